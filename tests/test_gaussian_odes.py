"""Gaussian moment ODEs (tpde.validation.gaussian) against the explicit formulas, closed forms
and validation cases of docs/theory.md ('Gaussian closures', 'Closed forms', 'Validation
cases'; the reference numbers printed there are checked to their last digit).

Every test prints the numbers it checks (``pytest -s``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import expm, sqrtm
from scipy.optimize import brentq

from tpde.validation.gaussian import (
    VARIANTS,
    Head,
    L2Head,
    Layers,
    SinkhornHead,
    affine_field,
    gaussian_rhs,
    head_from_qk,
    l2_isotropic_time,
    params_at,
    sinkhorn_cross_covariance,
    sinkhorn_isotropic_time,
    sinkhorn_mean,
    softmax_blowup_time,
    softmax_mean_scalar,
    softmax_rank_deficient_limit,
    softmax_scalar_v_covariance,
    softmax_scalar_v_inverse_covariance,
    solve,
)
from tpde.validation.particles import TokenSystem, gauss_hermite_tokens, simulate, token_moments

I2 = np.eye(2)
SIGMA0 = np.array([[1.0, 0.4], [0.4, 0.6]])
ALPHA0 = np.array([0.5, -0.3])

# docs/theory.md, 'Test matrices c1 and c2': case c1
C1_A = np.array([[-0.6, 0.8], [-0.2, -0.3]])
C1_V = np.array([[1.0, 0.5], [-0.3, 0.8]])
C1_Q = np.array([[0.8, -0.3], [0.5, 0.6]])
C1_K = np.array([[0.4, 0.7], [-0.6, 0.2]])
# case c2
C2_ALPHA0 = np.array([-0.4, 0.6])
C2_SIGMA0 = np.array([[0.8, -0.3], [-0.3, 0.5]])
C2_A = np.array([[0.4, -0.9], [0.3, 0.1]])
C2_V = np.array([[0.2, -1.0], [0.7, 0.3]])


def printed_tol(text: str) -> float:
    """Half a unit in the last printed digit of ``text`` (plus round-off slack)."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** (-decimals) * (1 + 1e-6)


def check_printed(label: str, got, printed) -> None:
    """Compare ``got`` with the reference numbers ``printed`` (strings, as docs/theory.md
    prints them) to the printed digits."""
    got = np.atleast_1d(np.asarray(got, float)).ravel()
    printed = [printed] if isinstance(printed, str) else [str(p) for p in printed]
    errs = [abs(g - float(p)) for g, p in zip(got, printed, strict=True)]
    tols = [printed_tol(p) for p in printed]
    print(
        f"  {label}: got {np.array2string(got, precision=9)}  reference {list(printed)}  "
        f"max|err| {max(errs):.2e}"
    )
    assert all(e <= t for e, t in zip(errs, tols, strict=True)), (label, got, printed)


def rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))


def random_spd(rng, d):
    G = rng.normal(size=(d, d))
    return G @ G.T + 0.5 * np.eye(d)


