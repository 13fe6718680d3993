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
from tpde.schemes.frame import ACTIVE_FLOOR, TRANSPORT_FLOOR

from .engines.direct import support_box


def active_box(weights: np.ndarray, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """The box (lower, upper edges) of the cells whose weight is at least
    :data:`tpde.schemes.frame.ACTIVE_FLOOR` of the largest: the part of the weights whose
    relative accuracy the scheme keeps."""
    return support_box(np.where(weights >= ACTIVE_FLOOR * weights.max(), weights, 0.0), grid)


def open_faces(weights: np.ndarray, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """The limits the box sets on the tilted laws, per axis (lower, upper): the faces of
    :func:`active_box`, except that a side where the weights are exactly zero between their
    trusted cells and the grid's face sets none (+-inf): a tilted law of compactly supported
    weights never leaves their support, and the sums over it are complete."""
    lower, upper = active_box(weights, grid)
    support_low, support_high = support_box(weights, grid)
    closed_low = (support_low > np.asarray(grid.lower)) & (support_low >= lower)
    closed_high = (support_high < np.asarray(grid.upper)) & (support_high <= upper)
    return np.where(closed_low, -np.inf, lower), np.where(closed_high, np.inf, upper)


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
    lower, upper = open_faces(weights, grid)
    # a tilted mean lies in the hull of the weights' mass: the surrogate's centre is held
    # to the box of the cells the scheme transports accurately (a Gaussian surrogate of a
    # compactly supported law would otherwise send it far past the support)
    trusted = np.where(weights >= TRANSPORT_FLOOR * weights.max(), weights, 0.0)
    mass_low, mass_high = support_box(trusted, grid)
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
            centre = np.clip(centre, mass_low[a], mass_high[a])
            inside = np.minimum(centre - lower[a], upper[a] - centre) / sd[a]
            np.minimum(depth, inside, out=depth)
        # phi(k) / Phi(k), in logs so that outside points do not overflow; below 1e-30
        # (depth > 11.6) it is 0 for every use here, and most points are that deep
        cut = np.zeros(shape)
        shallow = depth < 11.6
        k = depth[shallow]
        log_phi = -0.5 * k**2 - 0.5 * np.log(2.0 * np.pi)
        cut[shallow] = np.exp(np.minimum(log_phi - log_ndtr(k), 50.0))
        out.append(cut)
    return out


#: the largest |excess kurtosis| of a marginal of the weights for which the Gaussian surrogate
#: is trusted in a fixed box (a uniform disc's marginals have -1, two well separated bumps
#: about -2): beyond it a fixed-box run reports no cut and the edge mass alone watches the box
SURROGATE_KURTOSIS = 0.5


def gaussian_like(weights: np.ndarray, grid: Grid) -> bool:
    """Whether every marginal of ``weights`` has an excess kurtosis within
    :data:`SURROGATE_KURTOSIS` of a Gaussian's (0), so that the surrogate of
    :func:`cut_lattices` describes its tilted laws."""
    total = float(weights.sum())
    if not total > 0:
        return False
    for a in range(grid.ndim):
        marginal = weights.sum(axis=tuple(b for b in range(grid.ndim) if b != a)) / total
        x = grid.centres(a)
        mean = float(marginal @ x)
        var = float(marginal @ (x - mean) ** 2)
        if not var > 0:
            return False
        if abs(float(marginal @ (x - mean) ** 4) / var**2 - 3.0) > SURROGATE_KURTOSIS:
            return False
    return True


def held_window(held: np.ndarray) -> tuple[slice, ...] | None:
    """The smallest box of indices holding every True of ``held`` (None if there is none)."""
    if not held.any():
        return None
    window = []
    for axis in range(held.ndim):
        rows = np.flatnonzero(held.any(axis=tuple(b for b in range(held.ndim) if b != axis)))
        window.append(slice(int(rows[0]), int(rows[-1]) + 1))
    return tuple(window)
