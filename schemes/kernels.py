"""Compiled (numba) loops of the finite-volume update, one axis at a time.

Every kernel sees the density as a 3-D view ``(outer, n, inner)`` with the active axis in
the middle (``numpy.reshape`` of a C-contiguous array, no copy), so one kernel serves d = 1,
2, 3 and every axis. Faces along the active axis are numbered ``f = 0 .. n``; face ``f``
lies between cells ``f - 1`` and ``f``. Ghost cells come from an index map ``src`` of length
``n + 6``: position ``p`` holds the source cell of padded cell ``p - 3`` (periodic wrap,
mirror for no-flux, clamp for outflow), so no padded copy of the density is ever made.
``lo_zero`` / ``hi_zero`` say that the state outside the lower / upper boundary face is
vacuum (outflow: nothing comes in).
"""

from __future__ import annotations

import os

import numba as nb
import numpy as np

from .reconstruction import reconstruct

PARALLEL = True
THREADS_VARIABLE = "TPDE_NUM_THREADS"


def set_num_threads(threads: int | None = None) -> int:
    """Threads for the compiled loops; returns the number in use.

    Default (``None``): the ``TPDE_NUM_THREADS`` environment variable, else 1. One thread is
    the default because numba's parallel loops slow down badly when the cores are shared with
    other busy processes (launch and spin overheads per loop); on an idle 2-core machine two
    threads make a WENO5 step about 1.6x faster (benchmarks/advection.py). At most
    ``numba.config.NUMBA_NUM_THREADS`` (the core count unless ``NUMBA_NUM_THREADS`` is set).
    """
    if threads is None:
        threads = int(os.environ.get(THREADS_VARIABLE, "1") or 1)
    threads = max(1, min(int(threads), nb.config.NUMBA_NUM_THREADS))
    nb.set_num_threads(threads)
    return threads


set_num_threads()


@nb.njit(cache=True, inline="always")
def _boundary_face_flux(rho, src, kind, u, o, f, k, n, lo_zero, hi_zero):
    if u > 0.0:
        if lo_zero and f == 0:
            return 0.0
        return u * reconstruct(kind, rho[o, src[f], k], rho[o, src[f + 1], k],
                               rho[o, src[f + 2], k], rho[o, src[f + 3], k],
                               rho[o, src[f + 4], k])
    if u < 0.0:
        if hi_zero and f == n:
            return 0.0
        return u * reconstruct(kind, rho[o, src[f + 5], k], rho[o, src[f + 4], k],
                               rho[o, src[f + 3], k], rho[o, src[f + 2], k],
                               rho[o, src[f + 1], k])
    return 0.0


@nb.njit(cache=True, parallel=PARALLEL)
def upwind_face_flux(rho, src, kind, up, um, lo_zero, hi_zero, flux):
    """flux[o, f, k] = u * rho_upwind at the face centre (midpoint rule), u = up + um.

    rho: (O, n, I) cell averages; up >= 0, um <= 0: (O, n + 1, I) velocity parts (one of them
    is zero at every face); flux: (O, n + 1, I) output. Only the upwind state is
    reconstructed; the stencil is chosen by a select, so the inner loop vectorises.
    """
    n_out, n, n_in = rho.shape
    nf = n + 1
    if n_in == 1:  # active axis is the contiguous one: vectorise along the line
        for o in nb.prange(n_out):
            for f in range(3, n - 2):
                u = up[o, f, 0] + um[o, f, 0]
                pos = u > 0.0
                v0 = rho[o, f - 3, 0] if pos else rho[o, f + 2, 0]
                v1 = rho[o, f - 2, 0] if pos else rho[o, f + 1, 0]
                v2 = rho[o, f - 1, 0] if pos else rho[o, f, 0]
                v3 = rho[o, f, 0] if pos else rho[o, f - 1, 0]
                v4 = rho[o, f + 1, 0] if pos else rho[o, f - 2, 0]
                flux[o, f, 0] = u * reconstruct(kind, v0, v1, v2, v3, v4)
            for f in range(nf):
                if f < 3 or f >= n - 2:
                    u = up[o, f, 0] + um[o, f, 0]
                    flux[o, f, 0] = _boundary_face_flux(rho, src, kind, u, o, f, 0, n,
                                                        lo_zero, hi_zero)
        return
    for idx in nb.prange(n_out * nf):
        o = idx // nf
        f = idx - o * nf
        if (lo_zero and f == 0) or (hi_zero and f == n):
            for k in range(n_in):
                u = up[o, f, k] + um[o, f, k]
                flux[o, f, k] = _boundary_face_flux(rho, src, kind, u, o, f, k, n,
                                                    lo_zero, hi_zero)
            continue
        s0 = src[f]
        s1 = src[f + 1]
        s2 = src[f + 2]
        s3 = src[f + 3]
        s4 = src[f + 4]
        s5 = src[f + 5]
        for k in range(n_in):
            u = up[o, f, k] + um[o, f, k]
            pos = u > 0.0
            v0 = rho[o, s0, k] if pos else rho[o, s5, k]
            v1 = rho[o, s1, k] if pos else rho[o, s4, k]
            v2 = rho[o, s2, k] if pos else rho[o, s3, k]
            v3 = rho[o, s3, k] if pos else rho[o, s2, k]
            v4 = rho[o, s4, k] if pos else rho[o, s1, k]
            flux[o, f, k] = u * reconstruct(kind, v0, v1, v2, v3, v4)


