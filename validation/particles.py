"""The interacting-token system: the n-particle model the PDE is the limit of.

docs/theory.md, 'The Transformer PDE'.

Tokens ``X`` (n, d) with weights ``w`` (n,), sum 1 (uniform ``1/n`` for i.i.d. samples;
quadrature weights for the deterministic Gauss-Hermite nodes), move by

    x_i' = Gamma_{mu^n}(x_i),   mu^n = sum_j w_j delta_{x_j},

the same velocity field as the PDE evaluated on the empirical measure (mu^n is an exact weak
solution). Every variant reuses the grid's dense engines (one piece of code per
kernel sum, ``tpde.variants.engines.direct`` and ``tpde.variants.sigmoid``): targets and sources are
the tokens, blocked over targets so that memory stays at ``block x n`` (n = 10^5 fits in
2 x 80 MB). Softmax / multi-head: tilted means at ``A_h x_i``; l2: tilted means of
``w_j e^{-|K x_j|^2}`` at ``2 K^T Q_s x_i``; linear: ``C M2 A x_i`` with the token second
moment; sigmoid: the dense sigmoid sums; Sinkhorn: log-domain Sinkhorn iterations on the
tokens (Sinkformers; docs/theory.md, 'Sinkhorn attention'), warm-started from the previous
evaluation.

Masked (causal) attention (docs/theory.md, 'Masked attention'): tokens are pairs (s_i, x_i)
with positions s_i in [0, 1] fixed in time (``TokenSystem.positions``; the finite model has
s_i = i / n, ``causal_positions``). Token i attends to the tokens j with s_j <= s_i:

    x_i' = Gamma_{mu^n_{<= s_i}}(x_i),   mu^n_{<= s} = sum_{j: s_j <= s} w_j delta_{x_j},

normalised over those sources for softmax / multi-head / l2, the unnormalised sums for
sigmoid / linear. Sinkhorn has no causal form. ``sample_sliced_tokens`` samples tokens from
a position-sliced grid density (``tpde.grid.Positions``).

Time stepping: classical RK4 (default) or SSP-RK3 with a fixed step, landing exactly on the
requested output times. Initial tokens: ``sample_tokens`` (seeded, exact sampling of a
piecewise-constant grid density), ``gauss_hermite_tokens`` (tensor nodes and weights of a
Gaussian, docs/theory.md, 'Gaussian closures'), ``load_tokens`` (.npy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import expit

from tpde.grid import Grid, Positions
from tpde.grid.threads import ensure_policy
from tpde.variants.engines.direct import log_partition, tilted_means
from tpde.variants.parameters import L2Head, ParamSpec, SigmoidHead, SinkhornHead, params_at
from tpde.variants.sigmoid import sigmoid_sums
from tpde.variants.sinkhorn import sinkhorn_iterations

from .brownian import check_noise, flat_increment

__all__ = [
    "TOKEN_VARIANTS",
    "TokenSolution",
    "TokenSystem",
    "causal_positions",
    "gauss_hermite_tokens",
    "load_tokens",
    "quantile_tokens_of_cells",
    "sample_sliced_tokens",
    "sample_tokens",
    "simulate",
    "square_group",
    "SymmetricTokens",
    "symmetric_tokens",
    "token_histograms",
    "token_moments",
]

TOKEN_VARIANTS = ("softmax", "multihead", "linear", "l2", "sinkhorn", "sigmoid")
BLOCK_BYTES = 80 * 2**20  # per block of targets x sources
SIGMOID_DENSE_ROWS = 16  # fewer sigmoid targets than this: dense numpy sum, not numba


# ---- initial tokens -------------------------------------------------------------------------
def sample_tokens(density: np.ndarray, grid: Grid, n: int, seed: int = 0) -> np.ndarray:
    """n i.i.d. tokens (n, d) from the piecewise-constant density of cell averages: a cell by
    its mass, then a uniform point in the cell (exact sampling of that density)."""
    if n < 1:
        raise ValueError(f"tokens.n: expected an integer >= 1, got {n}")
    masses = np.maximum(np.asarray(density, float).reshape(-1), 0.0)
    if not masses.sum() > 0:
        raise ValueError("tokens: the density has no mass to sample from")
    rng = np.random.default_rng(seed)
    cells = rng.choice(masses.size, size=n, p=masses / masses.sum())
    index = np.stack(np.unravel_index(cells, grid.shape), axis=1)
    lower = np.array([grid.edges(a)[0] for a in range(grid.ndim)])
    return lower + (index + rng.random((n, grid.ndim))) * np.asarray(grid.spacing)


def quantile_tokens_of_cells(density: np.ndarray, grid: Grid, n: int) -> np.ndarray:
    """``n`` deterministic tokens (n, 1) of a 1-D density of cell averages: the quantiles
    ``F^{-1}(u_i)`` at the mid-points ``u_i = (i - 1/2) / n`` of the piecewise-constant
    density's CDF ``F`` (piecewise linear, inverted exactly cell by cell). They carry the
    mean field without sampling noise: the token histogram's error is O(1/n) in W1, where
    ``n`` i.i.d. samples have O(n^-1/2)."""
    if n < 1:
        raise ValueError(f"tokens.n: expected an integer >= 1, got {n}")
    if grid.ndim != 1:
        raise ValueError("tokens: mid-quantile tokens are defined in 1-D and on the circle")
    masses = np.maximum(np.asarray(density, float).reshape(-1), 0.0)
    if not masses.sum() > 0:
        raise ValueError("tokens: the density has no mass to sample from")
    cdf = np.concatenate(([0.0], np.cumsum(masses))) / masses.sum()
    u = (np.arange(n) + 0.5) / n
    cell = np.clip(np.searchsorted(cdf, u, side="right") - 1, 0, masses.size - 1)
    share = (u - cdf[cell]) / np.where(masses[cell] > 0, cdf[cell + 1] - cdf[cell], 1.0)
    edges = grid.edges(0)
    return (edges[cell] + np.clip(share, 0.0, 1.0) * grid.spacing[0])[:, None]


def causal_positions(n: int) -> np.ndarray:
    """Positions (n,) of the finite causal model: s_i = i / n, i = 1 .. n."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"tokens.n: expected an integer >= 1, got {n!r}")
    return np.arange(1, n + 1) / n


