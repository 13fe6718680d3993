"""tpde sweep: the sweep file, outcomes, a 96-run sweep on a local dask cluster (64 valid
runs), the rerun that skips completed runs, and a worker killed mid-sweep."""

from __future__ import annotations

import io
import json
import math
import os
import signal
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr

from tpde.cli import main
from tpde.config import ConfigError, dumps
from tpde.sweep import SweepProgress, classify, load_sweep, read_summary, run_sweep

distributed = pytest.importorskip("distributed")

# 16^2 softmax runs of ~30 ms: V = 4 I, A = scale [[1, a01], [0, 1]] from N(0, Sigma0) in a
# small box. Sigma' = 4 scale (Sigma A Sigma + Sigma A^T Sigma): scale <= 0.5 stays inside up
# to t = 0.2 (converged), scale >= 2 pushes mass to the faces of the box (box_limited).
BASE = {
    "grid": {"lower": [-3.0, -3.0], "upper": [3.0, 3.0], "cells": [16, 16]},
    "initial": {"kind": "gaussian", "mean": [0.0, 0.0], "covariance": [[0.25, 0.0], [0.0, 0.25]]},
    "attention": {
        "variant": "softmax",
        "A": [[1.0, 0.0], [0.0, 1.0]],
        "V": [[4.0, 0.0], [0.0, 4.0]],
    },
    "run": {"t_end": 0.2, "snapshots": 3, "max_outflow": 1e-4, "output": "ignored.nc"},
}
SCALES = [-2.0, -1.0, -0.5, 0.0, 0.5, 2.0, 3.0, 4.0]
ENTRIES = [-1.0, -0.5, 0.0, 0.5]
COVARIANCES = [
    [[0.25, 0.0], [0.0, 0.25]],
    [[0.2, 0.05], [0.05, 0.15]],
    [[1.0, 2.0], [2.0, 1.0]],
]  # the last is not positive definite: failed


