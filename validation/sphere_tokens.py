"""Tokens on the circle: the particle reference of the Transformer PDE on S^1.

docs/theory.md, 'Attention dynamics on the sphere' and 'Tokens on the circle'. ``n`` tokens
at angles ``theta_i`` with weights ``w_i`` (sum 1) move by

    theta_i' = <t(theta_i), Gamma_{mu^n}(x_i)>,   mu^n = sum_j w_j delta_{x_j},
    x = (cos theta, sin theta),  t = (-sin theta, cos theta),

the field of :mod:`tpde.variants.spherical` on the empirical measure. The ODE is integrated
in the angles with classical RK4 (``integrate``): the tokens stay on the circle exactly, with
no projection or normalisation step, and the scheme keeps its fourth order.

Sums (``method=``):

* ``"fourier"`` (``A = a I + b J``, any ``C``): the kernel's Fourier series truncated where
  ``I_k(r) / I_0(r) < 1e-18``, the token coefficients ``c_k = sum_j w_j e^{-i k theta_j}``
  by powers of ``e^{i theta_j}``: ``O(n K)`` per evaluation. A token sees itself with the
  largest kernel value, so the denominator is at least ``w_i e^{r}`` and the absolute error
  ``1e-16 e^r`` is a relative ``1e-16 / w_i``: ``1e-12`` for ``n = 10^4``.
* ``"direct"`` (any ``A``, ``C``): dense sums blocked over targets, each row shifted by its
  maximum (relative accuracy), ``O(n^2)``.
* ``"auto"``: Fourier for a rotation-invariant ``A``, direct otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ive

from tpde.grid import Grid
from tpde.grid.circle import TWO_PI, circle_copies
from tpde.variants.parameters import Head, ParamSpec, as_param_spec, params_at
from tpde.variants.spherical import conformal_parts, is_conformal

from .brownian import check_noise, circle_increment, split_step

__all__ = [
    "CircleTokens",
    "circle_token_run",
    "circle_token_velocity",
    "mode_tokens",
    "sample_circle_tokens",
    "token_modes",
]

_TRUNCATION = 1e-18
_BLOCK = 512


def _head(spec: ParamSpec, t: float) -> Head:
    head = params_at(spec, t)
    if not isinstance(head, Head) or head.dim != 2:
        raise ValueError("attention: tokens on the circle need one head with 2 x 2 A and C")
    return head


def _truncation(r: float) -> int:
    """The smallest K with I_K(r) / I_0(r) below 1e-18 (at least 2)."""
    scale = float(ive(0, r))
    k = 2
    while float(ive(k, r)) > _TRUNCATION * scale:
        k += max(1, k // 4)
    return k


def circle_token_velocity(
    theta: np.ndarray,
    weights: np.ndarray,
    head: Head,
    normalised: bool = True,
    method: str = "auto",
) -> np.ndarray:
    """``theta_i'`` for tokens at ``theta`` (n,) with ``weights`` (n,) (used as given)."""
    theta = np.asarray(theta, float)
    weights = np.asarray(weights, float)
    conformal = is_conformal(head.A)
    if method == "auto":
        method = "fourier" if conformal else "direct"
    if method == "fourier":
        if not conformal:
            raise ValueError('tokens: "fourier" sums need A = a I + b J; use "direct"')
        return _fourier(theta, weights, head, normalised)
    if method == "direct":
        return _direct(theta, weights, head, normalised)
    raise ValueError(f"tokens.method: unknown {method!r}; choose auto, fourier or direct")


def _fourier(theta, weights, head: Head, normalised: bool) -> np.ndarray:
    a, b, _, _ = conformal_parts(head.A)
    r, alpha = math.hypot(a, b), math.atan2(b, a)
    p, q, c, d = conformal_parts(head.C)
    big = _truncation(r) + 1
    k = np.arange(big + 1)
    # e^{i k theta_j}, k = 0 .. big, by powers
    z = np.exp(1j * theta)
    powers = np.empty((theta.size, big + 1), complex)
    powers[:, 0] = 1.0
    np.cumprod(np.broadcast_to(z[:, None], (theta.size, big)), axis=1, out=powers[:, 1:])
    coefficients = np.conj(powers).T @ weights  # c_k = sum_j w_j e^{-i k theta_j}, k >= 0
    # int G(phi - theta) dmu = sum_k G_hat(-k) c_k e^{i k theta}; for a real kernel the
    # terms at -k are the conjugates of those at k
    twice = np.where(k == 0, 1.0, 2.0)

    def g0(kk):
        return ive(np.abs(kk), r) * np.exp(-1j * kk * alpha)

    def real_convolution(factors: np.ndarray) -> np.ndarray:
        return (powers @ (twice * factors * coefficients)).real

    numerator = real_convolution(
        p * (g0(-k - 1) - g0(-k + 1)) / 2j + q * (g0(-k - 1) + g0(-k + 1)) / 2.0
    )
    if math.hypot(c, d) > 0:
        # e^{i s} g(s) is complex: its sum needs the modes k < 0 too (c_{-k} = conj(c_k))
        conv = powers @ (g0(-k - 1) * coefficients)
        conv += np.conj(powers[:, 1:]) @ (g0(k[1:] - 1) * np.conj(coefficients[1:]))
        numerator += (complex(d, c) * z * z * conv).real
    if not normalised:
        return numerator * math.exp(r)
    z_val = real_convolution(g0(-k))
    bound = float(np.linalg.norm(head.C, 2))
    return np.clip(numerator / z_val, -bound, bound)


