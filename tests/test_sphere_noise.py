"""Noise on the cubed sphere: the finite-volume Laplace-Beltrami operator, its exact solve and
the noisy linear rates (schemes/sphere_diffusion.py; docs/theory.md, 'Noise on the cubed
sphere'). References: ``Delta Y_l = -l (l + 1) Y_l``, the heat semigroup
``exp(-eps l (l + 1) t)`` and :func:`noisy_rate`."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import eval_legendre

from tpde.grid import cubed_sphere as cs
from tpde.schemes.cubed_sphere import solve
from tpde.schemes.sphere_diffusion import SphereDiffusion, laplace_beltrami
from tpde.validation.sphere_rates import cubed_sphere_rate, noisy_rate
from tpde.variants.cubed_sphere import CubedSphereAttention

#: an axis off the grid's symmetry lines, so that Y_l sees every panel differently
AXIS = np.array([0.3, 0.5, 0.8]) / np.linalg.norm([0.3, 0.5, 0.8])
DEGREES = (1, 2, 4, 8)


def _harmonic(grid: cs.CubedSphere, l: int) -> np.ndarray:
    return cs.cell_averages(grid, lambda x: eval_legendre(l, x @ AXIS)).ravel()


#: the least Rayleigh-quotient order from n = 16 to 32 asked of each operator
LEAST_ORDER = {2: 1.9, 4: 3.7}


@pytest.mark.parametrize("order", [2, 4])
def test_laplace_beltrami_order_on_harmonics(order):
    """Relative error of the Rayleigh quotient ``<A Y, L Y> / <A Y, Y>`` against ``-l (l + 1)``
    and of ``L Y_l`` in max norm (largest at the panel edges and corners, of lower order),
    n = 8, 16, 32; mass exact (area-weighted column sums) and ``L 1 = 0``."""
    table = {}
    for n in (8, 16, 32):
        grid = cs.cubed_sphere(n)
        L = laplace_beltrami(n, order)
        areas = grid.areas.ravel()
        scale = abs(L).max() * areas.max()
        assert np.abs(areas @ L).max() <= 1e-14 * scale  # conservative
        assert np.abs(L @ np.ones(L.shape[0])).max() <= 1e-13 * abs(L).max()
        for l in DEGREES:
            y = _harmonic(grid, l)
            exact = -l * (l + 1)
            rayleigh = (areas * y) @ (L @ y) / ((areas * y) @ y)
            pointwise = np.abs(L @ y - exact * y).max() / (abs(exact) * np.abs(y).max())
            table[n, l] = (abs(rayleigh / exact - 1.0), pointwise)
    print(f"\norder {order}\n| n | " + " | ".join(f"l={l} Rayleigh, max" for l in DEGREES) + " |")
    for n in (8, 16, 32):
        cells = " | ".join(f"{table[n, l][0]:.2e}, {table[n, l][1]:.2e}" for l in DEGREES)
        print(f"| {n} | {cells} |")
    for l in DEGREES:
        rate = np.log2(table[16, l][0] / table[32, l][0])
        print(f"l = {l}: Rayleigh order 16 -> 32 {rate:.2f}")
        assert rate > LEAST_ORDER[order]
        assert table[32, l][0] < (1e-2 if order == 2 else 2e-4)


def test_diffusion_substep_is_the_heat_semigroup_with_exact_mass():
    """``exp(t eps L)`` of a zonal harmonic against ``exp(-eps l (l + 1) t)`` (amplitude by the
    projection), a step far beyond ``h^2 / eps``; mass to round-off; a sharp von Mises-Fisher
    (kappa = 100) stays >= 0 (clipped substeps counted)."""
    n, eps, t = 16, 0.05, 2.0
    grid = cs.cubed_sphere(n)
    assert eps * t / grid.h**2 > 10
    diffusion = SphereDiffusion(grid, eps)
    for l in (1, 3, 6):
        density = cs.harmonic_mode(grid, l, 0.5)
        out = diffusion.step(density, t)
        measured = cs.zonal_projection(grid, out, l) / cs.zonal_projection(grid, density, l)
        exact = np.exp(-eps * l * (l + 1) * t)
        print(f"l = {l}: amplitude {measured:.6f} exact {exact:.6f}")
        assert abs(grid.integrate(out) - grid.integrate(density)) < 1e-14
        assert abs(measured / exact - 1.0) < 0.01 * (l * (l + 1) * eps * t)
    sharp = cs.von_mises_fisher(grid, (0.2, 0.1, 1.0), 100.0)
    out = diffusion.step(sharp, 0.01)
    assert out.min() >= 0.0 and abs(grid.integrate(out) - 1.0) < 1e-13
    print(f"sharp vMF: clipped substeps {diffusion.clipped}")


def _noisy_rates(
    n: int, eps: float, normalised: bool, beta: float = 1.0
) -> list[tuple[int, float, float]]:
    """(l, grid rate, noisy_rate) for l = 1..8: the transport's linearised rate
    (:func:`cubed_sphere_rate`) plus ``eps`` times ``L``'s projection on ``P_l``."""
    grid = cs.cubed_sphere(n)
    L = laplace_beltrami(n)
    rows = []
    for l in range(1, 9):
        mode = cs.harmonic_mode(grid, l, 1.0) - 1.0 / cs.FOUR_PI
        change = (L @ mode.ravel()).reshape(grid.shape)
        diffusion = cs.legendre_moment(grid, change, l) / cs.legendre_moment(grid, mode, l)
        transport = cubed_sphere_rate(l, beta, n, normalised=normalised)["measured"]
        rows.append((l, transport + eps * diffusion, noisy_rate(l, beta, eps, 3, normalised)))
    return rows


