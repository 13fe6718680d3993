"""The files tpde writes, read by the tools users open them with (issue 17).

Every kind of output (runs in 1-D, 2-D, 3-D and with position slices, ``tpde gaussian``,
``tpde particles``, a sweep's ``summary.nc``) is opened by

* VTK's ``vtkNetCDFCFReader``, the reader behind ParaView's "NetCDF CF" option, with the
  ``Dimensions`` the user guide tells ParaView users to pick: the right time steps, extents
  and x along VTK's x axis;
* compliance-checker's ``cf:1.10`` suite: no finding of high priority except the two about
  Transformer time's units (``units = "1"``: CF wants ``<unit> since <epoch>``, which xarray
  would decode to dates; docs/user-guide.md, 'Output files (CF-1.10 NetCDF)');
* xarray, whose ``.plot()`` puts x horizontal.

Run ``pytest -s`` to see the checker's scores. The files are small (at most 16 x 14 cells):
the module takes a few seconds beyond importing VTK.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import netCDF4
import numpy as np
import pytest
import xarray as xr

from tpde import io
from tpde.config import build, dumps
from tpde.grid import Grid, Positions, gaussian
from tpde.references import gaussian_reference, particle_reference, write_reference
from tpde.sweep import load_sweep, read_summary, summary_dataset, summary_grid

vtk = pytest.importorskip("vtk", reason="the ParaView reader check needs vtk (pip install vtk)")

CONFIG = {
    "grid": {"lower": [-5.5, -5.0], "upper": [6.5, 4.5], "cells": [16, 12]},
    "initial": {"kind": "gaussian", "mean": [0.5, -0.3], "covariance": [[1.0, 0.4], [0.4, 0.6]]},
    "attention": {
        "variant": "softmax",
        "A": [[-0.6, 0.8], [-0.2, -0.3]],
        "V": [[1.0, 0.5], [-0.3, 0.8]],
    },
    "run": {"t_end": 0.1, "snapshots": 3},
}
MASKED = {
    **CONFIG,
    "grid": {**CONFIG["grid"], "positions": 3, "sink_mass": 0.1},
    "attention": {**CONFIG["attention"], "masked": True},
}
GRIDS = {
    "run1": Grid([-6.1], [5.7], [14], "outflow"),
    "run2": Grid([-6.1, -3.3], [5.7, 4.9], [16, 12], "outflow"),
    "run3": Grid([-4.0, -3.7, -5.3], [4.2, 3.1, 4.9], [8, 7, 6], "outflow"),
    "masked": Grid([-6.1, -3.3], [5.7, 4.9], [16, 12], "outflow"),
}
POSITIONS = Positions(3, 0.1)
TIMES = (0.0, 0.25, 0.5)
#: what the checker says of time's units = "1" (the one CF rule tpde does not follow)
TIME_UNITS = (
    "time must be in a valid units format <unit> since <epoch> not 1",
    "time does not have correct time units",
)


def _snapshots(grid: Grid, positions: Positions | None = None) -> list[SimpleNamespace]:
    d = grid.ndim
    out = []
    for i, t in enumerate(TIMES):
        rho = gaussian(grid, np.linspace(-0.4, 0.3, d) + 0.1 * i, np.eye(d) * (0.8 + 0.2 * i))
        if positions is not None:
            rho = positions.product(rho, grid)
        out.append(SimpleNamespace(time=t, density=rho, outflow=0.0, max_speed=1.0, dt=0.1))
    return out


def _summary(folder: Path) -> Path:
    """A 3 x 2 sweep's summary.nc, written as run_sweep writes it (records made up: the
    layout is under test, not the runs)."""
    (folder / "run.toml").write_text(dumps(CONFIG))
    sweep = folder / "sweep.toml"
    sweep.write_text(
        'base = "run.toml"\noutput = "out"\n[parameters]\n'
        '"attention.scale" = [2.0, 0.5, 1.0]\n"scheme.reconstruction" = ["weno5z", "muscl"]\n'
    )
    spec = load_sweep(sweep)
    records = {}
    for i, run in enumerate(spec.runs):
        records[run.run_id] = {
            "run_id": run.run_id,
            "status": "completed",
            "message": "",
            "outcome": "converged" if i % 3 else "blowup",
            "rank": 2 if i % 3 else -1,
            "event_time": math.nan if i % 3 else 0.5,
            "trace_initial": 1.6,
            "trace_final": 1.0 + i,
            "eigenvalues": [0.7, 0.3],
            "wall_s": 0.1 * i,
            "skipped": False,
        }
    path = folder / "summary.nc"
    io.to_netcdf(summary_grid(summary_dataset(spec, records)), path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """One file of every kind tpde writes."""
    folder = tmp_path_factory.mktemp("formats")
    out = {}
    for kind, grid in GRIDS.items():
        positions = POSITIONS if kind == "masked" else None
        path = folder / f"{kind}.nc"
        writer = io.SnapshotWriter(path, grid, config_text="x", positions=positions)
        for snap in _snapshots(grid, positions):
            writer.write(snap)
        writer.close("completed", TIMES[-1])
        out[kind] = path
    config = build(CONFIG)
    out["gaussian"] = write_reference(gaussian_reference(config), folder / "gaussian.nc")
    out["particles"] = write_reference(particle_reference(config, 60), folder / "particles.nc")
    masked = particle_reference(build(MASKED), 40)
    out["particles_masked"] = write_reference(masked, folder / "particles_masked.nc")
    out["summary"] = _summary(folder)
    return out


KINDS = ["run1", "run2", "run3", "masked", "gaussian", "particles", "particles_masked", "summary"]


def _field(path: Path) -> tuple[str, tuple[str, ...], dict[str, np.ndarray]]:
    """The field ParaView users pick (density; the outcome of a summary), its stored
    dimensions after time, and the coordinate values along each."""
    with netCDF4.Dataset(path) as nc:
        name = "outcome_code" if "outcome_code" in nc.variables else "density"
        dims = tuple(d for d in nc[name].dimensions if d != "time")
        coords = {d: np.asarray(nc[d][:], float) if d in nc.variables else None for d in dims}
        times = np.asarray(nc["time"][:], float) if "time" in nc.variables else np.array([])
    coords["time"] = times
    return name, dims, coords


# ---- ParaView's CF reader -------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_paraview_cf_reader_sees_time_extents_and_x_along_x(files, kind):
    """The user guide's ParaView recipe: NetCDF CF reader, spherical coordinates off,
    Dimensions = the field's (e.g. "(y, x)")."""
    path = files[kind]
    name, dims, coords = _field(path)
    vtk.vtkObject.GlobalWarningDisplayOff()
    reader = vtk.vtkNetCDFCFReader()
    reader.SetFileName(str(path))
    reader.SphericalCoordinatesOff()
    reader.UpdateInformation()
    choices = reader.GetAllDimensions()
    listed = [choices.GetValue(i) for i in range(choices.GetNumberOfValues())]
    wanted = "(" + ", ".join(dims) + ")"
    assert wanted in listed, (wanted, listed)
    reader.SetDimensions(wanted)
    reader.UpdateInformation()
    info = reader.GetOutputInformation(0)
    key = vtk.vtkStreamingDemandDrivenPipeline.TIME_STEPS()
    steps = info.Get(key) if info.Has(key) else ()
    np.testing.assert_allclose(steps or [], coords["time"])
    reader.Update()
    image = reader.GetOutput()
    assert image.GetPointData().GetArray(name) is not None
    extent = list(reversed([coords[d].size for d in dims])) + [1] * (3 - len(dims))
    assert list(image.GetDimensions()) == extent  # x first: VTK's x axis
    x = coords[dims[-1]]
    bounds = image.GetBounds()
    assert bounds[0] == pytest.approx(x.min()) and bounds[1] == pytest.approx(x.max())


