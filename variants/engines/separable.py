"""Fast exponential-kernel sums: the moment-generating function on a tensor grid of tilts.

docs/theory.md, 'Separable kernel sums'. With ``M(c) = sum_s w_s e^{c.y_s}`` over the
cells, every exponential-kernel variant needs ``log M`` or its gradient, the tilted mean
``m(c) = grad log M(c)``, at ``c = A x``. On a tensor grid of ``c`` values ``M`` and its
first moments are separable sums, one matrix product per axis:

    M(c_1i, c_2j) = sum_p e^{c_1i y_1p} ( sum_q e^{c_2j y_2q} w_pq ),

``O(m N^d)`` work for ``m`` nodes per axis instead of ``O(N^{2d})``. The axis that shrinks
the array most is contracted first and the partial products are shared between the fields
(in 2-D five matrix products for M and the d first moments instead of six, on the smaller
intermediate; benchmarks/velocity.py times the tables). Each row's exponents are
shifted by their maximum over the cells that hold mass, so every term is <= 1 and positive;
the nodes whose sums these per-axis shifts leave out of range (a tilted law away from every
axis's extreme cells: narrow diagonal weights, large tilts) are formed again on recentred
tiles, so the sums keep relative accuracy however small they are (docs/theory.md,
'Separable kernel sums'). ``log M`` and ``m`` are smooth (the
Jacobian of ``m`` is the covariance of the tilted law, bounded by the squared support radius)
and exactly quadratic / linear for a Gaussian, so a local Lagrange interpolation of degree
``ORDER - 1 = 11`` on the uniform ``c``-grid gives their values at ``A x`` at a controllable error
(``tests/test_engines.py`` prints the convergence table against the dense engine).

The interpolation kernels (:mod:`tpde.variants.engines.lagrange`) compute their weights in O(ORDER)
per axis; in 2-D a lattice of targets is reached by two sheared 1-D passes
(:mod:`tpde.variants.engines.sheared`: ORDER instead of ORDER^2 multiply-adds per target, the table
refined along the pass-2 axis to keep the accuracy, and its second-level products formed
only on the nodes the passes read), in 3-D by three (:mod:`tpde.variants.engines.sheared3d`).
Accuracy is set by the table nodes (``nodes``); the velocity tables of the passes choose
them a posteriori (:func:`resolved_sums`: the coarsest table whose estimated interpolation
error is within TABLE_TOLERANCE, never finer than the a-priori :func:`table_nodes`; in 3-D,
where that bound often exceeds the node cap, a table the passes cannot resolve under the
cap is interpolated pointwise).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpde.grid import Grid, profile

from .direct import component_bounds, grad_log_box_factor
from .lagrange import HIGH, LOW, ORDER, interpolate_1d, interpolate_2d, interpolate_3d
from .products import blocked_dot, row_split_tensordot
from .sheared import extra_nodes, nodes_read, pass_errors, resolution_factor, sheared_on_lattice
from .sheared3d import padding, pass_errors3, sheared_on_lattice3
from .sheared3d import resolution_factor as resolution_factor3

#: automatic table size: step_a * extent_a <= NODE_RESOLUTION, where extent_a is the width of
#: the support along axis a (c . y changes by at most this between neighbouring nodes),
#: within [MIN_NODES, MAX_NODES[d]] (the cap bounds the table memory: 160^3 x 3 fields
#: = 100 MB in 3-D). 2-D 256^2 softmax on the c1 test matrices (docs/theory.md, 'Test
#: matrices c1 and c2') gets 512 nodes.
NODE_RESOLUTION = 0.7
MIN_NODES = 64
MAX_NODES = {1: 16384, 2: 2048, 3: 160}
#: adaptive tables (:func:`resolved_sums`): the first table's resolution without a warm
#: start, the fewest nodes per axis, the estimated interpolation error allowed relative to
#: the size of the means, the factor added to a predicted refinement, and the widening of
#: the spacing offered to the next evaluation where the estimate leaves room
COARSE_RESOLUTION = 2.0
ADAPTIVE_MIN_NODES = 2 * ORDER
TABLE_TOLERANCE = 1e-12
REFINE_MARGIN = 1.1
COARSEN_STEP = 1.25
#: the estimate of :func:`tpde.variants.engines.sheared.pass_errors` is the leading term of the
#: remainder: 0.54..1.01 of the measured error from 1e-4 down (tests/test_adaptive_table.py)
ESTIMATE_SAFETY = 2.0


def wanted_nodes(
    bounds: np.ndarray,
    extent: np.ndarray,
    matrix: np.ndarray | None = None,
    resolution: float = NODE_RESOLUTION,
) -> np.ndarray:
    """Nodes per axis (d,) the resolution criterion asks for, tilts in ``bounds`` (d, 2), a
    support of widths ``extent``; with the ``matrix`` of c = matrix x, refined where the
    sheared passes need it (:func:`tpde.variants.engines.sheared.resolution_factor`, 2-D;
    :func:`tpde.variants.engines.sheared3d.resolution_factor`, 3-D); ``resolution``: the largest
    change of c.y between neighbouring nodes. Before the [MIN, MAX] clip."""
    extent = np.asarray(extent, float)
    d = len(extent)
    factor = np.ones(d)
    if matrix is not None and d == 2:
        factor = resolution_factor(matrix, extent)
    elif matrix is not None and d == 3:
        factor = resolution_factor3(matrix, extent)
    width = np.asarray(bounds, float)[:, 1] - np.asarray(bounds, float)[:, 0]
    return np.ceil(width * extent * factor / resolution) + 1


def table_nodes(
    bounds: np.ndarray,
    extent: np.ndarray,
    matrix: np.ndarray | None = None,
    resolution: float = NODE_RESOLUTION,
    least: int = MIN_NODES,
) -> np.ndarray:
    """:func:`wanted_nodes` within [least, MAX_NODES[d]], as integers."""
    wanted = wanted_nodes(bounds, extent, matrix, resolution)
    return np.clip(wanted, least, MAX_NODES[len(wanted)]).astype(int)


FIELDS = ("means", "log", "both")


#: rows per block of the banded second-level products (mgf_table with a band), and the
#: largest fraction of the table for which the blocks beat one product
BAND_ROWS = 64
BAND_MAX_FRACTION = 0.7
#: cells along the contracted axis below which the second-level products are too cheap for
#: the band to pay (measured: 2-D 64^2 step slower with it)
BAND_MIN_CELLS = 128


def _band_blocks(
    band: tuple[int, np.ndarray, np.ndarray], rows_axis: int, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Per block of BAND_ROWS rows (nodes of ``rows_axis``) of a (shape) table, the column
    range [first, end) that holds every node of ``band`` (sheared.nodes_read) in the block."""
    t2, lo, hi = band
    starts = np.arange(0, shape[0], BAND_ROWS)
    first = np.zeros(starts.size, np.int64)
    end = np.zeros(starts.size, np.int64)
    valid = lo <= hi
    k = np.arange(lo.size)
    for b, r0 in enumerate(starts.tolist()):
        r1 = min(r0 + BAND_ROWS, shape[0])
        if rows_axis == t2:  # rows are the band's nodes k: their t1 ranges
            sel = valid[r0:r1]
            if sel.any():
                first[b], end[b] = lo[r0:r1][sel].min(), hi[r0:r1][sel].max() + 1
        else:  # rows are t1 nodes: the k whose range meets them
            meets = k[valid & (lo <= r1 - 1) & (hi >= r0)]
            if meets.size:
                first[b], end[b] = meets[0], meets[-1] + 1
    return first, end


