"""Velocities on the cubed sphere (:mod:`tpde.schemes.cubed_sphere`): solid-body rotation and
softmax attention with ``A = beta I``, ``V = I``.

docs/theory.md, 'The cubed sphere'. The attention field is the tangential part of the tilted
mean,

    v(x) = P_x Gamma(x),   Gamma(x) = int y e^{beta <x, y>} rho dA / int e^{beta <x, y>} rho dA,

(``P_x = I - x x^T``), computed by dense sums over the ``nodes x nodes`` Gauss nodes of every
cell, with the density at the nodes from the fifth-order reconstruction
(:func:`tpde.grid.cubed_sphere.point_values`; negatives set to zero) and the weights ``J w h^2``
of the nodes. The kernel is scaled by ``e^{-beta}`` (every term ``<= 1``). Where the kernel
matrix between the lattice and the nodes fits in ``cache_entries`` numbers it is kept between
calls (the lattice of the face nodes does not change), so a call is one matrix product.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tpde.grid.cubed_sphere import CubedSphere, point_values

__all__ = ["SolidRotation", "CubedSphereAttention", "rotate"]


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


class CubedSphereAttention:
    """Softmax attention ``A = beta I``, ``V = I`` on the cubed sphere (module docstring)."""

    steady = False

    def __init__(self, beta: float, nodes: int = 3, cache_entries: int = 12_000_000):
        if not (math.isfinite(beta) and beta > 0):
            raise ValueError(f"attention.beta: expected a finite number > 0, got {beta!r}")
        self.beta = float(beta)
        self.nodes = int(nodes)
        self.cache_entries = int(cache_entries)
        self._cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _kernel(self, points: np.ndarray, sources: np.ndarray) -> np.ndarray:
        """``e^{beta (<x, y> - 1)}``, kept for the next call with the same points."""
        if self._cache is not None:
            cached_points, cached_sources, kernel = self._cache
            if (
                cached_points.shape == points.shape
                and cached_sources.shape == sources.shape
                and np.array_equal(cached_points, points)
                and np.array_equal(cached_sources, sources)
            ):
                return kernel
        kernel = np.exp(self.beta * (points @ sources.T - 1.0))
        self._cache = (points.copy(), sources.copy(), kernel)
        return kernel

    def sums(self, density, grid: CubedSphere, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``e^{-beta} Z(x)`` ``(M,)`` and ``e^{-beta} int y e^{beta <x, y>} rho dA`` ``(M, 3)``."""
        y, values, weights = point_values(grid, density, self.nodes)
        sources = y.reshape(-1, 3)
        mass = (np.maximum(values, 0.0) * weights).reshape(-1)
        columns = np.concatenate([mass[:, None], mass[:, None] * sources], axis=1)  # (S, 4)
        if points.shape[0] * sources.shape[0] <= self.cache_entries:
            total = self._kernel(points, sources) @ columns
        else:
            total = np.empty((points.shape[0], 4))
            block = max(1, self.cache_entries // (4 * sources.shape[0]))
            for start in range(0, points.shape[0], block):
                part = points[start : start + block]
                total[start : start + block] = (
                    np.exp(self.beta * (part @ sources.T - 1.0)) @ columns
                )
        return total[:, 0], total[:, 1:]

    def tangent(self, density, grid: CubedSphere, t: float, points: np.ndarray) -> np.ndarray:
        z, g = self.sums(density, grid, points)
        gamma = g / z[:, None]
        return gamma - np.sum(gamma * points, axis=1)[:, None] * points
