"""The Transformer PDE on the circle S^1 (docs/theory.md, 'Attention dynamics on the sphere'
and 'The circle on the grid'): exact initial data, the FFT and direct velocities, the
finite-volume scheme on the periodic angle (mass, positivity, fifth order) and the linear
growth rates against lambda_k = k^2 I_k(beta) / (beta I_0(beta))."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ive

import tpde
from tpde.grid.circle import (
    TWO_PI,
    circle_copies,
    circle_grid,
    clusters,
    fourier_modes,
    mode_amplitude,
    smooth_noise,
    uniform_modes,
    von_mises,
    von_mises_mixture,
)
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.validation.sphere_rates import (
    circle_grid_rate,
    circle_sampled_token_rates,
    circle_token_rate,
    linear_rate,
)
from tpde.validation.sphere_tokens import (
    CircleTokens,
    circle_token_velocity,
    mode_tokens,
    token_modes,
)
from tpde.variants import Head
from tpde.variants.spherical import CircleAttention, circle_head, interaction_energy

MIXTURE = [(0.6, 0.5, 2.0), (0.4, 3.0, 3.0)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """1-D runs are too small for numba's workers (on shared cores one thread is ~8x
    faster here); the previous count is restored."""
    import numba

    before = numba.get_num_threads()
    tpde.set_num_threads(1)
    yield
    tpde.set_num_threads(before)


def mixture_density(theta: np.ndarray) -> np.ndarray:
    return sum(w * np.exp(k * np.cos(theta - m)) / (TWO_PI * np.i0(k)) for w, m, k in MIXTURE)


def reference_velocity(theta, A, C, density, normalised=True, m=8192):
    """theta' by a fine trapezoid rule of the point density (spectral for periodic data)."""
    phi = TWO_PI * (np.arange(m) + 0.5) / m
    rho = density(phi) * TWO_PI / m
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    y = np.stack([np.cos(phi), np.sin(phi)], 1)
    t = np.stack([-np.sin(theta), np.cos(theta)], 1)
    kernel = np.exp((x @ np.asarray(A).T) @ y.T)
    numerator = np.einsum("ij,ij->i", ((kernel * rho) @ y) @ np.asarray(C).T, t)
    return numerator / (kernel @ rho) if normalised else numerator


# ---- the grid -------------------------------------------------------------------------------
def test_circle_grids():
    g = circle_grid(64, copies=4)
    assert circle_copies(g) == 4 and g.upper[0] == pytest.approx(TWO_PI / 4)
    with pytest.raises(ValueError, match="2 pi / m"):
        circle_copies(tpde.grid.Grid([0.0], [2.0], [16], "periodic"))
    with pytest.raises(ValueError, match="periodic"):
        circle_copies(tpde.grid.Grid([0.0], [TWO_PI], [16]))


def test_von_mises_cell_averages_are_exact():
    g = circle_grid(48)
    rho = von_mises_mixture(g, MIXTURE)
    assert g.integrate(rho) == pytest.approx(1.0, abs=2e-15)
    # each cell against a fine composite rule
    edges = g.edges(0)
    fine = np.linspace(0.0, 1.0, 2001)
    for i in (0, 7, 20, 41):
        points = edges[i] + (edges[i + 1] - edges[i]) * fine
        values = mixture_density(points)
        average = np.trapezoid(values, points) / (edges[i + 1] - edges[i])
        assert rho[i] == pytest.approx(average, rel=1e-7)  # the trapezoid rule's own error
    # a very concentrated one keeps relative accuracy in its far tail
    sharp = von_mises(circle_grid(64), 1.0, 400.0)
    assert circle_grid(64).integrate(sharp) == pytest.approx(1.0, abs=1e-14)
    tail = sharp[32]  # opposite the mean: e^{-800} / ... : positive, not zero
    assert tail > 0 and math.isfinite(math.log(tail))