# ---- VC1-VC4 (docs/theory.md, 'Validation cases') and 'Closed forms' ------------------------
def test_vc1_scalar_blowup():
    print("\nVC1 softmax V = I, A = 0.5 I")
    head = Head(0.5 * I2, I2)
    sol = solve("softmax", ALPHA0, SIGMA0, head, 1.0, times=[0.2, 0.4])
    check_printed("Sigma(0.2)", sol.covariances[0], ["1.30734", "0.57339", "0.57339", "0.73394"])
    check_printed("alpha(0.2)", sol.means[0], ["0.66599", "-0.35997"])
    check_printed("Sigma(0.4)", sol.covariances[1], ["1.91450", "0.92937", "0.92937", "0.98513"])
    check_printed("alpha(0.4)", sol.means[1], ["0.91815", "-0.41290"])
    for i, t in enumerate([0.2, 0.4]):
        exact = SIGMA0 @ np.linalg.inv(I2 - t * SIGMA0)
        e_cov = rel(sol.covariances[i], exact)
        e_mean = rel(sol.means[i], softmax_mean_scalar(ALPHA0, SIGMA0, 0.5, 1.0, t))
        print(
            f"  t = {t}: ODE vs Sigma0 (I - t Sigma0)^-1 {e_cov:.1e}, vs mean formula {e_mean:.1e}"
        )
        assert e_cov < 1e-11 and e_mean < 1e-11
    t_closed = softmax_blowup_time(SIGMA0, 0.5 * I2, 1.0)
    print(
        f"  status {sol.status}, event t* = {sol.status_time:.10f}, closed form "
        f"{t_closed:.10f}, reference 0.801787283"
    )
    assert sol.status == "blowup"
    assert abs(sol.status_time - 0.801787283) <= 1e-6
    assert abs(t_closed - 0.801787283) <= 1e-9
    # the final state is at the threshold: lambda_max = 1e8 lambda_max(Sigma0)
    lam = np.linalg.eigvalsh(sol.at(sol.status_time)[1])[-1]
    ratio = lam / np.linalg.eigvalsh(SIGMA0)[-1]
    print(f"  lambda_max(Sigma(t_event)) / lambda_max(Sigma0) = {ratio:.9e}")
    # exactly: lambda_max(Sigma(t)) = s / (1 - t s), s = lambda_max(Sigma0), reaches 1e8 s at
    # t = t* (1 - 1e-8)
    t_hit = t_closed * (1 - 1e-8)
    print(f"  event time vs t* (1 - 1e-8) = {t_hit:.12f}: {abs(sol.status_time - t_hit):.1e}")
    assert abs(ratio / 1e8 - 1) < 1e-6 and abs(sol.status_time - t_hit) < 1e-12


def test_vc2_collapse():
    print("\nVC2 softmax V = I, A = -I")
    times = [0.5, 1.0, 5.0]
    sol = solve("softmax", ALPHA0, SIGMA0, Head(-I2, I2), 5.0, times=times)
    printed = [
        ["0.473684", "0.131579", "0.131579", "0.342105"],
        ["0.315436", "0.067114", "0.067114", "0.248322"],
        ["0.088525", "0.006557", "0.006557", "0.081967"],
    ]
    for i, t in enumerate(times):
        check_printed(f"Sigma({t})", sol.covariances[i], printed[i])
        exact = np.linalg.inv(np.linalg.inv(SIGMA0) + 2 * t * I2)
        e = rel(sol.covariances[i], exact)
        print(f"    vs (Sigma0^-1 + 2 t I)^-1: {e:.1e}")
        assert e < 1e-11
    check_printed("alpha(0.5)", sol.means[0], ["0.636444", "-0.469957"])
    check_printed("alpha(1)", sol.means[1], ["0.897916", "-0.712676"])
    e = rel(sol.means[1], softmax_mean_scalar(ALPHA0, SIGMA0, -1.0, 1.0, 1.0))
    print(f"  alpha(1) vs e^t (I + 2 t Sigma0)^-1/2 alpha0: {e:.1e}")
    assert e < 1e-11 and sol.status == "completed"


def test_vc3_rank_one_clustering():
    print("\nVC3 softmax V = I, A = -q^T q / sqrt 2, q = (0.6, -0.8)")
    q = np.array([[0.6, -0.8]])
    A = -q.T @ q / math.sqrt(2)
    S0 = np.array([[0.7, 0.2], [0.2, 0.3]])
    limit = softmax_rank_deficient_limit(S0, A)
    check_printed("Sigma_inf", limit, ["0.431746", "0.323810", "0.323810", "0.242857"])
    other = S0 - S0 @ q.T @ q @ S0 / (q @ S0 @ q.T)
    print(
        f"  Sigma_inf vs Sigma0 - Sigma0 q^T q Sigma0 / (q Sigma0 q^T): {rel(limit, other):.1e}; "
        f"|Sigma_inf q^T| = {np.linalg.norm(limit @ q.T):.1e}, "
        f"rank {np.linalg.matrix_rank(limit, 1e-10)}"
    )
    assert rel(limit, other) < 1e-12 and np.linalg.norm(limit @ q.T) < 1e-12
    assert np.linalg.matrix_rank(limit, 1e-10) == 1
    times = [1.0, 10.0, 100.0, 1000.0]
    sol = solve("softmax", np.zeros(2), S0, Head(A, I2), 1000.0, times=times)
    dist = [np.linalg.norm(S - limit) for S in sol.covariances]
    check_printed("|Sigma(1) - Sigma_inf|_F", dist[0], "0.2399")
    check_printed("|Sigma(10) - Sigma_inf|_F", dist[1], "0.07130")
    print(
        f"  |Sigma(t) - Sigma_inf|_F at t = 100, 1000: {dist[2]:.3e}, {dist[3]:.3e} "
        "(reference: 8.88e-3, 9.1e-4)"
    )
    check_printed("|Sigma(100) - Sigma_inf|_F", dist[2], "0.00888")
    check_printed("|Sigma(1000) - Sigma_inf|_F", dist[3], "0.00091")
    for i, t in enumerate(times):
        exact = softmax_scalar_v_covariance(S0, A, 1.0, t)
        assert rel(sol.covariances[i], exact) < 1e-10
    print(f"  max |alpha| = {np.abs(sol.means).max():.1e}")
    assert np.all(sol.means == 0)


