"""The time loop: conservation, positivity at every stage, boundaries, events, snapshots."""

from __future__ import annotations

import numpy as np
import pytest
from exact import sin2_cell_averages

from tpde.grid import Grid, gaussian, uniform_box
from tpde.schemes import RECONSTRUCTIONS, get_integrator
from tpde.schemes.solver import Problem, Scheme, SimulationError, Solver
from tpde.variants import AffineVelocity, ConstantVelocity, FunctionVelocity

SCHEMES = sorted(RECONSTRUCTIONS)


def stage_minimum_recorder(solver: Solver) -> list[float]:
    """Wrap the operator so the minimum of every forward-Euler stage output is recorded."""
    minima: list[float] = []
    euler_step = solver.operator.euler_step

    def recorded(density, velocity, dt, out, fluxes=None):
        left = euler_step(density, velocity, dt, out, fluxes)
        minima.append(float(out.min()))
        return left

    solver.operator.euler_step = recorded
    return minima


def swirl(x, t):
    """A divergent, rotating, time-dependent field (compresses and stretches the data)."""
    if len(x) == 1:
        return [np.sin(3 * x[0]) * (1 + 0.5 * np.cos(t)) + 0.3]
    return [np.sin(2 * x[1]) + 0.5 * x[0], -np.cos(x[0]) * (1 + t) - 0.4 * x[1]]


# ---- mass ------------------------------------------------------------------------------------
@pytest.mark.parametrize("boundary", ["periodic", "noflux"])
@pytest.mark.parametrize("recon", ["upwind", "muscl", "weno5z"])
def test_mass_conserved_to_round_off(boundary, recon):
    grid = Grid([-3.0, -3.0], [3.0, 3.0], [40, 36], boundary)
    rho0 = uniform_box(grid, [-1.5, -1.0], [0.5, 2.0]) + gaussian(
        grid, [1.0, 0.0], [[0.3, 0.1], [0.1, 0.2]]
    )
    result = Solver(
        Problem(
            grid,
            rho0,
            FunctionVelocity(swirl),
            1.5,
            scheme=Scheme(reconstruction=recon),
            snapshots=4,
        )
    ).run()
    masses = np.array([s.mass for s in result.snapshots])
    drift = np.abs(masses - masses[0]).max() / masses[0]
    print(
        f"\n{boundary} {recon}: relative mass drift {drift:.2e} over {result.steps} steps, "
        f"{result.limited_stages} limited stages"
    )
    assert drift <= 1e-13
    assert result.snapshots[-1].outflow == 0.0


@pytest.mark.parametrize("recon", ["upwind", "weno5z"])
def test_outflow_counts_the_mass_that_leaves(recon):
    grid = Grid([-2.0, -2.0], [2.0, 2.0], [48, 48], "outflow")
    rho0 = gaussian(grid, [0.5, 0.0], [[0.2, 0.05], [0.05, 0.3]])
    result = Solver(
        Problem(
            grid,
            rho0,
            ConstantVelocity([1.2, -0.4]),
            1.5,
            snapshots=4,
            max_outflow=1.0,
            scheme=Scheme(reconstruction=recon),
        )
    ).run()
    mass0 = result.snapshots[0].mass
    for snap in result.snapshots:
        assert abs(snap.mass + snap.outflow - mass0) <= 1e-13 * mass0
    assert result.snapshots[-1].outflow > 0.5 * mass0  # most of the bump has left


def test_mass_leaving_the_box_ends_the_run_with_a_status():
    grid = Grid([-2.0], [2.0], [64], "outflow")
    rho0 = gaussian(grid, [-1.0], [[0.1]])
    result = Solver(Problem(grid, rho0, ConstantVelocity([1.0]), 5.0, snapshots=11)).run()
    assert result.status == "mass_left_domain"
    # 1e-3 of the mass is beyond 2 when the centre passes 2 - 3.09 sigma = 1.02, t = 2.02
    assert 1.9 < result.status_time < 2.1
    assert "outflow" in result.status_message
    assert result.snapshots[-1].outflow > 1e-3 * result.snapshots[0].mass


