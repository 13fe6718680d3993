"""The token system (docs/theory.md, 'The Transformer PDE') against the Gaussian ODEs, and its
own invariants.

Deterministic Gauss-Hermite tokens of N(alpha_0, Sigma_0) carry the Gaussian moments to
quadrature accuracy, so their moments follow the mean/covariance ODEs (docs/theory.md,
'Gaussian closures').
"""

from __future__ import annotations

import numpy as np
import pytest
from test_runs import PARAMS
from test_variants import A1, COV1, MEAN1, V1, multihead_c1, relative_errors

from tpde.grid import Grid, Positions, gaussian, gaussian_mixture, moments
from tpde.validation import solve
from tpde.validation.particles import (
    TokenSystem,
    causal_positions,
    gauss_hermite_tokens,
    load_tokens,
    sample_sliced_tokens,
    sample_tokens,
    simulate,
    token_moments,
)
from tpde.variants import Head, SigmoidHead, SinkhornHead

CASES = dict(PARAMS, **{"multihead c1": multihead_c1()})


@pytest.mark.parametrize("case", list(CASES))
def test_gauss_hermite_tokens_follow_the_gaussian_odes(case):
    variant = case.split()[0]
    params = CASES[case]
    nodes = 16 if variant == "sinkhorn" else 30  # Sinkhorn iterates on n^2 pairs
    tokens, weights = gauss_hermite_tokens(MEAN1, COV1, nodes)
    system = TokenSystem(variant, params)
    solution = simulate(system, tokens, 0.5, 0.01, weights=weights)
    mean, cov = token_moments(solution.tokens[-1], weights)
    reference = solve(variant, MEAN1, COV1, params, 0.5).at(0.5)
    mean_err, cov_err = relative_errors(mean, cov, reference)
    iters = (
        f", Sinkhorn iterations {np.mean(system.iterations):.1f}/eval" if system.iterations else ""
    )
    print(
        f"\n{case}: {nodes}^2 Gauss-Hermite tokens, RK4 dt 0.01, t = 0.5 vs ODE: mean "
        f"{mean_err:.1e}, cov {cov_err:.1e}{iters}"
    )
    assert mean_err <= 1e-8 and cov_err <= 1e-8


def test_sinkhorn_tokens_keep_the_mean_identity_for_any_cloud():
    """Second marginal = mu^n: sum_i w_i Gamma(x_i) = V sum_i w_i x_i ('Closed forms')."""
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
    rho = gaussian_mixture(
        grid, [0.6, 0.4], [[-1.5, 0.0], [1.5, 0.5]], [0.4 * np.eye(2), [[0.5, 0.1], [0.1, 0.3]]]
    )
    n = 200_000
    tokens = sample_tokens(rho, grid, n, seed=3)
    _, mean, cov = moments(rho, grid)
    t_mean, t_cov = token_moments(tokens)
    sigma = np.sqrt(np.diag(cov))
    print(
        f"\n{n} sampled tokens: mean error {np.abs(t_mean - mean).max():.1e} "
        f"(sigma/sqrt(n) = {sigma.max() / np.sqrt(n):.1e}), cov error "
        f"{np.abs(t_cov - cov).max():.1e}"
    )
    assert np.all(np.abs(t_mean - mean) <= 5 * sigma / np.sqrt(n))
    assert np.abs(t_cov - cov).max() <= 5 * 2 * sigma.max() ** 2 / np.sqrt(n)
    np.save(tmp_path / "tokens.npy", tokens)
    assert np.array_equal(load_tokens(str(tmp_path / "tokens.npy"), ndim=2), tokens)
    with pytest.raises(ValueError, match="tokens.file"):
        load_tokens(str(tmp_path / "tokens.npy"), ndim=3)
    with pytest.raises(ValueError, match="tokens.variant"):
        TokenSystem("cosine", PARAMS["softmax"])


# ---- masked (causal) attention --------------------------------------------------------------
MASKABLE = {
    "softmax": PARAMS["softmax"],
    "l2": PARAMS["l2"],
    "linear": PARAMS["linear"],
    "sigmoid": SigmoidHead(A1, V1, bias=-0.5),
    "multihead": PARAMS["multihead"],
}


