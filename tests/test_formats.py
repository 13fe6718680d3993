"""The files tpde writes, read by the tools users open them with (issue 17).

Every kind of output (runs in 1-D, 2-D, 3-D and with position slices, ``tpde gaussian``,
``tpde particles``, a sweep's ``summary.nc``) is opened by

* VTK's ``vtkNetCDFCFReader``, the reader behind ParaView's "NetCDF CF" option, with the
  ``Dimensions`` the user guide tells ParaView users to pick: the right time steps, extents
  and x along VTK's x axis;
* compliance-checker's ``cf:1.10`` suite: no finding of high priority except exactly the two
  about Transformer time's units (``units = "1"``) in files with a time axis. No
  representation removes them without breaking xarray (docs/user-guide.md, 'Output files
  (CF-1.10 NetCDF)'): a dimension named ``time`` must have ``standard_name = "time"`` (CF
  5.1), which must have units ``<unit> since <epoch>`` (CF 3.1, 4.4), and xarray decodes every
  ``units`` holding "since" to dates. ``test_time_units_trade_off`` shows both ways out
  failing, so the allowance goes stale the day a tool changes;
* xarray, whose ``.plot()`` puts x horizontal.

Run ``pytest -s`` to see the checker's scores. The files are small (at most 16 x 14 cells):
the module takes a few seconds beyond importing VTK.
"""

from __future__ import annotations

import json
import math
import sys
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
#: runs written another way than GRIDS' (masked in 1-D and 3-D, in the co-moving frame,
#: resumed): the ParaView default and the checker are asked of them too
MORE = {
    "masked1": GRIDS["run1"],
    "masked3": GRIDS["run3"],
    "frame": GRIDS["run2"],
    "resumed": GRIDS["run2"],
    "resumed_old": GRIDS["run2"],
}
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


def _write_run(path: Path, kind: str, grid: Grid) -> Path:
    """A run file of ``kind`` (GRIDS or MORE). ``frame``: every snapshot in a co-moving
    frame of its own; ``resumed``: interrupted after two snapshots and resumed;
    ``resumed_old``: the same, written without the cell measure (files of 0.x before it):
    the resume adds it."""
    from tpde.schemes.frame import AffineFrame

    positions = POSITIONS if kind.startswith("masked") else None
    snaps = _snapshots(grid, positions)
    if kind == "frame":
        for i, snap in enumerate(snaps):
            snap.frame = AffineFrame([0.1 * i, -0.2 * i], [[1.0 + 0.3 * i, 0.2 * i], [0.0, 0.9]])
    with pytest.MonkeyPatch.context() as patch:
        if kind == "resumed_old":
            patch.setattr(io, "_define_cell_measure", lambda *args, **kwargs: None)
        writer = io.SnapshotWriter(path, grid, config_text="x", positions=positions)
        for snap in snaps[: 2 if kind.startswith("resumed") else None]:
            writer.write(snap)
    if kind.startswith("resumed"):
        writer.close("interrupted", TIMES[1])
        writer = io.SnapshotWriter.resume(path)
        writer.write(snaps[2])
    writer.close("completed", TIMES[-1])
    return path


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
    out = {kind: _write_run(folder / f"{kind}.nc", kind, grid) for kind, grid in GRIDS.items()}
    out.update({kind: _write_run(folder / f"{kind}.nc", kind, g) for kind, g in MORE.items()})
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
def _paraview(
    path: Path, dims: tuple[str, ...] | None, off: tuple[str, ...] = ()
) -> tuple[tuple[float, ...], object]:
    """The time steps and the loaded image of ParaView's CF reader (spherical coordinates
    off) with Dimensions ``dims`` chosen, or none chosen (``None``: ParaView's default),
    and the variables ``off`` unticked."""
    vtk.vtkObject.GlobalWarningDisplayOff()
    reader = vtk.vtkNetCDFCFReader()
    reader.SetFileName(str(path))
    reader.SphericalCoordinatesOff()
    reader.UpdateMetaData()
    for name in off:
        reader.SetVariableArrayStatus(name, 0)
    reader.UpdateInformation()
    if dims is not None:
        choices = reader.GetAllDimensions()
        listed = [choices.GetValue(i) for i in range(choices.GetNumberOfValues())]
        wanted = "(" + ", ".join(dims) + ")"
        assert wanted in listed, (wanted, listed)
        reader.SetDimensions(wanted)
        reader.UpdateInformation()
    info = reader.GetOutputInformation(0)
    key = vtk.vtkStreamingDemandDrivenPipeline.TIME_STEPS()
    steps = info.Get(key) if info.Has(key) else ()
    reader.Update()
    return tuple(steps or ()), reader.GetOutput()


