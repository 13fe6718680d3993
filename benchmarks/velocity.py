#!/usr/bin/env python
"""Velocity benchmark: time per velocity evaluation, fast (separable) engine vs dense.

    .venv/bin/python benchmarks/velocity.py

Rows: softmax and l2 at 2-D 256^2, softmax with a symmetric positive-definite A at 2-D 256^2
(where the FFT convolution engine also applies: timed and checked in the same row), softmax at
3-D 64^3, one Sinkhorn iteration (two log-partition half-steps) and a full cold-start
Sinkhorn evaluation at 2-D 256^2. Matrices:
the c1 test case (docs/theory.md) in 2-D, seeded random in 3-D; Gaussian density. One "evaluation"
is the velocity on the cell centres (one lattice). The dense engine is O(N^2): it is timed
on a random subset of targets and scaled linearly to all N targets
(``dense_s_extrapolated``); the accuracy reference is the same subset. ``floor_s`` is the
separable table the fast evaluation builds (its matrix products: the "transforms" of the
method; in 2-D on the adaptive resolution, with its error estimate), measured in the same
run, so ``fast_over_floor`` says what interpolation and bookkeeping add. Threads: tpde's
default (1, TPDE_NUM_THREADS). Prints one JSON line.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numba  # noqa: E402
from _machine import A1, V1, best_of, emit  # noqa: E402

from tpde.grid import Grid, gaussian  # noqa: E402
from tpde.variants import Head, L2Head, SinkhornHead  # noqa: E402
from tpde.variants.engines.direct import (  # noqa: E402
    density_sources,
    grad_log_box_factor,
    log_partition,
    tilted_means,
)
from tpde.variants.l2 import L2Attention, reweighted_density  # noqa: E402
from tpde.variants.sinkhorn import SinkhornAttention, quadrature_weights  # noqa: E402
from tpde.variants.softmax import SoftmaxAttention  # noqa: E402


def setup(ndim: int, cells: int):
    grid = Grid([-8.0] * ndim, [8.0] * ndim, [cells] * ndim)
    if ndim == 2:
        rho = gaussian(grid, [0.5, -0.3], [[1.0, 0.4], [0.4, 0.6]])
    else:
        rho = gaussian(grid, [0.5, -0.3, 0.2], 0.7 * np.eye(3))
    x = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    return grid, rho, x


def velocity_case(ndim: int, cells: int, variant: str = "softmax", subset: int = 2048) -> dict:
    rng = np.random.default_rng(1)
    grid, rho, x = setup(ndim, cells)
    if variant == "l2":
        l2_head = L2Head([[0.8, -0.3], [0.5, 0.6]], [[0.4, 0.7], [-0.6, 0.2]], V1)
        # the l2 field is the softmax machinery on w = exp(-|Ky|^2) rho with A = 2 K^T Q
        head = Head(2.0 * l2_head.K.T @ l2_head.Q, V1)
        fast = L2Attention(l2_head, engine="separable")
        weights, spacing = reweighted_density(rho, grid, l2_head), (0.0,) * ndim
    elif variant == "softmax-symmetric":  # the case an FFT convolution can also do
        head = Head(0.3 * np.array([[1.0, 0.3], [0.3, 0.8]]), V1)
        fast = SoftmaxAttention(head, engine="separable")
        weights, spacing = rho, grid.spacing
    else:
        head = (
            Head(A1, V1)
            if ndim == 2
            else Head(rng.normal(0, 0.5, (3, 3)), rng.normal(0, 0.7, (3, 3)))
        )
        fast = SoftmaxAttention(head, engine="separable")
        weights, spacing = rho, grid.spacing
    fast(rho, grid, 0.0)  # compile / warm
    fast_s = best_of(lambda: fast(rho, grid, 0.0))
    u_fast = fast(rho, grid, 0.0).reshape(ndim, -1)
    lattices, _ = fast.lattice_points(grid, [np.zeros(ndim)])
    table = fast.sums(weights, grid, lattices, head.A, sheared=True)
    floor_s = best_of(lambda: fast.sums(weights, grid, lattices, head.A, sheared=True))

    pick = rng.choice(x.shape[0], size=min(subset, x.shape[0]), replace=False)
    sources, values = density_sources(weights, grid)
    c = x[pick] @ head.A.T

    def dense():
        return (tilted_means(c, sources, values) - grad_log_box_factor(c, spacing)) @ head.C.T

    dense_subset_s = best_of(dense, repeat=1)
    u_dense = dense()
    mask = rho.reshape(-1)[pick] > 1e-8 * rho.max()
    error = float(np.abs(u_fast[:, pick].T - u_dense)[mask].max() / np.abs(u_dense[mask]).max())
    dense_s = dense_subset_s * x.shape[0] / pick.size
    row = {
        "case": f"{variant} velocity",
        "ndim": ndim,
        "cells": cells,
        "targets": int(x.shape[0]),
        "table_nodes": [int(n) for n in table.count],
        "fast_s": fast_s,
        "floor_s": floor_s,
        "fast_over_floor": fast_s / floor_s,
        "dense_s_extrapolated": dense_s,
        "dense_subset_targets": int(pick.size),
        "speedup": dense_s / fast_s,
        "max_rel_error_vs_dense": error,
    }
    if variant == "softmax-symmetric":
        fft = SoftmaxAttention(head, engine="fft")
        fft(rho, grid, 0.0)  # plans and kernel spectra cached
        row["fft_s"] = best_of(lambda: fft(rho, grid, 0.0))
        u_fft = fft(rho, grid, 0.0).reshape(ndim, -1)
        row["fft_max_rel_error_vs_dense"] = float(
            np.abs(u_fft[:, pick].T - u_dense)[mask].max() / np.abs(u_dense[mask]).max()
        )
    return row


def sinkhorn_cases(cells: int = 256, subset: int = 1024) -> list[dict]:
    rng = np.random.default_rng(2)
    grid, rho, x = setup(2, cells)
    head = SinkhornHead(A1, V1, eps=1.0)
    field = SinkhornAttention(head, engine="separable")
    q = quadrature_weights(rho, grid)
    f, g = field.potentials(q, grid, head)  # converged potentials (and warm-up)
    lattices, _ = field.lattice_points(grid, [np.zeros(2)])
    forward, backward = head.A / head.eps, head.A.T / head.eps

    def one_iteration():  # two log-partition half-steps, as inside SinkhornAttention
        for potential, matrix in ((g, forward), (f, backward)):
            w = q * np.exp((potential.reshape(grid.shape) - potential.max()) / head.eps)
            field.sums(w, grid, lattices, matrix, fields="log", sheared=True).on_lattice(
                lattices[0], matrix, 0
            )

    fast_s = best_of(one_iteration)
    floor_s = best_of(
        lambda: [
            field.sums(q, grid, lattices, m, fields="log", sheared=True)
            for m in (forward, backward)
        ]
    )
    # dense: the same two half-steps on a subset of targets, every source
    pick = rng.choice(x.shape[0], size=subset, replace=False)
    sources, values = density_sources(q, grid)

    def dense_iteration():
        for matrix in (forward, backward):
            log_partition(x[pick] @ matrix.T, sources, values)

    dense_s = best_of(dense_iteration, repeat=1) * x.shape[0] / subset
    cold = SinkhornAttention(head, engine="separable", warm_start=False)
    cold(rho, grid, 0.0)
    cold_s = best_of(lambda: cold(rho, grid, 0.0))
    return [
        {
            "case": "sinkhorn iteration",
            "ndim": 2,
            "cells": cells,
            "targets": int(x.shape[0]),
            "fast_s": fast_s,
            "floor_s": floor_s,
            "fast_over_floor": fast_s / floor_s,
            "dense_s_extrapolated": dense_s,
            "dense_subset_targets": subset,
            "speedup": dense_s / fast_s,
        },
        {
            "case": "sinkhorn velocity (cold start)",
            "ndim": 2,
            "cells": cells,
            "targets": int(x.shape[0]),
            "fast_s": cold_s,
            "iterations": cold.iterations[-1],
            "marginal_error": cold.marginal_error,
            "dense_s_extrapolated": dense_s * cold.iterations[-1],
            "speedup": dense_s * cold.iterations[-1] / cold_s,
        },
    ]


def main() -> int:
    start = time.perf_counter()
    rows = [
        velocity_case(2, 256),
        velocity_case(2, 256, "l2"),
        velocity_case(2, 256, "softmax-symmetric"),
        velocity_case(3, 64),
    ]
    rows += sinkhorn_cases()
    for r in rows:
        extra = (
            f", error {r['max_rel_error_vs_dense']:.1e}" if "max_rel_error_vs_dense" in r else ""
        )
        if "fft_s" in r:
            extra += f"; FFT {r['fft_s'] * 1e3:.1f} ms, error {r['fft_max_rel_error_vs_dense']:.1e}"
        floor = f" (table {r['floor_s'] * 1e3:.1f} ms)" if "floor_s" in r else ""
        print(
            f"# {r['case']} {r['ndim']}-D {r['cells']}^{r['ndim']}: fast "
            f"{r['fast_s'] * 1e3:.1f} ms{floor}, dense ~{r['dense_s_extrapolated']:.1f} s, "
            f"speed-up {r['speedup']:.0f}x{extra}",
            file=sys.stderr,
        )
    emit("velocity", start, rows=rows, threads=numba.get_num_threads())
    return 0


if __name__ == "__main__":
    sys.exit(main())
