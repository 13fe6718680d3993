"""Tests of tpde.validation.metrics: Wasserstein distances, Bures-Wasserstein, error norms.

Every number is checked against an independent reference: closed forms (1-D Gaussians,
translations, hand-computed transport costs), scipy adaptive quadrature of the CDF / quantile
integrals, scipy.stats.wasserstein_distance and ot.wasserstein_1d on finely subdivided cells
(with their rigorous discretisation bounds), scipy.linalg.sqrtm. Run ``pytest -s`` to see them.
"""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest
from scipy.integrate import quad
from scipy.linalg import sqrtm
from scipy.stats import norm, wasserstein_distance

from tpde.grid import Grid, Positions, from_tokens, gaussian, uniform_ball, uniform_box
from tpde.validation.metrics import (
    Distance,
    bures_wasserstein,
    conditional_wasserstein,
    conditional_wasserstein_tokens,
    density_errors,
    moment_errors,
    wasserstein,
    wasserstein_1d,
    wasserstein_1d_tokens,
    wasserstein_tokens,
)
from tpde.validation.particles import sample_sliced_tokens

M1, S1, M2, S2 = 0.3, 0.8, -0.5, 1.3  # two 1-D Gaussians
MA, SA = np.array([0.3, -0.2]), np.array([[1.0, 0.3], [0.3, 0.6]])
MB, SB = np.array([-0.4, 0.5]), np.array([[0.5, -0.1], [-0.1, 0.9]])


def _w1_gaussians_1d() -> float:
    """``int |Phi((x-m1)/s1) - Phi((x-m2)/s2)| dx`` by adaptive quadrature (one crossing)."""
    cross = (M1 * S2 - M2 * S1) / (S2 - S1)
    val, err = quad(
        lambda x: abs(norm.cdf(x, M1, S1) - norm.cdf(x, M2, S2)),
        -40,
        40,
        points=[cross],
        limit=400,
        epsabs=1e-14,
        epsrel=1e-13,
    )
    assert err < 1e-11
    return val


# ---- 1-D exact -----------------------------------------------------------------------------------
def test_1d_gaussians_converge_to_closed_form():
    w2_ref = math.hypot(M1 - M2, S1 - S2)
    w1_ref = _w1_gaussians_1d()
    print(f"\n1-D N({M1},{S1}^2) vs N({M2},{S2}^2): W2 = {w2_ref:.12f}, W1 = {w1_ref:.12f}")
    print("  cells   W2 error    W1 error")
    e2, e1 = [], []
    for n in (50, 100, 200, 400, 800):
        g = Grid([-10], [10], [n])
        a, b = gaussian(g, [M1], [[S1**2]]), gaussian(g, [M2], [[S2**2]])
        e2.append(abs(wasserstein_1d(a, b, g, p=2) - w2_ref))
        e1.append(abs(wasserstein_1d(a, b, g, p=1) - w1_ref))
        print(f"  {n:5d}  {e2[-1]:.3e}  {e1[-1]:.3e}")
    for e in (e2, e1):
        assert all(e[i + 1] < e[i] / 3.5 for i in range(len(e) - 1))  # O(h^2)
    assert e2[-1] < 2e-5 and e1[-1] < 2e-5


def test_1d_exact_on_a_fixed_grid_vs_quadrature():
    """The piecewise-constant W_p itself, against adaptive quadrature of the definitions."""
    g = Grid([-6], [6], [37])
    e = g.edges(0)
    a, b = gaussian(g, [M1], [[S1**2]]), gaussian(g, [M2], [[S2**2]])
    fa = np.concatenate(([0], np.cumsum(a))) / a.sum()
    fb = np.concatenate(([0], np.cumsum(b))) / b.sum()
    assert np.all(np.diff(fa) > 0) and np.all(np.diff(fb) > 0)
    w1, _ = quad(
        lambda x: abs(np.interp(x, e, fa) - np.interp(x, e, fb)),
        e[0],
        e[-1],
        points=e[1:-1],
        limit=500,
        epsabs=1e-14,
        epsrel=1e-13,
    )
    w2sq, _ = quad(
        lambda u: (np.interp(u, fa, e) - np.interp(u, fb, e)) ** 2,
        0,
        1,
        points=np.unique(np.concatenate((fa, fb)))[1:-1],
        limit=500,
        epsabs=1e-14,
        epsrel=1e-13,
    )
    got1, got2 = wasserstein_1d(a, b, g, 1), wasserstein_1d(a, b, g, 2)
    print(
        f"\n37 cells: W1 {got1:.15f} (quad {w1:.15f}), W2 {got2:.15f} (quad {math.sqrt(w2sq):.15f})"
    )
    assert abs(got1 - w1) < 1e-12
    assert abs(got2 - math.sqrt(w2sq)) < 1e-12