def _assert_loaded(steps, image, name, dims, coords) -> None:
    """``name`` loaded on ``dims`` (stored order), x along VTK's x, the file's time steps."""
    np.testing.assert_allclose(steps, coords["time"])
    assert image.GetPointData().GetArray(name) is not None
    extent = list(reversed([coords[d].size for d in dims])) + [1] * (3 - len(dims))
    assert list(image.GetDimensions()) == extent  # x first: VTK's x axis
    x = coords[dims[-1]]
    bounds = image.GetBounds()
    assert bounds[0] == pytest.approx(x.min()) and bounds[1] == pytest.approx(x.max())


@pytest.mark.parametrize("kind", KINDS)
def test_paraview_cf_reader_sees_time_extents_and_x_along_x(files, kind):
    """NetCDF CF reader, spherical coordinates off, Dimensions = the field's (e.g. "(y,
    x)"): what a ParaView user picks for the other fields of a run, and for the
    references and a sweep summary."""
    name, dims, coords = _field(files[kind])
    _assert_loaded(*_paraview(files[kind], dims), name, dims, coords)


#: every kind of file with a density whose dimensions ParaView's CF reader can load
DENSITY_KINDS = [
    *("run1", "run2", "run3", "masked", "masked1", "frame", "resumed", "resumed_old"),
    *("gaussian", "particles", "particles_masked"),
]


@pytest.mark.parametrize("kind", DENSITY_KINDS)
def test_paraview_default_dimensions_load_the_density(files, kind):
    """The user guide's ParaView recipe: open with the CF reader, untick spherical
    coordinates, Apply. With no Dimensions chosen the reader loads those of the first
    variable by name, which is the cell measure (``cell_length(x)``, ``cell_area(y, x)``,
    ``cell_volume(z, y, x)``; ``(s, ...)`` with positions), on the density's dimensions;
    it held h_x h_y.. (the frame's xi cells in the co-moving frame: the comment says so)."""
    path = files[kind]
    name, dims, coords = _field(path)
    steps, image = _paraview(path, None)
    _assert_loaded(steps, image, name, dims, coords)
    with xr.open_dataset(path) as ds:
        grid = io.grid_from_dataset(ds)
        measure = io.CELL_MEASURES[grid.ndim]
        assert sorted(str(n) for n in ds.data_vars)[0] == measure
    with netCDF4.Dataset(path) as nc:
        assert nc[measure].dimensions == dims
        area = np.asarray(nc[measure][:])
        assert ("frame_jacobian" in nc[measure].comment) == (kind == "frame")
        rho = np.asarray(nc["density"][-1])
    np.testing.assert_array_equal(area, np.full(area.shape, grid.cell_volume))
    assert float(np.sum(rho * area)) == pytest.approx(rho.sum() * grid.cell_volume)


def test_paraview_default_of_a_3d_masked_run_is_the_grid(files):
    """A 3-D masked density ``(time, s, z, y, x)`` has four dimensions besides time, which
    the reader loads under no choice (it fails on them, ticked, whatever the Dimensions):
    with ``density`` unticked the default is ``cell_volume(z, y, x)``, the grid, rather
    than the moments' ``(dim, dim2)``."""
    _, _, coords = _field(files["masked3"])
    steps, image = _paraview(files["masked3"], None, off=("density",))
    _assert_loaded(steps, image, "cell_volume", ("z", "y", "x"), coords)
    assert image.GetPointData().GetArray("density") is None


# ---- the CF checker -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checker():
    runner = pytest.importorskip("compliance_checker.runner")
    runner.CheckSuite.load_all_available_checkers()
    return runner.CheckSuite()


def _check(checker, path: Path) -> tuple[str, list[str], list[str]]:
    """The cf:1.10 score ("scored/possible"), its high and its medium findings."""
    dataset = checker.load_dataset(str(path))
    groups, errors = checker.run_all(dataset, ["cf:1.10"], skip_checks=[])["cf:1.10"]
    assert not errors  # no check crashed (variable-length strings did)
    report = checker.build_structure("cf:1.10", groups, str(path), limit=1)
    high = [m for group in report["high_priorities"] for m in group.msgs]
    medium = [m for group in report["medium_priorities"] for m in group.msgs]
    return f"{report['scored_points']}/{report['possible_points']}", high, medium


