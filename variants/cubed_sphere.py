"""Velocities on the cubed sphere (:mod:`tpde.schemes.cubed_sphere`): solid-body rotation and
softmax attention with a general ``3 x 3`` pair ``A``, ``V`` (``A = beta I``, ``V = I`` the
standard case).

docs/theory.md, 'The cubed sphere' and 'General attention on the sphere'. The attention field
is the tangential part of the tilted mean,

    v(x) = P_x Gamma(x),   Gamma(x) = V int y e^{<A x, y>} rho dA / int e^{<A x, y>} rho dA,

(``P_x = I - x x^T``; ``normalised = False``: the unnormalised variant, without the
denominator), computed by dense sums over the ``nodes x nodes`` Gauss nodes of every cell,
with the density at the nodes from the fifth-order reconstruction
(:func:`tpde.grid.cubed_sphere.point_values`; negatives set to zero) and the weights ``J w h^2``
of the nodes. Each target's kernel row is scaled by ``e^{-|A x|}`` (``<A x, y> <= |A x|`` on
the sphere, so every term is ``<= 1``; ``e^{-beta}`` for ``A = beta I``). Where the kernel
matrix between the lattice and the nodes fits in ``cache_entries`` numbers it is kept between
calls (the lattice of the face nodes does not change), so a call is one matrix product.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numba as nb
import numpy as np

from tpde.grid import profile
from tpde.grid.cubed_sphere import (
    CubedSphere,
    node_points,
    node_reconstruction,
    point_values,
)
from tpde.schemes.sphere_atoms import VMFAtoms, vmf_cubature, vmf_log_mgf, vmf_sums

from .engines.registry import check_engine, engine_names
from .engines.sphere_harmonics import HarmonicSums, scaled_energy

__all__ = [
    "SPHERE_ENGINES",
    "SolidRotation",
    "atom_sums",
    "energy_with_atoms",
    "CubedSphereAttention",
    "interaction_energy",
    "node_masses",
    "rotate",
    "sphere_engine",
]

#: the kernel-sum engines of the sphere ("auto": the harmonic one;
#: :data:`~.engines.registry.CONFIG_ENGINES`)
SPHERE_ENGINES = engine_names("sphere")


def sphere_engine(engine: str) -> str:
    """The engine that serves ``engine`` on the sphere: ``"auto"`` is ``"harmonic"`` (the
    spherical-harmonic sums are exact to their bound at every size, and faster than the dense
    sums from the smallest grids on: ``benchmarks/sphere_step.py``)."""
    engine = check_engine(engine, "sphere")
    return "harmonic" if engine == "auto" else engine


@nb.njit(cache=True)
def _clipped_masses(first, band, q, metric, weights, rows, out):  # pragma: no cover - compiled
    """``out[p, g, i, h, j] = max(v, 0) weights[i, j, g, h]``, ``v = sum_{u, w} band[g, i, u]
    band[h, j, w] q[p, first[g, i] + u, first[h, j] + w] / metric[i, j, g, h]``: the tensor
    reconstruction of :func:`tpde.grid.cubed_sphere.point_values` by its 5 non-zero weights
    a row (``rows (6, g, n, n)`` the first pass), clipped and weighted."""
    P, n = q.shape[0], q.shape[1]
    G = first.shape[0]
    for p in range(P):
        for g in range(G):
            for i in range(n):
                f = first[g, i]
                for k in range(n):
                    acc = 0.0
                    for u in range(5):
                        acc += band[g, i, u] * q[p, f + u, k]
                    rows[p, g, i, k] = acc
    for p in range(P):
        for g in range(G):
            for i in range(n):
                for h in range(G):
                    for j in range(n):
                        f = first[h, j]
                        acc = 0.0
                        for u in range(5):
                            acc += band[h, j, u] * rows[p, g, i, f + u]
                        value = acc / metric[i, j, g, h]
                        out[p, g, i, h, j] = max(value, 0.0) * weights[i, j, g, h]


@nb.njit(cache=True)
def _projected_mean(z, g, points, out):  # pragma: no cover - compiled
    """``out = gamma - <gamma, x> x`` with ``gamma = g / z`` per row ``(M, 3)``: the tangent
    part of the tilted mean in one pass (numpy's order: ``(a_0 + a_1) + a_2``)."""
    for i in range(points.shape[0]):
        g0 = g[i, 0] / z[i]
        g1 = g[i, 1] / z[i]
        g2 = g[i, 2] / z[i]
        dot = (g0 * points[i, 0] + g1 * points[i, 1]) + g2 * points[i, 2]
        out[i, 0] = g0 - dot * points[i, 0]
        out[i, 1] = g1 - dot * points[i, 1]
        out[i, 2] = g2 - dot * points[i, 2]


@functools.lru_cache(maxsize=8)
def _mass_weights(n: int, nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The first column and the 5 weights of each row of point_values' ``T (g, n, n)``, its
    metric values and area weights ``(n, n, g, g)`` (contiguous)."""
    grid = CubedSphere(n)
    T, metric_values = node_reconstruction(grid, nodes)
    _, weights = node_points(grid, nodes)
    first = np.clip(np.argmax(T != 0.0, axis=-1), 0, n - 5).astype(np.int64)
    band = np.take_along_axis(T, first[..., None] + np.arange(5), axis=-1)
    return first, np.ascontiguousarray(band), np.ascontiguousarray(metric_values), weights


def node_masses(grid: CubedSphere, density, nodes: int = 3) -> np.ndarray:
    """``max(rho(y), 0) J w h^2`` at the Gauss nodes, ``(6, n, n, g, g)`` as
    :func:`~tpde.grid.cubed_sphere.point_values` orders them (``rho`` its reconstruction),
    laid out in memory as ``(p, g, i, h, j)``: one compiled pass over the 5 non-zero weights
    of each row instead of two dense matrix products (the same numbers to the last bits:
    the products' order of summation differs)."""
    n, g = grid.n, int(nodes)
    first, band, metric, weights = _mass_weights(n, g)
    q = np.ascontiguousarray(grid.to_coordinate(density))
    rows = np.empty((6, g, n, n))
    out = np.empty((6, g, n, g, n))
    _clipped_masses(first, band, q, metric, np.ascontiguousarray(weights), rows, out)
    return out.transpose(0, 2, 4, 1, 3)


def rotate(x: np.ndarray, axis: np.ndarray, angle: float) -> np.ndarray:
    """Rodrigues: ``x (..., 3)`` rotated by ``angle`` about the unit vector ``axis``."""
    c, s = math.cos(angle), math.sin(angle)
    cross = np.cross(axis, x)
    return x * c + cross * s + np.outer(x @ axis, axis).reshape(x.shape) * (1 - c)


class SolidRotation:
    """``v(x) = omega axis x x``: rigid rotation at angular speed ``omega`` about ``axis``; the
    exact solution is the initial density rotated, ``rho(x, t) = rho_0(R(-omega t) x)``."""

    steady = True

    def __init__(self, axis: Sequence[float] = (0.0, 0.0, 1.0), omega: float = 1.0):
        a = np.asarray(axis, float)
        if a.shape != (3,) or not np.linalg.norm(a) > 0:
            raise ValueError(f"velocity.axis: expected a non-zero 3-vector, got {axis!r}")
        self.axis = a / np.linalg.norm(a)
        self.omega = float(omega)

    def tangent(self, density, grid: CubedSphere, t: float, points: np.ndarray) -> np.ndarray:
        return self.omega * np.cross(self.axis, points)

    def exact(self, initial, t: float):
        """``x -> rho(x, t)`` for an initial density ``x -> rho_0(x)``."""
        return lambda x: initial(rotate(x, self.axis, -self.omega * t))


def _matrix3(key: str, value) -> np.ndarray:
    m = np.asarray(value, float)
    if m.shape != (3, 3) or not np.all(np.isfinite(m)):
        raise ValueError(f"{key}: expected a finite 3 x 3 matrix, got {value!r:.80}")
    return m


class CubedSphereAttention:
    """Softmax attention on the cubed sphere (module docstring): ``beta`` (``A = beta I``,
    ``V = I``) or a general ``A`` and ``V``; ``normalised = False`` drops the denominator."""

    steady = False

    def __init__(
        self,
        beta: float | None = None,
        nodes: int = 3,
        cache_entries: int = 12_000_000,
        *,
        A=None,
        V=None,
        normalised: bool = True,
        engine: str = "auto",
    ):
        #: the engine asked for and the one that serves it (:func:`sphere_engine`)
        self.engine = check_engine(engine, "sphere")
        self.serving = sphere_engine(engine)
        if (beta is None) == (A is None):
            raise ValueError("attention.beta: give beta (A = beta I) or a 3 x 3 A, not both")
        if beta is not None:
            if not (math.isfinite(beta) and beta > 0):
                raise ValueError(f"attention.beta: expected a finite number > 0, got {beta!r}")
            A = float(beta) * np.eye(3)
        self.A = _matrix3("attention.A", A)
        self.V = np.eye(3) if V is None else _matrix3("attention.V", V)
        if float(np.linalg.norm(self.A, 2)) > 300.0:
            raise ValueError("attention.A: |A| > 300 overflows the kernel e^{<A x, y>}")
        scale = float(self.A[0, 0])
        #: ``beta`` when ``A = beta I`` (the closed-form rates and energies), else None
        self.beta = scale if np.array_equal(self.A, scale * np.eye(3)) and scale > 0 else None
        self.identity_v = bool(np.array_equal(self.V, np.eye(3)))
        self.normalised = bool(normalised)
        self.nodes = int(nodes)
        self.cache_entries = int(cache_entries)
        self._cache: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._harmonic: HarmonicSums | None = None
        #: the probes' own engine (their points change every call: the face nodes' plan stays)
        self._probe_harmonic: HarmonicSums | None = None
        if self.serving == "harmonic":
            self._harmonic = HarmonicSums(self.A)
            self._probe_harmonic = HarmonicSums(self.A)
        #: von Mises-Fisher atoms whose exact share the sums add (a run with [atoms]), or None
        self.atoms: VMFAtoms | None = None

    def _exponent(self, points: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``<A x, y> - |A x|`` ``(M, S)`` and the shifts ``|A x|`` ``(M,)``."""
        if self.beta is not None:  # the standard case, as e^{beta (<x, y> - 1)}
            return self.beta * (points @ sources.T - 1.0), np.full(points.shape[0], self.beta)
        tilts = points @ self.A.T
        shift = np.linalg.norm(tilts, axis=1)
        return tilts @ sources.T - shift[:, None], shift

    def _kernel(self, points: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``e^{<A x, y> - |A x|}`` and the shifts, kept for the next call with the same
        points."""
        if self._cache is not None:
            cached_points, cached_sources, kernel, shift = self._cache
            if (
                cached_points.shape == points.shape
                and cached_sources.shape == sources.shape
                and np.array_equal(cached_points, points)
                and np.array_equal(cached_sources, sources)
            ):
                return kernel, shift
        exponent, shift = self._exponent(points, sources)
        kernel = np.exp(exponent, out=exponent)
        self._cache = (points.copy(), sources.copy(), kernel, shift)
        return kernel, shift

    def sums(
        self, density, grid: CubedSphere, points: np.ndarray, radial: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``e^{-|A x|} Z(x)`` ``(M,)``, ``e^{-|A x|} int y e^{<A x, y>} rho dA`` ``(M, 3)`` and
        the shifts ``|A x|`` ``(M,)``. ``radial = False``: the second may lack its part along
        ``x`` when ``A = beta I`` (what the tangent drops anyway; the harmonic engine then
        skips one synthesis)."""
        return self._sums(density, grid, points, radial, self._harmonic)

    def _sums(self, density, grid, points, radial, engine):
        y, _ = node_points(grid, self.nodes)
        sources = y.reshape(-1, 3)
        # the masses (6, n, n, g, g) in their own memory order (p, g, i, h, j): no copy to C
        # order, the harmonic engine's panel reduction reads them as they lie
        mass = node_masses(grid, density, self.nodes)
        atoms = self.atoms if self.atoms is not None and self.atoms.count else None
        share = None
        if atoms is not None:
            tilts = points @ self.A.T
            share = atom_sums(atoms, tilts, np.linalg.norm(tilts, axis=1))
        if engine is not None:
            z, g, shift = engine.sums(
                sources,
                mass,
                points,
                radial,
                None if share is None else share[0],
                panels=(grid.n, self.nodes),
            )
        else:
            with profile.phase("velocity.direct"):
                z, g, shift = self._dense_sums(sources, mass.reshape(-1), points)
        if share is not None:
            z, g = z + share[0], g + share[1]
        return z, g, shift

    def probe_tangent(self, density, grid: CubedSphere, t: float, points: np.ndarray) -> np.ndarray:
        """:meth:`tangent` at a few points that change every call (the atoms' probes), by
        the probes' own engine."""
        return self._tangent(density, grid, points, self._probe_harmonic)

    def _dense_sums(
        self, sources: np.ndarray, mass: np.ndarray, points: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The dense sums of :meth:`sums` (kernel kept when it fits ``cache_entries``)."""
        columns = np.concatenate([mass[:, None], mass[:, None] * sources], axis=1)  # (S, 4)
        if points.shape[0] * sources.shape[0] <= self.cache_entries:
            kernel, shift = self._kernel(points, sources)
            total = kernel @ columns
        else:
            total = np.empty((points.shape[0], 4))
            shift = np.empty(points.shape[0])
            block = max(1, self.cache_entries // (4 * sources.shape[0]))
            for start in range(0, points.shape[0], block):
                rows = slice(start, start + block)
                exponent, shift[rows] = self._exponent(points[rows], sources)
                total[rows] = np.exp(exponent, out=exponent) @ columns
        return total[:, 0], total[:, 1:], shift

    def tangent(self, density, grid: CubedSphere, t: float, points: np.ndarray) -> np.ndarray:
        return self._tangent(density, grid, points, self._harmonic)

    def _tangent(self, density, grid, points, engine) -> np.ndarray:
        z, g, shift = self._sums(density, grid, points, not self.identity_v, engine)
        if self.normalised and self.identity_v:
            out = np.empty_like(points, dtype=float)
            _projected_mean(np.ascontiguousarray(z), np.ascontiguousarray(g), points, out)
            return out
        if self.normalised:
            gamma = g / z[:, None]
        else:
            gamma = g * np.exp(shift)[:, None]
        if not self.identity_v:
            gamma = gamma @ self.V.T
        return gamma - np.sum(gamma * points, axis=1)[:, None] * points


def interaction_energy(
    density,
    grid: CubedSphere,
    beta: float,
    nodes: int = 3,
    block: int = 2048,
    engine: str = "auto",
) -> float:
    """``E = 1/(2 beta) iint e^{beta <x, y>} rho(x) rho(y) dA dA`` from the cell averages by
    the attention's quadrature: the density at the ``nodes x nodes`` Gauss nodes of every cell
    from the fifth-order reconstruction (negatives set to zero), weights ``J w h^2``, the
    double sum over node pairs: by Funk-Hecke from the harmonic coefficients
    (:func:`tpde.variants.engines.sphere_harmonics.scaled_energy`; ``engine`` "auto" /
    "harmonic") or dense (``"direct"``: blocked, each term scaled by ``e^{-beta}``). The
    uniform probability has ``E = sinh(beta) / (2 beta^2)``, a point mass ``e^beta / (2 beta)``
    (docs/theory.md, 'Energy, harmonics and W2 on the sphere')."""
    beta = float(beta)
    if not (math.isfinite(beta) and 0 < beta <= 300):
        raise ValueError(f"attention.beta: expected a number in (0, 300], got {beta!r}")
    y, values, weights = point_values(grid, density, int(nodes))
    sources = y.reshape(-1, 3)
    mass = (np.maximum(values, 0.0) * weights).reshape(-1)
    if sphere_engine(engine) == "harmonic":
        return scaled_energy(sources, mass, beta) * math.exp(beta) / (2.0 * beta)
    total = 0.0
    for start in range(0, sources.shape[0], int(block)):
        rows = slice(start, start + int(block))
        exponent = beta * (sources[rows] @ sources.T - 1.0)
        total += float(mass[rows] @ (np.exp(exponent, out=exponent) @ mass))
    return total * math.exp(beta) / (2.0 * beta)


def atom_sums(
    atoms: VMFAtoms, tilts: np.ndarray, shift: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The atoms' exact share of the scaled sums at the tilts ``c = A x`` ``(M, 3)``, shifts
    ``|c|`` ``(M,)``: ``z = sum_k m_k e^{log MGF_k(c) - |c|}`` ``(M,)`` and ``g`` the same times
    the tilted mean ``L(r) (kappa a + c) / r`` ``(M, 3)`` (:mod:`tpde.schemes.sphere_atoms`).
    """
    return vmf_sums(tilts, atoms.directions, atoms.kappa, atoms.mass, shift)


def energy_with_atoms(
    density, grid: CubedSphere, beta: float, atoms: VMFAtoms | None, nodes: int = 3
) -> float:
    """``E = 1/(2 beta) iint e^{beta <x, y>} dmu dmu`` of cells plus atoms: cells with cells by
    :func:`interaction_energy`'s Funk-Hecke sum, cells with atoms by the atoms' exact
    ``int e^{beta <x, y>} dvMF(y)`` at the cells' Gauss nodes, atoms with atoms by the same
    exact form over :func:`~tpde.schemes.sphere_atoms.vmf_cubature` of the other atom."""
    cells = interaction_energy(density, grid, beta, nodes) * 2.0 * beta / math.exp(beta)
    if atoms is None or atoms.count == 0:
        return cells * math.exp(beta) / (2.0 * beta)
    y, values, weights = point_values(grid, density, int(nodes))
    sources = y.reshape(-1, 3)
    mass = (np.maximum(values, 0.0) * weights).reshape(-1)
    log, _, _ = vmf_log_mgf(beta * sources, atoms.directions, atoms.kappa)
    cross = float(mass @ (np.exp(log - beta) @ atoms.mass))
    pairs = 0.0
    for k in range(atoms.count):
        x, w = vmf_cubature(atoms.directions[k], float(atoms.kappa[k]))
        log, _, _ = vmf_log_mgf(beta * x, atoms.directions, atoms.kappa)
        pairs += atoms.mass[k] * float(w @ (np.exp(log - beta) @ atoms.mass))
    return (cells + 2.0 * cross + pairs) * math.exp(beta) / (2.0 * beta)
