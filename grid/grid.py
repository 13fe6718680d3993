"""Uniform Cartesian grids of cells in d = 1, 2, 3 token dimensions.

A :class:`Grid` knows geometry only: the box ``[lower, upper]``, the number of cells per
axis, the spacing ``h``, cell centres and edges, and the boundary mode of each axis. Densities
are plain ``numpy.ndarray`` of *cell averages* with shape ``grid.shape``; array index
``[i, j, k]`` is cell ``(x_i, y_j, z_k)`` (axis 0 is x).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

BOUNDARY_MODES = ("outflow", "periodic", "noflux")
AXIS_NAMES = ("x", "y", "z")


def _as_tuple(values, ndim: int, name: str, kind=float) -> tuple:
    arr = np.atleast_1d(np.asarray(values))
    if arr.ndim != 1:
        raise ValueError(f"grid.{name}: expected a list of {ndim} numbers, got shape {arr.shape}")
    if arr.size == 1 and ndim > 1:
        arr = np.repeat(arr, ndim)
    if arr.size != ndim:
        raise ValueError(f"grid.{name}: expected {ndim} entries (one per axis), got {arr.size}")
    return tuple(kind(v) for v in arr)


@dataclass(frozen=True)
class Grid:
    """A uniform grid of ``cells[a]`` cells on ``[lower[a], upper[a]]`` along each axis ``a``.

    Parameters
    ----------
    lower, upper : sequence of float, length d (1 <= d <= 3)
        Corners of the box.
    cells : sequence of int, length d (a scalar is broadcast to every axis)
        Number of cells per axis (>= 1; >= 7 for the five-point reconstructions).
    boundary : str or sequence of str
        ``"outflow"`` (mass that leaves is counted, nothing comes in), ``"periodic"`` or
        ``"noflux"`` (zero normal flux), one for all axes or one per axis.

    Examples
    --------
    >>> g = Grid([-6, -6], [6, 6], [128, 128])
    >>> g.spacing, g.cell_volume
    ((0.09375, 0.09375), 0.0087890625)
    """

    lower: tuple[float, ...]
    upper: tuple[float, ...]
    cells: tuple[int, ...]
    boundary: tuple[str, ...] = field(default=("outflow",))

    def __init__(
        self,
        lower: ArrayLike,
        upper: ArrayLike,
        cells: ArrayLike,
        boundary: str | Sequence[str] = "outflow",
    ):
        lower_arr = np.atleast_1d(np.asarray(lower, dtype=float))
        ndim = lower_arr.size
        if not 1 <= ndim <= 3:
            raise ValueError(f"grid.lower: 1 to 3 axes are supported, got {ndim}")
        lo = _as_tuple(lower, ndim, "lower")
        hi = _as_tuple(upper, ndim, "upper")
        n = _as_tuple(cells, ndim, "cells", kind=lambda v: int(v))
        if isinstance(boundary, str):
            boundary = (boundary,) * ndim
        if not (isinstance(boundary, Sequence) and all(isinstance(b, str) for b in boundary)):
            raise ValueError(
                f"grid.boundary: expected a mode name or one per axis "
                f"({', '.join(BOUNDARY_MODES)}), got {boundary!r:.60}"
            )
        bnd = tuple(boundary)
        if len(bnd) != ndim:
            raise ValueError(f"grid.boundary: expected 1 or {ndim} modes, got {len(bnd)}")
        for a in range(ndim):
            if not (np.isfinite(lo[a]) and np.isfinite(hi[a])):
                raise ValueError(f"grid.lower/upper: axis {a} has a non-finite bound")
            if not hi[a] > lo[a]:
                raise ValueError(
                    f"grid.upper: axis {a} needs upper > lower, got [{lo[a]}, {hi[a]}]"
                )
            if n[a] < 1:
                raise ValueError(f"grid.cells: axis {a} needs at least 1 cell, got {n[a]}")
            if bnd[a] not in BOUNDARY_MODES:
                raise ValueError(
                    f"grid.boundary: unknown mode {bnd[a]!r}; "
                    f"choose one of {', '.join(BOUNDARY_MODES)}"
                )
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)
        object.__setattr__(self, "cells", n)
        object.__setattr__(self, "boundary", bnd)

    # ---- geometry -------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """Number of token dimensions d."""
        return len(self.cells)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of a density array, ``cells``."""
        return self.cells

    @property
    def size(self) -> int:
        """Total number of cells."""
        return int(np.prod(self.cells))

    @property
    def spacing(self) -> tuple[float, ...]:
        """Cell widths ``h[a] = (upper[a] - lower[a]) / cells[a]``."""
        return tuple(
            (u - lo) / n for lo, u, n in zip(self.lower, self.upper, self.cells, strict=True)
        )

    @property
    def cell_volume(self) -> float:
        """Volume of one cell, ``prod(h)``."""
        return float(np.prod(self.spacing))

    @property
    def axis_names(self) -> tuple[str, ...]:
        return AXIS_NAMES[: self.ndim]

    def edges(self, axis: int) -> np.ndarray:
        """Cell edges along ``axis``, shape ``(cells[axis] + 1,)``."""
        return self.lower[axis] + self.spacing[axis] * np.arange(self.cells[axis] + 1)

    def centres(self, axis: int) -> np.ndarray:
        """Cell centres along ``axis``, shape ``(cells[axis],)``."""
        return self.lower[axis] + self.spacing[axis] * (np.arange(self.cells[axis]) + 0.5)

    def lattice(self, offset: ArrayLike) -> list[np.ndarray]:
        """Coordinates of the shifted lattice ``x_c + offset * h`` as one 1-D array per axis.

        ``offset[a]`` is in cell widths relative to the cell centres. An offset of +1/2 along
        ``a`` gives the cell faces; ``(cells[a] + 1)`` faces are returned then (including the
        lower boundary face at offset -1/2 of cell 0), otherwise ``cells[a]`` points.
        """
        offsets = np.asarray(offset, dtype=float)
        coords = []
        for a in range(self.ndim):
            off = float(offsets[a])
            if off == 0.5:
                coords.append(self.edges(a))
            else:
                coords.append(self.centres(a) + off * self.spacing[a])
        return coords

    def mesh(self, sparse: bool = True) -> list[np.ndarray]:
        """Cell-centre coordinates as broadcastable arrays (``numpy.meshgrid``, ``ij``)."""
        return list(
            np.meshgrid(*[self.centres(a) for a in range(self.ndim)], indexing="ij", sparse=sparse)
        )

    # ---- integration ----------------------------------------------------------------------
    def integrate(self, density: np.ndarray) -> float:
        """``sum(density) * cell_volume``: the exact integral of a field of cell averages."""
        return float(np.sum(density) * self.cell_volume)

    def measures(self) -> np.ndarray:
        """Each cell's measure (length, area, volume): ``cell_volume`` everywhere."""
        return np.full(self.shape, self.cell_volume)

    def moments(self, density: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Mass, mean and covariance (:func:`moments_of`, no h^2/12 bias)."""
        arr = np.asarray(density, dtype=np.float64)
        if arr.shape != self.shape:
            raise ValueError(f"moments.density: expected shape {self.shape}, got {arr.shape}")
        return moments_of(arr, self)

    def halo(self, values: np.ndarray, ghosts: int) -> np.ndarray:
        """``values`` (shape ``shape``) with ``ghosts`` ghost cells on both sides of every
        axis, from the axis' boundary mode (:func:`tpde.grid.stencils.ghost_index_map`:
        periodic wrap, noflux reflection, outflow zero gradient)."""
        out = np.asarray(values, float)
        for a, (n, mode) in enumerate(zip(self.cells, self.boundary, strict=True)):
            out = np.take(out, ghost_index_map(n, mode, ghosts), axis=a)
        return out

    def check_density(
        self, density: np.ndarray, name: str = "density", leading: tuple[int, ...] = ()
    ) -> np.ndarray:
        """Return ``density`` as a float64 array of shape ``leading + grid.shape`` (finite,
        >= 0), or raise ValueError. ``leading``: position slices (masked attention)."""
        arr = np.asarray(density, dtype=np.float64)
        if arr.shape != tuple(leading) + self.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(leading) + self.shape}, got {arr.shape}"
            )
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name}: contains NaN or Inf")
        if arr.min() < 0:
            raise ValueError(f"{name}: negative values (min {arr.min():.3e}); densities are >= 0")
        return arr

    # ---- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "lower": list(self.lower),
            "upper": list(self.upper),
            "cells": list(self.cells),
            "boundary": list(self.boundary),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Grid:
        return cls(data["lower"], data["upper"], data["cells"], data.get("boundary", "outflow"))

    @property
    def axis_attributes(self) -> dict[str, str]:
        """CF attributes a geometry adds to each coordinate axis (none for a flat box: its
        coordinates are the token space's)."""
        return {}

    @property
    def file_attributes(self) -> dict[str, object]:
        """Global attributes a geometry adds to the file (none for a flat box)."""
        return {}

    def describe(self) -> str:
        """One line for ``tpde info``: what the grid is, in the user's terms."""
        return (
            f"{self.ndim}-D grid {' x '.join(map(str, self.shape))} on "
            f"{[float(v) for v in self.lower]} .. {[float(v) for v in self.upper]}"
        )

    def state_lines(self, density: np.ndarray) -> list[str]:
        """Lines for ``tpde info`` about a density on this grid that only its geometry
        knows how to say (the circle: its clusters); none for a flat box."""
        return []

    def __repr__(self) -> str:
        return (
            f"Grid(lower={list(self.lower)}, upper={list(self.upper)}, "
            f"cells={list(self.cells)}, boundary={list(self.boundary)})"
        )


# ---- ghost cells and moments (tpde.grid.stencils and tpde.grid.moments build on these) ----
#: ghost cells per side the schemes' stencils read
GHOSTS = 3


def ghost_index_map(n: int, mode: str, ghosts: int = GHOSTS) -> np.ndarray:
    """Source cell of each padded position -ghosts .. n + ghosts - 1 (int64, length
    n + 2 ghosts; the schemes' stencils need 3)."""
    pos = np.arange(-ghosts, n + ghosts)
    if mode == "periodic":
        return np.mod(pos, n).astype(np.int64)
    if mode == "noflux":  # even reflection about the boundary faces
        idx = np.where(pos < 0, -pos - 1, pos)
        idx = np.where(idx >= n, 2 * n - idx - 1, idx)
        return np.clip(idx, 0, n - 1).astype(np.int64)
    return np.clip(pos, 0, n - 1).astype(np.int64)  # outflow: zero-gradient ghosts


MAX_POWER = 4


def deconvolved_monomial(x: np.ndarray, h: float, k: int) -> np.ndarray:
    """``q_k(x)`` with ``(1/h) int_{x-h/2}^{x+h/2} q_k(s) ds = x^k`` (``0 <= k <= 4``)."""
    x = np.asarray(x, dtype=np.float64)
    h2 = h * h
    if k == 0:
        return np.ones_like(x)
    if k == 1:
        return x.copy()
    if k == 2:
        return x * x - h2 / 12.0
    if k == 3:
        return x * (x * x - h2 / 4.0)
    if k == 4:
        x2 = x * x
        return x2 * x2 - 0.5 * h2 * x2 + 7.0 * h2 * h2 / 240.0
    raise ValueError(f"moments.powers: each power must be in 0..{MAX_POWER}, got {k}")


def _marginals(arr: np.ndarray) -> tuple[list[np.ndarray], dict]:
    """1-D marginal sums per axis and 2-D marginal sums per axis pair (a < b)."""
    d = arr.ndim
    if d == 1:
        return [arr], {}
    if d == 2:
        return [arr.sum(axis=1), arr.sum(axis=0)], {(0, 1): arr}
    m01 = arr.sum(axis=2)
    m02 = arr.sum(axis=1)
    m12 = arr.sum(axis=0)
    return [m01.sum(axis=1), m01.sum(axis=0), m02.sum(axis=0)], {
        (0, 1): m01,
        (0, 2): m02,
        (1, 2): m12,
    }


def moments_of(arr: np.ndarray, grid: Grid) -> tuple[float, np.ndarray, np.ndarray]:
    """``(mass, mean, covariance)`` of cell averages ``arr`` (shape ``grid.shape``) without
    the h^2/12 bias (:mod:`tpde.grid.moments`)."""
    d = grid.ndim
    vol = grid.cell_volume
    one, two = _marginals(arr)
    total = float(one[0].sum()) * vol
    if not total > 0:
        raise ValueError(f"moments.density: mass must be > 0 for a mean/covariance, got {total}")
    x = [grid.centres(a) for a in range(d)]
    h = grid.spacing
    mu = np.array([float(one[a] @ x[a]) * vol / total for a in range(d)])
    dx = [x[a] - mu[a] for a in range(d)]
    cov = np.empty((d, d))
    for a in range(d):
        cov[a, a] = float(one[a] @ deconvolved_monomial(dx[a], h[a], 2)) * vol / total
        for b in range(a + 1, d):
            cov[a, b] = cov[b, a] = float(dx[a] @ two[(a, b)] @ dx[b]) * vol / total
    return total, mu, cov
