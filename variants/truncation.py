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

import math
from collections.abc import Sequence

import numba as nb
import numpy as np

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


#: depth (standard deviations inside the nearest face) beyond which a point's cut is 0: there
#: phi(k) / Phi(k) < 1e-30, which is 0 for every use here
DEEP = 11.6
#: beyond this many standard deviations outside, Phi(-x) underflows in its closed form and the
#: cut takes the continued fraction of the Mills ratio (within 1e-12 of scipy's log_ndtr)
FAR_OUTSIDE = 37.0


@nb.njit(cache=True, error_model="numpy")
def _gaussian_cut(k: float) -> float:
    """phi(k) / Phi(k): the mean shift, in standard deviations, of a Gaussian cut ``k``
    standard deviations beyond its centre (k < 0: the centre lies outside), capped at e^50."""
    if k >= DEEP:
        return 0.0
    if k > -FAR_OUTSIDE:
        phi = math.exp(-0.5 * k * k) / math.sqrt(2.0 * math.pi)
        tail = 0.5 * math.erfc(-k / math.sqrt(2.0))
        return min(phi / tail, math.exp(50.0))
    x = -k  # phi(x) / Phi(-x) = x + 1 / (x + 2 / (x + 3 / (x + 4 / (x + ...))))
    fraction = x
    for j in range(16, 0, -1):
        fraction = x + j / fraction
    return min(fraction, math.exp(50.0))


@nb.njit(cache=True, error_model="numpy")
def _cut_points(coords, sizes, gain, offset, lower, upper, low, high, sd, where, out):
    """The cut of every point of one tensor lattice, flattened in C order into ``out`` (P,):
    coords (d, max size) per-axis coordinates, sizes (d,); the tilted centre of the point is
    ``offset + gain x`` held to [low, high], its depth the least, over axes, distance to the
    faces [lower, upper] in standard deviations ``sd``; where (P,) or (0,): the points to
    measure (the others get 1, fully cut)."""
    d = sizes.shape[0]
    index = np.zeros(d, np.int64)  # the point's multi-index, advanced like an odometer
    masked = where.shape[0] > 0
    for p in range(out.shape[0]):
        if p > 0:
            b = d - 1
            index[b] += 1
            while index[b] == sizes[b]:
                index[b] = 0
                b -= 1
                index[b] += 1
        if masked and not where[p]:
            out[p] = 1.0
            continue
        depth = np.inf
        for a in range(d):
            centre = offset[a]
            for b in range(d):
                centre += gain[a, b] * coords[b, index[b]]
            centre = min(max(centre, low[a]), high[a])
            depth = min(depth, min(centre - lower[a], upper[a] - centre) / sd[a])
        out[p] = _gaussian_cut(depth)


def cut_lattices(
    weights: np.ndarray,
    grid: Grid,
    lattices: Sequence[Sequence[np.ndarray]],
    matrix: np.ndarray,
    shift: np.ndarray | None = None,
    where: Sequence[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """The cut (module docstring) at every point of each lattice (arrays shaped like the
    tensor lattices ``lattices[i]``, per-axis coordinates) for the tilted laws of ``weights``
    (grid.shape, >= 0) at ``c = matrix (x + shift)``, measured from the faces of
    :func:`active_box`; 1 where the weights have no mass. ``where`` (optional, one boolean
    array per lattice): measure only there and report the other points fully cut (1), for
    callers that never use the velocity at those points (the co-moving frame's tails)."""
    mass, mean, cov = moments(np.maximum(weights, 0.0), grid)
    if not mass > 0:
        return [np.ones(tuple(len(x) for x in coords)) for coords in lattices]
    lower, upper = open_faces(weights, grid)
    # a tilted mean lies in the hull of the weights' mass: the surrogate's centre is held
    # to the box of the cells the scheme transports accurately (a Gaussian surrogate of a
    # compactly supported law would otherwise send it far past the support)
    trusted = np.where(weights >= TRANSPORT_FLOOR * weights.max(), weights, 0.0)
    mass_low, mass_high = support_box(trusted, grid)
    sd = np.sqrt(np.maximum(np.diag(cov), 1e-300))
    gain = cov @ np.asarray(matrix, float)  # centre = mean + gain (x + shift)
    offset = mean + (gain @ shift if shift is not None else 0.0)
    out = []
    for i, coords in enumerate(lattices):
        sizes = np.array([len(x) for x in coords], np.int64)
        packed = np.zeros((len(coords), int(sizes.max())))
        for b, x in enumerate(coords):
            packed[b, : len(x)] = x
        mask = np.zeros(0, bool) if where is None else np.ascontiguousarray(where[i]).reshape(-1)
        cut = np.empty(int(np.prod(sizes)))
        _cut_points(
            packed,
            sizes,
            gain,
            np.asarray(offset, float) * np.ones(len(coords)),
            np.asarray(lower, float),
            np.asarray(upper, float),
            np.asarray(mass_low, float),
            np.asarray(mass_high, float),
            sd,
            mask,
            cut,
        )
        out.append(cut.reshape(tuple(sizes)))
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
