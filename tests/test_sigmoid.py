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