def test_1d_translation_is_exact():
    g = Grid([-10], [10], [200])
    h = g.spacing[0]
    a = gaussian(g, [M1], [[S1**2]])
    b = gaussian(g, [M1 + 7 * h], [[S1**2]])  # exact cell averages, 7 cells over
    box_a = uniform_box(g, [-2.0], [1.0])
    box_b = uniform_box(g, [-2.0 - 13 * h], [1.0 - 13 * h])
    for p in (1, 2):
        err = abs(wasserstein_1d(a, b, g, p) - 7 * h)
        err_box = abs(wasserstein_1d(box_a, box_b, g, p) - 13 * h)
        print(f"\nshift 7h / 13h, p={p}: |W_p - shift| = {err:.2e} / {err_box:.2e}")
        assert err < 1e-12 and err_box < 1e-12


def test_1d_tokens_hand_computed():
    g = Grid([-1], [2], [30])  # box [0, 1] on cell edges
    u = uniform_box(g, [0.0], [1.0])
    cases = [  # (tokens, weights, W1, W2)
        ([0.5], None, 0.25, math.sqrt(1 / 12)),
        ((np.arange(7) + 0.5) / 7, None, 1 / 28, 1 / (7 * math.sqrt(12))),
        ([0.9, 0.2], [0.7, 0.3], 0.21, math.sqrt((0.2**3 + 0.1**3 + 0.6**3 + 0.1**3) / 3)),
    ]
    for x, w, w1, w2 in cases:
        got1 = wasserstein_1d_tokens(u, g, x, w, p=1)
        got2 = wasserstein_1d_tokens(u, g, np.reshape(x, (-1, 1)), w, p=2)
        print(
            f"\nU[0,1] vs {np.round(x, 3).tolist()}: W1 {got1:.15f} ({w1:.15f}), "
            f"W2 {got2:.15f} ({w2:.15f})"
        )
        assert abs(got1 - w1) < 1e-14 and abs(got2 - w2) < 1e-14
        d = wasserstein_tokens(u, g, x, w, p=2)
        assert isinstance(d, Distance) and d.value == got2 and d.bound == 0.0


def test_1d_tokens_vs_scipy_and_pot_on_subdivided_cells():
    rng = np.random.default_rng(3)
    g = Grid([-5], [5], [50])
    h = g.spacing[0]
    dens = gaussian(g, [0.4], [[1.1]])
    x = rng.normal(-0.2, 0.7, size=500)
    w = rng.random(500)
    m = 400  # points per cell: W_p(cell, m midpoints) <= h / (4 m) (p=1), h / (m sqrt12)
    sub = (g.edges(0)[:-1, None] + h * (np.arange(m) + 0.5)[None, :] / m).ravel()
    sub_w = np.repeat(dens / dens.sum() / m, m)
    ref1 = wasserstein_distance(sub, x, sub_w, w)
    ref2 = math.sqrt(ot.wasserstein_1d(sub, x, sub_w, w / w.sum(), p=2))
    got1 = wasserstein_1d_tokens(dens, g, x, w, p=1)
    got2 = wasserstein_1d_tokens(dens, g, x, w, p=2)
    print(
        f"\n50 cells vs 500 tokens: W1 {got1:.10f} (scipy {ref1:.10f}, bound {h / (4 * m):.1e})"
        f", W2 {got2:.10f} (POT {ref2:.10f}, bound {h / (m * math.sqrt(12)):.1e})"
    )
    assert abs(got1 - ref1) <= h / (4 * m)
    assert abs(got2 - ref2) <= h / (m * math.sqrt(12)) + 1e-12


