"""The one time loop (tpde.schemes.loop.TimeLoop) and its callbacks, on the flat grid and on
the cubed sphere alike: the hooks run in their order, a Stop ends the run with its typed
outcome, a step-control callback sets the step (the step count in closed form), and both
geometries carry the shared guards (step budget, retries, resolution monitor)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpde.grid import Grid, gaussian
from tpde.grid import cubed_sphere as cs
from tpde.schemes.cubed_sphere import SphereSolver
from tpde.schemes.loop import Callback, ResolutionMonitor, StepBudget, Stop, TimeLoop
from tpde.schemes.solver import Problem, Scheme, SimulationError, Solver
from tpde.variants import ConstantVelocity
from tpde.variants.cubed_sphere import SolidRotation

T_END = 0.5


class Recorder(Callback):
    """Records the hooks as they run; ``stop_after``: a Stop after that many steps;
    ``dt``: a step-control callback fixing the step."""

    def __init__(self, stop_after: int | None = None, dt: float | None = None):
        self.calls: list[str] = []
        self.stop_after, self.dt = stop_after, dt

    def start(self, loop: TimeLoop) -> None:
        self.calls.append("start")

    def begin_step(self, loop: TimeLoop) -> Stop | None:
        self.calls.append("begin_step")
        return None

    def limit_dt(self, loop, plan, dt: float) -> float:
        self.calls.append("limit_dt")
        return dt if self.dt is None else min(dt, self.dt)

    def before_step(self, loop, plan, dt: float) -> Stop | None:
        self.calls.append("before_step")
        return None

    def after_step(self, loop, plan) -> Stop | None:
        self.calls.append("after_step")
        if self.stop_after is not None and loop.steps >= self.stop_after:
            return Stop("blowup", f"stopped by the test at t = {loop.t:.6g}", "test")
        return None

    def on_snapshot(self, loop, snapshot) -> None:
        self.calls.append("on_snapshot")

    def end(self, loop, result) -> None:
        self.calls.append("end")


def flat(recorder: Recorder, **problem) -> Solver:
    grid = Grid([-4.0], [4.0], [64], "periodic")
    density = gaussian(grid, [0.0], [[0.3]])
    solver = Solver(Problem(grid, density, ConstantVelocity([1.0]), T_END, **problem))
    solver.callbacks.append(recorder)
    return solver


def sphere(recorder: Recorder, **options) -> SphereSolver:
    grid = cs.cubed_sphere(8)
    density = cs.von_mises_fisher(grid, (0.0, 0.0, 1.0), 4.0)
    solver = SphereSolver(grid, density, SolidRotation([1.0, 0.0, 0.0], 1.0), T_END, **options)
    solver.callbacks.append(recorder)
    return solver


GEOMETRIES = {"flat": flat, "sphere": sphere}


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_the_hooks_run_in_order_and_a_stop_ends_the_run_typed(geometry: str) -> None:
    recorder = Recorder(stop_after=3)
    solver = GEOMETRIES[geometry](recorder)
    result = solver.run()
    step = ["begin_step", "limit_dt", "before_step", "after_step"]
    expected = ["start", "on_snapshot", *step * 3, "on_snapshot", "end"]
    print(f"\n{geometry}: {result.status} at t = {result.status_time:.4g}: {recorder.calls}")
    assert recorder.calls == expected
    assert (result.status, result.status_reason) == ("blowup", "test")
    assert result.status_message == f"stopped by the test at t = {solver.t:.6g}"
    assert result.steps == 3 and result.status_time == solver.t < T_END
    assert [s.step for s in result.snapshots] == [0, 3]


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_a_step_control_callback_sets_the_step(geometry: str) -> None:
    """A callback allowing at most dt = T_END / 37 (below either stability bound): the run
    takes exactly 37 steps (the last lands on T_END) and completes."""
    dt = T_END / 37 * (1 + 1e-9)  # (a hair above: the 37th step is the remainder)
    result = GEOMETRIES[geometry](Recorder(dt=dt)).run()
    print(f"\n{geometry}: {result.steps} steps, status {result.status}")
    assert result.status == "completed" and result.steps == 37
    assert result.snapshots[-1].time == T_END


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_every_geometry_gets_the_shared_guards(geometry: str) -> None:
    """The step budget (max_steps) raises the same typed SimulationError on both; the
    resolution monitor is in both loops."""
    budget = {"flat": {"max_steps": 5}, "sphere": {"max_steps": 5}}[geometry]
    solver = GEOMETRIES[geometry](Recorder(), **budget)
    kinds = [type(c) for c in solver.callbacks]
    assert StepBudget in kinds and ResolutionMonitor in kinds, kinds
    with pytest.raises(SimulationError, match=r"run.max_steps = 5 reached at t = ") as caught:
        solver.run()
    assert caught.value.reason == "max_steps" and solver.steps == 5


def test_flat_callbacks_keep_the_run_bit_identical_to_a_plain_list() -> None:
    """A recording callback that steers nothing leaves the densities bit for bit."""
    plain = flat(Recorder()).run()
    grid = Grid([-4.0], [4.0], [64], "periodic")
    again = Solver(
        Problem(grid, gaussian(grid, [0.0], [[0.3]]), ConstantVelocity([1.0]), T_END)
    ).run()
    assert np.array_equal(plain.final, again.final) and plain.steps == again.steps
    assert math.isfinite(plain.status_time) and plain.status == "completed"
    assert isinstance(Scheme(), Scheme)
