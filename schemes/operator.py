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
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tpde.grid import Grid, profile
from tpde.grid.stencils import average_to_point_weights, ghost_index_map

from . import kernels
from .reconstruction import get_reconstruction

if TYPE_CHECKING:
    from .frame import FrameRates

GAUSS3_NODES = np.array([-0.5 * np.sqrt(0.6), 0.0, 0.5 * np.sqrt(0.6)])  # in cell widths
GAUSS3_WEIGHTS = np.array([5.0, 8.0, 5.0]) / 18.0
FACE_QUADRATURES = ("auto", "midpoint", "gauss")
FACE_VELOCITIES = ("auto", "exact", "interpolated")
#: faces per block of the Gauss-node work (the transverse interpolations of the face states
#: and velocities): a lattice of more faces is processed in blocks of whole planes normal to
#: its axis, so the work arrays hold one block (3-D 128^3: 17 blocks per axis) instead of
#: 2 x 9 + 9 face lattices
BLOCK_FACES = 1 << 17
#: an unlimited Euler step whose negative values sum to at most this fraction of its positive
#: values (below the round-off of its mass: float64 eps = 2.2e-16) has them set to zero
#: instead of limiting its fluxes (docs/theory.md, 'Positivity': the far tails of a smooth
#: solution, e.g. WENO's -3e-21 undershoots in a Gaussian's tails, cost the full limiter
#: at every stage otherwise)
NEGLIGIBLE_NEGATIVE = 1e-3 * float(np.finfo(np.float64).eps)


def check_face_quadrature(name: object) -> str:
    """The one check of ``scheme.face_quadrature`` (FluxOperator and Scheme.validate)."""
    if name not in FACE_QUADRATURES:
        raise ValueError(
            f"scheme.face_quadrature: unknown {name!r}; choose one of {', '.join(FACE_QUADRATURES)}"
        )
    return str(name)


#: points of the Lagrange interpolation of face velocities along the transverse axes
POINT_ORDER = kernels.POINT_ORDER


