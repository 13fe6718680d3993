"""Running a configuration: the solver, the NetCDF writer, progress and resume.

``simulate(config)`` is the Python face (returns the output as an ``xarray.Dataset``, the
same variables as the file); ``tpde run`` calls :func:`run_config`.
"""

from __future__ import annotations

import sys
import tempfile
import time as _time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tpde.schemes.solver import SimulationError, Snapshot, Solver

from . import io
from .config import Config, ConfigError, build
from .energies import run_energies

__all__ = ["Progress", "run_config", "simulate"]


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
        self.status.show(
            f"[{bar}] t = {snap.time:.4g}/{self.t_end:.4g}  dt {snap.dt:.2e}  "
            f"max|u| {snap.max_speed:.3g}  min rho "
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

    resume: continue the interrupted file ``output`` (its stored config must equal this one).
    The status (completed, mass_left_domain, error) is stored in the file, and the energies
    of :func:`tpde.energies.run_energies` at every snapshot (``energy_<name>`` records).
    """
    output = Path(output)
    problem = config.problem
    energies = run_energies(config)  # the same energies on new and resumed runs
    skip_first = False
    if resume:
        state = _resume_state(output)
        if state["config"].strip() != config.text.strip():
            raise ConfigError(
                f"run.output: {output} was written with a different config; "
                "resume with the config stored in the file (tpde info shows it)"
            )
        remaining = [t for t in problem.times if t > state["time"] * (1 + 1e-14) + 1e-300]
        if not remaining:
            raise ConfigError(
                f"run.output: {output} is already complete (t = "
                f"{state['time']:.6g}); nothing to resume"
            )
        problem = replace(
            problem,
            density=state["density"],
            t_start=state["time"],
            snapshots=[state["time"]] + remaining,
            initial_outflow=state["outflow"],
        )
        writer = _writer(lambda: io.SnapshotWriter.resume(output, energies=energies))
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
        writer.write(snap)
        progress(snap)

    status, status_time, message = "interrupted", problem.t_start, "the run did not finish"
    try:
        result = Solver(problem, on_snapshot=on_snapshot).run()
        status, status_time, message = result.status, result.status_time, result.status_message
    except SimulationError as exc:
        status, status_time, message = "error", float("nan"), str(exc)
        raise
    except KeyboardInterrupt:
        message = "interrupted by the user (resume with --resume)"
        raise
    finally:
        progress.done()
        writer.close(status, status_time, message)
    return output


def _writer(make):
    """Create the writer, turning a bad output path into a one-line ConfigError."""
    try:
        return make()
    except (ValueError, OSError, RuntimeError) as exc:
        message = str(exc).splitlines()[0]
        raise ConfigError(
            message if message.startswith("run.output") else f"run.output: {message}"
        ) from None


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
        return io.read(path)
    with tempfile.TemporaryDirectory(prefix="tpde-") as tmp:
        path = run_config(config, Path(tmp) / "run.nc", quiet=quiet)
        return io.read(path)