@pytest.mark.parametrize("kind", KINDS + list(MORE))
def test_cf_checker_finds_nothing_but_time_units(files, checker, kind):
    score, high, medium = _check(checker, files[kind])
    print(f"\n{kind}: cf:1.10 {score}, {len(high)} high, {len(medium)} medium")
    assert sorted(high) == sorted(TIME_UNITS if kind != "summary" else ()), high
    # the cell measure's only finding is the density's: in 3-D, (z, y, x) "not in the
    # order T, Z, Y, X", since x and y have no axis (CF tools read X/Y as lon/lat)
    measure = [m for m in medium if m.startswith("cell_")]
    assert all("not in the recommended order" in m and "z (Z)" in m for m in measure), measure


def _retimed(source: Path, target: Path, units: str, drop: tuple[str, ...] = ()) -> Path:
    target.write_bytes(source.read_bytes())
    with netCDF4.Dataset(target, "a") as nc:
        for name in drop:
            nc["time"].delncattr(name)
        nc["time"].units = units
    return target


def test_time_units_trade_off(files, checker, tmp_path):
    """Why two findings stay: each way to remove them breaks xarray or adds findings.

    Calendar units (``days since 0001-01-01``) satisfy the checker, but xarray decodes
    Transformer time into dates. Units xarray and VTK take as a plain number with time steps
    (``1 after 0``: VTK reads " after " as a time axis, xarray only decodes "since") need
    ``standard_name`` and ``axis`` gone (the 4.4 check refuses "after"), and then CF 5.1
    asks the dimension ``time`` for ``standard_name = "time"``, once per field. (``days
    Since 0001-01-01`` passes all three only because xarray's test for "since" is
    case-sensitive; the units would still say days since year 1, which cftime reads as
    dates: not used.)"""
    before = tmp_path / "before.nc"
    _old_layout(before, GRIDS["run2"], _snapshots(GRIDS["run2"]))
    scores = {"before issue 17": _check(checker, before)[0]}
    scores["now"], high, _ = _check(checker, files["run2"])
    assert sorted(high) == sorted(TIME_UNITS)

    dated = _retimed(files["run2"], tmp_path / "dated.nc", "days since 0001-01-01")
    scores["calendar units"], high, _ = _check(checker, dated)
    assert high == []
    with pytest.warns(Warning), xr.open_dataset(dated) as ds:  # cftime dates (year 1)
        assert ds["time"].dtype.kind != "f"

    plain = _retimed(files["run2"], tmp_path / "plain.nc", "1 after 0", ("standard_name", "axis"))
    scores["no standard_name"], high, _ = _check(checker, plain)
    assert high and set(high) == {
        "Coordinate variable 'time' should have standard_name='time', found: 'None'"
    }
    with xr.open_dataset(plain) as ds:
        assert ds["time"].dtype.kind == "f"
    print("\nrun2 cf:1.10 " + ", ".join(f"{k}: {v}" for k, v in scores.items()))


# ---- chunks ---------------------------------------------------------------------------------
def test_density_chunks_are_one_snapshot_and_spatial_tiles(tmp_path):
    """A time series reads one tile per snapshot (benchmarks/chunking.py times it), and a
    snapshot only adds chunks: none holds two snapshots, so an append never rewrites one."""
    assert io.SPATIAL_CHUNK_VALUES == 4096
    assert io.spatial_chunks([12, 16], 2) == (1, 12, 16)  # a small slab stays whole
    assert io.spatial_chunks([130, 150], 2) == (1, 64, 64)
    assert io.spatial_chunks([5, 40, 30, 20], 3) == (1, 1, 16, 16, 16)  # one slice per chunk
    assert io.spatial_chunks([5, 12, 16], 2) == (1, 5, 12, 16)  # ... or all that fit
    assert io.spatial_chunks([9, 30, 30], 2) == (1, 4, 30, 30)
    assert io.spatial_chunks([9000], 1) == (1, 4096)
    grid = Grid([-8.0, -7.0], [8.0, 7.0], [150, 130])
    path = tmp_path / "tiles.nc"
    writer = io.SnapshotWriter(path, grid)
    snaps = _snapshots(grid)
    for snap in snaps:
        writer.write(snap)
    writer.close("completed", TIMES[-1])
    with netCDF4.Dataset(path) as nc:
        assert nc["density"].chunking() == [1, 64, 64]
    with xr.open_dataset(path, chunks={"time": 16}) as ds:  # the user guide's dask advice
        assert ds["density"].chunks == ((3,), (64, 64, 2), (64, 64, 22))
        series = ds["density"].isel(y=70, x=40).values
    np.testing.assert_array_equal(series, [s.density[40, 70] for s in snaps])


