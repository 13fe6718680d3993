"""Cells and atoms on a periodic 1-D grid (the circle): conversion, absorption, merging.

docs/theory.md, 'Cells plus atoms'.
After every step the solver moves mass between the cells and the atoms
(:class:`~tpde.schemes.atoms.Atoms`), always conserving the total mass, mean and covariance:
the cells' part is the measure ``rho dx`` with ``rho`` constant on each cell, whose moments
over a set ``J`` of cells of width ``h`` are exact:

    M = h sum_J rho_j,   a = h sum_J rho_j x_j / M,
    S = h sum_J rho_j (x_j - a)^2 / M + h^2 / 12

(angles unwrapped about the cluster). In this order:

1. **Absorption.** The cells within ``absorb`` cells of an atom's centre are its own: their
   moments join the atom (:func:`~tpde.schemes.atoms.merge_moments`) and they are emptied.
2. **Merging.** Atoms closer than ``merge`` cells, or than the sum of their standard
   deviations, become one with the moments of both.
3. **Conversion.** A local maximum of ``rho`` above ``level`` times the uniform density, its
   cells the contiguous run around it down to ``floor`` of the peak (and not past a local
   minimum), becomes an atom when the cells' standard deviation is below ``width`` cells: the
   run's exact moments go to the atom and its cells are emptied; the rest stays on the cells.
4. **Release.** An atom whose standard deviation has grown past ``release`` cells (a
   diverging field spreads it) goes back to the cells as the exact cell averages of its
   (wrapped) Gaussian: the cells resolve it again. Mass is exact; mean and covariance agree to
   the cell averages' ``O(h^2)``.

All functions are pure: they return new arrays and a new state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
from scipy.special import ndtr

from .atoms import AtomOptions, Atoms, merge_moments

__all__ = ["AtomTransfer", "PeriodicCells", "absorb", "convert", "merge", "release"]


@dataclass(frozen=True)
class PeriodicCells:
    """The geometry the transfers need: ``n`` cells of width ``h`` from ``lower``, period
    ``n h``."""

    lower: float
    h: float
    n: int

    @property
    def period(self) -> float:
        return self.n * self.h

    @property
    def centres(self) -> np.ndarray:
        return self.lower + (np.arange(self.n) + 0.5) * self.h

    def wrap(self, x: np.ndarray | float) -> np.ndarray:
        """Angles into ``[lower, lower + period)``."""
        return self.lower + np.mod(np.asarray(x, float) - self.lower, self.period)

    def offset(self, x: np.ndarray, origin: float) -> np.ndarray:
        """``x - origin`` on the circle, in ``[-period / 2, period / 2)``."""
        p = self.period
        return np.mod(np.asarray(x, float) - origin + 0.5 * p, p) - 0.5 * p


@dataclass(frozen=True)
class AtomTransfer:
    """One transfer, for the cluster tracks: ``kind`` ("atom_birth", "atom_merge",
    "atom_release"), its time, the atom's id, the ids it came from (a merge), its mass and
    centre."""

    kind: str
    time: float
    ident: int
    parents: tuple[int, ...]
    mass: float
    centre: float


def _cell_moments(rho: np.ndarray, cells: PeriodicCells, index: np.ndarray, origin: float):
    """Exact moments (mass, mean, variance) of the piecewise-constant cells ``index``."""
    h = cells.h
    m = rho[index] * h
    total = float(m.sum())
    x = origin + cells.offset(cells.centres[index], origin)
    mean = float(m @ x) / total
    var = float(m @ (x - mean) ** 2) / total + h * h / 12.0
    return total, mean, var


def absorb(
    rho: np.ndarray, cells: PeriodicCells, atoms: Atoms, options: AtomOptions
) -> tuple[np.ndarray, Atoms]:
    """Step 1 of the module docstring: each atom takes the mass of its cells."""
    if atoms.count == 0:
        return rho, atoms
    h = cells.h
    reach = int(math.ceil(options.absorb)) + 1
    if not _mass_near(rho, cells.lower, h, atoms.centre[:, 0], reach + 1, options.absorb * h):
        return rho, atoms  # (the usual step: decided before any array of the windows)
    a = atoms.centre[:, 0]
    home = np.floor((a - cells.lower) / h).astype(int)
    near = home[:, None] + np.arange(-reach, reach + 1)[None, :]  # (K, 2 reach + 1)
    x = cells.lower + (near + 0.5) * h  # unwrapped centres about each atom
    index = near % cells.n
    offsets = x - a[:, None]  # (K, W): the cells' centres from each atom
    inside = np.abs(offsets) <= options.absorb * h
    m = np.where(inside, rho[index], 0.0) * h  # (K, W): each atom's cells' masses, else 0
    # (np.add / np.logical_or .reduce: what .sum / np.any call, without their wrappers)
    gains = np.logical_or.reduce(m > 0.0, axis=1)  # (an atom with no mass near: as it was)
    if not gains.any():  # (nothing near any atom)
        return rho, atoms
    taken = index[inside]
    if np.bincount(taken).max() == 1:  # (the usual step: no cell near two atoms)
        return _absorb_apart(rho, cells, atoms, index, inside, offsets, m, gains)
    out = rho.copy()
    mass, centre, cov = atoms.mass.copy(), atoms.centre.copy(), atoms.cov.copy()
    for k in range(atoms.count):
        take = index[k][inside[k]]
        m = out[take] * h
        if not np.any(m > 0.0):
            continue
        # the atom plus its cells (piecewise constant): exact first two moments (1-D)
        d = x[k][inside[k]] - a[k]  # (offsets from the atom: no cancellation in S)
        total = mass[k] + m.sum()
        shift = (m @ d) / total
        second = mass[k] * cov[k, 0, 0] + m @ (d * d) + m.sum() * h * h / 12
        var = second / total - shift * shift
        mass[k], centre[k, 0], cov[k, 0, 0] = total, cells.wrap(a[k] + shift), var
        out[take] = 0.0
    return out, Atoms(mass, centre, cov, atoms.ids, atoms.born, atoms.parents)


def _absorb_apart(
    rho: np.ndarray,
    cells: PeriodicCells,
    atoms: Atoms,
    index: np.ndarray,
    inside: np.ndarray,
    offsets: np.ndarray,
    m: np.ndarray,
    gains: np.ndarray,
) -> tuple[np.ndarray, Atoms]:
    """:func:`absorb` for atoms whose cells are disjoint, all atoms at once: ``index``,
    ``inside``, ``offsets`` and ``m`` (K, W) are each atom's window, the mask of its cells,
    their centres' offsets from it and their masses (0 outside the mask); ``gains`` (K,) the
    atoms with mass near. The same exact moments as the loop, its sums row by row."""
    h = cells.h
    mass0, cov0 = atoms.mass, atoms.cov[:, 0, 0]
    added = np.add.reduce(m, axis=1)
    total = mass0 + added
    shift = np.add.reduce(m * offsets, axis=1) / total
    second = mass0 * cov0 + np.add.reduce(m * (offsets * offsets), axis=1) + added * h * h / 12
    var = second / total - shift * shift
    centre = atoms.centre.copy()
    cov = atoms.cov.copy()
    mass = np.where(gains, total, mass0)
    centre[:, 0] = np.where(gains, cells.wrap(atoms.centre[:, 0] + shift), atoms.centre[:, 0])
    cov[:, 0, 0] = np.where(gains, var, cov0)
    out = rho.copy()
    out[index[inside & gains[:, None]]] = 0.0
    return out, Atoms(mass, centre, cov, atoms.ids, atoms.born, atoms.parents)


def merge(
    atoms: Atoms, cells: PeriodicCells, options: AtomOptions, time: float, next_id: int
) -> tuple[Atoms, list[AtomTransfer], int]:
    """Step 2: merge every pair of atoms closer than their reach (nearest pair first)."""
    events: list[AtomTransfer] = []
    while atoms.count > 1:
        a = atoms.centre[:, 0]
        if not _pair_near(a, atoms.cov[:, 0, 0], cells.period, options.merge * cells.h):
            break  # (the usual step: decided before the matrix of gaps)
        sd = np.sqrt(atoms.cov[:, 0, 0])
        o = cells.offset(a, 0.0)  # (once: the rows' and the columns' are the same)
        gap = np.abs(o[:, None] - o[None, :])
        gap = np.minimum(gap, cells.period - gap)
        reach = np.maximum(options.merge * cells.h, sd[:, None] + sd[None, :])
        gap.flat[:: atoms.count + 1] = np.inf  # (the diagonal: an atom is not its own pair)
        near = gap < reach
        if not near.any():  # (the usual step: no pair, decided before any index work)
            break
        close = np.argwhere(near)
        i, j = min(close.tolist(), key=lambda p: gap[p[0], p[1]])
        origin = float(a[i])
        means = [[origin], [origin + float(cells.offset(a[j], origin))]]
        total, mean, cov = merge_moments(atoms.mass[[i, j]], means, atoms.cov[[i, j]])
        keep = np.ones(atoms.count, bool)
        keep[[i, j]] = False
        parents = (int(atoms.ids[i]), int(atoms.ids[j]))
        atoms = atoms.select(keep).appended(total, cells.wrap(mean), cov, next_id, time, parents)
        events.append(
            AtomTransfer("atom_merge", time, next_id, parents, total, float(cells.wrap(mean[0])))
        )
        next_id += 1
    return atoms, events, next_id


#: the compiled pre-checks widen their tests by this (relative), so that every case the
#: exact tests could take passes on to them: they only skip what is clearly nothing
PRECHECK_MARGIN = 1e-9


@numba.njit(cache=True)
def _mass_near(rho, lower, h, a, reach, radius):  # pragma: no cover - compiled
    """Whether any cell within ``radius`` (widened by :data:`PRECHECK_MARGIN`) of an atom's
    centre ``a`` (K,) holds mass, looking ``reach`` cells either side of its home cell: False
    only where :func:`absorb`'s windows have no cell with mass (its early return)."""
    n = rho.size
    wide = radius * (1.0 + PRECHECK_MARGIN)
    for k in range(a.size):
        home = int(math.floor((a[k] - lower) / h))
        for w in range(-reach, reach + 1):
            j = home + w
            if abs(lower + (j + 0.5) * h - a[k]) <= wide and rho[j % n] > 0.0:
                return True
    return False