def _cloud(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n tokens (n, 2) around MEAN1 and random positive weights (n,) summing to 1."""
    rng = np.random.default_rng(seed)
    tokens = MEAN1 + rng.normal(size=(n, 2)) @ np.linalg.cholesky(COV1).T
    weights = rng.random(n) + 0.5
    return tokens, weights / weights.sum()


@pytest.mark.parametrize("variant", list(MASKABLE))
def test_masked_velocity_with_one_position_is_the_unmasked_velocity(variant):
    tokens, weights = _cloud(60, 1)
    unmasked = TokenSystem(variant, MASKABLE[variant]).velocity(tokens, weights, 0.0)
    masked = TokenSystem(variant, MASKABLE[variant], positions=np.full(60, 0.4))
    assert np.array_equal(masked.velocity(tokens, weights, 0.0), unmasked)


@pytest.mark.parametrize("variant", list(MASKABLE))
def test_masked_velocity_is_causal_bit_for_bit(variant):
    """Moving the tokens after s0 leaves every velocity at positions <= s0 unchanged."""
    tokens, weights = _cloud(90, 2)
    positions = np.random.default_rng(3).integers(0, 7, 90) / 6  # 7 levels, ties included
    system = TokenSystem(variant, MASKABLE[variant], positions=positions)
    before = system.velocity(tokens, weights, 0.0)
    later = positions > 0.5
    moved = tokens.copy()
    moved[later] += np.random.default_rng(4).normal(size=(later.sum(), 2))
    after = system.velocity(moved, weights, 0.0)
    assert np.array_equal(after[~later], before[~later])
    assert not np.allclose(after[later], before[later])


def test_masked_softmax_is_the_brute_force_causal_sum():
    """Token i at s_i = (i + 1) / n attends to tokens[:i + 1]: against the unmasked system on
    that prefix and against the softmax formula written out, V sum_j w_j y_j e^{<A x_i, y_j>}
    / sum_j w_j e^{<A x_i, y_j>} over j <= i."""
    n = 40
    tokens, weights = _cloud(n, 5)
    masked = TokenSystem("softmax", Head(A1, V1), positions=causal_positions(n))
    u = masked.velocity(tokens, weights, 0.0)
    unmasked = TokenSystem("softmax", Head(A1, V1))
    for i in range(n):
        prefix = unmasked.velocity(tokens[: i + 1], weights[: i + 1], 0.0)[i]
        kernel = weights[: i + 1] * np.exp(tokens[: i + 1] @ (A1 @ tokens[i]))
        formula = V1 @ (kernel @ tokens[: i + 1]) / kernel.sum()
        assert np.abs(u[i] - prefix).max() <= 1e-13
        assert np.abs(u[i] - formula).max() <= 1e-13 * max(1.0, np.abs(formula).max())


def test_masked_sigmoid_is_the_unmasked_sum_over_the_prefix():
    """Unnormalised: token i sums over tokens[:i + 1] with the global weights (the one-token
    levels take the dense numpy sum, the unmasked prefix systems the numba kernel)."""
    n = 40
    tokens, weights = _cloud(n, 8)
    head = MASKABLE["sigmoid"]
    u = TokenSystem("sigmoid", head, positions=causal_positions(n)).velocity(tokens, weights, 0)
    for i in range(n):
        prefix = TokenSystem("sigmoid", head).velocity(tokens[: i + 1], weights[: i + 1], 0.0)
        assert np.abs(u[i] - prefix[i]).max() <= 1e-13


def test_the_sink_moves_under_its_own_attention_only():
    """Tokens at s = 0 (the attention sink) attend to the sink tokens only: their velocity is
    the unmasked velocity of the sink cloud, whatever the other tokens do."""
    tokens, weights = _cloud(50, 6)
    positions = np.concatenate([np.zeros(3), causal_positions(47)])
    system = TokenSystem("softmax", Head(A1, V1), positions=positions)
    u = system.velocity(tokens, weights, 0.0)
    alone = TokenSystem("softmax", Head(A1, V1)).velocity(tokens[:3], weights[:3], 0.0)
    assert np.allclose(u[:3], alone, rtol=1e-14, atol=1e-15)
    single = TokenSystem(
        "softmax", Head(A1, V1), positions=np.concatenate([[0.0], causal_positions(49)])
    )
    assert np.allclose(single.velocity(tokens, weights, 0.0)[0], V1 @ tokens[0], rtol=1e-14)


def test_masked_system_integrates_and_rejects_bad_positions():
    tokens, weights = _cloud(30, 7)
    system = TokenSystem("softmax", Head(A1, V1), positions=causal_positions(30))
    solution = simulate(system, tokens, 0.2, 0.05, weights=weights)
    assert solution.tokens.shape == (2, 30, 2) and np.all(np.isfinite(solution.tokens))
    with pytest.raises(ValueError, match="tokens.positions"):
        TokenSystem("sinkhorn", SinkhornHead(A1, V1, eps=1.0), positions=causal_positions(30))
    with pytest.raises(ValueError, match="tokens.positions"):
        TokenSystem("softmax", Head(A1, V1), positions=causal_positions(29)).velocity(
            tokens, weights, 0.0
        )
    with pytest.raises(ValueError, match="tokens.positions"):
        TokenSystem("softmax", Head(A1, V1), positions=np.full(30, 1.5))
    assert np.array_equal(causal_positions(4), [0.25, 0.5, 0.75, 1.0])


def test_sample_sliced_tokens_shapes_positions_and_weights():
    grid = Grid([-5, -5], [5, 5], [40, 40])
    positions = Positions(3, sink_mass=0.2)
    density = positions.sliced(lambda s: gaussian(grid, [s, -s], 0.3 * np.eye(2)), grid)
    density[2] *= 0.5  # a slice that lost half its mass
    per = 4000
    tokens, s, w = sample_sliced_tokens(density, grid, positions, per, seed=9)
    count = positions.count
    assert tokens.shape == (count * per, 2) and s.shape == w.shape == (count * per,)
    assert np.array_equal(s, np.repeat(positions.s, per))
    masses = positions.marginal(density, grid)
    assert np.allclose(w, np.repeat(masses / masses.sum() / per, per), rtol=1e-14)
    assert abs(w.sum() - 1.0) <= 1e-14
    for k in range(count):  # each slice samples its own law
        mean = token_moments(tokens[k * per : (k + 1) * per])[0]
        _, ref, cov = moments(density[k], grid)
        assert np.all(np.abs(mean - ref) <= 5 * np.sqrt(np.diag(cov) / per))
    again = sample_sliced_tokens(density, grid, positions, per, seed=9)[0]
    assert np.array_equal(again, tokens)
    same = positions.product(gaussian(grid, [0, 0], np.eye(2)), grid)
    x = sample_sliced_tokens(same, grid, positions, 10, seed=1)[0]
    assert not np.array_equal(x[:10], x[10:20])  # a different seed per slice
