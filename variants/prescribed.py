"""Velocity fields given in closed form: constant, affine, or any callable of (x, t)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

from tpde.grid import Grid
from tpde.schemes.velocity import VelocityField


def _finite_vector(values, ndim_name: str, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains NaN or Inf")
    return arr


class ConstantVelocity(VelocityField):
    """u(x, t) = u0, a constant vector of length d."""

    face_constant = True
    steady = True

    def __init__(self, velocity: ArrayLike):
        self.velocity = _finite_vector(velocity, "d", "velocity")
        if self.velocity.ndim != 1:
            raise ValueError(f"velocity: expected a vector, got shape {self.velocity.shape}")

    def at(self, density, grid: Grid, t, offset):
        if self.velocity.size != grid.ndim:
            raise ValueError(f"velocity: expected {grid.ndim} components, got {self.velocity.size}")
        shape = tuple(len(c) for c in grid.lattice(offset))
        return np.broadcast_to(
            self.velocity.reshape((-1,) + (1,) * grid.ndim), (grid.ndim,) + shape
        ).copy()


class AffineVelocity(VelocityField):
    """u(x, t) = M x + b, M of shape (d, d), b of length d.

    A Gaussian N(m, S) stays Gaussian: m' = M m + b, S' = M S + S M^T.
    """

    steady = True

    def __init__(self, matrix: ArrayLike, offset: ArrayLike | None = None):
        self.matrix = _finite_vector(matrix, "d", "velocity.matrix")
        d = self.matrix.shape[0]
        if self.matrix.shape != (d, d):
            raise ValueError(f"velocity.matrix: expected a square matrix, got {self.matrix.shape}")
        self.shift = np.zeros(d) if offset is None else _finite_vector(offset, "d", "velocity.b")
        if self.shift.shape != (d,):
            raise ValueError(f"velocity.b: expected length {d}, got shape {self.shift.shape}")
        off_diagonal = self.matrix - np.diag(np.diag(self.matrix))
        self.face_constant = bool(np.all(off_diagonal == 0.0))

    def at(self, density, grid: Grid, t, offset):
        d = grid.ndim
        if self.matrix.shape[0] != d:
            raise ValueError(f"velocity.matrix: expected {d} x {d}, got {self.matrix.shape}")
        coords = grid.lattice(offset)
        mesh = np.meshgrid(*coords, indexing="ij", sparse=True)
        out = np.empty((d,) + tuple(len(c) for c in coords))
        for a in range(d):
            out[a] = self.shift[a]
            for b in range(d):
                out[a] += self.matrix[a, b] * mesh[b]
        return out


class FunctionVelocity(VelocityField):
    """u(x, t) = func(x, t) for a user callable.

    ``func(x, t)`` receives ``x`` as a list of d broadcastable coordinate arrays (sparse
    ``meshgrid``, ``ij``) and returns d arrays (or one stacked array) broadcastable to the
    lattice shape. Set ``face_constant=True`` only if ``u_a`` does not depend on the other
    coordinates, and ``steady=True`` only if it does not depend on ``t``.
    """

    def __init__(self, func: Callable, face_constant: bool = False, steady: bool = False):
        if not callable(func):
            raise TypeError("velocity: expected a callable func(x, t)")
        self.func = func
        self.face_constant = bool(face_constant)
        self.steady = bool(steady)

    def at(self, density, grid: Grid, t, offset):
        coords = grid.lattice(offset)
        mesh = np.meshgrid(*coords, indexing="ij", sparse=True)
        shape = tuple(len(c) for c in coords)
        values = self.func(mesh, t)
        d = grid.ndim
        expected = f"{d} arrays broadcastable to {shape} (or one array of shape {(d, *shape)})"
        try:
            count = len(values)
        except TypeError:
            count = None
        if count != d:
            got = type(values).__name__ if count is None else f"{count} component(s)"
            raise ValueError(f"velocity: func(x, t) must return {expected}, got {got}")
        out = np.empty((d,) + shape)
        for a in range(d):
            try:
                out[a] = np.broadcast_to(np.asarray(values[a], dtype=float), shape)
            except (ValueError, TypeError):
                raise ValueError(
                    f"velocity: func(x, t) must return {expected}; component {a} has "
                    f"shape {np.shape(values[a])}"
                ) from None
        return out