@numba.njit(cache=True)
def _pair_near(a, var, period, least):  # pragma: no cover - compiled
    """Whether two atoms (centres ``a``, variances ``var``) may be within their merge reach
    ``max(least, sd_i + sd_j)`` on the circle of ``period`` (the test widened by
    :data:`PRECHECK_MARGIN`): False only where :func:`merge` finds no pair."""
    K = a.size
    for i in range(K):
        for j in range(i + 1, K):
            gap = abs(a[i] - a[j]) % period
            gap = min(gap, period - gap)
            reach = max(least, math.sqrt(var[i]) + math.sqrt(var[j]))
            if gap < reach * (1.0 + PRECHECK_MARGIN) + PRECHECK_MARGIN * period:
                return True
    return False


def convert(
    rho: np.ndarray,
    cells: PeriodicCells,
    atoms: Atoms,
    options: AtomOptions,
    time: float,
    next_id: int,
) -> tuple[np.ndarray, Atoms, list[AtomTransfer], int]:
    """Step 3: the narrow clusters of the cells become atoms (their exact moments)."""
    n, h = cells.n, cells.h
    total_mass = float(np.add.reduce(rho)) * h + atoms.total_mass
    level = options.level * total_mass / cells.period
    if not np.maximum.reduce(rho) > level:  # (the usual step once the clusters are atoms)
        return rho, atoms, [], next_id
    left, right = np.roll(rho, 1), np.roll(rho, -1)
    peaks = np.flatnonzero((rho > left) & (rho >= right) & (rho > level))
    out = rho.copy()
    events: list[AtomTransfer] = []
    for p in peaks[np.argsort(-rho[peaks])]:
        if out[p] <= level:  # (emptied by a larger neighbour's conversion)
            continue
        edge = options.floor * out[p]
        lo = hi = int(p)
        for _ in range(n - 1):  # down the left flank, not past a minimum
            nxt = (lo - 1) % n
            if out[nxt] < edge or out[nxt] > out[lo % n] or (hi - lo + 1) >= n:
                break
            lo -= 1
        for _ in range(n - 1):
            nxt = (hi + 1) % n
            if out[nxt] < edge or out[nxt] > out[hi % n] or (hi - lo + 1) >= n:
                break
            hi += 1
        index = np.arange(lo, hi + 1) % n
        mass, mean, var = _cell_moments(out, cells, index, float(cells.centres[p]))
        if math.sqrt(var) >= options.width * h:
            continue
        atoms = atoms.appended(mass, cells.wrap(mean), [[var]], next_id, time)
        events.append(AtomTransfer("atom_birth", time, next_id, (), mass, float(cells.wrap(mean))))
        next_id += 1
        out[index] = 0.0
    return out, atoms, events, next_id