def test_vc4_indefinite():
    print("\nVC4 softmax V = I, A = [[0.3, -0.8], [0.5, -0.6]]")
    A = np.array([[0.3, -0.8], [0.5, -0.6]])
    check_printed("eig(A + A^T)", np.linalg.eigvalsh(A + A.T), ["-1.24868", "0.64868"])
    sol = solve("softmax", ALPHA0, SIGMA0, Head(A, I2), 3.0, times=[0.5, 1.0])
    check_printed(
        "Sigma(0.5)", sol.covariances[0], ["1.158676", "0.306169", "0.306169", "0.429004"]
    )
    check_printed("Sigma(1)", sol.covariances[1], ["1.522519", "0.267039", "0.267039", "0.334795"])
    check_printed("alpha(0.5)", sol.means[0], ["1.264121", "-0.208284"])
    check_printed("alpha(1)", sol.means[1], ["2.834328", "0.026487"])
    t_closed = softmax_blowup_time(SIGMA0, A, 1.0)
    print(
        f"  status {sol.status}, event t* = {sol.status_time:.10f}, closed form "
        f"{t_closed:.10f}, reference 2.25459678"
    )
    assert sol.status == "blowup"
    assert abs(sol.status_time - 2.25459678) <= 1e-6
    assert abs(t_closed - 2.25459678) <= printed_tol("2.25459678")


def test_inverse_covariance_closed_form_random():
    print("\nSigma^-1(t) = Sigma0^-1 - v t (A + A^T), V = v I, random A (d = 3)")
    rng = np.random.default_rng(20250130)
    worst = 0.0
    for trial in range(6):
        A = rng.normal(size=(3, 3))
        v = rng.uniform(-1.5, 1.5)
        S0 = random_spd(rng, 3) / 3
        a0 = rng.normal(size=3)
        t_star = softmax_blowup_time(S0, A, v)
        t_end = min(2.0, 0.5 * t_star)
        times = np.linspace(0, t_end, 5)[1:]
        sol = solve("softmax", a0, S0, Head(A, v * np.eye(3)), t_end, times=times)
        errs = [
            rel(np.linalg.inv(S), softmax_scalar_v_inverse_covariance(S0, A, v, t))
            for S, t in zip(sol.covariances, times, strict=True)
        ]
        line = f"  trial {trial}: v = {v:+.3f}, t* = {t_star:.5f}, max rel err {max(errs):.1e}"
        if math.isfinite(t_star):
            blow = solve("softmax", a0, S0, Head(A, v * np.eye(3)), 2 * t_star)
            line += f", event t* {blow.status_time:.8f} ({blow.status})"
            assert blow.status == "blowup" and abs(blow.status_time - t_star) < 1e-6 * t_star
        print(line)
        worst = max(worst, *errs)
    assert worst <= 1e-10


def test_scalar_mean_and_blowup_times():
    print("\nA = a I, V = v I: t* and the mean e^{vt} (I - 2 v a t Sigma0)^-1/2 alpha0 at t*/2")
    printed = {(1.0, 0.5): "0.80178728", (0.7, 1.3): "0.44054246", (2.0, 0.25): "0.80178728"}
    for (v, a), text in printed.items():
        t_star = softmax_blowup_time(SIGMA0, a * I2, v)
        check_printed(f"t* (v, a) = ({v}, {a})", t_star, text)
        t = 0.5 * t_star
        sol = solve("softmax", ALPHA0, SIGMA0, Head(a * I2, v * I2), t, times=[t])
        e_mean = rel(sol.means[0], softmax_mean_scalar(ALPHA0, SIGMA0, a, v, t))
        e_cov = rel(sol.covariances[0], SIGMA0 @ np.linalg.inv(I2 - 2 * v * a * t * SIGMA0))
        print(f"    at t*/2: mean rel err {e_mean:.1e}, covariance rel err {e_cov:.1e}")
        assert e_mean <= 1e-10 and e_cov <= 1e-10


