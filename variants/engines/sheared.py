"""A tilt table on a lattice by two one-dimensional passes (2-D): c = A x without 2-D stencils.

The softmax-type fields need a table ``T(c)`` (uniform nodes in ``c``) at ``c = A x`` for the
points ``x`` of a tensor lattice. Pointwise, each target costs an ORDER x ORDER stencil
(:mod:`tpde.variants.engines.separable`). Eliminating one lattice coordinate instead turns the 2-D
interpolation into two 1-D ones, as an image is rotated by shears (Paeth 1986): with the
table axes ``t1, t2`` and the lattice axes ``s1, s2`` (a pivot ``A[t2, s2] != 0``),

    c_t2 = A[t2, s1] x_s1 + A[t2, s2] x_s2,
    c_t1 = alpha x_s1 + beta c_t2,   beta = A[t1, s2] / A[t2, s2],
                                     alpha = A[t1, s1] - beta A[t2, s1],

so pass 1 interpolates ``T`` along ``c_t1`` to ``G(x_s1, c_t2) = T(alpha x_s1 + beta c_t2,
c_t2)`` at the table's own ``c_t2`` nodes (only the window a lattice row reads), and pass 2
interpolates ``G`` along ``c_t2`` to each target. Both passes are the same local Lagrange
stencil (ORDER points, :mod:`tpde.variants.engines.lagrange`): the result is the interpolant of T
along the sheared direction ``(beta, 1)`` instead of the table axes, of the same order.
Cost per target: ORDER multiply-adds plus one stencil in pass 2 (pass 1 works on the
lattice rows times a window of table nodes), against ORDER^2 pointwise.

The plan takes the axes with the smallest shear ``|beta|``. Along the sheared direction c.y
changes faster between nodes than along the axis (:func:`resolution_factor`): the table is
refined along ``t2`` by that factor so the passes are as accurate as the pointwise stencils
(measured, three bumps at 256^2 against the dense sums: 3.5e-9 without the refinement,
8.8e-10 with it and pointwise; at 128^2 4.0e-10 against 2.3e-9 pointwise on the unrefined
table, ``tests/test_sheared.py``). :func:`nodes_read` gives the nodes the passes read, so
the table need not be formed elsewhere (:func:`tpde.variants.engines.separable.mgf_table`).
Pass 1 reads ``c_t1`` up to ``|beta| step_t2 / step_t1 * ORDER/2`` nodes beyond the targets'
range (the window overhang): :func:`extra_nodes` gives the table padding for it. A lattice
whose passes would leave the table returns None (the caller falls back to the pointwise
stencils).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import lagrange as kernels
from .cache import Recent
from .lagrange import HIGH, LOW


@dataclass(frozen=True)
class ShearPlan:
    """Pass 1 along table axis ``t1`` keeping lattice axis ``s1``; pass 2 along ``t2``."""

    t1: int
    t2: int
    s1: int
    s2: int
    alpha: float
    beta: float

    def extra_nodes(self, step: np.ndarray) -> np.ndarray:
        """Padding (nodes per axis) for the window overhang of pass 1: it reads c_t1 up to
        ORDER/2 t2-nodes beyond the targets, |beta| step_t2 / step_t1 t1-nodes each."""
        extra = np.zeros(2, int)
        extra[self.t1] = int(np.ceil(abs(self.beta) * step[self.t2] / step[self.t1] * HIGH)) + 1
        return extra

    def pass_one_layout(self, table: np.ndarray) -> np.ndarray:
        """One field of the table as pass 1 reads it: (m_t2, m_t1), contiguous."""
        return table if self.t1 == 1 else np.ascontiguousarray(table.T)


def shear_plan(matrix: np.ndarray) -> ShearPlan | None:
    """The two-pass plan for c = matrix x, (2, 2), with the smallest shear |beta| (the
    pass-2 direction closest to a table axis); None outside 2-D or for matrix = 0."""
    matrix = np.asarray(matrix, float)
    if matrix.shape != (2, 2):
        return None
    scale = np.abs(matrix).max()
    best = None
    for t1 in (0, 1):
        for s1 in (0, 1):
            t2, s2 = 1 - t1, 1 - s1
            pivot = matrix[t2, s2]
            if not abs(pivot) > 1e-12 * scale:
                continue
            beta = matrix[t1, s2] / pivot
            if best is None or abs(beta) < abs(best.beta):
                best = ShearPlan(t1, t2, s1, s2, matrix[t1, s1] - beta * matrix[t2, s1], beta)
    return best


def resolution_factor(matrix: np.ndarray | None, extent: np.ndarray) -> np.ndarray:
    """(d,) factor by which the table's resolution width grows along each axis for the
    sheared passes: pass 2 interpolates along (beta, 1) in (c_t1, c_t2), where c.y changes
    by up to step_t2 (extent_t2 + |beta| extent_t1) between nodes over a support of widths
    ``extent``, against step_t2 extent_t2 along the axis. Ones without a plan."""
    factor = np.ones(len(extent))
    plan = None if matrix is None else shear_plan(matrix)
    if plan is not None:
        factor[plan.t2] += abs(plan.beta) * extent[plan.t1] / max(extent[plan.t2], 1e-300)
    return factor


def extra_nodes(matrix: np.ndarray | None, step: np.ndarray) -> np.ndarray:
    """Table padding per axis (beyond the stencil's) for :func:`sheared_on_lattice`."""
    plan = None if matrix is None else shear_plan(matrix)
    return np.zeros(len(step), int) if plan is None else plan.extra_nodes(step)


@dataclass(frozen=True)
class Passes:
    """The two passes onto one lattice, in table units (module docstring)."""

    plan: ShearPlan
    p: np.ndarray  # (n_s1,) pass 2: target (i, j) at p_i + q_j along t2
    q: np.ndarray  # (n_s2,)
    first_node: np.ndarray  # (n_s1,) row i reads the t2 nodes first_node_i .. last_node_i
    last_node: np.ndarray
    a: np.ndarray  # (n_s1,) pass 1: (row i, t2 node k) at a_i + b k along t1
    b: float


#: the last few plans (a table is planned onto the same lattices by nodes_read,
#: pass_errors and sheared_on_lattice)
_PLANS = Recent(16)


def plan_passes(
    counts: Sequence[int],
    start: np.ndarray,
    step: np.ndarray,
    coords: Sequence[np.ndarray],
    matrix: np.ndarray,
) -> Passes | None:
    """The passes of a table of ``counts`` nodes per axis onto the lattice ``coords``; None
    where no plan applies or a pass would read beyond the table. Kept for the last 16
    tables and lattices (the arrays are read, never written)."""
    key = (
        tuple(int(n) for n in counts),
        np.asarray(start, float).tobytes(),
        np.asarray(step, float).tobytes(),
        np.asarray(matrix, float).tobytes(),
        *(np.asarray(x, float).tobytes() for x in coords),
    )
    return _PLANS.get_or_make(key, lambda: _plan_passes(counts, start, step, coords, matrix))


def _plan_passes(counts, start, step, coords, matrix) -> Passes | None:
    plan = shear_plan(matrix)
    if plan is None or len(coords) != 2:
        return None
    A = np.asarray(matrix, float)
    t1, t2, s1, s2 = plan.t1, plan.t2, plan.s1, plan.s2
    x, y = np.asarray(coords[s1], float), np.asarray(coords[s2], float)
    p = (A[t2, s1] * x - start[t2]) / step[t2]
    q = A[t2, s2] * y / step[t2]
    first_node = np.floor(p + q.min()).astype(np.int64) - LOW
    last_node = np.floor(p + q.max()).astype(np.int64) + HIGH
    if first_node.min() < 0 or last_node.max() > counts[t2] - 1:
        return None
    a = (plan.alpha * x + plan.beta * start[t2] - start[t1]) / step[t1]
    b = plan.beta * step[t2] / step[t1]
    ends = np.concatenate([a + b * first_node, a + b * last_node])
    if ends.min() < LOW or ends.max() >= counts[t1] - HIGH:
        return None
    return Passes(
        plan,
        np.ascontiguousarray(p),
        np.ascontiguousarray(q),
        first_node,
        last_node,
        np.ascontiguousarray(a),
        b,
    )


def nodes_read(
    counts: Sequence[int],
    start: np.ndarray,
    step: np.ndarray,
    lattices: Sequence[Sequence[np.ndarray]],
    matrix: np.ndarray,
) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The table nodes :func:`sheared_on_lattice` reads for these lattices: ``(t2, lo, hi)``,
    for each node k along t2 the t1 nodes lo_k .. hi_k (none where lo_k > hi_k); None where
    a lattice has no passes. Exact: first_node, last_node and a are monotone along a lattice
    row, so the rows that read node k are an interval and the extremes of a_i + b k lie at
    its ends."""
    band = None
    for coords in lattices:
        passes = plan_passes(counts, start, step, coords, matrix)
        if passes is None:
            return None
        t2 = passes.plan.t2
        first, last, a = passes.first_node, passes.last_node, passes.a
        if first[-1] < first[0]:  # descending along the row: reverse
            first, last, a = first[::-1], last[::-1], a[::-1]
        k = np.arange(counts[t2])
        lowest = np.searchsorted(last, k, side="left")  # first row with last >= k
        highest = np.searchsorted(first, k, side="right") - 1  # last row with first <= k
        valid = lowest <= highest
        ends = np.stack([a[np.clip(lowest, 0, a.size - 1)], a[np.clip(highest, 0, a.size - 1)]])
        lo = np.where(valid, np.floor(ends.min(axis=0) + passes.b * k) - LOW, counts[1 - t2])
        hi = np.where(valid, np.floor(ends.max(axis=0) + passes.b * k) + HIGH, -1)
        if band is None:
            band = (t2, lo.astype(np.int64), hi.astype(np.int64))
        else:
            band = (
                t2,
                np.minimum(band[1], lo).astype(np.int64),
                np.maximum(band[2], hi).astype(np.int64),
            )
    return band


def sheared_on_lattice(
    values: np.ndarray,
    start: np.ndarray,
    step: np.ndarray,
    coords: Sequence[np.ndarray],
    matrix: np.ndarray,
) -> np.ndarray | None:
    """The table ``values`` (F, m_0, m_1) (nodes ``start + step * k`` per axis) at c = matrix x
    on the lattice ``coords`` (two 1-D arrays): (F, n_0, n_1), or None where no plan applies
    or a pass would read beyond the table."""
    passes = plan_passes(values.shape[1:], start, step, coords, matrix)
    if passes is None:
        return None
    plan = passes.plan
    length = passes.last_node - passes.first_node + 1
    rows = np.empty((passes.a.size, int(length.max())))
    out = np.empty((values.shape[0], passes.p.size, passes.q.size))
    for f, table in enumerate(values):
        table = plan.pass_one_layout(table)
        kernels.pass_one(table, passes.a, passes.b, passes.first_node, length, rows)
        kernels.pass_two(rows, passes.p, passes.q, passes.first_node, out[f])
    return out if plan.s1 == 0 else out.transpose(0, 2, 1)


def pass_errors(
    values: np.ndarray,
    start: np.ndarray,
    step: np.ndarray,
    coords: Sequence[np.ndarray],
    matrix: np.ndarray,
    stride: int = 16,
) -> np.ndarray | None:
    """Estimated interpolation errors of :func:`sheared_on_lattice` per table axis, (2,):
    ERROR_CONSTANT times the largest ORDER-th difference of what each pass interpolates, on
    every ``stride``-th lattice row and table row. Along t1: the table's rows (pass 1); along
    t2: pass 1's output, the table along the sheared direction (beta, 1) at the t2 nodes
    (pass 2). The difference is h^ORDER f^(ORDER) up to O(h^(ORDER+1)), so the estimate is
    the leading term of the Lagrange remainder. values: (F, m_0, m_1), NaN where the table is
    not formed; None where no plan applies."""
    passes = plan_passes(values.shape[1:], start, step, coords, matrix)
    if passes is None:
        return None
    plan = passes.plan
    rows = np.arange(0, passes.a.size, stride)
    first, length = passes.first_node[rows], passes.last_node[rows] - passes.first_node[rows] + 1
    line = np.empty((rows.size, int(length.max())))
    largest = np.zeros(2)
    for table in values:
        table = plan.pass_one_layout(table)
        nodes = np.arange(0, table.shape[0], stride)
        largest[plan.t1] = max(
            largest[plan.t1],
            kernels.max_difference(
                table, nodes, np.zeros(nodes.size, np.int64), np.full(nodes.size, table.shape[1])
            ),
        )
        kernels.pass_one(table, passes.a[rows], passes.b, first, length, line)
        largest[plan.t2] = max(
            largest[plan.t2],
            kernels.max_difference(
                line, np.arange(rows.size), np.zeros(rows.size, np.int64), length
            ),
        )
    return kernels.ERROR_CONSTANT * largest
