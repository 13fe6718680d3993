"""What every run shares, whatever its geometry: the signals that interrupt it
(:class:`Interrupted`, held while a record is written: :class:`RunSignals`), its one-line
error text, the refusal to resume a file that ended with a result, and the writer's
creation with a bad path said in one line. tpde.run (flat grids, the circle) and
tpde.sphere use it; it imports neither."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tpde.schemes.solver import SimulationError

from . import io
from .config_core import ConfigError

__all__ = [
    "Interrupted",
    "RunSignals",
    "error_line",
    "error_reason",
    "open_writer",
    "refuse_result",
]


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP during a run (a KeyboardInterrupt, so code that stops on
    Ctrl-C stops on these as well); ``signum`` is the signal."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(signal.Signals(self.signum).name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class RunSignals:
    """While a run is on: SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted`, except
    inside :meth:`held` (a snapshot being written, the final status), where the signal
    waits for the block to end. Installed only in the main thread (a dask worker runs
    its tasks in other threads; its nanny stops them)."""

    NAMES = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> RunSignals:
        if threading.current_thread() is threading.main_thread():
            for name in self.NAMES:
                number = getattr(signal, name, None)
                if number is not None:
                    with contextlib.suppress(OSError, ValueError):
                        self.previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self.previous.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(number, handler)
        self.previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.depth:
            self.pending = self.pending or signum
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def held(self, deliver: bool = True) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if deliver and not self.depth and self.pending is not None:
            signum, self.pending = self.pending, None
            raise Interrupted(signum)


def error_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (one line, for stderr and the file)."""
    if isinstance(exc, io.DiskFull | ConfigError | io.OutputError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, MemoryError):
        return "MemoryError: out of memory" + (f" ({exc})" if str(exc) else "")
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def error_reason(exc: BaseException) -> str:
    """The typed cause of a run that ended with ``exc`` (:data:`tpde.io.ERROR_REASONS`, the
    file's ``status_reason``): the solver's own (``SimulationError.reason``: a non-finite
    value, ``max_steps``, ...), else the kind of the exception."""
    if isinstance(exc, SimulationError):
        return exc.reason
    if isinstance(exc, io.DiskFull):
        return "disk_full"
    if isinstance(exc, ConfigError):
        return "config"
    if isinstance(exc, io.OutputError):
        return "output"
    if isinstance(exc, MemoryError):
        return "memory"
    return "exception"


def refuse_result(output: Path, outcome: io.Outcome) -> None:
    """Raise a one-line ConfigError when the file ``output`` ended with a result
    (:data:`tpde.io.RESULTS`): a resume continues interruptions and errors only."""
    if outcome.status == "completed":
        raise ConfigError(
            f"run.output: {output} is already complete (t = {outcome.time:.6g}); nothing to resume"
        )
    if outcome.result:
        raise ConfigError(
            f"run.output: {output} ended with status {outcome.status} at t = "
            f"{outcome.time:.6g}, a result of the dynamics, not an interruption; nothing to "
            "resume (start a new run with --overwrite)"
        )


def open_writer(make):
    """Create the writer, turning a bad output path into a one-line ConfigError (a full
    disk and a busy output are raised as they are)."""
    try:
        return make()
    except (io.DiskFull, io.OutputBusy, ConfigError):
        raise
    except (ValueError, OSError, RuntimeError) as exc:
        message = str(exc).splitlines()[0]
        raise ConfigError(
            message if message.startswith("run.output") else f"run.output: {message}"
        ) from None
