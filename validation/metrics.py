"""Distances and error norms between grid densities, token clouds and Gaussians.

Conventions (as in ``tpde.grid``): a density is an array of *cell averages* of shape
``grid.shape`` (axis 0 is x); a token cloud is an ``(n, d)`` array ``X`` with optional weights
``W`` of shape ``(n,)`` (uniform if ``None``). Every Wasserstein distance below compares
probability measures: both arguments are normalised to unit mass first (a mass <= 0 is an
error), so only the *shape* of a density counts; check the mass with :func:`moment_errors`.

* :func:`wasserstein_1d`, :func:`wasserstein_1d_tokens` -- exact ``W_p`` (p = 1, 2) in 1-D for
  the piecewise-constant density (and the empirical measure), through the CDFs / quantile
  functions (Villani, *Topics in Optimal Transportation*, 2003, Thm 2.18; Peyre & Cuturi,
  *Computational Optimal Transport*, 2019, Rem. 2.30).
* :func:`wasserstein_circle` -- exact ``W_1`` on a periodic 1-D grid (the circle), through
  the CDF difference and its median (Rabin, Delon & Gousseau 2011, Thm 1).
* :func:`wasserstein`, :func:`wasserstein_tokens` -- ``W_p`` in 1-3 D with POT
  (``ot.emd2`` network simplex, or log-domain Sinkhorn ``ot.sinkhorn2``) between the cell-centre
  atoms; see :func:`wasserstein` for the support, the cut-off and the error bounds.
* :func:`conditional_wasserstein`, :func:`conditional_wasserstein_tokens` -- the conditional
  distance of masked attention (docs/theory.md, 'Conditional Wasserstein distance') between
  position-sliced densities (shape ``(S, *grid.shape)``, see ``tpde.grid.Positions``) and
  sliced token clouds,
  ``W_{p,nu}^p = sum_k nu_k W_p(a_k, b_k)^p``.
* :func:`bures_wasserstein` -- closed-form ``W_2`` between Gaussians.
* :func:`density_errors`, :func:`moment_errors` -- L1 / Linf and mean / covariance errors.

Invalid input raises ``ValueError`` with a one-line message starting with ``metrics.<arg>``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import ot
from scipy.spatial.distance import cdist

from tpde.grid import Grid, from_tokens, moments

__all__ = [
    "CUTOFF",
    "Distance",
    "bures_wasserstein",
    "cell_points",
    "conditional_wasserstein",
    "conditional_wasserstein_tokens",
    "density_errors",
    "moment_errors",
    "wasserstein",
    "wasserstein_1d",
    "wasserstein_1d_tokens",
    "wasserstein_circle",
    "wasserstein_points",
    "wasserstein_tokens",
]

CUTOFF = 1e-14
"""Cells whose mass fraction is <= CUTOFF are dropped from the POT support (then renormalised)."""

_NEG_TOL = 1e-12  # negative cell averages down to -_NEG_TOL * max|density| count as round-off
_METHODS = ("exact", "entropic")


@dataclass(frozen=True)
class Distance:
    """Result of :func:`wasserstein` / :func:`wasserstein_tokens`.

    Attributes
    ----------
    value : float
        ``W_p`` (not its p-th power). Entropic: ``(<P_eps, C>)^(1/p)`` for the Sinkhorn plan
        ``P_eps`` (transport cost only, no entropy term), hence ``>= `` the exact value.
    p : int
        1 or 2.
    method : str
        ``"exact"`` or ``"entropic"``.
    reg : float or None
        The entropic ``eps`` actually used (units of the cost, length^p); ``None`` if exact.
    support_a, support_b : int
        Number of atoms of each measure (cells above the cut-off, or tokens; 1-D exact: cells
        with positive mass, or tokens).
    coarsening : int
        Block size ``k`` per axis used to coarsen the grid measures (1: none).
    bound : float
        Bound on ``|value - W_p(piecewise-constant densities)|`` for the exact method
        (cell-centre atoms and coarsening; see :func:`wasserstein`); 0 for the exact 1-D
        routines. For ``"entropic"`` add the (positive) entropic bias, which is not bounded here.
    """

    value: float
    p: int
    method: str
    reg: float | None
    support_a: int
    support_b: int
    coarsening: int = 1
    bound: float = 0.0


# ---- validation helpers ------------------------------------------------------------------------
def _check_grid(grid) -> Grid:
    if not isinstance(grid, Grid):
        raise ValueError(f"metrics.grid: expected a tpde.grid.Grid, got {type(grid).__name__}")
    return grid


def _check_p(p) -> int:
    if isinstance(p, bool) or p not in (1, 2):
        raise ValueError(f"metrics.p: expected 1 or 2, got {p!r}")
    return int(p)


def _array(values, grid: Grid, name: str) -> np.ndarray:
    """Float64 array of shape ``grid.shape`` with finite entries (signs not checked)."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"metrics.{name}: expected an array of shape {grid.shape}") from None
    if arr.shape != grid.shape:
        raise ValueError(
            f"metrics.{name}: expected shape {grid.shape} (grid.shape), got {arr.shape}"
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"metrics.{name}: contains NaN or Inf")
    return arr


def _probability(values, grid: Grid, name: str) -> np.ndarray:
    """Cell masses ``rho_c * |cell| / mass``, shape ``grid.shape``, summing to 1.

    Negative values down to ``-1e-12 * max|rho|`` are round-off and set to 0; below, an error.
    """
    arr = _array(values, grid, name)
    scale = float(np.max(np.abs(arr))) if arr.size else 0.0
    if arr.min() < -_NEG_TOL * scale:
        raise ValueError(
            f"metrics.{name}: negative values (min {arr.min():.3e}); pass a density >= 0"
        )
    arr = np.clip(arr, 0.0, None)
    total = float(arr.sum())
    if not total > 0:
        raise ValueError(f"metrics.{name}: mass must be > 0, got {total * grid.cell_volume}")
    return arr / total