def march(tokens, times: ArrayLike, dt: float, step: Callable[[float], None], state) -> np.ndarray:
    """Advance ``tokens`` (an object whose ``t`` is its time) through the increasing
    ``times``, by ``step(h)`` with ``h <= dt`` landing on each time exactly (no sliver step
    before it), and return ``state()`` at each: (len(times), *state().shape)."""
    times = np.asarray(times, float).reshape(-1)
    if not (math.isfinite(dt) and dt > 0):
        raise ValueError(f"tokens.dt: expected a positive number, got {dt!r}")
    if np.any(np.diff(times) < 0) or times[0] < tokens.t:
        raise ValueError("tokens.times: expected increasing times from the current time")
    out = np.empty((times.size, *np.shape(state())))
    for i, target in enumerate(times):
        while tokens.t < target:
            h = target - tokens.t
            if h > dt * (1.0 + 1e-9):
                h = min(dt, 0.5 * h) if h < 2.0 * dt else dt  # no sliver before target
            step(h)
            tokens.t += h
            if abs(tokens.t - target) <= 1e-12 * max(1.0, abs(target)):
                tokens.t = float(target)
        out[i] = state()
    return out


def inverse_cdf(
    cdf: Callable[[np.ndarray], np.ndarray],
    pdf: Callable[[np.ndarray], np.ndarray],
    u: np.ndarray,
    lower: float,
    upper: float,
    start: np.ndarray,
) -> np.ndarray:
    """``F^{-1}(u)`` per entry of ``u`` for a monotone ``cdf`` on ``[lower, upper]`` with
    density ``pdf``: Newton steps from ``start``, each kept inside the bracket that the signs
    of ``F - u`` have left (else bisected), until a step is below 1e-15 (100 at most)."""
    lo, hi = np.full(u.size, float(lower)), np.full(u.size, float(upper))
    x = np.asarray(start, float).copy()
    for _ in range(100):
        f = cdf(x) - u
        lo = np.where(f < 0, x, lo)
        hi = np.where(f > 0, x, hi)
        step = f / pdf(x)
        new = x - step
        outside = (new <= lo) | (new >= hi)
        x = np.where(outside, 0.5 * (lo + hi), new)
        if np.abs(step).max() < 1e-15 and not outside.any():
            break
    return x


def _direct(theta, weights, head: Head, normalised: bool) -> np.ndarray:
    y = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    tangents = np.stack([-np.sin(theta), np.cos(theta)], axis=1)
    ax = y @ head.A.T  # A x_i
    cy = y @ head.C.T  # C y_j
    out = np.empty(theta.size)
    for start in range(0, theta.size, _BLOCK):
        rows = slice(start, start + _BLOCK)
        exponent = ax[rows] @ y.T
        shift = exponent.max(axis=1, keepdims=True)
        kernel = np.exp(exponent - shift) * weights
        projected = tangents[rows] @ cy.T
        numerator = np.einsum("ij,ij->i", kernel, projected)
        if normalised:
            out[rows] = numerator / kernel.sum(axis=1)
        else:
            out[rows] = numerator * np.exp(shift[:, 0])
    return out


