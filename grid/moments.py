"""Moments of a density given by cell averages, without the O(h^2) centre-rule error.

A cell average is the box-filtered density, ``rho_bar = B * rho`` sampled at the centres. For
smooth, rapidly decaying ``rho`` the midpoint sum is spectrally accurate, so
``h * sum_c rho_bar_c q(x_c) ~= int (B * rho) q = int rho (B * q)``. To get ``int rho p`` for a
polynomial ``p`` we therefore sum ``q`` with ``B * q = p`` (per axis, ``B`` = average over one
cell width ``h``)::

    p = 1    : q0 = 1
    p = x    : q1 = x
    p = x^2  : q2 = x^2 - h^2/12
    p = x^3  : q3 = x^3 - h^2 x / 4
    p = x^4  : q4 = x^4 - h^2 x^2 / 2 + 7 h^4 / 240

Monomials factor over axes, so ``x_a x_b`` (a != b) needs no correction. The naive rule
``sum rho_bar_c x_c^2`` over-estimates the second moment by ``h^2/12`` times the mass per axis.
The correction assumes the density decays to ~0 before the box edges (no mass piled up at a
boundary); otherwise the error is O(h^2) at worst, as for the naive rule.

All functions accept a density of shape ``grid.shape`` (negative values allowed) and make one
contraction pass per axis with 1-D weight vectors; no full-size temporaries are built.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .grid import MAX_POWER, Grid, deconvolved_monomial
from .grid import moments_of as _moments

__all__ = ["covariance", "deconvolved_monomial", "mass", "mean", "moments", "raw_moment"]


def _check(density, grid: Grid) -> np.ndarray:
    if not isinstance(grid, Grid):
        raise ValueError(f"moments.grid: expected a tpde.grid.Grid, got {type(grid).__name__}")
    arr = np.asarray(density, dtype=np.float64)
    if arr.shape != grid.shape:
        raise ValueError(f"moments.density: expected shape {grid.shape}, got {arr.shape}")
    return arr


def _contract(arr: np.ndarray, vectors: Sequence[np.ndarray]) -> float:
    """``sum_{ijk} arr[i,j,k] v0[i] v1[j] v2[k]``, contracting the last axis first."""
    out = arr
    for v in reversed(vectors):
        out = out @ v
    return float(out)


def mass(density: np.ndarray, grid: Grid) -> float:
    """``int rho = cell_volume * sum(rho_bar)`` (exact for cell averages)."""
    arr = _check(density, grid)
    return float(arr.sum()) * grid.cell_volume


def raw_moment(
    density: np.ndarray, grid: Grid, powers: Sequence[int], origin: Sequence[float] | None = None
) -> float:
    """``int rho(x) prod_a (x_a - origin_a)^powers[a] dx`` (not divided by the mass).

    ``powers`` has one integer in ``0..4`` per axis; ``origin`` defaults to 0. Uses the
    deconvolved polynomials ``q_k`` (module docstring), so the result is spectrally accurate for
    smooth decaying densities.
    """
    arr = _check(density, grid)
    d = grid.ndim
    p = list(np.atleast_1d(np.asarray(powers)).tolist())
    if len(p) != d or any(int(k) != k or not 0 <= int(k) <= MAX_POWER for k in p):
        raise ValueError(f"moments.powers: expected {d} integers in 0..{MAX_POWER}, got {powers}")
    o = np.zeros(d) if origin is None else np.asarray(origin, dtype=np.float64).reshape(-1)
    if o.shape != (d,) or not np.all(np.isfinite(o)):
        raise ValueError(f"moments.origin: expected {d} finite numbers, got {origin}")
    vecs = [
        deconvolved_monomial(grid.centres(a) - o[a], grid.spacing[a], int(p[a])) for a in range(d)
    ]
    return _contract(arr, vecs) * grid.cell_volume


def mean(density: np.ndarray, grid: Grid) -> np.ndarray:
    """Mean ``int x rho / int rho``, shape ``(d,)``."""
    return _moments(_check(density, grid), grid)[1]


def covariance(density: np.ndarray, grid: Grid) -> np.ndarray:
    """Central covariance ``int (x - m)(x - m)^T rho / int rho``, shape ``(d, d)``.

    Diagonal entries use ``(x_c - m)^2 - h^2/12``; off-diagonal entries need no correction.
    """
    return _moments(_check(density, grid), grid)[2]


def moments(density: np.ndarray, grid: Grid) -> tuple[float, np.ndarray, np.ndarray]:
    """``(mass, mean (d,), covariance (d, d))`` in one pass over the array."""
    return _moments(_check(density, grid), grid)
