"""A tilt table on a lattice by two one-dimensional passes (2-D): c = A x without 2-D stencils.

The softmax-type fields need a table ``T(c)`` (uniform nodes in ``c``) at ``c = A x`` for the
points ``x`` of a tensor lattice. Pointwise, each target costs an ORDER x ORDER stencil
(:mod:`tpde.variants.separable`). Eliminating one lattice coordinate instead turns the 2-D
interpolation into two 1-D ones, as an image is rotated by shears (Paeth 1986): with the
table axes ``t1, t2`` and the lattice axes ``s1, s2`` (a pivot ``A[t2, s2] != 0``),

    c_t2 = A[t2, s1] x_s1 + A[t2, s2] x_s2,
    c_t1 = alpha x_s1 + beta c_t2,   beta = A[t1, s2] / A[t2, s2],
                                     alpha = A[t1, s1] - beta A[t2, s1],

so pass 1 interpolates ``T`` along ``c_t1`` to ``G(x_s1, c_t2) = T(alpha x_s1 + beta c_t2,
c_t2)`` at the table's own ``c_t2`` nodes (only the window a lattice row reads), and pass 2
interpolates ``G`` along ``c_t2`` to each target. Both passes are the same local Lagrange
stencil (ORDER points, :mod:`tpde.variants.lagrange`): the result is the interpolant of T
along the sheared direction ``(beta, 1)`` instead of the table axes, of the same order.
Cost per target: ORDER multiply-adds plus one stencil in pass 2 (pass 1 works on the
lattice rows times a window of table nodes), against ORDER^2 pointwise.

Pass 1 reads ``c_t1`` up to ``|beta| step_t2 / step_t1 * ORDER/2`` nodes beyond the targets'
range (the window overhang): :func:`extra_nodes` gives the table padding for it, and the
plan picks the axes with the smallest overhang. A lattice whose passes would leave the
table returns None (the caller falls back to the pointwise stencils).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba as nb
import numpy as np

from .lagrange import HIGH, JIT, LOW, ORDER, barycentric, stencil


@dataclass(frozen=True)
class ShearPlan:
    """Pass 1 along table axis ``t1`` keeping lattice axis ``s1``; pass 2 along ``t2``."""

    t1: int
    t2: int
    s1: int
    s2: int
    alpha: float
    beta: float
    overhang: float   # table-t1 nodes per table-t2 node along the shear

    def extra_nodes(self) -> np.ndarray:
        """Padding (nodes per axis) the window overhang of pass 1 needs."""
        extra = np.zeros(2, int)
        extra[self.t1] = int(np.ceil(self.overhang * HIGH)) + 1
        return extra


def shear_plan(matrix: np.ndarray, step: Sequence[float]) -> ShearPlan | None:
    """The two-pass plan with the smallest overhang for c = matrix x, (2, 2); None outside
    2-D or for matrix = 0."""
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
            plan = ShearPlan(t1, t2, s1, s2, matrix[t1, s1] - beta * matrix[t2, s1], beta,
                             abs(beta) * step[t2] / step[t1])
            if best is None or plan.overhang < best.overhang:
                best = plan
    return best


def extra_nodes(matrix: np.ndarray | None, step: np.ndarray) -> np.ndarray:
    """Table padding per axis (beyond the stencil's) for :func:`sheared_on_lattice`."""
    plan = None if matrix is None else shear_plan(matrix, step)
    return np.zeros(len(step), int) if plan is None else plan.extra_nodes()


# One field per call: a loop over fields inside the kernels doubles their time (measured).
@nb.njit(parallel=True, **JIT)
def _pass_one(table, a, b, first_node, length, out):
    """out[i, k'] = T(a_i + b k) along the last axis of ``table`` (m_t2, m_t1), for
    k = first_node[i] + k', k' < length[i]."""
    bary = barycentric()
    for i in nb.prange(a.size):
        w = np.empty(ORDER)
        for kk in range(length[i]):
            k = first_node[i] + kk
            first = stencil(a[i] + b * k, bary, w)
            acc = 0.0
            for j in range(ORDER):
                acc += w[j] * table[k, first + j]
            out[i, kk] = acc


@nb.njit(parallel=True, **JIT)
def _pass_two(rows, p, q, first_node, out):
    """out[i, j] = G(i, p_i + q_j), G(i, k) = rows[i, k - first_node[i]]."""
    bary = barycentric()
    for i in nb.prange(p.size):
        w = np.empty(ORDER)
        for j in range(q.size):
            first = stencil(p[i] + q[j], bary, w) - first_node[i]
            acc = 0.0
            for m in range(ORDER):
                acc += w[m] * rows[i, first + m]
            out[i, j] = acc


def sheared_on_lattice(values: np.ndarray, start: np.ndarray, step: np.ndarray,
                       coords: Sequence[np.ndarray], matrix: np.ndarray) -> np.ndarray | None:
    """The table ``values`` (F, m_0, m_1) (nodes ``start + step * k`` per axis) at c = matrix x
    on the lattice ``coords`` (two 1-D arrays): (F, n_0, n_1), or None where no plan applies
    or a pass would read beyond the table."""
    plan = shear_plan(matrix, step)
    if plan is None or len(coords) != 2:
        return None
    A = np.asarray(matrix, float)
    t1, t2, s1, s2 = plan.t1, plan.t2, plan.s1, plan.s2
    x, y = np.asarray(coords[s1], float), np.asarray(coords[s2], float)
    # pass 2: unit coordinate along t2 of target (i, j) is p_i + q_j
    p = (A[t2, s1] * x - start[t2]) / step[t2]
    q = A[t2, s2] * y / step[t2]
    first_node = np.floor(p + q.min()).astype(np.int64) - LOW
    last_node = np.floor(p + q.max()).astype(np.int64) + HIGH
    counts = values.shape[1:]
    if first_node.min() < 0 or last_node.max() > counts[t2] - 1:
        return None
    # pass 1: unit coordinate along t1 at (x_i, node k of t2) is a_i + b k
    a = (plan.alpha * x + plan.beta * start[t2] - start[t1]) / step[t1]
    b = plan.beta * step[t2] / step[t1]
    ends = np.concatenate([a + b * first_node, a + b * last_node])
    if ends.min() < LOW or ends.max() >= counts[t1] - HIGH:
        return None
    length = last_node - first_node + 1
    rows = np.empty((x.size, int(length.max())))
    out = np.empty((values.shape[0], x.size, y.size))
    a, p, q = np.ascontiguousarray(a), np.ascontiguousarray(p), np.ascontiguousarray(q)
    for f, table in enumerate(values):
        table = table if t1 == 1 else np.ascontiguousarray(table.T)
        _pass_one(table, a, b, first_node, length, rows)
        _pass_two(rows, p, q, first_node, out[f])
    return out if s1 == 0 else out.transpose(0, 2, 1)
