#!/usr/bin/env python
"""The resolution monitor's estimate against the true error, example by example.

    .venv/bin/python benchmarks/resolution_calibration.py [--cases softmax,e5_fixed_96]
        [--snapshots 41] [--tolerance 1e-4] [--json rows.json]

For every flat example (examples/*.toml) and E5 on a fixed box fitted to its Gaussian ODE up
to 0.9 t* (64^2, 96^2, 128^2, the box of tests/test_resolution.py), run with the defaults
and record at every snapshot the monitor's two integrated rates (``E_mass``, ``E_cov``:
docs/theory.md, 'The resolution monitor') beside the true errors:

* Gaussian initial data of a variant with a Gaussian closure: the mean and covariance
  against the Gaussian ODE (validation.gaussian.solve), and the density's L1 error against
  the exact cell averages of that Gaussian (fixed boxes);
* otherwise (sigmoid: a mixture; masked: a drifting mean): against the same run on twice the
  cells per axis, its cell averages summed 2^d to 1.

Errors: ``cov`` = ||Sigma - Sigma_ref||_2 / ||Sigma_ref||_2, ``mean`` = |m - m_ref| /
||Sigma_ref||_2^(1/2), ``l1`` = sum |rho - rho_ref| dV / mass (masked: the largest over the
position slices); ``true`` = max(cov, mean). Prints one table row per case (at the warning,
interpolated between snapshots, and at the end) and one JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import loadavg  # noqa: E402

import tpde.schemes.solver as solver_module  # noqa: E402
from tpde import config as tconfig  # noqa: E402
from tpde.grid import Grid, gaussian, moments  # noqa: E402
from tpde.schemes import monitor as monitor_module  # noqa: E402
from tpde.schemes.solver import Problem, Solver  # noqa: E402
from tpde.validation import solve  # noqa: E402
from tpde.validation.gaussian import VARIANTS, softmax_blowup_time  # noqa: E402
from tpde.validation.studies import fitted_box  # noqa: E402
from tpde.variants import ATTENTION, Head  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
E5_A = (
    np.array([[-0.01629, 1.04422], [-1.08488, -2.20592]]).T
    @ np.array([[-0.09678, 0.4222], [-0.22546, -0.63794]])
    / np.sqrt(2.0)
)
E5_COV = np.array([[0.6, 0.2], [0.2, 0.4]])

# ---- the components of the estimate, integrated beside the monitor's own ----------------
_PENDING: list[tuple[float, float, float]] = []
_rates = monitor_module.reconstruction_error_rates


def _tracked_rate(*args, **kwargs) -> float:
    rates = _rates(*args, **kwargs)
    _PENDING.append(rates)
    return max(rates)


_add = monitor_module.Monitor.add_reconstruction_error


def _tracked_add(self, amount: float) -> None:
    rates = np.array(_PENDING).max(axis=0) if _PENDING else np.zeros(3)
    _PENDING.clear()
    combined = float(rates.max())
    track = self.__dict__.setdefault("track", np.zeros(3))
    if combined > 0:
        track += rates * (amount / combined)
    _add(self, amount)


solver_module.reconstruction_error_rate = _tracked_rate  # type: ignore[assignment]
monitor_module.Monitor.add_reconstruction_error = _tracked_add  # type: ignore[method-assign]


def tracked_run(problem: Problem):
    """Run ``problem``; returns the result and, per snapshot, (t, E, E_mass, E_cov, E_mean,
    [(physical mean, physical covariance)] per slice, density)."""
    solver = Solver(problem)
    rows = []

    def record(snap) -> None:
        track = solver.monitor.__dict__.get("track", np.zeros(3))
        dens = snap.density if problem.positions is not None else snap.density[None]
        stats = []
        for slice_ in dens:
            _, mean, cov = moments(slice_, problem.grid)
            if snap.frame is not None:
                mean, cov = snap.frame.moments(mean, cov)
            stats.append((mean, cov))
        rows.append((snap.time, solver.monitor.reconstruction_error, *track, stats, dens.copy()))

    solver.callbacks.append(record)
    return solver.run(), rows


def _errors(mean, cov, mean_ref, cov_ref) -> tuple[float, float]:
    scale = float(np.linalg.norm(cov_ref, 2))
    return (
        float(np.linalg.norm(cov - cov_ref, 2)) / scale,
        float(np.linalg.norm(np.asarray(mean) - mean_ref)) / math.sqrt(scale),
    )


def coarsened(density: np.ndarray, d: int) -> np.ndarray:
    """Cell averages of a 2x finer grid averaged 2^d to 1 (the last d axes)."""
    out = density
    for a in range(d):
        axis = out.ndim - d + a
        shape = list(out.shape)
        shape[axis : axis + 1] = [shape[axis] // 2, 2]
        out = out.reshape(shape).mean(axis=axis + 1)
    return out


#: run.resolution_tolerance of every case (None: the default); set by --tolerance
TOLERANCE: list[float | None] = [None]


def _with(raw: dict, snapshots: int, factor: int = 1) -> dict:
    raw = json.loads(json.dumps(raw))
    raw["run"]["snapshots"] = snapshots
    if TOLERANCE[0] is not None:
        raw["run"]["resolution_tolerance"] = TOLERANCE[0]
    raw["run"].pop("output", None)
    raw["grid"]["cells"] = [factor * n for n in raw["grid"]["cells"]]
    return raw


def example_case(path: Path, snapshots: int) -> dict:
    raw = tconfig.load(path)
    config = tconfig.build(_with(raw, snapshots))
    problem = config.problem
    initial = raw.get("initial", {})
    gaussian_data = (
        initial.get("kind", "gaussian") == "gaussian"
        and "mean_drift" not in initial
        and config.variant in VARIANTS
    )
    result, rows = tracked_run(problem)
    grid, d = problem.grid, problem.grid.ndim
    table = []
    if gaussian_data:
        mean0 = np.asarray(initial.get("mean", [0.0] * d), float)
        cov0 = np.asarray(initial.get("covariance", np.eye(d)), float)
        solution = solve(config.variant, mean0, cov0, problem.velocity.spec, problem.t_end)
        for t, e, em, ec, emn, stats, dens in rows:
            if t > solution.status_time:
                break
            m_ref, c_ref = solution.at(t)
            cov_e, mean_e = _errors(*stats[0], m_ref, c_ref)
            l1 = math.nan
            if problem.frame is None:
                exact = gaussian(grid, m_ref, c_ref)
                l1 = float(np.abs(dens[0] - exact).sum() / exact.sum())
            table.append((t, e, em, ec, emn, cov_e, mean_e, l1))
        reference = "Gaussian ODE"
    else:
        fine = tconfig.build(_with(raw, snapshots, 2)).problem
        fine_result, fine_rows = tracked_run(fine)
        by_time = {round(r[0], 12): r for r in fine_rows}
        for t, e, em, ec, emn, stats, dens in rows:
            ref = by_time.get(round(t, 12))
            if ref is None:
                continue
            ref_dens = coarsened(ref[6], d)
            cov_e = mean_e = l1 = 0.0
            for k, (mean, cov) in enumerate(stats):
                c, m = _errors(mean, cov, *ref[5][k])
                cov_e, mean_e = max(cov_e, c), max(mean_e, m)
                l1 = max(l1, float(np.abs(dens[k] - ref_dens[k]).sum() / ref_dens[k].sum()))
            table.append((t, e, em, ec, emn, cov_e, mean_e, l1))
        reference = f"2x cells ({fine_result.status})"
    return summary(path.stem, result, problem, table, reference)


def e5_fixed_case(cells: int, snapshots: int) -> dict:
    t_star = softmax_blowup_time(E5_COV, E5_A, 1.0)
    params = Head(E5_A, np.eye(2))
    solution = solve("softmax", np.zeros(2), E5_COV, params, 0.9 * t_star)
    box = Grid(*fitted_box(solution, 0.9 * t_star, 7.0), [cells, cells])
    problem = Problem(
        box,
        gaussian(box, np.zeros(2), E5_COV),
        ATTENTION["softmax"](params),
        t_star,
        snapshots=list(np.linspace(0.0, 0.9 * t_star, snapshots)),
        **({} if TOLERANCE[0] is None else {"resolution_tolerance": TOLERANCE[0]}),
    )
    result, rows = tracked_run(problem)
    table = []
    for t, e, em, ec, emn, stats, dens in rows:
        m_ref, c_ref = solution.at(t)
        cov_e, mean_e = _errors(*stats[0], m_ref, c_ref)
        exact = gaussian(box, m_ref, c_ref)
        l1 = float(np.abs(dens[0] - exact).sum() / exact.sum())
        table.append((t / t_star, e, em, ec, emn, cov_e, mean_e, l1))
    return summary(f"e5_fixed_{cells}", result, problem, table, "closed form (t in t*)", t_star)


def _at(table, t: float, column: int) -> float:
    """Column ``column`` of the table at time t (log-linear between snapshots)."""
    times = np.array([r[0] for r in table])
    values = np.array([max(r[column], 1e-300) for r in table])
    return float(np.exp(np.interp(t, times, np.log(values))))


def summary(name, result, problem, table, reference, t_unit: float = 1.0) -> dict:
    events = [e for e in result.events if e.kind == "under_resolved"]
    warn = events[0].time / t_unit if events else None
    if warn is None and result.status == "under_resolved":
        warn = result.status_time / t_unit
    last = table[-1]
    row = {
        "case": name,
        "cells": list(problem.grid.cells),
        "frame": problem.frame is not None,
        "reference": reference,
        "tolerance": problem.resolution_tolerance,
        "status": result.status,
        "status_time": result.status_time / t_unit,
        "warned_at": warn,
        "end": {
            "t": last[0],
            "E": last[1],
            "E_mass": last[2],
            "E_cov": last[3],
            "E_mean": last[4],
            "cov": last[5],
            "mean": last[6],
            "l1": last[7],
        },
        "series": [[float(f"{v:.4g}") for v in r] for r in table],
    }
    if warn is not None:
        row["at_warning"] = {
            k: _at(table, warn, c)
            for k, c in (
                ("E", 1),
                ("E_mass", 2),
                ("E_cov", 3),
                ("E_mean", 4),
                ("cov", 5),
                ("mean", 6),
                ("l1", 7),
            )
        }
    return row


HEADER = (
    f"{'case':22s} {'status':14s} {'t end':>6s} {'E':>8s} {'E_cov':>8s} {'l1':>8s} "
    f"{'cov':>8s} {'mean':>8s} | {'warned':>7s} {'E':>8s} {'l1':>8s} {'cov':>8s}"
)


def print_row(row: dict) -> None:
    """One line: at the end (estimate, its covariance part, the true errors), then at the
    warning (time, estimate, true errors) or "-"."""
    end, warn = row["end"], row.get("at_warning")
    at = (
        f"{row['warned_at']:7.3g} {warn['E']:8.1e} {warn['l1']:8.1e} {warn['cov']:8.1e}"
        if warn
        else f"{'-':>7s}"
    )
    print(
        f"{row['case']:22s} {row['status']:14s} {end['t']:6.3g} {end['E']:8.1e} "
        f"{end['E_cov']:8.1e} {end['l1']:8.1e} {end['cov']:8.1e} {end['mean']:8.1e} | {at}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help="comma-separated names (default: all)")
    parser.add_argument("--snapshots", type=int, default=41)
    parser.add_argument("--json", default="", help="also write the rows to this file")
    parser.add_argument("--tolerance", type=float, default=None, help="resolution_tolerance")
    args = parser.parse_args()
    TOLERANCE[0] = args.tolerance
    examples = sorted((ROOT / "examples").glob("*.toml"))
    cases = {p.stem: (example_case, p) for p in examples}
    cases.update({f"e5_fixed_{n}": (e5_fixed_case, n) for n in (64, 96, 128)})
    chosen = [c for c in args.cases.split(",") if c] or list(cases)
    rows = []
    print(HEADER, flush=True)
    for name in chosen:
        func, arg = cases[name]
        start = time.perf_counter()
        row = func(arg, args.snapshots)
        row["wall_s"] = round(time.perf_counter() - start, 1)
        row["loadavg"] = loadavg()
        print_row(row)
        print(json.dumps({"benchmark": "resolution_calibration", **row}), flush=True)
        rows.append(row)
        if args.json:
            Path(args.json).write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
