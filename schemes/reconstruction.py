"""One-dimensional reconstructions of face values from cell averages.

Every reconstruction is a scalar numba function ``recon(v0, v1, v2, v3, v4) -> value`` that
returns the *left* state at the face ``i + 1/2`` from the averages of cells ``i-2 .. i+2``
(``v2`` is cell ``i``). The right state at the same face is the mirror image,
``recon(v_{i+3}, v_{i+2}, v_{i+1}, v_i, v_{i-1})``. A new reconstruction is one function,
one line in :data:`RECONSTRUCTIONS`, and one branch in each dispatcher: :func:`reconstruct`
here and the two line dispatchers of ``kernels.py``.

The compiled kernels take an integer ``kind`` rather than the function: numba cannot cache
kernels whose signature (or a value they pass around) holds a function. The hot loops are
specialised per reconstruction by an explicit branch *outside* the loop (a branch inside
stops LLVM from vectorising it); scalar boundary code uses :func:`reconstruct`.

References
----------
* G.-S. Jiang, C.-W. Shu, J. Comput. Phys. 126 (1996) 202 (WENO5-JS).
* R. Borges, M. Carmona, B. Costa, W. S. Don, J. Comput. Phys. 227 (2008) 3191 (WENO5-Z);
  M. Castro, B. Costa, W. S. Don, J. Comput. Phys. 230 (2011) 1766 (power p = 2).
* A. K. Henrick, T. D. Aslam, J. M. Powers, J. Comput. Phys. 207 (2005) 542 (order loss of
  WENO5-JS at critical points).
* B. van Leer, J. Comput. Phys. 32 (1979) 101 (MUSCL); limiters minmod, MC, van Leer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numba as nb

#: WENO regularisation. Tiny and scale free: densities span many decades (Gaussian tails), so
#: an absolute epsilon such as 1e-6 would switch WENO off wherever the density is small and
#: hides the order loss of WENO5-JS at critical points. SharpClaw uses 1e-36.
WENO_EPS = 1e-40

#: LLVM fast-math flags for the reconstructions: reassociation, reciprocal and contraction
#: (vectorised divisions), but no "no-NaN / no-Inf" assumptions, so a NaN still propagates
#: to the solver's finiteness check instead of being optimised away.
FAST = {"nsz", "arcp", "contract", "reassoc"}


@nb.njit(cache=True, inline="always", fastmath=FAST)
def upwind(v0, v1, v2, v3, v4):
    """First order: the face value is the upwind cell average."""
    return v2


@nb.njit(cache=True, inline="always", fastmath=FAST)
def _minmod2(a, b):
    if a * b <= 0.0:
        return 0.0
    return a if abs(a) < abs(b) else b


@nb.njit(cache=True, inline="always", fastmath=FAST)
def muscl_minmod(v0, v1, v2, v3, v4):
    """MUSCL, slope = minmod(backward, forward) difference; TVD."""
    return v2 + 0.5 * _minmod2(v2 - v1, v3 - v2)


@nb.njit(cache=True, inline="always", fastmath=FAST)
def muscl_mc(v0, v1, v2, v3, v4):
    """MUSCL, monotonised-central slope minmod(2 a, 2 b, (a + b) / 2); TVD."""
    a = v2 - v1
    b = v3 - v2
    if a * b <= 0.0:
        return v2
    s = min(2.0 * abs(a), 2.0 * abs(b), 0.5 * abs(a + b))
    return v2 + (0.5 * s if a > 0.0 else -0.5 * s)


@nb.njit(cache=True, inline="always", fastmath=FAST)
def muscl_vanleer(v0, v1, v2, v3, v4):
    """MUSCL, van Leer's harmonic slope 2 a b / (a + b) when a b > 0; TVD."""
    a = v2 - v1
    b = v3 - v2
    if a * b <= 0.0:
        return v2
    return v2 + a * b / (a + b)


@nb.njit(cache=True, inline="always", fastmath=FAST)
def _weno5_parts(v0, v1, v2, v3, v4):
    q0 = (2.0 * v0 - 7.0 * v1 + 11.0 * v2) / 6.0
    q1 = (-v1 + 5.0 * v2 + 2.0 * v3) / 6.0
    q2 = (2.0 * v2 + 5.0 * v3 - v4) / 6.0
    a = v0 - 2.0 * v1 + v2
    b = v0 - 4.0 * v1 + 3.0 * v2
    b0 = 13.0 / 12.0 * a * a + 0.25 * b * b
    a = v1 - 2.0 * v2 + v3
    b = v1 - v3
    b1 = 13.0 / 12.0 * a * a + 0.25 * b * b
    a = v2 - 2.0 * v3 + v4
    b = 3.0 * v2 - 4.0 * v3 + v4
    b2 = 13.0 / 12.0 * a * a + 0.25 * b * b
    return q0, q1, q2, b0, b1, b2


