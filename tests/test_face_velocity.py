"""Face velocities by transverse interpolation (scheme.face_velocity; docs/theory.md,
'Face fluxes in several dimensions').

The solver may evaluate the normal velocity at the face centres only and interpolate it to
the transverse Gauss nodes with 8-point Lagrange stencils. References: polynomials (exact),
a smooth function (eighth-order convergence, ends included), and the field itself evaluated
exactly at every Gauss node. ``components`` (one velocity component on a lattice) is checked
against the full field for every variant.
"""

from __future__ import annotations

import numpy as np
import pytest
from exact import print_table
from test_engines import random_params
from test_variants import A1, COV1, MEAN1, V1

from tpde.grid import Grid, gaussian, gaussian_mixture
from tpde.schemes.operator import GAUSS3_NODES, POINT_ORDER, point_interpolation
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.variants import ATTENTION, Head, SigmoidHead


def apply(first, weights, values):
    return np.einsum("gjk,gjk->gj", weights, values[first[..., None] + np.arange(POINT_ORDER)])


def test_point_interpolation_is_exact_for_degree_7_and_eighth_order():
    n = 20
    first, weights = point_interpolation(n, GAUSS3_NODES)
    targets = np.arange(n)[None, :] + GAUSS3_NODES[:, None]
    x = np.arange(n, dtype=float)
    poly = np.polynomial.Polynomial([0.3, -1.0, 0.5, 0.2, -0.1, 0.05, 0.01, -0.002])
    assert (
        np.max(np.abs(apply(first, weights, poly(x)) - poly(targets)))
        < 1e-9 * np.abs(poly(targets)).max()
    )
    assert np.array_equal(weights[1][np.arange(n), np.arange(n) - first[1]], np.ones(n))
    cells_list, errors = (16, 32, 64, 128), []
    for cells in cells_list:
        h = 2 * np.pi / cells
        centres = (np.arange(cells) + 0.5) * h
        first, weights = point_interpolation(cells, GAUSS3_NODES)
        exact = np.sin(centres[None, :] + GAUSS3_NODES[:, None] * h)
        errors.append(np.abs(apply(first, weights, np.sin(centres)) - exact).max())
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    print_table(
        "8-point transverse interpolation of sin, max error (ends included)", cells_list, errors
    )
    assert np.all(orders > 7.5), orders
    with pytest.raises(ValueError, match="needs >= 8 points"):
        point_interpolation(7, GAUSS3_NODES)


def face_values(field, grid, rho, mode):
    solver = Solver(Problem(grid, rho, field, t_end=1.0, scheme=Scheme(face_velocity=mode)))
    return solver.interpolate_faces, solver.face_velocity(rho, 0.3).values


@pytest.mark.parametrize("variant", ["softmax", "l2", "sinkhorn"])
def test_interpolated_face_velocities_match_the_exact_nodes(variant):
    """2-D, two bumps, 32^2 / 64^2: the interpolated Gauss-node velocities against the field
    evaluated at every node; the gap falls at about eighth order."""
    cells_list, gaps = (32, 64), []
    for cells in cells_list:
        grid = Grid([-6.0, -6.0], [6.0, 6.0], [cells, cells])
        rho = gaussian_mixture(
            grid, [0.5, 0.5], [[-1.5, 0.0], [1.5, 0.5]], [0.6 * np.eye(2), [[0.5, 0.1], [0.1, 0.4]]]
        )
        field = ATTENTION[variant](random_params(variant, 2), engine="separable")
        used, fast = face_values(field, grid, rho, "auto")
        _, exact = face_values(field, grid, rho, "exact")
        assert used
        scale = max(np.abs(v).max() for v in exact)
        gaps.append(max(np.abs(f - e).max() for f, e in zip(fast, exact, strict=True)) / scale)
    print_table(
        f"{variant}: interpolated vs exact Gauss-node face velocities (relative)", cells_list, gaps
    )
    assert gaps[-1] < 1e-7 and gaps[0] / gaps[1] > 2**6


def test_face_velocity_mode_is_validated_and_small_grids_fall_back():
    with pytest.raises(ValueError, match="scheme.face_velocity"):
        Scheme(face_velocity="spline").validate()
    grid = Grid([-3.0, -3.0], [3.0, 3.0], [6, 24])
    rho = gaussian(grid, MEAN1, COV1)
    used, _ = face_values(ATTENTION["softmax"](Head(A1, V1)), grid, rho, "interpolated")
    assert not used  # 6 cells along axis 0: too few for the 8-point stencils


@pytest.mark.parametrize(
    "variant", ["softmax", "softmax-fft", "multihead", "l2", "sinkhorn", "linear", "sigmoid"]
)
def test_one_component_equals_the_full_field(variant):
    """The separable engine tabulates C m (one field per component), the FFT engine
    convolves the combined numerator w (C y)_a: both against the full field. Each call on a
    fresh field: the warm starts (Sinkhorn potentials, table spacing) agree only within
    their tolerances."""
    grid = Grid([-5.0, -5.0], [5.0, 5.0], [24, 20] if variant == "sigmoid" else [40, 36])
    rho = gaussian(grid, MEAN1, COV1)
    if variant == "multihead":
        params = [Head(A1, V1), Head(np.transpose(A1), 0.5 * np.asarray(V1))]
    elif variant == "sigmoid":
        params = SigmoidHead(A1, V1, bias=-0.5)
    else:
        params = random_params(variant if variant != "linear" else "softmax", 2)

    def field():
        if variant == "softmax-fft":
            return ATTENTION["softmax"](
                Head(0.3 * np.array([[1.0, 0.3], [0.3, 0.8]]), V1), engine="fft"
            )
        kwargs = {} if variant in ("linear", "sigmoid") else {"engine": "separable"}
        return ATTENTION[variant](params, **kwargs)

    offsets = [[0.5, 0.0], [0.0, 0.5], [0.0, 0.0]]
    full = field().at_many(rho, grid, 0.0, offsets)
    parts = field().components(rho, grid, 0.0, offsets, [0, 1, None])
    for u, part, comp in zip(full, parts, [0, 1, None], strict=True):
        expected = u if comp is None else u[comp]
        assert part.shape == expected.shape
        np.testing.assert_allclose(part, expected, rtol=0, atol=1e-13 * np.abs(u).max())