def _rate_table(n: int, eps: float, normalised: bool, tolerance: float) -> None:
    rows = _noisy_rates(n, eps, normalised)
    model = "normalised" if normalised else "unnormalised"
    print(f"\nn = {n}, eps = {eps:g}, beta = 1 ({model})\n| l | grid | formula | error |")
    for l, grid, formula in rows:
        print(f"| {l} | {grid:.6f} | {formula:.6f} | {abs(grid - formula):.1e} |")
    assert max(abs(g - f) for _, g, f in rows) < tolerance


@pytest.mark.parametrize("normalised", [True, False], ids=["normalised", "unnormalised"])
def test_noisy_rates_on_s2_at_n16(normalised):
    _rate_table(16, 5e-3, normalised, 1e-3)


@pytest.mark.parametrize("normalised", [True, False], ids=["normalised", "unnormalised"])
def test_noisy_rates_on_s2_at_n32(normalised):
    _rate_table(32, 0.05, normalised, 1e-3)


def test_solve_with_noise_keeps_mass_and_damps():
    """The Strang-split run (attention beta = 1 and noise eps = 0.5, well above the unstable
    range: every mode decays) keeps the mass and damps a P_2 perturbation at about
    ``noisy_rate`` (a coarse grid, two steps: within 2 %)."""
    grid = cs.cubed_sphere(8)
    density = cs.harmonic_mode(grid, 2, 0.3)
    result = solve(grid, density, CubedSphereAttention(1.0), 0.5, noise=0.5, snapshots=3)
    masses = result.masses
    assert np.abs(masses - masses[0]).max() < 1e-13
    a0, a1 = (cs.zonal_projection(grid, d, 2) for d in (result.densities[0], result.final))
    measured = np.log(a1 / a0) / 0.5
    print(f"fitted {measured:.4f} formula {noisy_rate(2, 1.0, 0.5, 3):.4f} steps {result.steps}")
    assert result.clipped == 0  # a smooth density: no substep went negative
    assert abs(measured / noisy_rate(2, 1.0, 0.5, 3) - 1.0) < 0.02


SPHERE_RUN = """
[grid]
geometry = "sphere"
cells = 8

[attention]
beta = 1.0

[run]
t_end = 0.1
noise = {noise}
"""


