"""The co-moving affine frame: the grid follows the measure's mean and covariance.

Physical coordinates are ``x = m(t) + L(t) xi``; the solver transports the push-forward
``rho`` of the measure to ``xi`` (a probability density on a fixed ``xi`` grid, ``mu(x) =
rho(xi) / |det L|``). With ``m' = b`` and ``L' = B L`` the continuity equation in ``xi`` reads

    d/dt rho + div_xi(rho w) = 0,   w(xi) = L^-1 (Gamma(m + L xi) - b - B L xi).

The frame's rates are the affine least-squares fit of the field the variant returns in frame
coordinates, ``u(xi) = L^-1 Gamma(m + L xi)``, weighted by ``rho``:

    u(xi) ~ a + G (xi - xi_bar),   G = Cov_rho(u, xi) Cov_rho(xi)^-1,
    m' = L (a - G xi_bar),   L' = L G   (i.e. B = L G L^-1),   w = u - a - G (xi - xi_bar).

``w`` is the fit's residual: it vanishes identically when ``Gamma`` is affine on the current
measure (Gaussian data under softmax, l2, Sinkhorn, multi-head; linear attention for any data),
and then the density in the frame is stationary and only ``(m, L)`` move. The fit is taken per
axis from the normal components at the face centres, weighted by the face density (the mean of
the two neighbouring cells): row ``a`` of ``G`` uses the faces normal to ``a``. The quadrature
is second order, but an affine ``u`` is fitted exactly by any quadrature (the same sums form the
moments and the covariances), so ``w = 0`` holds to round-off; for non-affine ``u`` the fit only
decides how closely the frame follows the moments, never the solution it describes
(docs/theory.md, "The co-moving affine frame").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from tpde.grid import Grid

from .atoms import AtomRates, atom_rates

FRAMES = ("fixed", "affine")
#: in the frame, a face whose velocity the box cuts by more than this (the Gaussian
#: surrogate's cut, VelocityField.cut) keeps the frame's affine fit (residual 0) and takes no
#: part in it; a field whose cut means something else says so in VelocityField.held_cut
HELD_CUT = 1e-12
#: in the frame the residual is zero on faces whose density is below this fraction of the
#: largest: there WENO's smoothness indicators fall under WENO_EPS, its weights lose their
#: relative accuracy, and even a residual of 1e-12 gives the far tails relative errors of
#: O(1) within a few steps, which large tilts amplify by e^(c.y) into O(1) velocity errors
#: (measured). Those tails move with the frame's affine fit instead
TRANSPORT_FLOOR = 1e-20
#: tilted laws count as held only inside the box of the cells above this fraction of the
#: largest density (tpde.variants.truncation)
ACTIVE_FLOOR = 1e-40
#: the fit skips the faces that are not held only while those held carry this share of the
#: face mass (else it uses every face)
HELD_FIT_MASS = 0.5


@dataclass(frozen=True)
class AffineFrame:
    """``x = mean + matrix @ xi``: mean (d,), matrix (d, d) invertible."""

    mean: np.ndarray
    matrix: np.ndarray

    def __post_init__(self) -> None:
        mean = np.array(self.mean, dtype=float).reshape(-1)
        matrix = np.array(self.matrix, dtype=float)
        if matrix.shape != (mean.size, mean.size):
            raise ValueError(
                f"frame.matrix: expected {mean.size} x {mean.size}, got {matrix.shape}"
            )
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(matrix))):
            raise ValueError("frame: mean and matrix must be finite")
        if abs(np.linalg.det(matrix)) <= 0.0:
            raise ValueError("frame.matrix: must be invertible")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "matrix", matrix)

    @property
    def inverse(self) -> np.ndarray:
        return np.linalg.inv(self.matrix)

    @property
    def jacobian(self) -> float:
        """|det L|: the physical density is the frame density divided by it."""
        return float(abs(np.linalg.det(self.matrix)))

    def physical(self, xi: np.ndarray) -> np.ndarray:
        """x = m + L xi for points xi (..., d)."""
        return self.mean + np.asarray(xi) @ self.matrix.T

    def moments(self, xi_mean: np.ndarray, xi_cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Physical mean and covariance from the frame density's: (m + L xi_bar, L C L^T)."""
        L = self.matrix
        return self.mean + L @ xi_mean, L @ xi_cov @ L.T

    def advanced(self, rates: FrameRates, dt: float) -> AffineFrame:
        """The forward-Euler step ``(m + dt m', L + dt L')``."""
        return AffineFrame(self.mean + dt * rates.mean, self.matrix + dt * rates.matrix)

    @staticmethod
    def combination(weights: list[float], frames: list[AffineFrame]) -> AffineFrame:
        """sum_k weights[k] frames[k] (the Runge-Kutta stage combinations)."""
        mean = sum(w * f.mean for w, f in zip(weights, frames, strict=True))
        matrix = sum(w * f.matrix for w, f in zip(weights, frames, strict=True))
        return AffineFrame(np.asarray(mean), np.asarray(matrix))

    @staticmethod
    def following(mean: np.ndarray, covariance: np.ndarray) -> AffineFrame:
        """The frame of a measure with this mean and covariance: L = covariance^(1/2)
        (symmetric square root, so xi's axes are not rotated at the start)."""
        cov = np.asarray(covariance, float)
        values, vectors = np.linalg.eigh(0.5 * (cov + cov.T))
        if not np.all(values > 0):
            raise ValueError("frame: the initial covariance must be positive definite")
        return AffineFrame(np.asarray(mean, float), (vectors * np.sqrt(values)) @ vectors.T)


