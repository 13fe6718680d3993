#!/usr/bin/env python
"""A step with atoms against a step of the cells alone, side by side, on the circle and the
sphere.

    .venv/bin/python benchmarks/atoms.py [--case circle bessel sphere] [--rounds 5]

One JSON line per case; in each the two runs advance alternately in one process (interleaved
rounds, so both see the same load), and ``atoms_over_cells`` is the ratio of the shortest
time per step of each over the rounds (the load only adds time); ``median_ratio`` the median
of the rounds' ratios; ``atoms_over_cells_cpu`` the ratio of the shortest CPU times of the
process (one thread: what the load's waits for a core leave out) and ``median_ratio_cpu``
the median of the rounds' CPU ratios. ``load``: the one-minute load average at the end.

* ``atoms`` (``--case circle``): the metastability case of docs/theory.md, 'Cells plus atoms'
  (``A = 9 I``, modes 3, 4, 5 at 0.1, ``--cells`` cells): both runs go to ``t = 8`` (four
  atoms by then in the run with atoms), then advance by 0.2 time units per round (the
  adaptive steps of each: SSP-RK3, WENO5-Z, FFT engine; the run with atoms adds the atoms'
  sums, their motion and the transfers after every step).
* ``atoms_bessel`` (``--case bessel``): a general 2 x 2 head, ``A = diag(9, 6)`` (the
  Jacobi-Anger series of docs/theory.md, 'Atoms under any head on the circle'), the two
  narrow clusters of tests/test_circle_atoms_bessel.py on ``--bessel-cells`` cells (128):
  both runs to ``t = 0.5`` (two atoms, born at ``t = 0.03``), then rounds of 0.25 time
  units (about ten steps at 128 cells; twelve rounds end before the atoms merge at ``t =
  4.35``).
* ``atoms_sphere`` (``--case sphere``): the cubed sphere at 32 cells a panel edge,
  ``beta = 16``, ``velocity_at = "centres"`` (examples/sphere/clusters_s2_atoms.toml's
  scheme), nine von Mises-Fisher atoms of mass 0.1 each (spread ``(h / 4)^2``, centres on a
  Fibonacci lattice) over cells holding the remaining 0.1 (noise 1e-3 to degree 10); the
  cells alone carry the same cells. A round times ``solve`` over ``--steps`` + 1 steps of
  ``dt = 0.01`` less ``solve`` over one (the construction and first evaluation cancel).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import emit, loadavg  # noqa: E402

from tpde.grid import cubed_sphere as cs  # noqa: E402
from tpde.grid.circle import circle_grid, uniform_modes, von_mises_mixture  # noqa: E402
from tpde.grid.threads import set_num_threads  # noqa: E402
from tpde.schemes.atoms import AtomOptions  # noqa: E402
from tpde.schemes.cubed_sphere import solve  # noqa: E402
from tpde.schemes.solver import Problem, Scheme, Solver  # noqa: E402
from tpde.schemes.sphere_atoms import SphereAtomRun, VMFAtoms  # noqa: E402
from tpde.variants.cubed_sphere import CubedSphereAttention  # noqa: E402
from tpde.variants.parameters import Head  # noqa: E402
from tpde.variants.spherical import CircleAttention, circle_head  # noqa: E402

MODES = [(3, 0.1, 0.0), (4, 0.1, 1.0), (5, 0.1, 2.0)]
#: tests/test_circle_atoms_bessel.py's two narrow clusters (weight, centre, kappa)
CLUSTERS = [(0.5, 1.0, 200.0), (0.4, 1.7, 200.0), (0.1, 4.0, 2.0)]
SPHERE_ATOMS = 9
SPHERE_DT = 0.01


def ratios(per_step: dict[str, list[tuple[float, float]]]) -> dict:
    """The figures of interleaved rounds, each a (wall, CPU) time per step: the shortest
    wall ms per step of each run, the ratio of the shortest (``atoms_over_cells``), the
    median of the rounds' ratios, and the same ratio of the shortest CPU times of the
    process (``atoms_over_cells_cpu``: on a machine with more runnable processes than cores
    a round's wall time counts the waits for a core, its CPU time does not), and the median
    of the rounds' CPU ratios (``median_ratio_cpu``)."""
    cells, atoms = np.array(per_step["cells"]), np.array(per_step["atoms"])
    return {
        "rounds": int(cells.shape[0]),
        "ms_per_step_cells": round(1e3 * float(cells[:, 0].min()), 3),
        "ms_per_step_atoms": round(1e3 * float(atoms[:, 0].min()), 3),
        "atoms_over_cells": round(float(atoms[:, 0].min() / cells[:, 0].min()), 3),
        "median_ratio": round(float(np.median(atoms[:, 0] / cells[:, 0])), 3),
        "cpu_ms_per_step_cells": round(1e3 * float(cells[:, 1].min()), 3),
        "cpu_ms_per_step_atoms": round(1e3 * float(atoms[:, 1].min()), 3),
        "atoms_over_cells_cpu": round(float(atoms[:, 1].min() / cells[:, 1].min()), 3),
        "median_ratio_cpu": round(float(np.median(atoms[:, 1] / cells[:, 1])), 3),
    }


def clocks() -> np.ndarray:
    """Wall and process CPU seconds now."""
    return np.array([time.perf_counter(), time.process_time()])


def circle_rounds(runs: dict[str, Solver], warm: float, span: float, rounds: int) -> dict:
    for s in runs.values():
        s.advance_to(warm)
    per_step: dict[str, list[tuple[float, float]]] = {"cells": [], "atoms": []}
    for r in range(rounds):
        target = warm + span * (r + 1)
        for name, s in runs.items():
            steps = s.steps
            t0 = clocks()
            s.advance_to(target)
            spent = (clocks() - t0) / max(1, s.steps - steps)
            per_step[name].append((float(spent[0]), float(spent[1])))
    assert runs["atoms"].atom_run is not None
    return {"atoms": runs["atoms"].atom_run.atoms.count, **ratios(per_step)}


def circle_case(cells: int, rounds: int) -> dict:
    warm, span = 8.0, 0.2
    grid = circle_grid(cells)
    runs = {
        name: Solver(
            Problem(
                grid,
                uniform_modes(grid, MODES),
                CircleAttention(circle_head(9.0), engine="fft"),
                warm + span * rounds,
                scheme=Scheme(dt_max=0.1),
                atoms=AtomOptions() if name == "atoms" else None,
            )
        )
        for name in ("cells", "atoms")
    }
    return {"cells": cells, "head": "A = 9 I (FFT)", **circle_rounds(runs, warm, span, rounds)}


def bessel_case(cells: int, rounds: int) -> dict:
    warm, span = 0.5, 0.25
    grid = circle_grid(cells)
    rho = von_mises_mixture(grid, CLUSTERS)
    rho = rho / grid.integrate(rho)
    head = Head(np.diag([9.0, 6.0]), np.eye(2))
    runs = {
        name: Solver(
            Problem(
                grid,
                rho,
                CircleAttention(head, engine="fft"),
                warm + span * rounds,
                scheme=Scheme(dt_max=0.1),
                atoms=AtomOptions() if name == "atoms" else None,
            )
        )
        for name in ("cells", "atoms")
    }
    head_name = "A = diag(9, 6) (Bessel)"
    return {"cells": cells, "head": head_name, **circle_rounds(runs, warm, span, rounds)}


def sphere_atoms(grid: cs.CubedSphere) -> VMFAtoms:
    """Nine atoms of mass 0.1 on a Fibonacci lattice, spread ``(h / 4)^2``."""
    i = np.arange(SPHERE_ATOMS)
    z = 1.0 - (2.0 * i + 1.0) / SPHERE_ATOMS
    phi = i * math.pi * (3.0 - math.sqrt(5.0))
    rz = np.sqrt(1.0 - z * z)
    centre = np.stack([rz * np.cos(phi), rz * np.sin(phi), z], axis=1)
    return VMFAtoms(
        np.full(SPHERE_ATOMS, 0.1),
        centre,
        np.full(SPHERE_ATOMS, (0.25 * grid.h) ** 2),
        i.copy(),
        np.full(SPHERE_ATOMS, math.nan),
        np.full((SPHERE_ATOMS, 2), -1),
    )


def sphere_case(cells: int, steps: int, rounds: int) -> dict:
    grid = cs.cubed_sphere(cells)
    density = cs.noise(grid, 1e-3, 10, seed=0, mass=0.1)
    start = sphere_atoms(grid)

    def run(name: str, k: int) -> tuple[np.ndarray, int]:
        field = CubedSphereAttention(16.0)
        atoms = SphereAtomRun(grid, field, AtomOptions(), start) if name == "atoms" else None
        t0 = clocks()
        result = solve(
            grid,
            density,
            field,
            k * SPHERE_DT,
            dt_max=SPHERE_DT,
            snapshots=2,
            velocity_at="centres",
            atoms=atoms,
        )
        return clocks() - t0, result.steps

    per_step: dict[str, list[tuple[float, float]]] = {"cells": [], "atoms": []}
    for _ in range(rounds):
        for name in ("cells", "atoms"):
            (many, k), (one, j) = run(name, steps + 1), run(name, 1)
            spent = (many - one) / (k - j)
            per_step[name].append((float(spent[0]), float(spent[1])))
    return {"cells_a_panel": cells, "atoms": SPHERE_ATOMS, "steps": steps, **ratios(per_step)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", default=["circle", "bessel", "sphere"],
                        choices=["circle", "bessel", "sphere"])  # fmt: skip
    parser.add_argument("--cells", type=int, default=512, help="the circle case's cells")
    parser.add_argument("--bessel-cells", type=int, default=128)
    parser.add_argument("--sphere-cells", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="sphere steps a round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    set_num_threads(1)
    for case in args.case:
        start = time.perf_counter()
        if case == "circle":
            emit("atoms", start, **circle_case(args.cells, args.rounds), load=loadavg())
        elif case == "bessel":
            figures = bessel_case(args.bessel_cells, args.rounds)
            emit("atoms_bessel", start, **figures, load=loadavg())
        else:
            figures = sphere_case(args.sphere_cells, args.steps, args.rounds)
            emit("atoms_sphere", start, **figures, load=loadavg())


if __name__ == "__main__":
    main()
