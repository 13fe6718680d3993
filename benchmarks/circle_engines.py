#!/usr/bin/env python
"""A circle step with a general 2 x 2 head (Jacobi-Anger series) against A = a I + b J (FFT
convolution), side by side.

    .venv/bin/python benchmarks/circle_engines.py [--n 4096] [--steps 30] [--threads 1]

One SSP-RK3 step (WENO5-Z, positivity limiter, the velocity on the faces at every stage) of
softmax attention on the circle, ``n`` cells, from the same smooth three-bump von Mises
mixture. The conformal head ``A = 4 I + J`` takes the convolution engine; the general head
(``A = [[4, 1.5], [-0.5, 2.5]]``, ``V`` not conformal either) takes the Bessel series
(:mod:`tpde.variants.engines.bessel`): both are what ``engine = "auto"`` chooses. Both take
the same fixed dt; steps alternate in rounds of BLOCK (a shared machine's load drifts) and
``general_over_conformal`` is the median of the rounds' ratios. The row also gives the
series' truncation order and, on n / 4 cells, the general head's velocity against the dense
sums (the direct engine, eighth-order point values: its own error on this density is
~1e-12), relative to the largest. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import emit, loadavg  # noqa: E402

from tpde.grid.circle import circle_grid, von_mises_mixture  # noqa: E402
from tpde.grid.threads import set_num_threads  # noqa: E402
from tpde.schemes.solver import Problem, Solver  # noqa: E402
from tpde.variants import Head  # noqa: E402
from tpde.variants.spherical import CircleAttention, is_conformal  # noqa: E402

BLOCK = 5
MIXTURE = [(0.5, 0.5, 6.0), (0.3, 2.8, 10.0), (0.2, 4.5, 4.0)]
CONFORMAL = Head(np.array([[4.0, -1.0], [1.0, 4.0]]), np.eye(2))
GENERAL = Head(np.array([[4.0, 1.5], [-0.5, 2.5]]), np.array([[1.0, 0.3], [-0.2, 0.7]]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    start = time.perf_counter()
    set_num_threads(args.threads)
    grid = circle_grid(args.n)
    rho = von_mises_mixture(grid, MIXTURE)
    fields = {"conformal": CircleAttention(CONFORMAL), "general": CircleAttention(GENERAL)}
    solvers = {name: Solver(Problem(grid, rho, f, 1.0)) for name, f in fields.items()}
    dt = 0.2 * grid.spacing[0] / 8.0  # within the CFL bound of both (|theta'| <= ||C||)
    for solver in solvers.values():  # warm-up: compilation, kernel tables
        solver.step(dt)
    engines = {  # the engine "auto" took, and which of its two ways
        name: f"{f.last_engine} ({'convolution' if is_conformal(head.A) else 'series'})"
        for (name, f), head in zip(fields.items(), (CONFORMAL, GENERAL), strict=True)
    }
    ratios, times = [], {name: [] for name in solvers}
    for _ in range(max(1, args.steps // BLOCK)):
        block = {}
        for name, solver in solvers.items():
            clock = []
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                solver.step(dt)
                clock.append(time.perf_counter() - t0)
            block[name] = float(np.median(clock))
            times[name] += clock
        ratios.append(block["general"] / block["conformal"])
    # accuracy of the series on the faces against the dense sums (on n / 4 cells: the dense
    # sums hold n^2 kernel values)
    coarse = circle_grid(max(64, args.n // 4))
    coarse_rho = von_mises_mixture(coarse, MIXTURE)
    field = CircleAttention(GENERAL)
    series = field.at(coarse_rho, coarse, 0.0, [0.5])[0]
    order = max(int(v[1][0].order) for k, v in field._fixed.items() if k[0] == "bessel")
    dense = CircleAttention(GENERAL, engine="direct").at(coarse_rho, coarse, 0.0, [0.5])[0]
    emit(
        "circle_engines",
        start,
        n=args.n,
        threads=args.threads,
        engines=engines,
        series_order=order,
        conformal_step_s=round(float(np.median(times["conformal"])), 5),
        general_step_s=round(float(np.median(times["general"])), 5),
        general_over_conformal=round(float(np.median(ratios)), 3),
        dense_check_n=coarse.cells[0],
        series_vs_dense=float(np.abs(series - dense).max() / np.abs(dense).max()),
        loadavg=loadavg(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
