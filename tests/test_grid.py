"""Tests of tpde.grid: geometry, exact cell-average initial data, moments.

Every number is checked against an independent reference (erf/erfc differences, brute-force
tensor Gauss-Legendre per cell, Gauss-Hermite exact moments, scipy adaptive quadrature, exact
rational arithmetic). Run ``pytest -s`` to see the measured errors.
"""

from __future__ import annotations

import math
import time
import warnings
from fractions import Fraction

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import erf, erfc

from tpde.grid import (
    BOUNDARY_MODES,
    Grid,
    covariance,
    from_array,
    from_tokens,
    gaussian,
    gaussian_mixture,
    mass,
    mean,
    moments,
    raw_moment,
    uniform_ball,
    uniform_box,
)
from tpde.grid.initial import _disk_rect_area
from tpde.grid.moments import deconvolved_monomial

C2 = np.array([[1.0, 0.6], [0.6, 0.8]])
MU2 = np.array([0.3, -0.2])
C3 = np.array([[1.0, 0.5, 0.2], [0.5, 1.2, -0.4], [0.2, -0.4, 0.9]])
MU3 = np.array([0.1, 0.2, -0.3])


def gauss_pdf(points: np.ndarray, mu: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """Pointwise N(mu, cov) density at points (..., d)."""
    d = mu.size
    prec = np.linalg.inv(cov)
    u = points - mu
    q = np.einsum("...a,ab,...b->...", u, prec, u)
    return np.exp(-0.5 * q) / math.sqrt((2 * math.pi) ** d * np.linalg.det(cov))


def brute_force_2d(grid, mu, cov, nodes=20, sub=1):
    t, w = np.polynomial.legendre.leggauss(nodes)
    pos = ((np.arange(sub)[:, None] + 0.5 * (t + 1.0)) / sub).ravel()
    wts = np.tile(w / (2.0 * sub), sub)
    x = grid.lower[0] + grid.spacing[0] * (np.arange(grid.cells[0])[:, None] + pos)
    y = grid.lower[1] + grid.spacing[1] * (np.arange(grid.cells[1])[:, None] + pos)
    pts = np.stack(np.meshgrid(x.ravel(), y.ravel(), indexing="ij"), axis=-1)
    f = gauss_pdf(pts, mu, cov).reshape(grid.cells[0], wts.size, grid.cells[1], wts.size)
    return np.einsum("iajb,a,b->ij", f, wts, wts)


def brute_force_3d(grid, mu, cov, nodes=20):
    t, w = np.polynomial.legendre.leggauss(nodes)
    pos = 0.5 * (t + 1.0)
    wts = 0.5 * w
    ax = [
        grid.lower[a] + grid.spacing[a] * (np.arange(grid.cells[a])[:, None] + pos)
        for a in range(3)
    ]
    out = np.empty(grid.shape)
    for i in range(grid.cells[0]):
        pts = np.stack(np.meshgrid(ax[0][i], ax[1].ravel(), ax[2].ravel(), indexing="ij"), axis=-1)
        f = gauss_pdf(pts, mu, cov).reshape(nodes, grid.cells[1], nodes, grid.cells[2], nodes)
        out[i] = np.einsum("ajbkc,a,b,c->jk", f, wts, wts, wts)
    return out


def rel_err_above(value, ref, floor=1e-10):
    mask = ref > floor * ref.max()
    return float(np.max(np.abs(value[mask] - ref[mask]) / ref[mask])), int(mask.sum())


# ---- Grid ----------------------------------------------------------------------------------------
def test_grid_geometry():
    g = Grid(
        [-1.0, 0.0, 2.0], [1.0, 3.0, 2.5], [4, 6, 5], boundary=["periodic", "outflow", "noflux"]
    )
    print("\nspacing", g.spacing, "cell_volume", g.cell_volume)
    assert g.ndim == 3 and g.shape == (4, 6, 5) and g.size == 120
    assert g.spacing == (0.5, 0.5, 0.1)
    assert g.cell_volume == pytest.approx(0.025, rel=1e-15)
    np.testing.assert_allclose(g.edges(0), [-1.0, -0.5, 0.0, 0.5, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(g.centres(0), [-0.75, -0.25, 0.25, 0.75], rtol=0, atol=1e-15)
    np.testing.assert_allclose(g.centres(2), 2.05 + 0.1 * np.arange(5), rtol=0, atol=1e-14)
    lat = g.lattice([0.5, 0.0, -0.5])
    assert lat[0].shape == (5,) and lat[1].shape == (6,) and lat[2].shape == (5,)
    np.testing.assert_allclose(lat[0], g.edges(0))
    np.testing.assert_allclose(lat[2], g.edges(2)[:-1], atol=1e-14)
    xs = g.mesh()
    assert [x.shape for x in xs] == [(4, 1, 1), (1, 6, 1), (1, 1, 5)]
    assert g.integrate(np.ones(g.shape)) == pytest.approx(2.0 * 3.0 * 0.5, rel=1e-14)
    assert Grid.from_dict(g.to_dict()) == g
    assert set(BOUNDARY_MODES) == {"outflow", "periodic", "noflux"}
    g1 = Grid([0.0], [1.0], 8)
    assert g1.shape == (8,) and g1.boundary == ("outflow",)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(lower=[0, 0, 0, 0], upper=[1, 1, 1, 1], cells=4), "grid.lower"),
        (dict(lower=[0, 0], upper=[1, -1], cells=4), "grid.upper"),
        (dict(lower=[0, 0], upper=[1, 1], cells=[4, 0]), "grid.cells"),
        (dict(lower=[0, 0], upper=[1, 1], cells=[4, 4, 4]), "grid.cells"),
        (dict(lower=[0, 0], upper=[1, 1], cells=4, boundary="wall"), "grid.boundary"),
        (dict(lower=[0, 0], upper=[1, 1], cells=4, boundary=["periodic"] * 3), "grid.boundary"),
        (dict(lower=[0, np.nan], upper=[1, 1], cells=4), "grid.lower"),
    ],
)
def test_grid_bad_input(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")) as exc:
        Grid(**kwargs)
    assert "\n" not in str(exc.value)


# ---- Gaussians ----------------------------------------------------------------------------------
def test_gaussian_1d_equals_erf_differences():
    g = Grid([-9.0], [11.0], [173])
    mu, sd = 0.7, 1.3
    rho = gaussian(g, [mu], [[sd * sd]], mass=2.5)
    a = (g.edges(0)[:-1] - mu) / (sd * math.sqrt(2))
    b = (g.edges(0)[1:] - mu) / (sd * math.sqrt(2))
    # erf differences in the core, erfc differences in the tails (no cancellation there)
    ref = np.where(
        a > 1,
        0.5 * (erfc(a) - erfc(b)),
        np.where(b < -1, 0.5 * (erfc(-b) - erfc(-a)), 0.5 * (erf(b) - erf(a))),
    )
    ref *= 2.5 / g.spacing[0]
    err = np.abs(rho - ref) / ref
    print(f"\n1-D gaussian vs erf: max rel err {err.max():.2e} (min cell {ref.min():.2e})")
    assert err.max() < 1e-13


@pytest.mark.parametrize("d", [1, 2, 3])
def test_gaussian_mass_in_10_sigma_box(d):
    mu = MU3[:d]
    cov = C3[:d, :d] if d > 1 else np.array([[1.3]])
    sd = np.sqrt(np.diag(cov))
    cells = {1: 301, 2: 80, 3: 48}[d]
    g = Grid(mu - 10 * sd, mu + 10 * sd, cells)
    rho = gaussian(g, mu, cov, mass=3.0)
    err = abs(g.integrate(rho) / 3.0 - 1.0)
    print(f"\n{d}-D gaussian mass error in +-10 sigma box: {err:.2e}")
    assert rho.dtype == np.float64 and rho.shape == g.shape
    assert err < 1e-13


def test_gaussian_2d_nondiagonal_vs_brute_force():
    g = Grid([-4.0, -5.0], [6.0, 3.0], [26, 22])
    rho = gaussian(g, MU2, C2)
    ref = brute_force_2d(g, MU2, C2)
    err, n = rel_err_above(rho, ref)
    print(f"\n2-D non-diagonal: max rel err {err:.2e} over {n} cells above 1e-10 of max")
    assert err < 1e-12
    # strongly correlated (rho = 0.97) and coarse cells: exercises the automatic sub-cells
    cov = np.array([[1.0, 0.97 * 0.5], [0.97 * 0.5, 0.25]])
    g = Grid([-5.0, -2.5], [5.0, 2.5], [12, 14])
    rho = gaussian(g, [0.0, 0.0], cov)
    ref = brute_force_2d(g, np.zeros(2), cov, nodes=20, sub=6)
    err, n = rel_err_above(rho, ref)
    print(
        f"2-D rho=0.97, h = {g.spacing[0] / math.sqrt(1 - 0.97**2):.1f} conditional sd: "
        f"max rel err {err:.2e} over {n} cells"
    )
    assert err < 1e-12


def test_gaussian_3d_nondiagonal_vs_brute_force():
    g = Grid([-4.0, -4.0, -4.0], [4.5, 4.0, 3.5], [11, 10, 9])
    t0 = time.perf_counter()
    rho = gaussian(g, MU3, C3)
    t1 = time.perf_counter()
    ref = brute_force_3d(g, MU3, C3)
    err, n = rel_err_above(rho, ref)
    print(f"\n3-D non-diagonal: max rel err {err:.2e} over {n} cells ({t1 - t0:.3f} s)")
    assert err < 1e-12


def test_gaussian_narrow_conditional_window():
    # Conditional sd along the last axis << box: only a window of last-axis cells is computed.
    # 2-D: against brute force with sub-cells.
    sd, r = 0.3, 0.99
    cov = np.array([[1.0, r * sd], [r * sd, sd * sd]])
    g = Grid([-6.0, -6.0], [6.0, 6.0], [24, 120])
    rho = gaussian(g, [0.1, -0.05], cov)
    ref = brute_force_2d(g, np.array([0.1, -0.05]), cov, nodes=20, sub=3)
    err, n = rel_err_above(rho, ref)
    print(f"\n2-D narrow conditional (windowed): max rel err {err:.2e} over {n} cells")
    assert err < 1e-12
    # 3-D: against the same density on a grid with permuted axes, which conditions on another
    # axis (full path) -- an independent computation.
    cov3 = np.array([[1.0, 0.2, 0.02], [0.2, 0.8, 0.01], [0.02, 0.01, 0.0025]])
    mu3 = np.array([0.2, -0.1, 0.05])
    g = Grid([-5.0, -5.0, -5.0], [5.0, 5.0, 5.0], [10, 12, 120])
    rho = gaussian(g, mu3, cov3)
    perm = [2, 0, 1]
    gp = Grid([g.lower[a] for a in perm], [g.upper[a] for a in perm], [g.cells[a] for a in perm])
    rho_p = gaussian(gp, mu3[perm], cov3[np.ix_(perm, perm)])
    err, n = rel_err_above(rho, np.transpose(rho_p, (1, 2, 0)))
    print(
        f"3-D narrow conditional (windowed) vs permuted axes: max rel err {err:.2e} over "
        f"{n} cells; mass {g.integrate(rho):.15f}"
    )
    assert err < 1e-12


def test_gaussian_diagonal_is_product_and_far_tail():
    g = Grid([-30.0, -6.0], [10.0, 6.0], [40, 12])
    cov = np.diag([1.0, 2.0])
    rho = gaussian(g, [0.0, 0.0], cov)
    ex = g.edges(0) / math.sqrt(2)  # tail-safe erfc differences
    px = np.where(
        ex[:-1] > 0, 0.5 * (erfc(ex[:-1]) - erfc(ex[1:])), 0.5 * (erfc(-ex[1:]) - erfc(-ex[:-1]))
    )
    py = gaussian(Grid([-6.0], [6.0], [12]), [0.0], [[2.0]]) * g.spacing[1]
    ref = np.outer(px / g.spacing[0], py / g.spacing[1])
    rel = np.abs(rho - ref) / ref
    core = np.abs(g.centres(0)) < 8
    err_core, err = rel[core].max(), rel.max()
    print(
        f"\ndiagonal product: max rel err {err_core:.2e} within 8 sigma, {err:.2e} out to "
        f"-30 sigma (value {rho[0, 6]:.3e}; erfc is conditioned ~2z^2 eps there)"
    )
    assert err_core < 1e-13 and err < 1e-12 and rho[0, 6] > 0


def test_gaussian_performance_3d():
    g = Grid([-8.0] * 3, [8.0] * 3, 64)
    t0 = time.perf_counter()
    rho = gaussian(g, MU3, C3)
    dt = time.perf_counter() - t0
    print(f"\n3-D non-diagonal 64^3: {dt:.2f} s, mass {g.integrate(rho):.15f}")
    assert dt < 5.0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(mean=[0.0], covariance=np.eye(2)), "initial.mean"),
        (dict(mean=[0.0, np.inf], covariance=np.eye(2)), "initial.mean"),
        (dict(mean=[0.0, 0.0], covariance=np.eye(3)), "initial.covariance"),
        (dict(mean=[0.0, 0.0], covariance=[[1.0, 0.5], [0.4, 1.0]]), "initial.covariance: not sym"),
        (
            dict(mean=[0.0, 0.0], covariance=[[1.0, 2.0], [2.0, 1.0]]),
            "initial.covariance: not positive definite",
        ),
        (dict(mean=[0.0, 0.0], covariance=[[1.0, np.nan], [np.nan, 1.0]]), "initial.covariance"),
        (dict(mean=[0.0, 0.0], covariance=np.eye(2), mass=0.0), "initial.mass"),
        (dict(mean=[0.0, 0.0], covariance=np.eye(2), nodes=1), "initial.nodes"),
        (dict(mean=[1e4, 0.0], covariance=np.eye(2)), "initial.mean"),
    ],
)
def test_gaussian_bad_input(kwargs, field):
    g = Grid([-3.0, -3.0], [3.0, 3.0], 8)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")) as exc:
        gaussian(g, **kwargs)
    print(f"\n{exc.value}")
    assert "\n" not in str(exc.value)