#: a mixture entering the frame from a config gets at least this many frame cells per
#: standard deviation of its narrowest component (:func:`mixture_frame`'s ``grid``): the
#: frame unit shrinks below the whole law's standard deviation where separated bumps would
#: otherwise be narrower than the cells (docs/theory.md, 'The three-bump law: step and
#: frame units')
COMPONENT_CELLS = 2.0
#: ... but no further than keeps every component's mean +- this many of its standard
#: deviations (per axis) inside the grid (the config's mass check asks for 1 - 1e-6)
HOLD_SD = 6.0


def mixture_frame(
    weights: ArrayLike,
    means: Sequence[np.ndarray],
    covariances: Sequence[np.ndarray],
    grid: Grid | None = None,
) -> tuple[AffineFrame, list[np.ndarray], list[np.ndarray]]:
    """The frame that follows a Gaussian mixture (its exact mean and covariance, with
    :meth:`AffineFrame.following`) and the components' means and covariances in it,
    ``L^-1 (mu_k - m)`` and ``L^-1 C_k L^-T``: the mixture's push-forward to xi.

    ``grid`` (the frame's grid; None: the whole law's standard deviations are the frame's
    units): with several components whose narrowest standard deviation ``s`` in those units
    is below ``COMPONENT_CELLS h`` (``h`` the grid's widest cell), the frame is ``L = c
    Sigma^(1/2)`` with ``c = s / (COMPONENT_CELLS h)``, so that component has
    ``COMPONENT_CELLS`` cells per standard deviation, or the smallest ``c`` that keeps every
    component's mean +- ``HOLD_SD`` standard deviations inside the grid where that is
    larger (``c < 1`` only, on a grid around 0; the law then has covariance ``I / c^2``,
    which the frame keeps)."""
    w = np.asarray(weights, float) / float(np.sum(weights))
    mus = [np.asarray(m, float) for m in means]
    covs = [np.asarray(c, float) for c in covariances]
    mean = sum(wk * mk for wk, mk in zip(w, mus, strict=True))
    second = sum(wk * (ck + np.outer(mk, mk)) for wk, mk, ck in zip(w, mus, covs, strict=True))
    frame = AffineFrame.following(np.asarray(mean), np.asarray(second) - np.outer(mean, mean))
    inverse = frame.inverse
    if grid is not None and len(covs) > 1:
        scale = _component_scale(
            [inverse @ (mk - frame.mean) for mk in mus],
            [inverse @ ck @ inverse.T for ck in covs],
            grid,
        )
        if scale < 1.0:
            frame = AffineFrame(frame.mean, scale * frame.matrix)
            inverse = frame.inverse
    return (
        frame,
        [inverse @ (mk - frame.mean) for mk in mus],
        [inverse @ ck @ inverse.T for ck in covs],
    )


