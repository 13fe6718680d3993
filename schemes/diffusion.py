"""Noise: the diffusion term ``eps Delta rho`` in finite-volume form and its exact solve.

docs/theory.md, 'Noise: the diffusion flux and its solve'. The noisy Transformer PDE
``d/dt rho + div(rho Gamma) = eps Delta rho`` is split (Strang): half a step of diffusion, the
transport step, half a step of diffusion. The diffusion substep is solved exactly in time, so
the step is never limited by ``dt ~ h^2 / eps`` and the splitting keeps second order in time.

Space (per axis, cell averages ``rho_i``, spacing ``h``). The diffusive flux on the face
``i + 1/2`` is ``-eps g_{i+1/2}`` with the fourth-order face gradient of cell averages

    g_{i+1/2} = (rho_{i-1} - 15 rho_i + 15 rho_{i+1} - rho_{i+2}) / (12 h),

and the update is the flux difference ``(g_{i+1/2} - g_{i-1/2}) / h``: the stencil
``(-1, 16, -30, 16, -1) / (12 h^2)``, fourth order on cell averages, mass exact (a telescoping
sum of face fluxes). Ghost cells as the transport's boundary modes: periodic wrap; ``noflux``
mirror (the wall face's gradient is zero: no flux); ``outflow`` vacuum outside (ghosts 0:
mass diffuses out and is counted as outflow).

Time. With ``L_a`` the axis operator (a dense ``n x n`` matrix) the substep is
``rho <- prod_a exp(tau eps L_a) rho`` (the axis operators commute), one matrix product per
axis; the exponentials are formed once per substep length (:data:`CACHED_STEPS` kept; the
solver rounds a noisy step down to :func:`quantised_step` levels so that they repeat).
Scaling and squaring keeps the relative accuracy of the far, decaying entries, so a
Gaussian's tails stay accurate far below the round-off of the bulk (a global FFT leaves
``1e-16 max rho`` there, which the exponential tilts of attention amplify).

Positivity. ``exp(tau L_a)`` of the fourth-order stencil has small negative entries (a
Gaussian's far tails go negative), the second-order one (``(1, -2, 1) / h^2``, off-diagonals
>= 0) is a positive matrix. An axis whose fourth-order result has negative values beyond
round-off is flux-corrected towards the second-order one (:func:`limit_axis`): the difference
of the two is written as antidiffusive face fluxes and those are limited where they would
drain a cell below zero; mass exact, the bulk untouched.

The co-moving frame ``x = m + L xi``: ``Delta_x = div_xi(M grad_xi)``, ``M = L^-1 L^-T``, a
full constant tensor on the ``xi`` grid. That substep is solved in Fourier space on the box
by the action of the exponential of the sparse operator (scipy's ``expm_multiply``): the axis
Laplacians above weighted by ``M_aa`` plus ``2 M_ab Q_a Q_b`` with ``Q`` the fourth-order
derivative of cell averages ``(1, -8, 0, 8, -1) / (12 h)``, itself a difference of the face
interpolants ``(-1, 7, 7, -1) / 12`` (flux form, mass exact). For ``M = I`` it is the fixed
box's operator. There is no positive fourth-order operator with cross terms: a substep whose
result has negatives beyond round-off (far tails) has them set to zero and its mass restored
by scaling, and counts in ``Diffusion.blended``.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
from scipy import sparse
from scipy.linalg import expm
from scipy.sparse.linalg import expm_multiply

from tpde.grid import Grid
from tpde.grid.stencils import ghost_index_map

from .operator import NEGLIGIBLE_NEGATIVE, view3

#: h * (face gradient) at face i + 1/2 from rho_{i-1}, rho_i, rho_{i+1}, rho_{i+2}
FACE_GRADIENT = {4: np.array([1.0, -15.0, 15.0, -1.0]) / 12.0, 2: np.array([0.0, -1.0, 1.0, 0.0])}
#: substep lengths whose axis exponentials are kept (Strang: the two halves share one)
CACHED_STEPS = 16
#: a noisy step is rounded down to a power of 2^(1/STEP_LEVELS) (at most 8% shorter), so that
#: the few step lengths of a run reuse their exponentials: forming them costs ~10 matrix
#: products of n x n (0.18 s at n = 128, 2.5 s at 256 on a loaded core:
#: benchmarks/diffusion.py) against one product to apply them
STEP_LEVELS = 8


def quantised_step(dt: float) -> float:
    """The largest ``2^(j / STEP_LEVELS) <= dt`` (j an integer): the step of a noisy run."""
    if not (math.isfinite(dt) and dt > 0.0):
        return dt
    return float(2.0 ** (math.floor(STEP_LEVELS * math.log2(dt) + 1e-9) / STEP_LEVELS))


def check_noise(value: object) -> float:
    """The one check of the noise coefficient ``eps`` (``run.noise``): a finite number >= 0."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and math.isfinite(float(value)) and float(value) >= 0.0):  # type: ignore[arg-type]
        raise ValueError(
            f"run.noise: expected a finite number >= 0 (eps in eps Delta mu), got {value!r:.40}"
        )
    return float(value)  # type: ignore[arg-type]


