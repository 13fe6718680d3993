"""The atoms' share of the attention sums on the circle (wrapped normal atoms), exactly.

docs/theory.md, 'Cells plus atoms'.
An atom of mass ``m``, centre ``a`` and variance ``s`` is the wrapped normal
``m N(a, s)`` on the angle, whose Fourier coefficients are exact:

    c_k = int e^{-i k phi} m dN(a, s)(phi) = m e^{-i k a} e^{-k^2 s / 2}.

The kernel of a rotation-invariant head, ``g(s) = e^{r cos(s - alpha)}``, has coefficients
``I_|k|(r) e^{-i k alpha}``, so ``int e^{beta cos(phi - theta)} dN(a, s) = sum_k I_k(beta)
e^{-k^2 s / 2} e^{i k (a - theta)}`` and every sum of :class:`~.spherical.CircleAttention`'s
FFT engine takes the atoms as extra Fourier coefficients added to the cells'. The grid
keeps the modes below its Nyquist mode ``n / 2``; the kernel's beyond it are below
``ive(n / 2, r) / ive(0, r)`` (checked: :func:`check_band`), so the atoms' share is exact to
round-off wherever the FFT engine is.

At the atoms themselves the solver needs ``u``, ``u'`` and ``u''`` (the atom's motion,
:func:`tpde.schemes.atoms.atom_rates`): the same sums at the atoms' centres, with the
derivatives ``(i k)^j`` of the Fourier series, and

    u = N / Z,  u' = N'/Z - N Z'/Z^2,  u'' = N''/Z - (2 N' Z' + N Z'')/Z^2 + 2 N Z'^2/Z^3.
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np
from scipy.special import ive

from tpde.grid import Grid
from tpde.grid.circle import TWO_PI, fourier_modes
from tpde.schemes.atoms import Atoms

from .engines.bessel import series_order
from .parameters import Head

__all__ = [
    "add_atom_spectrum",
    "atom_modes",
    "atom_modes_upto",
    "atom_spectrum",
    "check_band",
    "dft_factor",
    "energy_with_atoms",
    "kernel_band",
    "kernel_modes",
    "mode_factor",
    "series_bound_order",
    "series_modes",
    "series_table",
    "series_velocity_at",
    "tilted_moments",
    "velocity_at",
]

#: the kernel's modes beyond the grid's Nyquist mode must be below this (relative)
BAND_TOLERANCE = 1e-16
#: the kernel's modes below this (relative to its mean) are left out of the atoms' sums
KERNEL_TAIL = 1e-18
#: the tilted trigonometric moments ``int e^{i j phi} e^{c.y} dmu``, ``j < SERIES_MOMENTS``,
#: that the atoms' motion under any head reads (its integrands have degree 3 in y)
SERIES_MOMENTS = 4
#: equispaced nodes that take those integrands to their Fourier coefficients exactly (a
#: trigonometric polynomial of degree 3 needs more than 7)
SERIES_NODES = 8


def atom_modes(atoms: Atoms, k: np.ndarray) -> np.ndarray:
    """``sum_atoms m e^{-i k a} e^{-k^2 s / 2}`` for the integers ``k`` (any shape)."""
    kk = np.asarray(k, float)[..., None]
    a = atoms.centre[:, 0]
    s = atoms.cov[:, 0, 0]
    terms = atoms.mass * np.exp(-1j * kk * a - 0.5 * kk * kk * s)
    return terms.sum(axis=-1)


def atom_modes_upto(atoms: Atoms, count: int) -> np.ndarray:
    """``atom_modes(atoms, np.arange(count))`` bit for bit, its exponent's factors kept per
    ``count`` (:func:`_exponent_factors`: the same products in the same order)."""
    a = atoms.centre[:, 0]
    s = atoms.cov[:, 0, 0]
    if atoms.count <= PAIRWISE_BLOCK:  # (a stage's few atoms: one compiled pass)
        out = np.empty(int(count), complex)
        _atom_modes_pass(atoms.mass, a, s, out)
        return out
    ik, half_k2 = _exponent_factors(int(count))
    return np.add.reduce(atoms.mass * np.exp(ik * a - half_k2 * s), axis=-1)


#: :func:`_atom_modes_pass` serves up to this many atoms (one block of numpy's pairwise sum)
PAIRWISE_BLOCK = 64


@numba.njit(cache=True)
def _atom_modes_pass(mass, a, s, out):  # pragma: no cover - compiled
    """``out[k] = sum_atoms m e^{-i k a - k^2 s / 2}``, ``k = 0 .. out.size - 1``, for at
    most :data:`PAIRWISE_BLOCK` atoms: numpy's operations of :func:`atom_modes_upto` in
    numpy's order, so its values bit for bit: the exponent ``(-k^2 / 2) s`` and ``-k a``,
    ``e^x (cos y, sin y)`` (numpy's complex exp), the mass times it, and the row sums as
    numpy's complex pairwise sum (below 4 terms one after another, else 4 accumulators over
    the terms ``i mod 4`` added as ``(r_0 + r_1) + (r_2 + r_3)``, then the rest)."""
    P = mass.size
    tr, ti = np.empty(P), np.empty(P)
    for k in range(out.size):
        kk = float(k)
        half = 0.5 * kk * kk
        for p in range(P):
            x = math.exp(-(half * s[p]))
            y = -(kk * a[p])
            tr[p] = mass[p] * (x * math.cos(y))
            ti[p] = mass[p] * (x * math.sin(y))
        if P < 4:
            sr, si = -0.0, -0.0
            for p in range(P):
                sr += tr[p]
                si += ti[p]
        else:
            r0, r1, r2, r3 = tr[0], tr[1], tr[2], tr[3]
            i0, i1, i2, i3 = ti[0], ti[1], ti[2], ti[3]
            top = P - P % 4
            for p in range(4, top, 4):
                r0 += tr[p]
                r1 += tr[p + 1]
                r2 += tr[p + 2]
                r3 += tr[p + 3]
                i0 += ti[p]
                i1 += ti[p + 1]
                i2 += ti[p + 2]
                i3 += ti[p + 3]
            sr = (r0 + r1) + (r2 + r3)
            si = (i0 + i1) + (i2 + i3)
            for p in range(top, P):
                sr += tr[p]
                si += ti[p]
        out[k] = complex(0.0 + sr, 0.0 + si)


def check_band(grid: Grid, head: Head) -> None:
    """Raise when the grid's modes do not hold the kernel (the atoms' sums would lose the
    kernel's modes beyond the Nyquist mode)."""
    r = float(np.hypot(*_conformal(head.A)))
    n = grid.cells[0]
    if ive(n // 2, r) > BAND_TOLERANCE * ive(0, r):
        raise ValueError(
            f"atoms: the kernel e^(|A| cos) with |A| = {r:g} has modes beyond {n // 2} (the "
            "grid's Nyquist mode) above 1e-16 of its mean; refine grid.cells"
        )


def _conformal(M: np.ndarray) -> tuple[float, float]:
    return 0.5 * (M[0, 0] + M[1, 1]), 0.5 * (M[1, 0] - M[0, 1])


def kernel_band(r: float, n: int) -> int:
    """The modes ``0 .. K - 1`` that carry the kernel ``e^{r cos}``: the smallest ``K`` with
    ``ive(K, r) < 1e-18 ive(0, r)``, at most ``n // 2`` (below the grid's Nyquist mode)."""
    scale = float(ive(0, r))
    k = 1
    while k < n // 2 and float(ive(k, r)) >= KERNEL_TAIL * scale:
        k += 1
    return k


@functools.lru_cache(maxsize=16)
def _dft_factor(n: int, h: float, lower: float, band: int) -> np.ndarray:
    """``n e^{i k x_0} sinc(k h / 2) / (2 pi)``, ``k = 0 .. band - 1``: a mode's DFT units."""
    k = np.arange(band)
    return (n / TWO_PI) * np.exp(1j * k * (lower + 0.5 * h)) * np.sinc(k * h / TWO_PI)


def mode_factor(grid: Grid, band: int) -> np.ndarray:
    """``(2 pi / n) e^{-i k x_0} / sinc(k h / 2)``, ``k < band``: the DFT of the cell averages
    (and of the atoms' :func:`atom_spectrum`) to ``c_k``."""
    return _mode_factor(grid.cells[0], float(grid.spacing[0]), float(grid.lower[0]), band)


@functools.lru_cache(maxsize=16)
def _mode_factor(n: int, h: float, lower: float, band: int) -> np.ndarray:
    """``(2 pi / n) e^{-i k x_0} / sinc(k h / 2)``: the DFT of the cell averages to ``c_k``."""
    k = np.arange(band)
    return (TWO_PI / n) * np.exp(-1j * k * (lower + 0.5 * h)) / np.sinc(k * h / TWO_PI)


def atom_spectrum(grid: Grid, atoms: Atoms, band: int | None = None) -> np.ndarray:
    """The atoms' modes in the units of ``np.fft.fft`` of the cell averages (FFT order), so
    that ``fft(rho) + atom_spectrum`` is the spectrum of cells plus atoms: the cells' ``c_k``
    is ``(2 pi / n) DFT_k e^{-i k x_0} / sinc(k h / 2)`` (``x_0`` the first centre). Modes
    ``|k| >= band`` (where the kernel is below 1e-18 of its mean) are left out."""
    n = grid.cells[0]
    band = n // 2 if band is None else min(int(band), n // 2)
    k = np.arange(band)
    positive = atom_modes(atoms, k) * _dft_factor(
        n, float(grid.spacing[0]), float(grid.lower[0]), band
    )
    dft = np.zeros(n, complex)
    dft[:band] = positive
    dft[n - band + 1 :] = np.conj(positive[1:][::-1])  # real atoms: c_{-k} = conj(c_k)
    if n % 2 == 0:
        dft[n // 2] = 0.0  # the Nyquist mode: the engine drops it
    return dft


@functools.lru_cache(maxsize=16)
def _exponent_factors(band: int) -> tuple[np.ndarray, np.ndarray]:
    """``-i k`` and ``k^2 / 2`` (band, 1) for :func:`atom_modes`' exponent, kept per band (the
    same products in the same order, so the modes are bit for bit those of atom_modes)."""
    kk = np.arange(band, dtype=float)[:, None]
    return -1j * kk, 0.5 * kk * kk


def add_atom_spectrum(
    spectrum: np.ndarray, grid: Grid, atoms: Atoms, band: int, dft_factor: np.ndarray
) -> None:
    """``spectrum += atom_spectrum(grid, atoms, band)`` in place, touching only the band's
    modes (the others of atom_spectrum are zero); ``dft_factor`` is :func:`dft_factor` of the
    grid and band. One pass per evaluation with no array of the grid's size (a step's cost)."""
    n = grid.cells[0]
    band = min(int(band), n // 2)
    ik, half_k2 = _exponent_factors(band)
    a = atoms.centre[:, 0]
    s = atoms.cov[:, 0, 0]
    positive = np.add.reduce(atoms.mass * np.exp(ik * a - half_k2 * s), axis=-1) * dft_factor
    spectrum[:band] += positive
    spectrum[n - band + 1 :] += np.conj(positive[1:][::-1])  # real atoms: c_{-k} = conj(c_k)


def dft_factor(grid: Grid, band: int) -> np.ndarray:
    """``n e^{i k x_0} sinc(k h / 2) / (2 pi)``, ``k < band``: a mode's DFT units."""
    n = grid.cells[0]
    band = min(int(band), n // 2)
    return _dft_factor(n, float(grid.spacing[0]), float(grid.lower[0]), band)


def kernel_modes(head: Head, band: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``k = 0 .. band - 1``, the weights (K, 6) that take the measure's ``c_k`` to the
    series ``N, N', N'', Z, Z', Z''`` at a point (the kernel's coefficients at ``-k``, scaled
    by ``e^{-r}``, as in :mod:`.spherical`'s FFT engine, times ``(i k)^j``), and the clip
    ``||C||_2``."""
    a, b = _conformal(head.A)
    p, q = _conformal(head.C)
    r, alpha = math.hypot(a, b), math.atan2(b, a)
    k = np.arange(band)

    def g0(kk: np.ndarray) -> np.ndarray:
        return ive(np.abs(kk), r) * np.exp(-1j * kk * alpha)

    z_factor = g0(-k)
    n_factor = p * (g0(-k - 1) - g0(-k + 1)) / 2j + q * (g0(-k - 1) + g0(-k + 1)) / 2.0
    # the six series N, N', N'', Z, Z', Z'' as weights on the modes (K, 6); the modes
    # k > 0 count twice (their conjugates at -k)
    twice = np.where(k == 0, 1.0, 2.0)
    ik = 1j * k
    weights = np.stack([twice * f * ik**j for f in (n_factor, z_factor) for j in range(3)], 1)
    return k, weights, float(np.linalg.norm(head.C, 2))


def velocity_at(
    density: np.ndarray,
    grid: Grid,
    atoms: Atoms,
    head: Head,
    points: np.ndarray,
    normalised: bool = True,
    kernel: tuple | None = None,
    modes: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(u, u', u'')`` of the angular velocity at ``points`` (P,) from cells plus atoms, for a
    rotation-invariant head (``A = a I + b J``, ``C = p I + q J``). ``kernel``: the
    :func:`kernel_modes` of the head (computed when not given); ``modes``: the measure's
    ``c_k`` on its band when already summed (the FFT engine's, cells plus atoms)."""
    if kernel is None:
        r = math.hypot(*_conformal(head.A))
        kernel = kernel_modes(head, kernel_band(r, grid.cells[0]))
    k, weights, bound = kernel
    if modes is None:
        # the cells' c_k (tpde.grid.circle.fourier_modes, its factor cached) plus the atoms'
        cells = np.fft.rfft(np.asarray(density, float))[: k.size]
        c = cells * mode_factor(grid, k.size) + atom_modes(atoms, k)
    else:
        c = modes
    phase = np.exp(1j * np.multiply.outer(np.asarray(points, float), k))  # (P, K)
    n0, n1, n2, z, z1, z2 = (phase @ (weights * c[:, None])).real.T
    if not normalised:
        scale = math.exp(math.hypot(*_conformal(head.A)))
        return n0 * scale, n1 * scale, n2 * scale
    u = n0 / z
    du = n1 / z - n0 * z1 / z**2
    d2u = n2 / z - (2.0 * n1 * z1 + n0 * z2) / z**2 + 2.0 * n0 * z1**2 / z**3
    return np.minimum(np.maximum(u, -bound), bound), du, d2u  # (np.clip's, without its wrapper)


def energy_with_atoms(density: np.ndarray, grid: Grid, beta: float, atoms: Atoms) -> float:
    """``E = 1/(2 beta) iint e^{beta cos(phi - theta)} dmu dmu`` of cells plus atoms:
    ``1/(2 beta) sum_k I_k(beta) |c_k|^2``, the cells' modes below the Nyquist mode, the
    atoms' to where ``I_k / I_0 < 1e-18`` (exact for the atoms, spectral for the cells)."""
    n = grid.cells[0]
    kmax = n // 2
    while ive(kmax, beta) > 1e-18 * ive(0, beta):
        kmax += 16
    k = np.arange(kmax)
    c = atom_modes(atoms, k)
    cells = fourier_modes(density, grid)
    c[: cells.size] += cells
    weights = np.where(k == 0, 1.0, 2.0) * ive(k, beta)
    return float(np.sum(weights * np.abs(c) ** 2) * math.exp(beta) / (2.0 * beta))


# ---- any head: the Jacobi-Anger series (docs/theory.md, 'Atoms under any head on the circle')
def series_modes(
    density: np.ndarray, grid: Grid, atoms: Atoms | None, count: int, factors: np.ndarray
) -> np.ndarray:
    """``c_m``, ``m = 0 .. count - 1``, of cells plus atoms: the cells' below the grid's
    Nyquist mode (the rfft of the averages times ``factors``, :func:`mode_factor`'s values
    for ``m < n / 2``; beyond it the cells have none), the atoms' exact at every ``m`` (a
    narrow atom has modes far beyond the grid's)."""
    cells = min(int(count), grid.cells[0] // 2)
    out = np.zeros(int(count), complex)
    out[:cells] = np.fft.rfft(np.asarray(density, float))[:cells] * factors[:cells]
    if atoms is not None and atoms.count:
        out += atom_modes_upto(atoms, int(count))
    return out


def series_bound_order(head: Head) -> int:
    """The series order that meets the tail bound of :mod:`.engines.bessel` at every target:
    the order of the largest tilt ``|A x| <= ||A||_2`` (the bound grows with the radius at a
    fixed order: ``I_{K+1}(r) / I_0(r)`` and the ratio ``q`` both do)."""
    return int(series_order(np.array([float(np.linalg.norm(head.A, 2))]))[0][0])


def series_table(radius: np.ndarray, angle: np.ndarray, order: int) -> np.ndarray:
    """``ive(|m|, r_i) e^{i m psi_i}``, ``m = -K .. K`` (P, 2K + 1), as
    :class:`~.engines.bessel.BesselSeries`'s table, at a given order ``K``."""
    m, orders, folded = _table_indices(int(order))
    scaled = ive(orders, np.asarray(radius, float)[:, None])
    return scaled[:, folded] * np.exp(1j * (np.asarray(angle, float).reshape(-1)[:, None] * m))


@functools.lru_cache(maxsize=8)
def _table_indices(order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``m = -K .. K``, the orders ``0 .. K`` (1, K + 1) and ``|m|`` of a series table."""
    m = np.arange(-order, order + 1)
    return m, np.arange(order + 1)[None, :], np.abs(m)


def tilted_moments(
    table: np.ndarray, positive: np.ndarray, count: int = SERIES_MOMENTS
) -> np.ndarray:
    """``e^{-r} E_j``, ``E_j = int e^{i j phi} e^{c.y} dmu = sum_m I_|m|(r) e^{i m psi}
    c_{m - j}`` for ``j = 0 .. count - 1`` at the targets of a series ``table`` (P, 2K + 1)
    (Jacobi-Anger, as :class:`~.engines.bessel.BesselSeries`, whose tail bound holds for
    every shift ``j``: ``|c_m| <= int |mu|``): (P, count) complex. ``positive``: ``c_0 ..``
    (at least ``K + 1`` of them where the measure has them; ``c_{-m} = conj(c_m)``)."""
    K = (table.shape[1] - 1) // 2
    shift = count - 1
    full = np.zeros(2 * K + 1 + shift, complex)  # c_l for l = -K - shift .. K
    centre = K + shift
    have = min(positive.size, K + 1)
    full[centre : centre + have] = positive[:have]
    full[centre - have + 1 : centre][::-1] = np.conj(positive[1:have])
    return table @ full[_shifted_columns(K, count)]  # column j: full[shift - j + m]


@functools.lru_cache(maxsize=8)
def _shifted_columns(order: int, count: int) -> np.ndarray:
    """``index[m, j] = count - 1 - j + m`` (2K + 1, count): the columns of the shifted
    coefficients ``c_{m - j}`` of :func:`tilted_moments` as one gather."""
    return (count - 1 - np.arange(count))[None, :] + np.arange(2 * order + 1)[:, None]


def _integrands(head: Head, theta: np.ndarray) -> np.ndarray:
    """Fourier coefficients ``f_j``, ``j = 0 .. 3``, of the six integrands (6, P, 4) whose
    integrals against ``e^{<A x, y>} dmu(y)`` are ``N, N', N'', Z, Z', Z''`` at the targets
    ``theta`` (P,): with ``g = <A x, y>``, ``g1 = <A t, y>``, ``n = <t, C y>``, ``n1 = -<x,
    C y>`` (``x' = t``, ``t' = -x``) they are ``n``, ``n1 + n g1``, ``-n + 2 n1 g1 + n (g1^2 -
    g)``, ``1``, ``g1``, ``g1^2 - g``: polynomials of degree <= 3 in ``y = (cos phi, sin
    phi)``, taken exactly to their modes by :data:`SERIES_NODES` equispaced nodes."""
    cos, sin = np.cos(theta), np.sin(theta)
    return _integrand_modes(head, cos, sin, _frame(cos, sin))


def _frame(cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x = (cos, sin)`` and ``t = (-sin, cos)`` (P, 2)."""
    x = np.empty((cos.size, 2))
    x[:, 0], x[:, 1] = cos, sin
    t = np.empty((cos.size, 2))
    t[:, 0], t[:, 1] = -sin, cos
    return x, t


@functools.lru_cache(maxsize=1)
def _series_nodes() -> np.ndarray:
    """``y = (cos phi, sin phi)`` at the :data:`SERIES_NODES` equispaced nodes (2, Q)."""
    phi = TWO_PI * np.arange(SERIES_NODES) / SERIES_NODES
    return np.stack([np.cos(phi), np.sin(phi)], axis=0)


def _integrand_modes(head: Head, cos, sin, frame) -> np.ndarray:
    """:func:`_integrands` from the targets' ``x, t`` (one (6, P, Q) array, no stacking)."""
    A, C = head.A, head.C
    x, t = frame
    y = _series_nodes()
    g = (x @ A.T) @ y
    g1 = (t @ A.T) @ y
    n = (t @ C) @ y
    n1 = -(x @ C) @ y
    curve = g1 * g1 - g
    values = np.empty((6,) + g.shape)  # (6, P, Q)
    values[0] = n
    values[1] = n1 + n * g1
    values[2] = -n + 2.0 * n1 * g1 + n * curve
    values[3] = 1.0
    values[4] = g1
    values[5] = curve
    return np.fft.fft(values, axis=-1)[..., :SERIES_MOMENTS] / SERIES_NODES


def series_velocity_at(
    density: np.ndarray,
    grid: Grid,
    atoms: Atoms | None,
    head: Head,
    points: np.ndarray,
    factors: np.ndarray,
    normalised: bool = True,
    order: int | None = None,
    modes: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(u, u', u'')`` of the angular velocity at ``points`` (P,) from cells plus atoms for
    any 2 x 2 head: per target the tilt ``c = A x``, the Bessel series of ``e^{c.y}`` read
    against the measure's modes shifted by ``j = 0 .. 3`` (the tilted moments ``E_j`` of
    :func:`tilted_moments`), and each of ``N, N', N'', Z, Z', Z''`` as ``f_0 E_0 + 2 Re
    sum_{j >= 1} f_j E_j`` with ``f_j`` the integrands' modes (:func:`_integrands`; real
    measure: ``E_{-j} = conj(E_j)``). ``factors``: the cells' :func:`mode_factor` below the
    Nyquist mode. Every sum carries the same ``e^{-|c|}``, which cancels in ``u = N / Z``
    and its derivatives (unnormalised: times ``e^{|c|}``). ``order``: the series order
    (:func:`series_bound_order`; else each call finds it a posteriori); ``modes``: the
    measure's ``c_m``, cells plus atoms, when already summed (at least ``order + 1``).

    One compiled pass (:func:`_series_pass`) after the scaled Bessel values: the integrands'
    modes in closed form (products of the linear forms ``<v, y>``, whose modes are ``(v_1 -+
    i v_2) / 2`` at ``j = +-1``) rather than an 8-node FFT, the series sums and the
    quotients, in real arithmetic; the same sums as the FFT form to round-off
    (``tests/test_atom_fast_paths.py``)."""
    theta = np.asarray(points, float).reshape(-1)
    A = np.asarray(head.A, float)
    radius, angle = _series_tilts(theta, A)
    if order is None:
        scaled = series_order(radius)[1]
    else:
        scaled = ive(_table_indices(int(order))[1], radius[:, None])
    K = scaled.shape[1] - 1
    if modes is None or modes.size < K + 1:
        modes = series_modes(density, grid, atoms, K + 1, factors)
    out = np.empty((3, theta.size))
    C = np.asarray(head.C, float)
    _series_pass(theta, radius, angle, scaled, modes, A, C, _clip_bound(head), normalised, out)
    return out[0], out[1], out[2]


@numba.njit(cache=True)
def _series_tilts(theta, A):  # pragma: no cover - compiled
    """``|A x|`` and its angle at the targets ``x = (cos theta, sin theta)`` (P,)."""
    P = theta.size
    radius, angle = np.empty(P), np.empty(P)
    for p in range(P):
        c, s = math.cos(theta[p]), math.sin(theta[p])
        c1 = A[0, 0] * c + A[0, 1] * s
        c2 = A[1, 0] * c + A[1, 1] * s
        radius[p] = math.hypot(c1, c2)
        angle[p] = math.atan2(c2, c1)
    return radius, angle


@numba.njit(cache=True)
def _linear_modes(v1, v2, re, im):  # pragma: no cover - compiled
    """The modes ``j = -3 .. 3`` (index ``j + 3``) of ``<v, y>``, ``y = (cos phi, sin
    phi)``: ``(v_1 - i v_2) / 2`` at ``j = 1``, its conjugate at ``j = -1``."""
    re[:] = 0.0
    im[:] = 0.0
    re[4], im[4] = 0.5 * v1, -0.5 * v2
    re[2], im[2] = 0.5 * v1, 0.5 * v2


@numba.njit(cache=True)
def _product_modes(are, aim, bre, bim, re, im):  # pragma: no cover - compiled
    """The modes ``j = -3 .. 3`` of the product of two trigonometric polynomials (their
    degrees add to at most 3: nothing is cut), ``sum_k a_k b_{j - k}`` in ``k`` order."""
    for j in range(-3, 4):
        sr = 0.0
        si = 0.0
        for k in range(-3, 4):
            l = j - k  # noqa: E741
            if -3 <= l <= 3:
                x, y = are[k + 3], aim[k + 3]
                u, v = bre[l + 3], bim[l + 3]
                sr += x * u - y * v
                si += x * v + y * u
        re[j + 3], im[j + 3] = sr, si


@numba.njit(cache=True)
def _series_pass(
    theta, radius, angle, scaled, modes, A, C, bound, normalised, out
):  # pragma: no cover - compiled
    """``u, u', u''`` (3, P) at the targets ``theta`` (P,) from the tilts' ``radius`` and
    ``angle``, the scaled Bessel values ``scaled[p, k] = ive(k, r_p)``, ``k = 0 .. K``, and
    the measure's ``modes`` ``c_0 ..`` (those beyond ``c_K`` unread, ``c_{-l} = conj(c_l)``).
    Per target: the integrands ``n``, ``n1 + n g1``, ``-n + 2 n1 g1 + n (g1^2 - g)``, ``1``,
    ``g1``, ``g1^2 - g`` (``g = <A x, y>``, ``g1 = <A t, y>``, ``n = <C^T t, y>``, ``n1 =
    -<C^T x, y>``) to their modes ``f_j`` exactly, the moments ``E_j = sum_{|m| <= K}
    ive(|m|, r) e^{i m psi} c_{m - j}``, ``j = 0 .. 3``, the six sums ``Re f_0 Re E_0 + 2
    ((Re f_1 E_1 + Re f_2 E_2) + Re f_3 E_3)``, and ``u = N / Z``, ``u' = N'/Z - N Z'/Z^2``,
    ``u'' = N''/Z - (2 N' Z' + N Z'')/Z^2 + 2 N Z'^2/Z^3`` with ``u`` clipped to ``+-bound``
    (unnormalised: ``N, N', N''`` times ``e^{r}``)."""
    P = theta.size
    K = scaled.shape[1] - 1
    have = min(modes.size, K + 1)
    width = 2 * K + 4  # c_l for l = -K - 3 .. K
    cre, cim = np.zeros(width), np.zeros(width)
    for l in range(have):  # noqa: E741
        cre[K + 3 + l], cim[K + 3 + l] = modes[l].real, modes[l].imag
        if l > 0:
            cre[K + 3 - l], cim[K + 3 - l] = modes[l].real, -modes[l].imag
    fre, fim = np.empty((6, 7)), np.empty((6, 7))
    gre, gim, g1re, g1im = np.empty(7), np.empty(7), np.empty(7), np.empty(7)
    nre, nim, n1re, n1im = np.empty(7), np.empty(7), np.empty(7), np.empty(7)
    wre, wim, vre, vim = np.empty(7), np.empty(7), np.empty(7), np.empty(7)
    ere, eim = np.empty(4), np.empty(4)
    tre, tim = np.empty(2 * K + 1), np.empty(2 * K + 1)
    sums = np.empty(6)
    for p in range(P):
        c, s = math.cos(theta[p]), math.sin(theta[p])
        # x = (c, s), t = (-s, c): A x, A t, C^T t, -C^T x
        _linear_modes(A[0, 0] * c + A[0, 1] * s, A[1, 0] * c + A[1, 1] * s, gre, gim)
        _linear_modes(A[0, 1] * c - A[0, 0] * s, A[1, 1] * c - A[1, 0] * s, g1re, g1im)
        _linear_modes(C[1, 0] * c - C[0, 0] * s, C[1, 1] * c - C[0, 1] * s, nre, nim)
        _linear_modes(-(C[0, 0] * c + C[1, 0] * s), -(C[0, 1] * c + C[1, 1] * s), n1re, n1im)
        _product_modes(g1re, g1im, g1re, g1im, wre, wim)  # g1^2
        for j in range(7):
            wre[j] -= gre[j]  # the curve g1^2 - g
            wim[j] -= gim[j]
        # N: n; N': n1 + n g1; N'': -n + 2 n1 g1 + n curve; Z: 1; Z': g1; Z'': curve
        for j in range(7):
            fre[0, j], fim[0, j] = nre[j], nim[j]
            fre[3, j], fim[3, j] = 0.0, 0.0
            fre[4, j], fim[4, j] = g1re[j], g1im[j]
            fre[5, j], fim[5, j] = wre[j], wim[j]
        fre[3, 3] = 1.0
        _product_modes(nre, nim, g1re, g1im, vre, vim)  # n g1
        for j in range(7):
            fre[1, j], fim[1, j] = n1re[j] + vre[j], n1im[j] + vim[j]
        _product_modes(n1re, n1im, g1re, g1im, vre, vim)  # n1 g1
        for j in range(7):
            fre[2, j], fim[2, j] = 2.0 * vre[j] - nre[j], 2.0 * vim[j] - nim[j]
        _product_modes(nre, nim, wre, wim, vre, vim)  # n curve
        for j in range(7):
            fre[2, j] += vre[j]
            fim[2, j] += vim[j]
        # the series table of this target, T_m = ive(|m|, r) e^{i m psi}, m = -K .. K
        for m in range(K + 1):
            phase = angle[p] * m
            a = scaled[p, m] * math.cos(phase)
            b = scaled[p, m] * math.sin(phase)
            tre[K + m], tim[K + m] = a, b
            tre[K - m], tim[K - m] = a, -b
        for j in range(4):  # E_j = sum_m T_m c_{m - j}
            sr = 0.0
            si = 0.0
            for i in range(2 * K + 1):  # m = i - K: c_{m - j} at index i + 3 - j
                x, y = tre[i], tim[i]
                u, v = cre[i + 3 - j], cim[i + 3 - j]
                sr += x * u - y * v
                si += x * v + y * u
            ere[j], eim[j] = sr, si
        for i in range(6):
            tail = 0.0
            for j in range(1, 4):
                tail += fre[i, j + 3] * ere[j] - fim[i, j + 3] * eim[j]
            sums[i] = fre[i, 3] * ere[0] + 2.0 * tail
        n0, n1, n2, z, z1, z2 = sums[0], sums[1], sums[2], sums[3], sums[4], sums[5]
        if not normalised:
            scale = math.exp(radius[p])
            out[0, p], out[1, p], out[2, p] = n0 * scale, n1 * scale, n2 * scale
            continue
        u = n0 / z
        zz = z * z
        du = n1 / z - n0 * z1 / zz
        d2u = n2 / z - (2.0 * n1 * z1 + n0 * z2) / zz + 2.0 * n0 * (z1 * z1) / (zz * z)
        if u < -bound:
            u = -bound
        if u > bound:
            u = bound
        out[0, p], out[1, p], out[2, p] = u, du, d2u


#: ``||C||_2`` of the last heads (head, value), kept while the head object is the same
_BOUNDS: dict[int, tuple[Head, float]] = {}


def _clip_bound(head: Head) -> float:
    """``||C||_2`` of the head (one SVD per head object, not per stage)."""
    kept = _BOUNDS.get(id(head))
    if kept is None or kept[0] is not head:
        if len(_BOUNDS) >= 8:
            _BOUNDS.clear()
        kept = (head, float(np.linalg.norm(head.C, 2)))
        _BOUNDS[id(head)] = kept
    return kept[1]