def write_sweep(
    folder: Path,
    parameters: dict,
    base: dict | None = None,
    extra: str = "",
    output: str | None = None,
) -> Path:
    """base.toml + sweep.toml in folder (JSON lists and strings are TOML values)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.toml").write_text(dumps(base or BASE))
    lines = ['base = "base.toml"', f'output = "{output or folder / "out"}"', extra, "[parameters]"]
    lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in parameters.items()]
    path = folder / "sweep.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---- the sweep file -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, parameters, where",
    [
        ("bogus = 1", {"attention.scale": [1.0]}, "bogus: unknown key"),
        ("", {"attention.Z": [1.0]}, 'parameters."attention.Z": attention.Z is not in the base'),
        ("", {"attention.A[5][0]": [1.0]}, 'parameters."attention.A[5][0]": no entry [5]'),
        ("", {"attention.A[0][1][0]": [1.0]}, 'parameters."attention.A[0][1][0]": no entry [0]'),
        ("", {"gird.cells": [[8, 8]]}, 'parameters."gird.cells": gird is not in the base'),
        ("", {"attention.A(0)": [1.0]}, 'parameters."attention.A(0)": not a config key'),
        ("", {"attention.scale": []}, 'parameters."attention.scale": expected a non-empty list'),
        ("", {"attention.scale": 1.0}, 'parameters."attention.scale": expected a non-empty list'),
        ("", {"attention.scale": [1.0, 1.0]}, 'parameters."attention.scale": value 1.0 appears'),
        ("", {}, "parameters: missing or empty"),
        ("[rank]\ntolerance = 2.0", {"attention.scale": [1.0]}, "rank.tolerance: expected"),
        (
            '[phase]\nx = "grid.cells"',
            {"attention.scale": [1.0]},
            "phase.x: 'grid.cells' is not a swept parameter",
        ),
    ],
)
def test_sweep_file_errors_name_the_key(tmp_path, extra, parameters, where):
    path = write_sweep(tmp_path, parameters, extra=extra)
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    message = str(info.value)
    assert message.startswith(where) and "\n" not in message


def test_sweep_file_keys_runs_and_ids(tmp_path):
    params = {
        "attention.scale": [0.5, 1.0],
        "scheme.cfl": [0.3, 0.4],  # absent from base
        "grid.cells": [[16, 16], [8, 8]],
        "attention.A[0][1]": [0.1],
    }
    sweep = load_sweep(write_sweep(tmp_path, params))
    assert len(sweep.runs) == 8 and sweep.phase == ("attention.scale", "scheme.cfl")
    run = sweep.runs[-1]
    assert run.raw["attention"]["scale"] == 1.0 and run.raw["scheme"] == {"cfl": 0.4}
    assert run.raw["grid"]["cells"] == [8, 8] and run.raw["attention"]["A"][0] == [1.0, 0.1]
    assert "output" not in run.raw["run"] and BASE["attention"]["A"][0][1] == 0.0
    assert run.run_id.startswith("scale1_cfl0.4_cells8x8_A010.1_")
    assert len({r.run_id for r in sweep.runs}) == 8
    again = load_sweep(write_sweep(tmp_path, params))  # stable ids
    assert [r.run_id for r in again.runs] == [r.run_id for r in sweep.runs]
    other = {**BASE, "run": {**BASE["run"], "t_end": 0.3}}  # the base is in the hash
    changed = load_sweep(write_sweep(tmp_path / "b", params, base=other))
    assert not {r.run_id for r in changed.runs} & {r.run_id for r in sweep.runs}
    inline = load_sweep(
        {"base": BASE, "output": str(tmp_path / "o"), "parameters": {"attention": {"scale": [0.5]}}}
    )  # unquoted dots
    assert list(inline.parameters) == ["attention.scale"]


def test_cli_bad_sweep_file_exits_2_with_one_line(tmp_path, capsys):
    path = write_sweep(tmp_path, {"attention.nope": [1.0]})
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith('tpde: parameters."attention.nope":') and err.count("\n") == 1


# ---- outcomes -------------------------------------------------------------------------------
def test_classify_outcomes():
    t = np.array([0.0, 0.5, 1.0])
    line = np.array([np.diag([1.0, 1.0]), np.diag([1.5, 0.3]), np.diag([2.0, 0.04])])
    out = classify("completed", 1.0, "", t, line, 0.05)
    assert (out["outcome"], out["rank"]) == ("converged", 1)
    assert out["eigenvalues"] == pytest.approx([2 / 2.04, 0.04 / 2.04])
    assert out["trace_final"] == pytest.approx(2.04)
    point = np.array([np.eye(2), 0.3 * np.eye(2), 0.04 * np.eye(2)])
    assert classify("completed", 1.0, "", t, point, 0.05)["rank"] == 0
    assert classify("completed", 1.0, "", t, point, 0.01)["rank"] == 2
    grown = np.array([np.eye(2), 2e3 * np.eye(2), 1e4 * np.eye(2)])
    out = classify("completed", 1.0, "", t, grown)
    assert (out["outcome"], out["event_time"]) == ("blowup", 0.5)
    # the typed status decides, never the message: a non-finite value is a failure of the
    # numerics at its time, unless the recorded trace grew by more than 1e3 before it
    message = "SimulationError: non-finite density at t = 0.73, step 12"
    out = classify("error", 0.73, message, t[:2], line[:2], reason="non_finite")
    assert (out["outcome"], out["reason"], out["event_time"]) == ("failed", "non_finite", 0.73)
    assert out["message"] == message
    out = classify("error", 0.73, "", t[:2], grown[:2], reason="non_finite")
    assert (out["outcome"], out["event_time"]) == ("blowup", 0.73)
    out = classify("error", 0.73, message, t[:2], grown[:2], reason="max_steps")
    assert (out["outcome"], out["reason"]) == ("failed", "max_steps")  # growth is no cause
    out = classify("error", 0.73, "overflow at t = 0.5", t[:2], line[:2])
    assert (out["outcome"], out["reason"], out["event_time"]) == ("failed", "exception", 0.73)
    out = classify("under_resolved", 0.3, "", t, line)
    assert (out["outcome"], out["event_time"]) == ("under_resolved", 0.3)
    out = classify("box_limited", 0.2, "", t, line)
    assert (out["outcome"], out["event_time"]) == ("box_limited", 0.2)
    out = classify("blowup", 0.61, "", t, line)
    assert (out["outcome"], out["event_time"]) == ("blowup", 0.61)
    out = classify("mass_left_domain", 0.42, "outflow ...", t, line)
    assert (out["outcome"], out["event_time"], out["rank"]) == ("mass_left", 0.42, -1)
    out = classify("error", math.nan, "SinkhornError: max_iter reached", t, line)
    assert (out["outcome"], out["message"]) == ("failed", "SinkhornError: max_iter reached")
    out = classify("running", 0.0, "", t[:1], line[:1])
    assert (out["outcome"], out["reason"]) == ("failed", "running")


def test_progress_line():
    stream = io.StringIO()
    bar = SweepProgress(3, stream=stream)
    bar.update({"outcome": "converged"})
    bar.update({"outcome": "failed"})
    bar.update({"outcome": "converged", "skipped": True})
    lines = stream.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "runs 1/3 done, 0 failed, 0 skipped",
        "runs 2/3 done, 1 failed, 0 skipped",
        "runs 3/3 done, 1 failed, 1 skipped",
    ]
    quiet = io.StringIO()
    SweepProgress(3, enabled=False, stream=quiet).update({"outcome": "failed"})
    assert quiet.getvalue() == ""


# ---- sweeps on dask -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=50,
        env={"TPDE_NUM_THREADS": "1"},
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """96 runs (64 valid, 32 with a non-SPD covariance) by `tpde sweep --workers 2`."""
    folder = tmp_path_factory.mktemp("sweep")
    path = write_sweep(
        folder,
        {
            "attention.scale": SCALES,
            "attention.A[0][1]": ENTRIES,
            "initial.covariance": COVARIANCES,
        },
    )
    assert main(["sweep", str(path), "--workers", "2", "--quiet"]) == 0
    return path, folder / "out"


def test_sweep_of_96_runs_on_a_local_cluster(swept, capsys):
    _, out = swept
    files = sorted((out / "runs").glob("*.nc"))
    assert len(files) == 64  # one NetCDF per valid run
    assert (out / "summary.nc").is_file() and (out / "phase.png").stat().st_size > 10_000
    with xr.open_dataset(out / "summary.nc") as grid:  # the parameter grid, phase x last
        assert grid["outcome"].dims == ("initial_covariance", "attention_A_0_1", "attention_scale")
        assert grid["attention_scale"].attrs["parameter"] == "attention.scale"
        assert grid["attention_scale"].values.tolist() == sorted(SCALES)
        assert grid.sizes["initial_covariance"] == len(COVARIANCES)
    ds = read_summary(out / "summary.nc")  # the table along run, sweep order
    assert ds.sizes["run"] == 96 and ds.attrs["runs"] == 96
    assert set(ds["attention.scale"].values) == set(SCALES)
    spd = ds["initial.covariance"].values != json.dumps(COVARIANCES[2])
    scale = ds["attention.scale"].values
    outcome = ds["outcome"].values
    assert np.all(outcome[~spd] == "failed")
    assert all(
        "initial.covariance" in m and "positive definite" in m for m in ds["message"].values[~spd]
    )
    assert np.all(outcome[spd & (scale <= 0.5)] == "converged")
    assert np.all(ds["rank"].values[spd & (scale <= 0.5)] == 2)
    # the box stops holding these runs (mass at its faces) before the outflow limit
    assert np.all(outcome[spd & (scale >= 2)] == "box_limited")
    times = ds["event_time"].values[spd & (scale >= 2)]
    assert np.all((times > 0) & (times < 0.2))
    assert np.all(np.isnan(ds["event_time"].values[outcome == "converged"]))
    assert (ds.attrs["converged"], ds.attrs["box_limited"], ds.attrs["failed"]) == (40, 24, 32)
    stored = xr.open_dataset(files[0])
    assert stored.attrs["status"] in ("completed", "mass_left_domain", "box_limited")
    assert "A = [[" in stored.attrs["config"]


def test_rerun_skips_completed_runs(swept, cluster):
    path, out = swept
    files = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.nc")}
    before = read_summary(out / "summary.nc")
    redo = sorted(files)[:2]  # one file deleted, one left "interrupted"
    (out / "runs" / redo[0]).unlink()
    with netCDF4.Dataset(out / "runs" / redo[1], "a") as nc:
        nc.setncattr("status", "interrupted")
    ds = run_sweep(path, scheduler=cluster.scheduler_address, progress=False)
    assert ds.attrs["skipped"] == 62 and int(ds["skipped"].sum()) == 62
    after = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.nc")}
    assert set(after) == set(files)
    assert {n for n in files if after[n] != files[n]} == set(redo)  # only these two redone
    for name in ("outcome", "rank", "run_id"):
        assert np.array_equal(ds[name].values, before[name].values)
    kept = ds["skipped"].values == 1
    assert np.allclose(ds["wall_s"].values[kept], before["wall_s"].values[kept])


def test_worker_killed_mid_sweep_is_survived(tmp_path, cluster):
    """~0.3 s runs; after the third result one worker process (with work in hand) gets
    SIGKILL; the scheduler reruns its tasks on the other worker and the nanny's new one."""
    base = {
        **BASE,
        "grid": {**BASE["grid"], "cells": [24, 24]},
        "run": {**BASE["run"], "t_end": 0.3},
    }
    path = write_sweep(
        tmp_path,
        {"attention.scale": [-1.0, -0.5, 0.0, 0.5], "attention.A[0][1]": [-0.5, 0.0, 0.5]},
        base=base,
    )
    client = distributed.Client(cluster)
    pids = client.run(os.getpid)
    seen, killed = [], {}

    def on_result(record):
        seen.append(record)
        if len(seen) == 3:
            processing = client.processing()
            victim = max(pids, key=lambda w: len(processing.get(w, ())))
            killed.update(pid=pids[victim], keys=list(processing.get(victim, ())))
            os.kill(pids[victim], signal.SIGKILL)

    try:
        ds = run_sweep(
            path, scheduler=cluster.scheduler_address, progress=False, on_result=on_result
        )
        assert killed and len(seen) == 12
        assert ds.sizes["run"] == 12 and ds.attrs["converged"] == 12
        lost = [k.removeprefix("tpde-sweep-") for k in killed["keys"]]
        assert set(lost) <= set(ds["run_id"].values)
        assert len(list((tmp_path / "out" / "runs").glob("*.nc"))) == 12
        client.wait_for_workers(2, timeout=60)
        assert killed["pid"] not in client.run(os.getpid).values()
    finally:
        client.close()


