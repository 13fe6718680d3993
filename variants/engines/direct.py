"""Dense kernel sums: the exact reference engine of the exponential-kernel variants.

For weights ``w_s >= 0`` at source points ``y_s`` (cells that hold mass) and tilts ``c``:

    M(c)     = sum_s w_s e^{c.y_s}                 (moment-generating function),
    log M(c),  m(c) = sum_s w_s y_s e^{c.y_s} / M(c)  (tilted mean = grad log M).

Softmax, multi-head, l2 and Sinkhorn all reduce to these (docs/theory.md, 'Softmax
attention': every exponential kernel is a tilted mean of a weighted measure). Each block of
targets shifts its exponents by the row maximum, so every term is <= 1 and positive: the
sums keep relative accuracy ~ n eps however small they are (no overflow, no NaN where the
density underflows; docs/theory.md, 'Other engines'). Cost O(targets x sources): the
reference up to about 2-D 64^2.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba as nb
import numpy as np

from tpde.grid import Grid, profile
from tpde.grid.threads import ensure_policy

DIRECT_BLOCK = 256
#: the dense sums' stated accuracy (:class:`~.protocol.KernelSums`): their round-off, about
#: n eps relative (every term <= 1 and positive), for the grids they serve (<= 2-D 64^2)
DIRECT_TOLERANCE = 1e-13


def density_sources(weights: np.ndarray, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Cell centres (S, d) and weights (S,) of the cells with positive weight.

    Raises ValueError when no cell holds mass (the normalised fields are undefined).
    """
    flat = weights.reshape(-1)
    mask = flat > 0
    if not np.any(mask):
        raise ValueError("attention: the density is zero everywhere (no mass on the grid)")
    centres = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    return centres[mask], flat[mask]


def _blocks(c: np.ndarray, sources: np.ndarray, weights: np.ndarray, block: int):
    """Yield (slice, shifted terms w e^{c.y - max}, shift) per block of targets: each row's
    exponents ``c.y + log w`` are shifted by their maximum, so its largest term is exactly 1
    however far in the tails of the weights the tilt reaches (weights >= 0, one > 0)."""
    with np.errstate(divide="ignore"):  # (a weight of 0: a term of 0)
        log_weights = np.log(weights)
    for start in range(0, c.shape[0], block):
        logits = c[start : start + block] @ sources.T  # (P_b, S)
        logits += log_weights
        shift = logits.max(axis=1, keepdims=True)
        logits -= shift
        np.exp(logits, out=logits)
        yield slice(start, start + block), logits, shift[:, 0]


@profile.timed("velocity.direct")
def tilted_means(
    c: np.ndarray, sources: np.ndarray, weights: np.ndarray, block: int = DIRECT_BLOCK
) -> np.ndarray:
    """m(c) for every row of c: (P, d) -> (P, d); sources (S, d), weights (S,) > 0."""
    c = np.asarray(c, dtype=float)
    out = np.empty_like(c)
    for rows, e, _ in _blocks(c, sources, weights, block):
        out[rows] = (e @ sources) / e.sum(axis=1, keepdims=True)
    return out


@profile.timed("velocity.direct")
def log_partition(
    c: np.ndarray, sources: np.ndarray, weights: np.ndarray, block: int = DIRECT_BLOCK
) -> np.ndarray:
    """log M(c) = log sum_s w_s e^{c.y_s} for every row of c: (P, d) -> (P,); weights > 0."""
    c = np.asarray(c, dtype=float)
    out = np.empty(c.shape[0])
    for rows, e, shift in _blocks(c, sources, weights, block):
        out[rows] = np.log(e.sum(axis=1)) + shift
    return out


def lattice_tilts(coords: Sequence[np.ndarray], matrix: np.ndarray) -> np.ndarray:
    """c = matrix x for the points x of the tensor lattice ``coords`` in C order, (P, d)."""
    mesh = np.meshgrid(*coords, indexing="ij")
    return np.stack([m.reshape(-1) for m in mesh], axis=1) @ matrix.T


