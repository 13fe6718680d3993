"""Issue 16, "Never lose a result": every numbered case of the audit, reproduced.

1 ``--overwrite`` keeps the earlier result unless the new run ends with a result
2 a full disk (``ulimit -f``): one line, snapshots before it readable, ``--resume`` completes
3 concurrent writers of one output: the second is refused with one line
4 honest statuses: error, interrupted (SIGINT, SIGTERM, SIGHUP), blowup, read by sweep/info
5 bad inputs end in one line on stderr, never a traceback
6 sizes are checked before anything is allocated
7 the smaller ones: keys named, irrelevant keys refused, resume by value, plot-safe text

Each test records the cases it held in TABLE; ``test_zz_table`` prints the table (category,
cases, held; ``pytest -s`` shows it). The default tier kills ``--overwrite`` at
SIGKILL_MOMENTS random moments, the slow tier at 20.
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr

from tpde import io
from tpde.cli import main
from tpde.config import build, dumps
from tpde.run import run_config
from tpde.sweep import read_outcome, run_one

TPDE = [sys.executable, "-m", "tpde.cli"]
SIGKILL_MOMENTS = 5
CATEGORIES = {
    "1": "--overwrite keeps the earlier result",
    "2": "full disk",
    "3": "concurrent writers",
    "4": "honest statuses",
    "5": "one line, no traceback",
    "6": "sizes checked first",
    "7": "smaller ones",
}
TABLE: dict[str, list[int]] = {key: [0, 0] for key in CATEGORIES}  # cases, held

BASE = {
    "grid": {"lower": [-6.0, -6.0], "upper": [6.0, 6.0], "cells": [24, 24]},
    "initial": {"kind": "gaussian", "mean": [0.2, -0.1], "covariance": [[1.0, 0.3], [0.3, 0.6]]},
    "attention": {
        "variant": "softmax",
        "A": [[-0.5, 0.2], [0.1, -0.4]],
        "V": [[1.0, 0.0], [0.0, 1.0]],
    },
    "run": {"t_end": 0.5, "snapshots": 11},
}


def variant(**sections) -> dict:
    """BASE with the given sections' keys replaced (a section value None removes it)."""
    raw = {k: dict(v) for k, v in BASE.items()}
    for section, keys in sections.items():
        if keys is None:
            raw.pop(section, None)
            continue
        raw.setdefault(section, {}).update(keys)
    return raw


def write_config(path: Path, raw: dict | str) -> Path:
    path.write_text(raw if isinstance(raw, str) else dumps(raw))
    return path


def held(category: str, cases: int, ok: int | None = None) -> None:
    """Record ``cases`` cases of ``category``, ``ok`` of them held (default: all)."""
    TABLE[category][0] += cases
    TABLE[category][1] += cases if ok is None else ok


def one_line(err: str) -> bool:
    """stderr is exactly one ``tpde: ...`` line, no traceback."""
    text = err.strip()
    return bool(text) and "\n" not in text and "Traceback" not in err and text.startswith("tpde: ")


def messages(err: str) -> list[str]:
    """The lines of stderr that are not progress lines."""
    return [line for line in err.strip().splitlines() if line and not line.startswith("[")]


def cli(*args, limit: int | None = None, **kwargs) -> subprocess.CompletedProcess:
    """The console script in a subprocess (with ``limit``: ``ulimit -f`` in bytes)."""

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [*TPDE, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=preexec if limit is not None else None,
        **kwargs,
    )


