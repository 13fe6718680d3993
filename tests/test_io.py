"""Tests of tpde.io: NetCDF snapshots written, killed, resumed and read back.

Every value read back is compared bit for bit with what was written; moments with
tpde.grid.moments of the written densities. Run ``pytest -s`` to see the measured costs.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import netCDF4
import numpy as np
import pytest
import xarray as xr

import tpde
import tpde.io as tio
from tpde.grid import Grid, Positions, gaussian, moments
from tpde.io import (
    SnapshotWriter,
    grid_from_dataset,
    positions_from_dataset,
    read,
    resume_state,
)

GRIDS = {
    1: Grid([-6.1], [5.7], [50], "outflow"),
    2: Grid([-6.1, -3.3], [5.7, 4.9], [40, 28], ["periodic", "outflow"]),
    3: Grid([-4.0, -3.7, -5.3], [4.2, 3.1, 4.9], [14, 12, 10], ["noflux", "outflow", "periodic"]),
}
RECORDS = ("density", "mass", "mean_position", "covariance", "outflow", "max_speed", "dt")


def snap(
    t: float, density: np.ndarray, outflow: float = 0.0, max_speed: float = 1.0, dt: float = 0.1
) -> SimpleNamespace:
    return SimpleNamespace(time=t, density=density, outflow=outflow, max_speed=max_speed, dt=dt)


def gaussian_snaps(grid: Grid, n: int) -> list[SimpleNamespace]:
    d = grid.ndim
    out = []
    for i in range(n):
        cov = np.diag(np.linspace(0.6, 1.2, d)) * (1 + 0.2 * i)
        mean = np.linspace(-0.4, 0.3, d) + 0.1 * i
        out.append(
            snap(
                0.25 * i,
                gaussian(grid, mean, cov),
                outflow=1e-5 * i,
                max_speed=math.nan if i == 0 else 1.0 + i,
                dt=math.nan if i == 0 else 0.01 * i,
            )
        )
    return out


def write_file(path, grid: Grid, snaps, status: str = "completed", **kwargs) -> None:
    writer = SnapshotWriter(path, grid, **kwargs)
    for s in snaps:
        assert writer.write(s)
    writer.close(status, snaps[-1].time, f"{status} for the test")


def assert_records(ds: xr.Dataset, grid: Grid, snaps) -> None:
    """Every record of ds equals the snapshots (exact) and their moments."""
    assert ds.sizes["time"] == len(snaps)
    for name in RECORDS:
        assert ds[name].sizes["time"] == len(snaps), name
    np.testing.assert_array_equal(ds["time"].values, [s.time for s in snaps])
    for i, s in enumerate(snaps):
        assert np.array_equal(ds["density"].values[i], s.density)
        mass, mean, cov = moments(s.density, grid)
        assert ds["mass"].values[i] == mass
        assert np.array_equal(ds["mean_position"].values[i], mean)
        assert np.array_equal(ds["covariance"].values[i], cov)
        for name in ("outflow", "max_speed", "dt"):
            np.testing.assert_array_equal(ds[name].values[i], getattr(s, name))


# ---- round trip ---------------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 2, 3])
def test_round_trip(tmp_path, d):
    grid = GRIDS[d]
    snaps = gaussian_snaps(grid, 3)
    path = tmp_path / f"run{d}.nc"
    config = "[grid]\ncells = [1, 2]\n# 'quotes' and \"double\" and unicode µ\n"
    write_file(path, grid, snaps, config_text=config, title="round trip", history="tpde run x")
    ds = read(path)
    assert_records(ds, grid, snaps)
    names = grid.axis_names
    assert ds["density"].dims == ("time", *names)
    assert ds["mean_position"].dims == ("time", "dim")
    assert ds["covariance"].dims == ("time", "dim", "dim2")
    assert ds["dim"].values.tolist() == list(range(d))
    assert ds["dim"].attrs["flag_meanings"] == " ".join(names)
    for a, name in enumerate(names):
        coord = ds[name]
        assert np.array_equal(coord.values, grid.centres(a))
        assert coord.attrs["units"] == "1" and coord.attrs.get("axis") == {"z": "Z"}.get(name)
        assert coord.attrs["long_name"] == f"token coordinate {a + 1}"  # (xarray's label)
        assert coord.attrs["bounds"] == f"{name}_bounds"
        bounds = ds[f"{name}_bounds"]
        assert bounds.dims == (name, "nv")
        edges = grid.edges(a)
        assert np.array_equal(bounds.values[:, 0], edges[:-1])
        assert np.array_equal(bounds.values[:, 1], edges[1:])
    rebuilt = grid_from_dataset(ds)
    assert rebuilt == grid and rebuilt.boundary == grid.boundary
    for a, name in enumerate(names):
        assert np.array_equal(rebuilt.centres(a), ds[name].values)
    assert ds["time"].attrs == tio.TIME_ATTRIBUTES and "_FillValue" not in ds["time"].encoding
    for name in RECORDS:
        assert ds[name].attrs["long_name"]
    attrs = ds.attrs
    assert attrs["Conventions"] == "CF-1.10"
    assert attrs["source"] == f"tpde {tpde.__version__}"
    assert attrs["config"] == config and attrs["title"] == "round trip"
    assert attrs["status"] == "completed" and attrs["status_time"] == snaps[-1].time
    assert attrs["status_message"] == "completed for the test"
    assert "created by tpde" in attrs["history"] and attrs["history"].endswith("tpde run x")
    enc = ds["density"].encoding
    assert enc["zlib"] and enc["complevel"] == 4
    assert tuple(enc["chunksizes"]) == (1, *grid.shape)
    assert enc["dtype"] == np.float64
    with netCDF4.Dataset(path) as nc:
        assert nc.dimensions["time"].isunlimited()
        assert {k: len(v) for k, v in nc.dimensions.items() if k != "time"} == {
            "nv": 2,
            "dim": d,
            "dim2": d,
            **dict(zip(names, grid.cells, strict=True)),
        }
    print(
        f"\nd={d}: {len(snaps)} snapshots of {grid.shape} round-trip bit for bit, "
        f"file {os.path.getsize(path) / 1e3:.1f} kB"
    )


def test_ncdump_header(tmp_path):
    grid = GRIDS[2]
    path = tmp_path / "run.nc"
    write_file(path, grid, gaussian_snaps(grid, 2))
    ncdump = shutil.which("ncdump")
    if ncdump is None:
        pytest.skip("ncdump is not installed")
    header = subprocess.run(
        [ncdump, "-h", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert "Conventions" in header and "density(time, x, y)" in header


def test_solver_callback(tmp_path):
    """A real run with the writer as the Solver's on_snapshot callback."""
    from tpde.schemes.solver import Problem, Solver
    from tpde.variants import AffineVelocity

    grid = Grid([-6.0], [6.0], [64])
    path = tmp_path / "solve.nc"
    writer = SnapshotWriter(path, grid, config_text="[run]\nt_end = 0.5\n")
    problem = Problem(
        grid,
        gaussian(grid, [0.0], [[1.0]]),
        AffineVelocity(matrix=[[-0.1]], offset=[0.2]),
        t_end=0.5,
        snapshots=4,
    )
    result = Solver(problem, on_snapshot=writer).run()
    writer.close(result.status, result.status_time, result.status_message)
    ds = read(path)
    assert_records(ds, grid, result.snapshots)
    assert ds.attrs["status"] == "completed" and ds.attrs["status_time"] == 0.5