class DirectSums:
    """The dense engine behind one weight field: ``means(c)`` and ``log_partition(c)``, and
    the interface of the tables (:class:`~.separable.SeparableSums`): ``on_lattice`` (the
    ``fields`` in the tables' layout: "means" m_1..m_d, "log" log M, "both" log M then the
    means) and ``velocity_table``. A :class:`~.protocol.KernelSums` (the reference of
    every other engine)."""

    name = "direct"
    tolerance = DIRECT_TOLERANCE

    def __init__(
        self, weights: np.ndarray, grid: Grid, block: int = DIRECT_BLOCK, fields: str = "both"
    ):
        self.sources, self.weights = density_sources(weights, grid)
        self.block = int(block)
        self.fields = fields

    def means(self, c: np.ndarray) -> np.ndarray:
        return tilted_means(c, self.sources, self.weights, self.block)

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        return log_partition(c, self.sources, self.weights, self.block)

    def error(self) -> float:
        """0: the dense sums are exact to their round-off."""
        return 0.0

    def on_lattice(
        self, coords: Sequence[np.ndarray], matrix: np.ndarray, field: int | None = None
    ) -> np.ndarray:
        """The fields at c = matrix x on the lattice ``coords``: (P, fields), or (P,)."""
        c = lattice_tilts(coords, matrix)
        with_log = int(self.fields != "means")
        if field is not None:
            return self.log_partition(c) if field < with_log else self.means(c)[:, field - with_log]
        parts = ([self.log_partition(c)[:, None]] if with_log else []) + (
            [self.means(c)] if self.fields != "log" else []
        )
        return np.concatenate(parts, axis=1)

    def velocity_table(
        self,
        C: np.ndarray,
        box: tuple[np.ndarray, np.ndarray],
        spacing: Sequence[float] | None = None,
    ) -> DirectVelocity:
        """The velocity ``C clip(m(c) - grad log S(c), box)`` (as the tables' velocity_table:
        ``spacing`` None for point-value weights), evaluated densely by ``on_lattice``."""
        return DirectVelocity(self, np.asarray(C, float), box, spacing)


class DirectVelocity:
    """:meth:`DirectSums.velocity_table`: ``on_lattice(coords, matrix, comp)``."""

    def __init__(self, sums: DirectSums, C, box, spacing):
        self.sums, self.C, self.box, self.spacing = sums, C, box, spacing

    def on_lattice(
        self, coords: Sequence[np.ndarray], matrix: np.ndarray, comp: int | None = None
    ) -> np.ndarray:
        """Velocity component ``comp`` (None: all) at the lattice points, (P,) or (P, d)."""
        c = lattice_tilts(coords, matrix)
        means = self.sums.means(c)
        if self.spacing is not None:
            means -= grad_log_box_factor(c, self.spacing)
        velocity = np.clip(means, *self.box, out=means) @ self.C.T
        return velocity if comp is None else velocity[:, comp]


def support_box(weights: np.ndarray, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper corners (d,) of the box of cells with positive weight (their edges).

    The normalised variants average over the measure, so their tilted means lie in the
    convex hull of its support, inside this box (docs/theory.md, 'Clip of tilted means'): the
    engines clip to it, which
    bounds |Gamma| by ||C|| max|y| however the sums were approximated.
    """
    lower, upper = np.empty(grid.ndim), np.empty(grid.ndim)
    for a in range(grid.ndim):
        rows = np.flatnonzero(
            np.any(weights > 0, axis=tuple(b for b in range(grid.ndim) if b != a))
        )
        if rows.size == 0:
            raise ValueError("attention: the density is zero everywhere (no mass on the grid)")
        edges = grid.edges(a)
        lower[a], upper[a] = edges[rows[0]], edges[rows[-1] + 1]
    return lower, upper


def component_bounds(
    C: np.ndarray, box: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Range of each component of C m over the means m in ``box`` (lower, upper): the clip of
    one tabulated or convolved velocity component (docs/theory.md, 'Clip of tilted means')."""
    return (
        np.minimum(C * box[0], C * box[1]).sum(axis=1),
        np.maximum(C * box[0], C * box[1]).sum(axis=1),
    )


def grad_log_box_factor(c: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
    """d/dc log S(c), S(c) = prod_a sinh(c_a h_a/2) / (c_a h_a/2); c: (P, d) -> (P, d).

    The exact cell-average correction of the exponential kernel (tpde.variants.softmax):
    d/dc_a log S = (h_a/2) coth(c_a h_a/2) - 1/c_a, by its series for |c_a h_a| < 2e-3.
    """
    ensure_policy()  # (its parallel loop may be the first of the process)
    c = np.ascontiguousarray(c, dtype=float)
    out = np.empty_like(c)
    _grad_log_box_factor(c, np.asarray(spacing, float), out)
    return out


@nb.njit(parallel=True, cache=True, error_model="numpy")
def _grad_log_box_factor(c, spacing, out):
    for i in nb.prange(c.shape[0]):
        for a in range(c.shape[1]):
            half = 0.5 * spacing[a]
            u = half * c[i, a]
            if abs(u) < 1e-3:  # (h/2) (u/3 - u^3/45 + 2u^5/945)
                u2 = u * u
                out[i, a] = half * u * (1.0 / 3.0 - u2 / 45.0 + 2.0 * u2 * u2 / 945.0)
            else:
                out[i, a] = half * (1.0 / np.tanh(u) - 1.0 / u)
