#!/usr/bin/env python
"""Cost of a full softmax step vs grid size (64^2 .. 1024^2) and peak memory per cell.

    .venv/bin/python benchmarks/scaling.py [--sizes 64 128 256 512 1024]

The step of benchmarks/step.py (2-D, softmax c1, WENO5-Z, SSP-RK3, default threads) at each
n^2, each size in a fresh subprocess, through the solver's own loop (``advance_to``, fixed
dt = 5e-4, one step per call; the velocity, dt bound and step as in a run): the median time
of a few steps after a warm-up (timed with tracemalloc off), and the memory of the run's
working set over the solver's construction and its first two steps, measured two ways:

* ``traced_doubles_per_cell``: tracemalloc's peak of the numpy allocations (the solver state,
  work arrays, velocity tables and every temporary) from just before the solver is built to
  the end of its second step, over n^2 * 8 bytes; the initial density is built before.
* ``rss_doubles_per_cell``: growth of the process's peak resident memory (ru_maxrss) over the
  same span (includes allocations tracemalloc does not see: numba and BLAS buffers, FFTW).

The fitted exponent is the least-squares slope of log(step time) against log(cells).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import A1, V1, emit, loadavg  # noqa: E402


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB


def child(n: int, steps: int) -> dict:
    import numba

    from tpde.grid import Grid, gaussian
    from tpde.schemes.solver import Problem, Scheme, Solver
    from tpde.variants import Head
    from tpde.variants.softmax import SoftmaxAttention

    def solver_for(cells: int, rho=None):
        grid = Grid([-7.0, -7.0], [7.0, 7.0], [cells, cells])
        rho = gaussian(grid, [0.5, -0.3], [[1.0, 0.4], [0.4, 0.6]]) if rho is None else rho
        # fixed dt (below the positivity bound at every size): one advance_to, one step,
        # through the solver's own loop (it drops each stage velocity after its last use)
        return Solver(
            Problem(grid, rho, SoftmaxAttention(Head(A1, V1)), t_end=1e9, scheme=Scheme(dt=5e-4))
        )

    warm = solver_for(32)  # compile every kernel on a small grid
    warm.advance_to(1e-3)
    grid = Grid([-7.0, -7.0], [7.0, 7.0], [n, n])
    rho = gaussian(grid, [0.5, -0.3], [[1.0, 0.4], [0.4, 0.6]])
    rss_before = peak_rss_bytes()
    tracemalloc.start()
    solver = solver_for(n, rho)
    del rho
    dt = solver.problem.scheme.dt
    solver.advance_to(dt)
    solver.advance_to(2 * dt)  # the peak of a step is the same in every step
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()  # timed without tracing (tracemalloc slows every allocation)
    times = []
    for k in range(steps):
        start = time.perf_counter()
        solver.advance_to((k + 3) * dt)
        times.append(time.perf_counter() - start)
    cells = n * n
    return {
        "cells_per_axis": n,
        "cells": cells,
        "step_s": float(np.median(times)),
        "traced_doubles_per_cell": traced_peak / (8 * cells),
        "rss_doubles_per_cell": max(peak_rss_bytes() - rss_before, 0) / (8 * cells),
        "threads": numba.get_num_threads(),
        "loadavg": loadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.steps)), flush=True)
        return 0
    start = time.perf_counter()
    rows = []
    for n in args.sizes:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", str(n), "--steps", str(args.steps)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"# {n}^2: {r['step_s'] * 1e3:.1f} ms/step, memory {r['traced_doubles_per_cell']:.1f}"
            f" doubles/cell traced, {r['rss_doubles_per_cell']:.1f} by peak RSS",
            file=sys.stderr,
            flush=True,
        )
    cells = np.array([r["cells"] for r in rows], float)
    seconds = np.array([r["step_s"] for r in rows])
    exponent = float(np.polyfit(np.log(cells), np.log(seconds), 1)[0])
    largest = rows[-1]
    print(f"# cost ~ N^{exponent:.2f}", file=sys.stderr)
    emit(
        "scaling",
        start,
        case="softmax c1 step, WENO5-Z, SSP-RK3",
        cost_exponent=exponent,
        largest=f"{largest['cells_per_axis']}^2",
        traced_doubles_per_cell_largest=largest["traced_doubles_per_cell"],
        rss_doubles_per_cell_largest=largest["rss_doubles_per_cell"],
        rows=rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
