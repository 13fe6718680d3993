"""``tpde run`` end to end: round trip through NetCDF, a killed run and --resume, examples."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from exact import kill_after

from tpde.cli import main
from tpde.config import build, dumps
from tpde.grid import moments
from tpde.io import grid_from_dataset, read
from tpde.run import simulate

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "grid": {"lower": [-5.5, -5.25], "upper": [6.5, 4.5], "cells": [24, 24]},
    "initial": {"kind": "gaussian", "mean": [0.5, -0.3], "covariance": [[1.0, 0.4], [0.4, 0.6]]},
    "attention": {
        "variant": "softmax",
        "A": [[-0.6, 0.8], [-0.2, -0.3]],
        "V": [[1.0, 0.5], [-0.3, 0.8]],
    },
    "run": {"t_end": 0.5, "snapshots": 6},
}


def test_simulate_round_trip_rebuilds_grid_and_values(tmp_path):
    ds = simulate(SMALL, output=tmp_path / "run.nc")
    again = read(tmp_path / "run.nc")
    grid = grid_from_dataset(again)
    config = build(SMALL)
    assert grid.shape == config.problem.grid.shape
    for a, name in enumerate(("x", "y")):
        assert np.array_equal(again[name].values, config.problem.grid.centres(a))
    assert np.array_equal(ds["density"].values, again["density"].values)
    assert ds.attrs["status"] == "completed" and ds.attrs["Conventions"] == "CF-1.10"
    final = again["density"].values[-1]
    mass, mean, cov = moments(final, grid)
    assert np.allclose(again["mean_position"].values[-1], mean, rtol=0, atol=1e-15)
    assert np.allclose(again["covariance"].values[-1], cov, rtol=0, atol=1e-15)
    assert build(again.attrs["config"]).text == config.text
    print(f"\nround trip: {ds.sizes['time']} snapshots, mass {mass:.15f}")


def test_killed_run_is_readable_and_resume_matches_an_uninterrupted_run(tmp_path):
    raw = dict(SMALL, run={"t_end": 1.0, "snapshots": 41})
    raw["grid"] = dict(SMALL["grid"], cells=[40, 40])
    config = tmp_path / "run.toml"
    config.write_text(dumps(raw))
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert main(["run", str(config), "-o", str(full), "--quiet"]) == 0
    kill_after(["run", str(config), "-o", str(cut)], 5)
    with xr.open_dataset(cut) as partial:
        done = partial.sizes["time"]
        assert partial.attrs["status"] in ("running", "interrupted")
        assert 5 <= done < 41
        assert np.all(np.isfinite(partial["density"].values))
    start = time.perf_counter()
    assert main(["run", str(config), "-o", str(cut), "--resume", "--quiet"]) == 0
    resumed, reference = read(cut), read(full)
    gap = float(np.abs(resumed["density"].values - reference["density"].values).max())
    print(
        f"\nkilled after {done} of 41 snapshots; resumed in {time.perf_counter() - start:.1f}"
        f" s; max |resumed - uninterrupted| = {gap:.1e}"
    )
    assert resumed.sizes["time"] == 41 and resumed.attrs["status"] == "completed"
    assert np.array_equal(resumed["time"].values, reference["time"].values)
    # warm starts are dropped at every snapshot (VelocityField.reset): 0 when run alone,
    # <= 4e-16 measured inside the full test session (2.3e-15 with warm starts kept)
    assert gap <= 1e-13 * float(reference["density"].max())
    assert main(["run", str(config), "-o", str(cut), "--resume", "--quiet"]) == 2


EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_runs_shortened(path, tmp_path):
    raw = tomllib.loads(path.read_text())
    d = len(raw["grid"]["cells"])
    # a frame's box is in standard deviations (+-16): 20 cells would not resolve the law
    affine = raw.get("scheme", {}).get("frame") == "affine"
    raw["grid"]["cells"] = [40 if affine else 20] * d
    raw["run"]["t_end"] = min(0.2, raw["run"]["t_end"])
    raw["run"]["snapshots"] = 3
    raw["run"]["max_outflow"] = 1e-2
    raw.setdefault("initial", {})
    ds = simulate(raw, output=tmp_path / f"{path.stem}.nc")
    print(f"\n{path.name}: status {ds.attrs['status']}, mass {float(ds['mass'][-1]):.6f}")
    assert ds.attrs["status"] == "completed"
    assert np.all(np.isfinite(ds["density"].values))


def test_gaussian_and_particle_references_match_the_run(tmp_path):
    """tpde gaussian / tpde particles write the references with the run's names; the grid
    run, the ODE and 2000 tokens agree on the covariance (sampling error ~ n^-1/2: the bound
    5 * 2 / sqrt(n) follows n). 2000, not 4000: the dense token sums cost n^2 (45 CPU s at
    4000, loaded)."""
    tokens_n = 2000
    config = tmp_path / "run.toml"
    raw = dict(SMALL, grid=dict(SMALL["grid"], cells=[48, 48]))
    config.write_text(dumps(raw))
    paths = {name: tmp_path / f"{name}.nc" for name in ("run", "gaussian", "particles")}
    assert main(["run", str(config), "-o", str(paths["run"]), "--quiet"]) == 0
    assert main(["gaussian", str(config), "-o", str(paths["gaussian"])]) == 0
    assert (
        main(["particles", str(config), "--tokens", str(tokens_n), "-o", str(paths["particles"])])
        == 0
    )
    run, ode, tokens = (
        read(paths["run"]),
        xr.load_dataset(paths["gaussian"]),
        xr.load_dataset(paths["particles"]),
    )
    assert np.array_equal(run["time"].values, ode["time"].values)
    grid_err = float(np.abs(run["covariance"][-1] - ode["covariance"][-1]).max())
    token_err = float(np.abs(tokens["covariance"][-1] - ode["covariance"][-1]).max())
    print(
        f"\ncovariance at t = 0.5: grid vs ODE {grid_err:.1e}, "
        f"{tokens_n} tokens vs ODE {token_err:.1e}"
    )
    assert grid_err <= 1e-3 and token_err <= 5 * 2 / np.sqrt(tokens_n)
    assert tokens["tokens"].shape == (6, tokens_n, 2)
    assert main(["gaussian", str(config), "-o", str(paths["gaussian"])]) == 2


#: 32 cells for a Gaussian of variance 0.3 against run.resolution_tolerance = 1e-7: the
#: resolution monitor's ``under_resolved`` at the first step (estimate 1.35e-4 by t = 0.1)
NARROW_FLAT = """
[grid]
lower = [-4.0]
upper = [4.0]
cells = [32]

