"""The atoms' share of the softmax sums on the flat grid (Gaussian atoms), exactly.

docs/theory.md, 'Atoms in the co-moving frame'. The measure is ``mu = rho dx + sum_k m_k
N(a_k, S_k)``; softmax needs, at a tilt ``c = A x``, the moment generating function
``Z(c) = int e^{c.y} dmu(y)`` and the tilted mean ``M(c) = grad log Z(c)``. Every part has
its own:

    cells:  log Z = log(dV sum_s rho_s e^{c.y_s}) - log S(c),  M = m_rho(c) - grad log S(c),
    atom k: log Z = log m_k + c.a_k + c^T S_k c / 2,            M = a_k + S_k c,

(``S(c)`` the cell box filter of the exact cell-average correction, tpde.variants.softmax),
and the mixture's are the parts' weighted by ``p_j = Z_j / Z`` (a log-sum-exp, so no part
over- or underflows):

    log Z = logsumexp_j log Z_j,   M = sum_j p_j M_j,
    K2 = sum_j p_j (K2_j + d_j d_j^T),
    K3 = sum_j p_j (K3_j + K2_j (x) d_j (3 terms) + d_j (x) d_j (x) d_j),   d_j = M_j - M,

the tilted covariance ``K2 = DM`` and third cumulant ``K3 = D^2 M`` (an atom's are ``S_k`` and
0; the cells' from dense sums over the cells at the atoms' few tilts, less the derivatives of
``log S``). At an atom the field ``u = C M(A x) + b`` then has ``Du = C K2 A`` and
``D^2 u_ijl = C_ip K3_pqr A_qj A_rl`` in closed form (no finite differences).
"""

from __future__ import annotations

import math

import numpy as np

from tpde.grid import Grid
from tpde.schemes.atoms import Atoms, gaussian_log_mgf, gaussian_tilted_mean

from .engines.direct import density_sources, grad_log_box_factor

__all__ = [
    "atom_field",
    "box_factor_derivatives",
    "cell_cumulants",
    "log_box_factor",
    "mixture_cumulants",
    "mixture_means",
]

#: below this |c h / 2| the box factor's derivatives are taken from their series (the
#: closed forms cancel: 2 cosh z / sinh^3 z - 2 / z^3 loses 1e-11 of its value at z = 0.1)
SERIES_BELOW = 0.1


def log_box_factor(c: np.ndarray, spacing) -> np.ndarray:
    """``log S(c) = sum_a log(sinh(z_a) / z_a)``, ``z_a = c_a h_a / 2``: c (P, d) -> (P,)."""
    z = 0.5 * np.asarray(c, float) * np.asarray(spacing, float)
    az = np.abs(z)
    small = az < SERIES_BELOW
    z2 = z * z
    # log(sinh z / z) = z^2/6 - z^4/180 + z^6/2835 - ...; else |z| + log(1 - e^{-2|z|}) - log 2|z|
    series = z2 * (1.0 / 6.0 - z2 * (1.0 / 180.0 - z2 / 2835.0))
    safe = np.where(small, 1.0, az)
    closed = safe + np.log1p(-np.exp(-2.0 * safe)) - np.log(2.0 * safe)
    return np.where(small, series, closed).sum(axis=1)


def box_factor_derivatives(c: np.ndarray, spacing) -> tuple[np.ndarray, np.ndarray]:
    """The second and third derivatives of ``log S`` along each axis (it is separable):
    ``f'' = (h/2)^2 (1/z^2 - 1/sinh^2 z)``, ``f''' = (h/2)^3 (2 cosh z / sinh^3 z - 2/z^3)``,
    by their series below :data:`SERIES_BELOW`; c (P, d) -> two (P, d)."""
    half = 0.5 * np.asarray(spacing, float)
    z = np.asarray(c, float) * half
    small = np.abs(z) < SERIES_BELOW
    z2 = z * z
    s2 = 1.0 / 3.0 - z2 * (
        1.0 / 15.0 - z2 * (2.0 / 189.0 - z2 * (7.0 / 4725.0 - z2 * 18.0 / 93555.0))
    )
    s3 = -z * (2.0 / 15.0 - z2 * (8.0 / 189.0 - z2 * (42.0 / 4725.0 - z2 * 144.0 / 93555.0)))
    safe = np.where(small, 1.0, z)
    with np.errstate(over="ignore"):  # (sinh of a large tilt: its inverse is 0)
        sh = np.sinh(safe)
        c2 = 1.0 / safe**2 - 1.0 / sh**2
        c3 = 2.0 / (np.tanh(safe) * sh**2) - 2.0 / safe**3
    return np.where(small, s2, c2) * half**2, np.where(small, s3, c3) * half**3


