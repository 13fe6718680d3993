"""The Jacobi-Anger engine of the circle: kernel sums for any 2 x 2 matrix by Bessel series.

docs/theory.md, 'Any head on the circle: the Jacobi-Anger series'. On the circle the tokens
are ``y = (cos phi, sin phi)``; for a target tilt ``c = r (cos psi, sin psi)`` (``c = A x``,
any 2 x 2 ``A``) the kernel is a function of ``phi - psi`` alone,

    e^{c . y} = e^{r cos(phi - psi)} = sum_k I_k(r) e^{i k (phi - psi)}     (Jacobi-Anger),

so with the density's Fourier coefficients ``c_m = int rho e^{-i m phi} dphi`` the sums are

    Z(c)   = int e^{c.y} rho dphi          = sum_m I_|m|(r) e^{i m psi} c_m,
    M(c)   = int e^{i phi} e^{c.y} rho dphi = sum_m I_|m+1|(r) e^{i (m+1) psi} c_m

(``M = M_1 + i M_2``, the first moments ``int y e^{c.y} rho``). Per target that is one row
``B_m = I_|m|(r) e^{i m psi}`` of a table ``(targets, 2K + 1)``, read against the coefficient
vector and against it shifted by one: one complex matrix product for both sums. The
coefficients come from the FFT of the cell averages divided by ``sinc(m h / 2)``
(:func:`tpde.grid.circle.fourier_modes`: exact for every mode below the grid's Nyquist mode,
the same density the convolution engine of ``A = a I + b J`` sees).

Truncation, a posteriori. The series is cut at ``|m| <= K``. Since ``|c_m| <= int |rho|``
and the ratios ``I_{k+1}(r) / I_k(r)`` decrease in ``k`` (the Turan inequality
``I_k^2 > I_{k-1} I_{k+1}``), the neglected terms of either sum are at most

    2 int |rho| sum_{k > K} I_k(r)  <=  2 int |rho| I_{K+1}(r) / (1 - q),
    q = I_{K+2}(r) / I_{K+1}(r),

and ``K`` is the smallest (from the table actually formed) for which this is at most
:data:`SERIES_TOLERANCE` of the sums' scale ``int |rho| I_0(r)``, at every target. The Bessel
values are the exponentially scaled ``ive = e^{-r} I`` (no overflow for any ``r``): the
sums come scaled by ``e^{-r}`` per target, which cancels in a normalised velocity.

Accuracy is absolute, of the scale ``int |rho| I_0(r)``, as for the convolution engine: the
smallest sums (a density concentrated opposite the tilt, ``Z ~ e^{-r}`` against the scale
``e^{r}``) keep ``1e-16 e^{2 r}`` relative, which is why the circle's ``"auto"`` takes this
engine up to ``|A| <= 8`` only (:func:`tpde.variants.spherical.CircleAttention.choose`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ive

__all__ = ["SERIES_TOLERANCE", "BesselSeries", "series_order", "tail_bounds"]

#: the neglected tail of the series, relative to the sums' scale int |rho| I_0(r), per target
SERIES_TOLERANCE = 1e-14
#: the first order tried above the largest radius (and the step of the search beyond it)
_ORDER_MARGIN = 16


def tail_bounds(scaled: np.ndarray) -> np.ndarray:
    """``bound[i, K] = 2 I_{K+1} / (1 - q) / I_0`` at radius ``r_i``: the neglected terms of
    the series cut at order ``K`` relative to its scale (module docstring), for a table
    ``scaled[i, k] = ive(k, r_i)``, ``k = 0 .. N + 2``; (P, N + 1) for ``K = 0 .. N``. The
    bound decreases in ``K`` (both ``I_{K+1}`` and ``q`` do)."""
    last, after, first = scaled[:, 1:-1], scaled[:, 2:], scaled[:, :1]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(last > 0.0, after / last, 0.0)
        bound = np.where(ratio < 1.0, 2.0 * last / (1.0 - ratio), np.inf) / first
    return bound


def series_order(
    radius: np.ndarray, tolerance: float = SERIES_TOLERANCE
) -> tuple[np.ndarray, np.ndarray]:
    """Per radius the smallest truncation order whose tail bound is within ``tolerance``
    (module docstring), (P,) integers, and the table ``ive(k, r_i)``, ``k = 0 .. K`` with
    ``K`` the largest of them, (P, K + 1). The table is formed a priori at
    ``ceil(max r) + 16`` and extended until every radius meets the bound."""
    r = np.asarray(radius, float).reshape(-1)
    if r.size and not np.all(np.isfinite(r)):
        raise ValueError("attention.A: the tilts A x are not finite")
    largest = float(r.max(initial=0.0))
    order = int(math.ceil(largest)) + _ORDER_MARGIN
    while True:
        k = np.arange(order + 3)
        scaled = ive(k[None, :], r[:, None])  # (P, order + 3)
        met = tail_bounds(scaled) <= tolerance  # (P, order + 1), monotone in K
        if np.all(met[:, -1]):
            orders = np.argmax(met, axis=1)  # the first order that meets the bound
            top = int(orders.max(initial=0))
            return orders, scaled[:, : top + 1]
        order += _ORDER_MARGIN + int(math.ceil(math.sqrt(largest)))


class BesselSeries:
    """The series table of fixed targets: tilts ``c_i = radius_i (cos angle_i, sin angle_i)``.

    ``table`` (P, 2K + 1), complex: ``ive(|m|, r_i) e^{i m psi_i}``, ``m = -K .. K``.
    :meth:`sums` returns ``e^{-r} Z`` and ``e^{-r} M`` (module docstring) from the density's
    coefficients ``c_m``, ``m >= 0`` (``c_{-m}`` is their conjugate: a real density).
    """

    def __init__(self, radius: np.ndarray, angle: np.ndarray, tolerance: float = SERIES_TOLERANCE):
        self.radius = np.asarray(radius, float).reshape(-1)
        angle = np.asarray(angle, float).reshape(-1)
        #: per target the order its tail bound needs; the table holds the largest, ``order``
        self.orders, scaled = series_order(self.radius, tolerance)
        self.order = K = scaled.shape[1] - 1
        m = np.arange(-K, K + 1)
        self.table = scaled[:, np.abs(m)] * np.exp(1j * np.outer(angle, m))

    def modes(self, positive: np.ndarray) -> np.ndarray:
        """The coefficient columns ``(c_m, c_{m-1})`` for ``m = -K .. K`` (2K + 1, 2) from
        ``c_0 .. c_{n-1}`` (the grid's modes below Nyquist; beyond them the density has
        none)."""
        K = self.order
        full = np.zeros(2 * K + 3, complex)  # c_m for m = -K - 1 .. K + 1
        count = min(positive.size, K + 2)
        centre = K + 1
        full[centre : centre + count] = positive[:count]
        full[centre - count + 1 : centre][::-1] = np.conj(positive[1:count])
        return np.stack([full[1:-1], full[:-2]], axis=1)

    def sums(self, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(e^{-r} Z, e^{-r} M)`` per target: (P,) real and (P,) complex."""
        out = self.table @ self.modes(positive)
        return out[:, 0].real, out[:, 1]
