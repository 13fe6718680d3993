#!/usr/bin/env python
"""The cubed sphere's step against the flat grid's, the harmonic engine against the dense
sums, ducc0 against shtns, and the clusters example's wall time.

    .venv/bin/python benchmarks/sphere_step.py [--cells 64] [--steps 4] [--threads 1]
        [--example]

Rows, in one run at one thread count (rounds alternate the two steps, so both see one load):

* ``sphere``: one SSP-RK3 step on the cubed sphere with ``--cells`` cells a panel edge
  (6 n^2 cells), ``A = beta I`` with beta = 32, noise of amplitude 1e-3 up to degree 10 (the
  start of clusters from noise), WENO5-Z, the positivity limiter, the velocity at the face
  centres interpolated to the Gauss nodes (examples/sphere/clusters_s2.toml's scheme), the
  harmonic engine (``reduction``: the panel reduction's ``K``, 0 without:
  docs/theory.md, 'The panel reduction of the node measure'); ``sphere_phase_s``: the self
  seconds per step of each phase.
* ``flat``: one step of 2-D softmax (the c1 matrices) on a ``m^2`` grid with about as many
  cells (157^2 for 64 a panel), the default engine: ``sphere_over_flat`` the ratio of the
  medians (issue 27's target: <= 3).
* ``engines``: at 16 cells a panel (1536 cells, the dense sums' old default), one velocity
  evaluation by the dense sums and by the harmonic engine, their ratio and the largest gap
  of the velocities relative to their scale.
* ``transforms``: the synthesis of the coefficients at the targets of the sphere row by
  ducc0 (``synthesis_general``, a non-uniform FFT: the engine's route for targets off the
  grid lines; the face centres themselves go by the line synthesis, docs/theory.md, 'The
  syntheses on the grid lines') and by shtns (``SH_to_point``, one point a
  call, timed on 2000 points and scaled), with their largest disagreement; shtns has no
  adjoint at scattered points (only the analysis of its own regular grids), so the
  coefficients of the Gauss-node measure are ducc0's alone. shtns is optional
  (``"shtns": null`` without it). ``adjoint_nodes_s`` / ``adjoint_reduced_s``: ducc0's
  adjoint transform of the Gauss-node measure and of its panel reduction (the reduction's
  two matrix products included), ``reduced_gap``: their largest coefficient gap over the
  largest coefficient.
* ``--example``: ``tpde run`` of examples/sphere/clusters_s2.toml (32 cells a panel, t = 20)
  into a temporary folder: its wall seconds and the load beside it.
Prints one JSON line.

Measured (one thread, 2 shared cores): ``sphere_over_flat`` 2.33 at load 13, 2.49 at
load 9-10 and 2.17 at load 6 with the line synthesis (the code before: 2.16 at load 5-7,
2.67 at load 3-6); ``engines.max_gap_over_scale`` 1.7e-13.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import A1, V1, emit, loadavg  # noqa: E402

import tpde  # noqa: E402
from tpde.grid import Grid, gaussian, profile  # noqa: E402
from tpde.grid import cubed_sphere as cs  # noqa: E402
from tpde.schemes.cubed_sphere import CubedSphereOperator, solve  # noqa: E402
from tpde.schemes.solver import Problem, Scheme, Solver  # noqa: E402
from tpde.variants import Head  # noqa: E402
from tpde.variants.cubed_sphere import CubedSphereAttention  # noqa: E402
from tpde.variants.softmax import SoftmaxAttention  # noqa: E402

BETA = 32.0
ROOT = Path(__file__).resolve().parent.parent


class SphereSteps:
    """Steps of the cubed sphere: ``solve`` over ``k`` steps of a fixed ``dt`` less ``solve``
    over one (the operator's construction and the first evaluation cancel)."""

    def __init__(self, n: int):
        self.grid = cs.cubed_sphere(n)
        self.density = cs.noise(self.grid, 1e-3, 10, seed=0)
        self.field = CubedSphereAttention(BETA)
        self.dt = 0.05

    def run(self, steps: int) -> tuple[float, int]:
        """Wall seconds and steps of ``solve`` to ``steps dt`` (the times stepped over count:
        a last step may be split in two)."""
        start = time.perf_counter()
        result = solve(
            self.grid,
            self.density,
            self.field,
            steps * self.dt,
            dt_max=self.dt,
            snapshots=2,
            velocity_at="centres",
        )
        return time.perf_counter() - start, result.steps

    def step(self, steps: int) -> float:
        (many, k), (one, j) = self.run(steps + 1), self.run(1)
        return (many - one) / (k - j)


class FlatSteps:
    def __init__(self, m: int):
        grid = Grid([-7.0, -7.0], [7.0, 7.0], [m, m])
        rho = gaussian(grid, [0.5, -0.3], [[1.0, 0.4], [0.4, 0.6]])
        self.solver = Solver(
            Problem(grid, rho, SoftmaxAttention(Head(A1, V1)), t_end=1e9, scheme=Scheme())
        )
        velocity = self.solver.face_velocity(self.solver.density, 0.0)
        self.dt = 0.4 * self.solver.stable_dt(velocity)
        for _ in range(2):
            self.one()

    def one(self) -> float:
        start = time.perf_counter()
        s = self.solver
        s.step(self.dt, s.face_velocity(s.density, s.t))
        return time.perf_counter() - start


def engines(threads: int) -> dict:
    grid = cs.cubed_sphere(16)
    rho = cs.noise(grid, 0.3, 10, seed=0)
    points = CubedSphereOperator(grid, velocity_at="centres").face_centres.reshape(-1, 3)
    out: dict = {"cells": 6 * 16 * 16, "targets": int(points.shape[0])}
    values = {}
    for engine in ("direct", "harmonic"):
        field = CubedSphereAttention(BETA, engine=engine, cache_entries=1)  # no kept kernel
        field.tangent(rho, grid, 0.0, points)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            values[engine] = field.tangent(rho, grid, 0.0, points)
            times.append(time.perf_counter() - start)
        out[f"{engine}_s"] = min(times)
    out["direct_over_harmonic"] = out["direct_s"] / out["harmonic_s"]
    scale = np.abs(values["direct"]).max()
    out["max_gap_over_scale"] = float(np.abs(values["harmonic"] - values["direct"]).max() / scale)
    return out


def transforms(n: int, threads: int) -> dict:
    from ducc0.sht.experimental import synthesis_general

    from tpde.variants.engines.sphere_harmonics import _locations, coefficients, degree_for

    grid = cs.cubed_sphere(n)
    y, values, weights = cs.point_values(grid, cs.noise(grid, 0.3, 10, seed=0), 3)
    degree = degree_for(BETA)
    alm = coefficients(y.reshape(-1, 3), (values * weights).reshape(-1), degree)
    points = CubedSphereOperator(grid, velocity_at="centres").face_centres.reshape(-1, 3)
    loc = _locations(points)[0]
    out_adjoint = _adjoints(grid, degree, y, values * weights, alm, threads)
    start = time.perf_counter()
    ducc = synthesis_general(
        alm=alm[None, :], spin=0, lmax=degree, loc=loc, epsilon=3e-13, nthreads=threads
    )[0]
    out: dict = {
        "degree": degree,
        "targets": int(points.shape[0]),
        "ducc0_synthesis_s": time.perf_counter() - start,
        **out_adjoint,
    }
    sys.stdout.flush()
    saved = os.dup(1)  # shtns prints a banner on the C stdout: keep the one JSON line alone
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        try:
            import shtns
        except ImportError:
            shtns = None
        if shtns is not None:
            sh = shtns.sht(degree, degree, norm=shtns.sht_orthonormal)
            sh.set_grid(2 * degree + 2, 4 * degree + 4, flags=shtns.sht_gauss, polar_opt=0)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    if shtns is None:
        out["shtns"] = None
        return out
    # shtns's coefficient order: sh.idx(l, m), m >= 0, the same orthonormal convention
    qlm = np.zeros(sh.nlm, complex)
    index = 0
    for m in range(degree + 1):
        for l in range(m, degree + 1):
            qlm[sh.idx(l, m)] = alm[index]
            index += 1
    count = min(2000, points.shape[0])
    pick = np.linspace(0, points.shape[0] - 1, count).astype(int)
    start = time.perf_counter()
    values_shtns = np.array(
        [sh.SH_to_point(qlm, math.cos(loc[k, 0]), loc[k, 1]) for k in pick], dtype=float
    )
    per_point = (time.perf_counter() - start) / count
    out["shtns"] = {
        "version": getattr(shtns, "__version__", "?"),
        "point_synthesis_s_scaled": per_point * points.shape[0],
        "max_gap_over_scale": float(np.abs(values_shtns - ducc[pick]).max() / np.abs(ducc).max()),
    }
    out["shtns_over_ducc0"] = out["shtns"]["point_synthesis_s_scaled"] / out["ducc0_synthesis_s"]
    return out


def _adjoints(grid, degree: int, y, masses, alm, threads: int) -> dict:
    """The adjoint transform of the node measure and of its panel reduction, timed (best of
    3), and their largest coefficient gap over the largest coefficient."""
    from ducc0.sht.experimental import adjoint_synthesis_general

    from tpde.variants.engines.sphere_harmonics import NUFFT_EPSILON, PanelReduction, _locations

    common = {"spin": 0, "lmax": degree, "epsilon": NUFFT_EPSILON, "nthreads": threads}
    loc = _locations(y.reshape(-1, 3))[0]
    flat = np.ascontiguousarray(masses).reshape(1, -1)
    reduction = PanelReduction.build(grid.n, 3, degree)
    out: dict = {"reduction": 0 if reduction is None else reduction.terms}
    times = []
    for _ in range(3):
        start = time.perf_counter()
        adjoint_synthesis_general(map=flat, loc=loc, **common)
        times.append(time.perf_counter() - start)
    out["adjoint_nodes_s"] = min(times)
    if reduction is None:
        return out
    times = []
    for _ in range(3):
        start = time.perf_counter()
        reduced = adjoint_synthesis_general(
            map=reduction.masses(masses)[None, :], loc=reduction.loc, **common
        )[0]
        times.append(time.perf_counter() - start)
    out["adjoint_reduced_s"] = min(times)
    out["reduced_gap"] = float(np.abs(reduced - alm).max() / np.abs(alm).max())
    return out


def example() -> dict:
    from tpde.config import build
    from tpde.run import run_config

    config = build(ROOT / "examples" / "sphere" / "clusters_s2.toml")
    with tempfile.TemporaryDirectory() as folder:
        load_start = loadavg()
        start = time.perf_counter()
        run_config(config, Path(folder) / "clusters_s2.nc", quiet=True)
        wall = time.perf_counter() - start
    return {
        "config": "examples/sphere/clusters_s2.toml",
        "cells": 6 * config.problem.grid.n**2,
        "t_end": config.problem.t_end,
        "wall_s": wall,
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--example", action="store_true")
    args, _ = parser.parse_known_args()  # (run_all.py passes its extra arguments to all)
    start = time.perf_counter()
    tpde.set_num_threads(args.threads)
    n = args.cells
    m = round(math.sqrt(6 * n * n))
    sphere, flat = SphereSteps(n), FlatSteps(m)
    sphere.run(1)  # compile, build the halo
    sphere_steps, flat_steps, ratios = [], [], []
    for _ in range(args.rounds):
        s = sphere.step(args.steps)
        f = statistics.median(flat.one() for _ in range(args.steps))
        sphere_steps.append(s)
        flat_steps.append(f)
        ratios.append(s / f)
    with profile.profiling() as phases:
        _, taken = sphere.run(args.steps)
    per_step = {k: round(float(v["self_s"]) / taken, 5) for k, v in phases.items()}
    figures = {
        "threads": args.threads,
        "sphere": {
            "cells": 6 * n * n,
            "panel": n,
            "beta": BETA,
            "step_s": min(sphere_steps),
            "reduction": sphere.field._harmonic.last.get("reduction", 0),
        },
        "sphere_phase_s": per_step,
        "flat": {"cells": m * m, "n": m, "step_s": min(flat_steps)},
        "sphere_over_flat": statistics.median(ratios),
        "engines": engines(args.threads),
        "transforms": transforms(n, args.threads),
    }
    if args.example:
        figures["example"] = example()
    emit("sphere_step", start, **figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