def uniform_ball_frame(center: np.ndarray, radius: float) -> tuple[AffineFrame, float]:
    """The frame of the uniform law on the ball ``|x - c| <= r`` in R^d (covariance
    ``r^2 / (d + 2) I``) and the pushed ball's radius ``sqrt(d + 2)`` (centred at 0)."""
    d = len(center)
    frame = AffineFrame.following(np.asarray(center, float), radius**2 / (d + 2) * np.eye(d))
    return frame, math.sqrt(d + 2)


def uniform_box_frame(lower: np.ndarray, upper: np.ndarray) -> tuple[AffineFrame, float]:
    """The frame of the uniform law on the box ``[lo, hi]`` (mean ``(lo + hi) / 2``,
    covariance ``diag((hi - lo)^2 / 12)``) and the pushed box's half-edge ``sqrt 3`` (the
    pushed box is ``[-sqrt 3, sqrt 3]^d``: L is diagonal)."""
    low, high = np.asarray(lower, float), np.asarray(upper, float)
    frame = AffineFrame.following(0.5 * (low + high), np.diag((high - low) ** 2 / 12.0))
    return frame, math.sqrt(3.0)


def points_frame(points: np.ndarray, weights: np.ndarray) -> AffineFrame:
    """The frame of weighted points (n, d), weights (n,) summing to 1: their mean
    ``sum_i w_i x_i`` and covariance ``sum_i w_i (x_i - m)(x_i - m)^T``
    (:meth:`AffineFrame.following`; ValueError where it is singular)."""
    mean = weights @ points
    centred = points - mean
    return AffineFrame.following(mean, (centred * weights[:, None]).T @ centred)


def to_frame(frame: AffineFrame, points: np.ndarray) -> np.ndarray:
    """Points (n, d) in frame units: ``xi_i = L^-1 (x_i - m)``."""
    return (points - frame.mean) @ frame.inverse.T


