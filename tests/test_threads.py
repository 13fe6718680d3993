"""The thread policy (tpde.grid.threads; docs/user-guide.md, 'Threads'): the default's load
check, the passive wait of numba's OpenMP workers, ``--threads`` on every command that runs
numerics, and the sweep's split of the cores between its workers. The timing of the
candidates on a busy machine is benchmarks/threads.py (a slow test runs its quick form)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpde import cli
from tpde.grid import threads
from tpde.sweep import worker_threads

ROOT = Path(__file__).resolve().parent.parent


def test_parse_threads():
    assert threads.parse_threads("3") == 3
    assert threads.parse_threads(2) == 2
    for bad in ("0", "-1", "two", "", 1.5):
        with pytest.raises(ValueError, match="positive integer"):
            threads.parse_threads(bad)


def test_threads_for_leaves_the_busy_cores_alone():
    assert threads.threads_for(2, 0.0) == 2
    assert threads.threads_for(2, 0.4) == 2
    assert threads.threads_for(2, 1.0) == 1
    assert threads.threads_for(2, 7.5) == 1
    assert threads.threads_for(16, 3.0) == 13
    assert threads.threads_for(1, 0.0) == 1


def test_busy_cores_reads_the_run_queue_less_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "SAMPLE_S", 0.0)
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("6.10 5.20 4.30 3/120 4567\n")  # this process and two others running
    assert threads.busy_cores(str(loadavg)) == 2.0
    loadavg.write_text("0.90 0.80 0.70 1/120 4567\n")  # only this process: a stale average
    assert threads.busy_cores(str(loadavg)) == 0.0
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert threads.busy_cores(str(tmp_path / "missing")) == 1.5  # no run queue: the average


def test_environment_overrides_the_load_check(monkeypatch):
    monkeypatch.setenv(threads.THREADS_VARIABLE, "3")
    assert threads.default_threads() == 3
    monkeypatch.setenv(threads.THREADS_VARIABLE, "zero")
    with pytest.raises(ValueError, match="TPDE_NUM_THREADS"):
        threads.default_threads()


POLICY_PROBE = """
import json, os, numba
from tpde.grid.threads import set_num_threads
used = set_num_threads(int(os.environ["THREADS"]) if os.environ.get("THREADS") else None)
print(json.dumps({"wait": os.environ.get("OMP_WAIT_POLICY"), "used": used,
                  "numba": numba.get_num_threads()}))
"""


@pytest.mark.parametrize(
    "preset, expected", [(None, "passive"), ("active", "active")], ids=["unset", "user's"]
)
def test_workers_wait_passively_unless_the_user_says_otherwise(preset, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "THREADS")}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    env["THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", POLICY_PROBE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["wait"] == expected
    assert out["used"] == out["numba"] == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "c.toml"],
        ["gaussian", "c.toml"],
        ["particles", "c.toml", "--tokens", "10"],
        ["validate"],
        ["sweep", "s.toml"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_numerics_command_takes_threads(argv):
    parser = cli.build_parser()
    assert parser.parse_args(argv).threads is None
    assert parser.parse_args([*argv, "--threads", "2"]).threads == 2
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([*argv, "--threads", "0"])
    assert exc.value.code == 2


def test_main_applies_threads_before_the_command(monkeypatch):
    seen = []
    monkeypatch.setattr(threads, "set_num_threads", lambda n=None: seen.append(("set", n)))
    monkeypatch.setitem(cli.COMMANDS, "run", lambda args: seen.append(("run", args.threads)) or 0)
    monkeypatch.setitem(
        cli.COMMANDS, "sweep", lambda args: seen.append(("sweep", args.threads)) or 0
    )
    assert cli.main(["run", "c.toml", "--threads", "1"]) == 0
    assert cli.main(["sweep", "s.toml", "--threads", "3"]) == 0  # passed to the runs
    assert seen == [("set", 1), ("run", 1), ("sweep", 3)]


def test_sweep_splits_the_cores_between_workers(monkeypatch):
    monkeypatch.delenv(threads.THREADS_VARIABLE, raising=False)
    assert worker_threads(2, 1) == 2  # one run: both cores
    assert worker_threads(2, 2) == 1
    assert worker_threads(16, 3) == 5
    assert worker_threads(2, 8) == 1  # never fewer than one
    assert worker_threads(2, 2, threads=2) == 2  # --threads: as asked
    monkeypatch.setenv(threads.THREADS_VARIABLE, "3")
    assert worker_threads(2, 2) == 3


@pytest.mark.slow
def test_busy_machine_costs_at_most_twice_the_quiet_thread():
    """benchmarks/threads.py --quick: the default policy next to a process keeping every core
    busy vs one thread without it (the issue's target: <= 2x; the former spinning default
    took 20-180x). Loose bound: the machine this runs on may be loaded by others."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/threads.py", "--quick", "--rounds", "2", "--steps", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["busy_default_over_quiet_1thread"] <= 4.0
