"""The token system (MATH.md 1.2) against the Gaussian ODEs, and its own invariants.

Deterministic Gauss-Hermite tokens of N(alpha_0, Sigma_0) carry the Gaussian moments to
quadrature accuracy, so their moments follow the mean/covariance ODEs (MATH.md 6.1: the
authors' verification used 40 x 40 nodes and RK4).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_runs import PARAMS
from test_variants import A1, COV1, MEAN1, V1, multihead_c1, relative_errors

from tpde.grid import Grid, gaussian_mixture, moments
from tpde.validation import solve
from tpde.validation.particles import (
    TokenSystem,
    gauss_hermite_tokens,
    load_tokens,
    sample_tokens,
    simulate,
    token_moments,
)
from tpde.variants import SinkhornHead

CASES = dict(PARAMS, **{"multihead c1": multihead_c1()})


@pytest.mark.parametrize("case", list(CASES))
def test_gauss_hermite_tokens_follow_the_gaussian_odes(case):
    variant = case.split()[0]
    params = CASES[case]
    nodes = 16 if variant == "sinkhorn" else 30        # Sinkhorn iterates on n^2 pairs
    tokens, weights = gauss_hermite_tokens(MEAN1, COV1, nodes)
    system = TokenSystem(variant, params)
    solution = simulate(system, tokens, 0.5, 0.01, weights=weights)
    mean, cov = token_moments(solution.tokens[-1], weights)
    reference = solve(variant, MEAN1, COV1, params, 0.5).at(0.5)
    mean_err, cov_err = relative_errors(mean, cov, reference)
    iters = (f", Sinkhorn iterations {np.mean(system.iterations):.1f}/eval"
             if system.iterations else "")
    print(f"\n{case}: {nodes}^2 Gauss-Hermite tokens, RK4 dt 0.01, t = 0.5 vs ODE: mean "
          f"{mean_err:.1e}, cov {cov_err:.1e}{iters}")
    assert mean_err <= 1e-8 and cov_err <= 1e-8


def test_sinkhorn_tokens_keep_the_mean_identity_for_any_cloud():
    """Second marginal = mu^n: sum_i w_i Gamma(x_i) = V sum_i w_i x_i (MATH.md 3.5)."""
    rng = np.random.default_rng(4)
    tokens = np.concatenate([rng.normal(-1, 0.4, (150, 2)), rng.normal(1.5, 0.6, (100, 2))])
    system = TokenSystem("sinkhorn", SinkhornHead(A1, V1, eps=0.7))
    weights = np.full(250, 1 / 250)
    u = system.velocity(tokens, weights, 0.0)
    gap = np.abs(weights @ u - V1 @ (weights @ tokens)).max()
    print(f"\nSinkhorn tokens: {system.iterations} iterations, mean identity gap {gap:.1e}")
    assert gap <= 1e-12


def test_sampled_tokens_have_the_grid_moments_and_round_trip_through_npy(tmp_path):
    grid = Grid([-5, -5], [5, 5], [40, 40])
    rho = gaussian_mixture(grid, [0.6, 0.4], [[-1.5, 0.0], [1.5, 0.5]],
                           [0.4 * np.eye(2), [[0.5, 0.1], [0.1, 0.3]]])
    n = 200_000
    tokens = sample_tokens(rho, grid, n, seed=3)
    _, mean, cov = moments(rho, grid)
    t_mean, t_cov = token_moments(tokens)
    sigma = np.sqrt(np.diag(cov))
    print(f"\n{n} sampled tokens: mean error {np.abs(t_mean - mean).max():.1e} "
          f"(sigma/sqrt(n) = {sigma.max() / np.sqrt(n):.1e}), cov error "
          f"{np.abs(t_cov - cov).max():.1e}")
    assert np.all(np.abs(t_mean - mean) <= 5 * sigma / np.sqrt(n))
    assert np.abs(t_cov - cov).max() <= 5 * 2 * sigma.max() ** 2 / np.sqrt(n)
    np.save(tmp_path / "tokens.npy", tokens)
    assert np.array_equal(load_tokens(str(tmp_path / "tokens.npy"), ndim=2), tokens)
    with pytest.raises(ValueError, match="tokens.file"):
        load_tokens(str(tmp_path / "tokens.npy"), ndim=3)
    with pytest.raises(ValueError, match="tokens.variant"):
        TokenSystem("cosine", PARAMS["softmax"])
