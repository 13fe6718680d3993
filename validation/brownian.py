"""Noisy tokens: Brownian increments for the token systems of R^d, the circle and the sphere.

docs/theory.md, 'Noise: tokens'. The noisy Transformer PDE ``d/dt mu + div(mu Gamma_mu) =
eps Delta mu`` is the mean-field law of tokens ``dX = Gamma_{mu^n}(X) dt + sqrt(2 eps) dB`` (``B``
a Brownian motion of the manifold). Each token step of length ``h`` is the symmetric
splitting

    noise(h / 2), the deterministic step (RK4 / CF4) of length h, noise(h / 2),

with the noise substep sampled exactly in ``R^d`` (``x + sqrt(eps h) xi``, ``xi ~ N(0, I)``) and
on the circle (the angle, ``theta + sqrt(eps h) xi``): the splitting of the generator is then
of weak order 2 (additive noise, an exact noise flow, a symmetric composition). On ``S^2`` the
noise substep is the rotation by the tangent increment, ``x <- exp([omega]_x) x`` with
``omega = sqrt(eps h) xi``, ``xi ~ N(0, I_3)`` (its part along ``x`` does not move ``x``): it
stays on the sphere exactly, its tangent displacement has covariance ``eps h`` per direction
and its mean in ``R^3`` is ``-2 eps (h / 2) x + O(h^2)``, the Ito drift of the Brownian motion
on ``S^2``; it matches the heat semigroup to ``O(h^2)`` per substep, so the token scheme is of
weak order 1 on the sphere.

Every system takes a ``seed``: a noisy run is reproducible (numpy's PCG64 generator).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def check_noise(eps: float) -> float:
    """``tokens.noise``: a finite number >= 0."""
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps >= 0.0):
        raise ValueError(f"tokens.noise: expected a finite number >= 0, got {eps!r}")
    return float(eps)


def flat_increment(x: np.ndarray, tau: float, eps: float, rng: np.random.Generator) -> np.ndarray:
    """``x + sqrt(2 eps tau) xi``: the exact Brownian substep in R^d (x: (n, d))."""
    return x + math.sqrt(2.0 * eps * tau) * rng.standard_normal(x.shape)


def circle_increment(
    theta: np.ndarray, tau: float, eps: float, rng: np.random.Generator
) -> np.ndarray:
    """``theta + sqrt(2 eps tau) xi``: the exact Brownian substep of the angles (n,)."""
    return theta + math.sqrt(2.0 * eps * tau) * rng.standard_normal(theta.shape)


def rotate_tokens(x: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """``exp(omega_i) x_i``: each token rotated by ``|omega_i|`` about ``omega_i`` (Rodrigues)."""
    angle = np.linalg.norm(omega, axis=1)
    safe = np.where(angle > 0, angle, 1.0)
    k = omega / safe[:, None]
    c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]
    kx = np.sum(k * x, axis=1)[:, None]
    return x * c + np.cross(k, x) * s + k * kx * (1.0 - c)


def sphere_increment(x: np.ndarray, tau: float, eps: float, rng: np.random.Generator) -> np.ndarray:
    """The rotation of each point of ``S^2`` (x: (n, 3)) by ``omega = sqrt(2 eps tau) xi``,
    ``xi ~ N(0, I_3)``: on the sphere exactly, weak order 1 (module docstring)."""
    return rotate_tokens(x, math.sqrt(2.0 * eps * tau) * rng.standard_normal(x.shape))


def split_step(step: Callable[[float], None], kick: Callable[[float], None], h: float) -> None:
    """The symmetric splitting: ``kick(h / 2)``, ``step(h)``, ``kick(h / 2)``."""
    kick(0.5 * h)
    step(h)
    kick(0.5 * h)
