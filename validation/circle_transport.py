"""Optimal transport on the circle S^1: exact W1 and W2 between densities and tokens.

docs/theory.md, 'Metastability on the circle'. The cost is the geodesic one,
``d(theta, phi) = min(|theta - phi|, 2 pi - |theta - phi|)`` (arc length on the unit circle).
A measure on ``[0, 2 pi)`` is described by its quantile function ``Q`` on ``[0, 1)``,
extended to the whole line by ``Q(u + 1) = Q(u) + 2 pi`` (the unwrapped circle). Then
(Delon, Salomon and Sobolevski 2010; Rabin, Delon and Gousseau 2011)

    W_p^p(mu, nu) = min_s int_0^1 |Q_mu(u) - Q_nu(u + s)|^p du,

the optimal plans on the circle being the monotone ones of the line, rotated by the mass
``s`` that the cut at ``theta = 0`` moves. ``C(s)`` is convex in ``s``, and its minimiser
lies in ``[-1, 1]``.

* ``p = 2``: ``C(s)`` is evaluated exactly for each ``s``: both quantile functions are
  piecewise linear (piecewise constant for tokens) between their merged breakpoints, so the
  integrand is a quadratic there and integrated in closed form; ``s`` is found by a scan of
  ``C`` on 17 points of ``[-1, 1]`` (which brackets the minimum of a convex function) and
  Brent's bounded search in the bracket, to ``|ds| <= 1e-13`` (the error in ``W_2^2`` is then
  ``C'(s) ds`` at a kink, ``< 1e-12`` for measures on the circle).
* ``p = 1``: ``W_1 = min_alpha int_0^{2 pi} |F_mu(x) - F_nu(x) - alpha| dx``, the CDFs
  extended the same way; the minimiser is a median of ``F_mu - F_nu`` for the Lebesgue
  measure on the circle (Rabin, Delon and Gousseau 2011, 'the level median'), found by
  the same scan and golden-section search on the convex integral, evaluated exactly.

Densities are cell averages on a whole-circle grid (``tpde.grid.circle``, ``m = 1``), taken
as piecewise constant; tokens are angles (any real numbers, wrapped) with optional weights.
Both are normalised to unit mass.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from tpde.grid import Grid
from tpde.grid.circle import TWO_PI, circle_copies

__all__ = [
    "Quantile",
    "circle_w1",
    "circle_w2",
    "density_quantile",
    "token_quantile",
    "transport_cost",
]

_SCAN = 17
_XTOL = 1e-15


class Quantile(NamedTuple):
    """A quantile function on ``[0, 1)``: pieces ``[u0_j, u1_j)`` on which ``Q`` is linear
    from ``q0_j`` to ``q1_j`` (constant for a token); ``u0[0] = 0``, ``u1[-1] = 1``,
    ``0 <= q < 2 pi`` (the last piece may end at ``2 pi``). The CDF is its inverse."""

    u0: np.ndarray
    u1: np.ndarray
    q0: np.ndarray
    q1: np.ndarray


def density_quantile(density: ArrayLike, grid: Grid) -> Quantile:
    """The quantile function of the piecewise-constant density of cell averages on a circle
    grid (``m = 1``): linear across each cell of positive mass."""
    if circle_copies(grid) != 1:
        raise ValueError("transport: a density on the whole circle (a grid with m = 1)")
    rho = np.asarray(density, float)
    if rho.shape != grid.shape or not np.all(np.isfinite(rho)):
        raise ValueError(f"transport: expected a finite density of shape {grid.shape}")
    scale = float(np.abs(rho).max())
    if rho.min() < -1e-12 * scale:
        raise ValueError(f"transport: negative density ({rho.min():.3e})")
    mass = np.clip(rho, 0.0, None)
    if not mass.sum() > 0:
        raise ValueError("transport: the density has no mass")
    mass = mass / mass.sum()
    edges = grid.edges(0) - grid.lower[0]  # the grid starts at 0 on the circle
    keep = mass > 0
    cdf = np.concatenate(([0.0], np.cumsum(mass[keep])))
    cdf[-1] = 1.0
    return Quantile(cdf[:-1], cdf[1:], edges[:-1][keep], edges[1:][keep])


def token_quantile(theta: ArrayLike, weights: ArrayLike | None = None) -> Quantile:
    """The quantile function of weighted tokens (angles wrapped to ``[0, 2 pi)``)."""
    x = np.mod(np.asarray(theta, float).reshape(-1), TWO_PI)
    if x.size < 1 or not np.all(np.isfinite(x)):
        raise ValueError("transport: expected at least one finite angle")
    w = np.full(x.size, 1.0 / x.size) if weights is None else np.asarray(weights, float)
    if w.shape != x.shape or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"transport: expected {x.size} non-negative weights, positive sum")
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order] / w.sum()
    keep = w > 0
    x, w = x[keep], w[keep]
    cdf = np.concatenate(([0.0], np.cumsum(w)))
    cdf[-1] = 1.0
    return Quantile(cdf[:-1], cdf[1:], x, x)


def _as_quantile(measure, grid: Grid | None, weights) -> Quantile:
    if isinstance(measure, Quantile):
        return measure
    if grid is not None:
        return density_quantile(measure, grid)
    return token_quantile(measure, weights)


def _extended(q: Quantile, s: float) -> tuple[np.ndarray, ...]:
    """The pieces of ``u -> Q(u + s)`` covering ``[0, 1]`` (three periods of ``Q``)."""
    u0 = np.concatenate((q.u0 - 1.0, q.u0, q.u0 + 1.0)) - s
    u1 = np.concatenate((q.u1 - 1.0, q.u1, q.u1 + 1.0)) - s
    q0 = np.concatenate((q.q0 - TWO_PI, q.q0, q.q0 + TWO_PI))
    q1 = np.concatenate((q.q1 - TWO_PI, q.q1, q.q1 + TWO_PI))
    return u0, u1, q0, q1


def _evaluate(pieces, u: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``Q(u)`` on the piece that holds ``start`` (the left end of a merged interval)."""
    u0, u1, q0, q1 = pieces
    j = np.clip(np.searchsorted(u0, start, side="right") - 1, 0, u0.size - 1)
    width = u1[j] - u0[j]
    t = np.divide(u - u0[j], width, out=np.zeros_like(u), where=width > 0)
    return q0[j] + np.clip(t, 0.0, 1.0) * (q1[j] - q0[j])


