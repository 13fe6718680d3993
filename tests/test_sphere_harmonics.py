"""The spherical-harmonic kernel sums of the sphere (docs/theory.md, 'Kernel sums by spherical
harmonics') against the dense sums over the same Gauss nodes: the velocity, the scaled sums,
the truncation degree and its bound, the engine choice and its config key."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpde.grid import cubed_sphere as cs
from tpde.schemes.cubed_sphere import CubedSphereOperator
from tpde.variants.cubed_sphere import CubedSphereAttention, interaction_energy, sphere_engine
from tpde.variants.engines import sphere_harmonics as sh

A_GENERAL = np.array([[2.0, 0.7, -0.4], [-0.3, 1.2, 0.9], [0.5, -0.6, 2.5]])
V_GENERAL = np.array([[1.0, -0.8, 0.2], [0.6, 0.9, 0.0], [-0.3, 0.4, 1.1]])
GRID = cs.cubed_sphere(10)


def densities() -> dict[str, np.ndarray]:
    return {
        "noise": cs.noise(GRID, 0.3, 10, seed=2),
        "mixture": cs.mixture(GRID, [(0.6, [0.6, 0.0, 0.8], 3.0), (0.4, [-0.5, 0.7, -0.2], 9.0)]),
        "vmf 50": cs.von_mises_fisher(GRID, [0.3, 0.2, 0.9], 50.0),
    }


def targets() -> np.ndarray:
    return CubedSphereOperator(GRID).points.reshape(-1, 3)


@pytest.mark.parametrize(
    "label, matrices",
    [
        ("beta I", [(beta * np.eye(3), None) for beta in (1.0, 16.0, 32.0, 64.0)]),
        ("general", [(A_GENERAL, V_GENERAL), (12.0 * A_GENERAL, V_GENERAL)]),
    ],
)
def test_velocity_matches_the_dense_sums(label, matrices):
    """The tangent velocity at every face node, harmonic against dense (same nodes, same
    reconstruction), the unnormalised variant on noise: within 1e-12 of the velocity's scale for
    the spread densities; for vMF(50) within 1e-12 of the scale plus the engine's own
    estimate at each target (at most its tolerance: targets far from all the mass)."""
    points = targets()
    print(f"\n{label}: max |v_h - v_d| / max |v|, max estimate (degree, terms, dense targets)")
    for A, V in matrices:
        norm_v = 1.0 if V is None else float(np.linalg.norm(V, 2))
        for name, rho in densities().items():
            for normalised in (True, False) if name == "noise" else (True,):
                fields = [
                    CubedSphereAttention(A=A, V=V, normalised=normalised, engine=engine)
                    for engine in ("direct", "harmonic")
                ]
                dense, harmonic = (f.tangent(rho, GRID, 0.0, points) for f in fields)
                engine = fields[1]._harmonic
                scale = np.abs(dense).max()
                gap = np.abs(harmonic - dense).max(axis=1)
                last = engine.last
                print(
                    f"  |A| {np.linalg.norm(A, 2):6.2f} {name:8} normalised {normalised!s:5} "
                    f"{gap.max() / scale:.1e} {engine.estimate.max():.1e} ({last['degree']}, "
                    f"{last['terms']}, {last['dense_targets']} of {last['targets']})"
                )
                if name == "vmf 50":
                    assert engine.estimate.max() <= engine.tolerance
                    assert np.all(gap <= 1e-12 * scale + norm_v * engine.estimate)
                else:
                    assert gap.max() < 1e-12 * scale


def test_scaled_sums_and_the_noise_bound():
    """The scaled sums ``e^{-r} Z``, ``e^{-r} G`` with no dense fallback: their error is
    within ``NOISE`` of their largest value (the estimate the engine's fallback rests on)."""
    points = targets()
    print("\nscaled sums, no fallback: max error / (NUFFT_EPSILON max e^{-r} Z)")
    worst = 0.0
    for A in (1.0 * np.eye(3), 32.0 * np.eye(3), 12.0 * A_GENERAL):
        for name, rho in densities().items():
            y, values, weights = cs.point_values(GRID, rho, 3)
            sources = y.reshape(-1, 3)
            masses = (np.maximum(values, 0.0) * weights).reshape(-1)
            z0, g0, s0 = CubedSphereAttention(A=A, engine="direct").sums(rho, GRID, points)
            engine = sh.HarmonicSums(A)
            plan = engine.plan(points)
            z, g, s = engine.sums(sources, masses, points)
            assert np.allclose(s, s0, rtol=1e-14)
            live = ~plan.dense
            error = max(np.abs(z - z0)[live].max(), np.abs(g - g0)[live].max())
            ratio = error / (sh.NUFFT_EPSILON * z0.max())
            worst = max(worst, ratio)
            print(f"  |A| {np.linalg.norm(A, 2):6.2f} {name:8} {ratio:.2f}")
    assert worst * sh.NUFFT_EPSILON < sh.NOISE


def miller_bessel(l_max: int, r: float) -> np.ndarray:
    """``i_l(r) / i_0(r)``, ``l = 0 .. l_max``, by Miller's backward recurrence
    ``i_{l-1} = i_{l+1} + (2 l + 1) / r i_l`` from far above (independent of scipy)."""
    top = l_max + 60 + int(2 * r)
    values = np.zeros(top + 2)
    values[top] = 1e-300
    for l in range(top, 0, -1):
        values[l - 1] = values[l + 1] + (2 * l + 1) / r * values[l]
        if values[l - 1] > 1e250:  # rescale (ratios are what matter)
            values[: top + 2] *= 1e-250
    return values[: l_max + 1] / values[0]


def test_truncation_degree_and_its_bound():
    """The chosen degree ``L`` leaves a tail ``sum_{l > L} (2 l + 1)(1 + l / r) i_l(r)``
    within ``TAIL_TOLERANCE`` of ``i_0(r)``, one degree fewer does not (minimal); ``i_l`` by
    Miller's recurrence, not scipy. The degree grows like ``sqrt(r)`` and past the cap the
    engine says so."""
    print("\nr  degree  tail_L / i_0  tail_{L-1} / i_0  scipy vs Miller (max rel.)")
    degrees = []
    for r in (0.5, 1.0, 4.0, 16.0, 32.0, 64.0, 128.0):
        L = sh.degree_for(r)
        ratio = miller_bessel(L + 80, r)
        l = np.arange(ratio.size)
        u = (2 * l + 1) * (1 + l / r) * ratio
        tail, before = float(u[L + 1 :].sum()), float(u[L:].sum())
        scipy_ratio = sh.scaled_bessel(L, r) / sh.scaled_bessel(0, r)[..., :1]
        agree = np.abs(scipy_ratio / ratio[: L + 1] - 1).max()
        print(f"  {r:6g} {L:4d} {tail:.1e} {before:.1e} {agree:.1e}")
        assert tail <= sh.TAIL_TOLERANCE and (before > sh.TAIL_TOLERANCE or L == 1)
        assert agree < 1e-12
        degrees.append(L)
    assert degrees == sorted(degrees) and 40 < degrees[4] < 70
    with pytest.raises(sh.SphereHarmonicsError, match="attention.engine"):
        sh.degree_for(1e5)


def test_engine_vocabulary_and_config():
    from tpde.config import ConfigError, build

    assert sphere_engine("auto") == "harmonic" and sphere_engine("direct") == "direct"
    assert CubedSphereAttention(4.0).serving == "harmonic"
    with pytest.raises(ValueError, match="attention.engine"):
        CubedSphereAttention(4.0, engine="separable")
    text = (
        '[grid]\ngeometry = "sphere"\ncells = 8\n[attention]\nbeta = 4.0\n{}\n'
        '[run]\nt_end = 0.1\noutput = "x.nc"\n'
    )
    config = build(text.format('engine = "direct"'))
    assert config.problem.velocity.serving == "direct" and 'engine = "direct"' in config.text
    assert 'engine = "auto"' in build(text.format("")).text
    with pytest.raises(ConfigError) as info:
        build(text.format('engine = "fft"'))
    print(f"\n{info.value}")
    assert str(info.value).startswith("attention.engine") and "\n" not in str(info.value)


def test_interaction_energy_by_harmonics():
    """``E = 1/(2 beta) sum_ij m_i m_j e^{beta <y_i, y_j>}`` by Funk-Hecke from the
    coefficients alone, against the dense double sum; the uniform probability's closed form
    ``sinh(beta) / (2 beta^2)``."""
    for beta in (1.0, 16.0, 32.0):
        for name, rho in densities().items():
            dense = interaction_energy(rho, GRID, beta, engine="direct")
            harmonic = interaction_energy(rho, GRID, beta)
            print(
                f"\nbeta {beta:4g} {name:8} E {harmonic:.15e} rel. gap {harmonic / dense - 1:.1e}"
            )
            assert harmonic == pytest.approx(dense, rel=1e-12)
    uniform = np.full(GRID.shape, 1.0 / (4.0 * math.pi))
    beta = 8.0
    exact = math.sinh(beta) / (2 * beta**2)
    assert interaction_energy(uniform, GRID, beta) == pytest.approx(exact, rel=1e-9)


@pytest.mark.slow
def test_fitted_rates_at_64_cells_a_panel():
    """l = 1..8, beta in {1, 4, 16}: the growth rate of a seeded zonal mode (amplitude 1e-6),
    fitted over the solver's run at 64 cells a panel (the harmonic engine, the velocity at the
    face centres, dt = 0.1 / lambda_max), within 1e-3 of Funk-Hecke's
    ``l (l + 1) I_{l+1/2}(beta) / (beta I_{1/2}(beta))``. (At 8 cells a panel the slow modes
    are off by percents: the coarse grid's discrete modes are not zonal.)"""
    from tpde.validation.sphere_rates import cubed_sphere_fitted_rate

    rows = []
    print("\nfitted rates at 64 cells a panel: beta l formula measured rel. error steps")
    for beta in (1.0, 4.0, 16.0):
        for l in range(1, 9):
            row = cubed_sphere_fitted_rate(l, beta, n=64, step=0.1, velocity_at="centres")
            rows.append(row)
            print(
                f"  {beta:4g} {l} {row['formula']:.8e} {row['measured']:.8e} "
                f"{row['error']:.1e} {row['steps']}",
                flush=True,
            )
    assert max(r["error"] for r in rows) < 1e-3
    assert max(r["mass_change"] for r in rows) < 1e-13


def test_panel_reduction_matches_the_full_transform_and_the_dense_sums():
    """The coefficients from the panel reduction's ``6 K^2`` Chebyshev points against the full
    transform over the ``6 (3 n)^2`` Gauss nodes (within twice its bound per unit mass plus the
    transforms' own error; also with the uniform part by the full transform and only the
    deviation reduced, the engine's way, within twice its bound), and the velocity at spread
    face centres against the dense sums over the same nodes (within 1e-12 of its scale), at
    32 cells a panel."""
    grid = cs.cubed_sphere(32)
    points = CubedSphereOperator(grid, velocity_at="centres").face_centres.reshape(-1, 3)
    pick = points[:: points.shape[0] // 200]
    print(
        "\nbeta, density: degree, K, coefficient gap / mass (bound), uniform part split off,"
        " velocity gap / scale"
    )
    cases = (
        (4.0, "noise 4", cs.noise(grid, 0.3, 4, seed=2)),
        (
            16.0,
            "mixture",
            cs.mixture(grid, [(0.6, [0.6, 0.0, 0.8], 3.0), (0.4, [0, 0.7, -0.7], 9.0)]),
        ),
    )
    for beta, name, rho in cases:
        degree = sh.degree_for(beta)
        reduction = sh.PanelReduction.build(32, 3, degree)
        assert reduction is not None and 6 * reduction.terms**2 < 0.5 * 6 * 96**2
        y, values, weights = cs.point_values(grid, rho, 3)
        masses = (np.maximum(values, 0.0) * weights).reshape(-1)
        full = sh.coefficients(y.reshape(-1, 3), masses, degree)
        reduced = sh.coefficients(reduction.points, reduction.masses(masses), degree)
        gap = float(np.abs(reduced - full).max() / masses.sum())
        assert gap <= 2 * reduction.error + sh.NOISE
        # the uniform part by the full transform, the deviation reduced: closer still
        split, bound = reduction.coefficients(
            masses, lmax=degree, epsilon=sh.NUFFT_EPSILON, nthreads=1
        )
        split_gap = float(np.abs(split - full).max() / masses.sum())
        assert bound <= reduction.error * 2 * masses.sum()
        assert split_gap <= 2 * bound / masses.sum() + sh.NOISE
        fields = [CubedSphereAttention(beta, engine=e) for e in ("direct", "harmonic")]
        dense = fields[0].tangent(rho, grid, 0.0, pick)
        harmonic = fields[1].tangent(rho, grid, 0.0, points)[:: points.shape[0] // 200]
        assert fields[1]._harmonic.last["reduction"] == reduction.terms
        velocity = float(np.abs(harmonic - dense).max() / np.abs(dense).max())
        print(
            f"  {beta:4.0f} {name:8} {degree} {reduction.terms} {gap:.1e} "
            f"({reduction.error:.1e}), split {split_gap:.1e}, {velocity:.1e}"
        )
        assert velocity < 1e-12


def test_line_synthesis_at_the_face_centres_against_the_dense_sums():
    """The velocity at every face centre by the line synthesis (no non-uniform synthesis:
    exact but for round-off) against the dense sums over the same Gauss nodes (within 1e-12
    of its scale, clearly: the measured gap is printed) and against the non-uniform
    syntheses (within their error), at 24 cells a panel (the longitudes folded: 4 n = 96 <
    2 L + 1 = 105) and 12 (n even and odd alike are lines), ``beta = 32`` and ``4``."""
    print("\nn, beta: degree, velocity gap to the dense sums / scale, to the NUFFT syntheses")
    for n, beta in ((24, 32.0), (13, 4.0)):
        grid = cs.cubed_sphere(n)
        rho = cs.noise(grid, 0.3, 10, seed=0)
        points = CubedSphereOperator(grid, velocity_at="centres").face_centres.reshape(-1, 3)
        lines = CubedSphereAttention(beta)
        new = lines.tangent(rho, grid, 0.0, points)
        assert lines._harmonic.last["lines"] == 1
        pick = slice(None, None, 5)  # every fifth target: the dense sums stay quick
        dense = CubedSphereAttention(beta, engine="direct", cache_entries=1)
        reference = dense.tangent(rho, grid, 0.0, points[pick])
        nufft = CubedSphereAttention(beta)
        nufft._harmonic.plan(points).lines = None  # the former path: two NUFFT syntheses
        old = nufft.tangent(rho, grid, 0.0, points)
        assert nufft._harmonic.last["lines"] == 0
        scale = float(np.abs(reference).max())
        gap = float(np.abs(new[pick] - reference).max()) / scale
        former = float(np.abs(new - old).max()) / float(np.abs(old).max())
        print(f"  {n} {beta:g}: {lines._harmonic.last['degree']} {gap:.2e} {former:.2e}")
        assert gap < 1e-12
        assert former < 4 * sh.NOISE


def test_line_synthesis_is_used_only_on_meridian_lines():
    """Targets that are not the face centres' lines (spread points, the Gauss nodes) keep
    the non-uniform syntheses."""
    grid = cs.cubed_sphere(8)
    rng = np.random.default_rng(3)
    spread = rng.normal(size=(12 * 8 * 9, 3))
    spread /= np.linalg.norm(spread, axis=1, keepdims=True)
    assert sh.LineSynthesis.build(spread, 22) is None
    nodes = CubedSphereOperator(grid).points.reshape(-1, 3)
    assert sh.LineSynthesis.build(nodes, 22) is None
    centres = CubedSphereOperator(grid, velocity_at="centres").face_centres.reshape(-1, 3)
    assert sh.LineSynthesis.build(centres, 22) is not None