def _tokens(tokens, weights, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens as ``(n, d)`` float64 and weights ``(n,)`` summing to 1."""
    try:
        x = np.asarray(tokens, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"metrics.tokens: expected an (n, {d}) array") from None
    if x.ndim == 1 and d == 1:
        x = x.reshape(-1, 1)
    if x.ndim != 2 or x.shape[1] != d or x.shape[0] < 1:
        raise ValueError(
            f"metrics.tokens: expected shape (n, {d}) with n >= 1 for a {d}-D grid, got {x.shape}"
        )
    if not np.all(np.isfinite(x)):
        raise ValueError("metrics.tokens: contains NaN or Inf")
    n = x.shape[0]
    if weights is None:
        return x, np.full(n, 1.0 / n)
    try:
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"metrics.weights: expected {n} numbers") from None
    if w.shape != (n,):
        raise ValueError(
            f"metrics.weights: expected shape ({n},) (one per token), got {np.shape(weights)}"
        )
    if not np.all(np.isfinite(w)) or w.min() < 0:
        raise ValueError("metrics.weights: must be finite and >= 0")
    total = float(w.sum())
    if not total > 0:
        raise ValueError(f"metrics.weights: must sum to > 0, got {total}")
    return x, w / total


def _check_transport(grid, p, method, reg, max_cells) -> tuple[Grid, int, float | None]:
    """The arguments every POT distance takes: (grid, p, eps) checked, or ValueError."""
    checked = _check_grid(grid), _check_p(p), _check_method(method, reg)
    if isinstance(max_cells, bool) or not isinstance(max_cells, int | np.integer) or max_cells < 1:
        raise ValueError(f"metrics.max_cells: expected an integer >= 1, got {max_cells!r}")
    return checked


def _check_method(method, reg) -> float | None:
    if method not in _METHODS:
        raise ValueError(
            f"metrics.method: unknown method {method!r}; choose one of {', '.join(_METHODS)}"
        )
    if reg is None:
        return None
    if method == "exact":
        raise ValueError("metrics.reg: only used with method='entropic'; drop it or change method")
    try:
        eps = float(reg)
    except (TypeError, ValueError):
        raise ValueError(f"metrics.reg: expected a number > 0, got {reg!r}") from None
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"metrics.reg: must be finite and > 0, got {reg!r}")
    return eps


# ---- exact 1-D ---------------------------------------------------------------------------------
def _cdf_at_edges(prob: np.ndarray) -> np.ndarray:
    """``F(e_i) = sum_{c < i} prob_c``, shape ``(n + 1,)``, monotone, ``F[0] = 0, F[-1] = 1``."""
    f = np.concatenate(([0.0], np.cumsum(prob)))
    f[-1] = 1.0
    return np.minimum(f, 1.0)


def _grid_quantile(
    f: np.ndarray, edges: np.ndarray, u: np.ndarray, ustart: np.ndarray
) -> np.ndarray:
    """Quantile ``F^{-1}(u)`` of a piecewise-linear CDF on the piece that starts at ``ustart``.

    ``f`` holds the CDF at ``edges`` (shape ``(n + 1,)``, ``f[-1] = 1``); for ``ustart < 1``
    the cell is ``i`` with ``f[i] <= ustart < f[i + 1]`` (so ``f[i + 1] > f[i]``), and
    ``F^{-1}(u) = e_i + (u - f_i) / (f_{i+1} - f_i) h``, the linear function on that piece
    (evaluated at both ends of a merged piece ``[ustart, u_next]``, which holds no breakpoint).
    """
    i = np.clip(np.searchsorted(f, ustart, side="right") - 1, 0, f.size - 2)
    t = np.clip((u - f[i]) / (f[i + 1] - f[i]), 0.0, 1.0)
    return edges[i] + t * (edges[i + 1] - edges[i])


def _integral_abs_power(d0: np.ndarray, d1: np.ndarray, du: np.ndarray, p: int) -> float:
    """``sum_k int_0^{du_k} |D_k(s)|^p ds`` for ``D_k`` linear from ``d0_k`` to ``d1_k`` (exact).

    p = 2: ``du (d0^2 + d0 d1 + d1^2) / 3``. p = 1: ``du (|d0| + |d1|) / 2`` without a sign
    change, ``du (d0^2 + d1^2) / (2 (|d0| + |d1|))`` with one.
    """
    if p == 2:
        return float(np.sum(du * (d0 * d0 + d0 * d1 + d1 * d1)) / 3.0)
    a0, a1 = np.abs(d0), np.abs(d1)
    same = d0 * d1 >= 0
    s = a0 + a1
    cross = np.divide(d0 * d0 + d1 * d1, 2.0 * s, out=np.zeros_like(s), where=s > 0)
    return float(np.sum(du * np.where(same, 0.5 * s, cross)))


def _check_1d(grid) -> Grid:
    grid = _check_grid(grid)
    if grid.ndim != 1:
        raise ValueError(
            f"metrics.grid: expected a 1-D grid, got {grid.ndim}-D; "
            f"use wasserstein / wasserstein_tokens"
        )
    return grid


def wasserstein_1d(density_a: np.ndarray, density_b: np.ndarray, grid: Grid, p: int = 2) -> float:
    """Exact ``W_p`` (p = 1, 2) between two 1-D piecewise-constant densities.

    Both densities (shape ``grid.shape = (n,)``, cell averages) are normalised to unit mass;
    their CDFs ``F_a, F_b`` are piecewise linear with breakpoints at the cell edges.

    * p = 1: ``W_1 = int |F_a(x) - F_b(x)| dx`` (Villani 2003, Thm 2.18 / Vallender 1973);
      ``F_a - F_b`` is linear in each cell, integrated exactly (zero crossings included).
    * p = 2: ``W_2^2 = int_0^1 |F_a^{-1}(u) - F_b^{-1}(u)|^2 du`` (Villani 2003, Thm 2.18);
      both quantile functions are linear between the merged breakpoints ``{F_a(e_i)} U
      {F_b(e_i)}``, so the integrand is a quadratic in ``u`` there and is integrated in closed
      form, ``du (D0^2 + D0 D1 + D1^2) / 3``.

    Exact up to round-off (O(eps * box length)). Returns ``W_p`` (not its p-th power).
    """
    grid = _check_1d(grid)
    p = _check_p(p)
    pa = _probability(density_a, grid, "density_a")
    pb = _probability(density_b, grid, "density_b")
    fa, fb = _cdf_at_edges(pa), _cdf_at_edges(pb)
    edges = grid.edges(0)
    if p == 1:
        h = np.diff(edges)
        return _integral_abs_power(fa[:-1] - fb[:-1], fa[1:] - fb[1:], h, 1)
    u = np.unique(np.concatenate((fa, fb)))
    u0, u1 = u[:-1], u[1:]
    d0 = _grid_quantile(fa, edges, u0, u0) - _grid_quantile(fb, edges, u0, u0)
    d1 = _grid_quantile(fa, edges, u1, u0) - _grid_quantile(fb, edges, u1, u0)
    return math.sqrt(max(_integral_abs_power(d0, d1, u1 - u0, 2), 0.0))


#: bisection steps for the median of the CDF difference (the interval halves each step:
#: 200 reach the float resolution of any finite range)
_MEDIAN_STEPS = 200


def wasserstein_circle(density_a: np.ndarray, density_b: np.ndarray, grid: Grid) -> float:
    """Exact ``W_1`` between two piecewise-constant densities on a periodic 1-D grid (the
    circle ``S^1`` of length ``L``, or one period of an m-fold run: the periodic extensions'
    distance is the same).

    With ``D = F_a - F_b`` the difference of the CDFs from the grid's lower edge (shape
    ``(n + 1,)`` at the edges, linear in each cell),
    ``W_1 = min_c int_0^L |D(x) - c| dx`` (Rabin, Delon & Gousseau, *Transportation
    distances on the circle*, 2011, Thm 1; Werman et al. 1985): the minimiser ``c`` is a
    median of ``D`` under the length measure, found by bisection on the length where
    ``D < c`` (exactly, per cell, for linear pieces), and the integral of ``|D - c|`` is
    exact per cell (zero crossings included). Both densities are normalised to unit mass.
    Raises ValueError for a grid that is not 1-D and periodic.
    """
    grid = _check_1d(grid)
    if grid.boundary[0] != "periodic":
        raise ValueError(
            "metrics.grid: wasserstein_circle needs a periodic 1-D grid (the circle); "
            "use wasserstein_1d on an interval"
        )
    pa = _probability(density_a, grid, "density_a")
    pb = _probability(density_b, grid, "density_b")
    d = np.concatenate(([0.0], np.cumsum(pa - pb)))
    d[-1] = 0.0  # (both have unit mass: D is periodic)
    d0, d1 = d[:-1], d[1:]
    h = np.diff(grid.edges(0))
    lo, hi = np.minimum(d0, d1), np.maximum(d0, d1)
    span = hi - lo

    def below(c: float) -> float:  # the length where D < c, minus half the circle
        flat = np.where(lo < c, 1.0, 0.0)
        part = np.clip(np.divide(c - lo, span, out=flat.copy(), where=span > 0), 0.0, 1.0)
        return float(np.sum(h * part)) - 0.5 * float(np.sum(h))

    a, b = float(lo.min()), float(hi.max())
    for _ in range(_MEDIAN_STEPS):
        c = 0.5 * (a + b)
        if c in (a, b):
            break
        if below(c) < 0.0:
            a = c
        else:
            b = c
    c = 0.5 * (a + b)
    return _integral_abs_power(d0 - c, d1 - c, h, 1)


def wasserstein_1d_tokens(
    density: np.ndarray,
    grid: Grid,
    tokens: np.ndarray,
    weights: np.ndarray | None = None,
    p: int = 2,
) -> float:
    """Exact ``W_p`` (p = 1, 2) between a 1-D piecewise-constant density and weighted tokens.

    ``density``: cell averages, shape ``(n,)``, normalised to unit mass; ``tokens``: shape
    ``(m,)`` or ``(m, 1)`` (may lie outside the box); ``weights``: shape ``(m,)``, >= 0,
    normalised to sum 1 (uniform if ``None``).
    ``W_p^p = int_0^1 |F^{-1}(u) - G^{-1}(u)|^p du`` (Villani 2003, Thm 2.18), where ``F^{-1}``
    is piecewise linear and the empirical quantile ``G^{-1}`` piecewise constant (the sorted
    tokens); on each piece between merged breakpoints the difference is linear in ``u`` and
    ``|.|^p`` is integrated in closed form (p = 1 with its zero crossing). Returns ``W_p``.
    """
    grid = _check_1d(grid)
    p = _check_p(p)
    prob = _probability(density, grid, "density")
    x, w = _tokens(tokens, weights, 1)
    order = np.argsort(x[:, 0], kind="stable")
    xs = x[order, 0]
    g = _cdf_at_edges(w[order])
    f = _cdf_at_edges(prob)
    edges = grid.edges(0)
    u = np.unique(np.concatenate((f, g)))
    u0, u1 = u[:-1], u[1:]
    j = np.clip(np.searchsorted(g, u0, side="right") - 1, 0, xs.size - 1)
    d0 = _grid_quantile(f, edges, u0, u0) - xs[j]
    d1 = _grid_quantile(f, edges, u1, u0) - xs[j]
    return max(_integral_abs_power(d0, d1, u1 - u0, p), 0.0) ** (1.0 / p)


# ---- POT, any dimension ------------------------------------------------------------------------
def _block_sum(prob: np.ndarray, k: int) -> np.ndarray:
    """Sum ``k^d`` blocks of cells (the upper end padded with zeros), shape ``ceil(n / k)``."""
    pad = [(0, (-s) % k) for s in prob.shape]
    arr = np.pad(prob, pad)
    shape = []
    for s in arr.shape:
        shape += [s // k, k]
    return arr.reshape(shape).sum(axis=tuple(range(1, 2 * prob.ndim, 2)))


def _atoms(prob: np.ndarray, grid: Grid, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Support points ``(m, d)`` and weights ``(m,)`` (sum 1) of cells/blocks above CUTOFF.

    Block ``J`` (k cells per axis) sits at ``lower + (k J + k/2) h``, the centre of the block.
    """
    arr = prob if k == 1 else _block_sum(prob, k)
    keep = arr > CUTOFF
    idx = np.nonzero(keep)
    pts = np.stack(
        [grid.lower[a] + grid.spacing[a] * k * (idx[a] + 0.5) for a in range(grid.ndim)], axis=1
    )
    w = arr[keep]
    return pts, w / w.sum()