def run_main(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def reference(folder) -> Path:
    """A completed run of BASE (the earlier result the overwrites must keep)."""
    config = write_config(folder / "base.toml", BASE)
    path = folder / "reference.nc"
    assert main(["run", str(config), "-o", str(path), "--quiet"]) == 0
    return path


def fresh_copy(reference: Path, target: Path) -> bytes:
    shutil.copyfile(reference, target)
    for extra in (io.staged_name(target), target.with_name(f".{target.name}.lock")):
        Path(extra).unlink(missing_ok=True)
    return target.read_bytes()


def same_records(a: xr.Dataset, b: xr.Dataset, n: int | None = None) -> bool:
    n = b.sizes["time"] if n is None else n
    scale = float(np.abs(b["density"].values).max())
    return bool(
        np.array_equal(a["time"].values[:n], b["time"].values[:n])
        and np.abs(a["density"].values[:n] - b["density"].values[:n]).max() <= 1e-13 * scale
    )


# ---- 1: --overwrite ------------------------------------------------------------------------------
OVERWRITE_FAILURES = [  # (name, config, exit code): each would have replaced the old file
    ("dt = 10 (fails at run time)", variant(scheme={"dt": 10.0}), 1),
    ("A = 1e308", variant(attention={"A": [[1e308, 0.0], [0.0, 1.0]]}), 2),
    ("V = 1e308", variant(attention={"V": [[1e308, 0.0], [0.0, 1.0]]}), 2),
    ("nodes = 10^9", variant(attention={"nodes": 10**9, "engine": "separable"}), 2),
    ("fft with a non-symmetric A", variant(attention={"engine": "fft"}), 2),
    (
        "sinkhorn max_iter = 1 (fails at run time)",
        variant(attention={"variant": "sinkhorn", "max_iter": 1}),
        1,
    ),
]


def test_failed_overwrites_keep_the_old_file(folder, reference, capsys):
    target = folder / "kept.nc"
    before = fresh_copy(reference, target)
    for name, raw, code in OVERWRITE_FAILURES:
        config = write_config(folder / "failing.toml", raw)
        status, err = run_main(capsys, "run", config, "-o", target, "--overwrite", "--quiet")
        print(f"\n{name}: exit {status}: {err.strip()}")
        assert status == code and one_line(err), name
        assert target.read_bytes() == before, name
        staged = Path(io.staged_name(target))
        if code == 1:  # the failed run's own records wait beside it, status error
            assert io.outcome(staged).status == "error" and "unchanged" in err
            staged.unlink()
        assert not staged.exists()
    held("1", len(OVERWRITE_FAILURES))


def overwrite_and_kill(config: Path, target: Path, delay: float) -> float:
    """``tpde run --overwrite`` in a subprocess, SIGKILLed after ``delay`` s (or done)."""
    process = subprocess.Popen(
        [*TPDE, "run", str(config), "-o", str(target), "--overwrite", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    start = time.perf_counter()
    try:
        process.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    return time.perf_counter() - start


def sigkill_during_overwrite(folder: Path, reference: Path, moments: int, seed: int) -> None:
    new = variant(attention={"A": [[-0.3, 0.4], [-0.1, -0.6]]}, run={"snapshots": 21})
    config = write_config(folder / f"new{moments}.toml", new)
    complete = folder / f"complete{moments}.nc"
    assert main(["run", str(config), "-o", str(complete), "--quiet"]) == 0
    complete_ds = io.read(complete)
    target = folder / f"target{moments}.nc"
    before = fresh_copy(reference, target)
    took = overwrite_and_kill(config, target, 600.0)  # how long an undisturbed overwrite takes
    assert io.read(target).attrs["status"] == "completed"
    rng = np.random.default_rng(seed)
    outcomes = {"old intact": 0, "new complete": 0}
    # random moments, one in each of ``moments`` equal slices of [0, 1.15 took]: some before
    # the new run's first snapshot, some while it writes, some around its rename
    slices = (np.arange(moments) + rng.uniform(size=moments)) / moments
    for moment in 1.15 * took * slices:
        fresh_copy(reference, target)
        overwrite_and_kill(config, target, float(moment))
        if target.read_bytes() == before:
            outcomes["old intact"] += 1
        else:
            ds = io.read(target)
            assert ds.attrs["status"] == "completed" and same_records(ds, complete_ds), moment
            outcomes["new complete"] += 1
        Path(io.staged_name(target)).unlink(missing_ok=True)
    print(f"\nSIGKILL at {moments} moments in [0, {1.15 * took:.1f}] s: {outcomes}")
    held("1", moments)


def test_sigkill_during_overwrite(folder, reference):
    sigkill_during_overwrite(folder, reference, SIGKILL_MOMENTS, seed=16)


@pytest.mark.slow
def test_sigkill_during_overwrite_20_moments(folder, reference):
    sigkill_during_overwrite(folder, reference, 20, seed=1616)


# ---- 2: full disk --------------------------------------------------------------------------------
def test_full_disk_keeps_every_snapshot_and_resume_completes(folder, reference, capsys):
    raw = variant(run={"snapshots": 21})
    config = write_config(folder / "disk.toml", raw)
    full = folder / "disk_full_run.nc"
    assert main(["run", str(config), "-o", str(full), "--quiet"]) == 0
    complete = io.read(full)
    grid = build(raw).problem.grid
    # a limit that cuts the file about half way (the writer reserves a record's worst case)
    limit = full.stat().st_size // 2 + io._record_bytes(grid, None)
    target = folder / "disk.nc"
    run = cli("run", config, "-o", target, "--quiet", limit=limit)
    print(f"\nulimit -f {limit} bytes: exit {run.returncode}: {run.stderr.strip()}")
    assert run.returncode == 1 and one_line(run.stderr) and "disk full" in run.stderr
    partial = io.read(target)
    n = partial.sizes["time"]
    assert 1 <= n < 21 and same_records(partial, complete, n)
    assert partial.attrs["status"] == "error" and "disk full" in partial.attrs["status_message"]
    assert partial.attrs["status_time"] == partial["time"].values[-1]
    status, err = run_main(capsys, "run", config, "-o", target, "--resume", "--quiet")
    assert status == 0, err
    resumed = io.read(target)
    assert resumed.attrs["status"] == "completed" and same_records(resumed, complete)
    print(f"disk filled after {n} of 21 snapshots; --resume completed all 21")
    # full at the start: the same one line, nothing created
    empty = folder / "disk_empty.nc"
    run = cli("run", config, "-o", empty, "--quiet", limit=8192)
    assert run.returncode == 1 and one_line(run.stderr) and "disk full" in run.stderr
    assert not empty.exists()
    # full during an --overwrite: the old file stays
    old = folder / "disk_old.nc"
    before = fresh_copy(reference, old)
    run = cli("run", config, "-o", old, "--overwrite", "--quiet", limit=limit)
    assert run.returncode == 1 and one_line(run.stderr) and old.read_bytes() == before
    held("2", 3)
    held("1", 1)


# ---- 3: concurrent writers -----------------------------------------------------------------------
def start(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [*TPDE, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def test_a_second_writer_is_refused(folder, capsys):
    other = variant(attention={"A": [[-0.3, 0.0], [0.0, -0.3]]})
    paths = [
        write_config(folder / "writer_a.toml", BASE),
        write_config(folder / "writer_b.toml", other),
    ]
    references = []
    for i, path in enumerate(paths):
        out = folder / f"writer_ref{i}.nc"
        assert main(["run", str(path), "-o", str(out), "--quiet"]) == 0
        references.append(io.read(out))
    # a writer holds the output (this process): another tpde run is refused, whatever its flags
    target = folder / "shared.nc"
    writer = io.SnapshotWriter(target, build(BASE).problem.grid, config_text="held")
    try:
        for flags in ([], ["--overwrite"]):
            run = cli("run", paths[1], "-o", target, "--quiet", *flags)
            print(f"\n{flags}: exit {run.returncode}: {run.stderr.strip()}")
            assert run.returncode == 2 and one_line(run.stderr)
            assert f"another tpde process (pid {os.getpid()})" in run.stderr
    finally:
        writer.close("interrupted")
    assert io.read(target).attrs["config"] == "held"
    # two started at the same moment: one writes, the other is refused, never a mixed file
    target.unlink()
    both = [start("run", p, "-o", target, "--overwrite", "--quiet") for p in paths]
    codes = [p.wait(timeout=600) for p in both]
    errors = [p.stderr.read() for p in both]
    ds = io.read(target)
    which = [build(r).text for r in (BASE, other)].index(ds.attrs["config"])
    print(f"simultaneous: exits {codes}, the file is writer {which}'s: {errors}")
    assert sorted(codes) in ([0, 0], [0, 2]) and same_records(ds, references[which])
    assert all(code == 0 or one_line(err) for code, err in zip(codes, errors, strict=True))
    held("3", 3)


# ---- 4: statuses ---------------------------------------------------------------------------------
def test_errors_are_recorded_with_their_time(folder, capsys, monkeypatch):
    config = write_config(
        folder / "sinkhorn.toml", variant(attention={"variant": "sinkhorn", "max_iter": 1})
    )
    target = folder / "sinkhorn.nc"
    status, err = run_main(capsys, "run", config, "-o", target, "--quiet")
    outcome = io.outcome(target)
    print(f"\nsinkhorn max_iter = 1: exit {status}: {err.strip()}\n  file: {outcome}")
    assert status == 1 and one_line(err) and "SinkhornError" in err
    assert (
        outcome.status == "error"
        and math.isfinite(outcome.time)
        and "SinkhornError" in outcome.message
    )
    # the sweep reads the error, not "the run did not finish"
    record = run_one(
        {
            "run_id": "s",
            "raw": variant(attention={"variant": "sinkhorn", "max_iter": 1}),
            "path": str(folder / "sweep_sinkhorn.nc"),
            "tolerance": 0.05,
        }
    )
    assert record["outcome"] == "failed" and "SinkhornError" in record["message"]
    # a non-finite velocity: error at the time it happened (was NaN)
    from tpde.variants import FunctionVelocity

    def velocity(x, t):
        bad = np.nan if t > 0.2 else 0.0
        return [0.1 + bad + 0 * x[0], 0.0 * x[1]]

    built = build(variant())
    built.problem.velocity = FunctionVelocity(velocity)
    nan_file = folder / "nan.nc"
    with pytest.raises(Exception, match="non-finite"):
        run_config(built, nan_file)
    nan_outcome = io.outcome(nan_file)
    assert nan_outcome.status == "error" and 0.2 <= nan_outcome.time <= 0.25
    assert nan_outcome.reason == "non_finite"  # typed: the sweep never reads the message
    # the velocity turned NaN while the covariance stayed put (drift 0.1): no evidence of a
    # blow-up, so the sweep records a failure of the numerics with its time and reason
    record = read_outcome(nan_file)
    print(f"  sweep record: {record['outcome']} ({record['reason']}) at {record['event_time']}")
    assert record["outcome"] == "failed" and record["reason"] == "non_finite"
    assert 0.2 <= record["event_time"] <= 0.25
    capsys.readouterr()
    assert main(["info", str(nan_file)]) == 0
    out = capsys.readouterr().out
    assert "status: error (non_finite) at t = 0.2" in out, out
    held("4", 3)


def test_a_blowup_is_recorded_and_read_by_info_and_the_sweep(folder, capsys, monkeypatch):
    from tpde.schemes import solver as solver_module

    original = solver_module.Solver.run

    def blowup(self):
        result = original(self)
        result.status, result.status_time = "blowup", 0.3
        result.status_message = "blow-up predicted at t = 0.31"
        return result

    monkeypatch.setattr(solver_module.Solver, "run", blowup)
    config = write_config(folder / "blowup.toml", variant())
    target = folder / "blowup.nc"
    assert main(["run", str(config), "-o", str(target), "--quiet"]) == 0
    monkeypatch.setattr(solver_module.Solver, "run", original)
    assert io.outcome(target) == io.Outcome("blowup", 0.3, "blow-up predicted at t = 0.31")
    capsys.readouterr()
    assert main(["info", str(target)]) == 0
    assert "status: blowup at t = 0.3" in capsys.readouterr().out
    record = read_outcome(target)
    assert record["outcome"] == "blowup" and record["event_time"] == 0.3
    size = target.stat().st_size
    status, err = run_main(capsys, "run", config, "-o", target, "--resume")
    assert status == 2 and one_line(err) and "blowup" in err and target.stat().st_size == size
    held("4", 1)


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_signals_record_interrupted_at_the_last_snapshot(folder, signame):
    raw = variant(run={"t_end": 0.5, "snapshots": 41})
    config = write_config(folder / f"signal_{signame}.toml", raw)
    target = folder / f"signal_{signame}.nc"
    process = subprocess.Popen(
        [*TPDE, "run", str(config), "-o", str(target)], stderr=subprocess.PIPE, text=True
    )
    seen, lines = 0, []
    while seen < 3:  # one progress line per snapshot (stderr is not a terminal)
        line = process.stderr.readline()
        assert line, f"the run ended early: {lines}"
        lines.append(line)
        seen += line.startswith("[")
    number = getattr(signal, signame)
    os.kill(process.pid, number)
    rest = process.stderr.read()
    process.wait(timeout=600)
    final = messages("".join(lines) + rest)
    print(f"\n{signame}: exit {process.returncode}: {final}")
    assert process.returncode == 128 + number
    assert (
        len(final) == 1 and one_line(final[0]) and signame in final[0] and "Traceback" not in rest
    )
    ds = io.read(target)
    outcome = io.outcome(target)
    assert outcome.status == "interrupted" and signame in outcome.message
    assert outcome.time == ds["time"].values[-1] and ds.sizes["time"] >= 3
    if signame == "SIGTERM":  # and it resumes to the end
        assert main(["run", str(config), "-o", str(target), "--resume", "--quiet"]) == 0
        assert io.read(target).sizes["time"] == 41
    held("4", 1)


# ---- 5: one line ---------------------------------------------------------------------------------
def corrupted(folder: Path) -> Path:
    """A tpde file whose second density chunk is garbage: two files that differ only in
    that chunk locate it; its middle is overwritten."""
    from types import SimpleNamespace

    from tpde.grid import Grid

    grid = Grid([-1.0, -1.0], [1.0, 1.0], [48, 48])
    paths = []
    for k in range(2):
        path = folder / f"chunk{k}.nc"
        path.unlink(missing_ok=True)
        writer = io.SnapshotWriter(path, grid, config_text=dumps(BASE))
        for i in range(2):
            density = np.random.default_rng(10 * i + (k if i == 1 else 0)).random(grid.shape)
            writer.write(
                SimpleNamespace(time=float(i), density=density, outflow=0.0, max_speed=1.0, dt=0.1)
            )
        writer.close("interrupted", 1.0, "for the test")
        paths.append(path)
    a, b = (np.frombuffer(p.read_bytes(), np.uint8) for p in paths)
    n = min(a.size, b.size)
    differ = np.nonzero(a[:n] != b[:n])[0]
    middle = int(np.median(differ))
    data = bytearray(paths[0].read_bytes())
    data[middle - 200 : middle + 200] = bytes(400)
    paths[0].write_bytes(bytes(data))
    return paths[0]


def bad_inputs(folder: Path, reference: Path) -> list[tuple[str, list]]:
    """(name, tpde arguments) of every bad input of the issue's case 5 and of
    tests/test_config.py (those through `tpde run`)."""
    from test_config import CASES, config_text

    nested = "[grid]\nlower = " + "[" * 5000 + "]" * 5000 + "\n"
    foreign = folder / "foreign.nc"
    xr.Dataset({"a": ("t", [1.0, 2.0])}).to_netcdf(foreign)
    binary = folder / "binary.toml"
    binary.write_bytes(bytes(range(256)) * 4)
    sweep_scalar = write_config(
        folder / "scalar_base.toml",
        'base = { foo = 1, grid = 2 }\n[parameters]\n"run.t_end" = [1.0]\n',
    )
    sweep = write_config(
        folder / "ok_sweep.toml",
        'base = "base.toml"\n[parameters]\n"attention.scale" = [0.5, 1.0]\n',
    )
    existing = folder / "a_file"
    existing.write_text("not a directory")
    broken = corrupted(folder)
    configs = {
        "boundary = 5": variant(grid={"boundary": 5}),
        "layers = [1, 2]": variant(attention={"layers": [1, 2]}),
        "radius = 1e308": variant(
            initial={"kind": "uniform", "radius": 1e308, "center": [0.0, 0.0]}
        ),
        "snapshot out of range": variant(
            initial={"kind": "file", "file": str(reference), "snapshot": 99}
        ),
        "foreign NetCDF": variant(initial={"kind": "file", "file": str(foreign)}),
    }
    cases = [
        ("a NetCDF file as the config", ["run", reference, "-o", folder / "x.nc"]),
        ("a NetCDF file as the sweep", ["sweep", reference]),
        ("a NetCDF file for gaussian", ["gaussian", reference, "-o", folder / "g.nc"]),
        ("5000-deep nested lists", ["run", write_config(folder / "nested.toml", nested)]),
        ("a sweep base with top-level scalars", ["sweep", sweep_scalar]),
        ("a binary sweep file", ["sweep", binary]),
        ("plot -o onto a file", ["plot", reference, "-o", existing]),
        ("info of a corrupted chunk", ["info", broken]),
        (
            "resume of a corrupted chunk",
            ["run", write_config(folder / "b.toml", BASE), "-o", broken, "--resume"],
        ),
    ]
    for address in ("nonsense", "tcp://", "tcp://host:99999", "http://h:1", "tcp://a b:1"):
        cases.append((f"--scheduler {address}", ["sweep", sweep, "--scheduler", address]))
    for name, raw in configs.items():
        cases.append(
            (
                name,
                ["run", write_config(folder / f"c{len(cases)}.toml", raw), "-o", folder / "y.nc"],
            )
        )
    for name, case, _ in CASES:
        path = write_config(folder / f"t{len(cases)}.toml", config_text(case))
        cases.append((f"test_config: {name}", ["run", path, "-o", folder / "z.nc"]))
    return cases


def test_every_bad_input_prints_one_line(folder, reference, capsys):
    cases = bad_inputs(folder, reference)
    failed = []
    for name, args in cases:
        status, err = run_main(capsys, *args)
        print(f"\n{name}: exit {status}: {err.strip()}")
        if not (status == 2 and one_line(err)):
            failed.append(name)
    assert not failed
    held("5", len(cases))


CONSOLE_SAMPLE = ("a NetCDF file as the config", "--scheduler tcp://", "boundary = 5")


def test_console_script_prints_one_line(folder, reference):
    """The same through the console script (a sample here; all of them in the slow tier)."""
    cases = [c for c in bad_inputs(folder, reference) if c[0] in CONSOLE_SAMPLE]
    for name, args in cases:
        run = cli(*args)
        assert run.returncode == 2 and one_line(run.stderr), (name, run.stderr)


@pytest.mark.slow
def test_console_script_prints_one_line_for_every_bad_input(folder, reference):
    for name, args in bad_inputs(folder, reference):
        run = cli(*args)
        assert run.returncode == 2 and one_line(run.stderr), (name, run.stderr)


# ---- 6: sizes ------------------------------------------------------------------------------------
SIZES = [  # (name, config, the key the message names)
    ("cells 30000^2", variant(grid={"cells": [30000, 30000]}), "grid.cells"),
    ("cells 100000^2", variant(grid={"cells": [100000, 100000]}), "grid.cells"),
    (
        "positions 10^9",
        variant(grid={"positions": 10**9}, attention={"masked": True}),
        "grid.positions",
    ),
    ("snapshots 10^12", variant(run={"snapshots": 10**12}), "run.snapshots"),
    ("snapshots 10^7", variant(run={"snapshots": 10**7}), "run.snapshots"),
    ("nodes 10^9", variant(attention={"nodes": 10**9}), "attention.nodes"),
    ("dt 1e-300", variant(scheme={"dt": 1e-300}), "scheme.dt"),
    ("dt_max 1e-300", variant(scheme={"dt_max": 1e-300}), "scheme.dt_max"),
]


def test_sizes_are_checked_before_allocating(folder, reference, capsys):
    for name, raw, key in SIZES:
        config = write_config(folder / "size.toml", raw)
        start_time = time.perf_counter()
        status, err = run_main(capsys, "run", config, "-o", folder / "size.nc")
        took = time.perf_counter() - start_time
        print(f"\n{name}: exit {status} in {took:.2f} s: {err.strip()}")
        assert status == 2 and one_line(err) and key in err and took < 20, name
    config = write_config(folder / "tokens.toml", BASE)
    status, err = run_main(capsys, "particles", config, "--tokens", 10**9, "-o", folder / "p.nc")
    assert status == 2 and one_line(err) and "--tokens" in err
    sweep = write_config(
        folder / "huge_sweep.toml",
        'base = "base.toml"\n[parameters]\n'
        + "".join(
            f'"attention.A[{i // 2}][{i % 2}]" = {np.linspace(-1, 1, 32).tolist()}\n'
            for i in range(4)
        ),
    )
    start_time = time.perf_counter()
    status, err = run_main(capsys, "sweep", sweep, "-o", folder / "huge")
    assert (
        status == 2 and one_line(err) and "--force" in err and time.perf_counter() - start_time < 10
    )
    held("6", len(SIZES) + 2)


# ---- 7: the smaller ones -------------------------------------------------------------------------
SMALLER = [  # (name, config, the key the message must name)
    ("cells [1e20, 16]", variant(grid={"cells": [1e20, 16]}), "grid.cells"),
    ("scale = 1e308", variant(attention={"scale": 1e308}), "attention.scale"),
    (
        "covariance diag(1e308)",
        variant(initial={"covariance": [[1e308, 0.0], [0.0, 1e308]]}),
        "initial.covariance",
    ),
    ("epsilon on softmax", variant(attention={"epsilon": 2.0}), "attention.epsilon"),
    ("bias on softmax", variant(attention={"bias": 1.0}), "attention.bias"),
    ("tol on softmax", variant(attention={"tol": 1e-9}), "attention.tol"),
]


def test_keys_are_named_and_unused_keys_refused(folder, capsys):
    for name, raw, key in SMALLER:
        config = write_config(folder / "small.toml", raw)
        status, err = run_main(capsys, "run", config, "-o", folder / "small.nc")
        print(f"\n{name}: exit {status}: {err.strip()}")
        assert status == 2 and one_line(err) and f"tpde: {key}" in err, name
    held("7", len(SMALLER))


def test_resume_compares_values_and_refuses_results(folder, capsys):
    raw = variant(run={"t_end": 0.5, "snapshots": 11})
    target = folder / "values.nc"
    cut = run_config_interrupted(build(raw), target, after=4)
    assert io.read(target).sizes["time"] == cut
    same = (  # key order, 1 vs 1.0, an explicit default
        "[run]\nsnapshots = 11\nt_end = 0.5\n[attention]\nV = [[1, 0], [0, 1]]\n"
        "A = [[-0.5, 0.2], [0.1, -0.4]]\nscale = 1\n[initial]\nmean = [0.2, -0.1]\n"
        "covariance = [[1, 0.3], [0.3, 0.6]]\n[grid]\nupper = [6, 6]\nlower = [-6, -6]\n"
        'cells = [24, 24]\nboundary = "outflow"\n[scheme]\ncfl = 0.4\n'
    )
    status, err = run_main(
        capsys, "run", write_config(folder / "same.toml", same), "-o", target, "--resume", "--quiet"
    )
    assert status == 0, err
    assert io.read(target).sizes["time"] == 11
    # mass_left_domain is a result: resume refuses and appends nothing
    left = variant(
        grid={"lower": [-3.0, -6.0], "upper": [3.0, 6.0]},
        initial={"kind": "uniform", "lower": [1.5, -0.5], "upper": [2.5, 0.5]},
        attention={"A": [[0.0, 0.0], [0.0, 0.0]], "V": [[2.0, 0.0], [0.0, 2.0]]},
        run={"max_outflow": 1e-4},
    )
    left_config = write_config(folder / "left.toml", left)
    left_file = folder / "left.nc"
    assert main(["run", str(left_config), "-o", str(left_file), "--quiet"]) == 0
    capsys.readouterr()  # its warnings (--quiet keeps them) are not the resume's line
    assert io.outcome(left_file).status == "mass_left_domain"
    before = io.read(left_file).sizes["time"]
    for _ in range(2):
        status, err = run_main(capsys, "run", left_config, "-o", left_file, "--resume")
        assert status == 2 and one_line(err) and "mass_left_domain" in err
    assert io.read(left_file).sizes["time"] == before
    held("7", 2)


def run_config_interrupted(config, target: Path, after: int) -> int:
    """Run in process, Ctrl-C after ``after`` snapshots; returns the snapshots on disk."""
    import tpde.run as trun

    calls = {"n": 0}
    original = trun.Progress.__call__

    def interrupt(self, snap):
        calls["n"] += 1
        if calls["n"] == after:
            raise KeyboardInterrupt
        original(self, snap)

    trun.Progress.__call__ = interrupt
    try:
        with pytest.raises(KeyboardInterrupt):
            run_config(config, target)
    finally:
        trun.Progress.__call__ = original
    assert io.outcome(target).status == "interrupted"
    return after


def test_plot_treats_attributes_as_text(folder, reference, capsys):
    crafted = folder / "crafted.nc"
    shutil.copyfile(reference, crafted)
    with netCDF4.Dataset(crafted, "a") as nc:
        nc.setncatts({"title": r"$\frac{$", "status": r"$\frac{$ x", "status_time": 0.1})
    status, err = run_main(capsys, "plot", crafted, "-o", folder / "crafted_figures")
    assert status == 0, err
    huge = folder / "huge_config.nc"
    shutil.copyfile(reference, huge)
    text = dumps(variant(grid={"cells": [100000, 100000]}))
    with netCDF4.Dataset(huge, "a") as nc:
        nc.setncattr("config", text)
    start_time = time.perf_counter()
    status, err = run_main(capsys, "plot", huge, "-o", folder / "huge_figures")
    assert status == 0 and time.perf_counter() - start_time < 60, err
    with netCDF4.Dataset(huge, "a") as nc:  # a grid attribute that the data does not hold
        nc.setncattr("grid_cells", np.array([100000, 100000]))
    status, err = run_main(capsys, "info", huge)
    assert status == 2 and one_line(err) and "grid_cells" in err
    held("7", 3)


def test_scheduler_security_and_docs(folder):
    from tpde.config import ConfigError
    from tpde.sweep import check_scheduler, load_security

    for name in ("ca.pem", "client.pem", "client.key"):
        (folder / name).write_text("-----BEGIN CERTIFICATE-----\n")
    security = write_config(
        folder / "tls.toml", 'ca_file = "ca.pem"\ncert = "client.pem"\nkey = "client.key"\n'
    )
    loaded = load_security(security)
    assert loaded.require_encryption and loaded.tls_ca_file.endswith("ca.pem")
    check_scheduler("tls://10.0.0.5:8786", loaded)
    with pytest.raises(ConfigError, match="--scheduler: --security needs a tls"):
        check_scheduler("tcp://10.0.0.5:8786", loaded)
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "sweeps.md").read_text()
    assert "unpickle" in guide and "--security" in guide and "TLS" in guide
    held("7", 1)


def test_zz_table():
    """The table of the cases held (pytest -s shows it)."""
    rows = [(f"{key} {CATEGORIES[key]}", *TABLE[key]) for key in CATEGORIES]
    width = max(len(r[0]) for r in rows)
    print(f"\n{'category':<{width}}  cases  held")
    for name, cases, ok in rows:
        print(f"{name:<{width}}  {cases:>5}  {ok:>4}")
    print(f"{'total':<{width}}  {sum(r[1] for r in rows):>5}  {sum(r[2] for r in rows):>4}")
    assert all(cases == ok for _, cases, ok in rows)