def test_fourier_modes_are_spectral():
    g = circle_grid(64)
    kappa, mean = 3.0, 0.7
    modes = fourier_modes(von_mises(g, mean, kappa), g, 12)
    k = np.arange(13)
    exact = ive(k, kappa) / ive(0, kappa) * np.exp(-1j * k * mean)
    assert np.abs(modes - exact).max() < 1e-14
    rho = uniform_modes(g, [(3, 0.2, 0.4), (5, 0.1, -1.0)])
    amplitude = mode_amplitude(rho, g, 3)
    assert amplitude == pytest.approx(0.1, rel=1e-13)  # (1 + a cos) has |c_k| / c_0 = a / 2
    reduced = circle_grid(16, copies=5)
    assert mode_amplitude(uniform_modes(reduced, [(5, 1e-8, 0.0)]), reduced, 5) == pytest.approx(
        0.5e-8, rel=1e-9
    )
    with pytest.raises(ValueError, match="multiple"):
        uniform_modes(reduced, [(3, 0.1, 0.0)])


def test_clusters_and_noise():
    g = circle_grid(256)
    rho = von_mises_mixture(g, [(0.5, 1.0, 40.0), (0.3, 3.0, 40.0), (0.2, 5.0, 40.0)])
    angles, masses = clusters(rho, g)
    assert np.allclose(angles, [1.0, 3.0, 5.0], atol=g.spacing[0])
    assert np.allclose(masses, [0.5, 0.3, 0.2], atol=1e-6)
    noise = smooth_noise(g, 1e-3, 10, seed=3)
    assert g.integrate(noise) == pytest.approx(1.0, abs=1e-14)
    assert np.abs(noise * TWO_PI - 1.0).max() <= 1e-3 * (1 + 1e-9)
    assert clusters(noise, g)[0].size == 0


# ---- the velocity ---------------------------------------------------------------------------
@pytest.mark.parametrize("beta", [1.0, 4.0, 16.0])
def test_fft_velocity_is_spectral_and_direct_is_eighth_order(beta):
    g = circle_grid(128)
    rho = von_mises_mixture(g, MIXTURE)
    faces = g.edges(0)
    exact = reference_velocity(faces, beta * np.eye(2), np.eye(2), mixture_density)
    fft = CircleAttention(circle_head(beta), engine="fft").at(rho, g, 0.0, [0.5])[0]
    direct = CircleAttention(circle_head(beta), engine="direct").at(rho, g, 0.0, [0.5])[0]
    assert fft.shape == (129,) and fft[0] == fft[-1]
    assert np.abs(fft - exact).max() < 5e-15
    assert np.abs(direct - exact).max() < 1e-9


def test_general_attention_matrices():
    g = circle_grid(128)
    rho = von_mises_mixture(g, MIXTURE)
    theta = g.centres(0)
    V = np.array([[0.5, -0.2], [0.8, 1.1]])
    # a non-conformal A: the Jacobi-Anger series ("fft", chosen by "auto") and dense sums
    A = np.array([[1.0, 0.7], [-0.3, 2.0]])
    field = CircleAttention(Head(A, V))
    assert field.choose(Head(A, V)) == "fft"
    exact = reference_velocity(theta, A, V, mixture_density)
    u = field.at(rho, g, 0.0, [0.0])[0]
    assert np.abs(u - exact).max() < 1e-10
    u = CircleAttention(Head(A, V), engine="direct").at(rho, g, 0.0, [0.0])[0]
    assert np.abs(u - exact).max() < 1e-10
    # a conformal A with a general value map: FFT (the reflection part of C included)
    A = np.array([[1.5, -0.6], [0.6, 1.5]])
    exact = reference_velocity(theta, A, V, mixture_density)
    for normalised in (True, False):
        exact = reference_velocity(theta, A, V, mixture_density, normalised)
        for engine in ("fft", "direct"):
            u = CircleAttention(Head(A, V), normalised, engine).at(rho, g, 0.0, [0.0])[0]
            assert np.abs(u - exact).max() < 1e-10 * np.abs(exact).max(), (normalised, engine)


