"""W2 on the circle, the interaction energy of tokens and grid, and the metastable clusters
(docs/theory.md, 'Metastability on the circle')."""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest
from scipy.special import i0, iv

from tpde.grid.circle import TWO_PI, circle_grid, clusters, uniform_modes, von_mises_mixture
from tpde.validation.circle_metastability import (
    energy_rate,
    format_table,
    merge_times,
    metastability_study,
    point_mass_energy,
    quantile_tokens,
    token_energy,
)
from tpde.validation.circle_transport import circle_w1, circle_w2
from tpde.validation.sphere_tokens import CircleTokens
from tpde.variants.spherical import circle_head, interaction_energy

BETA = 9.0
MODES = [(3, 0.1, 0.0), (4, 0.1, 1.0), (5, 0.1, 2.0)]


def geodesic_cost(x: np.ndarray, y: np.ndarray, p: int) -> np.ndarray:
    d = np.abs(np.mod(x, TWO_PI)[:, None] - np.mod(y, TWO_PI)[None, :])
    return np.minimum(d, TWO_PI - d) ** p


# ---- W1, W2 on the circle ---------------------------------------------------------------------
def test_circle_wasserstein_of_tokens_equals_the_linear_program():
    """Weighted tokens (1..11 each; a third of the cases inside an arc of 1 rad, where the
    circle's plan is the line's) against POT's exact LP with the geodesic cost."""
    rng = np.random.default_rng(1)
    worst = {1: 0.0, 2: 0.0}
    for trial in range(150):
        n, m = rng.integers(1, 12, 2)
        x = rng.uniform(0, TWO_PI, n)
        if trial % 3 == 0:
            x = rng.uniform(0, 1.0, n) + rng.uniform(0, TWO_PI)
        y = rng.uniform(0, TWO_PI, m)
        wa, wb = rng.uniform(0.1, 1, n), rng.uniform(0.1, 1, m)
        wa, wb = wa / wa.sum(), wb / wb.sum()
        for p, f in ((1, circle_w1), (2, circle_w2)):
            exact = ot.emd2(wa, wb, geodesic_cost(x, y, p)) ** (1 / p)
            worst[p] = max(worst[p], abs(f(x, y, weights_a=wa, weights_b=wb) - exact))
    print(f"\nworst |W1 - LP| = {worst[1]:.2e}, |W2 - LP| = {worst[2]:.2e} (150 cases)")
    assert worst[1] < 1e-13 and worst[2] < 1e-13


def test_circle_wasserstein_closed_forms():
    g = circle_grid(64)
    uniform = uniform_modes(g)
    rows = []
    # uniform against a point mass: W1 = pi / 2, W2 = pi / sqrt(3)
    for angle in (0.0, 1.234, 6.2):
        rows.append(("point", circle_w1(uniform, [angle], grid_a=g), math.pi / 2))
        rows.append(("point", circle_w2(uniform, [angle], grid_a=g), math.pi / math.sqrt(3)))
    # uniform against n equally spaced tokens, any offset: each takes its arc of 2 pi / n
    for n in (1, 2, 7, 64, 1000):
        x = 0.3 + TWO_PI * np.arange(n) / n
        rows.append((f"{n} tokens", circle_w1(uniform, x, grid_a=g), TWO_PI / n / 4))
        rows.append((f"{n} tokens", circle_w2(uniform, x, grid_a=g), TWO_PI / n / math.sqrt(12)))
    # tokens inside an arc of 1 rad: the line's monotone plan, sorted pairs
    rng = np.random.default_rng(4)
    x, y = 2.0 + rng.uniform(0, 1, 50), 2.0 + rng.uniform(0, 1, 50)
    line = math.sqrt(np.mean((np.sort(x) - np.sort(y)) ** 2))
    rows.append(("arc", circle_w2(x, y), line))
    # a rotation by a whole number of cells moves nothing
    rho = von_mises_mixture(g, [(0.6, 1.0, 3.0), (0.4, 4.0, 8.0)])
    tok = rng.uniform(0, TWO_PI, 9)
    shift = 5 * g.spacing[0]
    rows.append(
        (
            "rotated",
            circle_w2(np.roll(rho, 5), tok + shift, grid_a=g),
            circle_w2(rho, tok, grid_a=g),
        )
    )
    print()
    for name, value, exact in rows:
        print(f"{name:>10}  {value:.15f}  {exact:.15f}  {abs(value - exact):.1e}")
    assert all(abs(v - e) < 1e-13 for _, v, e in rows)


