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

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Self

import netCDF4
import numpy as np
import xarray as xr

from tpde.grid import Grid, Positions, moments, profile
from tpde.grid.mesh import Mesh

from . import geometries

# the durable file layer, the CF layout and resume, re-exported: ``tpde.io`` stays the
# one module users import (``tpde.io.read``, ``tpde.io.SnapshotWriter``, ...)
from .durable import (
    COUNTERS,
    ERROR_REASONS,
    LOCK_TIMEOUT,
    MONITOR_STATE,
    OUTCOMES,
    RESERVE_MARGIN,
    RESULTS,
    RUN_RECORDS,
    RUNNING,
    TIME_FILL,
    UNCLOSED_EVENTS,
    UNCLOSED_STEPS,
    ZARR_EXTRA,
    DiskFull,
    Outcome,
    OutputBusy,
    OutputError,
    _file_attributes,
    _fsync,
    _opened,
    _OutputLock,
    _provenance,
    _reserve,
    _retry_open,
    _space_error,
    check_zarr_output,
    complete_records,
    is_zarr,
    netcdf_to_zarr,
    open_output,
    read_run_state,
    staged_name,
    write_run_state,
    zarr_staging,
)
from .durable import (
    _now as _now,
)
from .layout import (
    _TIME_CHUNK,
    CELL_MEASURES,
    CONVENTIONS,
    ENERGY_COMMENT,
    ENERGY_MONOTONE,
    FRAME_DENSITY_ATTRIBUTES,
    MEAN,
    PHYSICAL,
    SPATIAL_CHUNK_VALUES,
    TIME_ATTRIBUTES,
    FileLayout,
    _cell_measure_comment,
    _create,
    _define_cell_measure,
    _density_dims,
    _density_shape,
    _energy_names,
    _global_attributes,
    _grid_from_attributes,
    _positions_from_attributes,
    _record_bytes,
    _record_variable,
    _slice_moments,
    _transposed,
    cell_measure,
    coordinates,
    file_order,
    global_attributes,
    grid_from_dataset,
    physical_density,
    positions_from_dataset,
    renamed,
    reordered,
    spatial_chunks,
    to_netcdf,
    xyz_order,
)
from .layout import (
    _grid_kind as _grid_kind,
)
from .resume import Reopened, close_killed_segment, reopen_output, resume_state

try:
    import fcntl
except ImportError:  # not POSIX: treat every failed open as a lock and retry
    fcntl = None  # type: ignore[assignment]  # (every use checks for None first)

