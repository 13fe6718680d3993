"""Property tests (hypothesis): positivity and conservation for random data, fields and grids."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_solver import stage_minimum_recorder

from tpde.grid import Grid
from tpde.schemes import RECONSTRUCTIONS
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.variants import AffineVelocity, FunctionVelocity


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 2))
    cells = [draw(st.integers(6, 20)) for _ in range(ndim)]
    boundary = draw(st.sampled_from(["outflow", "periodic", "noflux"]))
    grid = Grid([-1.0] * ndim, [1.0 + draw(st.floats(0.0, 2.0))] * ndim, cells, boundary)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    data = rng.random(grid.shape) ** draw(st.sampled_from([1, 4, 16]))  # from smooth to spiky
    data[rng.random(grid.shape) < draw(st.floats(0.0, 0.9))] = 0.0  # holes of vacuum
    data.flat[rng.integers(grid.size)] += 10.0  # one loaded cell
    if draw(st.booleans()):
        matrix = rng.uniform(-2, 2, (ndim, ndim))
        velocity = AffineVelocity(matrix, rng.uniform(-1, 1, ndim))
    else:
        k = rng.uniform(0.5, 4.0, (ndim, ndim))
        amp = rng.uniform(-2, 2, ndim)

        def func(x, t, k=k, amp=amp):
            return [
                amp[a] * np.sin(sum(k[a, b] * x[b] for b in range(ndim)) + t) for a in range(ndim)
            ]

        velocity = FunctionVelocity(func)
    scheme = Scheme(
        reconstruction=draw(st.sampled_from(sorted(RECONSTRUCTIONS))),
        integrator=draw(st.sampled_from(["ssprk1", "ssprk2", "ssprk3"])),
        cfl=draw(st.floats(0.25, 1.0)),
    )
    return grid, data, velocity, scheme


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_positive_and_conservative_for_random_problems(case):
    grid, data, velocity, scheme = case
    problem = Problem(grid, data, velocity, 0.1, scheme=scheme, max_outflow=1.0, max_steps=400)
    solver = Solver(problem)
    minima = stage_minimum_recorder(solver)
    result = solver.run()
    assert min(minima) >= 0.0
    assert np.all(np.isfinite(result.final))
    mass0 = result.snapshots[0].mass
    final = result.snapshots[-1]
    assert abs(final.mass + final.outflow - mass0) <= 1e-12 * mass0
    if grid.boundary[0] != "outflow":
        assert final.outflow == 0.0
