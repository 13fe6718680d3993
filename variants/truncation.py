"""How much the box cuts the tilted laws behind a tilted-mean velocity.

The softmax-type velocity at ``x`` is ``C m_w(c)``, the mean of the tilted law
``e^{c.y} w(y) / Z(c)`` with ``c = matrix (x + shift)``. The grid holds only the part of that
law inside the box: once the law sits near a face, the computed mean is the mean of a cut law
and the velocity is wrong, however fine the grid. For a Gaussian ``w = N(mu, S)`` the tilted
law is exactly ``N(mu + S c, S)``. With the weights' own mean and covariance as that surrogate,
a point whose tilted centre lies ``k`` standard deviations inside the nearest face has a mean
moved by about ``phi(k) / Phi(k)`` standard deviations (the mean of a Gaussian cut at ``k``);
that number is the point's *cut*. The solver weights it by the mass on the faces (the
truncation indicator) and, in the co-moving frame, keeps points whose cut exceeds
``HELD_CUT`` on the frame's affine fit (docs/theory.md, "The co-moving affine frame").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import log_ndtr

from tpde.grid import Grid, moments
from tpde.schemes.frame import ACTIVE_FLOOR

from .engines.direct import support_box


def active_box(weights: np.ndarray, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """The box (lower, upper edges) of the cells whose weight is at least
    :data:`tpde.schemes.frame.ACTIVE_FLOOR` of the largest: the part of the weights whose
    relative accuracy the scheme keeps."""
    return support_box(np.where(weights >= ACTIVE_FLOOR * weights.max(), weights, 0.0), grid)


def cut_lattices(
    weights: np.ndarray,
    grid: Grid,
    lattices: Sequence[Sequence[np.ndarray]],
    matrix: np.ndarray,
    shift: np.ndarray | None = None,
) -> list[np.ndarray]:
    """The cut (module docstring) at every point of each lattice (arrays shaped like the
    tensor lattices ``lattices[i]``, per-axis coordinates) for the tilted laws of ``weights``
    (grid.shape, >= 0) at ``c = matrix (x + shift)``, measured from the faces of
    :func:`active_box`; 1 where the weights have no mass."""
    mass, mean, cov = moments(np.maximum(weights, 0.0), grid)
    if not mass > 0:
        return [np.ones(tuple(len(x) for x in coords)) for coords in lattices]
    lower, upper = active_box(weights, grid)
    d = grid.ndim
    sd = np.sqrt(np.maximum(np.diag(cov), 1e-300))
    gain = cov @ np.asarray(matrix, float)  # centre = mean + gain (x + shift)
    offset = mean + (gain @ shift if shift is not None else 0.0)
    out = []
    for coords in lattices:
        shape = tuple(len(x) for x in coords)
        depth = np.full(shape, np.inf)  # standard deviations to the nearest face
        for a in range(d):
            centre = np.full(shape, offset[a])
            for b in range(d):
                view = [1] * d
                view[b] = shape[b]
                centre = centre + gain[a, b] * np.asarray(coords[b]).reshape(view)
            inside = np.minimum(centre - lower[a], upper[a] - centre) / sd[a]
            np.minimum(depth, inside, out=depth)
        # phi(k) / Phi(k), in logs so that deep points give 0 and outside points no overflow
        log_phi = -0.5 * depth**2 - 0.5 * np.log(2.0 * np.pi)
        out.append(np.exp(np.minimum(log_phi - log_ndtr(depth), 50.0)))
    return out