def test_one_parameter_sweep_writes_its_grid_and_passes_threads(tmp_path, monkeypatch):
    """A sweep over one key (no MultiIndex to unstack) writes its summary grid; --threads
    reaches every run over TPDE_NUM_THREADS (the file's provenance)."""
    monkeypatch.setenv("TPDE_NUM_THREADS", "2")
    path = write_sweep(tmp_path, {"attention.scale": [1.0, 0.5]})
    assert main(["sweep", str(path), "--workers", "1", "--threads", "1", "--quiet"]) == 0
    ds = read_summary(tmp_path / "out" / "summary.nc")
    assert ds.sizes["run"] == 2 and sorted(ds["attention.scale"].values) == [0.5, 1.0]
    for run in (tmp_path / "out" / "runs").glob("*.nc"):
        with xr.open_dataset(run) as one:
            assert int(one.attrs["threads"]) == 1


def test_summary_line_and_info_count_every_outcome(tmp_path, capsys):
    """A 4-run sweep (one run reaches t_end, one leaves the box's trust, two have a
    covariance that is not positive definite): the end-of-sweep line and `tpde info` of
    its summary give every outcome's count, box_limited included (a line that listed only
    converged, blowup and failed once hid 53 box_limited runs of 64), and each failure
    its typed reason."""
    path = write_sweep(
        tmp_path,
        {"attention.scale": [0.5, 3.0], "initial.covariance": [COVARIANCES[0], COVARIANCES[2]]},
    )
    with distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tcp://",
        dashboard_address=None,
        silence_logs=50,
    ) as cluster:
        code = main(["sweep", str(path), "--scheduler", cluster.scheduler_address, "--quiet"])
    out = capsys.readouterr().out
    line = out.splitlines()[0]
    print(f"\n{line}")
    assert code == 0
    expected = {
        "converged": 1,
        "blowup": 0,
        "mass_left": 0,
        "box_limited": 1,
        "failed": 2,
        "under_resolved": 0,
    }
    assert line.startswith("4 runs: ")
    for outcome, count in expected.items():
        assert f"{count} {outcome}" in line, outcome
    ds = read_summary(tmp_path / "out" / "summary.nc")
    failed = ds["outcome"].values == "failed"
    assert sorted(ds["reason"].values[failed]) == ["config", "config"]
    assert set(ds["reason"].values[~failed]) == {""}
    assert main(["info", str(tmp_path / "out" / "summary.nc")]) == 0
    said = [s for s in capsys.readouterr().out.splitlines() if "outcomes:" in s]
    print(said[0])
    for outcome, count in expected.items():
        assert f"{count} {outcome}" in said[0], outcome