[initial]
kind = "gaussian"
mean = [0.0]
covariance = [[0.3]]

[attention]
variant = "softmax"
A = [[1.0]]
V = [[0.5]]

[run]
t_end = 0.4
snapshots = 5
resolution_tolerance = 1e-7
"""


def test_resumed_flat_run_keeps_the_monitor_state(tmp_path, monkeypatch):
    """A flat run whose ``under_resolved`` came at its first step, interrupted (SIGINT)
    after two snapshots and resumed: one ``under_resolved`` in the file's events (before,
    the resumed run warned again), the stored ``monitor_state`` (the estimate exactly, the
    warned flag) and every variable as the uninterrupted run's."""
    import json
    import os
    import signal

    import netCDF4

    from tpde.io import SnapshotWriter

    config = tmp_path / "narrow.toml"
    config.write_text(NARROW_FLAT)
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert main(["run", str(config), "-o", str(full), "--quiet"]) == 0
    write = SnapshotWriter.write

    def interrupting(self, *args, **kwargs):
        done = write(self, *args, **kwargs)
        if self.snapshots == 2:
            os.kill(os.getpid(), signal.SIGINT)  # held until the record is written
        return done

    monkeypatch.setattr(SnapshotWriter, "write", interrupting)
    assert main(["run", str(config), "-o", str(cut), "--quiet"]) == 130
    monkeypatch.undo()
    assert main(["run", str(config), "-o", str(cut), "--resume", "--quiet"]) == 0
    with netCDF4.Dataset(cut) as a, netCDF4.Dataset(full) as b:
        a.set_auto_mask(False)
        b.set_auto_mask(False)
        state, reference = json.loads(a.monitor_state), json.loads(b.monitor_state)
        print(f"\nresumed flat run: events {str(a.events).splitlines()}, state {state}")
        assert str(a.events).count("under_resolved") == 1 == str(b.events).count("under_res")
        assert state == reference and state["resolution_warned"] is True
        assert sorted(a.variables) == sorted(b.variables)
        for name in b.variables:
            np.testing.assert_array_equal(a[name][...], b[name][...], err_msg=name)
