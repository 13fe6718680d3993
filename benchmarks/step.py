#!/usr/bin/env python
"""Full Transformer-PDE step: time per step, steps per second, and the FFT floor.

    .venv/bin/python benchmarks/step.py [--n 256] [--steps 20] [--profile]
    .venv/bin/python benchmarks/step.py --dim 3 --n 128 --steps 8 --threads 1 --memory

One SSP-RK3 step with WENO5-Z fluxes, the positivity limiter and the attention velocity
recomputed at every stage (the default scheme, face velocities interpolated along the faces),
2-D n^2 on [-7, 7]^2, Gaussian density; the c1 test matrices of docs/theory.md (softmax,
Sinkhorn eps = 1) and the l2 head of benchmarks/velocity.py (``sinkhorn_over_softmax_*``:
the Sinkhorn step over the softmax step, per thread count). Each case is timed at 1 and 2
threads in the same run (median over ``--steps`` steps after two warm-up steps), split into
the velocity (kernel sums, all stages) and the rest (fluxes, limiter, stage combinations).
``--dim 3``: the softmax case alone on [-7, 7]^3 with the seeded random 3 x 3 head of
benchmarks/velocity.py and a correlated Gaussian. ``--threads``: the thread counts to run
(default 1,2). ``--memory``: each row also holds the peak memory of the solver's
construction and its two warm-up steps, per cell, as benchmarks/scaling.py measures it
(``traced_doubles_per_cell``: tracemalloc's peak over n^d * 8 bytes;
``rss_doubles_per_cell``: the growth of the peak resident memory); the timed steps run
untraced. The steps run in rounds of BLOCK, each followed by BLOCK evaluations of the FFT
floor at the same thread count; ``step_over_fft_floor`` is the median over rounds of the
two medians' ratio (a shared machine's load drifts by 1.5x within a minute; a round sees
one load).

The FFT floor of a step: the padded real transforms an FFT-convolution evaluation of the
same velocities needs, timed as planned pyfftw transforms (FFTW_MEASURE) at the same thread
count: per stage, d + 1 forward transforms of the (2n)^d zero-padded weighted fields (the
denominator and the d numerators w (C y)_a) and two inverses per face lattice (the
denominator and the numerator of the normal component; the step evaluates d lattices).
No kernel multiply, copy or pointwise work is counted, so it is a lower bound for any FFT
engine. The ``softmax-fft`` row runs tpde's own FFT engine (symmetric A = 0.3 [[1, .3],
[.3, .8]], the case it applies to: it does exactly these transforms); the ``softmax`` row
is the default separable engine on the general c1 matrix (the engine ``auto`` picks, for
its relative accuracy). ``table_s`` is the separable method's own floor: its tables as the
step forms them (matrix products on the adaptive resolution, error estimate; one table per
stage). ``velocity_s`` is the ``velocity`` phase of :mod:`tpde.grid.profile`; with
``--profile`` each row also holds ``phase_s``, the self seconds per step of every phase
(velocity tables, interpolation, fluxes, limiter, ...: the table of ``tpde run --profile``),
and the table is printed to stderr. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pyfftw  # noqa: E402
from _machine import A1, V1, emit, loadavg  # noqa: E402

import tpde  # noqa: E402
from tpde.grid import Grid, gaussian, profile  # noqa: E402
from tpde.schemes.solver import Problem, Scheme, Solver  # noqa: E402
from tpde.variants import Head, L2Head, SinkhornHead  # noqa: E402
from tpde.variants.l2 import L2Attention, reweighted_density  # noqa: E402
from tpde.variants.sinkhorn import SinkhornAttention  # noqa: E402
from tpde.variants.softmax import SoftmaxAttention  # noqa: E402

L2_HEAD = L2Head([[0.8, -0.3], [0.5, 0.6]], [[0.4, 0.7], [-0.6, 0.2]], V1)


#: steps, then floor evaluations, timed back to back per round; the ratio of a round's
#: medians pairs measurements taken under the same load (the first of each block absorbs
#: the hand-over between numba's and FFTW's thread pools)
BLOCK = 4
SYMMETRIC_A = 0.3 * np.array([[1.0, 0.3], [0.3, 0.8]])  # the FFT engine's case
_RNG = np.random.default_rng(1)  # the 3-D head of benchmarks/velocity.py
HEAD3 = Head(_RNG.normal(0, 0.5, (3, 3)), _RNG.normal(0, 0.7, (3, 3)))
MEAN3 = [0.5, -0.3, 0.2]
COV3 = [[1.0, 0.4, 0.1], [0.4, 0.6, -0.1], [0.1, -0.1, 0.8]]


def make_field(case: str, ndim: int = 2):
    if case == "softmax":
        return SoftmaxAttention(Head(A1, V1) if ndim == 2 else HEAD3)
    if case == "softmax-fft":
        return SoftmaxAttention(Head(SYMMETRIC_A, V1), engine="fft")
    if case == "l2":
        return L2Attention(L2_HEAD)
    return SinkhornAttention(SinkhornHead(A1, V1, eps=1.0))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB


def time_steps(
    case: str,
    n: int,
    steps: int,
    threads: int,
    phases: bool = False,
    ndim: int = 2,
    memory: bool = False,
) -> dict:
    """Median step time of ``case``; for the kernel-sum cases rounds of BLOCK steps alternate
    with BLOCK evaluations of the FFT floor (same thread count), and the ratio is the median
    over rounds of step median / floor median: both sides of a round see the same load on a
    shared machine."""
    grid = Grid([-7.0] * ndim, [7.0] * ndim, [n] * ndim)
    if ndim == 2:
        rho = gaussian(grid, [0.5, -0.3], [[1.0, 0.4], [0.4, 0.6]])
    else:
        rho = gaussian(grid, MEAN3, COV3)
    field = make_field(case, ndim)
    rss_before = peak_rss_bytes()
    if memory:
        tracemalloc.start()
    solver = Solver(Problem(grid, rho, field, t_end=1e9, scheme=Scheme()))
    velocity = solver.face_velocity(solver.density, 0.0)
    dt = 0.4 * solver.stable_dt(velocity)
    del velocity
    for _ in range(2):  # compile, warm the Sinkhorn potentials
        solver.step(dt, solver.face_velocity(solver.density, solver.t))
    traced = tracemalloc.get_traced_memory()[1] if memory else 0
    tracemalloc.stop()
    rss = max(peak_rss_bytes() - rss_before, 0)  # (before the FFT floor's arrays)
    lattices = 1 if not solver.interpolate_faces else grid.ndim
    floor = None if case == "sinkhorn" else FFTFloor(n, grid.ndim, lattices, threads)
    totals, velocities, floors, ratios = [], [], [], []
    summed: dict[str, dict] = {}  # the phases' records over the timed steps
    for _round in range(max(1, steps // BLOCK)):
        block = []
        for _ in range(BLOCK):
            with profile.profiling() as timed:
                start = time.perf_counter()
                solver.step(dt, solver.face_velocity(solver.density, solver.t))
                block.append(time.perf_counter() - start)
            velocities.append(timed["velocity"]["total_s"])
            for name, record in timed.items():
                into = summed.setdefault(name, dict.fromkeys(record, 0))
                for key, value in record.items():
                    into[key] += value
        totals += block
        if floor is not None:
            floor_block = [floor.seconds() for _ in range(BLOCK)]
            floors += floor_block
            ratios.append(np.median(block) / np.median(floor_block))
    step_s, velocity_s = float(np.median(totals)), float(np.median(velocities))
    row = {
        "case": case,
        "cells": n,
        "step_s": step_s,
        "steps_per_s": 1.0 / step_s,
        "velocity_s": velocity_s,
        "rest_s": step_s - velocity_s,
        "lattices_per_stage": lattices,
    }
    if memory:
        row["traced_doubles_per_cell"] = traced / (8 * grid.size)
        row["rss_doubles_per_cell"] = rss / (8 * grid.size)
    if phases:
        row["phase_s"] = {name: r["self_s"] / len(totals) for name, r in summed.items()}
        table = profile.table(summed, float(np.sum(totals)))
        print(
            f"# {case} {n}^{ndim}, {threads} thread(s), {len(totals)} steps:\n{table}",
            file=sys.stderr,
        )
    if floor is not None:
        row["fft_floor_s"] = float(np.median(floors))
        row["step_over_fft_floor"] = float(np.median(ratios))
    if case == "sinkhorn":
        row["iterations_per_stage"] = float(np.mean(field.iterations[-3 * steps :]))
    elif case != "softmax-fft":
        lattices, _ = field.lattice_points(grid, [np.zeros(ndim)])
        if case == "l2":
            matrix = 2.0 * L2_HEAD.K.T @ L2_HEAD.Q
        else:
            matrix = np.asarray(A1) if ndim == 2 else HEAD3.A
        weights = rho if case == "softmax" else reweighted_density(rho, grid, L2_HEAD)
        field.sums(weights, grid, lattices, matrix, sheared=True)
        table = []
        for _ in range(5):
            start = time.perf_counter()
            field.sums(weights, grid, lattices, matrix, sheared=True)
            table.append(time.perf_counter() - start)
        row["table_s"] = 3 * float(np.median(table))
    return row


class FFTFloor:
    """The planned transforms of one SSP-RK3 step (module docstring)."""

    def __init__(self, n: int, ndim: int, lattices: int, threads: int):
        shape = (2 * n,) * ndim
        real = pyfftw.empty_aligned(shape, dtype="float64")
        real[...] = np.random.default_rng(0).random(shape)
        self.forward = pyfftw.builders.rfftn(real, threads=threads, planner_effort="FFTW_MEASURE")
        spectrum = pyfftw.empty_aligned(self.forward.output_array.shape, dtype="complex128")
        self.inverse = pyfftw.builders.irfftn(
            spectrum, s=shape, threads=threads, planner_effort="FFTW_MEASURE"
        )
        self.counts = (ndim + 1, 2 * lattices)
        self.seconds()

    def seconds(self) -> float:
        start = time.perf_counter()
        for _stage in range(3):
            for _ in range(self.counts[0]):
                self.forward()
            for _ in range(self.counts[1]):
                self.inverse()
        return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--cases",
        default="softmax,softmax-fft,l2,sinkhorn",
        help="comma-separated subset of the cases",
    )
    parser.add_argument(
        "--profile", action="store_true", help="per-phase seconds per step (phase_s)"
    )
    parser.add_argument("--dim", type=int, choices=(2, 3), default=2)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument(
        "--memory", action="store_true", help="peak doubles per cell of the warm-up steps"
    )
    args = parser.parse_args()
    if args.dim == 3 and args.cases != "softmax":
        if "--cases" in sys.argv:
            parser.error("--dim 3 runs the softmax case only")
        args.cases = "softmax"
    start = time.perf_counter()
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        used = tpde.set_num_threads(threads)
        for case in args.cases.split(","):
            steps = args.steps
            row = time_steps(case, args.n, steps, used, args.profile, args.dim, args.memory)
            row["threads"] = used
            row["loadavg"] = loadavg()
            rows.append(row)
            print(
                f"# {case} {args.n}^{args.dim}, {used} thread(s): "
                f"{row['step_s'] * 1e3:.1f} ms/step "
                f"({row['steps_per_s']:.1f} steps/s; velocity {row['velocity_s'] * 1e3:.1f} "
                f"ms)"
                + (
                    f", FFT floor {row['fft_floor_s'] * 1e3:.1f} ms: "
                    f"{row['step_over_fft_floor']:.2f}x"
                    if "fft_floor_s" in row
                    else f", {row['iterations_per_stage']:.1f} iterations per stage"
                ),
                file=sys.stderr,
                flush=True,
            )
    ratios = {  # the Sinkhorn step over the softmax step of the same run (issue 20: <= 3)
        f"sinkhorn_over_softmax_{threads}thread": sinkhorn["step_s"] / softmax["step_s"]
        for threads in (1, 2)
        for softmax in rows
        for sinkhorn in rows
        if softmax["case"] == "softmax"
        and sinkhorn["case"] == "sinkhorn"
        and softmax["threads"] == sinkhorn["threads"] == threads
    }
    emit(
        "step",
        start,
        n=args.n,
        dim=args.dim,
        scheme="WENO5-Z, SSP-RK3, positivity limiter",
        **ratios,
        rows=rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
