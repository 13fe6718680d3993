"""Sinkhorn attention on the grid: closed-form field, plan marginals, iterations.

docs/theory.md, 'Sinkhorn on Gaussians' and 'Sinkhorn iterations'.
"""

from __future__ import annotations

import numpy as np
import pytest
from exact import print_table
from test_engines import densities
from test_variants import A1, COV1, MEAN1, V1, affine_exact, bulk_error

from tpde.grid import Grid, gaussian, gaussian_mixture
from tpde.schemes.frame import AffineFrame, mixture_frame, transported
from tpde.validation import sinkhorn_field
from tpde.variants import SinkhornAttention, SinkhornError, SinkhornHead
from tpde.variants.sinkhorn import quadrature_weights
from tpde.variants.softmax import with_constant

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


def test_frame_velocity_only_on_the_transported_faces():
    """In the co-moving frame Sinkhorn evaluates its conditional means only on the window of
    the faces the frame transports (TiltedMeanField.on_windows, as softmax and l2;
    docs/theory.md, 'The co-moving affine frame'): on 64^2, xi box +-16, the two-component
    mixture of benchmarks/frame_step.py in its frame and a Gaussian in a frame, separable
    tables. On the transported faces the velocity is the full evaluation's (every face,
    from a second field), the potentials on the cells and the iteration counts are the
    same."""
    grid = Grid([-16.0, -16.0], [16.0, 16.0], [64, 64])
    frame, xi_means, xi_covs = mixture_frame(
        [0.35, 0.65],
        [np.array([1.0, -0.5]), np.array([-0.6, 0.4])],
        [np.array([[0.5, 0.1], [0.1, 0.3]]), np.array([[0.4, -0.1], [-0.1, 0.6]])],
    )
    cases = {
        "mixture": (gaussian_mixture(grid, [0.35, 0.65], xi_means, xi_covs), frame, HEAD),
        "gaussian": (
            gaussian(grid, np.zeros(2), np.eye(2)),
            AffineFrame.following(MEAN1, COV1),
            SinkhornHead([[1.0, 0.7], [-0.7, 0.0]], -np.eye(2), eps=1.0),
        ),
    }
    offsets = [np.array([0.5, 0.0]), np.array([0.0, 0.5])]
    print("\ncase, face axis, component, transported faces, max |u|, vs full, iterations")
    for name, (rho, frame, head) in cases.items():
        for components in ([0, 1], [None, None]):
            fast = SinkhornAttention(head)
            restricted = fast.frame_components(rho, grid, 0.0, offsets, components, frame)
            slow = SinkhornAttention(head)  # the full evaluation, on every face
            L, inverse = frame.matrix, frame.inverse
            framed = SinkhornHead(L.T @ head.A @ L, inverse @ head.C @ L, eps=head.eps)
            tilted, box = slow.plan_weights(rho, grid, 0.0, framed)
            velocity = slow.head_velocities(
                tilted, grid, offsets, components, framed.A / framed.eps, framed.C, box
            )
            constant = inverse @ head.C @ frame.mean
            full = slow.shaped(with_constant(velocity, components, constant), grid, offsets)
            assert fast.iterations == slow.iterations
            np.testing.assert_array_equal(
                fast.warm_potential(grid.shape, head.eps, 0.0),
                slow.warm_potential(grid.shape, head.eps, 0.0),
            )
            for axis, (mine, every) in enumerate(zip(restricted, full, strict=True)):
                moving = transported(rho, offsets[axis])
                mine, every = mine[..., moving], every[..., moving]
                scale = float(np.abs(every).max())
                error = float(np.abs(mine - every).max()) / scale
                count = f"{int(moving.sum())}/{moving.size}"
                print(
                    f"  {name:8s} {axis} {components[axis]!s:4s} {count:9s} {scale:.4f} "
                    f"{error:.1e} {fast.iterations}"
                )
                assert moving.sum() < 0.6 * moving.size
                assert error <= 1e-12


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