def test_sphere_config_takes_run_noise():
    """``[run] noise`` reaches the sphere's ``solve``; a bad value is one line naming the key."""
    from tpde.config import ConfigError, build

    config = build(SPHERE_RUN.format(noise=0.25))
    assert config.problem.scheme["noise"] == 0.25
    assert "noise" not in config.text.split("[run]")[0]  # stored under run, not scheme
    for bad in ("-1.0", '"a lot"'):
        with pytest.raises(ConfigError) as info:
            build(SPHERE_RUN.format(noise=bad))
        text = str(info.value)
        print(text)
        assert text.startswith("run.noise") and "\n" not in text


def test_strang_splitting_is_second_order_in_time():
    """Self-convergence in the step (a vMF, kappa = 3, beta = 2, eps = 0.2, T = 0.5, n = 8):
    max-norm differences to the run with ``dt = T / 128`` fall by 4 per halving."""
    grid = cs.cubed_sphere(8)
    density = cs.von_mises_fisher(grid, (0.2, 0.3, 1.0), 3.0)
    field = CubedSphereAttention(2.0)

    def run(steps: int) -> np.ndarray:
        result = solve(grid, density, field, 0.5, noise=0.2, dt_max=0.5 / steps, cfl=1.0)
        assert result.steps == steps  # the CFL bound does not bind
        return result.final

    reference = run(128)
    errors = [float(np.abs(run(k) - reference).max()) for k in (4, 8, 16)]
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    print(f"errors {errors}, orders {orders}")
    assert np.all(orders > 1.9)


def test_cli_runs_a_noisy_sphere_config(tmp_path, capsys):
    """``tpde run`` of a sphere config with ``[run] noise`` (a sharp vMF, kappa = 80 at
    n = 8: the noise substep clips negatives, and the file's status says so)."""
    import xarray as xr

    from tpde.cli import main

    config = tmp_path / "noisy.toml"
    config.write_text(
        SPHERE_RUN.format(noise=0.05)
        .replace("[attention]", '[initial]\nkind = "von_mises_fisher"\nkappa = 80.0\n\n[attention]')
        .replace("t_end = 0.1", "t_end = 0.01\nsnapshots = 2")
    )
    path = tmp_path / "noisy.nc"
    code = main(["run", str(config), "-o", str(path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 0, err
    with xr.open_dataset(path) as ds:
        status, message = ds.attrs["status"], ds.attrs["status_message"]
    print(status, message)
    assert status == "completed" and message.startswith("noise:")


@pytest.mark.parametrize(
    "n, eps", [(16, 5e-3), pytest.param(32, 0.05, marks=pytest.mark.slow)], ids=["n16", "n32"]
)
def test_noisy_rates_by_short_time_fits(n, eps):
    """The time-dependent run (Strang splitting, SSP-RK3, beta = 1): the growth rate fitted to
    the projected amplitude of ``P_l`` seeded at ``1e-6`` over ``T = 0.2`` (6 snapshots,
    ``dt <= 0.02``) against :func:`noisy_rate`, l = 1..8 (the operator's eigenvalue error,
    times ``eps``, is what sets the resolution: n = 16 with eps = 0.05 is 9.4e-3 off at l = 8)."""
    from tpde.validation.sphere_rates import fit_rate

    grid = cs.cubed_sphere(n)
    field = CubedSphereAttention(1.0, 4, cache_entries=20_000_000)
    print(f"\nn = {n}, eps = {eps:g}\n| l | fitted | formula | error |")
    errors = []
    for l in range(1, 9):
        seed = cs.harmonic_mode(grid, l, 1e-6)
        result = solve(grid, seed, field, 0.2, dt_max=0.02, snapshots=6, noise=eps)
        amplitudes = np.array([cs.zonal_projection(grid, d, l) for d in result.densities])
        fitted, formula = fit_rate(result.times, amplitudes), noisy_rate(l, 1.0, eps, 3)
        errors.append(abs(fitted - formula))
        print(f"| {l} | {fitted:.6f} | {formula:.6f} | {errors[-1]:.1e} |")
    assert max(errors) < 1e-3
