"""Sigmoid attention (docs/theory.md, 'Sigmoid attention'): no Gaussian closure, so the references
are quadratures.

1-D: adaptive quadrature of V int sigma(a x y + b) y N(y) dy (scipy.integrate.quad).
2-D: a tensor Gauss-Hermite rule for the Gaussian expectation C E[sigma(<A x, Y> + b) Y],
independent of the grid.
"""

from __future__ import annotations

import numpy as np
import pytest
from exact import print_table
from scipy import integrate
from test_variants import A1, COV1, MEAN1, V1

from tpde.grid import Grid, gaussian
from tpde.variants import SigmoidAttention, SigmoidHead


def sigma(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def test_sigmoid_1d_matches_adaptive_quadrature_spectrally():
    a, v, b, mean, var = 0.7, 1.3, -0.5, 0.4, 0.8
    head = SigmoidHead([[a]], [[v]], bias=b)

    def exact(x):
        def integrand(y):
            density = np.exp(-((y - mean) ** 2) / (2 * var)) / np.sqrt(2 * np.pi * var)
            return sigma(a * x * y + b) * y * density

        return v * integrate.quad(integrand, -12, 12, epsabs=1e-14, epsrel=1e-12, limit=200)[0]

    cells, errors = [32, 64, 128], []
    for n in cells:
        grid = Grid([-8], [8], [n])
        u = SigmoidAttention(head)(gaussian(grid, [mean], [[var]]), grid, 0.0)[0]
        x = grid.centres(0)
        bulk = np.abs(x - mean) <= 3 * np.sqrt(var)
        reference = np.array([exact(xi) for xi in x[bulk]])
        errors.append(float(np.abs(u[bulk] - reference).max() / np.abs(reference).max()))
    print_table("sigmoid 1-D velocity vs adaptive quadrature, 3-sigma bulk", cells, errors)
    assert errors[-1] <= 1e-9
    assert np.all(np.diff(np.log(errors)) < -3.0)


def test_sigmoid_2d_matches_gauss_hermite_expectation():
    head = SigmoidHead(A1, V1, bias=-np.log(50.0))
    nodes, weights = np.polynomial.hermite_e.hermegauss(160)  # probabilists' Hermite
    weights = weights / weights.sum()
    z = np.stack(np.meshgrid(nodes, nodes, indexing="ij"), axis=-1).reshape(-1, 2)
    w = np.outer(weights, weights).reshape(-1)
    y = MEAN1 + z @ np.linalg.cholesky(COV1).T  # Y ~ N(MEAN1, COV1)
    cells, errors = [32, 64, 128], []
    for n in cells:
        grid = Grid([-8, -8], [8, 8], [n, n])
        u = SigmoidAttention(head)(gaussian(grid, MEAN1, COV1), grid, 0.0).reshape(2, -1)
        x = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
        diff = x - MEAN1
        bulk = np.einsum("pi,ij,pj->p", diff, np.linalg.inv(COV1), diff) <= 9.0
        reference = ((sigma(x[bulk] @ A1.T @ y.T + head.bias) * w) @ y) @ V1.T
        errors.append(float(np.abs(u[:, bulk].T - reference).max() / np.abs(reference).max()))
    print_table(
        "sigmoid 2-D velocity vs 160x160 Gauss-Hermite expectation, 3-sigma bulk", cells, errors
    )
    assert errors[-1] <= 1e-9
    assert np.all(np.diff(np.log(errors)) < 0)


def test_sigmoid_is_unnormalised_and_bounded():
    grid = Grid([-6, -6], [6, 6], [32, 32])
    rho = gaussian(grid, MEAN1, COV1)
    field = SigmoidAttention(SigmoidHead(5 * A1, V1, bias=3.0))
    u, half = field(rho, grid, 0.0), field(0.5 * rho, grid, 0.0)
    assert np.allclose(half, 0.5 * u, rtol=1e-13, atol=1e-15)  # scales with the mass
    y = np.stack(grid.mesh(sparse=False), axis=0)
    first_moment = float((np.sqrt((y**2).sum(axis=0)) * rho).sum() * grid.cell_volume)
    bound = np.linalg.norm(V1, 2) * first_moment * (1 + 1e-6)  # 'Support and speed bounds'
    assert np.all(np.isfinite(u))
    assert np.sqrt((u**2).sum(axis=0)).max() <= bound
    with pytest.raises(ValueError, match="SigmoidHead.bias"):
        SigmoidHead(A1, V1, bias=np.inf)
    with pytest.raises(ValueError, match="needs a SigmoidHead"):
        from tpde.variants import Head

        SigmoidAttention(Head(A1, V1))(rho, grid, 0.0)


def mixture(grid: Grid) -> np.ndarray:
    """A two-component, unequal, correlated mixture (non-Gaussian data)."""
    d = grid.ndim
    wide = np.eye(d) * 0.8 + 0.2
    return 0.65 * gaussian(grid, 0.7 * np.ones(d), wide) + 0.35 * gaussian(
        grid, -1.2 * np.ones(d), 0.25 * np.eye(d)
    )


@pytest.mark.parametrize("d, cells", [(1, 201), (2, 48), (3, 14)])
def test_the_lattice_engine_equals_the_dense_sums(d, cells):
    """engine = "lattice" (the recurrence along each lattice row) against the direct sums on
    the face lattices the solver evaluates: random non-symmetric A and C, a bias, mixture
    data; relative max difference at round-off, full vectors and single components."""
    rng = np.random.default_rng(11 + d)
    head = SigmoidHead(1.5 * rng.normal(size=(d, d)), rng.normal(size=(d, d)), bias=-1.3)
    grid = Grid([-7.0] * d, [7.0] * d, [cells] * d)
    rho = mixture(grid)
    offsets = [np.where(np.arange(d) == a, 0.5, 0.0) for a in range(d)] + [np.zeros(d)]
    fast = SigmoidAttention(head, engine="lattice").at_many(rho, grid, 0.0, offsets)
    dense = SigmoidAttention(head, engine="direct").at_many(rho, grid, 0.0, offsets)
    # and one component per lattice, as the solver asks for the normal components
    normal = SigmoidAttention(head, engine="lattice").components(
        rho, grid, 0.0, offsets, list(range(d)) + [None]
    )
    fast += normal
    dense += [g[a] for a, g in enumerate(dense[:d])] + [dense[d]]
    pairs = zip(fast, dense, strict=True)
    errors = [float(np.abs(f - g).max() / np.abs(g).max()) for f, g in pairs]
    print(f"\n{d}-D {cells}^{d}: lattice vs direct, per lattice: {np.array(errors)}")
    assert max(errors) <= 1e-12


def test_the_lattice_engine_keeps_its_range():
    """Beyond |<A x, y> + b| = RECURRENCE_RANGE a factor e^{-z} could leave the float range:
    "auto" takes the direct sums there (equal to them), "lattice" refuses in one line."""
    grid = Grid([-7.0, -7.0], [7.0, 7.0], [16, 16])
    rho = mixture(grid)
    head = SigmoidHead(20.0 * np.array([[1.0, 0.4], [-0.3, 0.9]]), np.eye(2), bias=0.5)
    auto = SigmoidAttention(head)(rho, grid, 0.0)
    direct = SigmoidAttention(head, engine="direct")(rho, grid, 0.0)
    assert np.array_equal(auto, direct) and np.all(np.isfinite(auto))
    with pytest.raises(ValueError, match='engine = "lattice"'):
        SigmoidAttention(head, engine="lattice")(rho, grid, 0.0)


def test_the_lattice_engine_leaves_out_only_negligible_cells():
    """Two narrow clusters (standard deviation 0.3 on [-7, 7]^2, 128^2): the lattice engine
    sums over the cells that hold all but 1e-15 of sum w |y| (a third of those with mass),
    and equals the direct sums over every cell."""
    from tpde.grid.stencils import point_values
    from tpde.variants.engines.direct import density_sources
    from tpde.variants.sigmoid import NEGLIGIBLE_SHARE, significant_sources

    grid = Grid([-7.0, -7.0], [7.0, 7.0], [128, 128])
    narrow = 0.09 * np.eye(2)
    rho = 0.5 * gaussian(grid, [1.0, 1.0], narrow) + 0.5 * gaussian(grid, [-2.0, 0.5], narrow)
    sources, weights = density_sources(np.maximum(point_values(rho, grid), 0.0), grid)
    kept, kept_weights = significant_sources(sources, weights)
    size = weights * np.linalg.norm(sources, axis=1)
    left_out = size.sum() - (kept_weights * np.linalg.norm(kept, axis=1)).sum()
    head = SigmoidHead(A1, V1, bias=-1.0)
    offsets = [np.array([0.5, 0.0]), np.array([0.0, 0.5])]
    fast = SigmoidAttention(head).components(rho, grid, 0.0, offsets, [0, 1])
    dense = SigmoidAttention(head, engine="direct").components(rho, grid, 0.0, offsets, [0, 1])
    error = max(
        float(np.abs(f - g).max() / np.abs(g).max()) for f, g in zip(fast, dense, strict=True)
    )
    print(f"\ncells with mass {len(weights)}, summed {len(kept_weights)}; vs direct {error:.1e}")
    assert len(kept_weights) < 0.5 * len(weights)
    assert 0 <= left_out <= NEGLIGIBLE_SHARE * size.sum() * (1 + 1e-12)
    assert error <= 1e-12
