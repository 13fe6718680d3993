"""Validation studies: the grid solution side by side with the tokens and the Gaussian ODEs.

Each study is a plain function that runs its pieces and returns numbers (no plotting, no
I/O); ``tpde validate`` (tpde/validate.py) turns them into PASS/FAIL checks and a report,
and the tests call the same functions. The studies drive the solver loop, so they live in
``tpde`` (the face) and use ``tpde.validation`` (which never imports the solver).

* :func:`gaussian_refinement` -- grid runs from N(alpha_0, Sigma_0) at several resolutions
  against the mean/covariance ODEs (docs/theory.md, 'Gaussian closures'): errors and observed
  orders.
* :func:`tokens_vs_ode` -- deterministic Gauss-Hermite tokens against the ODEs.
* :func:`grid_vs_tokens` -- sampled tokens against the grid solution on any initial density,
  with the sampling distance at t = 0 as the yardstick.
* :func:`mean_field` -- the distance between tokens and the grid solution as n grows, with a
  least-squares slope in log-log (docs/theory.md, 'Support and speed bounds': W1 ~ n^{-1/2} in
  1-D, n^{-1/2} log n
  in 2-D for i.i.d. tokens, carried forward by the stability estimate).
* :func:`masked_grid_vs_tokens` -- masked attention: tokens sampled per position slice, the
  masked token system against the masked grid run in the conditional distance W_{p,nu}.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpde.grid import Grid, Positions, from_tokens, gaussian, moments
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.validation.gaussian import solve
from tpde.validation.metrics import (
    conditional_wasserstein_tokens,
    wasserstein,
    wasserstein_1d_tokens,
)
from tpde.validation.particles import (
    TokenSystem,
    gauss_hermite_tokens,
    sample_sliced_tokens,
    sample_tokens,
    simulate,
    token_moments,
)
from tpde.variants import ATTENTION, CausalAttention

__all__ = [
    "Refinement",
    "fitted_box",
    "gaussian_refinement",
    "grid_run",
    "grid_vs_tokens",
    "masked_grid_vs_tokens",
    "mean_field",
    "observed_orders",
    "relative_errors",
    "tokens_vs_ode",
]


def relative_errors(mean: np.ndarray, cov: np.ndarray, reference) -> tuple[float, float]:
    """(|mean - mean_ref| / |mean_ref|, ||cov - cov_ref||_F / ||cov_ref||_F)."""
    mean_ref, cov_ref = reference
    return (
        float(np.linalg.norm(mean - mean_ref) / np.linalg.norm(mean_ref)),
        float(np.linalg.norm(cov - cov_ref) / np.linalg.norm(cov_ref)),
    )


def observed_orders(errors, cells) -> np.ndarray:
    """log(e_k / e_{k+1}) / log(N_{k+1} / N_k) between successive resolutions."""
    e, n = np.asarray(errors, float), np.asarray(cells, float)
    return np.log(e[:-1] / e[1:]) / np.log(n[1:] / n[:-1])


def fitted_box(solution, t_end: float, sigmas: float = 6.0) -> tuple[np.ndarray, np.ndarray]:
    """Lower / upper corners holding alpha_a(t) +- sigmas sigma_a(t) for t in [0, t_end]
    (a Gaussian ODE solution), rounded out to multiples of 1/4. The softmax kernels need
    sigmas >= 7 (docs/theory.md, 'Blow-up and tails': the tilted law sits at
    alpha + Sigma A x)."""
    d = solution.at(0.0)[0].size
    lower, upper = np.full(d, np.inf), np.full(d, -np.inf)
    for t in np.linspace(0.0, t_end, 41):
        mean, cov = solution.at(t)
        spread = sigmas * np.sqrt(np.diag(cov))
        lower, upper = np.minimum(lower, mean - spread), np.maximum(upper, mean + spread)
    return np.floor(4 * lower) / 4, np.ceil(4 * upper) / 4


def grid_run(
    variant: str,
    params: Any,
    grid: Grid,
    density: np.ndarray,
    t_end: float,
    snapshots: int | list = 2,
    max_outflow: float = 1e-5,
    scheme: Scheme | None = None,
    positions: Positions | None = None,
):
    """One grid run of an attention variant (WENO5-Z + SSP-RK3 unless ``scheme``); masked
    (causal) over ``positions`` when given. Raises RuntimeError unless it completes."""
    field_ = ATTENTION[variant](params)
    if positions is not None:
        field_ = CausalAttention(field_)
    result = Solver(
        Problem(
            grid,
            density,
            field_,
            t_end,
            scheme=scheme or Scheme(),
            snapshots=snapshots,
            max_outflow=max_outflow,
            positions=positions,
        )
    ).run()
    if result.status != "completed":
        masked = "masked " if positions is not None else ""
        raise RuntimeError(
            f"validation: the {masked}{variant} run ended with {result.status} "
            f"at t = {result.status_time:.4g}: {result.status_message}"
        )
    return result


@dataclass
class Refinement:
    """Grid runs vs the Gaussian ODE: one row per resolution (errors at t_end)."""

    variant: str
    cells: list[int]
    mean_errors: list[float]
    cov_errors: list[float]
    times: np.ndarray
    grid_covariances: list[np.ndarray] = field(default_factory=list)  # finest run, per time
    ode_covariances: np.ndarray | None = None

    @property
    def orders(self) -> np.ndarray:
        return observed_orders(self.cov_errors, self.cells)


def gaussian_refinement(
    variant: str,
    params: Any,
    mean0,
    cov0,
    cells: list[int],
    t_end: float,
    sigmas: float | None = None,
    snapshots: int = 11,
) -> Refinement:
    """Runs at ``cells`` per axis on a box fitted to the ODE solution (``fitted_box``)."""
    mean0, cov0 = np.atleast_1d(np.asarray(mean0, float)), np.atleast_2d(cov0)
    sigmas = sigmas or (7.0 if variant in ("softmax", "multihead") else 6.0)
    solution = solve(variant, mean0, cov0, params, t_end)
    lower, upper = fitted_box(solution, t_end, sigmas)
    times = np.linspace(0.0, t_end, snapshots)
    out = Refinement(variant, list(cells), [], [], times)
    for n in cells:
        grid = Grid(lower, upper, [n] * mean0.size)
        result = grid_run(
            variant, params, grid, gaussian(grid, mean0, cov0), t_end, snapshots=list(times)
        )
        _, mean, cov = moments(result.final, grid)
        errors = relative_errors(mean, cov, solution.at(t_end))
        out.mean_errors.append(errors[0])
        out.cov_errors.append(errors[1])
        out.grid_covariances = [moments(s.density, grid)[2] for s in result.snapshots]
    out.ode_covariances = np.array([solution.at(t)[1] for t in times])
    return out


def tokens_vs_ode(
    variant: str,
    params: Any,
    mean0,
    cov0,
    t_end: float,
    nodes: int = 30,
    dt: float = 0.01,
    times=None,
) -> dict:
    """Gauss-Hermite tokens (nodes^d) with RK4 against the ODE: relative errors at t_end and
    the token covariances at ``times``."""
    tokens, weights = gauss_hermite_tokens(mean0, cov0, nodes)
    times = list(times) if times is not None else [t_end]
    solution = simulate(
        TokenSystem(variant, params), tokens, t_end, dt, weights=weights, times=times
    )
    ode = solve(variant, mean0, cov0, params, t_end)
    means, covs = solution.moments()
    errors = relative_errors(means[-1], covs[-1], ode.at(t_end))
    return {
        "mean_error": errors[0],
        "cov_error": errors[1],
        "times": solution.times,
        "covariances": covs,
        "tokens": tokens.shape[0],
    }


def _distance(density: np.ndarray, grid: Grid, tokens: np.ndarray, p: int) -> float:
    """W_p between the tokens and a grid density. 1-D: exact (quantile functions). 2-D/3-D:
    the tokens are binned on the grid (nearest cell) and both measures compared on the cell
    centres (POT, exact): the semi-discrete distance to cell-centre atoms has a floor of
    about h/3 that would hide the n^{-1/2} decay, binning both sides does not."""
    if grid.ndim == 1:
        return wasserstein_1d_tokens(density, grid, tokens[:, 0], p=p)
    binned = from_tokens(grid, tokens, method="ngp")
    return wasserstein(binned, density, grid, p=p).value


def grid_vs_tokens(
    variant: str,
    params: Any,
    grid: Grid,
    density: np.ndarray,
    n: int,
    t_end: float,
    dt: float,
    seed: int = 0,
    p: int = 1,
) -> dict:
    """n sampled tokens and the grid solution from the same density: W_p at t = 0 (the
    sampling distance) and at t_end; token moments against the grid's."""
    tokens = sample_tokens(density, grid, n, seed)
    start = _distance(density, grid, tokens, p)
    solution = simulate(TokenSystem(variant, params), tokens, t_end, dt, method="ssprk3")
    result = grid_run(variant, params, grid, density, t_end)
    end = _distance(result.final, grid, solution.tokens[-1], p)
    _, mean, cov = moments(result.final, grid)
    t_mean, t_cov = token_moments(solution.tokens[-1])
    return {
        "n": n,
        "distance_start": start,
        "distance_end": end,
        "mean_gap": float(np.linalg.norm(t_mean - mean)),
        "cov_gap": float(np.linalg.norm(t_cov - cov)),
        "final": result.final,
        "tokens": solution.tokens[-1],
    }