# ---- VC5, VC7 ---------------------------------------------------------------------------------
def test_vc5_sinkhorn_mean():
    print("\nVC5 Sinkhorn mean, c1 (A, V)")
    times = [0.25, 0.5, 1.0]
    sol = solve("sinkhorn", ALPHA0, SIGMA0, SinkhornHead(C1_A, C1_V), 1.0, times=times)
    printed = [["0.592161", "-0.411569"], ["0.692514", "-0.555835"], ["0.904454", "-0.975143"]]
    for i, t in enumerate(times):
        check_printed(f"alpha({t})", sol.means[i], printed[i])
        e = rel(sol.means[i], sinkhorn_mean(ALPHA0, C1_V, t))
        print(f"    vs expm(t V) alpha0: {e:.1e}")
        assert e < 1e-11


def invert_time(time_of, t):
    return brentq(lambda lam: time_of(lam) - t, 1e-6, 1e6, xtol=1e-15, rtol=1e-15)


@pytest.mark.parametrize(
    "v, q, k, printed",
    [(1.0, 0.8, 0.6, ("2.4448009", "288.30401")), (1.0, -0.8, 0.6, ("0.35074871", "0.16289723"))],
)
def test_vc7_l2_isotropic(v, q, k, printed):
    print(f"\nVC7 l2 isotropic (v, q, k) = ({v}, {q}, {k}), Sigma0 = 0.7 I")
    head = L2Head(q * I2, k * I2, v * I2)
    sol = solve("l2", np.zeros(2), 0.7 * I2, head, 3.0, times=[1.0, 3.0])
    for i, t in enumerate([1.0, 3.0]):
        S = sol.covariances[i]
        assert abs(S[0, 1]) < 1e-12 * S[0, 0] and abs(S[0, 0] - S[1, 1]) < 1e-12 * S[0, 0]
        check_printed(f"lambda({t})", S[0, 0], printed[i])
        lam = invert_time(lambda x: l2_isotropic_time(x, 0.7, q, k, v), t)
        e = abs(lam - S[0, 0]) / lam
        print(f"    implicit formula inverted with brentq: {lam:.10g}, rel diff to ODE {e:.1e}")
        assert e < 1e-10


@pytest.mark.parametrize(
    "v, a, printed",
    [(1.0, 0.8, ("2.3431540", "96.891524")), (1.0, -0.8, ("0.35261385", "0.16882819"))],
)
def test_vc7_sinkhorn_isotropic(v, a, printed):
    print(f"\nVC7 Sinkhorn isotropic (v, a) = ({v}, {a}), Sigma0 = 0.7 I")
    sol = solve(
        "sinkhorn", np.zeros(2), 0.7 * I2, SinkhornHead(a * I2, v * I2), 3.0, times=[1.0, 3.0]
    )
    for i, t in enumerate([1.0, 3.0]):
        S = sol.covariances[i]
        assert abs(S[0, 1]) < 1e-12 * S[0, 0] and abs(S[0, 0] - S[1, 1]) < 1e-12 * S[0, 0]
        check_printed(f"lambda({t})", S[0, 0], printed[i])
        lam = invert_time(lambda x: sinkhorn_isotropic_time(x, 0.7, a, v), t)
        e = abs(lam - S[0, 0]) / lam
        print(f"    implicit formula inverted with brentq: {lam:.10g}, rel diff to ODE {e:.1e}")
        assert e < 1e-10


# ---- one formula per variant: affine field vs the explicit formulas ('Gaussian closures') ----
def explicit_softmax(alpha, S, A, V):
    return V @ (np.eye(len(alpha)) + S @ A) @ alpha, V @ S @ A @ S + S @ A.T @ S @ V.T


def explicit_linear(alpha, S, A, V):
    M2 = S + np.outer(alpha, alpha)
    return V @ M2 @ A @ alpha, V @ M2 @ A @ S + S @ A.T @ M2 @ V.T