# ---- POT, 2-D / 3-D ------------------------------------------------------------------------------
def test_translation_exact_2d_3d():
    g2 = Grid([-3, -3], [3, 3], [20, 20])
    h = np.array(g2.spacing)
    shift = np.array([2, -1]) * h
    a = uniform_ball(g2, [0.1, -0.2], 1.3)
    b = uniform_ball(g2, np.array([0.1, -0.2]) + shift, 1.3)
    g3 = Grid([-2, -2, -2], [2, 2, 2], [8, 8, 8])
    shift3 = np.array([1, 0, -1]) * np.array(g3.spacing)
    a3 = uniform_ball(g3, [0.0, 0.1, 0.0], 1.0)
    b3 = uniform_ball(g3, np.array([0.0, 0.1, 0.0]) + shift3, 1.0)
    for p in (1, 2):
        d2 = wasserstein(a, b, g2, p=p)
        d3 = wasserstein(a3, b3, g3, p=p)
        e2 = abs(d2.value - np.linalg.norm(shift))
        e3 = abs(d3.value - np.linalg.norm(shift3))
        print(
            f"\ntranslation p={p}: 2-D |W - |s|| = {e2:.2e} ({d2.support_a} atoms), "
            f"3-D {e3:.2e} ({d3.support_a} atoms)"
        )
        assert e2 < 1e-12 and e3 < 1e-12
        assert d2.method == "exact" and d2.reg is None and d2.coarsening == 1


def test_2d_gaussians_vs_bures_wasserstein():
    ref = bures_wasserstein(MA, SA, MB, SB)
    print(f"\n2-D Gaussians, Bures-Wasserstein W2 = {ref:.10f}\n  cells  atoms   W2 error")
    errs = []
    for n in (16, 24, 32):
        g = Grid([-6, -6], [6, 6], [n, n])
        d = wasserstein(gaussian(g, MA, SA), gaussian(g, MB, SB), g, p=2)
        errs.append(abs(d.value - ref))
        print(f"  {n:4d}²  {d.support_a:5d}  {errs[-1]:.3e}  (bound {d.bound:.2f})")
        assert errs[-1] <= d.bound
    assert errs[1] < errs[0] and errs[2] < errs[1]
    assert errs[0] / errs[2] > 3.0 and errs[2] < 0.02  # ~O(h^2)


def test_entropic_above_exact_and_converging():
    g = Grid([-6, -6], [6, 6], [16, 16])
    a, b = gaussian(g, MA, SA), gaussian(g, MB, SB)
    exact = wasserstein(a, b, g).value
    h2 = g.spacing[0] ** 2
    print(f"\n16² exact W2 = {exact:.10f}\n  eps/h²   entropic - exact")
    gaps = []
    for r in (1.0, 0.5, 0.25):
        d = wasserstein(a, b, g, method="entropic", reg=r * h2)
        assert d.reg == r * h2 and d.method == "entropic"
        gaps.append(d.value - exact)
        print(f"  {r:5.2f}    {gaps[-1]:.3e}")
    assert all(gap > -1e-9 for gap in gaps)
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 0.02
    assert wasserstein(a, b, g, method="entropic").reg == h2  # default eps = h^p


def test_coarsening_within_its_bound():
    g = Grid([-6, -6], [6, 6], [32, 32])
    a, b = gaussian(g, MA, SA), gaussian(g, MB, SB)
    fine = wasserstein(a, b, g, p=1)
    coarse = wasserstein(a, b, g, p=1, max_cells=300)
    k = coarse.coarsening
    diag = float(np.linalg.norm(g.spacing))
    print(
        f"\n32² W1: fine {fine.value:.6f} ({fine.support_a} atoms), k={k} "
        f"{coarse.value:.6f} ({coarse.support_a} atoms), bound (k-1)|h| = {(k - 1) * diag:.3f}"
    )
    assert k == 2 and max(coarse.support_a, coarse.support_b) <= 300
    assert abs(coarse.value - fine.value) <= (k - 1) * diag


