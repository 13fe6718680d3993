"""The one time loop: steps of a mesh's operator, and the callbacks that watch and steer them.

docs/architecture.md, 'The time loop and its callbacks'. A :class:`TimeLoop` advances a state
from snapshot time to snapshot time; the geometry supplies the operator side (what one step
is, the step its stability allows, how a step lands on a stop, what a snapshot holds) and
everything else is a :class:`Callback` in the loop's list, called in order::

    start                                  once, before the first step
    for each step:
        begin_step   -> Stop | None        before anything is evaluated (the step budget)
        plan         =  the operator's velocity at the step's start and its stable step
        limit_dt     -> dt                 step control (the frame's error, the noise's grid)
        land            the step shortened to land on the next stop (the operator's rule)
        before_step  -> Stop | None        the resolution monitor (it ends a run before a
                                           step that would pass its tolerance)
        attempt         retried with half the step after a negative update (STEP_TRIES)
        after_step   -> Stop | None        resolution estimate, atom transfers, outflow,
                                           the box, collapse and blow-up monitors
    on_snapshot(snapshot)                  at every snapshot: the writer, progress
    end(result)                            once, with the result

A hook that returns a :class:`Stop` ends the run with its typed outcome (``status`` one of
the solver's STATUSES, ``reason`` the typed cause a file and a sweep read, ``message`` for
people); ``None`` goes on. A plain callable in the list is a snapshot callback (it is called
with each snapshot). The shape follows Trixi.jl's ``CallbackSet`` (a step-size callback, a
save-solution callback, summary callbacks, each with initialize / affect / finalize) and
py-pde's trackers (handle at interrupts, finalize at the end); unlike either, a stop carries
a typed status and reason that reach the file, and the snapshot hand-off writes one durable
record per snapshot (tpde.io).
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .operator import PositivityError

__all__ = [
    "MAX_STEPS",
    "STEP_TRIES",
    "FAILURE_REASONS",
    "SimulationError",
    "Stop",
    "StepPlan",
    "Callback",
    "StepBudget",
    "ResolutionMonitor",
    "AtomTransfers",
    "TimeLoop",
]

#: the steps a run may take (``Problem.max_steps``; every geometry): a run past it ends with
#: an error naming the time, not hours later
MAX_STEPS = 10_000_000
#: how often a step whose update went negative is halved and redone before the run ends
#: (each retry halves dt: 30 is a factor 1e-9)
STEP_TRIES = 30
#: why the numerics failed (:attr:`SimulationError.reason`, the file's ``status_reason``):
#: a non-finite value, the step budget ``max_steps`` spent, a fixed ``scheme.dt`` above the
#: positivity bound, the step halved STEP_TRIES times without passing the limiter
FAILURE_REASONS = ("non_finite", "max_steps", "step_bound", "step_collapse")


class SimulationError(RuntimeError):
    """The numerics failed (non-finite values, step size collapse); message names t and step.

    ``reason``: one of :data:`FAILURE_REASONS`, the typed cause a file and a sweep read (the
    message is for people)."""

    def __init__(self, message: str, reason: str = "non_finite"):
        if reason not in FAILURE_REASONS:
            raise ValueError(f"SimulationError: reason {reason!r} not in {FAILURE_REASONS}")
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Stop:
    """A callback's verdict that the run ends now: ``status`` (the solver's STATUSES),
    ``message`` (one line for people), ``reason`` (the typed cause, "" where the status says
    it all)."""

    status: str
    message: str
    reason: str = ""


@dataclass
class StepPlan:
    """What the operator found at a step's start: ``velocity`` (its face velocity: a
    FaceVelocity on a flat grid, the node speeds on the cubed sphere), ``dt`` the step its
    stability bound allows (before step control and landing), ``rate`` the resolution
    monitor's rate at the start (set by the monitor, 0 without it)."""

    velocity: Any
    dt: float
    rate: float = 0.0

    def take(self) -> Any:
        """The velocity, once: the step drops it after its last use (memory: one face
        velocity alive at a time); later takes return None (a retry evaluates it again)."""
        velocity, self.velocity = self.velocity, None
        return velocity


