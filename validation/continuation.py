"""Pseudo-arclength continuation of stationary states in the noise eps: branches, folds, the
bifurcation from the uniform state and the first-order transition.

docs/theory.md, 'Stationary states and phase transitions'. The unknowns are the scaled
state ``x = (q, e)``, ``q = v / rho_uniform`` the reduced cell averages of
:mod:`tpde.validation.stationary` (the even half on the circle) and ``e = eps / eps_ref``;
lengths are ``|x|^2 = mean(q^2) + e^2``. A step from ``x_0`` with unit tangent ``t`` predicts
``x_0 + ds t`` and corrects by Newton-Krylov on

    G(x) = 0,    <t, x - x_0> = ds                               (pseudo-arclength)

and the new tangent solves ``[G_x; t_0^T] t = [0; 1]``. The uniform state is a solution for
every eps; along it the smallest eigenvalue of the reduced Jacobian changes sign at the
linear threshold (the k = 1 / l = 1 mode: located by brentq), where the branch of
clustered states leaves along the null vector (branch switching: the first tangent is the
null vector, ``e``-component 0, a pitchfork). A fold is where the tangent's ``e``-component
changes sign; it is refined as the extremum of ``eps(a)`` on the branch parametrised by the
amplitude ``a`` (the bordered system ``G = 0``, ``a(x) = a``). The first-order point is the
root of ``F_cluster - F_uniform`` on the stable part of the branch (brentq in ``a``).

The type of the transition is the sign of the curvature ``d^2 eps / da^2`` at the
bifurcation point: ``eps(a) = eps_c + c_2 a^2 + c_4 a^4 + ..`` (even: ``a -> -a`` is a
rotation by pi on the circle, the reflection ``z -> -z`` on the sphere); ``c_2 < 0`` the
branch exists below the threshold only (continuous), ``c_2 > 0`` it turns back from
above (discontinuous). ``c_2`` comes from three amplitude-parametrised solutions
(``a = delta, 2 delta, 3 delta``), exact up to ``O(delta^6)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.sparse.linalg import LinearOperator, gmres

from . import stationary as st

__all__ = [
    "DEFAULT_EPS_MAX",
    "DEFAULT_EPS_MIN",
    "continuation",
    "critical_points",
    "diagram_dataset",
    "phase_dataset",
    "Branch",
    "Diagram",
    "amplitude_state",
    "bifurcation_point",
    "curvature",
    "diagram",
    "first_order_point",
    "refine_fold",
    "transition_beta",
]

#: continuation steps: initial, largest and smallest arclength (scaled units)
DS_INITIAL = 0.05
DS_MAX = 0.12
DS_MIN = 1e-7
#: Newton iterations aimed at per step (the step grows below, shrinks above)
NEWTON_TARGET = 4
#: amplitude steps of the curvature fit
CURVATURE_DELTA = 0.02
#: the status of a branch that stops where the grid no longer holds its states
UNDER_RESOLVED = "under_resolved"


@dataclass
class Branch:
    """A branch of stationary states: per point eps, amplitude, free energy, the unstable
    modes and the leading growth rate, the tangent's eps-component, the densities (m, n).
    ``status`` says why it ended (``eps_range``, ``amplitude_limit``, ``under_resolved``,
    ``max_steps``, ``newton_failed``) and ``where`` the eps at which it did."""

    kind: str
    eps: list[float] = field(default_factory=list)
    amplitude: list[float] = field(default_factory=list)
    free_energy: list[float] = field(default_factory=list)
    unstable: list[int] = field(default_factory=list)
    leading: list[float] = field(default_factory=list)
    tangent_eps: list[float] = field(default_factory=list)
    states: list[np.ndarray] = field(default_factory=list)
    folds: list[int] = field(default_factory=list)
    status: str = "running"
    where: float = math.nan

    def add(self, problem, u, eps, tangent_eps: float = math.nan) -> None:
        unstable, leading = st.stability(problem, u, eps)
        self.eps.append(float(eps))
        self.amplitude.append(float(st.amplitude(problem, u)))
        self.free_energy.append(st.free_energy(problem, u, eps))
        self.unstable.append(unstable)
        self.leading.append(leading)
        self.tangent_eps.append(float(tangent_eps))
        self.states.append(np.asarray(u, float).copy())


@dataclass
class Diagram:
    """The uniform branch and the bifurcating branch with the located points:
    ``eps_threshold`` (the grid's linear threshold), ``eps_folds`` and ``amplitude_folds``
    (refined), ``eps_first_order`` (free energies equal on the stable part; the threshold
    itself for a continuous transition), ``curvature`` (``c_2 / eps_c``)."""

    problem: st.StationaryProblem
    uniform: Branch
    clustered: Branch
    eps_threshold: float
    curvature: float
    eps_folds: list[float]
    amplitude_folds: list[float]
    eps_first_order: float
    amplitude_first_order: float

    @property
    def transition(self) -> str:
        return "discontinuous" if self.curvature > 0 else "continuous"


class _System:
    """The reduced, scaled system ``x = (q, e)`` of one problem (module docstring)."""

    def __init__(self, problem: st.StationaryProblem, eps_ref: float):
        self.problem = problem
        self.eps_ref = float(eps_ref)
        self.rho = problem.density_uniform
        r = problem.reduced
        m = problem.moment
        reduced = m[:r] + m[::-1][:r] if problem.geometry == "circle" else m
        self.moment = self.rho * reduced  # a = moment . q
        self.weights = np.append(np.full(r, 1.0 / r), 1.0)

    def state(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        return self.problem.expand(self.rho * x[:-1]), float(x[-1] * self.eps_ref)

    def point(self, u: np.ndarray, eps: float) -> np.ndarray:
        return np.append(self.problem.restrict(u) / self.rho, eps / self.eps_ref)

    def residual(self, x: np.ndarray) -> np.ndarray:
        u, eps = self.state(x)
        return self.problem.restrict(st.residual(self.problem, u, eps)) / self.rho

    def linear(self, x: np.ndarray):
        u, eps = self.state(x)
        apply = st.jacobian_operator(self.problem, u, eps)
        p, rho, ref = self.problem, self.rho, self.eps_ref

        def matvec(dx: np.ndarray) -> np.ndarray:
            return p.restrict(apply(p.expand(rho * dx[:-1]), ref * dx[-1])) / rho

        return matvec

    def dot(self, a: np.ndarray, b: np.ndarray) -> float:
        return float(np.sum(self.weights * a * b))

    def solve_bordered(self, x, row: np.ndarray, value, rhs_top: np.ndarray) -> np.ndarray:
        """Solve ``[G_x(x); row] dx = [rhs_top; value]`` by GMRES."""
        n = x.size
        g = self.linear(x)
        op = LinearOperator((n, n), matvec=lambda dx: np.append(g(dx), row @ dx), dtype=float)
        out, info = gmres(op, np.append(rhs_top, value), rtol=1e-12, atol=0.0, restart=n, maxiter=4)
        if info < 0:
            raise st.NewtonError("continuation: GMRES failed on the bordered system")
        return out

    def tangent(self, x: np.ndarray, previous: np.ndarray) -> np.ndarray:
        t = self.solve_bordered(x, self.weights * previous, 1.0, np.zeros(x.size - 1))
        return t / math.sqrt(self.dot(t, t))

    def correct(self, guess: np.ndarray, row: np.ndarray, target: float):
        """Newton-Krylov on ``[G(x); row . x - target] = 0``."""

        def function(x):
            return np.append(self.residual(x), row @ x - target)

        def linearise(x):
            g = self.linear(x)
            return lambda dx: np.append(g(dx), row @ dx)

        # the residual is relative to the largest density (round-off of a cluster's peak)
        scale = max(1.0, float(np.max(np.abs(guess[:-1]))))
        return st.newton_krylov(function, linearise, guess, scale)


def bifurcation_point(
    problem: st.StationaryProblem, eps_max: float, eps_min: float, samples: int = 41
) -> tuple[float, np.ndarray, Branch]:
    """Follow the uniform branch from ``eps_max`` down to ``eps_min``: the first sign change of
    the smallest eigenvalue of the reduced Jacobian, refined by brentq (relative 1e-15).
    Returns ``(eps_c, the null vector (reduced, unit), the uniform branch)``."""
    u = st.uniform(problem)

    def lowest(eps: float) -> float:
        return float(np.min(np.linalg.eigvals(st.reduced_jacobian(problem, u, eps)).real))

    branch = Branch("uniform")
    grid = np.geomspace(eps_max, eps_min, samples)
    values = []
    found = None
    for i, eps in enumerate(grid):
        values.append(lowest(eps))
        branch.add(problem, u, eps, -1.0)
        if i and values[-2] > 0 >= values[-1] and found is None:
            found = (grid[i], grid[i - 1])
    branch.status, branch.where = "eps_range", float(grid[-1])
    if found is None:
        where = "stable" if values[-1] > 0 else "unstable"
        raise ValueError(
            f"continuation.eps_min: the uniform state is {where} over the whole range "
            f"[{eps_min:.6g}, {eps_max:.6g}]; widen it to contain the threshold"
        )
    eps_c = float(brentq(lowest, *found, xtol=1e-15 * found[1], rtol=1e-15))
    values_c, vectors = np.linalg.eig(st.reduced_jacobian(problem, u, eps_c))
    null = vectors[:, np.argmin(np.abs(values_c))].real
    null = null / np.linalg.norm(null)
    system = _System(problem, eps_c)
    if system.moment @ null < 0:
        null = -null
    return eps_c, null, branch


def _branch(
    problem: st.StationaryProblem,
    eps_c: float,
    null: np.ndarray,
    eps_range: tuple[float, float],
    amplitude_max: float,
    max_steps: int,
    ds: float,
) -> Branch:
    system = _System(problem, eps_c)
    x0 = system.point(st.uniform(problem), eps_c)
    t = np.append(null / problem.density_uniform, 0.0)
    t = t / math.sqrt(system.dot(t, t))
    branch = Branch("clustered")
    lo, hi = eps_range
    step = ds
    x, previous = x0, t
    for _ in range(max_steps):
        try:
            guess = x + step * t
            row = system.weights * t
            new, iterations = system.correct(guess, row, row @ x + step)
        except st.NewtonError:
            step *= 0.5
            if step < DS_MIN:
                branch.status, branch.where = "newton_failed", system.state(x)[1]
                return branch
            continue
        u, eps = system.state(new)
        if not st.resolved(problem, u):
            branch.status, branch.where = UNDER_RESOLVED, eps
            return branch
        new_t = system.tangent(new, t)
        x, previous, t = new, t, new_t
        branch.add(problem, u, eps, float(t[-1]))
        if len(branch.eps) > 1 and np.sign(t[-1]) != np.sign(previous[-1]):
            branch.folds.append(len(branch.eps) - 1)
        if not lo <= eps <= hi:
            branch.status, branch.where = "eps_range", eps
            return branch
        if branch.amplitude[-1] >= amplitude_max:
            branch.status, branch.where = "amplitude_limit", eps
            return branch
        step = min(DS_MAX, step * min(2.0, max(0.5, NEWTON_TARGET / max(iterations, 1))))
    branch.status, branch.where = "max_steps", system.state(x)[1]
    return branch


def amplitude_state(
    problem: st.StationaryProblem, a: float, guess: np.ndarray, eps_guess: float
) -> tuple[np.ndarray, float]:
    """The stationary state of amplitude ``a`` (and its eps) by Newton-Krylov on the bordered
    system ``G = 0``, ``amplitude = a``, from ``(guess, eps_guess)``."""
    system = _System(problem, eps_guess)
    row = np.append(system.moment, 0.0)
    x, _ = system.correct(system.point(guess, eps_guess), row, float(a))
    return system.state(x)


def _interpolate(branch: Branch, a: float) -> tuple[np.ndarray, float]:
    amps = np.asarray(branch.amplitude)
    i = int(np.clip(np.searchsorted(amps, a), 1, amps.size - 1))
    w = (a - amps[i - 1]) / (amps[i] - amps[i - 1])
    u = (1 - w) * branch.states[i - 1] + w * branch.states[i]
    return u, (1 - w) * branch.eps[i - 1] + w * branch.eps[i]


def refine_fold(problem: st.StationaryProblem, branch: Branch, index: int) -> tuple[float, float]:
    """The fold near point ``index``: the extremum of ``eps(a)`` over the amplitude between
    the neighbouring points (Brent, amplitude to 1e-10). Returns ``(eps, a)``."""
    amps = branch.amplitude
    lo, hi = amps[max(index - 2, 0)], amps[min(index + 1, len(amps) - 1)]
    sign = 1.0 if branch.tangent_eps[index - 1] > 0 else -1.0  # eps rose before: a maximum

    def objective(a: float) -> float:
        u, eps = _interpolate(branch, a)
        return -sign * amplitude_state(problem, a, u, eps)[1]

    result = minimize_scalar(objective, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    return float(-sign * result.fun), float(result.x)


def first_order_point(
    problem: st.StationaryProblem, branch: Branch, start: int = 0
) -> tuple[float, float]:
    """The root of ``F(branch state) - F(uniform)`` on the branch beyond point ``start``
    (brentq in the amplitude, 1e-13). ``(nan, nan)`` where the sign does not change."""
    uniform = st.uniform(problem)
    gap = [
        f - st.free_energy(problem, uniform, e)
        for f, e in zip(branch.free_energy, branch.eps, strict=True)
    ]
    for i in range(max(start, 1), len(gap)):
        if gap[i - 1] > 0 >= gap[i]:
            a0, a1 = branch.amplitude[i - 1], branch.amplitude[i]

            def difference(a: float) -> float:
                u, eps = amplitude_state(problem, a, *_interpolate(branch, a))
                return st.free_energy(problem, u, eps) - st.free_energy(problem, uniform, eps)

            root = float(brentq(difference, a0, a1, xtol=1e-13, rtol=1e-15))
            u, eps = amplitude_state(problem, root, *_interpolate(branch, root))
            return eps, root
    return math.nan, math.nan


def curvature(
    problem: st.StationaryProblem, eps_c: float, null: np.ndarray, delta: float = CURVATURE_DELTA
) -> tuple[float, float]:
    """``(eps_c, c_2 / eps_c)`` of ``eps(a) = eps_c + c_2 a^2 + c_4 a^4`` fitted through the
    amplitude-parametrised states at ``a = delta, 2 delta, 3 delta`` (from the null vector);
    the returned ``eps_c`` is the fit's, a check on the threshold."""
    system = _System(problem, eps_c)
    direction = problem.expand(null)
    scale = st.amplitude(problem, direction)
    amps = delta * np.arange(1, 4)
    values = []
    guess = st.uniform(problem)
    eps = eps_c
    for a in amps:
        guess = guess + (a - st.amplitude(problem, guess)) * direction / scale
        guess, eps = amplitude_state(problem, a, guess, eps)
        values.append(eps)
    del system
    coefficients = np.linalg.solve(np.vander(amps**2, 3, increasing=True), np.array(values))
    return float(coefficients[0]), float(coefficients[1] / coefficients[0])


def transition_beta(
    geometry: str,
    cells: int,
    bracket: tuple[float, float],
    model: str = "unnormalised",
    tolerance: float = 1e-6,
) -> float:
    """The ``beta`` at which ``c_2`` changes sign (continuous -> discontinuous), by brentq
    over ``bracket``; the threshold of each ``beta`` from :func:`bifurcation_point`."""

    def c2(beta: float) -> float:
        problem = st.stationary_problem(geometry, cells, beta, model)
        guess = st.linear_threshold(geometry, beta, model)
        eps_c, null, _ = bifurcation_point(problem, 1.2 * guess, 0.8 * guess, samples=3)
        return curvature(problem, eps_c, null)[1]

    return float(brentq(c2, *bracket, xtol=tolerance))


def diagram(
    problem: st.StationaryProblem,
    eps_range: tuple[float, float],
    amplitude_max: float = 0.9,
    max_steps: int = 400,
    ds: float = DS_INITIAL,
) -> Diagram:
    """Trace the uniform branch over ``eps_range = (eps_min, eps_max)``, locate the threshold,
    switch to the bifurcating branch and follow it (pseudo-arclength) until it leaves the
    range, the amplitude reaches ``amplitude_max``, the grid no longer resolves it or
    ``max_steps``; refine its folds and the first-order point."""
    lo, hi = (float(v) for v in eps_range)
    if not (0 < lo < hi and math.isfinite(hi)):
        raise ValueError(
            f"continuation.eps_min/eps_max: expected 0 < eps_min < eps_max, got {lo}, {hi}"
        )
    eps_c, null, uniform_branch = bifurcation_point(problem, hi, lo)
    c0, c2 = curvature(problem, eps_c, null)
    branch = _branch(problem, eps_c, null, (lo, hi), amplitude_max, max_steps, ds)
    folds = [refine_fold(problem, branch, i) for i in branch.folds]
    last_fold = branch.folds[-1] if branch.folds else 0
    if c2 > 0:
        eps_f, a_f = first_order_point(problem, branch, last_fold)
    else:
        eps_f, a_f = eps_c, 0.0
    return Diagram(
        problem,
        uniform_branch,
        branch,
        eps_c,
        c2,
        [f[0] for f in folds],
        [f[1] for f in folds],
        eps_f,
        a_f,
    )


# ---- one beta from plain arguments (tpde continue, its phase diagram's dask tasks) ----------
#: the default eps range of :func:`continuation`, in units of the linear threshold
DEFAULT_EPS_MIN = 0.5
DEFAULT_EPS_MAX = 4.0


def continuation(
    geometry: str,
    beta: float,
    cells: int = 128,
    model: str = "unnormalised",
    eps_min: float | None = None,
    eps_max: float | None = None,
    amplitude_max: float = 0.97,
    steps: int = 400,
) -> Diagram:
    """The bifurcation diagram of one ``beta``: the uniform branch, the bifurcating branch,
    folds and the first-order point (:func:`tpde.validation.continuation.diagram`). The
    default eps range is DEFAULT_EPS_MIN..DEFAULT_EPS_MAX times the linear threshold."""
    problem = st.stationary_problem(geometry, cells, beta, model)
    threshold = st.linear_threshold(geometry, beta, model)
    lo = DEFAULT_EPS_MIN * threshold if eps_min is None else eps_min
    hi = DEFAULT_EPS_MAX * threshold if eps_max is None else eps_max
    return diagram(problem, (lo, hi), amplitude_max, steps)


def critical_points(task: Mapping[str, Any]) -> dict:
    """One dask task: the threshold, curvature, fold and first-order eps of one beta."""
    try:
        d = continuation(**task)
    except (ValueError, ArithmeticError) as exc:
        return {"beta": task["beta"], "error": str(exc)}
    return {
        "beta": task["beta"],
        "eps_threshold": d.eps_threshold,
        "curvature": d.curvature,
        "eps_fold": d.eps_folds[0] if d.eps_folds else math.nan,
        "eps_first_order": d.eps_first_order,
        "status": d.clustered.status,
        "error": "",
    }


def diagram_dataset(diagram: Diagram):
    """The branches as one ``xarray.Dataset``: dimension ``point`` (the uniform branch's
    points then the clustered branch's; variable ``branch`` 0 / 1), ``cell`` (the grid's
    centres: angle or z); eps, amplitude, free energy, unstable modes, leading rate,
    density (point, cell); the located points as attributes."""
    import xarray as xr

    p = diagram.problem
    parts = [diagram.uniform, diagram.clustered]

    def cat(name: str) -> np.ndarray:
        return np.concatenate([np.asarray(getattr(b, name), float) for b in parts])

    branch = np.concatenate([np.full(len(b.eps), i, np.int32) for i, b in enumerate(parts)])
    states = np.concatenate([np.asarray(b.states).reshape(-1, p.cells) for b in parts])
    threshold = st.linear_threshold(p.geometry, p.beta, p.model)
    ds = xr.Dataset(
        {
            "branch": (
                "point",
                branch,
                {"long_name": "0: uniform, 1: bifurcating (k = 1 / l = 1)"},
            ),
            "eps": ("point", cat("eps"), {"long_name": "noise eps"}),
            "amplitude": (
                "point",
                cat("amplitude"),
                {"long_name": "int rho cos theta (circle), int rho z (sphere)"},
            ),
            "free_energy": (
                "point",
                cat("free_energy"),
                {"long_name": "eps int rho log rho - (1/(2 beta)) int rho K * rho (NaN: none)"},
            ),
            "unstable_modes": ("point", cat("unstable").astype(np.int32)),
            "leading_rate": ("point", cat("leading"), {"long_name": "largest growth rate"}),
            "density": (("point", "cell"), states),
        },
        coords={
            "cell": (
                "cell",
                p.centres,
                {"long_name": p.coordinate_name},
            )
        },
    )
    clustered = diagram.clustered
    ds.attrs = {
        "title": "tpde stationary branches",
        "geometry": p.geometry,
        "model": p.model,
        "beta": p.beta,
        "cells": np.int64(p.cells),
        "eps_threshold": diagram.eps_threshold,
        "eps_threshold_closed_form": threshold,
        "curvature": diagram.curvature,
        "transition": diagram.transition,
        "eps_fold": diagram.eps_folds[0] if diagram.eps_folds else math.nan,
        "amplitude_fold": diagram.amplitude_folds[0] if diagram.amplitude_folds else math.nan,
        "eps_first_order": diagram.eps_first_order,
        "amplitude_first_order": diagram.amplitude_first_order,
        "status": clustered.status,
        "status_eps": clustered.where,
        "comment": "docs/theory.md, 'Stationary states and phase transitions'",
    }
    return ds


def phase_dataset(records: Sequence[Mapping[str, Any]], geometry: str, model: str, cells: int):
    """The phase diagram as an ``xarray.Dataset`` over ``beta`` from the records of
    :func:`critical_points` (any order): the linear threshold, the curvature, the fold and
    the first-order eps (NaN where a record has none), the transition (``discontinuous``
    where the curvature is positive), each task's status and error, and the closed-form
    beta* of the geometry."""
    import xarray as xr

    records = sorted(records, key=lambda r: r["beta"])

    def column(name: str) -> np.ndarray:
        return np.array([r.get(name, math.nan) for r in records], float)

    ds = xr.Dataset(
        {
            name: ("beta", column(name))
            for name in ("eps_threshold", "curvature", "eps_fold", "eps_first_order")
        },
        coords={"beta": ("beta", column("beta"))},
    )
    ds["transition"] = (
        "beta",
        np.array(["discontinuous" if c > 0 else "continuous" for c in column("curvature")]),
    )
    ds["status"] = ("beta", np.array([r.get("status", "error") for r in records]))
    ds["error"] = ("beta", np.array([r["error"] for r in records]))
    ds.attrs = {
        "title": "tpde phase diagram",
        "geometry": geometry,
        "model": model,
        "cells": np.int64(cells),
        "beta_star_closed_form": st.critical_beta(geometry),
    }
    return ds
