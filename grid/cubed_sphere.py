"""The sphere S^2 as the equiangular gnomonic cubed sphere: geometry, exact cell averages,
moments, the halo interpolation across panel edges.

docs/theory.md, 'The cubed sphere'. Six panels ``p`` (centre ``c_p``, axes ``e1_p, e2_p``,
``c_p x e1_p = e2_p``) cover the sphere; a point of panel ``p`` with local angles
``(a, b) in [-pi/4, pi/4]^2`` is

    x = (c_p + tan a e1_p + tan b e2_p) / r,   r = sqrt(1 + tan^2 a + tan^2 b),

and each panel carries ``n x n`` cells of equal angular width ``h = pi / (2 n)``. The area
element is ``dA = J da db`` with the gnomonic metric

    J(a, b) = sec^2 a sec^2 b / r^3,

and the area of a cell has the closed form ``sum_corners +- atan(X Y / sqrt(1 + X^2 + Y^2))``
(``X = tan a``, ``Y = tan b``). Every grid line is a great circle, so an edge's length is the
angle between its end points. Densities are per unit area (the uniform probability is
``1 / (4 pi)``); a density is an array ``(6, n, n)`` of cell averages ``rho_bar[p, i, j]`` (``i``
along ``a``, ``j`` along ``b``).

Why the cubed sphere: it is quasi-uniform (the largest and the smallest cell differ in area
by less than ``sqrt 2``, the ratio of ``J`` at a panel's centre and at an edge's midpoint:
1.28 at n = 8, 1.41 as n grows; no pole, no long thin cells), it is logically Cartesian per
panel, so the reconstructions of :mod:`tpde.schemes` run along grid
lines unchanged, and its grid lines are great circles, so edges and areas are exact in closed
form. The price is the panel edges, where the coordinates kink: the halo there is interpolated.

Halo. The finite-volume scheme reconstructs the coordinate density ``q = J rho`` (whose
coordinate cell averages are ``q_bar = rho_bar A / h^2``) along each panel's grid lines and
needs three ghost cells beyond each panel edge: the cells of the panel's own coordinates
extended across the edge (the gnomonic map extends analytically). Such a ghost cell lies on
the neighbouring panel, on one column of its cells (the lines parallel to the edge continue
as the neighbour's grid lines) but cut obliquely across its rows. Its average of ``q`` is
the integral over it, by a 5 x 5 Gauss rule, of the neighbour's tensor degree-4 polynomial
through the 5 x 5 cell averages around the node (average-to-point weights per axis,
one-sided near the neighbour's own edges), times the Jacobian ``J_p / J_neighbour``: a fixed
linear map (:func:`halo_matrix`), fifth order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.polynomial.legendre import leggauss

from .stencils import average_to_point_weights

__all__ = [
    "FOUR_PI",
    "PANELS",
    "CubedSphere",
    "cell_averages",
    "cell_geography",
    "cell_index",
    "cell_list",
    "cell_panels",
    "padded_panels",
    "clusters",
    "cubed_sphere",
    "halo_matrix",
    "harmonic_amplitudes",
    "harmonic_mode",
    "harmonic_power",
    "lat_lon",
    "lat_lon_raster",
    "legendre_moment",
    "mass",
    "mean",
    "mixture",
    "node_points",
    "node_reconstruction",
    "noise",
    "point_histogram",
    "point_weights",
    "second_moment",
    "small_circle",
    "von_mises_fisher",
    "zonal_projection",
]

FOUR_PI = 4.0 * math.pi
QUARTER = 0.25 * math.pi
GHOSTS = 3

#: (centre, e1, e2) of the six panels: four around the equator, then north and south
PANELS = np.array(
    [
        [[1, 0, 0], [0, 1, 0], [0, 0, 1]],
        [[0, 1, 0], [-1, 0, 0], [0, 0, 1]],
        [[-1, 0, 0], [0, -1, 0], [0, 0, 1]],
        [[0, -1, 0], [1, 0, 0], [0, 0, 1]],
        [[0, 0, 1], [0, 1, 0], [-1, 0, 0]],
        [[0, 0, -1], [0, 1, 0], [1, 0, 0]],
    ],
    dtype=float,
)


def to_sphere(p, a, b) -> np.ndarray:
    """Points ``(..., 3)`` of panel(s) ``p`` at local angles ``(a, b)`` (broadcast)."""
    p, a, b = np.broadcast_arrays(np.asarray(p), np.asarray(a, float), np.asarray(b, float))
    frame = PANELS[p]  # (..., 3, 3)
    x = frame[..., 0, :] + np.tan(a)[..., None] * frame[..., 1, :]
    x = x + np.tan(b)[..., None] * frame[..., 2, :]
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def to_panel(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Panel and local angles ``(p, a, b)`` of points ``x (..., 3)`` (the panel whose centre
    is nearest)."""
    x = np.asarray(x, float)
    dots = x @ PANELS[:, 0, :].T  # (..., 6)
    p = np.argmax(dots, axis=-1)
    frame = PANELS[p]
    c = np.take_along_axis(dots, p[..., None], -1)[..., 0]
    a = np.arctan2(np.einsum("...k,...k->...", x, frame[..., 1, :]), c)
    b = np.arctan2(np.einsum("...k,...k->...", x, frame[..., 2, :]), c)
    return p, a, b


