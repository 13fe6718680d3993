"""Per-phase timers (tpde.grid.profile) and ``tpde run --profile``."""

from __future__ import annotations

import io as _io
import time

import numpy as np
import pytest

from tpde.config import build
from tpde.grid import Grid, gaussian, profile
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.variants import Head, SinkhornHead
from tpde.variants.sinkhorn import SinkhornAttention
from tpde.variants.softmax import SoftmaxAttention

A = [[-0.6, 0.8], [-0.2, -0.3]]
V = [[1.0, 0.5], [-0.3, 0.8]]
#: 40^2 cells: the automatic engine takes the tables (above 32^2)
SMALL = {
    "grid": {"lower": [-5.5, -5.25], "upper": [6.5, 4.5], "cells": [40, 40]},
    "initial": {"kind": "gaussian", "mean": [0.5, -0.3], "covariance": [[1.0, 0.4], [0.4, 0.6]]},
    "attention": {"variant": "softmax", "A": A, "V": V},
    "run": {"t_end": 0.05, "snapshots": 3},
}


@pytest.fixture(autouse=True)
def _off():
    """Every test starts and ends with the timers off and the registry empty."""
    profile.set_enabled(False)
    profile.reset()
    yield
    profile.set_enabled(False)
    profile.reset()


def short_solver(engine: str = "separable") -> Solver:
    grid = Grid([-5.5, -5.25], [6.5, 4.5], [40, 40])
    rho = gaussian(grid, [0.5, -0.3], np.array([[1.0, 0.4], [0.4, 0.6]]))
    field = SoftmaxAttention(Head(np.array(A), np.array(V)), engine=engine)
    return Solver(Problem(grid, rho, field, 0.02, Scheme(), snapshots=2))


def test_disabled_profiling_records_nothing():
    short_solver().run()
    assert profile.records() == {}
    assert profile.phase("fluxes") is profile.phase("limiter")  # one shared no-op


def test_a_profiled_run_reports_its_phases_within_the_wall_time(tmp_path):
    from tpde.run import profiled, run_config

    stream = _io.StringIO()
    start = time.perf_counter()
    with profiled(stream=stream) as phases:
        run_config(build(SMALL), tmp_path / "run.nc", quiet=True)
    wall = time.perf_counter() - start
    for name in (
        "velocity",
        "velocity.tables",
        "velocity.tables.estimate",
        "velocity.interpolation.passes",
        "fluxes",
        "euler",
        "rk.combine",
        "io.write",
    ):
        assert phases[name]["calls"] > 0, name
        assert 0.0 <= phases[name]["self_s"] <= phases[name]["total_s"] <= wall, name
    assert phases["io.write"]["calls"] == 3  # one record per snapshot
    assert sum(r["self_s"] for r in phases.values()) <= wall
    assert not profile.enabled() and profile.records() == phases
    table = stream.getvalue()
    print("\n" + table)
    assert table.startswith("phase times") and "velocity.tables" in table and "wall" in table


def test_sinkhorn_direct_and_limiter_phases():
    grid = Grid([-5.0, -5.0], [5.0, 5.0], [20, 20])
    rho = gaussian(grid, [0.3, 0.0], 0.8 * np.eye(2))
    field = SinkhornAttention(SinkhornHead(A, V, eps=1.0), engine="direct")
    with profile.profiling() as phases:
        field(rho, grid, 0.0)
    assert phases["velocity.sinkhorn"]["calls"] == 1
    assert phases["velocity.direct"]["calls"] >= 2 * field.iterations[-1]
    # the Sinkhorn iterations' sums are phases of their own, taken out of its self time
    sinkhorn = phases["velocity.sinkhorn"]
    assert sinkhorn["self_s"] < sinkhorn["total_s"]
    # a density with a vacuum next to a step: the limiter acts
    step = np.zeros(grid.shape)
    step[8:12, 8:12] = 1.0
    solver = Solver(Problem(grid, step, SoftmaxAttention(Head(A, V)), 0.05, snapshots=2))
    with profile.profiling() as phases:
        solver.run()
    assert solver.operator.limited_steps > 0
    assert phases["limiter"]["calls"] == solver.operator.limited_steps


def test_tpde_run_profile_prints_the_table(tmp_path, capsys):
    from tpde.cli import main
    from tpde.config import dumps

    config = tmp_path / "run.toml"
    config.write_text(dumps(SMALL))
    assert main(["run", str(config), "-o", str(tmp_path / "run.nc"), "--quiet", "--profile"]) == 0
    err = capsys.readouterr().err
    assert "phase times" in err and "fluxes" in err and "io.write" in err
    assert not profile.enabled()
