"""NetCDF output of runs: writing snapshots as they come, reading back, resuming.

The format is described in docs/user-guide.md, 'Output files (CF-1.10 NetCDF)'.

File layout (NetCDF4/HDF5, CF-1.10), for a grid of d axes and N snapshots::

    dimensions : time (unlimited, N), [z,] [y,] x (grid.cells), dim = dim2 = d, nv = 2
    coordinates: time(time), x(x) [y(y), z(z)] cell centres, x_bounds(x, nv) cell edges, ...,
                 dim(dim), dim2(dim2) integer codes 0 .. d-1 (flag_meanings "x y z")
    variables  : cell_length(x) | cell_area(y, x) | cell_volume(z, y, x)  the cells' measure
                 h_x [h_y [h_z]] (static, written at creation; named to sort first, so
                 ParaView's CF reader opens the density's dimensions by default)
                 density(time, [z,] [y,] x)   float64, zlib level 4, chunks of one snapshot
                 and spatial tiles of about SPATIAL_CHUNK_VALUES values (spatial_chunks)
                 mass(time), mean_position(time, dim), covariance(time, dim, dim2)
                 (tpde.grid.moments), outflow(time) (cumulative mass that left the box),
                 max_speed(time), dt(time)
    attributes : Conventions, title, history, source, tpde_version, config (the resolved
                 TOML), status, status_time, status_message, status_reason (the typed
                 cause of an ``error``: :data:`ERROR_REASONS`), grid_lower, grid_upper,
                 grid_cells, grid_boundary; at close threads, steps, rejected_steps,
                 wall_time (the counters of every run segment, summed over resumes)

Axis order. Fields are stored in CF's T, Z, Y, X order, x fastest (the order ParaView's CF
reader, ncview, Panoply and ``xarray.DataArray.plot`` take as horizontal = x), while tpde's
arrays are indexed ``[x, y, z]``: the writer transposes the spatial axes of every field on
write (:func:`_to_file`), and :func:`read`, :func:`resume_state` and the resumed writer
transpose them back by dimension name, so a variable added later with spatial dimensions
(the co-moving frame's physical coordinates as CF auxiliary coordinates, say
``position_x(time, [z,] [y,] x)`` next to ``frame_mean(time, dim)`` and
``frame_matrix(time, dim, dim2)``) needs no reader change. ``time`` is Transformer time (the
layer depth): ``standard_name = "time"``, ``axis = "T"``, ``units = "1"`` (xarray leaves it
a number; CF's calendar-time units would decode it to dates) and no ``_FillValue`` (CF
forbids one on a coordinate): a record not yet written reads as the netCDF default fill
value, which :func:`complete_records` treats like NaN. ``x`` and ``y`` have no ``axis``
attribute (CF tools read ``axis = "X"/"Y"`` as longitude/latitude and then ask for
degrees); ``z`` has ``axis = "Z"`` and ``positive = "up"``. Files written before this layout
(``density(time, x, y)``, ``mean``) are read the same way: ``mean`` reads as
``mean_position`` (``mean`` shadows ``xarray.Dataset.mean``).

Masked (causal) attention adds the position coordinate s (``positions=`` a
:class:`tpde.grid.Positions` with ``S = positions.count = slices + 1``)::

    dimensions : s (S)
    coordinates: s(s) positions 0, 1/slices, .., 1 (slice 0 is the attention sink at s = 0;
                 slice k stands for the positions in ((k-1)/slices, k/slices])
    variables  : position_weight(s)  nu-mass of each slice (Positions.weights, sums to 1)
                 cell_length(s, x) | cell_area(s, y, x)  the cell measure, the same for every
                 slice (3-D: cell_volume(z, y, x); ParaView's reader loads at most three)
                 density(time, s, [z,] [y,] x)  slice k: cell averages of the joint density
                 mass, mean_position, covariance  of the x-marginal (density summed over s)
                 slice_mass(time, s), slice_mean(time, s, dim),
                 slice_covariance(time, s, dim, dim2)  moments of each slice, normalised by
                 its mass (NaN for a slice without mass)
    attributes : positions (int, slices), sink_mass (float)

Files without positions have none of these (:func:`positions_from_dataset` gives None).

Energies (``energies=`` a callable ``(density, t) -> {name: value}``, :mod:`tpde.variants.energies`;
tpde.run passes :func:`tpde.variants.energies.run_energies`)::

    variables  : energy_<name>(time)  one per energy, created at the first snapshot, with the
                 attributes long_name, formula, units and monotone ("increasing",
                 "decreasing" or "none": what the theory says along the run)
    attributes : energies (str), the comma-separated names (empty when none applies)

Durability. :class:`SnapshotWriter` keeps the file *closed* between snapshots: each
:meth:`SnapshotWriter.write` opens it in append mode, writes one record and closes it (a few
milliseconds). An HDF5 file that is open for writing can be left unreadable by a kill, a closed
one cannot, so a process killed at any moment outside those milliseconds leaves a file that
``xarray.open_dataset`` reads with every completed snapshot. Within one record the data
variables are written first and ``time`` last; float record variables have ``_FillValue =
NaN`` and times must be finite, so a record whose ``time`` is NaN is *incomplete*:
:func:`read`, :func:`resume_state` and :meth:`SnapshotWriter.resume` ignore a trailing
incomplete record (the resumed writer overwrites it).

Locking. HDF5 locks a file while it is open, so a writer cannot append while another process
holds the file open (e.g. an ``xarray.open_dataset`` that was never closed); the writer then
retries for ``lock_timeout`` seconds before it raises. :func:`read` loads and closes at once.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import math
import os
import time as _time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Self

import netCDF4
import numpy as np
import xarray as xr

import tpde
from tpde.grid import Grid, Positions, moments, profile

from . import geometries

try:
    import fcntl
except ImportError:  # not POSIX: treat every failed open as a lock and retry
    fcntl = None  # type: ignore[assignment]  # (every use checks for None first)

__all__ = [
    "CELL_MEASURES",
    "CONVENTIONS",
    "COUNTERS",
    "ERROR_REASONS",
    "MEAN",
    "OUTCOMES",
    "RESULTS",
    "TIME_ATTRIBUTES",
    "TIME_FILL",
    "ZARR_EXTRA",
    "DiskFull",
    "Outcome",
    "OutputBusy",
    "OutputError",
    "OutputWriter",
    "Record",
    "Reopened",
    "SnapshotLike",
    "SnapshotWriter",
    "cell_measure",
    "check_zarr_output",
    "complete_records",
    "coordinates",
    "file_order",
    "global_attributes",
    "grid_from_dataset",
    "is_zarr",
    "netcdf_to_zarr",
    "open_output",
    "outcome",
    "physical_density",
    "positions_from_dataset",
    "read",
    "renamed",
    "reopen_output",
    "reordered",
    "resume_state",
    "staged_name",
    "to_dataset",
    "to_netcdf",
    "write",
    "xyz_order",
    "zarr_staging",
]

CONVENTIONS = "CF-1.10"
#: the values of an energy record's ``monotone`` attribute (tpde.variants.energies.MONOTONE)
ENERGY_MONOTONE = ("increasing", "decreasing", "none")
AXES = ("x", "y", "z")
LOCK_TIMEOUT = 60.0
_TIME_CHUNK = 256
_RECORD_CHUNK_VALUES = 8192  # at most this many values (64 KiB) per chunk of a moment record
#: values per chunk of a spatial record (density, physical_<axis>): one snapshot per chunk,
#: cut into tiles of about this many values (32 KiB), so a cell's or a line's time series
#: reads one tile per snapshot instead of the whole file (benchmarks/chunking.py)
SPATIAL_CHUNK_VALUES = 4096
_CHUNK_INDEX_BYTES = 128  # an HDF5 chunk-index entry (48 bytes in 3-D) and its node's share
S_COMMENT = "slice 0 is the attention sink at s = 0; slice k stands for positions in ((k-1)/N, k/N]"
MARGINAL_COMMENT = "of the x-marginal (density summed over s)"
#: the record of the mean (``mean`` would shadow ``xarray.Dataset.mean``: ``ds.mean.plot()``)
MEAN = "mean_position"
#: names of files written before the current layout -> the names :func:`read` gives them
RENAMED = {"mean": MEAN}
#: the time coordinate: Transformer time is the layer depth, a plain number (docstring)
TIME_ATTRIBUTES = {
    "standard_name": "time",
    "axis": "T",
    "units": "1",
    "long_name": "layer depth (Transformer time)",
}
#: what ``time`` holds in a record not yet written (no _FillValue: the netCDF default)
TIME_FILL = float(netCDF4.default_fillvals["f8"])

_LONG_NAMES = {
    "density": "token density (cell averages)",
    "mass": "mass in the box",
    MEAN: "mean position of the density",
    "covariance": "covariance of the density",
    "outflow": "cumulative mass that left the box",
    "max_speed": "largest face velocity of the last step",
    "dt": "last time step",
    "slice_mass": "mass of each position slice",
    "slice_mean": "mean of each position slice",
    "slice_covariance": "covariance of each position slice",
    "frame_mean": "co-moving frame: origin m",
    "frame_matrix": "co-moving frame: matrix L",
    "frame_jacobian": "co-moving frame: |det L|",
}
#: the detail of a record beyond its short long_name (xarray's plots label an axis with the
#: long_name: a long one was clipped)
_COMMENTS = {
    "slice_mean": "normalised by the slice's mass",
    "slice_covariance": "normalised by the slice's mass",
    "frame_mean": "origin m of the frame map x = m + L xi",
    "frame_matrix": "matrix L of the frame map x = m + L xi",
    "frame_jacobian": "|det L| of x = m + L xi: physical density = density / frame_jacobian",
}
#: the physical coordinate of every cell centre in the co-moving frame, per axis
PHYSICAL = "physical_"
#: ``density``'s attributes in a co-moving-frame file: it is mass per frame volume
FRAME_DENSITY_ATTRIBUTES = {
    "long_name": "density per frame-coordinate volume",
    "comment": "cell averages in the frame coordinates xi of x = m + L xi; the physical "
    "density is density / frame_jacobian (tpde.io.physical_density)",
}
#: where an energy record's theory is told (its ``comment``)
ENERGY_COMMENT = (
    "docs/theory.md, 'Gradient flows and energies' and 'Energies and Lyapunov functions'"
)
#: the attributes of :func:`physical_density`
PHYSICAL_DENSITY_ATTRIBUTES = {
    "long_name": "token density (physical space)",
    "comment": "density / frame_jacobian: mass per unit physical volume, at the cell "
    "centres physical_<axis> (x = m + L xi)",
}
#: the static measure of the density's cells, by the grid's dimension (:func:`_define_cell_measure`)
CELL_MEASURES = {1: "cell_length", 2: "cell_area", 3: "cell_volume"}
_CELL_MEASURE_COMMENT = (
    "h_x{} of the grid: mass = sum(density * {}). Not a CF cell_measures variable (CF asks "
    "m2 or m3 of those; token coordinates are dimensionless). Named to sort first: "
    "ParaView's CF reader opens the first variable's dimensions by default"
)
_CELL_MEASURE_SLICES = ", the density's. The same for every position slice s"
_CELL_MEASURE_4D = ". (The density's (s, z, y, x) are four: that reader does not load them)"
_CELL_MEASURE_FRAME = (
    ". Cells of the co-moving frame's coordinates xi (the grid), in which the density is "
    "stored: a cell's physical measure is this times frame_jacobian (|det L|, per time)"
)


#: ``(density, t) -> {name: float or tpde.variants.energies.Energy}``, evaluated at every snapshot
EnergyCallable = Callable[[np.ndarray, float], Mapping[str, Any]]


class SnapshotLike(Protocol):
    """What :meth:`SnapshotWriter.write` reads (``tpde.schemes.solver.Snapshot`` fits)."""

    time: float
    density: np.ndarray
    outflow: float
    max_speed: float
    dt: float


@dataclass(frozen=True)
class Record:
    """A snapshot as :class:`SnapshotWriter` stores it, read once at its entry
    (:meth:`of`): the fields of :class:`SnapshotLike` and the optional ones of
    ``tpde.schemes.solver.Snapshot``: ``frame`` (a co-moving frame: the moments are
    mapped back through it), ``atoms`` and ``next_atom_id`` (tpde.atoms_io), ``step`` (the
    solver's step count, recorded for a resume). A SnapshotLike without them (one built in
    Python, a ``SimpleNamespace``) has no frame, no atoms and no step."""

    time: float
    density: np.ndarray
    outflow: float
    max_speed: float
    dt: float
    frame: Any = None
    atoms: Any = None
    next_atom_id: int = 0
    step: int | None = None

    @classmethod
    def of(cls, snapshot: SnapshotLike) -> Record:
        """The Record of ``snapshot`` (the one place its optional members are looked up)."""
        step = getattr(snapshot, "step", None)
        return cls(
            snapshot.time,
            snapshot.density,
            snapshot.outflow,
            snapshot.max_speed,
            snapshot.dt,
            frame=getattr(snapshot, "frame", None),
            atoms=getattr(snapshot, "atoms", None),
            next_atom_id=int(getattr(snapshot, "next_atom_id", 0) or 0),
            step=int(step) if isinstance(step, int | np.integer) else None,
        )


# ---- how a run ends ----------------------------------------------------------------------------
#: statuses that are results of the dynamics: the run reached its end (``completed``) or
#: stopped for a physical reason; a resume refuses them, an overwrite publishes them
RESULTS = ("completed", "mass_left_domain", "box_limited", "blowup", "under_resolved")
#: every status a finished writer records: the results, ``interrupted`` (SIGINT, SIGTERM,
#: SIGHUP: ``status_time`` is the last complete snapshot) and ``error`` (any exception)
OUTCOMES = (*RESULTS, "interrupted", "error")
#: the status of a file while it is written (left as is by SIGKILL or a power cut)
RUNNING = "running"
#: why a run ended with status ``error`` (the file's ``status_reason``; "" for every other
#: status): the numerics failed (tpde.schemes.solver.FAILURE_REASONS: a non-finite value,
#: ``max_steps``, a fixed step above the positivity bound, a step size collapse), the
#: config, the output or the disk refused, memory ran out, or another exception. Typed, so
#: that a sweep maps it without reading the message (which is for people).
ERROR_REASONS = (
    "non_finite",
    "max_steps",
    "step_bound",
    "step_collapse",
    "config",
    "output",
    "disk_full",
    "memory",
    "exception",
)


@dataclass(frozen=True)
class Outcome:
    """How a run ended, as stored in the file's ``status``, ``status_time``,
    ``status_message`` and ``status_reason`` attributes (``status`` one of
    :data:`OUTCOMES`, or ``running``; ``reason`` one of :data:`ERROR_REASONS` for an
    ``error``, where "" reads as ``exception``, and "" for every other status)."""

    status: str
    time: float = math.nan
    message: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        if self.status not in (*OUTCOMES, RUNNING):
            raise ValueError(
                f"run.output: status {self.status!r} is not one of {', '.join(OUTCOMES)}"
            )
        reason = str(self.reason) or ("exception" if self.status == "error" else "")
        if self.status != "error" and reason:
            raise ValueError(f"run.output: a reason ({reason!r}) goes with status error only")
        if self.status == "error" and reason not in ERROR_REASONS:
            raise ValueError(
                f"run.output: reason {reason!r} is not one of {', '.join(ERROR_REASONS)}"
            )
        object.__setattr__(self, "time", float(self.time))
        object.__setattr__(self, "message", " ".join(str(self.message).split()))
        object.__setattr__(self, "reason", reason)

    @property
    def result(self) -> bool:
        """Whether the status is a result of the dynamics (:data:`RESULTS`)."""
        return self.status in RESULTS

    @classmethod
    def from_attributes(cls, attrs: Mapping[str, Any]) -> Outcome:
        """The outcome a file records. Attributes are untrusted text: an unknown status reads
        as ``error`` with the stored text in the message, a bad time as NaN."""
        status = str(attrs.get("status", "")).strip()
        message = str(attrs.get("status_message", ""))
        try:
            when = float(np.asarray(attrs.get("status_time", math.nan)).reshape(-1)[0])
        except (TypeError, ValueError, IndexError):
            when = math.nan
        if status not in (*OUTCOMES, RUNNING):
            return cls("error", when, f"unknown status {status[:40]!r} in the file; {message}")
        reason = str(attrs.get("status_reason", "")).strip() if status == "error" else ""
        if reason and reason not in ERROR_REASONS:  # (a file of a later version)
            message, reason = f"unknown reason {reason[:40]!r} in the file; {message}", ""
        return cls(status, when, message, reason)


class OutputError(ValueError):
    """The output file cannot be written or read as asked (one line, ``run.output: ...``)."""


class OutputBusy(OutputError):
    """Another writer holds the output's lock."""


