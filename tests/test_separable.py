"""The separable (moment-generating-function) softmax engine against the dense reference."""

from __future__ import annotations

import numpy as np
import pytest
from exact import print_table
from test_variants import A1, COV1, MEAN1, V1, relative_errors, softmax_run

from tpde.grid import Grid, gaussian, gaussian_mixture
from tpde.validation import solve
from tpde.variants import Head
from tpde.variants.softmax import SoftmaxAttention


def densities(grid: Grid) -> dict[str, np.ndarray]:
    d = grid.ndim
    means = [[-1.5] + [0.0] * (d - 1), [1.5] + [0.5] * (d - 1)]
    cov_b = 0.3 * np.eye(d) + 0.1 * np.ones((d, d))
    return {
        "gaussian": gaussian(grid, MEAN1[:d] if d <= 2 else [0.5, -0.3, 0.2],
                             COV1 if d == 2 else 0.7 * np.eye(d)),
        "two bumps": gaussian_mixture(grid, [0.5, 0.5], means, [0.4 * np.eye(d), cov_b]),
    }


def head_for(d: int) -> Head:
    rng = np.random.default_rng(7)
    if d == 2:
        return Head(A1, V1)
    return Head(rng.normal(0, 0.5, (d, d)), rng.normal(0, 0.7, (d, d)))


def engine_errors(grid: Grid, rho: np.ndarray, head: Head, nodes: int) -> float:
    """max |separable - direct| / max |direct| where rho > 1e-8 max rho (all face lattices)."""
    direct = SoftmaxAttention(head, engine="direct")(rho, grid, 0.0)
    fast = SoftmaxAttention(head, engine="separable", nodes=nodes)(rho, grid, 0.0)
    mask = rho > 1e-8 * rho.max()
    return float(np.abs(fast - direct)[:, mask].max() / np.abs(direct[:, mask]).max())


@pytest.mark.parametrize("kind", ["gaussian", "two bumps"])
def test_separable_engine_converges_to_the_dense_sums_2d(kind):
    grid = Grid([-8, -8], [8, 8], [64, 64])
    rho = densities(grid)[kind]
    nodes = [64, 128, 256, 512]
    errors = [engine_errors(grid, rho, head_for(2), m) for m in nodes]
    print_table(f"separable vs direct softmax velocity, 2-D 64^2, {kind}, order 12 "
                "(N = table nodes per axis)", nodes, errors)
    assert errors[-1] <= 1e-10
    assert errors[-1] < errors[0]


@pytest.mark.parametrize("ndim, cells, nodes", [(1, 200, 4096), (3, 16, 96)])
def test_separable_engine_matches_the_dense_sums_in_1d_and_3d(ndim, cells, nodes):
    grid = Grid([-6.0] * ndim, [6.0] * ndim, [cells] * ndim)
    for kind, rho in densities(grid).items():
        error = engine_errors(grid, rho, head_for(ndim), nodes)
        print(f"\n{ndim}-D {kind}: separable vs direct {error:.2e}")
        assert error <= 1e-9


def test_separable_multihead_with_rank_one_heads():
    heads = [Head(0.5 * np.outer([0.8, 0.5], [0.4, 0.7]), V1[:1], np.eye(2)[:, :1]),
             Head(0.5 * np.outer([-0.3, 0.6], [-0.6, 0.2]), V1[1:], np.eye(2)[:, 1:])]
    grid = Grid([-8, -8], [8, 8], [48, 48])
    rho = densities(grid)["two bumps"]
    direct = SoftmaxAttention(heads, engine="direct")(rho, grid, 0.0)
    fast = SoftmaxAttention(heads, engine="separable")(rho, grid, 0.0)
    error = float(np.abs(fast - direct).max() / np.abs(direct).max())
    print(f"\nmulti-head rank-1 heads, separable vs direct: {error:.2e}")
    assert error <= 1e-10


def test_softmax_run_at_64_follows_the_ode_to_1e_3():
    """MATH.md c1 matrices, t = 0.5: the issue's target of 1e-3 at 64^2 (separable engine)."""
    t_end = 0.5
    reference = solve("softmax", MEAN1, COV1, Head(A1, V1), t_end).at(t_end)
    mean_err, cov_err = relative_errors(*softmax_run(64, Head(A1, V1), t_end), reference)
    print(f"\nsoftmax run 64^2 (separable) vs ODE: mean {mean_err:.2e}, cov {cov_err:.2e}")
    assert cov_err < 1e-3


@pytest.mark.slow
def test_softmax_run_refinement_to_256():
    t_end = 0.5
    reference = solve("softmax", MEAN1, COV1, Head(A1, V1), t_end).at(t_end)
    cells = [64, 128, 256]
    rows = [relative_errors(*softmax_run(n, Head(A1, V1), t_end), reference) for n in cells]
    print_table("softmax run vs Gaussian ODE (c1), t = 0.5: relative covariance error",
                cells, [r[1] for r in rows], {"mean err": [r[0] for r in rows]})
    assert rows[-1][1] < 1e-6