def test_write_cost(tmp_path):
    grid = Grid([-6.0, -6.0], [6.0, 6.0], [128, 128])
    density = gaussian(grid, [0.1, 0.0], np.eye(2))
    writer = SnapshotWriter(tmp_path / "cost.nc", grid)
    costs = []
    for i in range(10):
        start = time.perf_counter()
        writer.write(snap(0.1 * i, density * (1 + 1e-3 * i)))
        costs.append(time.perf_counter() - start)
    writer.close()
    start = time.perf_counter()
    for _ in range(10):
        with netCDF4.Dataset(tmp_path / "cost.nc", "a"):
            pass
    reopen = (time.perf_counter() - start) / 10
    median = float(np.median(costs))
    print(
        f"\nwrite of one 128x128 snapshot (open, append, compress, close): median "
        f"{1e3 * median:.1f} ms, max {1e3 * max(costs):.1f} ms; open+close alone "
        f"{1e3 * reopen:.2f} ms"
    )
    assert median < 0.25 and reopen < 0.05


# ---- durability -----------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from types import SimpleNamespace
    from tpde.grid import Grid
    from tpde.io import SnapshotWriter
    grid = Grid([-1.0, -2.0], [1.0, 2.0], [48, 40], "periodic")
    writer = SnapshotWriter(sys.argv[1], grid, config_text="child")
    pause = float(sys.argv[2])
    for i in range(100000):
        density = np.random.default_rng(i).random(grid.shape)
        writer.write(SimpleNamespace(time=0.5 * i, density=density, outflow=1e-3 * i,
                                     max_speed=2.0, dt=0.01))
        print(i + 1, flush=True)
        time.sleep(pause)
