"""The finite-volume transport operator: face fluxes, positivity limiter, forward-Euler step.

For ``d rho/dt + div(rho u) = 0`` on cell averages ``rho_c`` the semi-discrete update is

    d rho_c / dt = - sum_a ( F_{a, c + e_a/2} - F_{a, c - e_a/2} ) / h_a,

with ``F_a`` the *face average* of ``rho u_a`` over the face normal to axis ``a``. Along the
normal the reconstruction (upwind / MUSCL / WENO5) gives the two face states from cell
averages; upwinding picks the state by the sign of the velocity.

Transverse quadrature (d >= 2). Reconstruction along axis ``a`` gives *line averages* of
``rho`` over the face. Multiplying them by the velocity at the face centre is exact when
``u_a`` is constant along the face (constant fields, ``u_a = u_a(x_a)``) and second-order
otherwise. ``face_quadrature = "gauss"`` instead interpolates the face states to the 3-point
Gauss-Legendre nodes of each transverse axis (5-point linear interpolation from the line
averages: degree-4 exact) and sums ``w_g (u_g^+ rho_L(g) + u_g^- rho_R(g))``: fifth order for
any smooth velocity (Titarev & Toro 2004; Shi, Hu & Shu 2002). Because the Gauss rule
reproduces the line average, the flux equals the midpoint flux plus a correction weighted by
``u_g - u_mean``, so the linear (non-WENO) transverse interpolation only enters multiplied by
the variation of ``u`` along the face. ``"auto"`` takes Gauss unless the velocity field says
it is constant along faces.

Positivity. Each forward-Euler step (every SSP-RK stage is a convex combination of them) is
made positivity preserving by a flux-corrected-transport limiter in the spirit of
Zhang & Shu (2010) and Hu, Adams & Shu (J. Comput. Phys. 242 (2013) 169): with the
first-order upwind flux ``F_L`` and the high-order flux ``F_H``,

    rho^L = rho - dt div F_L >= 0   if   dt max_c sum_a (u+_{c+1/2} - u-_{c-1/2}) / h_a <= 1,
    F = F_L + C (F_H - F_L),  C = min(1, rho^L_c / P_c) of the cell c the correction drains,

with ``P_c`` the sum of the outgoing corrections of cell ``c``. The limiter acts only when the
unlimited update has a negative cell, so smooth positive solutions are untouched (full order).
The CFL number ``cfl = dt * max_c sum_a (outflow rate)`` must be <= 1; the solver enforces it
and rejects a step whose low-order update is negative (the velocity grew within the step).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from tpde.grid import Grid
from tpde.grid.stencils import average_to_point_weights, ghost_index_map

from . import kernels
from .reconstruction import get_reconstruction

GAUSS3_NODES = np.array([-0.5 * np.sqrt(0.6), 0.0, 0.5 * np.sqrt(0.6)])  # in cell widths
GAUSS3_WEIGHTS = np.array([5.0, 8.0, 5.0]) / 18.0
FACE_QUADRATURES = ("auto", "midpoint", "gauss")


class PositivityError(RuntimeError):
    """The first-order update went negative: the time step is above the positivity bound."""


def view3(arr: np.ndarray, axis: int) -> np.ndarray:
    """Reshape a C-contiguous array to (outer, n_axis, inner) without copying."""
    shape = arr.shape
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    if not arr.flags.c_contiguous:
        raise ValueError("view3 needs a C-contiguous array")
    return arr.reshape(outer, shape[axis], inner)


def face_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return tuple(n + 1 if a == axis else n for a, n in enumerate(shape))


@dataclass
class FaceVelocity:
    """Normal velocity on the faces of every axis.

    ``values[a]``: (q, *face_shape(a)) at the q quadrature nodes of the faces normal to a;
    ``positive[a]`` / ``negative[a]``: (face_shape(a)) quadrature means of u^+ >= 0 / u^- <= 0.
    """

    values: list[np.ndarray]
    positive: list[np.ndarray]
    negative: list[np.ndarray]

    def max_speed(self) -> float:
        return float(max(max(p.max(initial=0.0), -m.min(initial=0.0))
                         for p, m in zip(self.positive, self.negative, strict=True)))


class FluxOperator:
    """Fluxes and limited forward-Euler steps for one grid and one reconstruction.

    Holds the ghost index maps and the work arrays, reused at every stage.
    """

    def __init__(self, grid: Grid, reconstruction: str = "weno5z",
                 face_quadrature: str = "auto", positivity: bool = True):
        self.grid = grid
        self.reconstruction = get_reconstruction(reconstruction)
        if face_quadrature not in FACE_QUADRATURES:
            raise ValueError(f"scheme.face_quadrature: unknown {face_quadrature!r}; choose one "
                             f"of {', '.join(FACE_QUADRATURES)}")
        self.face_quadrature = face_quadrature
        self.positivity = bool(positivity)
        d = grid.ndim
        self.src = [ghost_index_map(n, grid.boundary[a]) for a, n in enumerate(grid.cells)]
        self.periodic = [b == "periodic" for b in grid.boundary]
        self.vacuum_outside = [b == "outflow" for b in grid.boundary]
        self.face_shapes = [face_shape(grid.shape, a) for a in range(d)]
        self.face_area = [grid.cell_volume / grid.spacing[a] for a in range(d)]
        self._interp = np.stack([average_to_point_weights(x) for x in GAUSS3_NODES])
        self.fluxes = [np.zeros(s) for s in self.face_shapes]
        self._left = [None] * d
        self._right = [None] * d
        self._gauss_work = [None] * d
        self._low = np.empty(grid.shape)
        self._out_sum = np.empty(grid.shape)
        self._ratio = np.empty(grid.shape)
        self._low_flux = None
        self.limited_steps = 0

    # ---- where the velocity is needed --------------------------------------------------------
    def uses_gauss(self, face_constant: bool) -> bool:
        if self.grid.ndim == 1 or self.face_quadrature == "midpoint":
            return False
        return self.face_quadrature == "gauss" or not face_constant

    def face_nodes(self, face_constant: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per axis: (offsets (q, d) in cell widths from the cell centre, weights (q,)).

        The normal offset is +1/2 (faces); the lattice at that offset has n + 1 faces.
        """
        d = self.grid.ndim
        gauss = self.uses_gauss(face_constant)
        out = []
        for a in range(d):
            others = [b for b in range(d) if b != a]
            if gauss:
                combos = list(itertools.product(range(3), repeat=len(others)))
            else:
                combos = [()]
            offsets = np.zeros((len(combos), d))
            weights = np.ones(len(combos))
            for g, combo in enumerate(combos):
                offsets[g, a] = 0.5
                for b, node in zip(others, combo, strict=False):
                    offsets[g, b] = GAUSS3_NODES[node]
                    weights[g] *= GAUSS3_WEIGHTS[node]
            out.append((offsets, weights))
        return out

    def face_velocity(self, values: list[np.ndarray], weights: list[np.ndarray]) -> FaceVelocity:
        """Build a :class:`FaceVelocity` from node values (q, *face_shape) per axis.

        Applies the boundary modes: periodic faces n and 0 are made identical, no-flux
        boundary faces get zero normal velocity.
        """
        vals, pos, neg = [], [], []
        for a, (v, w) in enumerate(zip(values, weights, strict=True)):
            v = np.array(v, dtype=np.float64)  # own copy: boundary edits must not leak
            if v.shape != (len(w),) + self.face_shapes[a]:
                raise ValueError(f"velocity on faces of axis {a}: expected shape "
                                 f"{(len(w),) + self.face_shapes[a]}, got {v.shape}")
            if not np.all(np.isfinite(v)):
                raise FloatingPointError(f"velocity: non-finite value on the faces of axis {a}")
            n = self.grid.cells[a]
            sl_first = [slice(None)] * v.ndim
            sl_last = [slice(None)] * v.ndim
            sl_first[a + 1] = 0
            sl_last[a + 1] = n
            if self.periodic[a]:
                v[tuple(sl_last)] = v[tuple(sl_first)]
            elif self.grid.boundary[a] == "noflux":
                v[tuple(sl_first)] = 0.0
                v[tuple(sl_last)] = 0.0
            wb = w.reshape((-1,) + (1,) * (v.ndim - 1))
            vals.append(v)
            pos.append(np.ascontiguousarray(np.sum(wb * np.maximum(v, 0.0), axis=0)))
            neg.append(np.ascontiguousarray(np.sum(wb * np.minimum(v, 0.0), axis=0)))
        return FaceVelocity(vals, pos, neg)

    def outflow_rate(self, velocity: FaceVelocity) -> float:
        """max_c sum_a (u+_{c+1/2} - u-_{c-1/2}) / h_a; forward Euler is >= 0 for dt <= 1/rate."""
        rate = np.zeros(self.grid.shape)
        for a in range(self.grid.ndim):
            n = self.grid.cells[a]
            upper = [slice(None)] * self.grid.ndim
            lower = [slice(None)] * self.grid.ndim
            upper[a] = slice(1, n + 1)
            lower[a] = slice(0, n)
            inv_h = 1.0 / self.grid.spacing[a]
            rate += inv_h * velocity.positive[a][tuple(upper)]
            rate -= inv_h * velocity.negative[a][tuple(lower)]
        return float(rate.max())

    # ---- fluxes ------------------------------------------------------------------------------
    def _transverse(self, face: np.ndarray, axis: int, work: list[np.ndarray]) -> np.ndarray:
        """Interpolate face line averages to the Gauss nodes of the transverse axes.

        face: face_shape(axis) -> (3 ** (d - 1), *face_shape(axis)), node order as face_nodes.
        work: preallocated arrays (3, ...), (9, ...) for the successive transverse axes.
        """
        arrays = face[None]
        level = 0
        for b in range(self.grid.ndim):
            if b == axis:
                continue
            out = work[level]
            q = arrays.shape[0]
            for g in range(q):
                target = out[3 * g: 3 * g + 3]
                kernels.transverse_points(view3(arrays[g], b), self.src[b], self._interp,
                                          target.reshape((3,) + view3(arrays[g], b).shape))
            arrays = out
            level += 1
        return arrays

    def compute_fluxes(self, density: np.ndarray, velocity: FaceVelocity) -> list[np.ndarray]:
        """High-order face fluxes F_a (face_shape(a)) into the operator's work arrays."""
        recon = self.reconstruction.kind
        for a in range(self.grid.ndim):
            rho3 = view3(density, a)
            flux3 = view3(self.fluxes[a], a)
            lo_zero = self.vacuum_outside[a]
            hi_zero = self.vacuum_outside[a]
            if velocity.values[a].shape[0] == 1:
                kernels.upwind_face_flux(rho3, self.src[a], recon,
                                         view3(velocity.positive[a], a),
                                         view3(velocity.negative[a], a),
                                         lo_zero, hi_zero, flux3)
                continue
            if self._left[a] is None:
                self._left[a] = np.empty(self.face_shapes[a])
                self._right[a] = np.empty(self.face_shapes[a])
                levels = [3 ** (k + 1) for k in range(self.grid.ndim - 1)]
                self._gauss_work[a] = [[np.empty((q,) + self.face_shapes[a]) for q in levels]
                                       for _ in range(2)]
            kernels.face_states(rho3, self.src[a], recon, lo_zero, hi_zero,
                                view3(self._left[a], a), view3(self._right[a], a))
            left_g = self._transverse(self._left[a], a, self._gauss_work[a][0])
            right_g = self._transverse(self._right[a], a, self._gauss_work[a][1])
            u = velocity.values[a]
            q = u.shape[0]
            kernels.gauss_flux(u.reshape(q, -1), left_g.reshape(q, -1), right_g.reshape(q, -1),
                               self._node_weights(a, q), self.fluxes[a].reshape(-1))
        return self.fluxes

    def _node_weights(self, axis: int, q: int) -> np.ndarray:
        if q == 1:
            return np.ones(1)
        w = np.ones(1)
        for _ in range(self.grid.ndim - 1):
            w = np.outer(w, GAUSS3_WEIGHTS).ravel()
        return w

    # ---- one limited forward-Euler step -------------------------------------------------------
    def euler_step(self, density: np.ndarray, velocity: FaceVelocity, dt: float,
                   out: np.ndarray, fluxes: list[np.ndarray] | None = None) -> float:
        """out = density - dt div F (limited to keep out >= 0); returns the mass that left.

        ``fluxes`` are the high-order fluxes of ``density`` (computed if not given); they are
        overwritten by the limited fluxes. Raises :class:`PositivityError` when dt exceeds
        the positivity bound of the first-order flux.
        """
        if fluxes is None:
            fluxes = self.compute_fluxes(density, velocity)
        h = self.grid.spacing
        out[...] = density
        for a in range(self.grid.ndim):
            kernels.subtract_divergence(view3(fluxes[a], a), dt / h[a], view3(out, a))
        if self.positivity and out.min() < 0.0:
            self._limit(density, velocity, dt, out, fluxes)
        return self._outflow(fluxes, dt)

    def _limit(self, density, velocity, dt, out, fluxes) -> None:
        h = self.grid.spacing
        tol = 1e-12 * float(np.max(density))
        low, out_sum, ratio = self._low, self._out_sum, self._ratio
        if self._low_flux is None:
            self._low_flux = [np.empty(s) for s in self.face_shapes]
        low[...] = density
        out_sum[...] = 0.0
        for a in range(self.grid.ndim):
            low_flux3, anti3 = view3(self._low_flux[a], a), view3(fluxes[a], a)
            kernels.split_low_flux(anti3, view3(density, a), self.src[a],
                                   view3(velocity.positive[a], a),
                                   view3(velocity.negative[a], a),
                                   self.vacuum_outside[a], self.vacuum_outside[a], low_flux3)
            kernels.accumulate_low_and_outgoing(low_flux3, anti3, dt / h[a], view3(low, a),
                                                view3(out_sum, a))
        lowest = kernels.positivity_ratio(low.ravel(), out_sum.ravel(), ratio.ravel())
        if lowest < -tol:
            raise PositivityError(f"first-order update reached {lowest:.3e} < 0: dt = {dt:.3e} "
                                  "is above the positivity bound")
        out[...] = density
        for a in range(self.grid.ndim):
            kernels.limit_fluxes(view3(self._low_flux[a], a), view3(fluxes[a], a),
                                 view3(ratio, a), self.periodic[a])
            kernels.subtract_divergence(view3(fluxes[a], a), dt / h[a], view3(out, a))
        lowest = float(out.min())
        if lowest < -tol:
            raise PositivityError(f"limited update reached {lowest:.3e} < 0 at dt = {dt:.3e}")
        np.maximum(out, 0.0, out=out)  # round-off only (|value| <= 1e-12 max density)
        self.limited_steps += 1

    def _outflow(self, fluxes: list[np.ndarray], dt: float) -> float:
        """Mass through the outflow boundaries during the step: dt * sum face_area * F.n."""
        total = 0.0
        for a in range(self.grid.ndim):
            if not self.vacuum_outside[a]:
                continue
            n = self.grid.cells[a]
            upper = np.take(fluxes[a], n, axis=a).sum()
            lower = np.take(fluxes[a], 0, axis=a).sum()
            total += dt * self.face_area[a] * (upper - lower)
        return float(total)
