"""Fast softmax sums: the moment-generating function on a tensor grid, then interpolation.

MATH.md 9.9. With ``M(c) = sum_s rho_bar_s e^{c.y_s}`` the softmax velocity is
``Gamma(x) = C m(A x)``, ``m(c) = grad log M(c)`` (plus the cell-average correction of
:mod:`tpde.variants.softmax`). On a tensor grid of ``c`` values ``M`` and its first moments are
separable sums, one matrix product per axis:

    M(c_1i, c_2j) = sum_p e^{c_1i y_1p} ( sum_q e^{c_2j y_2q} rho_pq ),

``O(m N^d)`` work for ``m`` nodes per axis instead of ``O(N^{2d})``. Each row's exponents are
shifted by their maximum over the cells that hold mass, so every term is <= 1 and positive:
the sums keep relative accuracy however small they are. ``m(c)`` is smooth (its Jacobian is
the covariance of the tilted law, bounded by the squared support radius) and exactly linear
for a Gaussian, so a local Lagrange interpolation of degree ``order - 1`` on the uniform
``c``-grid gives ``m(A x)`` at a controllable error (``tests/test_separable.py`` prints the
convergence table against the dense engine).
"""

from __future__ import annotations

from collections.abc import Sequence

import numba as nb
import numpy as np

from tpde.grid import Grid

JIT = {"cache": True, "error_model": "numpy"}
#: table nodes per axis by dimension, and the interpolation order (points per axis)
SEPARABLE_DEFAULTS = {1: 4096, 2: 512, 3: 96}
SEPARABLE_ORDER = 12


def mgf_table(density: np.ndarray, grid: Grid, nodes: Sequence[np.ndarray]) -> np.ndarray:
    """Tilted means m(c) on the tensor grid ``nodes`` (one 1-D array per axis).

    density: cell averages, grid.shape; returns (d, m_1, ..., m_d).
    """
    d = grid.ndim
    centres = [grid.centres(a) for a in range(d)]
    has_mass = [np.any(density > 0, axis=tuple(b for b in range(d) if b != a))
                for a in range(d)]
    factors, moment_factors = [], []
    for a in range(d):
        exponent = np.multiply.outer(nodes[a], centres[a])           # (m_a, N_a)
        shift = np.where(has_mass[a][None, :], exponent, -np.inf).max(axis=1, keepdims=True)
        e = np.exp(exponent - shift)
        factors.append(e)
        moment_factors.append(e * centres[a][None, :])

    def contract(mats: list[np.ndarray]) -> np.ndarray:
        out = density
        for a, mat in enumerate(mats):   # axis a of `out` is still N_a: contract it with mat
            out = np.moveaxis(np.tensordot(mat, out, axes=([1], [a])), 0, a)
        return out

    total = contract(factors)
    table = np.empty((d,) + total.shape)
    for b in range(d):
        mats = [moment_factors[a] if a == b else factors[a] for a in range(d)]
        table[b] = contract(mats) / total
    return table


@nb.njit(**JIT)
def lagrange_weights(x: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Local Lagrange interpolation on the integer nodes: x (P,) in node units.

    Returns the first node index (P,) and the weights (P, order) of the ``order`` nodes
    around x (degree order - 1).
    """
    size = x.size
    first = np.empty(size, np.int64)
    weights = np.ones((size, order))
    for i in range(size):
        f = np.int64(np.floor(x[i])) - (order // 2 - 1)
        first[i] = f
        for j in range(order):
            w = 1.0
            for k in range(order):
                if k != j:
                    w *= (x[i] - (f + k)) / (j - k)
            weights[i, j] = w
    return first, weights


@nb.njit(parallel=True, **JIT)
def _interpolate_2d(table, first0, w0, first1, w1, out):
    order = w0.shape[1]
    for i in nb.prange(out.shape[0]):
        for b in range(table.shape[0]):
            acc = 0.0
            for j in range(order):
                row = 0.0
                for k in range(order):
                    row += w1[i, k] * table[b, first0[i] + j, first1[i] + k]
                acc += w0[i, j] * row
            out[i, b] = acc


@nb.njit(parallel=True, **JIT)
def _interpolate_3d(table, first0, w0, first1, w1, first2, w2, out):
    order = w0.shape[1]
    for i in nb.prange(out.shape[0]):
        for b in range(table.shape[0]):
            acc = 0.0
            for j in range(order):
                plane = 0.0
                for k in range(order):
                    row = 0.0
                    for m in range(order):
                        row += w2[i, m] * table[b, first0[i] + j, first1[i] + k, first2[i] + m]
                    plane += w1[i, k] * row
                acc += w0[i, j] * plane
            out[i, b] = acc


class SeparableTiltedMeans:
    """m(c) for any c inside a box of c values, from one separable table.

    bounds: (d, 2) lower / upper c per axis; nodes_per_axis: table size (m);
    order: points of the local interpolation per axis (default 8).
    """

    def __init__(self, density: np.ndarray, grid: Grid, bounds: np.ndarray,
                 nodes_per_axis: int, order: int = 8):
        self.order = int(order)
        lower, upper = np.asarray(bounds, float).T
        width = np.maximum(upper - lower, 1e-12)
        inner = max(int(nodes_per_axis), self.order)
        self.step = width / (inner - 1)
        pad = self.order // 2 + 1
        self.start = lower - pad * self.step
        count = inner + 2 * pad
        nodes = [self.start[a] + self.step[a] * np.arange(count) for a in range(grid.ndim)]
        self.table = mgf_table(density, grid, nodes)
        self.count = count

    def __call__(self, c: np.ndarray) -> np.ndarray:
        """m(c), c: (P, d) -> (P, d)."""
        c = np.asarray(c, float)
        d = c.shape[1]
        firsts, weights = [], []
        for a in range(d):
            first, w = lagrange_weights(np.ascontiguousarray((c[:, a] - self.start[a])
                                                             / self.step[a]), self.order)
            if first.min() < 0 or first.max() + self.order > self.count:
                raise ValueError("separable engine: a target c lies outside the table")
            firsts.append(first)
            weights.append(w)
        out = np.zeros_like(c)
        if d == 1:
            out[:, 0] = np.sum(weights[0] * self.table[0][firsts[0][:, None]
                                                         + np.arange(self.order)], axis=1)
        elif d == 2:
            _interpolate_2d(self.table, firsts[0], weights[0], firsts[1], weights[1], out)
        else:
            _interpolate_3d(self.table, firsts[0], weights[0], firsts[1], weights[1],
                            firsts[2], weights[2], out)
        return out
