"""Per-phase timers: a module-level registry of named phases, off unless enabled.

    from tpde.grid import profile

    with profile.phase("fluxes"):
        ...

    @profile.timed("limiter")              # the same around every call of a function
    def limit(...): ...

    with profile.profiling() as phases:     # enable, run, disable
        solver.run()
    print(profile.table(phases, wall))

Disabled (the default), :func:`phase` returns one shared no-op context manager and a
:func:`timed` function calls through: a global test and a function call per use, nothing
recorded. Enabled, every phase records its calls, its total (inclusive) time and its self
time (the total less the phases opened inside it: phases nest as the calls do), so the self
times of all phases add up to at most the wall time of the run. The registry is
per process (a sweep's workers profile nothing unless they enable it) and not thread safe:
phases are opened by the Python thread that drives the solver.

The phases of the project (the ``velocity.*`` engines also count where the energies of a
snapshot use them):

=====================================  ======================================================
``velocity``                           the solver's face velocities, the rest of the field
``velocity.tables``                    kernel-sum tables: matrix products, velocity tables
``velocity.tables.estimate``           the error estimate of the adaptive tables
``velocity.interpolation.passes``      sheared 1-D passes of a table onto lattices
``velocity.interpolation.pointwise``   pointwise 12^d stencils
``velocity.direct``                    dense kernel sums
``velocity.fft``                       FFT convolutions
``velocity.sinkhorn``                  Sinkhorn iterations (their sums are phases of their own)
``euler``                              forward-Euler updates (divergence, positivity check)
``fluxes``                             reconstruction and flux kernels
``limiter``                            the positivity limiter
``rk.combine``                         the Runge-Kutta stage combinations
``io.write``                           snapshot records: moments, energies, the file write
=====================================  ======================================================
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import ParamSpec, TypeVar

__all__ = [
    "enabled",
    "phase",
    "profiling",
    "records",
    "reset",
    "set_enabled",
    "table",
    "timed",
]

P = ParamSpec("P")
R = TypeVar("R")


class Record:
    """One phase's calls, total (inclusive) and self seconds."""

    __slots__ = ("calls", "self_s", "total_s")

    def __init__(self) -> None:
        self.calls, self.total_s, self.self_s = 0, 0.0, 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {"calls": self.calls, "total_s": self.total_s, "self_s": self.self_s}


_enabled = False
_records: dict[str, Record] = {}
_stack: list[list[float]] = []  # per open phase: [start, time of the phases inside it]


class _Off:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Phase:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> None:
        _stack.append([perf_counter(), 0.0])

    def __exit__(self, *exc: object) -> None:
        start, inner = _stack.pop()
        elapsed = perf_counter() - start
        record = _records.get(self.name)
        if record is None:
            record = _records[self.name] = Record()
        record.calls += 1
        record.total_s += elapsed
        record.self_s += elapsed - inner
        if _stack:
            _stack[-1][1] += elapsed


_OFF = _Off()


def phase(name: str) -> _Off | _Phase:
    """A context manager that times the phase ``name`` (a no-op while disabled)."""
    return _Phase(name) if _enabled else _OFF


def timed(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: every call of the function is the phase ``name``."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            if not _enabled:
                return function(*args, **kwargs)
            with _Phase(name):
                return function(*args, **kwargs)

        return wrapper

    return decorate


def enabled() -> bool:
    return _enabled


def set_enabled(on: bool) -> None:
    """Switch the timers on or off (what was recorded stays until :func:`reset`)."""
    global _enabled
    _enabled = bool(on)


def reset() -> None:
    """Forget every record."""
    _records.clear()
    _stack.clear()


def records() -> dict[str, dict[str, float | int]]:
    """name -> {"calls", "total_s", "self_s"}, in the order the phases were first closed."""
    return {name: record.as_dict() for name, record in _records.items()}


@contextlib.contextmanager
def profiling() -> Iterator[dict[str, dict[str, float | int]]]:
    """Enable the timers on a fresh registry for the block; the dict it yields is filled
    with :func:`records` when the block ends (the timers are then off again)."""
    reset()
    set_enabled(True)
    result: dict[str, dict[str, float | int]] = {}
    try:
        yield result
    finally:
        set_enabled(False)
        result.update(records())


def table(phases: dict[str, dict[str, float | int]], wall_s: float) -> str:
    """The phases as a text table: phase, calls, total s, self s and the self share of
    ``wall_s`` (the untimed rest on the last line), longest self time first."""
    lines = [f"{'phase':<34}{'calls':>9}{'total s':>11}{'self s':>11}{'share':>8}"]
    timed = 0.0
    for name, r in sorted(phases.items(), key=lambda item: -item[1]["self_s"]):
        timed += r["self_s"]
        share = r["self_s"] / wall_s if wall_s > 0 else 0.0
        lines.append(
            f"{name:<34}{r['calls']:>9d}{r['total_s']:>11.3f}{r['self_s']:>11.3f}{share:>8.1%}"
        )
    rest = max(wall_s - timed, 0.0)
    share = rest / wall_s if wall_s > 0 else 0.0
    lines.append(f"{'(untimed)':<34}{'':>9}{'':>11}{rest:>11.3f}{share:>8.1%}")
    lines.append(f"{'wall':<34}{'':>9}{wall_s:>11.3f}")
    return "\n".join(lines)