def test_tokens_2d_one_atom_and_consistency():
    g = Grid([-2, -2], [2, 2], [16, 16])
    h = g.spacing[0]
    cell = uniform_box(g, [0.0, 0.0], [h, h])  # one cell -> one atom at (h/2, h/2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    w = rng.random(40)
    w /= w.sum()
    dist = np.linalg.norm(x - h / 2, axis=1)
    for p in (1, 2):
        got = wasserstein_tokens(cell, g, x, w, p=p).value
        ref = float(np.sum(w * dist**p)) ** (1 / p)
        print(f"\none atom vs 40 tokens p={p}: {got:.15f} (sum w |x - c|^p: {ref:.15f})")
        assert abs(got - ref) < 1e-12
    a, b = gaussian(g, [0.2, 0.0], np.eye(2) * 0.3), gaussian(g, [-0.3, 0.4], np.eye(2) * 0.2)
    centres = np.stack([c.ravel() for c in g.mesh(sparse=False)], axis=1)
    grid_grid = wasserstein(a, b, g, p=2).value
    grid_tok = wasserstein_tokens(a, g, centres, b.ravel(), p=2).value
    assert abs(grid_grid - grid_tok) < 1e-12
    ent = wasserstein_tokens(a, g, centres, b.ravel(), p=2, method="entropic", reg=0.1)
    assert ent.value > grid_tok - 1e-9 and ent.reg == 0.1


