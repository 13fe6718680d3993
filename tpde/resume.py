"""Continuing a file: reopening an output after its last complete record, whatever its
layout (:func:`reopen_output`), the steps and events of a killed segment
(:func:`close_killed_segment`), and what a solver needs to continue a grid run
(:func:`resume_state`, read without loading every record). The durable writes are
:mod:`tpde.durable`'s, the layout :mod:`tpde.layout`'s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import netCDF4
import numpy as np

from .durable import (
    RESERVE_MARGIN,
    RUNNING,
    UNCLOSED_EVENTS,
    UNCLOSED_STEPS,
    Outcome,
    OutputError,
    _complete_in_file,
    _file_attributes,
    _now,
    _opened,
    _OutputLock,
    _reserve,
    _source,
    joined_events,
    read_run_state,
    staged_name,
)
from .layout import (
    _density_shape,
    _grid_from_attributes,
    _positions_from_attributes,
    _transposed,
    xyz_order,
)

#: a stored time t and a snapshot time s are the same time when s <= t (1 + SAME_TIME):
#: a resumed run's last record is one of its snapshot times, written to the last bit
SAME_TIME = 1e-14


def times_after(times: Any, start: float) -> list[float]:
    """The snapshot ``times`` a run resumed at ``start`` still has to reach: those past
    ``start`` by more than its round-off (:data:`SAME_TIME`, relative)."""
    return [float(t) for t in times if t > start * (1 + SAME_TIME) + 1e-300]


def close_killed_segment(nc: netCDF4.Dataset) -> None:
    """Add the steps and the events a killed segment made up to its last complete snapshot
    (:data:`UNCLOSED_STEPS`, :data:`UNCLOSED_EVENTS`) to the file's ``steps`` and
    ``events``, so the resumed run's totals are the uninterrupted run's (attributes are
    untrusted: anything but a count is dropped, events are kept as text)."""
    if UNCLOSED_EVENTS in nc.ncattrs():
        unclosed_events = str(nc.getncattr(UNCLOSED_EVENTS))
        if unclosed_events:
            closed = nc.getncattr("events") if "events" in nc.ncattrs() else None
            nc.setncattr("events", joined_events(closed, unclosed_events))
        nc.setncattr(UNCLOSED_EVENTS, "")
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
            # what the callbacks had found at the last snapshot (the estimate exactly, the
            # warnings given); {} in files of tpde before it
            "monitor_state": read_run_state(attrs),
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