def sample_sliced_tokens(
    density: np.ndarray, grid: Grid, positions: Positions, per_slice: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``per_slice`` i.i.d. tokens from every slice of a sliced density.

    density: (positions.count, *grid.shape), slice k the cell averages of the joint density
    at s_k = positions.s[k]. Slice k gives ``per_slice`` tokens drawn from density[k]
    (``sample_tokens``, seed k of ``SeedSequence(seed)``) at position s_k, each with weight
    m_k / per_slice, m_k = sum(density[k]) * cell_volume (the actual slice mass, so that a
    density that lost mass through the boundary is sampled as it is); the weights are then
    normalised to sum 1. Returns tokens (count * per_slice, d), their positions
    (count * per_slice,) and weights (count * per_slice,), slice by slice.
    """
    density = positions.check_density(density, grid)
    if isinstance(per_slice, bool) or not isinstance(per_slice, int | np.integer) or per_slice < 1:
        raise ValueError(f"tokens.per_slice: expected an integer >= 1, got {per_slice!r}")
    masses = positions.marginal(density, grid)
    if not np.all(masses > 0):
        k = int(np.argmin(masses > 0))
        raise ValueError(f"tokens: slice {k} (s = {positions.s[k]:g}) has no mass to sample from")
    seeds = np.random.SeedSequence(seed).generate_state(positions.count)
    tokens = [
        sample_tokens(density[k], grid, int(per_slice), int(seeds[k]))
        for k in range(positions.count)
    ]
    weights = np.repeat(masses / per_slice, per_slice)
    return (np.concatenate(tokens), np.repeat(positions.s, per_slice), weights / weights.sum())


def gauss_hermite_tokens(mean: Any, cov: Any, nodes: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Tensor Gauss-Hermite nodes of N(mean, cov): tokens (nodes^d, d) and weights (sum 1).

    Expectations of smooth functions of a Gaussian converge spectrally in ``nodes``
    (40 x 40 nodes in 2-D follow the Gaussian ODEs to about 1e-11 up to t = 1 on the c1 and
    c2 test matrices)."""
    mean = np.atleast_1d(np.asarray(mean, float))
    d = mean.size
    z, w = hermegauss(int(nodes))  # probabilists' Hermite: weight e^{-z^2/2}
    w = w / w.sum()
    grids = np.meshgrid(*([z] * d), indexing="ij")
    points = np.stack([g.reshape(-1) for g in grids], axis=1)
    weights = np.ones(points.shape[0])
    for wg in np.meshgrid(*([w] * d), indexing="ij"):
        weights *= wg.reshape(-1)
    root = np.linalg.cholesky(np.atleast_2d(np.asarray(cov, float)))
    return mean + points @ root.T, weights


def load_tokens(path: str, ndim: int | None = None) -> np.ndarray:
    """Tokens (n, d) from a .npy file (an (n,) array is read as 1-D tokens)."""
    tokens = np.load(path)
    if tokens.ndim == 1:
        tokens = tokens[:, None]
    if tokens.ndim != 2 or (ndim is not None and tokens.shape[1] != ndim):
        raise ValueError(
            f"tokens.file: expected an (n, {ndim or 'd'}) array in {path}, got shape {tokens.shape}"
        )
    if not np.all(np.isfinite(tokens)):
        raise ValueError(f"tokens.file: {path} holds non-finite entries")
    return np.asarray(tokens, float)


def token_moments(
    tokens: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted mean (d,) and covariance (d, d) of a token cloud."""
    w = _weights(tokens, weights)
    mean = w @ tokens
    centred = tokens - mean
    return mean, (centred * w[:, None]).T @ centred


def _weights(tokens: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    if weights is None:
        return np.full(tokens.shape[0], 1.0 / tokens.shape[0])
    w = np.asarray(weights, float)
    if w.shape != (tokens.shape[0],) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(
            f"tokens.weights: expected {tokens.shape[0]} non-negative weights with a positive sum"
        )
    return w / w.sum()


# ---- the velocity of the token system -------------------------------------------------------
def _field(
    variant: str,
    targets: np.ndarray,
    sources: np.ndarray,
    weights: np.ndarray,
    params: Any,
    block: int,
) -> np.ndarray:
    """Gamma_mu(x) at the targets x (P, d) for mu = sum_j w_j delta_{y_j}: sources y (S, d),
    weights w (S,) (used as given; the normalised variants normalise over the sources).

    softmax / multi-head: sum_h C_h m_h(A_h x), m_h the tilted mean of mu at A_h x; linear:
    sum_h C_h (sum_j w_j y_j y_j^T) A_h x; l2: C m(2 K^T scale Q x) of w_j e^{-|K y_j|^2};
    sigmoid: C sum_j w_j sigma(<A x, y_j> + bias) y_j. Sinkhorn is ``TokenSystem._sinkhorn``.
    Returns (P, d).
    """
    if variant in ("softmax", "multihead", "linear"):
        heads = [params] if hasattr(params, "A") else list(params)
        out = np.zeros_like(targets)
        if variant == "linear":
            second = (sources * weights[:, None]).T @ sources
            for head in heads:
                out += targets @ (head.C @ second @ head.A).T
            return out
        for head in heads:
            out += tilted_means(targets @ head.A.T, sources, weights, block) @ head.C.T
        return out
    if variant == "l2":
        if not isinstance(params, L2Head):
            raise ValueError("tokens: the l2 variant needs an L2Head (Q, K, V)")
        reweighted = weights * np.exp(-np.sum((sources @ params.K.T) ** 2, axis=1))
        if not reweighted.sum() > 0:
            raise ValueError("tokens: the l2 weights e^{-|K y|^2} underflow for every token")
        coupling = 2.0 * params.K.T @ (params.scale * params.Q)
        return tilted_means(targets @ coupling.T, sources, reweighted, block) @ params.C.T
    if not isinstance(params, SigmoidHead):
        raise ValueError("tokens: the sigmoid variant needs a SigmoidHead (A, V, bias)")
    return _sigmoid_sums(targets @ params.A.T, params.bias, sources, weights) @ params.C.T


def _sigmoid_sums(
    c: np.ndarray, bias: float, sources: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """sum_j w_j sigma(<c_i, y_j> + bias) y_j for every row of c (P, d) -> (P, d).

    The parallel numba kernel (``tpde.variants.sigmoid``) pays a thread launch per call, too
    much for the one-token levels of the causal model: fewer targets than
    ``SIGMOID_DENSE_ROWS`` and than sources (never the unmasked case, where P = S) use a dense
    (P, S) numpy sum with ``scipy.special.expit`` instead (equal up to round-off).
    """
    if c.shape[0] < min(SIGMOID_DENSE_ROWS, sources.shape[0]):
        return (expit(c @ sources.T + bias) * weights) @ sources
    sums = np.zeros_like(c)
    sigmoid_sums(
        np.ascontiguousarray(c),
        bias,
        np.ascontiguousarray(sources),
        np.ascontiguousarray(weights),
        sums,
    )
    return sums


def _check_positions(positions: Any) -> np.ndarray:
    """Token positions as a float (n,) array, finite and in [0, 1], else ValueError."""
    s = np.asarray(positions, dtype=float)
    if s.ndim != 1 or not np.all(np.isfinite(s)) or np.any((s < 0) | (s > 1)):
        raise ValueError(
            f"tokens.positions: expected a 1-D array of finite positions in "
            f"[0, 1], got shape {s.shape}"
        )
    return s


@dataclass
class TokenSystem:
    """Velocity of the token system for one variant (``TOKEN_VARIANTS``).

    params: the same parameter specification as the grid variant (a head, heads, Layers or a
    callable of t). Sinkhorn: ``tol`` on the marginal error, ``max_iter``; the potentials of
    the last evaluation warm-start the next one, ``iterations`` records the counts.
    positions: None (unmasked), or the token positions (n,) in [0, 1] of masked (causal)
    attention: token i attends to the tokens j with positions[j] <= positions[i]. Sinkhorn
    has no causal form.
    """

    variant: str
    params: ParamSpec
    tol: float = 1e-12
    max_iter: int = 2000
    iterations: list[int] = field(default_factory=list)
    _potentials: tuple | None = field(default=None, repr=False)
    positions: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.variant not in TOKEN_VARIANTS:
            raise ValueError(
                f"tokens.variant: unknown {self.variant!r}; choose one of "
                f"{', '.join(TOKEN_VARIANTS)}"
            )
        if self.positions is not None:
            if self.variant == "sinkhorn":
                raise ValueError(
                    "tokens.positions: Sinkhorn attention has no causal form (its "
                    "plan couples every pair of tokens); drop the positions"
                )
            self.positions = _check_positions(self.positions)

    def block(self, n: int) -> int:
        return int(max(16, min(4096, BLOCK_BYTES // (8 * max(n, 1)))))

    def velocity(self, tokens: np.ndarray, weights: np.ndarray, t: float) -> np.ndarray:
        """Gamma_{mu^n}(x_i) for every token (masked: Gamma_{mu^n_{<= s_i}}(x_i)): (n, d)."""
        params = params_at(self.params, t)
        block = self.block(tokens.shape[0])
        if self.variant == "sinkhorn":
            return self._sinkhorn(tokens, weights, params, t, block)
        if self.positions is None:
            return _field(self.variant, tokens, tokens, weights, params, block)
        return self._masked(tokens, weights, params, block)

    def _masked(
        self, tokens: np.ndarray, weights: np.ndarray, params: Any, block: int
    ) -> np.ndarray:
        """Causal velocity (n, d): the tokens of each position level L (np.unique) are the
        targets, the tokens with position <= L (a prefix of the stably position-sorted
        tokens) the sources. Sum over levels of targets x sources <= n^2 kernel terms; the
        velocity of a level reads only the tokens at positions <= L (bit-for-bit causal)."""
        n, positions = tokens.shape[0], self.positions
        assert positions is not None  # (the caller's branch)
        if positions.shape != (n,):
            raise ValueError(
                f"tokens.positions: expected shape ({n},) (one per token), got {positions.shape}"
            )
        order = np.argsort(positions, kind="stable")
        sources, source_weights = tokens[order], weights[order]
        _, starts = np.unique(positions[order], return_index=True)
        ends = np.append(starts[1:], n)
        out = np.empty_like(tokens)
        for lo, hi in zip(starts, ends, strict=True):
            out[order[lo:hi]] = _field(
                self.variant, sources[lo:hi], sources[:hi], source_weights[:hi], params, block
            )
        return out

    def _sinkhorn(self, tokens, weights, params, t, block) -> np.ndarray:
        if not isinstance(params, SinkhornHead):
            raise ValueError("tokens: the sinkhorn variant needs a SinkhornHead (A, V, eps)")
        eps = params.eps
        forward, backward = tokens @ (params.A / eps).T, tokens @ params.A / eps
        n = tokens.shape[0]
        f, g = (
            self._potentials
            if self._potentials is not None and self._potentials[0].shape == (n,)
            else (np.zeros(n), np.zeros(n))
        )

        def half(potential, c):
            top = potential.max()
            return (
                -eps * log_partition(c, tokens, weights * np.exp((potential - top) / eps), block)
                - top
            )

        f, g, count, error = sinkhorn_iterations(
            lambda pot: half(pot, forward),
            lambda pot: half(pot, backward),
            weights,
            f,
            g,
            eps,
            self.tol,
            self.max_iter,
        )
        if not error <= self.tol:
            raise RuntimeError(
                f"tokens: Sinkhorn marginal error {error:.2e} > tol "
                f"{self.tol:.0e} after {count} iterations at t = {t:.6g}"
            )
        self.iterations.append(count)
        self._potentials = (f, g)
        tilted = weights * np.exp((g - g.max()) / eps)
        return tilted_means(forward, tokens, tilted, block) @ params.C.T


def square_group(d: int = 2) -> np.ndarray:
    """The symmetries of the square / cube ``[-1, 1]^d``: every signed permutation matrix,
    (2^d d!, d, d), the identity first (the hyperoctahedral group)."""
    import itertools

    out = []
    for perm in itertools.permutations(range(d)):
        for signs in itertools.product((1.0, -1.0), repeat=d):
            g = np.zeros((d, d))
            g[np.arange(d), perm] = signs
            out.append(g)
    return np.array(out)


def symmetric_tokens(representatives: np.ndarray, group: np.ndarray) -> np.ndarray:
    """The images ``g x`` of representatives x (m, d) under every g of ``group`` (G, d, d),
    stacked block by block: (G m, d), the identity's block first when group[0] is I."""
    reps = np.asarray(representatives, float)
    return np.concatenate([reps @ g.T for g in group])


@dataclass
class SymmetricTokens:
    """A token system whose tokens are the images of m representatives under a group of
    orthogonal maps g with ``Gamma(g x) = g Gamma(x)`` (e.g. signed permutations for
    heads ``A = a I``, ``C = c I``): the velocity of the G m tokens (laid out by
    :func:`symmetric_tokens`) from the m representatives' only, ``u(g x) = g u(x)``, G times
    cheaper and symmetric to the last bit (a signed permutation is exact in floating
    point, so each block of the RK stages stays the exact image of the first).

    The caller checks the equivariance (heads commuting with the group); equal weights."""

    system: TokenSystem
    group: np.ndarray

    def velocity(self, tokens: np.ndarray, weights: np.ndarray, t: float) -> np.ndarray:
        G = len(self.group)
        m = tokens.shape[0] // G
        params = params_at(self.system.params, t)
        block = self.system.block(tokens.shape[0])
        u = _field(self.system.variant, tokens[:m], tokens, weights, params, block)
        return symmetric_tokens(u, self.group)


# ---- time integration -----------------------------------------------------------------------
@dataclass
class TokenSolution:
    """Tokens at the output times: ``times`` (m,), ``tokens`` (m, n, d), ``weights`` (n,)."""

    times: np.ndarray
    tokens: np.ndarray
    weights: np.ndarray

    def at(self, t: float) -> np.ndarray:
        i = int(np.argmin(np.abs(self.times - t)))
        if not np.isclose(self.times[i], t, rtol=0, atol=1e-12 * max(1.0, abs(t))):
            raise ValueError(f"tokens: t = {t} is not an output time; pass it in times=")
        return self.tokens[i]

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Means (m, d) and covariances (m, d, d) at the output times."""
        pairs = [token_moments(x, self.weights) for x in self.tokens]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def simulate(
    system: TokenSystem | SymmetricTokens,
    tokens: np.ndarray,
    t_end: float,
    dt: float,
    weights: np.ndarray | None = None,
    times: Sequence[float] | None = None,
    method: str = "rk4",
    t_start: float = 0.0,
    noise: float = 0.0,
    seed: int = 0,
) -> TokenSolution:
    """Integrate the token system from t_start to t_end with a fixed step (RK4 or SSP-RK3).

    tokens: (n, d); times: output times (default: t_start and t_end); each step is
    shortened to land on them. Raises if a token velocity is not finite. ``noise`` eps > 0:
    ``dX = Gamma dt + sqrt(2 eps) dB``, each step split around exact Brownian substeps of
    half its length (:mod:`.brownian`: weak order 2), drawn from ``seed``.
    """
    if method not in ("rk4", "ssprk3"):
        raise ValueError(f"tokens.method: unknown {method!r}; choose rk4 or ssprk3")
    if not (dt > 0 and t_end > t_start):
        raise ValueError(
            f"tokens.dt: expected dt > 0 and t_end > t_start, got dt = {dt}, "
            f"t = [{t_start}, {t_end}]"
        )
    # one BLAS thread, as in a grid run: the dense sums are BLAS products, and OpenBLAS's
    # threads spin-wait after each one (tpde particles with 4000 tokens: 48 -> 24 CPU s)
    ensure_policy()
    x = np.array(tokens, dtype=float, ndmin=2)
    w = _weights(x, weights)
    noise = check_noise(noise)
    rng = np.random.default_rng(seed)
    outputs = sorted(set([float(t_start), float(t_end)] + [float(s) for s in (times or [])]))
    saved, t = [x.copy()], float(t_start)

    def rhs(state, time):
        u = system.velocity(state, w, time)
        if not np.all(np.isfinite(u)):
            raise FloatingPointError(f"tokens: non-finite velocity at t = {time:.6g}")
        return u

    for target in outputs[1:]:
        while t < target - 1e-14 * max(1.0, abs(target)):
            h = min(dt, target - t)
            if noise:
                x = flat_increment(x, 0.5 * h, noise, rng)
            if method == "rk4":
                k1 = rhs(x, t)
                k2 = rhs(x + 0.5 * h * k1, t + 0.5 * h)
                k3 = rhs(x + 0.5 * h * k2, t + 0.5 * h)
                k4 = rhs(x + h * k3, t + h)
                x = x + h / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
            else:
                y1 = x + h * rhs(x, t)
                y2 = 0.75 * x + 0.25 * (y1 + h * rhs(y1, t + h))
                x = x / 3.0 + 2.0 / 3.0 * (y2 + h * rhs(y2, t + 0.5 * h))
            if noise:
                x = flat_increment(x, 0.5 * h, noise, rng)
            t = t + h if target - (t + h) > 1e-14 * max(1.0, abs(target)) else target
        saved.append(x.copy())
    return TokenSolution(np.array(outputs), np.array(saved), w)


def _histogram(tokens: np.ndarray, weights: np.ndarray, grid: Grid) -> np.ndarray:
    """Cell averages of the weighted tokens (n, d) on ``grid``: weight per cell / volume."""
    edges = [grid.edges(a) for a in range(grid.ndim)]
    counts, _ = np.histogramdd(tokens, bins=edges, weights=weights)
    return counts / grid.cell_volume


def token_histograms(
    solution: TokenSolution,
    grid: Grid,
    positions: Positions | None = None,
    token_s: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of every time of ``solution`` as cell averages on ``grid``, with unit
    mass (the run's initial density's, up to what is outside the box): the normalised
    token weights ``(n,)`` and the densities ``(time, *grid.shape)``; with ``positions``
    (masked attention; ``token_s`` each token's position) one histogram per slice, of the
    tokens whose position is ``s_k``: ``(time, S, *grid.shape)``."""
    count = len(solution.tokens[0])
    w = np.full(count, 1.0) if solution.weights is None else np.asarray(solution.weights, float)
    w = w / w.sum()
    if positions is None:
        return w, np.stack([_histogram(x, w, grid) for x in solution.tokens])
    if token_s is None:
        raise ValueError("token_histograms: positions need each token's position token_s")
    slice_of = np.argmin(np.abs(np.subtract.outer(token_s, positions.s)), axis=1)
    density = np.stack(
        [
            np.stack(
                [
                    _histogram(x[slice_of == k], w[slice_of == k], grid)
                    for k in range(positions.count)
                ]
            )
            for x in solution.tokens
        ]
    )
    return w, density
