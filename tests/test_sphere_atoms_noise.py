"""Atoms with noise on the sphere: the heat substep of a von Mises-Fisher atom (its first
moment exact) against the exact heat flow of the vMF and against the cubed sphere's diffusion,
and a noisy run with an atom (docs/theory.md, 'Atoms with noise on the sphere')."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ive

from tpde.grid import cubed_sphere as cs
from tpde.schemes.atoms import AtomOptions
from tpde.schemes.cubed_sphere import solve
from tpde.schemes.sphere_atoms import SphereAtomRun, VMFAtoms, vmf_diffused_spread
from tpde.schemes.sphere_diffusion import SphereDiffusion


def mean_resultant(l: int, kappa: float) -> float:
    """``A_l(kappa) = I_{l + 1/2}(kappa) / I_{1/2}(kappa)``: the vMF's degree-l Legendre
    moment ``E[P_l(<a, X>)]``, which the heat flow multiplies by ``e^{-l (l + 1) eps tau}``."""
    return float(ive(l + 0.5, kappa) / ive(0.5, kappa))


def test_vmf_heat_law_against_the_exact_heat_flow():
    """``A_1(kappa') = A_1(kappa) e^{-2 eps tau}`` to round-off (the first moment exact), and
    the degree-2 and 3 moments of the vMF(kappa') against the heat flow's exact
    ``A_l(kappa) e^{-l (l + 1) eps tau}``: the degree-2 error within ``3 s v (s + v) + v^3``
    (``v = 2 eps tau``, third order); the naive ``s + v`` is off at second order."""
    print("\n| s | v | A_1 error | A_2 error | bound | A_3 error | A_2 error of s + v |")
    print("|---|---|---|---|---|---|---|")
    for s in (1e-3, 1e-2, 1e-1):
        for v in (1e-4, 1e-3, 1e-2):
            k = 1.0 / s
            k2 = 1.0 / float(vmf_diffused_spread(np.array([s]), v)[0])
            e1 = mean_resultant(1, k2) - mean_resultant(1, k) * math.exp(-v)
            e2 = mean_resultant(2, k2) - mean_resultant(2, k) * math.exp(-3.0 * v)
            e3 = mean_resultant(3, k2) - mean_resultant(3, k) * math.exp(-6.0 * v)
            naive = mean_resultant(2, 1.0 / (s + v)) - mean_resultant(2, k) * math.exp(-3.0 * v)
            bound = 3.0 * s * v * (s + v) + v**3
            print(f"| {s:g} | {v:g} | {e1:.1e} | {e2:.2e} | {bound:.2e} | {e3:.2e} | {naive:.2e} |")
            assert abs(e1) < 1e-15
            assert 0.0 < e2 <= 1.05 * bound
            assert abs(naive) > 5.0 * abs(e2)


def test_vmf_heat_law_against_the_cubed_sphere_diffusion():
    """A vMF(kappa = 50) as cells (n = 32: 2.9 cells per standard deviation) diffused by the
    cubed sphere's own solve for ``2 eps tau = 0.01``: its first and degree-2 moments about the
    mean direction against the atom's law (1.0e-6 and 1.6e-5 measured; the grid's own error
    against the exact heat flow 3e-6), where ``s + v`` is off by 6.9e-4."""
    grid = cs.cubed_sphere(32)
    a = np.array([0.3, -0.5, 0.8]) / math.sqrt(0.98)
    kappa, v = 50.0, 0.01
    rho = cs.von_mises_fisher(grid, a, kappa)
    out = SphereDiffusion(grid, 1.0).step(rho, 0.5 * v)
    mass = grid.integrate(out)
    first = float(np.linalg.norm(cs.mean(grid, out))) / mass
    second = cs.legendre_moment(grid, out, 2, a) / mass
    k2 = 1.0 / float(vmf_diffused_spread(np.array([1.0 / kappa]), v)[0])
    rows = {
        "atom's law": (first - mean_resultant(1, k2), second - mean_resultant(2, k2)),
        "s + v": (
            first - mean_resultant(1, 1.0 / (1.0 / kappa + v)),
            second - mean_resultant(2, 1.0 / (1.0 / kappa + v)),
        ),
        "exact heat flow": (
            first - mean_resultant(1, kappa) * math.exp(-v),
            second - mean_resultant(2, kappa) * math.exp(-3.0 * v),
        ),
    }
    print("\n| grid against | A_1 | A_2 |\n|---|---|---|")
    for name, (e1, e2) in rows.items():
        print(f"| {name} | {e1:.2e} | {e2:.2e} |")
    assert abs(rows["atom's law"][0]) < 3e-6 and abs(rows["atom's law"][1]) < 3e-5
    assert abs(rows["s + v"][1]) > 3e-4


class Still:
    """No transport (a zero tangent field that takes atoms): diffusion alone."""

    steady = True
    atoms = None

    def tangent(self, density, grid, t, points):
        return np.zeros((np.asarray(points).reshape(-1, 3).shape[0], 3))

    def probe_tangent(self, density, grid, t, points):
        return self.tangent(density, grid, t, points)


def test_noisy_sphere_run_spreads_and_releases_an_atom():
    """``solve`` with noise (eps = 0.1, n = 8, no transport) and one atom of spread (h / 2)^2
    on empty cells: the atom's first moment decays as ``e^{-2 eps t}``
    to round-off while it lives, it is released one step after its standard deviation passes
    ``release`` = 4 cells, and the mass of cells plus atoms is conserved to 1e-13."""
    grid = cs.cubed_sphere(8)
    a = np.array([0.0, 0.0, 1.0])
    rho = np.zeros(grid.shape)  # (cells near the atom would join it: the atom alone)
    s0 = (0.5 * grid.h) ** 2
    start = VMFAtoms(
        np.array([1.0]), a[None, :], np.array([s0]), np.array([0]), np.array([np.nan]),
        np.array([[-1, -1]]),
    )  # fmt: skip
    field = Still()
    run = SphereAtomRun(grid, field, AtomOptions(), start=start)
    eps, t_end = 0.1, 6.0
    spreads: list[tuple[float, float]] = []
    masses: list[float] = []

    def record(t: float, density: np.ndarray, steps: int) -> None:
        masses.append(grid.integrate(density) + run.atoms.total_mass)
        if run.atoms.count:
            spreads.append((t, float(run.atoms.spread[0])))

    events: list = []
    solve(grid, rho, field, t_end, dt_max=0.2, snapshots=31, noise=eps, atoms=run,
          on_snapshot=record, events=events)  # fmt: skip
    from tpde.schemes.sphere_atoms import deficit, kappa_of_deficit

    q0 = float(deficit(1.0 / s0))
    worst = max(
        abs((1.0 - float(deficit(1.0 / s))) - (1.0 - q0) * math.exp(-2.0 * eps * t))
        for t, s in spreads
    )
    release = AtomOptions().release * grid.h
    # the law composes exactly (A_1 decays as e^{-2 eps t}): the spread at t in closed form
    grid_t = np.linspace(0.0, t_end, 6001)
    widths = np.sqrt(1.0 / kappa_of_deficit(q0 - (1.0 - q0) * np.expm1(-2.0 * eps * grid_t)))
    t_star = float(grid_t[np.argmax(widths > release)])
    released = [e for e in events if e.kind == "atom_release"]
    drift = max(abs(m - masses[0]) for m in masses)
    print(f"\nfirst moment against e^(-2 eps t): {worst:.1e} over {len(spreads)} snapshots")
    print(f"released at t = {released[0].time:.3f} (sd passes {release:.3f} at {t_star:.3f})")
    print(f"mass of cells plus atoms: largest change {drift:.1e}")
    assert worst < 1e-14
    assert len(released) == 1 and t_star <= released[0].time < t_star + 0.2 + 1e-9
    assert drift < 1e-13


@pytest.mark.slow
def test_noisy_sphere_atoms_resume_bit_for_bit():
    """Attention (beta = 16, n = 6) with noise (eps = 2e-3) and atoms from two narrow vMF
    clusters, to t = 1, and the same run solved on from its snapshot at t = 0.5 (its density,
    atoms and next id, as ``--resume`` reads them): cells and atoms at t = 1 bit for bit
    (~15 s: the attention sums at every stage)."""
    from tpde.variants.cubed_sphere import CubedSphereAttention

    grid = cs.cubed_sphere(6)
    rho = cs.mixture(grid, [(0.5, [0.0, 0.0, 1.0], 200.0), (0.5, [1.0, 0.0, 0.2], 200.0)])
    kept: dict[float, tuple] = {}

    def run(density, times, start=None, next_id=0):
        field = CubedSphereAttention(16.0)
        atoms = SphereAtomRun(grid, field, AtomOptions(), start=start, next_id=next_id)

        def record(t: float, d: np.ndarray, steps: int) -> None:
            kept[t] = (d.copy(), atoms.atoms, atoms.next_id)

        result = solve(grid, density, field, times[-1], dt_max=0.05, snapshots=times,
                       noise=2e-3, atoms=atoms, on_snapshot=record)  # fmt: skip
        return result, atoms

    full, atoms_full = run(rho, [0.0, 0.5, 1.0])
    density, middle, next_id = kept[0.5]
    print(f"\natoms at t = 0.5: {middle.count}, at t = 1: {atoms_full.atoms.count}")
    assert middle.count >= 1
    again, atoms_again = run(density, [0.5, 1.0], middle, next_id)
    assert np.array_equal(full.final, again.final)
    for name in ("mass", "centre", "spread", "ids"):
        assert np.array_equal(getattr(atoms_full.atoms, name), getattr(atoms_again.atoms, name))
