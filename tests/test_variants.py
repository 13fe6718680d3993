"""Attention velocities on the grid: exact dense softmax / multi-head / linear engines.

References: the closed-form affine fields on Gaussians (docs/theory.md, 'Gaussian closures'), a
direct
unblocked evaluation, and the Gaussian mean/covariance ODEs (tpde.validation.gaussian).
"""

from __future__ import annotations

import numpy as np
import pytest
from exact import print_table

from tpde.grid import Grid, gaussian
from tpde.validation.studies import relative_errors  # noqa: F401  (shared by the run tests)
from tpde.variants import Head
from tpde.variants.engines.direct import density_sources, grad_log_box_factor, tilted_means
from tpde.variants.softmax import LinearAttention, SoftmaxAttention

# case c1 (non-symmetric A and V; docs/theory.md, 'Test matrices c1 and c2')
A1 = np.array([[-0.6, 0.8], [-0.2, -0.3]])
V1 = np.array([[1.0, 0.5], [-0.3, 0.8]])
MEAN1 = np.array([0.5, -0.3])
COV1 = np.array([[1.0, 0.4], [0.4, 0.6]])


def centre_points(grid: Grid) -> np.ndarray:
    return np.stack(grid.mesh(sparse=False), axis=-1)  # (*cells, d)


def bulk_error(velocity, exact, grid, mean, cov) -> float:
    """max |u - exact| / max |exact| over |x - mean|_cov <= 3 (three sigma)."""
    diff = centre_points(grid) - mean
    bulk = np.einsum("...i,ij,...j->...", diff, np.linalg.inv(cov), diff) <= 9.0
    return float(np.abs(velocity - exact)[:, bulk].max() / np.abs(exact[:, bulk]).max())


def affine_exact(grid, b, matrix) -> np.ndarray:
    x = centre_points(grid)
    return np.moveaxis(b + x @ matrix.T, -1, 0)


def test_grad_log_box_factor_series_and_exact_agree():
    h = [0.3, 0.7]
    c = np.array([[1e-4, -2e-3], [5e-3, 1.0], [-4.0, 20.0]])
    g = grad_log_box_factor(c, h)
    step = 1e-6
    for a in range(2):
        plus, minus = c.copy(), c.copy()
        plus[:, a] += step
        minus[:, a] -= step

        def log_s(cc, a=a):
            u = 0.5 * h[a] * cc[:, a]
            return np.log(np.sinh(u) / u)

        numeric = (log_s(plus) - log_s(minus)) / (2 * step)
        assert np.allclose(g[:, a], numeric, rtol=1e-6, atol=1e-10)
    assert g[0, 0] == pytest.approx(1e-4 * 0.3**2 / 12, rel=1e-6)


def test_tilted_means_match_a_direct_evaluation_and_stay_finite():
    rng = np.random.default_rng(3)
    sources = rng.uniform(-4, 4, (300, 2))
    weights = rng.random(300) ** 8
    c = rng.normal(0, 1, (50, 2))
    c[:5] *= 400.0  # logits of several thousand: no overflow, no NaN
    fast = tilted_means(c, sources, weights, block=7)
    logits = c @ sources.T
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits) * weights
    direct = (e @ sources) / e.sum(axis=1, keepdims=True)
    assert np.all(np.isfinite(fast))
    assert np.allclose(fast, direct, rtol=1e-13, atol=1e-13)
    # convex hull bound ('Clip of tilted means'): every tilted mean lies within the support box
    assert np.all(np.abs(fast) <= 4.0 + 1e-12)


def test_softmax_velocity_on_gaussian_cell_averages_is_the_affine_field():
    """Gamma(x) = V (alpha + Sigma A x) in the bulk; the cell-average correction makes the
    error spectrally small, the naive midpoint sum has an O(h^2) error."""
    cells, errors, naive = [24, 32, 48], [], []
    exact_b, exact_m = V1 @ MEAN1, V1 @ COV1 @ A1
    for n in cells:
        grid = Grid([-12, -12], [12, 12], [n, n])
        rho = gaussian(grid, MEAN1, COV1)
        u = SoftmaxAttention(Head(A1, V1))(rho, grid, 0.0)
        exact = affine_exact(grid, exact_b, exact_m)
        errors.append(bulk_error(u, exact, grid, MEAN1, COV1))
        sources, weights = density_sources(rho, grid)
        x = centre_points(grid).reshape(-1, 2)
        plain = tilted_means(x @ A1.T, sources, weights) @ V1.T
        naive.append(
            bulk_error(np.moveaxis(plain.reshape(n, n, 2), -1, 0), exact, grid, MEAN1, COV1)
        )
    print_table(
        "softmax velocity vs V(alpha + Sigma A x), 3-sigma bulk, box +-12",
        cells,
        errors,
        {"naive sum": naive},
    )
    assert errors[-1] <= 1e-12
    assert errors[0] > errors[-1]
    assert naive[-1] > 1e-3  # the h^2/12 tilt bias the correction removes


