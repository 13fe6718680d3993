"""Energies and Lyapunov functions (tpde.variants.energies; docs/theory.md,
'Gradient flows and energies').

Independent references: the closed form of E[e^{x^T A y}] for independent Gaussians (the
interaction energy of Gaussians and Gaussian mixtures), a dense double sum, the primal value
<cost, pi> + eps KL(pi | mu x mu) of a plan built by plain matrix scaling, the closed form of
the entropic self-transport cost of a Gaussian, and the Gaussian moment ODEs. Along grid runs
each energy must move in the direction the theory says, at every snapshot, by more than the
discretisation error. Run ``pytest -s`` to see the sequences.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy.linalg import sqrtm

from tpde.config import build
from tpde.grid import Grid, gaussian, gaussian_mixture, moments
from tpde.grid.stencils import point_values
from tpde.io import SnapshotWriter, read
from tpde.run import run_config
from tpde.schemes.solver import Problem, Solver
from tpde.validation.gaussian import sinkhorn_cross_covariance, solve
from tpde.variants import Head, L2Head, Layers, SinkhornAttention, SinkhornHead, SoftmaxAttention
from tpde.variants.energies import (
    Energy,
    applicable,
    energies,
    interaction_energy,
    log_box_factor,
    run_energies,
    sinkhorn_self_cost,
    trace_lyapunov,
)
from tpde.variants.sinkhorn import quadrature_weights

# paper experiment E1 (docs/theory.md, 'Paper experiments E1-E6'): K = -Q, A = K^T Q / sqrt(2)
# symmetric negative definite, V SPD
Q_E1 = np.array([[0.45805, 0.30835], [0.23149, 0.27742]])
A_E1 = -Q_E1.T @ Q_E1 / np.sqrt(2)
V_E1 = np.array([[2.66938, -0.69153], [-0.69153, 2.68745]])

A_SYM = np.array([[-0.4, 0.15], [0.15, 0.2]])  # symmetric, indefinite
MIX_W = [0.6, 0.4]
MIX_MEANS = [np.array([-1.0, 0.5]), np.array([1.0, -0.3])]
MIX_COVS = [0.5 * np.eye(2), np.array([[0.4, 0.1], [0.1, 0.3]])]


# ---- references -----------------------------------------------------------------------------
def log_pair_mgf(a, S, b, T, A) -> float:
    """log E[exp(x^T A y)] for independent x ~ N(a, S), y ~ N(b, T).

    z = (x, y) ~ N(m, P), P = diag(S, T), and x^T A y = z^T H z / 2 with H = [[0, A], [A^T,
    0]]; completing the square with the precision L = P^-1 - H (must be SPD):
    E = det(I - P H)^(-1/2) exp(m^T (P^-1 L^-1 P^-1 - P^-1) m / 2).
    """
    a, b = np.atleast_1d(np.asarray(a, float)), np.atleast_1d(np.asarray(b, float))
    S, T, A = (np.atleast_2d(np.asarray(M, float)) for M in (S, T, A))
    d = a.size
    zero = np.zeros((d, d))
    P = np.block([[S, zero], [zero, T]])
    H = np.block([[zero, A], [A.T, zero]])
    m = np.concatenate([a, b])
    Pinv = np.linalg.inv(P)
    L = Pinv - H
    assert np.linalg.eigvalsh(0.5 * (L + L.T))[0] > 0, "E[exp(x^T A y)] is infinite"
    Pm = Pinv @ m
    quad = Pm @ np.linalg.solve(L, Pm) - m @ Pm
    sign, logdet = np.linalg.slogdet(np.eye(2 * d) - P @ H)
    assert sign > 0
    return float(-0.5 * logdet + 0.5 * quad)


def mixture_energy(weights, means, covs, A) -> float:
    """1/2 iint e^{<A x, y>} dmu dmu for a Gaussian mixture (sum over pairs of components)."""
    return 0.5 * sum(
        wi * wj * math.exp(log_pair_mgf(mi, Si, mj, Sj, A))
        for wi, mi, Si in zip(weights, means, covs, strict=True)
        for wj, mj, Sj in zip(weights, means, covs, strict=True)
    )


def dense_interaction(density, grid, A) -> float:
    """The discrete formula of interaction_energy by a plain O(N^2) double sum (no log
    domain, no engine): 1/2 sum_x h^d rho(x_c) sum_y h^d rho_bar_y e^{<A x_c, y_c>} / S(A x_c).
    """
    x = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    outer = np.maximum(point_values(density, grid), 0.0).reshape(-1)
    inner = np.maximum(density, 0.0).reshape(-1)
    c = x @ A.T
    u = 0.5 * c * np.asarray(grid.spacing)
    S = np.prod(np.where(u == 0, 1.0, np.sinh(u) / np.where(u == 0, 1.0, u)), axis=1)
    kernel = np.exp(c @ x.T)  # e^{<A x_i, y_j>}
    h = grid.cell_volume
    return 0.5 * h * h * float(outer @ (kernel @ inner / S))


def gaussian_self_cost(alpha, Sigma, A, eps) -> float:
    """1/2 OT_eps(N, N) for N = N(alpha, Sigma) and the cost -<A x, y>: the optimal plan is
    Gaussian with cross-covariance C (sinkhorn_cross_covariance, 'Sinkhorn on Gaussians'), so
    OT_eps = -E<A x, y> + eps KL = -alpha^T A alpha - tr(A C) - (eps/2) log det(I - D D^T),
    D = Sigma^-1/2 C Sigma^-1/2 (KL of a Gaussian coupling against the product of its
    marginals)."""
    C = sinkhorn_cross_covariance(Sigma, A, eps)
    root_inv = np.linalg.inv(np.real(sqrtm(Sigma)))
    D = root_inv @ C @ root_inv
    _, logdet = np.linalg.slogdet(np.eye(len(alpha)) - D @ D.T)
    return 0.5 * float(-alpha @ A @ alpha - np.trace(A @ C) - 0.5 * eps * logdet)


def strictly(values, direction: str, margin: float) -> bool:
    """Every step in ``direction`` by more than ``margin``: with margin = 2 x the largest
    error of the values, the exact steps have the same sign."""
    steps = np.diff(values)
    return bool(np.all(steps < -margin) if direction == "decreasing" else np.all(steps > margin))


# ---- the functionals ------------------------------------------------------------------------
def test_trace_lyapunov_and_the_box_factor():
    cov = np.array([[1.0, 0.3], [0.3, 0.5]])
    assert trace_lyapunov(cov, V_E1) == pytest.approx(
        np.trace(np.linalg.inv(V_E1) @ cov), rel=1e-14
    )
    with pytest.raises(ValueError, match="singular"):
        trace_lyapunov(cov, [[1.0, 2.0], [2.0, 4.0]])
    c = np.array([[0.0, 1e-5], [3.0, -40.0], [-2000.0, 1e-3]])
    h = (0.5, 0.25)
    u = 0.5 * c * np.array(h)
    plain = np.sum(
        np.log(
            np.where(
                u == 0, 1.0, np.sinh(np.where(np.abs(u) > 500, 1.0, u)) / np.where(u == 0, 1.0, u)
            )
        ),
        axis=1,
    )
    got = log_box_factor(c, h)
    assert np.allclose(got[:2], plain[:2], rtol=1e-14, atol=1e-16)
    expected = 500 - math.log(1000) + (1.25e-4) ** 2 / 6  # sinh(500) overflows nothing
    assert np.isfinite(got[2]) and got[2] == pytest.approx(expected, rel=1e-14)


def test_interaction_energy_matches_the_dense_double_sum():
    """Both engines against a plain O(N^2) evaluation of the same sums (a non-Gaussian
    mixture: the separable table's interpolation is not exact there)."""
    grid = Grid([-5, -4.5], [5.5, 5], [30, 28])
    rho = gaussian_mixture(grid, MIX_W, MIX_MEANS, MIX_COVS)
    reference = dense_interaction(rho, grid, A_SYM)
    for engine in ("direct", "separable"):
        value = interaction_energy(rho, grid, A_SYM, engine=engine)
        print(f"\n{engine}: {value:.16f} vs dense {reference:.16f}: {value / reference - 1:.1e}")
        assert value == pytest.approx(reference, rel=1e-12)


def test_interaction_energy_of_gaussians_and_mixtures_against_the_closed_form():
    mean, cov = np.array([0.3, -0.2]), np.array([[0.5, 0.1], [0.1, 0.3]])
    exact = 0.5 * math.exp(log_pair_mgf(mean, cov, mean, cov, A_SYM))
    rows = []
    for n in (16, 24, 32, 48):
        grid = Grid([-6, -6], [6, 6], [n, n])
        rows.append((n, interaction_energy(gaussian(grid, mean, cov), grid, A_SYM) / exact - 1))
    print("\ninteraction energy of a Gaussian, 2-D box +-6: relative error")
    for n, err in rows:
        print(f"  {n:3d}^2  {err:+.2e}")
    assert abs(rows[-1][1]) <= 1e-9
    assert abs(rows[0][1]) > 100 * abs(rows[-1][1])  # it converges (fast)

    grid = Grid([-6, -6], [6, 6], [64, 64])
    mix = interaction_energy(gaussian_mixture(grid, MIX_W, MIX_MEANS, MIX_COVS), grid, A_SYM)
    exact_mix = mixture_energy(MIX_W, MIX_MEANS, MIX_COVS, A_SYM)
    print(f"two-bump mixture, 64^2: {mix:.15f} vs {exact_mix:.15f} ({mix / exact_mix - 1:.1e})")
    assert mix == pytest.approx(exact_mix, rel=1e-9)

    # 1-D, a positive kernel
    grid1 = Grid([-8], [8], [128])
    value = interaction_energy(gaussian(grid1, [0.4], [[0.7]]), grid1, [[0.5]])
    exact1 = 0.5 * math.exp(log_pair_mgf([0.4], [[0.7]], [0.4], [[0.7]], [[0.5]]))
    print(f"1-D, A = 0.5: {value / exact1 - 1:.1e}")
    assert value == pytest.approx(exact1, rel=1e-11)


@pytest.mark.parametrize("a", [0.3, -0.3])
def test_interaction_energy_keeps_relative_accuracy_without_overflow(a):
    """e^{<A x, y>} ~ e^{+-750} (tokens near 50, A = +-0.3): E overflows / underflows
    float64, log E does not. (The pair law e^{a x y} rho(x) rho(y) / E sits within one
    standard deviation of rho's mean, where the point values are accurate.)"""
    grid = Grid([49.6], [50.4], [128])
    rho = gaussian(grid, [50.0], [[0.0025]])
    log_exact = math.log(0.5) + log_pair_mgf([50.0], [[0.0025]], [50.0], [[0.0025]], [[a]])
    log_value = interaction_energy(rho, grid, [[a]], log=True)
    print(f"\nA = {a:+}: log E = {log_value:.12f}, exact {log_exact:.12f}")
    assert log_value == pytest.approx(log_exact, rel=1e-11)
    value = interaction_energy(rho, grid, [[a]])
    assert value == (math.inf if a > 0 else 0.0)
    with pytest.raises(ValueError, match="symmetric"):
        interaction_energy(np.ones((4, 4)), Grid([0, 0], [1, 1], [4, 4]), [[0, 1], [0, 0]])


@pytest.mark.parametrize("eps", [1.0, 0.5])
def test_sinkhorn_dual_value_is_the_primal_value(eps):
    """OT_eps = + (int f dmu + int g dmu): against <cost, pi> + eps KL(pi | mu x mu) for the
    plan of plain matrix scaling (u, v iterations, no potentials) on the same grid."""
    grid = Grid([-5, -5], [5, 5], [20, 20])
    rho = gaussian_mixture(grid, MIX_W, MIX_MEANS, MIX_COVS)
    A = np.array([[-0.5, 0.2], [0.2, 0.3]])
    head = SinkhornHead(A, A, eps=eps)
    value = sinkhorn_self_cost(rho, grid, head, SinkhornAttention(head, tol=1e-13))
    q = quadrature_weights(rho, grid).reshape(-1)
    y = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    keep = q > 0
    q, y = q[keep], y[keep]
    logits = y @ A.T @ y.T  # <A y_i, y_j>
    kernel = np.exp((logits - logits.max()) / eps)
    u, v = np.ones(q.size), np.ones(q.size)
    for _ in range(5000):
        u = 1.0 / (kernel @ (v * q))
        v = 1.0 / (kernel.T @ (u * q))
    plan = (u * q)[:, None] * kernel * (v * q)[None, :]
    marginal = np.abs(plan.sum(axis=1) - q).sum() + np.abs(plan.sum(axis=0) - q).sum()
    primal = float(np.sum(plan * -logits) + eps * np.sum(plan * np.log(plan / np.outer(q, q))))
    print(
        f"\neps {eps}: dual 1/2 (int f + int g) = {value:.16f}, primal / 2 = "
        f"{primal / 2:.16f} (plan marginal error {marginal:.0e})"
    )
    assert marginal <= 1e-13
    assert value == pytest.approx(primal / 2, rel=1e-12, abs=1e-14)
    assert not value == pytest.approx(-primal / 2, rel=1e-3)  # the sign matters here


@pytest.mark.parametrize("eps", [1.0, 0.5])
def test_sinkhorn_self_cost_of_a_gaussian_against_the_closed_form(eps):
    mean, cov = np.array([0.3, -0.2]), np.array([[0.6, 0.15], [0.15, 0.4]])
    A = np.array([[-0.5, 0.2], [0.2, 0.3]])
    head = SinkhornHead(A, A, eps=eps)
    exact = gaussian_self_cost(mean, cov, A, eps)
    grid = Grid([-6, -6], [6, 6], [40, 40])
    value = sinkhorn_self_cost(
        gaussian(grid, mean, cov), grid, head, SinkhornAttention(head, tol=1e-13)
    )
    h1 = SinkhornHead([[-0.7]], [[-0.7]], eps=eps)
    exact1 = gaussian_self_cost(np.array([0.4]), np.array([[0.8]]), np.array([[-0.7]]), eps)
    grid1 = Grid([-7], [7], [96])
    value1 = sinkhorn_self_cost(
        gaussian(grid1, [0.4], [[0.8]]), grid1, h1, SinkhornAttention(h1, tol=1e-13)
    )
    print(
        f"\neps {eps}: 2-D 40^2 {value:.12f} vs {exact:.12f} ({value - exact:.1e}); "
        f"1-D 96 {value1:.14f} vs {exact1:.14f} ({value1 - exact1:.1e})"
    )
    assert abs(value - exact) <= 1e-9
    assert abs(value1 - exact1) <= 1e-11


# ---- which energies apply -------------------------------------------------------------------
def test_applicable_follows_the_theory():
    assert applicable("softmax", Head(A_E1, V_E1), gaussian_data=True) == {
        "trace_lyapunov": "decreasing",
        "interaction": "none",
    }  # V A^-1 not symmetric
    assert applicable("softmax", Head(A_E1, V_E1)) == {
        "trace_lyapunov": "none",
        "interaction": "none",
    }
    # A = -a I: the Lyapunov property holds for any data; M = -2 I: E decreases
    assert applicable("softmax", Head(-0.5 * np.eye(2), np.eye(2))) == {
        "trace_lyapunov": "decreasing",
        "interaction": "decreasing",
    }
    M = np.array([[1.5, 0.3], [0.3, 1.0]])
    assert applicable("multihead", [Head(A_SYM, M @ A_SYM)])["interaction"] == "increasing"
    assert applicable("softmax", Head(A_SYM, np.eye(2))) == {
        "trace_lyapunov": "none",
        "interaction": "none",
    }
    assert applicable("softmax", Head([[0, 1.0], [0, 0]], np.eye(2))) == {
        "trace_lyapunov": "none"
    }  # A not symmetric
    assert applicable("softmax", Head(A_SYM, [[1.0, 2.0], [2.0, 4.0]])) == {"interaction": "none"}
    assert applicable("multihead", [Head(A_SYM, np.eye(2))] * 2) == {}
    assert applicable("linear", Head(A_E1, V_E1), True) == {"trace_lyapunov": "none"}
    assert applicable("l2", L2Head(Q_E1, -Q_E1, V_E1)) == {"trace_lyapunov": "none"}
    assert applicable("sinkhorn", SinkhornHead(A_SYM, A_SYM)) == {
        "trace_lyapunov": "none",
        "sinkhorn_self_cost": "decreasing",
    }
    assert applicable("sinkhorn", SinkhornHead(A_SYM, np.eye(2))) == {"trace_lyapunov": "none"}
    assert applicable("sigmoid", Head(A_SYM, np.eye(2))) == {}
    grid = Grid([-4, -4], [4, 4], [16, 16])
    rho = gaussian(grid, [0, 0], np.eye(2))
    layered = Layers([(0.0, Head(A_SYM, np.eye(2))), (1.0, Head(A_E1, V_E1))])
    assert energies("softmax", layered, rho, grid) == {}
    assert energies("softmax", Head(A_SYM, np.eye(2)), np.stack([rho, rho]), grid) == {}
    out = energies("softmax", Head(-0.5 * np.eye(2), np.eye(2)), rho, grid)
    assert isinstance(out["interaction"], Energy) and out["interaction"].monotone == "decreasing"
    assert out["trace_lyapunov"].value == pytest.approx(
        trace_lyapunov(moments(rho, grid)[2], np.eye(2)), rel=1e-15
    )


# ---- monotone along grid runs ---------------------------------------------------------------
def run(grid, density, field, t_end, snapshots):
    start = time.perf_counter()
    result = Solver(Problem(grid, density, field, t_end, snapshots=snapshots)).run()
    assert result.status == "completed"
    return result, time.perf_counter() - start


def test_trace_lyapunov_decreases_along_a_softmax_run_and_matches_the_ode():
    """Lyapunov function (docs/theory.md, 'Closed forms') with the E1 matrices: d/dt tr(V^-1 Sigma)
    = 2 tr(A Sigma^2) < 0."""
    head = Head(A_E1, V_E1)
    grid = Grid([-5, -5], [5, 5], [40, 40])
    mean0, cov0 = np.zeros(2), np.array([[1.0, 0.3], [0.3, 0.6]])
    result, seconds = run(
        grid, gaussian(grid, mean0, cov0), SoftmaxAttention(head, engine="separable"), 2.0, 9
    )
    values = [
        energies("softmax", head, s.density, grid, s.time, gaussian_data=True)
        for s in result.snapshots
    ]
    assert all(v["trace_lyapunov"].monotone == "decreasing" for v in values)
    trace = np.array([v["trace_lyapunov"].value for v in values])
    ode = solve("softmax", mean0, cov0, head, 2.0, times=result.times)
    exact = np.array([trace_lyapunov(c, V_E1) for c in ode.covariances])
    error = float(np.abs(trace - exact).max())
    print(f"\nE1 softmax 40^2 ({seconds:.1f} s): tr(V^-1 Sigma) = {np.round(trace, 6)}")
    print(f"steps {np.round(np.diff(trace), 5)}; max |grid - ODE| = {error:.1e}")
    assert error <= 5e-4
    assert strictly(trace, "decreasing", 2 * error)


def test_interaction_energy_is_monotone_along_softmax_runs():
    """M = V A^-1 = -2 I: E decreases; M symmetric positive definite (V = M A, A negative
    definite, a short horizon before blow-up): E increases."""
    grid = Grid([-6, -6], [6, 6], [40, 40])
    mean0, cov0 = np.array([0.3, -0.2]), np.array([[0.8, 0.2], [0.2, 0.5]])
    A_neg = np.array([[-0.4, 0.1], [0.1, -0.3]])
    M = np.array([[3.0, 0.6], [0.6, 2.0]])
    cases = [
        ("decreasing", Head(-0.5 * np.eye(2), np.eye(2)), 1.0),
        ("increasing", Head(A_neg, M @ A_neg), 0.5),
    ]
    for direction, head, t_end in cases:
        result, seconds = run(
            grid, gaussian(grid, mean0, cov0), SoftmaxAttention(head, engine="separable"), t_end, 6
        )
        values = [
            energies("softmax", head, s.density, grid, s.time, gaussian_data=True)
            for s in result.snapshots
        ]
        assert values[0]["interaction"].monotone == direction
        energy = np.array([v["interaction"].value for v in values])
        # the same energy on the ODE's Gaussians: the grid error
        ode = solve("softmax", mean0, cov0, head, t_end, times=result.times)
        exact = np.array(
            [
                0.5 * math.exp(log_pair_mgf(m, c, m, c, head.A))
                for m, c in zip(ode.means, ode.covariances, strict=True)
            ]
        )
        error = float(np.abs(energy - exact).max())
        print(
            f"\n{direction} (M = {np.round(head.C @ np.linalg.inv(head.A), 3).tolist()}, "
            f"{seconds:.1f} s): E = {np.round(energy, 7)}; max |grid - Gaussian| = "
            f"{error:.1e}"
        )
        assert error <= 2e-3
        assert strictly(energy, direction, 2 * error)


def test_sinkhorn_self_cost_decreases_along_a_run():
    """A = A^T = V negative definite (the W2 gradient flow of 1/2 OT_eps: docs/theory.md,
    'Gradient flows and energies'); the
    reference is the closed form on the Gaussians of the Sinkhorn moment ODEs."""
    A = np.array([[-0.3, 0.1], [0.1, -0.2]])
    head = SinkhornHead(A, A, eps=1.0)
    grid = Grid([-5, -5], [5, 5], [24, 24])
    mean0, cov0 = np.array([0.6, -0.4]), np.array([[0.8, 0.2], [0.2, 0.5]])
    result, seconds = run(
        grid, gaussian(grid, mean0, cov0), SinkhornAttention(head, engine="separable"), 1.0, 5
    )
    field = SinkhornAttention(head)
    values = [
        energies("sinkhorn", head, s.density, grid, s.time, sinkhorn=field)
        for s in result.snapshots
    ]
    assert values[0]["sinkhorn_self_cost"].monotone == "decreasing"
    cost = np.array([v["sinkhorn_self_cost"].value for v in values])
    ode = solve("sinkhorn", mean0, cov0, head, 1.0, times=result.times)
    exact = np.array(
        [gaussian_self_cost(m, c, A, 1.0) for m, c in zip(ode.means, ode.covariances, strict=True)]
    )
    error = float(np.abs(cost - exact).max())
    print(
        f"\nSinkhorn, A = V negative definite, 24^2 ({seconds:.1f} s): 1/2 OT_eps = "
        f"{np.round(cost, 8)}; max |grid - Gaussian| = {error:.1e}"
    )
    assert error <= 1e-4
    assert strictly(cost, "decreasing", 2 * error)


# ---- output files ---------------------------------------------------------------------------
CONFIG = {
    "grid": {"lower": [-6.0, -6.0], "upper": [6.0, 6.0], "cells": [24, 24]},
    "initial": {"kind": "gaussian", "mean": [0.2, -0.1], "covariance": [[0.8, 0.2], [0.2, 0.5]]},
    "attention": {
        "variant": "softmax",
        "A": [[-0.5, 0.0], [0.0, -0.5]],
        "V": [[1.0, 0.0], [0.0, 1.0]],
        "engine": "separable",
    },
    "run": {"t_end": 0.5, "snapshots": 6},
}


def test_run_writes_energy_records_and_resume_continues_them(tmp_path, monkeypatch):
    config = build(CONFIG)
    full = run_config(config, tmp_path / "full.nc")
    ds = read(full)
    assert ds.attrs["energies"] == "trace_lyapunov,interaction"
    for name, monotone in (("trace_lyapunov", "decreasing"), ("interaction", "decreasing")):
        var = ds[f"energy_{name}"]
        assert var.dims == ("time",) and var.sizes["time"] == 6
        assert var.attrs["monotone"] == monotone
        assert var.attrs["long_name"] and var.attrs["formula"]
        assert np.all(np.isfinite(var.values)) and np.all(np.diff(var.values) < 0)
    expected = run_energies(config)(ds["density"].values[-1], 0.5)
    assert ds["energy_interaction"].values[-1] == expected["interaction"].value
    print(f"\nenergy_interaction: {ds['energy_interaction'].values}")

    # interrupt after 3 snapshots, then resume: the records continue, equal to the full run
    import tpde.run as trun

    calls = {"n": 0}
    original = trun.Progress.__call__

    def interrupt(self, snap):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        original(self, snap)

    monkeypatch.setattr(trun.Progress, "__call__", interrupt)
    cut = tmp_path / "cut.nc"
    with pytest.raises(KeyboardInterrupt):
        run_config(config, cut)
    monkeypatch.setattr(trun.Progress, "__call__", original)
    partial = read(cut)
    assert partial.sizes["time"] == 3 and partial.attrs["status"] == "interrupted"
    run_config(config, cut, resume=True)
    resumed = read(cut)
    assert resumed.attrs["status"] == "completed" and resumed.sizes["time"] == 6
    for name in ("energy_trace_lyapunov", "energy_interaction"):
        assert resumed[name].attrs["monotone"] == "decreasing"
        np.testing.assert_allclose(resumed[name].values, ds[name].values, rtol=1e-12)


def test_writer_energy_records(tmp_path):
    """Plain floats get monotone "none"; a name missing later is NaN; an unknown one fails;
    a masked run's callable gives no records (an empty ``energies`` attribute)."""
    grid = Grid([-4, -4], [4, 4], [12, 12])
    rho = gaussian(grid, [0, 0], np.eye(2))

    class Snap:
        def __init__(self, t):
            self.time, self.density, self.outflow, self.max_speed, self.dt = t, rho, 0, 1, 0.1

    answers = iter(
        [{"a": 1.0, "b": Energy(2.0, "increasing", "bee", "b = 2")}, {"a": 3.0}, {"c": 1.0}]
    )
    path = tmp_path / "e.nc"
    writer = SnapshotWriter(path, grid, energies=lambda density, t: next(answers))
    writer.write(Snap(0.0))
    writer.write(Snap(1.0))
    with pytest.raises(ValueError, match="not among the energies"):
        writer.write(Snap(2.0))
    writer.close()
    ds = read(path)
    assert ds.attrs["energies"] == "a,b"
    assert ds["energy_a"].attrs["monotone"] == "none"
    assert ds["energy_b"].attrs["monotone"] == "increasing"
    assert ds["energy_b"].attrs["formula"] == "b = 2"
    np.testing.assert_array_equal(ds["energy_a"].values, [1.0, 3.0])
    assert ds["energy_b"].values[0] == 2.0 and np.isnan(ds["energy_b"].values[1])
    resumed = SnapshotWriter.resume(path, energies=lambda density, t: {"a": 5.0, "b": 6.0})
    resumed.write(Snap(3.0))
    resumed.close()
    ds = read(path)
    np.testing.assert_array_equal(ds["energy_b"].values[-1], 6.0)

    masked = dict(CONFIG, attention=dict(CONFIG["attention"], masked=True))
    masked["grid"] = dict(CONFIG["grid"], positions=2)
    assert run_energies(build(masked))(np.zeros((3, 24, 24)), 0.0) == {}
    path = tmp_path / "none.nc"
    writer = SnapshotWriter(path, grid, energies=lambda density, t: {})
    writer.write(Snap(0.0))
    writer.close()
    ds = read(path)
    assert ds.attrs["energies"] == "" and not [v for v in ds.data_vars if "energy" in v]


@pytest.mark.parametrize(
    "variant, extra, names",
    [
        (
            "softmax",
            {"A": [[-0.5, 0.1], [0.1, -0.3]], "V": [[1.0, 0.2], [0.2, 1.0]]},
            {"trace_lyapunov": "decreasing", "interaction": "none"},
        ),
        (
            "linear",
            {"A": [[-0.5, 0.1], [0.1, -0.3]], "V": [[1.0, 0.2], [0.2, 1.0]]},
            {"trace_lyapunov": "none"},
        ),
        (
            "l2",
            {
                "Q": [[0.5, 0.1], [0.0, 0.4]],
                "K": [[0.3, 0.0], [0.1, 0.5]],
                "V": [[1.0, 0.0], [0.0, 1.0]],
            },
            {"trace_lyapunov": "none"},
        ),
        (
            "sinkhorn",
            {"A": [[-0.3, 0.1], [0.1, -0.2]], "V": [[-0.3, 0.1], [0.1, -0.2]], "epsilon": 0.5},
            {"trace_lyapunov": "none", "sinkhorn_self_cost": "decreasing"},
        ),
        ("sigmoid", {"A": [[-0.3, 0.1], [0.1, -0.2]], "V": [[1.0, 0.0], [0.0, 1.0]]}, {}),
    ],
)
def test_run_energies_of_each_variant(variant, extra, names):
    raw = dict(CONFIG, attention={"variant": variant, **extra})
    config = build(raw)
    out = run_energies(config)(config.problem.density, 0.0)
    assert {name: e.monotone for name, e in out.items()} == names
    assert all(np.isfinite(e.value) for e in out.values())
    if variant == "sinkhorn":  # the energies' own Sinkhorn field, the run's options
        grid = config.problem.grid
        head = SinkhornHead(extra["A"], extra["V"], eps=0.5)
        assert out["sinkhorn_self_cost"].value == pytest.approx(
            sinkhorn_self_cost(config.problem.density, grid, head), rel=1e-12
        )
    # a Gaussian start that is not flagged as one: no Lyapunov expectation for general data
    mixture = dict(
        raw,
        initial={
            "kind": "mixture",
            "weights": [0.5, 0.5],
            "means": [[-1.0, 0.0], [1.0, 0.0]],
            "covariances": [[[0.5, 0.0], [0.0, 0.5]]] * 2,
        },
    )
    flagged = run_energies(build(mixture))(config.problem.density, 0.0)
    assert all(e.monotone == "none" for name, e in flagged.items() if name == "trace_lyapunov")
