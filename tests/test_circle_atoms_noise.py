"""Atoms with noise on the circle: the exact heat-kernel substep of a wrapped normal atom
(variance + 2 eps tau), its release to the cells, a noisy run against a fine grid without atoms,
and a resumed noisy run (docs/theory.md, 'Atoms with noise')."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from tpde.grid.circle import circle_grid, von_mises_mixture
from tpde.schemes.atom_cells import PeriodicCells, wrapped_normal_averages
from tpde.schemes.atoms import AtomOptions, Atoms
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.variants.circle_atoms import energy_with_atoms
from tpde.variants.spherical import CircleAttention, circle_head

BETA = 9.0
#: two narrow clusters over a wide one (the merge case of test_circle_atoms.py)
COMPONENTS = [(0.5, 1.0, 200.0), (0.4, 1.7, 200.0), (0.1, 4.0, 2.0)]


def wrapped_offset(x: np.ndarray, origin: float) -> np.ndarray:
    return np.mod(x - origin + math.pi, 2.0 * math.pi) - math.pi


def test_pure_diffusion_of_an_atom_is_exact_and_releases_it():
    """V = 0 (no transport), eps = 0.01, one atom (mass 0.5, variance (h / 2)^2) and a compact
    bump of cells opposite it, 128 cells: while the atom lives its variance is ``s0 + 2 eps t``
    to round-off and its centre and mass do not move; it goes back to the cells at the first
    step after its standard deviation passes ``release = 4`` cells (t* = 1.898), and at t = 3
    the cells around it are the wrapped normal ``N(a, s0 + 2 eps t)`` to the fourth-order
    diffusion's error (measured 3.6e-5 of a peak of 0.81); mass to 1e-13."""
    n, eps, a = 128, 0.01, 1.0
    grid = circle_grid(n)
    h, x = float(grid.spacing[0]), grid.centres(0)
    s0 = (0.5 * h) ** 2
    far = wrapped_offset(x, a + math.pi)
    bump = np.where(np.abs(far) < 1.0, np.cos(0.5 * math.pi * far) ** 4, 0.0)
    bump *= 0.5 / grid.integrate(bump)
    field = CircleAttention(circle_head(BETA, 0.0), engine="fft")  # V = 0: no transport
    times = list(np.round(np.arange(0.0, 3.0 + 1e-9, 0.25), 10))
    problem = Problem(
        grid,
        bump,
        field,
        3.0,
        scheme=Scheme(dt_max=0.05),
        snapshots=times,
        noise=eps,
        atoms=AtomOptions(),
        initial_atoms=Atoms.of([0.5], [[a]], [[[s0]]], [0]),
    )
    result = Solver(problem).run()
    print(
        "\n| t | atoms | variance - (s0 + 2 eps t) | centre - a | mass - 1 |\n|---|---|---|---|---|"
    )
    worst = 0.0
    for snap in result.snapshots:
        k = snap.atoms.count
        if k:
            gap = float(snap.atoms.cov[0, 0, 0]) - (s0 + 2.0 * eps * snap.time)
            shift = float(snap.atoms.centre[0, 0]) - a
            worst = max(worst, abs(gap))
            assert shift == 0.0 and snap.atoms.mass[0] == 0.5
            print(f"| {snap.time:g} | {k} | {gap:.1e} | {shift:.1e} | {snap.mass - 1:.1e} |")
        else:
            print(f"| {snap.time:g} | 0 | | | {snap.mass - 1:.1e} |")
        assert abs(snap.mass - 1.0) < 1e-13
    assert worst < 1e-15
    released = [e for e in result.events if e.kind == "atom_release"]
    t_star = ((AtomOptions().release * h) ** 2 - s0) / (2.0 * eps)
    print(f"released at t = {released[0].time:.4f} (crossing at t* = {t_star:.4f})")
    assert len(released) == 1 and t_star < released[0].time < t_star + 0.05
    cells = PeriodicCells(float(grid.lower[0]), h, n)
    exact = 0.5 * wrapped_normal_averages(cells, a, s0 + 2.0 * eps * 3.0)
    near = np.abs(wrapped_offset(x, a)) < 1.5
    error = float(np.abs(result.snapshots[-1].density - exact)[near].max())
    print(f"cells at t = 3 against the wrapped normal: {error:.2e} (peak {exact.max():.3f})")
    assert error < 1e-4 * exact.max()