def point_interpolation(
    n: int, shifts: np.ndarray, order: int = POINT_ORDER
) -> tuple[np.ndarray, np.ndarray]:
    """Lagrange stencils from point values at positions 0 .. n-1 to positions j + shifts[g].

    Returns first (q, n) int (the first stencil point, centred, moved inside at the ends) and
    weights (q, n, order). Degree order - 1: exact for polynomials of that degree, error
    O(h^order) for a smooth function; the weights of a zero shift are exactly 0 and 1.
    """
    if n < order:
        raise ValueError(f"point interpolation needs >= {order} points, got {n}")
    shifts = np.asarray(shifts, float)
    position = np.arange(n)[None, :] + shifts[:, None]  # (q, n)
    first = np.clip(np.floor(position).astype(int) - (order // 2 - 1), 0, n - order)
    s = position - first  # in [0, order - 1]
    weights = np.ones(position.shape + (order,))
    for k in range(order):
        for j in range(order):
            if j != k:
                weights[..., j] *= (s - k) / (j - k)
    return first, weights


class PositivityError(RuntimeError):
    """The first-order update went negative: the time step is above the positivity bound."""


def view3(arr: np.ndarray, axis: int) -> np.ndarray:
    """Reshape a C-contiguous array to (outer, n_axis, inner) without copying."""
    shape = arr.shape
    outer = math.prod(shape[:axis])
    inner = math.prod(shape[axis + 1 :])
    if not arr.flags.c_contiguous:
        raise ValueError("view3 needs a C-contiguous array")
    return arr.reshape(outer, shape[axis], inner)


def face_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return tuple(n + 1 if a == axis else n for a, n in enumerate(shape))


@dataclass
class FaceVelocity:
    """Normal velocity on the faces of every axis.

    ``values[a]``: (q, *face_shape(a)) at the q quadrature nodes of the faces normal to a,
    or, when ``centres`` is set, (face_shape(a)) the normal component at the face centres
    only: the Gauss-node values are interpolated from it along the faces block by block
    where they are used (:meth:`FluxOperator.node_values`; lattices of more than one block
    of faces, i.e. 3-D, where the node values would hold 27 doubles per cell);
    ``positive[a]`` / ``negative[a]``: (face_shape(a)) quadrature means of u^+ >= 0 / u^- <= 0;
    ``frame_rates``: in the co-moving frame, the frame's rates fitted with these velocities.
    """

    values: list[np.ndarray]
    positive: list[np.ndarray]
    negative: list[np.ndarray]
    frame_rates: FrameRates | None = None
    centres: bool = False

    def max_speed(self) -> float:
        return float(
            max(
                max(p.max(initial=0.0), -m.min(initial=0.0))
                for p, m in zip(self.positive, self.negative, strict=True)
            )
        )


class FluxOperator:
    """Fluxes and limited forward-Euler steps for one grid and one reconstruction.

    Holds the ghost index maps and the work arrays, reused at every stage.
    """

    def __init__(
        self,
        grid: Grid,
        reconstruction: str = "weno5z",
        face_quadrature: str = "auto",
        positivity: bool = True,
        slices: int | None = None,
    ):
        self.grid = grid
        # masked attention: a leading axis of position slices, transported independently
        self.lead = 0 if slices is None else 1
        self.shape = grid.shape if slices is None else (int(slices),) + grid.shape
        self.reconstruction = get_reconstruction(reconstruction)
        self.face_quadrature = check_face_quadrature(face_quadrature)
        self.positivity = bool(positivity)
        d = grid.ndim
        self.src = [ghost_index_map(n, grid.boundary[a]) for a, n in enumerate(grid.cells)]
        self.periodic = [b == "periodic" for b in grid.boundary]
        self.vacuum_outside = [b == "outflow" for b in grid.boundary]
        self.face_shapes = [self.shape[: self.lead] + face_shape(grid.shape, a) for a in range(d)]
        self.face_area = [grid.cell_volume / grid.spacing[a] for a in range(d)]
        self._interp = np.stack([average_to_point_weights(x) for x in GAUSS3_NODES])
        # stencils to the outer Gauss nodes (the middle node is the face centre itself)
        self._points = [
            point_interpolation(n, GAUSS3_NODES[::2]) if n >= POINT_ORDER else None
            for n in grid.cells
        ]
        self.fluxes = [np.zeros(s) for s in self.face_shapes]
        self._flat: dict[str, np.ndarray] = {}  # work buffers shared by the axes
        self._low = np.empty(self.shape)
        self._out_sum = np.empty(self.shape)
        self._ratio = np.empty(self.shape)
        self._low_flux: list[np.ndarray] | None = None  # (allocated by the first limiting)
        self.limited_steps = 0
        self.clipped_steps = 0  # Euler steps whose round-off negatives were set to zero

    def _axis(self, arr: np.ndarray, axis: int) -> np.ndarray:
        """(outer, n, inner) view of a state or face array with grid axis ``axis`` in the
        middle (position slices, if any, fold into ``outer``)."""
        return view3(arr, axis + self.lead)

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

    def can_interpolate(self, face_constant: bool = False) -> bool:
        """Whether the Gauss-node velocities can come from face centres by interpolation
        (Gauss nodes in use, >= POINT_ORDER cells along every axis)."""
        return self.uses_gauss(face_constant) and all(p is not None for p in self._points)

    def transverse_velocity(
        self, centre: np.ndarray, axis: int, work: list[np.ndarray] | None = None
    ) -> np.ndarray:
        """The normal velocity at the Gauss nodes of the faces from its face-centre values.

        centre: face_shape(axis) (or a block of its planes normal to ``axis``) ->
        (3 ** (d - 1), *centre.shape), node order as :meth:`face_nodes`: a
        POINT_ORDER-point Lagrange interpolation along each transverse axis in turn (error
        O(h^8) for a smooth velocity, below the fifth-order flux error; one-sided stencils
        at the ends, which need no values outside the box). ``work``: arrays (3, ...),
        (9, ...) to write the successive levels into (allocated if None).
        """
        arrays = np.ascontiguousarray(centre, dtype=np.float64)[None]
        level = 0
        for b in range(self.grid.ndim):
            if b == axis:
                continue
            points = self._points[b]
            assert points is not None, "transverse_velocity needs can_interpolate()"
            first, weights = points
            shape = (3 * arrays.shape[0],) + arrays.shape[1:]
            out = np.empty(shape) if work is None else work[level]
            level += 1
            for g in range(arrays.shape[0]):
                source = self._axis(arrays[g], b)
                out[3 * g + 1] = arrays[g]
                outer = out[3 * g : 3 * g + 3 : 2].reshape((2,) + source.shape)
                kernels.interpolate_points(source, first, weights, outer)
            arrays = out
        return arrays

    def face_velocity(
        self, values: list[np.ndarray], weights: list[np.ndarray], copy: bool = True
    ) -> FaceVelocity:
        """Build a :class:`FaceVelocity` from node values (q, *face_shape) per axis.

        Applies the boundary modes: periodic faces n and 0 are made identical, no-flux
        boundary faces get zero normal velocity (on a copy of ``values`` unless
        ``copy=False`` hands the arrays over).
        """
        vals, pos, neg = [], [], []
        for a, (v, w) in enumerate(zip(values, weights, strict=True)):
            v = (np.array if copy else np.asarray)(v, dtype=np.float64)  # edited below
            if v.shape != (len(w),) + self.face_shapes[a]:
                raise ValueError(
                    f"velocity on faces of axis {a}: expected shape "
                    f"{(len(w),) + self.face_shapes[a]}, got {v.shape}"
                )
            self._boundary_faces(v, a, 1)
            vals.append(v)
            pos.append(np.empty(self.face_shapes[a]))
            neg.append(np.empty(self.face_shapes[a]))
            if not kernels.split_node_means(
                v.reshape(len(w), -1),
                np.asarray(w, float),
                pos[-1].reshape(-1),
                neg[-1].reshape(-1),
            ):
                raise FloatingPointError(f"velocity: non-finite value on the faces of axis {a}")
        return FaceVelocity(vals, pos, neg)

    def centre_face_velocity(
        self, centres: list[np.ndarray], weights: list[np.ndarray]
    ) -> FaceVelocity:
        """A :class:`FaceVelocity` from the normal components at the face centres
        (face_shape(a) per axis; the list and its arrays are handed over), interpolated to
        the Gauss nodes along the faces (:meth:`transverse_velocity`).

        Lattices of one block each keep the node values (:meth:`face_velocity`); larger
        ones keep the centres (``centres``): the nodes are interpolated block by block here
        for the quadrature means u^+, u^- and again where the fluxes use them. The boundary
        modes act on the centres, which gives the same node values (the interpolation runs
        within planes of faces).
        """
        d = self.grid.ndim
        if all(len(self._planes(a)) == 1 for a in range(d)):
            values = []
            centres.reverse()
            for a in range(d):  # (memory: each face-centre array is dropped once used)
                values.append(self.transverse_velocity(centres.pop(), a))
            return self.face_velocity(values, weights, copy=False)
        vals, pos, neg = [], [], []
        for a, (v, w) in enumerate(zip(centres, weights, strict=True)):
            v = np.ascontiguousarray(v, dtype=np.float64)
            if v.shape != self.face_shapes[a]:
                raise ValueError(
                    f"velocity on face centres of axis {a}: expected shape "
                    f"{self.face_shapes[a]}, got {v.shape}"
                )
            self._boundary_faces(v, a, 0)
            vals.append(v)
            pos.append(np.empty(self.face_shapes[a]))
            neg.append(np.empty(self.face_shapes[a]))
            for planes in self._planes(a):
                nodes = self._nodes(v, True, a, planes)
                q = nodes.shape[0]
                up = self._block_work("positive", nodes.shape[1:])
                down = self._block_work("negative", nodes.shape[1:])
                if not kernels.split_node_means(
                    nodes.reshape(q, -1), np.asarray(w, float), up.reshape(-1), down.reshape(-1)
                ):
                    raise FloatingPointError(f"velocity: non-finite value on the faces of axis {a}")
                index = (slice(None),) * (a + self.lead) + (planes,)
                pos[-1][index] = up
                neg[-1][index] = down
        return FaceVelocity(vals, pos, neg, centres=True)

    def _boundary_faces(self, v: np.ndarray, a: int, nodes: int) -> None:
        """Periodic faces n and 0 made identical, no-flux boundary faces zero, in place
        (``v``: ``nodes`` leading axes of quadrature nodes, then face_shape(a))."""
        n = self.grid.cells[a]
        sl_first: list[slice | int] = [slice(None)] * v.ndim
        sl_last: list[slice | int] = [slice(None)] * v.ndim
        sl_first[a + nodes + self.lead] = 0
        sl_last[a + nodes + self.lead] = n
        if self.periodic[a]:
            v[tuple(sl_last)] = v[tuple(sl_first)]
        elif self.grid.boundary[a] == "noflux":
            v[tuple(sl_first)] = 0.0
            v[tuple(sl_last)] = 0.0

    def node_values(
        self, velocity: FaceVelocity, axis: int, planes: slice | None = None
    ) -> np.ndarray:
        """(q, *block) the velocity at the Gauss nodes of the faces normal to ``axis`` (the
        planes ``planes`` of them; all if None, as a new array): the stored node values, or
        interpolated from the face centres."""
        if planes is None:
            values = velocity.values[axis]
            if velocity.centres:
                return self.transverse_velocity(values, axis)
            return values
        return self._nodes(velocity.values[axis], velocity.centres, axis, planes)

    def _nodes(self, values: np.ndarray, centres: bool, a: int, planes: slice) -> np.ndarray:
        """Gauss-node velocities of a block of face planes (work arrays, reused)."""
        if not centres:
            return self._block("nodes", values, a, planes, 1)
        centre = self._block("centre", values, a, planes)
        levels = [3 ** (k + 1) for k in range(self.grid.ndim - 1)]
        work = [self._block_work(f"u{q}", (q,) + centre.shape) for q in levels]
        return self.transverse_velocity(centre, a, work)

    # ---- blocks of face planes ---------------------------------------------------------------
    def _planes(self, a: int) -> list[slice]:
        """The face planes normal to axis ``a`` in blocks of about BLOCK_FACES faces or
        fewer (whole planes; one block when the lattice fits)."""
        shape = self.face_shapes[a]
        m = shape[a + self.lead]
        blocks = -(-math.prod(shape) // BLOCK_FACES)
        size = -(-m // blocks)
        return [slice(p, min(m, p + size)) for p in range(0, m, size)]

    def _block(self, name: str, arr: np.ndarray, a: int, planes: slice, nodes: int = 0):
        """The planes ``planes`` (normal to axis ``a``) of a face array with ``nodes`` leading
        axes as a C-contiguous array: the array itself when the block is all of it, else a
        copy in the work buffer ``name``."""
        axis = nodes + a + self.lead
        if planes.start == 0 and planes.stop == arr.shape[axis]:
            return arr
        part = arr[(slice(None),) * axis + (planes,)]
        out = self._block_work(name, part.shape)
        out[...] = part
        return out

    def _block_work(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A work array of ``shape`` (leading node axes, then a block of face planes) on a
        buffer sized for the largest block of any axis."""
        key = "block:" + name
        if key not in self._flat:
            largest = max(
                max(p.stop - p.start for p in self._planes(a)) * (math.prod(f) // f[a + self.lead])
                for a, f in enumerate(self.face_shapes)
            )
            lead = math.prod(shape[: len(shape) - len(self.shape)])
            self._flat[key] = np.empty(lead * largest)
        return self._flat[key][: math.prod(shape)].reshape(shape)

    def outflow_rate(self, velocity: FaceVelocity) -> float:
        """max_c sum_a (u+_{c+1/2} - u-_{c-1/2}) / h_a; forward Euler is >= 0 for dt <= 1/rate."""
        rate = np.zeros(self.shape)
        for a in range(self.grid.ndim):
            n = self.grid.cells[a]
            upper = [slice(None)] * len(self.shape)
            lower = [slice(None)] * len(self.shape)
            upper[a + self.lead] = slice(1, n + 1)
            lower[a + self.lead] = slice(0, n)
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
                target = out[3 * g : 3 * g + 3]
                line = self._axis(arrays[g], b)
                kernels.transverse_points(
                    line, self.src[b], self._interp, target.reshape((3,) + line.shape)
                )
            arrays = out
            level += 1
        return arrays

    def face_states(self, density: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """The reconstruction's left and right states at every face normal to ``axis``
        (face_shape(axis) each; line averages over the face), as the fluxes use them. Views
        of work arrays: valid until the next flux computation."""
        shape = self.face_shapes[axis]
        left, right = self._work("left", shape), self._work("right", shape)
        kernels.face_states(
            self._axis(density, axis),
            self.src[axis],
            self.reconstruction.kind,
            self.vacuum_outside[axis],
            self.vacuum_outside[axis],
            self._axis(left, axis),
            self._axis(right, axis),
        )
        return left, right

    @profile.timed("fluxes")
    def compute_fluxes(self, density: np.ndarray, velocity: FaceVelocity) -> list[np.ndarray]:
        """High-order face fluxes F_a (face_shape(a)) into the operator's work arrays."""
        recon = self.reconstruction.kind
        for a in range(self.grid.ndim):
            rho3 = self._axis(density, a)
            flux3 = self._axis(self.fluxes[a], a)
            lo_zero = self.vacuum_outside[a]
            hi_zero = self.vacuum_outside[a]
            if not velocity.centres and velocity.values[a].shape[0] == 1:
                kernels.upwind_face_flux(
                    rho3,
                    self.src[a],
                    recon,
                    self._axis(velocity.positive[a], a),
                    self._axis(velocity.negative[a], a),
                    lo_zero,
                    hi_zero,
                    flux3,
                )
                continue
            left, right = self.face_states(density, a)
            levels = [3 ** (k + 1) for k in range(self.grid.ndim - 1)]
            q = levels[-1]
            weights = self._node_weights(a, q)
            for planes in self._planes(a):  # the transverse work one block of planes at a time
                left_b = self._block("left", left, a, planes)
                right_b = self._block("right", right, a, planes)
                block = left_b.shape
                left_g = self._transverse(
                    left_b, a, [self._block_work(f"left{k}", (k,) + block) for k in levels]
                )
                right_g = self._transverse(
                    right_b, a, [self._block_work(f"right{k}", (k,) + block) for k in levels]
                )
                u = self._nodes(velocity.values[a], velocity.centres, a, planes)
                flux = self._block("flux", self.fluxes[a], a, planes)
                kernels.gauss_flux(
                    u.reshape(q, -1),
                    left_g.reshape(q, -1),
                    right_g.reshape(q, -1),
                    weights,
                    flux.reshape(-1),
                )
                if flux is not self.fluxes[a]:
                    self.fluxes[a][(slice(None),) * (a + self.lead) + (planes,)] = flux
        return self.fluxes

    def _work(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A work array of ``shape`` ((q,) + face shape) on a buffer shared by the axes,
        which are processed one after the other."""
        lead = math.prod(shape[: len(shape) - len(self.shape)])
        if name not in self._flat:
            largest = max(math.prod(f) for f in self.face_shapes)
            self._flat[name] = np.empty(lead * largest)
        return self._flat[name][: math.prod(shape)].reshape(shape)

    def _node_weights(self, axis: int, q: int) -> np.ndarray:
        if q == 1:
            return np.ones(1)
        w = np.ones(1)
        for _ in range(self.grid.ndim - 1):
            w = np.outer(w, GAUSS3_WEIGHTS).ravel()
        return w

    # ---- one limited forward-Euler step -------------------------------------------------------
    @profile.timed("euler")
    def euler_step(
        self,
        density: np.ndarray,
        velocity: FaceVelocity,
        dt: float,
        out: np.ndarray,
        fluxes: list[np.ndarray] | None = None,
    ) -> float:
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
            kernels.subtract_divergence(self._axis(fluxes[a], a), dt / h[a], self._axis(out, a))
        if self.positivity and self.lead:
            # position slices are limited one by one: a slice that stays positive keeps its
            # high-order update bit for bit (masked attention: exact causality)
            lowest = out.reshape(out.shape[0], -1).min(axis=1)
            for k in np.flatnonzero(lowest < 0.0):
                part = slice(k, k + 1)
                if not self._clip(out[part]):
                    self._limit(
                        density[part], velocity, dt, out[part], [f[part] for f in fluxes], part
                    )
        elif self.positivity and out.min() < 0.0 and not self._clip(out):
            self._limit(density, velocity, dt, out, fluxes)
        return self._outflow(fluxes, dt)

    def _clip(self, out: np.ndarray) -> bool:
        """Set the negative values of an unlimited update to zero when they are below the
        round-off of its mass (a smooth solution's far tails; NEGLIGIBLE_NEGATIVE): that
        moves less mass than one rounding of its sum. False: the fluxes must be limited."""
        negative, positive = kernels.signed_sums(out.reshape(-1))
        if not negative <= NEGLIGIBLE_NEGATIVE * positive:  # (NaN: limited, which reports it)
            return False
        np.maximum(out, 0.0, out=out)
        self.clipped_steps += 1
        return True

    @profile.timed("limiter")
    def _limit(self, density, velocity, dt, out, fluxes, part: slice = slice(None)) -> None:
        """Limit the fluxes of ``density`` (the position slices ``part`` of the state when
        there are slices: every array passed is that part, the work arrays are cut to it)."""
        h = self.grid.spacing
        tol = 1e-12 * float(np.max(density))
        if self._low_flux is None:
            self._low_flux = [np.empty(s) for s in self.face_shapes]
        low, out_sum, ratio = self._low[part], self._out_sum[part], self._ratio[part]
        low_fluxes = [f[part] for f in self._low_flux]
        positive = [u[part] for u in velocity.positive]
        negative = [u[part] for u in velocity.negative]
        low[...] = density
        out_sum[...] = 0.0
        for a in range(self.grid.ndim):
            low_flux3, anti3 = self._axis(low_fluxes[a], a), self._axis(fluxes[a], a)
            kernels.split_low_flux(
                anti3,
                self._axis(density, a),
                self.src[a],
                self._axis(positive[a], a),
                self._axis(negative[a], a),
                self.vacuum_outside[a],
                self.vacuum_outside[a],
                low_flux3,
            )
            kernels.accumulate_low_and_outgoing(
                low_flux3, anti3, dt / h[a], self._axis(low, a), self._axis(out_sum, a)
            )
        lowest = kernels.positivity_ratio(low.ravel(), out_sum.ravel(), ratio.ravel())
        if lowest < -tol:
            raise PositivityError(
                f"first-order update reached {lowest:.3e} < 0: dt = {dt:.3e} "
                "is above the positivity bound"
            )
        out[...] = density
        for a in range(self.grid.ndim):
            kernels.limit_fluxes(
                self._axis(low_fluxes[a], a),
                self._axis(fluxes[a], a),
                self._axis(ratio, a),
                self.periodic[a],
            )
            kernels.subtract_divergence(self._axis(fluxes[a], a), dt / h[a], self._axis(out, a))
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
            upper = np.take(fluxes[a], n, axis=a + self.lead).sum()
            lower = np.take(fluxes[a], 0, axis=a + self.lead).sum()
            total += dt * self.face_area[a] * (upper - lower)
        return float(total)