def _coarsen(probs: list[np.ndarray], grid: Grid, max_cells: int) -> tuple[int, list]:
    """Smallest block size ``k >= 1`` with at most ``max_cells`` atoms per measure.

    ``k = max(grid.shape)`` leaves one atom, so the search always ends (``max_cells >= 1``).
    """
    for k in range(1, max(grid.shape) + 1):
        atoms = [_atoms(pr, grid, k) for pr in probs]
        if all(a[1].size <= max_cells for a in atoms):
            break
    return k, atoms


def _cost(xa: np.ndarray, xb: np.ndarray, p: int) -> np.ndarray:
    """Cost matrix ``|x_i - y_j|^p``, shape ``(m_a, m_b)`` (direct differences, no expansion)."""
    return cdist(xa, xb, "sqeuclidean") if p == 2 else cdist(xa, xb, "euclidean")


def _transport(
    wa: np.ndarray,
    wb: np.ndarray,
    cost: np.ndarray,
    method: str,
    eps: float | None,
    num_iter_max: int | None,
    stop_thr: float,
) -> float:
    """Optimal (or entropic) transport cost ``<P, C>`` between the weight vectors."""
    if method == "exact":
        n_iter = num_iter_max if num_iter_max is not None else max(100_000, 50 * wa.size * wb.size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            value, log = ot.emd2(wa, wb, cost, numItermax=int(n_iter), log=True)
        if log["result_code"] != 1:
            raise ValueError(
                f"metrics.num_iter_max: ot.emd2 did not converge "
                f"({log['warning']}); raise num_iter_max (was {n_iter})"
            )
        return float(value)
    n_iter = num_iter_max if num_iter_max is not None else 100_000
    with np.errstate(over="ignore"):  # POT's exp(log_u) for the log, unused here
        value, log = ot.sinkhorn2(
            wa,
            wb,
            cost,
            eps,
            method="sinkhorn_log",
            numItermax=int(n_iter),
            stopThr=stop_thr,
            log=True,
        )
    err = float(log["err"][-1]) if len(log["err"]) else math.inf
    if not err <= stop_thr:
        raise ValueError(
            f"metrics.num_iter_max: Sinkhorn stopped at marginal error {err:.2e} "
            f"> {stop_thr:.1e} after {log['niter']} iterations; raise "
            f"num_iter_max or reg"
        )
    if not math.isfinite(float(value)):
        raise ValueError(f"metrics.reg: Sinkhorn returned {float(value)}; increase reg")
    return float(value)


def _finish(
    total: float,
    p: int,
    method: str,
    eps: float | None,
    na: int,
    nb: int,
    k: int,
    per_side: float,
    sides: int,
) -> Distance:
    return Distance(
        value=max(total, 0.0) ** (1.0 / p),
        p=p,
        method=method,
        reg=eps if method == "entropic" else None,
        support_a=na,
        support_b=nb,
        coarsening=k,
        bound=sides * per_side,
    )


def _atom_bound(grid: Grid, k: int) -> float:
    """Per-measure bound ``|h| / sqrt(12) + (k - 1) |h| / 2`` (``|h|`` = cell diagonal)."""
    diag = math.sqrt(sum(h * h for h in grid.spacing))
    return diag / math.sqrt(12.0) + 0.5 * (k - 1) * diag


def wasserstein(
    density_a: np.ndarray,
    density_b: np.ndarray,
    grid: Grid,
    p: int = 2,
    method: str = "exact",
    reg: float | None = None,
    max_cells: int = 4096,
    num_iter_max: int | None = None,
    stop_thr: float = 1e-9,
) -> Distance:
    """``W_p`` (p = 1, 2) between two grid densities (1-, 2- or 3-D) with POT.

    Both densities (cell averages, shape ``grid.shape``) are normalised to unit mass. In 1-D
    ``method="exact"`` delegates to :func:`wasserstein_1d` (exact for the piecewise-constant
    densities, ``bound = 0``). Otherwise each density becomes the discrete measure of its cell
    centres weighted by the cell masses, keeping cells with mass fraction ``> CUTOFF = 1e-14``
    (renormalised; the dropped mass changes ``W_p^p`` by at most ``n_cells * 1e-14 * diam^p``).
    Cost ``C_ij = |x_i - y_j|^2`` (p = 2) or ``|x_i - y_j|`` (p = 1).

    * ``"exact"``: ``ot.emd2`` (network simplex; Bonneel et al. 2011), ``numItermax`` =
      ``num_iter_max`` or ``max(1e5, 50 m_a m_b)``; raises if the solver is not optimal.
      Cost O(m^3) time, ``m_a m_b`` doubles of memory: keep ``m`` <= a few thousand.
    * ``"entropic"``: ``ot.sinkhorn2(..., method="sinkhorn_log")`` with ``eps = reg`` (units of
      the cost, length^p), default ``eps = max(h)^p`` (the plan blurs over about one cell);
      returns ``<P_eps, C>^(1/p) >= `` the exact discrete value (Cuturi 2013). Raises if the
      marginal error stays above ``stop_thr`` after ``num_iter_max`` (default 1e5) iterations.

    Coarsening: if a measure has more than ``max_cells`` atoms, cells are summed in blocks of
    ``k^d`` (smallest ``k`` that fits; upper end zero-padded), each block at its centre. Each
    atom moves by at most ``(k - 1) |h| / 2``, so ``W_p`` of the atoms changes by at most
    ``(k - 1) |h|`` (``|h|`` = fine cell diagonal; half a coarse diagonal per measure).

    Error bound (``Distance.bound``, exact method): a uniform cell moved to its centre costs
    ``W_p <= |h| / sqrt(12)``, so ``|value - W_p(piecewise-constant a, b)| <= 2 (|h| / sqrt(12)
    + (k - 1) |h| / 2)`` (triangle inequality). Smooth densities do much better (O(h^2)).

    Returns
    -------
    Distance
        ``value`` (``W_p``), ``p``, ``method``, ``reg`` (eps used), ``support_a``, ``support_b``,
        ``coarsening`` (k), ``bound``.
    """
    grid, p, eps = _check_transport(grid, p, method, reg, max_cells)
    pa = _probability(density_a, grid, "density_a")
    pb = _probability(density_b, grid, "density_b")
    if grid.ndim == 1 and method == "exact":
        value = wasserstein_1d(pa, pb, grid, p)
        return Distance(
            value, p, method, None, int(np.count_nonzero(pa)), int(np.count_nonzero(pb))
        )
    if method == "entropic" and eps is None:
        eps = max(grid.spacing) ** p
    k, ((xa, wa), (xb, wb)) = _coarsen([pa, pb], grid, int(max_cells))
    total = _transport(wa, wb, _cost(xa, xb, p), method, eps, num_iter_max, stop_thr)
    return _finish(total, p, method, eps, wa.size, wb.size, k, _atom_bound(grid, k), 2)


def wasserstein_tokens(
    density: np.ndarray,
    grid: Grid,
    tokens: np.ndarray,
    weights: np.ndarray | None = None,
    p: int = 2,
    method: str = "exact",
    reg: float | None = None,
    max_cells: int = 4096,
    num_iter_max: int | None = None,
    stop_thr: float = 1e-9,
) -> Distance:
    """``W_p`` (p = 1, 2) between a grid density and weighted tokens, with POT.

    ``density``: cell averages, shape ``grid.shape``, normalised to unit mass; ``tokens``:
    shape ``(n, d)`` (``(n,)`` in 1-D); ``weights``: ``(n,)``, >= 0, normalised (uniform if
    ``None``). Same support, cut-off, cost, methods, defaults and coarsening as
    :func:`wasserstein` (only the grid measure is coarsened; the tokens are used as given, so
    keep ``n`` moderate for ``"exact"``). In 1-D ``"exact"`` delegates to
    :func:`wasserstein_1d_tokens` (exact, ``bound = 0``). ``Distance.bound`` (exact) is
    ``|h| / sqrt(12) + (k - 1) |h| / 2``: one grid measure is approximated.
    """
    grid, p, eps = _check_transport(grid, p, method, reg, max_cells)
    prob = _probability(density, grid, "density")
    x, w = _tokens(tokens, weights, grid.ndim)
    if grid.ndim == 1 and method == "exact":
        value = wasserstein_1d_tokens(prob, grid, x, w, p)
        return Distance(value, p, method, None, int(np.count_nonzero(prob)), x.shape[0])
    if method == "entropic" and eps is None:
        eps = max(grid.spacing) ** p
    k, ((xa, wa),) = _coarsen([prob], grid, int(max_cells))
    total = _transport(wa, w, _cost(xa, x, p), method, eps, num_iter_max, stop_thr)
    return _finish(total, p, method, eps, wa.size, w.size, k, _atom_bound(grid, k), 1)


def cell_points(density: np.ndarray, grid: Grid, sub: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The piecewise-constant law of cell averages ``density`` (grid.shape) as weighted
    points: ``sub^d`` points per cell at the centres of a ``sub``-fold finer lattice, each
    with ``rho dV / sub^d``: points (cells sub^d, d), weights (cells sub^d,). Their W2 to the
    piecewise-constant law is at most ``|h| / (sub sqrt 12)`` (``|h|`` the cell diagonal):
    each point carries a box of side ``h / sub`` centred on it."""
    sub = int(sub)
    if sub < 1:
        raise ValueError(f"metrics.sub: expected an integer >= 1, got {sub}")
    h = np.asarray(grid.spacing, float)
    centres = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    ticks = (np.arange(sub) + 0.5) / sub - 0.5  # (offsets inside a cell, in cells)
    offsets = np.stack(np.meshgrid(*([ticks] * grid.ndim), indexing="ij"), -1).reshape(
        -1, grid.ndim
    )
    points = (centres[:, None, :] + offsets[None, :, :] * h).reshape(-1, grid.ndim)
    mass = np.asarray(density, float).reshape(-1) * float(np.prod(h)) / sub**grid.ndim
    return points, np.repeat(mass, sub**grid.ndim)


def wasserstein_points(
    xa: np.ndarray,
    wa: np.ndarray,
    xb: np.ndarray,
    wb: np.ndarray,
    p: int = 2,
    num_iter_max: int | None = None,
) -> float:
    """Exact ``W_p`` (p = 1, 2) between two weighted point sets xa (m, d), wa (m,) and
    xb (n, d), wb (n,), each normalised to unit mass (POT's network simplex); weights at or
    below :data:`CUTOFF` of their total are dropped. Memory m x n doubles."""
    p = _check_p(p)
    measures = []
    for x, w in ((xa, wa), (xb, wb)):
        x = np.asarray(x, float).reshape(len(w), -1)
        w = np.asarray(w, float)
        keep = w > CUTOFF * w.sum()
        measures.append((x[keep], w[keep] / w[keep].sum()))
    (xa, wa), (xb, wb) = measures
    total = _transport(wa, wb, _cost(xa, xb, p), "exact", None, num_iter_max, 0.0)
    return float(max(total, 0.0) ** (1.0 / p))


# ---- conditional (position-sliced) distances ----------------------------------------------------
def _sliced(values, grid: Grid, name: str, count: int | None = None) -> np.ndarray:
    """Float64 array of shape ``(S, *grid.shape)`` (S = count if given), finite, S >= 1."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"metrics.{name}: expected an array of shape (S, *{grid.shape})") from None
    want = (count if count is not None else "S",) + grid.shape
    if (
        arr.ndim != grid.ndim + 1
        or arr.shape[1:] != grid.shape
        or arr.shape[0] < 1
        or (count is not None and arr.shape[0] != count)
    ):
        raise ValueError(
            f"metrics.{name}: expected a sliced density of shape "
            f"({', '.join(map(str, want))}), got {arr.shape}"
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"metrics.{name}: contains NaN or Inf")
    return arr


def _slice_masses(arr: np.ndarray, grid: Grid) -> np.ndarray:
    """Mass of each slice ``sum_c max(rho_kc, 0) |cell|``, shape ``(S,)``."""
    return np.clip(arr, 0.0, None).reshape(arr.shape[0], -1).sum(axis=1) * grid.cell_volume


def _nu(slice_weights, masses: np.ndarray) -> np.ndarray:
    """Slice weights ``nu`` (S,) summing to 1: ``slice_weights`` normalised, else ``masses``."""
    count = masses.size
    if slice_weights is None:
        if not masses.sum() > 0:
            raise ValueError("metrics.density: every slice has zero mass")
        return masses / masses.sum()
    try:
        nu = np.asarray(slice_weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"metrics.slice_weights: expected {count} numbers") from None
    if nu.shape != (count,) or not np.all(np.isfinite(nu)) or np.any(nu < 0) or not nu.sum() > 0:
        raise ValueError(
            f"metrics.slice_weights: expected {count} finite weights >= 0 with "
            f"a positive sum, got shape {nu.shape}"
        )
    return nu / nu.sum()


def _combine(nu: np.ndarray, distances: dict[int, float], p: int) -> float:
    """``(sum_k nu_k W_k^p)^(1/p)`` over the slices that were compared."""
    total = sum(nu[k] * w**p for k, w in distances.items())
    return float(max(total, 0.0) ** (1.0 / p))


def _compared(mass_a: float, mass_b: float, k: int, names: tuple[str, str]) -> bool:
    """Whether slice k is compared: both masses > 0 (True), both 0 (False), else ValueError
    naming the side with zero mass."""
    if (mass_a > 0) != (mass_b > 0):
        empty = names[0] if mass_b > 0 else names[1]
        raise ValueError(
            f"metrics.{empty}: slice {k} has zero mass on this side only "
            f"({mass_a:.3e} vs {mass_b:.3e}); the conditional distance is "
            f"undefined"
        )
    return bool(mass_a > 0)


def conditional_wasserstein(
    density_a: np.ndarray,
    density_b: np.ndarray,
    grid: Grid,
    slice_weights: np.ndarray | None = None,
    p: int = 2,
    **kwargs,
) -> float:
    """Conditional ``W_{p,nu}`` (p = 1, 2) between two position-sliced densities.

    docs/theory.md, 'Conditional Wasserstein distance': for mu = sum_k nu_k delta_{s_k} (x) mu_k,

        W_{p,nu}(a, b)^p = sum_k nu_k W_p(a_k, b_k)^p,

    with ``a_k, b_k`` slice k of ``density_a, density_b`` (shape ``(S, *grid.shape)``, cell
    averages) normalised to probability measures and ``nu = slice_weights`` (S,) normalised to
    sum 1 (default: the slice masses of ``density_a``, normalised). Per slice: 1-D the exact
    :func:`wasserstein_1d` (``wasserstein`` with ``method="exact"`` delegates to it), 2-D/3-D
    :func:`wasserstein` (POT); ``**kwargs`` (method, reg, max_cells, ...) go to
    :func:`wasserstein`. Slices with zero mass in both densities are skipped; zero mass in one
    only raises ``ValueError``. Returns ``W_{p,nu}`` (not its p-th power).
    """
    grid = _check_grid(grid)
    p = _check_p(p)
    a = _sliced(density_a, grid, "density_a")
    b = _sliced(density_b, grid, "density_b", a.shape[0])
    mass_a, mass_b = _slice_masses(a, grid), _slice_masses(b, grid)
    nu = _nu(slice_weights, mass_a)
    distances = {
        k: wasserstein(a[k], b[k], grid, p=p, **kwargs).value
        for k in range(a.shape[0])
        if _compared(mass_a[k], mass_b[k], k, ("density_a", "density_b"))
    }
    return _combine(nu, distances, p)


def _assign(token_positions, slice_positions, n: int) -> np.ndarray:
    """Slice index (n,) of each token: the slice whose position is ``np.isclose`` to its own."""
    try:
        s = np.asarray(token_positions, dtype=np.float64).reshape(-1)
        levels = np.asarray(slice_positions, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError("metrics.token_positions: expected arrays of numbers") from None
    if s.shape != (n,) or not np.all(np.isfinite(s)):
        raise ValueError(
            f"metrics.token_positions: expected {n} finite positions (one per "
            f"token), got shape {np.shape(token_positions)}"
        )
    match = np.isclose(s[:, None], levels[None, :])
    if not np.all(match.any(axis=1)):
        bad = s[~match.any(axis=1)][0]
        raise ValueError(
            f"metrics.token_positions: a token at s = {bad:g} matches no slice position"
        )
    return np.argmax(match, axis=1)


def _slice_token_distance(
    density: np.ndarray, grid: Grid, tokens: np.ndarray, weights: np.ndarray, p: int, kwargs: dict
) -> float:
    """``W_p`` between one slice (``grid.shape``) and its tokens (m, d) with weights (m,).

    1-D: :func:`wasserstein_tokens`, which for ``method="exact"`` (the default) is the exact
    :func:`wasserstein_1d_tokens`. 2-D/3-D: the tokens binned on the grid (``from_tokens``,
    ``"ngp"``) against the slice with :func:`wasserstein`: comparing grid to grid avoids the
    ``~|h| / 3`` floor of the semi-discrete distance to cell centres.
    """
    if grid.ndim == 1:
        return wasserstein_tokens(density, grid, tokens, weights, p=p, **kwargs).value
    binned = from_tokens(grid, tokens, weights=weights, method="ngp")
    return wasserstein(density, binned, grid, p=p, **kwargs).value


def conditional_wasserstein_tokens(
    density: np.ndarray,
    grid: Grid,
    tokens: np.ndarray,
    token_positions: np.ndarray,
    slice_positions: np.ndarray,
    token_weights: np.ndarray | None = None,
    slice_weights: np.ndarray | None = None,
    p: int = 2,
    **kwargs,
) -> float:
    """Conditional ``W_{p,nu}`` (p = 1, 2) between a sliced density and sliced tokens.

    ``density``: shape ``(S, *grid.shape)``, slice k at position ``slice_positions[k]``;
    ``tokens``: ``(n, d)`` (``(n,)`` in 1-D) at ``token_positions`` (n,), weights
    ``token_weights`` (n,) (uniform if ``None``). Token i belongs to the slice k with
    ``np.isclose(token_positions[i], slice_positions[k])`` (``ValueError`` if none). Then

        W_{p,nu}^p = sum_k nu_k W_p(rho_k, sum_{i in k} w_i delta_{x_i})^p,

    both measures of slice k normalised to probability, ``nu = slice_weights`` normalised
    (default: the slice masses of ``density``, normalised). Per slice: 1-D the exact
    :func:`wasserstein_1d_tokens`; 2-D/3-D the slice's tokens binned on the grid
    (``tpde.grid.from_tokens``, nearest cell) and compared grid to grid with
    :func:`wasserstein` (``**kwargs`` passed on). A slice with no mass and no tokens is skipped;
    one without the other raises ``ValueError``. Returns ``W_{p,nu}``.
    """
    grid = _check_grid(grid)
    p = _check_p(p)
    rho = _sliced(density, grid, "density")
    x, w = _tokens(tokens, token_weights, grid.ndim)
    if np.size(slice_positions) != rho.shape[0]:
        raise ValueError(
            f"metrics.slice_positions: expected {rho.shape[0]} positions (one per "
            f"slice), got {np.size(slice_positions)}"
        )
    owner = _assign(token_positions, slice_positions, x.shape[0])
    masses = _slice_masses(rho, grid)
    nu = _nu(slice_weights, masses)
    token_mass = np.bincount(owner, weights=w, minlength=rho.shape[0])
    distances = {}
    for k in range(rho.shape[0]):
        if _compared(masses[k], token_mass[k], k, ("density", "tokens")):
            mine = owner == k
            distances[k] = _slice_token_distance(rho[k], grid, x[mine], w[mine], p, kwargs)
    return _combine(nu, distances, p)


# ---- Gaussians ---------------------------------------------------------------------------------
def _matrix(mat, d: int, name: str) -> np.ndarray:
    """A finite (d, d) float matrix (a scalar is accepted in 1-D)."""
    try:
        c = np.asarray(mat, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"metrics.{name}: expected a {d}x{d} matrix") from None
    if c.size == 1 and d == 1:
        c = c.reshape(1, 1)
    if c.shape != (d, d) or not np.all(np.isfinite(c)):
        raise ValueError(
            f"metrics.{name}: expected a finite ({d}, {d}) matrix, got shape {c.shape}"
        )
    return c


def _sym_psd(mat, d: int, name: str) -> np.ndarray:
    c = _matrix(mat, d, name)
    scale = float(np.max(np.abs(c))) if c.size else 0.0
    if float(np.max(np.abs(c - c.T))) > 1e-12 * max(scale, 1e-300):
        raise ValueError(f"metrics.{name}: not symmetric; pass (C + C^T) / 2")
    c = 0.5 * (c + c.T)
    if np.linalg.eigvalsh(c)[0] < -1e-12 * max(scale, 1e-300):
        raise ValueError(f"metrics.{name}: not positive semi-definite")
    return c


def _vector(value, d: int | None, name: str) -> np.ndarray:
    try:
        v = np.atleast_1d(np.asarray(value, dtype=np.float64))
    except (TypeError, ValueError):
        raise ValueError(f"metrics.{name}: expected a vector of numbers") from None
    if v.ndim != 1 or (d is not None and v.shape != (d,)) or not np.all(np.isfinite(v)):
        want = f"({d},)" if d is not None else "(d,)"
        raise ValueError(f"metrics.{name}: expected finite shape {want}, got {v.shape}")
    return v


def _sqrtm_psd(c: np.ndarray) -> np.ndarray:
    """Symmetric square root ``V diag(sqrt(max(l, 0))) V^T`` (``eigh``, round-off clipped)."""
    lam, vec = np.linalg.eigh(c)
    return (vec * np.sqrt(np.clip(lam, 0.0, None))) @ vec.T


def bures_wasserstein(mean_a, cov_a, mean_b, cov_b) -> float:
    """Closed-form ``W_2(N(m_a, S_a), N(m_b, S_b))`` (Dowson & Landau 1982; Gelbrich 1990).

    ``W_2^2 = |m_a - m_b|^2 + tr(S_a + S_b - 2 (S_a^{1/2} S_b S_a^{1/2})^{1/2})``.
    Means shape ``(d,)``, covariances ``(d, d)`` symmetric positive semi-definite (1-D: scalars
    allowed, a variance). Square roots by ``eigh`` with round-off negatives clipped to 0; the
    trace term is clipped at 0. Returns ``W_2`` (not squared).
    """
    ma = _vector(mean_a, None, "mean_a")
    d = ma.size
    mb = _vector(mean_b, d, "mean_b")
    sa = _sym_psd(cov_a, d, "cov_a")
    sb = _sym_psd(cov_b, d, "cov_b")
    ra = _sqrtm_psd(sa)
    cross = ra @ sb @ ra
    lam = np.linalg.eigvalsh(0.5 * (cross + cross.T))
    trace = float(np.trace(sa) + np.trace(sb) - 2.0 * np.sum(np.sqrt(np.clip(lam, 0.0, None))))
    return math.sqrt(float(np.sum((ma - mb) ** 2)) + max(trace, 0.0))


# ---- error norms -------------------------------------------------------------------------------
def density_errors(density: np.ndarray, reference: np.ndarray, grid: Grid) -> dict[str, float]:
    """L1 and Linf errors of cell averages, absolute and relative.

    ``L1 = sum_c |a_c - b_c| * cell_volume`` (exact L1 norm of the piecewise-constant
    difference), ``Linf = max_c |a_c - b_c|``, ``L1_rel = L1 / (sum_c |b_c| * cell_volume)``,
    ``Linf_rel = Linf / max_c |b_c|`` (``nan`` if the reference norm is 0). Both arrays have
    shape ``grid.shape``; no normalisation, signs allowed.

    Returns ``{"L1", "Linf", "L1_rel", "Linf_rel"}``.
    """
    grid = _check_grid(grid)
    a = _array(density, grid, "density")
    b = _array(reference, grid, "reference")
    diff = np.abs(a - b)
    l1 = float(diff.sum()) * grid.cell_volume
    linf = float(diff.max())
    ref_l1 = float(np.abs(b).sum()) * grid.cell_volume
    ref_linf = float(np.abs(b).max())
    return {
        "L1": l1,
        "Linf": linf,
        "L1_rel": l1 / ref_l1 if ref_l1 > 0 else math.nan,
        "Linf_rel": linf / ref_linf if ref_linf > 0 else math.nan,
    }


def moment_errors(density: np.ndarray, grid: Grid, mean_ref, cov_ref) -> dict[str, float]:
    """Mass and mean / covariance errors against a reference, from ``tpde.grid.moments``.

    ``mean_error = |m - m_ref| / |m_ref|`` (Euclidean norms; the absolute ``|m - m_ref|`` when
    ``m_ref = 0`` exactly), ``cov_error = ||C - C_ref||_F / ||C_ref||_F`` (Frobenius;
    ``C_ref`` must not be 0). ``m, C`` are the bias-free moments of the density (shape
    ``grid.shape``, mass > 0); ``mean_ref`` shape ``(d,)``, ``cov_ref`` shape ``(d, d)``.

    Returns ``{"mass", "mean_error", "cov_error"}``.
    """
    grid = _check_grid(grid)
    arr = _array(density, grid, "density")
    d = grid.ndim
    m_ref = _vector(mean_ref, d, "mean_ref")
    c_ref = _matrix(cov_ref, d, "cov_ref")
    c_norm = float(np.linalg.norm(c_ref))
    if not c_norm > 0:
        raise ValueError("metrics.cov_ref: is zero; a relative covariance error needs C_ref != 0")
    if not arr.sum() > 0:
        raise ValueError(f"metrics.density: mass must be > 0, got {arr.sum() * grid.cell_volume}")
    total, mu, cov = moments(arr, grid)
    m_norm = float(np.linalg.norm(m_ref))
    dm = float(np.linalg.norm(mu - m_ref))
    return {
        "mass": float(total),
        "mean_error": dm / m_norm if m_norm > 0 else dm,
        "cov_error": float(np.linalg.norm(cov - c_ref)) / c_norm,
    }