def test_gaussian_mixture():
    g = Grid([-10.0, -10.0], [10.0, 10.0], 40)
    means = [[-1.0, 0.5], [1.5, -0.5]]
    covs = [C2, np.diag([0.5, 0.7])]
    rho = gaussian_mixture(g, [2.0, 6.0], means, covs, mass=2.0)
    ref = 2.0 * (0.25 * gaussian(g, means[0], covs[0]) + 0.75 * gaussian(g, means[1], covs[1]))
    err = np.max(np.abs(rho - ref)) / ref.max()
    m, mu, _ = moments(rho, g)
    exact_mu = 0.25 * np.array(means[0]) + 0.75 * np.array(means[1])
    print(
        f"\nmixture vs weighted sum {err:.1e}; mass {m:.15f}; mean err "
        f"{np.abs(mu - exact_mu).max():.1e}"
    )
    assert err < 1e-15
    assert abs(m - 2.0) < 1e-12 and np.abs(mu - exact_mu).max() < 1e-11
    for bad, field in [
        (dict(weights=[1.0, -1.0]), "initial.weights"),
        (dict(weights=[1.0]), "initial.means"),
        (dict(covariances=[C2, -C2]), r"initial.covariances\[1\]"),
    ]:
        kw = dict(weights=[1.0, 1.0], means=means, covariances=covs) | bad
        with pytest.raises(ValueError, match=field):
            gaussian_mixture(g, **kw)


