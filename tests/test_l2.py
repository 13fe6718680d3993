"""l2 attention on the grid against the closed-form field and the Gaussian ODE.

docs/theory.md, 'l2 on Gaussians'.
"""

from __future__ import annotations

import numpy as np
import pytest
from exact import print_table
from test_variants import COV1, MEAN1, V1

from tpde.grid import Grid, gaussian, gaussian_mixture
from tpde.grid.stencils import point_values
from tpde.schemes.frame import AffineFrame, transported
from tpde.validation import l2_field
from tpde.validation.paper import EXPERIMENTS
from tpde.variants import ATTENTION, Head, L2Head
from tpde.variants.engines.direct import support_box
from tpde.variants.l2 import L2Attention
from tpde.variants.softmax import with_constant

# case c1 (docs/theory.md, 'Test matrices c1 and c2')
Q1 = np.array([[0.8, -0.3], [0.5, 0.6]])
K1 = np.array([[0.4, 0.7], [-0.6, 0.2]])
HEAD = L2Head(Q1, K1, V1)


def test_point_values_are_eighth_order():
    errors = []
    for n in (16, 32, 64):
        grid = Grid([-6.0], [6.0], [n])
        rho = gaussian(grid, [0.3], [[0.8]])
        exact = np.exp(-((grid.centres(0) - 0.3) ** 2) / 1.6) / np.sqrt(2 * np.pi * 0.8)
        errors.append(np.abs(point_values(rho, grid) - exact).max())
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    print(f"\npoint values from cell averages: errors {errors}, orders {orders}")
    assert orders[-1] > 7.0


def test_l2_velocity_on_gaussian_cell_averages_is_the_affine_field():
    b, m = l2_field(MEAN1, COV1, HEAD)
    cells, errors = [32, 64, 128], []
    for n in cells:
        grid = Grid([-8, -8], [8, 8], [n, n])
        u = ATTENTION["l2"](HEAD)(gaussian(grid, MEAN1, COV1), grid, 0.0)
        x = np.stack(grid.mesh(sparse=False), axis=-1)
        exact = np.moveaxis(b + x @ m.T, -1, 0)
        diff = x - MEAN1
        bulk = np.einsum("...i,ij,...j->...", diff, np.linalg.inv(COV1), diff) <= 9.0
        errors.append(float(np.abs(u - exact)[:, bulk].max() / np.abs(exact[:, bulk]).max()))
    print_table("l2 velocity vs the closed form (3.3), 3-sigma bulk, box +-8", cells, errors)
    assert errors[-1] <= 1e-8
    assert np.all(np.diff(np.log(errors)) < 0)


def test_l2_engines_agree_on_a_two_bump_density():
    grid = Grid([-8, -8], [8, 8], [48, 48])
    rho = gaussian_mixture(
        grid, [0.5, 0.5], [[-1.5, 0.0], [1.5, 0.5]], [0.4 * np.eye(2), [[0.4, 0.1], [0.1, 0.3]]]
    )
    direct = L2Attention(HEAD, engine="direct")(rho, grid, 0.0)
    fast = L2Attention(HEAD, engine="separable")(rho, grid, 0.0)
    mask = rho > 1e-8 * rho.max()
    error = float(np.abs(fast - direct)[:, mask].max() / np.abs(direct[:, mask]).max())
    print(f"\nl2 separable vs direct, two bumps 48^2: {error:.2e}")
    assert error <= 1e-10


def test_l2_needs_q_and_k():
    grid = Grid([-2, -2], [2, 2], [8, 8])
    with pytest.raises(ValueError, match="L2Head"):
        L2Attention(Head(np.eye(2), np.eye(2)))(np.ones((8, 8)), grid, 0.0)


def test_l2_frame_velocity_where_the_separable_shifts_underflow():
    """E5's l2 head in the co-moving frame (docs/theory.md, 'Separable kernel sums'): near
    t = 0.87 the frame's key weight exp(-|K (m + L eta)|^2) is narrow about a diagonal line
    of the xi box and the tilts reach |c| ~ 50, so the per-axis shifts of the separable table
    left some of its nodes' sums subnormal or 0 (0 / 0 in the means: the run stopped with a
    non-finite velocity, and nodes short of 0 gave errors up to 2e-4 here). The frame of that
    time (L scaled by 1.05, N(0, I) in xi, 48^2 on +-12) against the dense sums."""
    head = EXPERIMENTS["E5"].params["l2"]
    frame = AffineFrame(np.zeros(2), 1.05 * np.array([[0.4409, 0.2737], [0.2695, 1.0057]]))
    grid = Grid([-12.0, -12.0], [12.0, 12.0], [48, 48])
    rho = gaussian(grid, np.zeros(2), np.eye(2))
    offsets, components = [np.array([0.5, 0.0]), np.array([0.0, 0.5])], [0, 1]
    fields = {
        engine: L2Attention(head, engine=engine).frame_components(
            rho, grid, 0.0, offsets, components, frame
        )
        for engine in ("direct", "separable")
    }
    rows = []
    for axis, (dense, fast) in enumerate(zip(fields["direct"], fields["separable"], strict=True)):
        assert np.all(np.isfinite(fast))
        scale = float(np.abs(dense).max())
        rows.append((axis, scale, float(np.abs(fast - dense).max()) / scale))
    print("\nE5 l2 frame velocity, 48^2, separable vs dense: face axis, max |u|, relative error")
    for axis, scale, error in rows:
        print(f"  {axis}  {scale:.4f}  {error:.2e}")
    assert max(error for _, _, error in rows) <= 1e-12