def test_reduced_grid_velocity_equals_the_full_circle():
    modes = [(6, 0.3, 0.2), (12, 0.1, 1.0)]
    full, reduced = circle_grid(96), circle_grid(16, copies=6)
    u_full = CircleAttention(circle_head(5.0)).at(uniform_modes(full, modes), full, 0, [0.5])
    u_red = CircleAttention(circle_head(5.0)).at(uniform_modes(reduced, modes), reduced, 0, [0.5])
    assert np.abs(u_full[0, :17] - u_red[0]).max() < 1e-15
    with pytest.raises(ValueError, match="rotation-invariant"):
        CircleAttention(Head([[1.0, 0.0], [0.0, 2.0]], np.eye(2))).at(
            uniform_modes(reduced, modes), reduced, 0, [0.5]
        )


def test_interaction_energy():
    g = circle_grid(128)
    rho = von_mises_mixture(g, MIXTURE)
    m = 2048
    phi = TWO_PI * (np.arange(m) + 0.5) / m
    rho_pt = mixture_density(phi) * TWO_PI / m
    exact = np.exp(4.0 * np.cos(phi[:, None] - phi[None, :])) @ rho_pt @ rho_pt / 8.0
    assert interaction_energy(rho, g, 4.0) == pytest.approx(exact, rel=1e-14)
    # the uniform measure: I_0(beta) / (2 beta)
    assert interaction_energy(uniform_modes(g), g, 4.0) == pytest.approx(
        np.i0(4.0) / 8.0, rel=1e-14
    )


# ---- the finite-volume scheme on the angle --------------------------------------------------
def circle_run(cells: int, beta: float = 4.0, t_end: float = 1.0, **scheme):
    g = circle_grid(cells)
    rho = von_mises_mixture(g, MIXTURE)
    scheme.setdefault("dt_max", 0.5 * g.spacing[0] ** (5.0 / 3.0))
    problem = Problem(
        g, rho, CircleAttention(circle_head(beta)), t_end, scheme=Scheme(**scheme), snapshots=5
    )
    return g, Solver(problem).run()


def test_mass_and_positivity():
    g, result = circle_run(128)
    masses = np.array([s.mass for s in result.snapshots])
    assert np.abs(masses - 1.0).max() < 1e-13
    assert result.final.min() >= 0.0
    # clusters sharpen the density; the limiter keeps it non-negative
    g = circle_grid(64)
    rho = smooth_noise(g, 0.3, 6, seed=1)
    problem = Problem(g, rho, CircleAttention(circle_head(16.0)), 8.0, snapshots=3)
    result = Solver(problem).run()
    assert result.final.min() >= 0.0 and result.limited_stages > 0
    assert abs(g.integrate(result.final) - 1.0) < 1e-13


def test_fifth_order_on_smooth_data():
    finals = {n: circle_run(n)[1].final for n in (32, 64, 128, 256)}
    errors = []
    for n in (32, 64, 128):
        reference = finals[256].reshape(n, -1).mean(axis=1)
        errors.append(np.abs(finals[n] - reference).sum() * TWO_PI / n)
    # the 256 reference adds its own error: orders from the two finest levels only
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    print("\nS^1, WENO5-Z + SSP-RK3, beta = 4, L1 errors vs 256 cells:")
    for n, e in zip((32, 64, 128), errors, strict=True):
        print(f"  {n:4d} {e:.3e}")
    print("  orders", np.round(orders, 2))
    assert orders[-1] > 4.5


# ---- linear growth rates --------------------------------------------------------------------
@pytest.mark.parametrize("k, beta", [(1, 1.0), (3, 4.0), (6, 16.0), (11, 64.0), (20, 4.0)])
def test_growth_rates_on_the_reduced_grid(k, beta):
    row = circle_grid_rate(k, beta, step=0.05)
    assert row["error"] < 1e-5 and row["mass_change"] < 1e-13
    assert row["growth"] == pytest.approx(math.e, rel=1e-5)