""")


def run_and_kill(path, pause: float, after: int, extra_delay: float = 0.0) -> int:
    """Start the writer child, SIGKILL it once it reported >= after snapshots."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(pause)], stdout=subprocess.PIPE, text=True
    )
    try:
        reported = 0
        while reported < after:
            line = proc.stdout.readline()
            assert line, f"child ended early (rc {proc.poll()})"
            reported = int(line)
        time.sleep(extra_delay)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    return reported


def check_killed_file(path) -> int:
    """The records tpde reads are complete and exact; the raw file holds at most one more,
    the last, without its time (the writer syncs a record to disk before its time: a kill
    can cut only the time, never the data of a record that has one)."""
    grid = Grid([-1.0, -2.0], [1.0, 2.0], [48, 40], "periodic")
    with xr.open_dataset(path) as raw:
        times = raw["time"].values
        assert times.size - resume_state(path)["snapshots"] in (0, 1)
        assert np.all(np.isfinite(times[:-1]))
    with read(path) as ds:
        n = ds.sizes["time"]
        assert n == resume_state(path)["snapshots"]
        for name in RECORDS:
            assert ds[name].sizes["time"] == n
        assert np.all(np.isfinite(ds["time"].values)) and np.all(np.isfinite(ds["mass"].values))
        np.testing.assert_array_equal(ds["time"].values, 0.5 * np.arange(n))
        np.testing.assert_array_equal(ds["outflow"].values, 1e-3 * np.arange(n))
        for i in range(n):
            density = np.random.default_rng(i).random(grid.shape)
            assert np.array_equal(ds["density"].values[i], density)
            assert ds["mass"].values[i] == moments(density, grid)[0]
        assert ds.attrs["status"] == "running" and ds.attrs["config"] == "child"
    return n


def test_sigkill_between_snapshots(tmp_path):
    path = tmp_path / "killed.nc"
    reported = run_and_kill(path, pause=0.05, after=3)
    n = check_killed_file(path)
    print(f"\nSIGKILL after {reported} reported snapshots: xarray reads {n} complete records")
    assert n >= reported >= 3
    assert resume_state(path)["snapshots"] == n


def test_sigkill_during_writes(tmp_path):
    """No pause: the kill lands at a random moment, often inside a write."""
    rng = np.random.default_rng(7)
    for trial in range(3):
        path = tmp_path / f"burst{trial}.nc"
        reported = run_and_kill(path, pause=0.0, after=3, extra_delay=rng.uniform(0, 0.1))
        n = check_killed_file(path)
        print(
            f"\ntrial {trial}: killed mid-burst after >= {reported} reported, "
            f"{n} complete records read"
        )
        assert n >= reported