# ---- moments -------------------------------------------------------------------------------------
def _box_average_exact(coeffs: list[Fraction], x: Fraction, h: Fraction) -> Fraction:
    """(1/h) int_{x-h/2}^{x+h/2} sum_k c_k s^k ds, in exact rational arithmetic."""
    total = Fraction(0)
    for k, c in enumerate(coeffs):
        total += c * ((x + h / 2) ** (k + 1) - (x - h / 2) ** (k + 1)) / (k + 1)
    return total / h


def test_deconvolved_monomials_exact():
    # q_k as coefficient lists in x for a given h (rational), then check B * q_k = x^k exactly
    for h in (Fraction(1), Fraction(3, 7), Fraction(5, 2)):
        qs = [
            [Fraction(1)],
            [Fraction(0), Fraction(1)],
            [-(h**2) / 12, Fraction(0), Fraction(1)],
            [Fraction(0), -(h**2) / 4, Fraction(0), Fraction(1)],
            [7 * h**4 / 240, Fraction(0), -(h**2) / 2, Fraction(0), Fraction(1)],
        ]
        for k, q in enumerate(qs):
            for x in (Fraction(0), Fraction(2, 3), Fraction(-11, 5)):
                assert _box_average_exact(q, x, h) == x**k
            # the implementation evaluates the same polynomial
            xf = np.array([0.0, 2 / 3, -2.2])
            ref = sum(float(c) * xf**j for j, c in enumerate(q))
            np.testing.assert_allclose(
                deconvolved_monomial(xf, float(h), k), ref, rtol=1e-14, atol=1e-14
            )
    # numerical check too: 8-point Gauss-Legendre is exact for degree 4
    t, w = np.polynomial.legendre.leggauss(8)
    x, h = 0.37, 0.9
    for k in range(5):
        avg = 0.5 * np.sum(w * deconvolved_monomial(x + 0.5 * h * t, h, k))
        assert abs(avg - x**k) < 1e-15
    print("\nq0..q4 verified: B*q_k = x^k exactly (Fractions)")
    with pytest.raises(ValueError, match="moments.powers"):
        deconvolved_monomial(np.zeros(2), 1.0, 5)