def laplacian_matrix(n: int, h: float, mode: str, order: int = 4) -> np.ndarray:
    """(n, n) the finite-volume Laplacian of cell averages on one axis: flux differences of
    the face gradients :data:`FACE_GRADIENT` (order 4 or 2), ghosts by the boundary mode
    (``periodic``, ``noflux``: zero wall flux, ``outflow``: vacuum outside)."""
    if order not in FACE_GRADIENT:
        raise ValueError(f"diffusion order: expected 2 or 4, got {order}")
    weights = FACE_GRADIENT[order]
    source = ghost_index_map(n, mode, 3)  # padded position p -> cell, p = -3 .. n + 2
    grad = np.zeros((n + 1, n))  # face j (between cells j - 1 and j)
    for j in range(n + 1):
        if mode == "noflux" and j in (0, n):
            continue  # the wall: no flux
        for w, cell in zip(weights, range(j - 2, j + 2), strict=True):
            if w == 0.0:
                continue
            if mode == "outflow" and not 0 <= cell < n:
                continue  # vacuum outside the box
            grad[j, source[cell + 3]] += w / h
    return (grad[1:] - grad[:-1]) / h


def derivative_matrix(n: int, h: float, mode: str) -> np.ndarray:
    """(n, n) the fourth-order derivative of cell averages ``(rho_{i-2} - 8 rho_{i-1} +
    8 rho_{i+1} - rho_{i+2}) / (12 h)``: the difference of the face interpolants
    ``(-rho_{i-1} + 7 rho_i + 7 rho_{i+1} - rho_{i+2}) / 12`` over ``h`` (flux form); ghosts
    as :func:`laplacian_matrix` (noflux: the wall faces carry nothing)."""
    weights = np.array([-1.0, 7.0, 7.0, -1.0]) / 12.0
    source = ghost_index_map(n, mode, 3)
    face = np.zeros((n + 1, n))
    for j in range(n + 1):
        if mode == "noflux" and j in (0, n):
            continue
        for w, cell in zip(weights, range(j - 2, j + 2), strict=True):
            if mode == "outflow" and not 0 <= cell < n:
                continue
            face[j, source[cell + 3]] += w
    return (face[1:] - face[:-1]) / h


def frame_step_bound(gain: np.ndarray, grid: Grid) -> float:
    """The co-moving frame's CFL rate with noise: ``sum_a max_box |(G xi)_a| / h_a`` of the
    frame's affine velocity ``G xi`` over the box (``gain`` G, (d, d)). In the frame the
    residual velocity can vanish, but the splitting error of the diffusion and the frame's
    motion does not: a noisy frame step is held to the fixed box's CFL bound of that motion."""
    corners = np.maximum(np.abs(np.asarray(grid.lower)), np.abs(np.asarray(grid.upper)))
    speeds = np.abs(np.asarray(gain, float)) @ corners
    return float(np.sum(speeds / np.asarray(grid.spacing)))