# ---- the CF checker -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checker():
    runner = pytest.importorskip("compliance_checker.runner")
    runner.CheckSuite.load_all_available_checkers()
    return runner.CheckSuite()


@pytest.mark.parametrize("kind", KINDS)
def test_cf_checker_finds_nothing_but_time_units(files, checker, kind):
    dataset = checker.load_dataset(str(files[kind]))
    groups, errors = checker.run_all(dataset, ["cf:1.10"], skip_checks=[])["cf:1.10"]
    assert not errors  # no check crashed (variable-length strings did)
    report = checker.build_structure("cf:1.10", groups, str(files[kind]), limit=1)
    high = [m for group in report["high_priorities"] for m in group.msgs]
    medium = [m for group in report["medium_priorities"] for m in group.msgs]
    print(
        f"\n{kind}: cf:1.10 {report['scored_points']}/{report['possible_points']}, "
        f"{len(high)} high, {len(medium)} medium"
    )
    assert set(high) <= set(TIME_UNITS), high
    if kind != "summary":
        assert set(TIME_UNITS) <= set(high)  # (the allowance is not stale)


# ---- xarray ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["run2", "gaussian", "particles", "summary"])
def test_xarray_plot_puts_x_horizontal(files, kind):
    """The user guide's snippet: ``xr.open_dataset(f).density.isel(time=-1).plot()``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from xarray.plot.utils import label_from_attrs

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    with xr.open_dataset(files[kind]) as ds:
        assert not np.issubdtype(ds["time"].dtype, np.datetime64) if "time" in ds else True
        if kind == "summary":
            ds["outcome_code"].plot(ax=ax)
            horizontal = json.loads(ds.attrs["parameter_names"])[0]  # the phase x key
        else:
            ds["density"].isel(time=-1).plot(ax=ax)
            horizontal = "x"
        assert "mean" not in ds.data_vars  # (mean_position: ds.mean is the method)
        assert ax.get_xlabel() == label_from_attrs(ds[horizontal])
        assert ax.get_ylabel() != ax.get_xlabel()


# ---- earlier files and the tpde readers -----------------------------------------------------
def _old_layout(path: Path, grid: Grid, snaps) -> None:
    """A file of the layout before issue 17: density(time, x, y), mean, time with NaN fill."""
    with netCDF4.Dataset(path, "w") as nc:
        nc.setncatts(io.global_attributes(grid, "old", "old", "", None))
        nc.createDimension("time", None)
        nc.createDimension("dim", 2)
        nc.createDimension("dim2", 2)
        nc.createDimension("nv", 2)
        for a, name in enumerate(("x", "y")):
            nc.createDimension(name, grid.cells[a])
            nc.createVariable(name, "f8", (name,))[:] = grid.centres(a)
        time = nc.createVariable("time", "f8", ("time",), fill_value=np.nan)
        variables = {
            "density": ("time", "x", "y"),
            "mass": ("time",),
            "mean": ("time", "dim"),
            "covariance": ("time", "dim", "dim2"),
            "outflow": ("time",),
            "max_speed": ("time",),
            "dt": ("time",),
        }
        for name, dims in variables.items():
            nc.createVariable(name, "f8", dims, fill_value=np.nan)
        from tpde.grid import moments

        for i, s in enumerate(snaps):
            mass, mean, cov = moments(s.density, grid)
            nc["density"][i] = s.density
            nc["mass"][i], nc["mean"][i], nc["covariance"][i] = mass, mean, cov
            for name in ("outflow", "max_speed", "dt"):
                nc[name][i] = getattr(s, name)
            time[i] = s.time
        nc.status = "interrupted"


def test_files_of_the_earlier_layout_read_and_resume(tmp_path):
    grid = GRIDS["run2"]
    snaps = _snapshots(grid)
    path = tmp_path / "old.nc"
    _old_layout(path, grid, snaps[:2])
    ds = io.read(path)
    assert ds["density"].dims == ("time", "x", "y") and "mean" not in ds
    assert np.array_equal(ds["density"].values[1], snaps[1].density)
    assert ds["mean_position"].dims == ("time", "dim")
    assert np.array_equal(io.resume_state(path)["density"], snaps[1].density)
    writer = io.SnapshotWriter.resume(path)
    assert writer.write(snaps[2])
    writer.close("completed", TIMES[-1])
    again = io.read(path)
    assert np.array_equal(again["density"].values[2], snaps[2].density)
    assert np.array_equal(again["mean_position"].values[2], again["mean_position"].values[2])
    assert np.isfinite(again["mean_position"].values).all()


def test_read_orders(files):
    """io.read gives tpde's [x, y, z] order (order="xyz"), or the stored CF order."""
    grid = GRIDS["run3"]
    xyz = io.read(files["run3"])
    stored = io.read(files["run3"], order="file")
    assert xyz["density"].dims == ("time", "x", "y", "z")
    assert stored["density"].dims == ("time", "z", "y", "x")
    assert xyz["density"].shape[1:] == grid.shape
    np.testing.assert_array_equal(stored["density"].values[1], xyz["density"].values[1].T)
    with xr.open_dataset(files["run3"]) as raw:
        assert raw["density"].dims == stored["density"].dims
        assert "_FillValue" not in raw["time"].encoding and raw["time"].attrs["axis"] == "T"
        assert raw["z"].attrs["positive"] == "up" and "axis" not in raw["x"].attrs


def test_summary_reads_back_as_the_table(files):
    """summary.nc is the parameter grid (phase x last); read_summary gives the run table."""
    with xr.open_dataset(files["summary"]) as grid:
        assert grid["outcome"].dims == ("scheme_reconstruction", "attention_scale")
        assert grid["attention_scale"].values.tolist() == [0.5, 1.0, 2.0]
        assert grid["scheme_reconstruction_value"].values.tolist() == ["weno5z", "muscl"]
        assert grid["outcome_code"].attrs["flag_meanings"].split()[0] == "converged"
    table = read_summary(files["summary"])
    assert table.sizes["run"] == 6
    assert table["attention.scale"].values.tolist() == [2.0, 2.0, 0.5, 0.5, 1.0, 1.0]
    assert table["scheme.reconstruction"].values.tolist() == ["weno5z", "muscl"] * 3
    assert table["outcome"].values.tolist()[:3] == ["blowup", "converged", "converged"]
