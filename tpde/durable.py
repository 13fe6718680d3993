"""The durable file layer of tpde's outputs, whatever their layout (:class:`tpde.io.
SnapshotWriter` writes the grid runs' layout and a geometry's own, ``tpde.layout.FileLayout``).

What it guarantees (docs/user-guide.md, 'Output files (CF-1.10 NetCDF)'):

- one writer per output: an advisory lock (``fcntl.flock`` on ``.<name>.lock``,
  :class:`_OutputLock`) from creation or resume to close (:class:`OutputBusy`);
- atomic replacement: a run that overwrites an existing file writes ``.<name>.partial``
  (:func:`staged_name`) and renames it over the old file only when it ends with a result
  (:data:`RESULTS`); a Zarr store is built beside and renamed (:func:`netcdf_to_zarr`);
- one durable record per write: the file is opened, one record written (its ``time`` last,
  after a sync) and closed again, so a kill at any moment leaves every complete record
  readable; a record without its time is incomplete (:func:`complete_records`);
- disk full: the room a record may need is reserved before HDF5 writes anything
  (:func:`_reserve`, ``posix_fallocate`` of a probe file; ``ulimit -f``): :class:`DiskFull`
  then leaves the file as it was;
- the final status (:class:`Outcome`: :data:`OUTCOMES`, the typed :data:`ERROR_REASONS`) and
  the provenance counters (:data:`COUNTERS`, summed over resumed segments).

The layout of what is written is :mod:`tpde.layout`'s; continuing a file is
:mod:`tpde.resume`'s.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import math
import os
import time as _time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import netCDF4
import numpy as np
import xarray as xr

import tpde

try:
    import fcntl
except ImportError:  # not POSIX: treat every failed open as a lock and retry
    fcntl = None  # type: ignore[assignment]  # (every use checks for None first)

LOCK_TIMEOUT = 60.0
#: what ``time`` holds in a record not yet written (no _FillValue: the netCDF default)
TIME_FILL = float(netCDF4.default_fillvals["f8"])

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


# ---- records ------------------------------------------------------------------------------
def complete_records(time: np.ndarray) -> int:
    """Number of leading records whose ``time`` (written last) is present: finite and not
    the fill value of a record not yet written (:data:`TIME_FILL`; NaN in older files)."""
    t = np.asarray(time, dtype=np.float64)
    ok = np.isfinite(t) & (t != TIME_FILL)
    return int(ok.size if ok.all() else np.argmin(ok))


def _complete_in_file(nc: netCDF4.Dataset) -> int:
    var = nc["time"]
    var.set_auto_mask(False)
    return complete_records(var[:])


def _file_attributes(nc: netCDF4.Dataset) -> dict:
    return {k: nc.getncattr(k) for k in nc.ncattrs()}


#: provenance attributes that count a run's work: a resumed run adds its own
COUNTERS = ("steps", "rejected_steps", "wall_time")
#: the steps of the segment being written, up to its last complete snapshot: rewritten with
#: every record, added to ``steps`` at close, or at resume when a kill left it unclosed (a
#: resumed run repeats only what came after that snapshot)
UNCLOSED_STEPS = "steps_since_resume"
#: the events of the run segment up to its last complete record (``"kind t message"`` per
#: line), rewritten with every record once there is one, added to ``events`` at close or
#: at resume when a kill left it unclosed: the events before the record a resumed run
#: starts from are not repeated by it (the monitor state says they were given)
UNCLOSED_EVENTS = "events_since_resume"
#: what the loop's callbacks had found at the last complete snapshot (JSON text of
#: ``tpde.schemes.loop.TimeLoop.monitor_state``: the resolution estimate, the warnings
#: already given), rewritten with every record: a resumed run restores it and goes on as the
#: uninterrupted one (no warning given twice, the estimate continued exactly)
MONITOR_STATE = "monitor_state"
#: run records kept as text (``events``: "kind t message" per line, tpde.schemes.monitor) or
#: as the largest over resumed segments (``largest_truncation``; ``reconstruction_error``, the
#: monitor's running estimate, which a resumed run continues from the file's value)
RUN_RECORDS = ("events", "largest_truncation", "reconstruction_error")


def joined_events(*texts: object) -> str:
    """Event texts of run segments one after another (one line per event; empty ones and
    None skipped): the ``events`` of a file over its resumed segments."""
    return "\n".join(str(v) for v in texts if v)


def write_run_state(
    nc: Any, step: int | None, state: Mapping[str, Any] | None, events: str = ""
) -> None:
    """With a record: the segment's steps so far (:data:`UNCLOSED_STEPS`), its events so
    far (:data:`UNCLOSED_EVENTS`) and the loop's monitor state (:data:`MONITOR_STATE`),
    each where given."""
    if step is not None:
        nc.setncattr(UNCLOSED_STEPS, np.int64(step))
    if events:
        nc.setncattr(UNCLOSED_EVENTS, events)
    if state:
        nc.setncattr(MONITOR_STATE, json.dumps(dict(state), sort_keys=True))


def read_run_state(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`MONITOR_STATE` of a file's attributes ({} when absent or not a JSON
    object: attributes are untrusted, a fresh run's values are used then)."""
    try:
        state = json.loads(str(attrs.get(MONITOR_STATE, "{}")))
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def _provenance(nc: netCDF4.Dataset, values: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes to store for ``values`` (:meth:`SnapshotWriter.close`): the
    :data:`COUNTERS` added to what ``nc`` holds, numbers as numpy scalars."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        before = nc.getncattr(name) if name in nc.ncattrs() else None
        if name == "events":  # one line per event, over every segment of a resumed run
            value = joined_events(before, value)
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
    (:meth:`tpde.io.SnapshotWriter.close`). Returns the held lock, the file to append to and whether
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
