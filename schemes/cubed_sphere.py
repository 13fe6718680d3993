"""Finite volumes on the cubed sphere: WENO along grid lines, Gauss fluxes, positivity, SSP-RK.

docs/theory.md, 'The cubed sphere'. On each panel the continuity equation in the local angles
``(a, b)`` (:mod:`tpde.grid.cubed_sphere`) is the flat one for the coordinate density
``q = J rho``:

    d/dt q + d/da (q a') + d/db (q b') = 0,   a' = <grad a, v>,  b' = <grad b, v>,

so the update of the coordinate cell averages ``q_bar`` is the Cartesian one on a uniform
grid of spacing ``h``: ``d q_bar / dt = -(sum of outward face fluxes) / h^2``, the flux through
a face ``a = a_f`` being ``int q a' db``. Per face:

* states: the reconstruction (WENO5-Z by default, :mod:`tpde.schemes.reconstruction`) along
  the panel's grid lines gives the two line averages of ``q`` over the face, from the cells of
  the panel and three ghost cells beyond its edges (:func:`tpde.grid.cubed_sphere.halo_matrix`);
* transverse: degree-4 average-to-point interpolation of those line averages along the face's
  grid line to the 3 Gauss nodes of the face (one-sided next to the panel's corners);
* flux: ``h sum_g w_g (a'_g^+ q_L(g) + a'_g^- q_R(g))`` (upwind per node), the velocity exact
  at the nodes;
* panel edges: each edge is seen from both panels; its flux is the mean of the two, with
  opposite signs on the two sides, so the mass is conserved to round-off.

Positivity: the flux-corrected transport limiter of :mod:`tpde.schemes.operator` (first-order
upwind flux with the cells on both sides, the correction of each face scaled by the
``R = min(1, q^L h^2 / (dt P))`` of the cell it drains); it acts only when the unlimited
Euler step has a negative cell. The low-order step is non-negative when
``dt max_c (outflow of c) <= h^2``; SSP-RK stages are convex combinations of such steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numba as nb
import numpy as np

from tpde.grid import profile
from tpde.grid.cubed_sphere import (
    GHOSTS,
    SIDES,
    CubedSphere,
    connectivity,
    coordinate_gradients,
    gauss_nodes,
    halo_matrix,
    padded_panels,
    point_weights,
    to_sphere,
)

from .kernels import SEVENTH_ORDER
from .loop import (
    MAX_STEPS,
    AtomTransfers,
    ResolutionMonitor,
    SimulationError,
    StepBudget,
    StepPlan,
    Stop,
    TimeLoop,
    plain_snapshot_callbacks,
)
from .monitor import RESOLUTION_TOLERANCE, SEVENTH_GHOSTS, Event, event_lines
from .operator import PositivityError
from .reconstruction import get_reconstruction, reconstruct
from .rk import get_integrator
from .solver import Snapshot
from .sphere_diffusion import SphereDiffusion

__all__ = ["SphereVelocity", "CubedSphereOperator", "SphereResult", "SphereSolver", "solve"]


class SphereVelocity(Protocol):
    """A tangent velocity field on the sphere."""

    #: True when the field depends neither on the density nor on time
    steady: bool

    def tangent(
        self, density: np.ndarray, grid: CubedSphere, t: float, points: np.ndarray
    ) -> np.ndarray:
        """Tangent vectors ``(M, 3)`` at ``points (M, 3)`` for the density ``(6, n, n)``."""
        ...


@nb.njit(cache=True)
def _face_states(padded, kind, n, left, right):  # pragma: no cover - compiled
    """Left / right states ``(6, n + 1, n)`` at the faces along axis 1 of ``padded``."""
    for p in range(padded.shape[0]):
        for f in range(n + 1):
            for j in range(n):
                c = j + GHOSTS
                left[p, f, j] = reconstruct(
                    kind,
                    padded[p, f, c],
                    padded[p, f + 1, c],
                    padded[p, f + 2, c],
                    padded[p, f + 3, c],
                    padded[p, f + 4, c],
                )
                right[p, f, j] = reconstruct(
                    kind,
                    padded[p, f + 5, c],
                    padded[p, f + 4, c],
                    padded[p, f + 3, c],
                    padded[p, f + 2, c],
                    padded[p, f + 1, c],
                )


#: where a velocity field is evaluated: at every Gauss node of the faces, or at the face
#: centres and interpolated along the face (:meth:`CubedSphereOperator.node_speeds`)
VELOCITY_AT = ("nodes", "centres")


def lagrange_weights(n: int, offsets) -> np.ndarray:
    """``(len(offsets), n, n)``: row ``[g, j]`` interpolates the point values at the ``n``
    positions ``m + 1/2`` of a grid line (cell units) to ``j + 1/2 + offsets[g]``: the degree-4
    polynomial through 5 of them, centred, moved inside ``0 .. n - 1`` at the ends."""
    shifts = np.asarray(offsets, float)
    t = np.arange(n)[None, :] + 0.5 + shifts[:, None]
    first = np.clip(np.floor(t).astype(int) - 2, 0, n - 5)
    out = np.zeros((shifts.size, n, n))
    for k in range(5):
        weight = np.ones_like(t)
        for m in range(5):
            if m != k:
                weight *= (t - (first + m + 0.5)) / (k - m)
        np.put_along_axis(out, (first + k)[..., None], weight[..., None], axis=-1)
    return out


def _banded(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first column ``(g, n)`` and the 5 entries ``(g, n, 5)`` of each row of interpolation
    weights ``(g, n, n)`` with 5 consecutive non-zeros a row."""
    first = np.clip(np.argmax(weights != 0.0, axis=-1), 0, weights.shape[-1] - 5)
    columns = first[..., None] + np.arange(5)
    return first.astype(np.int64), np.take_along_axis(weights, columns, axis=-1)


