"""Cells plus atoms on the circle against tokens: clusters, merge times, the energy staircase.

docs/theory.md, 'Cells plus atoms'.
A run with atoms (:mod:`tpde.schemes.atoms`) holds its collapsed clusters as weighted
Gaussian points; the tokens (:class:`.sphere_tokens.CircleTokens`, the law's mid-quantiles:
the mean field without sampling noise) are the reference. Both are counted the same way: the
measure's histogram on one coarse counting grid (the atoms' wrapped normals integrated over
its cells exactly, the cells' masses summed into it) and the local maxima above twice the
uniform density (:func:`tpde.grid.circle.clusters`), so that a merge time means the same for
both. The energy of cells plus atoms is :func:`tpde.variants.circle_atoms.energy_with_atoms`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import vonmises

from tpde.grid import Grid
from tpde.grid.circle import TWO_PI, circle_grid, clusters, uniform_modes, von_mises_mixture

from .circle_metastability import merge_times, quantile_tokens, token_clusters, token_energy
from .sphere_tokens import CircleTokens, inverse_cdf

__all__ = [
    "atom_clusters",
    "atom_run",
    "atoms_against_tokens",
    "measure_histogram",
    "mixture_quantile_tokens",
    "plateau_gaps",
    "plateau_windows",
]


def measure_histogram(density: np.ndarray, grid: Grid, atoms, counting: Grid) -> np.ndarray:
    """Cell averages of cells plus atoms on the whole-circle grid ``counting`` (its cell count
    divides the run's): the cells' masses summed, the atoms' exact wrapped-normal masses."""
    from tpde.schemes.atom_cells import PeriodicCells, wrapped_normal_averages

    n, m = grid.cells[0], counting.cells[0]
    if n % m:
        raise ValueError(f"counting: {m} cells do not divide the run's {n}")
    mass = np.asarray(density, float).reshape(m, n // m).sum(axis=1) * grid.spacing[0]
    bins = PeriodicCells(float(counting.lower[0]), float(counting.spacing[0]), m)
    for k in range(0 if atoms is None else atoms.count):
        var = max(float(atoms.cov[k, 0, 0]), 1e-300)
        share = wrapped_normal_averages(bins, float(atoms.centre[k, 0]), var) * bins.h
        mass = mass + atoms.mass[k] * share
    return mass / counting.spacing[0]


def atom_clusters(
    density: np.ndarray, grid: Grid, atoms, counting: Grid
) -> tuple[np.ndarray, np.ndarray]:
    """The clusters of cells plus atoms, counted as :func:`.circle_metastability.
    token_clusters` counts tokens (on ``counting``)."""
    return clusters(measure_histogram(density, grid, atoms, counting), counting)


def mixture_quantile_tokens(n: int, components: Sequence[tuple[float, float, float]]) -> np.ndarray:
    """The ``n`` mid-quantile tokens ``F^{-1}((i - 1/2) / n)`` of the von Mises mixture
    ``sum_j w_j VM(mean_j, kappa_j)`` (``(weight, mean, kappa)``; weights normalised)."""
    total = sum(w for w, _, _ in components)
    parts = [(w / total, mu, kappa) for w, mu, kappa in components]

    def cdf(x: np.ndarray) -> np.ndarray:
        return sum(
            w * (vonmises.cdf(x, kappa, loc=mu) - vonmises.cdf(0.0, kappa, loc=mu))
            for w, mu, kappa in parts
        )

    def pdf(x: np.ndarray) -> np.ndarray:
        return sum(w * vonmises.pdf(x, kappa, loc=mu) for w, mu, kappa in parts)

    u = (np.arange(n) + 0.5) / n
    return inverse_cdf(cdf, pdf, u, 0.0, TWO_PI, TWO_PI * u)


def atom_run(
    beta: float,
    initial: np.ndarray,
    grid: Grid,
    times: np.ndarray,
    options=None,
    grid_step: float = 0.1,
):
    """``A = beta I``, ``V = I`` on ``grid`` from ``initial`` with atoms on (``options``, an
    :class:`tpde.schemes.atoms.AtomOptions`; default ones when None): the solver's Result."""
    from tpde.schemes.atoms import AtomOptions
    from tpde.schemes.solver import Problem, Scheme, Solver
    from tpde.variants.spherical import CircleAttention, circle_head

    problem = Problem(
        grid,
        initial,
        CircleAttention(circle_head(beta), engine="fft"),
        float(times[-1]),
        scheme=Scheme(dt_max=grid_step),
        snapshots=list(times),
        atoms=AtomOptions() if options is None else options,
    )
    return Solver(problem).run()


def atoms_against_tokens(
    beta: float,
    t_end: float,
    cells: Sequence[int],
    n: int,
    modes: Sequence[tuple[int, float, float]] | None = None,
    components: Sequence[tuple[float, float, float]] | None = None,
    spacing: float = 0.1,
    dt: float = 0.1,
    count_cells: int = 128,
    options=None,
) -> dict[str, Any]:
    """Cells plus atoms (each of ``cells``) against ``n`` mid-quantile tokens of the same law:
    ``(1 + sum a cos(k (theta - p))) / (2 pi)`` (``modes``) or a von Mises mixture
    (``components``), to ``t_end``, snapshots every ``spacing``.

    Returns the times, per run (``"mid"``, ``"<cells>"``) the cluster counts on the counting
    grid and the energies in units of a point mass's (``e^beta / (2 beta)``), the merge times
    (:func:`.circle_metastability.merge_times`), the results (cell runs) and the tokens."""
    from tpde.variants.circle_atoms import energy_with_atoms
    from tpde.variants.spherical import circle_head

    if (modes is None) == (components is None):
        raise ValueError("initial: give modes or components")
    times = np.round(np.arange(0.0, float(t_end) + 0.5 * spacing, spacing), 12)
    counting = circle_grid(count_cells)
    scale = math.exp(beta) / (2.0 * beta)
    if modes is not None:
        theta = quantile_tokens(n, modes)
    else:
        assert components is not None
        theta = mixture_quantile_tokens(n, components)
    start = time.perf_counter()
    tokens = CircleTokens(theta, circle_head(beta)).integrate(times, dt)
    out: dict[str, Any] = {"times": times, "tokens": tokens, "results": {}, "grids": {}}
    out["wall mid"] = time.perf_counter() - start
    out["clusters mid"] = [int(token_clusters(a, counting)[0].size) for a in tokens]
    out["E mid"] = [token_energy(a, beta) / scale for a in tokens]
    for c in cells:
        grid = circle_grid(c)
        if modes is not None:
            initial = uniform_modes(grid, modes)
        else:
            assert components is not None
            initial = von_mises_mixture(grid, components)
            initial = initial / (grid.integrate(initial))
        start = time.perf_counter()
        result = atom_run(beta, initial, grid, times, options)
        out[f"wall {c}"] = time.perf_counter() - start
        out["results"][c] = result
        out["grids"][c] = grid
        snaps = result.snapshots
        out[f"clusters {c}"] = [
            int(atom_clusters(s.density, grid, s.atoms, counting)[0].size) for s in snaps
        ]
        out[f"E {c}"] = [energy_with_atoms(s.density, grid, beta, s.atoms) / scale for s in snaps]
    for key in ["mid"] + [str(c) for c in cells]:
        out[f"merges {key}"] = merge_times(times, out[f"clusters {key}"])
    return out


def plateau_gaps(
    times: np.ndarray, energy: Sequence[float], reference: Sequence[float], windows
) -> list[tuple[float, float, float]]:
    """Per plateau window ``(t0, t1)``: the largest ``|E - E_ref|`` over its snapshots and the
    ``(t0, t1, gap)``."""
    t = np.asarray(times)
    e, r = np.asarray(energy), np.asarray(reference)
    rows = []
    for t0, t1 in windows:
        inside = (t >= t0 - 1e-9) & (t <= t1 + 1e-9)
        rows.append((float(t0), float(t1), float(np.abs(e[inside] - r[inside]).max())))
    return rows


def plateau_windows(
    times: np.ndarray, counts: Sequence[int], margin: float, start: float = 0.0
) -> list[tuple[float, float]]:
    """The plateaus of a cluster count: the maximal intervals from ``start`` on over which
    ``counts`` (at ``times``) stays constant and positive, each cut by ``margin`` at both
    ends (the merges and the formation between them are not plateaus); the windows left
    longer than ``margin``, as ``(t0, t1)`` for :func:`plateau_gaps`."""
    t, c = np.asarray(times, float), np.asarray(counts, int)
    keep = t >= start
    t, c = t[keep], c[keep]
    windows = []
    edges = np.flatnonzero(np.diff(c)) + 1
    for lo, hi in zip(np.r_[0, edges], np.r_[edges, c.size], strict=True):
        t0, t1 = t[lo] + margin, t[hi - 1] - margin
        if c[lo] > 0 and t1 - t0 > margin:
            windows.append((float(t0), float(t1)))
    return windows
