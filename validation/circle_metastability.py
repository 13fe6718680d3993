"""Metastability on the circle: the interaction energy and its staircase, grid against tokens.

docs/theory.md, 'Metastability on the circle'. With ``A = beta I``, ``V = I`` the interaction
energy

    E(mu) = 1/(2 beta) iint e^{beta cos(theta - phi)} dmu(theta) dmu(phi)
          = 1/(2 beta) sum_{k in Z} I_k(beta) |c_k|^2,   c_k = int e^{-i k theta} dmu,

grows along both the normalised and the unnormalised flow: for tokens (weights ``w_i``,
``Z_i = sum_j w_j e^{beta cos(theta_j - theta_i)}``, velocity ``v_i``)

    dE/dt = sum_i w_i Z_i v_i^2      (normalised),     sum_i w_i v_i^2    (unnormalised),

and the same with ``dmu`` for the mean field (:func:`energy_rate`). From the uniform measure
plus a small perturbation the fastest modes grow into clusters, which then merge on
exponentially long time scales: the energy climbs a staircase whose plateaus are the energies
of the clusters as point masses, ``1/(2 beta) sum_ab m_a m_b e^{beta cos(theta_a - theta_b)}``
(:func:`point_mass_energy`).

:func:`metastability_study` runs that from one law on the grid (several resolutions) and with
tokens (the law's mid-quantiles: the mean field without sampling noise; i.i.d. samples over
several seeds), and tabulates clusters, energies and ``W_2`` on the circle
(:mod:`.circle_transport`) over time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ive

from tpde.grid import Grid
from tpde.grid.circle import TWO_PI, circle_copies, circle_grid, clusters, uniform_modes

from .circle_transport import circle_w2
from .sphere_tokens import CircleTokens, _truncation, circle_token_velocity, inverse_cdf

__all__ = [
    "clusters_from_noise",
    "energy_rate",
    "format_table",
    "histogram",
    "merge_times",
    "metastability_study",
    "point_mass_energy",
    "quantile_tokens",
    "token_clusters",
    "token_energy",
]

_BLOCK = 1024


def _weights(n: int, weights: ArrayLike | None) -> np.ndarray:
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, float).reshape(-1)
    if w.shape != (n,) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"tokens.weights: expected {n} non-negative weights, positive sum")
    return w / w.sum()


def token_energy(
    theta: ArrayLike, beta: float, weights: ArrayLike | None = None, method: str = "fourier"
) -> float:
    """The tokens' own interaction energy ``1/(2 beta) sum_ij w_i w_j e^{beta cos(theta_i -
    theta_j)}`` (the pairs ``i = j`` included: the exact energy of the empirical measure).

    ``"fourier"``: ``1/(2 beta) sum_k I_k(beta) |c_k|^2`` with the tokens' exact
    coefficients ``c_k`` (powers of ``e^{i theta_j}``), truncated where ``I_k / I_0 < 1e-18``:
    every term is positive and the sum is at least ``I_0(beta)``, so the result is exact to
    round-off, in ``O(n K)``. ``"direct"``: the double sum, blocked, ``O(n^2)``.
    """
    x = np.asarray(theta, float).reshape(-1)
    w = _weights(x.size, weights)
    beta = float(beta)
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta: expected a number > 0, got {beta!r}")
    if method == "direct":
        total = 0.0
        for start in range(0, x.size, _BLOCK):
            rows = slice(start, start + _BLOCK)
            kernel = np.exp(beta * (np.cos(x[rows, None] - x[None, :]) - 1.0))
            total += float(w[rows] @ kernel @ w)
        return total * math.exp(beta) / (2.0 * beta)
    if method != "fourier":
        raise ValueError(f"method: unknown {method!r}; choose fourier or direct")
    big = _truncation(beta) + 1
    z = np.exp(1j * x)
    powers = np.empty((x.size, big + 1), complex)
    powers[:, 0] = 1.0
    np.cumprod(np.broadcast_to(z[:, None], (x.size, big)), axis=1, out=powers[:, 1:])
    c = np.conj(powers).T @ w
    k = np.arange(big + 1)
    terms = np.where(k == 0, 1.0, 2.0) * ive(k, beta) * np.abs(c) ** 2
    return float(np.sum(terms[::-1]) * math.exp(beta) / (2.0 * beta))


def energy_rate(
    theta: ArrayLike, beta: float, weights: ArrayLike | None = None, normalised: bool = True
) -> float:
    """``dE/dt`` of the tokens by the identity of the module docstring:
    ``sum_i w_i Z_i v_i^2`` (normalised) or ``sum_i w_i v_i^2`` (unnormalised), >= 0."""
    from tpde.variants.spherical import circle_head

    x = np.asarray(theta, float).reshape(-1)
    w = _weights(x.size, weights)
    head = circle_head(beta)
    v = circle_token_velocity(x, w, head, normalised)
    if not normalised:
        return float(w @ (v * v))
    z = np.zeros(x.size)
    for start in range(0, x.size, _BLOCK):
        rows = slice(start, start + _BLOCK)
        z[rows] = np.exp(beta * np.cos(x[None, :] - x[rows, None])) @ w
    return float(w @ (z * v * v))


def point_mass_energy(angles: ArrayLike, masses: ArrayLike, beta: float) -> float:
    """``1/(2 beta) sum_ab m_a m_b e^{beta cos(theta_a - theta_b)}``: the energy of point
    masses (clusters); ``e^beta / (2 beta)`` for one unit mass."""
    a = np.asarray(angles, float).reshape(-1)
    m = np.asarray(masses, float).reshape(-1)
    return float(m @ np.exp(beta * np.cos(a[:, None] - a[None, :])) @ m / (2.0 * beta))


def quantile_tokens(
    n: int, modes: Sequence[tuple[int, float, float]], seed: int | None = None
) -> np.ndarray:
    """``n`` tokens of the law ``(1 + sum_j a_j cos(k_j (theta - p_j))) / (2 pi)``: the
    quantiles ``F^{-1}(u_i)`` at the mid-points ``u_i = (i - 1/2) / n`` (``seed=None``: no
    sampling noise below mode ``n``) or at i.i.d. uniform ``u_i`` (``seed``: an exact i.i.d.
    sample of the law). ``F(theta) = u`` is solved by safeguarded Newton steps to round-off.
    """
    if sum(abs(a) for _, a, _ in modes) >= 1:
        raise ValueError("tokens.modes: the amplitudes sum to 1 or more (negative density)")
    if seed is None:
        u = (np.arange(n) + 0.5) / n
    else:
        u = np.sort(np.random.default_rng(seed).uniform(size=n))

    def cdf(th: np.ndarray) -> np.ndarray:
        out = th / TWO_PI
        for k, a, p in modes:
            out = out + a * (np.sin(k * (th - p)) + math.sin(k * p)) / (TWO_PI * k)
        return out

    def pdf(th: np.ndarray) -> np.ndarray:
        out = np.ones_like(th)
        for k, a, p in modes:
            out = out + a * np.cos(k * (th - p))
        return out / TWO_PI

    return inverse_cdf(cdf, pdf, u, 0.0, TWO_PI, TWO_PI * u)


def histogram(theta: ArrayLike, grid: Grid, weights: ArrayLike | None = None) -> np.ndarray:
    """The tokens' cell averages on a whole-circle grid (mass per cell / cell width)."""
    if circle_copies(grid) != 1:
        raise ValueError("tokens: a histogram on the whole circle (a grid with m = 1)")
    x = np.mod(np.asarray(theta, float).reshape(-1), TWO_PI)
    w = _weights(x.size, weights)
    n = grid.cells[0]
    cell = np.minimum((x / grid.spacing[0]).astype(int), n - 1)
    return np.bincount(cell, weights=w, minlength=n) / grid.spacing[0]


