"""Tokens on S^2 (docs/theory.md, 'Tokens on the sphere'): the CF4 Lie group integrator
against an independent high-accuracy solution of the embedded ODE (order printed), the
samplers against closed forms, and the cubed-sphere run against the tokens (spherical moments
within the tokens' sampling noise, measured over seeds; tables printed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from tpde.grid import cubed_sphere as cs
from tpde.validation.s2_tokens import (
    SphereTokens,
    grid_and_tokens,
    sample_cell_tokens,
    sample_von_mises_fisher,
    sphere_token_velocity,
    token_moments,
)

A = 0.5 * np.array([[2.0, 0.7, -0.4], [-0.3, 1.2, 0.9], [0.5, -0.6, 2.5]])
V = np.array([[1.0, -0.8, 0.2], [0.6, 0.9, 0.0], [-0.3, 0.4, 1.1]])
MEAN = [0.3, -0.5, 0.8]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import tpde

    tpde.set_num_threads(1)


def test_cf4_is_fourth_order_on_the_sphere():
    """CF4 against DOP853 (rtol 1e-13) on ``x' = P_x Gamma(x)`` in R^3 (which keeps ``|x|``
    exactly, so the reference needs no projection), 40 tokens, t = 2."""
    x0 = sample_von_mises_fisher(40, MEAN, 1.0, 3)
    w = np.full(40, 1 / 40)

    def rhs(t, y):
        return sphere_token_velocity(y.reshape(-1, 3), w, 2 * A, V).ravel()

    ref = solve_ivp(rhs, (0, 2), x0.ravel(), method="DOP853", rtol=1e-13, atol=1e-14)
    exact = ref.y[:, -1].reshape(-1, 3)
    errors, drift = [], []
    for dt in (0.2, 0.1, 0.05):
        x = SphereTokens(x0, 2 * A, V).integrate([0.0, 2.0], dt)[-1]
        errors.append(np.abs(x - exact).max())
        drift.append(np.abs(np.linalg.norm(x, axis=1) - 1).max())
    orders = [math.log2(errors[i] / errors[i + 1]) for i in range(2)]
    print(
        "\nCF4 vs DOP853: dt 0.2 / 0.1 / 0.05 errors "
        + " ".join(f"{e:.2e}" for e in errors)
        + f"; orders {orders[0]:.2f} {orders[1]:.2f}; | |x| - 1 | <= {max(drift):.1e}"
    )
    assert min(orders) > 3.8 and errors[-1] < 1e-7
    assert max(drift) < 1e-14


def test_samplers_against_closed_forms():
    kappa, n = 4.0, 40_000
    m = np.asarray(MEAN) / np.linalg.norm(MEAN)
    x = sample_von_mises_fisher(n, MEAN, kappa, 1)
    exact = (1 / math.tanh(kappa) - 1 / kappa) * m
    mean, second = token_moments(x)
    # Var <m, x> = 1 - coth^2 k + 1 / k^2 for the vMF on S^2
    sigma = math.sqrt((1 - 1 / math.tanh(kappa) ** 2 + 1 / kappa**2) / n)
    print(f"\nvMF sampler: |mean - exact| {np.abs(mean - exact).max():.1e} (sigma {sigma:.1e})")
    assert np.abs(mean - exact).max() < 5 * sigma and np.trace(second) == pytest.approx(1, 1e-14)
    g = cs.cubed_sphere(8)
    rho = cs.von_mises_fisher(g, MEAN, kappa)
    cells = sample_cell_tokens(rho, g, n, 2)
    assert np.abs(np.linalg.norm(cells, axis=1) - 1).max() < 1e-14
    # the piecewise-constant law's mean differs from the smooth one's by O(h^2) (~1e-3 here)
    gap = np.abs(token_moments(cells)[0] - cs.mean(g, rho)).max()
    print(f"cell sampler: |mean - grid mean| {gap:.1e}")
    assert gap < 5 * sigma + 3e-3


def moment_table(r: dict) -> tuple[float, list[str]]:
    """The largest ``|grid - token mean| / (sd over seeds / sqrt(seeds))`` over times > 0
    and the components of the mean vector and the second moment; the printed table."""
    seeds = r["token_mean"].shape[0]
    rows, worst = [], 0.0
    for k, t in enumerate(r["times"]):
        for name, grid, tok in (
            ("mean", r["grid_mean"][k], r["token_mean"][:, k]),
            ("second", r["grid_second"][k][np.triu_indices(3)], None),
        ):
            if tok is None:
                tok = r["token_second"][:, k][:, *np.triu_indices(3)]
            noise = tok.std(0, ddof=1) / math.sqrt(seeds)
            z = (grid - tok.mean(0)) / noise
            if k:
                worst = max(worst, float(np.abs(z).max()))
            rows.append(
                f"  {t:4.2f} {name:6} grid "
                + " ".join(f"{v:+.5f}" for v in grid)
                + "  tokens "
                + " ".join(f"{v:+.5f}" for v in tok.mean(0))
                + "  noise "
                + " ".join(f"{v:.1e}" for v in noise)
                + ("  z " + " ".join(f"{v:+.1f}" for v in z) if k else "")
            )
    return worst, rows


def test_grid_matches_tokens_within_sampling_noise():
    """n = 8 cells a panel edge against 8 seeds of 500 tokens (vMF kappa 4, general A, V):
    every moment within 4 standard errors at t = 0.5, 1; the same tokens moved with A^T
    instead of A are not (the comparison can fail)."""
    times = [0.0, 0.5, 1.0]
    r = grid_and_tokens(A, V, MEAN, 4.0, times, cells=8, tokens=500, seeds=8)
    worst, rows = moment_table(r)
    print(
        f"\ngrid (n = 8, {r['steps']} steps, {r['grid_time']:.1f} s) vs 8 x 500 tokens "
        f"({r['token_time']:.1f} s); mass change {r['mass_change']:.1e}"
    )
    print("\n".join(rows))
    wrong = grid_and_tokens(A.T, V, MEAN, 4.0, times, cells=8, tokens=500, seeds=8)
    r_wrong = {**r, "token_mean": wrong["token_mean"], "token_second": wrong["token_second"]}
    worst_wrong, _ = moment_table(r_wrong)
    print(f"largest z: {worst:.2f}; tokens with A^T instead of A: {worst_wrong:.1f}")
    assert worst < 4.0 and worst_wrong > 8.0
    assert r["mass_change"] < 1e-13


@pytest.mark.slow
def test_grid_matches_ten_thousand_tokens():
    """n = 16 cells a panel edge (face-centre velocities) against 4 seeds of 10^4 tokens, t up
    to 1.5: every moment within 4 standard errors."""
    times = [0.0, 0.5, 1.0, 1.5]
    r = grid_and_tokens(
        A, V, MEAN, 4.0, times, cells=16, tokens=10_000, seeds=4, velocity_at="centres"
    )
    worst, rows = moment_table(r)
    print(
        f"\ngrid (n = 16, {r['steps']} steps, {r['grid_time']:.1f} s) vs 4 x 10^4 tokens "
        f"({r['token_time']:.1f} s); mass change {r['mass_change']:.1e}"
    )
    print("\n".join(rows))
    print(f"largest z: {worst:.2f}")
    assert worst < 4.0
    assert r["mass_change"] < 1e-13