def cell_subpoints(grid: Grid, density: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``k^d`` evenly spaced points per cell of ``grid`` (the centres of the cell's ``k^d``
    sub-cells, (N k^d, d)) and their weights (N k^d,): each the value of ``density`` (the
    cell averages, ``grid.shape``) in its cell, so that they carry the cells' mass in equal
    shares (to be normalised by the caller)."""
    d = grid.ndim
    axes = [
        (grid.lower[a] + (np.arange(grid.cells[a] * k) + 0.5) * grid.spacing[a] / k)
        for a in range(d)
    ]
    points = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, d)
    weights = np.repeat(density, k, axis=0) if d >= 1 else density
    for a in range(1, d):
        weights = np.repeat(weights, k, axis=a)
    return points, weights.reshape(-1)


def _component_scale(centres: list[np.ndarray], covs: list[np.ndarray], grid: Grid) -> float:
    """:func:`mixture_frame`'s ``c`` for components pushed to the whole law's units (1: no
    change, on a grid that does not hold 0 inside on every axis)."""
    lower, upper = np.asarray(grid.lower, float), np.asarray(grid.upper, float)
    if not (np.all(lower < 0.0) and np.all(upper > 0.0)):
        return 1.0
    narrowest = min(math.sqrt(float(np.linalg.eigvalsh(c).min())) for c in covs)
    scale = narrowest / (COMPONENT_CELLS * float(np.max(grid.spacing)))
    for centre, c in zip(centres, covs, strict=True):  # the grid holds HOLD_SD of each
        reach = HOLD_SD * np.sqrt(np.diag(c))
        scale = max(scale, *((centre + reach) / upper), *((centre - reach) / lower))
    return float(scale)


@dataclass(frozen=True)
class FrameRates:
    """d/dt of the frame: mean (d,), matrix (d, d); ``gain`` is G = L^-1 L' (d, d);
    ``points``: the atoms' rates in the frame (:class:`~.atoms.AtomRates`) where the fit
    had atoms (:class:`FitPoints`), else None."""

    mean: np.ndarray
    matrix: np.ndarray
    gain: np.ndarray
    points: AtomRates | None = None


@dataclass(frozen=True)
class FitPoints:
    """The atoms as weighted Gaussian points of the frame's fit (docs/theory.md, 'Atoms in
    the co-moving frame'), in frame coordinates: ``weight`` (K,) in the units of the face
    densities (mass / cell volume), ``centre`` (K, d), ``cov`` (K, d, d), and the field at
    the centres, ``u`` (K, d), ``jacobian`` (K, d, d) ``[k, i, j] = d_j u_i``, ``hessian``
    (K, d, d, d). An atom enters the moments of the fit as the Gaussian it is: ``E u = u +
    1/2 S : D^2 u`` at its centre and ``Cov(u, xi) = Du S`` (exact for quadratic ``u``)."""

    weight: np.ndarray
    centre: np.ndarray
    cov: np.ndarray
    u: np.ndarray
    jacobian: np.ndarray
    hessian: np.ndarray

    @property
    def mean_u(self) -> np.ndarray:
        """``E u = u + 1/2 S : D^2 u`` over each atom (K, d)."""
        return self.u + 0.5 * np.einsum("kjl,kijl->ki", self.cov, self.hessian)

    @property
    def spread(self) -> np.ndarray:
        """``Cov(u, xi) = Du S`` of each atom (K, d, d): ``[k, a, b]`` for row a."""
        return np.einsum("kij,kjl->kil", self.jacobian, self.cov)

    def rates(self, drift: np.ndarray, gain: np.ndarray) -> AtomRates:
        """The atoms' motion in the frame: the fit's residual at the atom, ``xi' = E u -
        drift - G xi`` and ``S' = (Du - G) S + S (Du - G)^T`` (:func:`~.atoms.atom_rates`
        of the residual field ``u - drift - G xi``)."""
        residual = self.u - drift - self.centre @ gain.T
        return atom_rates(residual, self.jacobian - gain, self.hessian, self.cov)


def face_density(density: np.ndarray, axis: int) -> np.ndarray:
    """The density on the faces normal to ``axis``: mean of the two neighbouring cells (a cell
    outside the box counts as empty), shape cells with ``cells[axis] + 1`` along ``axis``."""
    shape = list(density.shape)
    shape[axis] += 1
    faces = np.zeros(shape)
    inner = [slice(None)] * density.ndim
    inner[axis] = slice(1, None)
    faces[tuple(inner)] += density  # the cell below each face ...
    inner[axis] = slice(None, -1)
    faces[tuple(inner)] += density  # ... plus the cell above it
    faces *= 0.5
    return faces


def _marginal(values: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """``values`` summed over every axis not in ``axes`` (kept in their order)."""
    return values.sum(axis=tuple(b for b in range(values.ndim) if b not in axes))


def weighted_fit(
    weight: np.ndarray,
    coords: Sequence[np.ndarray],
    u: np.ndarray,
    points: tuple[np.ndarray, ...] | None = None,
) -> tuple[float, np.ndarray]:
    """The weighted least-squares fit ``u ~ drift + row . x`` over a tensor lattice:
    weight, u (*lattice shape), weight >= 0 with a positive sum; coords one 1-D array per
    axis. Returns (drift, row (d,)). The moments are centred sums, formed from marginals of
    the weight and of ``weight (u - u_bar)`` (one pass over the lattice per marginal).

    ``points``: Gaussian points that join the sums (the atoms, :class:`FitPoints`), as
    ``(weight (K,), centre (K, d), cov (K, d, d), E u (K,), Cov(u, x) (K, d))``: their
    moments are added to the lattice's exactly (:func:`_with_points`)."""
    if points is not None:
        return _with_points(weight, coords, u, points)
    d = weight.ndim
    total = float(weight.sum())
    centre = np.array([float(_marginal(weight, (b,)) @ coords[b]) / total for b in range(d)])
    centred = [np.asarray(coords[b], float) - centre[b] for b in range(d)]
    u_bar = float(np.sum(weight * u)) / total
    spread = weight * (u - u_bar)
    cov = np.empty((d, d))
    cross = np.empty(d)
    for b in range(d):
        cross[b] = float(_marginal(spread, (b,)) @ centred[b]) / total
        cov[b, b] = float(_marginal(weight, (b,)) @ centred[b] ** 2) / total
        for c in range(b + 1, d):
            pair = float(centred[b] @ _marginal(weight, (b, c)) @ centred[c]) / total
            cov[b, c] = cov[c, b] = pair
    row = np.linalg.solve(cov, cross)
    return u_bar - float(row @ centre), row