@profile.timed("velocity.tables")
def mgf_table(
    weights: np.ndarray,
    grid: Grid,
    nodes: Sequence[np.ndarray],
    fields: str = "means",
    band: tuple[int, np.ndarray, np.ndarray] | None = None,
    reuse: dict | None = None,
) -> np.ndarray:
    """The tilted means m(c) and / or log M(c) on the tensor grid ``nodes``.

    weights: (*grid.shape) >= 0, not all zero; nodes: one 1-D array of tilts per axis;
    fields: "means" (m_1..m_d), "log" (log M) or "both" (log M, then m_1..m_d); band (2-D):
    the only nodes that will be read, as from :func:`tpde.variants.engines.sheared.nodes_read` (the
    sheared passes read a parallelogram): the second-level products are then formed in
    blocks of BAND_ROWS rows over the columns the band needs, NaN elsewhere (a stray read
    cannot pass unnoticed); reuse: a dict that keeps the first-level products (one axis
    contracted) between calls on the same weights, keyed by that axis's nodes (a table
    refined along the other axes forms only its second level again). Returns (fields,
    len(nodes_1), ..., len(nodes_d)), the layout the interpolation kernels read.

    The per-axis shifts keep every term at most 1, but a separable shift cannot follow the
    largest term of every tilt (:func:`_out_of_range`): the nodes whose sums leave the range
    where they keep relative accuracy are formed again on recentred tiles
    (:func:`_recentred`), so every node formed is exact to round-off.
    """
    if fields not in FIELDS:
        raise ValueError(f"mgf_table: fields must be one of {', '.join(FIELDS)}, got {fields!r}")
    table, out_of_range = _shifted_table(weights, grid, nodes, fields, band, reuse)
    if out_of_range is not None:
        _recentred(weights, grid, nodes, fields, table, out_of_range)
    return table


