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

from typing import Any

import numba as nb
import numpy as np

from .reconstruction import (
    FAST,
    MUSCL_MC,
    MUSCL_MINMOD,
    MUSCL_VANLEER,
    WENO5_JS,
    WENO5_Z,
    muscl_mc,
    muscl_minmod,
    muscl_vanleer,
    reconstruct,
    upwind,
    weno5_js,
    weno5_z,
)

PARALLEL = True
#: error_model="numpy": no Python ZeroDivisionError checks, which would stop LLVM from
#: vectorising every loop that divides (WENO weights); fast-math flags as for the
#: reconstructions (no NaN/Inf assumptions).
JIT: dict[str, Any] = {"cache": True, "error_model": "numpy", "fastmath": FAST}


@nb.njit(inline="always", **JIT)
def _boundary_face_flux(rho, src, kind, u, o, f, k, n, lo_zero, hi_zero):
    if u > 0.0:
        if lo_zero and f == 0:
            return 0.0
        return u * reconstruct(
            kind,
            rho[o, src[f], k],
            rho[o, src[f + 1], k],
            rho[o, src[f + 2], k],
            rho[o, src[f + 3], k],
            rho[o, src[f + 4], k],
        )
    if u < 0.0:
        if hi_zero and f == n:
            return 0.0
        return u * reconstruct(
            kind,
            rho[o, src[f + 5], k],
            rho[o, src[f + 4], k],
            rho[o, src[f + 3], k],
            rho[o, src[f + 2], k],
            rho[o, src[f + 1], k],
        )
    return 0.0


@nb.njit(inline="always", **JIT)
def _upwind_line(recon, a0, a1, a2, a3, a4, a5, u_pos, u_neg, out):
    """out[i] = u * recon(upwind stencil): a0..a5 are cells f-3 .. f+2 of face i.

    Lines where the velocity has one sign (the common case) skip the stencil select.
    """
    size = out.size
    inflow_left = 0.0
    inflow_right = 0.0
    for i in range(size):
        inflow_left += u_pos[i]
        inflow_right -= u_neg[i]
    if inflow_right == 0.0:
        for i in range(size):
            out[i] = u_pos[i] * recon(a0[i], a1[i], a2[i], a3[i], a4[i])
        return
    if inflow_left == 0.0:
        for i in range(size):
            out[i] = u_neg[i] * recon(a5[i], a4[i], a3[i], a2[i], a1[i])
        return
    for i in range(size):
        u = u_pos[i] + u_neg[i]
        pos = u > 0.0
        v0 = a0[i] if pos else a5[i]
        v1 = a1[i] if pos else a4[i]
        v2 = a2[i] if pos else a3[i]
        v3 = a3[i] if pos else a2[i]
        v4 = a4[i] if pos else a1[i]
        out[i] = u * recon(v0, v1, v2, v3, v4)


@nb.njit(inline="always", **JIT)
def _states_line(recon, a0, a1, a2, a3, a4, a5, left, right):
    """left[i] = recon(a0..a4), right[i] = recon(a5..a1): both states at face i."""
    for i in range(left.size):
        left[i] = recon(a0[i], a1[i], a2[i], a3[i], a4[i])
        right[i] = recon(a5[i], a4[i], a3[i], a2[i], a1[i])


@nb.njit(**JIT)
def upwind_line(kind, a0, a1, a2, a3, a4, a5, u_pos, u_neg, out):
    """_upwind_line specialised for the reconstruction numbered kind."""
    if kind == WENO5_Z:
        _upwind_line(weno5_z, a0, a1, a2, a3, a4, a5, u_pos, u_neg, out)
    elif kind == WENO5_JS:
        _upwind_line(weno5_js, a0, a1, a2, a3, a4, a5, u_pos, u_neg, out)
    elif kind == MUSCL_MINMOD:
        _upwind_line(muscl_minmod, a0, a1, a2, a3, a4, a5, u_pos, u_neg, out)
    elif kind == MUSCL_MC:
        _upwind_line(muscl_mc, a0, a1, a2, a3, a4, a5, u_pos, u_neg, out)
    elif kind == MUSCL_VANLEER:
        _upwind_line(muscl_vanleer, a0, a1, a2, a3, a4, a5, u_pos, u_neg, out)
    else:
        _upwind_line(upwind, a0, a1, a2, a3, a4, a5, u_pos, u_neg, out)


