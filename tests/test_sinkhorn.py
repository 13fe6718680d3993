"""Sinkhorn attention on the grid: closed-form field, plan marginals, iterations.

docs/theory.md, 'Sinkhorn on Gaussians' and 'Sinkhorn iterations'.
"""

from __future__ import annotations

import numpy as np
import pytest
from exact import print_table
from test_engines import densities
from test_variants import A1, COV1, MEAN1, V1, affine_exact, bulk_error

from tpde.grid import Grid, gaussian
from tpde.validation import sinkhorn_field
from tpde.variants import SinkhornAttention, SinkhornError, SinkhornHead
from tpde.variants.sinkhorn import quadrature_weights

HEAD = SinkhornHead(A1, V1, eps=1.0)


def test_sinkhorn_velocity_on_a_gaussian_is_the_closed_form_field():
    b, m = sinkhorn_field(MEAN1, COV1, HEAD)
    cells, errors, iterations = [64, 128, 256], [], []
    for n in cells:
        grid = Grid([-10, -10], [10, 10], [n, n])
        field = SinkhornAttention(HEAD)
        u = field(gaussian(grid, MEAN1, COV1), grid, 0.0)
        errors.append(bulk_error(u, affine_exact(grid, b, m), grid, MEAN1, COV1))
        iterations.append(field.iterations[-1])
    print_table(
        "Sinkhorn velocity vs V(alpha + C^T Sigma^-1 (x - alpha)) (3.5), 3-sigma bulk, "
        "box +-10, tol 1e-11",
        cells,
        errors,
        {"iterations": iterations},
    )
    assert errors[-1] <= 1e-8
    assert np.all(np.diff(np.log(errors)) < 0)


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_plan_marginals_and_the_mean_identity(eps):
    """Second marginal of the plan = mu, so int Gamma dmu = C int y dmu for any mu (3.5)."""
    grid = Grid([-6, -6], [6, 6], [40, 40])
    rho = densities(grid)["two bumps"]
    head = SinkhornHead(A1, V1, eps=eps)
    field = SinkhornAttention(head, tol=1e-12)
    q = quadrature_weights(rho, grid)
    f, g = field.potentials(q, grid, head)
    y = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    logits = (y @ head.A.T @ y.T + f[:, None] + g[None, :]) / eps
    plan = np.exp(logits) * q.reshape(-1)[:, None] * q.reshape(-1)[None, :]
    rows, cols = plan.sum(axis=1), plan.sum(axis=0)
    row_err = np.abs(rows - q.reshape(-1)).sum()
    col_err = np.abs(cols - q.reshape(-1)).sum()
    u = field(rho, grid, 0.0).reshape(2, -1)
    mean_velocity = u @ q.reshape(-1)
    identity = V1 @ (y.T @ q.reshape(-1))
    gap = float(np.abs(mean_velocity - identity).max() / np.abs(identity).max())
    print(
        f"\neps {eps}: {field.iterations} iterations, plan marginal errors {row_err:.1e} / "
        f"{col_err:.1e}, int Gamma dmu vs V int y dmu: {gap:.1e}"
    )
    assert row_err <= 1e-11 and col_err <= 1e-11
    assert gap <= 1e-11


def test_warm_start_cuts_iterations_and_failures_are_reported():
    grid = Grid([-8, -8], [8, 8], [48, 48])
    rho = gaussian(grid, MEAN1, COV1)
    field = SinkhornAttention(HEAD)
    field(rho, grid, 0.0)
    moved = gaussian(grid, MEAN1 + 0.01, COV1 * 1.01)
    field(moved, grid, 0.1)
    cold = SinkhornAttention(HEAD, warm_start=False)
    cold(moved, grid, 0.1)
    print(f"\nwarm start: {field.iterations} vs cold {cold.iterations}")
    assert field.iterations[-1] < cold.iterations[-1]
    with pytest.raises(SinkhornError, match=r"attention.max_iter: .* after 2 iterations at t = 0"):
        SinkhornAttention(HEAD, max_iter=2)(rho, grid, 0.0)


def test_sinkhorn_rejects_bad_parameters():
    grid = Grid([-2, -2], [2, 2], [8, 8])
    with pytest.raises(ValueError, match="SinkhornHead.eps"):
        SinkhornHead(A1, V1, eps=0.0)
    with pytest.raises(ValueError, match="attention.tol"):
        SinkhornAttention(HEAD, tol=-1.0)
    with pytest.raises(ValueError, match="needs a SinkhornHead"):
        from tpde.variants import Head

        SinkhornAttention(Head(A1, V1))(np.ones((8, 8)), grid, 0.0)
    with pytest.raises(ValueError, match="no mass"):
        SinkhornAttention(HEAD)(np.zeros((8, 8)), grid, 0.0)