class Callback:
    """One thing the loop runs around each step (module docstring); every hook does nothing
    by default, so a callback defines only the hooks it needs."""

    def start(self, loop: TimeLoop) -> None:
        """Once, before the first step."""

    def begin_step(self, loop: TimeLoop) -> Stop | None:
        """Before a step, before its velocity is evaluated."""
        return None

    def limit_dt(self, loop: TimeLoop, plan: StepPlan, dt: float) -> float:
        """The step this callback allows (step control): ``dt`` or less."""
        return dt

    def before_step(self, loop: TimeLoop, plan: StepPlan, dt: float) -> Stop | None:
        """With the step ``dt`` as it will be tried (landed on the next stop)."""
        return None

    def after_step(self, loop: TimeLoop, plan: StepPlan) -> Stop | None:
        """After an accepted step (``loop.t``, ``loop.steps``, ``loop.last_dt`` are its)."""
        return None

    def on_snapshot(self, loop: TimeLoop, snapshot: Any) -> None:
        """At every snapshot (the initial one too)."""

    def end(self, loop: TimeLoop, result: Any) -> None:
        """Once, with the result (also when the run ends by an exception: then before it
        propagates)."""


class StepBudget(Callback):
    """``max_steps``: a run that would take one step more fails (``SimulationError`` with
    reason ``max_steps``, naming the time)."""

    def __init__(self, max_steps: int = MAX_STEPS):
        self.max_steps = int(max_steps)

    def begin_step(self, loop: TimeLoop) -> Stop | None:
        if loop.steps >= self.max_steps:
            raise SimulationError(
                f"run.max_steps = {self.max_steps} reached at t = {loop.t:.6g}", "max_steps"
            )
        return None


class ResolutionMonitor(Callback):
    """The resolution monitor (:mod:`.monitor`; docs/theory.md, 'The resolution monitor'):
    before a step, the operator's estimate of the share of the mass its reconstruction will
    misplace in it (``loop.check_resolution``: an ``under_resolved`` event, or a stop before
    the step); after it, that share added to the run's estimate (``loop.add_resolution``).
    The geometry's operator computes the rate; the monitor says when."""

    def before_step(self, loop: TimeLoop, plan: StepPlan, dt: float) -> Stop | None:
        return loop.check_resolution(plan, dt)

    def after_step(self, loop: TimeLoop, plan: StepPlan) -> Stop | None:
        loop.add_resolution(plan)
        return None


class AtomTransfers(Callback):
    """After each step: cells <-> atoms (births, merges, releases, each conserving mass and
    moments), or with atoms off the pinning watch (``loop.transfer_atoms``)."""

    def after_step(self, loop: TimeLoop, plan: StepPlan) -> Stop | None:
        loop.transfer_atoms()
        return None