@nb.njit(**JIT)
def states_line(kind, a0, a1, a2, a3, a4, a5, left, right):
    """_states_line specialised for the reconstruction numbered kind."""
    if kind == WENO5_Z:
        _states_line(weno5_z, a0, a1, a2, a3, a4, a5, left, right)
    elif kind == WENO5_JS:
        _states_line(weno5_js, a0, a1, a2, a3, a4, a5, left, right)
    elif kind == MUSCL_MINMOD:
        _states_line(muscl_minmod, a0, a1, a2, a3, a4, a5, left, right)
    elif kind == MUSCL_MC:
        _states_line(muscl_mc, a0, a1, a2, a3, a4, a5, left, right)
    elif kind == MUSCL_VANLEER:
        _states_line(muscl_vanleer, a0, a1, a2, a3, a4, a5, left, right)
    else:
        _states_line(upwind, a0, a1, a2, a3, a4, a5, left, right)


@nb.njit(parallel=PARALLEL, **JIT)
def upwind_face_flux(rho, src, kind, up, um, lo_zero, hi_zero, flux):
    """flux[o, f, k] = u * rho_upwind at the face centre (midpoint rule), u = up + um.

    rho: (O, n, I) cell averages; up >= 0, um <= 0: (O, n + 1, I) velocity parts (one of them
    is zero at every face); flux: (O, n + 1, I) output. Only the upwind state is
    reconstructed; the stencil is chosen by a select, so the inner loop vectorises.
    """
    n_out, n, n_in = rho.shape
    nf = n + 1
    if n_in == 1:  # active axis is the contiguous one: vectorise along the line
        m = n - 5  # interior faces f = 3 .. n - 3 (stencils need no ghosts)
        rho2 = rho.reshape(n_out, n)  # 2-D C-contiguous: unit-stride rows for LLVM
        up2 = up.reshape(n_out, nf)
        um2 = um.reshape(n_out, nf)
        flux2 = flux.reshape(n_out, nf)
        for o in nb.prange(n_out):
            line = rho2[o]
            upwind_line(
                kind,
                line[0:m],
                line[1 : m + 1],
                line[2 : m + 2],
                line[3 : m + 3],
                line[4 : m + 4],
                line[5 : m + 5],
                up2[o, 3 : m + 3],
                um2[o, 3 : m + 3],
                flux2[o, 3 : m + 3],
            )
            for f in range(nf):
                if f < 3 or f >= n - 2:
                    u = up[o, f, 0] + um[o, f, 0]
                    flux[o, f, 0] = _boundary_face_flux(
                        rho, src, kind, u, o, f, 0, n, lo_zero, hi_zero
                    )
        return
    for idx in nb.prange(n_out * nf):
        o = idx // nf
        f = idx - o * nf
        if (lo_zero and f == 0) or (hi_zero and f == n):
            for k in range(n_in):
                u = up[o, f, k] + um[o, f, k]
                flux[o, f, k] = _boundary_face_flux(rho, src, kind, u, o, f, k, n, lo_zero, hi_zero)
            continue
        upwind_line(
            kind,
            rho[o, src[f]],
            rho[o, src[f + 1]],
            rho[o, src[f + 2]],
            rho[o, src[f + 3]],
            rho[o, src[f + 4]],
            rho[o, src[f + 5]],
            up[o, f],
            um[o, f],
            flux[o, f],
        )


