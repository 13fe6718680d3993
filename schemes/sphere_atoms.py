"""Atoms on the sphere S^2: von Mises-Fisher points that carry the collapsed clusters.

docs/theory.md, 'Atoms on the sphere'. The measure is ``mu = rho dA + sum_k m_k vMF(a_k,
kappa_k)``: cell averages on the cubed sphere plus atoms of mass ``m_k``, mean direction
``a_k`` (a unit vector) and concentration ``kappa_k``. The state keeps the *spread*
``s = 1 / kappa`` (the tangent variance per direction of a concentrated vMF), so a collapsed
atom (``s ~ 1e-100``) loses nothing to round-off. The atom's share of the attention sums is
exact (``C(k) = k / (4 pi sinh k)``):

    int e^{<c, y>} dvMF(a, kappa)(y) = C(kappa) / C(r),      r = |kappa a + c|,
    int y e^{<c, y>} dvMF / int e^{<c, y>} dvMF = L(r) (kappa a + c) / r,
    L(r) = coth r - 1 / r,

computed as ``log(kappa / r) + (r - kappa) + log(1 - e^{-2r}) - log(1 - e^{-2 kappa})`` with
``r - kappa = (2 <a, c> + |c|^2 / kappa) / (|a + c / kappa| + 1)`` (no cancellation, no
overflow at any kappa). Motion (second order in the width, in the exponential coordinates
``xi`` of the tangent plane at ``a``, ``V(xi) = v(exp_a xi)``):

    a' = (1 + s) v(a) + (s / 2) P_a Lap V(0),     s' = s tr DV(0),

(``d/dt E[X] = E[v(X)]`` with ``E[X] = (1 - s) a + O(s^2)``; ``S' = D S + S D^T`` for ``S = s
I``, its isotropic part), ``DV`` and ``Lap V`` by central differences of the field at four
probes ``exp_a(+- PROBE e_j)`` around the centre. Transfers conserve the mass and the first
moment ``int x dmu`` (so the mean direction and the mean resultant length that sets kappa):
a part is ``(m, d, q)``, its direction ``d`` and deficit ``q = 1 - |E X|`` (``1 - coth kappa
+ 1 / kappa`` for an atom, ``1 - |mean of x over the cell|`` for a cell), merged by
:func:`merge_parts` without cancellation.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numba
import numpy as np
from numpy.typing import ArrayLike

from tpde.grid import cubed_sphere as cs

from .atom_run import describe as describe_transfer
from .atoms import AtomOptions

__all__ = [
    "PROBE",
    "SphereAtomRun",
    "SphereCells",
    "SphereTransfer",
    "VMFAtoms",
    "deficit",
    "kappa_of_deficit",
    "merge_parts",
    "probe_points",
    "vmf_cubature",
    "vmf_diffused_spread",
    "vmf_log_mgf",
    "vmf_sums",
    "vmf_sums_reference",
    "vmf_rates",
    "vmf_tilted_mean",
]

#: the probes' distance from an atom's centre (radians): the central differences' truncation
#: (PROBE^2 beta ~ 2e-7 at beta = 16) against the sums' noise over PROBE (3e-13 / 1e-4)
PROBE = 1e-4
#: below this the deficit's series in kappa is used (1 - A(kappa), A ~ kappa / 3)
SMALL_KAPPA = 1e-4
#: from this ``r`` on ``tanh r`` and ``1 - e^{-2 r}`` are 1 in double precision (``e^{-40}
#: < 2^-57``): the share's compiled terms skip them; below it, the numpy form serves
FLAT_TAIL = 20.0


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """``log(1 - e^{-x})`` for ``x > 0``."""
    return np.log(-np.expm1(-x))


def vmf_log_mgf(c: np.ndarray, centre: np.ndarray, kappa: np.ndarray) -> tuple:
    """``log int e^{<c, y>} dvMF(a, kappa)``, ``r`` and ``(kappa a + c) / r`` for tilts
    ``c (P, 3)`` and atoms ``centre (K, 3)``, ``kappa (K,)``: shapes ``(P, K)``, ``(P, K)``,
    ``(P, K, 3)`` (module docstring's stable form)."""
    log, r, norm_w = _log_mgf(c, centre, kappa)
    a = np.asarray(centre, float)
    w = a[None, :, :] + c[:, None, :] / np.asarray(kappa, float)[None, :, None]
    return log, r, w / norm_w[..., None]


def _log_mgf(c: np.ndarray, centre: np.ndarray, kappa) -> tuple:
    """``log MGF``, ``r`` and ``|a + c / kappa|`` ``(P, K)``, without ``(P, K, 3)`` arrays:
    ``|a + c / kappa|^2 = 1 + 2 <a, c> / kappa + |c|^2 / kappa^2``."""
    k = np.asarray(kappa, float)[None, :]
    ac = c @ np.asarray(centre, float).T  # <a, c>  (P, K)
    cc = (c[:, 0] * c[:, 0] + c[:, 1] * c[:, 1] + c[:, 2] * c[:, 2])[:, None]
    norm_w = np.sqrt(np.maximum(1.0 + (2.0 * ac + cc / k) / k, 0.0))
    gap = (2.0 * ac + cc / k) / (norm_w + 1.0)  # r - kappa
    r = k * norm_w
    log = -np.log1p(gap / k) + gap + _log1mexp(2.0 * r) - _log1mexp(2.0 * k)
    return log, r, norm_w


def vmf_sums(
    c: np.ndarray, centre: np.ndarray, kappa: np.ndarray, mass: np.ndarray, shift: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``sum_k m_k e^{log MGF_k(c) - shift}`` ``(P,)`` and the same times each tilted mean,
    summed ``(P, 3)``: ``L(r) (kappa a + c) / r = L(r) (a + c / kappa) / |a + c / kappa|``,
    so the sum is ``coef @ a + c sum_k coef_k / kappa_k`` (``(P, K)`` arrays only).

    The ``(P, K)`` terms ``share`` and ``coef`` come from one compiled pass
    (:func:`_vmf_terms`: the operations of :func:`vmf_sums_reference` in its order, so the
    same values bit for bit where numpy's ``exp`` and ``log1p`` are libm's; on machines where
    numpy has its own SIMD loops for them (AVX-512) each term may differ by an ulp or so)
    wherever every ``r >= FLAT_TAIL``
    (where ``log(1 - e^{-2r})`` is 0 and ``tanh r`` is 1 exactly: a concentrated atom);
    otherwise the numpy form of :func:`vmf_sums_reference` serves."""
    centre = np.asarray(centre, float)
    kappa = np.asarray(kappa, float)
    c = np.asarray(c, float)
    ac = c @ centre.T  # <a, c>  (P, K), as _log_mgf's
    cc = c[:, 0] * c[:, 0] + c[:, 1] * c[:, 1] + c[:, 2] * c[:, 2]
    if kappa.size > _PAIRWISE_BLOCK:  # (numpy's row sums recurse beyond its block)
        return vmf_sums_reference(c, centre, kappa, mass, shift)
    z = np.empty(ac.shape[0])
    coef = np.empty_like(ac)
    tail = _log1mexp(2.0 * kappa)
    if not _vmf_terms(ac, cc, kappa, np.asarray(mass, float), np.asarray(shift, float),
                      tail, z, coef):  # fmt: skip
        return vmf_sums_reference(c, centre, kappa, mass, shift)
    g = coef @ centre + c * (coef @ (1.0 / kappa))[:, None]
    return z, g


def vmf_sums_reference(
    c: np.ndarray, centre: np.ndarray, kappa: np.ndarray, mass: np.ndarray, shift: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`vmf_sums` in numpy alone (its reference, and its form where an atom is wide)."""
    log, r, norm_w = _log_mgf(c, centre, kappa)
    share = mass[None, :] * np.exp(log - shift[:, None])
    coef = share * _langevin(r) / norm_w
    g = coef @ np.asarray(centre, float) + c * (coef @ (1.0 / np.asarray(kappa, float)))[:, None]
    return share.sum(axis=1), g


#: numpy's pairwise sum adds a row of up to this many terms in one unrolled pass
_PAIRWISE_BLOCK = 128


@numba.njit(cache=True)
def _vmf_terms(ac, cc, kappa, mass, shift, tail, z, coef):  # pragma: no cover - compiled
    """``z[p] = sum_k share[p, k]``, ``share[p, k] = m_k e^{log MGF_k(c_p) - shift_p}``, and
    ``coef = share L(r) / |a + c / kappa|`` from ``ac = <a_k, c_p>``, ``cc = |c_p|^2`` and
    ``tail = log(1 - e^{-2 kappa})``, each as :func:`_log_mgf` and
    :func:`vmf_sums_reference` evaluate it (same operations, same order, ``log(1 - e^{-2r})
    = 0`` and ``tanh r = 1`` for ``r >= FLAT_TAIL``), the row sums in numpy's pairwise order
    (below 8 terms one after another; else eight partial sums over blocks of 8, added
    ``((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))``, then the rest one by one; ``K <=
    _PAIRWISE_BLOCK``). First the divisions and roots of every term (a loop the compiler
    vectorises: IEEE division and square root are exact to the bit in any width), then the
    logarithms and exponentials. False (the arrays unfinished) where some ``r <
    FLAT_TAIL``."""
    P, K = ac.shape
    norm_w = np.empty((P, K))
    gap = np.empty((P, K))
    inner = np.empty((P, K))  # gap / kappa, log1p's argument
    least = np.inf
    for p in range(P):
        cp = cc[p]
        for k in range(K):
            kk = kappa[k]
            t = 2.0 * ac[p, k] + cp / kk
            v = 1.0 + t / kk
            if v < 0.0:  # (np.maximum: NaN stays NaN)
                v = 0.0
            w = math.sqrt(v)
            g = t / (w + 1.0)
            norm_w[p, k] = w
            gap[p, k] = g
            inner[p, k] = g / kk
            least = min(least, kk * w)
    if not least >= FLAT_TAIL:
        return False
    share = np.empty(K)
    partial = np.empty(8)
    for p in range(P):
        sp = shift[p]
        for k in range(K):
            log = (-math.log1p(inner[p, k]) + gap[p, k]) - tail[k]
            s = mass[k] * math.exp(log - sp)
            share[k] = s
            r = kappa[k] * norm_w[p, k]
            coef[p, k] = s * (1.0 - 1.0 / r) / norm_w[p, k]
        if K < 8:
            total = 0.0
            for k in range(K):
                total += share[k]
        else:
            for j in range(8):
                partial[j] = share[j]
            i = 8
            while i < K - K % 8:
                for j in range(8):
                    partial[j] += share[i + j]
                i += 8
            total = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + (
                (partial[4] + partial[5]) + (partial[6] + partial[7])
            )
            while i < K:
                total += share[i]
                i += 1
        z[p] = total
    return True


def _langevin(r: np.ndarray) -> np.ndarray:
    """``L(r) = coth r - 1 / r`` (series below 1e-3)."""
    small = r < 1e-3
    safe = np.where(small, 1.0, r)
    out = 1.0 / np.tanh(safe) - 1.0 / safe
    return np.where(small, r / 3.0 - r**3 / 45.0, out)


def vmf_tilted_mean(c: np.ndarray, centre: np.ndarray, kappa: np.ndarray) -> np.ndarray:
    """``int y e^{<c, y>} dvMF / int e^{<c, y>} dvMF`` ``(P, K, 3)``."""
    _, r, u = vmf_log_mgf(c, centre, kappa)
    return _langevin(r)[..., None] * u


def deficit(kappa: ArrayLike) -> np.ndarray:
    """``q = 1 - A(kappa) = 1 - coth kappa + 1 / kappa = 1 / kappa - 2 / (e^{2 kappa} - 1)``."""
    k = np.asarray(kappa, float)
    small = k < SMALL_KAPPA
    safe = np.where(small, 1.0, k)
    out = 1.0 / safe - 2.0 / np.expm1(np.minimum(2.0 * safe, 700.0))
    return np.where(small, 1.0 - k / 3.0 + k**3 / 45.0, out)


def kappa_of_deficit(q: ArrayLike) -> np.ndarray:
    """The kappa with ``deficit(kappa) = q`` (``0 < q < 1``): Newton from ``1 / q`` (exact
    for ``kappa > 20``, where ``e^{-2 kappa}`` is below round-off) or from Banerjee et al.'s
    ``A (3 - A^2) / (1 - A^2)``."""
    q = np.asarray(q, float)
    a = 1.0 - q
    k = np.where(q < 0.05, 1.0 / q, a * (3.0 - a * a) / np.maximum(1.0 - a * a, 1e-300))
    for _ in range(40):
        big = k > 20.0
        if np.all(big):
            break
        e = np.exp(-2.0 * np.minimum(k, 700.0))
        slope = -1.0 / (k * k) + 4.0 * e / np.expm1(-2.0 * k) ** 2
        step = (deficit(k) - q) / slope
        k = np.where(big, k, np.maximum(k - step, 0.5 * k))
    return np.where(k > 20.0, 1.0 / q, k)


def vmf_diffused_spread(spread: ArrayLike, variance: float) -> np.ndarray:
    """The spread ``1 / kappa'`` of a vMF atom after the heat substep ``exp(tau eps Delta)``,
    ``variance = 2 eps tau`` (docs/theory.md, 'Atoms with noise on the sphere').

    The coordinates ``x`` are degree-1 harmonics (``Delta x = -2 x``), so the heat flow
    takes the atom's first moment ``m A(kappa) a`` to ``m A(kappa) e^{-2 eps tau} a`` exactly
    (``A = 1 - deficit``): mass and mean direction stay, and ``kappa'`` is the one with
    ``A(kappa') = A(kappa) e^{-variance}``, i.e. the deficit ``q' = q - (1 - q)
    expm1(-variance)`` (no cancellation at a collapsed atom's ``q ~ 1e-100``). For a narrow
    atom ``s' = 1 - (1 - s) e^{-variance} = s + 2 eps tau + O(s eps tau, (eps tau)^2)``; the
    degree-2 harmonic of the vMF then agrees with the heat flow's to second order in ``(s,
    eps tau)`` (the vMF family is closed under the heat flow to that order): the law's error
    per substep is third order. Shape (K,)."""
    q = deficit(1.0 / np.asarray(spread, float))
    return 1.0 / kappa_of_deficit(q - (1.0 - q) * math.expm1(-float(variance)))


def merge_parts(
    masses: ArrayLike, directions: ArrayLike, deficits: ArrayLike
) -> tuple[float, np.ndarray, float]:
    """Mass ``M``, direction and deficit ``Q = 1 - |R|`` of a sum of parts, ``R = sum w_i
    (1 - q_i) d_i``, ``w = m / M`` (the first moment summed exactly). ``1 - |R|^2 = 2 qbar -
    qbar^2 + B sum b |d - e|^2 - |sum b (d - e)|^2`` (``b = w (1 - q)``, ``B = sum b``, ``e``
    the direction of ``R``): every term is small and positive where the parts are close, so
    ``Q`` has no cancellation even at ``Q ~ 1e-100``."""
    m = np.asarray(masses, float).reshape(-1)
    d = np.asarray(directions, float).reshape(m.size, 3)
    q = np.asarray(deficits, float).reshape(m.size)
    total = float(np.sum(m))
    w = m / total
    b = w * (1.0 - q)
    moment = b @ d
    e = moment / np.linalg.norm(moment)
    qbar = float(w @ q)
    offset = d - e
    spread = float(np.sum(b)) * float(b @ np.sum(offset * offset, axis=1))
    spread -= float(np.sum((b @ offset) ** 2))
    # sum_ij w_i w_j (q_i + q_j - q_i q_j) = 2 qbar - qbar^2 (sum w = 1)
    one_minus_r2 = 2.0 * qbar - qbar * qbar + max(spread, 0.0)
    r = math.sqrt(max(1.0 - one_minus_r2, 0.0))
    return total, e, one_minus_r2 / (1.0 + r)


def vmf_cubature(
    centre: np.ndarray, kappa: float, radial: int = 24, azimuth: int = 32
) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``(Q, 3)`` and weights ``(Q,)`` (sum 1) of ``vMF(centre, kappa)``: Gauss-Laguerre
    in ``u = kappa (1 - <a, y>)`` (density ``e^{-u} / (1 - e^{-2 kappa})`` on ``[0, 2 kappa]``)
    for ``kappa > 50``, else Gauss-Legendre in ``t = <a, y>`` times the density; the azimuth
    by the trapezoid rule."""
    a = np.asarray(centre, float)
    if kappa > 50.0:
        u, wu = np.polynomial.laguerre.laggauss(radial)
        keep = u < 2.0 * kappa
        u, wu = u[keep], wu[keep]
        t = 1.0 - u / kappa
        wt = wu / -math.expm1(-2.0 * kappa)
    else:
        x, wx = np.polynomial.legendre.leggauss(8 * radial)
        t = x
        wt = wx * kappa * np.exp(kappa * (x - 1.0)) / (-math.expm1(-2.0 * kappa))
    # 1 - t^2 from u without cancellation (t near 1)
    sin = np.sqrt(np.maximum((1.0 - t) * (1.0 + t), 0.0))
    e1, e2 = _frame(a)
    phi = 2.0 * math.pi * (np.arange(azimuth) + 0.5) / azimuth
    nodes = (
        t[:, None, None] * a
        + (sin[:, None] * np.cos(phi)[None, :])[..., None] * e1
        + (sin[:, None] * np.sin(phi)[None, :])[..., None] * e2
    )
    weights = np.repeat(wt[:, None] / azimuth, azimuth, axis=1)
    return nodes.reshape(-1, 3), weights.reshape(-1) / float(np.sum(weights))


def _frame(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An orthonormal frame ``e1, e2`` of the tangent plane at the unit vector ``a``.

    The norm is ``sqrt((e_0^2 + e_1^2) + e_2^2)`` written out, as :func:`_frames` forms it:
    ``numpy.linalg.norm`` of a vector is BLAS's dot product, whose rounding depends on the
    machine (fused multiply-adds on AVX-512), so the two would differ in the last bit there."""
    helper = np.array([1.0, 0.0, 0.0]) if abs(a[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    e1 = helper - (helper @ a) * a
    e1 /= math.sqrt((e1[0] * e1[0] + e1[1] * e1[1]) + e1[2] * e1[2])
    return e1, np.cross(a, e1)


@numba.njit(cache=True)
def _frames(centre, out):  # pragma: no cover - compiled
    """``out[i] = _frame(centre[i])`` ``(K, 2, 3)`` in one pass, in numpy's operations: the
    helper's dot product is ``a_0`` or ``a_1`` exactly, the norm ``sqrt((e_0^2 + e_1^2) +
    e_2^2)``, the cross product's components as :func:`numpy.cross` forms them."""
    for i in range(centre.shape[0]):
        a0, a1, a2 = centre[i, 0], centre[i, 1], centre[i, 2]
        if abs(a0) < 0.9:  # helper (1, 0, 0)
            e0, e1, e2 = 1.0 - a0 * a0, 0.0 - a0 * a1, 0.0 - a0 * a2
        else:  # helper (0, 1, 0)
            e0, e1, e2 = 0.0 - a1 * a0, 1.0 - a1 * a1, 0.0 - a1 * a2
        norm = math.sqrt((e0 * e0 + e1 * e1) + e2 * e2)
        e0, e1, e2 = e0 / norm, e1 / norm, e2 / norm
        out[i, 0, 0], out[i, 0, 1], out[i, 0, 2] = e0, e1, e2
        out[i, 1, 0] = a1 * e2 - a2 * e1
        out[i, 1, 1] = a2 * e0 - a0 * e2
        out[i, 1, 2] = a0 * e1 - a1 * e0


def probe_points(centre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The centres and their four probes ``exp_a(+- PROBE e_j)``: points ``(K, 5, 3)`` and the
    frames ``(K, 2, 3)``."""
    k = centre.shape[0]
    frames = np.empty((k, 2, 3))
    _frames(np.ascontiguousarray(centre, float), frames)
    c, s = math.cos(PROBE), math.sin(PROBE)
    points = np.empty((k, 5, 3))
    points[:, 0] = centre
    for j in range(2):
        points[:, 1 + 2 * j] = c * centre + s * frames[:, j]
        points[:, 2 + 2 * j] = c * centre - s * frames[:, j]
    return points, frames


def vmf_rates(
    velocity: np.ndarray, frames: np.ndarray, spread: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(a', s')`` from the tangent velocities at the probes ``velocity (K, 5, 3)``
    (:func:`probe_points`' order), the frames ``(K, 2, 3)`` and ``s (K,)`` (module
    docstring)."""
    v0 = velocity[:, 0]
    plus = velocity[:, 1::2]  # (K, 2, 3): +e1, +e2
    minus = velocity[:, 2::2]
    centred = (plus - minus) / (2.0 * PROBE)  # d_j V
    divergence = np.sum(centred * frames, axis=(1, 2))  # sum_j <e_j, d_j V>
    laplacian = np.sum(plus + minus, axis=1) - 4.0 * v0
    laplacian /= PROBE * PROBE
    return (1.0 + spread)[:, None] * v0 + 0.5 * spread[:, None] * laplacian, spread * divergence


@dataclass(frozen=True)
class VMFAtoms:
    """K atoms on the sphere: ``mass`` (K,), ``centre`` (K, 3) unit vectors (off the sphere by
    O(dt^2) inside a step; :meth:`normalised`), ``spread`` (K,) ``= 1 / kappa``, ``ids``,
    ``born`` (NaN: given at the start), ``parents`` (K, 2) (-1: none)."""

    mass: np.ndarray
    centre: np.ndarray
    spread: np.ndarray
    ids: np.ndarray
    born: np.ndarray
    parents: np.ndarray

    @staticmethod
    def empty() -> VMFAtoms:
        return VMFAtoms(
            np.zeros(0), np.zeros((0, 3)), np.zeros(0), np.zeros(0, int), np.zeros(0),
            np.zeros((0, 2), int),
        )  # fmt: skip

    @property
    def count(self) -> int:
        return int(self.mass.size)

    @property
    def total_mass(self) -> float:
        return float(np.sum(self.mass))

    @property
    def kappa(self) -> np.ndarray:
        return 1.0 / self.spread

    @property
    def directions(self) -> np.ndarray:
        return self.centre / np.linalg.norm(self.centre, axis=1, keepdims=True)

    def normalised(self) -> VMFAtoms:
        return VMFAtoms(self.mass, self.directions, self.spread, self.ids, self.born, self.parents)

    def with_moments(
        self, mass: float, mean: np.ndarray, second: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """The mass, first moment ``int x dmu`` (3,) and second moment ``int x x^T dmu``
        (3, 3) of the cells' (``mass``, ``mean``, ``second``) plus the atoms', exactly: an
        atom's first moment is ``m A(kappa) a`` (``A = 1 - deficit``) and its second
        ``m ((A / kappa) I + (1 - 3 A / kappa) a a^T)`` (trace ``m``; ``A / kappa = A s`` has
        no division and tends to 1/3 as ``kappa -> 0``)."""
        first = (1.0 - deficit(self.kappa)) * self.mass
        ratio = (1.0 - deficit(self.kappa)) * self.spread
        u = self.directions
        mass = mass + self.total_mass
        mean = mean + first @ u
        second = second + np.sum(self.mass * ratio) * np.eye(3)
        second = second + np.einsum("k,ki,kj->ij", self.mass * (1.0 - 3.0 * ratio), u, u)
        return mass, mean, second

    def advanced(self, rates: tuple[np.ndarray, np.ndarray], dt: float) -> VMFAtoms:
        return VMFAtoms(
            self.mass,
            self.centre + dt * rates[0],
            self.spread + dt * rates[1],
            self.ids,
            self.born,
            self.parents,
        )

    @staticmethod
    def combination(weights: list[float], terms: list[VMFAtoms]) -> VMFAtoms:
        first = terms[0]
        centre = weights[0] * first.centre
        spread = weights[0] * first.spread
        for w, t in zip(weights[1:], terms[1:], strict=True):
            centre = centre + w * t.centre
            spread = spread + w * t.spread
        return VMFAtoms(first.mass, centre, spread, first.ids, first.born, first.parents)

    def select(self, keep: np.ndarray) -> VMFAtoms:
        return VMFAtoms(
            self.mass[keep], self.centre[keep], self.spread[keep], self.ids[keep],
            self.born[keep], self.parents[keep],
        )  # fmt: skip

    def appended(
        self, mass: float, centre, spread: float, ident: int, born: float = math.nan,
        parents: tuple[int, int] = (-1, -1),
    ) -> VMFAtoms:  # fmt: skip
        return VMFAtoms(
            np.append(self.mass, mass),
            np.vstack([self.centre, np.asarray(centre, float).reshape(1, 3)]),
            np.append(self.spread, spread),
            np.append(self.ids, int(ident)),
            np.append(self.born, float(born)),
            np.vstack([self.parents, np.asarray(parents, int).reshape(1, 2)]),
        )

    def replaced(self, index: int, mass: float, centre, spread: float) -> VMFAtoms:
        m, a, s = self.mass.copy(), self.centre.copy(), self.spread.copy()
        m[index], a[index], s[index] = mass, centre, spread
        return VMFAtoms(m, a, s, self.ids, self.born, self.parents)


@dataclass(frozen=True)
class SphereTransfer:
    """One transfer for the cluster tracks (as :class:`~.atom_cells.AtomTransfer`, the
    centre a unit vector)."""

    kind: str
    time: float
    ident: int
    parents: tuple[int, ...]
    mass: float
    centre: np.ndarray


class SphereCells:
    """What the transfers need of a cubed sphere: flat cell centres ``(N, 3)``, areas, the
    direction and deficit of each cell's mean of ``x`` (exact quadrature), the neighbours
    within ``1.5 h`` (padded with -1), ``h``."""

    def __init__(self, grid: cs.CubedSphere):
        from scipy.spatial import cKDTree

        self.grid = grid
        self.h = grid.h
        self.centres = grid.centres_3d().reshape(-1, 3)
        self.areas = grid.areas.reshape(-1)

        def component(k: int):
            return lambda x: x[..., k]

        mean = np.stack([cs.cell_averages(grid, component(k)).reshape(-1) for k in range(3)], 1)
        norm = np.linalg.norm(mean, axis=1)
        self.directions = mean / norm[:, None]
        self.deficits = 1.0 - norm
        tree = cKDTree(self.centres)
        lists = tree.query_ball_point(self.centres, 1.5 * grid.h)
        width = max(len(x) for x in lists)
        self.neighbours = np.full((self.centres.shape[0], width - 1), -1, int)
        for i, near in enumerate(lists):
            others = [j for j in near if j != i]
            self.neighbours[i, : len(others)] = others

    def moments(self, rho: np.ndarray, index: np.ndarray) -> tuple[float, np.ndarray, float]:
        """``(M, direction, deficit)`` of the cells ``index`` of the flat density ``rho``."""
        return merge_parts(rho[index] * self.areas[index], self.directions[index],
                           self.deficits[index])  # fmt: skip


def _merge_atom_cells(atoms: VMFAtoms, k: int, rho, cells: SphereCells, index) -> tuple:
    m = np.concatenate([[atoms.mass[k]], rho[index] * cells.areas[index]])
    d = np.vstack([atoms.directions[k : k + 1], cells.directions[index]])
    q = np.concatenate([deficit(atoms.kappa[k : k + 1]), cells.deficits[index]])
    return merge_parts(m, d, q)


def _spread_of(q: float) -> float:
    return float(1.0 / kappa_of_deficit(q))


def absorb(rho: np.ndarray, cells: SphereCells, atoms: VMFAtoms, options: AtomOptions):
    """Each atom takes the mass of the cells within ``absorb`` cells of its centre (the
    nearest atom where two reach a cell); ``rho`` flat."""
    if atoms.count == 0:
        return rho, atoms
    dots = cells.centres @ atoms.directions.T  # (N, K)
    nearest = np.argmax(dots, axis=1)
    near = dots[np.arange(dots.shape[0]), nearest] > math.cos(options.absorb * cells.h)
    near &= rho > 0.0
    if not near.any():
        return rho, atoms
    out = rho.copy()
    for k in np.unique(nearest[near]):
        index = np.flatnonzero(near & (nearest == k))
        mass, e, q = _merge_atom_cells(atoms, int(k), out, cells, index)
        atoms = atoms.replaced(int(k), mass, e, _spread_of(q))
        out[index] = 0.0
    return out, atoms


def merge(atoms: VMFAtoms, cells: SphereCells, options: AtomOptions, time: float, next_id: int):
    """Merge every pair of atoms closer than ``merge`` cells or the sum of their widths
    ``sqrt(s)`` (nearest pair first)."""
    events: list[SphereTransfer] = []
    while atoms.count > 1:
        a = atoms.directions
        gap = np.linalg.norm(a[:, None, :] - a[None, :, :], axis=-1)  # chord ~ angle
        sd = np.sqrt(atoms.spread)
        reach = np.maximum(options.merge * cells.h, sd[:, None] + sd[None, :])
        np.fill_diagonal(gap, np.inf)
        near = gap < reach
        if not near.any():
            break
        i, j = min(np.argwhere(near).tolist(), key=lambda p: gap[p[0], p[1]])
        total, e, q = merge_parts(atoms.mass[[i, j]], a[[i, j]], deficit(atoms.kappa[[i, j]]))
        keep = np.ones(atoms.count, bool)
        keep[[i, j]] = False
        parents = (int(atoms.ids[i]), int(atoms.ids[j]))
        atoms = atoms.select(keep).appended(total, e, _spread_of(q), next_id, time, parents)
        events.append(SphereTransfer("atom_merge", time, next_id, parents, total, e))
        next_id += 1
    return atoms, events, next_id


def cluster_cells(out: np.ndarray, cells: SphereCells, peak: int, floor: float) -> np.ndarray:
    """The cells reached from ``peak`` going down (never up) to ``floor`` of its value."""
    edge = floor * out[peak]
    seen = {int(peak)}
    queue = deque([int(peak)])
    while queue:
        c = queue.popleft()
        for nb in cells.neighbours[c]:
            if nb < 0 or nb in seen:
                continue
            if out[nb] >= edge and out[nb] <= out[c] and out[nb] > 0.0:
                seen.add(int(nb))
                queue.append(int(nb))
    return np.fromiter(seen, int)


def peaks_above(rho: np.ndarray, cells: SphereCells, level: float) -> np.ndarray:
    """Cells above ``level`` and above their neighbours (a plateau once), by decreasing
    value."""
    candidates = np.flatnonzero(rho > level)
    if candidates.size == 0:
        return candidates
    nb = cells.neighbours[candidates]
    values = np.where(nb >= 0, rho[np.maximum(nb, 0)], -np.inf)
    mine = rho[candidates][:, None]
    ok = ~np.any(values > mine, axis=1) & ~np.any((values == mine) & (nb < candidates[:, None])
                                                  & (nb >= 0), axis=1)  # fmt: skip
    peaks = candidates[ok]
    return peaks[np.argsort(-rho[peaks])]


def convert(rho, cells: SphereCells, atoms: VMFAtoms, options: AtomOptions, time, next_id):
    """The clusters of the cells narrower than ``width`` cells become atoms (their mass and
    first moment exactly); ``rho`` flat."""
    total = float(rho @ cells.areas) + atoms.total_mass
    level = options.level * total / cs.FOUR_PI
    if not float(rho.max()) > level:
        return rho, atoms, [], next_id
    out = rho.copy()
    events: list[SphereTransfer] = []
    for p in peaks_above(rho, cells, level):
        if out[p] <= level:
            continue
        index = cluster_cells(out, cells, int(p), options.floor)
        mass, e, q = cells.moments(out, index)
        if not math.sqrt(q) < options.width * cells.h:
            continue
        atoms = atoms.appended(mass, e, _spread_of(q), next_id, time)
        events.append(SphereTransfer("atom_birth", time, next_id, (), mass, e))
        next_id += 1
        out[index] = 0.0
    return out, atoms, events, next_id


def release(rho, cells: SphereCells, atoms: VMFAtoms, options: AtomOptions, time: float):
    """Atoms wider than ``release`` cells go back to the cells (the vMF's cell averages,
    scaled to the atom's mass exactly)."""
    if atoms.count == 0:
        return rho, atoms, []
    wide = np.sqrt(atoms.spread) > options.release * cells.h
    if not wide.any():
        return rho, atoms, []
    out = rho.copy()
    events = []
    for k in np.flatnonzero(wide):
        share = cs.von_mises_fisher(cells.grid, atoms.directions[k], float(atoms.kappa[k]))
        share = share.reshape(-1)
        out += atoms.mass[k] * share / float(share @ cells.areas)
        events.append(SphereTransfer("atom_release", time, int(atoms.ids[k]), (),
                                     float(atoms.mass[k]), atoms.directions[k]))  # fmt: skip
    return out, atoms.select(~wide), events


def describe(event: SphereTransfer) -> str:
    """One line for an atom's event (the run's events and ``tpde info``)."""
    lat, lon = cs.lat_lon(event.centre)
    return describe_transfer(event, f"lat {float(lat):.4f} lon {float(lon):.4f}")


class SphereAtomRun:
    """The atoms of one sphere run: their SSP-RK stages beside the cells' and the transfers
    after each step (:func:`tpde.schemes.cubed_sphere.solve` calls ``stages``, ``rates``,
    ``term``, ``combine`` and ``transfer``). ``field`` has ``atoms`` (what its sums add) and
    ``probe_tangent(density, grid, t, points)``."""

    def __init__(self, grid: cs.CubedSphere, field, options: AtomOptions,
                 start: VMFAtoms | None = None, next_id: int = 0):  # fmt: skip
        options.validate()
        self.options = options
        self.grid = grid
        self.field = field
        self.cells = SphereCells(grid)
        self.atoms = VMFAtoms.empty() if start is None else start
        used = int(self.atoms.ids.max()) + 1 if self.atoms.count else 0
        self.next_id = max(int(next_id), used)
        self.transfers: list[SphereTransfer] = []
        field.atoms = self.atoms
        self._stage: list[VMFAtoms] = []
        self._rates: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def stages(self) -> None:
        self._stage = [self.atoms]
        self._rates = {}
        self.field.atoms = self.atoms

    def see(self, i: int) -> None:
        """The field sees stage ``i``'s atoms (their centres on the sphere)."""
        self.field.atoms = self._stage[i].normalised()

    def rates(self, i: int, density: np.ndarray, t: float) -> None:
        """Stage ``i``'s rates from the field at the probes (``see(i)`` done)."""
        stage = self._stage[i].normalised()
        if stage.count == 0:
            self._rates[i] = (stage.centre.copy(), stage.spread.copy())
            return
        points, frames = probe_points(stage.centre)
        v = self.field.probe_tangent(density, self.grid, t, points.reshape(-1, 3))
        self._rates[i] = vmf_rates(v.reshape(points.shape), frames, stage.spread)

    def combine(self, weights: list[tuple[float, float]], dt: float) -> None:
        """Stage ``len(stages)``: ``sum_k a_k (X_k + (b_k / a_k) dt R_k)``."""
        terms, alphas = [], []
        for k, (a, b) in enumerate(weights):
            if a == 0.0:
                continue
            x = self._stage[k]
            terms.append(x.advanced(self._rates[k], (b / a) * dt) if b else x)
            alphas.append(a)
        self._stage.append(VMFAtoms.combination(alphas, terms))

    def accept(self) -> None:
        self.atoms = self._stage[-1].normalised()
        self.field.atoms = self.atoms

    def restore(self, atoms: VMFAtoms) -> None:
        """Back to ``atoms`` (a rejected step starts again from them)."""
        self.atoms = atoms
        self.field.atoms = atoms

    def diffuse(self, variance: float) -> None:
        """The atoms' part of a noise substep ``exp(tau eps Delta)``, ``variance = 2 eps
        tau``: each spread by :func:`vmf_diffused_spread` (mass, direction and first moment
        exact)."""
        atoms = self.atoms
        if atoms.count:
            spread = vmf_diffused_spread(atoms.spread, variance)
            self.atoms = VMFAtoms(atoms.mass, atoms.centre, spread, atoms.ids, atoms.born,
                                  atoms.parents)  # fmt: skip
            self.field.atoms = self.atoms

    def transfer(
        self, density: np.ndarray, t: float
    ) -> tuple[np.ndarray, list[SphereTransfer], bool]:
        """Absorb, merge, convert, release; the new density ``(6, n, n)``, the events and
        whether the cells changed."""
        options, cells = self.options, self.cells
        atoms = self.atoms
        if atoms.count:
            atoms = VMFAtoms(atoms.mass, atoms.directions, np.maximum(atoms.spread, 1e-300),
                             atoms.ids, atoms.born, atoms.parents)  # fmt: skip
        flat = density.reshape(-1)
        rho, atoms = absorb(flat, cells, atoms, options)
        atoms, merged, self.next_id = merge(atoms, cells, options, t, self.next_id)
        rho, atoms, born, self.next_id = convert(rho, cells, atoms, options, t, self.next_id)
        rho, atoms, released = release(rho, cells, atoms, options, t)
        events = merged + born + released
        self.transfers.extend(events)
        self.atoms = atoms
        self.field.atoms = atoms
        return rho.reshape(density.shape), events, rho is not flat

    def pinned(self, density: np.ndarray, t: float) -> str | None:
        """With atoms off (a dry run of the conversion): the line of the first collapsed
        cluster whose drift is below ``h / 2`` (its cells cannot move it), else None."""
        rho = density.reshape(-1)
        _, candidates, _, _ = convert(rho, self.cells, VMFAtoms.empty(), self.options, t, 0)
        if candidates.count == 0:
            return None
        saved = self.field.atoms
        self.field.atoms = None
        try:
            v = self.field.probe_tangent(density, self.grid, t, candidates.centre)
        finally:
            self.field.atoms = saved
        drift = np.linalg.norm(v, axis=1)
        half = 0.5 * self.cells.h
        slow = np.flatnonzero(drift < half)
        if slow.size == 0:
            return None
        k = int(slow[np.argmax(candidates.mass[slow])])
        lat, lon = cs.lat_lon(candidates.centre[k])
        speed = max(float(drift[k]), 1e-300)
        needed = int(math.ceil(0.5 * math.pi / (2.0 * speed)))
        return (
            f"a collapsed cluster at lat {float(lat):.2f} lon {float(lon):.2f} (mass "
            f"{float(candidates.mass[k]):.4g}) drifts at {speed:.2e} < h / 2 = {half:.2e} at "
            f"t = {t:.6g}: its cells cannot move it and hold it pinned from here; turn atoms "
            f"on ([atoms]) or use at least {min(needed, 10**9)} cells a panel edge (h < 2 x "
            "drift)"
        )
