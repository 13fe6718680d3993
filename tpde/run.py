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
from typing import Any

from tpde.grid import profile
from tpde.schemes.frame import AffineFrame
from tpde.schemes.solver import Snapshot, Solver
from tpde.variants.energies import run_energies

from . import io
from .config import Config, ConfigError, build
from .config import same_config as same_values
from .lifecycle import Interrupted, error_line, error_reason, refuse_result
from .lifecycle import RunSignals as _Signals
from .lifecycle import open_writer as _writer

__all__ = [
    "Interrupted",
    "Progress",
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


class Progress:
    """One status line per snapshot: t, dt, CFL-limited speed, min density, mass, outflow.

    On a terminal the line is redrawn in place (a progress bar); otherwise one log line per
    snapshot; ``quiet`` prints nothing.
    """

    def __init__(self, t_end: float, quiet: bool = False, stream=None):
        self.t_end = t_end
        self.status = StatusLine(not quiet, stream)

    def __call__(self, snap: Snapshot) -> None:
        if not self.status.enabled:
            return
        fraction = snap.time / self.t_end if self.t_end else 1.0
        bar = "#" * int(20 * fraction) + "." * (20 - int(20 * fraction))
        # the first snapshot comes before any step: no dt or speed to show yet
        stepped = math.isfinite(snap.dt)
        step = (
            f"dt {snap.dt:.2e}  max|u| {snap.max_speed:.3g}" if stepped else "before the first step"
        )
        self.status.show(
            f"[{bar}] t = {snap.time:.4g}/{self.t_end:.4g}  {step}  min rho "
            f"{float(snap.density.min()):.1e}  mass {snap.mass:.9f}  outflow "
            f"{snap.outflow:.1e}  {self.status.elapsed():.1f} s"
        )
        if fraction >= 1.0:
            self.status.close()

    def done(self) -> None:
        self.status.close()


def run_config(
    config: Config,
    output: str | Path,
    overwrite: bool = False,
    resume: bool = False,
    quiet: bool = True,
    history: str = "",
) -> Path:
    """Run ``config`` writing every snapshot to ``output`` (NetCDF); returns the path.

    resume: continue the file ``output`` (its stored config must have the same values as
    this one; a run that ended with a result, :data:`tpde.io.RESULTS`, is not resumed).
    The file records how the run ended (:class:`tpde.io.Outcome`): the solver's status
    (completed, mass_left_domain, box_limited, blowup) with its time and message;
    ``interrupted`` for SIGINT, SIGTERM and SIGHUP (:class:`Interrupted` is raised after
    the file says so; its time is the last complete snapshot's); ``error`` for any
    exception, raised again after the file says so (its time is the time the run had
    reached). :class:`tpde.io.DiskFull` ends a run as ``error`` with every earlier snapshot
    readable and resumable. With ``overwrite`` an existing file is replaced only by a run
    that ends with a result (:class:`tpde.io.SnapshotWriter`). The energies of
    :func:`tpde.variants.energies.run_energies` are written at every snapshot (``energy_<name>``).

    An ``output`` ending in ``.zarr`` is a Zarr store: the run writes the NetCDF file
    :func:`tpde.io.zarr_staging` and copies it into the store when it ends with a result
    (:func:`tpde.io.netcdf_to_zarr`); an interrupted or failed run leaves that file. Not
    resumable (:func:`tpde.io.check_zarr_output` refuses ``resume`` in one line).
    """
    if config.runner is not None:  # a geometry with its own solver and file (tpde.sphere)
        return config.runner(config, output, overwrite, resume, quiet, history)
    if io.is_zarr(output):
        staging = io.check_zarr_output(output, overwrite, resume)
        run_config(config, staging, overwrite=overwrite, quiet=quiet, history=history)
        io.netcdf_to_zarr(staging, output)
        return Path(output)
    output = Path(output)
    problem = config.problem
    # the same energies on new and resumed runs; none in the co-moving frame, whose density
    # lives in frame coordinates (the energies' kernels are written for physical ones)
    energies = None if problem.frame is not None else run_energies(config)
    skip_first = False
    signals = _Signals()
    with signals:
        if resume:
            state: dict = {}

            def accept(found: dict) -> None:
                state.update(_resumable(output, found, config, problem))

            writer = _writer(
                lambda: io.SnapshotWriter.resume(output, energies=energies, accept=accept)
            )
            problem = replace(
                problem,
                density=state["density"],
                t_start=state["time"],
                snapshots=[state["time"]] + state["remaining"],
                initial_outflow=state["outflow"],
                initial_reconstruction_error=state["reconstruction_error"],
                frame=(
                    problem.frame if state.get("frame") is None else AffineFrame(*state["frame"])
                ),
            )
            if problem.atoms is not None and state.get("atoms") is not None:
                problem.initial_atoms, problem.next_atom_id = state["atoms"]
            skip_first = True
        else:
            writer = _writer(
                lambda: io.SnapshotWriter(
                    output,
                    problem.grid,
                    config_text=config.text,
                    overwrite=overwrite,
                    history=history,
                    positions=problem.positions,
                    energies=energies,
                )
            )
        progress = Progress(problem.t_end, quiet=quiet)

        def on_snapshot(snap: Snapshot) -> None:
            nonlocal skip_first
            if skip_first:  # the state the resumed run starts from is already stored
                skip_first = False
                return
            with signals.held():
                writer.write(snap)
            progress(snap)

        solver = None
        outcome = io.Outcome("error", problem.t_start, "the run did not start")
        start = _time.perf_counter()
        try:
            solver = Solver(problem, on_snapshot=on_snapshot)
            result = solver.run()
            outcome = result_outcome(result)
        except KeyboardInterrupt as exc:
            name = exc.name if isinstance(exc, Interrupted) else "SIGINT"
            last = writer.last_time if writer.last_time is not None else problem.t_start
            reached = solver.t if solver is not None else problem.t_start
            outcome = io.Outcome(
                "interrupted",
                last,
                f"interrupted by {name} at t = {reached:.6g}; snapshots up to t = {last:.6g} "
                "are complete; continue with --resume",
            )
            raise
        except BaseException as exc:
            reached = solver.t if solver is not None else problem.t_start
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
            with signals.held(deliver=False):
                writer.close(outcome, provenance=_provenance(solver, start))
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


def _provenance(solver: Solver | None, start: float) -> dict[str, Any]:
    """What the file records of this run segment (:data:`tpde.io.COUNTERS` are summed over
    resumes): wall time, and once the solver exists its steps, rejected steps, threads."""
    out: dict[str, Any] = {"wall_time": _time.perf_counter() - start}
    if solver is not None:
        from tpde.grid.threads import ensure_policy

        out.update(steps=solver.steps, rejected_steps=solver.rejected, threads=ensure_policy())
        monitor = solver.monitor  # what the box and the covariance did (schemes.monitor)
        out["largest_truncation"] = monitor.largest
        out["reconstruction_error"] = monitor.reconstruction_error
        out["events"] = "\n".join(f"{e.kind} {e.time:.9g} {e.message}" for e in monitor.events)
    return out


def _resumable(output: Path, found: dict, config: Config, problem) -> dict:
    """Check that ``found`` (:meth:`tpde.io.SnapshotWriter.resume`) can be continued by
    ``config``; returns its state plus the snapshot times still to come."""
    refuse_result(output, found["outcome"])
    if not same_config(found["config"], config):
        raise ConfigError(
            f"run.output: {output} was written with a different config; "
            "resume with the config stored in the file (tpde info shows it)"
        )
    state = _resume_state(Path(found["file"]))
    remaining = [t for t in problem.times if t > state["time"] * (1 + 1e-14) + 1e-300]
    if not remaining:
        raise ConfigError(
            f"run.output: {output} is already complete (t = {state['time']:.6g}); nothing to resume"
        )
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
        path = run_config(config, output, overwrite=overwrite, quiet=quiet)
        return _read(path, config)
    with tempfile.TemporaryDirectory(prefix="tpde-") as tmp:
        path = run_config(config, Path(tmp) / "run.nc", quiet=quiet)
        return _read(path, config)


def _read(path: Path, config: Config):
    """The output as a Dataset: :func:`tpde.io.read`, or the sphere's file as it is stored
    (:func:`tpde.sphere.read_sphere`)."""
    return io.read(path) if config.reader is None else config.reader(path)