def test_moments_2d_corrected_vs_naive():
    sd = np.sqrt(np.diag(C2))
    g = Grid(MU2 - 8 * sd, MU2 + 8 * sd, 32)
    rho = gaussian(g, MU2, C2, mass=1.7)
    m, mu, cov = moments(rho, g)
    x, y = g.mesh()
    w = rho * g.cell_volume
    naive_mu = np.array([np.sum(w * x), np.sum(w * y)]) / w.sum()
    dx, dy = x - naive_mu[0], y - naive_mu[1]
    naive_cov = (
        np.array(
            [[np.sum(w * dx * dx), np.sum(w * dx * dy)], [np.sum(w * dx * dy), np.sum(w * dy * dy)]]
        )
        / w.sum()
    )
    err_mu = np.abs(mu - MU2).max()
    err_cov = np.abs(cov - C2).max()
    err_naive = np.abs(naive_cov - C2).max()
    print(
        f"\n2-D 32^2 (h = {g.spacing[0]:.3f}, {g.spacing[1]:.3f}): mass err {abs(m - 1.7):.1e}, "
        f"mean err {err_mu:.1e}, cov err {err_cov:.1e}; naive cov err {err_naive:.2e} "
        f"(h^2/12 = {g.spacing[0] ** 2 / 12:.2e})"
    )
    assert abs(m - 1.7) < 1e-12
    assert err_mu < 1e-10 and err_cov < 1e-10
    assert err_naive > 1e-4 and err_cov < err_naive / 1000
    np.testing.assert_allclose(naive_cov - C2, np.diag(np.square(g.spacing)) / 12, atol=1e-10)
    assert mass(rho, g) == pytest.approx(m, rel=1e-15)
    np.testing.assert_allclose(mean(rho, g), mu, rtol=0, atol=1e-15)
    np.testing.assert_allclose(covariance(rho, g), cov, rtol=0, atol=1e-15)


