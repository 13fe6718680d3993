"""Gaussian closure of the Transformer PDE: mean/covariance ODEs and their closed forms.

Reference: docs/theory.md, sections 'Conventions', 'Gaussian closures' and 'Closed forms'
(cited below by section title).

Convention ('Conventions'): the attention matrix is ``A = K^T Q`` (d x d) and the softmax
kernel is ``exp(<A x, y>) = exp(y^T A x)``; particle logits are ``L = (X A^T) X^T``.

Mechanism ('Gaussian closures'): on a Gaussian ``mu = N(alpha, Sigma)`` every variant below has an
affine velocity field ``Gamma(x) = b + M x``, so the flow keeps ``mu`` Gaussian and

    alpha' = b + M alpha,        Sigma' = M Sigma + Sigma M^T.

Each variant is written once, as its affine field (``*_field``); the ODE right-hand sides
(``*_rhs``, ``gaussian_rhs``) are derived from it, and the tests compare them with the
explicit formulas of docs/theory.md, 'Gaussian closures'.

Variants (``VARIANTS``) and their parameters (defined in ``tpde.variants.parameters``, shared
with the grid variants and the token system):

* ``"softmax"``    ``Head(A, V, W=None)``
* ``"linear"``     ``Head(A, V, W=None)``
* ``"l2"``         ``L2Head(Q, K, V, scale=1.0, W=None)``, kernel exp(-|scale Q x - K y|^2)
* ``"multihead"``  a sequence of ``Head`` (one per head, ``C_h = W_h V_h``)
* ``"sinkhorn"``   ``SinkhornHead(A, V, W=None, eps=1.0)`` or ``Head`` (eps = 1)

In every head the value matrix applied to the attention average is ``C = W V`` (``C = V``
without ``W``): ``V`` is d x d, or k x d together with an output matrix ``W`` (d x k).

Time dependence ('Layer-wise parameters': every ODE holds as written with ``A(t), V(t)``):
a parameter specification is a constant parameter object, piecewise-constant ``Layers``
(or a mapping ``{"layers": [(t_start, params), ...]}``), or a callable ``t -> params``;
``params_at(spec, t)`` resolves it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.integrate import solve_ivp
from scipy.linalg import expm

from tpde.variants.parameters import (
    Head,
    L2Head,
    Layers,
    Params,
    ParamSpec,
    SinkhornHead,
    as_param_spec,
    checked_matrix,
    head_from_qk,
    params_at,
    shape_str,
)

Field = tuple[np.ndarray, np.ndarray]  # (b (d,), M (d, d)): Gamma(x) = b + M x

__all__ = [
    "VARIANTS",
    "GaussianSolution",
    "Head",
    "L2Head",
    "Layers",
    "NotPositiveDefiniteError",
    "SinkhornHead",
    "affine_field",
    "gaussian_rhs",
    "head_from_qk",
    "l2_field",
    "l2_isotropic_time",
    "l2_rhs",
    "linear_field",
    "linear_rhs",
    "multihead_field",
    "multihead_rhs",
    "params_at",
    "sinkhorn_cross_covariance",
    "sinkhorn_field",
    "sinkhorn_isotropic_time",
    "sinkhorn_mean",
    "sinkhorn_rhs",
    "softmax_blowup_time",
    "softmax_field",
    "softmax_mean_scalar",
    "softmax_rank_deficient_limit",
    "softmax_rhs",
    "softmax_scalar_v_covariance",
    "softmax_scalar_v_inverse_covariance",
    "solve",
    "validate_params",
]

VARIANTS: tuple[str, ...] = ("softmax", "linear", "l2", "multihead", "sinkhorn")


class NotPositiveDefiniteError(ValueError):
    """A covariance matrix that must be symmetric positive definite is not."""


def validate_params(variant: str, params: Any, d: int, name: str = "attention") -> None:
    """Check that ``params`` suit ``variant`` in dimension d; ValueError naming the field.

    Example message: ``attention.A: expected 2 x 2, got 3 x 3``.
    """
    _check_variant(variant)

    def check_head(p: Any, where: str, kinds: tuple[type[Head] | type[L2Head], ...]) -> None:
        if not isinstance(p, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise ValueError(
                f"{where}: expected {names} for variant '{variant}', got {type(p).__name__}"
            )
        if isinstance(p, L2Head):
            checked_matrix(f"{where}.Q", p.Q, (None, d), f"k x {d}")
            checked_matrix(f"{where}.K", p.K, p.Q.shape, f"{shape_str(p.Q.shape)} (the shape of Q)")
        else:
            checked_matrix(f"{where}.A", p.A, (d, d), f"{d} x {d}")
        if p.W is None:
            checked_matrix(f"{where}.V", p.V, (d, d), f"{d} x {d} (no W given)")
        else:
            checked_matrix(f"{where}.V", p.V, (None, d), f"k x {d}")
            checked_matrix(f"{where}.W", p.W, (d, p.V.shape[0]), f"{d} x {p.V.shape[0]}")

    if variant in ("softmax", "linear"):
        check_head(params, name, (Head,))
    elif variant == "l2":
        check_head(params, name, (L2Head,))
    elif variant == "sinkhorn":
        check_head(params, name, (SinkhornHead, Head))
    else:
        heads = _heads(params)
        if not heads:
            raise ValueError(f"{name}.heads: expected at least one Head, got none")
        for i, h in enumerate(heads):
            check_head(h, f"{name}.heads[{i}]", (Head,))


def _heads(params: Any) -> list[Any]:
    if isinstance(params, (Head, L2Head, SinkhornHead)):
        return [params]
    if isinstance(params, Sequence) and not isinstance(params, str):
        return list(params)
    raise ValueError(
        f"attention.heads: expected a sequence of Head for variant 'multihead', "
        f"got {type(params).__name__}"
    )


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {', '.join(VARIANTS)}, got {variant!r}")


# ---- small linear algebra --------------------------------------------------------------------
def _sym(S: np.ndarray) -> np.ndarray:
    return 0.5 * (S + S.T)


def _spd_eigh(Sigma: np.ndarray, name: str = "Sigma") -> tuple[np.ndarray, np.ndarray]:
    w, U = np.linalg.eigh(_sym(np.asarray(Sigma, float)))
    if not w[0] > 0:
        raise NotPositiveDefiniteError(
            f"{name}: not positive definite (smallest eigenvalue {w[0]:.3e})"
        )
    return w, U


def _spd_sqrt_pair(Sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Sigma^{1/2}, Sigma^{-1/2}) for symmetric positive definite Sigma."""
    w, U = _spd_eigh(Sigma)
    r = np.sqrt(w)
    return (U * r) @ U.T, (U / r) @ U.T