@nb.njit(parallel=PARALLEL, **JIT)
def face_states(rho, src, kind, lo_zero, hi_zero, left, right):
    """Both reconstructed states at every face: left, right of shape (O, n + 1, I).

    The state outside an outflow boundary (left of face 0, right of face n) is vacuum.
    """
    n_out, n, n_in = rho.shape
    nf = n + 1
    if n_in == 1:
        m = n - 5
        rho2 = rho.reshape(n_out, n)
        left2 = left.reshape(n_out, nf)
        right2 = right.reshape(n_out, nf)
        for o in nb.prange(n_out):
            line = rho2[o]
            states_line(
                kind,
                line[0:m],
                line[1 : m + 1],
                line[2 : m + 2],
                line[3 : m + 3],
                line[4 : m + 4],
                line[5 : m + 5],
                left2[o, 3 : m + 3],
                right2[o, 3 : m + 3],
            )
            for f in range(nf):
                if f < 3 or f >= n - 2:
                    s = src[f : f + 6]
                    left[o, f, 0] = reconstruct(
                        kind, line[s[0]], line[s[1]], line[s[2]], line[s[3]], line[s[4]]
                    )
                    right[o, f, 0] = reconstruct(
                        kind, line[s[5]], line[s[4]], line[s[3]], line[s[2]], line[s[1]]
                    )
            if lo_zero:
                left[o, 0, 0] = 0.0
            if hi_zero:
                right[o, n, 0] = 0.0
        return
    for idx in nb.prange(n_out * nf):
        o = idx // nf
        f = idx - o * nf
        states_line(
            kind,
            rho[o, src[f]],
            rho[o, src[f + 1]],
            rho[o, src[f + 2]],
            rho[o, src[f + 3]],
            rho[o, src[f + 4]],
            rho[o, src[f + 5]],
            left[o, f],
            right[o, f],
        )
        if lo_zero and f == 0:
            left[o, f, :] = 0.0
        if hi_zero and f == n:
            right[o, f, :] = 0.0


@nb.njit(parallel=PARALLEL, **JIT)
def subtract_divergence(flux, coef, out):
    """out[o, i, k] -= coef * (flux[o, i + 1, k] - flux[o, i, k])."""
    n_out, n, n_in = out.shape
    if n_in == 1:
        for o in nb.prange(n_out):
            right = flux[o, 1 : n + 1, 0]
            left = flux[o, 0:n, 0]
            cells = out[o, :, 0]
            for i in range(n):
                cells[i] -= coef * (right[i] - left[i])
        return
    for idx in nb.prange(n_out * n):
        o = idx // n
        i = idx - o * n
        right = flux[o, i + 1]
        left = flux[o, i]
        cells = out[o, i]
        for k in range(n_in):
            cells[k] -= coef * (right[k] - left[k])


@nb.njit(inline="always", **JIT)
def _split_line(left, right, u_pos, u_neg, anti, low_out, use_left, use_right):
    """low = use_left up rho_l + use_right um rho_r; anti -= low (faces of one line)."""
    for i in range(anti.size):
        low = use_left * u_pos[i] * left[i] + use_right * u_neg[i] * right[i]
        low_out[i] = low
        anti[i] -= low


@nb.njit(parallel=PARALLEL, **JIT)
def split_low_flux(flux, rho, src, up, um, lo_zero, hi_zero, low_flux):
    """low_flux = first-order upwind flux up rho_l + um rho_r; flux -= low_flux (in place).

    After the call ``flux`` holds the antidiffusive correction A = F_high - F_low. Outside
    an outflow boundary the state is vacuum.
    """
    n_out, n, n_in = rho.shape
    nf = n + 1
    if n_in == 1:
        rho2 = rho.reshape(n_out, n)
        up2, um2 = up.reshape(n_out, nf), um.reshape(n_out, nf)
        flux2, low2 = flux.reshape(n_out, nf), low_flux.reshape(n_out, nf)
        for o in nb.prange(n_out):
            line = rho2[o]
            _split_line(
                line[0 : n - 1],
                line[1:n],
                up2[o, 1:n],
                um2[o, 1:n],
                flux2[o, 1:n],
                low2[o, 1:n],
                1.0,
                1.0,
            )
            for f in (0, n):
                use_left = 0.0 if (lo_zero and f == 0) else 1.0
                use_right = 0.0 if (hi_zero and f == n) else 1.0
                low = (
                    use_left * up2[o, f] * line[src[f + 2]]
                    + use_right * um2[o, f] * line[src[f + 3]]
                )
                low2[o, f] = low
                flux2[o, f] -= low
        return
    for idx in nb.prange(n_out * nf):
        o = idx // nf
        f = idx - o * nf
        use_left = 0.0 if (lo_zero and f == 0) else 1.0
        use_right = 0.0 if (hi_zero and f == n) else 1.0
        _split_line(
            rho[o, src[f + 2]],
            rho[o, src[f + 3]],
            up[o, f],
            um[o, f],
            flux[o, f],
            low_flux[o, f],
            use_left,
            use_right,
        )


