"""Tokens on the sphere S^2: the particle reference of the Transformer PDE on the sphere.

docs/theory.md, 'Tokens on the sphere'. ``n`` tokens ``x_i`` on ``S^2`` with weights ``w_i``
(sum 1) move by the tangential attention field of the empirical measure,

    x_i' = P_{x_i} Gamma(x_i),
    Gamma(x) = V sum_j w_j x_j e^{<A x, x_j>} / sum_j w_j e^{<A x, x_j>}

(``normalised = False``: without the denominator), the field of
:class:`tpde.variants.cubed_sphere.CubedSphereAttention` on ``mu^n = sum_j w_j delta_{x_j}``.
Sums are dense, blocked over targets, each row shifted by ``|A x_i|`` (every term ``<= 1``).

Integrator: the commutator-free Lie group method of order 4 of Celledoni, Marthinsen and Owren
(CF4) for the action of ``SO(3)^n`` on ``(S^2)^n``. A tangent velocity ``v`` at ``x`` is the
rotation ``omega = x x v`` (``omega x x = v``); every stage moves the tokens by exponentials,
rotations (Rodrigues) of each token about its own ``omega``, so the tokens stay on the sphere
to round-off at every stage, with no normalisation step, and the method keeps its fourth
order (tests/test_s2_tokens.py measures it):

    F_k = h omega(Y_k),   Y_1 = x,   Y_2 = exp(F_1 / 2) x,   Y_3 = exp(F_2 / 2) x,
    Y_4 = exp(F_3 - F_1 / 2) Y_2,
    x_new = exp((-F_1 + 2 F_2 + 2 F_3 + 3 F_4) / 12) exp((3 F_1 + 2 F_2 + 2 F_3 - F_4) / 12) x.

``exp(F) y`` rotates ``y`` by ``|F|`` about ``F / |F|`` (for ``y`` perpendicular to ``F`` the
exponential map of the sphere along the geodesic with initial velocity ``F x y``).

Initial tokens: exact samples of von Mises-Fisher laws and their mixtures
(``sample_von_mises_fisher``, inverse CDF of ``<m, x>``), or of the piecewise-constant
density of cubed-sphere cell averages (``sample_cell_tokens``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import numpy as np
from numpy.typing import ArrayLike

from tpde.grid.cubed_sphere import CubedSphere, harmonic_power, metric, to_sphere

from .brownian import check_noise, rotate_tokens, sphere_increment, split_step
from .sphere_tokens import inverse_cdf, march

__all__ = [
    "SphereTokens",
    "fibonacci_tokens",
    "rotate_tokens",
    "sample_cell_tokens",
    "sample_mixture",
    "sample_von_mises_fisher",
    "sphere_token_velocity",
    "token_amplitudes",
    "token_energy",
    "token_moments",
    "zonal_mode_tokens",
]

_BLOCK = 1024


def _matrix3(key: str, value) -> np.ndarray:
    m = np.asarray(value, float)
    if m.shape != (3, 3) or not np.all(np.isfinite(m)):
        raise ValueError(f"{key}: expected a finite 3 x 3 matrix, got {value!r:.80}")
    return m


def sphere_token_velocity(
    x: np.ndarray, weights: np.ndarray, A: np.ndarray, V: np.ndarray, normalised: bool = True
) -> np.ndarray:
    """Tangent velocities ``(n, 3)`` of tokens ``x (n, 3)`` with ``weights (n,)`` (as given)."""
    tilts = x @ np.asarray(A, float).T
    shift = np.linalg.norm(tilts, axis=1)
    columns = np.concatenate([weights[:, None], weights[:, None] * x], axis=1)  # (n, 4)
    total = np.empty((x.shape[0], 4))
    for start in range(0, x.shape[0], _BLOCK):
        rows = slice(start, start + _BLOCK)
        exponent = tilts[rows] @ x.T
        exponent -= shift[rows, None]
        total[rows] = np.exp(exponent, out=exponent) @ columns
    if normalised:
        gamma = total[:, 1:] / total[:, :1]
    else:
        gamma = total[:, 1:] * np.exp(shift)[:, None]
    gamma = gamma @ np.asarray(V, float).T
    return gamma - np.sum(gamma * x, axis=1)[:, None] * x


class SphereTokens:
    """A token system on ``S^2``: positions, weights, ``A``, ``V``, normalisation (module
    docstring). ``integrate(times, dt)`` runs CF4 with steps of at most ``dt``, landing on each
    output time, and returns the positions ``(len(times), n, 3)``. ``noise`` eps > 0: each
    step is split around rotations by tangent Gaussian increments (:mod:`.brownian`, weak
    order 1), drawn from ``seed``."""

    def __init__(
        self,
        x: np.ndarray,
        A: ArrayLike,
        V: ArrayLike | None = None,
        weights: np.ndarray | None = None,
        normalised: bool = True,
        noise: float = 0.0,
        seed: int = 0,
    ):
        x = np.asarray(x, float).reshape(-1, 3)
        if x.shape[0] < 1 or not np.all(np.isfinite(x)):
            raise ValueError("tokens: expected at least one finite point (n, 3)")
        norms = np.linalg.norm(x, axis=1)
        if np.abs(norms - 1.0).max() > 1e-12:
            raise ValueError("tokens: the points must lie on the unit sphere")
        self.x = x / norms[:, None]
        n = self.x.shape[0]
        w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, float)
        if w.shape != (n,) or np.any(w < 0) or not w.sum() > 0:
            raise ValueError(f"tokens.weights: expected {n} non-negative weights, positive sum")
        self.weights = w / w.sum()
        self.A = _matrix3("attention.A", A)
        self.V = np.eye(3) if V is None else _matrix3("attention.V", V)
        self.normalised = bool(normalised)
        self.t = 0.0
        self.evaluations = 0
        # noise: the rotation by a tangent Gaussian increment around CF4 (.brownian)
        self.noise = check_noise(noise)
        self.rng = np.random.default_rng(seed)

    def velocity(self, x: np.ndarray) -> np.ndarray:
        self.evaluations += 1
        return sphere_token_velocity(x, self.weights, self.A, self.V, self.normalised)

    def rotation(self, x: np.ndarray) -> np.ndarray:
        """``omega = x x v(x)``: the rotation whose action at ``x`` is the velocity."""
        return np.cross(x, self.velocity(x))

    def step(self, h: float) -> None:
        """One CF4 step of length ``h`` (module docstring)."""
        x = self.x
        f1 = h * self.rotation(x)
        y2 = rotate_tokens(x, 0.5 * f1)
        f2 = h * self.rotation(y2)
        y3 = rotate_tokens(x, 0.5 * f2)
        f3 = h * self.rotation(y3)
        y4 = rotate_tokens(y2, f3 - 0.5 * f1)
        f4 = h * self.rotation(y4)
        first = rotate_tokens(x, (3.0 * f1 + 2.0 * f2 + 2.0 * f3 - f4) / 12.0)
        self.x = rotate_tokens(first, (-f1 + 2.0 * f2 + 2.0 * f3 + 3.0 * f4) / 12.0)

    def integrate(self, times: ArrayLike, dt: float) -> np.ndarray:
        step = self.step if self.noise == 0.0 else partial(split_step, self.step, self._kick)
        return march(self, times, dt, step, lambda: self.x)

    def _kick(self, tau: float) -> None:
        self.x = sphere_increment(self.x, tau, self.noise, self.rng)


def token_moments(x: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """The mean vector ``sum w x`` ``(..., 3)`` and the second moment ``sum w x x^T``
    ``(..., 3, 3)`` of tokens ``x (..., n, 3)``."""
    x = np.asarray(x, float)
    n = x.shape[-2]
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, float) / np.sum(weights)
    mean = np.einsum("...nk,n->...k", x, w)
    second = np.einsum("...nk,...nl,n->...kl", x, x, w)
    return mean, second


def _token_weights(n: int, weights) -> np.ndarray:
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, float).reshape(-1)
    if w.shape != (n,) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"tokens.weights: expected {n} non-negative weights, positive sum")
    return w / w.sum()


def token_energy(x: np.ndarray, beta: float, weights: np.ndarray | None = None) -> float:
    """The tokens' exact interaction energy ``1/(2 beta) sum_ij w_i w_j e^{beta <x_i, x_j>}``
    (pairs ``i = j`` included: the energy of the empirical measure), the double sum blocked,
    each term scaled by ``e^{-beta}``."""
    x = np.asarray(x, float).reshape(-1, 3)
    w = _token_weights(x.shape[0], weights)
    beta = float(beta)
    if not (math.isfinite(beta) and 0 < beta <= 300):
        raise ValueError(f"beta: expected a number in (0, 300], got {beta!r}")
    total = 0.0
    for start in range(0, x.shape[0], _BLOCK):
        rows = slice(start, start + _BLOCK)
        exponent = beta * (x[rows] @ x.T - 1.0)
        total += float(w[rows] @ (np.exp(exponent, out=exponent) @ w))
    return total * math.exp(beta) / (2.0 * beta)


def token_amplitudes(x: np.ndarray, l_max: int = 8, weights: np.ndarray | None = None):
    """The degree amplitudes ``A_l = sqrt(4 pi (2 l + 1) sum_m |c_lm|^2)``, ``l = 0 .. l_max``,
    of the tokens' empirical measure (:func:`tpde.grid.cubed_sphere.harmonic_amplitudes` for a
    density); ``x (..., n, 3)`` gives ``(..., l_max + 1)``."""
    x = np.asarray(x, float)
    w = _token_weights(x.shape[-2], weights)
    flat = x.reshape(-1, x.shape[-2], 3)
    l = np.arange(int(l_max) + 1)
    out = np.array(
        [np.sqrt(4.0 * math.pi * (2 * l + 1) * harmonic_power(p, w, l_max)) for p in flat]
    )
    return out.reshape(*x.shape[:-2], l.size)


def fibonacci_tokens(n: int) -> np.ndarray:
    """The Fibonacci lattice of ``n`` points: heights ``z_i = 1 - (2 i + 1) / n`` (the
    mid-quantiles of the uniform law of ``z``), azimuths ``i`` times the golden angle."""
    i = np.arange(int(n))
    z = 1.0 - (2.0 * i + 1.0) / n
    phi = math.pi * (3.0 - math.sqrt(5.0)) * i
    r = np.sqrt(1.0 - z * z)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


def zonal_mode_tokens(
    n: int, modes: Sequence[tuple[int, float]], seed: int | None = None
) -> np.ndarray:
    """``n`` tokens of the law ``(1 + sum_j a_j P_{l_j}(z)) / (4 pi)``: the tokens of
    :func:`fibonacci_tokens` (``seed = None``) or ``n`` i.i.d. uniform points (``seed``) moved
    in height by the map ``z -> F^{-1}((1 + z) / 2)`` (``F`` the law's CDF in ``z``, solved
    by safeguarded Newton steps to round-off), the azimuth kept: the law pushed forward
    exactly (an i.i.d. sample of it for a seed)."""
    from scipy.special import eval_legendre

    if sum(abs(a) for _, a in modes) >= 1:
        raise ValueError("tokens.modes: the amplitudes sum to 1 or more (negative density)")
    if seed is None:
        x = fibonacci_tokens(n)
    else:
        x = np.random.default_rng(seed).normal(size=(int(n), 3))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    u = 0.5 * (1.0 + x[:, 2])

    def cdf(z: np.ndarray) -> np.ndarray:
        out = 0.5 * (1.0 + z)
        for l, a in modes:  # int_{-1}^z P_l = (P_{l+1} - P_{l-1}) / (2 l + 1)
            out = out + 0.5 * a * (eval_legendre(l + 1, z) - eval_legendre(l - 1, z)) / (2 * l + 1)
        return out

    def pdf(z: np.ndarray) -> np.ndarray:
        return 0.5 * (1.0 + sum(a * eval_legendre(l, z) for l, a in modes))

    z = inverse_cdf(cdf, pdf, u, -1.0, 1.0, x[:, 2])
    r_old = np.hypot(x[:, 0], x[:, 1])
    scale = np.divide(
        np.sqrt(np.maximum(1.0 - z * z, 0.0)), r_old, out=np.zeros_like(z), where=r_old > 0
    )
    return np.stack([x[:, 0] * scale, x[:, 1] * scale, z], axis=1)


def _unit(v: Sequence[float]) -> np.ndarray:
    m = np.asarray(v, float)
    if m.shape != (3,) or not np.linalg.norm(m) > 0:
        raise ValueError(f"initial.mean: expected a non-zero 3-vector, got {v!r}")
    return m / np.linalg.norm(m)


def sample_von_mises_fisher(
    n: int, mean: Sequence[float], kappa: float, rng: np.random.Generator | int = 0
) -> np.ndarray:
    """``n`` i.i.d. points of ``vMF(mean, kappa)`` on ``S^2``: ``w = <m, x>`` by its inverse
    CDF ``w = 1 + log(u + (1 - u) e^{-2 kappa}) / kappa``, the azimuth uniform."""
    rng = np.random.default_rng(rng)
    m = _unit(mean)
    if not (math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"initial.kappa: expected a finite number > 0, got {kappa!r}")
    u = rng.random(n)
    w = 1.0 + np.log(u + (1.0 - u) * math.exp(-2.0 * kappa)) / kappa
    w = np.clip(w, -1.0, 1.0)
    phi = 2.0 * math.pi * rng.random(n)
    # an orthonormal frame (e1, e2, m)
    helper = np.eye(3)[int(np.argmin(np.abs(m)))]
    e1 = np.cross(m, helper)
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(m, e1)
    r = np.sqrt(1.0 - w * w)
    return w[:, None] * m + (r * np.cos(phi))[:, None] * e1 + (r * np.sin(phi))[:, None] * e2


def sample_mixture(
    n: int,
    components: Sequence[tuple[float, Sequence[float], float]],
    rng: np.random.Generator | int = 0,
) -> np.ndarray:
    """``n`` i.i.d. points of ``sum_k w_k vMF(m_k, kappa_k)`` for ``(w_k, m_k, kappa_k)``."""
    rng = np.random.default_rng(rng)
    weights = np.array([c[0] for c in components], float)
    if weights.size == 0 or np.any(weights < 0) or not weights.sum() > 0:
        raise ValueError("initial.weights: expected non-negative weights, positive sum")
    which = rng.choice(weights.size, size=n, p=weights / weights.sum())
    out = np.empty((n, 3))
    for k, (_, m, kappa) in enumerate(components):
        picked = which == k
        out[picked] = sample_von_mises_fisher(int(picked.sum()), m, kappa, rng)
    return out


def sample_cell_tokens(density: np.ndarray, grid: CubedSphere, n: int, seed: int = 0) -> np.ndarray:
    """``n`` i.i.d. points of the piecewise-constant density of cubed-sphere cell averages
    (per unit area): a cell by its mass, then a point uniform by area in it (local angles
    uniform, accepted with probability ``J(a, b) / max J``; ``J <= 1``)."""
    if n < 1:
        raise ValueError(f"tokens.n: expected an integer >= 1, got {n}")
    masses = np.maximum(np.asarray(density, float), 0.0) * grid.areas
    if not masses.sum() > 0:
        raise ValueError("tokens: the density has no mass to sample from")
    rng = np.random.default_rng(seed)
    cells = rng.choice(masses.size, size=n, p=(masses / masses.sum()).ravel())
    p, i, j = np.unravel_index(cells, grid.shape)
    a = np.empty(n)
    b = np.empty(n)
    todo = np.arange(n)
    edges = grid.edges
    while todo.size:
        ua = edges[i[todo]] + grid.h * rng.random(todo.size)
        ub = edges[j[todo]] + grid.h * rng.random(todo.size)
        keep = rng.random(todo.size) < metric(ua, ub)
        a[todo[keep]], b[todo[keep]] = ua[keep], ub[keep]
        todo = todo[~keep]
    return to_sphere(p, a, b)


def grid_and_tokens(
    A: ArrayLike,
    V: ArrayLike | None,
    mean: Sequence[float],
    kappa: float,
    times: Sequence[float],
    cells: int = 8,
    tokens: int = 500,
    seeds: int = 8,
    dt: float = 0.1,
    normalised: bool = True,
    velocity_at: str = "nodes",
    cfl: float = 0.5,
) -> dict:
    """The moments of a cubed-sphere run (``cells`` per panel edge, SSP-RK3, WENO5-Z) and of
    ``seeds`` token systems of ``tokens`` i.i.d. samples each, from ``vMF(mean, kappa)``:
    ``grid_mean (T, 3)``, ``grid_second (T, 3, 3)``, ``token_mean (seeds, T, 3)``,
    ``token_second (seeds, T, 3, 3)``, the grid's mass change and wall times."""
    import time as _time

    from tpde.grid import cubed_sphere as cs
    from tpde.schemes.cubed_sphere import solve
    from tpde.variants.cubed_sphere import CubedSphereAttention

    times_ = np.asarray(times, float)
    V = np.eye(3) if V is None else np.asarray(V, float)
    start = _time.perf_counter()
    grid = cs.cubed_sphere(cells)
    field = CubedSphereAttention(
        A=np.asarray(A, float), V=V, normalised=normalised, cache_entries=60_000_000
    )
    result = solve(
        grid,
        cs.von_mises_fisher(grid, mean, kappa),
        field,
        float(times_[-1]),
        snapshots=times_,
        velocity_at=velocity_at,
        cfl=cfl,
    )
    grid_mean = np.array([cs.mean(grid, d) for d in result.densities])
    grid_second = np.array([cs.second_moment(grid, d) for d in result.densities])
    grid_time = _time.perf_counter() - start
    start = _time.perf_counter()
    token_mean, token_second = [], []
    for seed in range(int(seeds)):
        x0 = sample_von_mises_fisher(int(tokens), mean, kappa, seed)
        path = SphereTokens(x0, A, V, normalised=normalised).integrate(times_, dt)
        m, s = token_moments(path)
        token_mean.append(m)
        token_second.append(s)
    return {
        "times": times_,
        "grid_mean": grid_mean,
        "grid_second": grid_second,
        "token_mean": np.array(token_mean),
        "token_second": np.array(token_second),
        "mass_change": float(np.abs(result.masses - result.masses[0]).max()),
        "steps": result.steps,
        "grid_time": grid_time,
        "token_time": _time.perf_counter() - start,
    }
