"""How much the box cuts the tilted laws behind a tilted-mean velocity.

The softmax-type velocity at ``x`` is ``C m_w(c)``, the mean of the tilted law
``e^{c.y} w(y) / Z(c)`` with ``c = matrix (x + shift)``. The grid holds only the part of that
law inside the box: once the law sits near a face, the computed mean is the mean of a cut law
and the velocity is wrong, however fine the grid. For a Gaussian ``w = N(mu, S)`` the tilted
law is exactly ``N(mu + S c, S)``. With the weights' own mean and covariance as that surrogate,
a point whose tilted centre lies ``k`` standard deviations inside the nearest face has a mean
moved by about ``phi(k) / Phi(k)`` standard deviations (the mean of a Gaussian cut at ``k``);
that number is the point's *cut*. Weights the surrogate does not describe (:func:`gaussian_like`)
get :func:`measured_cut` instead: the share of each tilted law in the box's outermost trusted
cells. The solver weights the cut by the mass on the faces (the truncation indicator, against
``run.box_tolerance``) and, in the co-moving frame, keeps points whose cut exceeds the field's
``held_cut`` on the frame's affine fit: :data:`~tpde.schemes.frame.HELD_CUT` for the
surrogate, :data:`MEASURED_HELD` for the measured share (docs/theory.md, "The co-moving affine
frame").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba as nb
import numpy as np

from tpde.grid import Grid, moments
from tpde.schemes.frame import ACTIVE_FLOOR, TRANSPORT_FLOOR

from .engines.direct import DirectSums, support_box
from .engines.lagrange import ORDER
from .engines.separable import SeparableSums, TiltTable, table_nodes


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
#: and the largest total-variation distance between the weights and the Gaussian of their own
#: mean and covariance (cell averages): a two-component mixture clustering into one bump has
#: marginal kurtoses near 0 and a distance near 0.25 (tests/test_frame_tokens.py)
SURROGATE_DISTANCE = 0.05


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
    # marginals can look Gaussian while the law is not (a mixture clustering into one bump)
    _, mean_w, cov_w = moments(weights, grid)
    if not np.all(np.linalg.eigvalsh(cov_w) > 0):
        return False
    # the Gaussian's cell averages to fourth order, f(c) (1 + sum_a h_a^2 / 24 d_aa f / f) at
    # the centres c (exact averages cost ~20 ms at 256^2, at every stage of a frame run; plain
    # centre values are off by h^2 / 24 relative, 7% on a coarse frame grid of 1.3 cells)
    precision = np.linalg.inv(cov_w)
    offsets = [x - m for x, m in zip(grid.mesh(), mean_w, strict=True)]  # sparse, broadcast
    gradient = [
        sum(precision[a, b] * offsets[b] for b in range(grid.ndim)) for a in range(grid.ndim)
    ]  # P (x - m), per axis
    quadratic = sum(offsets[a] * gradient[a] for a in range(grid.ndim))
    correction = 1.0 + sum(
        h**2 / 24.0 * (gradient[a] ** 2 - precision[a, a]) for a, h in enumerate(grid.spacing)
    )
    surrogate = np.exp(-0.5 * np.asarray(quadratic)) * correction
    distance = 0.5 * float(np.abs(weights / total - surrogate / surrogate.sum()).sum())
    return distance <= SURROGATE_DISTANCE


def held_window(held: np.ndarray) -> tuple[slice, ...] | None:
    """The smallest box of indices holding every True of ``held`` (None if there is none)."""
    if not held.any():
        return None
    window = []
    for axis in range(held.ndim):
        rows = np.flatnonzero(held.any(axis=tuple(b for b in range(held.ndim) if b != axis)))
        window.append(slice(int(rows[0]), int(rows[-1]) + 1))
    return tuple(window)


def left_out(weights: np.ndarray, grid: Grid) -> np.ndarray:
    """The weights the box does not hold, zero elsewhere: every cell below
    :data:`~tpde.schemes.frame.ACTIVE_FLOOR` of the largest (whose values the scheme no
    longer keeps to relative accuracy, and which the frame's sums leave out), and the
    outermost cells of the grid on every side (what lies beyond them the grid does not have,
    and they stand for it). Compactly supported weights have zeros around their support and
    leave nothing out there."""
    positive = np.maximum(weights, 0.0)
    out = positive < ACTIVE_FLOOR * positive.max()
    for a in range(grid.ndim):
        for row in (0, grid.shape[a] - 1):
            index = [slice(None)] * grid.ndim
            index[a] = slice(row, row + 1)
            out[tuple(index)] = True
    return np.where(out, positive, 0.0)


#: the log tables of :func:`measured_cut`: the largest change of ``c.y`` between neighbouring
#: nodes (a cut needs log M to a few per cent, not the velocity tables' 1e-12)
CUT_RESOLUTION = 2.0
#: a point is held (``VelocityField.held_cut`` of a measured cut) while at most this share of
#: its tilted law lies in the cells the box does not hold (:func:`left_out`): the velocity
#: then moves by about that share of the box, while the frame's fit it would otherwise keep is
#: off by the whole residual for data that are not Gaussian. Measured on the clustering
#: mixture of tests/test_frame_tokens.py (softmax, 4000 tokens x 3 seeds, W2 over the noise
#: at t = 4): 48^2 on +-16 stopped box_limited at 2.81 with 1e-8 (2.27 of the noise at the
#: stop), 3.57 with 1e-6 (1.38), and completes with 1e-4 (1.06); 64^2 on +-10 stopped at 3.02
#: with 1e-8 (2.03), 0.44 with 1e-12, and completes with 1e-6 .. 1e-2 (0.905); 96^2 on +-12
#: and l2 on 64^2 are the same from 1e-8 to 1e-4. So the trusted sums beat the fit by far at
#: a cut of 1e-4, the share the truncation indicator accepts of the mass by default; the cut
#: itself is the share, unscaled, and the indicator weighs it against ``run.box_tolerance``
MEASURED_HELD = 1e-4


def measured_cut(
    weights: np.ndarray,
    grid: Grid,
    lattices: Sequence[Sequence[np.ndarray]],
    matrix: np.ndarray,
    shift: np.ndarray | None = None,
    where: Sequence[np.ndarray] | None = None,
    direct: bool = False,
) -> list[np.ndarray]:
    """The cut measured from the weights themselves, for laws the Gaussian surrogate of
    :func:`cut_lattices` does not describe: at every point of each lattice, the share of the
    tilted law ``e^{c.y} w(y)``, ``c = matrix (x + shift)``, that lies in the cells the box
    does not hold (:func:`left_out`: below the trusted floor, or on the grid's outermost
    cells), ``M_out(c) / M(c)``, two log-partition sums over the same cells (dense sums with
    ``direct``, else one separable log table each on shared nodes, their difference taken to
    each lattice's window of measured points by the sheared passes). The share is that
    of the grid's own weights: a law whose tail goes on smoothly past the trusted floor or
    the grid's face reports the part there (beyond the face, the outermost cells stand for
    what the grid does not have), while a compactly supported law, whose values fall by
    hundreds of decades past its edge, reports none. Shapes
    and ``where`` as :func:`cut_lattices` (points outside ``where`` report 1). The share is
    returned as it is; a point is held while it is at most :data:`MEASURED_HELD`."""
    positive = np.maximum(weights, 0.0)
    band = left_out(positive, grid)
    shapes = [tuple(len(x) for x in coords) for coords in lattices]
    masks = [
        np.ones(shape, bool) if where is None else np.asarray(where[i], bool)
        for i, shape in enumerate(shapes)
    ]
    out = [np.where(mask, 0.0, 1.0) for mask in masks]
    if not band.any() or not any(mask.any() for mask in masks):
        return out
    offset = np.zeros(grid.ndim) if shift is None else np.asarray(shift, float)
    matrix = np.asarray(matrix, float)
    if direct:
        points = []
        for coords, mask in zip(lattices, masks, strict=True):
            shifted = [np.asarray(x) + s for x, s in zip(coords, offset, strict=True)]
            mesh = np.meshgrid(*shifted, indexing="ij")
            points.append(np.stack([m[mask] for m in mesh], axis=1))
        tilts = np.concatenate(points) @ matrix.T
        logs = []
        for values in (positive, band):
            scaled, log_scale = _unit_scaled(values)
            logs.append(DirectSums(scaled, grid, fields="log").log_partition(tilts) + log_scale)
        share = _share(logs[1] - logs[0])
        start = 0
        for cut, mask in zip(out, masks, strict=True):
            count = int(mask.sum())
            cut[mask] = share[start : start + count]
            start += count
        return out
    # the tables reach the window of measured points of each lattice by the sheared passes
    # (the tables padded for them, refined along the pass-2 axis, formed only on the nodes
    # they read): ORDER multiply-adds per point instead of a pointwise ORDER^d stencil
    windows = {i: w for i, mask in enumerate(masks) if (w := held_window(mask)) is not None}
    subs = {
        i: [np.asarray(x)[w] + s for x, w, s in zip(lattices[i], windows[i], offset, strict=True)]
        for i in windows
    }
    # c = matrix x is linear: its range over a tensor lattice is that over the lattice's corners
    lower, upper = np.full(grid.ndim, np.inf), np.full(grid.ndim, -np.inf)
    for sub in subs.values():
        ends = [np.multiply.outer(matrix[:, b], x[[0, -1]]) for b, x in enumerate(sub)]
        lower = np.minimum(lower, sum(e.min(axis=1) for e in ends))
        upper = np.maximum(upper, sum(e.max(axis=1) for e in ends))
    bounds = np.stack([lower, upper], axis=1)
    low, high = support_box(positive, grid)
    extent = np.asarray(high - low, float)
    nodes = table_nodes(bounds, extent, matrix, CUT_RESOLUTION, 2 * ORDER)
    served = list(subs.values())
    logs = []
    for values in (positive, band):
        scaled, log_scale = _unit_scaled(values)
        sums = SeparableSums(scaled, grid, bounds, nodes, "log", matrix, served, extent)
        logs.append(sums.values + log_scale)
    # the interpolant is linear in the table: one table of log M_out - log M on the same
    # nodes gives the difference of the two interpolants, in one pass per lattice
    ratio = TiltTable(logs[1] - logs[0], sums.start, sums.step, True, extent)
    for i, sub in subs.items():
        share = _share(ratio.on_lattice(sub, matrix, 0)).reshape(tuple(len(x) for x in sub))
        np.copyto(out[i][windows[i]], share, where=masks[i][windows[i]])
    return out


def _unit_scaled(values: np.ndarray) -> tuple[np.ndarray, float]:
    """Weights scaled to a largest of 1, subnormal ones dropped (the left-out cells lie 40 and
    more decades down; subnormal weights made the tables NaN), and the log of the scale."""
    scale = float(values.max())
    scaled = values / scale
    scaled[scaled < np.finfo(float).tiny] = 0.0
    return scaled, math.log(scale)


def _share(log_ratio: np.ndarray) -> np.ndarray:
    """The share ``exp(log M_out - log M)``, at most 1. A left-out sum that underflows in every
    term is an empty share (log -inf, share 0); one the tables could not form (NaN) is not
    measured, and counts as fully cut."""
    with np.errstate(invalid="ignore"):
        share = np.exp(np.minimum(log_ratio, 0.0))
    share[np.isnan(share)] = 1.0
    return share