class DiskFull(OSError):
    """No room for the next write (full file system, quota, or a file size limit): nothing
    of the write was started, so the file holds every snapshot before it."""

    def __str__(self) -> str:
        return str(self.strerror)


_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
#: bytes kept free beyond a record's own size: HDF5 metadata (chunk index, object headers)
RESERVE_MARGIN = 256 * 1024


def _reserve(path: str, nbytes: int, what: str) -> None:
    """Raise :class:`DiskFull` unless ``path`` can grow by ``nbytes``: within the file size
    limit (``ulimit -f``), and as many bytes as a probe file beside it can allocate
    (``posix_fallocate`` of ``.<name>.reserve``, removed at once: a full file system or
    quota shows there, before HDF5 writes anything, instead of as an HDF5 error in the
    middle of a record, which can leave the file unreadable). The output itself is never
    extended: HDF5 truncates a file to its own end of allocation when it flushes, and a
    kill inside that window left files whose last chunk could not be read (measured)."""
    nbytes = int(nbytes)
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    limit = _file_size_limit()
    if limit is not None and size + nbytes > limit:
        raise DiskFull(
            errno.EFBIG,
            f"run.output: disk full: no room for {what} in {path} ({_size(nbytes)} "
            f"needed; the file size limit (ulimit -f) is {_size(limit)}, the file has "
            f"{_size(size)})",
        )
    folder, name = os.path.split(os.path.abspath(path))
    probe = os.path.join(folder, f".{name}.reserve")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        if exc.errno in _SPACE_ERRNOS:
            raise DiskFull(
                exc.errno, f"run.output: disk full: no room for {what} in {path}"
            ) from None
        return  # the write that follows reports it
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            free = _free_bytes(path)
            if exc.errno in _SPACE_ERRNOS or (free is not None and free < nbytes):
                raise DiskFull(
                    exc.errno if exc.errno in _SPACE_ERRNOS else errno.ENOSPC,
                    f"run.output: disk full: no room for {what} in {path} ({_size(nbytes)} "
                    "needed" + (f", {_size(free)} free)" if free is not None else ")"),
                ) from None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def _free_bytes(path: str) -> int | None:
    """Bytes this process may still write beside ``path`` (file system, ``ulimit -f``)."""
    free = None
    with contextlib.suppress(OSError):
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
        free = st.f_bavail * st.f_frsize
    limit = _file_size_limit()
    if limit is not None:
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        free = max(0, limit - size) if free is None else min(free, max(0, limit - size))
    return free


def _file_size_limit() -> int | None:
    """This process's file size limit in bytes (``ulimit -f``), None when unlimited."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if limit == resource.RLIM_INFINITY else int(limit)


def _size(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def _space_error(path: str, exc: BaseException, what: str) -> DiskFull | None:
    """A DiskFull for an error HDF5 reported after all (out of room despite the reserve)."""
    code = getattr(exc, "errno", None)
    free = _free_bytes(path)
    if code in _SPACE_ERRNOS or (free is not None and free < RESERVE_MARGIN):
        return DiskFull(
            errno.ENOSPC,
            f"run.output: disk full while writing {what} to {path}"
            + (f" ({_size(free)} free)" if free is not None else ""),
        )
    return None


class _OutputLock:
    """An advisory lock (``fcntl.flock``) that one writer of ``path`` holds from creation
    (or resume) to close. It lives on the hidden file ``.<name>.lock`` beside the output:
    HDF5 takes its own flock on the output while it has it open, and readers (``tpde
    info`` during a run) must still open it. The lock file is removed on release; a
    killed writer's lock ends with its process."""

    def __init__(self, path: str):
        folder, name = os.path.split(os.path.abspath(path))
        self.path = path
        self.lock_path = os.path.join(folder, f".{name}.lock")
        self.fd: int | None = None

    def acquire(self) -> None:
        if fcntl is None:
            return
        for _ in range(100):
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise OutputError(
                    f"run.output: cannot write {self.path}: cannot create its lock file "
                    f"{self.lock_path}: {exc.strerror}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.read(fd, 32).decode(errors="replace").strip()
                os.close(fd)
                raise OutputBusy(
                    f"run.output: {self.path} is being written by another tpde process"
                    + (f" (pid {holder})" if holder.isdigit() else "")
                    + "; wait for it to end or choose another output"
                ) from None
            try:  # the file we locked is still the lock file (not one a releaser removed)
                same = os.path.samestat(os.fstat(fd), os.stat(self.lock_path))
            except OSError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return
            os.close(fd)
        raise OutputBusy(f"run.output: cannot lock {self.path}; try again")

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.lock_path)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = None