#: a node's sum keeps its relative accuracy while it is at least (cells + sum w) times
#: RANGE_FLOOR = tiny / eps: its terms are products of factors <= 1 and a weight w_s, each
#: with an absolute round-off of a few (1 + w_s) 2^-1075 where it is subnormal, in all then
#: some 2^-52 times below eps of the sum. Above RANGE_CEILING (weights near the largest
#: float) its moments could overflow
RANGE_FLOOR = np.finfo(float).tiny / np.finfo(float).eps
RANGE_CEILING = np.finfo(float).max * np.finfo(float).eps
#: a recentred tile (:func:`_recentred`) spans tilts within delta_a of its centre with
#: sum_a delta_a extent_a <= RECENTRED_SPREAD (extent: the widths of the cells with mass), so
#: every node's largest term is at least e^-RECENTRED_SPREAD (1e-174), far above the floor
RECENTRED_SPREAD = 400.0


def _out_of_range(total: np.ndarray, weights: np.ndarray, radius: float) -> np.ndarray | None:
    """The nodes whose shifted sums ``total`` (NaN where not formed) are too small to keep
    relative accuracy (RANGE_FLOOR), or too large (RANGE_CEILING: only where the weights'
    sum can exceed it, ``radius`` the largest |y|); None where there is none.

    The shift of each axis is the largest ``c_a y_a`` over the cells with mass, so the sum
    of a tilt whose law sits away from the cells where each axis takes its extreme (narrow
    weights along a diagonal, large tilts: the co-moving frame's l2 key weights) falls up to
    ``sum_a |c_a| extent_a`` e-folds below its largest term: past ~700 that sum is
    subnormal, or 0, and its means 0 / 0."""
    mass = float(np.sum(weights))
    low = total < (weights.size + mass) * RANGE_FLOOR  # False where NaN (not formed)
    if mass * max(1.0, radius) > RANGE_CEILING:
        low |= total > RANGE_CEILING
    return low if low.any() else None


def _tiles(bad: np.ndarray, nodes: Sequence[np.ndarray], extent: np.ndarray) -> list[tuple]:
    """Boxes of node indices (tuples of slices) that cover every True of ``bad``, each shrunk
    to the bounding box of the True nodes it holds and halved along the axis of the largest
    ``half width_a extent_a`` until ``sum_a half width_a extent_a <= RECENTRED_SPREAD``."""
    out = []
    stack = [tuple(slice(0, n) for n in bad.shape)]
    d = bad.ndim
    while stack:
        box = stack.pop()
        held = bad[box]
        if not held.any():
            continue
        shrunk = []
        for a in range(d):
            rows = np.flatnonzero(held.any(axis=tuple(b for b in range(d) if b != a)))
            shrunk.append(slice(box[a].start + rows[0], box[a].start + rows[-1] + 1))
        box = tuple(shrunk)
        spread = np.array(
            [0.5 * abs(nodes[a][box[a].stop - 1] - nodes[a][box[a].start]) for a in range(d)]
        )
        spread *= extent
        if spread.sum() <= RECENTRED_SPREAD:
            out.append(box)
            continue
        a = int(np.argmax(spread))
        middle = (box[a].start + box[a].stop) // 2
        for part in (slice(box[a].start, middle), slice(middle, box[a].stop)):
            stack.append(box[:a] + (part,) + box[a + 1 :])
    return out


