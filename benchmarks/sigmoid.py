#!/usr/bin/env python
"""Sigmoid attention at full resolution: its engines, its step beside softmax's, and why its
sums have no smooth table.

    .venv/bin/python benchmarks/sigmoid.py [--n 256] [--n3 64] [--steps 3] [--threads 1]

Rows (one JSON line each; every ratio from timings taken back to back in this run):

* ``sigmoid_engines`` (2-D ``--n-direct``^2, default 128): one evaluation of what a stage
  needs (the normal component on each of the d face lattices), engine "lattice" against
  "direct", and their relative max difference.
* ``sigmoid_step`` (2-D ``--n``^2): one SSP-RK3 step of the default scheme with sigmoid
  attention (engine "auto") and with softmax attention (the separable engine) on the same
  mixture, alternating, median over ``--steps`` each: ``sigmoid_over_softmax``.
* ``sigmoid_velocity_3d`` (3-D ``--n3``^3): one evaluation of the normal components on the
  three face lattices, sigmoid ("auto") and softmax: ``sigmoid_over_softmax``.
* ``sigmoid_table_degree``: the Chebyshev degree the dense sum F(c) = sum_s sigma(c y_s + b)
  w_s of a 1-D 256-cell mixture needs for 1e-6 and 1e-10 (relative) over |c| <= 5 and 20 (the
  range of c = A x on a box of radius 10 for ||A|| = 0.5 and 2): a table of F interpolated in
  c, the route of the exponential engines, needs that many nodes per axis (docs/theory.md,
  'Sigmoid sums').

Random non-symmetric A and C (seed 5, scaled to ||A|| = 1), bias -1.5; the mixture of
tests/test_sigmoid.py on [-7, 7]^d.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from scipy.fft import dct
from scipy.special import expit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import emit, loadavg  # noqa: E402

import tpde  # noqa: E402
from tpde.grid import Grid, gaussian  # noqa: E402
from tpde.schemes.solver import Problem, Solver  # noqa: E402
from tpde.variants import Head, SigmoidAttention, SigmoidHead  # noqa: E402
from tpde.variants.softmax import SoftmaxAttention  # noqa: E402

BIAS = -1.5


def heads(d: int) -> tuple[SigmoidHead, Head]:
    rng = np.random.default_rng(5)
    A = rng.normal(size=(d, d))
    A /= np.linalg.norm(A, 2)
    C = rng.normal(size=(d, d))
    return SigmoidHead(A, C, bias=BIAS), Head(A, C)


def mixture(grid: Grid) -> np.ndarray:
    d = grid.ndim
    wide = np.eye(d) * 0.8 + 0.2
    return 0.65 * gaussian(grid, 0.7 * np.ones(d), wide) + 0.35 * gaussian(
        grid, -1.2 * np.ones(d), 0.25 * np.eye(d)
    )


def face_offsets(d: int) -> list[np.ndarray]:
    return [np.where(np.arange(d) == a, 0.5, 0.0) for a in range(d)]


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def emit_ratio(
    benchmark: str, start: float, n: int, threads: int, suffix: str, seconds: dict[str, float]
) -> None:
    """One row with the sigmoid and softmax seconds (keys ``sigmoid<suffix>``,
    ``softmax<suffix>``) and their ratio."""
    emit(
        benchmark,
        start,
        n=n,
        threads=threads,
        **{f"{name}{suffix}": round(seconds[name], 4) for name in ("sigmoid", "softmax")},
        sigmoid_over_softmax=round(seconds["sigmoid"] / seconds["softmax"], 1),
        loadavg=loadavg(),
    )


def engines_row(n: int, threads: int) -> None:
    start = time.perf_counter()
    grid = Grid([-7.0, -7.0], [7.0, 7.0], [n, n])
    rho, offsets = mixture(grid), face_offsets(2)
    head = heads(2)[0]
    fields = {e: SigmoidAttention(head, engine=e) for e in ("lattice", "direct")}
    small = Grid([-7.0, -7.0], [7.0, 7.0], [8, 8])
    for field in fields.values():  # compile
        field.at_many(mixture(small), small, 0.0, face_offsets(2))
    seconds, values = {}, {}
    for name, field in fields.items():
        seconds[name], values[name] = timed(
            lambda f=field: f.components(rho, grid, 0.0, offsets, [0, 1])
        )
    error = max(
        float(np.abs(a - b).max() / np.abs(b).max())
        for a, b in zip(values["lattice"], values["direct"], strict=True)
    )
    emit(
        "sigmoid_engines",
        start,
        n=n,
        threads=threads,
        lattice_s=round(seconds["lattice"], 4),
        direct_s=round(seconds["direct"], 3),
        direct_over_lattice=round(seconds["direct"] / seconds["lattice"], 1),
        relative_difference=float(f"{error:.2e}"),
        loadavg=loadavg(),
    )


def step_row(n: int, steps: int, threads: int) -> None:
    start = time.perf_counter()
    grid = Grid([-7.0, -7.0], [7.0, 7.0], [n, n])
    sigmoid, softmax = heads(2)
    solvers = {
        "sigmoid": Solver(Problem(grid, mixture(grid), SigmoidAttention(sigmoid), 1e9)),
        "softmax": Solver(Problem(grid, mixture(grid), SoftmaxAttention(softmax), 1e9)),
    }
    dts = {}
    for name, solver in solvers.items():
        velocity = solver.face_velocity(solver.density, 0.0)
        dts[name] = 0.4 * solver.stable_dt(velocity)
        solver.step(dts[name], velocity)  # compile
    times: dict[str, list[float]] = {name: [] for name in solvers}
    for _ in range(steps):
        for name, solver in solvers.items():
            seconds, _ = timed(lambda s=solver, n=name: s.step(dts[n]))
            times[name].append(seconds)
    medians = {name: float(np.median(t)) for name, t in times.items()}
    emit_ratio("sigmoid_step", start, n, threads, "_step_s", medians)


def velocity_3d_row(n: int, threads: int) -> None:
    start = time.perf_counter()
    grid = Grid([-7.0] * 3, [7.0] * 3, [n] * 3)
    rho, offsets = mixture(grid), face_offsets(3)
    sigmoid, softmax = heads(3)
    fields = {"sigmoid": SigmoidAttention(sigmoid), "softmax": SoftmaxAttention(softmax)}
    small = Grid([-7.0] * 3, [7.0] * 3, [8] * 3)
    for field in fields.values():  # compile
        field.at_many(mixture(small), small, 0.0, offsets)
    seconds = {  # (softmax: the faster of two, its first may still plan its tables)
        name: min(
            timed(lambda f=field: f.components(rho, grid, 0.0, offsets, [0, 1, 2]))[0]
            for _ in range(1 if name == "sigmoid" else 2)
        )
        for name, field in fields.items()
    }
    emit_ratio("sigmoid_velocity_3d", start, n, threads, "_s", seconds)


def table_degree_row() -> None:
    """Chebyshev coefficients of F on [-c_max, c_max] from its values at 3000 Chebyshev
    points (a DCT-II); the degree is the last coefficient above the tolerance times the
    largest."""
    start = time.perf_counter()
    edges = np.linspace(-10.0, 10.0, 257)
    y = 0.5 * (edges[1:] + edges[:-1])
    w = 0.7 * np.exp(-0.5 * (y - 0.3) ** 2) + 0.3 * np.exp(-0.5 * (y + 2.0) ** 2 / 0.3)
    degrees = {}
    nodes = 3000
    for c_max in (5.0, 20.0):
        c = c_max * np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
        coefficients = np.abs(dct((expit(np.outer(c, y) + BIAS) * w).sum(axis=1), type=2))
        for tol in (1e-6, 1e-10):
            above = np.flatnonzero(coefficients > tol * coefficients.max())
            degrees[f"c{c_max:g}_tol{tol:g}"] = int(above[-1])
    emit("sigmoid_table_degree", start, cells=256, degrees=degrees)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--n-direct", type=int, default=128)
    parser.add_argument("--n3", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    tpde.set_num_threads(args.threads)
    table_degree_row()
    engines_row(args.n_direct, args.threads)
    step_row(args.n, args.steps, args.threads)
    velocity_3d_row(args.n3, args.threads)


if __name__ == "__main__":
    main()