# ---- Zarr -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["run3", "masked"])
def test_zarr_store_is_the_netcdf_file(files, tmp_path, kind):
    """xr.open_zarr of the store gives the Dataset xr.open_dataset gives of the .nc."""
    pytest.importorskip("zarr")
    source = tmp_path / "copy.nc"
    source.write_bytes(files[kind].read_bytes())
    store = io.netcdf_to_zarr(source, tmp_path / "run.zarr")
    assert not source.exists()
    with xr.open_dataset(files[kind]) as nc, xr.open_zarr(store) as zarr:
        assert zarr.identical(nc)
        assert zarr["density"].encoding["chunks"] == nc["density"].encoding["chunksizes"]
    assert io.read(store).identical(io.read(files[kind]))


def test_io_write_of_a_python_result_to_zarr(tmp_path):
    pytest.importorskip("zarr")
    from tpde.schemes.solver import Problem, Solver
    from tpde.variants.prescribed import AffineVelocity

    grid = GRIDS["run2"]
    rho = gaussian(grid, [0.3, -0.2], [[0.6, 0.1], [0.1, 0.4]])
    velocity = AffineVelocity([[-0.3, 0.2], [0.0, -0.1]], [0.1, 0.0])
    result = Solver(Problem(grid, rho, velocity, 0.2, snapshots=3)).run()
    nc = io.write(result, tmp_path / "python.nc", config_text="python")
    store = io.write(result, tmp_path / "python.zarr", config_text="python")
    with xr.open_dataset(nc) as a, xr.open_zarr(store) as b:
        # (history holds the time of writing, to the second)
        assert b.assign_attrs(history="").identical(a.assign_attrs(history=""))
    with pytest.raises(io.OutputError, match="exists; pass --overwrite"):
        io.write(result, store)


