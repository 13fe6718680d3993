"""The frame's initial moments (tpde.schemes.frame) against closed forms: the uniform box
and ball, weighted points, their push to frame units and the cells' sub-points."""

from __future__ import annotations

import math

import numpy as np

from tpde.grid import Grid
from tpde.schemes import frame as fr


def test_uniform_box_and_ball():
    frame, half = fr.uniform_box_frame(np.array([0.0, -1.0]), np.array([2.0, 5.0]))
    # mean (1, 2), covariance diag(4 / 12, 36 / 12): L = diag(sqrt(1/3), sqrt 3)
    print(frame.mean, frame.matrix)
    np.testing.assert_allclose(frame.mean, [1.0, 2.0])
    np.testing.assert_allclose(frame.matrix, np.diag([math.sqrt(1 / 3), math.sqrt(3.0)]))
    assert half == math.sqrt(3.0)
    frame, radius = fr.uniform_ball_frame(np.array([1.0, 0.0, 0.0]), 2.0)
    np.testing.assert_allclose(frame.matrix, 2.0 / math.sqrt(5.0) * np.eye(3), rtol=1e-15)
    assert radius == math.sqrt(5.0)


def test_points_frame_and_push():
    points = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    weights = np.full(4, 0.25)
    frame = fr.points_frame(points, weights)
    # mean 0, covariance diag(1/2, 2)
    np.testing.assert_allclose(frame.mean, [0.0, 0.0], atol=0)
    np.testing.assert_allclose(frame.matrix, np.diag([math.sqrt(0.5), math.sqrt(2.0)]))
    xi = fr.to_frame(frame, points)
    np.testing.assert_allclose(weights @ (xi * xi), [1.0, 1.0], rtol=1e-15)


def test_cell_subpoints_carry_the_cells_mass():
    grid = Grid([0.0, 0.0], [2.0, 1.0], [2, 1])
    density = np.array([[1.0], [3.0]])
    points, weights = fr.cell_subpoints(grid, density, 2)
    print(points, weights)
    assert points.shape == (8, 2)
    # the sub-cell centres of cell (0, 0): x in (0.25, 0.75), y in (0.25, 0.75)
    np.testing.assert_allclose(points[:4], [[0.25, 0.25], [0.25, 0.75], [0.75, 0.25],
                                            [0.75, 0.75]])  # fmt: skip
    np.testing.assert_array_equal(weights, [1.0] * 4 + [3.0] * 4)