def _with_points(
    weight: np.ndarray, coords: Sequence[np.ndarray], u: np.ndarray, points: tuple
) -> tuple[float, np.ndarray]:
    """:func:`weighted_fit` of the lattice plus Gaussian points: the two parts' totals,
    means, covariances and cross covariances combined by the parallel-axis rule (as
    :func:`~.atoms.merge_moments`), then ``row = Cov(x)^-1 Cov(u, x)``."""
    w_k, centre_k, cov_k, u_k, cross_k = points
    d = weight.ndim
    lattice = float(weight.sum())
    if lattice > 0:
        drift, row = weighted_fit(weight, coords, u)
        centre = np.array([float(_marginal(weight, (b,)) @ coords[b]) / lattice for b in range(d)])
        u_bar = drift + float(row @ centre)
        centred = [np.asarray(coords[b], float) - centre[b] for b in range(d)]
        cov = np.empty((d, d))
        for b in range(d):
            cov[b, b] = float(_marginal(weight, (b,)) @ centred[b] ** 2) / lattice
            for c in range(b + 1, d):
                pair = float(centred[b] @ _marginal(weight, (b, c)) @ centred[c]) / lattice
                cov[b, c] = cov[c, b] = pair
        cross = cov @ row
        parts_w = np.concatenate([[lattice], w_k])
        parts_x = np.vstack([centre[None, :], centre_k])
        parts_cov = np.concatenate([cov[None], cov_k])
        parts_u = np.concatenate([[u_bar], u_k])
        parts_cross = np.vstack([cross[None, :], cross_k])
    else:
        parts_w, parts_x, parts_cov, parts_u, parts_cross = w_k, centre_k, cov_k, u_k, cross_k
    total = float(parts_w.sum())
    x_bar = parts_w @ parts_x / total
    u_all = float(parts_w @ parts_u) / total
    dx = parts_x - x_bar
    cov_all = (
        np.einsum("k,kij->ij", parts_w, parts_cov) + np.einsum("k,ki,kj->ij", parts_w, dx, dx)
    ) / total
    cross_all = (parts_w @ parts_cross + (parts_w * (parts_u - u_all)) @ dx) / total
    row_all = np.linalg.solve(cov_all, cross_all)
    return u_all - float(row_all @ x_bar), row_all