def test_circle_w2_of_a_density_against_fine_atoms():
    """A density against tokens, by the LP on M atoms per cell (cell midpoints of M pieces):
    the LP is within the quantisation ``h / (M sqrt 12)`` (W2) of the exact value."""
    g = circle_grid(64)
    rho = von_mises_mixture(g, [(0.6, 1.0, 3.0), (0.4, 4.0, 8.0)])
    y = np.random.default_rng(2).uniform(0, TWO_PI, 7)
    value = circle_w2(rho, y, grid_a=g)
    print()
    for m in (4, 16, 64):
        atoms = (g.edges(0)[:-1, None] + g.spacing[0] * (np.arange(m) + 0.5) / m).ravel()
        mass = np.repeat(rho, m) / rho.sum() / m
        exact = math.sqrt(ot.emd2(mass, np.full(7, 1 / 7), geodesic_cost(atoms, y, 2)))
        bound = g.spacing[0] / m / math.sqrt(12)
        print(
            f"M = {m:3d}: W2 = {value:.10f}, LP = {exact:.10f}, "
            f"gap {value - exact:.1e} <= {bound:.1e}"
        )
        assert abs(value - exact) <= bound


# ---- the interaction energy --------------------------------------------------------------------
def test_token_energy_closed_forms_and_double_sum():
    rng = np.random.default_rng(0)
    theta = rng.uniform(0, TWO_PI, 3000)
    weights = rng.uniform(0, 1, 3000)
    rows = []
    for beta in (1.0, 9.0, 50.0):
        fourier = token_energy(theta, beta, weights)
        direct = token_energy(theta, beta, weights, method="direct")
        uniform = token_energy(TWO_PI * (np.arange(1000) + 0.5) / 1000, beta)
        point = token_energy(np.full(4, 2.5), beta)
        rows.append(
            (
                beta,
                fourier / direct - 1,
                uniform / (i0(beta) / (2 * beta)) - 1,
                point / (math.exp(beta) / (2 * beta)) - 1,
            )
        )
    print("\n beta  fourier/direct-1  uniform/(I0/2b)-1  point/(e^b/2b)-1")
    for row in rows:
        print(f"{row[0]:5g}  {row[1]: .1e}  {row[2]: .1e}  {row[3]: .1e}")
    assert all(max(abs(r[1]), abs(r[2]), abs(r[3])) < 1e-13 for r in rows)
    # the grid's energy from the cell averages: the same closed forms
    g = circle_grid(128)
    assert interaction_energy(uniform_modes(g), g, 9.0) == pytest.approx(i0(9.0) / 18, rel=1e-14)
    # a cluster in one cell: the band-limited reading of the averages (c_k = e^{-ik theta} /
    # sinc(kh/2) up to Nyquist) exceeds the point mass by beta h^2 / 12 (sum k^2 I_k = beta e^b)
    h = g.spacing[0]
    one_cell = np.zeros(128)
    one_cell[17] = 1.0 / h
    k = np.arange(1, 64)
    reading = (i0(9.0) + 2 * np.sum(iv(k, 9.0) / np.sinc(k * h / 2 / np.pi) ** 2)) / 18
    value = interaction_energy(one_cell, g, 9.0)
    excess = value / (math.exp(9.0) / 18) - 1
    print(f"one cell: E = {value:.12f}, reading {reading:.12f}, excess {excess:.3e}", end="")
    print(f" against beta h^2 / 12 = {9.0 * h * h / 12:.3e}")
    assert value == pytest.approx(reading, rel=1e-13)
    assert excess == pytest.approx(9.0 * h * h / 12, rel=0.05)
    assert point_mass_energy([1.0, 1.0 + 1e-9], [0.3, 0.7], 9.0) == pytest.approx(
        math.exp(9.0) / 18, rel=1e-13
    )


@pytest.mark.parametrize(("beta", "normalised"), [(9.0, True), (2.0, False)])
def test_energy_grows_at_the_rate_of_the_identity(beta, normalised):
    """dE/dt = sum w Z v^2 (normalised) or sum w v^2 (unnormalised) >= 0, against central
    differences of the tokens' energy along RK4 (error O(h^2) of the differences; the
    unnormalised speeds scale with e^beta, hence beta = 2 there)."""
    theta = quantile_tokens(300, MODES, seed=3)
    tokens = CircleTokens(theta, circle_head(beta), normalised=normalised)
    h = 1e-3
    rows = []
    for t in (1.0, 3.0, 6.0):
        angles = tokens.integrate([t - h, t, t + h], 0.01)
        measured = (token_energy(angles[2], beta) - token_energy(angles[0], beta)) / (2 * h)
        rows.append((t, measured, energy_rate(angles[1], beta, normalised=normalised)))
    print("\n   t  dE/dt (differences)  identity  rel. gap")
    for t, measured, identity in rows:
        print(f"{t:4g}  {measured:.10e}  {identity:.10e}  {measured / identity - 1:.1e}")
        assert identity > 0
        assert measured == pytest.approx(identity, rel=1e-5)