class TimeLoop:
    """The loop every geometry's solver runs (module docstring). A subclass supplies the
    operator side: :meth:`plan`, :meth:`land`, :meth:`reached`, :meth:`attempt`,
    :meth:`snapshot`, :meth:`schedule`, :meth:`new_result`, :meth:`finish` (and, where its
    callbacks ask for them, ``check_resolution`` / ``add_resolution`` / ``transfer_atoms``).
    """

    t: float
    steps: int
    rejected: int
    last_dt: float
    callbacks: list[Callback | Callable[[Any], None]]
    status_message: str
    status_reason: str
    #: exceptions after which a step is redone (:meth:`retried` says with which step)
    retryable: tuple[type[BaseException], ...] = (PositivityError,)
    #: whether a stop reached without a step takes no second snapshot of the same state
    dedupe_snapshots: bool = True

    # ---- the operator side ----------------------------------------------------------------
    def plan(self) -> StepPlan:
        """The velocity at the step's start and the step its stability bound allows."""
        raise NotImplementedError

    def land(self, dt: float, remaining: float) -> float:
        """The step shortened to land on a stop ``remaining`` ahead."""
        raise NotImplementedError

    def reached(self, target: float) -> bool:
        """Whether the state has reached the stop ``target``."""
        return not self.t < target

    def attempt(self, plan: StepPlan, dt: float) -> None:
        """One step of size ``dt`` (raises one of :attr:`retryable` to be redone)."""
        raise NotImplementedError

    def begin_attempts(self) -> None:
        """Before a step's first attempt (what a retry starts from)."""

    def restore(self) -> None:
        """After a rejected attempt: back to the state the attempts started from."""

    def accepted(self, target: float) -> None:
        """After an accepted step towards ``target``."""

    def retried(self, exc: BaseException, dt: float, tries: list) -> float | Stop:
        """The step to redo after ``exc`` (half the step after a negative update), or a
        :class:`Stop` that ends the run."""
        self.rejected += 1
        self.restore()
        return 0.5 * dt

    def check_resolution(self, plan: StepPlan, dt: float) -> Stop | None:
        """The resolution monitor before a step (:class:`ResolutionMonitor`)."""
        raise NotImplementedError

    def add_resolution(self, plan: StepPlan) -> None:
        """The resolution monitor after a step (:class:`ResolutionMonitor`)."""
        raise NotImplementedError

    def transfer_atoms(self) -> None:
        """Cells <-> atoms after a step (:class:`AtomTransfers`)."""
        raise NotImplementedError

    def snapshot(self) -> Any:
        raise NotImplementedError

    def schedule(self) -> tuple[bool, list[tuple[float, bool]]]:
        """Whether the start is a snapshot, and the stops ``(time, is_snapshot)``."""
        raise NotImplementedError

    def new_result(self) -> Any:
        raise NotImplementedError

    def finish(self, result: Any, wall_time: float) -> None:
        """What the run adds to its result at the end (counts, events, estimates)."""

    def monitor_state(self) -> dict[str, float | bool | int]:
        """What the callbacks have found so far that a run resumed from the snapshot being
        taken must know to go on as this one does: the resolution monitor's estimate and
        the flags of the warnings already given (each is given once a run). Stored with
        every snapshot (``Snapshot.state``), handed back by :meth:`restore_monitor_state`."""
        return {}

    def restore_monitor_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a stored :meth:`monitor_state` (a resumed run, before it starts);
        a key missing (a file of an earlier tpde) keeps the fresh run's value."""

    # ---- the callbacks ---------------------------------------------------------------------
    def _hooked(self) -> list[Callback]:
        return [c for c in self.callbacks if isinstance(c, Callback)]

    def handed(self, snapshot: Any) -> None:
        """Hand a snapshot to every callback (a plain callable is called with it)."""
        for callback in self.callbacks:
            if isinstance(callback, Callback):
                callback.on_snapshot(self, snapshot)
            else:
                callback(snapshot)

    def _stopped(self, stop: Stop) -> str:
        self.status_message = stop.message
        self.status_reason = stop.reason
        return stop.status

    # ---- the loop --------------------------------------------------------------------------
    def advance_to(self, target: float) -> str:
        """Step until the stop ``target``; the status (``completed`` when reached)."""
        return self._advance_to(target)

    def _advance_to(self, target: float) -> str:
        hooked = self._hooked()
        while not self.reached(target):
            for callback in hooked:
                stop = callback.begin_step(self)
                if stop is not None:
                    return self._stopped(stop)
            plan = self.plan()
            dt = plan.dt
            for callback in hooked:
                dt = callback.limit_dt(self, plan, dt)
            dt = self.land(dt, target - self.t)
            for callback in hooked:
                stop = callback.before_step(self, plan, dt)
                if stop is not None:  # (the run ends before the step)
                    return self._stopped(stop)
            tries: list = []  # what the rejected attempts found (the frame's (dt, error))
            self.begin_attempts()
            for _attempt in range(STEP_TRIES):
                try:
                    self.attempt(plan, dt)
                    break
                except self.retryable as exc:  # redone from its start
                    retry = self.retried(exc, dt, tries)
                    if isinstance(retry, Stop):
                        return self._stopped(retry)
                    dt = retry
            else:
                raise SimulationError(
                    f"step size collapsed below {dt:.3e} at t = {self.t:.6g}", "step_collapse"
                )
            self.accepted(target)
            for callback in hooked:
                stop = callback.after_step(self, plan)
                if stop is not None:
                    return self._stopped(stop)
        return "completed"

    def run(self) -> Any:
        """From the start through every stop; the result (its status the first stop's, or
        ``completed``). Snapshots land exactly on their times."""
        start = _time.perf_counter()
        result = self.new_result()
        for callback in self._hooked():
            callback.start(self)
        initial, stops = self.schedule()
        if initial:
            result.snapshots.append(self.snapshot())
        try:
            for t_stop, is_snapshot in stops:
                status = self.advance_to(t_stop)
                if not is_snapshot and status == "completed":
                    continue
                same = bool(result.snapshots) and result.snapshots[-1].step == self.steps
                if not (self.dedupe_snapshots and same):  # (a stop before any step: none)
                    result.snapshots.append(self.snapshot())
                if status != "completed":
                    result.status = status
                    result.status_time = self.t
                    result.status_message = self.status_message
                    result.status_reason = self.status_reason
                    break
        finally:
            self.finish(result, _time.perf_counter() - start)
            for callback in self._hooked():
                callback.end(self, result)
        if result.status == "completed":
            result.status_time = self.t
        return result


def plain_snapshot_callbacks(
    on_snapshot: Callable[[Any], None] | Sequence[Callable[[Any], None]],
) -> list[Callable[[Any], None]]:
    """``on_snapshot`` (one callable or several) as a list."""
    return [on_snapshot] if callable(on_snapshot) else list(on_snapshot)
