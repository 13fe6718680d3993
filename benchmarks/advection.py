#!/usr/bin/env python
"""Advection benchmark: tpde against Clawpack SharpClaw on ADV2D, side by side in one run.

    .venv/bin/python benchmarks/advection.py [--n 256] [--repeat 3]

Problem and timing protocol: benchmarks/peers (README.md, adv2d.py): rho_t + div(rho u) = 0 on
the periodic unit square, u = (1, 0.5), Gaussian bump, N x N cells, 0.625 N fixed steps of
dt = 0.4 dx / max|u| to T = 0.25; only the stepping loop is timed, median of --repeat.

Rows, each a fresh subprocess, interleaved so that machine noise hits all of them:
    tpde WENO5-JS + SSP-RK3, 1 thread              (benchmarks/adv2d_tpde.py,
                                                    NUMBA_NUM_THREADS = TPDE_NUM_THREADS = 1)
    SharpClaw WENO5 + SSP33, Fortran               (benchmarks/peers/pyclaw_adv2d.py in the peer
                                                    venv benchmarks/_peers/venv, made by
                                                    benchmarks/setup_peers.sh; null if absent)
    tpde WENO5-JS, 2 threads (NUMBA_NUM_THREADS = TPDE_NUM_THREADS = 2; a row that ran
                              with another numba thread count is reported as failed)
    extras (--extras, default weno5z): tpde WENO5-Z at 1 and 2 threads; "nolimit": tpde
    WENO5-JS with the positivity limiter off; "limitall": tpde WENO5-JS with the limiter on
    every stage that has a negative value (--always-limit: no clip of round-off negatives).
Time budget (--budget seconds, default 170): every row is killed when it would overrun it (its
figures are then null; only a failure of the tpde 1-thread row fails the benchmark), and an
extra is skipped (null) when its weno5 twin's time says it would not fit.

On a loaded machine (load average above the core count) the 2-thread rows measure contention
more than tpde: numba's OpenMP fork-join at every kernel call waits for a descheduled thread.
--env OMP_WAIT_POLICY=passive makes that far less extreme; the load average is recorded.

Output: human-readable lines on stderr, exactly one JSON line on stdout. ratio_* = tpde Mcups /
SharpClaw Mcups (> 1: tpde is faster); ref_ratio_* = each row's throughput over the numpy
reference kernel timed in the same process (comparable across days and machines).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_model, host, loadavg

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEERS_DIR = HERE / "peers"
PEER_PY = HERE / "_peers" / "venv" / "bin" / "python"
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "TPDE_NUM_THREADS",
)


def tpde_python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def source_state() -> dict:
    """Which tpde code was measured: git commit, modified files, hash of the sources."""
    dirs = ("tpde", "schemes", "grid", "variants")
    state: dict = {}
    try:

        def git(*a):
            return subprocess.run(
                ["git", *a], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
            ).stdout.rstrip("\n")

        state["commit"] = git("rev-parse", "--short", "HEAD")
        state["modified"] = [
            ln[3:] for ln in git("status", "--porcelain", "--", *dirs).splitlines()
        ]
    except (OSError, subprocess.SubprocessError):
        state["commit"] = None
    digest = hashlib.sha1()
    for d in dirs:
        for f in sorted((REPO / d).rglob("*.py")):
            digest.update(str(f.relative_to(REPO)).encode())
            digest.update(f.read_bytes())
    state["sources_sha1"] = digest.hexdigest()[:12]
    return state


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_row(label: str, cmd: list[str], env: dict, cwd: str, timeout: float) -> dict:
    """Run one row script; return its JSON (last stdout line) plus bookkeeping, or an error."""
    load0 = loadavg()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {
            "label": label,
            "error": f"timed out after {timeout:.0f} s",
            "wall_s": time.perf_counter() - t0,
        }
    wall = time.perf_counter() - t0
    for line in proc.stderr.splitlines():
        if line.startswith("# "):
            log(f"  {label:<26s}{line[1:]}")
    res = None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            res = json.loads(lines[-1])
        except json.JSONDecodeError:
            res = None
    if res is None:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-5:]
        return {
            "label": label,
            "error": f"exit {proc.returncode}: " + " | ".join(tail),
            "wall_s": wall,
        }
    res.update(label=label, wall_s=wall, loadavg_before=load0, loadavg_after=loadavg())
    return res


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=256, help="cells per direction (default 256)")
    p.add_argument("--repeat", type=int, default=3, help="timed repeats per row (median)")
    p.add_argument(
        "--extras",
        default="weno5z",
        help="comma list of extra rows: weno5z, nolimit, limitall ('' for none)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=170.0,
        help="seconds; extras that would overrun it are skipped (default 170)",
    )
    p.add_argument("--no-peer", action="store_true", help="skip the SharpClaw row")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the tpde rows (e.g. OMP_WAIT_POLICY=passive)",
    )
    args = p.parse_args()
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    for e in extras:
        if e not in ("weno5z", "nolimit", "limitall"):
            p.error(f"--extras: unknown {e!r} (weno5z, nolimit, limitall)")

    start = time.perf_counter()
    source0 = source_state()
    base_env = dict(os.environ)
    for v in THREAD_VARS:  # every row: one thread unless the row says otherwise
        base_env[v] = "1"
    # A private numba cache for this run (cold compile in the first row's untimed warmup):
    # the rows do not depend on the state of the repository's __pycache__ (concurrent test
    # runs, edits in progress; a cache index grown by many processes once made every compile
    # fail with "ReferenceError: underlying object has vanished").
    numba_cache = tempfile.TemporaryDirectory(prefix="advection_numba_cache_")
    tpde_env = dict(base_env, NUMBA_CACHE_DIR=numba_cache.name)
    for kv in args.env:
        key, sep, value = kv.partition("=")
        if not sep:
            p.error(f"--env: expected KEY=VALUE, got {kv!r}")
        tpde_env[key] = value
    common_args = ["--n", str(args.n), "--repeat", str(args.repeat)]
    tpde_script = str(HERE / "adv2d_tpde.py")
    peer_script = PEERS_DIR / "pyclaw_adv2d.py"

    def tpde_row(key, threads, extra_args=()):
        env = dict(tpde_env, NUMBA_NUM_THREADS=str(threads), TPDE_NUM_THREADS=str(threads))
        cmd = [tpde_python(), tpde_script, *common_args, *extra_args]
        return key, lambda timeout: run_row(key, cmd, env, str(REPO), timeout)

    peer_reason = None
    if args.no_peer:
        peer_reason = "skipped (--no-peer)"
    elif not PEER_PY.exists():
        peer_reason = f"peer venv missing ({PEER_PY}): run bash benchmarks/setup_peers.sh"
    elif not peer_script.exists():
        peer_reason = f"peer script missing ({peer_script})"

    def sharpclaw_row(timeout):
        with tempfile.TemporaryDirectory(prefix="adv2d_sharpclaw_") as tmp:
            cmd = [str(PEER_PY), str(peer_script), "--solver", "sharpclaw", *common_args]
            return run_row("sharpclaw", cmd, base_env, tmp, timeout)

    plan = [tpde_row("tpde_weno5_1thread", 1)]
    if peer_reason is None:
        plan.append(("sharpclaw", sharpclaw_row))
    plan.append(tpde_row("tpde_weno5_2threads", 2))
    headline = len(plan)
    if "weno5z" in extras:
        plan.append(tpde_row("tpde_weno5z_1thread", 1, ["--reconstruction", "weno5z"]))
        plan.append(tpde_row("tpde_weno5z_2threads", 2, ["--reconstruction", "weno5z"]))
    if "nolimit" in extras:
        plan.append(tpde_row("tpde_weno5_nolimit_1thread", 1, ["--no-positivity"]))
    if "limitall" in extras:
        plan.append(tpde_row("tpde_weno5_limitall_1thread", 1, ["--always-limit"]))

    log(
        f"advection benchmark: ADV2D N={args.n}, repeat={args.repeat}, {cpu_model()}, "
        f"{os.cpu_count()} cpus, load {loadavg()}"
    )
    if peer_reason:
        log(f"  sharpclaw: UNAVAILABLE: {peer_reason}")
    rows: dict[str, dict] = {}
    for i, (key, fn) in enumerate(plan):
        elapsed = time.perf_counter() - start
        if i >= headline:
            similar = key.replace("weno5z", "weno5").replace("_nolimit", "")
            similar = similar.replace("_limitall", "")
            estimate = rows.get(similar, {}).get("wall_s", 0.0)
            if elapsed + estimate > args.budget:
                rows[key] = {"label": key, "error": "skipped: time budget"}
                log(f"  {key:<26s} skipped (time budget {args.budget:.0f} s)")
                continue
        timeout = args.budget - elapsed
        if timeout < 5.0:
            rows[key] = {"label": key, "error": "skipped: time budget"}
            log(f"  {key:<26s} skipped (time budget {args.budget:.0f} s)")
            continue
        rows[key] = fn(timeout)
        want = 2 if key.endswith("2threads") else 1
        got = rows[key].get("numba_num_threads")
        if key != "sharpclaw" and "error" not in rows[key] and got != want:
            rows[key]["error"] = f"ran with {got} numba threads instead of {want}"
        if "error" in rows[key]:
            log(f"  {key:<26s} FAILED: {rows[key]['error']}")

    numba_cache.cleanup()
    if "error" in rows["tpde_weno5_1thread"]:
        log("advection: the tpde 1-thread row failed")
        print(
            json.dumps(
                {
                    "benchmark": "advection",
                    "n": args.n,
                    "error": "tpde 1-thread row: " + rows["tpde_weno5_1thread"]["error"],
                }
            ),
            flush=True,
        )
        return 1

    def fig(key, field):
        r = rows.get(key)
        return None if r is None or "error" in r else r.get(field)

    t1 = rows["tpde_weno5_1thread"]
    sc = rows.get("sharpclaw")
    sc_mcups = fig("sharpclaw", "mcups")
    out = {
        "benchmark": "advection",
        "problem": "ADV2D gauss (benchmarks/peers/adv2d.py)",
        "n": args.n,
        "steps": t1["steps"],
        "repeat": args.repeat,
        "tpde_env": args.env,
        "numba_cache": "private per run (cold compile in the first row's untimed warmup)",
    }
    row_keys = [k for k, _ in plan]
    for key in row_keys:
        if key != "sharpclaw":
            out[f"{key}_mcups"] = fig(key, "mcups")
    out["sharpclaw_mcups"] = sc_mcups
    for label, key in (("1thread", "tpde_weno5_1thread"), ("2threads", "tpde_weno5_2threads")):
        m = fig(key, "mcups")
        out[f"ratio_{label}"] = m / sc_mcups if m and sc_mcups else None
    for key in row_keys:
        if key.startswith(("tpde_weno5z", "tpde_weno5_nolimit", "tpde_weno5_limitall")):
            m = fig(key, "mcups")
            out[f"ratio_{key[5:]}"] = m / sc_mcups if m and sc_mcups else None
    out["l1_tpde"] = t1["l1"]
    out["l1_sharpclaw"] = fig("sharpclaw", "l1")
    if "tpde_weno5z_1thread" in rows:
        out["l1_tpde_weno5z"] = fig("tpde_weno5z_1thread", "l1")
    for key in row_keys:
        short = "sharpclaw" if key == "sharpclaw" else key
        out[f"ref_ratio_{short}"] = fig(key, "ratio_to_ref")
    if sc_mcups is None:
        out["sharpclaw_unavailable"] = peer_reason or (sc or {}).get("error")
    out["rows"] = [
        {
            "row": key,
            "peer": r.get("peer"),
            "scheme": r.get("scheme"),
            "threads": r.get(
                "numba_num_threads", (r.get("threads") or {}).get("NUMBA_NUM_THREADS")
            ),
            "mcups": r.get("mcups"),
            "median_s": r.get("median_s"),
            "times_s": r.get("times_s"),
            "ratio_to_ref": r.get("ratio_to_ref"),
            "l1": r.get("l1"),
            "linf": r.get("linf"),
            "limited_stages_last_run": r.get("limited_stages_last_run"),
            "clipped_stages_last_run": r.get("clipped_stages_last_run"),
            "loadavg": [r.get("loadavg_before"), r.get("loadavg_after")],
            "versions": r.get("versions"),
            "error": r.get("error"),
        }
        for key, r in rows.items()
    ]
    source1 = source_state()
    out["tpde_source"] = source1
    if source1["sources_sha1"] != source0["sources_sha1"]:
        out["tpde_source_changed_during_run"] = True
        log("advection: WARNING: tpde's sources changed during the run")
    out["date"] = _dt.datetime.now().isoformat(timespec="seconds")
    out["host"] = host()
    out["wall_s"] = round(time.perf_counter() - start, 1)

    if out["l1_sharpclaw"] is not None:
        rel = abs(out["l1_tpde"] - out["l1_sharpclaw"]) / out["l1_sharpclaw"]
        out["l1_rel_diff"] = rel
        if rel > 1e-6:
            log(f"advection: WARNING: L1 differs from SharpClaw's by {rel:.2e} (same scheme)")

    def num(v):
        return "n/a" if v is None else f"{v:.2f}"

    summary = [
        f"tpde 1t {num(out['tpde_weno5_1thread_mcups'])}",
        f"tpde 2t {num(out['tpde_weno5_2threads_mcups'])}",
        f"SharpClaw {num(sc_mcups)} Mcups; ratio 1t {num(out['ratio_1thread'])}, "
        f"2t {num(out['ratio_2threads'])}",
    ]
    log(f"advection N={args.n}: " + ", ".join(summary) + f" ({out['wall_s']} s)")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