def _recentred(
    weights: np.ndarray,
    grid: Grid,
    nodes: Sequence[np.ndarray],
    fields: str,
    table: np.ndarray,
    bad: np.ndarray,
) -> None:
    """Form the ``bad`` nodes of ``table`` (:func:`_out_of_range`) again, exactly: on tiles
    of nodes (:func:`_tiles`) around a centre tilt ``c*``, from the recentred weights
    ``w' = w e^{c*.y - f*}``, ``f* = max_y (c*.y + log w)`` (largest 1). With ``c = c* + delta``,
    ``M(c) = e^{f*} M'(delta)`` and ``m(c) = m'(delta)``; the shift of each axis bounds the
    largest term of ``M'(delta)`` from below by ``e^{-sum_a |delta_a| extent_a}`` (the cell
    of ``w' = 1`` holds one term that large), so every tile's nodes are in range. The other
    nodes keep their values; a node still out of range (none by that bound) is NaN."""
    d = grid.ndim
    positive = weights > 0
    log_weights = np.log(weights, where=positive, out=np.full(weights.shape, -np.inf))
    mesh = grid.mesh()
    extent = np.empty(d)
    for a in range(d):
        rows = np.flatnonzero(np.any(positive, axis=tuple(b for b in range(d) if b != a)))
        centres = grid.centres(a)
        extent[a] = centres[rows[-1]] - centres[rows[0]]
    with_log = fields != "means"
    for box in _tiles(bad, nodes, extent):
        tilts = [np.asarray(nodes[a][box[a]], float) for a in range(d)]
        centre = [0.5 * (t[0] + t[-1]) for t in tilts]
        exponent = log_weights + sum(c * y for c, y in zip(centre, mesh, strict=True))
        top = float(exponent.max())
        part, left = _shifted_table(
            np.exp(exponent - top),
            grid,
            [t - c for t, c in zip(tilts, centre, strict=True)],
            fields,
        )
        if with_log:
            part[0] += top
        if left is not None:
            part[:, left] = np.nan
        held = bad[box]
        tile = table[(slice(None),) + box]
        tile[:, held] = part[:, held]


