"""Provenance in the files and the Python face (issue 17).

* the resolved config, the tpde version, threads, steps, rejected steps and wall time are in
  every run file and in ``tpde info``; ``tpde --version``; ``initial.file`` is relative to
  the config file's folder;
* ``Result.to_xarray()`` is the Dataset of the file ``tpde.io.write(result, path)`` writes,
  which is the file ``tpde run`` writes; the references return Datasets with the run's
  names;
* a velocity callable that returns the wrong shape gets one line naming the shape expected.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import replace

import numpy as np
import pytest

import tpde
from tpde import io
from tpde.cli import main
from tpde.config import build, dumps
from tpde.grid import Grid, Positions, gaussian
from tpde.references import gaussian_reference
from tpde.schemes.solver import Problem, Solver
from tpde.variants import AffineVelocity, FunctionVelocity

CONFIG = {
    "grid": {"lower": [-5.5, -5.0], "upper": [6.5, 4.5], "cells": [16, 12]},
    "initial": {"kind": "gaussian", "mean": [0.5, -0.3], "covariance": [[1.0, 0.4], [0.4, 0.6]]},
    "attention": {
        "variant": "softmax",
        "A": [[-0.6, 0.8], [-0.2, -0.3]],
        "V": [[1.0, 0.5], [-0.3, 0.8]],
    },
    "run": {"t_end": 0.05, "snapshots": 3},
}


def test_run_files_record_their_provenance(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text(dumps(CONFIG))
    out = tmp_path / "run.nc"
    assert main(["run", str(config), "-o", str(out), "--quiet"]) == 0
    ds = io.read(out)
    a = ds.attrs
    assert a["tpde_version"] == tpde.__version__ and a["source"] == f"tpde {tpde.__version__}"
    assert int(a["threads"]) >= 1 and int(a["steps"]) >= 1 and int(a["rejected_steps"]) >= 0
    assert 0 < float(a["wall_time"]) < 600
    stored = tomllib.loads(a["config"])  # the resolved config: every default written out
    assert stored["scheme"]["cfl"] == 0.4 and stored["scheme"]["reconstruction"] == "weno5z"
    assert stored["attention"]["engine"] == "auto" and stored["run"]["max_outflow"] == 1e-3
    assert stored["grid"]["boundary"] == "outflow"
    assert build(a["config"]).text == a["config"]  # the stored config rebuilds itself
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"written by tpde {tpde.__version__}, threads {a['threads']}, steps {a['steps']}" in said
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"tpde {tpde.__version__}"


def test_counters_add_up_over_a_resume(tmp_path):
    grid = Grid([-3.0], [3.0], [12])
    path = tmp_path / "resumed.nc"
    snaps = [
        type(
            "S",
            (),
            {
                "time": t,
                "density": gaussian(grid, [0.0], [[1.0]]),
                "outflow": 0.0,
                "max_speed": 1.0,
                "dt": 0.1,
            },
        )()
        for t in (0.0, 0.5, 1.0)
    ]
    writer = io.SnapshotWriter(path, grid)
    writer.write(snaps[0])
    writer.close("interrupted", 0.0, provenance={"steps": 7, "rejected_steps": 1, "wall_time": 2.0})
    writer = io.SnapshotWriter.resume(path)
    for s in snaps[1:]:
        writer.write(s)
    writer.close(
        "completed",
        1.0,
        provenance={"steps": 5, "rejected_steps": 0, "wall_time": 1.5, "threads": 2},
    )
    a = io.read(path).attrs
    assert (int(a["steps"]), int(a["rejected_steps"]), float(a["wall_time"])) == (12, 1, 3.5)
    assert int(a["threads"]) == 2


def test_initial_file_is_relative_to_the_config_folder(tmp_path, monkeypatch):
    grid = build(CONFIG).problem.grid
    folder = tmp_path / "case"
    folder.mkdir()
    start = folder / "start.nc"
    writer = io.SnapshotWriter(start, grid)
    rho = gaussian(grid, [0.2, 0.1], [[0.8, 0.0], [0.0, 0.5]])
    writer.write(
        type("S", (), {"time": 0.0, "density": rho, "outflow": 0.0, "max_speed": 1.0, "dt": 0.1})()
    )
    writer.close("completed", 0.0)
    raw = {**CONFIG, "initial": {"kind": "file", "file": "start.nc"}}
    (folder / "run.toml").write_text(dumps(raw))
    monkeypatch.chdir(tmp_path)  # not the config's folder
    config = build(folder / "run.toml")
    assert np.array_equal(config.problem.density, rho)
    stored = tomllib.loads(config.text)["initial"]["file"]
    assert os.path.isabs(stored) and os.path.samefile(stored, start)


def _tiny_result():
    grid = Grid([-4.0, -3.0], [4.0, 3.0], [16, 12])
    rho = gaussian(grid, [0.3, -0.2], [[0.6, 0.1], [0.1, 0.4]])
    velocity = AffineVelocity([[-0.3, 0.2], [0.0, -0.1]], [0.1, 0.0])
    return Solver(Problem(grid, rho, velocity, 0.2, snapshots=3)).run()


def test_result_to_xarray_is_the_file_tpde_writes(tmp_path):
    result = _tiny_result()
    ds = result.to_xarray(config_text="python", title="built in Python")
    path = io.write(result, tmp_path / "python.nc", config_text="python", title="built in Python")
    again = io.read(path)
    assert set(ds.variables) == set(again.variables)
    for name in ("density", "mass", "mean_position", "covariance", "time", "x", "y"):
        np.testing.assert_array_equal(ds[name].values, again[name].values)
    assert ds["density"].dims == ("time", "x", "y")
    np.testing.assert_array_equal(ds["density"].values[-1], result.final)
    assert ds.attrs["status"] == result.status == "completed"
    assert int(ds.attrs["steps"]) == result.steps and float(ds.attrs["wall_time"]) > 0
    stored = result.to_xarray(order="file")
    assert stored["density"].dims == ("time", "y", "x")
    with pytest.raises(io.OutputError, match="exists"):
        io.write(result, path)
    positions = Positions(2, 0.1)  # a masked run's Result carries its Positions
    snapshots = [
        replace(s, density=positions.product(s.density, result.grid)) for s in result.snapshots
    ]
    masked = replace(result, snapshots=snapshots, positions=positions)
    sliced = masked.to_xarray()
    assert sliced["density"].dims == ("time", "s", "x", "y") and sliced.attrs["positions"] == 2
    with pytest.raises(ValueError, match="need positions="):
        io.write(replace(masked, positions=None), tmp_path / "no_positions.nc")


def test_references_return_datasets_with_the_run_names():
    ode = gaussian_reference(build(CONFIG))
    for name in ("density", "mass", "mean_position", "covariance"):
        assert name in ode.data_vars
    assert ode["time"].attrs == io.TIME_ATTRIBUTES
    assert io.grid_from_dataset(ode) == build(CONFIG).problem.grid


@pytest.mark.parametrize(
    ("func", "message"),
    [
        (lambda x, t: [x[0]], "got 1 component"),
        (lambda x, t: [x[0], np.ones(7)], "component 1 has shape (7,)"),
        (lambda x, t: 2.0, "got float"),
    ],
)
def test_a_velocity_callable_of_the_wrong_shape_says_the_shape(func, message):
    grid = Grid([-1.0, -1.0], [1.0, 1.0], [4, 5])
    with pytest.raises(ValueError, match="must return 2 arrays broadcastable to") as err:
        FunctionVelocity(func).at(None, grid, 0.0, (0.0, 0.0))
    assert message in str(err.value) and "\n" not in str(err.value)
