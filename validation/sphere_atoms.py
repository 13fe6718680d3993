"""Grid plus atoms on the sphere against tokens: clusters, masses, positions, energy.

docs/theory.md, 'Atoms on the sphere'; docs/validation.md, 'Atoms on the sphere'. The
reference is ``n`` tokens drawn from the run's initial density: a Fibonacci lattice turned
by a random rotation (one per seed) with weights ``w_i ~ rho_0(x_i)`` (a quasi-Monte Carlo
sample: its sampling noise in the low degrees is far below i.i.d. tokens' ``(2 l + 1) /
sqrt(n)``, which at ``n = 4 x 10^4`` would swamp a ``1e-3`` seed), moved by CF4
(:class:`~.s2_tokens.SphereTokens`) with the field's sums by spherical harmonics
(:class:`~tpde.variants.engines.sphere_harmonics.HarmonicSums`: tokens as sources and
targets, exact to its ``1e-8`` bound; the dense sums are ``O(n^2)``). Both measures are
counted the same way: their mass in the run's cells (an atom's in the cell of its centre,
tokens' by cell), clusters the local maxima above twice the uniform density with the mass
of the cells nearest to each (:func:`tpde.grid.cubed_sphere.clusters`).
"""

from __future__ import annotations

import math

import numpy as np

from tpde.grid import cubed_sphere as cs
from tpde.schemes.sphere_atoms import VMFAtoms
from tpde.variants.engines.sphere_harmonics import HarmonicSums, scaled_energy

from .s2_tokens import SphereTokens, fibonacci_tokens

__all__ = [
    "HarmonicTokens",
    "cell_masses",
    "lattice_tokens",
    "match_clusters",
    "measure_clusters",
    "token_clusters",
    "token_energy_harmonic",
]


class HarmonicTokens(SphereTokens):
    """:class:`~.s2_tokens.SphereTokens` for ``A = beta I``, ``V = I``, normalised, with the
    sums by spherical harmonics (``O(n L^2)`` a call instead of ``O(n^2)``)."""

    def __init__(self, x: np.ndarray, beta: float, weights: np.ndarray | None = None):
        super().__init__(x, float(beta) * np.eye(3), weights=weights)
        self.engine = HarmonicSums(self.A)

    def velocity(self, x: np.ndarray) -> np.ndarray:
        self.evaluations += 1
        z, g, _ = self.engine.sums(x, self.weights, x, radial=False)
        gamma = g / z[:, None]
        return gamma - np.sum(gamma * x, axis=1)[:, None] * x


def _rotation(seed: int) -> np.ndarray:
    """A uniformly random rotation (QR of a Gaussian matrix, signs fixed)."""
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def lattice_tokens(density, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` tokens of the law ``density(x) dA`` (a callable): the rotated Fibonacci lattice
    and the weights ``density(x_i) / sum`` (module docstring)."""
    x = fibonacci_tokens(int(n)) @ _rotation(seed).T
    w = np.asarray(density(x), float)
    return x, w / w.sum()


def cell_masses(grid: cs.CubedSphere, points: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Cell averages ``(6, n, n)`` of the point masses ``weights`` at ``points (P, 3)``."""
    if points.shape[0] == 0:
        return np.zeros(grid.shape)
    p, i, j = cs.cell_index(grid, points)
    flat = (p * grid.n + i) * grid.n + j
    counts = np.bincount(flat, weights=weights, minlength=6 * grid.n**2)
    return counts.reshape(grid.shape) / grid.areas


def measure_clusters(
    grid: cs.CubedSphere, density: np.ndarray, atoms: VMFAtoms | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Clusters ``(centres (k, 3), masses (k,))`` of cells plus atoms (module docstring)."""
    rho = np.asarray(density, float).copy()
    if atoms is not None and atoms.count:
        rho += cell_masses(grid, atoms.directions, atoms.mass)
    return cs.clusters(grid, rho)


def match_clusters(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> list[tuple[int, int, float]]:
    """Greedy nearest pairs ``(i, j, angle)`` between two cluster lists (closest first)."""
    ca, cb = a[0], b[0]
    if ca.shape[0] == 0 or cb.shape[0] == 0:
        return []
    angle = np.arccos(np.clip(ca @ cb.T, -1.0, 1.0))
    pairs = []
    used_a: set[int] = set()
    used_b: set[int] = set()
    for flat in np.argsort(angle, axis=None):
        i, j = np.unravel_index(flat, angle.shape)
        if i in used_a or j in used_b:
            continue
        used_a.add(int(i))
        used_b.add(int(j))
        pairs.append((int(i), int(j), float(angle[i, j])))
    return pairs


def token_energy_harmonic(x: np.ndarray, weights: np.ndarray, beta: float) -> float:
    """The tokens' interaction energy ``1/(2 beta) sum_ij w_i w_j e^{beta <x_i, x_j>}`` by
    Funk-Hecke (:func:`~tpde.variants.engines.sphere_harmonics.scaled_energy`)."""
    return scaled_energy(x, weights, beta) * math.exp(beta) / (2.0 * beta)


def token_clusters(config, seed: int, times, n: int = 40_000, dt: float = 0.1):
    """Yield ``(t, energy, centres, masses)`` of ``n`` lattice tokens of a sphere config's
    initial ``noise`` law (:func:`lattice_tokens`, the turn ``seed``) at ``times``, moved by
    CF4 steps of at most ``dt`` with the harmonic sums (:class:`HarmonicTokens`)."""
    init = config.initial
    _, density = cs.noise_function(
        config.grid, init.get("amplitude", 1e-3), init.get("l_max", 8), init.get("seed", 0)
    )
    x, w = lattice_tokens(density, n, seed)
    system = HarmonicTokens(x, config.field.beta, w)
    for t in times:
        system.integrate([t], dt)
        rho = cell_masses(config.grid, system.x, system.weights)
        centres, masses = cs.clusters(config.grid, rho)
        energy = token_energy_harmonic(system.x, system.weights, config.field.beta)
        yield float(t), energy, centres, masses
