#!/usr/bin/env python
"""A step in the co-moving affine frame against a step in a fixed box, side by side.

    .venv/bin/python benchmarks/frame_step.py [--n 256] [--steps 10] [--threads 1]

One SSP-RK3 step (WENO5-Z, positivity limiter, softmax attention recomputed at every stage,
the default separable engine) on 2-D n^2, from the same non-Gaussian law (a two-component
Gaussian mixture with unequal weights and covariances, so the frame's residual is not zero):
the fixed box holds it on +-7 of its own spread, the frame grid on +-16 frame units. The
frame step adds the per-axis affine fit, the frame's rates and stage combinations, the
truncation measures and the shifted tilts; its velocity and cut are evaluated only on the faces
it transports (density above 1e-20 of the largest), so its tables span the same kind of tilt
range as the fixed box's. Both take the same fixed dt; steps alternate in
rounds of BLOCK (a shared machine's load drifts), and ``frame_over_fixed`` is the median of
the rounds' ratios. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import A1, V1, emit, loadavg  # noqa: E402

from tpde.grid import Grid, gaussian_mixture  # noqa: E402
from tpde.grid.threads import set_num_threads  # noqa: E402
from tpde.schemes.frame import mixture_frame  # noqa: E402
from tpde.schemes.solver import Problem, Scheme, Solver  # noqa: E402
from tpde.variants import Head, SoftmaxAttention  # noqa: E402

BLOCK = 3
WEIGHTS = [0.35, 0.65]
MEANS = [np.array([1.0, -0.5]), np.array([-0.6, 0.4])]
COVS = [np.array([[0.5, 0.1], [0.1, 0.3]]), np.array([[0.4, -0.1], [-0.1, 0.6]])]


def solvers(n: int) -> tuple[Solver, Solver]:
    field = SoftmaxAttention(Head(A1, V1))
    frame, xi_means, xi_covs = mixture_frame(WEIGHTS, MEANS, COVS)
    spread = 7.0 * np.sqrt(np.diag(frame.matrix @ frame.matrix.T))
    box = Grid(frame.mean - spread, frame.mean + spread, [n, n])
    fixed = Solver(Problem(box, gaussian_mixture(box, WEIGHTS, MEANS, COVS), field, 1.0))
    xi = Grid([-16.0, -16.0], [16.0, 16.0], [n, n])
    framed = Solver(
        Problem(
            xi,
            gaussian_mixture(xi, WEIGHTS, xi_means, xi_covs),
            SoftmaxAttention(Head(A1, V1)),
            1.0,
            scheme=Scheme(frame="affine", frame_tolerance=0.5),  # dt is fixed here
            frame=frame,
        )
    )
    return fixed, framed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    start = time.perf_counter()
    set_num_threads(args.threads)
    fixed, framed = solvers(args.n)
    dt = 1e-3
    for solver in (fixed, framed):  # warm-up: compilation, plans, tables
        solver.step(dt)
    ratios, times = [], {"fixed": [], "frame": []}
    for _ in range(max(1, args.steps // BLOCK)):
        block = {}
        for name, solver in (("fixed", fixed), ("frame", framed)):
            clock = []
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                solver.step(dt)
                clock.append(time.perf_counter() - t0)
            block[name] = float(np.median(clock))
            times[name] += clock
        ratios.append(block["frame"] / block["fixed"])
    emit(
        "frame_step",
        start,
        n=args.n,
        threads=args.threads,
        fixed_step_s=round(float(np.median(times["fixed"])), 4),
        frame_step_s=round(float(np.median(times["frame"])), 4),
        frame_over_fixed=round(float(np.median(ratios)), 3),
        loadavg=loadavg(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