def test_incomplete_record_is_dropped(tmp_path):
    """A record missing its time (a kill inside a write) is ignored, then overwritten."""
    grid = GRIDS[2]
    snaps = gaussian_snaps(grid, 4)
    path = tmp_path / "partial.nc"
    write_file(path, grid, snaps[:2], status="interrupted")
    with netCDF4.Dataset(path, "a") as nc:  # what a kill between density and time leaves
        nc["density"][2, ...] = snaps[3].density.T  # stored (time, y, x)
        nc["mass"][2] = 1.0
        assert len(nc.dimensions["time"]) == 3
    with xr.open_dataset(path) as raw:  # no _FillValue on time: the netCDF default fill
        assert raw.sizes["time"] == 3 and raw["time"].values[2] == tio.TIME_FILL
        assert tio.complete_records(raw["time"].values) == 2
    assert read(path).sizes["time"] == 2
    state = resume_state(path)
    assert state["snapshots"] == 2 and state["time"] == snaps[1].time
    writer = SnapshotWriter.resume(path)
    assert writer.snapshots == 2
    writer.write(snaps[2])
    writer.write(snaps[3])
    writer.close("completed", snaps[3].time)
    assert_records(read(path), grid, snaps)


# ---- resume -----------------------------------------------------------------------------------
def test_resume(tmp_path):
    grid = GRIDS[2]
    snaps = gaussian_snaps(grid, 4)
    path = tmp_path / "resume.nc"
    write_file(path, grid, snaps[:2], status="interrupted", config_text="[run]\nt_end = 0.75\n")
    first = read(path)
    assert first.attrs["status"] == "interrupted"
    state = resume_state(path)
    assert state["grid"] == grid and state["snapshots"] == 2
    assert state["time"] == snaps[1].time and state["outflow"] == snaps[1].outflow
    assert np.array_equal(state["density"], snaps[1].density)
    assert state["density"].shape == grid.shape and state["density"].dtype == np.float64
    assert state["config"] == "[run]\nt_end = 0.75\n" and state["status"] == "interrupted"
    assert state["positions"] is None and positions_from_dataset(first) is None
    np.testing.assert_array_equal(state["times"], [s.time for s in snaps[:2]])

    writer = SnapshotWriter.resume(path)
    assert writer.snapshots == 2 and writer.last_time == snaps[1].time
    assert writer.positions is None and writer.shape == grid.shape
    assert read(path).attrs["status"] == "running"
    assert writer.write(snap(snaps[1].time, snaps[1].density)) is False  # the resume point
    with pytest.raises(ValueError, match="before the last written time"):
        writer.write(snap(0.1, snaps[0].density))
    with pytest.raises(ValueError, match="shape"):
        writer.write(snap(9.0, np.zeros((3, 3))))
    assert writer.write(snaps[2]) and writer.write(snaps[3])
    writer.close("completed", snaps[3].time, "done")
    with pytest.raises(RuntimeError, match="closed"):
        writer.write(snap(9.0, snaps[0].density))

    ds = read(path)
    assert_records(ds, grid, snaps)
    for name in RECORDS:
        np.testing.assert_array_equal(ds[name].values[:2], first[name].values)
    assert ds.attrs["status"] == "completed" and ds.attrs["status_message"] == "done"
    assert "resumed by tpde" in ds.attrs["history"]
    state = resume_state(path)
    assert state["snapshots"] == 4 and state["time"] == snaps[3].time
    assert state["outflow"] == snaps[3].outflow
    assert np.array_equal(state["density"], snaps[3].density)


def test_context_manager_status(tmp_path):
    grid = GRIDS[1]
    snaps = gaussian_snaps(grid, 2)
    path = tmp_path / "ctx.nc"
    with pytest.raises(KeyboardInterrupt), SnapshotWriter(path, grid) as writer:
        writer.write(snaps[0])
        raise KeyboardInterrupt
    assert read(path).attrs["status"] == "interrupted"
    with SnapshotWriter.resume(path) as writer:
        writer.write(snaps[1])
    ds = read(path)
    assert ds.attrs["status"] == "completed" and ds.sizes["time"] == 2


