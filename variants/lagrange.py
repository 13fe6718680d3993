"""Local Lagrange interpolation on uniform nodes: the stencil shared by the table kernels.

ORDER points per axis (a compile-time constant of the numba kernels: fixed trip counts let
LLVM unroll and vectorise the stencil loops, about 3x faster than a runtime order). A point
at unit coordinate ``u`` (node index space) is interpolated from the nodes
``floor(u) - (ORDER/2 - 1) .. floor(u) + ORDER/2`` with the barycentric weights

    w_j = prod_{k != j} (s - k) / prod_{k != j} (j - k),   s = u - first,

computed in O(ORDER) by prefix and suffix products (no division).
"""

from __future__ import annotations

import numba as nb
import numpy as np

JIT = {"cache": True, "error_model": "numpy"}
#: interpolation points per axis
ORDER = 12
#: first stencil node relative to floor(u): the stencil covers floor(u) - LOW .. + HIGH
LOW = ORDER // 2 - 1
HIGH = ORDER // 2


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