@nb.njit(cache=True, parallel=PARALLEL)
def face_states(rho, src, kind, lo_zero, hi_zero, left, right):
    """Both reconstructed states at every face: left, right of shape (O, n + 1, I)."""
    n_out, n, n_in = rho.shape
    nf = n + 1
    for idx in nb.prange(n_out * nf):
        o = idx // nf
        f = idx - o * nf
        s0 = src[f]
        s1 = src[f + 1]
        s2 = src[f + 2]
        s3 = src[f + 3]
        s4 = src[f + 4]
        s5 = src[f + 5]
        zl = lo_zero and f == 0
        zr = hi_zero and f == n
        for k in range(n_in):
            if zl:
                left[o, f, k] = 0.0
            else:
                left[o, f, k] = reconstruct(kind, rho[o, s0, k], rho[o, s1, k],
                                            rho[o, s2, k], rho[o, s3, k], rho[o, s4, k])
            if zr:
                right[o, f, k] = 0.0
            else:
                right[o, f, k] = reconstruct(kind, rho[o, s5, k], rho[o, s4, k],
                                             rho[o, s3, k], rho[o, s2, k], rho[o, s1, k])


@nb.njit(cache=True, parallel=PARALLEL)
def subtract_divergence(flux, coef, out):
    """out[o, i, k] -= coef * (flux[o, i + 1, k] - flux[o, i, k])."""
    n_out, n, n_in = out.shape
    if n_in == 1:
        for o in nb.prange(n_out):
            for i in range(n):
                out[o, i, 0] -= coef * (flux[o, i + 1, 0] - flux[o, i, 0])
        return
    for idx in nb.prange(n_out * n):
        o = idx // n
        i = idx - o * n
        for k in range(n_in):
            out[o, i, k] -= coef * (flux[o, i + 1, k] - flux[o, i, k])


@nb.njit(cache=True, inline="always")
def _low_flux(rho, src, up, um, lo_zero, hi_zero, o, f, k, n):
    value = 0.0
    if not (lo_zero and f == 0):
        value += up[o, f, k] * rho[o, src[f + 2], k]
    if not (hi_zero and f == n):
        value += um[o, f, k] * rho[o, src[f + 3], k]
    return value


@nb.njit(cache=True, parallel=PARALLEL)
def split_low_flux(flux, rho, src, up, um, lo_zero, hi_zero, low_flux):
    """low_flux = first-order upwind flux up rho_l + um rho_r; flux -= low_flux (in place).

    After the call ``flux`` holds the antidiffusive correction A = F_high - F_low.
    """
    n_out, n, n_in = rho.shape
    nf = n + 1
    if n_in == 1:
        for o in nb.prange(n_out):
            for f in range(1, n):
                low = up[o, f, 0] * rho[o, f - 1, 0] + um[o, f, 0] * rho[o, f, 0]
                low_flux[o, f, 0] = low
                flux[o, f, 0] -= low
            for f in (0, n):
                low = _low_flux(rho, src, up, um, lo_zero, hi_zero, o, f, 0, n)
                low_flux[o, f, 0] = low
                flux[o, f, 0] -= low
        return
    for idx in nb.prange(n_out * nf):
        o = idx // nf
        f = idx - o * nf
        if f == 0 or f == n:
            for k in range(n_in):
                low = _low_flux(rho, src, up, um, lo_zero, hi_zero, o, f, k, n)
                low_flux[o, f, k] = low
                flux[o, f, k] -= low
            continue
        for k in range(n_in):
            low = up[o, f, k] * rho[o, f - 1, k] + um[o, f, k] * rho[o, f, k]
            low_flux[o, f, k] = low
            flux[o, f, k] -= low


@nb.njit(cache=True, parallel=PARALLEL)
def accumulate_low_and_outgoing(low_flux, anti, coef, low, out_sum):
    """low -= coef div F_low;  out_sum += coef (max(A_{i+1/2}, 0) - min(A_{i-1/2}, 0))."""
    n_out, n, n_in = low.shape
    if n_in == 1:
        for o in nb.prange(n_out):
            for i in range(n):
                low[o, i, 0] -= coef * (low_flux[o, i + 1, 0] - low_flux[o, i, 0])
                out_sum[o, i, 0] += coef * (max(anti[o, i + 1, 0], 0.0)
                                            - min(anti[o, i, 0], 0.0))
        return
    for idx in nb.prange(n_out * n):
        o = idx // n
        i = idx - o * n
        for k in range(n_in):
            low[o, i, k] -= coef * (low_flux[o, i + 1, k] - low_flux[o, i, k])
            out_sum[o, i, k] += coef * (max(anti[o, i + 1, k], 0.0) - min(anti[o, i, k], 0.0))