def wrapped_normal_averages(cells: PeriodicCells, centre: float, var: float) -> np.ndarray:
    """Exact cell averages of the wrapped normal ``N(centre, var)`` (unit mass): the normal's
    mass in every cell and its images ``2 pi w`` for ``|w| <= 2``."""
    edges = cells.lower + np.arange(cells.n + 1) * cells.h
    sd = math.sqrt(var)
    mass = np.zeros(cells.n)
    for w in range(-2, 3):
        cdf = ndtr((edges - centre + w * cells.period) / sd)
        mass += np.diff(cdf)
    return mass / cells.h


def release(
    rho: np.ndarray, cells: PeriodicCells, atoms: Atoms, options: AtomOptions, time: float
) -> tuple[np.ndarray, Atoms, list[AtomTransfer]]:
    """Step 4: atoms wider than ``release`` cells go back to the cells."""
    if atoms.count == 0:
        return rho, atoms, []
    sd = np.sqrt(atoms.cov[:, 0, 0])
    wide = sd > options.release * cells.h
    if not np.logical_or.reduce(wide):
        return rho, atoms, []
    out = rho.copy()
    events = []
    for k in np.flatnonzero(wide):
        share = wrapped_normal_averages(cells, float(atoms.centre[k, 0]), float(atoms.cov[k, 0, 0]))
        out += atoms.mass[k] * share / (share.sum() * cells.h)  # (mass to round-off)
        events.append(
            AtomTransfer(
                "atom_release",
                time,
                int(atoms.ids[k]),
                (),
                float(atoms.mass[k]),
                float(atoms.centre[k, 0]),
            )
        )
    return out, atoms.select(~wide), events