class CircleTokens:
    """A token system on the circle: angles, weights, parameters, the field's options.

    ``integrate(times, dt)`` runs classical RK4 in the angles with steps of at most ``dt``,
    landing on each output time, and returns the angles (len(times), n), wrapped to
    ``[0, 2 pi)``. ``noise`` eps > 0: each step is split around the exact Brownian
    substeps of :mod:`.brownian` (weak order 2), drawn from ``seed``.
    """

    def __init__(
        self,
        theta: np.ndarray,
        params: ParamSpec,
        weights: np.ndarray | None = None,
        normalised: bool = True,
        method: str = "auto",
        noise: float = 0.0,
        seed: int = 0,
    ):
        self.theta = np.asarray(theta, float).reshape(-1).copy()
        n = self.theta.size
        if n < 1 or not np.all(np.isfinite(self.theta)):
            raise ValueError("tokens: expected at least one finite angle")
        w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, float)
        if w.shape != (n,) or np.any(w < 0) or not w.sum() > 0:
            raise ValueError(f"tokens.weights: expected {n} non-negative weights, positive sum")
        self.weights = w / w.sum()
        self.spec = as_param_spec(params)
        self.normalised = bool(normalised)
        self.method = method
        self.t = 0.0
        # noise: dtheta = ... + sqrt(2 eps) dB, split around RK4 (validation.brownian)
        self.noise = check_noise(noise)
        self.rng = np.random.default_rng(seed)

    def velocity(self, theta: np.ndarray, t: float) -> np.ndarray:
        head = _head(self.spec, t)
        return circle_token_velocity(theta, self.weights, head, self.normalised, self.method)

    def integrate(self, times: ArrayLike, dt: float) -> np.ndarray:
        step = self._rk4 if self.noise == 0.0 else partial(split_step, self._rk4, self._kick)
        return march(self, times, dt, step, lambda: np.mod(self.theta, TWO_PI))

    def _kick(self, tau: float) -> None:
        self.theta = circle_increment(self.theta, tau, self.noise, self.rng)

    def _rk4(self, h: float) -> None:
        th, t = self.theta, self.t
        k1 = self.velocity(th, t)
        k2 = self.velocity(th + 0.5 * h * k1, t + 0.5 * h)
        k3 = self.velocity(th + 0.5 * h * k2, t + 0.5 * h)
        k4 = self.velocity(th + h * k3, t + h)
        self.theta = th + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def token_modes(theta: np.ndarray, weights: np.ndarray | None, k_max: int) -> np.ndarray:
    """``c_k = sum_j w_j e^{-i k theta_j}`` for ``k = 0 .. k_max`` (the tokens' Fourier
    coefficients, comparable with :func:`tpde.grid.circle.fourier_modes`); ``theta`` may
    carry leading axes (times)."""
    theta = np.asarray(theta, float)
    n = theta.shape[-1]
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, float) / np.sum(weights)
    k = np.arange(int(k_max) + 1)
    return np.exp(-1j * theta[..., None, :] * k[:, None]) @ w


def mode_tokens(n: int, k: int, amplitude: float, phase: float = 0.0) -> np.ndarray:
    """``n`` tokens at the mid-quantiles of ``(1 + amplitude cos(k (theta - phase))) / (2 pi)``:
    ``F(theta_i) = (i - 1/2) / n`` solved by Newton's method (to round-off). Without the
    perturbation these are equally spaced, whose Fourier modes vanish below ``k = n``: the
    quasi-uniform tokens that follow the mean field without sampling noise."""
    if not 0 <= abs(amplitude) < 1:
        raise ValueError(f"tokens.amplitude: expected |amplitude| < 1, got {amplitude!r}")
    target = TWO_PI * (np.arange(n) + 0.5) / n
    theta = target.copy()
    for _ in range(50):
        f = theta + amplitude * (np.sin(k * (theta - phase)) + math.sin(k * phase)) / k - target
        step = f / (1.0 + amplitude * np.cos(k * (theta - phase)))
        theta -= step
        if np.abs(step).max() < 1e-16:
            break
    return theta


def sample_circle_tokens(density: np.ndarray, grid: Grid, n: int, seed: int = 0) -> np.ndarray:
    """``n`` i.i.d. angles from the piecewise-constant density of the cell averages on a
    circle grid (``m = 1``): a cell by its mass, then a uniform point in it."""
    if circle_copies(grid) != 1:
        raise ValueError("tokens: sample on the whole circle (a grid with m = 1)")
    from .particles import sample_tokens

    return np.mod(sample_tokens(density, grid, n, seed)[:, 0], TWO_PI)


def circle_token_run(
    density: np.ndarray,
    grid: Grid,
    spec: ParamSpec,
    normalised: bool,
    times: np.ndarray,
    t_start: float,
    n: int,
    seed: int = 0,
    quantiles: bool = False,
) -> tuple[np.ndarray, np.ndarray, float]:
    """``n`` tokens of the cell averages ``density`` on the circle ``grid`` (i.i.d. with
    ``seed``, or the deterministic mid-quantiles with ``quantiles``) moved by the token
    system (:class:`CircleTokens`: classical RK4 in the angles, head ``spec``) from
    ``t_start`` through ``times``, with a tenth of the smallest interval between snapshots as
    the step. Returns the angles ``(time, n)``, their histograms on the grid's cells as
    densities per unit angle ``(time, cells)`` and the step."""
    from .particles import quantile_tokens_of_cells

    if quantiles:
        theta = quantile_tokens_of_cells(density, grid, n)[:, 0]
    else:
        theta = sample_circle_tokens(density, grid, n, seed)
    step = float(np.min(np.diff(times))) / 10 if len(times) > 1 else 0.01
    tokens = CircleTokens(theta, spec, normalised=normalised)
    tokens.t = t_start
    angles = tokens.integrate(times, step)
    edges = grid.edges(0)
    histograms = np.stack(
        [np.histogram(a, bins=edges)[0] / (n * grid.spacing[0]) for a in angles]
    ).astype(float)
    return angles, histograms, step