# ---- affine fields and right-hand sides (docs/theory.md, 'Gaussian closures') ----------------
def softmax_field(alpha: np.ndarray, Sigma: np.ndarray, params: Head) -> Field:
    """Softmax field on N(alpha, Sigma) ('Softmax on Gaussians'): Gamma(x) = C (alpha + Sigma A x).

    The tilted law exp(<A x, y>) N(alpha, Sigma)(dy) / Z is N(alpha + Sigma A x, Sigma), so
    b = C alpha, M = C Sigma A.  alpha: (d,), Sigma: (d, d); returns b (d,), M (d, d).
    """
    C = params.C
    return C @ alpha, C @ Sigma @ params.A


def linear_field(alpha: np.ndarray, Sigma: np.ndarray, params: Head) -> Field:
    """Linear-attention field ('Linear attention on Gaussians'): C (Sigma + alpha alpha^T) A x.

    Gamma(x) = int <A x, y> C y dmu(y) = C M2 A x with M2 the second moment; b = 0.
    """
    d = alpha.shape[0]
    return np.zeros(d), params.C @ (Sigma + np.outer(alpha, alpha)) @ params.A


def l2_field(alpha: np.ndarray, Sigma: np.ndarray, params: L2Head) -> Field:
    """l2 field ('l2 on Gaussians'), kernel exp(-|Qs x - K y|^2) with Qs = scale Q:

    Gamma(x) = C (I + 2 Sigma K^T K)^{-1} (alpha + 2 Sigma K^T Qs x)
    (posterior mean of y under the weight exp(-|Qs x - K y|^2) N(alpha, Sigma)), so
    b = C S^{-1} alpha, M = 2 C S^{-1} Sigma K^T Qs, S = I + 2 Sigma K^T K.
    """
    K = params.K
    Qs = params.scale * params.Q
    d = alpha.shape[0]
    S = np.eye(d) + 2.0 * Sigma @ K.T @ K
    rhs = np.column_stack([alpha, 2.0 * Sigma @ K.T @ Qs])
    sol = np.linalg.solve(S, rhs)
    C = params.C
    return C @ sol[:, 0], C @ sol[:, 1:]