def token_clusters(
    theta: ArrayLike, grid: Grid, weights: ArrayLike | None = None, threshold: float = 2.0
) -> tuple[np.ndarray, np.ndarray]:
    """The clusters of tokens as :func:`tpde.grid.circle.clusters` counts them on their
    histogram on ``grid`` (the same definition as the grid density's)."""
    return clusters(histogram(theta, grid, weights), grid, threshold)


def _grid_run(beta: float, modes, cells: int, times: np.ndarray, step: float) -> list[np.ndarray]:
    from tpde.schemes.solver import Problem, Scheme, Solver
    from tpde.variants.spherical import CircleAttention, circle_head

    grid = circle_grid(cells)
    problem = Problem(
        grid,
        uniform_modes(grid, modes),
        CircleAttention(circle_head(beta), engine="fft"),
        float(times[-1]),
        scheme=Scheme(dt_max=step),
        snapshots=list(times),
    )
    result = Solver(problem).run()
    return [s.density for s in result.snapshots]


def metastability_study(
    beta: float,
    modes: Sequence[tuple[int, float, float]],
    t_end: float,
    cells: Sequence[int] = (512, 2048),
    n: int = 10_000,
    seeds: Sequence[int] = (0, 1, 2),
    snapshots: int = 15,
    dt: float = 0.1,
    grid_step: float = 0.1,
    count_cells: int = 128,
    w2_every: int = 1,
) -> dict[str, Any]:
    """Attention ``A = beta I``, ``V = I`` from ``(1 + sum a cos(k (theta - p))) / (2 pi)``
    (``modes``) to ``t_end``: on the grid for each of ``cells`` (exact initial averages,
    FFT engine, WENO5-Z, SSP-RK3 with ``dt <= grid_step``), with the ``n`` mid-quantile
    tokens of the law (``"mid"``: the mean field without sampling noise) and with ``n``
    i.i.d. tokens for each seed (RK4, ``dt``).

    Returns per snapshot time: the clusters (counted on a ``count_cells`` grid for tokens,
    coarse enough that i.i.d. noise stays below the threshold, on their own grid for the
    grid runs), the energies (grid: from the cell averages,
    :func:`tpde.variants.spherical.interaction_energy`; tokens: :func:`token_energy`),
    ``W_2`` on the circle from each grid run and each seed to the mid tokens, and the
    sampling noise: ``W_2`` between seeds (mean over pairs); the distances at every
    ``w2_every``-th snapshot (NaN between).
    """
    from tpde.variants.spherical import circle_head, interaction_energy

    times = np.linspace(0.0, float(t_end), int(snapshots))
    out: dict[str, Any] = {"beta": float(beta), "modes": list(modes), "n": int(n)}
    out["times"] = times
    grids = {c: circle_grid(c) for c in cells}
    counting = circle_grid(count_cells)
    runs: dict[str, np.ndarray] = {}
    for name, seed in [("mid", None)] + [(f"seed {s}", s) for s in seeds]:
        tokens = CircleTokens(quantile_tokens(n, modes, seed), circle_head(beta))
        runs[name] = tokens.integrate(times, dt)
    densities = {c: _grid_run(beta, modes, c, times, grid_step) for c in cells}
    rows = []
    for i, t in enumerate(times):
        row: dict[str, Any] = {"t": float(t)}
        distances = i % int(w2_every) == 0 or i == times.size - 1
        nan = float("nan")
        for c in cells:
            g, rho = grids[c], densities[c][i]
            row[f"clusters {c}"] = int(clusters(rho, g)[0].size)
            row[f"E {c}"] = interaction_energy(rho, g, beta)
            row[f"W2 {c}"] = circle_w2(rho, runs["mid"][i], grid_a=g) if distances else nan
        for name, angles in runs.items():
            row[f"clusters {name}"] = int(token_clusters(angles[i], counting)[0].size)
            row[f"E {name}"] = token_energy(angles[i], beta)
            if name != "mid":
                row[f"W2 {name}"] = circle_w2(angles[i], runs["mid"][i]) if distances else nan
        pairs = [
            circle_w2(runs[f"seed {a}"][i], runs[f"seed {b}"][i])
            for j, a in enumerate(seeds)
            for b in seeds[j + 1 :]
        ]
        row["noise"] = float(np.mean(pairs)) if pairs and distances else nan
        rows.append(row)
    out["rows"] = rows
    out["tokens"] = runs
    out["densities"] = densities
    out["grids"] = grids
    return out