def test_moments_3d():
    sd = np.sqrt(np.diag(C3))
    g = Grid(MU3 - 9 * sd, MU3 + 9 * sd, [30, 32, 28])
    rho = gaussian(g, MU3, C3)
    m, mu, cov = moments(rho, g)
    naive = np.zeros((3, 3))
    xs = g.mesh()
    for a in range(3):
        for b in range(3):
            naive[a, b] = np.sum(rho * (xs[a] - mu[a]) * (xs[b] - mu[b])) * g.cell_volume / m
    err_cov = np.abs(cov - C3).max()
    err_naive = np.abs(naive - C3).max()
    print(
        f"\n3-D: mass err {abs(m - 1):.1e}, mean err {np.abs(mu - MU3).max():.1e}, cov err "
        f"{err_cov:.1e}, naive cov err {err_naive:.2e}"
    )
    assert abs(m - 1) < 1e-12 and np.abs(mu - MU3).max() < 1e-10 and err_cov < 1e-10
    assert err_naive > 1e-4 and err_cov < err_naive / 1000


def _gauss_hermite_moment(mu, cov, powers, n=6):
    """E[prod x_a^k_a] for N(mu, cov) by tensor Gauss-Hermite (exact for degree <= 2n-1)."""
    t, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    d = len(mu)
    L = np.linalg.cholesky(cov)
    grids = np.meshgrid(*([t] * d), indexing="ij")
    z = np.stack([gi.ravel() for gi in grids], axis=1)
    wz = np.prod(np.meshgrid(*([w] * d), indexing="ij"), axis=0).ravel()
    x = mu + z @ L.T
    return float(np.sum(wz * np.prod(x ** np.asarray(powers), axis=1)))