def staged_name(path: str | os.PathLike) -> str:
    """Where a run that replaces an existing ``path`` writes until it ends with a result
    (``.<name>.partial`` beside it; :class:`SnapshotWriter`)."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(folder, f".{name}.partial")


def _fsync(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _source() -> str:
    return f"tpde {tpde.__version__}"


# ---- path checks ----------------------------------------------------------------------------
def _check_target(path: str, overwrite: bool) -> None:
    """Raise a one-line OutputError unless a new file can be created at ``path``."""
    if os.path.isdir(path):
        raise OutputError(f"run.output: cannot write {path}: it is a directory")
    if os.path.exists(path) and not overwrite:
        raise OutputError(
            f"run.output: {path} exists; pass --overwrite to replace it or --resume to continue it"
        )
    if os.path.exists(path) and not os.path.isfile(path):
        raise OutputError(f"run.output: cannot write {path}: not a regular file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OutputError(f"run.output: cannot write {path}: directory {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"run.output: cannot write {path}: directory {folder} is not writable")


def _record_bytes(grid: Grid, positions: Positions | None) -> int:
    """What one record may add to a file, at most: the density (deflate can grow
    incompressible data by a few bytes per block) and an index entry per density chunk
    (_CHUNK_INDEX_BYTES, B-tree nodes included), a new chunk of every moment record (a chunk
    holds _TIME_CHUNK records), up to 8 energy records, and RESERVE_MARGIN."""
    d = grid.ndim
    sizes = (*(() if positions is None else (positions.count,)), *grid.cells[::-1])
    tiles = math.prod(-(-n // c) for n, c in zip(sizes, spatial_chunks(sizes, d)[1:], strict=True))
    cells = math.prod(grid.shape) * (1 if positions is None else positions.count)
    chunks = _TIME_CHUNK * (1 + 1 + d + d * d + 3 + 8)  # time, mass, mean, cov, 3 scalars, energies
    if positions is not None:
        chunks += sum(
            math.prod(_moment_chunks((positions.count, *inner))) for inner in ((), (d,), (d, d))
        )
    return int(1.05 * 8 * cells) + _CHUNK_INDEX_BYTES * tiles + 8 * chunks + RESERVE_MARGIN


def _busy(path: str, exclusive: bool) -> bool:
    """Whether another open handle holds a conflicting HDF5 (flock) lock on ``path``."""
    if fcntl is None:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing the descriptor releases the probe lock
    return False


def _retry_open(path: str, opener: Callable[[], Any], exclusive: bool, timeout: float) -> Any:
    """``opener()``, retried while another process holds the file locked (up to timeout s)."""
    deadline = _time.monotonic() + timeout
    delay, unlocked_failures = 0.005, 0
    while True:
        try:
            return opener()
        except OSError as exc:
            if not os.path.exists(path):
                raise OutputError(f"run.output: {path} does not exist") from None
            if not _busy(path, exclusive):
                unlocked_failures += 1
                if unlocked_failures >= 2:
                    raise OutputError(f"run.output: cannot open {path}: {exc}") from None
            elif _time.monotonic() >= deadline:
                raise RuntimeError(
                    f"run.output: {path} stayed locked for {timeout:g} s; "
                    "another process (or handle) holds it open: close its "
                    "xarray or netCDF4 handle"
                ) from None
            else:
                _time.sleep(delay)
                delay = min(2 * delay, 0.25)


@contextlib.contextmanager
def _opened(path: str, mode: Literal["r", "a"], timeout: float) -> Iterator[netCDF4.Dataset]:
    """``netCDF4.Dataset(path, mode)`` (retried while locked), closed on exit."""
    nc = _retry_open(path, lambda: netCDF4.Dataset(path, mode), mode != "r", timeout)
    try:
        yield nc
    finally:
        nc.close()


# ---- file layout ----------------------------------------------------------------------------
def _spatial_order(dims: Sequence[str], reverse: bool) -> tuple[str, ...]:
    """``dims`` with its spatial dimensions in x, y, z order (``reverse``: z, y, x), in the
    places they had; every other dimension stays where it is."""
    out = list(dims)
    where = [i for i, name in enumerate(out) if name in AXES]
    spatial = sorted((out[i] for i in where), key=AXES.index, reverse=reverse)
    for i, name in zip(where, spatial, strict=True):
        out[i] = name
    return tuple(out)


def file_order(dims: Sequence[str]) -> tuple[str, ...]:
    """The stored order of a variable whose tpde dimensions are ``dims``: CF's ..., Z, Y, X
    (``(time, s, x, y)`` is stored ``(time, s, y, x)``; ``x_bounds(x, nv)`` stays)."""
    return _spatial_order(dims, True)


def xyz_order(dims: Sequence[str]) -> tuple[str, ...]:
    """The order tpde's arrays use (``[x, y, z]``) for a variable stored with ``dims``."""
    return _spatial_order(dims, False)


def _transposed(values: np.ndarray, have: Sequence[str], want: Sequence[str]) -> np.ndarray:
    """``values`` (dimensions ``have``) with its axes in the order ``want`` (a view)."""
    have = tuple(have)
    return np.transpose(values, [have.index(name) for name in want])


def _define_axes(nc: netCDF4.Dataset, grid: Grid) -> None:
    """Spatial dimensions, cell-centre coordinates and their bounds (cell edges). No
    ``axis`` on x and y: CF tools take ``axis = "X"/"Y"`` for longitude/latitude."""
    nc.createDimension("nv", 2)
    for a in range(grid.ndim):
        name = AXES[a]
        nc.createDimension(name, grid.cells[a])
        coord = nc.createVariable(name, "f8", (name,))
        coord.setncatts(_axis_attributes(a))
        coord.setncatts(grid.axis_attributes)  # a geometry's (the circle)
        coord[:] = grid.centres(a)
        bounds = nc.createVariable(f"{name}_bounds", "f8", (name, "nv"))
        bounds[:] = _bounds(grid, a)


def _axis_attributes(a: int) -> dict[str, str]:
    name = AXES[a]
    attributes = {
        "units": "1",
        "long_name": f"token coordinate {a + 1}",
        "comment": f"cell centres; the cells' edges are {name}_bounds",
        "bounds": f"{name}_bounds",
    }
    if name == "z":
        attributes.update(axis="Z", positive="up")
    return attributes


def _bounds(grid: Grid, a: int) -> np.ndarray:
    """The cells' edges along axis a, (cells, 2)."""
    edges = grid.edges(a)
    return np.stack([edges[:-1], edges[1:]], axis=1)


def _component_attributes(d: int, name: str) -> dict[str, Any]:
    what = "component" if name == "dim" else "second component"
    return {
        "long_name": f"{what} (axis)",
        "flag_values": np.arange(d, dtype=np.int32),
        "flag_meanings": " ".join(AXES[:d]),
    }


S_ATTRIBUTES = {"units": "1", "long_name": "token position", "comment": S_COMMENT}
WEIGHT_ATTRIBUTES = {"units": "1", "long_name": "position marginal nu (mass per slice)"}


def coordinates(grid: Grid, positions: Positions | None = None) -> xr.Dataset:
    """The coordinates every tpde file has, as a Dataset to build others on (the
    references, :func:`to_dataset`): ``x(x)``.. cell centres with ``x_bounds(x, nv)``..,
    ``dim(dim)`` and ``dim2(dim2)``, with positions ``s(s)`` and ``position_weight(s)``;
    the attributes of the run files."""
    d = grid.ndim
    variables: dict[str, Any] = {}
    coords: dict[str, Any] = {}
    for a, name in enumerate(grid.axis_names):
        coords[name] = (name, grid.centres(a), _axis_attributes(a))
        variables[f"{name}_bounds"] = ((name, "nv"), _bounds(grid, a))
    for name in ("dim", "dim2"):
        coords[name] = (name, np.arange(d, dtype=np.int32), _component_attributes(d, name))
    if positions is not None:
        coords["s"] = ("s", positions.s, dict(S_ATTRIBUTES))
        variables["position_weight"] = ("s", positions.weights, dict(WEIGHT_ATTRIBUTES))
    return xr.Dataset(variables, coords=coords)


def _cell_measure_dims(grid: Grid, positions: Positions | None) -> tuple[str, ...]:
    """The stored dimensions of the cell measure: the density's after ``time`` (``(s, y,
    x)`` with positions) when they are at most three, the ones ParaView's CF reader loads;
    else (3-D with positions, which that reader cannot load) the grid's ``(z, y, x)``."""
    dims = file_order(_density_dims(grid, positions))
    return dims if len(dims) <= 3 else file_order(grid.axis_names)


def _define_cell_measure(
    nc: netCDF4.Dataset, grid: Grid, positions: Positions | None, frame: bool = False
) -> None:
    """``cell_length(x)``, ``cell_area(y, x)`` or ``cell_volume(z, y, x)`` (``(s, ...)``
    with positions, :func:`_cell_measure_dims`): the measure of the density's cells, the
    grid's h_x h_y .., written once when the file is created. Its name sorts before every
    other data variable, so ParaView's CF reader, which loads the dimensions of the
    alphabetically first variable when none are chosen, opens the density's. ``frame``:
    the file holds a co-moving frame (the comment says which cells these are)."""
    name, measure = cell_measure(grid, positions, frame)
    dims = _cell_measure_dims(grid, positions)
    values = measure.transpose(*dims)
    var = nc.createVariable(
        name,
        "f8",
        dims,
        chunksizes=spatial_chunks(values.shape, grid.ndim)[1:],
        zlib=True,
        complevel=4,
    )
    var.setncatts(values.attrs)
    var[:] = values.values


def cell_measure(
    grid: Grid, positions: Positions | None = None, frame: bool = False
) -> tuple[str, xr.Variable]:
    """The name and the variable (tpde's axis order) of the cells' measure every file with
    a density carries (:func:`_define_cell_measure`; the references add it to their
    Datasets): ``cell_length``, ``cell_area`` or ``cell_volume``, h_x [h_y [h_z]]."""
    d = grid.ndim
    dims = xyz_order(_cell_measure_dims(grid, positions))
    sizes = {"s": 0 if positions is None else positions.count}
    sizes.update(zip(grid.axis_names, grid.cells, strict=True))
    unit = grid.axis_attributes.get("units", "1")  # the circle's radian
    attributes = {
        "long_name": f"{CELL_MEASURES[d].split('_')[1]} of each grid cell",
        "units": "1" if unit == "1" else unit + (str(d) if d > 1 else ""),
        "comment": _cell_measure_comment(grid, positions, frame),
    }
    values = np.full([sizes[n] for n in dims], grid.cell_volume)
    return CELL_MEASURES[d], xr.Variable(dims, values, attributes)


def _cell_measure_comment(grid: Grid, positions: Positions | None, frame: bool) -> str:
    d = grid.ndim
    text = _CELL_MEASURE_COMMENT.format(" h_y h_z"[: 4 * (d - 1)], CELL_MEASURES[d])
    if positions is None:
        text += ", the density's"
    else:
        text += _CELL_MEASURE_SLICES if d < 3 else _CELL_MEASURE_4D
    return text + (_CELL_MEASURE_FRAME if frame else "")


def _define_positions(nc: netCDF4.Dataset, positions: Positions) -> None:
    """The ``s`` dimension, its coordinate ``s(s)`` and ``position_weight(s)``."""
    nc.createDimension("s", positions.count)
    coord = nc.createVariable("s", "f8", ("s",))
    coord.setncatts(S_ATTRIBUTES)
    coord[:] = positions.s
    weight = nc.createVariable("position_weight", "f8", ("s",))
    weight.setncatts(WEIGHT_ATTRIBUTES)
    weight[:] = positions.weights


def _define_components(nc: netCDF4.Dataset, d: int) -> None:
    """``dim`` and ``dim2`` (the indices of a mean and a covariance): integer coordinates
    0 .. d-1 whose ``flag_meanings`` name the axes (a string coordinate is variable-length
    in NetCDF4, which CF checkers and older tools do not read)."""
    for name in ("dim", "dim2"):
        nc.createDimension(name, d)
        var = nc.createVariable(name, "i4", (name,))
        var.setncatts(_component_attributes(d, name))
        var[:] = np.arange(d, dtype=np.int32)