def merge_times(times: ArrayLike, counts: Sequence[int], settle: int = 3) -> list[float]:
    """The times at which a cluster count falls once the clusters have formed: from the
    first snapshot after which the count stays the same for ``settle`` snapshots (while the
    clusters form, the count of maxima flickers), the first snapshot with fewer clusters
    than the one before, one entry per cluster lost."""
    t = np.asarray(times, float)
    c = np.asarray(counts, int)
    formed = next(
        (i for i in range(c.size - settle) if c[i] > 0 and np.all(c[i : i + settle + 1] == c[i])),
        c.size,
    )
    out: list[float] = []
    for i in range(formed + 1, c.size):
        out += [float(t[i])] * max(int(c[i - 1] - c[i]), 0)
    return out


def format_table(rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A markdown table of the study's rows (integers as such, floats to 6 digits)."""
    columns = list(rows[0]) if columns is None else list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for c in columns:
            v = row[c]
            cells.append(str(v) if isinstance(v, int) else f"{v:.6g}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def clusters_from_noise(
    beta: float,
    cells: int = 512,
    amplitude: float = 1e-4,
    k_noise: int = 48,
    seed: int = 0,
    extra: float = 4.0,
    snapshots: int = 41,
    threshold: float = 2.0,
) -> dict[str, Any]:
    """Run ``A = beta I``, ``V = I`` from the uniform density times ``1 + amplitude *
    noise`` (:func:`tpde.grid.circle.smooth_noise` of degree ``k_noise``) until the fastest
    mode has grown to order one and ``extra`` e-folds more,
    ``T = (log(1 / amplitude) + extra) / lambda_max``, and count the clusters there (local
    maxima above ``threshold`` times the uniform density). Returns the count, the fastest
    mode ``k_max``, the clusters' angles and masses, and the solver's Result."""
    from tpde.grid.circle import smooth_noise
    from tpde.schemes.solver import Problem, Scheme, Solver
    from tpde.variants.spherical import CircleAttention, circle_head

    from .sphere_rates import fastest_mode, linear_rate

    grid = circle_grid(cells)
    k_max = fastest_mode(beta)
    t_end = (math.log(1.0 / amplitude) + extra) / linear_rate(k_max, beta)
    density = smooth_noise(grid, amplitude, k_noise, seed)
    # the CFL bound is a positivity bound: while the velocity is O(amplitude) it allows steps
    # far beyond what SSP-RK3 resolves of the growth, hence dt_max = 0.1 / lambda_max
    scheme = Scheme(dt_max=0.1 / linear_rate(k_max, beta))
    problem = Problem(
        grid,
        density,
        CircleAttention(circle_head(beta)),
        t_end,
        scheme=scheme,
        snapshots=snapshots,
    )
    result = Solver(problem).run()
    angles, masses = clusters(result.final, grid, threshold)
    return {
        "beta": float(beta),
        "k_max": k_max,
        "count": int(angles.size),
        "angles": angles,
        "masses": masses,
        "t_end": t_end,
        "result": result,
        "grid": grid,
    }
