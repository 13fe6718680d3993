"""Cells and atoms on an N-D box (the co-moving frame's grid): conversion, absorption, merging.

docs/theory.md, 'Atoms in the co-moving frame'. The box analogue of :mod:`.atom_cells` (the
circle's), in frame coordinates, always conserving the total mass, mean and covariance: the
cells' part is ``rho dxi`` with ``rho`` constant on each cell, whose moments over a set ``J``
of cells (widths ``h_a``, volume ``dV``) are exact:

    M = dV sum_J rho_j,   a = dV sum_J rho_j x_j / M,
    S = dV sum_J rho_j (x_j - a)(x_j - a)^T / M + diag(h_a^2 / 12).

Widths are measured in cell units, ``H^-1 S H^-1`` with ``H = diag(h)``, by its largest
eigenvalue (the widest direction). In this order:

1. **Absorption.** The cells whose centres lie within ``absorb`` cells (in cell units) of an
   atom's centre join it (:func:`~.atoms.merge_moments`) and are emptied.
2. **Merging.** Atoms closer (in cell units) than ``merge`` or than the sum of their widest
   standard deviations become one with the moments of both.
3. **Conversion.** A local maximum of ``rho`` (over its face neighbours) above ``level``
   times the uniform density of the same mass, its cells the flood fill around it that only
   descends and stops below ``floor`` of the peak, becomes one atom with the cells' exact
   moments when (a) its widest standard deviation is below ``width`` cells and (b) it is
   separate from the rest: its covariance is below ``SEPARATE^2`` times the whole measure's
   in every direction. (b) keeps a single cluster (a Gaussian) on the cells, where the frame
   follows it exactly: the frame's covariance is the cluster's own, and no grid resolves a
   law narrower than itself better than the frame does.
4. **Release.** An atom whose widest standard deviation grows past ``release`` cells goes
   back to the cells as the exact cell averages of its Gaussian (renormalised to its mass
   where the box cuts it).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tpde.grid import Grid, gaussian

from .atoms import AtomOptions, Atoms, merge_moments

__all__ = [
    "SEPARATE",
    "BoxTransfer",
    "absorb",
    "cell_moments",
    "cluster",
    "convert",
    "merge",
    "peaks",
    "release",
    "transfer_all",
]

#: a cluster converts only when its standard deviation is below this fraction of the whole
#: measure's in every direction (step 3 (b) of the module docstring)
SEPARATE = 0.5


class BoxTransfer:
    """One transfer on the box, for the cluster tracks (the :class:`~.atom_run.Transfer`
    protocol): ``kind``, ``time``, ``ident``, ``parents``, ``mass`` and ``centre`` (d,),
    in frame coordinates."""

    __slots__ = ("kind", "time", "ident", "parents", "mass", "centre")

    def __init__(self, kind, time, ident, parents, mass, centre):
        self.kind, self.time, self.ident = str(kind), float(time), int(ident)
        self.parents = tuple(int(p) for p in parents)
        self.mass, self.centre = float(mass), np.asarray(centre, float).copy()


def _centres(grid: Grid) -> np.ndarray:
    """Every cell centre, (cells, d) in C order."""
    return np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)


def _width(cov: np.ndarray, h: np.ndarray) -> np.ndarray:
    """The widest standard deviation in cell units of covariances (..., d, d)."""
    scaled = cov / np.multiply.outer(h, h)
    return np.sqrt(np.maximum(np.linalg.eigvalsh(scaled)[..., -1], 0.0))


def cell_moments(
    rho: np.ndarray, grid: Grid, index: np.ndarray, centres: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """Exact (mass, mean (d,), covariance (d, d)) of the piecewise-constant cells ``index``
    (flat indices)."""
    h = np.asarray(grid.spacing, float)
    m = rho.reshape(-1)[index] * float(np.prod(h))
    x = centres[index]
    cov = np.broadcast_to(np.diag(h * h / 12.0), (index.size, h.size, h.size))
    return merge_moments(m, x, cov)


def absorb(rho: np.ndarray, grid: Grid, atoms: Atoms, options: AtomOptions):
    """Step 1: each atom takes the mass of the cells within ``absorb`` cells of it."""
    if atoms.count == 0:
        return rho, atoms
    h = np.asarray(grid.spacing, float)
    centres = _centres(grid)
    flat = rho.reshape(-1)
    out = None
    mass, centre, cov = atoms.mass.copy(), atoms.centre.copy(), atoms.cov.copy()
    for k in range(atoms.count):
        near = np.sqrt((((centres - centre[k]) / h) ** 2).sum(axis=1)) <= options.absorb
        take = np.flatnonzero(near & ((flat if out is None else out) > 0.0))
        if take.size == 0:
            continue
        if out is None:
            out = flat.copy()
        m, a, s = cell_moments(out.reshape(rho.shape), grid, take, centres)
        mass[k], centre[k], cov[k] = merge_moments([mass[k], m], [centre[k], a], [cov[k], s])
        out[take] = 0.0
    if out is None:
        return rho, atoms
    return out.reshape(rho.shape), Atoms(mass, centre, cov, atoms.ids, atoms.born, atoms.parents)


def merge(atoms: Atoms, grid: Grid, options: AtomOptions, time: float, next_id: int):
    """Step 2: merge every pair of atoms closer than their reach (nearest pair first)."""
    h = np.asarray(grid.spacing, float)
    events: list[BoxTransfer] = []
    while atoms.count > 1:
        units = atoms.centre / h
        gap = np.sqrt(((units[:, None, :] - units[None, :, :]) ** 2).sum(axis=2))
        sd = _width(atoms.cov, h)
        reach = np.maximum(options.merge, sd[:, None] + sd[None, :])
        gap.flat[:: atoms.count + 1] = np.inf
        near = gap < reach
        if not near.any():
            break
        close = np.argwhere(near)
        i, j = min(close.tolist(), key=lambda p: gap[p[0], p[1]])
        total, mean, cov = merge_moments(
            atoms.mass[[i, j]], atoms.centre[[i, j]], atoms.cov[[i, j]]
        )
        keep = np.ones(atoms.count, bool)
        keep[[i, j]] = False
        parents = (int(atoms.ids[i]), int(atoms.ids[j]))
        atoms = atoms.select(keep).appended(total, mean, cov, next_id, time, parents)
        events.append(BoxTransfer("atom_merge", time, next_id, parents, total, mean))
        next_id += 1
    return atoms, events, next_id


def peaks(rho: np.ndarray, level: float) -> np.ndarray:
    """Flat indices of the local maxima above ``level`` (strictly above the lower neighbour
    and at least the upper one along every axis; outside the box counts as 0), highest
    first."""
    is_peak = rho > level
    for axis in range(rho.ndim):
        pad = [(0, 0)] * rho.ndim
        pad[axis] = (1, 1)
        padded = np.pad(rho, pad)
        lower = np.take(padded, np.arange(0, rho.shape[axis]), axis=axis)
        upper = np.take(padded, np.arange(2, rho.shape[axis] + 2), axis=axis)
        is_peak &= (rho > lower) & (rho >= upper)
    found = np.flatnonzero(is_peak)
    return found[np.argsort(-rho.reshape(-1)[found], kind="stable")]


def cluster(rho: np.ndarray, peak: int, floor: float) -> np.ndarray:
    """The flood fill from ``peak`` (flat index) that only descends and keeps cells at least
    ``floor`` of the peak: flat indices."""
    shape = rho.shape
    flat = rho.reshape(-1)
    edge = floor * flat[peak]
    seen = np.zeros(flat.size, bool)
    seen[peak] = True
    queue = deque([peak])
    while queue:
        j = queue.popleft()
        here = np.unravel_index(j, shape)
        for axis in range(rho.ndim):
            for step in (-1, 1):
                q = list(here)
                q[axis] += step
                if not 0 <= q[axis] < shape[axis]:
                    continue
                n = int(np.ravel_multi_index(tuple(q), shape))
                if not seen[n] and edge <= flat[n] <= flat[j] and flat[n] > 0.0:
                    seen[n] = True
                    queue.append(n)
    return np.flatnonzero(seen)


def convert(
    rho: np.ndarray, grid: Grid, atoms: Atoms, options: AtomOptions, time: float, next_id: int
):
    """Step 3: the narrow, separate clusters of the cells become atoms (exact moments)."""
    h = np.asarray(grid.spacing, float)
    volume = float(np.prod(h))
    cells_mass = float(rho.sum()) * volume
    total_mass = cells_mass + atoms.total_mass
    box = float(np.prod(np.asarray(grid.upper, float) - np.asarray(grid.lower, float)))
    level = options.level * total_mass / box
    if not rho.max() > level or cells_mass <= 0.0:
        return rho, atoms, [], next_id
    centres = _centres(grid)
    # the whole measure's covariance (cells plus atoms): the separation test's scale
    m_all, a_all, s_all = cell_moments(rho, grid, np.flatnonzero(rho.reshape(-1) > 0), centres)
    if atoms.count:
        m_all, a_all, s_all = merge_moments(
            np.concatenate([[m_all], atoms.mass]),
            np.vstack([a_all[None], atoms.centre]),
            np.concatenate([s_all[None], atoms.cov]),
        )
    values, vectors = np.linalg.eigh(s_all)
    whiten = vectors / np.sqrt(np.maximum(values, 1e-300))  # S_all^-1/2 in its eigenbasis
    out = rho.reshape(-1).copy()
    events: list[BoxTransfer] = []
    for p in peaks(rho, level):
        if out[p] <= level:  # (emptied by a larger neighbour's conversion)
            continue
        index = cluster(out.reshape(rho.shape), int(p), options.floor)
        mass, mean, cov = cell_moments(out.reshape(rho.shape), grid, index, centres)
        if _width(cov, h) >= options.width:
            continue
        if np.linalg.eigvalsh(whiten.T @ cov @ whiten)[-1] >= SEPARATE**2:
            continue  # (one cluster that is most of the law: the frame follows it)
        atoms = atoms.appended(mass, mean, cov, next_id, time)
        events.append(BoxTransfer("atom_birth", time, next_id, (), mass, mean))
        next_id += 1
        out[index] = 0.0
    if not events:
        return rho, atoms, [], next_id
    return out.reshape(rho.shape), atoms, events, next_id


def release(rho: np.ndarray, grid: Grid, atoms: Atoms, options: AtomOptions, time: float):
    """Step 4: atoms wider than ``release`` cells go back to the cells (exact mass)."""
    if atoms.count == 0:
        return rho, atoms, []
    h = np.asarray(grid.spacing, float)
    wide = _width(atoms.cov, h) > options.release
    if not wide.any():
        return rho, atoms, []
    out = rho.copy()
    events = []
    volume = float(np.prod(h))
    for k in np.flatnonzero(wide):
        share = gaussian(grid, atoms.centre[k], atoms.cov[k])
        out += atoms.mass[k] * share / (share.sum() * volume)
        events.append(
            BoxTransfer("atom_release", time, atoms.ids[k], (), atoms.mass[k], atoms.centre[k])
        )
    return out, atoms.select(~wide), events


def transfer_all(rho: np.ndarray, grid: Grid, atoms: Atoms, options: AtomOptions, time, next_id):
    """Steps 1-4 in order: (rho, atoms, events, next_id)."""
    rho, atoms = absorb(rho, grid, atoms, options)
    atoms, merged, next_id = merge(atoms, grid, options, time, next_id)
    rho, atoms, born, next_id = convert(rho, grid, atoms, options, time, next_id)
    rho, atoms, released = release(rho, grid, atoms, options, time)
    return rho, atoms, merged + born + released, next_id
