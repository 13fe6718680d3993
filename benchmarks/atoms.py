#!/usr/bin/env python
"""A step with atoms against a step of the cells alone, side by side, on the circle.

    .venv/bin/python benchmarks/atoms.py [--cells 512] [--rounds 5]

The metastability case of docs/theory.md, 'Cells plus atoms' (``A = 9 I``, modes 3, 4, 5
at 0.1): both runs go to ``t = 8`` (four atoms by then in the run with atoms), then
advance alternately by 0.2 time units per round (the adaptive steps of each: SSP-RK3,
WENO5-Z, FFT engine; the run with atoms adds the atoms' sums, their motion and the
transfers after every step). ``atoms_over_cells`` is the median over the rounds of the
ratio of the times per step. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import emit, loadavg  # noqa: E402

from tpde.grid.circle import circle_grid, uniform_modes  # noqa: E402
from tpde.grid.threads import set_num_threads  # noqa: E402
from tpde.schemes.atoms import AtomOptions  # noqa: E402
from tpde.schemes.solver import Problem, Scheme, Solver  # noqa: E402
from tpde.variants.spherical import CircleAttention, circle_head  # noqa: E402

MODES = [(3, 0.1, 0.0), (4, 0.1, 1.0), (5, 0.1, 2.0)]
WARM = 8.0
ROUND = 0.2


def solver(cells: int, atoms: bool, t_end: float) -> Solver:
    grid = circle_grid(cells)
    problem = Problem(
        grid,
        uniform_modes(grid, MODES),
        CircleAttention(circle_head(9.0), engine="fft"),
        t_end,
        scheme=Scheme(dt_max=0.1),
        atoms=AtomOptions() if atoms else None,
    )
    return Solver(problem)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    set_num_threads(1)
    start = time.perf_counter()
    t_end = WARM + ROUND * args.rounds
    runs = {name: solver(args.cells, name == "atoms", t_end) for name in ("cells", "atoms")}
    for s in runs.values():
        s.advance_to(WARM)
    per_step: dict[str, list[float]] = {"cells": [], "atoms": []}
    for r in range(args.rounds):
        target = WARM + ROUND * (r + 1)
        for name, s in runs.items():
            steps = s.steps
            t0 = time.perf_counter()
            s.advance_to(target)
            per_step[name].append((time.perf_counter() - t0) / max(1, s.steps - steps))
    ratios = [a / c for a, c in zip(per_step["atoms"], per_step["cells"], strict=True)]
    assert runs["atoms"].atom_run is not None
    emit(
        "atoms",
        start,
        cells=args.cells,
        atoms=runs["atoms"].atom_run.atoms.count,
        ms_per_step_cells=round(1e3 * float(np.median(per_step["cells"])), 3),
        ms_per_step_atoms=round(1e3 * float(np.median(per_step["atoms"])), 3),
        atoms_over_cells=round(float(np.median(ratios)), 3),
        load=loadavg(),
    )


if __name__ == "__main__":
    main()
