"""Fewer Sinkhorn iterations (variants/sinkhorn.py; docs/theory.md, 'Sinkhorn iterations'):
Anderson mixing of the fixed-point map, secants kept between evaluations, warm starts
linear in t that hold across a change of A, and what they must not change: the potentials
(to the marginal tolerance), the token system, and a resumed run, bit for bit.

The accuracy of whole runs against the Gaussian ODE (64^2 .. 256^2) is the slow
tests/test_runs.py; the 256^2 step time is benchmarks/step.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_engines import densities
from test_variants import A1, COV1, MEAN1, V1

from tpde.grid import Grid, gaussian
from tpde.schemes.solver import Problem, Solver
from tpde.validation.particles import TokenSystem
from tpde.variants import SinkhornAttention, SinkhornHead
from tpde.variants import sinkhorn as sk
from tpde.variants.sinkhorn import Secants, quadrature_weights, sinkhorn_iterations

HEAD = SinkhornHead(A1, V1, eps=1.0)


def plan_errors(f, g, q, grid, head):
    """l1 row and column errors of the dense plan (f, g) against q."""
    y = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    logits = (y @ head.A.T @ y.T + f[:, None] + g[None, :]) / head.eps
    q = q.reshape(-1)
    plan = np.exp(logits) * q[:, None] * q[None, :]
    return np.abs(plan.sum(axis=1) - q).sum(), np.abs(plan.sum(axis=0) - q).sum()


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_anderson_reaches_the_plain_potentials_in_fewer_iterations(eps, monkeypatch):
    grid = Grid([-6, -6], [6, 6], [36, 36])
    rho = densities(grid)["two bumps"]
    head = SinkhornHead(A1, V1, eps=eps)
    q = quadrature_weights(rho, grid)
    fast = SinkhornAttention(head, tol=1e-12)
    f, g = fast.potentials(q, grid, head)
    monkeypatch.setattr(sk, "ANDERSON_MEMORY", 0)
    plain = SinkhornAttention(head, tol=1e-12)
    f0, g0 = plain.potentials(q, grid, head)
    mass = q.reshape(-1) > 0
    shift = np.mean((g - g0)[mass])  # the potentials are fixed up to (f + c, g - c)
    gap = float(np.abs(g - g0 - shift)[mass].max() / eps)
    rows, cols = plan_errors(f, g, q, grid, head)
    print(
        f"\neps {eps}: {fast.iterations[-1]} iterations with Anderson, {plain.iterations[-1]} "
        f"plain; |g - g_plain| / eps = {gap:.1e}; plan marginal errors {rows:.1e} / {cols:.1e}"
    )
    assert fast.iterations[-1] < 0.7 * plain.iterations[-1]
    assert gap <= 1e-10
    assert rows <= 1e-12 and cols <= 1e-12


def test_secants_mix_and_restart():
    secants = Secants(2, 3)
    image, residual = np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.0, -0.1])
    assert secants.mix(image, residual) is image  # no secants: the plain step
    for k in range(3):
        secants.add(np.full(3, k + 1.0), np.array([1.0, 0.0, k]))
    assert secants.count == 2  # the oldest dropped
    mixed = secants.mix(image, residual)
    assert mixed.shape == (3,) and np.all(np.isfinite(mixed))
    secants.clear()
    assert secants.count == 0 and secants.mix(image, residual) is image


def test_a_linear_fixed_point_converges_in_a_few_steps():
    """Anderson mixing with memory >= the dimension solves a contracting linear map in a
    few steps: g -> M g + b (half_f the identity, half_g the affine map)."""
    rng = np.random.default_rng(3)
    n = 5
    M = 0.6 * rng.normal(size=(n, n)) / np.sqrt(n)
    b = rng.normal(size=n)
    q = np.full(n, 1.0 / n)
    _, g, count, error = sinkhorn_iterations(
        lambda g: g, lambda f: M @ f + b, q, np.zeros(n), np.zeros(n), 1.0, 1e-12, 50, memory=n
    )
    exact = np.linalg.solve(np.eye(n) - M, b)
    assert error <= 1e-12 and count <= 2 * n
    assert np.abs(g - exact).max() <= 1e-10
    _, _, plain, _ = sinkhorn_iterations(
        lambda g: g, lambda f: M @ f + b, q, np.zeros(n), np.zeros(n), 1.0, 1e-12, 500, memory=0
    )
    assert plain > count


def test_warm_start_is_linear_in_t_and_holds_across_a_change_of_A():
    field = SinkhornAttention(HEAD)
    shape = (4,)
    g0, g1 = np.zeros(4), np.ones(4)
    field._previous = (shape, 1.0, [(0.0, g0), (0.1, g1)])
    assert np.allclose(field.warm_potential(shape, 1.0, 0.05), 0.5)  # between: interpolated
    assert np.allclose(field.warm_potential(shape, 1.0, 0.2), 2.0)  # beyond: extrapolated
    assert np.allclose(field.warm_potential(shape, 1.0, 0.1), 1.0)  # the same time
    assert np.allclose(field.warm_potential(shape, 1.0, 5.0), 1.0)  # far: the nearest
    assert field.warm_potential((5,), 1.0, 0.1) is None  # another grid
    assert field.warm_potential(shape, 0.5, 0.1) is None  # another eps
    field.reset()
    assert field.warm_potential(shape, 1.0, 0.1) is None
    # a nearby A (the co-moving frame changes it every step) still starts warm
    grid = Grid([-8, -8], [8, 8], [40, 40])
    rho = gaussian(grid, MEAN1, COV1)
    q = quadrature_weights(rho, grid)
    warm = SinkhornAttention(HEAD)
    warm.potentials(q, grid, HEAD)
    turned = SinkhornHead(np.asarray(A1) * 1.01 + 0.005, V1, eps=1.0)
    warm.potentials(q, grid, turned)
    cold = SinkhornAttention(turned, warm_start=False)
    cold.potentials(q, grid, turned)
    print(f"\nafter a change of A: {warm.iterations[-1]} warm vs {cold.iterations[-1]} cold")
    assert warm.iterations[-1] < cold.iterations[-1]


def test_stage_iterations_fall_and_a_resumed_run_repeats_the_run_bit_for_bit():
    """48^2, snapshots at 0, 0.1, 0.2: the solver resets the field at every snapshot
    (VelocityField.reset: warm starts and secants dropped), so a run started from the 0.1
    snapshot with a new field ends on the same density, bit for bit."""
    grid = Grid([-6, -6], [6, 6], [48, 48])
    rho = gaussian(grid, MEAN1, COV1)
    field = SinkhornAttention(HEAD)
    full = Solver(Problem(grid, rho, field, 0.2, snapshots=[0.0, 0.1, 0.2])).run()
    middle = full.snapshots[1]
    again = SinkhornAttention(HEAD)
    resumed = Solver(
        Problem(
            grid,
            middle.density,
            again,
            0.2,
            snapshots=[0.1, 0.2],
            t_start=0.1,
            initial_outflow=middle.outflow,
        )
    ).run()
    cold = field.iterations[0]
    later = float(np.mean(field.iterations[3:]))
    print(f"\niterations: cold start {cold}, later stages {later:.2f} on average")
    assert later <= 0.6 * cold
    assert np.array_equal(resumed.final, full.final)


def test_tokens_converge_with_the_mixing():
    """The token system shares the iterations (no secants kept there)."""
    rng = np.random.default_rng(0)
    tokens = rng.multivariate_normal(MEAN1, COV1, size=300)
    system = TokenSystem("sinkhorn", HEAD)
    velocity = system.velocity(tokens, np.full(300, 1.0 / 300), 0.0)
    assert np.all(np.isfinite(velocity))
    assert system.iterations and max(system.iterations) < 40