@nb.njit(cache=True, parallel=PARALLEL)
def limit_fluxes(low_flux, anti, ratio, periodic):
    """anti <- F_low + C A with C the ratio of the cell the correction A drains.

    ratio: (O, n, I) in [0, 1]. Outside a non-periodic boundary the correction may not
    bring mass in (C = 0 there). On return ``anti`` holds the limited flux.
    """
    n_out, n1, n_in = anti.shape
    n = n1 - 1
    if n_in == 1:
        for o in nb.prange(n_out):
            for f in range(1, n):
                a = anti[o, f, 0]
                c = ratio[o, f - 1, 0] if a > 0.0 else ratio[o, f, 0]
                anti[o, f, 0] = low_flux[o, f, 0] + c * a
            for f in (0, n):
                a = anti[o, f, 0]
                if f == 0:
                    if a > 0.0:
                        c = ratio[o, n - 1, 0] if periodic else 0.0
                    else:
                        c = ratio[o, 0, 0]
                else:
                    if a > 0.0:
                        c = ratio[o, n - 1, 0]
                    else:
                        c = ratio[o, 0, 0] if periodic else 0.0
                anti[o, f, 0] = low_flux[o, f, 0] + c * a
        return
    for idx in nb.prange(n_out * n1):
        o = idx // n1
        f = idx - o * n1
        for k in range(n_in):
            a = anti[o, f, k]
            if a > 0.0:  # drains the left cell f - 1
                if f == 0:
                    c = ratio[o, n - 1, k] if periodic else 0.0
                else:
                    c = ratio[o, f - 1, k]
            else:  # drains the right cell f
                if f == n:
                    c = ratio[o, 0, k] if periodic else 0.0
                else:
                    c = ratio[o, f, k]
            anti[o, f, k] = low_flux[o, f, k] + c * a


@nb.njit(cache=True)
def positivity_ratio(low, out_sum, ratio):
    """ratio = min(1, low / out_sum) where out_sum > low (flat arrays); returns min(low)."""
    lowest = np.inf
    for i in range(low.size):
        lo = low[i]
        if lo < lowest:
            lowest = lo
        if lo < 0.0:
            lo = 0.0
        p = out_sum[i]
        ratio[i] = lo / p if p > lo else 1.0
    return lowest


@nb.njit(cache=True, parallel=PARALLEL)
def axpy(out, alpha, x):
    """out += alpha * x (flat arrays), without a temporary."""
    for i in nb.prange(out.size):
        out[i] += alpha * x[i]


@nb.njit(cache=True)
def all_finite(x):
    """True when every entry of the flat array x is finite."""
    for i in range(x.size):
        if not np.isfinite(x[i]):
            return False
    return True


@nb.njit(cache=True, parallel=PARALLEL)
def transverse_points(face, src, weights, out):
    """Point values at 3 transverse offsets from line averages along the middle axis.

    face: (O, n, I) face states viewed with the transverse axis in the middle; src: (n + 6,)
    ghost index map of that axis; weights: (3, 5) average-to-point weights of the stencil
    j-2 .. j+2; out: (3, O, n, I).
    """
    n_out, n, n_in = face.shape
    for idx in nb.prange(n_out * n):
        o = idx // n
        j = idx - o * n
        s0 = src[j + 1]
        s1 = src[j + 2]
        s2 = src[j + 3]
        s3 = src[j + 4]
        s4 = src[j + 5]
        for k in range(n_in):
            v0 = face[o, s0, k]
            v1 = face[o, s1, k]
            v2 = face[o, s2, k]
            v3 = face[o, s3, k]
            v4 = face[o, s4, k]
            for g in range(3):
                out[g, o, j, k] = (weights[g, 0] * v0 + weights[g, 1] * v1 + weights[g, 2] * v2
                                   + weights[g, 3] * v3 + weights[g, 4] * v4)


@nb.njit(cache=True, parallel=PARALLEL)
def gauss_flux(velocity, left, right, weights, flux):
    """flux = sum_g w_g (max(u_g, 0) left_g + min(u_g, 0) right_g); (q, m) inputs, (m,) out."""
    q, m = velocity.shape
    for i in nb.prange(m):
        acc = 0.0
        for g in range(q):
            u = velocity[g, i]
            acc += weights[g] * (max(u, 0.0) * left[g, i] + min(u, 0.0) * right[g, i])
        flux[i] = acc
