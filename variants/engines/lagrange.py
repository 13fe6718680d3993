"""Local Lagrange interpolation on uniform nodes: the stencil shared by the table kernels.

ORDER points per axis (a compile-time constant of the numba kernels: fixed trip counts let
LLVM unroll and vectorise the stencil loops, which a runtime order prevents;
benchmarks/velocity.py times the interpolation). Every
kernel that uses the stencil lives in this module: numba's on-disk cache is keyed to the
source file of each kernel, so a kernel elsewhere would keep a stale ORDER or stencil after
an edit here. A point
at unit coordinate ``u`` (node index space) is interpolated from the nodes
``floor(u) - (ORDER/2 - 1) .. floor(u) + ORDER/2`` with the barycentric weights

    w_j = prod_{k != j} (s - k) / prod_{k != j} (j - k),   s = u - first,

computed in O(ORDER) by prefix and suffix products (no division).
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np

JIT: dict[str, Any] = {"cache": True, "error_model": "numpy"}
#: interpolation points per axis
ORDER = 12
#: first stencil node relative to floor(u): the stencil covers floor(u) - LOW .. + HIGH
LOW = ORDER // 2 - 1
HIGH = ORDER // 2


def _error_constant() -> float:
    """max |prod_j (s - j)| / ORDER! over the stencil's middle interval LOW <= s <= LOW + 1:
    the interpolation error is this times |f^(ORDER)| in node units, which the ORDER-th
    difference of the nodes estimates (:func:`max_difference`)."""
    s = np.linspace(LOW, LOW + 1, 2001)
    omega = np.prod(s[:, None] - np.arange(ORDER)[None, :], axis=1)
    return float(np.abs(omega).max() / np.prod(np.arange(1.0, ORDER + 1)))


#: interpolation error per unit ORDER-th difference (5.5e-5 for ORDER = 12)
ERROR_CONSTANT = _error_constant()


@nb.njit(**JIT)
def barycentric():
    """1 / prod_{k != j} (j - k) for j < ORDER."""
    out = np.empty(ORDER)
    for j in range(ORDER):
        value = 1.0
        for k in range(ORDER):
            if k != j:
                value *= j - k
        out[j] = 1.0 / value
    return out


@nb.njit(inline="always", **JIT)
def stencil(x, bary, weights):
    """First node and Lagrange weights (into ``weights``, (ORDER,)) of the ORDER integer
    nodes around the unit coordinate x (module docstring)."""
    first = np.int64(np.floor(x)) - LOW
    s = x - first
    prefix = 1.0
    for j in range(ORDER):
        weights[j] = prefix * bary[j]
        prefix *= s - j
    suffix = 1.0
    for j in range(ORDER - 1, -1, -1):
        weights[j] *= suffix
        suffix *= s - j
    return first


#: targets per parallel task of the pointwise kernels
CHUNK = 512


@nb.njit(parallel=True, **JIT)
def interpolate_1d(table, x0, out):
    chunks = (x0.size + CHUNK - 1) // CHUNK
    bary = barycentric()
    for chunk in nb.prange(chunks):
        w0 = np.empty(ORDER)
        for i in range(chunk * CHUNK, min(x0.size, (chunk + 1) * CHUNK)):
            f0 = stencil(x0[i], bary, w0)
            for b in range(table.shape[0]):
                acc = 0.0
                for j in range(ORDER):
                    acc += w0[j] * table[b, f0 + j]
                out[i, b] = acc


@nb.njit(parallel=True, **JIT)
def interpolate_2d(table, x0, x1, out):
    chunks = (x0.size + CHUNK - 1) // CHUNK
    bary = barycentric()
    for chunk in nb.prange(chunks):
        w0 = np.empty(ORDER)
        w1 = np.empty(ORDER)
        rows = np.empty(ORDER)  # sum_j w0_j table[b, f0 + j, f1 + k]
        for i in range(chunk * CHUNK, min(x0.size, (chunk + 1) * CHUNK)):
            f0 = stencil(x0[i], bary, w0)
            f1 = stencil(x1[i], bary, w1)
            for b in range(table.shape[0]):
                rows[:] = 0.0
                for j in range(ORDER):
                    w = w0[j]
                    row = table[b, f0 + j]
                    for k in range(ORDER):
                        rows[k] += w * row[f1 + k]
                acc = 0.0
                for k in range(ORDER):
                    acc += w1[k] * rows[k]
                out[i, b] = acc


@nb.njit(parallel=True, **JIT)
def interpolate_3d(table, x0, x1, x2, out):
    chunks = (x0.size + CHUNK - 1) // CHUNK
    bary = barycentric()
    for chunk in nb.prange(chunks):
        w0 = np.empty(ORDER)
        w1 = np.empty(ORDER)
        w2 = np.empty(ORDER)
        rows = np.empty(ORDER)  # sum_jk w0_j w1_k table[b, f0 + j, f1 + k, f2 + m]
        for i in range(chunk * CHUNK, min(x0.size, (chunk + 1) * CHUNK)):
            f0 = stencil(x0[i], bary, w0)
            f1 = stencil(x1[i], bary, w1)
            f2 = stencil(x2[i], bary, w2)
            for b in range(table.shape[0]):
                rows[:] = 0.0
                for j in range(ORDER):
                    for k in range(ORDER):
                        w = w0[j] * w1[k]
                        row = table[b, f0 + j, f1 + k]
                        for m in range(ORDER):
                            rows[m] += w * row[f2 + m]
                acc = 0.0
                for m in range(ORDER):
                    acc += w2[m] * rows[m]
                out[i, b] = acc


# One field per call: a loop over fields inside the kernels doubles their time (measured).
@nb.njit(parallel=True, **JIT)
def pass_one(table, a, b, first_node, length, out):
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
def pass_two(rows, p, q, first_node, out):
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


# Three-dimensional sheared passes (tpde.variants.engines.sheared3d), one field per call.
@nb.njit(parallel=True, **JIT)
def pass3_one(table, a, b2, b3, m_first, m_count, l_first, l_count, out):
    """out[i, l', m'] = T(a_i + b2 m + b3 l) along the last axis of ``table`` (m_t2, m_t3,
    m_t1), m = m_first[i] + m', l = l_first[i] + l'."""
    bary = barycentric()
    for i in nb.prange(a.size):
        w = np.empty(ORDER)
        for ll in range(l_count[i]):
            l = l_first[i] + ll
            for mm in range(m_count[i]):
                m = m_first[i] + mm
                first = stencil(a[i] + b2 * m + b3 * l, bary, w)
                acc = 0.0
                for j in range(ORDER):
                    acc += w[j] * table[m, l, first + j]
                out[i, ll, mm] = acc


@nb.njit(parallel=True, **JIT)
def pass3_two(rows, a, b, m_first, l_first, row_first, row_count, out):
    """out[i, j, l'] = G(i, a_ij + b l, l) along m, l = row_first[i, j] + l', with
    G(i, m, l) = rows[i, l - l_first[i], m - m_first[i]]."""
    bary = barycentric()
    n_i, n_j = a.shape
    for i in nb.prange(n_i):
        w = np.empty(ORDER)
        for j in range(n_j):
            for ll in range(row_count[i, j]):
                l = row_first[i, j] + ll
                first = stencil(a[i, j] + b * l, bary, w) - m_first[i]
                line = rows[i, l - l_first[i]]
                acc = 0.0
                for s in range(ORDER):
                    acc += w[s] * line[first + s]
                out[i, j, ll] = acc


@nb.njit(parallel=True, **JIT)
def pass3_three(rows, p, q, row_first, out):
    """out[i, j, k] = G(i, j, p_ij + q_k), G(i, j, l) = rows[i, j, l - row_first[i, j]]."""
    bary = barycentric()
    n_i, n_j = p.shape
    for i in nb.prange(n_i):
        w = np.empty(ORDER)
        for j in range(n_j):
            for k in range(q.size):
                first = stencil(p[i, j] + q[k], bary, w) - row_first[i, j]
                acc = 0.0
                for s in range(ORDER):
                    acc += w[s] * rows[i, j, first + s]
                out[i, j, k] = acc


@nb.njit(**JIT)
def difference_weights():
    """(-1)^(ORDER - j) binom(ORDER, j), j <= ORDER: the ORDER-th forward difference."""
    out = np.empty(ORDER + 1)
    value = 1.0
    for j in range(ORDER + 1):
        out[ORDER - j] = value if j % 2 == 0 else -value
        value = value * (ORDER - j) / (j + 1)
    return out


@nb.njit(parallel=True, **JIT)
def max_difference(values, rows, first, count):
    """max |Delta^ORDER values[r, s]| along the last axis over the rows ``r = rows[i]`` and
    the windows of ORDER + 1 nodes in ``first[i] .. first[i] + count[i] - 1``; a window that
    holds a NaN (a node the table does not form) is skipped."""
    weights = difference_weights()
    best = np.zeros(rows.size)
    for i in nb.prange(rows.size):
        line = values[rows[i]]
        largest = 0.0
        for s in range(first[i], first[i] + count[i] - ORDER):
            acc = 0.0
            for j in range(ORDER + 1):
                acc += weights[j] * line[s + j]
            if abs(acc) > largest:  # False for NaN
                largest = abs(acc)
        best[i] = largest
    return best.max() if rows.size else 0.0