def multihead_field(
    alpha: np.ndarray, Sigma: np.ndarray, params: Sequence[Head]
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head field ('Multi-head on Gaussians'): sum_h C_h (alpha + Sigma A_h x).

    C_h = W_h V_h; b = sum_h C_h alpha, M = sum_h C_h Sigma A_h.
    """
    b = np.zeros_like(alpha, dtype=float)
    M = np.zeros_like(Sigma, dtype=float)
    for h in _heads(params):
        bh, Mh = softmax_field(alpha, Sigma, h)
        b += bh
        M += Mh
    return b, M


def sinkhorn_cross_covariance(Sigma: np.ndarray, A: np.ndarray, eps: float = 1.0) -> np.ndarray:
    """Cross-covariance C = E_pi[(x - alpha)(y - alpha)^T] of the Sinkhorn plan of
    N(alpha, Sigma) with itself (docs/theory.md, 'Sinkhorn on Gaussians').

    B = Sigma^{1/2} A^T Sigma^{1/2} / eps,  D = 2 B (I + (I + 4 B^T B)^{1/2})^{-1},
    C = Sigma^{1/2} D Sigma^{1/2}.  C solves Sigma^{-1} C (Sigma - C^T Sigma^{-1} C)^{-1} = A^T/eps.
    Sigma: (d, d) SPD (NotPositiveDefiniteError otherwise), A: (d, d); returns (d, d).
    """
    root, _ = _spd_sqrt_pair(Sigma)
    return root @ _sinkhorn_D(root, A, eps) @ root


def _sinkhorn_D(root: np.ndarray, A: np.ndarray, eps: float) -> np.ndarray:
    d = root.shape[0]
    B = root @ A.T @ root / eps
    w, U = np.linalg.eigh(np.eye(d) + 4.0 * B.T @ B)
    X = np.eye(d) + (U * np.sqrt(w)) @ U.T  # symmetric positive definite
    return np.linalg.solve(X, 2.0 * B.T).T  # 2 B X^{-1}


def sinkhorn_field(
    alpha: np.ndarray, Sigma: np.ndarray, params: SinkhornHead | Head
) -> tuple[np.ndarray, np.ndarray]:
    """Sinkhorn field ('Sinkhorn on Gaussians'): Gamma(x) = V (alpha + C^T Sigma^{-1} (x - alpha)).

    With C = Sigma^{1/2} D Sigma^{1/2}: M = V Sigma^{1/2} D^T Sigma^{-1/2} (= V C^T Sigma^{-1}),
    b = V alpha - M alpha.  (V stands for W V when W is given; eps = 1 for a plain Head.)
    """
    eps = getattr(params, "eps", 1.0)
    root, inv_root = _spd_sqrt_pair(Sigma)
    D = _sinkhorn_D(root, params.A, eps)
    Cv = params.C
    M = Cv @ root @ D.T @ inv_root
    return Cv @ alpha - M @ alpha, M


_FIELDS: dict[str, Callable[[np.ndarray, np.ndarray, Any], Field]] = {
    "softmax": softmax_field,
    "linear": linear_field,
    "l2": l2_field,
    "multihead": multihead_field,
    "sinkhorn": sinkhorn_field,
}


def affine_field(variant: str, alpha: Any, Sigma: Any, params: Params) -> Field:
    """Affine velocity field Gamma(x) = b + M x of ``variant`` on N(alpha, Sigma).

    docs/theory.md, 'Gaussian closures'.

    alpha: (d,), Sigma: (d, d) symmetric; returns b: (d,), M: (d, d).
    """
    _check_variant(variant)
    return _FIELDS[variant](np.asarray(alpha, float), np.asarray(Sigma, float), params)


def _moment_rhs(
    b: np.ndarray, M: np.ndarray, alpha: np.ndarray, Sigma: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    MS = M @ Sigma
    return b + M @ alpha, MS + MS.T


def gaussian_rhs(variant: str, alpha: Any, Sigma: Any, params: Params) -> Field:
    """(alpha', Sigma') = (b + M alpha, M Sigma + Sigma M^T) for the field of ``variant``.

    docs/theory.md, 'Gaussian closures'; alpha: (d,), Sigma: (d, d); returns ((d,), (d, d)).
    """
    alpha = np.asarray(alpha, float)
    Sigma = np.asarray(Sigma, float)
    b, M = affine_field(variant, alpha, Sigma, params)
    return _moment_rhs(b, M, alpha, Sigma)


def softmax_rhs(alpha, Sigma, params: Head):
    """Softmax ('Softmax on Gaussians'): alpha' = C (I + Sigma A) alpha,
    Sigma' = C Sigma A Sigma + (.)^T."""
    return gaussian_rhs("softmax", alpha, Sigma, params)


def linear_rhs(alpha, Sigma, params: Head):
    """Linear ('Linear attention on Gaussians'): alpha' = C (Sigma + a a^T) A alpha,
    Sigma' = C (Sigma + a a^T) A Sigma + (.)^T with a = alpha."""
    return gaussian_rhs("linear", alpha, Sigma, params)


def l2_rhs(alpha, Sigma, params: L2Head):
    """l2 ('l2 on Gaussians'): alpha' = C (I + 2 Sigma K^T K)^{-1} (I + 2 Sigma K^T Qs) alpha,
    Sigma' = 2 C Sigma (I + 2 K^T K Sigma)^{-1} K^T Qs Sigma + (.)^T, Qs = scale Q."""
    return gaussian_rhs("l2", alpha, Sigma, params)


def multihead_rhs(alpha, Sigma, params: Sequence[Head]):
    """Multi-head ('Multi-head on Gaussians'): alpha' = sum_h C_h (I + Sigma A_h) alpha,
    Sigma' = sum_h C_h Sigma A_h Sigma + (.)^T."""
    return gaussian_rhs("multihead", alpha, Sigma, params)


def sinkhorn_rhs(alpha, Sigma, params: SinkhornHead | Head):
    """Sinkhorn ('Sinkhorn on Gaussians'): alpha' = V alpha, Sigma' = V C^T + C V^T (C the plan's
    cross-covariance, ``sinkhorn_cross_covariance``)."""
    return gaussian_rhs("sinkhorn", alpha, Sigma, params)


# ---- the ODE solver --------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class GaussianSolution:
    """Solution of the Gaussian moment ODEs returned by ``solve``.

    times: (T,); means: (T, d); covariances: (T, d, d); status: "completed", "blowup"
    (lambda_max(Sigma) reached blowup_threshold * lambda_max(Sigma0)), "not_positive_definite"
    (Sigma lost positive definiteness) or "failed" (the integrator gave up, see message);
    status_time: t_end, or the time at which the run stopped.  ``at(t)`` evaluates the dense
    output anywhere in [t0, status_time].
    """

    variant: str
    times: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    status: str
    status_time: float
    message: str
    t0: float
    _segments: tuple[tuple[float, float, Any], ...] = field(repr=False)
    _dim: int = field(repr=False)

    def at(self, t: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, covariance) at t: shapes (d,), (d, d) for scalar t; (T, d), (T, d, d) else."""
        ts = np.asarray(t, float)
        flat = np.atleast_1d(ts).ravel()
        lo, hi = self.t0, self.status_time
        slack = 1e-12 * max(1.0, abs(hi))
        if flat.size and (flat.min() < lo - slack or flat.max() > hi + slack):
            raise ValueError(
                f"t: expected values in [{lo}, {hi}], got [{flat.min()}, {flat.max()}]"
            )
        y = np.empty((flat.size, self._state_size()))
        for i, tt in enumerate(flat):
            y[i] = self._dense(tt)
        means, covs = _unpack_many(y, self._dim)
        if ts.ndim == 0:
            return means[0], covs[0]
        return means, covs

    def _state_size(self) -> int:
        d = self._dim
        return d + d * (d + 1) // 2

    def _dense(self, t: float) -> np.ndarray:
        """Right-continuous at layer starts: the later segment wins (the values agree)."""
        starts = [seg[0] for seg in self._segments]
        t_lo, t_hi, sol = self._segments[max(bisect.bisect_right(starts, t) - 1, 0)]
        return sol(min(max(t, t_lo), t_hi))


def _pack(alpha: np.ndarray, Sigma: np.ndarray) -> np.ndarray:
    iu = np.triu_indices(alpha.shape[0])
    return np.concatenate([alpha, Sigma[iu]])


def _unpack(y: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    iu = np.triu_indices(d)
    S = np.zeros((d, d))
    S[iu] = y[d:]
    S = S + S.T
    S[np.diag_indices(d)] *= 0.5
    return y[:d], S


def _unpack_many(y: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    iu = np.triu_indices(d)
    S = np.zeros((y.shape[0], d, d))
    S[:, iu[0], iu[1]] = y[:, d:]
    S[:, iu[1], iu[0]] = y[:, d:]
    return y[:, :d].copy(), S


def solve(
    variant: str,
    mean0: Any,
    cov0: Any,
    params: ParamSpec,
    t_end: float,
    times: Any = None,
    rtol: float = 1e-12,
    atol: float = 1e-14,
    blowup_threshold: float | None = 1e8,
    t0: float = 0.0,
    noise: float = 0.0,
) -> GaussianSolution:
    """Integrate the Gaussian moment ODEs of ``variant`` ('Gaussian closures') from t0 to t_end.

    State: alpha (d,) and the upper triangle of Sigma (symmetric by construction); scipy
    ``solve_ivp`` with DOP853 and dense output.  Piecewise-constant ``Layers`` are integrated
    segment by segment, restarting at every layer start (no step straddles a jump).

    Stops early, with ``status`` and ``status_time`` set, when lambda_max(Sigma) exceeds
    ``blowup_threshold * lambda_max(cov0)`` ("blowup", a terminal event located on the dense
    output; None disables it) or when lambda_min(Sigma) reaches 0 ("not_positive_definite").

    mean0: (d,); cov0: (d, d) SPD; params: see ``params_at``; times: output times in
    [t0, t_end] (those after an early stop are dropped); None gives the integrator's steps.
    noise: eps >= 0 of the noisy PDE ``d/dt mu + div(mu Gamma) = eps Delta mu``
    (docs/theory.md, 'Noise: the Gaussian reference'): the field on a Gaussian is affine, so
    the law stays Gaussian and the covariance ODE gains ``+ 2 eps I`` (the mean's is unchanged).
    """
    _check_variant(variant)
    mean0 = np.asarray(mean0, float)
    if mean0.ndim != 1:
        raise ValueError(f"mean0: expected a vector of length d, got shape {mean0.shape}")
    d = mean0.shape[0]
    cov0 = checked_matrix("cov0", cov0, (d, d), f"{d} x {d}")
    if not np.all(np.isfinite(mean0)):
        raise ValueError(f"mean0: entries must be finite, got {mean0}")
    if not np.allclose(cov0, cov0.T, rtol=1e-12, atol=1e-14 * np.abs(cov0).max()):
        raise ValueError("cov0: not symmetric")
    lam0 = _spd_eigh(cov0, "cov0")[0]
    if not (math.isfinite(noise) and noise >= 0.0):
        raise ValueError(f"noise: expected a finite number >= 0, got {noise!r}")
    diffusion = 2.0 * float(noise) * np.eye(d)
    t0, t_end = float(t0), float(t_end)
    if not (math.isfinite(t0) and math.isfinite(t_end) and t_end > t0):
        raise ValueError(f"t_end: expected a finite number > t0 = {t0}, got {t_end}")
    if blowup_threshold is None:
        blowup_level = math.inf
    else:
        if not (blowup_threshold > 0):
            raise ValueError(f"blowup_threshold: expected > 0 or None, got {blowup_threshold}")
        blowup_level = float(blowup_threshold) * lam0[-1]
    if times is not None:
        times = np.asarray(times, float).ravel()
        if times.size and (times.min() < t0 or times.max() > t_end or np.any(np.diff(times) < 0)):
            raise ValueError(f"times: expected non-decreasing values in [{t0}, {t_end}]")

    spec = as_param_spec(params)
    if isinstance(spec, Layers):
        if spec.starts[0] > t0:
            raise ValueError(f"layers[0].t_start: expected <= t0 = {t0}, got {spec.starts[0]}")
        for i, p in enumerate(spec.params):
            if callable(p):
                raise ValueError(f"attention.layers[{i}]: expected parameters, got a callable")
            validate_params(variant, p, d, f"attention.layers[{i}]")
        breaks = [t0] + [s for s in spec.starts if t0 < s < t_end] + [t_end]
        pieces = [(a, b, spec.at(a)) for a, b in zip(breaks[:-1], breaks[1:], strict=True)]
    elif callable(spec):
        validate_params(variant, spec(t0), d)
        pieces = [(t0, t_end, spec)]
    else:
        validate_params(variant, spec, d)
        pieces = [(t0, t_end, spec)]

    field_fn = _FIELDS[variant]

    def make_rhs(p: Any) -> Callable[[float, np.ndarray], np.ndarray]:
        def rhs(t: float, y: np.ndarray) -> np.ndarray:
            pt = p(t) if callable(p) else p
            alpha, Sigma = _unpack(y, d)
            try:
                b, M = field_fn(alpha, Sigma, pt)
            except NotPositiveDefiniteError:
                return np.full_like(y, np.nan)  # the step is rejected; the PD event stops
            da, dS = _moment_rhs(b, M, alpha, Sigma)
            return _pack(da, dS + diffusion)

        return rhs

    def blowup_event(t: float, y: np.ndarray) -> float:
        w = np.linalg.eigvalsh(_unpack(y, d)[1])
        return w[-1] / blowup_level - 1.0 if math.isfinite(blowup_level) else -1.0

    def nonpd_event(t: float, y: np.ndarray) -> float:
        S = _unpack(y, d)[1]
        return np.linalg.eigvalsh(S)[0] / lam0[-1]

    for event, direction in ((blowup_event, 1.0), (nonpd_event, -1.0)):
        marked: Any = event  # solve_ivp reads these two attributes off the event function
        marked.terminal = True
        marked.direction = direction

    y = _pack(mean0, cov0)
    segments: list[tuple[float, float, Any]] = []
    step_t: list[np.ndarray] = []
    step_y: list[np.ndarray] = []
    status, status_time, message = "completed", t_end, "reached t_end"
    for a, b, p in pieces:
        sol = solve_ivp(
            make_rhs(p),
            (a, b),
            y,
            method="DOP853",
            rtol=rtol,
            atol=atol,
            dense_output=True,
            events=[blowup_event, nonpd_event],
        )
        t_stop = float(sol.t[-1])
        segments.append((a, t_stop, sol.sol))
        first = 0 if not step_t else 1
        step_t.append(sol.t[first:])
        step_y.append(sol.y[:, first:].T)
        y = sol.y[:, -1]
        if sol.status == 1:
            if sol.t_events[0].size:
                status, status_time = "blowup", float(sol.t_events[0][0])
                message = (
                    f"lambda_max(Sigma) reached {blowup_threshold:g} x lambda_max(cov0) "
                    f"at t = {status_time:.12g}"
                )
            else:
                status, status_time = "not_positive_definite", float(sol.t_events[1][0])
                message = f"Sigma lost positive definiteness at t = {status_time:.12g}"
            break
        if sol.status != 0:
            status, status_time = "failed", t_stop
            message = f"integrator stopped at t = {t_stop:.12g}: {sol.message}"
            break

    solution = GaussianSolution(
        variant=variant,
        times=np.empty(0),
        means=np.empty((0, d)),
        covariances=np.empty((0, d, d)),
        status=status,
        status_time=status_time,
        message=message,
        t0=t0,
        _segments=tuple(segments),
        _dim=d,
    )
    if times is None:
        out_t = np.concatenate(step_t)
        means, covs = _unpack_many(np.concatenate(step_y, axis=0), d)
    else:
        out_t = times[times <= status_time]
        means, covs = solution.at(out_t) if out_t.size else (np.empty((0, d)), np.empty((0, d, d)))
    object.__setattr__(solution, "times", out_t)
    object.__setattr__(solution, "means", means)
    object.__setattr__(solution, "covariances", covs)
    return solution


# ---- closed forms (docs/theory.md, 'Closed forms') --------------------------------------------
def softmax_scalar_v_inverse_covariance(cov0: Any, A: Any, v: float, t: float) -> np.ndarray:
    """Softmax with V = v I ('Closed forms'): Sigma(t)^{-1} = Sigma0^{-1} - v t (A + A^T).

    (P = Sigma^{-1} satisfies P' = -v (A + A^T).)  cov0, A: (d, d); returns (d, d).
    """
    cov0 = np.asarray(cov0, float)
    A = np.asarray(A, float)
    return _sym(np.linalg.inv(cov0)) - v * t * (A + A.T)


def softmax_scalar_v_covariance(cov0: Any, A: Any, v: float, t: float) -> np.ndarray:
    """Sigma(t) = (Sigma0^{-1} - v t (A + A^T))^{-1} ('Closed forms'), valid for t < t*."""
    P = softmax_scalar_v_inverse_covariance(cov0, A, v, t)
    _spd_eigh(P, "Sigma(t)^{-1}")
    return _sym(np.linalg.inv(P))


def softmax_blowup_time(cov0: Any, A: Any, v: float) -> float:
    """Blow-up time of softmax with V = v I ('Closed forms').

    t* = 1 / lambda_max(v Sigma0^{1/2} (A + A^T) Sigma0^{1/2}); inf when that is <= 0.
    Scalar case A = a I: t* = 1 / (2 v a lambda_max(Sigma0)).
    """
    A = np.asarray(A, float)
    root, _ = _spd_sqrt_pair(np.asarray(cov0, float))
    top = np.linalg.eigvalsh(_sym(v * root @ (A + A.T) @ root))[-1]
    return 1.0 / top if top > 0 else math.inf


def softmax_mean_scalar(mean0: Any, cov0: Any, a: float, v: float, t: float) -> np.ndarray:
    """Mean for softmax with A = a I, V = v I ('Closed forms'):

    alpha(t) = e^{v t} (I - 2 v a t Sigma0)^{-1/2} alpha0 (matrix function of Sigma0).
    mean0: (d,), cov0: (d, d); returns (d,).  ValueError at or after the blow-up time.
    """
    w, U = _spd_eigh(np.asarray(cov0, float), "cov0")
    f = 1.0 - 2.0 * v * a * t * w
    if not np.all(f > 0):
        t_star = 1.0 / (2.0 * v * a * w[-1])
        raise ValueError(f"t: {t} is at or after the blow-up time {t_star}")
    return math.exp(v * t) * ((U / np.sqrt(f)) @ U.T) @ np.asarray(mean0, float)


def softmax_rank_deficient_limit(cov0: Any, A: Any, tol: float = 1e-10) -> np.ndarray:
    """Limit of Sigma(t) for softmax with V = v I and v (A + A^T) <= 0 ('Closed forms').

    Sigma_inf = P (P^T Sigma0^{-1} P)^{-1} P^T, P an orthonormal basis of ker(A + A^T)
    (eigenvalues below tol * max|eig| count as zero); rank Sigma_inf = d - rank(A + A^T).
    cov0, A: (d, d); returns (d, d) (zero when A + A^T is definite).
    """
    cov0 = np.asarray(cov0, float)
    A = np.asarray(A, float)
    w, U = np.linalg.eigh(A + A.T)
    scale = max(np.abs(w).max(), np.finfo(float).tiny)
    P = U[:, np.abs(w) <= tol * scale]
    if P.shape[1] == 0:
        return np.zeros_like(cov0)
    inner = P.T @ np.linalg.solve(cov0, P)
    return _sym(P @ np.linalg.solve(inner, P.T))


def l2_isotropic_time(lam: float, lam0: float, q: float, k: float, v: float) -> float:
    """Time at which the isotropic l2 solution reaches Sigma = lam I ('Closed forms', l2 isotropic).

    Q = q I, K = k I, V = v I, Sigma0 = lam0 I: lam' = c lam^2 / (1 + b lam), c = 4 v k q,
    b = 2 k^2, so t = (1/c)(1/lam0 - 1/lam) + (b/c) log(lam/lam0).
    """
    c = 4.0 * v * k * q
    b = 2.0 * k * k
    return (1.0 / lam0 - 1.0 / lam) / c + (b / c) * math.log(lam / lam0)


def sinkhorn_isotropic_time(lam: float, lam0: float, a: float, v: float, eps: float = 1.0) -> float:
    """Time at which the isotropic Sinkhorn solution reaches Sigma = lam I ('Closed forms').

    A = a I, V = v I, Sigma0 = lam0 I: lam' = 4 v a lam^2 / (1 + sqrt(1 + 4 a^2 lam^2)), so
    t = G(lam) - G(lam0), G(lam) = -(1 + sqrt(1 + 4 a^2 lam^2)) / (4 v a lam)
    + asinh(2 a lam) / (2 v).  (For eps != 1, a is replaced by a / eps.)
    """
    a = a / eps

    def G(x: float) -> float:
        return -(1.0 + math.sqrt(1.0 + 4.0 * a * a * x * x)) / (4.0 * v * a * x) + math.asinh(
            2.0 * a * x
        ) / (2.0 * v)

    return G(lam) - G(lam0)


def sinkhorn_mean(mean0: Any, V: Any, t: float) -> np.ndarray:
    """Sinkhorn mean ('Closed forms'): alpha(t) = expm(t V) alpha0 for constant V, any A, Sigma."""
    return expm(t * np.asarray(V, float)) @ np.asarray(mean0, float)