def explicit_l2(alpha, S, Q, K, V):
    eye = np.eye(len(alpha))
    da = V @ np.linalg.inv(eye + 2 * S @ K.T @ K) @ (eye + 2 * S @ K.T @ Q) @ alpha
    half = 2 * V @ S @ np.linalg.inv(eye + 2 * K.T @ K @ S) @ K.T @ Q @ S
    # the equivalent form 2 V (Sigma^-1 + 2 K^T K)^-1 K^T Q Sigma ('l2 on Gaussians')
    other = 2 * V @ np.linalg.inv(np.linalg.inv(S) + 2 * K.T @ K) @ K.T @ Q @ S
    assert rel(half, other) < 1e-12
    return da, half + half.T


def explicit_sinkhorn_C(S, A, eps=1.0):
    root = np.real(sqrtm(S))
    B = root @ A.T @ root / eps
    d = len(S)
    D = 2 * B @ np.linalg.inv(np.eye(d) + np.real(sqrtm(np.eye(d) + 4 * B.T @ B)))
    return root @ D @ root


def authors_sinkhorn_rhs(S, A, V):
    """The authors' code's form ('Sinkhorn on Gaussians'): C_S and rhs = V A^-T Sigma^-1 C_S Sigma +
    transpose."""
    d = len(S)
    root = np.real(sqrtm(S))
    inner = np.real(sqrtm(4 * root @ A.T @ S @ A @ root + np.eye(d)))
    CS = 0.5 * (root @ inner @ np.linalg.inv(root) - np.eye(d))
    half = V @ np.linalg.inv(A).T @ np.linalg.inv(S) @ CS @ S
    return CS, half + half.T


def test_affine_field_equals_explicit_formulas():
    print("\naffine-field form vs the explicit formulas (d = 3, 5 random draws)")
    rng = np.random.default_rng(7)
    d = 3
    worst = dict.fromkeys(VARIANTS, 0.0)
    for _ in range(5):
        S = random_spd(rng, d)
        alpha = rng.normal(size=d)
        A, V = rng.normal(size=(2, d, d))
        Q, K = rng.normal(size=(2, 2, d))
        scale = 0.7
        eps = rng.uniform(0.5, 2.0)
        heads = [
            head_from_qk(
                rng.normal(size=(2, d)),
                rng.normal(size=(2, d)),
                rng.normal(size=(2, d)),
                rng.normal(size=(d, 2)),
                scale=0.5,
            )
            for _ in range(2)
        ]
        cases = {
            "softmax": (Head(A, V), explicit_softmax(alpha, S, A, V)),
            "linear": (Head(A, V), explicit_linear(alpha, S, A, V)),
            "l2": (L2Head(Q, K, V, scale), explicit_l2(alpha, S, scale * Q, K, V)),
            "multihead": (
                heads,
                tuple(
                    sum(parts)
                    for parts in zip(
                        *[explicit_softmax(alpha, S, h.A, h.W @ h.V) for h in heads], strict=True
                    )
                ),
            ),
            "sinkhorn": (
                SinkhornHead(A, V, eps=eps),
                (
                    V @ alpha,
                    V @ explicit_sinkhorn_C(S, A, eps).T + explicit_sinkhorn_C(S, A, eps) @ V.T,
                ),
            ),
        }
        for variant, (params, (da_ref, dS_ref)) in cases.items():
            da, dS = gaussian_rhs(variant, alpha, S, params)
            b, M = affine_field(variant, alpha, S, params)
            worst[variant] = max(
                worst[variant], rel(da, da_ref), rel(dS, dS_ref), rel(b + M @ alpha, da_ref)
            )
        # authors' code form of Sinkhorn (eps = 1, invertible A)
        CS, dS_code = authors_sinkhorn_rhs(S, A, V)
        dS_ours = gaussian_rhs("sinkhorn", alpha, S, SinkhornHead(A, V))[1]
        worst["sinkhorn [CODE] form"] = max(
            worst.get("sinkhorn [CODE] form", 0.0),
            rel(dS_ours, dS_code),
            rel(sinkhorn_cross_covariance(S, A), CS @ np.linalg.inv(A)),
        )
    for name, e in worst.items():
        print(f"  {name:22s} max rel diff {e:.1e}")
    assert all(e <= 1e-12 for name, e in worst.items() if "CODE" not in name)
    # sqrtm / pinv-free identities of the [CODE] form go through A^-1: allow conditioning
    assert worst["sinkhorn [CODE] form"] <= 1e-10