# ---- metastability: the default-tier twin of the slow comparison -----------------------------
def test_staircase_grid_against_tokens_quick():
    """beta = 9, three modes at 0.1, to t = 15: four clusters form; the grid (256 cells)
    against 1000 mid-quantile tokens, with two i.i.d. seeds for the noise."""
    study = metastability_study(
        BETA, MODES, 15.0, cells=(256,), n=1000, seeds=(0, 1), snapshots=4, dt=0.15
    )
    rows = study["rows"]
    print(
        "\n"
        + format_table(
            rows,
            [
                "t",
                "clusters 256",
                "clusters mid",
                "E 256",
                "E mid",
                "E seed 0",
                "W2 256",
                "W2 seed 0",
                "W2 seed 1",
                "noise",
            ],
        )
    )
    g = study["grids"][256]
    for key in ("E 256", "E mid", "E seed 0", "E seed 1"):
        energies = np.array([r[key] for r in rows])
        # between the uniform measure's energy and the point mass's, non-decreasing
        assert energies.min() >= i0(BETA) / (2 * BETA) * (1 - 1e-14)
        assert energies.max() <= math.exp(BETA) / (2 * BETA)
        assert np.all(np.diff(energies) >= -1e-12 * energies[1:])
    for row, rho in zip(rows, study["densities"][256], strict=True):
        assert row["W2 256"] < 0.5 * row["noise"]
        if row["t"] >= 10:
            assert row["clusters 256"] == row["clusters mid"] == 4
            angles, masses = clusters(rho, g)
            # the plateau: the clusters' energy as point masses
            assert row["E 256"] == pytest.approx(point_mass_energy(angles, masses, BETA), rel=2e-3)


def test_merge_times_skip_the_formation():
    counts = [0, 0, 6, 5, 4, 4, 4, 4, 4, 3, 3, 3, 1]
    assert merge_times(np.arange(13.0), counts) == [9.0, 12.0, 12.0]
    assert merge_times(np.arange(4.0), [0, 2, 1, 1]) == []


def test_quantile_tokens_follow_their_law():
    theta = quantile_tokens(4000, MODES)
    c = np.exp(-1j * np.outer([3, 4, 5], theta)).mean(axis=1)
    expected = [0.05 * np.exp(-1j * k * p) for k, _, p in MODES]
    assert np.abs(c - expected).max() < 1e-6


@pytest.mark.slow
def test_staircase_grid_against_tokens():
    """The full comparison (examples/sphere/run_metastability.py to t = 40): beta = 9,
    modes 3, 4, 5 at 0.1; grids of 512 and 2048 cells; 10^4 mid-quantile tokens and 10^4
    i.i.d. tokens for three seeds. Four clusters form by t = 10; the two nearest merge near
    t = 25 (mid tokens). 2048 cells follow the mid tokens through the merge, well within the
    seeds' spread; at 512 cells the collapsed clusters are pinned to their cells (their drift
    is below h / 2 per unit contraction rate) and never merge. Measured: merges at t = 27
    (mid), 32 (2048 cells), 26, 21, 35 (seeds); W2 2048 <= 0.024."""
    study = metastability_study(
        BETA, MODES, 40.0, cells=(512, 2048), n=10_000, seeds=(0, 1, 2), snapshots=41, w2_every=10
    )
    rows = study["rows"]
    table = [r for r in rows if not math.isnan(r["noise"])]
    print("\n" + format_table(table))
    merges = {
        key: merge_times(study["times"], [r[f"clusters {key}"] for r in rows])
        for key in ("512", "2048", "mid", "seed 0", "seed 1", "seed 2")
    }
    print("merge times:", merges)
    for key in ("E 512", "E 2048", "E mid", "E seed 0", "E seed 1", "E seed 2"):
        energies = np.array([r[key] for r in rows])
        assert np.all(np.diff(energies) >= -1e-12 * energies[1:])
    for row in table:
        assert row["W2 2048"] < min(0.05, 0.25 * row["noise"])
    # one merge each; the grid's is late (a collapsed cluster moves at about its drift less
    # h / 2), and inside the seeds' spread of merge times
    seeds = [merges[f"seed {s}"] for s in (0, 1, 2)]
    assert len(merges["mid"]) == len(merges["2048"]) == 1 and all(len(m) == 1 for m in seeds)
    assert merges["mid"][0] <= merges["2048"][0] <= max(m[0] for m in seeds)
    assert merges["512"] == []
    final = rows[-1]
    assert final["E 2048"] == pytest.approx(final["E mid"], rel=1e-3)
    assert final["W2 512"] > final["noise"]