def test_resume_errors(tmp_path):
    with pytest.raises(ValueError, match="^run.output: .* does not exist"):
        SnapshotWriter.resume(tmp_path / "missing.nc")
    with pytest.raises(ValueError, match="^run.output"):
        resume_state(tmp_path / "missing.nc")
    empty = tmp_path / "empty.nc"
    SnapshotWriter(empty, GRIDS[1]).close("interrupted")
    with pytest.raises(ValueError, match="no complete snapshot"):
        resume_state(empty)
    foreign = tmp_path / "foreign.nc"
    xr.Dataset({"a": ("t", [1.0])}).to_netcdf(foreign)
    with pytest.raises(ValueError, match="grid_lower"):
        SnapshotWriter.resume(foreign)
    text = tmp_path / "text.nc"
    text.write_text("not netcdf")
    start = time.perf_counter()
    with pytest.raises(ValueError, match="^run.output: cannot open"):
        SnapshotWriter.resume(text)
    assert time.perf_counter() - start < 1.0  # not mistaken for a lock


# ---- overwrite safety ----------------------------------------------------------------------
def test_existing_file_is_kept(tmp_path):
    grid = GRIDS[2]
    path = tmp_path / "out.nc"
    write_file(path, grid, gaussian_snaps(grid, 2))
    before = path.read_bytes()
    with pytest.raises(ValueError, match="--overwrite") as info:
        SnapshotWriter(path, grid)
    assert str(info.value).startswith("run.output: ") and "\n" not in str(info.value)
    assert path.read_bytes() == before

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    original = tio._create
    tio._create = broken
    try:
        with pytest.raises(tio.DiskFull, match="^run.output: disk full"):
            SnapshotWriter(path, grid, overwrite=True)
    finally:
        tio._create = original
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.nc"]

    # the replacement is staged beside the old file and moved over it by a result only
    writer = SnapshotWriter(path, GRIDS[1], overwrite=True)
    assert writer.staged and writer.file == tio.staged_name(path)
    assert path.read_bytes() == before
    writer.close("interrupted")
    assert path.read_bytes() == before and os.path.isfile(tio.staged_name(path))
    writer = SnapshotWriter(path, GRIDS[1], overwrite=True)
    writer.close("completed")
    assert read(path).sizes["time"] == 0 and grid_from_dataset(read(path)) == GRIDS[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.nc"]


def test_staged_overwrite_resumes_and_replaces_on_a_result(tmp_path):
    """An interrupted --overwrite leaves the old file and its own records beside it;
    resume continues those and replaces the old file when the run ends with a result."""
    grid = GRIDS[2]
    path = tmp_path / "out.nc"
    write_file(path, GRIDS[1], gaussian_snaps(GRIDS[1], 2))
    before = path.read_bytes()
    snaps = gaussian_snaps(grid, 4)
    writer = SnapshotWriter(path, grid, overwrite=True, config_text="new")
    with pytest.raises(tio.OutputBusy, match="another tpde process"):
        SnapshotWriter(path, grid, overwrite=True)  # one writer per output
    writer.write(snaps[0])
    writer.write(snaps[1])
    assert writer.close("interrupted", snaps[1].time, "stopped")
    assert path.read_bytes() == before
    seen = {}
    resumed = SnapshotWriter.resume(path, accept=seen.update)
    assert seen["file"] == tio.staged_name(path) and seen["config"] == "new"
    assert seen["outcome"] == tio.Outcome("interrupted", snaps[1].time, "stopped")
    assert resumed.staged and resumed.snapshots == 2 and path.read_bytes() == before
    resumed.write(snaps[2])
    resumed.write(snaps[3])
    resumed.close("completed", snaps[3].time)
    assert_records(read(path), grid, snaps)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.nc"]  # no partial, no lock
    refused = SnapshotWriter.resume  # accept may refuse: nothing changes, the lock is freed
    with pytest.raises(ValueError, match="no"):
        refused(path, accept=lambda state: (_ for _ in ()).throw(ValueError("no")))
    assert read(path).attrs["status"] == "completed"
    SnapshotWriter.resume(path).close("completed", snaps[3].time)


def test_unwritable_targets(tmp_path, monkeypatch):
    grid = GRIDS[1]
    for target, reason in [
        (tmp_path / "no" / "such" / "dir" / "out.nc", "does not exist"),
        (tmp_path, "is a directory"),
    ]:
        with pytest.raises(ValueError, match=f"^run.output: cannot write .*{reason}"):
            SnapshotWriter(target, grid)
    assert not (tmp_path / "no").exists()
    with monkeypatch.context() as m:
        m.setattr(tio.os, "access", lambda *args, **kwargs: False)
        with pytest.raises(ValueError, match="^run.output: cannot write .*not writable"):
            SnapshotWriter(tmp_path / "out.nc", grid)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only directories"
)
def test_read_only_directory(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="^run.output: cannot write"):
            SnapshotWriter(folder / "out.nc", GRIDS[1])
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)