def test_sinkhorn_cross_covariance_equation():
    print("\nSinkhorn: Sigma^-1 C (Sigma - C^T Sigma^-1 C)^-1 = A^T / eps")
    rng = np.random.default_rng(11)
    for trial in range(6):
        d = 2 + trial % 3
        S = random_spd(rng, d)
        A = rng.normal(size=(d, d))
        if trial == 5:
            A = np.outer(rng.normal(size=d), rng.normal(size=d))  # singular A
        eps = [1.0, 0.5, 2.0][trial % 3]
        C = sinkhorn_cross_covariance(S, A, eps)
        Si = np.linalg.inv(S)
        lhs = Si @ C @ np.linalg.inv(S - C.T @ Si @ C)
        e = np.linalg.norm(lhs - A.T / eps) / np.linalg.norm(A.T / eps)
        # the joint covariance [[S, C], [C^T, S]] of the plan must be positive definite
        joint = np.block([[S, C], [C.T, S]])
        print(
            f"  d = {d}, eps = {eps}, rank A = {np.linalg.matrix_rank(A)}: residual {e:.1e}, "
            f"lambda_min(joint) {np.linalg.eigvalsh(joint)[0]:.3f}"
        )
        assert e <= 1e-10 and np.linalg.eigvalsh(joint)[0] > 0


# ---- time-dependent parameters ----------------------------------------------------------------
def test_piecewise_layers_equal_restart():
    print("\nLayers: c1 on [0, 0.3), c2 on [0.3, 0.7] vs run + restart")
    p1, p2 = Head(C1_A, C1_V), Head(C2_A, C2_V)
    for variant, q1, q2 in [
        ("softmax", p1, p2),
        ("sinkhorn", SinkhornHead(C1_A, C1_V), SinkhornHead(C2_A, C2_V)),
    ]:
        layered = solve(
            variant, ALPHA0, SIGMA0, Layers([(0.0, q1), (0.3, q2)]), 0.7, times=[0.2, 0.3, 0.7]
        )
        as_dict = solve(
            variant, ALPHA0, SIGMA0, {"layers": [(0.0, q1), (0.3, q2)]}, 0.7, times=[0.7]
        )
        first = solve(variant, ALPHA0, SIGMA0, q1, 0.3, times=[0.2, 0.3])
        second = solve(
            variant, first.means[-1], first.covariances[-1], q2, 0.7, t0=0.3, times=[0.7]
        )
        e = max(
            rel(layered.means[-1], second.means[0]),
            rel(layered.covariances[-1], second.covariances[0]),
            rel(layered.covariances[0], first.covariances[0]),
            rel(layered.covariances[1], first.covariances[1]),
        )
        e_dict = rel(as_dict.covariances[0], layered.covariances[-1])
        print(
            f"  {variant}: layered vs restart {e:.1e}; dict form vs Layers {e_dict:.1e}; "
            f"params_at(0.3) is layer 2: {params_at(Layers([(0, q1), (0.3, q2)]), 0.3) is q2}"
        )
        assert e <= 1e-10 and e_dict == 0.0


def test_callable_parameters():
    print("\nCallable parameters")
    p = Head(C1_A, C1_V)
    const = solve("softmax", ALPHA0, SIGMA0, p, 0.5, times=[0.25, 0.5])
    call = solve("softmax", ALPHA0, SIGMA0, lambda t: p, 0.5, times=[0.25, 0.5])
    e = max(rel(call.means, const.means), rel(call.covariances, const.covariances))
    print(f"  callable returning the constant vs constant: {e:.1e}")
    assert e <= 1e-14
    # A(t) = a(t) I, V = I: Sigma^-1(t) = Sigma0^-1 - 2 (int_0^t a) I ('Closed forms' with A(t))
    times = [0.5, 1.0]
    sol = solve(
        "softmax",
        ALPHA0,
        SIGMA0,
        lambda t: Head((0.2 + 0.3 * np.sin(t)) * I2, I2),
        1.0,
        times=times,
    )
    errs = []
    for S, t in zip(sol.covariances, times, strict=True):
        integral = 0.2 * t + 0.3 * (1 - np.cos(t))
        errs.append(rel(np.linalg.inv(S), np.linalg.inv(SIGMA0) - 2 * integral * I2))
    print(
        f"  A(t) = (0.2 + 0.3 sin t) I, t = 0.5, 1: Sigma^-1 vs Sigma0^-1 - 2 int a, "
        f"max rel err {max(errs):.1e} ({sol.status})"
    )
    assert sol.status == "completed" and max(errs) <= 1e-10