def test_growth_rate_on_the_whole_circle():
    row = circle_grid_rate(11, 64.0, cells=64, copies=1)
    assert row["error"] < 1e-5
    assert linear_rate(11, 64.0) == pytest.approx(row["measured"], rel=1e-5)


@pytest.mark.slow
def test_growth_rate_table():
    """k = 1..20, beta in {1, 4, 16, 64}: the reduced grids (16 cells per period) within
    1e-6; the whole circle (64 cells) where its round-off floor allows."""
    rows = []
    for beta in (1.0, 4.0, 16.0, 64.0):
        for k in range(1, 21):
            reduced = circle_grid_rate(k, beta, step=0.02)
            full = circle_grid_rate(k, beta, cells=64, copies=1)
            rows.append((reduced, full))
    print("\nbeta   k   lambda_k (formula)  measured (m = k)   rel. error", end="")
    print("  whole circle  rel. error")
    for reduced, full in rows:
        print(
            f"{reduced['beta']:4g} {reduced['k']:3d}  {reduced['formula']:.10e}  "
            f"{reduced['measured']:.10e}  {reduced['error']:.1e}     "
            f"{full['measured']: .6e}  {full['error']:.1e}"
        )
    assert max(r["error"] for r, _ in rows) < 1e-6
    for _, full in rows:
        fastest = max(linear_rate(j, full["beta"]) for j in range(1, 32))
        if full["formula"] > 1e-4 * fastest:
            assert full["error"] < 1e-3


# ---- tokens on the circle -------------------------------------------------------------------
def test_token_sums_fourier_equals_direct():
    rng = np.random.default_rng(0)
    theta = rng.uniform(0.0, TWO_PI, 1500)
    weights = rng.uniform(0.5, 1.5, theta.size)
    weights /= weights.sum()
    heads = [circle_head(16.0), Head([[1.5, -0.6], [0.6, 1.5]], [[0.5, -0.2], [0.8, 1.1]])]
    for head in heads:
        for normalised in (True, False):
            fourier = circle_token_velocity(theta, weights, head, normalised, "fourier")
            direct = circle_token_velocity(theta, weights, head, normalised, "direct")
            assert np.abs(fourier - direct).max() < 1e-13 * np.abs(direct).max()
    # the same field as the grid's on the empirical measure of a fine grid
    g = circle_grid(256)
    rho = von_mises_mixture(g, MIXTURE)
    fft = CircleAttention(circle_head(4.0)).at(rho, g, 0.0, [0.0])[0]
    tokens = circle_token_velocity(g.centres(0), rho / rho.sum(), circle_head(4.0))
    assert np.abs(fft - tokens).max() < 1e-4  # the midpoint rule's O(h^2) on the tokens


def test_token_rk4_is_fourth_order_and_stays_on_the_circle():
    theta0 = np.random.default_rng(1).uniform(0.0, TWO_PI, 64)
    finals = []
    for dt in (0.2, 0.1, 0.05, 0.025):
        system = CircleTokens(theta0, circle_head(4.0))
        finals.append(system.integrate([0.0, 2.0], dt)[-1])
    gaps = [
        np.abs(np.angle(np.exp(1j * (a - b)))).max()
        for a, b in zip(finals[:-1], finals[1:], strict=True)
    ]
    orders = np.log2(np.array(gaps[:-1]) / np.array(gaps[1:]))
    assert orders.min() > 3.7, orders


def test_mode_tokens_are_the_quantiles():
    theta = mode_tokens(1000, 3, 0.2, phase=0.4)
    cdf = (theta + 0.2 * (np.sin(3 * (theta - 0.4)) + math.sin(1.2)) / 3) / TWO_PI
    assert np.abs(cdf - (np.arange(1000) + 0.5) / 1000).max() < 1e-15
    modes = token_modes(theta, None, 6)
    assert abs(modes[3]) == pytest.approx(0.1, rel=1e-6)  # a / 2, as on the grid
    assert np.abs(token_modes(mode_tokens(1000, 3, 0.0), None, 20)[1:]).max() < 1e-14