def cell_cumulants(
    weights: np.ndarray, grid: Grid, c: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The cells' ``log Z``, ``M``, ``K2``, ``K3`` at a few tilts c (P, d), by dense sums over
    the cells (cell averages ``weights``, grid.shape), with the exact cell-average correction:
    shapes (P,), (P, d), (P, d, d), (P, d, d, d). O(P x cells)."""
    sources, w = density_sources(weights, grid)
    c = np.asarray(c, float)
    d = grid.ndim
    logits = c @ sources.T + np.log(w)
    shift = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - shift)
    total = e.sum(axis=1)
    p = e / total[:, None]
    mean = p @ sources
    y = sources[None, :, :] - mean[:, None, :]  # (P, S, d)
    k2 = np.einsum("ps,psi,psj->pij", p, y, y)
    k3 = np.einsum("ps,psi,psj,psl->pijl", p, y, y, y)
    volume = float(np.prod(grid.spacing))
    log_z = np.log(total) + shift[:, 0] + math.log(volume) - log_box_factor(c, grid.spacing)
    mean = mean - grad_log_box_factor(c, grid.spacing)
    f2, f3 = box_factor_derivatives(c, grid.spacing)
    idx = np.arange(d)
    k2[:, idx, idx] -= f2
    k3[:, idx, idx, idx] -= f3
    return log_z, mean, k2, k3


def mixture_means(
    cells_log: np.ndarray | None, cells_mean: np.ndarray | None, atoms: Atoms, c: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``log Z`` (P,) and ``M`` (P, d) of cells plus atoms at tilts c (P, d), from the cells'
    own (None: no cells) and each atom's closed form, combined by log-sum-exp."""
    logs = [] if cells_log is None else [cells_log]
    means = [] if cells_mean is None else [cells_mean]
    for k in range(atoms.count):
        logs.append(math.log(atoms.mass[k]) + gaussian_log_mgf(c, atoms.centre[k], atoms.cov[k]))
        means.append(gaussian_tilted_mean(c, atoms.centre[k], atoms.cov[k]))
    stacked = np.stack(logs)  # (J, P)
    top = stacked.max(axis=0)
    p = np.exp(stacked - top)
    total = p.sum(axis=0)
    p /= total
    mean = np.einsum("jp,jpi->pi", p, np.stack(means))
    return np.log(total) + top, mean


def mixture_cumulants(
    cells: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None,
    atoms: Atoms,
    c: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``M`` (P, d), ``K2`` (P, d, d), ``K3`` (P, d, d, d) of cells (their
    :func:`cell_cumulants`, or None) plus atoms at tilts c (P, d) (module docstring)."""
    P, d = c.shape
    parts = [] if cells is None else [cells]
    zero3 = np.zeros((P, d, d, d))
    for k in range(atoms.count):
        log_z = math.log(atoms.mass[k]) + gaussian_log_mgf(c, atoms.centre[k], atoms.cov[k])
        mean = gaussian_tilted_mean(c, atoms.centre[k], atoms.cov[k])
        parts.append((log_z, mean, np.broadcast_to(atoms.cov[k], (P, d, d)), zero3))
    logs = np.stack([part[0] for part in parts])
    p = np.exp(logs - logs.max(axis=0))
    p /= p.sum(axis=0)
    mean = np.einsum("jp,jpi->pi", p, np.stack([part[1] for part in parts]))
    k2 = np.zeros((P, d, d))
    k3 = np.zeros((P, d, d, d))
    for weight, (_, m_j, k2_j, k3_j) in zip(p, parts, strict=True):
        dj = m_j - mean
        w = weight[:, None, None]
        k2 += w * (k2_j + np.einsum("pi,pj->pij", dj, dj))
        mixed = np.einsum("pij,pl->pijl", k2_j, dj)
        k3 += w[..., None] * (
            k3_j
            + mixed
            + np.swapaxes(mixed, 2, 3)  # [i, j, l] = K2_il d_j
            + np.swapaxes(mixed, 1, 3)  # [i, j, l] = K2_jl d_i (K2 symmetric)
            + np.einsum("pi,pj,pl->pijl", dj, dj, dj)
        )
    return mean, k2, k3


def atom_field(
    weights: np.ndarray | None,
    grid: Grid,
    heads,
    atoms: Atoms,
    shift: np.ndarray,
    matrices: list[np.ndarray],
    gains: list[np.ndarray],
    constants: list[np.ndarray],
    points: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``u``, ``Du``, ``D^2 u`` at the atoms' centres (K, d), (K, d, d), (K, d, d, d) of the
    field ``u(x) = sum_h G_h M(B_h (x + shift)) + b_h`` (B_h = ``matrices[h]``, G_h =
    ``gains[h]``, b_h = ``constants[h]``: in the frame ``L^T A L``, ``L^-1 C L``, ``L^-1 C
    m``) of the cells (``weights``, None: none) plus the atoms; ``heads`` only counts them.
    ``points`` (K, d): evaluate there instead of at the centres."""
    where = atoms.centre if points is None else np.asarray(points, float)
    K, d = where.shape
    u = np.zeros((K, d))
    du = np.zeros((K, d, d))
    d2u = np.zeros((K, d, d, d))
    for _, B, G, b in zip(heads, matrices, gains, constants, strict=True):
        c = (where + shift) @ B.T
        cells = None if weights is None else cell_cumulants(weights, grid, c)
        mean, k2, k3 = mixture_cumulants(cells, atoms, c)
        u += mean @ G.T + b
        du += np.einsum("ip,kpq,qj->kij", G, k2, B)
        d2u += np.einsum("ip,kpqr,qj,rl->kijl", G, k3, B, B)
    return u, du, d2u