def test_raw_moment_fourth_order():
    sd = np.sqrt(np.diag(C2))
    g = Grid(MU2 - 9 * sd, MU2 + 9 * sd, [40, 36])
    rho = gaussian(g, MU2, C2, mass=2.0)
    worst = 0.0
    for powers in [(4, 0), (0, 4), (2, 2), (3, 1), (1, 3), (2, 1), (3, 0), (1, 1), (0, 0)]:
        ref = 2.0 * _gauss_hermite_moment(MU2, C2, powers)
        got = raw_moment(rho, g, powers)
        worst = max(worst, abs(got - ref) / max(1.0, abs(ref)))
    # central fourth moments by Isserlis: E[x^4] = 3 s^4, E[x^2 y^2] = s_x^2 s_y^2 + 2 s_xy^2
    iss = {
        (4, 0): 3 * C2[0, 0] ** 2,
        (2, 2): C2[0, 0] * C2[1, 1] + 2 * C2[0, 1] ** 2,
        (3, 1): 3 * C2[0, 0] * C2[0, 1],
    }
    for powers, ref in iss.items():
        got = raw_moment(rho, g, powers, origin=MU2) / 2.0
        worst = max(worst, abs(got - ref) / ref)
    # naive 4th moment is off by O(h^2)
    x, _ = g.mesh()
    naive = np.sum(rho * x**4) * g.cell_volume
    naive_err = abs(naive - 2.0 * _gauss_hermite_moment(MU2, C2, (4, 0)))
    print(
        f"\nraw_moment up to 4th order: worst rel err {worst:.1e} (naive x^4 err {naive_err:.1e})"
    )
    assert worst < 1e-10 and naive_err > 1e-3
    sd = np.sqrt(np.diag(C3))
    g3 = Grid(MU3 - 9 * sd, MU3 + 9 * sd, 30)
    rho3 = gaussian(g3, MU3, C3)
    worst3 = 0.0
    for powers in [(2, 1, 1), (0, 2, 2), (1, 0, 3), (4, 0, 0), (1, 1, 1)]:
        ref = _gauss_hermite_moment(MU3, C3, powers)
        worst3 = max(worst3, abs(raw_moment(rho3, g3, powers) - ref) / max(1.0, abs(ref)))
    print(f"3-D raw moments: worst rel err {worst3:.1e}")
    assert worst3 < 1e-10
    with pytest.raises(ValueError, match="moments.powers"):
        raw_moment(rho, g, (5, 0))
    with pytest.raises(ValueError, match="moments.density"):
        raw_moment(rho[:-1], g, (1, 0))


def test_moments_bad_input():
    g = Grid([0.0, 0.0], [1.0, 1.0], 4)
    with pytest.raises(ValueError, match="moments.density"):
        moments(np.zeros((4, 5)), g)
    with pytest.raises(ValueError, match="moments.density: mass"):
        mean(np.zeros((4, 4)), g)


# ---- uniform box and ball ------------------------------------------------------------------------
def test_uniform_box_exact():
    g = Grid([0.0, 0.0], [4.0, 2.0], [4, 4])  # h = (1, 0.5)
    rho = uniform_box(g, [0.5, 0.25], [2.25, 1.5], mass=3.0)
    density = 3.0 / (1.75 * 1.25)
    fx = np.array([0.5, 1.0, 0.25, 0.0])
    fy = np.array([0.5, 1.0, 1.0, 0.0])
    ref = density * np.outer(fx, fy)
    print(f"\nuniform_box: max abs err {np.abs(rho - ref).max():.1e}, mass {g.integrate(rho)!r}")
    assert np.abs(rho - ref).max() < 1e-15 * density
    assert abs(g.integrate(rho) - 3.0) < 1e-14
    with pytest.warns(UserWarning, match=r"initial.uniform_box: 0.5 of the mass"):
        rho = uniform_box(g, [-1.0, 0.0], [1.0, 1.0])
    assert abs(g.integrate(rho) - 0.5) < 1e-15
    with pytest.raises(ValueError, match="initial.upper"):
        uniform_box(g, [1.0, 1.0], [0.5, 2.0])
    with pytest.raises(ValueError, match="initial.lower"):
        uniform_box(g, [10.0, 10.0], [11.0, 11.0])
    with pytest.raises(ValueError, match="initial.lower"):
        uniform_box(g, [0.0], [1.0])