def _record_variable(
    nc: netCDF4.Dataset,
    name: str,
    dims: tuple[str, ...],
    chunks: tuple[int, ...],
    comment: str = "",
    cell_methods: str = "time: point",
    units: str | None = "1",
    **compression: Any,
) -> None:
    """A float64 record ``name(time, *dims)`` (``dims`` in the stored order, NaN fill);
    ``units=None``: none (CF asks none of a dimensionless quantity, and xarray's plots
    label a variable ``long_name [units]``)."""
    var = nc.createVariable(
        name, "f8", ("time", *dims), fill_value=np.nan, chunksizes=chunks, **compression
    )
    var.setncatts({"long_name": _LONG_NAMES[name], "cell_methods": cell_methods})
    if units is not None:
        var.setncattr("units", units)
    comment = comment or _COMMENTS.get(name, "")
    if comment:
        var.setncattr("comment", comment)


def spatial_chunks(
    sizes: Sequence[int], ndim: int, values: int = SPATIAL_CHUNK_VALUES, times: int = 1
) -> tuple[int, ...]:
    """Chunk sizes of a spatial record ``(time, [s,] *space)`` whose stored sizes after
    ``time`` are ``sizes`` (the last ``ndim`` spatial, in the stored order).

    ``times`` records per chunk (1: a snapshot writes new chunks only and never rewrites one
    holding earlier snapshots, which a kill during the rewrite of a compressed chunk could
    lose), spatial tiles of edge about ``values ** (1/ndim)`` (whole axes when the slab
    holds at most ``values``), and as many position slices as keep a chunk within
    ``values`` (at least one): reading one cell over time reads one tile per snapshot,
    reading a snapshot reads its tiles."""
    lead, space = tuple(sizes[: len(sizes) - ndim]), tuple(sizes[len(sizes) - ndim :])
    if math.prod(space) <= values:
        tile = space
    else:
        edge = max(1, round(values ** (1.0 / ndim)))
        tile = tuple(min(n, edge) for n in space)
    room = max(1, values // math.prod(tile))
    return (times, *(min(n, room) for n in lead), *tile)


def _moment_chunks(inner: tuple[int, ...]) -> tuple[int, ...]:
    """Chunk sizes of a moment record ``(time, *inner)``: up to _TIME_CHUNK records, and
    at most _RECORD_CHUNK_VALUES values per chunk (many slices would make it huge)."""
    per_record = int(np.prod(inner, dtype=np.int64))
    return (max(1, min(_TIME_CHUNK, _RECORD_CHUNK_VALUES // per_record)), *inner)


def _define_slice_records(nc: netCDF4.Dataset, d: int, count: int) -> None:
    """slice_mass(time, s), slice_mean(time, s, dim), slice_covariance(time, s, dim, dim2)."""
    _record_variable(nc, "slice_mass", ("s",), _moment_chunks((count,)))
    _record_variable(nc, "slice_mean", ("s", "dim"), _moment_chunks((count, d)))
    _record_variable(nc, "slice_covariance", ("s", "dim", "dim2"), _moment_chunks((count, d, d)))


def _density_dims(grid: Grid, positions: Positions | None) -> tuple[str, ...]:
    """The dimensions of a density after ``time``, in tpde's order (``[s,] x[, y[, z]]``)."""
    return (*(() if positions is None else ("s",)), *grid.axis_names)


def _define_records(nc: netCDF4.Dataset, grid: Grid, positions: Positions | None) -> None:
    """The unlimited ``time`` axis and every per-snapshot variable."""
    d = grid.ndim
    nc.createDimension("time", None)
    _define_components(nc, d)
    # no _FillValue on a coordinate (CF 2.5.1): an unwritten time reads as TIME_FILL
    time = nc.createVariable("time", "f8", ("time",), chunksizes=(_TIME_CHUNK,))
    time.setncatts(TIME_ATTRIBUTES)
    dims = file_order(_density_dims(grid, positions))
    sizes = {"s": 0 if positions is None else positions.count}
    sizes.update(zip(grid.axis_names, grid.cells, strict=True))
    _record_variable(
        nc,
        "density",
        dims,
        spatial_chunks([sizes[name] for name in dims], grid.ndim),
        cell_methods="time: point " + " ".join(f"{a}:" for a in grid.axis_names) + " mean",
        units=None,  # (the density is what users plot: no "[1]" on its label)
        compression="zlib",
        complevel=4,
        shuffle=True,
    )
    marginal = "" if positions is None else MARGINAL_COMMENT
    _record_variable(nc, "mass", (), (_TIME_CHUNK,), marginal)
    _record_variable(nc, MEAN, ("dim",), (_TIME_CHUNK, d), marginal)
    _record_variable(nc, "covariance", ("dim", "dim2"), (_TIME_CHUNK, d, d), marginal)
    for name in ("outflow", "max_speed", "dt"):
        _record_variable(nc, name, (), (_TIME_CHUNK,))
    if positions is not None:
        _define_slice_records(nc, d, positions.count)


def _global_attributes(
    grid: Grid, config_text: str, title: str, history: str, positions: Positions | None = None
) -> dict:
    created = f"{_now()}: created by {_source()}" + (f": {history}" if history else "")
    attributes = {
        "Conventions": CONVENTIONS,
        "title": title,
        "history": created,
        "source": _source(),
        "tpde_version": tpde.__version__,
        "config": config_text,
        "status": "running",
        "status_time": math.nan,
        "status_message": "",
        "status_reason": "",
        "grid_lower": np.asarray(grid.lower, dtype=np.float64),
        "grid_upper": np.asarray(grid.upper, dtype=np.float64),
        "grid_cells": np.asarray(grid.cells, dtype=np.int64),
        "grid_boundary": ",".join(grid.boundary),
    }
    if positions is not None:
        attributes["positions"] = np.int64(positions.slices)
        attributes["sink_mass"] = np.float64(positions.sink_mass)
    attributes.update(grid.file_attributes)  # a geometry's (the circle)
    return attributes


#: the global attributes of a tpde file (the references' and :func:`to_dataset`'s as well)
global_attributes = _global_attributes


def to_netcdf(ds: xr.Dataset, path: str | os.PathLike) -> None:
    """Write a Dataset in the layout of the run files (the references, the sweep summary):
    the stored CF order (:func:`file_order`, x fastest), no ``_FillValue`` on coordinates,
    bounds, integer and text variables, text as fixed-length characters (a NetCDF4
    variable-length string is what CF checkers and older tools fail on). Writes ``path`` as
    is (callers stage and rename)."""
    stored = reordered(renamed(ds), file_order).copy()
    encoding: dict[str, dict[str, Any]] = {}
    for key, var in stored.variables.items():
        name = str(key)
        var.encoding = {}  # what a read left (chunks, coordinates of another layout)
        kind = var.dtype.kind
        if name in stored.coords or name.endswith("_bounds") or kind not in "fc":
            encoding[name] = {"_FillValue": None}
        if kind in "UOS":
            encoding[name] = {"_FillValue": None, "dtype": "S1"}
    unlimited = ["time"] if "time" in stored.dims else None  # as the run files (CF: T first)
    stored.to_netcdf(
        path, engine="netcdf4", format="NETCDF4", encoding=encoding, unlimited_dims=unlimited
    )


def _create(path: str, grid: Grid, attributes: dict, positions: Positions | None = None) -> None:
    """Write an empty file with every dimension, variable and attribute."""
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        nc.setncatts(attributes)
        _define_axes(nc, grid)
        if positions is not None:
            _define_positions(nc, positions)
        _define_cell_measure(nc, grid, positions)
        _define_records(nc, grid, positions)


# ---- reading helpers ------------------------------------------------------------------------
def _grid_kind(attrs: dict) -> type[Grid]:
    """The Grid class of a file's ``geometry`` attribute (a geometry's ``file_attributes``;
    its ``grid`` in tpde.geometries); files without one are flat boxes."""
    hook = geometries.of_dataset(attrs).grid
    return Grid if hook is None else geometries.load(hook)


def _grid_from_attributes(
    attrs: dict, where: str, density_shape: tuple[int, ...] | None = None
) -> Grid:
    """Rebuild the Grid from the ``grid_*`` global attributes (exact: float64 stored as is).

    Attributes are untrusted: the cells must be those of the ``density`` variable (its last
    d dimensions, ``density_shape``), so a crafted attribute cannot make a reader allocate
    more than the file holds."""
    missing = [
        k for k in ("grid_lower", "grid_upper", "grid_cells", "grid_boundary") if k not in attrs
    ]
    if missing:
        raise OutputError(
            f"run.output: {where} has no {missing[0]} attribute; not a tpde output file"
        )
    if density_shape == ():
        raise OutputError(f"run.output: {where} has no density; not a tpde output file")
    try:
        lower = np.atleast_1d(np.asarray(attrs["grid_lower"], dtype=np.float64))
        upper = np.atleast_1d(np.asarray(attrs["grid_upper"], dtype=np.float64))
        cells = np.atleast_1d(np.asarray(attrs["grid_cells"], dtype=np.int64))
        boundary = [b.strip() for b in str(attrs["grid_boundary"]).split(",")]
        if density_shape is not None and tuple(density_shape[-cells.size :]) != tuple(
            cells.tolist()
        ):
            raise ValueError(
                f"grid_cells {cells.tolist()} do not match the density's shape "
                f"{list(density_shape)}"
            )
        kind = _grid_kind(attrs)
        return kind(lower.tolist(), upper.tolist(), cells.tolist(), boundary)
    except (TypeError, ValueError, OverflowError) as exc:
        raise OutputError(
            f"run.output: {where} is not a valid tpde output: {str(exc).splitlines()[0]}"
        ) from None


def _density_shape(nc: netCDF4.Dataset) -> tuple[int, ...]:
    """The shape of the file's density in tpde's order (``time[, s], x[, y[, z]]``, from the
    dimension names: files of either layout), () when it has none."""
    if "density" not in nc.variables:
        return ()
    var = nc["density"]
    sizes = dict(zip(var.dimensions, var.shape, strict=True))
    return tuple(sizes[name] for name in xyz_order(var.dimensions))


def _positions_from_attributes(attrs: dict, where: str) -> Positions | None:
    """The Positions of the ``positions`` / ``sink_mass`` global attributes, else None."""
    if "positions" not in attrs:
        return None
    if "sink_mass" not in attrs:
        raise ValueError(f"run.output: {where} has a positions attribute but no sink_mass")
    slices = np.asarray(attrs["positions"]).reshape(-1)
    sink = np.asarray(attrs["sink_mass"]).reshape(-1)
    if slices.size != 1 or sink.size != 1 or int(slices[0]) != slices[0]:
        raise ValueError(
            f"run.output: {where} has positions = {attrs['positions']!r}, "
            f"sink_mass = {attrs['sink_mass']!r}; expected an integer and a number"
        )
    return Positions(int(slices[0]), float(sink[0]))


def _slice_moments(
    density: np.ndarray, grid: Grid, positions: Positions
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Moments of each slice of ``density`` (S, *grid.shape), S = positions.count: mass (S,)
    (:meth:`Positions.marginal`), mean (S, d) and covariance (S, d, d) normalised by the
    slice mass (:func:`tpde.grid.moments`); NaN mean and covariance where the mass is not > 0.
    """
    d, count = grid.ndim, positions.count
    mass = positions.marginal(density, grid)
    mean = np.full((count, d), np.nan)
    cov = np.full((count, d, d), np.nan)
    for k in range(count):
        if mass[k] > 0:
            _, mean[k], cov[k] = moments(density[k], grid)
    return mass, mean, cov


def complete_records(time: np.ndarray) -> int:
    """Number of leading records whose ``time`` (written last) is present: finite and not
    the fill value of a record not yet written (:data:`TIME_FILL`; NaN in older files)."""
    t = np.asarray(time, dtype=np.float64)
    ok = np.isfinite(t) & (t != TIME_FILL)
    return int(ok.size if ok.all() else np.argmin(ok))


_complete_records = complete_records


def _complete_in_file(nc: netCDF4.Dataset) -> int:
    var = nc["time"]
    var.set_auto_mask(False)
    return _complete_records(var[:])


def _file_attributes(nc: netCDF4.Dataset) -> dict:
    return {k: nc.getncattr(k) for k in nc.ncattrs()}


def _energy_names(attrs: dict) -> tuple[str, ...] | None:
    """The energy names of a file (its ``energies`` attribute), None before the first
    snapshot of a run with energies (or for a file without them)."""
    if "energies" not in attrs:
        return None
    text = str(attrs["energies"]).strip()
    return tuple(name.strip() for name in text.split(",")) if text else ()


#: provenance attributes that count a run's work: a resumed run adds its own
COUNTERS = ("steps", "rejected_steps", "wall_time")
#: the steps of the segment being written, up to its last complete snapshot: rewritten with
#: every record, added to ``steps`` at close, or at resume when a kill left it unclosed (a
#: resumed run repeats only what came after that snapshot)
UNCLOSED_STEPS = "steps_since_resume"
#: run records kept as text (``events``: "kind t message" per line, tpde.schemes.monitor) or
#: as the largest over resumed segments (``largest_truncation``; ``reconstruction_error``, the
#: monitor's running estimate, which a resumed run continues from the file's value)
RUN_RECORDS = ("events", "largest_truncation", "reconstruction_error")


def count_unclosed_steps(nc: netCDF4.Dataset) -> None:
    """Add the steps a killed segment made up to its last complete snapshot
    (:data:`UNCLOSED_STEPS`) to the file's ``steps``, so the resumed run's total is the
    uninterrupted run's (attributes are untrusted: anything but a count is dropped)."""
    if UNCLOSED_STEPS not in nc.ncattrs():
        return
    try:
        unclosed = int(np.asarray(nc.getncattr(UNCLOSED_STEPS)).reshape(-1)[0])
        before = (
            int(np.asarray(nc.getncattr("steps")).reshape(-1)[0]) if "steps" in nc.ncattrs() else 0
        )
    except (TypeError, ValueError, IndexError, OverflowError):
        unclosed, before = 0, 0
    if unclosed > 0:
        nc.setncattr("steps", np.int64(before + unclosed))
    nc.setncattr(UNCLOSED_STEPS, np.int64(0))


def _provenance(nc: netCDF4.Dataset, values: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes to store for ``values`` (:meth:`SnapshotWriter.close`): the
    :data:`COUNTERS` added to what ``nc`` holds, numbers as numpy scalars."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        before = nc.getncattr(name) if name in nc.ncattrs() else None
        if name == "events":  # one line per event, over every segment of a resumed run
            value = "\n".join(str(v) for v in (before, value) if v)
        elif name in ("largest_truncation", "reconstruction_error") and before is not None:
            value = max(float(before), float(value))
        if name in COUNTERS:
            before = before if before is not None else 0
            try:
                value = float(np.asarray(before).reshape(-1)[0]) + float(value)
            except (TypeError, ValueError, IndexError):
                value = float(value)
            value = np.float64(value) if name == "wall_time" else np.int64(round(value))
        elif isinstance(value, bool | int | np.integer):
            value = np.int64(value)
        elif isinstance(value, float | np.floating):
            value = np.float64(value)
        else:
            value = str(value)
        out[str(name)] = value
    return out


# ---- the writer -----------------------------------------------------------------------------
def open_output(
    path: str, overwrite: bool, create: Callable[[str], None], nbytes: int
) -> tuple[_OutputLock, str, bool]:
    """The start of a new output, whatever its layout: lock ``path`` (:class:`_OutputLock`),
    check it (:class:`OutputError` when it exists without ``overwrite``), reserve ``nbytes``
    (the header and a first record) and write the empty file with ``create(file)`` at
    :func:`staged_name`. Without an existing file that name is renamed into place at once;
    with one (``overwrite``) the new run stays there until it ends with a result
    (:meth:`OutputWriter.close`). Returns the held lock, the file to append to and whether
    it is staged; on any failure nothing is left and the lock is released."""
    lock = _OutputLock(path)
    _check_target(path, True)  # the directory; whether it exists is asked under the lock
    lock.acquire()
    temporary = staged_name(path)
    try:
        _check_target(path, overwrite)  # again, now that no other writer can create it
        staged = os.path.exists(path)
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)  # a stale partial run: its writer is gone (the lock)
        try:
            _reserve(temporary, nbytes, "the new file and its first snapshot")
            create(temporary)
        except (OSError, RuntimeError) as exc:
            if isinstance(exc, DiskFull):
                raise
            raise _space_error(temporary, exc, "the new file") or OutputError(
                f"run.output: cannot write {path}: {exc}"
            ) from None
        if not staged:
            os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        lock.release()
        raise
    return lock, temporary if staged else path, staged


@dataclass
class Reopened:
    """An output reopened by :func:`reopen_output`: the held ``lock``, the ``file`` continued
    (``staged``: the partial file of a run replacing ``path``), the global attributes as they
    were, what ``read`` returned (``layout``), the complete records and the last one's time."""

    lock: _OutputLock
    file: str
    staged: bool
    attrs: dict
    layout: Any
    count: int
    last: float | None


def reopen_output(
    path: str,
    lock_timeout: float,
    read: Callable[[netCDF4.Dataset, dict], Any],
    accept: Callable[[dict], None] | None = None,
    update: Callable[[netCDF4.Dataset, Any], None] | None = None,
) -> Reopened:
    """Lock an existing output and open it for appending after its last complete record,
    whatever its layout (:meth:`SnapshotWriter.resume` tells the rest): ``read(nc, attrs)``
    parses the layout of the file to continue (the staged partial file when there is one),
    ``accept(state)`` may refuse (raise) before anything changes, then the status becomes
    ``running`` with a ``resumed`` history line and ``update(nc, layout)`` may add what
    the file lacks. On any failure the lock is released."""
    lock = _OutputLock(path)
    lock.acquire()
    try:
        staged = os.path.isfile(staged_name(path))
        file = staged_name(path) if staged else path
        if not os.path.isfile(file):
            raise OutputError(
                f"run.output: {path} does not exist; nothing to resume (drop "
                "--resume to start a new run)"
            )
        with _opened(file, "r", lock_timeout) as nc:
            attrs = _file_attributes(nc)
            layout = read(nc, attrs)
            count = _complete_in_file(nc)
            last = float(nc["time"][count - 1]) if count else None
        if accept is not None:
            accept(
                {
                    "file": file,
                    "config": str(attrs.get("config", "")),
                    "outcome": Outcome.from_attributes(attrs),
                    "snapshots": count,
                    "time": last,
                }
            )
        _reserve(file, RESERVE_MARGIN, "the resumed status")
        with _opened(file, "a", lock_timeout) as nc:
            nc.setncatts(
                {
                    "status": RUNNING,
                    "status_time": math.nan,
                    "status_message": f"resumed after {count} snapshots",
                    "status_reason": "",
                    "history": f"{attrs.get('history', '')}\n{_now()}: resumed by {_source()}",
                }
            )
            if update is not None:
                update(nc, layout)
    except BaseException:
        lock.release()
        raise
    return Reopened(lock, file, staged, attrs, layout, count, last)


class OutputWriter:
    """What every durable writer of records shares, whatever the file's layout: the output's
    lock, the staged file of an overwrite, one record appended per :meth:`_append` (room
    reserved first: :class:`DiskFull` leaves the file untouched), the final status with
    :meth:`close`. :class:`SnapshotWriter` (the grid runs) and ``tpde.sphere.SphereWriter``
    (the cubed sphere) are its layouts: they create the file with :func:`open_output` or
    continue it with :func:`reopen_output`, then call :meth:`_begin` and :meth:`_attach`."""

    path: str
    file: str
    staged: bool
    lock_timeout: float

    def _begin(
        self, path: str, count: int, last_time: float | None, lock_timeout: float, record: int
    ) -> None:
        """The state of a writer of ``path`` holding ``count`` records (the last at
        ``last_time``), each needing at most ``record`` bytes."""
        self.path = path
        self.lock_timeout = float(lock_timeout)
        self._count = count
        self._last_time = last_time
        self._closed = False
        self._lock: _OutputLock | None = None
        self.file = path
        self.staged = False
        self._record = int(record)

    def _attach(self, lock: _OutputLock, file: str, staged: bool) -> None:
        """The writer owns ``lock`` and writes its records to ``file`` (the staged partial
        file when ``staged``: moved over :attr:`path` when the run ends with a result)."""
        self._lock = lock
        self.file = file
        self.staged = staged

    @property
    def snapshots(self) -> int:
        """Number of complete snapshots in the file."""
        return self._count

    @property
    def last_time(self) -> float | None:
        """Time of the last snapshot written (None before the first)."""
        return self._last_time

    def _check_time(self, t: float) -> float:
        """``t`` as the next record's time: the writer open, finite, not before the last."""
        if self._closed:
            raise RuntimeError(
                f"run.output: {self.path} was closed; use SnapshotWriter.resume to append again"
            )
        t = float(t)
        if not math.isfinite(t):
            raise ValueError(f"run.output: snapshot time must be finite, got {t}")
        if self._last_time is not None and t < self._last_time:
            raise ValueError(
                f"run.output: snapshot time {t!r} is before the last written "
                f"time {self._last_time!r}"
            )
        return t

    def _append(self, t: float, store: Callable[[int], None]) -> None:
        """Record number :attr:`snapshots` at time ``t``: reserve the room it may need, then
        ``store(i)`` (open the file, write record ``i`` with its time last, close it)."""
        i = self._count
        what = f"snapshot {i + 1} (t = {t:.6g})"
        _reserve(self.file, self._record, what)
        try:
            store(i)
        except (OSError, RuntimeError) as exc:
            if isinstance(exc, DiskFull):
                raise
            space = _space_error(self.file, exc, what)
            if space is None:
                raise
            raise space from None
        self._count = i + 1
        self._last_time = t

    def close(
        self,
        status: str | Outcome = "completed",
        status_time: float = math.nan,
        status_message: str = "",
        provenance: Mapping[str, Any] | None = None,
    ) -> bool:
        """Record how the run ended (an :class:`Outcome`, or its status, time and message:
        one of :data:`OUTCOMES`, the message made one line), release the lock, and, for a
        run that replaces an existing file (``overwrite``), move it over that file when the
        status is a result (:data:`RESULTS`); otherwise the old file stays and the new
        records stay in :attr:`file` for ``resume``.

        ``provenance``: global attributes stored with the status, e.g. ``threads`` and the
        solver's counters ``steps``, ``rejected_steps``, ``wall_time`` (:data:`COUNTERS`:
        added to the values a resumed file already holds, so they count the whole run).

        Returns whether the status was stored: on a full disk it is not (the file then says
        ``running``, which ``resume`` accepts), and a staged run is not published.
        """
        outcome = (
            status if isinstance(status, Outcome) else Outcome(status, status_time, status_message)
        )
        if self._closed:
            raise RuntimeError(f"run.output: {self.path} is already closed")
        stored = False
        try:
            try:
                _reserve(self.file, RESERVE_MARGIN, "the final status")
                with _opened(self.file, "a", self.lock_timeout) as nc:
                    nc.setncatts(
                        {
                            "status": outcome.status,
                            "status_time": outcome.time,
                            "status_message": outcome.message,
                            "status_reason": outcome.reason,
                            **_provenance(nc, provenance or {}),
                            UNCLOSED_STEPS: np.int64(0),  # counted in steps now
                        }
                    )
                stored = True
            except DiskFull:
                pass
            if stored and self.staged and outcome.result:
                _fsync(self.file)
                os.replace(self.file, self.path)
                _fsync(os.path.dirname(os.path.abspath(self.path)))
                self.file, self.staged = self.path, False
        finally:
            self._closed = True
            if self._lock is not None:
                self._lock.release()
        return stored

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Close if not closed yet: ``completed``, ``interrupted`` (Ctrl-C) or ``error``."""
        if self._closed:
            return
        last = math.nan if self._last_time is None else self._last_time
        if exc_type is None:
            self.close("completed", last)
        elif issubclass(exc_type, KeyboardInterrupt):
            self.close("interrupted", last, "interrupted by the user")
        else:
            self.close("error", last, f"{exc_type.__name__}: {exc}")

    def __del__(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()


class SnapshotWriter(OutputWriter):
    """Append run snapshots to a NetCDF file, one durable record per :meth:`write`.

    Parameters
    ----------
    path : str or os.PathLike. The output file (``run.output``).
    grid : Grid. Every density written must have shape ``grid.shape`` (without positions).
    config_text : the resolved configuration (TOML text), stored in the ``config`` attribute.
    title : the ``title`` attribute.
    overwrite : replace an existing file. The new run is written to ``.<name>.partial``
        beside it (:func:`staged_name`) and moved over the old file (an atomic rename) when
        :meth:`close` records a result (:data:`RESULTS`: completed or a physical stop); a run
        that is interrupted, fails or is killed leaves the old file as it was and its own
        records in the partial file, which ``resume`` continues. Without an existing file the
        header is written under that name and renamed into place at once, and the snapshots
        are appended in place (a killed run leaves a readable, resumable file).
    history : the command line, recorded in ``history`` with the creation time.
    lock_timeout : seconds to wait while another process holds the file open.
    positions : :class:`tpde.grid.Positions` of masked (causal) attention, or None. Densities
        then have shape ``positions.shape(grid) = (S, *grid.shape)`` and the file gets the
        ``s`` dimension and the slice records (module docstring).
    energies : a callable ``(density, t) -> Mapping[str, float | Energy]`` evaluated at
        every snapshot written (:func:`tpde.variants.energies.run_energies`), or None. Each
        name gets the record ``energy_<name>(time)``, created at the first snapshot with the
        attributes of a :class:`tpde.variants.energies.Energy` value (monotone, long_name, formula;
        a plain float gets monotone "none"); the names are stored in the global attribute
        ``energies`` and stay fixed for the run (a name missing later is written as NaN).

    The writer holds an advisory lock on the output (:class:`_OutputLock`, ``fcntl.flock``
    on ``.<name>.lock``) from creation to :meth:`close`: a second writer of the same output
    gets :class:`OutputBusy`. Before each write it reserves the room the record may need
    (``posix_fallocate``); when that fails it raises :class:`DiskFull` without touching the
    file, which keeps every earlier snapshot and can be resumed once there is room.

    Raises OutputError (a ValueError, one line, starting ``run.output``) when the file exists
    and ``overwrite`` is false, or when the directory is missing or not writable; nothing is
    created then. The instance is callable, so it can be a ``Solver`` ``on_snapshot`` callback.

    Examples
    --------
    >>> writer = SnapshotWriter("run.nc", grid, config_text=toml_text)   # doctest: +SKIP
    >>> result = Solver(problem, on_snapshot=writer).run()               # doctest: +SKIP
    >>> writer.close(result.status, result.status_time, result.status_message)  # +SKIP
    """

    def __init__(
        self,
        path: str | os.PathLike,
        grid: Grid,
        config_text: str = "",
        title: str = "tpde run",
        overwrite: bool = False,
        history: str = "",
        lock_timeout: float = LOCK_TIMEOUT,
        positions: Positions | None = None,
        energies: EnergyCallable | None = None,
    ):
        path = os.fspath(path)
        if not isinstance(grid, Grid):
            raise ValueError(f"run.output: expected a tpde.grid.Grid, got {type(grid).__name__}")
        if positions is not None and not isinstance(positions, Positions):
            raise ValueError(
                f"run.output: expected tpde.grid.Positions or None for "
                f"positions, got {type(positions).__name__}"
            )
        attributes = _global_attributes(grid, str(config_text), str(title), str(history), positions)
        header = 64 * 1024 + 32 * sum(grid.cells) + 2 * len(str(config_text))
        lock, file, staged = open_output(
            path,
            overwrite,
            lambda file: _create(file, grid, attributes, positions),
            header + _record_bytes(grid, positions),
        )
        self._setup(path, grid, 0, None, lock_timeout, positions, energies)
        self._attach(lock, file, staged)

    def _setup(
        self,
        path: str,
        grid: Grid,
        count: int,
        last_time: float | None,
        lock_timeout: float,
        positions: Positions | None = None,
        energies: EnergyCallable | None = None,
        energy_names: tuple[str, ...] | None = None,
    ) -> None:
        if energies is not None and not callable(energies):
            raise ValueError(
                f"run.output: energies must be a callable (density, t) -> dict, "
                f"got {type(energies).__name__}"
            )
        self._begin(path, count, last_time, lock_timeout, _record_bytes(grid, positions))
        self.grid = grid
        self.positions = positions
        self.energies = energies
        self._energy_names = energy_names  # None until the records exist
        # the stored order of the density and the mean's name: those of this layout, or of
        # the file a resumed writer continues (an earlier layout keeps its own)
        self._stored = file_order(_density_dims(grid, positions))
        self._mean = MEAN

    @classmethod
    def resume(
        cls,
        path: str | os.PathLike,
        lock_timeout: float = LOCK_TIMEOUT,
        energies: EnergyCallable | None = None,
        accept: Callable[[dict], None] | None = None,
    ) -> SnapshotWriter:
        """Reopen an existing output file for appending after its last complete snapshot.

        Existing records are kept as they are; a trailing incomplete record (a kill inside a
        write) is overwritten by the next :meth:`write`. The status becomes ``running`` and
        ``history`` gets a ``resumed`` line. The grid and the positions (None for a file
        without them) are those of the file. ``energies``: the same callable as the original
        run (the energy names stored in the file stay fixed; their records are continued).

        A run that was replacing ``path`` (``overwrite``) and did not end with a result left
        its records in :func:`staged_name`; that file is the one continued, and it replaces
        ``path`` when the resumed run ends with a result. ``accept(state)`` is called with the
        lock held and before anything is changed: ``state`` has ``file`` (the file to be
        continued), ``config``, ``outcome`` (:class:`Outcome`), ``snapshots`` and ``time``
        (the last complete snapshot's, None without one); it raises to refuse the resume.
        """
        path = os.fspath(path)

        def read(nc: netCDF4.Dataset, attrs: dict) -> tuple:
            grid = _grid_from_attributes(attrs, path, _density_shape(nc))
            positions = _positions_from_attributes(attrs, path)
            mean_name = MEAN if MEAN in nc.variables else "mean"
            return grid, positions, tuple(nc["density"].dimensions[1:]), mean_name

        def update(nc: netCDF4.Dataset, layout: tuple) -> None:
            grid, positions, stored, _ = layout
            count_unclosed_steps(nc)
            # a file of this layout from before the cell measure gets it (once)
            current = stored == file_order(_density_dims(grid, positions))
            if current and CELL_MEASURES[grid.ndim] not in nc.variables:
                frame = "frame_mean" in nc.variables
                _define_cell_measure(nc, grid, positions, frame)

        opened = reopen_output(path, lock_timeout, read, accept, update)
        grid, positions, stored, mean_name = opened.layout
        writer = cls.__new__(cls)
        writer._setup(
            path,
            grid,
            opened.count,
            opened.last,
            lock_timeout,
            positions,
            energies,
            _energy_names(opened.attrs),
        )
        writer._stored, writer._mean = stored, mean_name
        writer._attach(opened.lock, opened.file, opened.staged)
        return writer

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of a density: ``grid.shape``, or ``(positions.count, *grid.shape)``."""
        return self.grid.shape if self.positions is None else self.positions.shape(self.grid)

    def _check_snapshot(self, snapshot: Record) -> tuple[float, np.ndarray]:
        t = self._check_time(snapshot.time)
        density = np.asarray(snapshot.density, dtype=np.float64)
        if density.shape != self.shape:
            what = "" if self.positions is None else " (position slices, *grid.shape)"
            raise ValueError(
                f"run.output: snapshot density has shape {density.shape}, "
                f"expected {self.shape}{what}"
            )
        return t, density

    @profile.timed("io.write")
    def write(self, snapshot: SnapshotLike) -> bool:
        """Append one snapshot (density of shape :attr:`shape`) and close the file again.

        mass, mean (d,) and covariance (d, d) are computed with :func:`tpde.grid.moments`
        (with positions: of the x-marginal ``density.sum(axis=0)``, and slice_mass (S,),
        slice_mean (S, d), slice_covariance (S, d, d) of each slice). A snapshot at exactly
        the time of the last record (the start of a resumed run) is skipped; returns whether
        a record was written.

        Raises :class:`DiskFull` when the room the record may need cannot be reserved: the
        file is not opened then, so it keeps every earlier snapshot intact.
        """
        record = Record.of(snapshot)
        t, density = self._check_snapshot(record)
        if self._last_time is not None and t == self._last_time:
            return False
        sliced = self.positions is not None
        mass, mean, cov = moments(density.sum(axis=0) if sliced else density, self.grid)
        if record.frame is not None:  # mean and covariance stay physical
            if record.atoms is not None and record.atoms.count:  # the frame's: cells + atoms
                mass, mean, cov = _with_atoms(mass, mean, cov, record.atoms)
            mean, cov = record.frame.moments(mean, cov)
        energies = None if self.energies is None else dict(self.energies(density, t))
        self._append(
            t, lambda i: self._write_record(i, t, record, density, mass, mean, cov, energies)
        )
        return True

    def _write_record(self, i, t, snapshot: Record, density, mass, mean, cov, energies) -> None:
        sliced = self.positions is not None
        with _opened(self.file, "a", self.lock_timeout) as nc:
            if energies is not None:
                self._write_energies(nc, i, energies)
            tpde_dims = _density_dims(self.grid, self.positions)
            nc["density"][i, ...] = _transposed(density, tpde_dims, self._stored)
            nc["mass"][i] = mass
            nc[self._mean][i, :] = mean
            nc["covariance"][i, :, :] = cov
            if sliced:
                self._write_slices(nc, i, density)
            if snapshot.frame is not None:
                self._write_frame(nc, i, snapshot.frame)
            if snapshot.atoms is not None:  # (tpde.atoms_io: a fill-valued atom dimension)
                from .atoms_io import write_atoms

                write_atoms(nc, i, snapshot.atoms, snapshot.next_atom_id, snapshot.frame)
            nc["outflow"][i] = float(snapshot.outflow)
            nc["max_speed"][i] = float(snapshot.max_speed)
            nc["dt"][i] = float(snapshot.dt)
            if snapshot.step is not None:
                nc.setncattr(UNCLOSED_STEPS, np.int64(snapshot.step))
            # the record on disk before its time: HDF5 flushes cached chunks in its own order
            # at close, so a kill there could leave a time without its data (seen: a NaN
            # mass); after the sync it can only lose the time, and a record without time
            # is incomplete (dropped on read and resume)
            nc.sync()
            nc["time"][i] = t

    __call__ = write

    def _write_frame(self, nc: netCDF4.Dataset, i: int, frame: Any) -> None:
        """Record i of the co-moving frame (docs/theory.md, 'The co-moving affine frame'):
        frame_mean (dim), frame_matrix (dim, dim2), frame_jacobian, and the physical position
        ``physical_<axis>`` of every cell centre, a CF auxiliary coordinate of ``density``
        (the variables are defined with the first record that has a frame)."""
        grid, d = self.grid, self.grid.ndim
        names = [PHYSICAL + a for a in grid.axis_names]
        if "frame_mean" not in nc.variables:
            _record_variable(nc, "frame_mean", ("dim",), (_TIME_CHUNK, d))
            _record_variable(nc, "frame_matrix", ("dim", "dim2"), (_TIME_CHUNK, d, d))
            _record_variable(nc, "frame_jacobian", (), (_TIME_CHUNK,))
            for a, name in enumerate(names):
                var = nc.createVariable(
                    name,
                    "f8",
                    ("time", *self._stored),
                    fill_value=np.nan,
                    chunksizes=spatial_chunks(
                        [grid.cells[grid.axis_names.index(n)] for n in self._stored], d
                    ),
                    zlib=True,
                    complevel=4,
                )
                var.setncatts(
                    {
                        "long_name": f"physical {grid.axis_names[a]} of the cell centre",
                        "comment": "x = m + L xi of the cell centre xi (frame_mean m, "
                        "frame_matrix L)",
                    }
                )
            nc["density"].setncattr("coordinates", " ".join(names))
            # mass per frame-coordinate volume, not the physical density (physical_density)
            nc["density"].setncatts(FRAME_DENSITY_ATTRIBUTES)
            if CELL_MEASURES[d] in nc.variables:  # the frame's cells, not the physical ones
                comment = _cell_measure_comment(grid, self.positions, True)
                nc[CELL_MEASURES[d]].setncattr("comment", comment)
        nc["frame_mean"][i, :] = frame.mean
        nc["frame_matrix"][i, :, :] = frame.matrix
        nc["frame_jacobian"][i] = frame.jacobian
        centres = frame.physical(np.stack(grid.mesh(sparse=False), axis=-1))
        tpde_dims = _density_dims(grid, None)
        for a, name in enumerate(names):
            nc[name][i, ...] = _transposed(centres[..., a], tpde_dims, self._stored)

    def _write_slices(self, nc: netCDF4.Dataset, i: int, density: np.ndarray) -> None:
        """Record i of slice_mass (S,), slice_mean (S, d), slice_covariance (S, d, d)."""
        assert self.positions is not None  # (written for sliced states only)
        mass, mean, cov = _slice_moments(density, self.grid, self.positions)
        nc["slice_mass"][i, :] = mass
        nc["slice_mean"][i, :, :] = mean
        nc["slice_covariance"][i, :, :, :] = cov

    def _write_energies(self, nc: netCDF4.Dataset, i: int, energies: dict) -> None:
        """Record i of every ``energy_<name>``; the records (and the ``energies`` attribute)
        are created at the first snapshot, and the names stay those of the file."""
        if self._energy_names is None:
            names = tuple(str(name) for name in energies)
            for name in names:
                if not name.isidentifier():
                    raise ValueError(f"run.output: energy name {name!r} is not an identifier")
                value = energies[name]
                var = nc.createVariable(
                    f"energy_{name}", "f8", ("time",), fill_value=np.nan, chunksizes=(_TIME_CHUNK,)
                )
                monotone = str(getattr(value, "monotone", "none"))
                if monotone not in ENERGY_MONOTONE:
                    raise ValueError(
                        f"run.output: energy {name!r} has monotone = "
                        f"{monotone!r}; expected one of "
                        f"{', '.join(ENERGY_MONOTONE)}"
                    )
                var.setncatts(
                    {
                        "long_name": str(getattr(value, "long_name", "") or name),
                        "comment": ENERGY_COMMENT,
                        "formula": str(getattr(value, "formula", "")),
                        "units": "1",
                        "monotone": monotone,
                    }
                )
            nc.setncattr("energies", ",".join(names))
            self._energy_names = names
        extra = set(energies) - set(self._energy_names)
        if extra:
            raise ValueError(
                f"run.output: energy {sorted(extra)[0]!r} is not among the "
                f"energies of this file ({', '.join(self._energy_names)})"
            )
        for name in self._energy_names:
            value = energies.get(name, math.nan)
            nc[f"energy_{name}"][i] = float(getattr(value, "value", value))

    def __repr__(self) -> str:
        extra = "" if self.positions is None else f", positions={self.positions!r}"
        return f"SnapshotWriter({self.path!r}, {self.grid!r}, snapshots={self._count}{extra})"


# ---- reading --------------------------------------------------------------------------------
def _load(path: str) -> xr.Dataset:
    """The file's complete records, loaded: the trailing record without its time (a kill
    inside a write) is cut before anything is read from it, so a chunk the kill left half
    written in that record cannot fail the read of the records before it."""
    with xr.open_dataset(path, engine="zarr" if is_zarr(path) else "netcdf4") as ds:
        if "time" in ds.variables and "time" in ds.dims:
            n = _complete_records(ds["time"].values)
            if n < ds.sizes["time"]:
                ds = ds.isel(time=slice(0, n))
        return ds.load()


def read(
    path: str | os.PathLike, lock_timeout: float = 10.0, order: Literal["xyz", "file"] = "xyz"
) -> xr.Dataset:
    """Load an output file into memory (the file is closed on return).

    Returns an ``xarray.Dataset`` with ``density (time, x[, y[, z]])``, ``mass (time)``,
    ``mean_position (time, dim)``, ``covariance (time, dim, dim2)``, ``outflow``,
    ``max_speed``, ``dt (time)``, the cell measure (``cell_area (x, y)``.., :data:`CELL_MEASURES`;
    files written before it have none), coordinates ``time``, ``x``.., ``dim``, ``dim2`` and
    bounds ``x_bounds (x, nv)``..; a trailing incomplete record is dropped. ``order = "xyz"`` (the
    default) gives every variable its spatial dimensions in x, y, z order, as tpde's arrays
    (``density.values[i]`` is indexed ``[x, y, z]``, like the solver's densities; plot with
    ``.plot(x="x")``); ``order = "file"`` keeps the stored CF order (``(time, [z,] [y,] x)``,
    what ``xarray.open_dataset`` gives). Files of the earlier layout read the same (their
    ``mean`` as ``mean_position``). A run with positions has ``density (time, s, x[, y[, z]])``,
    the coordinate ``s (s)``, ``position_weight (s)``, ``slice_mass (time, s)``,
    ``slice_mean (time, s, dim)`` and ``slice_covariance (time, s, dim, dim2)`` as well
    (:func:`positions_from_dataset` rebuilds its Positions). A run with energies has
    ``energy_<name> (time)`` for each name of the ``energies`` attribute (attributes
    long_name, formula, monotone).
    """
    path = os.fspath(path)
    try:
        ds = _retry_open(path, lambda: _load(path), False, lock_timeout)
    except (RuntimeError, OverflowError, MemoryError) as exc:  # e.g. a corrupted chunk
        if isinstance(exc, RuntimeError) and "stayed locked" in str(exc):
            raise
        raise OutputError(
            f"run.output: cannot read {path}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from None
    if "time" not in ds.variables or "time" not in ds.dims:
        raise OutputError(f"run.output: {path} has no time records; not a tpde output file")
    n = _complete_records(ds["time"].values)
    if n < ds.sizes["time"]:
        ds = ds.isel(time=slice(0, n))
    ds = renamed(ds)
    return reordered(ds, xyz_order) if order == "xyz" else reordered(ds, file_order)


def renamed(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with the variables of earlier layouts under their current names
    (:data:`RENAMED`: ``mean`` -> ``mean_position``)."""
    names = {old: new for old, new in RENAMED.items() if old in ds.variables and new not in ds}
    return ds.rename(names) if names else ds


def reordered(ds: xr.Dataset, order: Callable[[Sequence[str]], tuple[str, ...]]) -> xr.Dataset:
    """``ds`` with every variable's dimensions in ``order(dims)`` (:func:`xyz_order`: tpde's
    ``[x, y, z]``; :func:`file_order`: the stored CF order); chunk sizes follow."""
    out = ds.copy(deep=False)
    for name, var in ds.variables.items():
        dims = order([str(dim) for dim in var.dims])
        if dims == var.dims:
            continue
        moved = var.transpose(*dims)
        chunks = var.encoding.get("chunksizes")
        if chunks is not None and len(chunks) == len(dims):
            where = dict(zip(var.dims, chunks, strict=True))
            moved.encoding = {**var.encoding, "chunksizes": tuple(where[n] for n in dims)}
        if name in ds.coords:
            out = out.assign_coords({name: moved})
        else:
            out[name] = moved
    return out


def _stored_attributes(path: str | os.PathLike) -> dict:
    """The global attributes of a run's NetCDF file or Zarr store (no record is read)."""
    path = os.fspath(path)
    if is_zarr(path):
        import zarr

        return dict(zarr.open_group(path, mode="r").attrs)
    with _opened(path, "r", 10.0) as nc:
        return _file_attributes(nc)


def outcome(path: str | os.PathLike) -> Outcome:
    """How the run in ``path`` (a NetCDF file or Zarr store) ended (its status attributes;
    no record is read)."""
    return Outcome.from_attributes(_stored_attributes(path))


def events(path: str | os.PathLike) -> list[str]:
    """The events a run in ``path`` (a NetCDF file or Zarr store) records (its ``events``
    attribute: one line each, "kind time message")."""
    return str(_stored_attributes(path).get("events", "")).splitlines()


def grid_from_dataset(ds: xr.Dataset) -> Grid:
    """The exact :class:`Grid` of a run (from the ``grid_*`` global attributes, checked
    against the shape of its ``density``)."""
    shape = None
    if "density" in ds.variables:
        sizes = ds["density"].sizes
        shape = tuple(sizes[name] for name in xyz_order([str(d) for d in ds["density"].dims]))
    return _grid_from_attributes(dict(ds.attrs), "dataset", shape)


def _with_atoms(mass: float, mean: np.ndarray, cov: np.ndarray, atoms: Any):
    """The moments (mass, mean (d,), covariance (d, d)) of cells plus atoms, all in the same
    (frame) coordinates: the exact mixture moments (tpde.schemes.atoms.merge_moments)."""
    from tpde.schemes.atoms import merge_moments

    if not mass > 0:  # (every cell emptied into atoms: the cells' mean is undefined)
        return merge_moments(atoms.mass, atoms.centre, atoms.cov)
    return merge_moments(
        np.concatenate([[mass], atoms.mass]),
        np.vstack([np.asarray(mean)[None], atoms.centre]),
        np.concatenate([np.asarray(cov)[None], atoms.cov]),
    )


def positions_from_dataset(ds: xr.Dataset) -> Positions | None:
    """The :class:`Positions` of a run (from the ``positions`` and ``sink_mass`` global
    attributes), or None for a run without position slices."""
    return _positions_from_attributes(dict(ds.attrs), "dataset")


def resume_state(path: str | os.PathLike, lock_timeout: float = 10.0) -> dict:
    """What a solver needs to continue an interrupted run, read without loading every record.

    Returns a dict: ``grid`` (Grid), ``positions`` (Positions, or None without position
    slices), ``time`` (float, last snapshot), ``density`` (last density, ``grid.shape`` or
    ``positions.shape(grid)``), ``outflow`` (float, cumulative), ``mass`` (float),
    ``snapshots`` (int, complete records), ``times`` (all snapshot times, (snapshots,)),
    ``config`` (str), ``status`` and ``status_message`` (str), ``frame`` ((mean, matrix) of
    the last snapshot's co-moving frame, or None).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"run.output: {path} does not exist; nothing to resume")
    with _opened(path, "r", lock_timeout) as nc:
        nc.set_auto_mask(False)
        attrs = _file_attributes(nc)
        grid = _grid_from_attributes(attrs, path, _density_shape(nc))
        positions = _positions_from_attributes(attrs, path)
        n = _complete_in_file(nc)
        if n == 0:
            raise ValueError(
                f"run.output: {path} holds no complete snapshot; start a new run with --overwrite"
            )
        last = n - 1
        from .atoms_io import read_atoms

        atoms = read_atoms(nc, last)
        stored = nc["density"].dimensions
        density = _transposed(nc["density"][last, ...], stored[1:], xyz_order(stored[1:]))
        return {
            "grid": grid,
            "positions": positions,
            "time": float(nc["time"][last]),
            "density": np.array(density, dtype=np.float64),
            "outflow": float(nc["outflow"][last]),
            # the resolution monitor's estimate when the last segment ended (at or after
            # this snapshot: a resumed run continues from at least the true value)
            "reconstruction_error": float(attrs.get("reconstruction_error", 0.0)),
            "mass": float(nc["mass"][last]),
            "snapshots": n,
            "times": np.array(nc["time"][:n], dtype=np.float64),
            "config": str(attrs.get("config", "")),
            "status": str(attrs.get("status", "")),
            "status_message": str(attrs.get("status_message", "")),
            "outcome": Outcome.from_attributes(attrs),
            # the atoms of the last snapshot and the next atom id (None: no atoms)
            "atoms": atoms,
            # the co-moving frame of the last snapshot (None for a fixed box): a resumed run
            # continues it exactly
            "frame": (
                (
                    np.array(nc["frame_mean"][last], dtype=np.float64),
                    np.array(nc["frame_matrix"][last], dtype=np.float64),
                )
                if "frame_mean" in nc.variables
                else None
            ),
        }


# ---- results built in Python ------------------------------------------------------------------
class ResultLike(Protocol):
    """What :func:`write` reads (``tpde.schemes.solver.Result`` fits)."""

    grid: Grid
    snapshots: list
    status: str
    status_time: float
    status_message: str
    #: the typed cause of an ``error`` outcome (:data:`ERROR_REASONS`), else ""
    status_reason: str
    #: the Problem's Positions (masked runs), else None
    positions: Positions | None


#: the solver's statuses that are not file outcomes (:data:`OUTCOMES`)
_STATUS_OF_RESULT = {"failed": "error"}


def write(
    result: ResultLike,
    path: str | os.PathLike,
    config_text: str = "",
    title: str = "tpde run",
    overwrite: bool = False,
    history: str = "",
    positions: Positions | None = None,
    energies: EnergyCallable | None = None,
) -> str:
    """Write a run built in Python (a ``tpde.schemes.solver.Result``) as the file ``tpde
    run`` writes: every snapshot through a :class:`SnapshotWriter`, then the result's
    status and its provenance (``steps``, ``rejected_steps``, ``wall_time``, ``threads``).

    positions: the Problem's :class:`tpde.grid.Positions` of a masked run (its densities
    have a leading slice axis), else None. Returns the path. Raises OutputError (as the
    writer) when ``path`` exists without ``overwrite``. A ``path`` ending in ``.zarr`` is
    written as a Zarr store with the same variables and attributes (:func:`netcdf_to_zarr`;
    needs zarr, the ``zarr`` extra).
    """
    if is_zarr(path):
        staging = check_zarr_output(path, overwrite)
        write(result, staging, config_text, title, overwrite, history, positions, energies)
        netcdf_to_zarr(staging, path)
        return os.fspath(path)
    snapshots = list(result.snapshots)
    if not snapshots:
        raise ValueError("io.write: the result has no snapshot to write")
    grid = result.grid
    positions = positions if positions is not None else result.positions
    leading = np.ndim(snapshots[0].density) - grid.ndim
    if leading != (0 if positions is None else 1):
        raise ValueError(
            f"io.write: densities of shape {np.shape(snapshots[0].density)} on a "
            f"{grid.ndim}-D grid need positions= the Problem's Positions"
            if positions is None
            else f"io.write: positions given but the densities have shape "
            f"{np.shape(snapshots[0].density)} (expected {positions.shape(grid)})"
        )
    writer = SnapshotWriter(
        path,
        grid,
        config_text=config_text,
        title=title,
        overwrite=overwrite,
        history=history,
        positions=positions,
        energies=energies,
    )
    try:
        for snapshot in snapshots:
            writer.write(snapshot)
    except BaseException as exc:
        writer.close("error", math.nan, f"{type(exc).__name__}: {exc}")
        raise
    status = _STATUS_OF_RESULT.get(str(result.status), str(result.status))
    reason = str(result.status_reason or "") if status == "error" else ""
    if status not in OUTCOMES:
        status, reason = "error", "exception"
    writer.close(
        Outcome(status, float(result.status_time), str(result.status_message), reason),
        provenance=_result_provenance(result),
    )
    return os.fspath(path)


#: the extra that installs zarr (``tpde run -o RUN.zarr``)
ZARR_EXTRA = "tpde[zarr]"


def is_zarr(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a Zarr store (it ends in ``.zarr``)."""
    return os.fspath(path).rstrip("/").endswith(".zarr")


def zarr_staging(path: str | os.PathLike) -> str:
    """The NetCDF file a Zarr output is written to while its run goes on: ``.NAME.nc``
    beside ``NAME.zarr``; copied into the store at the end and removed."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path).rstrip("/")))
    return os.path.join(folder, f".{name}.nc")


def check_zarr_output(path: str | os.PathLike, overwrite: bool, resume: bool = False) -> str:
    """Refuse a Zarr output that cannot be written, in one line (:class:`OutputError`):
    zarr not installed, ``--resume``, an existing store without ``overwrite``. Returns the
    NetCDF staging file (:func:`zarr_staging`)."""
    try:
        import zarr  # noqa: F401
    except ImportError:
        raise OutputError(
            f"run.output: {path} is a Zarr store, which needs zarr: pip install "
            f"'{ZARR_EXTRA}' (or write a .nc file)"
        ) from None
    if resume:
        raise OutputError(
            f"run.output: --resume of a Zarr output ({path}) is not supported; run to a .nc "
            "file to resume, or run again with --overwrite"
        )
    if os.path.exists(path) and not overwrite:
        raise OutputError(f"run.output: {path} exists; pass --overwrite to replace it")
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"run.output: cannot write {path}: a file, not a Zarr store")
    staging = zarr_staging(path)
    _check_target(staging, True)  # the folder (the writer checks the staging file itself)
    return staging


def netcdf_to_zarr(source: str | os.PathLike, path: str | os.PathLike) -> str:
    """Copy the NetCDF file ``source`` into the Zarr store ``path`` (same variables,
    attributes and chunks; ``xr.open_zarr(path)`` is ``xr.open_dataset(source)``) and remove
    ``source``. The store is built as ``.NAME.partial`` and renamed; an existing store is
    replaced only after the new one is complete."""
    import shutil

    target = os.path.abspath(os.fspath(path).rstrip("/"))
    folder, name = os.path.split(target)
    partial, old = os.path.join(folder, f".{name}.partial"), os.path.join(folder, f".{name}.old")
    for leftover in (partial, old):
        shutil.rmtree(leftover, ignore_errors=True)
    with xr.open_dataset(source) as ds:
        encoding = {}
        for var_name, var in ds.variables.items():
            chunks = var.encoding.get("chunksizes")
            var.encoding = {}
            encoding[var_name] = {"chunks": tuple(chunks)} if chunks else {}
        ds.to_zarr(partial, mode="w", encoding=encoding, consolidated=True, zarr_format=2)
    if os.path.exists(target):
        os.rename(target, old)
    os.rename(partial, target)
    shutil.rmtree(old, ignore_errors=True)
    os.remove(source)
    return target


def _result_provenance(result: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key in (("steps", "steps"), ("rejected_steps", "rejected_steps")):
        if hasattr(result, key):
            out[name] = int(getattr(result, key))
    if hasattr(result, "wall_time"):
        out["wall_time"] = float(result.wall_time)
    try:
        from tpde.grid.threads import ensure_policy

        out["threads"] = int(ensure_policy())
    except ImportError:  # pragma: no cover - numba is a dependency
        pass
    return out


def physical_density(ds: xr.Dataset) -> xr.DataArray:
    """The token density in physical space of a file read by :func:`read`: in a co-moving
    frame run ``density / frame_jacobian`` (the frame map x = m + L xi takes a frame cell of
    volume v onto a physical one of volume |det L| v, so mass per physical volume is the
    stored density, mass per frame volume, divided by |det L|), with the coordinates
    ``physical_<axis>`` of the cell centres; in any other file ``density`` itself.

    >>> rho = physical_density(read("out.nc")).isel(time=-1)  # doctest: +SKIP
    >>> rho.plot(x="physical_x", y="physical_y")  # doctest: +SKIP
    """
    density = ds["density"]
    if "frame_jacobian" not in ds.variables:
        return density
    out = density / ds["frame_jacobian"]
    out.attrs = dict(PHYSICAL_DENSITY_ATTRIBUTES)
    return out.rename("physical_density")


def to_dataset(
    result: ResultLike,
    order: Literal["xyz", "file"] = "xyz",
    positions: Positions | None = None,
    **attributes: Any,
) -> xr.Dataset:
    """The ``xarray.Dataset`` of a run built in Python: exactly what :func:`read` gives of
    the file :func:`write` writes (same variables, attributes and provenance; ``order``
    as in :func:`read`). ``attributes``: ``config_text``, ``title``, ``history``,
    ``energies`` of :func:`write`. ``Result.to_xarray()`` calls this."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tpde-") as folder:
        path = write(result, os.path.join(folder, "run.nc"), positions=positions, **attributes)
        return read(path, order=order)