# ---- locking --------------------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys, time, netCDF4
    nc = netCDF4.Dataset(sys.argv[1], "r")
    print("open", flush=True)
    time.sleep(float(sys.argv[2]))
    nc.close()
""")


def test_writer_waits_for_a_reader(tmp_path):
    grid = GRIDS[1]
    snaps = gaussian_snaps(grid, 2)
    path = tmp_path / "locked.nc"
    writer = SnapshotWriter(path, grid)
    writer.write(snaps[0])
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), "1.0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "open"
        writer.lock_timeout = 0.1
        with pytest.raises(RuntimeError, match="holds it open"):
            writer.write(snaps[1])
        assert writer.snapshots == 1
        writer.lock_timeout = 30.0
        start = time.perf_counter()
        assert writer.write(snaps[1])
        waited = time.perf_counter() - start
    finally:
        proc.wait()
        proc.stdout.close()
    writer.close()
    print(f"\nwriter waited {waited:.2f} s for a reader holding the file open")
    assert_records(read(path), grid, snaps)


# ---- position slices (masked attention) ------------------------------------------------------
POSITIONS = Positions(4)
SLICED_GRID = Grid([-4.0, -3.0], [4.0, 3.5], [12, 10], ["outflow", "periodic"])
SLICE_RECORDS = ("slice_mass", "slice_mean", "slice_covariance")


def sliced_snaps(n: int, empty: int | None = None) -> list[SimpleNamespace]:
    """n snapshots of shape (S, 12, 10): a Gaussian whose mean drifts with s and t; slice
    ``empty`` of the last snapshot has no mass."""
    grid = SLICED_GRID
    out = []
    for i in range(n):
        cov = np.diag([0.8, 0.5]) * (1 + 0.2 * i)
        density = POSITIONS.sliced(
            lambda s, i=i, cov=cov: gaussian(grid, [s - 0.5 + 0.1 * i, 0.3 * s], cov), grid
        )
        if empty is not None and i == n - 1:
            density[empty] = 0.0
        out.append(snap(0.25 * i, density, outflow=1e-5 * i))
    return out


def assert_sliced_records(ds: xr.Dataset, snaps) -> None:
    """Density, x-marginal moments and slice moments of ds equal the snapshots' (exact)."""
    grid, count = SLICED_GRID, POSITIONS.count
    assert ds.sizes["time"] == len(snaps)
    np.testing.assert_array_equal(ds["time"].values, [s.time for s in snaps])
    for i, s in enumerate(snaps):
        assert np.array_equal(ds["density"].values[i], s.density)
        mass, mean, cov = moments(s.density.sum(axis=0), grid)
        assert ds["mass"].values[i] == mass
        assert np.array_equal(ds["mean_position"].values[i], mean)
        assert np.array_equal(ds["covariance"].values[i], cov)
        slice_mass = POSITIONS.marginal(s.density, grid)
        assert np.array_equal(ds["slice_mass"].values[i], slice_mass)
        for k in range(count):
            mean_k, cov_k = ds["slice_mean"].values[i, k], ds["slice_covariance"].values[i, k]
            if slice_mass[k] == 0:
                assert np.isnan(mean_k).all() and np.isnan(cov_k).all()
                continue
            m, mu, sigma = moments(s.density[k], grid)  # normalised by the slice mass
            assert m == pytest.approx(slice_mass[k], rel=1e-13)
            assert np.array_equal(mean_k, mu) and np.array_equal(cov_k, sigma)
        np.testing.assert_array_equal(ds["outflow"].values[i], s.outflow)