@nb.njit(cache=True)
def _banded_apply(first, band, values, out):  # pragma: no cover - compiled
    """``out[b, j, g, k] = sum_u band[g, j, u] values[b, first[g, j] + u, k]``."""
    for b in range(values.shape[0]):
        for j in range(values.shape[1]):
            for g in range(first.shape[0]):
                f = first[g, j]
                for k in range(values.shape[2]):
                    acc = 0.0
                    for u in range(5):
                        acc += band[g, j, u] * values[b, f + u, k]
                    out[b, j, g, k] = acc


@nb.njit(cache=True)
def _gauss_fluxes(first, band, weights, h, states, speeds, cells, high, low):  # pragma: no cover
    """The high- and first-order fluxes of every face ``(2, 6, n + 1, n)``: the line averages
    ``states (2, 2, 6, n + 1, n)`` (left / right) to the Gauss nodes (banded weights), upwind
    per node, ``h sum_g w_g (s^+ q_L + s^- q_R)``; the first-order flux from the cells on both
    sides ``cells (2, 6, n + 2, n)``, ``h (sum_g w_g s^+) q_c + h (sum_g w_g s^-) q_c'``."""
    for x in range(states.shape[0]):
        for p in range(states.shape[2]):
            for f in range(states.shape[3]):
                for j in range(states.shape[4]):
                    total = 0.0
                    up = 0.0
                    down = 0.0
                    for g in range(first.shape[0]):
                        c = first[g, j]
                        left = 0.0
                        right = 0.0
                        for u in range(5):
                            left += band[g, j, u] * states[x, 0, p, f, c + u]
                            right += band[g, j, u] * states[x, 1, p, f, c + u]
                        speed = speeds[x, p, f, j, g]
                        if speed > 0.0:
                            total += weights[g] * speed * left
                            up += weights[g] * speed
                        else:
                            total += weights[g] * speed * right
                            down += weights[g] * speed
                    high[x, p, f, j] = h * total
                    low[x, p, f, j] = h * (up * cells[x, p, f, j] + down * cells[x, p, f + 1, j])


@nb.njit(cache=True)
def _centre_speeds(first, band, centres, gradients, out):  # pragma: no cover - compiled
    """``out[b, j, g] = sum_k v[b, j, g, k] gradients[b, j, g, k]`` with
    ``v[b, j, g, k] = sum_u band[g, j, u] centres[b, first[g, j] + u, k]``: the face-centre
    vectors ``centres (B, n, 3)`` to the nodes along the face's grid line, then the coordinate
    speeds against ``gradients (B, n, g, 3)`` (:func:`_along_faces` then :func:`_dot3`, fused;
    the same operations in the same order)."""
    for b in range(centres.shape[0]):
        for j in range(centres.shape[1]):
            for g in range(first.shape[0]):
                f = first[g, j]
                v0 = 0.0
                v1 = 0.0
                v2 = 0.0
                for u in range(5):
                    v0 += band[g, j, u] * centres[b, f + u, 0]
                for u in range(5):
                    v1 += band[g, j, u] * centres[b, f + u, 1]
                for u in range(5):
                    v2 += band[g, j, u] * centres[b, f + u, 2]
                out[b, j, g] = (
                    v0 * gradients[b, j, g, 0] + v1 * gradients[b, j, g, 1]
                ) + v2 * gradients[b, j, g, 2]


@nb.njit(cache=True)
def _outflows(speeds, weights, h, up, down):  # pragma: no cover - compiled
    """``up = h sum_g w_g max(s_g, 0)``, ``down = h sum_g w_g max(-s_g, 0)`` per face of the
    node speeds ``(2, 6, n + 1, n, g)`` (the einsums of :meth:`max_outflow`, in their order)."""
    a, p, f, j, G = speeds.shape
    for x in range(a):
        for q in range(p):
            for i in range(f):
                for k in range(j):
                    u = 0.0
                    d = 0.0
                    for g in range(G):
                        s = speeds[x, q, i, k, g]
                        # np.maximum's: a NaN passes (the loop names a non-finite velocity)
                        u += (s if s > 0.0 else (0.0 if s <= 0.0 else s)) * weights[g]
                        d += (-s if s < 0.0 else (0.0 if s >= 0.0 else s)) * weights[g]
                    up[x, q, i, k] = h * u
                    down[x, q, i, k] = h * d


def _along_faces(banded: tuple[np.ndarray, np.ndarray], values: np.ndarray) -> np.ndarray:
    """``sum_m weights[g, j, m] values[..., m, k]`` as ``(..., j, g, k)``: values along a
    face's grid line to its nodes (the weights :func:`_banded`), compiled."""
    first, band = banded
    n, k = values.shape[-2:]
    flat = np.ascontiguousarray(values).reshape(-1, n, k)
    out = np.empty((flat.shape[0], n, first.shape[0], k))
    _banded_apply(first, band, flat, out)
    return out.reshape(values.shape[:-2] + (n, first.shape[0], k))


