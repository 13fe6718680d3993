"""Noise: the noisy Transformer PDE ``d/dt mu + div(mu Gamma) = eps Delta mu`` on the grid.

docs/theory.md, 'Noise: the diffusion flux and its solve'. References, all independent of the
solver: the Fourier symbol of the fourth-order finite-volume Laplacian and the heat semigroup
of a Fourier mode; the Gaussian mean/covariance ODE with ``+ 2 eps I``
(tpde.validation.gaussian.solve(noise=eps)); the linear rates ``lambda_k - eps k^2`` of the
uniform state on the circle (normalised and unnormalised models); finer-step runs for the
temporal order. Every test prints its table (``-s``).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpde.grid import Grid, gaussian, moments
from tpde.grid.circle import circle_grid, von_mises_mixture
from tpde.schemes.diffusion import Diffusion, laplacian_matrix
from tpde.schemes.frame import AffineFrame
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.validation import solve
from tpde.validation.circle_transport import circle_w2
from tpde.validation.sphere_rates import circle_grid_rate, linear_rate, noisy_rate
from tpde.validation.sphere_tokens import CircleTokens, sample_circle_tokens
from tpde.variants import ATTENTION, Head
from tpde.variants.spherical import CircleAttention, circle_head

#: a contraction that the noise balances: V = -I, A + A^T = I, a skew part
A_BALANCED = np.array([[0.5, 0.2], [-0.2, 0.5]])
MEAN0 = np.array([0.5, -0.3])
COV0 = np.array([[1.0, 0.3], [0.3, 0.8]])
EPS = 0.1


def show(title: str, header: list[str], rows: list[tuple]) -> None:
    print(f"\n{title}")
    print(" ".join(f"{h:>12}" for h in header))
    for row in rows:
        print(" ".join(f"{v:12.4e}" if isinstance(v, float) else f"{v:>12}" for v in row))


def test_laplacian_is_fourth_order_and_conservative():
    """The stencil against the exact Laplacian of a cell-averaged Fourier mode (its symbol
    -k^2): error ratios of 16 per halving; every boundary mode keeps the mass (outflow: only
    through the boundary rows) and the second-order operator is a positive one."""
    rows, errors = [], []
    for n in (16, 32, 64, 128):
        h = 2 * np.pi / n
        edges = np.arange(n + 1) * h
        k = 3
        average = (np.sin(k * edges[1:]) - np.sin(k * edges[:-1])) / (k * h)  # of cos(kx)
        error = np.abs(laplacian_matrix(n, h, "periodic") @ average + k**2 * average).max()
        errors.append(error)
        rows.append((n, error, errors[-2] / error if len(errors) > 1 else float("nan")))
    show("FV Laplacian of cos(3x) (cell averages)", ["cells", "max error", "ratio"], rows)
    assert all(r[2] > 13.0 for r in rows[1:]) and rows[-1][2] > 15.5
    for mode in ("periodic", "noflux"):
        for order in (4, 2):
            assert np.abs(laplacian_matrix(24, 0.1, mode, order).sum(axis=0)).max() < 1e-11
    outflow = laplacian_matrix(24, 0.1, "outflow")
    assert np.abs(outflow.sum(axis=0)[3:-3]).max() < 1e-11  # interior columns
    for mode in ("periodic", "noflux", "outflow"):
        low = laplacian_matrix(24, 0.1, mode, 2)
        assert (low - np.diag(np.diag(low))).min() >= 0.0  # a Metzler matrix: exp >= 0


def test_diffusion_substep_is_exact_in_time_and_positive():
    """One substep of any length is the heat semigroup of the discrete operator: a Fourier
    mode decays by exp(tau eps sigma(k)) at tau = 1000 h^2 / eps (no step limit), the mass
    is kept to round-off, and a one-cell spike (the fourth-order exponential alone would go
    negative) stays >= 0 through the positive combination."""
    n = 64
    grid = Grid([0.0], [2 * np.pi], [n], "periodic")
    h = grid.spacing[0]
    edges = np.arange(n + 1) * h
    k = 5
    mode = 1.0 + 0.5 * (np.sin(k * edges[1:]) - np.sin(k * edges[:-1])) / (k * h)
    diffusion = Diffusion(grid, EPS)
    theta = k * h
    symbol = (32 * np.cos(theta) - 2 * np.cos(2 * theta) - 30) / (12 * h**2)
    rows = []
    for tau in (0.01 * h**2 / EPS, h**2 / EPS, 1000 * h**2 / EPS):
        out, left = diffusion.step(mode, tau)
        expected = 1.0 + (mode - 1.0) * np.exp(tau * EPS * symbol)
        rows.append((tau * EPS / h**2, np.abs(out - expected).max(), abs(out.sum() / n - 1.0)))
        assert left == 0.0
    show("substep of a Fourier mode", ["eps tau/h^2", "max error", "mass change"], rows)
    assert all(r[1] < 1e-13 and r[2] < 1e-14 for r in rows)
    spike = np.zeros(n)
    spike[n // 2] = 1.0
    out, _ = diffusion.step(spike, 0.05 * h**2 / EPS)
    assert out.min() >= 0.0 and diffusion.blended == 1
    assert abs(out.sum() - 1.0) < 1e-14


def gaussian_error(cells: int, t_end: float, frame: bool) -> tuple[list[tuple], Problem]:
    """The grid (fixed box +-8, or the frame on +-12) against the noisy Gaussian ODE."""
    times = [0.0, 0.5 * t_end, t_end]
    head = Head(A_BALANCED, -np.eye(2))
    radius = 12.0 if frame else 8.0
    grid = Grid([-radius] * 2, [radius] * 2, [cells, cells])
    extra: dict = {}
    if frame:
        density = gaussian(grid, np.zeros(2), np.eye(2))
        extra = {
            "scheme": Scheme(frame="affine", frame_tolerance=1e-8),
            "frame": AffineFrame.following(MEAN0, COV0),
        }
    else:
        density = gaussian(grid, MEAN0, COV0)
    problem = Problem(
        grid, density, ATTENTION["softmax"](head), t_end, snapshots=times, noise=EPS, **extra
    )
    result = Solver(problem).run()
    assert result.status == "completed", result.status_message
    exact = solve("softmax", MEAN0, COV0, head, t_end, noise=EPS)
    free = solve("softmax", MEAN0, COV0, head, t_end)
    rows = []
    for snap in result.snapshots:
        _, mean, cov = moments(snap.density, grid)
        if snap.frame is not None:
            mean, cov = snap.frame.moments(mean, cov)
        exact_mean, exact_cov = exact.at(snap.time)
        rows.append(
            (
                snap.time,
                float(np.abs(cov - exact_cov).max()),
                float(np.abs(mean - exact_mean).max()),
                float(np.abs(exact_cov - free.at(snap.time)[1]).max()),
                snap.mass - 1.0,
            )
        )
    kind = "frame" if frame else "fixed box"
    show(
        f"softmax + noise eps = {EPS}, {kind} {cells}^2, {result.steps} steps",
        ["t", "cov error", "mean error", "noise effect", "mass - 1"],
        rows,
    )
    return rows, problem


@pytest.mark.parametrize(
    "frame, cells, t_end, tolerance", [(False, 64, 0.5, 3e-4), (True, 32, 0.25, 1e-4)]
)
def test_noisy_gaussian_small(frame, cells, t_end, tolerance):
    """Default tier: the fixed box at 64^2 to t = 0.5, the frame at 32^2 to t = 0.25 (measured
    1.5e-4 and 4e-5); the noise moves the covariance by 4e-2 to 7e-2. Fourth order in space
    takes both to 1e-6 at 128^2 (the slow tier)."""
    rows, _ = gaussian_error(cells, t_end, frame)
    assert rows[-1][3] > 4e-2  # the noise matters
    assert all(r[1] < tolerance and r[2] < tolerance and abs(r[4]) < 1e-12 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("frame", [False, True])
def test_noisy_gaussian_128(frame):
    """The covariance ODE with + 2 eps I at 128^2 to t = 1, fixed box and frame: 1e-6."""
    rows, _ = gaussian_error(128, 1.0, frame)
    assert all(r[1] < 1e-6 and r[2] < 1e-6 for r in rows)


def test_strang_splitting_is_second_order_in_time():
    """Steps 0.02 and 0.01 (below the CFL step) on one grid against a 0.0025 run:
    the covariance error falls by 4 per halving (SSP-RK3 transport, exact diffusion: the
    splitting's order)."""
    head = Head(A_BALANCED, -np.eye(2))
    grid = Grid([-8.0] * 2, [8.0] * 2, [20, 20])
    density = gaussian(grid, MEAN0, COV0)

    def covariance(dt: float) -> np.ndarray:
        problem = Problem(
            grid,
            density,
            ATTENTION["softmax"](head),
            0.2,
            scheme=Scheme(dt_max=dt),
            noise=1.0,
            box_action="warn",
            resolution_action="warn",
        )
        return moments(Solver(problem).run().final, grid)[2]

    reference = covariance(0.0025)
    errors = [float(np.abs(covariance(0.02 / 2**j) - reference).max()) for j in range(2)]
    rows = [
        (0.02 / 2**j, e, errors[j - 1] / e if j else float("nan")) for j, e in enumerate(errors)
    ]
    show("Strang splitting, eps = 1", ["dt", "cov error", "ratio"], rows)
    assert all(3.2 < r[2] < 4.8 for r in rows[1:])


@pytest.mark.parametrize("normalised", [True, False])
def test_noisy_linear_rates_on_the_circle(normalised):
    """k = 1..20, beta in {1, 4, 16}, eps half the linear threshold (lambda_1): the rate of
    mode k fitted from grid runs against lambda_k - eps k^2 (normalised) and
    k^2 (I_k(beta) / beta - eps) (unnormalised), within 1e-3 of the larger of |rate|,
    lambda_k and eps k^2 (the rate passes through zero)."""
    from scipy.special import iv

    rows = []
    for beta in (1.0, 4.0, 16.0):
        eps = 0.5 * linear_rate(1, beta, 2, normalised)
        for k in range(1, 21):
            if not normalised:  # the closed form, independent of linear_rate
                assert (
                    abs(
                        noisy_rate(k, beta, eps, 2, False) / (k * k * (iv(k, beta) / beta - eps))
                        - 1
                    )
                    < 1e-12
                )
            row = circle_grid_rate(k, beta, cells=32, noise=eps, normalised=normalised)
            scale = max(abs(row["formula"]), linear_rate(k, beta, 2, normalised), eps * k * k)
            rows.append(
                (
                    k,
                    beta,
                    row["formula"],
                    row["measured"],
                    abs(row["measured"] - row["formula"]) / scale,
                )
            )
    show(
        f"noisy rates on the circle ({'normalised' if normalised else 'unnormalised'})",
        ["k", "beta", "formula", "measured", "error"],
        rows,
    )
    assert max(r[4] for r in rows) < 1e-3


def test_noisy_tokens_match_the_grid_on_the_circle():
    """10^4 noisy tokens (angle + sqrt(2 eps) dW, split around RK4), three seeds, sampled from
    the grid's initial density, against the grid's noisy solution: W2 (exact on the circle)
    within the sampling noise of 10^4 i.i.d. draws from the grid density at the same time
    (the seeds' mean within 1.5 x theirs), while the noise-free solution is 3 x farther
    (measured 4.4)."""
    grid = circle_grid(128)
    initial = von_mises_mixture(grid, [(0.5, 0.0, 4.0), (0.5, 2.5, 4.0)])
    beta, eps, times = 4.0, 0.1, [0.0, 0.5, 1.0]

    def grid_run(noise: float):
        field = CircleAttention(circle_head(beta), engine="fft")
        problem = Problem(grid, initial, field, times[-1], snapshots=times, noise=noise)
        return [s.density for s in Solver(problem).run().snapshots]

    noisy, free = grid_run(eps), grid_run(0.0)
    rows = []
    for seed in range(3):
        theta = sample_circle_tokens(initial, grid, 10_000, seed)
        tokens = CircleTokens(theta, circle_head(beta), noise=eps, seed=seed)
        states = tokens.integrate(times, 0.1)
        for i, t in enumerate(times):
            iid = sample_circle_tokens(noisy[i], grid, 10_000, 100 + seed)
            rows.append(
                (
                    seed,
                    t,
                    circle_w2(states[i], noisy[i], grid_b=grid),
                    circle_w2(iid, noisy[i], grid_b=grid),
                    circle_w2(free[i], noisy[i], grid_a=grid, grid_b=grid),
                )
            )
    show(
        f"noisy tokens vs the grid on the circle, beta = {beta}, eps = {eps}",
        ["seed", "t", "W2 tokens", "W2 i.i.d.", "W2 no noise"],
        rows,
    )
    for t in times[1:]:
        at = [r for r in rows if r[1] == t]
        tokens_w2 = np.mean([r[2] for r in at])
        assert tokens_w2 <= 1.5 * np.mean([r[3] for r in at])
    assert min(r[4] for r in rows if r[1] == times[-1]) > 3.0 * max(r[2] for r in rows)


def test_noisy_token_steps():
    """The Brownian substeps: R^d increments spread by exactly 2 eps t per axis in variance;
    a seeded noisy token run is reproducible; sphere increments stay on S^2 to round-off and
    the mean of z decays as e^{-2 eps t} (the heat semigroup of the coordinate functions,
    l = 1: the Ito drift of the Brownian motion on S^2)."""
    from tpde.validation.brownian import flat_increment, sphere_increment
    from tpde.validation.particles import TokenSystem, simulate

    rng = np.random.default_rng(5)
    x = np.zeros((20_000, 2))
    for _ in range(20):
        x = flat_increment(x, 0.05, 0.3, rng)
    variance = x.var(axis=0)
    assert np.all(np.abs(variance / 0.6 - 1.0) < 0.05)  # 4 sigma of 20000 samples: 0.04
    system = TokenSystem("softmax", Head(-np.eye(2), -np.eye(2)))
    start = np.random.default_rng(0).standard_normal((200, 2))
    runs = [simulate(system, start, 0.5, 0.1, noise=0.3, seed=s).tokens for s in (7, 7, 8)]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert np.abs(runs[0] - runs[2]).max() > 0.1
    points = np.tile([0.0, 0.0, 1.0], (20_000, 1))
    for _ in range(40):
        points = sphere_increment(points, 0.025, 0.2, rng)
    radius_error = np.abs(np.linalg.norm(points, axis=1) - 1.0).max()
    mean_z = points[:, 2].mean()
    print(f"\nS^2: |x| - 1 <= {radius_error:.1e}; <z> = {mean_z:.4f}, e^-0.4 = {np.exp(-0.4):.4f}")
    assert radius_error < 1e-13
    assert abs(mean_z - np.exp(-0.4)) < 0.02  # sampling 0.005, weak error O(eps^2 tau)


def test_run_noise_key():
    """``[run] noise = eps`` reaches the Problem on flat grids and the circle; a bad value is
    one line naming the key."""
    from tpde.config import ConfigError, build

    flat = {
        "grid": {"lower": [-8.0], "upper": [8.0], "cells": [16]},
        "attention": {"variant": "softmax", "A": [[0.5]], "V": [[-1.0]]},
        "run": {"t_end": 0.1, "noise": 0.25},
    }
    assert build(flat).problem.noise == 0.25
    circle = {
        "grid": {"geometry": "circle", "cells": 16},
        "attention": {"beta": 2.0},
        "run": {"t_end": 0.1, "noise": 0.5},
    }
    assert build(circle).problem.noise == 0.5
    for bad in (-1.0, "a lot", float("nan")):
        flat["run"]["noise"] = bad
        with pytest.raises(ConfigError, match=r"^run\.noise"):
            build(flat)


def test_noisy_run_resumes_bit_for_bit():
    """A noisy run restarted from its middle snapshot repeats the rest of the run bit for bit
    (the diffusion carries no state across a snapshot: its exponentials are a pure function
    of the step length)."""
    grid = circle_grid(64)
    initial = von_mises_mixture(grid, [(0.6, 0.0, 3.0), (0.4, 2.0, 5.0)])
    field = CircleAttention(circle_head(4.0), engine="fft")
    whole = Solver(Problem(grid, initial, field, 0.4, snapshots=[0.0, 0.2, 0.4], noise=0.05))
    middle = whole.run().snapshots[1]
    rest = Problem(grid, middle.density, field, 0.4, snapshots=[0.2, 0.4], t_start=0.2, noise=0.05)
    again = Solver(rest).run()
    assert again.steps > 0
    np.testing.assert_array_equal(again.final, whole.density)
