"""A 3-D tilt table on a lattice by three one-dimensional passes (the 2-D scheme of
:mod:`tpde.variants.engines.sheared`, one level deeper).

With table axes ``t1, t2, t3`` and lattice axes ``s1, s2, s3`` (pivots ``A[t3, s3]`` and the
block ``A[(t2, t3), (s2, s3)]`` invertible):

* pass 1 interpolates the table along ``c_t1 = alpha1 x_s1 + beta12 c_t2 + beta13 c_t3`` at the
  table's own ``(c_t2, c_t3)`` nodes, for every lattice plane ``x_s1`` (a rectangle of nodes per
  plane: what the next passes read);
* pass 2 interpolates along ``c_t2 = alpha2 . (x_s1, x_s2) + beta2 c_t3`` at the ``c_t3`` nodes,
  for every lattice row ``(x_s1, x_s2)``;
* pass 3 interpolates along ``c_t3 = A[t3] . x`` to each target.

ORDER multiply-adds per target in pass 3 (pass 1 and 2 work on planes and rows times node
windows), against ORDER^3 pointwise (benchmarks/velocity.py times the 3-D velocity). Pass 3
runs along
``A[:, s3] / A[t3, s3]`` and pass 2 along ``(beta12, 1, 0)`` in (t1, t2, t3): the table is refined
along t3 and t2 so that c.y changes between neighbouring nodes along those directions as little
as along an axis (:func:`resolution_factor`, as in 2-D); the plan takes the pair of axis
orders with the smallest refined table. The padding a lattice needs is measured by a dry run
of the windows (:func:`padding`); a lattice whose passes would leave the table returns None
(pointwise stencils instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import permutations

import numpy as np

from . import lagrange as kernels
from .lagrange import HIGH, LOW


@dataclass(frozen=True)
class ShearPlan3:
    """Pass order of the table axes ``tau`` and of the lattice axes ``sigma``, and the
    coefficients of the sheared coordinates (module docstring)."""

    tau: tuple[int, int, int]
    sigma: tuple[int, int, int]
    alpha1: float
    beta12: float
    beta13: float
    alpha2: tuple[float, float]
    beta2: float
    direction3: np.ndarray  # (3,) dc / dc_t3 along pass 3

    def factor(self, extent: np.ndarray) -> np.ndarray:
        """(3,) growth of the resolution width per table axis (module docstring)."""
        t1, t2, t3 = self.tau
        out = np.ones(3)
        out[t3] = np.sum(np.abs(self.direction3) * extent) / max(extent[t3], 1e-300)
        out[t2] = 1.0 + abs(self.beta12) * extent[t1] / max(extent[t2], 1e-300)
        return out


def shear_plan3(matrix: np.ndarray, extent: np.ndarray | None = None) -> ShearPlan3 | None:
    """The plan with the smallest refined table for c = matrix x, (3, 3) (support widths
    ``extent``, default equal); None outside 3-D or without invertible pivots."""
    A = np.asarray(matrix, float)
    if A.shape != (3, 3):
        return None
    extent = np.ones(3) if extent is None else np.asarray(extent, float)
    scale = np.abs(A).max()
    best, best_size = None, np.inf
    for tau in permutations(range(3)):
        t1, t2, t3 = tau
        for sigma in permutations(range(3)):
            s1, s2, s3 = sigma
            pivot = A[t3, s3]
            block = A[np.ix_([t2, t3], [s2, s3])]
            if not (abs(pivot) > 1e-12 * scale and abs(np.linalg.det(block)) > 1e-12 * scale**2):
                continue
            beta1 = A[t1, [s2, s3]] @ np.linalg.inv(block)
            alpha1 = A[t1, s1] - beta1 @ A[[t2, t3], s1]
            beta2 = A[t2, s3] / pivot
            alpha2 = (A[t2, s1] - beta2 * A[t3, s1], A[t2, s2] - beta2 * A[t3, s2])
            plan = ShearPlan3(
                (t1, t2, t3),
                (s1, s2, s3),
                float(alpha1),
                float(beta1[0]),
                float(beta1[1]),
                (float(alpha2[0]), float(alpha2[1])),
                float(beta2),
                A[:, s3] / pivot,
            )
            size = np.prod(plan.factor(extent))
            if size < best_size:
                best, best_size = plan, size
    return best


def resolution_factor(matrix: np.ndarray | None, extent: np.ndarray) -> np.ndarray:
    """(3,) growth of the table's resolution width per axis for the passes; ones without a
    plan."""
    plan = None if matrix is None else shear_plan3(matrix, extent)
    return np.ones(3) if plan is None else plan.factor(np.asarray(extent, float))


@dataclass
class Windows:
    """What the passes read for one lattice (node indices of the table)."""

    plan: ShearPlan3
    p: np.ndarray  # (n1, n2) pass 3: target (i, j, k) at p_ij + q_k along t3
    q: np.ndarray  # (n3,)
    row_first: np.ndarray  # (n1, n2) t3 nodes row (i, j) reads: row_first .. row_last
    row_last: np.ndarray
    a2: np.ndarray  # (n1, n2) pass 2: (i, j, t3 node l) at a2_ij + b2 l along t2
    b2: float
    m_first: np.ndarray  # (n1,) t2 nodes plane i reads: m_first .. m_last
    m_last: np.ndarray
    l_first: np.ndarray  # (n1,) t3 nodes plane i reads: l_first .. l_last
    l_last: np.ndarray
    a1: np.ndarray  # (n1,) pass 1: (i, m, l) at a1_i + c2 m + c3 l along t1
    c2: float
    c3: float

    def reads(self) -> np.ndarray:
        """(3, 2) the lowest and highest node read along each table axis."""
        t1, t2, t3 = self.plan.tau
        out = np.zeros((3, 2), np.int64)
        out[t3] = self.row_first.min(), self.row_last.max()
        out[t2] = self.m_first.min(), self.m_last.max()
        corners = np.stack(
            [
                self.a1 + self.c2 * m + self.c3 * l
                for m in (self.m_first, self.m_last)
                for l in (self.l_first, self.l_last)
            ]
        )
        out[t1] = np.floor(corners.min()) - LOW, np.floor(corners.max()) + HIGH
        return out


def windows(
    start: np.ndarray,
    step: np.ndarray,
    coords: Sequence[np.ndarray],
    plan: ShearPlan3,
    matrix: np.ndarray,
) -> Windows:
    """The node windows of the three passes onto the lattice ``coords`` (no range check)."""
    A = np.asarray(matrix, float)
    t1, t2, t3 = plan.tau
    s1, s2, s3 = plan.sigma
    x1, x2, x3 = (np.asarray(coords[s], float) for s in plan.sigma)
    p = (A[t3, s1] * x1[:, None] + A[t3, s2] * x2[None, :] - start[t3]) / step[t3]
    q = A[t3, s3] * x3 / step[t3]
    row_first = np.floor(p + q.min()).astype(np.int64) - LOW
    row_last = np.floor(p + q.max()).astype(np.int64) + HIGH
    a2 = (
        plan.alpha2[0] * x1[:, None]
        + plan.alpha2[1] * x2[None, :]
        + plan.beta2 * start[t3]
        - start[t2]
    ) / step[t2]
    b2 = plan.beta2 * step[t3] / step[t2]
    ends = np.stack([a2 + b2 * row_first, a2 + b2 * row_last])
    m_first = np.floor(ends.min(axis=(0, 2))).astype(np.int64) - LOW
    m_last = np.floor(ends.max(axis=(0, 2))).astype(np.int64) + HIGH
    a1 = (plan.alpha1 * x1 + plan.beta12 * start[t2] + plan.beta13 * start[t3] - start[t1]) / step[
        t1
    ]
    return Windows(
        plan,
        p,
        q,
        row_first,
        row_last,
        a2,
        b2,
        m_first,
        m_last,
        row_first.min(axis=1),
        row_last.max(axis=1),
        a1,
        plan.beta12 * step[t2] / step[t1],
        plan.beta13 * step[t3] / step[t1],
    )


def padding(
    counts: Sequence[int],
    start: np.ndarray,
    step: np.ndarray,
    lattices: Sequence[Sequence[np.ndarray]],
    matrix: np.ndarray,
    extent: np.ndarray | None,
) -> np.ndarray:
    """(3,) nodes to add at both ends of each axis so that every read of the passes onto
    ``lattices`` lies in the table (a dry run on the table as it stands)."""
    plan = shear_plan3(matrix, extent)
    extra = np.zeros(3, np.int64)
    if plan is None:
        return extra
    for coords in lattices:
        reads = windows(start, step, coords, plan, matrix).reads()
        extra = np.maximum(extra, np.maximum(-reads[:, 0], reads[:, 1] - (np.asarray(counts) - 1)))
    return extra


def checked_windows(
    counts: Sequence[int],
    start: np.ndarray,
    step: np.ndarray,
    coords: Sequence[np.ndarray],
    matrix: np.ndarray,
    extent: np.ndarray | None,
) -> Windows | None:
    """The windows of the passes of a table of ``counts`` nodes per axis onto the lattice
    ``coords``; None where no plan applies or a pass would read beyond the table."""
    plan = shear_plan3(matrix, extent)
    if plan is None or len(coords) != 3:
        return None
    win = windows(start, step, coords, plan, matrix)
    reads = win.reads()
    if reads[:, 0].min() < 0 or np.any(reads[:, 1] > np.asarray(counts) - 1):
        return None
    return win


def pass_one_layout(table: np.ndarray, plan: ShearPlan3) -> np.ndarray:
    """One field of the table as pass 1 reads it: (m_t2, m_t3, m_t1), contiguous."""
    t1, t2, t3 = plan.tau
    return np.ascontiguousarray(np.transpose(table, (t2, t3, t1)))


def sheared_on_lattice3(
    values: np.ndarray,
    start: np.ndarray,
    step: np.ndarray,
    coords: Sequence[np.ndarray],
    matrix: np.ndarray,
    extent: np.ndarray | None = None,
) -> np.ndarray | None:
    """The table ``values`` (F, m_0, m_1, m_2) at c = matrix x on the lattice ``coords`` (three
    1-D arrays): (F, n_0, n_1, n_2), or None where no plan applies or a pass would read beyond
    the table. ``extent``: the support widths the plan was chosen for (the table's)."""
    win = checked_windows(values.shape[1:], start, step, coords, matrix, extent)
    if win is None:
        return None
    n1, n2, n3 = win.p.shape + win.q.shape
    m_count = win.m_last - win.m_first + 1
    l_count = win.l_last - win.l_first + 1
    row_count = win.row_last - win.row_first + 1
    planes = np.empty((n1, int(l_count.max()), int(m_count.max())))
    rows = np.empty((n1, n2, int(row_count.max())))
    out = np.empty((values.shape[0], n1, n2, n3))
    for f, table in enumerate(values):
        kernels.pass3_one(
            pass_one_layout(table, win.plan),
            win.a1,
            win.c2,
            win.c3,
            win.m_first,
            m_count,
            win.l_first,
            l_count,
            planes,
        )
        kernels.pass3_two(
            planes, win.a2, win.b2, win.m_first, win.l_first, win.row_first, row_count, rows
        )
        kernels.pass3_three(rows, win.p, win.q, win.row_first, out[f])
    order = np.argsort(win.plan.sigma)  # (s1, s2, s3) order -> lattice order
    return np.ascontiguousarray(np.transpose(out, (0, *(1 + order))))


def pass_errors3(
    values: np.ndarray,
    start: np.ndarray,
    step: np.ndarray,
    coords: Sequence[np.ndarray],
    matrix: np.ndarray,
    extent: np.ndarray | None = None,
    stride: int = 16,
) -> np.ndarray | None:
    """Estimated interpolation errors of :func:`sheared_on_lattice3` per table axis, (3,):
    ERROR_CONSTANT times the largest ORDER-th difference of what each pass interpolates
    (as :func:`tpde.variants.engines.sheared.pass_errors` in 2-D): the table along t1 (pass 1, every
    ``stride``-th table line), pass 1's output along t2 (pass 2) and pass 2's output along t3
    (pass 3), on every ``stride``-th lattice plane. None where no plan applies or a pass
    would leave the table."""
    win = checked_windows(values.shape[1:], start, step, coords, matrix, extent)
    if win is None:
        return None
    t1, t2, t3 = win.plan.tau
    picked = np.arange(0, win.a1.size, stride)
    m_count = (win.m_last - win.m_first + 1)[picked]
    l_count = (win.l_last - win.l_first + 1)[picked]
    row_count = (win.row_last - win.row_first + 1)[picked]
    planes = np.empty((picked.size, int(l_count.max()), int(m_count.max())))
    rows = np.empty((picked.size, win.p.shape[1], int(row_count.max())))
    # pass 2 reads plane i at l < l_count[i], m < m_count[i]; pass 3 row (i, j) at l < count
    plane_rows = (np.arange(planes.shape[1])[None, :] < l_count[:, None]).reshape(-1)
    plane_rows = np.flatnonzero(plane_rows)
    plane_counts = np.repeat(m_count, planes.shape[1])[plane_rows]
    largest = np.zeros(3)
    for table in values:
        table = pass_one_layout(table, win.plan)
        lines = table.reshape(-1, table.shape[2])
        sampled = np.arange(0, lines.shape[0], stride)
        largest[t1] = max(
            largest[t1],
            kernels.max_difference(
                lines,
                sampled,
                np.zeros(sampled.size, np.int64),
                np.full(sampled.size, lines.shape[1]),
            ),
        )
        kernels.pass3_one(
            table,
            win.a1[picked],
            win.c2,
            win.c3,
            win.m_first[picked],
            m_count,
            win.l_first[picked],
            l_count,
            planes,
        )
        largest[t2] = max(
            largest[t2],
            kernels.max_difference(
                planes.reshape(-1, planes.shape[2]),
                plane_rows,
                np.zeros(plane_rows.size, np.int64),
                plane_counts,
            ),
        )
        kernels.pass3_two(
            planes,
            win.a2[picked],
            win.b2,
            win.m_first[picked],
            win.l_first[picked],
            win.row_first[picked],
            row_count,
            rows,
        )
        flat_counts = row_count.reshape(-1)
        largest[t3] = max(
            largest[t3],
            kernels.max_difference(
                rows.reshape(-1, rows.shape[2]),
                np.arange(flat_counts.size),
                np.zeros(flat_counts.size, np.int64),
                flat_counts,
            ),
        )
    return kernels.ERROR_CONSTANT * largest