def lattice_density(density: np.ndarray, offset) -> np.ndarray:
    """The density on a lattice of offsets 0 (cell centres) or 1/2 (faces) per axis: the
    mean of the neighbouring cells along every axis with offset 1/2 (:func:`face_density`),
    shaped like ``grid.lattice(offset)``."""
    values = density
    for axis, shift in enumerate(np.asarray(offset, float)):
        if shift == 0.5:
            values = face_density(values, axis)
        elif shift != 0.0:
            raise ValueError(f"lattice_density: offsets 0 or 1/2 only, got {offset}")
    return values


def transported(density: np.ndarray, offset) -> np.ndarray:
    """Where the frame moves the density with its residual (boolean, shaped like the lattice
    ``offset``): the lattice density is at least :data:`TRANSPORT_FLOOR` of the largest cell
    value. Elsewhere the residual is zero and the points take no part in the fit, so a
    variant need not evaluate its velocity there."""
    return lattice_density(density, offset) >= TRANSPORT_FLOOR * density.max()


def truncation_indicator(face_weights: Sequence[np.ndarray], cut: Sequence[np.ndarray]) -> float:
    """The largest, over axes, mean of the velocity's cut (VelocityField.cut) weighted by the
    face densities: the truncation indicator of one evaluation."""
    worst = 0.0
    for weight, estimate in zip(face_weights, cut, strict=True):
        total = float(weight.sum())
        if total > 0:
            worst = max(worst, float(np.sum(weight * estimate)) / total)
    return worst


def unheld_share(face_weights: Sequence[np.ndarray], held: Sequence[np.ndarray]) -> float:
    """The largest, over axes, share of the face weights on faces that are not held."""
    return truncation_indicator(face_weights, [~mask for mask in held])


def affine_fit(
    density: np.ndarray,
    grid: Grid,
    normal: list[np.ndarray],
    frame: AffineFrame,
    held: list[np.ndarray] | None = None,
    faces: list[np.ndarray] | None = None,
    points: FitPoints | None = None,
) -> tuple[list[np.ndarray], FrameRates]:
    """Fit ``u_a ~ a_a + G_a . (xi - xi_bar^a)`` on the faces normal to each axis and return
    the residuals ``w_a`` (same shapes as ``normal``) and the frame's rates.

    density : frame density, grid.shape. normal[a] : u_a at the face centres of axis a
    (grid.lattice with offset 1/2 along a). Row a of the fit is weighted by
    :func:`face_density` on those faces (module docstring). held[a] (optional, boolean like
    normal[a]): faces whose velocity the box holds; the others take no part in the fit and
    keep the fit's value (residual 0), so a tilted law cut by the box never moves the frame.
    faces: the :func:`face_density` of every axis, where the caller has them already.
    points: the atoms (:class:`FitPoints`), weighted points of every row's fit; the rates
    then carry their motion in the frame (``FrameRates.points``).
    """
    d = grid.ndim
    if points is not None:
        mean_u, spread = points.mean_u, points.spread
    drift = np.empty(d)
    gain = np.empty((d, d))
    residuals = []
    for a in range(d):
        offset = np.where(np.arange(d) == a, 0.5, 0.0)
        coords = grid.lattice(offset)
        on_faces = face_density(density, a) if faces is None else faces[a]
        # faces below the transport floor keep the fit (residual 0) and take no part in it:
        # their velocity need not be evaluated (VelocityField.frame_components)
        moving = on_faces >= TRANSPORT_FLOOR * density.max()
        on_faces = np.where(moving, on_faces, 0.0)
        weight = on_faces
        mask = None if held is None else held[a]
        if mask is not None:
            kept = np.where(mask, on_faces, 0.0)
            # a fit needs the bulk of the mass: with less held, the box is the problem and
            # the truncation indicator (not the fit) has to say so
            if kept.sum() >= HELD_FIT_MASS * on_faces.sum():
                weight = kept
            else:
                mask = None
        total = weight.sum()
        if points is not None:
            total += points.weight.sum()
            row_points = (points.weight, points.centre, points.cov, mean_u[:, a], spread[:, a])
        if not total > 0:
            raise FloatingPointError("frame: no mass left to fit the frame to")
        drift[a], gain[a] = weighted_fit(
            weight, coords, normal[a], None if points is None else row_points
        )
        mesh = np.meshgrid(*coords, indexing="ij", sparse=True)
        residual = normal[a] - drift[a]
        for b in range(d):
            residual -= gain[a, b] * mesh[b]
        if mask is not None:
            residual = np.where(mask, residual, 0.0)
        residual[~moving] = 0.0
        residuals.append(residual)
    L = frame.matrix
    moved = None if points is None else points.rates(drift, gain)
    return residuals, FrameRates(L @ drift, L @ gain, gain, moved)