def dense_frame_velocity(rho, grid, head, frame, axis, where) -> np.ndarray:
    """The normal velocity ``(L^-1 Gamma(x))_axis`` at the frame faces ``where`` (boolean,
    faces normal to ``axis``), x = m + L xi: the dense sums of the physical kernel
    exp(-|scale Q x - K y|^2) over the cells' point values (y = m + L eta), each row shifted
    by its largest exponent."""
    offset = np.where(np.arange(2) == axis, 0.5, 0.0)
    faces = np.stack(np.meshgrid(*grid.lattice(offset), indexing="ij"), axis=-1)[where]
    x = frame.physical(faces)
    y = frame.physical(np.stack(grid.mesh(sparse=False), axis=-1).reshape(-1, 2))
    values = np.maximum(point_values(rho, grid), 0.0).reshape(-1)
    keep = values > 0
    queries, keys = x @ (head.scale * head.Q).T, y[keep] @ head.K.T
    exponents = -((queries[:, None, :] - keys[None, :, :]) ** 2).sum(axis=-1)
    exponents += np.log(values[keep])
    terms = np.exp(exponents - exponents.max(axis=1, keepdims=True))
    mean = terms @ y[keep] / terms.sum(axis=1, keepdims=True)
    return (mean @ head.C.T @ frame.inverse.T)[:, axis]


def test_l2_frame_velocity_only_on_the_transported_faces(monkeypatch):
    """In the co-moving frame l2 evaluates its velocity only on the window of the faces the
    frame transports and holds (TiltedMeanField.on_windows, as softmax; docs/theory.md,
    'The co-moving affine frame'): the frame of E5's l2 run near t = 0.87 (as above) on
    64^2, the separable tables. On the transported faces the velocity is that of the full
    evaluation over every face (the field's head_velocities on the whole lattices) and of
    the dense sums of the physical kernel; the tables are smaller."""
    import tpde.variants.engines.separable as separable

    nodes: list[int] = []
    original = separable.mgf_table

    def counted(weights, grid, tilts, *args, **kwargs):
        nodes.append(int(np.prod([len(t) for t in tilts])))
        return original(weights, grid, tilts, *args, **kwargs)

    monkeypatch.setattr(separable, "mgf_table", counted)
    head = EXPERIMENTS["E5"].params["l2"]
    frame = AffineFrame(np.zeros(2), 1.05 * np.array([[0.4409, 0.2737], [0.2695, 1.0057]]))
    grid = Grid([-12.0, -12.0], [12.0, 12.0], [64, 64])
    rho = gaussian(grid, np.zeros(2), np.eye(2))
    offsets, components = [np.array([0.5, 0.0]), np.array([0.0, 0.5])], [0, 1]
    field = L2Attention(head, engine="separable")
    restricted = field.frame_components(rho, grid, 0.0, offsets, components, frame)
    after, nodes[:] = sum(nodes), []
    full_field = L2Attention(head, engine="separable")
    weights, coupling, shift, gain, constant = full_field.frame_weights(rho, grid, 0.0, frame)
    velocity = full_field.head_velocities(
        weights, grid, offsets, components, coupling, gain, support_box(weights, grid), None, shift
    )
    full = full_field.shaped(with_constant(velocity, components, constant), grid, offsets)
    before = sum(nodes)
    print(f"\nE5 l2 frame 64^2: table nodes, every face {before}, transported window {after}")
    print("face axis, transported faces, max |u|, vs full, vs dense")
    for axis, (fast, every) in enumerate(zip(restricted, full, strict=True)):
        moving = transported(rho, offsets[axis])
        dense = dense_frame_velocity(rho, grid, head, frame, axis, moving)
        scale = float(np.abs(dense).max())
        to_full = float(np.abs(fast - every)[moving].max()) / scale
        to_dense = float(np.abs(fast[moving] - dense).max()) / scale
        count = f"{int(moving.sum())}/{moving.size}"
        print(f"  {axis}  {count}  {scale:.4f}  {to_full:.1e}  {to_dense:.1e}")
        assert to_full <= 1e-12 and to_dense <= 1e-12
    assert after < 0.8 * before
