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
from tpde.variants.engines.sphere_harmonics import (
    NUFFT_EPSILON,
    HarmonicSums,
    coefficients,
    degree_for,
    scaled_energy,
)

from .s2_tokens import SphereTokens, fibonacci_tokens

__all__ = [
    "CELL_TOLERANCE",
    "MASS_TOLERANCE",
    "HarmonicTokens",
    "cell_masses",
    "cluster_table",
    "compare_clusters",
    "density_coefficients",
    "lattice_tokens",
    "match_degree",
    "matched_weights",
    "match_clusters",
    "measure_clusters",
    "plateau_failures",
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


#: the Richardson iteration of :func:`matched_weights` stops when the largest coefficient
#: residual is below this (absolute: the weights sum to 1, a coefficient is at most 0.28)
MATCH_TOLERANCE = 1e-15
#: and gives up (raises) after this many sweeps (the lattice's quadrature contracts the
#: residual by ~1e-2 a sweep at 4 x 10^4 tokens and degree 76: four or five suffice)
MATCH_SWEEPS = 30


def density_coefficients(density, degree: int) -> np.ndarray:
    """``a_lm = int density(x) Y_lm*(x) dA`` up to ``degree`` (ducc0's order, ``m >= 0``) of a
    density callable, by the product rule of ``degree + 32`` Gauss-Legendre heights and
    ``2 degree + 64`` azimuths (exact for a polynomial density of degree up to 31 times
    ``Y_lm``, ``l <= degree``: the noise laws have degree ``l_max <= 31``)."""
    heights, height_weights = np.polynomial.legendre.leggauss(int(degree) + 32)
    azimuths = 2.0 * math.pi * np.arange(2 * int(degree) + 64) / (2 * int(degree) + 64)
    ring = np.sqrt(1.0 - heights**2)[:, None]
    points = np.stack(
        [ring * np.cos(azimuths), ring * np.sin(azimuths), heights[:, None] + 0 * azimuths], -1
    ).reshape(-1, 3)
    weights = np.repeat(height_weights * (2.0 * math.pi / azimuths.size), azimuths.size)
    return coefficients(points, weights * np.asarray(density(points), float), int(degree))


def _angles(x: np.ndarray) -> np.ndarray:
    """``(theta, phi)`` ``(n, 2)`` of unit vectors, ducc0's locations."""
    theta = np.arctan2(np.hypot(x[:, 0], x[:, 1]), x[:, 2])
    phi = np.arctan2(x[:, 1], x[:, 0]) % (2.0 * math.pi)
    return np.ascontiguousarray(np.stack([theta, phi], 1))


def matched_weights(
    x: np.ndarray, weights: np.ndarray, target: np.ndarray, degree: int
) -> np.ndarray:
    """Weights ``w`` near ``weights`` at the points ``x (n, 3)`` (nearly uniform: a
    lattice) whose measure has exactly the coefficients ``target`` up to ``degree``:
    ``sum_j w_j Y_lm*(x_j) = target_lm``. Richardson sweeps with the lattice as its own
    preconditioner, ``w <- w + (4 pi / n) sum_lm r_lm Y_lm(x)``, ``r = target - a(w)``
    (``sum_j Y_lm*(x_j) Y_l'm'(x_j) ~ n / (4 pi) delta``); raises when the residual does
    not fall below :data:`MATCH_TOLERANCE` or a weight would not stay positive."""
    from ducc0.sht.experimental import adjoint_synthesis_general, synthesis_general

    loc = _angles(np.asarray(x, float))
    common = {"lmax": int(degree), "spin": 0, "loc": loc, "epsilon": NUFFT_EPSILON}
    w = np.array(weights, float)
    scale = 4.0 * math.pi / w.size
    for _ in range(MATCH_SWEEPS):
        residual = target - adjoint_synthesis_general(map=w[None, :], **common)[0]
        if np.abs(residual).max() <= MATCH_TOLERANCE:
            if not w.min() > 0:
                raise ValueError("matched_weights: a weight fell to zero or below")
            return w
        w += scale * synthesis_general(alm=residual[None, :], **common)[0]
    raise ValueError(
        f"matched_weights: residual {np.abs(residual).max():.1e} after {MATCH_SWEEPS} sweeps"
    )


def lattice_tokens(density, n: int, seed: int = 0, match: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` tokens of the law ``density(x) dA`` (a callable): the rotated Fibonacci lattice
    and the weights ``density(x_i) / sum`` (module docstring); ``match > 0``: the weights
    then corrected by :func:`matched_weights` so that the tokens' coefficients up to degree
    ``match`` are the density's (:func:`density_coefficients`)."""
    x = fibonacci_tokens(int(n)) @ _rotation(seed).T
    w = np.asarray(density(x), float)
    w = w / w.sum()
    if match > 0:
        target = density_coefficients(density, match)
        target /= target[0].real * math.sqrt(4.0 * math.pi)  # the measure of mass 1
        w = matched_weights(x, w, target, match)
    return x, w


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


def match_degree(beta: float) -> int:
    """The degree to which :func:`token_clusters` matches the tokens' coefficients by
    default: twice the harmonic engine's (:func:`~tpde.variants.engines.sphere_harmonics.
    degree_for`, 38 at ``beta = 16``), so that both the initial field (degree ``L``) and the
    first change of the measure's degree-``L`` coefficients under it (products of degree
    ``2 L``) are the density's."""
    return 2 * degree_for(beta)


def token_clusters(
    problem, seed: int, times, n: int = 40_000, dt: float = 0.1, match: int | None = None
):
    """Yield ``(t, energy, centres, masses)`` of ``n`` lattice tokens of a sphere config's
    initial ``noise`` law (:func:`lattice_tokens`, the turn ``seed``, the coefficients
    matched up to degree ``match``, :func:`match_degree` by default, 0: not) at ``times``,
    moved by CF4 steps of at most ``dt`` with the harmonic sums (:class:`HarmonicTokens`).
    ``problem``: the config's problem (``grid``, ``velocity`` with ``beta``, ``initial``)."""
    if match is None:
        match = match_degree(problem.velocity.beta)
    init = problem.initial
    _, density = cs.noise_function(
        problem.grid, init.get("amplitude", 1e-3), init.get("l_max", 8), init.get("seed", 0)
    )
    x, w = lattice_tokens(density, n, seed, match)
    system = HarmonicTokens(x, problem.velocity.beta, w)
    for t in times:
        system.integrate([t], dt)
        rho = cell_masses(problem.grid, system.x, system.weights)
        centres, masses = cs.clusters(problem.grid, rho)
        energy = token_energy_harmonic(system.x, system.weights, problem.velocity.beta)
        yield float(t), energy, centres, masses


#: the largest mass gap between the grid's and the tokens' clusters on a plateau (issue 26)
MASS_TOLERANCE = 1e-3
#: the largest angle between matched clusters' cells, in cell widths (the same cell or its
#: neighbour: the maxima of two measures of one cluster are counted on the run's cells)
CELL_TOLERANCE = 1.5

#: a snapshot of clusters: ``(t, energy, centres (k, 3), masses (k,))``
Clusters = tuple[float, float, np.ndarray, np.ndarray]


def _mass_gaps(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]):
    """The largest mass gap and angle over the matched pairs (:func:`match_clusters`)."""
    pairs = match_clusters(a, b)
    if not pairs:
        return math.nan, math.nan
    return max(abs(a[1][i] - b[1][j]) for i, j, _ in pairs), max(g for _, _, g in pairs)


def compare_clusters(grid: list[Clusters], seeds: list[list[Clusters]]) -> list[dict]:
    """Rows, one per time present in the grid's and every seed's snapshots: ``t``, the
    counts (``grid``, ``seeds``), ``plateau`` (every count equal and not zero), per seed
    the largest mass gap and angle to the grid's clusters over matched pairs
    (``mass_gap``, ``angle``; NaN off a plateau), ``spread`` the largest mass gap between
    any two seeds, the energies (``energy`` of the grid, ``energies`` of the seeds) and
    ``energy_spread`` (the seeds' range)."""
    by_time = [{round(s[0], 9): s for s in seed} for seed in seeds]
    rows = []
    for t, energy, centres, masses in grid:
        key = round(t, 9)
        if not all(key in s for s in by_time):
            continue
        snaps = [s[key] for s in by_time]
        counts = [s[3].size for s in snaps]
        plateau = masses.size > 0 and all(c == masses.size for c in counts)
        gaps = [_mass_gaps((centres, masses), (s[2], s[3])) if plateau else (math.nan,) * 2
                for s in snaps]  # fmt: skip
        spread = max(
            (_mass_gaps((a[2], a[3]), (b[2], b[3]))[0] for k, a in enumerate(snaps)
             for b in snaps[k + 1:] if a[3].size == b[3].size),
            default=math.nan,
        )  # fmt: skip
        energies = [s[1] for s in snaps]
        rows.append({
            "t": t, "grid": masses.size, "seeds": counts, "plateau": plateau,
            "mass_gap": [g[0] for g in gaps], "angle": [g[1] for g in gaps],
            "spread": spread, "energy": energy, "energies": energies,
            "energy_spread": max(energies) - min(energies),
        })  # fmt: skip
    return rows


def plateau_failures(
    rows: list[dict], h: float, mass: float = MASS_TOLERANCE, cells: float = CELL_TOLERANCE
) -> list[str]:
    """One line per row of :func:`compare_clusters` that breaks the comparison: on a plateau
    a mass gap above ``mass`` or an angle above ``cells`` cell widths ``h``."""
    out = []
    for r in rows:
        if not r["plateau"]:
            continue
        if max(r["mass_gap"]) > mass:
            out.append(f"t = {r['t']:g}: mass gap {max(r['mass_gap']):.2e} > {mass:g}")
        if max(r["angle"]) > cells * h:
            out.append(f"t = {r['t']:g}: angle {max(r['angle']):.3f} > {cells:g} h")
    return out


def cluster_table(rows: list[dict]) -> str:
    """The rows of :func:`compare_clusters` as a markdown table."""
    lines = [
        "| t | clusters grid / seeds | mass gap | seed spread | angle | E grid | E seeds - grid |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        counts = ", ".join(str(c) for c in r["seeds"])
        gap = f"{max(r['mass_gap']):.1e}" if r["plateau"] else "-"
        angle = f"{max(r['angle']):.1e}" if r["plateau"] else "-"
        spread = "-" if math.isnan(r["spread"]) else f"{r['spread']:.1e}"
        de = ", ".join(f"{e - r['energy']:+.3g}" for e in r["energies"])
        lines.append(
            f"| {r['t']:g} | {r['grid']} / {counts} | {gap} | {spread} | {angle} | "
            f"{r['energy']:.6g} | {de} |"
        )
    return "\n".join(lines)
