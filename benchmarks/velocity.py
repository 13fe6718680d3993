#!/usr/bin/env python
"""Velocity benchmark: time per softmax / l2 velocity evaluation, fast (separable) vs dense.

    .venv/bin/python benchmarks/velocity.py

Cases: 2-D 256^2 and 3-D 64^3, the c1 matrices of MATH.md 6 (3-D: seeded random), a Gaussian
density. One "evaluation" is the velocity on the cell centres (one lattice). The dense
engine is O(N^2): it is timed on a random subset of targets and scaled linearly to all N
targets (reported as ``dense_s_extrapolated``); its accuracy reference is the same subset.
``floor_s`` is the separable engine's table build alone (its matrix products), so
``fast_s / floor_s`` says how much the interpolation adds. Prints one JSON line.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import cpu_model, loadavg  # noqa: E402

from tpde.grid import Grid, gaussian  # noqa: E402
from tpde.variants import Head, L2Head  # noqa: E402
from tpde.variants.direct import density_sources, grad_log_box_factor, tilted_means  # noqa: E402
from tpde.variants.l2 import L2Attention, reweighted_density  # noqa: E402
from tpde.variants.separable import SEPARABLE_DEFAULTS, mgf_table  # noqa: E402
from tpde.variants.softmax import SoftmaxAttention  # noqa: E402


def best_of(func, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def case(ndim: int, cells: int, variant: str = "softmax", subset: int = 2048) -> dict:
    rng = np.random.default_rng(1)
    v1 = [[1.0, 0.5], [-0.3, 0.8]]
    if ndim == 2:
        head = Head([[-0.6, 0.8], [-0.2, -0.3]], v1)
        mean, cov = [0.5, -0.3], [[1.0, 0.4], [0.4, 0.6]]
    else:
        head = Head(rng.normal(0, 0.5, (3, 3)), rng.normal(0, 0.7, (3, 3)))
        mean, cov = [0.5, -0.3, 0.2], 0.7 * np.eye(3)
    grid = Grid([-8.0] * ndim, [8.0] * ndim, [cells] * ndim)
    rho = gaussian(grid, mean, cov)
    if variant == "l2":
        l2_head = L2Head([[0.8, -0.3], [0.5, 0.6]], [[0.4, 0.7], [-0.6, 0.2]], v1)
        # the l2 field is the softmax machinery on w = exp(-|Ky|^2) rho with A = 2 K^T Q
        head = Head(2.0 * l2_head.K.T @ l2_head.Q, v1)
        fast = L2Attention(l2_head, engine="separable")
        rho_sums = reweighted_density(rho, grid, l2_head)
    else:
        fast = SoftmaxAttention(head, engine="separable")
        rho_sums = rho
    fast(rho, grid, 0.0)  # compile / warm
    fast_s = best_of(lambda: fast(rho, grid, 0.0))
    u_fast = fast(rho, grid, 0.0).reshape(ndim, -1)

    nodes = SEPARABLE_DEFAULTS[ndim]
    x = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    c = x @ head.A.T
    span = [np.linspace(c[:, a].min(), c[:, a].max(), nodes) for a in range(ndim)]
    floor_s = best_of(lambda: mgf_table(rho_sums, grid, span))

    pick = rng.choice(x.shape[0], size=min(subset, x.shape[0]), replace=False)
    sources, weights = density_sources(rho_sums, grid)
    spacing = (0.0,) * ndim if variant == "l2" else grid.spacing

    def dense():
        cc = c[pick]
        return (tilted_means(cc, sources, weights)
                - grad_log_box_factor(cc, spacing)) @ head.C.T

    dense_subset_s = best_of(dense, repeat=1)
    u_dense = dense()
    mask = rho.reshape(-1)[pick] > 1e-8 * rho.max()
    error = float(np.abs(u_fast[:, pick].T - u_dense)[mask].max() / np.abs(u_dense[mask]).max())
    dense_s = dense_subset_s * x.shape[0] / pick.size
    return {"variant": variant, "ndim": ndim, "cells": cells, "targets": int(x.shape[0]),
            "fast_s": fast_s,
            "floor_s": floor_s, "fast_over_floor": fast_s / floor_s,
            "dense_s_extrapolated": dense_s, "dense_subset_targets": int(pick.size),
            "speedup": dense_s / fast_s, "max_rel_error_vs_dense": error}


def main() -> int:
    start = time.perf_counter()
    rows = [case(2, 256), case(2, 256, "l2"), case(3, 64)]
    for r in rows:
        print(f"# {r['variant']} {r['ndim']}-D {r['cells']}^{r['ndim']}: "
              f"separable {r['fast_s'] * 1e3:.1f} ms "
              f"(table {r['floor_s'] * 1e3:.1f} ms), dense ~{r['dense_s_extrapolated']:.1f} s, "
              f"speed-up {r['speedup']:.0f}x, error {r['max_rel_error_vs_dense']:.1e}",
              file=sys.stderr)
    out = {"benchmark": "velocity", "rows": rows,
           "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "machine": platform.machine(),
                    "loadavg_end": loadavg()},
           "wall_s": round(time.perf_counter() - start, 1)}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
