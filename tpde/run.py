"""Running a configuration: the solver, the NetCDF writer, progress and resume.

``simulate(config)`` is the Python face (returns the output as an ``xarray.Dataset``, the
same variables as the file); ``tpde run`` calls :func:`run_config`.
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
import time as _time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from tpde.grid import profile
from tpde.schemes.frame import AffineFrame
from tpde.schemes.loop import Callback
from tpde.schemes.monitor import event_lines
from tpde.schemes.solver import Problem, Snapshot, Solver
from tpde.variants.energies import run_energies

from . import io
from .config import Config, ConfigError, build
from .config import same_config as same_values
from .lifecycle import Interrupted, error_line, error_reason, refuse_result
from .lifecycle import RunSignals as _Signals
from .lifecycle import open_writer as _writer
from .resume import times_after

__all__ = [
    "FlatSession",
    "Interrupted",
    "Progress",
    "Recorder",
    "RunSession",
    "check_resumable",
    "profiled",
    "refuse_result",
    "run_config",
    "same_config",
    "simulate",
]


class StatusLine:
    """One status line on ``stream`` (stderr): redrawn in place on a terminal, one log line
    per update otherwise, nothing when disabled. Shared by runs and sweeps."""

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = _time.perf_counter()

    def elapsed(self) -> float:
        return _time.perf_counter() - self.start

    def show(self, line: str) -> None:
        if self.enabled:
            self.stream.write(f"\r{line}" if self.tty else line + "\n")
            self.stream.flush()

    def close(self) -> None:
        """End a redrawn line (terminal only)."""
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


class Progress(Callback):
    """One status line per snapshot: t, dt, CFL-limited speed, min density, mass, outflow.
    A callback of the time loop (every geometry's).

    On a terminal the line is redrawn in place (a progress bar); otherwise one log line per
    snapshot; ``quiet`` prints nothing.
    """

    def __init__(self, t_end: float, quiet: bool = False, stream=None):
        self.t_end = t_end
        self.status = StatusLine(not quiet, stream)

    def on_snapshot(self, loop: Any, snapshot: Any) -> None:
        self(snapshot)

    def __call__(self, snap: Snapshot) -> None:
        if not self.status.enabled:
            return
        fraction = snap.time / self.t_end if self.t_end else 1.0
        bar = "#" * int(20 * fraction) + "." * (20 - int(20 * fraction))
        # the first snapshot comes before any step: no dt or speed to show yet (the cubed
        # sphere's snapshots have no face speed)
        speed = f"  max|u| {snap.max_speed:.3g}" if math.isfinite(snap.max_speed) else ""
        step = f"dt {snap.dt:.2e}{speed}" if math.isfinite(snap.dt) else "before the first step"
        self.status.show(
            f"[{bar}] t = {snap.time:.4g}/{self.t_end:.4g}  {step}  min rho "
            f"{float(snap.density.min()):.1e}  mass {snap.mass:.9f}  outflow "
            f"{snap.outflow:.1e}  {self.status.elapsed():.1f} s"
        )
        if fraction >= 1.0:
            self.status.close()

    def end(self, loop: Any, result: Any) -> None:
        self.done()  # (the events: tpde run's warnings, read from the file)

    def done(self) -> None:
        self.status.close()


class Recorder(Callback):
    """The writer (a :class:`tpde.io.SnapshotWriter`) as a callback
    of the time loop: every snapshot one durable record
    (``writer.write``, the signals held while it is written: a SIGINT or SIGTERM then ends
    the run between records), the first one skipped on a resumed run (the state it starts
    from is the file's last record). ``last_step``: the steps at the last snapshot."""

    def __init__(self, writer: Any, signals: _Signals, skip_first: bool):
        self.writer = writer
        self.signals = signals
        self.skip_first = skip_first
        self.last_step = 0

    def on_snapshot(self, loop: Any, snapshot: Any) -> None:
        self.last_step = int(snapshot.step)
        if self.skip_first:
            self.skip_first = False
            return
        with self.signals.held():
            self.writer.write(snapshot)


class RunSession(Protocol):
    """What a geometry's run hands :func:`run_config` (``Config.session(config)``; the flat
    grid and the circle: :class:`FlatSession`, the cubed sphere: ``tpde.sphere.
    SphereSession``): the writer of a new or a resumed run (``resume_writer`` checks the
    file and keeps the state to continue from), the solver (a ``tpde.schemes.loop.
    TimeLoop``) with the given callbacks, the file's outcome of its result and what the
    file records of the segment."""

    t_start: float
    t_end: float
    #: whether an output ending in .zarr can be written (through a staged NetCDF file)
    zarr: bool

    def new_writer(self, output: Path, overwrite: bool, history: str) -> Any: ...

    def resume_writer(self, output: Path) -> Any: ...

    def solver(self, callbacks: list) -> Any: ...

    def outcome(self, result: Any) -> io.Outcome: ...

    def provenance(self, solver: Any, recorder: Recorder) -> dict[str, Any]: ...


class FlatSession:
    """The run of a :class:`tpde.config.Config` on the grid (flat, frame, masked, circle):
    :class:`tpde.schemes.solver.Solver`, :class:`tpde.io.SnapshotWriter` and the energies
    of :func:`tpde.variants.energies.run_energies` at every snapshot."""

    zarr = True

    def __init__(self, config: Config[Problem]):
        self.config = config
        self.problem = config.problem
        self.t_start, self.t_end = self.problem.t_start, self.problem.t_end
        # the same energies on new and resumed runs; none in the co-moving frame, whose
        # density lives in frame coordinates (the energies' kernels are written for physical
        # ones)
        self.energies = None if self.problem.frame is not None else run_energies(config)
        self.state: dict = {}

    def new_writer(self, output: Path, overwrite: bool, history: str) -> io.SnapshotWriter:
        return io.SnapshotWriter(
            output,
            self.problem.grid,
            config_text=self.config.text,
            overwrite=overwrite,
            history=history,
            positions=self.problem.positions,
            energies=self.energies,
        )

    def resume_writer(self, output: Path) -> io.SnapshotWriter:
        state = self.state

        def accept(found: dict) -> None:
            state.update(_resumable(output, found, self.config, self.problem))

        writer = io.SnapshotWriter.resume(output, energies=self.energies, accept=accept)
        problem = replace(
            self.problem,
            density=state["density"],
            t_start=state["time"],
            snapshots=[state["time"]] + state["remaining"],
            initial_outflow=state["outflow"],
            initial_reconstruction_error=state["reconstruction_error"],
            frame=(
                self.problem.frame if state.get("frame") is None else AffineFrame(*state["frame"])
            ),
        )
        if problem.atoms is not None and state.get("atoms") is not None:
            problem.initial_atoms, problem.next_atom_id = state["atoms"]
        self.problem, self.t_start = problem, problem.t_start
        return writer

    def solver(self, callbacks: list) -> Solver:
        solver = Solver(self.problem, on_snapshot=callbacks)
        solver.restore_monitor_state(self.state.get("monitor_state", {}))
        return solver

    def outcome(self, result: Any) -> io.Outcome:
        return result_outcome(result)

    def provenance(self, solver: Solver, recorder: Recorder) -> dict[str, Any]:
        """What the file records of this run segment (:data:`tpde.io.COUNTERS` are summed
        over resumes): its steps, rejected steps, threads, the monitor's records."""
        from tpde.grid.threads import ensure_policy

        monitor = solver.monitor  # what the box and the covariance did (schemes.monitor)
        return {
            "steps": solver.steps,
            "rejected_steps": solver.rejected,
            "threads": ensure_policy(),
            "largest_truncation": monitor.largest,
            "reconstruction_error": monitor.reconstruction_error,
            "events": event_lines(monitor.events),
        }


def run_config(
    config: Config,
    output: str | Path,
    overwrite: bool = False,
    resume: bool = False,
    quiet: bool = True,
    history: str = "",
) -> Path:
    """Run ``config`` writing every snapshot to ``output`` (NetCDF); returns the path.

    The one run path of every geometry: the config's :class:`RunSession` supplies the
    writer and the solver, whose time loop runs the writer (:class:`Recorder`) and the
    progress line (:class:`Progress`) as callbacks. resume: continue the file ``output``
    (its stored config must have the same values as this one; a run that ended with a
    result, :data:`tpde.io.RESULTS`, is not resumed; the monitor state stored with its last
    snapshot, :data:`tpde.io.MONITOR_STATE`, is restored). The file records how the run
    ended (:class:`tpde.io.Outcome`): the solver's status (completed, mass_left_domain,
    box_limited, blowup) with its time and message; ``interrupted`` for SIGINT, SIGTERM and
    SIGHUP (:class:`Interrupted` is raised after the file says so; its time is the last
    complete snapshot's); ``error`` for any exception, raised again after the file says so
    (its time is the time the run had reached). :class:`tpde.io.DiskFull` ends a run as
    ``error`` with every earlier snapshot readable and resumable. With ``overwrite`` an
    existing file is replaced only by a run that ends with a result
    (:class:`tpde.io.SnapshotWriter`). On the grid the energies of
    :func:`tpde.variants.energies.run_energies` are written at every snapshot
    (``energy_<name>``).

    An ``output`` ending in ``.zarr`` is a Zarr store: the run writes the NetCDF file
    :func:`tpde.io.zarr_staging` and copies it into the store when it ends with a result
    (:func:`tpde.io.netcdf_to_zarr`); an interrupted or failed run leaves that file. Not
    resumable (:func:`tpde.io.check_zarr_output` refuses ``resume`` in one line).
    """
    session: RunSession = (config.session or FlatSession)(config)
    if io.is_zarr(output):
        if not session.zarr:
            raise ConfigError(
                f"run.output: {output}: this geometry writes NetCDF only; choose a name "
                "ending in .nc"
            )
        staging = io.check_zarr_output(output, overwrite, resume)
        run_config(config, staging, overwrite=overwrite, quiet=quiet, history=history)
        io.netcdf_to_zarr(staging, output)
        return Path(output)
    output = Path(output)
    signals = _Signals()
    with signals:
        if resume:
            writer = _writer(lambda: session.resume_writer(output))
        else:
            writer = _writer(lambda: session.new_writer(output, overwrite, history))
        recorder = Recorder(writer, signals, skip_first=resume)
        progress = Progress(session.t_end, quiet=quiet)
        solver = None
        t_start = session.t_start
        outcome = io.Outcome("error", t_start, "the run did not start")
        start = _time.perf_counter()
        try:
            solver = session.solver([recorder, progress])
            outcome = session.outcome(solver.run())
        except KeyboardInterrupt as exc:
            name = exc.name if isinstance(exc, Interrupted) else "SIGINT"
            last = writer.last_time if writer.last_time is not None else t_start
            reached = solver.t if solver is not None else t_start
            outcome = io.Outcome(
                "interrupted",
                last,
                f"interrupted by {name} at t = {reached:.6g}; snapshots up to t = {last:.6g} "
                "are complete; continue with --resume",
            )
            raise
        except BaseException as exc:
            reached = solver.t if solver is not None else t_start
            last = writer.last_time
            if isinstance(exc, io.DiskFull) and last is not None:
                reached = last  # resumable from there, like an interruption
            outcome = io.Outcome(
                "error",
                reached,
                f"{error_line(exc)} (at t = {reached:.6g}"
                + ("" if last is None else f"; snapshots up to t = {last:.6g} are complete")
                + ")",
                error_reason(exc),
            )
            raise
        finally:
            progress.done()
            provenance = {"wall_time": _time.perf_counter() - start}
            if solver is not None:
                provenance.update(session.provenance(solver, recorder))
            with signals.held(deliver=False):
                writer.close(outcome, provenance=provenance)
    return output


def result_outcome(result) -> io.Outcome:
    """The file's :class:`tpde.io.Outcome` of a solver's Result: its status (``failed``,
    the numerics failing in the co-moving frame, is the file's ``error``), time, message
    and, for an error, its typed reason (``Result.status_reason``)."""
    if result.status == "failed":
        return io.Outcome(
            "error",
            result.status_time,
            result.status_message,
            result.status_reason or "exception",
        )
    return io.Outcome(result.status, result.status_time, result.status_message)


def check_resumable(output: Path, found: dict, config: Any, times: Any) -> None:
    """Refuse, in one line (ConfigError), to continue ``found`` (what
    :func:`tpde.io.reopen_output` hands ``accept``) with ``config`` and its snapshot
    ``times``: a run that ended with a result, a different config (:func:`same_config`:
    defaults filled in on both sides), no complete snapshot, nothing left to run. Every
    geometry's resume asks it."""
    refuse_result(output, found["outcome"])
    if not same_config(found["config"], config):
        raise ConfigError(
            f"run.output: {output} was written with a different config; "
            "resume with the config stored in the file (tpde info shows it)"
        )
    if not found["snapshots"]:
        raise ConfigError(
            f"run.output: {output} holds no complete snapshot; start a new run with --overwrite"
        )
    if not times_after(times, found["time"]):
        raise ConfigError(
            f"run.output: {output} is already complete (t = {found['time']:.6g}); nothing to resume"
        )


def _resumable(output: Path, found: dict, config: Config, problem) -> dict:
    """Check that ``found`` (:meth:`tpde.io.SnapshotWriter.resume`) can be continued by
    ``config`` (:func:`check_resumable`); returns its state plus the snapshot times still
    to come."""
    check_resumable(output, found, config, problem.times)
    state = _resume_state(Path(found["file"]))
    remaining = times_after(problem.times, state["time"])
    return {**state, "remaining": remaining}


def same_config(stored: str, config: Config) -> bool:
    """Whether the config text stored in a file has the same values as ``config`` on any
    geometry, defaults filled in on both sides (:func:`tpde.config.same_config`: key order,
    ``1`` vs ``1.0``, omitted defaults and ``run.output`` do not count)."""
    return same_values(stored, config)


def _resume_state(path: Path) -> dict:
    try:
        return io.resume_state(path)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        message = str(exc).splitlines()[0]
        raise ConfigError(
            message
            if message.startswith("run.output")
            else f"run.output: cannot resume {path}: {message}"
        ) from None


@contextlib.contextmanager
def profiled(enabled: bool = True, stream=None) -> Iterator[dict]:
    """With ``enabled`` (``tpde run --profile``): time the phases of what runs inside
    (:mod:`tpde.grid.profile`) and print their table, with the wall time of the block, to
    ``stream`` (stderr) when it ends, also by an exception. Yields the phases' records
    (filled at the end); nothing is timed or printed otherwise."""
    if not enabled:
        yield {}
        return
    start = _time.perf_counter()
    phases: dict = {}
    try:
        with profile.profiling() as phases:
            yield phases
    finally:
        wall = _time.perf_counter() - start
        print(
            f"phase times (tpde run --profile)\n{profile.table(phases, wall)}",
            file=stream or sys.stderr,
        )


def simulate(
    source: Any, output: str | Path | None = None, overwrite: bool = False, quiet: bool = True
):
    """Run a configuration (a Config, a TOML path or text, or a mapping) and return the
    output as an ``xarray.Dataset`` (the variables and attributes of the NetCDF file).

    output: also keep the file there (default: a temporary file, deleted afterwards).
    """
    config = source if isinstance(source, Config) else build(source)
    if output is not None:
        return io.read(run_config(config, output, overwrite=overwrite, quiet=quiet))
    with tempfile.TemporaryDirectory(prefix="tpde-") as tmp:
        return io.read(run_config(config, Path(tmp) / "run.nc", quiet=quiet))