# ---- positivity --------------------------------------------------------------------------------
def discontinuous_data(grid: Grid, kind: str) -> np.ndarray:
    if kind == "pulse":
        return uniform_box(grid, [-0.5] * grid.ndim, [0.5] * grid.ndim)
    rho = np.zeros(grid.shape)
    rho[tuple(n // 2 for n in grid.shape)] = 1.0 / grid.cell_volume
    return rho


@pytest.mark.parametrize("kind", ["pulse", "single_cell"])
@pytest.mark.parametrize("recon", SCHEMES)
@pytest.mark.parametrize("ndim", [1, 2])
def test_density_nonnegative_at_every_stage(kind, recon, ndim):
    grid = Grid([-2.0] * ndim, [2.0] * ndim, [50] * ndim, "outflow")
    problem = Problem(
        grid,
        discontinuous_data(grid, kind),
        FunctionVelocity(swirl),
        0.6,
        scheme=Scheme(reconstruction=recon, cfl=1.0),
        max_outflow=1.0,
    )
    solver = Solver(problem)
    minima = stage_minimum_recorder(solver)
    result = solver.run()
    assert len(minima) >= 3 * result.steps  # rejected steps add stages
    assert min(minima) >= 0.0
    assert result.final.min() >= 0.0


@pytest.mark.parametrize("case", ["coarse_sin2", "pulse_high_cfl"])
def test_weno_without_limiter_undershoots_and_with_limiter_does_not(case):
    """The limiter is what keeps the density >= 0 (WENO alone undershoots)."""
    if case == "coarse_sin2":  # a smooth profile touching zero, 20 cells
        grid = Grid([0.0], [1.0], [20], "periodic")
        rho0, cfl = sin2_cell_averages(grid, [0.0]), 0.4
    else:
        grid = Grid([-2.0], [2.0], [80], "periodic")
        rho0, cfl = discontinuous_data(grid, "pulse"), 0.9
    mins = {}
    for positivity in (False, True):
        solver = Solver(
            Problem(
                grid,
                rho0,
                ConstantVelocity([1.0]),
                0.5,
                scheme=Scheme(reconstruction="weno5z", positivity=positivity, cfl=cfl),
            )
        )
        minima = stage_minimum_recorder(solver)
        solver.run()
        mins[positivity] = min(minima)
    print(f"\n{case}: min density unlimited {mins[False]:.3e}, limited {mins[True]:.3e}")
    assert mins[False] < -1e-3
    assert mins[True] >= 0.0


def total_variation(rho: np.ndarray) -> float:
    return float(np.abs(np.diff(np.r_[rho, rho[:1]])).sum())


@pytest.mark.parametrize("recon", ["muscl", "muscl-mc", "muscl-vanleer"])
def test_muscl_is_tvd_in_1d(recon):
    grid = Grid([0.0], [1.0], [100], "periodic")
    rho0 = uniform_box(grid, [0.2], [0.45]) + 0.5 * sin2_cell_averages(grid, [0.0])
    solver = Solver(
        Problem(
            grid,
            rho0,
            ConstantVelocity([1.0]),
            1.0,
            scheme=Scheme(reconstruction=recon, integrator="ssprk3"),
        )
    )
    tv = [total_variation(solver.density)]
    for _ in range(250):  # cfl = 0.4
        solver.step(0.4 * grid.spacing[0])
        tv.append(total_variation(solver.density))
    increase = np.diff(tv).max()
    print(f"\n{recon}: TV {tv[0]:.6f} -> {tv[-1]:.6f}, largest step increase {increase:.2e}")
    assert increase <= 1e-12 * tv[0]


# ---- time stepping ------------------------------------------------------------------------------
def test_snapshots_land_exactly_on_requested_times():
    grid = Grid([-3.0], [3.0], [60], "outflow")
    times = [0.0, 0.1, 0.35, 0.7, 1.0]
    result = Solver(
        Problem(grid, gaussian(grid, [0.0], [[0.2]]), ConstantVelocity([0.3]), 1.0, snapshots=times)
    ).run()
    assert result.times.tolist() == times
    assert result.status == "completed"


def test_adaptive_dt_respects_the_cfl_number():
    grid = Grid([-1.0, -1.0], [1.0, 1.0], [40, 40], "periodic")
    u = (0.8, -0.6)
    solver = Solver(
        Problem(grid, np.ones(grid.shape), ConstantVelocity(u), 1.0, scheme=Scheme(cfl=0.5))
    )
    solver.advance_to(0.5)
    cfl = solver.last_dt * sum(abs(v) / h for v, h in zip(u, grid.spacing, strict=True))
    assert cfl == pytest.approx(0.5, rel=1e-12) or solver.t == 0.5


def test_time_dependent_velocity_is_evaluated_at_stage_times():
    """u = cos(t): the exact displacement is sin(T); SSP-RK3 is third order in time."""
    errors = []
    for dt in (0.012, 0.006, 0.003):
        grid = Grid([0.0], [1.0], [64], "periodic")
        field = FunctionVelocity(lambda x, t: [np.full_like(x[0], np.cos(t))], face_constant=True)
        result = Solver(
            Problem(
                grid,
                sin2_cell_averages(grid, [0.0]),
                field,
                1.0,
                scheme=Scheme(reconstruction="upwind", dt=dt),
            )
        ).run()
        # exact in space for upwind is not available: compare with a very fine time step run
        ref = Solver(
            Problem(
                grid,
                sin2_cell_averages(grid, [0.0]),
                field,
                1.0,
                scheme=Scheme(reconstruction="upwind", dt=dt / 16),
            )
        ).run()
        errors.append(np.abs(result.final - ref.final).max())
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    print(f"\ntime orders (SSP-RK3, upwind space): {orders}")
    assert np.all(orders > 2.7)


@pytest.mark.parametrize("name", ["ssprk1", "ssprk2", "ssprk3"])
def test_integrators_reach_their_order_on_an_ode(name):
    """d rho/dt = -u drho/dx with a linear spatial operator: use a uniform field that decays.

    With u = M x on a Gaussian the moments obey an ODE; instead test the Shu-Osher tables
    directly on y' = lambda y.
    """
    rk = get_integrator(name)
    lam = -1.3
    errors = []
    for n in (20, 40, 80):
        dt = 1.0 / n
        y = 1.0
        for _ in range(n):
            stages = [y]
            for i in range(rk.stages):
                stages.append(
                    sum(
                        a * stages[k] + b * dt * lam * stages[k]
                        for k, (a, b) in enumerate(zip(rk.alpha[i], rk.beta[i], strict=True))
                    )
                )
            y = stages[-1]
        errors.append(abs(y - np.exp(lam)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - rk.order) < 0.15), orders
    assert rk.ssp_coefficient == pytest.approx(1.0)


# ---- events and errors ------------------------------------------------------------------------
def test_non_finite_velocity_stops_the_run_naming_time_and_step():
    grid = Grid([-2.0], [2.0], [32], "outflow")

    def bad(x, t):
        return [np.full_like(x[0], np.nan if t > 0.3 else 0.2)]

    solver = Solver(
        Problem(
            grid, gaussian(grid, [0.0], [[0.2]]), FunctionVelocity(bad), 1.0, scheme=Scheme(dt=0.05)
        )
    )
    with pytest.raises(SimulationError, match=r"t = 0\.3.*step \d+"):
        solver.run()


def test_fixed_dt_above_the_positivity_bound_is_refused():
    grid = Grid([0.0], [1.0], [32], "periodic")
    solver = Solver(Problem(grid, np.ones(32), ConstantVelocity([1.0]), 1.0, scheme=Scheme(dt=0.1)))
    with pytest.raises(SimulationError, match="scheme.dt"):
        solver.run()


@pytest.mark.parametrize(
    "scheme, match",
    [
        (dict(cfl=1.5), "scheme.cfl"),
        (dict(cfl=0.0), "scheme.cfl"),
        (dict(reconstruction="weno7"), "scheme.reconstruction"),
        (dict(integrator="rk4"), "scheme.integrator"),
        (dict(dt=-1.0), "scheme.dt"),
        (dict(face_quadrature="simpson"), "scheme.face_quadrature"),
    ],
)
def test_bad_scheme_settings_are_named(scheme, match):
    grid = Grid([0.0], [1.0], [16], "periodic")
    with pytest.raises(ValueError, match=match):
        Problem(grid, np.ones(16), ConstantVelocity([1.0]), 1.0, scheme=Scheme(**scheme))


def test_bad_problem_inputs_are_named():
    grid = Grid([0.0], [1.0], [16], "periodic")
    with pytest.raises(ValueError, match="run.t_end"):
        Problem(grid, np.ones(16), ConstantVelocity([1.0]), 0.0)
    with pytest.raises(ValueError, match="initial density"):
        Problem(grid, -np.ones(16), ConstantVelocity([1.0]), 1.0)
    with pytest.raises(ValueError, match="initial density"):
        Problem(grid, np.full(16, np.nan), ConstantVelocity([1.0]), 1.0)
    with pytest.raises(ValueError, match="shape"):
        Problem(grid, np.ones(15), ConstantVelocity([1.0]), 1.0)
    with pytest.raises(ValueError, match="run.snapshots"):
        Problem(grid, np.ones(16), ConstantVelocity([1.0]), 1.0, snapshots=1)
    with pytest.raises(ValueError, match="velocity"):
        ConstantVelocity([1.0, np.inf])
    with pytest.raises(ValueError, match="velocity.matrix"):
        AffineVelocity([[1.0, 2.0]])


# ---- boundaries and dimensions ----------------------------------------------------------------
def test_noflux_wall_holds_the_mass_against_the_flow():
    grid = Grid([-1.0], [1.0], [64], "noflux")
    rho0 = gaussian(grid, [0.0], [[0.05]])
    result = Solver(Problem(grid, rho0, ConstantVelocity([1.0]), 3.0)).run()
    assert abs(result.snapshots[-1].mass - result.snapshots[0].mass) <= 1e-13
    assert result.final[-8:].sum() > 0.95 * result.final.sum()  # piled up at the right wall


def test_3d_constant_advection_is_fifth_order_and_conservative():
    errors = []
    cells = [12, 24, 48]
    for n in cells:
        grid = Grid([0.0] * 3, [1.0] * 3, [n] * 3, "periodic")
        h = grid.spacing[0]
        dt = 0.2 * (1 / 12) * (h * 12) ** (5 / 3)
        u = [1.0, -0.5, 0.25]
        t_end = 0.25
        result = Solver(
            Problem(
                grid,
                sin2_cell_averages(grid, [0, 0, 0]),
                ConstantVelocity(u),
                t_end,
                scheme=Scheme(dt=t_end / np.ceil(t_end / dt)),
            )
        ).run()
        exact = sin2_cell_averages(grid, [v * t_end for v in u])
        errors.append(np.abs(result.final - exact).sum() * grid.cell_volume)
        masses = [s.mass for s in result.snapshots]
        assert abs(masses[-1] - masses[0]) <= 1e-13 * masses[0]
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    print(f"\n3-D periodic sin^2, weno5z: errors {errors}, orders {orders}")
    assert orders[-1] >= 4.7


def test_3d_sheared_affine_field_uses_gauss_faces_and_conserves():
    grid = Grid([-4.0] * 3, [4.0] * 3, [20] * 3, "outflow")
    rho0 = gaussian(grid, [0.2, 0.0, -0.1], np.diag([0.6, 0.5, 0.4]))
    field = AffineVelocity([[0.0, -0.5, 0.1], [0.5, 0.0, 0.0], [0.2, 0.0, -0.1]], [0.1, 0, 0])
    solver = Solver(Problem(grid, rho0, field, 0.5, max_outflow=1.0))
    assert [len(w) for _, w in solver.nodes] == [9, 9, 9]
    result = solver.run()
    mass0 = result.snapshots[0].mass
    assert abs(result.snapshots[-1].mass + result.snapshots[-1].outflow - mass0) <= 1e-13
    assert result.final.min() >= 0.0