def metric(a, b) -> np.ndarray:
    """``J = sec^2 a sec^2 b / (1 + tan^2 a + tan^2 b)^(3/2)``: ``dA = J da db``."""
    ta, tb = np.tan(a), np.tan(b)
    return (1 + ta * ta) * (1 + tb * tb) / (1 + ta * ta + tb * tb) ** 1.5


def coordinate_gradients(p, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``grad a`` and ``grad b`` at points ``x`` of panel(s) ``p`` (tangent, ``(..., 3)``): a
    tangent velocity ``v`` moves the local angles at ``a' = <grad a, v>``, ``b' = <grad b, v>``."""
    frame = PANELS[np.asarray(p)]
    c, e1, e2 = frame[..., 0, :], frame[..., 1, :], frame[..., 2, :]
    xc = np.einsum("...k,...k->...", x, c)[..., None]
    out = []
    for e in (e1, e2):
        xe = np.einsum("...k,...k->...", x, e)[..., None]
        out.append((e * xc - xe * c) / (xc * xc + xe * xe))
    return out[0], out[1]


def _area_antiderivative(ta, tb):
    return np.arctan(ta * tb / np.sqrt(1 + ta * ta + tb * tb))


@dataclass(frozen=True)
class CubedSphere:
    """The equiangular gnomonic cubed sphere with ``n x n`` cells per panel."""

    n: int

    def __post_init__(self):
        if isinstance(self.n, bool) or int(self.n) != self.n or self.n < 6:
            raise ValueError(
                f"grid.cells: the cubed sphere needs n >= 6 cells per panel edge, got {self.n!r}"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        return (6, self.n, self.n)

    @property
    def h(self) -> float:
        """The angular width of a cell, ``pi / (2 n)``."""
        return 0.5 * math.pi / self.n

    @property
    def edges(self) -> np.ndarray:
        """The local angles of the grid lines, ``-pi/4 + k h``, ``k = 0 .. n``."""
        return -QUARTER + self.h * np.arange(self.n + 1)

    @property
    def centres(self) -> np.ndarray:
        return -QUARTER + self.h * (np.arange(self.n) + 0.5)

    @functools.cached_property
    def areas(self) -> np.ndarray:
        """Exact cell areas ``(6, n, n)`` (closed form; they sum to ``4 pi``)."""
        t = np.tan(self.edges)
        corner = _area_antiderivative(t[:, None], t[None, :])
        area = corner[1:, 1:] - corner[:-1, 1:] - corner[1:, :-1] + corner[:-1, :-1]
        return np.broadcast_to(area, self.shape).copy()

    @functools.cached_property
    def edge_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Exact lengths of the edges ``a = const`` ``(n + 1, n)`` and ``b = const`` ``(n, n + 1)``
        (great-circle arcs; the same on every panel)."""
        e = self.edges
        corners = to_sphere(0, e[:, None], e[None, :])  # (n + 1, n + 1, 3)

        def arc(u, v):
            return np.arctan2(np.linalg.norm(np.cross(u, v), axis=-1), np.sum(u * v, -1))

        return arc(corners[:, :-1], corners[:, 1:]), arc(corners[:-1, :], corners[1:, :])

    def centres_3d(self) -> np.ndarray:
        c = self.centres
        return to_sphere(np.arange(6)[:, None, None], c[None, :, None], c[None, None, :])

    @property
    def size(self) -> int:
        return 6 * self.n * self.n

    def measures(self) -> np.ndarray:
        """The exact cell areas (:attr:`areas`)."""
        return self.areas

    def integrate(self, density) -> float:
        return float(np.sum(np.asarray(density, float) * self.areas))

    def moments(self, density) -> tuple[float, np.ndarray, np.ndarray]:
        """Mass, mean ``int x rho dA / mass`` (a 3-vector, inside the ball) and covariance
        ``int x x^T rho dA / mass - mean mean^T`` (fifth order: :func:`mean`,
        :func:`second_moment`)."""
        total = self.integrate(density)
        centre = mean(self, density) / total
        return total, centre, second_moment(self, density) / total - np.outer(centre, centre)

    def halo(self, values, ghosts: int) -> np.ndarray:
        """Coordinate averages ``values`` ``(6, n, n)`` with ``ghosts`` halo cells on every
        side of each panel ``(6, n + 2 ghosts, n + 2 ghosts)`` (:func:`halo_matrix`: the
        neighbours' cells interpolated onto the panel's extended grid lines); corners 0."""
        g = int(ghosts)
        return padded_panels(np.asarray(values, float), halo_matrix(self.n, ghosts=g), g)

    def describe(self) -> str:
        return (
            f"the sphere S^2, cubed sphere of {self.n} x {self.n} cells a panel ({self.size} cells)"
        )

    def to_coordinate(self, density) -> np.ndarray:
        """``q_bar = rho_bar A / h^2``: the coordinate cell averages of ``q = J rho``."""
        return np.asarray(density, float) * (self.areas / (self.h * self.h))

    def from_coordinate(self, q) -> np.ndarray:
        return np.asarray(q, float) * ((self.h * self.h) / self.areas)


def cubed_sphere(n: int) -> CubedSphere:
    return CubedSphere(int(n))


# ---- exact cell averages ---------------------------------------------------------------------
def cell_averages(
    grid: CubedSphere, density: Callable[[np.ndarray], np.ndarray], nodes: int = 10, pieces: int = 1
) -> np.ndarray:
    """Cell averages of ``density(x)`` (``x (..., 3)`` -> ``(...)``): per cell a tensor
    Gauss-Legendre rule of ``nodes`` points in ``(a, b)`` on each of ``pieces x pieces``
    sub-cells, weighted by the metric and divided by the exact area. For the smooth data here
    (``nodes = 10``, ``h <= pi / 12``) the rule is exact to round-off (tests check it against
    a rule twice as fine)."""
    x, w = leggauss(int(nodes))
    sub = grid.h / pieces
    local = (np.arange(pieces)[:, None] * sub + 0.5 * sub * (x[None, :] + 1.0)).ravel()
    weights = np.tile(0.5 * sub * w, pieces)
    offsets = grid.edges[:-1, None] + local[None, :]  # (n, m)
    m = offsets.shape[1]
    out = np.empty(grid.shape)
    jac_w = weights[:, None] * weights[None, :]
    for p in range(6):
        a = offsets[:, None, :, None]
        b = offsets[None, :, None, :]
        points = to_sphere(p, a, b)  # (n, n, m, m, 3)
        values = density(points) * metric(a, b) * jac_w
        out[p] = values.reshape(grid.n, grid.n, m * m).sum(-1)
    return out / grid.areas


def _unit(v: Sequence[float]) -> np.ndarray:
    m = np.asarray(v, float)
    if m.shape != (3,) or not np.linalg.norm(m) > 0:
        raise ValueError(f"initial.mean: expected a non-zero 3-vector, got {v!r}")
    return m / np.linalg.norm(m)


def von_mises_fisher(
    grid: CubedSphere,
    mean: Sequence[float] = (0.0, 0.0, 1.0),
    kappa: float = 1.0,
    mass: float = 1.0,
) -> np.ndarray:
    """Cell averages of ``mass kappa e^{kappa <m, x>} / (4 pi sinh kappa)``, the rule split into
    pieces across which the exponent changes by at most about 2."""
    m = _unit(mean)
    if not (math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"initial.kappa: expected a finite number > 0, got {kappa!r}")
    scale = kappa / (2.0 * math.pi * -math.expm1(-2.0 * kappa))
    pieces = max(1, math.ceil(kappa * grid.h / 2.0))
    return (
        mass * scale * cell_averages(grid, lambda x: np.exp(kappa * (x @ m - 1.0)), pieces=pieces)
    )


def mixture(
    grid: CubedSphere, components: Sequence[tuple[float, Sequence[float], float]]
) -> np.ndarray:
    """Cell averages of ``sum_k w_k vMF(m_k, kappa_k)`` for ``(w_k, m_k, kappa_k)``."""
    return sum(
        (von_mises_fisher(grid, m, k, w) for w, m, k in components), start=np.zeros(grid.shape)
    )


def harmonic_mode(
    grid: CubedSphere,
    l: int,
    amplitude: float,
    axis: Sequence[float] = (0.0, 0.0, 1.0),
    mass: float = 1.0,
) -> np.ndarray:
    """Cell averages of ``(mass / 4 pi) (1 + amplitude P_l(<axis, x>))``: the uniform measure
    plus the zonal harmonic of degree ``l`` about ``axis``."""
    from scipy.special import eval_legendre

    if isinstance(l, bool) or int(l) != l or l < 0:
        raise ValueError(f"initial.modes: l must be an integer >= 0, got {l!r}")
    m = _unit(axis)
    shape = cell_averages(grid, lambda x: eval_legendre(int(l), x @ m))
    if float(np.min(1 + amplitude * shape)) < 0:
        raise ValueError("initial.modes: the density would be negative")
    return mass / FOUR_PI * (1.0 + amplitude * shape)


# ---- point values, moments -------------------------------------------------------------------
def _stencil_weights(t: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For positions ``t`` in cell units (cell ``k`` is ``[k, k + 1]``): the first of 5 cells
    (centred, moved inside ``0 .. n - 1``) and the average-to-point weights ``(..., 5)``."""
    t = np.asarray(t, float)
    first = np.clip(np.floor(t).astype(int) - 2, 0, n - 5)
    offset = t - (first + 2.5)
    # the weights are polynomials in the offset: columns of the basis at 0 .. 4 in powers
    basis = np.stack([average_to_point_weights(float(s)) for s in range(-2, 3)])  # (5, 5)
    powers = np.arange(-2, 3, dtype=float)[:, None] ** np.arange(5)[None, :]
    coefficients = np.linalg.solve(powers, basis)  # weights(s) = [s^0 .. s^4] @ coefficients
    weights = (offset[..., None] ** np.arange(5)) @ coefficients
    return first, weights


def point_weights(n: int, offsets: np.ndarray | Sequence[float]) -> np.ndarray:
    """``(len(offsets), n, n)``: row ``[g, j]`` gives the point value at ``j + 1/2 + offsets[g]``
    (cell units) from the ``n`` averages of a grid line, degree 4, one-sided at its ends."""
    shifts = np.asarray(offsets, float)
    t = np.arange(n)[None, :] + 0.5 + shifts[:, None]
    first, weights = _stencil_weights(t, n)
    out = np.zeros((shifts.size, n, n))
    for k in range(5):
        np.put_along_axis(out, (first + k)[..., None], weights[..., k : k + 1], axis=-1)
    return out


def gauss_nodes(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre offsets in cell units (``[-1/2, 1/2]``) and weights summing to 1."""
    x, w = leggauss(int(nodes))
    return 0.5 * x, 0.5 * w


def _tensor_points(T: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``sum_{m, k} T[g, i, m] T[h, j, k] q[..., m, k]`` as ``(..., n, n, g, g)``: the tensor
    reconstruction by two matrix products (``T (g, n, n)``)."""
    rows = np.matmul(T, q[..., None, :, :])  # (..., g, i, k)
    values = np.tensordot(rows, T, axes=([-1], [2]))  # (..., g, i, h, j)
    return np.moveaxis(values, (-4, -2), (-2, -1))  # (..., i, j, g, h)


@functools.lru_cache(maxsize=8)
def _node_geometry(n: int, nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What :func:`point_values` reuses on one grid: the weights ``T (g, n, n)``, the
    reconstruction of the metric's averages ``(n, n, g, g)``, the points
    ``(6, n, n, g, g, 3)`` and the area weights ``(n, n, g, g)`` (read-only)."""
    grid = CubedSphere(n)
    s, w = gauss_nodes(nodes)
    T = point_weights(n, s)  # (g, n, n)
    jbar = grid.areas[0] / grid.h**2
    metric_values = np.ascontiguousarray(_tensor_points(T, jbar))
    a = grid.centres[:, None] + grid.h * s[None, :]  # (n, g)
    aa = a[:, None, :, None]
    bb = a[None, :, None, :]
    points = to_sphere(np.arange(6)[:, None, None, None, None], aa, bb)
    weights = metric(aa, bb) * (w[:, None] * w[None, :]) * grid.h**2
    for array in (T, metric_values, points, weights):
        array.flags.writeable = False
    return T, metric_values, points, weights


def node_points(grid: CubedSphere, nodes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The Gauss nodes ``(6, n, n, g, g, 3)`` and area weights ``J w_a w_b h^2``
    ``(n, n, g, g)`` of :func:`point_values` (shared, read-only: the same arrays on every
    call for one grid)."""
    _, _, points, weights = _node_geometry(grid.n, int(nodes))
    return points, weights


def node_reconstruction(grid: CubedSphere, nodes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`point_values` applies: the average-to-point weights ``T (g, n, n)`` of a
    grid line and the reconstructed metric ``R[J_bar]`` ``(n, n, g, g)`` (shared,
    read-only)."""
    T, metric_values, _, _ = _node_geometry(grid.n, int(nodes))
    return T, metric_values


def point_values(
    grid: CubedSphere, density, nodes: int = 3
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The density at the ``nodes x nodes`` Gauss nodes of every cell: points
    ``(6, n, n, g, g, 3)``, values ``(6, n, n, g, g)`` and area weights ``J w_a w_b h^2``.

    The values are ``R[q_bar] / R[J_bar]``: the tensor degree-4 reconstruction ``R`` of the
    coordinate averages of ``q = J rho`` divided by that of the metric's own averages
    ``J_bar = A / h^2``. Both are fifth order; the quotient is exact for a constant density,
    so the uniform measure is reproduced to round-off and its attention field is the
    quadrature error of the kernel alone. The points and weights are shared, read-only
    arrays (the same on every call for one grid)."""
    T, metric_values, points, weights = _node_geometry(grid.n, int(nodes))
    values = _tensor_points(T, grid.to_coordinate(density))
    values /= metric_values
    return points, values, np.broadcast_to(weights, values.shape)


def mass(grid: CubedSphere, density) -> float:
    return grid.integrate(density)


def mean(grid: CubedSphere, density, nodes: int = 3) -> np.ndarray:
    """``int x rho dA`` (a 3-vector) from the reconstruction (fifth order)."""
    points, values, weights = point_values(grid, density, nodes)
    return np.sum(points * (values * weights)[..., None], axis=(0, 1, 2, 3, 4))


def second_moment(grid: CubedSphere, density, nodes: int = 3) -> np.ndarray:
    """``int x x^T rho dA`` (``3 x 3``) from the reconstruction (fifth order)."""
    points, values, weights = point_values(grid, density, nodes)
    flat = points.reshape(-1, 3)
    return (flat * (values * weights).reshape(-1)[:, None]).T @ flat


def legendre_moment(
    grid: CubedSphere, density, l: int, axis=(0.0, 0.0, 1.0), nodes: int = 4
) -> float:
    """``int rho P_l(<axis, x>) dA`` from the reconstruction at ``nodes^2`` Gauss nodes a cell
    (fifth order)."""
    from scipy.special import eval_legendre

    points, values, weights = point_values(grid, density, nodes)
    return float(np.sum(values * eval_legendre(int(l), points @ _unit(axis)) * weights))


def zonal_projection(
    grid: CubedSphere, density, l: int, axis=(0.0, 0.0, 1.0), nodes: int = 4
) -> float:
    """``a`` of ``rho ~ (m / 4 pi)(1 + a P_l(<axis, x>) + ...)``: ``(2 l + 1) int rho P_l dA /
    int rho dA``."""
    moment = legendre_moment(grid, density, l, axis, nodes)
    return (2 * l + 1) * moment / grid.integrate(density)


def harmonic_power(points: np.ndarray, masses: np.ndarray, l_max: int) -> np.ndarray:
    """``P_l = sum_m |c_lm|^2``, ``l = 0 .. l_max``, of the discrete measure
    ``sum_k masses_k delta_{points_k}``: ``c_lm = sum_k masses_k Y_lm(points_k)`` with the
    spherical harmonics orthonormal on the unit sphere (``scipy.special.sph_harm_y``; for a real
    measure ``|c_{l,-m}| = |c_lm|``). ``P_l`` is rotation invariant (the degree-``l`` part of
    the measure in ``L^2``)."""
    from scipy.special import sph_harm_y

    if isinstance(l_max, bool) or int(l_max) != l_max or l_max < 0:
        raise ValueError(f"harmonics.l_max: expected an integer >= 0, got {l_max!r}")
    x = np.asarray(points, float).reshape(-1, 3)
    w = np.asarray(masses, float).reshape(-1)
    theta = np.arccos(np.clip(x[:, 2], -1.0, 1.0))
    phi = np.arctan2(x[:, 1], x[:, 0])
    out = np.zeros(int(l_max) + 1)
    for l in range(int(l_max) + 1):
        for m in range(l + 1):
            c = w @ sph_harm_y(l, m, theta, phi)
            out[l] += (1.0 if m == 0 else 2.0) * float(abs(c) ** 2)
    return out


#: the accuracy asked of ducc0's non-uniform adjoint transform (its floor in double: 2e-13)
NUFFT_EPSILON = 3e-13


def _harmonic_power_nufft(points: np.ndarray, masses: np.ndarray, l_max: int) -> np.ndarray:
    """:func:`harmonic_power` by one non-uniform adjoint synthesis (ducc0's
    ``sht.experimental.adjoint_synthesis_general``; the same orthonormal harmonics, ``m >= 0``
    in ``m``-major order): for the ``10^5`` Gauss nodes of a grid, where the harmonic loop takes
    seconds. Relative accuracy ``NUFFT_EPSILON`` of the largest coefficient."""
    from ducc0.sht.experimental import adjoint_synthesis_general

    x = np.asarray(points, float).reshape(-1, 3)
    theta = np.arctan2(np.hypot(x[:, 0], x[:, 1]), x[:, 2])
    phi = np.arctan2(x[:, 1], x[:, 0]) % (2.0 * math.pi)
    l_max = int(l_max)
    alm = adjoint_synthesis_general(
        map=np.ascontiguousarray(np.asarray(masses, float).reshape(1, -1)),
        spin=0,
        lmax=l_max,
        loc=np.ascontiguousarray(np.stack([theta, phi], 1)),
        epsilon=NUFFT_EPSILON,
    )[0]
    l_of = np.concatenate([np.arange(m, l_max + 1) for m in range(l_max + 1)])
    doubled = np.full(l_of.size, 2.0)
    doubled[: l_max + 1] = 1.0  # m = 0 once, m > 0 twice (|c_{l,-m}| = |c_lm|)
    return np.bincount(l_of, weights=doubled * np.abs(alm) ** 2, minlength=l_max + 1)


def harmonic_amplitudes(grid: CubedSphere, density, l_max: int = 8, nodes: int = 4) -> np.ndarray:
    """The amplitude of every degree ``l = 0 .. l_max`` of a density, ``A_l = sqrt(4 pi
    (2 l + 1) P_l) / m`` (:func:`harmonic_power`, by a non-uniform transform, of the density
    at ``nodes^2`` Gauss nodes a cell from the fifth-order reconstruction, ``m`` its mass):
    ``(m / 4 pi)(1 + a P_l(<axis, x>))`` has ``A_l = |a|`` about any axis (``A_0 = 1``), so
    ``A_l`` is the rotation-invariant :func:`zonal_projection`."""
    points, values, weights = point_values(grid, density, nodes)
    power = _harmonic_power_nufft(points, values * weights, l_max)
    l = np.arange(power.size)
    return np.sqrt(FOUR_PI * (2 * l + 1) * power) / grid.integrate(density)


# ---- connectivity and halo ---------------------------------------------------------------------
#: sides of a panel: 0: a = -pi/4, 1: a = +pi/4, 2: b = -pi/4, 3: b = +pi/4
SIDES = 4


def _side_points(grid: CubedSphere, side: int, depth: np.ndarray, along: np.ndarray):
    """Local angles of positions ``depth`` cells outwards (0 = on the edge) and ``along``
    (cell units from the side's start) on a side."""
    e0 = -QUARTER
    out_lo = e0 - depth * grid.h
    out_hi = QUARTER + depth * grid.h
    t = e0 + along * grid.h
    if side == 0:
        return out_lo, t
    if side == 1:
        return out_hi, t
    if side == 2:
        return t, out_lo
    return t, out_hi


@functools.lru_cache(maxsize=8)
def connectivity(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every panel side and cell ``k`` along it (``(6, 4, n)``): the flat index
    ``(p' * 4 + s') * n + k'`` of the same edge segment seen from the neighbour, whether
    its direction is reversed there, and the flat index ``p' n^2 + i' n + j'`` of the
    neighbour's cell on that segment."""
    grid = CubedSphere(n)
    k = np.arange(n)
    mids = np.empty((6, SIDES, n, 3))
    starts = np.empty((6, SIDES, n, 3))
    for p in range(6):
        for s in range(SIDES):
            mids[p, s] = to_sphere(p, *_side_points(grid, s, np.zeros(n), k + 0.5))
            starts[p, s] = to_sphere(p, *_side_points(grid, s, np.zeros(n), k + 0.0))
    flat = mids.reshape(-1, 3)
    distance = np.linalg.norm(flat[:, None, :] - flat[None, :, :], axis=-1)
    np.fill_diagonal(distance, np.inf)
    partner = np.argmin(distance, axis=1)
    if not np.all(distance[np.arange(flat.shape[0]), partner] < 1e-9 * grid.h):
        raise RuntimeError("cubed sphere: unmatched edge segment")
    starts_flat = starts.reshape(-1, 3)
    reversed_ = np.linalg.norm(starts_flat - starts_flat[partner], axis=-1) > 1e-9
    pp, ss, kk = np.unravel_index(partner, (6, SIDES, n))
    ii = np.select([ss == 0, ss == 1], [0, n - 1], kk)
    jj = np.select([ss == 2, ss == 3], [0, n - 1], kk)
    cell = pp * n * n + ii * n + jj
    return (
        partner.reshape(6, SIDES, n),
        reversed_.reshape(6, SIDES, n),
        cell.reshape(6, SIDES, n),
    )


@functools.lru_cache(maxsize=8)
def halo_matrix(n: int, nodes: int = 5, ghosts: int = GHOSTS):
    """The halo as a sparse matrix ``(6 * 4 * ghosts * n, 6 n^2)`` acting on flat coordinate
    averages ``q_bar``: row ``((p * 4 + side) * ghosts + depth - 1) * n + k`` is the ghost cell
    ``depth`` cells beyond ``side`` of panel ``p``, ``k`` along it (module docstring).
    ``ghosts``: the halo's depth (the scheme's ``GHOSTS``; the resolution monitor's
    seventh-order reference reads one more)."""
    from scipy.sparse import coo_matrix

    grid = CubedSphere(n)
    s, w = gauss_nodes(nodes)
    rows, cols, vals = [], [], []
    k = np.arange(n)
    for p in range(6):
        for side in range(SIDES):
            for depth in range(1, ghosts + 1):
                row0 = ((p * SIDES + side) * ghosts + depth - 1) * n
                # ghost cell centre: depth - 1/2 cells out; nodes (n, g, g) in (normal, along)
                dn = (depth - 0.5) + s[:, None] * np.ones(nodes)[None, :]
                al = (k[:, None, None] + 0.5) + s[None, None, :] * np.ones(nodes)[None, :, None]
                dn = np.broadcast_to(dn, al.shape)
                a, b = _side_points(grid, side, dn, al)
                x = to_sphere(p, a, b)
                q, a2, b2 = to_panel(x)
                weight = (w[:, None] * w[None, :]) * metric(a, b) / metric(a2, b2)
                ta = (a2 + QUARTER) / grid.h
                tb = (b2 + QUARTER) / grid.h
                fa, wa = _stencil_weights(ta, n)
                fb, wb = _stencil_weights(tb, n)
                for u in range(5):
                    for v in range(5):
                        rows.append(np.broadcast_to((row0 + k)[:, None, None], q.shape).ravel())
                        cols.append((q * n * n + (fa + u) * n + (fb + v)).ravel())
                        vals.append((weight * wa[..., u] * wb[..., v]).ravel())
    shape = (6 * SIDES * ghosts * n, 6 * n * n)
    matrix = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=shape
    )
    return matrix.tocsr()


# ---- geography, noise, clusters ------------------------------------------------------------
def lat_lon(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latitude and longitude in degrees (``z`` north, longitude from ``x`` towards ``y``,
    in ``[-180, 180]``) of points ``(..., 3)``."""
    x = np.asarray(x, float)
    lat = np.degrees(np.arctan2(x[..., 2], np.hypot(x[..., 0], x[..., 1])))
    lon = np.degrees(np.arctan2(x[..., 1], x[..., 0]))
    return lat, lon


def cell_geography(grid: CubedSphere) -> dict[str, np.ndarray]:
    """CF geography of the cells, arrays over ``(panel, j, i)`` (``i`` along ``a``, fastest):
    centre latitude / longitude and the latitude / longitude of the 4 corners
    (``(panel, j, i, 4)``, counter-clockwise seen from outside). Corner longitudes are
    unwrapped to within 180 degrees of the centre's (a cell across the date line keeps
    contiguous bounds); a corner at a pole takes the centre's longitude."""
    e, c = grid.edges, grid.centres
    panels = np.arange(6)[:, None, None]
    centres = to_sphere(panels, c[None, None, :], c[None, :, None])  # a = c[i], b = c[j]
    lat, lon = lat_lon(centres)
    lo, hi = e[:-1], e[1:]
    corners = []
    for a_edge, b_edge in ((lo, lo), (hi, lo), (hi, hi), (lo, hi)):  # counter-clockwise
        corners.append(to_sphere(panels, a_edge[None, None, :], b_edge[None, :, None]))
    points = np.stack(corners, axis=-2)  # (6, n, n, 4, 3)
    lat_b, lon_b = lat_lon(points)
    pole = np.abs(lat_b) > 90.0 - 1e-9
    lon_b = np.where(pole, lon[..., None], lon_b)
    lon_b = lon[..., None] + (lon_b - lon[..., None] + 180.0) % 360.0 - 180.0
    return {"lat": lat, "lon": lon, "lat_bounds": lat_b, "lon_bounds": lon_b}


def noise(
    grid: CubedSphere, amplitude: float, l_max: int = 8, seed: int = 0, mass: float = 1.0
) -> np.ndarray:
    """Cell averages of ``(mass / 4 pi)(1 + amplitude g / max|g|)``: ``g`` a random sum of zonal
    harmonics ``P_l(<m, x>)`` of every degree ``l = 1 .. l_max`` (``2 l + 1`` of each, random
    axes ``m`` and normal coefficients): smooth, mean zero (no mass), band-limited to
    ``l_max``."""
    if isinstance(l_max, bool) or int(l_max) != l_max or not 1 <= l_max <= 64:
        raise ValueError(f"initial.l_max: expected an integer in 1 .. 64, got {l_max!r}")
    if not (math.isfinite(amplitude) and 0 <= amplitude < 1):
        raise ValueError(f"initial.amplitude: expected 0 <= amplitude < 1, got {amplitude!r}")
    return noise_function(grid, amplitude, l_max, seed, mass)[0]


def noise_function(
    grid: CubedSphere, amplitude: float, l_max: int = 8, seed: int = 0, mass: float = 1.0
) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """:func:`noise`'s cell averages and the density itself, ``x (..., 3) -> (...)`` (the same
    normalisation: the largest cell average of ``g`` and its residual mean), for tokens drawn
    from the same law."""
    from scipy.special import eval_legendre

    rng = np.random.default_rng(seed)
    terms = []
    for l in range(1, int(l_max) + 1):
        for _ in range(2 * l + 1):
            axis = rng.normal(size=3)
            terms.append((l, axis / np.linalg.norm(axis), rng.normal()))

    def shape(x):
        return sum(w * eval_legendre(l, x @ m) for l, m, w in terms)

    g = cell_averages(grid, shape, nodes=max(6, int(l_max) // 2 + 4))
    residual = grid.integrate(g) / FOUR_PI  # the quadrature's residual mean (round-off)
    g -= residual
    scale = amplitude / np.abs(g).max()

    def density(x):
        return mass / FOUR_PI * (1.0 + scale * (shape(np.asarray(x, float)) - residual))

    # (the cell averages as noise() always wrote them: the same operations, bit for bit)
    return mass / FOUR_PI * (1.0 + amplitude * g / np.abs(g).max()), density


def clusters(
    grid: CubedSphere, density: np.ndarray, threshold: float = 2.0
) -> tuple[np.ndarray, np.ndarray]:
    """Clusters of a density: cells that are local maxima among the cells within ``1.5 h``
    of their centre (their 8 neighbours, 7 at a panel corner) and above ``threshold`` times
    the uniform density of the same mass; each with the mass of the cells nearer to it than
    to any other maximum. Returns the maxima's centres ``(k, 3)`` and masses ``(k,)``, by
    decreasing mass."""
    from scipy.spatial import cKDTree

    rho = np.asarray(density, float).ravel()
    centres = grid.centres_3d().reshape(-1, 3)
    tree = cKDTree(centres)
    level = threshold * grid.integrate(density) / FOUR_PI
    index = np.arange(rho.size)
    peak = rho > level
    for k in np.flatnonzero(peak):
        near = np.asarray(tree.query_ball_point(centres[k], 1.5 * grid.h), int)
        near = near[near != k]
        # a plateau counts once: strictly above the neighbours before it, at least the rest
        if np.any(rho[near] > rho[k]) or np.any(rho[near[near < k]] == rho[k]):
            peak[k] = False
    peaks = index[peak]
    if peaks.size == 0:
        return np.empty((0, 3)), np.empty(0)
    _, nearest = cKDTree(centres[peaks]).query(centres)
    masses = np.bincount(nearest, weights=rho * grid.areas.ravel(), minlength=peaks.size)
    order = np.argsort(-masses)
    return centres[peaks][order], masses[order]


def cell_index(grid: CubedSphere, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cell ``(p, i, j)`` of ``grid`` that holds each unit vector of ``x (..., 3)``
    (:func:`to_panel`, then the equiangular cell of ``(a, b)``; a point on an edge goes to
    the cell above it, the last cell keeps the panel's far edge)."""
    p, a, b = to_panel(x)
    i = np.clip(((a + QUARTER) / grid.h).astype(int), 0, grid.n - 1)
    j = np.clip(((b + QUARTER) / grid.h).astype(int), 0, grid.n - 1)
    return p, i, j


def cell_list(values: np.ndarray) -> np.ndarray:
    """``(..., 6, n, n)`` indexed ``[p, i, j]`` -> the file's one cell axis ``(..., cell)``,
    cell ``(p n + j) n + i`` (``i`` fastest: CF's X; tpde.sphere's file layout)."""
    values = np.asarray(values)
    return np.swapaxes(values, -1, -2).reshape(*values.shape[:-3], 6 * values.shape[-1] ** 2)


def cell_panels(values: np.ndarray) -> np.ndarray:
    """The inverse of :func:`cell_list`: ``(..., cell)`` -> ``(..., 6, n, n)`` indexed
    ``[p, i, j]`` (``ValueError`` unless the cells are ``6 n^2``)."""
    values = np.asarray(values, float)
    n = math.isqrt(values.shape[-1] // 6)
    if 6 * n * n != values.shape[-1]:
        raise ValueError(f"density: {values.shape[-1]} cells is not 6 n^2 (a cubed sphere)")
    return np.swapaxes(values.reshape(*values.shape[:-1], 6, n, n), -1, -2)


def lat_lon_raster(grid: CubedSphere, density: np.ndarray, step: float = 0.5):
    """``(lon, lat, values)``: the cell values of ``density (6, n, n)`` on a
    latitude-longitude raster of ``step`` degrees (pixel centres, in radians: matplotlib's
    geographic axes; each pixel shows the cell its centre falls in, :func:`cell_index`)."""
    lat = np.radians(np.arange(-90 + step / 2, 90, step))
    lon = np.radians(np.arange(-180 + step / 2, 180, step))
    la, lo = np.meshgrid(lat, lon, indexing="ij")
    x = np.stack([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)], -1)
    p, i, j = cell_index(grid, x)
    return lon, lat, np.asarray(density)[p, i, j]


def small_circle(centre: np.ndarray, radius: float, points: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lon, lat)`` in radians of the small circle of angular ``radius`` around the unit
    vector ``centre`` (``points`` points, closed), NaN where it crosses longitude 180 (so
    a map's line does not cross the map)."""
    c = np.asarray(centre, float) / np.linalg.norm(centre)
    other = np.eye(3)[int(np.argmin(np.abs(c)))]
    e1 = np.cross(c, other)
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(c, e1)
    phi = np.linspace(0.0, 2.0 * np.pi, points)[:, None]
    ring = np.cos(radius) * c + np.sin(radius) * (np.cos(phi) * e1 + np.sin(phi) * e2)
    lat, lon = lat_lon(ring)
    lat, lon = np.radians(lat), np.radians(lon)
    jumps = np.flatnonzero(np.abs(np.diff(lon)) > np.pi) + 1
    return np.insert(lon, jumps, np.nan), np.insert(lat, jumps, np.nan)


def point_histogram(grid: CubedSphere, points: np.ndarray) -> np.ndarray:
    """Cell averages ``(6, n, n)`` of ``points (P, 3)`` each of mass ``1 / P`` (the token
    count of each cell, :func:`cell_index`, over ``P`` times the cell's area)."""
    p, i, j = cell_index(grid, points)
    flat = (p * grid.n + i) * grid.n + j
    counts = np.bincount(flat, minlength=6 * grid.n**2).reshape(grid.shape)
    return counts / (points.shape[0] * grid.areas)


def padded_panels(q: np.ndarray, halo, ghosts: int) -> np.ndarray:
    """``q (6, n, n)`` with ``ghosts`` halo cells on every side of each panel ``(6, n + 2g,
    n + 2g)``, the ghost values ``halo @ q.ravel()`` (a :func:`halo_matrix` of that depth:
    rows ordered panel, side (low/high along the first axis, then the second), depth, line
    position); the corners stay 0 (no stencil reads them)."""
    n, g = q.shape[-1], int(ghosts)
    ghost = (halo @ q.ravel()).reshape(6, SIDES, g, n)
    padded = np.zeros((6, n + 2 * g, n + 2 * g))
    inner = slice(g, g + n)
    padded[:, inner, inner] = q
    for d in range(g):
        padded[:, g - 1 - d, inner] = ghost[:, 0, d]
        padded[:, g + n + d, inner] = ghost[:, 1, d]
        padded[:, inner, g - 1 - d] = ghost[:, 2, d]
        padded[:, inner, g + n + d] = ghost[:, 3, d]
    return padded