def mean_field(
    variant: str,
    params: Any,
    grid: Grid,
    density: np.ndarray,
    ns: list[int],
    t_end: float,
    dt: float,
    seeds: int = 3,
    p: int = 1,
) -> dict:
    """W_p(tokens_n(t_end), grid(t_end)) for each n (mean over ``seeds`` independent samples)
    and the least-squares slope of log W_p against log n."""
    final = grid_run(variant, params, grid, density, t_end).final
    distances = []
    for k, n in enumerate(ns):
        samples = []
        for seed in range(seeds):
            tokens = sample_tokens(density, grid, n, 1000 * k + seed)
            solution = simulate(TokenSystem(variant, params), tokens, t_end, dt, method="ssprk3")
            samples.append(_distance(final, grid, solution.tokens[-1], p))
        distances.append(float(np.mean(samples)))
    slope = float(np.polyfit(np.log(ns), np.log(distances), 1)[0])
    return {"n": list(ns), "distances": distances, "slope": slope}


def masked_grid_vs_tokens(
    variant: str,
    params: Any,
    grid: Grid,
    positions: Positions,
    density: np.ndarray,
    per_slice: int,
    t_end: float,
    dt: float,
    seed: int = 0,
    p: int = 2,
) -> dict:
    """Masked attention, tokens against the grid (issue 6): ``per_slice`` tokens sampled
    from each position slice of ``density`` (shape (positions.count, *grid.shape)), moved by
    the masked token system (SSP-RK3, fixed dt) and compared with the masked grid run in the
    conditional distance W_{p,nu}, at t = 0 (the sampling distance) and at t_end."""
    tokens, token_s, weights = sample_sliced_tokens(density, grid, positions, per_slice, seed)

    def distance(grid_density: np.ndarray, token_points: np.ndarray) -> float:
        return conditional_wasserstein_tokens(
            grid_density, grid, token_points, token_s, positions.s, token_weights=weights, p=p
        )

    start = distance(density, tokens)
    system = TokenSystem(variant, params, positions=token_s)
    solution = simulate(system, tokens, t_end, dt, weights=weights, method="ssprk3")
    result = grid_run(variant, params, grid, density, t_end, positions=positions)
    end = distance(result.final, solution.tokens[-1])
    return {
        "tokens": tokens.shape[0],
        "distance_start": start,
        "distance_end": end,
        "final": result.final,
        "token_final": solution.tokens[-1],
        "token_positions": token_s,
    }