def transport_cost(a: Quantile, b: Quantile, s: float) -> float:
    """``C(s) = int_0^1 |Q_a(u) - Q_b(u + s)|^2 du``, exactly (the integrand is a quadratic
    between the merged breakpoints)."""
    pb = _extended(b, s)
    inside = (pb[1] > 0.0) & (pb[0] < 1.0)
    pb = tuple(arr[inside] for arr in pb)
    pa = (a.u0, a.u1, a.q0, a.q1)
    cuts = np.unique(np.concatenate(([0.0, 1.0], a.u0, np.clip(pb[0], 0.0, 1.0))))
    lo, hi = cuts[:-1], cuts[1:]
    d0 = _evaluate(pa, lo, lo) - _evaluate(pb, lo, lo)
    d1 = _evaluate(pa, hi, lo) - _evaluate(pb, hi, lo)
    return float(np.sum((hi - lo) * (d0 * d0 + d0 * d1 + d1 * d1)) / 3.0)


def _minimise(cost, lo: float, hi: float) -> tuple[float, float]:
    """The minimum of a convex function on ``[lo, hi]``: a scan of 17 points brackets it,
    golden-section search narrows the bracket to ``1e-15`` of ``hi - lo`` (convexity is all
    it needs; ``C`` may have kinks, where Brent's parabolas gain nothing)."""
    xs = np.linspace(lo, hi, _SCAN)
    values = [cost(s) for s in xs]
    i = int(np.argmin(values))
    a, b = float(xs[max(i - 1, 0)]), float(xs[min(i + 1, _SCAN - 1)])
    best_x, best = float(xs[i]), float(values[i])
    ratio = 0.5 * (math.sqrt(5.0) - 1.0)
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = cost(c), cost(d)
    while b - a > _XTOL * (hi - lo):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = cost(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = cost(d)
    for x, f in ((c, fc), (d, fd)):
        if f < best:
            best_x, best = x, f
    return best_x, best


def circle_w2(
    a,
    b,
    grid_a: Grid | None = None,
    grid_b: Grid | None = None,
    weights_a: ArrayLike | None = None,
    weights_b: ArrayLike | None = None,
    shift: bool = False,
):
    """Exact ``W_2`` on the circle between two measures, each a density (pass its grid) or
    tokens (angles; optional weights), or a :class:`Quantile`. ``shift``: also return the
    optimal rotation ``s`` of the mass (``(W_2, s)``)."""
    qa = _as_quantile(a, grid_a, weights_a)
    qb = _as_quantile(b, grid_b, weights_b)
    s, value = _minimise(lambda s: transport_cost(qa, qb, s), -1.0, 1.0)
    w2 = math.sqrt(max(value, 0.0))
    return (w2, s) if shift else w2


def _cdf_pieces(q: Quantile) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The CDF on ``[0, 2 pi]`` as pieces ``[x0, x1)`` linear from ``f0`` to ``f1`` (tokens:
    jumps, zero-width pieces dropped)."""
    x = np.concatenate((q.q0, q.q1, [0.0, TWO_PI]))
    x = np.unique(np.clip(x, 0.0, TWO_PI))
    lo, hi = x[:-1], x[1:]
    return lo, hi, _cdf(q, lo, hi, left=True), _cdf(q, lo, hi, left=False)


def _cdf(q: Quantile, lo: np.ndarray, hi: np.ndarray, left: bool) -> np.ndarray:
    """``F`` at the left (just right of ``lo``) or right (just left of ``hi``) end of each
    interval ``[lo, hi)`` that holds no breakpoint of ``F`` inside: the last piece of ``q``
    starting at or below the interval's midpoint either holds it (``F`` linear there) or
    lies below it (``F = u1`` of that piece)."""
    x = lo if left else hi
    mid = 0.5 * (lo + hi)
    j = np.searchsorted(q.q0, mid, side="right") - 1
    jj = np.clip(j, 0, q.u0.size - 1)
    q0, q1, u0, u1 = q.q0[jj], q.q1[jj], q.u0[jj], q.u1[jj]
    inside = (mid < q1) & (j >= 0)
    span = np.where(inside, q1 - q0, 1.0)
    linear = u0 + np.clip((x - q0) / span, 0.0, 1.0) * (u1 - u0)
    return np.where(j < 0, 0.0, np.where(inside, linear, u1))


def circle_w1(
    a,
    b,
    grid_a: Grid | None = None,
    grid_b: Grid | None = None,
    weights_a: ArrayLike | None = None,
    weights_b: ArrayLike | None = None,
) -> float:
    """Exact ``W_1`` on the circle: ``min_alpha int |F_a - F_b - alpha| dx`` (module
    docstring); measures as for :func:`circle_w2`."""
    qa = _as_quantile(a, grid_a, weights_a)
    qb = _as_quantile(b, grid_b, weights_b)
    xa = _cdf_pieces(qa)
    xb = _cdf_pieces(qb)
    x = np.unique(np.concatenate((xa[0], xb[0], [TWO_PI])))
    lo, hi = x[:-1], x[1:]
    d0 = _cdf(qa, lo, hi, True) - _cdf(qb, lo, hi, True)
    d1 = _cdf(qa, lo, hi, False) - _cdf(qb, lo, hi, False)
    width = hi - lo

    def cost(alpha: float) -> float:
        e0, e1 = d0 - alpha, d1 - alpha
        a0, a1 = np.abs(e0), np.abs(e1)
        total = a0 + a1
        cross = np.divide(e0 * e0 + e1 * e1, 2.0 * total, out=np.zeros_like(total), where=total > 0)
        return float(np.sum(width * np.where(e0 * e1 >= 0, 0.5 * total, cross)))

    lo_a = float(min(d0.min(), d1.min()))
    hi_a = float(max(d0.max(), d1.max()))
    if hi_a - lo_a <= 0:
        return cost(lo_a)
    return _minimise(cost, lo_a, hi_a)[1]