def test_parameter_validation_messages():
    print("\nValidation messages")
    cases = [
        (
            lambda: solve("softmax", ALPHA0, SIGMA0, Head(np.eye(3), np.eye(3)), 1.0),
            "attention.A: expected 2 x 2, got 3 x 3",
        ),
        (lambda: Head(np.ones((2, 3)), I2), "Head.A: expected a square"),
        (lambda: Head(I2, [[np.nan, 0], [0, 1]]), "Head.V: entries must be finite"),
        (
            lambda: solve("l2", ALPHA0, SIGMA0, Head(I2, I2), 1.0),
            "attention: expected L2Head for variant 'l2', got Head",
        ),
        (
            lambda: solve(
                "multihead", ALPHA0, SIGMA0, [Head(I2, I2), Head(np.eye(3), np.eye(3))], 1.0
            ),
            "attention.heads[1].A: expected 2 x 2",
        ),
        (lambda: solve("softmax", ALPHA0, -SIGMA0, Head(I2, I2), 1.0), "cov0: not positive"),
        (lambda: solve("nope", ALPHA0, SIGMA0, Head(I2, I2), 1.0), "variant: expected one of"),
    ]
    for make, start in cases:
        with pytest.raises(ValueError) as info:
            make()
        print(f"  {info.value}")
        assert str(info.value).startswith(start) and "\n" not in str(info.value)


# ---- deterministic Gauss-Hermite tokens ('Gaussian closures') --------------------------------
@pytest.mark.parametrize("kind", ["softmax", "l2"])
def test_gauss_hermite_tokens(kind):
    """Tokens follow the ODE; with the transposed convention (A -> A^T, Q <-> K) they do not."""
    print(f"\nGauss-Hermite 30 x 30 tokens, {kind}, c1, RK4 dt = 0.01 to t = 0.5")
    if kind == "softmax":
        params, wrong = Head(C1_A, C1_V), Head(C1_A.T, C1_V)
    else:
        params, wrong = L2Head(C1_Q, C1_K, C1_V), L2Head(C1_K, C1_Q, C1_V)
    X, W = gauss_hermite_tokens(ALPHA0, SIGMA0, 30)
    solution = simulate(TokenSystem(kind, params), X, 0.5, 0.01, weights=W)
    m, S = token_moments(solution.tokens[-1], W)
    ode = solve(kind, ALPHA0, SIGMA0, params, 0.5, times=[0.5])
    bad = solve(kind, ALPHA0, SIGMA0, wrong, 0.5, times=[0.5])
    e_mean, e_cov = rel(m, ode.means[0]), rel(S, ode.covariances[0])
    w_mean, w_cov = rel(m, bad.means[0]), rel(S, bad.covariances[0])
    swap = "A -> A^T" if kind == "softmax" else "Q <-> K"
    print(f"  tokens vs ODE: mean {e_mean:.1e}, covariance {e_cov:.1e}")
    print(f"  tokens vs wrong-transpose ODE ({swap}): mean {w_mean:.1e}, covariance {w_cov:.1e}")
    assert e_mean <= 1e-8 and e_cov <= 1e-8
    assert w_cov > 1e-2


def test_sinkhorn_mean_closed_form_any_time():
    # alpha(t) = expm(t V) alpha0 also through a layer change (piecewise-constant V)
    p1, p2 = SinkhornHead(C1_A, C1_V), SinkhornHead(C2_A, C2_V)
    sol = solve("sinkhorn", C2_ALPHA0, C2_SIGMA0, Layers([(0.0, p1), (0.4, p2)]), 1.0, times=[1.0])
    exact = expm(0.6 * C2_V) @ expm(0.4 * C1_V) @ C2_ALPHA0
    e = rel(sol.means[0], exact)
    print(f"\nSinkhorn mean through a layer change vs expm(0.6 V2) expm(0.4 V1) alpha0: {e:.1e}")
    assert e < 1e-11
