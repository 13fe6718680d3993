"""Optimal transport on the sphere S^2: exact W2 between cubed-sphere densities and tokens.

docs/theory.md, 'Energy, harmonics and W2 on the sphere'. The cost is the squared geodesic
distance, ``d(x, y)^2 = arccos(<x, y>)^2``; both measures are discrete (a density as atoms,
tokens as themselves) and ``W_2^2`` is the value of the exact linear program of the transport
between them (POT's network simplex, ``ot.emd2``). A density of cell averages is taken as
piecewise constant and replaced by ``k x k`` atoms a cell (``per_side = k``): the centres of
the sub-cells of equal angular width, each with the exact area of its sub-cell times the
cell's density, which moves every point of mass by at most the sub-cell's half-diagonal,
about ``h / (k sqrt 2)`` (``h = pi / (2 n)``), so ``W_2`` changes by at most that much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tpde.grid.cubed_sphere import CubedSphere, to_sphere

__all__ = ["density_atoms", "grid_token_w2", "sphere_w2"]


def density_atoms(
    grid: CubedSphere, density: np.ndarray, per_side: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Atoms ``(6 n^2 k^2, 3)`` and their masses (summing to 1) of the piecewise-constant
    density of cell averages: ``k x k`` sub-cells of every cell (module docstring)."""
    k = int(per_side)
    if k < 1:
        raise ValueError(f"transport.per_side: expected an integer >= 1, got {per_side!r}")
    rho = np.asarray(density, float)
    if rho.shape != grid.shape or not np.all(np.isfinite(rho)):
        raise ValueError(f"transport: expected a finite density of shape {grid.shape}")
    edges = -0.25 * math.pi + (grid.h / k) * np.arange(grid.n * k + 1)
    t = np.tan(edges)
    corner = np.arctan(t[:, None] * t[None, :] / np.sqrt(1 + t[:, None] ** 2 + t[None, :] ** 2))
    area = corner[1:, 1:] - corner[:-1, 1:] - corner[1:, :-1] + corner[:-1, :-1]  # (nk, nk)
    mid = 0.5 * (edges[1:] + edges[:-1])
    points = to_sphere(np.arange(6)[:, None, None], mid[None, :, None], mid[None, None, :])
    fine = np.repeat(np.repeat(np.maximum(rho, 0.0), k, axis=1), k, axis=2)  # (6, nk, nk)
    masses = (fine * area[None]).reshape(-1)
    if not masses.sum() > 0:
        raise ValueError("transport: the density has no mass")
    return points.reshape(-1, 3), masses / masses.sum()


def sphere_w2(
    a: np.ndarray,
    b: np.ndarray,
    weights_a: np.ndarray | None = None,
    weights_b: np.ndarray | None = None,
) -> float:
    """Exact ``W_2`` on the sphere between the discrete measures ``sum_i a_w_i delta_{a_i}`` and
    ``sum_j b_w_j delta_{b_j}`` (uniform weights by default): the square root of the optimal
    value of the transport LP with the cost ``arccos(<a_i, b_j>)^2``."""
    import ot

    x = np.asarray(a, float).reshape(-1, 3)
    y = np.asarray(b, float).reshape(-1, 3)
    wa = np.full(x.shape[0], 1.0 / x.shape[0]) if weights_a is None else np.asarray(weights_a)
    wb = np.full(y.shape[0], 1.0 / y.shape[0]) if weights_b is None else np.asarray(weights_b)
    wa = np.asarray(wa, float) / np.sum(wa)
    wb = np.asarray(wb, float) / np.sum(wb)
    keep_a, keep_b = wa > 0, wb > 0
    x, wa, y, wb = x[keep_a], wa[keep_a], y[keep_b], wb[keep_b]
    cost = np.arccos(np.clip(x @ y.T, -1.0, 1.0)) ** 2
    value = float(ot.emd2(wa, wb, cost, numItermax=10_000_000))
    return math.sqrt(max(value, 0.0))


def grid_token_w2(
    grid: CubedSphere,
    densities: Sequence[np.ndarray],
    token_sets: Sequence[np.ndarray],
    per_side: int = 3,
) -> list[dict]:
    """Per snapshot ``i``: ``W_2`` from the density ``densities[i]`` (atoms of
    :func:`density_atoms`) to each token set ``token_sets[s][i]`` (``(seeds, T, n, 3)``) and
    the tokens' own sampling noise, ``W_2`` between every pair of seeds (mean and largest)."""
    rows = []
    seeds = len(token_sets)
    for i, rho in enumerate(densities):
        atoms, masses = density_atoms(grid, rho, per_side)
        to_grid = [sphere_w2(atoms, s[i], masses) for s in token_sets]
        pairs = [
            sphere_w2(token_sets[p][i], token_sets[q][i])
            for p in range(seeds)
            for q in range(p + 1, seeds)
        ]
        rows.append(
            {
                "grid": to_grid,
                "noise": float(np.mean(pairs)) if pairs else math.nan,
                "noise_max": float(np.max(pairs)) if pairs else math.nan,
            }
        )
    return rows
