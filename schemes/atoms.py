"""Atoms: weighted Gaussian points that carry the collapsed clusters of a measure.

docs/theory.md, 'Cells plus atoms'.
The measure is ``mu = rho dx + sum_k m_k N(a_k, S_k)``: a density on the cells plus atoms of
mass ``m_k``, centre ``a_k`` and covariance ``S_k``. The continuity equation is linear in
``mu`` for a given velocity, so every part moves with the same ``Gamma_mu``: the density by
the finite-volume scheme, each atom by the moments of a Gaussian carried by the field to
second order in its width,

    a' = Gamma(a) + 1/2 sum_ij S_ij d_i d_j Gamma(a),    S' = DGamma(a) S + S DGamma(a)^T,
    m' = 0,

exact for an affine ``Gamma`` (then a Gaussian stays one). The solver advances the atoms in
the same SSP-RK stages as the cells (:class:`Atoms` combines like a state vector); what each
variant adds to its kernel sums from the atoms is in the variant (the Gaussian moment
generating function, or its wrapped form on the circle).

This module holds what does not depend on the geometry: the state, its motion, the exact
combination of moments (a conversion, an absorption and a merge conserve mass, mean and
covariance), and the atoms' own kernel sums in flat space:

    int e^{c.y} N(a, S)(dy) = e^{c.a + c^T S c / 2},
    int y e^{c.y} N(a, S)(dy) = e^{c.a + c^T S c / 2} (a + S c).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "ATOM_EVENT_KINDS",
    "AtomOptions",
    "AtomRates",
    "Atoms",
    "atom_rates",
    "gaussian_log_mgf",
    "gaussian_tilted_mean",
    "merge_moments",
]

#: the kinds of event the atoms record (schemes.monitor.Event.kind)
ATOM_EVENT_KINDS = ("atom_birth", "atom_merge", "atom_release")


@dataclass(frozen=True)
class AtomRates:
    """``(a', S')`` of every atom: centre rates (K, d), covariance rates (K, d, d)."""

    centre: np.ndarray
    cov: np.ndarray


@dataclass(frozen=True)
class Atoms:
    """K atoms in d dimensions: ``mass`` (K,), ``centre`` (K, d), ``cov`` (K, d, d), ``ids``
    (K,) (an atom's number for its track: births and merges name atoms by it), ``born`` (K,)
    the time each was born or merged (NaN: given at the start), ``parents`` (K, 2) the ids a
    merged atom came from (-1: none). Immutable: every operation returns a new state."""

    mass: np.ndarray
    centre: np.ndarray
    cov: np.ndarray
    ids: np.ndarray
    born: np.ndarray
    parents: np.ndarray

    @staticmethod
    def empty(dim: int) -> Atoms:
        return Atoms(
            np.zeros(0),
            np.zeros((0, dim)),
            np.zeros((0, dim, dim)),
            np.zeros(0, int),
            np.zeros(0),
            np.zeros((0, 2), int),
        )

    @staticmethod
    def of(
        mass: ArrayLike,
        centre: ArrayLike,
        cov: ArrayLike,
        ids: ArrayLike,
        born: ArrayLike | None = None,
        parents: ArrayLike | None = None,
    ) -> Atoms:
        """Checked construction (shapes, finite values, mass > 0, symmetric cov >= 0);
        ``born`` NaN and ``parents`` -1 where not given."""
        m = np.asarray(mass, float).reshape(-1)
        k = m.size
        b = np.full(k, np.nan) if born is None else np.asarray(born, float).reshape(k)
        p = np.full((k, 2), -1, int) if parents is None else np.asarray(parents, int).reshape(k, 2)
        a = np.asarray(centre, float).reshape(k, -1)
        d = a.shape[1]
        s = np.asarray(cov, float).reshape(k, d, d)
        n = np.asarray(ids, int).reshape(-1)
        if n.shape != (k,) or len(set(n.tolist())) != k:
            raise ValueError(f"atoms: expected {k} distinct ids, got {n.tolist()}")
        if not (np.all(np.isfinite(m)) and np.all(np.isfinite(a)) and np.all(np.isfinite(s))):
            raise ValueError("atoms: mass, centre and covariance must be finite")
        if np.any(m <= 0):
            raise ValueError("atoms: every atom needs a mass > 0")
        if k and (
            np.abs(s - np.swapaxes(s, 1, 2)).max() > 1e-12 * max(1.0, np.abs(s).max())
            or np.linalg.eigvalsh(s).min() < -1e-14 * max(1.0, np.abs(s).max())
        ):
            raise ValueError("atoms: every covariance must be symmetric positive semidefinite")
        return Atoms(m, a, s, n, b, p)

    @property
    def count(self) -> int:
        return int(self.mass.size)

    @property
    def dim(self) -> int:
        return int(self.centre.shape[1])

    @property
    def total_mass(self) -> float:
        return float(np.add.reduce(self.mass))  # (.sum without its wrapper)

    def advanced(self, rates: AtomRates, dt: float) -> Atoms:
        """The Euler step ``(a + dt a', S + dt S')`` (one term of an SSP-RK stage)."""
        return Atoms(
            self.mass,
            self.centre + dt * rates.centre,
            self.cov + dt * rates.cov,
            self.ids,
            self.born,
            self.parents,
        )

    @staticmethod
    def combination(weights: list[float], terms: list[Atoms]) -> Atoms:
        """``sum_j w_j terms_j`` for centres and covariances (the convex combinations of the
        SSP-RK stages); the terms are the same atoms (same ids and masses)."""
        first = terms[0]
        centre = weights[0] * first.centre
        cov = weights[0] * first.cov
        for w, t in zip(weights[1:], terms[1:], strict=True):  # (in place: no temporaries)
            centre += w * t.centre
            cov += w * t.cov
        return Atoms(first.mass, centre, cov, first.ids, first.born, first.parents)

    def select(self, keep: np.ndarray) -> Atoms:
        return Atoms(
            self.mass[keep],
            self.centre[keep],
            self.cov[keep],
            self.ids[keep],
            self.born[keep],
            self.parents[keep],
        )

    def appended(
        self,
        mass: float,
        centre: ArrayLike,
        cov: ArrayLike,
        ident: int,
        born: float = math.nan,
        parents: tuple[int, int] = (-1, -1),
    ) -> Atoms:
        d = self.dim
        return Atoms(
            np.append(self.mass, mass),
            np.vstack([self.centre, np.asarray(centre, float).reshape(1, d)]),
            np.concatenate([self.cov, np.asarray(cov, float).reshape(1, d, d)]),
            np.append(self.ids, int(ident)),
            np.append(self.born, float(born)),
            np.vstack([self.parents, np.asarray(parents, int).reshape(1, 2)]),
        )

    def moved(self, centre: np.ndarray) -> Atoms:
        """The same atoms at other centres (K, d)."""
        return Atoms(self.mass, centre, self.cov, self.ids, self.born, self.parents)

    def replaced(self, index: int, mass: float, centre: ArrayLike, cov: ArrayLike) -> Atoms:
        m, a, s = self.mass.copy(), self.centre.copy(), self.cov.copy()
        m[index], a[index], s[index] = mass, np.asarray(centre).reshape(-1), cov
        return Atoms(m, a, s, self.ids, self.born, self.parents)


def atom_rates(
    velocity: np.ndarray, jacobian: np.ndarray, hessian: np.ndarray, cov: np.ndarray
) -> AtomRates:
    """The moments of a Gaussian carried by ``Gamma`` to second order in its width.

    velocity (K, d): ``Gamma(a)``; jacobian (K, d, d): ``[k, i, j] = d_j Gamma_i(a)``;
    hessian (K, d, d, d): ``[k, i, j, l] = d_j d_l Gamma_i(a)``; cov (K, d, d): ``S``.
    Returns ``a' = Gamma + 1/2 S : D^2 Gamma`` and ``S' = DGamma S + S DGamma^T``.
    """
    if cov.shape[1] == 1:  # (1-D, every stage: the one-term sums as products, bit for bit)
        s = cov[:, 0, :]
        js = jacobian * cov
        return AtomRates(velocity + 0.5 * (s * hessian[:, 0, 0]), js + js)
    centre = velocity + 0.5 * np.einsum("kjl,kijl->ki", cov, hessian)
    js = np.einsum("kij,kjl->kil", jacobian, cov)
    return AtomRates(centre, js + np.swapaxes(js, 1, 2))


def merge_moments(
    masses: ArrayLike, means: ArrayLike, covs: ArrayLike
) -> tuple[float, np.ndarray, np.ndarray]:
    """Mass, mean and covariance of a sum of parts (masses (K,), means (K, d), covs (K, d, d)):
    ``M = sum m``, ``a = sum m a_k / M``, ``S = sum m (S_k + (a_k - a)(a_k - a)^T) / M``
    (exact: the sum's first two moments are the parts' summed)."""
    m = np.asarray(masses, float).reshape(-1)
    a = np.asarray(means, float).reshape(m.size, -1)
    s = np.asarray(covs, float).reshape(m.size, a.shape[1], a.shape[1])
    total = float(m.sum())
    mean = m @ a / total
    offset = a - mean
    cov = (np.einsum("k,kij->ij", m, s) + np.einsum("k,ki,kj->ij", m, offset, offset)) / total
    return total, mean, 0.5 * (cov + cov.T)


def gaussian_log_mgf(c: np.ndarray, centre: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """``log int e^{c.y} N(a, S)(dy) = c.a + c^T S c / 2`` for tilts c (P, d) and one atom
    (centre (d,), cov (d, d)): shape (P,)."""
    return c @ centre + 0.5 * np.einsum("pi,ij,pj->p", c, cov, c)


def gaussian_tilted_mean(c: np.ndarray, centre: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """The mean of the tilted atom, ``int y e^{c.y} dN / int e^{c.y} dN = a + S c``: (P, d)."""
    return centre[None, :] + c @ cov.T


@dataclass
class AtomOptions:
    """When cells become atoms and atoms merge (docs/theory.md, 'Cells plus atoms').

    width : a cluster (the cells around a local maximum down to ``floor`` of it) becomes an
        atom when its standard deviation is below ``width`` cells (default 2).
    floor : the cells of a cluster reach down to this fraction of its peak (default 1e-2);
        what lies below stays on the cells and joins the atom when it flows in.
    level : only maxima above ``level`` times the uniform density of the same mass count.
    absorb : the cells within ``absorb`` cells of an atom's centre are its own: after every
        step their mass joins it (default 2).
    merge : two atoms merge when their centres are closer than ``merge`` cells or the sum of
        their standard deviations (default 0.5).
    release : an atom whose standard deviation grows past ``release`` cells goes back to the
        cells as exact cell averages of its Gaussian (default 4: resolved again).
    """

    width: float = 2.0
    floor: float = 1e-2
    level: float = 2.0
    absorb: float = 2.0
    merge: float = 0.5
    release: float = 4.0

    def validate(self) -> None:
        for option in fields(self):
            value = getattr(self, option.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"atoms.{option.name}: expected a number, got {value!r:.40}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"atoms.{option.name}: must be a number > 0, got {value!r}")
        if not self.floor < 1:
            raise ValueError(f"atoms.floor: must be in (0, 1), got {self.floor!r}")
        if not self.release > self.width:
            raise ValueError(
                f"atoms.release: must exceed atoms.width = {self.width} (else an atom is "
                "released as soon as it forms)"
            )
