"""Atoms (docs/theory.md, 'Cells plus atoms'): moments, the Gaussian closed forms, the
atoms' motion, the circle's exact
share of the sums, and the transfers between cells and atoms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpde.grid.circle import TWO_PI, circle_grid, von_mises_mixture
from tpde.schemes.atom_cells import PeriodicCells, absorb, convert, merge, release
from tpde.schemes.atoms import (
    AtomOptions,
    Atoms,
    atom_rates,
    gaussian_log_mgf,
    gaussian_tilted_mean,
    merge_moments,
)
from tpde.validation.sphere_tokens import circle_token_velocity
from tpde.variants.circle_atoms import atom_modes, energy_with_atoms, velocity_at
from tpde.variants.parameters import Head
from tpde.variants.spherical import CircleAttention, circle_head


def gauss_hermite_2d(mean: np.ndarray, cov: np.ndarray, nodes: int = 40):
    """Nodes (N, 2) and weights (N,) of N(mean, cov) (tensor Gauss-Hermite)."""
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    grid = np.stack(np.meshgrid(x, x, indexing="ij"), axis=-1).reshape(-1, 2)
    weights = np.outer(w, w).reshape(-1)
    return mean + grid @ np.linalg.cholesky(cov).T, weights


def random_cov(rng, d: int = 2, scale: float = 1.0) -> np.ndarray:
    m = rng.normal(size=(d, d)) * scale
    return m @ m.T + 0.1 * scale**2 * np.eye(d)


# ---- flat closed forms --------------------------------------------------------------------------
def test_merge_moments_against_quadrature():
    rng = np.random.default_rng(0)
    masses = rng.uniform(0.1, 1.0, 3)
    means = rng.normal(size=(3, 2))
    covs = np.stack([random_cov(rng) for _ in range(3)])
    total, mean, cov = merge_moments(masses, means, covs)
    points, weights = [], []
    for m, a, s in zip(masses, means, covs, strict=True):
        p, w = gauss_hermite_2d(a, s)
        points.append(p)
        weights.append(m * w)
    p, w = np.concatenate(points), np.concatenate(weights)
    ref_mean = w @ p / w.sum()
    ref_cov = (w[:, None, None] * np.einsum("ni,nj->nij", p - ref_mean, p - ref_mean)).sum(0)
    ref_cov /= w.sum()
    errors = (
        abs(total - w.sum()),
        np.abs(mean - ref_mean).max(),
        np.abs(cov - ref_cov).max(),
    )
    print(f"\nmerge_moments against quadrature: mass {errors[0]:.1e}, mean {errors[1]:.1e}", end="")
    print(f", cov {errors[2]:.1e}")
    assert max(errors) < 1e-13


def test_gaussian_mgf_and_tilted_mean_against_quadrature():
    rng = np.random.default_rng(1)
    a = rng.normal(size=2)
    s = random_cov(rng, scale=0.3)
    c = rng.normal(size=(5, 2))
    p, w = gauss_hermite_2d(a, s, 60)
    kernel = np.exp(c @ p.T)  # (5, N)
    ref_log = np.log(kernel @ w)
    ref_mean = (kernel * w) @ p / (kernel @ w)[:, None]
    log_err = np.abs(gaussian_log_mgf(c, a, s) - ref_log).max()
    mean_err = np.abs(gaussian_tilted_mean(c, a, s) - ref_mean).max()
    print(f"\nlog MGF {log_err:.1e}, tilted mean {mean_err:.1e}")
    assert log_err < 1e-12 and mean_err < 1e-12


def test_atom_motion_is_the_gaussian_law_of_a_quadratic_field():
    """For a quadratic field Gamma_i(x) = b_i + B_ij x_j + 1/2 Q_ijk x_j x_k the mean of
    Gamma under N(a, S) is exactly Gamma(a) + 1/2 S : D^2 Gamma (the atom's a'), and for the
    affine part S' = B S + S B^T is the covariance's exact rate."""
    rng = np.random.default_rng(2)
    b, B = rng.normal(size=2), rng.normal(size=(2, 2))
    Q = rng.normal(size=(2, 2, 2))
    Q = 0.5 * (Q + np.swapaxes(Q, 1, 2))
    a, s = rng.normal(size=2), random_cov(rng, scale=0.2)

    def gamma(x: np.ndarray) -> np.ndarray:  # (N, 2)
        return b + x @ B.T + 0.5 * np.einsum("ijk,nj,nk->ni", Q, x, x)

    p, w = gauss_hermite_2d(a, s, 10)
    mean_gamma = w @ gamma(p)
    jac = B + np.einsum("ijk,k->ij", Q, a)
    rates = atom_rates(gamma(a[None])[:, :], jac[None], Q[None], s[None])
    assert np.abs(rates.centre[0] - mean_gamma).max() < 1e-13
    affine = atom_rates(gamma(a[None]), B[None], np.zeros((1, 2, 2, 2)), s[None])
    assert np.abs(affine.cov[0] - (B @ s + s @ B.T)).max() < 1e-14


# ---- the circle ----------------------------------------------------------------------------------
def wrapped_normal_nodes(centre: float, var: float, nodes: int = 80):
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    return centre + math.sqrt(var) * x, w / w.sum()


def test_wrapped_normal_modes_against_quadrature():
    atoms = Atoms.of([0.3, 0.7], [[1.0], [5.9]], [[[0.01]], [[0.2]]], [0, 1])
    theta = TWO_PI * np.arange(4096) / 4096
    # the wrapped normal densities, their images summed, at the trapezoidal nodes
    parts = []
    for m, a, s in zip(atoms.mass, atoms.centre[:, 0], atoms.cov[:, 0, 0], strict=True):
        f = sum(np.exp(-((theta - a + w * TWO_PI) ** 2) / (2 * s)) for w in range(-3, 4))
        parts.append(m * f / math.sqrt(TWO_PI * s))
    total = sum(parts)
    k = np.arange(0, 40)
    ref = (np.exp(-1j * np.outer(k, theta)) @ total) * TWO_PI / theta.size
    err = np.abs(atom_modes(atoms, k) - ref).max()
    print(f"\nwrapped normal modes against the trapezoidal rule: {err:.1e}")
    assert err < 1e-13


def cells_and_atoms_tokens(grid, components, atoms):
    """Weighted points for cells (the exact density at 1024 trapezoidal nodes) plus atoms
    (Gauss-Hermite nodes): the dense reference of the sums."""
    theta = TWO_PI * (np.arange(1024) + 0.5) / 1024
    density = np.zeros_like(theta)
    from scipy.special import ive

    for w, mu, kappa in components:
        density += w * np.exp(kappa * (np.cos(theta - mu) - 1)) / (TWO_PI * ive(0, kappa))
    points, weights = [theta], [density * TWO_PI / theta.size]
    for m, a, s in zip(atoms.mass, atoms.centre[:, 0], atoms.cov[:, 0, 0], strict=True):
        x, w = wrapped_normal_nodes(float(a), float(s))
        points.append(x)
        weights.append(m * w)
    return np.concatenate(points), np.concatenate(weights)


J = np.array([[0.0, -1.0], [1.0, 0.0]])


@pytest.mark.parametrize(
    ("head", "normalised"),
    [
        (circle_head(9.0), True),
        (Head(9.0 * np.eye(2) + 2.0 * J, np.eye(2) + 0.5 * J), True),
        (circle_head(2.0), False),
    ],
    ids=["beta I", "a I + b J", "unnormalised"],
)
def test_circle_sums_with_atoms_against_dense_token_sums(head, normalised):
    """Cells (exact averages of a von Mises mixture) plus two atoms: the FFT engine's face
    velocity and u, u', u'' at the atoms against dense sums over quadrature points of the same
    measure (finite differences of step 1e-4 for the derivatives); rotation-invariant heads,
    normalised or not."""
    grid = circle_grid(128)
    components = [(0.3, 1.0, 3.0), (0.2, 4.0, 8.0)]
    rho = von_mises_mixture(grid, components)
    atoms = Atoms.of([0.3, 0.2], [[2.5], [5.5]], [[[4e-4]], [[1e-3]]], [0, 1])
    field = CircleAttention(head, normalised=normalised, engine="fft")
    field.atoms = atoms
    faces = field.at(rho, grid, 0.0, [0.5])[0]
    points, weights = cells_and_atoms_tokens(grid, components, atoms)

    def dense(x: np.ndarray) -> np.ndarray:
        both = np.concatenate([x, points])
        w = np.concatenate([np.zeros(x.size), weights])
        return circle_token_velocity(both, w, head, normalised)[: x.size]

    face_err = np.abs(faces - dense(grid.edges(0))).max()
    u, du, d2u = velocity_at(rho, grid, atoms, head, atoms.centre[:, 0], normalised)
    a, step = atoms.centre[:, 0], 1e-4
    ref_u = dense(a)
    ref_du = (dense(a + step) - dense(a - step)) / (2 * step)
    ref_d2u = (dense(a + step) - 2 * ref_u + dense(a - step)) / step**2
    errors = (
        face_err,
        np.abs(u - ref_u).max(),
        np.abs(du - ref_du).max(),
        np.abs(d2u - ref_d2u).max() / np.abs(ref_d2u).max(),
    )
    print("\nfaces, u, u' (abs), u'' (rel):", ", ".join(f"{e:.1e}" for e in errors))
    scale = max(1.0, float(np.abs(ref_u).max()))  # (unnormalised speeds scale with e^beta)
    assert errors[0] < 1e-11 * scale and errors[1] < 1e-12 * scale
    assert errors[2] < 1e-7 * scale and errors[3] < 1e-4
    if not (normalised and head.A[0, 0] == 9.0 and head.A[1, 0] == 0.0):
        return
    # the energy of atoms alone: 1/(2 beta) sum m m' int int e^{beta cos} (Gauss-Hermite)
    p, w = cells_and_atoms_tokens(grid, [], atoms)
    ref = w @ np.exp(9.0 * np.cos(p[:, None] - p[None, :])) @ w / 18.0
    empty = np.zeros(grid.shape)
    assert energy_with_atoms(empty, grid, 9.0, atoms) == pytest.approx(ref, rel=1e-13)


# ---- transfers between cells and atoms -----------------------------------------------------------
def moments_of(rho: np.ndarray, cells: PeriodicCells, atoms: Atoms) -> np.ndarray:
    """Mass, first and second moment of cells (piecewise constant) plus atoms, in the plain
    angle (everything lies away from the wrap)."""
    h, x = cells.h, cells.centres
    m = rho * h
    out = np.array([m.sum(), m @ x, m @ (x * x + h * h / 12)])
    a, s = atoms.centre[:, 0], atoms.cov[:, 0, 0]
    out += np.array([atoms.mass.sum(), atoms.mass @ a, atoms.mass @ (a * a + s)])
    return out


def test_transfers_conserve_mass_mean_and_covariance():
    grid = circle_grid(256)
    cells = PeriodicCells(0.0, grid.spacing[0], 256)
    rho = von_mises_mixture(grid, [(0.3, 2.0, 4000.0), (0.3, 3.0, 2.0), (0.2, 4.0, 30000.0)])
    atoms = Atoms.of([0.1, 0.1], [[3.5], [3.505]], [[[1e-6]], [[2e-6]]], [0, 1])
    options = AtomOptions()
    before = moments_of(rho, cells, atoms)
    rho1, atoms1 = absorb(rho, cells, atoms, options)
    atoms2, merged, next_id = merge(atoms1, cells, options, 0.0, 2)
    rho3, atoms3, born, next_id = convert(rho1, cells, atoms2, options, 0.0, next_id)
    after = moments_of(rho3, cells, atoms3)
    print("\nrelative change of mass, mean, second moment:", (after - before) / before)
    assert np.all(np.abs(after - before) <= 1e-14 * np.abs(before))
    assert [e.parents for e in merged] == [(0, 1)]
    assert sorted(round(e.centre, 2) for e in born) == [2.0, 4.0]  # the wide one stays
    assert atoms3.count == 3 and np.all(rho3 >= 0)
    # the wide component stays on the cells, the narrow ones' cells are empty
    assert rho3[np.argmin(np.abs(cells.centres - 4.0))] == 0.0
    assert 0.25 < grid.integrate(rho3) < 0.3  # (the atoms took the cells near them)


def test_release_puts_a_wide_atom_back_on_the_cells():
    grid = circle_grid(64)
    cells = PeriodicCells(0.0, grid.spacing[0], 64)
    h = grid.spacing[0]
    atoms = Atoms.of([0.4, 0.6], [[3.0], [5.0]], [[[(5 * h) ** 2]], [[(0.5 * h) ** 2]]], [3, 4])
    rho = np.full(64, 0.0)
    out, left, events = release(rho, cells, atoms, AtomOptions(), 1.5)
    assert left.ids.tolist() == [4] and [e.ident for e in events] == [3]
    assert grid.integrate(out) == pytest.approx(0.4, rel=1e-14)
    x = cells.centres
    mean = (out * h) @ x / 0.4
    assert mean == pytest.approx(3.0, abs=1e-8)  # (the tail past 6 sd wraps around)


def test_atom_options_name_the_key():
    with pytest.raises(ValueError, match="atoms.width"):
        AtomOptions(width=-1.0).validate()
    with pytest.raises(ValueError, match="atoms.release"):
        AtomOptions(width=3.0, release=2.0).validate()
