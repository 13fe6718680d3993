"""Energies and Lyapunov functions along runs.

docs/theory.md, 'Gradient flows and energies' (the theory) and 'Energies and Lyapunov
functions' (how they are evaluated).

Three functionals of the token law mu (density rho, cell averages ``rho_bar`` on a grid):

* ``trace_lyapunov``: tr(V^-1 Sigma), Sigma the covariance of mu (:func:`tpde.grid.moments`).
  For softmax with V symmetric positive definite and A symmetric negative semidefinite,
  d/dt tr(V^-1 Sigma) = 2 tr(A Sigma^2) <= 0 on Gaussian data ('Closed forms'). For other
  data the rate is 2 int m(A x).(x - alpha) dmu (m the tilted mean), which is <= 0 when
  A = -a I (m = grad log M is a monotone map) but has no sign in general.
* ``interaction_energy``: E(mu) = 1/2 iint e^{<A x, y>} dmu(x) dmu(y) for symmetric A. With
  Z(x) = int e^{<A x, y>} dmu(y) = dE/dmu, softmax attention is Gamma = M grad Z / Z with
  M = V A^-1, so dE/dt = int <grad Z, M grad Z> / Z dmu: E increases when M is
  symmetric positive definite and decreases when it is negative definite, for any mu.
* ``sinkhorn_self_cost``: 1/2 OT_eps(mu, mu) with
  OT_eps(mu, nu) = min_{pi in Pi(mu, nu)} int -<A x, y> dpi + eps KL(pi | mu x nu).
  Sinkhorn attention with A = A^T and V = A is its W2 gradient flow (descent):
  Gamma = -grad f, f the potential below, so it decreases for any mu.

Primal and dual of the self-transport (the sign convention of
:mod:`tpde.variants.sinkhorn`). The optimal plan is
``pi = exp((<A x, y> + f(x) + g(y)) / eps) mu x mu``, so on its support
``eps log(dpi / d(mu x mu)) = <A x, y> + f(x) + g(y)`` and

    int -<A x, y> dpi + eps KL(pi | mu x mu) = int (f(x) + g(y)) dpi = int f dmu + int g dmu,

using the two marginals of pi. Hence ``OT_eps(mu, mu) = +(int f dmu + int g dmu)`` (the
"potentials" f, g of the module are the usual dual potentials, with the cost -<A x, y>; the
dual objective int f + int g - eps (pi(1) - 1) equals this because Sinkhorn's last half-step
normalises the plan's mass to 1). tests/test_energies.py checks it against the primal value
of an explicitly built plan.

:func:`energies` decides which of them a run gets and what the theory says about their
monotonicity ("increasing", "decreasing" or "none"); :func:`run_energies` builds the
callable that :class:`tpde.io.SnapshotWriter` evaluates at every snapshot. Masked runs
(position slices) and time-dependent parameters (layers, callables) get no energies: the
functionals above concern one law and constant parameters (with layers they change at every
layer start).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpde.grid import Grid, moments
from tpde.grid.stencils import point_values

__all__ = [
    "DESCRIPTIONS",
    "Energy",
    "MONOTONE",
    "applicable",
    "circle_energies",
    "energies",
    "interaction_energy",
    "log_box_factor",
    "run_energies",
    "sinkhorn_self_cost",
    "trace_lyapunov",
]

MONOTONE = ("increasing", "decreasing", "none")

#: name -> (long_name, formula) of each energy (the attributes of its output record; the
#: long_name short, for xarray's plot labels: the reference is the record's ``comment``)
DESCRIPTIONS = {
    "trace_lyapunov": (
        "trace Lyapunov function tr(V^-1 Sigma)",
        "tr(V^-1 Sigma)",
    ),
    "interaction": (
        "interaction energy",
        "1/2 iint exp(<A x, y>) rho(x) rho(y) dx dy",
    ),
    "sinkhorn_self_cost": (
        "half the entropic self-transport cost",
        "1/2 OT_eps(mu, mu) = 1/2 (int f dmu + int g dmu), OT_eps(mu, nu) "
        "= min_pi int -<A x, y> dpi + eps KL(pi | mu x nu), mu normalised",
    ),
}

#: relative tolerance of the structural tests (symmetry, definiteness) on the parameters
_TOL = 1e-10


@dataclass(frozen=True)
class Energy:
    """One energy at one time: its value and what the theory says about its monotonicity."""

    value: float
    monotone: str = "none"
    long_name: str = ""
    formula: str = ""

    def __float__(self) -> float:
        return float(self.value)


# ---- the functionals ------------------------------------------------------------------------
def trace_lyapunov(cov: Any, V: Any) -> float:
    """tr(V^-1 Sigma) for a covariance ``cov`` (d, d) and an invertible ``V`` (d, d).

    Raises ValueError when V is not square of the size of cov, or singular.
    """
    cov = np.asarray(cov, float)
    V = np.asarray(V, float)
    if V.ndim != 2 or V.shape[0] != V.shape[1] or cov.shape != V.shape:
        raise ValueError(
            f"trace_lyapunov: expected V and Sigma of the same square shape, got "
            f"{V.shape} and {cov.shape}"
        )
    if not _invertible(V):
        raise ValueError("trace_lyapunov: V is singular")
    return float(np.trace(np.linalg.solve(V, cov)))


def log_box_factor(c: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
    """log S(c), S(c) = prod_a sinh(c_a h_a / 2) / (c_a h_a / 2); c: (P, d) -> (P,).

    The exact cell-average factor of the exponential kernel, B * e^{c.y} = S(c) e^{c.y}
    (tpde.variants.softmax), evaluated without overflow: log(sinh u / u) = |u| +
    log1p(-e^{-2|u|}) - log(2|u|), by its series u^2/6 - u^4/180 for |u| < 1e-3.
    """
    u = 0.5 * np.abs(np.asarray(c, float)) * np.asarray(spacing, float)
    small = u < 1e-3
    safe = np.where(small, 1.0, u)
    u2 = u * u
    terms = np.where(
        small,
        u2 / 6.0 - u2 * u2 / 180.0,
        safe + np.log1p(-np.exp(-2.0 * safe)) - np.log(2.0 * safe),
    )
    return terms.sum(axis=-1)


def interaction_energy(
    density: np.ndarray,
    grid: Grid,
    A: Any,
    engine: str = "auto",
    nodes: int | None = None,
    log: bool = False,
) -> float:
    """E = 1/2 iint e^{<A x, y>} rho(x) rho(y) dx dy for symmetric A.

    docs/theory.md, 'Gradient flows and energies' and 'Energies and Lyapunov functions'.

    density: cell averages (grid.shape, negative values are treated as 0); A: (d, d)
    symmetric. ``log=True`` returns log E (finite however large or small E is).

    Method, O(m N) with the separable engine (O(N^2) with the direct one; ``engine`` and
    ``nodes`` as for :class:`tpde.variants.SoftmaxAttention`, "auto": direct up to 32^2
    cells). The inner integral Z(x) = int e^{<A x, y>} rho(y) dy is the moment-generating
    function of the cell averages at c = A x, divided by the exact cell-average factor S(c)
    (B * e^{c.y} = S(c) e^{c.y}, tpde.variants.softmax):

        Z(x_c) = h^d sum_s rho_bar_s e^{c.y_s} / S(c),   c = A x_c,

    spectrally accurate for a resolved density (the trapezoid error of a smooth decaying
    integrand). The outer integral is the trapezoid sum over the cell centres with the
    eighth-order point values of the density (tpde.grid.stencils.point_values, clipped at 0),
    so its error is O(h^8) from the point values (then spectral): the plain midpoint sum
    over cell averages would be only second order, h^d sum rho_bar_x Z(x_c) = int rho (B * Z)
    = int rho Z + (h^2/24) int rho Lap Z + O(h^4). Both sums run in the log domain
    (log M from the engines, whose terms are shifted by their maxima, then a log-sum-exp over
    x of log rho(x_c) + log Z(x_c)): relative accuracy, no overflow, no NaN where the density
    underflows.
    """
    from tpde.variants.softmax import TiltedMeanField

    A = _symmetric("interaction_energy: A", A, grid.ndim)
    rho = np.asarray(density, float)
    if rho.shape != grid.shape:
        raise ValueError(
            f"interaction_energy: expected a density of shape {grid.shape}, got {rho.shape}"
        )
    weights = np.maximum(rho, 0.0)
    outer = np.maximum(point_values(rho, grid), 0.0).reshape(-1)
    keep = outer > 0
    if not np.any(weights > 0) or not np.any(keep):
        raise ValueError("interaction_energy: the density is zero everywhere")
    lattice = [grid.lattice(np.zeros(grid.ndim))]
    field = TiltedMeanField(engine, nodes)
    sums = field.sums(weights, grid, lattice, A, fields="log")
    _, (x,) = field.lattice_points(grid, [np.zeros(grid.ndim)])
    c = x[keep] @ A.T
    log_volume = math.log(grid.cell_volume)
    log_z = sums.log_partition(c) - log_box_factor(c, grid.spacing) + log_volume
    terms = np.log(outer[keep]) + log_volume + log_z
    top = terms.max()
    log_e = math.log(0.5) + top + math.log(np.exp(terms - top).sum())
    if log:
        return float(log_e)
    with np.errstate(over="ignore"):
        return float(np.exp(log_e))


def sinkhorn_self_cost(density: np.ndarray, grid: Grid, head, field=None) -> float:
    """1/2 OT_eps(mu, mu) for the cost -<A x, y> and ``eps = head.eps``.

    docs/theory.md, 'Energies and Lyapunov functions'.

    OT_eps(mu, mu) = min_pi int -<A x, y> dpi + eps KL(pi | mu x mu) = int f dmu + int g dmu
    (module docstring), from the converged Sinkhorn potentials on the cell centres
    (:meth:`tpde.variants.SinkhornAttention.potentials`, quadrature weights q = normalised
    point values of the density: mu is normalised to mass 1, as for the velocity).

    head: a :class:`SinkhornHead` (any A; only A and eps enter). field: the
    :class:`SinkhornAttention` to run the iterations (its tol, max_iter, engine and warm
    start), default a new one with the default options.
    """
    from tpde.variants.sinkhorn import SinkhornAttention, quadrature_weights

    if field is None:
        field = SinkhornAttention(head)
    q = quadrature_weights(np.asarray(density, float), grid)
    f, g = field.potentials(q, grid, head)
    weights = q.reshape(-1)
    mass = weights > 0
    return float(0.5 * (np.dot(weights[mass], f[mass]) + np.dot(weights[mass], g[mass])))


# ---- which energies apply -------------------------------------------------------------------
def _invertible(M: np.ndarray) -> bool:
    s = np.linalg.svd(M, compute_uv=False)
    return bool(s[0] > 0 and s[-1] > _TOL * s[0])


def _is_symmetric(M: np.ndarray) -> bool:
    scale = max(float(np.abs(M).max()), 1e-300)
    return bool(np.abs(M - M.T).max() <= _TOL * scale)


def _symmetric(name: str, A: Any, d: int) -> np.ndarray:
    A = np.asarray(A, float)
    if A.shape != (d, d):
        raise ValueError(f"{name}: expected {d} x {d}, got {A.shape}")
    if not _is_symmetric(A):
        raise ValueError(f"{name}: expected a symmetric matrix")
    return 0.5 * (A + A.T)


def _definiteness(M: np.ndarray) -> str:
    """ "positive", "negative" (definite), "nonpositive" (semidefinite) or "" for a symmetric M."""
    eig = np.linalg.eigvalsh(0.5 * (M + M.T))
    scale = max(float(np.abs(eig).max()), 1e-300)
    if eig[0] > _TOL * scale:
        return "positive"
    if eig[-1] < -_TOL * scale:
        return "negative"
    if eig[-1] <= _TOL * scale:
        return "nonpositive"
    return ""


def _single_head(params) -> Any | None:
    from tpde.variants.parameters import Head, L2Head

    if isinstance(params, (Head, L2Head)):
        return params
    if isinstance(params, (list, tuple)) and len(params) == 1 and isinstance(params[0], Head):
        return params[0]
    return None


def applicable(variant: str, params, gaussian_data: bool = False) -> dict[str, str]:
    """Which energies a run with the constant parameters ``params`` gets: name -> expected
    monotonicity ("increasing", "decreasing" or "none"), in the output order.

    * ``trace_lyapunov``: softmax, multihead (one head), l2, sinkhorn and linear with one
      head whose value map C = W V is invertible; "decreasing" for softmax / multihead when
      C is symmetric positive definite, A symmetric negative semidefinite and either the
      data are Gaussian (``gaussian_data``: docs/theory.md, 'Closed forms') or A = -a I (then
      for any data);
      "none" otherwise.
    * ``interaction``: softmax / multihead with one head and symmetric A; "increasing" when
      M = C A^-1 is symmetric positive definite, "decreasing" when it is symmetric negative
      definite, "none" otherwise (also for a singular A).
    * ``sinkhorn_self_cost``: sinkhorn with symmetric A and C = A: "decreasing".
    """
    from tpde.variants.parameters import Head, SinkhornHead

    head = _single_head(params)
    out: dict[str, str] = {}
    if head is None or variant not in ("softmax", "multihead", "l2", "sinkhorn", "linear"):
        return out
    if variant == "sinkhorn" and not isinstance(head, SinkhornHead):
        return out
    C = np.asarray(head.C, float)
    softmax = variant in ("softmax", "multihead") and isinstance(head, Head)
    if C.shape[0] == C.shape[1] and _invertible(C):
        monotone = "none"
        if softmax and _is_symmetric(C) and _definiteness(C) == "positive":
            A = np.asarray(head.A, float)
            scalar = np.allclose(
                A,
                A[0, 0] * np.eye(A.shape[0]),
                rtol=0,
                atol=_TOL * max(float(np.abs(A).max()), 1e-300),
            )
            if (
                _is_symmetric(A)
                and _definiteness(A) in ("negative", "nonpositive")
                and (gaussian_data or scalar)
            ):
                monotone = "decreasing"
        out["trace_lyapunov"] = monotone
    if softmax and _is_symmetric(np.asarray(head.A, float)):
        A = np.asarray(head.A, float)
        monotone = "none"
        if _invertible(A):
            M = C @ np.linalg.inv(A)
            if _is_symmetric(M):
                kind = _definiteness(M)
                monotone = {"positive": "increasing", "negative": "decreasing"}.get(kind, "none")
        out["interaction"] = monotone
    if variant == "sinkhorn":
        A = np.asarray(head.A, float)
        scale = max(float(np.abs(A).max()), 1e-300)
        if _is_symmetric(A) and np.abs(C - A).max() <= _TOL * scale:
            out["sinkhorn_self_cost"] = "decreasing"
    return out


def _constant(spec) -> bool:
    """Whether a parameter specification is constant (not Layers, a layers mapping or a
    callable of t)."""
    from collections.abc import Mapping

    from tpde.variants.parameters import Layers

    return not (isinstance(spec, (Layers, Mapping)) or callable(spec))


def energies(
    variant: str,
    params,
    density: np.ndarray,
    grid: Grid,
    t: float = 0.0,
    gaussian_data: bool = False,
    engine: str = "auto",
    nodes: int | None = None,
    sinkhorn=None,
) -> dict[str, Energy]:
    """The energies of a run at one snapshot: name -> :class:`Energy` (value, monotone,
    long_name, formula); see :func:`applicable` for which apply.

    variant: the attention variant name; params: its parameter specification (time-dependent
    specifications, Layers or callables, get none: returns {}); density: cell averages,
    grid.shape (masked runs: position slices (S, *grid.shape), which get none: returns {});
    gaussian_data: whether the run started from Gaussian data (the trace_lyapunov
    expectation); engine, nodes: the kernel-sum engine of the interaction energy ("fft" is
    replaced by "auto"); sinkhorn: the SinkhornAttention that computes the potentials (its
    options and warm start), default a new one per call. A value that cannot be computed (no
    mass left, Sinkhorn not converged) is NaN.
    """
    from tpde.variants.sinkhorn import SinkhornError

    density = np.asarray(density, float)
    if density.shape != grid.shape or not _constant(params):
        return {}
    plan = applicable(variant, params, gaussian_data)
    head = _single_head(params)
    if head is None:  # (then applicable() plans nothing)
        return {}
    out: dict[str, Energy] = {}
    for name, monotone in plan.items():
        try:
            if name == "trace_lyapunov":
                total, _, cov = moments(density, grid)
                value = trace_lyapunov(cov, head.C) if total > 0 else math.nan
            elif name == "interaction":
                value = interaction_energy(
                    density, grid, head.A, "auto" if engine == "fft" else engine, nodes
                )
            else:
                value = sinkhorn_self_cost(density, grid, head, sinkhorn)
        except (ValueError, SinkhornError, ArithmeticError):
            value = math.nan
        long_name, formula = DESCRIPTIONS[name]
        out[name] = Energy(float(value), monotone, long_name, formula)
    return out


def run_energies(config) -> Callable[[np.ndarray, float], dict[str, Energy]]:
    """The callable ``(density, t) -> energies`` of a :class:`tpde.config.Config` (what
    tpde.run passes to :class:`tpde.io.SnapshotWriter`, on new and resumed runs alike).

    Uses the run's variant, parameters and engine options, and whether the initial data are
    a Gaussian (``initial.kind``); a Sinkhorn run gets its own SinkhornAttention (same
    options, its own warm start, so the energies never change the run's iterations).
    Masked runs and time-dependent parameters get a callable that returns {}.
    """
    from tpde.variants import CausalAttention, SinkhornAttention

    own = config.energies  # a geometry's own (tpde.circle)
    if own is not None:
        return own()
    problem = config.problem
    field = problem.velocity
    grid = problem.grid
    spec = getattr(field, "spec", None)
    if (
        problem.positions is not None
        or isinstance(field, CausalAttention)
        or spec is None
        or not _constant(spec)
    ):
        return lambda density, t: {}
    initial = config.raw.get("initial", {}) if isinstance(config.raw, dict) else {}
    gaussian_data = initial.get("kind", "gaussian") == "gaussian"
    engine = getattr(field, "engine", "auto")
    nodes = getattr(field, "nodes", None)
    sinkhorn = None
    if isinstance(field, SinkhornAttention):
        sinkhorn = SinkhornAttention(
            field.spec,
            engine=field.engine,
            nodes=field.nodes,
            block=field.block,
            tol=field.tol,
            max_iter=field.max_iter,
        )
    variant = config.variant

    def evaluate(density: np.ndarray, t: float) -> dict[str, Energy]:
        return energies(variant, spec, density, grid, t, gaussian_data, engine, nodes, sinkhorn)

    return evaluate


def circle_energies(field: Any, grid: Grid) -> Callable[[np.ndarray, float], dict]:
    """``(density, t) -> {"interaction": Energy}`` for ``A = beta I`` (the energy of
    docs/theory.md, 'Attention dynamics on the sphere'; ``increasing`` when ``C`` is a
    positive multiple of the identity); ``{}`` for other matrices."""
    from .circle_atoms import energy_with_atoms
    from .parameters import Head
    from .spherical import interaction_energy as circle_interaction

    head = field.spec if isinstance(field.spec, Head) else None
    if head is None:
        return lambda density, t: {}
    A, C = np.asarray(head.A, float), np.asarray(head.C, float)
    beta = float(A[0, 0])
    scalar = np.allclose(A, beta * np.eye(2), rtol=0, atol=1e-12 * max(abs(beta), 1e-300))
    if not (scalar and beta > 0):
        return lambda density, t: {}
    positive = np.allclose(C, C[0, 0] * np.eye(2), rtol=0, atol=1e-12) and C[0, 0] > 0
    monotone = "increasing" if positive else "none"

    def evaluate(density: np.ndarray, t: float) -> dict:
        # with atoms, the field holds the snapshot's atoms while the writer runs (the
        # solver's snapshot callback): their exact share joins the cells'
        atoms = field.atoms
        value = (
            circle_interaction(density, grid, beta)
            if atoms is None
            else energy_with_atoms(density, grid, beta, atoms)
        )
        return {
            "interaction": Energy(
                value,
                monotone,
                "interaction energy on the circle",
                "1/(2 beta) iint exp(beta cos(phi - theta)) dmu dmu",
            )
        }

    return evaluate
