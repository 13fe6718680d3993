#!/usr/bin/env python
"""Masked attention: cost of one velocity evaluation against the number of position slices.

    .venv/bin/python benchmarks/masked.py [--n 128]

Causal softmax (c1 test matrices, docs/theory.md, 'Test matrices c1 and c2'), 2-D n^2, drifting
two-bump data, N_s = 1 .. 32 position slices plus the sink: the time of the velocity a solver stage
needs (the normal component on the faces of both axes, ``CausalAttention.components``), median of 5,
and the least-squares exponent of time against the slice count (1: linear, as the cumulative sum
along s promises; a pairwise mask would be 2). Default threads. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import A1, V1, emit, loadavg  # noqa: E402

from tpde.grid import Grid, Positions, gaussian_mixture  # noqa: E402
from tpde.variants import CausalAttention, Head, SoftmaxAttention  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--n", type=int, default=128)
    args = parser.parse_args()
    start = time.perf_counter()
    grid = Grid([-6.0, -6.0], [6.0, 6.0], [args.n, args.n])
    field = CausalAttention(SoftmaxAttention(Head(A1, V1)))
    offsets = [[0.5, 0.0], [0.0, 0.5]]
    rows = []
    for slices in (1, 2, 4, 8, 16, 32):
        positions = Positions(slices)
        density = positions.sliced(
            lambda s: gaussian_mixture(
                grid,
                [0.7 - 0.4 * s, 0.3 + 0.4 * s],
                [[-1.0 + s, 0.0], [1.0, 0.5 - s]],
                [0.4 * np.eye(2), [[0.3, 0.1], [0.1, 0.35]]],
            ),
            grid,
        )
        field.components(density, grid, 0.0, offsets, [0, 1])  # warm
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            field.components(density, grid, 0.0, offsets, [0, 1])
            times.append(time.perf_counter() - t0)
        seconds = float(np.median(times))
        rows.append(
            {
                "positions": slices,
                "slices": positions.count,
                "cells": args.n,
                "velocity_s": seconds,
                "per_slice_s": seconds / positions.count,
                "loadavg": loadavg(),
            }
        )
        print(
            f"# {slices:3d} positions (+ sink): {seconds * 1e3:8.1f} ms, "
            f"{seconds / positions.count * 1e3:.1f} ms per slice",
            file=sys.stderr,
            flush=True,
        )
    counts = np.array([r["slices"] for r in rows], float)
    seconds = np.array([r["velocity_s"] for r in rows])
    exponent = float(np.polyfit(np.log(counts), np.log(seconds), 1)[0])
    print(f"# time ~ slices^{exponent:.2f}", file=sys.stderr)
    emit(
        "masked",
        start,
        case="causal softmax c1, face velocities of one stage",
        n=args.n,
        cost_exponent_in_slices=exponent,
        rows=rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