def test_tpde_run_writes_zarr(tmp_path, capsys, monkeypatch):
    pytest.importorskip("zarr")
    from tpde.cli import main

    config = tmp_path / "run.toml"
    config.write_text(dumps(CONFIG))
    nc, store = tmp_path / "run.nc", tmp_path / "run.zarr"
    assert main(["run", str(config), "-o", str(nc), "--quiet"]) == 0
    assert main(["run", str(config), "-o", str(store), "--quiet"]) == 0
    assert store.is_dir() and not Path(io.zarr_staging(store)).exists()
    with xr.open_dataset(nc) as a, xr.open_zarr(store) as b:
        assert sorted(b.variables) == sorted(a.variables)
        for name in a.variables:
            stored = b[name].variable
            assert stored.identical(a[name].variable.copy(data=stored.values)), name
            np.testing.assert_allclose(stored.values, a[name].values, rtol=1e-13, atol=0)
        per_run = {"history", "wall_time"}  # when and how long each run took
        kept = [
            xr.Dataset(attrs={k: v for k, v in x.attrs.items() if k not in per_run}) for x in (a, b)
        ]
        assert kept[1].identical(kept[0])
        assert b.attrs["status"] == "completed"
    assert main(["info", str(store)]) == 0 and main(["plot", str(store), "-o", str(tmp_path)]) == 0
    assert "grid run" in capsys.readouterr().out
    refusals = {
        "--resume": "--resume of a Zarr output",
        "": "exists; pass --overwrite",
    }
    for flag, said in refusals.items():
        assert main(["run", str(config), "-o", str(store), "--quiet", *[flag][: bool(flag)]]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    assert main(["run", str(config), "-o", str(tmp_path / "loud.zarr")]) == 0  # (not --quiet)
    assert "loud.zarr: status completed" in capsys.readouterr().err
    before = (store / "density").stat().st_mtime_ns
    assert main(["run", str(config), "-o", str(store), "--quiet", "--overwrite"]) == 0
    assert (store / "density").stat().st_mtime_ns != before
    capsys.readouterr()  # that run's warnings (--quiet keeps them) are not the next line
    monkeypatch.setitem(sys.modules, "zarr", None)  # zarr not installed
    assert main(["run", str(config), "-o", str(tmp_path / "other.zarr"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'tpde[zarr]'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "other.zarr").exists()


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


# ---- tpde info, plot and compare on every file ------------------------------------------------
def drawn_texts(fig) -> list[tuple[str, object]]:
    """(text, window box) of what a drawn figure shows: figure and subfigure titles, axes
    titles and labels, the tick labels inside the view, legends (one box each)."""
    renderer = fig.canvas.get_renderer()
    items: list[tuple[str, object]] = []
    seen: set[int] = set()

    def add(artist, name=None) -> None:
        if artist is None or not artist.get_visible() or id(artist) in seen:
            return
        seen.add(id(artist))
        if hasattr(artist, "get_text") and not artist.get_text().strip():
            return
        box = artist.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            items.append((name or artist.get_text(), box))

    for figure in (fig, *fig.subfigs):
        add(getattr(figure, "_suptitle", None))
        for text in figure.texts:
            add(text)
    for ax in fig.get_axes():
        if not ax.get_visible():
            continue
        for text in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label):
            add(text)
        for text in ax.texts:
            add(text)
        for axis in (ax.xaxis, ax.yaxis) if ax.axison else ():
            for tick in axis._update_ticks():  # the ticks inside the view
                for label in (tick.label1, tick.label2):
                    if tick.get_visible():
                        add(label)
            add(axis.offsetText)
        add(ax.get_legend(), "legend")
    return items


def text_problems(fig) -> list[str]:
    """Texts of ``fig`` that overlap one another or leave the figure."""
    fig.canvas.draw()
    fig.canvas.draw()  # (the compressed layout settles in a second pass, as savefig does)
    width, height = fig.bbox.width, fig.bbox.height
    items = drawn_texts(fig)
    found = []
    for name, box in items:
        if box.x0 < -0.5 or box.y0 < -0.5 or box.x1 > width + 0.5 or box.y1 > height + 0.5:
            found.append(f"outside the figure: {name!r}")
    for i, (a, box_a) in enumerate(items):
        for b, box_b in items[i + 1 :]:
            dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if dx > 0.5 and dy > 0.5:
                found.append(f"overlap: {a!r} / {b!r}")
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_tpde_info_and_plot_read_every_file(files, kind, tmp_path, capsys):
    from tpde.cli import main

    assert main(["info", str(files[kind])]) == 0
    said = capsys.readouterr().out
    assert str(files[kind]) in said.splitlines()[0]
    if kind == "summary":
        assert "sweep summary, 6 runs" in said and "attention.scale: 3 values" in said
    else:
        expected = {"gaussian": "Gaussian ODE", "particles": "token system"}
        assert expected.get(kind.split("_")[0], "grid run") in said and "written by tpde" in said
    out = tmp_path / "figures"
    assert main(["plot", str(files[kind]), "-o", str(out), "--title", "T"]) == 0
    written = capsys.readouterr().out.split()
    assert written and all(Path(p).is_file() and Path(p).stat().st_size > 5000 for p in written)
    if kind == "summary":
        assert [Path(p).name for p in written] == ["phase.png"]


def _matching_run(path: Path, reference: Path) -> Path:
    """A run file on the references' grid and times (the ODE's densities, slightly moved)."""
    ds = io.read(reference)
    grid = io.grid_from_dataset(ds)
    writer = io.SnapshotWriter(path, grid, config_text=ds.attrs["config"])
    for i, t in enumerate(ds["time"].values):
        rho = np.roll(ds["density"].values[i], 1, axis=0)
        writer.write(SimpleNamespace(time=t, density=rho, outflow=0.0, max_speed=1.0, dt=0.1))
    writer.close("completed", float(ds["time"].values[-1]))
    return path


def test_tpde_compare_draws_run_tokens_and_ode(files, tmp_path, capsys):
    from tpde.cli import main
    from tpde.plots import compare_figure

    run = _matching_run(tmp_path / "run.nc", files["gaussian"])
    target = tmp_path / "compare.png"
    args = ["compare", str(run), str(files["gaussian"]), str(files["particles"])]
    assert main([*args, "-o", str(target), "--log", "--title", "c1"]) == 0
    assert target.stat().st_size > 20_000
    assert main(["compare", str(run), str(files["run2"])]) == 2  # a run is not a reference
    assert main(["compare", str(files["run2"]), str(files["gaussian"])]) == 2  # another grid
    capsys.readouterr()
    fig = compare_figure(run, files["particles"], files["gaussian"])
    assert text_problems(fig) == []
    w_axes = [ax for ax in fig.get_axes() if ax.get_title() == "W2 distance to the grid run"]
    curves = {line.get_label(): line.get_ydata() for line in w_axes[0].lines}
    assert set(curves) == {"tokens - grid", "Gaussian ODE - grid"}
    assert all(np.all(np.asarray(v) > 0) for v in curves.values())


def test_reference_curves_stop_where_the_reference_does(files):
    """A reference that ended early (a blow-up) draws nothing after its last time."""
    from tpde.plots import compare_figure, density_figure

    with xr.open_dataset(files["gaussian"]) as full:
        cut = full.isel(time=slice(0, 2)).load()  # the ODE "blew up" after its 2nd time
    last = float(cut["time"].values[-1])
    reference = {
        "time": cut["time"].values,
        "mean": cut["mean_position"].values,
        "covariance": cut["covariance"].values,
    }
    fig = density_figure(files["gaussian"], reference=reference)
    images = [ax for ax in fig.get_axes() if ax.get_title().startswith("t = ")]
    times = [float(ax.get_title()[4:]) for ax in images]
    assert [len(ax.lines) > 0 for ax in images] == [t <= last for t in times]
    fig = compare_figure(files["gaussian"], gaussian=cut)
    for ax in fig.get_axes():
        for line in ax.lines:
            if line.get_label().startswith("Gaussian ODE"):
                assert np.max(line.get_xdata()) <= last
    assert any("no snapshot at t" in t.get_text() for ax in fig.get_axes() for t in ax.texts)


def test_plot_options_and_no_overlapping_text(files):
    from matplotlib.colors import LogNorm

    from tpde.plots import (
        density_figure,
        energies_figure,
        moments_figure,
        plot_all,
        projection_figure,
    )
    from tpde.sweep import plot_phase

    grid = Grid([-5.5, -5.5], [5.5, 5.5], [40, 40])
    five = xr.Dataset(
        {
            "density": (
                ("time", "y", "x"),
                np.stack([gaussian(grid, [0, 0], np.eye(2) * (1 - 0.1 * i)).T for i in range(7)]),
            )
        },
        coords={"time": np.linspace(0, 6, 7), "x": grid.centres(0), "y": grid.centres(1)},
        attrs={"title": "tpde run"},
    )  # the shape of the README's E2 figure, whose title and x labels collided
    fig = density_figure(five, log=True, vmax=1.0, title="a long title " * 4)
    assert text_problems(fig) == []
    norm = next(ax for ax in fig.get_axes() if ax.collections).collections[0].norm
    assert isinstance(norm, LogNorm) and (norm.vmin, norm.vmax) == (1e-6, 1.0)
    assert fig.get_suptitle().startswith("a long title")
    fig = density_figure(files["run2"], times=[0.25], vmin=0.01, vmax=0.2)
    mesh = next(ax for ax in fig.get_axes() if ax.collections).collections[0]
    assert (mesh.norm.vmin, mesh.norm.vmax) == (0.01, 0.2)
    assert [ax.get_title() for ax in fig.get_axes() if ax.get_title()] == ["t = 0.25"]
    with pytest.raises(ValueError, match="vmin must be below vmax"):
        density_figure(files["run2"], vmin=1.0, vmax=0.5)
    for make in (
        lambda: density_figure(files["run3"]),
        lambda: density_figure(files["run1"], log=True),
        lambda: projection_figure(files["run3"]),
        lambda: moments_figure(files["particles"]),
    ):
        assert text_problems(make()) == []
    energetic = Path(files["masked"]).parent / "energies.nc"  # energies are drawn too
    grid = GRIDS["run2"]
    writer = io.SnapshotWriter(energetic, grid, energies=lambda rho, t: {"toy": 1.0 - t})
    for snap in _snapshots(grid):
        writer.write(snap)
    writer.close("completed", TIMES[-1])
    assert text_problems(energies_figure(energetic)) == []
    written = plot_all(energetic, energetic.parent / "energies_figures")
    assert "energies.png" in [p.name for p in written]
    phase = plot_phase(read_summary(files["summary"]), Path(files["summary"]).with_suffix(".png"))
    assert phase.is_file()