def embedded_error(start: AffineFrame, second: AffineFrame, end: AffineFrame) -> float:
    """Local error estimate of one SSP-RK3 (Shu-Osher) step of the frame: the distance between
    its result and the embedded second-order (Heun) result ``2 u^(2) - u^(0)``, relative to the
    frame's size ``||L||`` (mean and matrix alike)."""
    scale = float(np.linalg.norm(start.matrix, 2))
    heun_mean = 2.0 * second.mean - start.mean
    heun_matrix = 2.0 * second.matrix - start.matrix
    err = max(
        float(np.abs(end.mean - heun_mean).max()),
        float(np.abs(end.matrix - heun_matrix).max()),
    )
    return err / scale if scale > 0 else math.inf


#: the frame's local error per step may be this share of the error the cells make in the
#: same step (the resolution monitor's estimate ``rate * dt``, the density's L1 error the
#: reconstruction injects; :func:`frame_step_tolerance`): over a run the frame's time error
#: then adds at most this share to the cells' error. Measured on the three-bump law
#: (docs/theory.md, 'The three-bump law: step and frame units'): the frame's error
#: is smooth (0.39 dt^3 from dt = 5e-4 to 4e-2) against the cells' 0.15 dt, so
#: frame_tolerance = 1e-10 alone held the step at 5.7e-4 (703 steps to t = 0.34); with 0.05
#: the steps reach the residual's CFL bound (26 steps to t = 0.34, 1e-3: 132), and the
#: covariance there and t* move by 1.1e-6 and 8e-5 relative against 1e-3
FRAME_CELL_SHARE = 5e-2


def frame_step_tolerance(tolerance: float, cells_rate: float, dt: float) -> float:
    """The local error the frame's step control allows in a step of length ``dt``: the
    larger of ``scheme.frame_tolerance`` and ``FRAME_CELL_SHARE * cells_rate * dt``, where
    ``cells_rate`` is the resolution monitor's rate of the cells' error at the step's start
    (:func:`.monitor.reconstruction_error_rate`, L1 error per unit time). Gaussian data
    under a Gaussian-preserving field have a residual of round-off only, whose rate is far
    below ``tolerance / dt``: their steps keep ``frame_tolerance`` exactly."""
    share = FRAME_CELL_SHARE * cells_rate * dt
    return share if share > tolerance else tolerance


#: the frame's step control gives up on a step whose retries do not lower its embedded error
#: estimate at least like this power of the step (SSP-RK3 against Heun: a smooth frame's
#: estimate falls like dt^3; rates that jump by e from stage to stage give dt e, order 1):
#: the estimate is then the roughness of the frame's rates in time (an under-resolved law
#: whose fit jumps between stages), which no shorter step resolves. The threshold is the
#: noise's own order, so only an error no better than noise stops a run (a mix of step and
#: noise error, order between 1 and 3, keeps shortening the step). Measured on the
#: three-bump law of docs/theory.md, 'When the frame cannot go on': orders 0.74 - 0.89
ROUGH_ORDER = 1.0
#: retries of one step are only compared when the step shrank by at least this factor (closer
#: steps cannot tell an order)
ROUGH_STEP_RATIO = 0.8
#: and it gives up after this many rejections of one step, whatever their errors
FRAME_RETRIES = 8