def cluster_moments(density: np.ndarray, grid, centres: np.ndarray, atoms=None) -> list[tuple]:
    """Mass, mean and standard deviation of the measure's cluster around each of ``centres``:
    the cells nearest it and within 0.5 of it (piecewise constant: h^2 / 12 added) plus, where
    ``atoms`` are given, atom k (the same window on both runs)."""
    from tpde.schemes.atoms import merge_moments

    x, h = grid.centres(0), float(grid.spacing[0])
    offsets = np.stack([wrapped_offset(x, float(c)) for c in centres])  # (K, n)
    nearest = np.argmin(np.abs(offsets), axis=0)
    rows = []
    for k in range(len(centres)):
        mine = (nearest == k) & (np.abs(offsets[k]) < 0.5)
        w = density[mine] * h
        m = float(w.sum())
        shift = float(w @ offsets[k][mine]) / m
        var = float(w @ (offsets[k][mine] - shift) ** 2) / m + h * h / 12.0
        if atoms is not None:
            m, mean, cov = merge_moments(
                [m, float(atoms.mass[k])], [[shift], [0.0]], [[[var]], atoms.cov[k]]
            )
            shift, var = float(mean[0]), float(cov[0, 0])
        rows.append((m, float(centres[k]) + shift, math.sqrt(var)))
    return rows


def noisy_pair(t_end: float, fine: int, eps: float = 2e-3):
    times = list(np.round(np.arange(0.0, t_end + 1e-9, 0.25), 10))
    out = {}
    for n, atoms in ((128, AtomOptions()), (fine, None)):
        grid = circle_grid(n)
        rho = von_mises_mixture(grid, COMPONENTS)
        rho = rho / grid.integrate(rho)
        field = CircleAttention(circle_head(BETA), engine="fft")
        problem = Problem(
            grid,
            rho,
            field,
            t_end,
            scheme=Scheme(dt_max=0.1),
            snapshots=times,
            noise=eps,
            atoms=atoms,
        )
        out[n] = (grid, Solver(problem).run())
    return times, out


def compare_noisy(t_end: float, fine: int) -> tuple[float, list]:
    """The energy gap over the run and, at the end, each atom against the fine grid's
    cluster around it: rows (mass, centre, sd) of both."""
    times, out = noisy_pair(t_end, fine)
    (coarse, run), (grid, reference) = out[128], out[fine]
    scale = math.exp(BETA) / (2.0 * BETA)
    print(f"\n| t | atoms | E 128 + atoms | E {fine} | gap |\n|---|---|---|---|---|")
    worst = 0.0
    for i, t in enumerate(times):
        a, b = run.snapshots[i], reference.snapshots[i]
        e_a = energy_with_atoms(a.density, coarse, BETA, a.atoms) / scale
        e_b = energy_with_atoms(b.density, grid, BETA, Atoms.empty(1)) / scale
        worst = max(worst, abs(e_a - e_b))
        print(f"| {t:g} | {a.atoms.count} | {e_a:.6f} | {e_b:.6f} | {e_a - e_b:.1e} |")
        assert abs(a.mass - 1.0) < 1e-13
    last = run.snapshots[-1].atoms
    centres = last.centre[:, 0]
    rows = cluster_moments(reference.snapshots[-1].density, grid, centres)
    ours = cluster_moments(run.snapshots[-1].density, coarse, centres, last)
    table = []
    print("| atom | mass | fine | centre | fine | sd | fine | atom sd |\n" + "|---" * 8 + "|")
    for k, ((m, c, sd), mine) in enumerate(zip(rows, ours, strict=True)):
        print(
            f"| {int(last.ids[k])} | {mine[0]:.5f} | {m:.5f} | {mine[1]:.5f} | {c:.5f} | "
            f"{mine[2]:.5f} | {sd:.5f} | {math.sqrt(last.cov[k, 0, 0]):.5f} |"
        )
        table.append((mine, (m, c, sd)))
    return worst, table


def test_noisy_atoms_against_a_fine_grid_without_atoms():
    """eps = 2e-3, the two narrow clusters at 128 cells with atoms (born at t = 0.03: 1.4
    cells wide) against 512 cells without atoms (the clusters 5 cells wide) to t = 1.5:
    the atoms' widths are held by the noise against the contraction (without the atoms'
    noise substep they shrink to 0.029 and 0.034), the clusters (atom plus the cells within
    0.5) within 3 % of the fine grid's in width,
    centres within 2e-3, masses within 1e-3, the energy within 1e-3 of a point mass's."""
    worst, table = compare_noisy(1.5, 512)
    assert worst < 1e-3
    assert len(table) == 2
    for (m, c, sd), (m_ref, c_ref, sd_ref) in table:
        assert abs(m - m_ref) < 1e-3
        assert abs(c - c_ref) < 2e-3
        assert sd == pytest.approx(sd_ref, rel=0.03)