@nb.njit(inline="always", **JIT)
def _accumulate_line(low_right, low_left, anti_right, anti_left, coef, low, out_sum):
    for i in range(low.size):
        low[i] -= coef * (low_right[i] - low_left[i])
        out_sum[i] += coef * (max(anti_right[i], 0.0) - min(anti_left[i], 0.0))


@nb.njit(parallel=PARALLEL, **JIT)
def accumulate_low_and_outgoing(low_flux, anti, coef, low, out_sum):
    """low -= coef div F_low;  out_sum += coef (max(A_{i+1/2}, 0) - min(A_{i-1/2}, 0))."""
    n_out, n, n_in = low.shape
    if n_in == 1:
        nf = n + 1
        lf2, an2 = low_flux.reshape(n_out, nf), anti.reshape(n_out, nf)
        low2, out2 = low.reshape(n_out, n), out_sum.reshape(n_out, n)
        for o in nb.prange(n_out):
            _accumulate_line(
                lf2[o, 1:nf], lf2[o, 0:n], an2[o, 1:nf], an2[o, 0:n], coef, low2[o], out2[o]
            )
        return
    for idx in nb.prange(n_out * n):
        o = idx // n
        i = idx - o * n
        _accumulate_line(
            low_flux[o, i + 1],
            low_flux[o, i],
            anti[o, i + 1],
            anti[o, i],
            coef,
            low[o, i],
            out_sum[o, i],
        )


@nb.njit(inline="always", **JIT)
def _limit_line(low_flux, anti, ratio_left, ratio_right):
    """anti <- low + C anti, C = ratio_left where anti > 0 (drains the left cell) else right."""
    for i in range(anti.size):
        a = anti[i]
        c = ratio_left[i] if a > 0.0 else ratio_right[i]
        anti[i] = low_flux[i] + c * a


@nb.njit(parallel=PARALLEL, **JIT)
def limit_fluxes(low_flux, anti, ratio, periodic):
    """anti <- F_low + C A with C the ratio of the cell the correction A drains.

    ratio: (O, n, I) in [0, 1]. Outside a non-periodic boundary the correction may not
    bring mass in (C = 0 there). On return ``anti`` holds the limited flux.
    """
    n_out, n1, n_in = anti.shape
    n = n1 - 1
    if n_in == 1:
        lf2, an2, ra2 = (
            low_flux.reshape(n_out, n1),
            anti.reshape(n_out, n1),
            ratio.reshape(n_out, n),
        )
        for o in nb.prange(n_out):
            _limit_line(lf2[o, 1:n], an2[o, 1:n], ra2[o, 0 : n - 1], ra2[o, 1:n])
            wrap = 1.0 if periodic else 0.0  # beyond a non-periodic face: no correction
            a = an2[o, 0]  # face 0: left cell n - 1 (periodic) / outside, right cell 0
            an2[o, 0] = lf2[o, 0] + (wrap * ra2[o, n - 1] if a > 0.0 else ra2[o, 0]) * a
            a = an2[o, n]  # face n: left cell n - 1, right cell 0 (periodic) / outside
            an2[o, n] = lf2[o, n] + (ra2[o, n - 1] if a > 0.0 else wrap * ra2[o, 0]) * a
        return
    for idx in nb.prange(n_out * n1):
        o = idx // n1
        f = idx - o * n1
        if 0 < f < n:
            _limit_line(low_flux[o, f], anti[o, f], ratio[o, f - 1], ratio[o, f])
            continue
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


@nb.njit(parallel=PARALLEL, **JIT)
def positivity_ratio(low, out_sum, ratio):
    """ratio = min(1, max(low, 0) / out_sum) (flat arrays); returns min(low)."""
    lowest = np.inf
    for i in nb.prange(low.size):
        lo = low[i]
        lowest = min(lowest, lo)
        lo = max(lo, 0.0)
        p = out_sum[i]
        ratio[i] = lo / p if p > lo else 1.0
    return lowest


