#!/usr/bin/env python
"""The issue's three-bump case to its typed end: co-moving frame against a fixed box.

    .venv/bin/python benchmarks/frame_bumps.py [--rounds 3] [--threads 1]

Softmax ``A = V = I`` on the three-bump law of docs/theory.md ('When the frame cannot go
on'; weights 0.4 / 0.3 / 0.3, covariances 0.2 I), as configured by a user: ``frame =
"affine"`` on +-16 frame units at 64^2, and the fixed +-6 box at 96^2, each run to
``t_end = 3`` from its config (as tests/test_frame_storm.py's ``three_bumps``) until it ends
by itself (``blowup`` / ``box_limited``; the frame where its densest cluster narrowed past
FRAME_NARROWING). The runs alternate for ``--rounds`` rounds (a shared machine's load
drifts); each wall and CPU time (``time.process_time``, the measure on a loaded machine) is
the smallest of its rounds, ``frame_over_fixed`` / ``frame_over_fixed_cpu`` their ratios.
``--issue-box`` adds the issue's own fixed run, its config with ``frame = "fixed"`` at 96^2
(+-16: 1.3 cells per standard deviation of a bump), as ``fixed16`` and
``frame_over_fixed16_cpu``. Also reported: each run's steps, status, stop time and printed
t*.

Where a frame step's cost goes: the frame and a fixed +-6 box at the same 64^2 cells, run to
``t = 0.342644`` (the tests' BUMPS_STOP) once each with the phase timers on
(:mod:`tpde.grid.profile`, as ``tpde run --profile``): ``same_cells_*`` give each run's
milliseconds per step and the self time per step of the kernel-sum tables
(``velocity.tables``), the sheared passes (``velocity.interpolation.passes``) and the rest of
the step (the frame's fit and step control among it), ``tables_nodes_*`` the mean number of
table nodes per table formed. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import emit, loadavg  # noqa: E402

from tpde.config import build  # noqa: E402
from tpde.grid import profile  # noqa: E402
from tpde.grid.threads import set_num_threads  # noqa: E402
from tpde.schemes.solver import Problem, Solver  # noqa: E402

RUNS = {"frame": (16.0, 64, "affine"), "fixed": (6.0, 96, "fixed")}
#: the issue's fixed run: the frame's config with frame = "fixed" at 96^2 (--issue-box)
ISSUE_BOX = (16.0, 96, "fixed")
#: the same-cells comparison: the frame's grid against a fixed +-6 box at 64^2, to SAME_STOP
SAME_CELLS = {"frame": (16.0, 64, "affine"), "fixed": (6.0, 64, "fixed")}
SAME_STOP = 0.342644
#: the phases reported per step (self times): the tables and the sheared passes
PHASES = {"tables": "velocity.tables", "passes": "velocity.interpolation.passes"}
#: the three-bump law (docs/theory.md, 'When the frame cannot go on')
THREE_BUMPS = {
    "kind": "mixture",
    "weights": [0.4, 0.3, 0.3],
    "means": [[-1.5, 0.0], [1.5, 0.5], [0.0, 1.8]],
    "covariances": [[[0.2, 0.0], [0.0, 0.2]]] * 3,
}


def three_bumps(radius: float, cells: int, frame: str, t_end: float = 3.0) -> Problem:
    """The case as a user writes it: softmax A = V = I, the grid +-radius at cells^2."""
    return build(
        {
            "grid": {"lower": [-radius] * 2, "upper": [radius] * 2, "cells": [cells] * 2},
            "initial": THREE_BUMPS,
            "attention": {
                "variant": "softmax",
                "A": [[1.0, 0.0], [0.0, 1.0]],
                "V": [[1.0, 0.0], [0.0, 1.0]],
            },
            "scheme": {"frame": frame},
            "run": {"t_end": t_end, "snapshots": [0.0, t_end]},
        }
    ).problem


def once(name: str) -> tuple[float, float, object]:
    """One run of RUNS[name] to its own end: wall seconds, CPU seconds, the result."""
    problem = three_bumps(*RUNS[name])  # (the config's build: part of what a user waits for)
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy warning reaches the user
        result = Solver(problem).run()
    return time.perf_counter() - t0, time.process_time() - c0, result


def per_step(name: str) -> dict[str, float]:
    """One profiled run of SAME_CELLS[name] to SAME_STOP: ms per step, the self ms per step
    of PHASES and of the rest, and the mean table nodes (the tables' size drives their cost:
    one product per node and cell row)."""
    from tpde.variants.engines import separable

    nodes: list[int] = []
    formed = separable.mgf_table

    def counted(weights, grid, tilts, *args, **kwargs):  # (the benchmark's count only)
        nodes.append(int(np.prod([len(t) for t in tilts])))
        return formed(weights, grid, tilts, *args, **kwargs)

    problem = three_bumps(*SAME_CELLS[name], t_end=SAME_STOP)
    separable.mgf_table = counted  # type: ignore[assignment]
    try:
        with warnings.catch_warnings(), profile.profiling() as phases:
            warnings.simplefilter("error")
            t0 = time.perf_counter()
            result = Solver(problem).run()
            wall = time.perf_counter() - t0
    finally:
        separable.mgf_table = formed  # type: ignore[assignment]
    steps = max(result.steps, 1)
    out = {"ms_per_step": 1e3 * wall / steps, "steps": result.steps}
    rest = wall
    for key, phase in PHASES.items():
        own = float(phases.get(phase, {}).get("self_s", 0.0))
        out[f"{key}_ms_per_step"] = 1e3 * own / steps
        rest -= own
    out["rest_ms_per_step"] = 1e3 * rest / steps
    out["tables_nodes"] = float(np.mean(nodes)) if nodes else 0.0
    return {key: round(value, 1) for key, value in out.items()}


def predicted(message: str) -> float | None:
    return float(message.split("t* = ")[1].split()[0]) if "t* = " in message else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--issue-box", action="store_true", help="also the +-16 96^2 box")
    args = parser.parse_args()
    if args.issue_box:
        RUNS["fixed16"] = ISSUE_BOX
    start = time.perf_counter()
    set_num_threads(args.threads)
    walls: dict[str, list[float]] = {name: [] for name in RUNS}
    cpus: dict[str, list[float]] = {name: [] for name in RUNS}
    results = {}
    for _ in range(args.rounds):
        for name in RUNS:
            wall, cpu, results[name] = once(name)
            walls[name].append(wall)
            cpus[name].append(cpu)
    figures: dict[str, object] = {}
    for name in SAME_CELLS:  # (one run each: the numba caches are warm from the rounds)
        for key, value in per_step(name).items():
            figures[f"same_cells_{name}_{key}"] = value
    figures["same_cells_step_ratio"] = round(
        float(figures["same_cells_frame_ms_per_step"])  # type: ignore[arg-type]
        / float(figures["same_cells_fixed_ms_per_step"]),  # type: ignore[arg-type]
        3,
    )
    for name, result in results.items():
        figures[f"{name}_wall_s"] = round(min(walls[name]), 3)
        figures[f"{name}_cpu_s"] = round(min(cpus[name]), 3)
        figures[f"{name}_steps"] = result.steps
        figures[f"{name}_status"] = result.status
        figures[f"{name}_stop"] = round(result.status_time, 6)
        figures[f"{name}_t_star"] = predicted(result.status_message)
    emit(
        "frame_bumps",
        start,
        rounds=args.rounds,
        threads=args.threads,
        **figures,
        frame_over_fixed=round(min(walls["frame"]) / min(walls["fixed"]), 3),
        frame_over_fixed_cpu=round(min(cpus["frame"]) / min(cpus["fixed"]), 3),
        **(
            {"frame_over_fixed16_cpu": round(min(cpus["frame"]) / min(cpus["fixed16"]), 3)}
            if "fixed16" in cpus
            else {}
        ),
        loadavg=loadavg(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