def rough_rates(tries: Sequence[tuple[float, float]], tolerance: float) -> str | None:
    """Why the frame's step control gives up on a step, or None (a storm of rejected steps).

    tries: the ``(dt, embedded error)`` of the step's rejected attempts so far, in order;
    tolerance: the frame's tolerance of the last attempt (:func:`frame_step_tolerance`). A
    retry whose error fell by less than ``(dt_2 / dt_1)^ROUGH_ORDER`` (with ``dt_2 <=
    ROUGH_STEP_RATIO dt_1``) shows an error that does not come from the step; after
    ``FRAME_RETRIES`` rejections the step control has failed whatever the errors."""
    if len(tries) >= FRAME_RETRIES:
        return (
            f"the frame's step control rejected {len(tries)} steps in a row (FRAME_RETRIES), "
            f"down to dt = {tries[-1][0]:.3e} with error {tries[-1][1]:.2e} > the frame's "
            f"tolerance {tolerance:g} (scheme.frame_tolerance, or FRAME_CELL_SHARE of the "
            "cells' error)"
        )
    for (dt1, e1), (dt2, e2) in zip(tries, tries[1:], strict=False):
        if not (0.0 < dt2 <= ROUGH_STEP_RATIO * dt1 and e1 > 0.0 and e2 > 0.0):
            continue
        order = math.log(e1 / e2) / math.log(dt1 / dt2)
        if order < ROUGH_ORDER:
            return (
                f"the frame's rates are rough in time: its error estimate fell from {e1:.2e} "
                f"to {e2:.2e} when the step shrank from {dt1:.3e} to {dt2:.3e} (order "
                f"{order:.2f} < ROUGH_ORDER = {ROUGH_ORDER:g}; a smooth frame's falls like "
                f"dt^3), so no step meets the frame's tolerance {tolerance:g} (refine the "
                "grid, or raise scheme.frame_tolerance)"
            )
    return None


#: the frame follows the whole law's covariance: a cluster whose own covariance grows slower
#: (separated bumps of a law that spreads) narrows in frame units, and the frame's cells hold
#: it less and less. A frame run ends when the variance, in cells squared, of its densest
#: cluster (:func:`tpde.schemes.monitor.cluster_width`) has fallen below this share of its
#: value at the run's start: the cells then hold the cluster with half the variance they
#: were given (the reconstruction error, falling like h^5, has grown about 2^(5/2) = 5.7
#: times). A law the frame follows (one Gaussian under a Gaussian-preserving field) keeps its
#: width in frame units and never meets it. Measured on the three-bump law (docs/theory.md,
#: 'When the frame cannot go on'): the width falls from 2.06 cells to 1.454 by t = 0.4239,
#: where the frame's tangent t* is 7.0e-3 below a fixed box's at 192^2 (1.8e-2 at the box's
#: stop at t = 0.556)
FRAME_NARROWING = 0.5


def narrowed(start: float, width: float, where: str = "") -> str | None:
    """Why a frame run ends because its densest cluster narrowed, or None.

    start, width: the cluster's standard deviation in cells (:func:`.monitor.cluster_width`)
    at the run's start and now; ``where``: the cluster's place, for the message. The rule is
    off where ``start`` is not a finite positive width (no peak to follow: a flat top); a
    width of 0 (an empty neighbour: a one-cell spike) or below ``sqrt(FRAME_NARROWING)
    start`` ends the run."""
    if not (math.isfinite(start) and start > 0.0) or not (width / start) ** 2 < FRAME_NARROWING:
        return None
    return (
        f"the frame's cells no longer hold its densest cluster{where}: {width:.3g} cells per "
        f"standard deviation, from {start:.3g} at the start (variance below FRAME_NARROWING "
        f"= {FRAME_NARROWING:g} of the start's; the frame follows the whole law's covariance, "
        "which grows faster than the cluster's: refine the grid, or a fixed box)"
    )