def test_quasi_uniform_tokens_follow_the_linear_rate():
    row = circle_token_rate(6, 16.0, n=2000, noise_span=10.0)
    assert row["error"] < 1e-6


@pytest.mark.slow
def test_token_rate_tables():
    """n = 10^4 tokens: quasi-uniform (quantile) tokens follow the rates; i.i.d. tokens,
    whose modes all start at the sampling noise n^-1/2, do not."""
    print("\nquasi-uniform tokens, n = 10^4: beta k formula measured rel. error")
    for beta in (16.0, 64.0):
        for k in (1, 3, 6, 11, 20):
            row = circle_token_rate(k, beta, step=0.25)
            print(
                f"  {beta:4g} {k:3d} {row['formula']:.8e} {row['measured']:.8e} {row['error']:.1e}"
            )
            assert row["error"] < 1e-4
    print("i.i.d. tokens, n = 10^4, one run per beta: beta k formula measured rel. error |c_k(0)|")
    for beta in (4.0, 16.0, 64.0):
        rows = circle_sampled_token_rates(beta, range(1, 21))
        for row in rows:
            print(
                f"  {beta:4g} {row['k']:3d} {row['formula']:.5e} {row['measured']: .5e} "
                f"{row['error']:.1e} {row['initial']:.1e}"
            )
        # the sampling noise: far from the formula except near the fastest modes
        assert max(r["error"] for r in rows) > 1e-1


# ---- causal (masked) attention on the circle ------------------------------------------------
def masked_run(density, positions, t_end=2.0, beta=8.0, dt=None):
    from tpde.variants.masked import CausalAttention

    g = circle_grid(density.shape[-1])
    field = CausalAttention(CircleAttention(circle_head(beta)))
    field.attention = False  # no box to hold the measure: the circle is periodic
    problem = Problem(
        g,
        density,
        field,
        t_end,
        positions=positions,
        snapshots=3,
        scheme=Scheme(dt=dt),
    )
    return Solver(problem).run()


def test_masked_position_independent_data_follow_the_unmasked_flow():
    from tpde.grid import Positions

    positions = Positions(6, 0.2)
    g = circle_grid(64)
    rho = von_mises_mixture(g, MIXTURE)
    masked = masked_run(positions.product(rho, g), positions).final
    unmasked = Solver(Problem(g, rho, CircleAttention(circle_head(8.0)), 2.0, snapshots=3)).run()
    weights = positions.weights
    for k in range(positions.count):
        assert np.abs(masked[k] / weights[k] - unmasked.final).max() < 1e-12
    assert np.allclose(positions.marginal(masked, g), weights, rtol=0, atol=1e-14)


def test_masked_attention_is_causal():
    from tpde.grid import Positions

    positions = Positions(5, 0.2)
    g = circle_grid(48)
    slices = np.stack([von_mises(g, 0.8 * k, 3.0, mass=w) for k, w in enumerate(positions.weights)])
    # a fixed step: the CFL step would depend on every slice
    base = masked_run(slices, positions, t_end=1.0, dt=0.02).final
    changed = slices.copy()
    changed[3] = von_mises(g, 2.0, 9.0, mass=positions.weights[3])
    other = masked_run(changed, positions, t_end=1.0, dt=0.02).final
    assert np.array_equal(base[:3], other[:3])  # bit for bit: slices before 3
    assert np.abs(base[4] - other[4]).max() > 1e-3  # the last slice sees slice 3
    # the sink attends to itself only: the unmasked flow of its own law
    sink = Solver(
        Problem(
            g,
            slices[0] / positions.weights[0],
            CircleAttention(circle_head(8.0)),
            1.0,
            scheme=Scheme(dt=0.02),
        )
    ).run()
    assert np.abs(base[0] / positions.weights[0] - sink.final).max() < 1e-12