def test_uniform_ball_1d_2d():
    g1 = Grid([-2.0], [2.0], 10)
    rho = uniform_ball(g1, [0.13], 0.77, mass=2.0)
    ref = (
        2.0
        / 1.54
        * np.clip(np.minimum(g1.edges(0)[1:], 0.9) - np.maximum(g1.edges(0)[:-1], -0.64), 0, None)
        / 0.4
    )
    assert np.abs(rho - ref).max() < 1e-14
    g = Grid([-2.0, -2.0], [2.0, 2.0], [23, 19])
    c, r = np.array([0.137, -0.291]), 1.234
    rho = uniform_ball(g, c, r)
    area_err = abs(g.integrate(rho) - 1.0)
    # independent per-cell reference: adaptive quadrature of the chord length in y over x
    h = g.spacing
    full = 1.0 / (math.pi * r * r)
    worst = 0.0
    ex, ey = g.edges(0) - c[0], g.edges(1) - c[1]
    for i in range(g.cells[0]):
        for j in range(g.cells[1]):
            if 0 < rho[i, j] < full:

                def chord(x, j=j):
                    s = math.sqrt(max(r * r - x * x, 0.0))
                    return max(0.0, min(ey[j + 1], s) - max(ey[j], -s))

                pts = [
                    p
                    for p in (
                        -r,
                        r,
                        *[
                            sgn * math.sqrt(r * r - e * e)
                            for e in (ey[j], ey[j + 1])
                            if abs(e) < r
                            for sgn in (1, -1)
                        ],
                    )
                    if ex[i] < p < ex[i + 1]
                ]
                v = quad(
                    chord,
                    ex[i],
                    ex[i + 1],
                    points=pts or None,
                    epsabs=1e-15,
                    epsrel=1e-13,
                    limit=200,
                )[0]
                worst = max(worst, abs(rho[i, j] / full - v / (h[0] * h[1])))
    print(f"\n2-D ball: area rel err {area_err:.1e}; cut cells vs adaptive quad {worst:.1e}")
    assert area_err < 1e-14 and worst < 1e-12
    assert np.all(rho[np.hypot(*np.meshgrid(ex[:-1], ey[:-1], indexing="ij")) > r + 0.4] == 0)


def test_uniform_ball_3d():
    g = Grid([-1.0] * 3, [1.0] * 3, 40)
    c, r = np.array([0.011, -0.023, 0.037]), 0.27  # r = 5.4 h
    t0 = time.perf_counter()
    rho = uniform_ball(g, c, r, mass=1.0)
    dt = time.perf_counter() - t0
    vol_err = abs(g.integrate(rho) - 1.0)
    # per-cell reference for a sample of cut cells: adaptive quadrature over x of the exact
    # disk-rectangle slice area, checked itself against a chord-length quadrature.
    full = 1.0 / (4.0 / 3.0 * math.pi * r**3)
    e = [g.edges(a) - c[a] for a in range(3)]
    cut = np.argwhere((rho > 0) & (rho < full))
    rng = np.random.default_rng(0)
    worst = 0.0
    for i, j, k in cut[rng.choice(len(cut), 25, replace=False)]:

        def slice_area(x, j=j, k=k):
            s = math.sqrt(max(r * r - x * x, 0.0))
            return float(_disk_rect_area(np.array(s), e[1][j], e[1][j + 1], e[2][k], e[2][k + 1]))

        crit = [
            0.0,
            *np.abs([e[1][j], e[1][j + 1], e[2][k], e[2][k + 1]]),
            *[math.hypot(p, q) for p in (e[1][j], e[1][j + 1]) for q in (e[2][k], e[2][k + 1])],
        ]
        pts = [sg * math.sqrt(r * r - v * v) for v in crit if v < r for sg in (1, -1)]
        pts = [p for p in pts if e[0][i] < p < e[0][i + 1]]
        v = quad(
            slice_area,
            e[0][i],
            e[0][i + 1],
            points=pts or None,
            epsabs=1e-16,
            epsrel=1e-13,
            limit=200,
        )[0]
        worst = max(worst, abs(rho[i, j, k] / full - v / g.cell_volume))
    # the slice area formula itself, against the chord-length integral, on one slice
    s, y0, y1, z0, z1 = 0.8, -0.3, 0.5, 0.2, 1.1
    chord = quad(
        lambda y: max(
            0.0,
            min(z1, math.sqrt(max(s * s - y * y, 0.0)))
            - max(z0, -math.sqrt(max(s * s - y * y, 0.0))),
        ),
        y0,
        y1,
        points=[math.sqrt(s * s - z0 * z0)],
        epsabs=1e-15,
        limit=200,
    )[0]
    area = float(_disk_rect_area(np.array(s), y0, y1, z0, z1))
    print(
        f"\n3-D ball (40^3, r = 5.4h, {dt:.2f} s): volume rel err {vol_err:.1e}; 25 cut cells "
        f"vs adaptive quad {worst:.1e}; slice area vs chord {abs(area - chord):.1e}"
    )
    assert vol_err < 1e-13 and worst < 1e-12 and abs(area - chord) < 1e-14
    with pytest.raises(ValueError, match="initial.radius"):
        uniform_ball(g, c, -1.0)
    with pytest.raises(ValueError, match="initial.centre"):
        uniform_ball(g, [5.0, 5.0, 5.0], 0.1)
    with pytest.warns(UserWarning, match="initial.uniform_ball"):
        uniform_ball(g, [1.0, 0.0, 0.0], 0.2)


