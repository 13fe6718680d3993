#!/usr/bin/env python
"""The thread policy on a busy machine: a softmax run next to a process that keeps every core
busy, against the same run on one thread without it.

    .venv/bin/python benchmarks/threads.py [--n 128] [--steps 20] [--rounds 5] [--quick]

Each row is a fresh process (OpenMP reads its wait policy once, when numba starts its
workers) that times ``--steps`` SSP-RK3 steps of the 2-D n^2 softmax step of
benchmarks/step.py (c1 matrices, WENO5-Z, limiter) after two warm-up steps; ``busy`` rows run
while a helper process keeps every core of the machine busy (one spinning loop per core).
The rows of a round run back to back and every round runs every row, so a round sees one
load; ``*_over_quiet_1thread`` is the median over rounds of the row's time over the quiet
one-thread time of the same round (a shared machine's load drifts within a minute).

Rows: ``quiet_1thread`` (TPDE_NUM_THREADS=1, no helper: the reference), ``busy_default``
(the default policy: the cores other processes leave free at start, OpenMP workers waiting
passively; the issue's target is <= 2x), ``busy_1thread``, ``quiet_default``; then the
candidates on every core: ``busy_passive`` (passive workers), ``busy_spinning`` (the former
default: workers that spin 300000 times after each loop, GOMP_SPINCOUNT=300000; it
collapses, so it times fewer steps), ``busy_workqueue`` (numba's workqueue layer) and
``busy_tbb`` (when numba can load TBB). ``--quick`` runs the first three. Each row records
the threads and layer it ran on. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import emit, loadavg  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

#: the timed process: prints seconds per step, numba's threads and threading layer
CHILD = r"""
import sys, time
from tpde.grid import Grid, gaussian
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.variants import Head
from tpde.variants.softmax import SoftmaxAttention
import numba
n, steps = int(sys.argv[1]), int(sys.argv[2])
grid = Grid([-7.0, -7.0], [7.0, 7.0], [n, n])
rho = gaussian(grid, [0.5, -0.3], [[1.0, 0.4], [0.4, 0.6]])
field = SoftmaxAttention(Head([[-0.6, 0.8], [-0.2, -0.3]], [[1.0, 0.5], [-0.3, 0.8]]))
solver = Solver(Problem(grid, rho, field, t_end=1e9, scheme=Scheme()))
dt = 0.4 * solver.stable_dt(solver.face_velocity(solver.density, 0.0))
for _ in range(2):
    solver.step(dt, solver.face_velocity(solver.density, solver.t))
start = time.perf_counter()
for _ in range(steps):
    solver.step(dt, solver.face_velocity(solver.density, solver.t))
print((time.perf_counter() - start) / steps, numba.get_num_threads(), numba.threading_layer())
"""

#: one busy loop per core, in one process group (the helper forks them)
BUSY = r"""
import os
for _ in range(os.cpu_count() - 1):
    if os.fork() == 0:
        break
while True:
    pass
"""

#: every core of the process (the candidates' thread count)
CORES = str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
#: row -> (environment, busy helper, share of --steps)
ROWS = {
    "quiet_1thread": ({"TPDE_NUM_THREADS": "1"}, False, 1.0),
    "busy_default": ({}, True, 1.0),
    "busy_1thread": ({"TPDE_NUM_THREADS": "1"}, True, 1.0),
    "quiet_default": ({}, False, 1.0),
    "busy_passive": ({"TPDE_NUM_THREADS": CORES}, True, 1.0),
    "busy_spinning": ({"TPDE_NUM_THREADS": CORES, "GOMP_SPINCOUNT": "300000"}, True, 0.2),
    "busy_workqueue": (
        {"TPDE_NUM_THREADS": CORES, "NUMBA_THREADING_LAYER": "workqueue"},
        True,
        1.0,
    ),
    "busy_tbb": ({"TPDE_NUM_THREADS": CORES, "NUMBA_THREADING_LAYER": "tbb"}, True, 1.0),
}
#: variables of the thread policy cleared in every row (a row sets its own)
CLEARED = ("TPDE_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "NUMBA_THREADING_LAYER")


def tbb_available() -> bool:
    try:
        from numba.np.ufunc import tbbpool  # noqa: F401
    except ImportError:
        return False
    return True


def time_row(env: dict, busy: bool, n: int, steps: int) -> tuple[float, int, str] | str:
    """Seconds per step, threads, layer (or the error's last line)."""
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full.update(env)
    helper = None
    if busy:
        helper = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
        time.sleep(0.5)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(n), str(steps)],
            env=full,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        if helper is not None:
            os.killpg(helper.pid, signal.SIGKILL)
            helper.wait()
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["failed"])[-1]
    seconds, threads, layer = proc.stdout.split()[-3:]
    return float(seconds), int(threads), layer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="the first three rows only")
    args, _ = parser.parse_known_args()
    start = time.perf_counter()
    names = list(ROWS)[:3] if args.quick else list(ROWS)
    if not tbb_available():
        names = [name for name in names if name != "busy_tbb"]
    times: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    layers: dict[str, str] = {}
    errors: dict[str, str] = {}
    for round_ in range(args.rounds):
        got = {}
        for name in names:
            if name in errors:
                continue
            env, busy, share = ROWS[name]
            result = time_row(env, busy, args.n, max(2, round(share * args.steps)))
            if isinstance(result, str):
                errors[name] = result
                continue
            got[name] = result[0]
            times[name].append(result[0])
            layers[name] = f"{result[1]} thread(s), {result[2]}"
        for name, seconds in got.items():
            if "quiet_1thread" in got:
                ratios[name].append(seconds / got["quiet_1thread"])
        print(
            f"# round {round_}: "
            + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in got.items())
            + f" (load {loadavg()})",
            file=sys.stderr,
            flush=True,
        )
    rows = [
        {
            "row": name,
            "threads": layers.get(name, "n/a"),
            "step_s": float(np.median(times[name])) if times[name] else None,
            "over_quiet_1thread": float(np.median(ratios[name])) if ratios[name] else None,
            "ratios": [round(r, 2) for r in ratios[name]],
            **({"error": errors[name]} if name in errors else {}),
        }
        for name in names
    ]
    figures = {
        f"{row['row']}_over_quiet_1thread": row["over_quiet_1thread"]
        for row in rows
        if row["row"] != "quiet_1thread"
    }
    emit(
        "threads",
        start,
        case=f"2-D {args.n}^2 softmax c1 step, next to a process keeping every core busy",
        **figures,
        target_busy_default="<= 2",
        rows=rows,
        loadavg=loadavg(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
