"""The sphere S^2 as an equal-area grid in (z, phi): exact cell averages, zonal projections.

docs/theory.md, 'The sphere on the grid'. A point of the unit sphere is
``x = (s cos phi, s sin phi, z)``, ``s = sqrt(1 - z^2)``; by Archimedes' theorem the area
element is exactly ``dA = dz dphi``, so the rectangle ``[-1, 1] x [0, 2 pi)`` with cells of
equal width in ``z`` and ``phi`` is an *equal-area* grid of the sphere and the continuity
equation on the sphere is the flat one in ``(z, phi)``:

    d/dt rho + d/dz (rho u_z) + d/dphi (rho u_phi) = 0,
    u_z = dz/dt = <grad_S z, v>,   u_phi = dphi/dt = <e_phi, v> / s,

``rho`` the density per unit area. The grid is ``Grid([-1, 0], [1, 2 pi], [nz, nphi],
("noflux", "periodic"))``: the poles are the edges ``z = +-1`` (``u_z = 0`` there), ``phi``
is periodic, and the finite-volume scheme of :mod:`tpde.schemes` runs on it unchanged. The
grid is not quasi-uniform: near the poles the cells are long and thin (``s ~ sqrt(h_z)``)
and a smooth function on the sphere is not smooth in ``z`` there (``x = s cos phi``); see
the docs for what that costs.

Densities are per unit area (the uniform probability is ``1 / (4 pi)``). The cell averages
here are exact: closed forms for zonal Legendre data, Gauss-Legendre quadrature in
``(theta, phi)`` (``z = cos theta``, smooth up to the poles) for von Mises-Fisher data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.polynomial.legendre import leggauss
from scipy.special import eval_legendre

from .grid import Grid

__all__ = [
    "FOUR_PI",
    "legendre_averages",
    "SphereGrid",
    "sphere_grid",
    "von_mises_fisher",
    "zonal_amplitude",
    "zonal_modes",
]

FOUR_PI = 4.0 * math.pi
_GL_NODES = 12


class SphereGrid(Grid):
    """The equal-area ``(z, phi)`` grid of the sphere (module docstring)."""

    @property
    def nz(self) -> int:
        return self.cells[0]

    @property
    def nphi(self) -> int:
        return self.cells[1]


def sphere_grid(nz: int, nphi: int | None = None) -> SphereGrid:
    """``nz`` bands of equal width in ``z`` times ``nphi`` (default ``2 nz``) sectors."""
    nphi = 2 * int(nz) if nphi is None else int(nphi)
    if int(nz) < 8 or nphi < 8:
        raise ValueError(f"grid.cells: the sphere needs at least 8 x 8 cells, got {nz} x {nphi}")
    return SphereGrid([-1.0, 0.0], [1.0, 2.0 * math.pi], [int(nz), nphi], ("noflux", "periodic"))


def _check_sphere(grid: Grid) -> None:
    if not (
        grid.ndim == 2
        and grid.boundary == ("noflux", "periodic")
        and grid.lower == (-1.0, 0.0)
        and grid.upper == (1.0, 2.0 * math.pi)
    ):
        raise ValueError("grid: the sphere is the (z, phi) grid of sphere_grid()")


def zonal_modes(
    grid: Grid, modes: Sequence[tuple[int, float]] = (), mass: float = 1.0
) -> np.ndarray:
    """Exact cell averages of ``(mass / 4 pi) (1 + sum_j a_j P_{l_j}(z))`` (Legendre
    ``P_l``): the average of ``P_l`` over ``[z_a, z_b]`` is
    ``(P_{l+1} - P_{l-1}) |_{z_a}^{z_b} / ((2 l + 1) h_z)``."""
    _check_sphere(grid)
    edges = grid.edges(0)
    h = grid.spacing[0]
    profile = np.ones(grid.cells[0])
    for l, amplitude in modes:
        if int(l) != l or l < 1:
            raise ValueError(f"initial.modes: l must be an integer >= 1, got {l!r}")
        antiderivative = (eval_legendre(l + 1, edges) - eval_legendre(l - 1, edges)) / (2 * l + 1)
        profile = profile + float(amplitude) * np.diff(antiderivative) / h
    if profile.min() < 0:
        raise ValueError("initial.modes: the density would be negative")
    return np.repeat((mass / FOUR_PI * profile)[:, None], grid.cells[1], axis=1)


def von_mises_fisher(
    grid: Grid, mean: Sequence[float] = (0.0, 0.0, 1.0), kappa: float = 1.0, mass: float = 1.0
) -> np.ndarray:
    """Exact cell averages of ``mass kappa e^{kappa <m, x>} / (4 pi sinh kappa)``
    (``m = mean / |mean|``): per cell a tensor Gauss-Legendre rule in ``(theta, phi)``
    (``z = cos theta``; ``dz = sin theta dtheta`` keeps the integrand smooth up to the poles),
    split into pieces across which the exponent changes by at most about 4."""
    _check_sphere(grid)
    m = np.asarray(mean, float)
    if m.shape != (3,) or not np.linalg.norm(m) > 0:
        raise ValueError(f"initial.mean: expected a non-zero 3-vector, got {mean!r}")
    m = m / np.linalg.norm(m)
    if not (math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"initial.kappa: expected a finite number > 0, got {kappa!r}")
    # normalisation, scaled by e^{-kappa}: kappa / (2 pi (1 - e^{-2 kappa}))
    scale = kappa / (2.0 * math.pi * -math.expm1(-2.0 * kappa))
    x, w = leggauss(_GL_NODES)
    z_edges, phi_edges = grid.edges(0), grid.edges(1)
    theta_edges = np.arccos(np.clip(z_edges, -1.0, 1.0))  # decreasing
    out = np.empty(grid.shape)
    h_phi = grid.spacing[1]
    pieces_phi = max(1, math.ceil(kappa * h_phi / 4.0))
    sub_phi = h_phi / pieces_phi
    phi_nodes = (
        phi_edges[:-1, None, None]
        + sub_phi * np.arange(pieces_phi)[None, :, None]
        + 0.5 * sub_phi * (x[None, None, :] + 1.0)
    ).reshape(grid.cells[1], -1)
    phi_weights = np.tile(0.5 * sub_phi * w, pieces_phi)
    for i in range(grid.cells[0]):
        t0, t1 = theta_edges[i + 1], theta_edges[i]  # theta increases as z decreases
        pieces = max(1, math.ceil(kappa * (t1 - t0) / 4.0))
        sub = (t1 - t0) / pieces
        theta = (t0 + sub * np.arange(pieces)[:, None] + 0.5 * sub * (x[None, :] + 1.0)).ravel()
        t_weights = np.tile(0.5 * sub * w, pieces) * np.sin(theta)
        st, ct = np.sin(theta), np.cos(theta)
        # <m, x> - 1 at every (theta, phi) node of the row: (cells_phi, nodes_phi, nodes_theta)
        dot = (
            st[None, None, :]
            * (m[0] * np.cos(phi_nodes)[:, :, None] + m[1] * np.sin(phi_nodes)[:, :, None])
            + m[2] * ct[None, None, :]
        )
        values = np.exp(kappa * (dot - 1.0))
        cell = np.einsum("kpt,p,t->k", values, phi_weights, t_weights)
        out[i] = mass * scale * cell / (grid.spacing[0] * h_phi)
    return out


def legendre_averages(grid: Grid, degrees: int) -> np.ndarray:
    """The cell averages in ``z`` of ``P_0 .. P_{degrees - 1}``: (nz, degrees)."""
    edges = grid.edges(0)
    h = grid.spacing[0]
    columns = [np.ones(grid.cells[0])]
    for l in range(1, degrees):
        antiderivative = (eval_legendre(l + 1, edges) - eval_legendre(l - 1, edges)) / (2 * l + 1)
        columns.append(np.diff(antiderivative) / h)
    return np.stack(columns, axis=1)


def zonal_amplitude(density: np.ndarray, grid: Grid, l: int) -> float:
    """``a_l / a_0`` of the least-squares Legendre fit ``sum_k a_k P_k(z)`` (``k <
    min(nz // 2, 24)``) of the zonal (``phi``-averaged) cell averages: ``a`` for
    ``(1 + a P_l(z)) / (4 pi)``, exact for zonal data of degree below the fit's (no other
    zonal mode of lower degree leaks in)."""
    _check_sphere(grid)
    degrees = min(grid.cells[0] // 2, 24)
    if not 0 < l < degrees:
        raise ValueError(f"zonal_amplitude: l = {l} is outside 1..{degrees - 1} on this grid")
    rows = np.asarray(density, float).mean(axis=-1)
    coefficients = np.linalg.lstsq(legendre_averages(grid, degrees), rows, rcond=None)[0]
    return float(coefficients[l] / coefficients[0])