__all__ = [
    "CELL_MEASURES",
    "CONVENTIONS",
    "COUNTERS",
    "ERROR_REASONS",
    "LOCK_TIMEOUT",
    "MEAN",
    "MONITOR_STATE",
    "OUTCOMES",
    "RESERVE_MARGIN",
    "RESULTS",
    "RUNNING",
    "RUN_RECORDS",
    "SPATIAL_CHUNK_VALUES",
    "TIME_ATTRIBUTES",
    "TIME_FILL",
    "UNCLOSED_EVENTS",
    "UNCLOSED_STEPS",
    "ZARR_EXTRA",
    "DiskFull",
    "FileLayout",
    "Outcome",
    "OutputBusy",
    "OutputError",
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
    "read_run_state",
    "renamed",
    "reopen_output",
    "reordered",
    "resume_state",
    "staged_name",
    "to_dataset",
    "to_netcdf",
    "write",
    "write_run_state",
    "xyz_order",
    "zarr_staging",
]


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
    solver's step count, recorded for a resume), ``state`` (the loop's monitor state,
    :data:`MONITOR_STATE`). A SnapshotLike without them (one built in Python, a
    ``SimpleNamespace``) has no frame, no atoms, no step and no state."""

    time: float
    density: np.ndarray
    outflow: float
    max_speed: float
    dt: float
    frame: Any = None
    atoms: Any = None
    next_atom_id: int = 0
    step: int | None = None
    #: the loop's monitor state at the snapshot (:data:`MONITOR_STATE`), or None
    state: Mapping[str, Any] | None = None
    #: the segment's events up to the snapshot (:data:`UNCLOSED_EVENTS`)
    events: str = ""

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
            state=getattr(snapshot, "state", None) or None,
            events=str(getattr(snapshot, "events", "") or ""),
        )


# ---- how a run ends ----------------------------------------------------------------------------


class SnapshotWriter:
    """Append run snapshots to a NetCDF file, one durable record per :meth:`write`.

    Parameters
    ----------
    path : str or os.PathLike. The output file (``run.output``).
    grid : Grid (or the mesh of ``layout``). Every density written must have shape
        ``grid.shape`` (without positions).
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
    layout : a geometry's own file layout (:class:`tpde.layout.FileLayout`: the cubed
        sphere's ``tpde.sphere.SphereLayout``), or None: the grid runs' layout (module
        docstring). The layout says what the header and each record hold (``positions``
        and ``energies`` are the grid layout's); the writer, its durability and
        :meth:`resume` are the same (a file's layout is its ``geometry``'s registered one).

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
                    if UNCLOSED_EVENTS in nc.ncattrs():  # (in events now)
                        nc.setncattr(UNCLOSED_EVENTS, "")
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

    def __init__(
        self,
        path: str | os.PathLike,
        grid: Grid | Mesh,
        config_text: str = "",
        title: str = "tpde run",
        overwrite: bool = False,
        history: str = "",
        lock_timeout: float = LOCK_TIMEOUT,
        positions: Positions | None = None,
        energies: EnergyCallable | None = None,
        layout: FileLayout | None = None,
    ):
        path = os.fspath(path)
        if layout is not None:
            text, title, history = str(config_text), str(title), str(history)
            lock, file, staged = open_output(
                path,
                overwrite,
                lambda file: layout.create(file, text, title, history),
                layout.header_bytes(text) + layout.record_bytes(),
            )
            self._setup(path, layout.grid, 0, None, lock_timeout, layout=layout)
            self._attach(lock, file, staged)
            return
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
        layout: FileLayout | None = None,
    ) -> None:
        if energies is not None and not callable(energies):
            raise ValueError(
                f"run.output: energies must be a callable (density, t) -> dict, "
                f"got {type(energies).__name__}"
            )
        record = _record_bytes(grid, positions) if layout is None else layout.record_bytes()
        self._begin(path, count, last_time, lock_timeout, record)
        self.layout = layout
        #: the loop's monitor state at the last record of a resumed file ({} for a new one)
        self.state: dict = {}
        self.grid = grid
        self.positions = positions
        self.energies = energies
        #: atoms here are a flat box's d-D Gaussians (tpde.atoms_io), not the circle's
        self._flat_atoms = layout is None and "periodic" not in grid.boundary
        self._energy_names = energy_names  # None until the records exist
        # the stored order of the density and the mean's name: those of this layout, or of
        # the file a resumed writer continues (an earlier layout keeps its own)
        stored = () if layout is not None else file_order(_density_dims(grid, positions))
        self._stored: tuple[str, ...] = stored
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

        def read(nc: netCDF4.Dataset, attrs: dict) -> tuple | FileLayout:
            own = geometries.of_dataset(attrs).layout
            if own is not None:  # a geometry's own layout (its records, its mesh)
                return geometries.load(own).reopen(nc, attrs, path)
            grid = _grid_from_attributes(attrs, path, _density_shape(nc))
            positions = _positions_from_attributes(attrs, path)
            mean_name = MEAN if MEAN in nc.variables else "mean"
            return grid, positions, tuple(nc["density"].dimensions[1:]), mean_name

        def update(nc: netCDF4.Dataset, layout: tuple | FileLayout) -> None:
            close_killed_segment(nc)
            if not isinstance(layout, tuple):
                return
            grid, positions, stored, _ = layout
            # a file of this layout from before the cell measure gets it (once)
            current = stored == file_order(_density_dims(grid, positions))
            if current and CELL_MEASURES[grid.ndim] not in nc.variables:
                frame = "frame_mean" in nc.variables
                _define_cell_measure(nc, grid, positions, frame)

        opened = reopen_output(path, lock_timeout, read, accept, update)
        writer = cls.__new__(cls)
        if not isinstance(opened.layout, tuple):
            own: FileLayout = opened.layout
            writer._setup(path, own.grid, opened.count, opened.last, lock_timeout, layout=own)
            writer._attach(opened.lock, opened.file, opened.staged)
            writer.state = read_run_state(opened.attrs)  # (the last snapshot's)
            return writer
        grid, positions, stored, mean_name = opened.layout
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

    def read_last(self, read: Callable[[netCDF4.Dataset, int], Any]) -> Any:
        """``read(nc, i)`` of the last complete record ``i`` (a resumed run's start: e.g.
        the layout's ``density``, ``tpde.atoms_io.read_atoms``)."""
        if not self._count:
            raise OutputError(f"run.output: {self.path} holds no complete snapshot")
        with _opened(self.file, "r", self.lock_timeout) as nc:
            nc.set_auto_mask(False)
            return read(nc, self._count - 1)

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
        if self.layout is not None:  # a geometry's own records
            store = self.layout.record(record)
            self._append(t, lambda i: self._store(i, t, record, store))
            return True
        sliced = self.positions is not None
        mass, mean, cov = moments(density.sum(axis=0) if sliced else density, self.grid)
        flat_atoms = record.atoms is not None and record.atoms.count and self._flat_atoms
        if flat_atoms:  # a flat box's (the frame's or a fixed one's): cells + atoms
            mass, mean, cov = _with_atoms(mass, mean, cov, record.atoms)
        if record.frame is not None:  # mean and covariance stay physical
            mean, cov = record.frame.moments(mean, cov)
        energies = None if self.energies is None else dict(self.energies(density, t))
        values = (density, mass, mean, cov, energies)
        self._append(
            t,
            lambda i: self._store(
                i, t, record, lambda nc, k: self._write_record(nc, k, record, *values)
            ),
        )
        return True

    def _store(
        self, i: int, t: float, record: Record, write: Callable[[netCDF4.Dataset, int], None]
    ) -> None:
        """Record ``i``: open the file, ``write(nc, i)`` its variables, the run state
        (:data:`UNCLOSED_STEPS`, :data:`UNCLOSED_EVENTS`, :data:`MONITOR_STATE`), then its
        time, and close it."""
        with _opened(self.file, "a", self.lock_timeout) as nc:
            write(nc, i)
            write_run_state(nc, record.step, record.state, record.events)
            # the record on disk before its time: HDF5 flushes cached chunks in its own order
            # at close, so a kill there could leave a time without its data (seen: a NaN
            # mass); after the sync it can only lose the time, and a record without time
            # is incomplete (dropped on read and resume)
            nc.sync()
            nc["time"][i] = t

    def _write_record(
        self, nc: netCDF4.Dataset, i: int, snapshot: Record, density, mass, mean, cov, energies
    ) -> None:
        """Record ``i`` of the grid runs' layout (module docstring)."""
        sliced = self.positions is not None
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

            layout = "frame" if snapshot.frame is not None else "box"
            write_atoms(
                nc,
                i,
                snapshot.atoms,
                snapshot.next_atom_id,
                snapshot.frame,
                layout if self._flat_atoms else "circle",
            )
        nc["outflow"][i] = float(snapshot.outflow)
        nc["max_speed"][i] = float(snapshot.max_speed)
        nc["dt"][i] = float(snapshot.dt)

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
            n = complete_records(ds["time"].values)
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
    n = complete_records(ds["time"].values)
    if n < ds.sizes["time"]:
        ds = ds.isel(time=slice(0, n))
    ds = renamed(ds)
    return reordered(ds, xyz_order) if order == "xyz" else reordered(ds, file_order)


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
    """The events a run in ``path`` (a NetCDF file or Zarr store) records, one line each,
    "kind time message": its ``events`` attribute, then those of a segment still running or
    killed up to its last complete record (:data:`UNCLOSED_EVENTS`)."""
    attrs = _stored_attributes(path)
    return [
        line
        for name in ("events", UNCLOSED_EVENTS)
        for line in str(attrs.get(name, "")).splitlines()
    ]


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