def _shifted_table(
    weights: np.ndarray,
    grid: Grid,
    nodes: Sequence[np.ndarray],
    fields: str,
    band: tuple[int, np.ndarray, np.ndarray] | None = None,
    reuse: dict | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`mgf_table` with the per-axis shifts alone, and the nodes out of range
    (:func:`_out_of_range`, None for none; their values are placeholders)."""
    d = grid.ndim
    reuse = {} if reuse is None else reuse
    positive = weights > 0
    factors, moment_factors, shifts = [], [], []
    for a in range(d):
        centres = grid.centres(a)
        massive = np.flatnonzero(np.any(positive, axis=tuple(b for b in range(d) if b != a)))
        exponent = np.multiply.outer(nodes[a], centres)  # (m_a, N_a)
        # the largest exponent over the cells with mass: c y is monotone in y
        shift = np.maximum(exponent[:, massive[0]], exponent[:, massive[-1]])
        e = np.exp(exponent - shift[:, None], out=exponent)
        factors.append(e)
        moment_factors.append(e * centres[None, :])
        shifts.append(shift)

    # contract the axis that shrinks the array most first (m_a / N_a smallest); partial
    # contractions are shared between the fields (keyed by the factor used on each axis):
    # in 2-D three products of the second level and two of the first instead of six.
    # (Stacking the factors applied to one partial product into one product measured no
    # faster.)
    order = sorted(range(d), key=lambda a: len(nodes[a]) / grid.cells[a])
    partial: dict[tuple, np.ndarray] = {(): weights}
    if band is not None:
        if d != 2:
            raise ValueError("mgf_table: a band applies to 2-D tables only")
        shape = (len(nodes[order[1]]), len(nodes[order[0]]))
        blocks = _band_blocks(band, order[1], shape)
        rows = np.minimum(BAND_ROWS, shape[0] - np.arange(0, shape[0], BAND_ROWS))
        if (
            np.sum(rows * (blocks[1] - blocks[0])) > BAND_MAX_FRACTION * shape[0] * shape[1]
            or grid.cells[order[1]] < BAND_MIN_CELLS
        ):
            band = None  # one product is faster: the band covers most of the table, or
            #                 the products are short next to the table-sized work

    def contract(moment_axis: int | None) -> np.ndarray:
        key: tuple = ()
        out = weights
        for a in order:
            key = key + (a == moment_axis,)
            if key not in partial:
                mat = moment_factors[a] if a == moment_axis else factors[a]
                if band is not None and len(key) == 2:  # 2-D second level, banded
                    level1 = np.ascontiguousarray(out if order[0] == 0 else out.T)
                    product = np.empty((mat.shape[0], level1.shape[0]))
                    blocked_dot(mat, level1, product, *blocks, BAND_ROWS)
                    partial[key] = np.moveaxis(product, 0, a)
                elif len(key) == 1:  # first level: kept in reuse
                    kept = (a, key[0], nodes[a].tobytes())
                    if kept not in reuse:
                        reuse[kept] = np.moveaxis(row_split_tensordot(mat, out, a), 0, a)
                    partial[key] = reuse[kept]
                else:
                    partial[key] = np.moveaxis(row_split_tensordot(mat, out, a), 0, a)
            out = partial[key]
        return out

    total = contract(None)
    radius = max(float(np.abs(grid.lower).max()), float(np.abs(grid.upper).max()))
    out_of_range = _out_of_range(total, weights, radius)
    if out_of_range is not None:  # placeholders, formed again by the caller
        total = np.where(out_of_range, 1.0, total)
    with_log = fields != "means"
    with_means = fields != "log"
    table = np.empty((int(with_log) + d * int(with_means),) + total.shape)
    if with_log:
        log_total = np.log(total)
        for a in range(d):
            log_total += shifts[a].reshape((-1,) + (1,) * (d - 1 - a))
        table[0] = log_total
    if with_means:
        for b in range(d):
            np.divide(contract(b), total, out=table[int(with_log) + b])
    return table, out_of_range


class TiltTable:
    """Fields on a uniform tensor grid of tilts, interpolated with ORDER points per axis.

    values: (fields, count_1, ..., count_d); start, step: (d,) the first node and the node
    spacing per axis (the nodes are ``start + step * arange(count)``); clip: (lower, upper)
    per field, the range :meth:`on_lattice` clips its values to (a velocity table's
    :func:`~.direct.component_bounds`), None for none.
    """

    def __init__(
        self,
        values: np.ndarray,
        start: np.ndarray,
        step: np.ndarray,
        sheared: bool = True,
        extent: np.ndarray | None = None,
        clip: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.values = np.ascontiguousarray(values)
        self.start = np.asarray(start, float)
        self.step = np.asarray(step, float)
        self.count = np.array(self.values.shape[1:])
        self.sheared = sheared  # on_lattice may use the sheared passes
        self.extent = extent  # the support widths the 3-D pass plan was chosen for
        self.clip = clip

    def nodes(self) -> list[np.ndarray]:
        """The tilts of the nodes, one 1-D array per axis."""
        return [self.start[a] + self.step[a] * np.arange(n) for a, n in enumerate(self.count)]

    def __call__(self, c: np.ndarray, field: int | None = None) -> np.ndarray:
        """The fields at the tilts ``c`` (P, d): (P, fields), or (P,) for one ``field``."""
        c = np.asarray(c, float)
        return self._at_units(
            [
                np.ascontiguousarray((c[:, a] - self.start[a]) / self.step[a])
                for a in range(c.shape[1])
            ],
            field,
        )

    def on_lattice(
        self, coords: Sequence[np.ndarray], matrix: np.ndarray, field: int | None = None
    ) -> np.ndarray:
        """The fields at c = matrix x for the points x of the tensor lattice ``coords`` (one
        1-D array per axis, points in C order), without forming the (P, d) points: in 2-D and
        3-D by 1-D passes along sheared lines (:mod:`tpde.variants.engines.sheared`,
        :mod:`tpde.variants.engines.sheared3d`: ORDER instead of ORDER^d multiply-adds per target),
        else (``sheared`` off, or a pass would leave the table) by the pointwise stencils."""
        table = self.values if field is None else self.values[field : field + 1]
        sheared = None
        with profile.phase("velocity.interpolation.passes"):
            if self.sheared and len(coords) == 2:
                sheared = sheared_on_lattice(table, self.start, self.step, coords, matrix)
            elif self.sheared and len(coords) == 3:
                sheared = sheared_on_lattice3(
                    table, self.start, self.step, coords, matrix, self.extent
                )
        if sheared is not None:
            flat = sheared.reshape(table.shape[0], -1)
            values = flat[0] if field is not None else flat.T
        else:
            mesh = np.meshgrid(*coords, indexing="ij", sparse=True)
            shape = tuple(len(x) for x in coords)
            units = []
            for a in range(len(coords)):
                unit = -self.start[a] / self.step[a]
                for b, x in enumerate(mesh):
                    unit = unit + (matrix[a, b] / self.step[a]) * x
                units.append(np.ascontiguousarray(np.broadcast_to(unit, shape)).reshape(-1))
            values = self._at_units(units, field)
        if self.clip is not None:
            low, high = self.clip if field is None else (self.clip[0][field], self.clip[1][field])
            np.clip(values, low, high, out=values)
        return values

    @profile.timed("velocity.tables.estimate")
    def pass_errors(
        self, lattices: Sequence[Sequence[np.ndarray]], matrix: np.ndarray
    ) -> np.ndarray | None:
        """Estimated errors per table axis (d,) of the sheared passes onto ``lattices`` (the
        largest over them, :func:`tpde.variants.engines.sheared.pass_errors`,
        :func:`.sheared3d.pass_errors3`); None where a lattice has no passes."""
        largest = np.zeros(len(self.count))
        for coords in lattices:
            errors = (
                pass_errors(self.values, self.start, self.step, coords, matrix)
                if len(coords) == 2
                else pass_errors3(self.values, self.start, self.step, coords, matrix, self.extent)
            )
            if errors is None:
                return None
            largest = np.maximum(largest, errors)
        return largest

    @profile.timed("velocity.interpolation.pointwise")
    def _at_units(self, units: list[np.ndarray], field: int | None) -> np.ndarray:
        for u, count in zip(units, self.count, strict=True):
            if u.size and (u.min() < LOW or u.max() >= count - HIGH):
                raise ValueError("separable engine: a target c lies outside the table")
        table = self.values if field is None else self.values[field : field + 1]
        out = np.empty((units[0].size, table.shape[0]))
        kernel = (interpolate_1d, interpolate_2d, interpolate_3d)[len(units) - 1]
        kernel(table, *units, out)
        return out if field is None else out[:, 0]


class SeparableSums(TiltTable):
    """log M(c) and m(c) for any c inside a box of tilts, from one separable table.

    weights: (*grid.shape) >= 0; bounds: (d, 2) lower / upper c per axis; nodes: table
    nodes per axis (int or (d,); the interpolation uses ORDER = 12 points per axis, see
    :func:`table_nodes` for the automatic choice); fields: what the table holds, "means"
    (velocities), "log" (Sinkhorn potentials: one contraction instead of d) or "both"
    (see :func:`mgf_table`); matrix: the c = matrix x of :meth:`on_lattice`, if known: the
    table is padded for its sheared passes (:func:`tpde.variants.engines.sheared.extra_nodes`);
    lattices: with ``matrix``, the only lattices the table will serve through
    :meth:`on_lattice` (also after :meth:`velocity_table`): a 2-D table is then formed only
    on the nodes their sheared passes read (NaN elsewhere), a 3-D table padded for what its
    passes read (:func:`tpde.variants.engines.sheared3d.padding`); extent: the support widths (the
    3-D pass plan). :meth:`on_lattice` uses the sheared passes only on a table built with
    ``matrix`` (refined for them by the caller, :func:`wanted_nodes`).

    A :class:`~.protocol.KernelSums` with ``fields="both"`` (``"means"`` / ``"log"`` tables
    answer one of the two and raise at the other): pointwise interpolation has no a
    posteriori estimate (``error()`` NaN); the sheared passes' estimate is
    :meth:`TiltTable.pass_errors`.
    """

    name = "separable"
    #: the a-priori table's accuracy (:func:`table_nodes`, ORDER points per axis): the dense
    #: engine's difference measured 1e-15 .. 1e-11 (tests/test_engines.py)
    tolerance = 1e-11

    def __init__(
        self,
        weights: np.ndarray,
        grid: Grid,
        bounds: np.ndarray,
        nodes: int | Sequence[int] | np.ndarray,
        fields: str = "means",
        matrix: np.ndarray | None = None,
        lattices: Sequence[Sequence[np.ndarray]] | None = None,
        extent: np.ndarray | None = None,
        reuse: dict | None = None,
    ):
        if not np.any(weights > 0):
            raise ValueError("attention: the density is zero everywhere (no mass on the grid)")
        lower, upper = np.asarray(bounds, float).T
        width = np.maximum(upper - lower, 1e-12)
        inner = np.maximum(np.broadcast_to(np.asarray(nodes, int), lower.shape), ORDER)
        step = width / (inner - 1)
        pad = ORDER // 2 + 1 + extra_nodes(matrix, step)
        if matrix is not None and lattices is not None and grid.ndim == 3:
            pad = pad + padding(inner + 2 * pad, lower - pad * step, step, lattices, matrix, extent)
        start = lower - pad * step
        tilts = [start[a] + step[a] * np.arange(inner[a] + 2 * pad[a]) for a in range(grid.ndim)]
        self.fields = fields
        band = None
        if matrix is not None and lattices is not None and grid.ndim == 2:
            band = nodes_read([len(t) for t in tilts], start, step, lattices, matrix)
        super().__init__(
            mgf_table(weights, grid, tilts, fields, band, reuse),
            start,
            step,
            matrix is not None,
            extent,
        )

    def means(self, c: np.ndarray) -> np.ndarray:
        """m(c), c: (P, d) -> (P, d)."""
        if self.fields == "log":
            raise ValueError("separable engine: this table holds log M only (fields='log')")
        values = self(c)
        return values if self.fields == "means" else values[:, 1:]

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        """log M(c), c: (P, d) -> (P,)."""
        if self.fields == "means":
            raise ValueError("separable engine: this table holds the means only (fields='means')")
        return self(c, 0)

    def error(self) -> float:
        """NaN: the pointwise interpolation has no a posteriori estimate (the passes' is
        :meth:`TiltTable.pass_errors`)."""
        return float("nan")

    @profile.timed("velocity.tables")
    def velocity_table(
        self,
        C: np.ndarray,
        box: tuple[np.ndarray, np.ndarray],
        spacing: Sequence[float] | None = None,
    ) -> TiltTable:
        """The velocity components ``C clip(m(c) - grad log S(c), box)`` at the nodes.

        A lattice that needs one velocity component (the normal one, on faces) then
        interpolates one field instead of d. ``spacing``: the cell widths of the exact
        cell-average correction grad log S (softmax, :func:`grad_log_box_factor`), None for
        point-value weights (l2, Sinkhorn). The correction depends on c_a alone along axis
        a, so it is applied on the nodes of each axis. :meth:`TiltTable.on_lattice` of the
        result clips each component to the range ``C box`` allows.
        """
        means = self.values if self.fields == "means" else self.values[1:]
        d = means.shape[0]
        tilts = self.nodes()
        corrected = np.empty_like(means)
        for b in range(d):
            shape = [1] * d
            shape[b] = -1
            shift: float | np.ndarray = 0.0
            if spacing is not None:  # d/dc_b log S depends on c_b alone
                shift = grad_log_box_factor(tilts[b][:, None], [spacing[b]])[:, 0].reshape(shape)
            np.clip(means[b] - shift, box[0][b], box[1][b], out=corrected[b])
        C = np.asarray(C, float)
        return TiltTable(
            np.tensordot(C, corrected, axes=([1], [0])),
            self.start,
            self.step,
            self.sheared,
            self.extent,
            component_bounds(C, box),
        )


def resolved_sums(
    weights: np.ndarray,
    grid: Grid,
    bounds: np.ndarray,
    extent: np.ndarray,
    scale: float,
    matrix: np.ndarray,
    lattices: Sequence[Sequence[np.ndarray]],
    step: np.ndarray | None = None,
    fields: str = "means",
) -> tuple[SeparableSums | None, np.ndarray | None]:
    """The tilted means (or log M, ``fields="log"``) for the sheared passes (2-D, 3-D) onto
    ``lattices`` on a table whose estimated interpolation error is within TABLE_TOLERANCE *
    ``scale`` (the size of the means, the support's radius; 1 for log M: a relative error of
    M; ESTIMATE_SAFETY times the estimate), and the node spacing to try first next time;
    (None, None) where the passes cannot reach the tolerance under the node cap (the caller
    interpolates a capped table pointwise, as before).

    The resolution criterion of :func:`table_nodes` bounds c.y between nodes over the whole
    support: a bound for any density, far finer than a smooth one needs (a Gaussian's means
    are linear in c). Here the first table has the spacing ``step`` per axis (the previous
    evaluation's: a warm start) or, without one, COARSE_RESOLUTION; the passes' errors are
    estimated from the ORDER-th differences of what they interpolate
    (:func:`.sheared.pass_errors`, :func:`.sheared3d.pass_errors3`),
    and an axis whose estimate exceeds the tolerance is refined by the factor the h^ORDER
    remainder predicts (times REFINE_MARGIN) and the table formed again, never beyond
    :func:`table_nodes` (the bound, accepted whatever its estimate where the node cap does
    not bind it). An axis whose estimate is so far below the tolerance that a spacing
    COARSEN_STEP times wider would still pass by a factor 2 is offered that spacing next
    time. The field therefore depends on the warm start, within the tolerance (as
    Sinkhorn's potentials do).
    """
    bounds = np.asarray(bounds, float)
    d = len(bounds)
    width = np.maximum(bounds[:, 1] - bounds[:, 0], 1e-12)
    capped = bool(np.any(wanted_nodes(bounds, extent, matrix) > MAX_NODES[d]))
    finest = table_nodes(bounds, extent, matrix)
    if step is None:
        nodes = np.minimum(
            table_nodes(bounds, extent, matrix, COARSE_RESOLUTION, ADAPTIVE_MIN_NODES), finest
        )
    else:
        nodes = np.clip(np.ceil(width / step).astype(int) + 1, ADAPTIVE_MIN_NODES, finest)
    target = TABLE_TOLERANCE * scale
    reuse: dict = {}
    while True:
        sums = SeparableSums(weights, grid, bounds, nodes, fields, matrix, lattices, extent, reuse)
        errors = sums.pass_errors(lattices, matrix)
        if errors is None:
            return (None, None) if capped else (sums, sums.step)
        errors = ESTIMATE_SAFETY * errors
        # an axis whose estimate is not a number (a table with non-finite values) is known
        # nothing about: it takes the bound, as an estimate above the tolerance would
        unknown = ~np.isfinite(errors)
        errors = np.where(unknown, np.inf, errors)
        with np.errstate(invalid="ignore", over="ignore"):
            factor = np.where(errors > target, REFINE_MARGIN * (errors / target) ** (1 / ORDER), 1)
            grown = np.ceil((nodes - 1) * np.minimum(factor, 1e9)).astype(int) + 1
        refined = np.where(unknown, finest, np.minimum(grown, finest))
        if np.array_equal(refined, nodes):  # within the tolerance, or at the bound
            if capped and np.any(errors > target):
                return None, None
            room = (target / np.maximum(2.0 * errors, 1e-300)) ** (1 / ORDER)
            return sums, sums.step * np.where(room >= COARSEN_STEP, COARSEN_STEP, 1.0)
        nodes = refined