@nb.njit(parallel=PARALLEL, **JIT)
def signed_sums(x):
    """(sum of -x over the negative entries, sum of x over the others) of a flat array."""
    negative = 0.0
    total = 0.0
    for i in nb.prange(x.size):  # (branch-free: vectorised)
        v = x[i]
        negative += min(v, 0.0)
        total += v
    return -negative, total - negative


@nb.njit(parallel=PARALLEL, **JIT)
def axpy(out, alpha, x):
    """out += alpha * x (flat arrays), without a temporary."""
    for i in nb.prange(out.size):
        out[i] += alpha * x[i]


@nb.njit(**JIT)
def all_finite(x):
    """True when every entry of the flat array x is finite."""
    for i in range(x.size):
        if not np.isfinite(x[i]):
            return False
    return True


@nb.njit(inline="always", **JIT)
def _transverse_line(weights, v0, v1, v2, v3, v4, out0, out1, out2):
    """Three point values from five line averages (rows of the (3, 5) weight table)."""
    for k in range(out0.size):
        out0[k] = (
            weights[0, 0] * v0[k]
            + weights[0, 1] * v1[k]
            + weights[0, 2] * v2[k]
            + weights[0, 3] * v3[k]
            + weights[0, 4] * v4[k]
        )
        out1[k] = (
            weights[1, 0] * v0[k]
            + weights[1, 1] * v1[k]
            + weights[1, 2] * v2[k]
            + weights[1, 3] * v3[k]
            + weights[1, 4] * v4[k]
        )
        out2[k] = (
            weights[2, 0] * v0[k]
            + weights[2, 1] * v1[k]
            + weights[2, 2] * v2[k]
            + weights[2, 3] * v3[k]
            + weights[2, 4] * v4[k]
        )


@nb.njit(parallel=PARALLEL, **JIT)
def transverse_points(face, src, weights, out):
    """Point values at 3 transverse offsets from line averages along the middle axis.

    face: (O, n, I) face states viewed with the transverse axis in the middle; src: (n + 6,)
    ghost index map of that axis; weights: (3, 5) average-to-point weights of the stencil
    j-2 .. j+2; out: (3, O, n, I).
    """
    n_out, n, n_in = face.shape
    if n_in == 1:  # transverse axis contiguous: vectorise along it
        m = n - 4
        face2 = face.reshape(n_out, n)
        out2 = out.reshape(3, n_out, n)
        for o in nb.prange(n_out):
            line = face2[o]
            _transverse_line(
                weights,
                line[0:m],
                line[1 : m + 1],
                line[2 : m + 2],
                line[3 : m + 3],
                line[4 : m + 4],
                out2[0, o, 2 : m + 2],
                out2[1, o, 2 : m + 2],
                out2[2, o, 2 : m + 2],
            )
            for j in (0, 1, n - 2, n - 1):
                s = src[j + 1 : j + 6]
                _transverse_line(
                    weights,
                    line[s[0] : s[0] + 1],
                    line[s[1] : s[1] + 1],
                    line[s[2] : s[2] + 1],
                    line[s[3] : s[3] + 1],
                    line[s[4] : s[4] + 1],
                    out2[0, o, j : j + 1],
                    out2[1, o, j : j + 1],
                    out2[2, o, j : j + 1],
                )
        return
    for idx in nb.prange(n_out * n):
        o = idx // n
        j = idx - o * n
        _transverse_line(
            weights,
            face[o, src[j + 1]],
            face[o, src[j + 2]],
            face[o, src[j + 3]],
            face[o, src[j + 4]],
            face[o, src[j + 5]],
            out[0, o, j],
            out[1, o, j],
            out[2, o, j],
        )