# ---- tokens and arrays ---------------------------------------------------------------------------
def test_from_tokens_ngp_single_and_mass():
    g = Grid([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [4, 5, 6])
    rho = from_tokens(g, [[0.3, 1.1, 2.9]])
    assert rho[1, 2, 5] == 1.0 / g.cell_volume and np.count_nonzero(rho) == 1
    rng = np.random.default_rng(1)
    tok = rng.uniform(0.0, 1.0, (1000, 3)) * [1.0, 2.0, 3.0]
    wts = rng.uniform(0.5, 1.5, 1000)
    for method in ("ngp", "cic"):
        rho = from_tokens(g, tok, weights=wts, method=method, mass=2.0)
        err = abs(g.integrate(rho) - 2.0)
        print(f"\n{method}: mass error {err:.1e}, min {rho.min():.2e}")
        assert err < 1e-13 and rho.min() >= 0


def test_from_tokens_cic_properties():
    g = Grid([-1.0, -1.0], [1.0, 1.0], 10)
    # a token on a cell centre deposits exactly like NGP
    tok = [[g.centres(0)[3], g.centres(1)[6]]]
    np.testing.assert_allclose(from_tokens(g, tok, method="cic"), from_tokens(g, tok))
    # CIC preserves the first moment exactly for tokens half a cell inside the box
    rng = np.random.default_rng(2)
    tok = rng.uniform(-0.85, 0.85, (500, 2))
    rho = from_tokens(g, tok, method="cic")
    x, y = g.mesh()
    m1 = np.array([np.sum(rho * x), np.sum(rho * y)]) * g.cell_volume
    err = np.abs(m1 - tok.mean(axis=0)).max()
    print(f"\ncic first-moment error {err:.1e}")
    assert err < 1e-14
    # periodic wrap-around of the cloud and of tokens outside a periodic axis
    gp = Grid([0.0], [1.0], 10, boundary="periodic")
    rho = from_tokens(gp, [[0.01], [1.52]], method="cic")
    assert abs(gp.integrate(rho) - 1.0) < 1e-15 and rho[9] > 0 and rho[0] > 0


def test_from_tokens_dropped_and_bad_input():
    g = Grid([0.0, 0.0], [1.0, 1.0], 4)
    with pytest.warns(UserWarning, match=r"initial.tokens: 0.25 of the token mass \(1 of 4"):
        rho = from_tokens(g, [[0.1, 0.1], [0.2, 0.9], [0.5, 0.5], [1.5, 0.5]])
    assert abs(g.integrate(rho) - 0.75) < 1e-15
    with pytest.raises(ValueError, match="initial.tokens: all 2 tokens"):
        from_tokens(g, [[2.0, 2.0], [-1.0, 0.5]])
    for kwargs, field in [
        (dict(tokens=[[0.1, 0.1, 0.1]]), "initial.tokens"),
        (dict(tokens=[[0.1, np.nan]]), "initial.tokens"),
        (dict(tokens=[[0.1, 0.1]], weights=[-1.0]), "initial.weights"),
        (dict(tokens=[[0.1, 0.1]], weights=[1.0, 2.0]), "initial.weights"),
        (dict(tokens=[[0.1, 0.1]], method="tsc"), "initial.method"),
        (dict(tokens=[[0.1, 0.1]], mass=-1.0), "initial.mass"),
    ]:
        with pytest.raises(ValueError, match=field):
            from_tokens(g, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_tokens(g, [[1.0, 1.0], [0.0, 0.0]])  # closed box: no warning


def test_from_array():
    g = Grid([0.0, 0.0], [1.0, 1.0], [3, 2])
    src = np.arange(6, dtype=np.int64).reshape(3, 2)
    out = from_array(g, src)
    assert out.dtype == np.float64 and np.array_equal(out, src)
    out2 = from_array(g, out)
    assert out2 is not out and not np.shares_memory(out, out2)
    for bad, msg in [
        (np.zeros((2, 3)), "initial.values: expected shape"),
        (np.full((3, 2), np.nan), "initial.values: contains NaN"),
        (-np.ones((3, 2)), "initial.values: negative"),
    ]:
        with pytest.raises(ValueError, match=msg):
            from_array(g, bad)
    with pytest.raises(ValueError, match="initial.rho0"):
        from_array(g, np.zeros(3), name="initial.rho0")