# ---- Gaussians -----------------------------------------------------------------------------------
def test_bures_wasserstein_closed_forms():
    one = bures_wasserstein([M1], [[S1**2]], [M2], [[S2**2]])
    assert abs(one - math.hypot(M1 - M2, S1 - S2)) < 1e-14
    a, b = np.array([0.5, 2.0, 0.01]), np.array([1.5, 0.3, 0.02])
    m1, m2 = np.array([1.0, 0.0, -1.0]), np.array([0.5, 0.5, 0.0])
    diag = bures_wasserstein(m1, np.diag(a), m2, np.diag(b))
    ref = math.sqrt(np.sum((m1 - m2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2))
    r = sqrtm(SA)
    general = math.sqrt(np.sum((MA - MB) ** 2) + np.trace(SA + SB - 2 * np.real(sqrtm(r @ SB @ r))))
    got = bures_wasserstein(MA, SA, MB, SB)
    print(
        f"\nBures: 1-D {one:.15f}, diagonal {diag:.15f} ({ref:.15f}), "
        f"general {got:.15f} (scipy sqrtm {general:.15f})"
    )
    assert abs(diag - ref) < 1e-14 and abs(got - general) < 1e-12
    assert bures_wasserstein(MA, SA, MA, SA) < 1e-7  # sqrt of round-off


# ---- error norms ---------------------------------------------------------------------------------
def test_density_and_moment_errors():
    g = Grid([-9, -9], [9, 9], [64, 64])  # tails below 1e-18
    ref = gaussian(g, MA, SA)
    a = ref.copy()
    a[30, 31] += 0.01
    a[10, 5] -= 0.002
    e = density_errors(a, ref, g)
    vol = g.cell_volume
    assert abs(e["L1"] - 0.012 * vol) < 1e-15 and abs(e["Linf"] - 0.01) < 1e-15
    assert abs(e["L1_rel"] - 0.012 * vol / (ref.sum() * vol)) < 1e-15
    assert abs(e["Linf_rel"] - 0.01 / ref.max()) < 1e-15
    exact = moment_errors(ref, g, MA, SA)
    print(f"\nmoments of the exact 64² Gaussian: {exact}")
    assert abs(exact["mass"] - 1) < 1e-12
    assert exact["mean_error"] < 1e-12 and exact["cov_error"] < 1e-12
    off = moment_errors(ref, g, [0.0, 0.0], 1.01 * SA)
    assert abs(off["mean_error"] - np.linalg.norm(MA)) < 1e-12  # absolute at m_ref = 0
    assert abs(off["cov_error"] - 0.01 / 1.01) < 1e-12


# ---- bad input -----------------------------------------------------------------------------------
def test_bad_input_names_the_argument():
    g1, g2 = Grid([-1], [1], [10]), Grid([-1, -1], [1, 1], [6, 6])
    d1, d2 = np.ones(10), np.ones((6, 6))
    cases = [
        (lambda: wasserstein_1d(d1, np.ones(11), g1), "density_b"),
        (lambda: wasserstein_1d(np.zeros(10), d1, g1), "density_a"),
        (lambda: wasserstein_1d(d1, d1, g1, p=3), "p"),
        (lambda: wasserstein_1d(d2, d2, g2), "grid"),
        (lambda: wasserstein_1d(-d1, d1, g1), "density_a"),
        (lambda: wasserstein_1d_tokens(d1, g1, [[0.0, 1.0]]), "tokens"),
        (lambda: wasserstein_1d_tokens(d1, g1, [0.0, 1.0], [1.0]), "weights"),
        (lambda: wasserstein(d2, d2, g2, method="sinkhorn"), "method"),
        (lambda: wasserstein(d2, d2, g2, reg=0.1), "reg"),
        (lambda: wasserstein(d2, d2, g2, method="entropic", reg=-1.0), "reg"),
        (lambda: wasserstein(d2, np.ones((6, 5)), g2), "density_b"),
        (lambda: wasserstein(d2, d2, g2, max_cells=0), "max_cells"),
        (lambda: wasserstein_tokens(np.zeros((6, 6)), g2, [[0.0, 0.0]]), "density"),
        (lambda: wasserstein_tokens(d2, g2, [[0.0, 0.0, 0.0]]), "tokens"),
        (lambda: bures_wasserstein([0.0, 0.0], np.eye(3), [0.0, 0.0], np.eye(2)), "cov_a"),
        (lambda: density_errors(d2, d1, g2), "reference"),
        (lambda: moment_errors(d2, g2, [0.0], np.eye(2)), "mean_ref"),
        (lambda: moment_errors(d2, g2, [0.0, 0.0], np.zeros((2, 2))), "cov_ref"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=rf"^metrics\.{name}: "):
            call()
    g = Grid([-6, -6], [6, 6], [16, 16])
    a, b = gaussian(g, MA, SA), gaussian(g, MB, SB)
    with pytest.raises(ValueError, match=r"^metrics\.num_iter_max: ot\.emd2"):
        wasserstein(a, b, g, num_iter_max=3)
    with pytest.raises(ValueError, match=r"^metrics\.num_iter_max: Sinkhorn"):
        wasserstein(a, b, g, method="entropic", reg=0.01, num_iter_max=20)


# ---- conditional (position-sliced) distances -----------------------------------------------------
def _drifting(grid: Grid, positions: Positions, shift: float = 0.0) -> np.ndarray:
    """Sliced density (S, *grid.shape): slice k a Gaussian whose mean drifts with s_k."""
    d = grid.ndim
    return positions.sliced(
        lambda s: gaussian(grid, np.full(d, s - 0.3 + shift), 0.4 * np.eye(d)), grid
    )


@pytest.mark.parametrize("d", [1, 2])
def test_conditional_zero_on_itself_and_plain_with_one_slice(d):
    g = Grid([-4] * d, [4] * d, [200] if d == 1 else [20, 20])
    positions = Positions(3)
    a, b = _drifting(g, positions), _drifting(g, positions, shift=0.4)
    assert conditional_wasserstein(a, a, g) <= 1e-12
    for p in (1, 2):
        plain = wasserstein(a[2], b[2], g, p=p).value
        one = conditional_wasserstein(a[2:3], b[2:3], g, p=p)
        print(f"\n{d}-D, p={p}: one slice {one:.15f}, plain {plain:.15f}")
        assert one == plain


def test_conditional_1d_two_shifted_slices():
    """Slice 0 shifted by 0.3 = 30 h, slice 1 by 0.5 = 50 h: exact cell averages of translated
    Gaussians are translated arrays, and W_p of a translation is the shift (exact to 1e-12,
    test_1d_translation_is_exact); the tails beyond the box (> 9 sigma) are ~1e-18."""
    g = Grid([-5], [5], [1000])
    sigma, nu = 0.5, np.array([0.25, 0.75])
    a = np.stack([m * gaussian(g, [0.0], [[sigma**2]]) for m in nu])
    b = np.stack(
        [m * gaussian(g, [shift], [[sigma**2]]) for m, shift in zip(nu, (0.3, 0.5), strict=True)]
    )
    w2 = conditional_wasserstein(a, b, g)
    w1 = conditional_wasserstein(a, b, g, p=1)
    flat = conditional_wasserstein(a, b, g, slice_weights=[1.0, 1.0])
    ref2 = math.sqrt(0.25 * 0.3**2 + 0.75 * 0.5**2)
    print(f"\ntwo slices: W_2,nu {w2:.15f} (ref {ref2:.15f}), W_1,nu {w1:.15f}")
    assert abs(w2 - ref2) <= 1e-12
    assert abs(w1 - (0.25 * 0.3 + 0.75 * 0.5)) <= 1e-12
    assert abs(flat - math.sqrt(0.5 * 0.3**2 + 0.5 * 0.5**2)) <= 1e-12
    a3, b3 = np.insert(a, 1, 0.0, axis=0), np.insert(b, 1, 0.0, axis=0)
    assert conditional_wasserstein(a3, b3, g) == w2  # empty in both: skipped
    b3[1] = b3[0]
    with pytest.raises(ValueError, match=r"^metrics\.density_a: slice 1"):
        conditional_wasserstein(a3, b3, g)
    with pytest.raises(ValueError, match=r"^metrics\.density_b: "):
        conditional_wasserstein(a, b[:1], g)
    with pytest.raises(ValueError, match=r"^metrics\.slice_weights: "):
        conditional_wasserstein(a, b, g, slice_weights=[1.0, -1.0])


def test_conditional_tokens_1d_decreases_with_the_sample_size():
    """Each slice by the exact 1-D distance; the sampling error decays like n^{-1/2}."""
    g = Grid([-4], [4], [400])
    positions = Positions(2)
    rho = _drifting(g, positions)
    rows = {}
    for per in (200, 5000):
        values = []
        for seed in range(3):
            x, s, w = sample_sliced_tokens(rho, g, positions, per, seed=seed)
            values.append(conditional_wasserstein_tokens(rho, g, x, s, positions.s, w))
        rows[per] = float(np.mean(values))
    x, s, w = sample_sliced_tokens(rho, g, positions, 200, seed=0)
    nu = positions.marginal(rho, g)
    by_hand = math.sqrt(
        sum(
            nu[k]
            / nu.sum()
            * wasserstein_1d_tokens(rho[k], g, x[k * 200 : (k + 1) * 200], p=2) ** 2
            for k in range(positions.count)
        )
    )
    print(
        f"\n1-D conditional W_2 of sliced tokens: 200/slice {rows[200]:.2e}, "
        f"5000/slice {rows[5000]:.2e}"
    )
    assert abs(conditional_wasserstein_tokens(rho, g, x, s, positions.s, w) - by_hand) <= 1e-14
    assert rows[5000] < rows[200] / 2.5  # sqrt(25) = 5 expected
    with pytest.raises(ValueError, match=r"^metrics\.token_positions: "):
        conditional_wasserstein_tokens(rho, g, x, s + 0.1, positions.s, w)


def test_conditional_tokens_2d_is_the_distance_to_the_binned_tokens():
    g = Grid([-4, -4], [4, 4], [20, 20])
    positions = Positions(2)
    rho = _drifting(g, positions)
    per = 300
    x, s, w = sample_sliced_tokens(rho, g, positions, per, seed=2)
    binned = np.stack(
        [
            from_tokens(g, x[k * per : (k + 1) * per], w[k * per : (k + 1) * per])
            for k in range(positions.count)
        ]
    )
    got = conditional_wasserstein_tokens(rho, g, x, s, positions.s, w)
    ref = conditional_wasserstein(rho, binned, g)
    print(f"\n2-D conditional W_2, {per} tokens/slice: {got:.6f} (binned grid {ref:.6f})")
    assert abs(got - ref) <= 1e-12 and got > 0