@nb.njit(parallel=PARALLEL, **JIT)
def gauss_flux(velocity, left, right, weights, flux):
    """flux = sum_g w_g (max(u_g, 0) left_g + min(u_g, 0) right_g); (q, m) inputs, (m,) out."""
    q, m = velocity.shape
    chunk = 4096
    for c in nb.prange((m + chunk - 1) // chunk):
        lo = c * chunk
        hi = min(m, lo + chunk)
        out = flux[lo:hi]
        out[:] = 0.0
        for g in range(q):
            w = weights[g]
            u = velocity[g, lo:hi]
            left_g = left[g, lo:hi]
            right_g = right[g, lo:hi]
            for i in range(hi - lo):
                out[i] += w * (max(u[i], 0.0) * left_g[i] + min(u[i], 0.0) * right_g[i])


#: points of the Lagrange stencils of :func:`interpolate_points` (a compile-time constant:
#: fixed trip counts let LLVM unroll and vectorise the loops, which a runtime order prevents;
#: benchmarks/step.py times the step these kernels serve)
POINT_ORDER = 8


@nb.njit(parallel=PARALLEL, **JIT)
def interpolate_points(values, first, weights, out):
    """Point values at shifted positions along the middle axis (Lagrange, one-sided at ends).

    values: (O, n, I); first: (q, n) first stencil point of target (g, j); weights:
    (q, n, POINT_ORDER); out: (q, O, n, I), out[g, o, j, i] = sum_k weights[g, j, k]
    values[o, first[g, j] + k, i].
    """
    if weights.shape[2] != POINT_ORDER:
        raise ValueError("interpolate_points: weights must have POINT_ORDER columns")
    q = first.shape[0]
    n_out, n, n_in = values.shape
    for idx in nb.prange(q * n_out):
        g = idx // n_out
        o = idx - g * n_out
        w = weights[g]
        f = first[g]
        if n_in == 1:
            line = values[o, :, 0]
            target = out[g, o, :, 0]
            for j in range(n):
                acc = 0.0
                for k in range(POINT_ORDER):
                    acc += w[j, k] * line[f[j] + k]
                target[j] = acc
            continue
        for j in range(n):
            # stencil point outermost, the contiguous inner axis innermost (vectorised; the
            # sum runs over k in the same order as the line case)
            target = out[g, o, j]
            wj = w[j]
            fj = f[j]
            target[:] = 0.0
            for k in range(POINT_ORDER):
                wk = wj[k]
                row = values[o, fj + k]
                for i in range(n_in):
                    target[i] += wk * row[i]


@nb.njit(parallel=PARALLEL, **JIT)
def split_node_means(values, weights, positive, negative):
    """Quadrature means of u^+ and u^- over the q nodes of each face; False on a NaN / Inf.

    values: (q, F); weights: (q,); positive, negative: (F,) outputs.
    """
    q, faces = values.shape
    bad = 0
    for f in nb.prange(faces):
        up = 0.0
        down = 0.0
        for g in range(q):
            v = values[g, f]
            if not np.isfinite(v):
                bad += 1
            if v > 0.0:
                up += weights[g] * v
            else:
                down += weights[g] * v
        positive[f] = up
        negative[f] = down
    return bad == 0


#: the seventh-order linear upwind face value from the cell averages j-3 .. j+3 (face j + 1/2)
SEVENTH_ORDER = np.array([-3.0, 25.0, -101.0, 319.0, 214.0, -38.0, 4.0]) / 420.0


@nb.njit(parallel=PARALLEL, **JIT)
def seventh_order_flux_error(rho, src4, left, right, u, inv_h, vacuum, out):
    """out[o, f, k] = u (q - q7) / h at every face (the resolution monitor's flux error):
    q the scheme's upwind state (``left`` where u > 0, else ``right``), q7 the seventh-order
    linear upwind value of the cell averages (cells f-4 .. f+2 from the left, f+3 .. f-3
    from the right). Ghosts come from ``src4`` (length n + 8: position p holds the source of
    padded cell p - 4); ``vacuum``: the inflow side of a boundary face is vacuum (the
    scheme's boundary condition, no reconstruction error: 0). Shapes: rho (O, n, I); left,
    right, u, out (O, n + 1, I)."""
    n_out, n, n_in = rho.shape
    for o in nb.prange(n_out):
        for f in range(n + 1):
            s = src4[f : f + 8]
            for k in range(n_in):
                velocity = u[o, f, k]
                from_left = velocity > 0.0
                q7 = 0.0
                for j in range(7):  # (from the right: the stencil mirrored)
                    q7 += SEVENTH_ORDER[j] * rho[o, s[j] if from_left else s[7 - j], k]
                if from_left:
                    error = 0.0 if vacuum and f == 0 else left[o, f, k] - q7
                else:
                    error = 0.0 if vacuum and f == n else right[o, f, k] - q7
                out[o, f, k] = velocity * error * inv_h