def axis_exponential(scale: float, n: int, h: float, mode: str, order: int = 4) -> np.ndarray:
    """(n, n) ``exp(scale L)`` of :func:`laplacian_matrix` (scipy's scaling and squaring).
    Without outflow every column sums to 1 (mass); the squarings leave a round-off of
    ``~1e-16 ||scale L||`` on that sum (4e-13 at ``scale / h^2 = 1000``), so the columns are
    rescaled to sum 1 exactly (a change at the level of that round-off)."""
    matrix = expm(scale * laplacian_matrix(n, h, mode, order))
    if mode != "outflow":
        matrix /= matrix.sum(axis=0, keepdims=True)
    return matrix


def apply_axis(matrix: np.ndarray, state: np.ndarray, axis: int, out: np.ndarray) -> None:
    """out = the (n, n) ``matrix`` applied along ``axis`` of the C-contiguous ``state``."""
    np.matmul(matrix, view3(state, axis), out=view3(out, axis))


def _negligible(values: np.ndarray) -> bool:
    """Negative values below the round-off of the mass (operator.NEGLIGIBLE_NEGATIVE)."""
    negative = -values[values < 0.0].sum()
    return bool(negative <= NEGLIGIBLE_NEGATIVE * values[values > 0.0].sum())


def limit_axis(high: np.ndarray, low: np.ndarray) -> None:
    """Flux-corrected ``high`` (in place) along the middle axis of (outer, n, inner) arrays:
    ``high = low - div A`` with the antidiffusive face fluxes ``A_{i+1/2} = -sum_{j <= i}
    (high - low)_j`` (``A_{-1/2} = 0``; the last face carries what the two operators let
    leave differently through an outflow boundary), each scaled by ``R`` of the cell it
    drains, ``R_i = min(1, low_i / P_i)``, ``P_i`` the cell's outgoing antidiffusive flux
    (Zalesak's limiter, positivity half: the transport's, docs/theory.md, 'Positivity'). Mass
    is exact (flux form), every cell ends >= 0, and ``R = 1`` wherever the corrections do not
    drain a cell below zero (the bulk of a smooth solution keeps fourth order)."""
    outer, n, inner = high.shape
    flux = np.zeros((outer, n + 1, inner))
    flux[:, 1:] = -np.cumsum(high - low, axis=1)
    outgoing = np.maximum(flux[:, 1:], 0.0) + np.maximum(-flux[:, :-1], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(outgoing > low, low / outgoing, 1.0)
    coefficient = np.ones_like(flux)
    coefficient[:, 1:] = np.where(flux[:, 1:] > 0.0, ratio, coefficient[:, 1:])
    coefficient[:, :-1] = np.where(flux[:, :-1] < 0.0, ratio, coefficient[:, :-1])
    limited = coefficient * flux
    high[...] = low - (limited[:, 1:] - limited[:, :-1])
    np.maximum(high, 0.0, out=high)  # (round-off: each cell loses at most its low value)


class Diffusion:
    """The exact diffusion substep ``rho <- exp(tau eps Delta) rho`` on a grid (fixed box, any
    boundary modes: axis exponentials; the co-moving frame: Fourier symbols).

    ``lead``: leading axes of position slices (masked attention), each diffused alone.
    ``blended``: axis substeps that were flux-corrected (or, in the frame, clipped).
    """

    def __init__(self, grid: Grid, eps: float, lead: int = 0):
        self.grid = grid
        self.eps = check_noise(eps)
        self.lead = int(lead)
        self._cache: OrderedDict[float, tuple[list[np.ndarray], list[np.ndarray]]] = OrderedDict()
        self.blended = 0
        self.outflow_axes = [b == "outflow" for b in grid.boundary]

    # ---- the fixed box ------------------------------------------------------------------------
    def _exponentials(self, tau: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if tau not in self._cache:
            grid = self.grid
            pairs = [
                [
                    axis_exponential(tau * self.eps, n, h, mode, order)
                    for n, h, mode in zip(grid.cells, grid.spacing, grid.boundary, strict=True)
                ]
                for order in (4, 2)
            ]
            self._cache[tau] = (pairs[0], pairs[1])
            while len(self._cache) > CACHED_STEPS:
                self._cache.popitem(last=False)
        return self._cache[tau]

    def _apply(
        self, high_ops: list[np.ndarray], low_ops: list[np.ndarray], density: np.ndarray
    ) -> np.ndarray:
        """The axis exponentials in turn, each limited to stay >= 0 (:func:`limit_axis`)."""
        state = np.ascontiguousarray(density, dtype=np.float64)
        for a, (high_op, low_op) in enumerate(zip(high_ops, low_ops, strict=True)):
            high = np.empty_like(state)
            apply_axis(high_op, state, a + self.lead, high)
            if high.min() < 0.0 and not _negligible(high):
                low = np.empty_like(state)
                apply_axis(low_op, state, a + self.lead, low)
                np.maximum(low, 0.0, out=low)  # (round-off: exp of a Metzler matrix is >= 0)
                limit_axis(view3(high, a + self.lead), view3(low, a + self.lead))
                self.blended += 1
            else:
                np.maximum(high, 0.0, out=high)
            state = high
        return state

    def step(self, density: np.ndarray, tau: float, frame_matrix: np.ndarray | None = None):
        """The diffused density after a time ``tau`` (a new array) and the mass that left
        through outflow boundaries. ``frame_matrix``: the frame's ``L`` (xi grid), else None."""
        if self.eps == 0.0 or tau <= 0.0:
            return density, 0.0
        if frame_matrix is not None:
            out = self._frame_step(density, tau, np.asarray(frame_matrix, float))
            return out, float(self.grid.cell_volume * (np.sum(density) - np.sum(out)))
        high_ops, low_ops = self._exponentials(float(tau))
        high = self._apply(high_ops, low_ops, density)
        left = 0.0
        if any(self.outflow_axes):
            volume = self.grid.cell_volume
            left = float(volume * (np.sum(density) - np.sum(high)))
        return high, left

    # ---- the co-moving frame ------------------------------------------------------------------
    def frame_operator(self, tensor: np.ndarray) -> sparse.csr_matrix:
        """(N, N) sparse ``div(tensor grad)`` on the grid's cells (C order): the axis
        Laplacians weighted by the diagonal, ``2 tensor_ab Q_a Q_b`` off it (``Q`` the
        fourth-order derivative of cell averages, a difference of face interpolants: flux
        form). Kronecker products of the axis operators."""
        grid = self.grid
        d = grid.ndim
        eye = [sparse.identity(n, format="csr") for n in grid.cells]
        lap = [
            sparse.csr_matrix(laplacian_matrix(n, h, mode))
            for n, h, mode in zip(grid.cells, grid.spacing, grid.boundary, strict=True)
        ]
        der = [
            sparse.csr_matrix(derivative_matrix(n, h, mode))
            for n, h, mode in zip(grid.cells, grid.spacing, grid.boundary, strict=True)
        ]

        def kron(factors: dict[int, sparse.csr_matrix]) -> sparse.csr_matrix:
            out = factors.get(0, eye[0])
            for a in range(1, d):
                out = sparse.kron(out, factors.get(a, eye[a]), format="csr")
            return out

        total = sparse.csr_matrix((grid.size, grid.size))
        for a in range(d):
            total = total + tensor[a, a] * kron({a: lap[a]})
            for b in range(a + 1, d):
                total = total + 2.0 * tensor[a, b] * kron({a: der[a], b: der[b]})
        return total.tocsr()

    def _frame_step(self, density: np.ndarray, tau: float, L: np.ndarray) -> np.ndarray:
        """exp(tau eps div(M grad)) on the xi grid, ``M = L^-1 L^-T``, by scipy's
        ``expm_multiply`` (Taylor steps of the sparse operator: local, so the far tails keep
        their relative accuracy, which the exponential tilts of attention need)."""
        inverse = np.linalg.inv(L)
        operator = self.frame_operator(self.eps * inverse @ inverse.T)
        flat = np.ascontiguousarray(density, dtype=np.float64).reshape(-1)
        out = expm_multiply(tau * operator, flat).reshape(density.shape)
        if out.min() < 0.0 and not _negligible(out):
            # no positive fourth-order operator with cross terms: the negatives (far tails)
            # are set to zero and the mass they took is restored by scaling
            mass = out.sum()
            np.maximum(out, 0.0, out=out)
            out *= mass / out.sum()
            self.blended += 1
        else:
            np.maximum(out, 0.0, out=out)
        return np.ascontiguousarray(out)