def test_multihead_velocity_is_the_sum_of_head_fields():
    heads = [
        Head(0.5 * np.outer([0.8, 0.5], [0.4, 0.7]), V1[:1], np.eye(2)[:, :1]),
        Head(0.5 * np.outer([-0.3, 0.6], [-0.6, 0.2]), V1[1:], np.eye(2)[:, 1:]),
    ]
    grid = Grid([-12, -12], [12, 12], [48, 48])
    rho = gaussian(grid, MEAN1, COV1)
    u = SoftmaxAttention(heads)(rho, grid, 0.0)
    b = sum(h.C @ MEAN1 for h in heads)
    m = sum(h.C @ COV1 @ h.A for h in heads)
    error = bulk_error(u, affine_exact(grid, b, m), grid, MEAN1, COV1)
    print(f"\nmulti-head (2 rank-1 heads, W = I columns): bulk relative error {error:.2e}")
    assert error <= 1e-12


def test_linear_attention_is_exact_from_corrected_moments():
    grid = Grid([-10, -10], [10, 10], [40, 40])
    rho = gaussian(grid, MEAN1, COV1)
    u = LinearAttention(Head(A1, V1))(rho, grid, 0.0)
    m = V1 @ (COV1 + np.outer(MEAN1, MEAN1)) @ A1
    error = float(
        np.abs(u - affine_exact(grid, np.zeros(2), m)).max()
        / np.abs(affine_exact(grid, np.zeros(2), m)).max()
    )
    print(f"\nlinear attention: relative error {error:.2e}")
    assert error <= 1e-11


def test_bad_attention_inputs_are_named():
    grid = Grid([-2, -2], [2, 2], [8, 8])
    with pytest.raises(ValueError, match="attention.heads"):
        SoftmaxAttention(Head(np.eye(3), np.eye(3)))(np.ones((8, 8)), grid, 0.0)
    with pytest.raises(ValueError, match="no mass"):
        SoftmaxAttention(Head(np.eye(2), np.eye(2)))(np.zeros((8, 8)), grid, 0.0)
    with pytest.raises(ValueError, match="Head.A"):
        Head([[1.0, np.nan], [0.0, 1.0]], np.eye(2))


def multihead_c1() -> list[Head]:
    """Multi-head c1 ('Test matrices c1 and c2'): H = 2, k = 1, A_h = K[h]^T Q[h] / 2 (outer product
    of rows), C_h = e_h V[h]."""
    q = np.array([[0.8, -0.3], [0.5, 0.6]])
    k = np.array([[0.4, 0.7], [-0.6, 0.2]])
    return [
        Head(0.5 * np.outer(k[h], q[h]), V1[h : h + 1], np.eye(2)[:, h : h + 1]) for h in range(2)
    ]


@pytest.mark.parametrize("variant", ["softmax", "l2", "sinkhorn", "linear", "multihead"])
def test_velocity_on_gaussian_data_is_the_closed_form_field(variant):
    """docs/theory.md, 'Gaussian closures': every variant with a Gaussian closure has an affine
    field on N(alpha, Sigma); the grid velocity (auto engine: separable above 32^2) matches it in
    the 3-sigma bulk."""
    from test_runs import PARAMS

    from tpde.validation.gaussian import affine_field
    from tpde.variants import ATTENTION

    params = PARAMS[variant]
    b, m = affine_field(variant, MEAN1, COV1, params)
    cells, errors = [64, 128, 256], []
    for n in cells:
        grid = Grid([-10, -10], [10, 10], [n, n])
        u = ATTENTION[variant](params)(gaussian(grid, MEAN1, COV1), grid, 0.0)
        errors.append(bulk_error(u, affine_exact(grid, b, m), grid, MEAN1, COV1))
    print_table(
        f"{variant} velocity vs its closed-form affine field, 3-sigma bulk, box +-10",
        cells,
        errors,
    )
    assert errors[-1] <= 1e-8
    assert errors[-1] <= max(errors[0], 1e-13)  # falls, or sits at round-off from the start