def _dot3(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``sum_k u[..., k] v[..., k]`` over a last axis of 3 (no einsum temporaries)."""
    return u[..., 0] * v[..., 0] + u[..., 1] * v[..., 1] + u[..., 2] * v[..., 2]


class CubedSphereOperator:
    """Face nodes, fluxes and limited Euler steps on one cubed sphere (module docstring).

    Both face families are held in one layout ``(2, 6, n + 1, n)``: family 0 the faces
    ``a = const`` indexed ``[p, f, j]``, family 1 the faces ``b = const`` indexed ``[p, f, i]``
    (the panel transposed), so one loop serves both.
    """

    def __init__(
        self,
        grid: CubedSphere,
        reconstruction: str = "weno5z",
        limiter: bool = True,
        velocity_at: str = "nodes",
    ):
        if velocity_at not in VELOCITY_AT:
            raise ValueError(
                f"scheme.velocity_at: unknown {velocity_at!r}; choose one of "
                f"{', '.join(VELOCITY_AT)}"
            )
        self.grid = grid
        self.velocity_at = velocity_at
        self.kind = get_reconstruction(reconstruction).kind
        self.limiter = bool(limiter)
        self.limited_steps = 0
        n, h = grid.n, grid.h
        self.halo = halo_matrix(n)
        partner, _, cell = connectivity(n)
        self.partner = partner.ravel()
        self.neighbour_cell = cell  # (6, 4, n)
        s, w = gauss_nodes(3)
        self.node_weights = w
        self.transverse = point_weights(n, s)  # (3, n, n)
        self._transverse = _banded(self.transverse)
        e, c = grid.edges, grid.centres
        along = c[:, None] + h * s[None, :]  # (n, 3)
        panels = np.arange(6)[:, None, None, None]
        normal = e[None, :, None, None]
        tangential = along[None, None, :, :]
        points_a = to_sphere(panels, normal, tangential)  # (6, n + 1, n, 3, 3)
        points_b = to_sphere(panels, tangential, normal)
        grad_a, _ = coordinate_gradients(panels, points_a)
        _, grad_b = coordinate_gradients(panels, points_b)
        self.points = np.stack([points_a, points_b])  # (2, 6, n + 1, n, 3, 3)
        self.gradients = np.stack([grad_a, grad_b])
        centres_a = to_sphere(panels[..., 0], normal[..., 0], c[None, None, :])  # (6, n + 1, n, 3)
        centres_b = to_sphere(panels[..., 0], c[None, None, :], normal[..., 0])
        self.face_centres = np.stack([centres_a, centres_b])  # (2, 6, n + 1, n, 3)
        self.centre_to_nodes = lagrange_weights(n, s)  # (3, n, n)
        self._centre_to_nodes = _banded(self.centre_to_nodes)
        self._wide_halo = None  # the resolution monitor's halo (:meth:`_seventh_order_states`)
        #: the last ``(q, states)`` of :meth:`_cell_states`
        self._kept_states: tuple[np.ndarray, np.ndarray] | None = None

    # ---- velocity --------------------------------------------------------------------------
    @profile.timed("velocity")
    def node_speeds(self, velocity: SphereVelocity, density: np.ndarray, t: float) -> np.ndarray:
        """``a'`` (family 0) and ``b'`` (family 1) at the face nodes: ``(2, 6, n + 1, n, 3)``.

        ``velocity_at = "centres"``: the tangent vectors at the face centres only, interpolated
        to the nodes along the face's grid line (degree 4, one-sided next to the panel's
        corners; a third of the evaluations; order 4.4 measured from n = 8 to 16)."""
        if self.velocity_at == "centres":
            flat = self.face_centres.reshape(-1, 3)
            at_centres = np.asarray(velocity.tangent(density, self.grid, t, flat), float)
            first, band = self._centre_to_nodes
            n = self.grid.n
            speeds = np.empty(self.gradients.shape[:-1])  # (2, 6, n + 1, n, g)
            _centre_speeds(
                first,
                band,
                np.ascontiguousarray(at_centres).reshape(-1, n, 3),
                self.gradients.reshape(-1, n, first.shape[0], 3),
                speeds.reshape(-1, n, first.shape[0]),
            )
            return speeds
        else:
            flat = self.points.reshape(-1, 3)
            v = np.asarray(velocity.tangent(density, self.grid, t, flat), float).reshape(
                self.points.shape
            )
        return _dot3(v, self.gradients)

    def max_outflow(self, speeds: np.ndarray) -> float:
        """``max_c sum_faces (outflow rate) / h^2``: a step ``dt`` keeps the first-order update
        non-negative when ``dt * max_outflow <= 1``."""
        h = self.grid.h
        n = self.grid.n
        up = np.empty((2, 6, n + 1, n))
        down = np.empty((2, 6, n + 1, n))
        _outflows(np.ascontiguousarray(speeds), self.node_weights, h, up, down)
        out = up[:, :, 1:, :] + down[:, :, :-1, :]  # (2, 6, n, n) per family, [p, f, .]
        total = out[0] + out[1].transpose(0, 2, 1)
        return float(total.max()) / (h * h)

    # ---- fluxes ----------------------------------------------------------------------------
    def _padded(self, q: np.ndarray, halo=None, g: int = GHOSTS) -> np.ndarray:
        """``q (6, n, n)`` with ``g`` halo cells on every side of each panel ``(6, n + 2g,
        n + 2g)``, the ghosts from ``halo`` (the scheme's by default; :func:`padded_panels`)."""
        return padded_panels(q, self.halo if halo is None else halo, g)

    def _neighbours(self, values: np.ndarray) -> np.ndarray:
        """``values (6, n, n)`` with one layer of the neighbours' actual cells, per family:
        ``(2, 6, n + 2, n)``."""
        n = self.grid.n
        flat = values.ravel()
        across = flat[self.neighbour_cell]  # (6, 4, n)
        out = np.empty((2, 6, n + 2, n))
        out[0, :, 1:-1] = values
        out[1, :, 1:-1] = values.transpose(0, 2, 1)
        out[0, :, 0], out[0, :, -1] = across[:, 0], across[:, 1]
        out[1, :, 0], out[1, :, -1] = across[:, 2], across[:, 3]
        return out

    def _unify(self, flux: np.ndarray) -> np.ndarray:
        """The mean of the two panels' fluxes on every panel edge (in place)."""
        n = self.grid.n
        outward = np.stack([-flux[0, :, 0], flux[0, :, n], -flux[1, :, 0], flux[1, :, n]], 1)
        flat = outward.reshape(-1)
        mean = (0.5 * (flat - flat[self.partner])).reshape(6, SIDES, n)
        flux[0, :, 0], flux[0, :, n] = -mean[:, 0], mean[:, 1]
        flux[1, :, 0], flux[1, :, n] = -mean[:, 2], mean[:, 3]
        return flux

    @profile.timed("fluxes")
    def fluxes(self, q: np.ndarray, speeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """High- and first-order fluxes ``(2, 6, n + 1, n)`` in the + direction of each face."""
        n, h = self.grid.n, self.grid.h
        states = self._cell_states(q)
        cells = self._neighbours(q)
        high = np.empty((2, 6, n + 1, n))
        low = np.empty((2, 6, n + 1, n))
        first, band = self._transverse
        _gauss_fluxes(
            first,
            band,
            self.node_weights,
            h,
            states,
            np.ascontiguousarray(speeds),
            cells,
            high,
            low,
        )
        return self._unify(high), self._unify(low)

    def _cell_states(self, q: np.ndarray) -> np.ndarray:
        """:meth:`_states` of ``q``'s halo-padded panels, the last one kept: the resolution
        monitor reads the states of the step's start, which the first stage's fluxes then
        need again (the same ``q``: compared whole, so a changed array is never served)."""
        kept = self._kept_states
        if kept is not None and kept[0].shape == q.shape and np.array_equal(kept[0], q):
            return kept[1]
        states = self._states(self._padded(q))
        self._kept_states = (np.array(q, float), states)
        return states

    # ---- resolution monitor ----------------------------------------------------------------
    def _states(self, padded: np.ndarray) -> np.ndarray:
        """The scheme's left / right line averages ``(2, 2, 6, n + 1, n)`` (family, side)."""
        n = self.grid.n
        states = np.empty((2, 2, 6, n + 1, n))
        _face_states(padded, self.kind, n, states[0, 0], states[0, 1])
        _face_states(
            np.ascontiguousarray(padded.transpose(0, 2, 1)),
            self.kind,
            n,
            states[1, 0],
            states[1, 1],
        )
        return states

    def _seventh_order_states(self, q: np.ndarray) -> np.ndarray:
        """The seventh-order linear left / right line averages ``(2, 2, 6, n + 1, n)`` along
        the panel's grid lines (cells ``f - 4 .. f + 2`` from the left of face ``f``, the
        stencil mirrored from the right) from a halo of ``SEVENTH_GHOSTS`` cells."""
        n = self.grid.n
        if self._wide_halo is None:  # built on first use: runs without the monitor skip it
            self._wide_halo = halo_matrix(n, ghosts=SEVENTH_GHOSTS)
        g = SEVENTH_GHOSTS
        padded = self._padded(q, self._wide_halo, g)
        inner = slice(g, g + n)
        out = np.zeros((2, 2, 6, n + 1, n))
        for x, lines in enumerate((padded, padded.transpose(0, 2, 1))):
            lines = lines[:, :, inner]  # (6, n + 8, n): the panel's own grid lines
            for k, weight in enumerate(SEVENTH_ORDER):
                out[x, 0] += weight * lines[:, k : k + n + 1]
                out[x, 1] += weight * lines[:, 2 * g - 1 - k : 2 * g - k + n]
        return out

    def reconstruction_error_rate(self, q: np.ndarray, speeds: np.ndarray) -> float:
        """The share of the mass the reconstruction misplaces per unit time,
        ``sum_c |div dF|_c / sum_c q_c h^2`` (docs/theory.md, 'The resolution monitor on the
        sphere'): ``dF`` the flux of the difference ``q_s - q_7`` of the scheme's line
        averages (WENO, :meth:`fluxes`) and the seventh-order linear ones
        (:meth:`_seventh_order_states`) at every face, taken to the Gauss nodes and upwinded
        like the flux itself, ``h sum_g w_g s_g (q_s - q_7)_upwind(g)``, the two panels'
        values meaned on the panel edges. ``q``: coordinate averages ``(6, n, n)``;
        ``speeds``: :meth:`node_speeds`. Reads only: the step is not touched."""
        n, h = self.grid.n, self.grid.h
        total = float(q.sum()) * h * h
        if not total > 0:
            return 0.0
        difference = self._cell_states(q) - self._seventh_order_states(q)
        error = np.empty((2, 6, n + 1, n))
        unused = np.empty((2, 6, n + 1, n))
        first, band = self._transverse
        _gauss_fluxes(
            first,
            band,
            self.node_weights,
            h,
            difference,
            np.ascontiguousarray(speeds),
            self._neighbours(q),
            error,
            unused,
        )
        return float(np.abs(self._divergence(self._unify(error))).sum()) / total

    @staticmethod
    def _divergence(flux: np.ndarray) -> np.ndarray:
        return (flux[0, :, 1:] - flux[0, :, :-1]) + (flux[1, :, 1:] - flux[1, :, :-1]).transpose(
            0, 2, 1
        )

    def derivative(self, density: np.ndarray, speeds: np.ndarray) -> np.ndarray:
        """The semi-discrete right-hand side ``d rho_bar / dt`` (high order, unlimited)."""
        high, _ = self.fluxes(self.grid.to_coordinate(density), speeds)
        return -self.grid.from_coordinate(self._divergence(high)) / self.grid.h**2

    @profile.timed("euler")
    def euler(self, q: np.ndarray, speeds: np.ndarray, dt: float) -> np.ndarray:
        """One forward-Euler step of the coordinate averages, positivity-limited."""
        h2 = self.grid.h**2
        high, low = self.fluxes(q, speeds)
        result = q - (dt / h2) * self._divergence(high)
        if not self.limiter or result.min() >= 0.0:
            return result
        with profile.phase("limiter"):
            return self._limited(q, high, low, dt)

    def _limited(self, q: np.ndarray, high: np.ndarray, low: np.ndarray, dt: float) -> np.ndarray:
        """The FCT-limited update where the unlimited one has a negative cell."""
        h2 = self.grid.h**2
        tol = 1e-12 * max(float(q.max()), 0.0)
        first = q - (dt / h2) * self._divergence(low)
        if first.min() < -tol:
            raise PositivityError(f"first-order update reached {first.min():.3e} < 0: dt too large")
        correction = high - low
        # outgoing corrections of each cell: + faces with correction > 0, - faces with < 0
        drain = np.maximum(correction[:, :, 1:], 0.0) + np.maximum(-correction[:, :, :-1], 0.0)
        total = drain[0] + drain[1].transpose(0, 2, 1)
        available = np.maximum(first, 0.0) * h2
        demand = dt * total
        with np.errstate(divide="ignore", invalid="ignore"):
            # demand > available >= 0 makes the division safe (no 0 / 0 when demand underflows)
            ratio = np.where(demand > available, available / demand, 1.0)
        r = self._neighbours(ratio)  # (2, 6, n + 2, n)
        scale = np.where(correction > 0.0, r[:, :, :-1], r[:, :, 1:])
        limited = low + scale * correction
        result = q - (dt / h2) * self._divergence(limited)
        if result.min() < -tol:
            raise PositivityError(f"limited update reached {result.min():.3e} < 0")
        self.limited_steps += 1
        return np.maximum(result, 0.0)  # round-off only (|value| <= 1e-12 max density)


@dataclass
class SphereResult:
    """Snapshots of a run on the cubed sphere: times, densities ``(6, n, n)`` per unit area,
    masses, number of steps; ``clipped``: noise substeps whose negatives beyond round-off
    were clipped (:class:`tpde.schemes.sphere_diffusion.SphereDiffusion`)."""

    grid: CubedSphere
    times: np.ndarray
    densities: list[np.ndarray] = field(default_factory=list)
    masses: np.ndarray = field(default_factory=lambda: np.zeros(0))
    steps: int = 0
    #: steps whose update went negative, halved and redone
    rejected_steps: int = 0
    clipped: int = 0
    #: what happened (:class:`tpde.schemes.monitor.Event`: atom births, merges, releases;
    #: ``pinned`` with atoms off)
    events: list = field(default_factory=list)
    #: the atoms at the end (a run with atoms), else None
    atoms: object = None
    #: the resolution monitor's estimate at the end: the share of the mass the reconstruction
    #: has misplaced, ``int sum_c |div dF| / mass dt`` (:func:`solve`; 0 without the monitor)
    reconstruction_error: float = 0.0
    #: the snapshots as the loop took them (:class:`tpde.schemes.solver.Snapshot`)
    snapshots: list[Snapshot] = field(default_factory=list)
    #: how the run ended (the loop's typed outcome: a callback's stop, else ``completed``)
    status: str = "completed"
    status_time: float = float("nan")
    status_message: str = ""
    status_reason: str = ""
    wall_time: float = 0.0

    @property
    def final(self) -> np.ndarray:
        return self.densities[-1]


class SphereSolver(TimeLoop):
    """The cubed sphere's operator in the one time loop (:class:`.loop.TimeLoop`): its
    callbacks are the step budget (``max_steps``), the resolution monitor (a tolerance
    given), the atom transfers or the pinning watch, and the snapshot hand-off; the loop
    retries a negative update with half the step (``STEP_TRIES``) and names the time of
    every non-finite value. Arguments: :func:`solve`'s."""

    #: every snapshot time is a snapshot, reached by a step or not
    dedupe_snapshots = False

    def __init__(
        self,
        grid: CubedSphere,
        density: np.ndarray,
        velocity: SphereVelocity,
        t_end: float,
        *,
        cfl: float = 0.5,
        dt_max: float | None = None,
        snapshots: int | Sequence[float] | np.ndarray = 2,
        reconstruction: str = "weno5z",
        integrator: str = "ssprk3",
        limiter: bool = True,
        velocity_at: str = "nodes",
        on_snapshot: Callable[[Snapshot], None] | Sequence[Callable[[Snapshot], None]] = (),
        noise: float = 0.0,
        atoms=None,
        pinning: bool = False,
        events: list | None = None,
        max_steps: int = MAX_STEPS,
        resolution_tolerance: float | None = RESOLUTION_TOLERANCE,
        reconstruction_error: float = 0.0,
    ):
        from .sphere_atoms import SphereAtomRun

        density = np.asarray(density, float)
        if density.shape != grid.shape:
            raise ValueError(f"density: expected shape {grid.shape}, got {density.shape}")
        if not 0 < cfl <= 1:
            raise ValueError(f"scheme.cfl: expected 0 < cfl <= 1, got {cfl!r}")
        self.grid, self.velocity, self.cfl, self.dt_max = grid, velocity, cfl, dt_max
        self.op = CubedSphereOperator(grid, reconstruction, limiter, velocity_at)
        self.rk = rk = get_integrator(integrator)
        self.noise = noise
        self.diffusion = SphereDiffusion(grid, noise)
        self.atoms = atoms
        self.watch = None
        self._pinning = atoms is None and pinning and hasattr(velocity, "probe_tangent")
        if self._pinning:
            from .atoms import AtomOptions

            self.watch = SphereAtomRun(grid, velocity, AtomOptions())
        self.events = [] if events is None else events
        if any(b for i, row in enumerate(rk.beta) for k, b in enumerate(row) if k < i):
            raise ValueError(
                f"scheme.integrator: {integrator!r} needs the stage's own velocity only"
            )
        self.offsets = rk.stage_times
        if isinstance(snapshots, int | np.integer):
            times = np.linspace(0.0, float(t_end), max(int(snapshots), 2))
        else:
            times = np.asarray(snapshots, float)
            if times.ndim != 1 or times.size < 2 or np.any(np.diff(times) <= 0):
                raise ValueError("run.snapshots: expected at least two increasing times")
        self.times = times
        self.initial = density
        self.q = grid.to_coordinate(density)
        self.t = self.target = float(times[0])
        # a steady field's node speeds, evaluated once at the first step (None: unsteady)
        self.steady: np.ndarray | None = None
        self._steady_pending = bool(velocity.steady)
        self.steps = self.rejected = 0
        self.last_dt = float("nan")
        self.status_message = self.status_reason = ""
        self.tolerance = resolution_tolerance
        self.estimate = float(reconstruction_error)  # the monitor's accumulated share
        self.warned = resolution_tolerance is not None and self.estimate > resolution_tolerance
        self._amount = 0.0  # (the share of the step being taken)
        self._before = None  # the atoms a retry starts from
        self._started = False  # (whether the initial snapshot is taken)
        callbacks: list = [StepBudget(max_steps)]
        if resolution_tolerance is not None:
            callbacks.append(ResolutionMonitor())
        if atoms is not None or self.watch is not None:
            callbacks.append(AtomTransfers())
        self.callbacks = callbacks + plain_snapshot_callbacks(on_snapshot)

    # ---- the operator side of the loop ------------------------------------------------------
    def reached(self, target: float) -> bool:
        return not self.t < target * (1 - 1e-14)

    def advance_to(self, target: float) -> str:
        self.target = float(target)
        return self._advance_to(target)

    def plan(self) -> StepPlan:
        """The node speeds at the step's start; the step ``cfl / max_outflow`` (at most
        ``dt_max``); a non-finite speed is a SimulationError naming the time."""
        grid, op = self.grid, self.op
        if self._steady_pending:
            self._steady_pending = False
            self.steady = op.node_speeds(self.velocity, self.initial, float(self.times[0]))
        if self.steady is not None:
            speeds = self.steady
        else:
            speeds = op.node_speeds(self.velocity, grid.from_coordinate(self.q), self.t)
        rate = op.max_outflow(speeds)
        if not math.isfinite(rate):
            raise SimulationError(
                f"velocity: non-finite value at the Gauss nodes at t = {self.t:.6g}, "
                f"step {self.steps}"
            )
        dt = self.cfl / rate if rate > 0 else math.inf
        if self.dt_max is not None:
            dt = min(dt, self.dt_max)
        return StepPlan(speeds, dt)

    def land(self, dt: float, remaining: float) -> float:
        """At most the remainder, and no sliver of a last step (two halves instead)."""
        dt = min(remaining, dt)
        if dt < remaining and remaining < 1.5 * dt:
            dt = 0.5 * remaining
        return dt

    def check_resolution(self, plan: StepPlan, dt: float) -> Stop | None:
        """The step's share (:meth:`CubedSphereOperator.reconstruction_error_rate` times
        ``dt``); the first step that would take the estimate past the tolerance records one
        ``under_resolved`` event at its start (the run goes on)."""
        assert self.tolerance is not None  # (the monitor is in the loop only with one)
        self._amount = self.op.reconstruction_error_rate(self.q, plan.velocity) * dt
        if not self.warned and self.estimate + self._amount > self.tolerance:
            self.warned = True
            message = under_resolved_message(
                self.grid.n, self.t, self.t + dt, self.estimate + self._amount, self.tolerance
            )
            self.events.append(Event("under_resolved", self.t, message))
        return None

    def add_resolution(self, plan: StepPlan) -> None:
        self.estimate += self._amount

    def begin_attempts(self) -> None:
        self._before = None if self.atoms is None else self.atoms.atoms

    def restore(self) -> None:
        if self.atoms is not None and self._before is not None:
            self.atoms.restore(self._before)

    def attempt(self, plan: StepPlan, dt: float) -> None:
        """One Strang-split SSP-RK step (raises PositivityError); a non-finite density is a
        SimulationError naming the step."""
        stepped = self._step(self.q, plan.velocity, self.t, dt)
        if not np.all(np.isfinite(stepped)):
            raise SimulationError(
                f"density: non-finite value in the step from t = {self.t:.6g} to "
                f"{self.t + dt:.6g} (step {self.steps}): the velocity or the density failed there"
            )
        self.q = stepped
        self.t += dt
        self.steps += 1
        self.last_dt = dt
        if self.atoms is not None:
            self.atoms.accept()
            if self.diffusion.matrix is not None:  # the atoms' second half
                self.atoms.diffuse(self.noise * dt)

    def _step(self, q: np.ndarray, speeds: np.ndarray, t: float, dt: float) -> np.ndarray:
        """One Strang-split SSP-RK step from ``q`` (raises PositivityError)."""
        grid, op, rk, atoms, diffusion = self.grid, self.op, self.rk, self.atoms, self.diffusion
        offsets = self.offsets
        if diffusion.matrix is not None:  # Strang: the first half of the noise
            q = grid.to_coordinate(diffusion.step(grid.from_coordinate(q), 0.5 * dt))
            if atoms is not None:  # (the atoms' half: their first moment exact)
                atoms.diffuse(self.noise * dt)
            if self.steady is None:  # the transport step starts from the diffused state
                speeds = op.node_speeds(self.velocity, grid.from_coordinate(q), t)
        stages = [q]
        if atoms is not None:
            atoms.stages()
        for i in range(rk.stages):
            if atoms is not None:
                atoms.see(i)
            if i > 0 and self.steady is None:
                rho_i = grid.from_coordinate(stages[i])
                speeds = op.node_speeds(self.velocity, rho_i, t + offsets[i] * dt)
            if atoms is not None:
                atoms.rates(i, grid.from_coordinate(stages[i]), t + offsets[i] * dt)
                atoms.combine(list(zip(rk.alpha[i], rk.beta[i], strict=True)), dt)
            terms = [
                (a, op.euler(stages[k], speeds, (b / a) * dt) if b else stages[k])
                for k, (a, b) in enumerate(zip(rk.alpha[i], rk.beta[i], strict=True))
                if a != 0.0
            ]
            # last + sum a_k (X_k - last): differences of equal-mass states carry no mass,
            # so the stages keep it to the last bit (1.1e-16 over 6063 steps at n = 64;
            # the plain sum with the tables' exactly summing weights drifts randomly,
            # 1.7e-14; with fl(1/3) + fl(2/3) = 1 - 2^-54 it had shrunk by 3.6e-13)
            new = terms[-1][1].copy()
            for a, x in terms[:-1]:
                new += a * (x - terms[-1][1])
            stages.append(new)
        q = stages[-1]
        if diffusion.matrix is not None:  # and the second
            q = grid.to_coordinate(diffusion.step(grid.from_coordinate(q), 0.5 * dt))
        return q

    def transfer_atoms(self) -> None:
        """Cells <-> vMF atoms after the step (their events); atoms off, every PIN_EVERY
        steps the pinning watch (one ``pinned`` event)."""
        from .atom_run import PIN_EVERY
        from .sphere_atoms import describe

        grid = self.grid
        if self.atoms is not None:
            rho, moved, changed = self.atoms.transfer(grid.from_coordinate(self.q), self.t)
            if changed:
                self.q = grid.to_coordinate(rho)
            self.events.extend(Event(e.kind, self.t, describe(e)) for e in moved)
        elif self.watch is not None and self.steps % PIN_EVERY == 0:
            line = self.watch.pinned(grid.from_coordinate(self.q), self.t)
            if line is not None:
                self.events.append(Event("pinned", self.t, line))
                self.watch = None

    def schedule(self) -> tuple[bool, list[tuple[float, bool]]]:
        return True, [(float(t), True) for t in self.times[1:]]

    def snapshot(self) -> Snapshot:
        """The initial density, or the state at the stop just reached. The state at a
        snapshot is its density and time exactly (q from rho, t the target: each differs
        from the stepped value in the last bit), so a run restarted from a stored snapshot
        (tpde run --resume) continues bit for bit."""
        grid = self.grid
        if not self._started:
            self._started = True
            rho = self.initial.copy()
        else:
            rho = grid.from_coordinate(self.q)
            self.q = grid.to_coordinate(rho)
            if self.reached(self.target):  # (a callback's stop before it: the time as is)
                self.t = float(self.target)
        snap = Snapshot(
            time=self.t,
            density=rho,
            mass=grid.integrate(rho),
            outflow=0.0,
            max_speed=float("nan"),
            dt=self.last_dt,
            step=self.steps,
            state=self.monitor_state(),
            events=event_lines(self.events),
        )
        if self.atoms is not None:  # (the mass of the state: cells plus atoms, as flat)
            snap.atoms, snap.next_atom_id = self.atoms.atoms, self.atoms.next_id
            snap.mass += self.atoms.atoms.total_mass
        self.handed(snap)
        return snap

    def monitor_state(self) -> dict[str, float | bool | int]:
        """The resolution estimate and its warned flag; whether the pinning watch has
        spoken (it is dropped then)."""
        return {
            "reconstruction_error": float(self.estimate),
            "resolution_warned": bool(self.warned),
            "pinning_warned": self._pinning and self.watch is None,
        }

    def restore_monitor_state(self, state: Mapping[str, Any]) -> None:
        self.estimate = float(state.get("reconstruction_error", self.estimate))
        self.warned = bool(state.get("resolution_warned", self.warned))
        if state.get("pinning_warned", False):
            self.watch = None

    def new_result(self) -> SphereResult:
        return SphereResult(self.grid, self.times)

    def finish(self, result: SphereResult, wall_time: float) -> None:
        result.densities = [s.density for s in result.snapshots]
        result.masses = np.array([s.mass for s in result.snapshots])
        result.steps = self.steps
        result.rejected_steps = self.rejected
        result.clipped = self.diffusion.clipped
        result.events = self.events
        result.atoms = None if self.atoms is None else self.atoms.atoms
        result.reconstruction_error = self.estimate
        result.wall_time = wall_time


def solve(
    grid: CubedSphere,
    density: np.ndarray,
    velocity: SphereVelocity,
    t_end: float,
    *,
    on_snapshot: Callable[[float, np.ndarray, int], None] | None = None,
    **options,
) -> SphereResult:
    """Advance ``density`` (cell averages per unit area) to ``t_end`` with SSP-RK stages of the
    limited Euler step: :class:`SphereSolver` in the one time loop. ``dt = min(dt_max, cfl /
    max_outflow)`` from the velocity at the start of each step, cut to land on the
    ``snapshots`` equally spaced times (or at the given increasing times, the first one the
    start). ``velocity_at``: see :meth:`CubedSphereOperator.node_speeds`.
    ``on_snapshot(t, density, steps)`` is called with every snapshot as it is reached (the
    initial one too). The state at a snapshot is its density and time exactly: solving on
    from a snapshot's density, with the snapshot times from there on, repeats the rest of
    the run bit for bit (a resumed run).

    Options (keywords, defaults): ``cfl`` 0.5, ``dt_max`` None, ``snapshots`` 2,
    ``reconstruction`` "weno5z", ``integrator`` "ssprk3", ``limiter`` True, ``velocity_at``
    "nodes", ``noise`` 0, ``atoms`` None, ``pinning`` False, ``events`` None, ``max_steps``
    MAX_STEPS, ``resolution_tolerance`` RESOLUTION_TOLERANCE, ``reconstruction_error`` 0.

    ``noise``: ``eps`` of the noise term ``eps Delta rho`` (Laplace-Beltrami): each step is
    Strang-split, ``exp(dt eps L / 2)``, the transport step, ``exp(dt eps L / 2)``
    (:mod:`tpde.schemes.sphere_diffusion`; exact in time, no ``h^2 / eps`` limit).

    ``atoms``: a :class:`tpde.schemes.sphere_atoms.SphereAtomRun` (von Mises-Fisher atoms in
    the same SSP-RK stages, the transfers after each step, their events in ``events``).
    ``pinning`` (atoms off): every ``PIN_EVERY`` steps a dry run of the conversion; one
    ``pinned`` event when a collapsed cluster drifts slower than its cells can move it.
    ``events``: the list the events are appended to as they happen (a new one if None).

    The loop's guards (:mod:`tpde.schemes.loop`, the flat solver's too): a step whose update
    goes negative (:class:`PositivityError`) is halved and redone from its start, at most
    ``STEP_TRIES`` times; a non-finite velocity or density, or more than ``max_steps``
    steps, raise :class:`tpde.schemes.solver.SimulationError` naming the time.

    ``resolution_tolerance``: the resolution monitor (docs/theory.md, 'The resolution monitor
    on the sphere'): before every step its
    :meth:`CubedSphereOperator.reconstruction_error_rate` times ``dt`` is added to the
    estimate of the share of the mass the reconstruction has misplaced
    (``SphereResult.reconstruction_error``); the first step that would take it past the
    tolerance records one ``under_resolved`` event at its start, naming the time and the
    remedies (the run goes on). None: no monitor (one flux evaluation a step saved). It only
    reads: the densities are the same bit for bit either way. ``reconstruction_error``: the
    estimate to start from (a resumed run passes the one it stopped with; past the
    tolerance already, no second event)."""
    handed: list[Callable[[Snapshot], None]] = []
    if on_snapshot is not None:
        call = on_snapshot

        def handed_on(snap: Snapshot) -> None:
            call(snap.time, snap.density, snap.step)

        handed.append(handed_on)
    result: SphereResult = SphereSolver(
        grid, density, velocity, t_end, on_snapshot=handed, **options
    ).run()
    return result


def under_resolved_message(n: int, t: float, t_next: float, estimate: float, tolerance: float):
    """The one line of a sphere run's ``under_resolved`` event: the time, the estimate and
    the remedies (more cells a panel, the estimate falling like ``h^RESOLUTION_ORDER``;
    atoms for a law narrower than a few cells)."""
    from .monitor import RESOLUTION_ORDER, SUGGESTED_MARGIN

    cells = math.ceil(n * (SUGGESTED_MARGIN * estimate / tolerance) ** (1.0 / RESOLUTION_ORDER))
    return (
        f"the grid no longer resolves the dynamics at t = {t:.6g}: the step to "
        f"t = {t_next:.6g} would take the estimated reconstruction error to {estimate:.2e} "
        f"> run.resolution_tolerance = {tolerance:g} (about {cells} cells a panel instead "
        f"of {n}, the estimate falling like h^{RESOLUTION_ORDER} from here; or atoms, "
        f"run.atoms, for a law narrower than a few cells)"
    )