def test_sliced_round_trip(tmp_path):
    grid, count = SLICED_GRID, POSITIONS.count
    snaps = sliced_snaps(3, empty=2)
    path = tmp_path / "sliced.nc"
    write_file(path, grid, snaps, positions=POSITIONS)
    ds = read(path)
    assert_sliced_records(ds, snaps)
    assert np.isnan(ds["slice_mean"].values[2, 2]).all()  # the empty slice
    assert ds["density"].dims == ("time", "s", "x", "y")
    assert ds["density"].shape == (3, count, 12, 10)
    assert ds["slice_mass"].dims == ("time", "s")
    assert ds["slice_mean"].dims == ("time", "s", "dim")
    assert ds["slice_covariance"].dims == ("time", "s", "dim", "dim2")
    assert ds["mean_position"].dims == ("time", "dim") and "s" not in ds["mass"].dims
    assert np.array_equal(ds["s"].values, POSITIONS.s)
    assert np.array_equal(ds["s"].values, [0.0, 0.25, 0.5, 0.75, 1.0])
    assert ds["s"].attrs["long_name"] == "token position" and ds["s"].attrs["units"] == "1"
    assert ds["s"].attrs["comment"].startswith("slice 0 is the attention sink at s = 0")
    assert ds["position_weight"].dims == ("s",)
    assert np.array_equal(ds["position_weight"].values, POSITIONS.weights)
    assert ds["position_weight"].attrs["long_name"] == "position marginal nu (mass per slice)"
    for name in SLICE_RECORDS:
        assert ds[name].attrs["long_name"] and ds[name].attrs["units"] == "1"
    # the slice masses are the invariant position marginal nu (a Gaussian well inside the box)
    np.testing.assert_allclose(ds["slice_mass"].values[0], POSITIONS.weights, rtol=1e-6)
    assert ds.attrs["positions"] == 4 and ds.attrs["sink_mass"] == 0.1
    assert ds.attrs["Conventions"] == "CF-1.10"
    assert positions_from_dataset(ds) == POSITIONS and grid_from_dataset(ds) == grid
    assert tuple(ds["density"].encoding["chunksizes"]) == (1, count, *grid.shape)
    with netCDF4.Dataset(path) as nc:
        assert len(nc.dimensions["s"]) == count and nc.dimensions["time"].isunlimited()


def test_sliced_resume(tmp_path):
    grid = SLICED_GRID
    snaps = sliced_snaps(3)
    path = tmp_path / "sliced.nc"
    write_file(path, grid, snaps[:2], status="interrupted", positions=Positions(4, 0.1))
    state = resume_state(path)
    assert state["positions"] == POSITIONS and state["snapshots"] == 2
    assert np.array_equal(state["density"], snaps[1].density)
    writer = SnapshotWriter.resume(path)
    assert writer.positions == POSITIONS and writer.shape == POSITIONS.shape(grid)
    assert "positions=Positions(slices=4" in repr(writer)
    assert writer.write(snaps[2])
    writer.close("completed", snaps[2].time)
    assert_sliced_records(read(path), snaps)


def test_sliced_shape_errors(tmp_path):
    grid = SLICED_GRID
    writer = SnapshotWriter(tmp_path / "sliced.nc", grid, positions=POSITIONS)
    density = sliced_snaps(1)[0].density
    for bad in (density[0], density[:-1], np.zeros((POSITIONS.count, 10, 12))):
        with pytest.raises(ValueError, match=r"^run\.output: .*shape") as info:
            writer.write(snap(0.0, bad))
        assert "\n" not in str(info.value)
    assert writer.snapshots == 0
    writer.close()
    with pytest.raises(ValueError, match=r"^run\.output: expected tpde\.grid\.Positions"):
        SnapshotWriter(tmp_path / "other.nc", grid, positions=4)
    assert not (tmp_path / "other.nc").exists()
    plain = xr.Dataset(attrs={"positions": 4})
    with pytest.raises(ValueError, match="^run.output: .*no sink_mass"):
        positions_from_dataset(plain)
