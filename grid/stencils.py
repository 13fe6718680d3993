"""Stencils on cell averages: ghost index maps and average-to-point interpolation.

Shared by the schemes (face states, transverse Gauss nodes) and the attention variants (point
values of the density for kernel sums).
"""

from __future__ import annotations

import numpy as np

from .grid import GHOSTS, Grid, ghost_index_map

__all__ = ["GHOSTS", "average_to_point_weights", "ghost_index_map", "point_values"]


def average_to_point_weights(offset: float, radius: int = 2) -> np.ndarray:
    """Weights c_m (m = -radius..radius) with sum_m c_m avg_m(p) = p(offset) for all
    polynomials of degree <= 2 radius.

    ``avg_m`` is the average over the unit cell centred at m; ``offset`` is in cell widths.
    """
    m = np.arange(-radius, radius + 1, dtype=float)
    degree = np.arange(2 * radius + 1)
    hi = (m[None, :] + 0.5) ** (degree[:, None] + 1)
    lo = (m[None, :] - 0.5) ** (degree[:, None] + 1)
    moments = (hi - lo) / (degree[:, None] + 1)
    return np.linalg.solve(moments, float(offset) ** degree)


def point_values(density: np.ndarray, grid: Grid) -> np.ndarray:
    """Point values at the cell centres from cell averages, eighth order per axis.

    rho(x_c) = sum_m w_m rho_bar_{c+m}, m = -3..3 (exact for polynomials of degree <= 7),
    applied axis by axis with the grid's ghost cells. Can be slightly negative next to steep
    features of non-negative data.
    """
    weights = average_to_point_weights(0.0, radius=GHOSTS)
    out = np.asarray(density, dtype=float)
    for axis, n in enumerate(grid.cells):
        padded = np.take(out, ghost_index_map(n, grid.boundary[axis]), axis=axis)
        result = np.zeros_like(out)
        for m in range(2 * GHOSTS + 1):
            index = [slice(None)] * out.ndim
            index[axis] = slice(m, m + n)
            result += weights[m] * padded[tuple(index)]
        out = result
    return out