@nb.njit(cache=True, inline="always", fastmath=FAST)
def weno5_js(v0, v1, v2, v3, v4):
    """WENO5 of Jiang and Shu: weights d_k / (eps + beta_k)^2, d = (1, 6, 3) / 10."""
    q0, q1, q2, b0, b1, b2 = _weno5_parts(v0, v1, v2, v3, v4)
    a0 = 0.1 / ((WENO_EPS + b0) * (WENO_EPS + b0))
    a1 = 0.6 / ((WENO_EPS + b1) * (WENO_EPS + b1))
    a2 = 0.3 / ((WENO_EPS + b2) * (WENO_EPS + b2))
    return (a0 * q0 + a1 * q1 + a2 * q2) / (a0 + a1 + a2)


@nb.njit(cache=True, inline="always", fastmath=FAST)
def weno5_z(v0, v1, v2, v3, v4):
    """WENO5-Z of Borges et al.: weights d_k (1 + (tau5 / (beta_k + eps))^2), tau5 = |b0 - b2|."""
    q0, q1, q2, b0, b1, b2 = _weno5_parts(v0, v1, v2, v3, v4)
    tau = abs(b0 - b2)
    r0 = tau / (b0 + WENO_EPS)
    r1 = tau / (b1 + WENO_EPS)
    r2 = tau / (b2 + WENO_EPS)
    a0 = 0.1 * (1.0 + r0 * r0)
    a1 = 0.6 * (1.0 + r1 * r1)
    a2 = 0.3 * (1.0 + r2 * r2)
    return (a0 * q0 + a1 * q1 + a2 * q2) / (a0 + a1 + a2)


UPWIND, MUSCL_MINMOD, MUSCL_MC, MUSCL_VANLEER, WENO5_JS, WENO5_Z = range(6)


@nb.njit(cache=True, inline="always", fastmath=FAST)
def reconstruct(kind, v0, v1, v2, v3, v4):
    """Left state at i + 1/2 by the reconstruction numbered ``kind`` (see RECONSTRUCTIONS)."""
    if kind == WENO5_Z:
        return weno5_z(v0, v1, v2, v3, v4)
    if kind == WENO5_JS:
        return weno5_js(v0, v1, v2, v3, v4)
    if kind == MUSCL_MINMOD:
        return muscl_minmod(v0, v1, v2, v3, v4)
    if kind == MUSCL_MC:
        return muscl_mc(v0, v1, v2, v3, v4)
    if kind == MUSCL_VANLEER:
        return muscl_vanleer(v0, v1, v2, v3, v4)
    return upwind(v0, v1, v2, v3, v4)


@dataclass(frozen=True)
class Reconstruction:
    """A registered reconstruction: its number for :func:`reconstruct`, the scalar function,
    its formal order and a one-line description."""

    name: str
    kind: int
    kernel: Callable
    order: int
    description: str


RECONSTRUCTIONS: dict[str, Reconstruction] = {
    r.name: r
    for r in (
        Reconstruction("upwind", UPWIND, upwind, 1, "first-order upwind"),
        Reconstruction("muscl", MUSCL_MINMOD, muscl_minmod, 2, "MUSCL, minmod limiter"),
        Reconstruction("muscl-mc", MUSCL_MC, muscl_mc, 2, "MUSCL, monotonised central"),
        Reconstruction("muscl-vanleer", MUSCL_VANLEER, muscl_vanleer, 2, "MUSCL, van Leer"),
        Reconstruction("weno5", WENO5_JS, weno5_js, 5, "WENO5-JS (Jiang & Shu 1996)"),
        Reconstruction("weno5z", WENO5_Z, weno5_z, 5, "WENO5-Z, p = 2 (Borges et al.)"),
    )
}
#: Other accepted spellings.
ALIASES = {"muscl-minmod": "muscl", "weno5-js": "weno5", "weno5-z": "weno5z"}


def get_reconstruction(name: str) -> Reconstruction:
    """Look up a reconstruction by name, with a message listing the choices."""
    key = str(name).lower()
    key = ALIASES.get(key, key)
    if key not in RECONSTRUCTIONS:
        raise ValueError(
            f"scheme.reconstruction: unknown {name!r}; choose one of "
            f"{', '.join(sorted(RECONSTRUCTIONS))}"
        )
    return RECONSTRUCTIONS[key]