@pytest.mark.slow
def test_noisy_atoms_merge_against_a_fine_grid():
    """The same case to t = 5: the atoms merge (t = 3.1) and the wide cluster becomes an atom
    (t = 4.6); at t = 5 each cluster against 512 cells without atoms (whose own change to
    1024 cells is 0.5 % of the width): widths within 3 % (measured 0.7 % for the merged atom,
    2.1 % for the young one), centres within 1e-3, masses within 5e-4; the energy within 1e-3
    throughout (2.5e-5 at the end)."""
    worst, table = compare_noisy(5.0, 512)
    assert worst < 1e-3
    assert len(table) == 2
    for (m, c, sd), (m_ref, c_ref, sd_ref) in table:
        assert abs(m - m_ref) < 5e-4
        assert abs(c - c_ref) < 1e-3
        assert sd == pytest.approx(sd_ref, rel=0.03)


def test_noisy_atoms_resume_bit_for_bit():
    """A noisy run with atoms (the two clusters, 128 cells, eps = 2e-3) to t = 1, and the same
    run resumed from its snapshot at t = 0.5 (its density, atoms, next atom id, outflow and
    resolution estimate, as ``--resume`` reads them): the cells and atoms at t = 1 agree bit
    for bit."""
    grid = circle_grid(128)
    rho = von_mises_mixture(grid, COMPONENTS)
    rho = rho / grid.integrate(rho)
    field = CircleAttention(circle_head(BETA), engine="fft")
    problem = Problem(
        grid,
        rho,
        field,
        1.0,
        scheme=Scheme(dt_max=0.1),
        snapshots=[0.0, 0.5, 1.0],
        noise=2e-3,
        atoms=AtomOptions(),
    )
    estimates: list[float] = []  # the resolution estimate at each snapshot (the file's)
    solver = Solver(problem)
    solver.callbacks.append(lambda snap: estimates.append(solver.monitor.reconstruction_error))
    full = solver.run()
    middle = full.snapshots[1]
    assert middle.atoms is not None and middle.atoms.count == 2
    resumed = replace(
        problem,
        velocity=CircleAttention(circle_head(BETA), engine="fft"),
        density=middle.density,
        t_start=middle.time,
        snapshots=[0.5, 1.0],
        initial_outflow=middle.outflow,
        initial_reconstruction_error=estimates[1],
        initial_atoms=middle.atoms,
        next_atom_id=middle.next_atom_id,
    )
    again = Solver(resumed).run()
    a, b = full.snapshots[-1], again.snapshots[-1]
    print(f"\nsteps: {full.steps} in one run, {again.steps} after the resume")
    assert np.array_equal(a.density, b.density)
    for name in ("mass", "centre", "cov", "ids", "born"):
        assert np.array_equal(getattr(a.atoms, name), getattr(b.atoms, name), equal_nan=True)


@pytest.mark.slow
def test_noisy_atoms_in_the_file_resume_bit_for_bit(tmp_path):
    """``tpde run`` with ``[atoms]`` and ``run.noise`` on the circle, killed after 5 snapshots
    and resumed (``--resume``), equals the uninterrupted run bit for bit: cells, atoms' ids,
    masses, centres and variances in every record."""
    from exact import kill_after
    from test_circle_atoms import ATOMS_CONFIG  # (two clusters that become atoms and merge)

    from tpde.cli import main
    from tpde.config import dumps
    from tpde.io import read

    raw = {
        **ATOMS_CONFIG,
        "attention": {"beta": BETA, "engine": "fft"},
        "atoms": {},
        "run": {"t_end": 4.0, "snapshots": 21, "noise": 2e-3},
    }
    config = tmp_path / "noisy.toml"
    config.write_text(dumps(raw))
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert main(["run", str(config), "-o", str(full), "--quiet"]) == 0
    kill_after(["run", str(config), "-o", str(cut)], 6)
    assert main(["run", str(config), "-o", str(cut), "--resume", "--quiet"]) == 0
    resumed, reference = read(cut), read(full)
    for name in ("density", "atom_id", "atom_mass", "atom_centre", "atom_variance"):
        assert np.array_equal(resumed[name].values, reference[name].values, equal_nan=True), name
    counts = (reference["atom_id"].values >= 0).sum(axis=1)
    print(f"\natoms per record: {counts.tolist()}")
    assert counts.max() >= 2
