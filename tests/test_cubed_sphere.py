"""The cubed sphere (docs/theory.md, 'The cubed sphere'): exact geometry and cell averages, the
halo, transport by a solid-body rotation against its exact solution (orders printed), mass,
positivity, the attention field against quadrature."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy.integrate import dblquad

from tpde.grid import cubed_sphere as cs
from tpde.schemes.cubed_sphere import CubedSphereOperator, solve
from tpde.schemes.monitor import RESOLUTION_TOLERANCE
from tpde.variants.cubed_sphere import CubedSphereAttention, SolidRotation, rotate

AXIS = np.array([1.0, 0.4, 0.7]) / np.linalg.norm([1.0, 0.4, 0.7])
MEAN = np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8])


def vmf(mean, kappa):
    m = np.asarray(mean, float) / np.linalg.norm(mean)
    scale = kappa / (2 * math.pi * -math.expm1(-2 * kappa))
    return lambda x: scale * np.exp(kappa * (x @ m - 1.0))


def test_exact_geometry():
    g = cs.cubed_sphere(8)
    assert g.areas.sum() == pytest.approx(4 * math.pi, abs=1e-13)
    assert g.areas.max() / g.areas.min() < math.sqrt(2)
    e = g.edges
    # a cell's area and an edge's length against adaptive quadrature of the metric
    for i, j in [(0, 0), (3, 5), (7, 2)]:
        area = dblquad(lambda b, a: cs.metric(a, b), e[i], e[i + 1], e[j], e[j + 1])[0]
        assert g.areas[0, i, j] == pytest.approx(area, rel=1e-12)
    # along a = e[i] the line element is |d x / d b| = sqrt(g_bb) = sec a sec^2 b / r^2
    lengths_a, lengths_b = g.edge_lengths
    for i, j in [(0, 0), (4, 6)]:
        a = e[i]

        def element(b, a=a):
            r2 = 1 + math.tan(a) ** 2 + math.tan(b) ** 2
            return math.sqrt(1 + math.tan(a) ** 2) / (math.cos(b) ** 2 * r2)

        from scipy.integrate import quad

        assert lengths_a[i, j] == pytest.approx(quad(element, e[j], e[j + 1])[0], rel=1e-12)
        assert lengths_b[j, i] == pytest.approx(lengths_a[i, j], rel=1e-14)  # symmetry
    # points round-trip and each panel's centre
    p, a, b = cs.to_panel(cs.to_sphere(3, 0.2, -0.7))
    assert (p, a, b) == (3, pytest.approx(0.2, abs=1e-15), pytest.approx(-0.7, abs=1e-15))


def test_exact_cell_averages_and_moments():
    g = cs.cubed_sphere(8)
    density = vmf(MEAN, 20.0)
    rho = cs.von_mises_fisher(g, MEAN, 20.0)
    assert g.integrate(rho) == pytest.approx(1.0, abs=1e-14)
    fine = cs.cell_averages(g, density, nodes=20, pieces=4)
    assert np.abs(rho - fine).max() < 1e-13 * rho.max()
    p, i, j = np.unravel_index(np.argmax(rho), rho.shape)
    e = g.edges

    def f(b, a):
        return density(cs.to_sphere(p, a, b)) * cs.metric(a, b)

    cell = dblquad(f, e[i], e[i + 1], e[j], e[j + 1], epsabs=0, epsrel=1e-13)[0]
    assert rho[p, i, j] == pytest.approx(cell / g.areas[p, i, j], rel=1e-12)
    mix = cs.mixture(g, [(0.3, [1, 0, 0], 5.0), (0.7, [0, -1, 1], 8.0)])
    assert g.integrate(mix) == pytest.approx(1.0, abs=1e-14)
    # the mean of a vMF: (coth kappa - 1 / kappa) m; fifth order from the reconstruction
    kappa = 5.0
    exact = (1 / math.tanh(kappa) - 1 / kappa) * MEAN
    gaps = [
        np.abs(
            cs.mean(cs.cubed_sphere(n), cs.von_mises_fisher(cs.cubed_sphere(n), MEAN, kappa))
            - exact
        ).max()
        for n in (8, 16)
    ]
    print(f"\nmean of vMF(kappa 5): error n = 8 {gaps[0]:.2e}, n = 16 {gaps[1]:.2e}")
    assert gaps[1] < 1e-6 and gaps[0] / gaps[1] > 16
    # uniform plus a mode: the projection recovers the amplitude (fifth order)
    gaps = []
    for n in (8, 16):
        mode = cs.harmonic_mode(cs.cubed_sphere(n), 3, 0.2)
        assert cs.cubed_sphere(n).integrate(mode) == pytest.approx(1.0, abs=1e-14)
        gaps.append(abs(cs.zonal_projection(cs.cubed_sphere(n), mode, 3) - 0.2))
    print(f"P_3 amplitude 0.2: error n = 8 {gaps[0]:.2e}, n = 16 {gaps[1]:.2e}")
    assert gaps[1] < 1e-5 and gaps[0] / gaps[1] > 16


def test_connectivity_pairs_every_edge_segment():
    n = 8
    partner, reversed_, cell = cs.connectivity(n)
    flat = partner.ravel()
    assert np.array_equal(flat[flat], np.arange(flat.size))  # an involution
    assert np.all(flat != np.arange(flat.size))
    assert np.array_equal(reversed_.ravel(), reversed_.ravel()[flat])
    assert np.all(cell // (n * n) != np.arange(6)[:, None, None])  # across is another panel
    # the neighbour cell across a segment shares that segment: its centre is one cell away
    centres = cs.cubed_sphere(n).centres_3d().reshape(-1, 3)
    own = np.empty_like(cell)
    for s, (ii, jj) in enumerate([(0, None), (n - 1, None), (None, 0), (None, n - 1)]):
        k = np.arange(n)
        i = np.full(n, ii) if ii is not None else k
        j = np.full(n, jj) if jj is not None else k
        own[:, s] = np.arange(6)[:, None] * n * n + i * n + j
    distance = np.linalg.norm(centres[own] - centres[cell], axis=-1)
    h = cs.cubed_sphere(n).h
    assert distance.max() < 1.2 * h and distance.min() > 0.7 * h


def test_halo_is_fifth_order():
    density = vmf([0.6, 0.0, 0.8], 2.0)
    errors = []
    for n in (8, 16, 32):
        g = cs.cubed_sphere(n)
        ghost = cs.halo_matrix(n) @ g.to_coordinate(cs.cell_averages(g, density)).ravel()
        s, w = cs.gauss_nodes(10)
        worst = 0.0
        for p in (0, 4):
            for side in range(4):
                for depth in (1, 3):
                    row = ((p * 4 + side) * 3 + depth - 1) * n
                    k = np.arange(n)
                    normal = (depth - 0.5) + s[:, None] * np.ones(10)[None, :]
                    along = (k[:, None, None] + 0.5) + s[None, None, :] * np.ones(10)[None, :, None]
                    a, b = cs._side_points(g, side, np.broadcast_to(normal, along.shape), along)
                    x = cs.to_sphere(p, a, b)
                    exact = (density(x) * cs.metric(a, b) * (w[:, None] * w[None, :])).sum((1, 2))
                    worst = max(worst, np.abs(ghost[row : row + n] - exact).max())
        errors.append(worst)
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    print(f"\nhalo: max error {errors}, orders {orders}")
    assert orders[-1] > 4.3


def rotation_errors(ns, t_end, kappa=4.0, dt_power=None):
    rot = SolidRotation(AXIS, 1.0)
    density = vmf(MEAN, kappa)
    rows = []
    for n in ns:
        g = cs.cubed_sphere(n)
        rho = cs.cell_averages(g, density)
        dt_max = None if dt_power is None else 0.5 * g.h**dt_power
        result = solve(g, rho, rot, t_end, cfl=0.5, dt_max=dt_max)
        exact = cs.cell_averages(g, rot.exact(density, t_end))
        l1 = float(np.sum(np.abs(result.final - exact) * g.areas))
        linf = float(np.abs(result.final - exact).max())
        mass = float(np.abs(result.masses - result.masses[0]).max())
        rows.append((n, result.steps, l1, linf, mass, float(result.final.min())))
    print(f"\nsolid-body rotation about {np.round(AXIS, 3)}, t = {t_end:.4g}, vMF kappa {kappa}")
    print("    n steps        L1      Linf  order L1  order Linf   mass change")
    for k, (n, steps, l1, linf, mass, _) in enumerate(rows):
        if k:
            o1 = math.log2(rows[k - 1][2] / l1)
            oi = math.log2(rows[k - 1][3] / linf)
            orders = f"{o1:9.2f} {oi:11.2f}"
        else:
            orders = " " * 21
        print(f"  {n:3d} {steps:5d} {l1:.3e} {linf:.3e} {orders}   {mass:.1e}")
    return rows


def test_rotation_converges_at_high_order():
    rows = rotation_errors((8, 16, 32), 1.0)
    for k in (1, 2):
        assert math.log2(rows[k - 1][2] / rows[k][2]) > 3.0
        assert math.log2(rows[k - 1][3] / rows[k][3]) > 3.0
    assert max(r[4] for r in rows) < 1e-13
    assert min(r[5] for r in rows) >= 0.0


@pytest.mark.slow
def test_rotation_orders_full_revolution():
    # dt ~ h^(5/3): the SSP-RK3 error stays below the spatial one
    rows = rotation_errors((8, 16, 32, 64), 2 * math.pi, dt_power=5 / 3)
    for k in (1, 2, 3):
        assert math.log2(rows[k - 1][2] / rows[k][2]) > 3.0
    assert max(r[4] for r in rows) < 1e-13


def test_rotation_of_the_initial_data_is_exact():
    x = cs.to_sphere(1, 0.3, -0.2)
    y = rotate(x[None, :], AXIS, 0.7)[0]
    assert np.linalg.norm(y) == pytest.approx(1.0, abs=1e-15)
    assert y @ AXIS == pytest.approx(x @ AXIS, abs=1e-15)
    assert rotate(y[None, :], AXIS, -0.7)[0] == pytest.approx(x, abs=1e-15)


def test_mass_and_positivity_with_a_discontinuous_cap():
    g = cs.cubed_sphere(16)
    m = np.array([1.0, 1.0, 1.0]) / math.sqrt(3)  # a cube corner: three panels meet
    cap = cs.cell_averages(g, lambda x: (x @ m > math.cos(0.4)).astype(float), nodes=6)
    rho = cap / g.integrate(cap)
    rot = SolidRotation([0.2, -0.3, 1.0], 1.0)
    limited = solve(g, rho, rot, 1.5, cfl=0.9, snapshots=4)
    free = solve(g, rho, rot, 1.5, cfl=0.9, snapshots=4, limiter=False)
    print(
        f"\ncap: min with the limiter {min(d.min() for d in limited.densities):.1e}, "
        f"without {min(d.min() for d in free.densities):.1e}; "
        f"mass change {np.abs(limited.masses - 1).max():.1e}"
    )
    assert min(d.min() for d in limited.densities) >= 0.0
    assert min(d.min() for d in free.densities) < -1e-6  # the limiter had work to do
    assert np.abs(limited.masses - 1.0).max() < 1e-13


def sphere_rule(nodes=120):
    z, wz = np.polynomial.legendre.leggauss(nodes)
    count = 2 * nodes
    phi = 2 * np.pi * (np.arange(count) + 0.5) / count
    zz, pp = np.meshgrid(z, phi, indexing="ij")
    s = np.sqrt(1 - zz**2)
    points = np.stack([s * np.cos(pp), s * np.sin(pp), zz], -1).reshape(-1, 3)
    return points, (wz[:, None] * np.full(count, 2 * np.pi / count)[None, :]).ravel()


def test_attention_field_against_quadrature():
    beta, kappa = 4.0, 3.0
    density = vmf([0.6, 0.0, 0.8], kappa)
    y, w = sphere_rule()
    targets = cs.to_sphere(
        np.array([0, 4, 2, 5]), np.array([0.1, -0.7, 0.78, 0.0]), np.array([-0.3, 0.2, 0.5, 0.0])
    )
    k = np.exp(beta * (targets @ y.T - 1.0)) * (density(y) * w)[None, :]
    gamma = (k @ y) / k.sum(1)[:, None]
    exact = gamma - np.sum(gamma * targets, 1)[:, None] * targets
    gaps = []
    for n in (8, 16):
        g = cs.cubed_sphere(n)
        v = CubedSphereAttention(beta).tangent(
            cs.von_mises_fisher(g, [0.6, 0, 0.8], kappa), g, 0.0, targets
        )
        gaps.append(np.abs(v - exact).max())
    print(f"\nattention field vs quadrature: n = 8 {gaps[0]:.1e}, n = 16 {gaps[1]:.1e}")
    assert gaps[1] < 1e-6 and gaps[0] / gaps[1] > 16
    # the uniform measure: the field is the kernel's quadrature error alone
    g = cs.cubed_sphere(8)
    op = CubedSphereOperator(g)
    uniform = np.full(g.shape, 1 / (4 * math.pi))
    drift = [
        np.abs(
            CubedSphereAttention(beta, nodes).tangent(uniform, g, 0, op.points.reshape(-1, 3))
        ).max()
        for nodes in (3, 5)
    ]
    print(f"uniform measure, beta 4: |v| {drift[0]:.1e} (3 x 3 nodes), {drift[1]:.1e} (5 x 5)")
    assert drift[1] < 1e-13 and drift[0] < 1e-8


def test_attention_run_conserves_mass_and_stays_positive():
    g = cs.cubed_sphere(8)
    rho = cs.mixture(g, [(0.5, [1, 0, 0], 2.0), (0.5, [0, 0.6, -0.8], 5.0)])
    result = solve(g, rho, CubedSphereAttention(8.0), 3.0, snapshots=4)
    assert np.abs(result.masses - 1.0).max() < 1e-13
    assert min(d.min() for d in result.densities) >= 0.0
    assert result.final.max() > 3 * rho.max()  # clusters


# ---- linear rates around the uniform measure -------------------------------------------------
def print_rates(title, rows):
    print(f"\n{title}: beta l formula measured rel. error")
    for r in rows:
        print(f"  {r['beta']:4g} {r['l']} {r['formula']:.8e} {r['measured']:.8e} {r['error']:.1e}")


@pytest.mark.parametrize("l, beta", [(1, 4.0), (5, 16.0), (8, 4.0)])
def test_linearised_rate_on_a_coarse_grid(l, beta):
    from tpde.validation.sphere_rates import cubed_sphere_rate

    row = cubed_sphere_rate(l, beta, n=8)
    print_rates("cubed sphere n = 8, slope of the projected amplitude", [row])
    assert row["error"] < 1e-2
    assert row["mass_change"] < 1e-13


def test_fitted_rate_of_a_fast_mode():
    from tpde.validation.sphere_rates import cubed_sphere_fitted_rate

    row = cubed_sphere_fitted_rate(5, 16.0)
    print_rates("cubed sphere n = 8, fitted over e-fold growth (seed 1e-6)", [row])
    assert row["error"] < 1e-2 and row["growth"] > 2.5
    assert row["mass_change"] < 1e-13


@pytest.mark.slow
def test_rate_table():
    """l = 1..8, beta in {1, 4, 16}: the slope of the projected amplitude under the n = 12
    operator within 1e-2 of the formula; the amplitude fitted over the solver's run (n = 8)
    where the mode grows at least a tenth as fast as the fastest one."""
    from tpde.validation.sphere_rates import (
        cubed_sphere_fitted_rate,
        cubed_sphere_rate,
        linear_rate,
    )

    rows = [cubed_sphere_rate(l, beta) for beta in (1.0, 4.0, 16.0) for l in range(1, 9)]
    print_rates("cubed sphere n = 12, slope of the projected amplitude", rows)
    assert max(r["error"] for r in rows) < 1e-2
    fitted = []
    for beta in (1.0, 4.0, 16.0):
        fastest = max(linear_rate(j, beta, 3) for j in range(1, 33))
        for l in range(1, 9):
            if linear_rate(l, beta, 3) >= 0.1 * fastest:
                fitted.append(cubed_sphere_fitted_rate(l, beta))
    print_rates("cubed sphere n = 8, fitted (seed 1e-6, lambda_l >= lambda_max / 10)", fitted)
    assert max(r["error"] for r in fitted) < 1e-2
    assert max(r["mass_change"] for r in fitted) < 1e-13


# ---- general attention: A, V 3 x 3 ----------------------------------------------------------
A_GENERAL = np.array([[2.0, 0.7, -0.4], [-0.3, 1.2, 0.9], [0.5, -0.6, 2.5]])
V_GENERAL = np.array([[1.0, -0.8, 0.2], [0.6, 0.9, 0.0], [-0.3, 0.4, 1.1]])


def quadrature_field(A, V, density, targets, normalised=True):
    """``P_x V int y e^{<A x, y>} rho / int e^{<A x, y>} rho`` by a 120 x 240 product rule on
    the sphere against the exact density (independent of the cubed sphere)."""
    y, w = sphere_rule()
    tilts = targets @ A.T
    shift = np.linalg.norm(tilts, axis=1)
    k = np.exp(tilts @ y.T - shift[:, None]) * (density(y) * w)[None, :]
    if normalised:
        gamma = (k @ y) / k.sum(1)[:, None]
    else:
        gamma = (k @ y) * np.exp(shift)[:, None]
    gamma = gamma @ V.T
    return gamma - np.sum(gamma * targets, 1)[:, None] * targets


def test_general_attention_against_quadrature():
    mix = [(0.6, [0.6, 0.0, 0.8], 3.0), (0.4, [-0.5, 0.7, -0.2], 5.0)]

    def density(x):
        return sum(w * vmf(m, k)(x) for w, m, k in mix)

    targets = cs.to_sphere(
        np.array([0, 4, 2, 5, 1, 3]),
        np.array([0.1, -0.7, 0.78, 0.0, 0.3, -0.2]),
        np.array([-0.3, 0.2, 0.5, 0.0, 0.6, -0.75]),
    )
    print("\ngeneral A, V: max |v - quadrature| (n = 8, 16), ratio")
    for normalised in (True, False):
        exact = quadrature_field(A_GENERAL, V_GENERAL, density, targets, normalised)
        gaps = []
        for n in (8, 16):
            g = cs.cubed_sphere(n)
            field = CubedSphereAttention(A=A_GENERAL, V=V_GENERAL, normalised=normalised)
            v = field.tangent(cs.mixture(g, mix), g, 0.0, targets)
            gaps.append(np.abs(v - exact).max() / np.abs(exact).max())
        print(
            f"  normalised {normalised!s:5}: {gaps[0]:.2e} {gaps[1]:.2e} {gaps[0] / gaps[1]:.1f}"
            f"  (|v| up to {np.abs(exact).max():.3g})"
        )
        assert gaps[1] < 3e-6 and gaps[0] / gaps[1] > 16


def test_general_path_reproduces_beta_identity_by_rotation():
    """``A = beta Q`` (``Q`` a rotation) tilts by ``beta Q x``: its tilted mean at ``x`` is the
    ``A = beta I`` one at ``Q x``; the general path (row shifts ``|A x|``) against the
    standard one (``e^{beta (<x, y> - 1)}``)."""
    beta = 6.0
    q = rotate(np.eye(3), np.array([0.3, -1.0, 0.5]) / np.linalg.norm([0.3, -1.0, 0.5]), 1.1).T
    g = cs.cubed_sphere(8)
    rho = cs.mixture(g, [(0.5, [1, 0, 0], 2.0), (0.5, [0, 0.6, -0.8], 5.0)])
    targets = CubedSphereOperator(g).points.reshape(-1, 3)[::37]
    general = CubedSphereAttention(A=beta * q)
    standard = CubedSphereAttention(beta)
    assert general.beta is None and standard.beta == beta
    z1, m1, s1 = general.sums(rho, g, targets)
    z2, m2, s2 = standard.sums(rho, g, targets @ q.T)
    gap = np.abs(m1 / z1[:, None] - m2 / z2[:, None]).max()
    print(f"\nA = beta Q vs A = beta I at Q x: tilted means differ by {gap:.1e}")
    assert np.allclose(s1, beta, rtol=1e-14)
    assert gap < 1e-13
    # the same A given as a matrix takes the standard path: bit for bit
    same = CubedSphereAttention(A=beta * np.eye(3))
    assert np.array_equal(same.tangent(rho, g, 0, targets), standard.tangent(rho, g, 0, targets))


def test_face_centre_velocity_converges():
    """``velocity_at = "centres"``: the tangents at the face centres interpolated to the Gauss
    nodes (degree 4), against the field evaluated at the nodes: order >= 4 (4.4 measured from
    n = 8 to 16, pre-asymptotic)."""
    mix = [(0.6, [0.6, 0.0, 0.8], 3.0), (0.4, [-0.5, 0.7, -0.2], 5.0)]
    gaps = []
    for n in (8, 16):
        g = cs.cubed_sphere(n)
        rho = cs.mixture(g, mix)
        field = CubedSphereAttention(A=A_GENERAL, V=V_GENERAL)
        nodes = CubedSphereOperator(g).node_speeds(field, rho, 0.0)
        centres = CubedSphereOperator(g, velocity_at="centres").node_speeds(field, rho, 0.0)
        gaps.append(np.abs(nodes - centres).max() / np.abs(nodes).max())
    print(f"\nface-centre velocity vs nodes: n = 8 {gaps[0]:.1e}, n = 16 {gaps[1]:.1e}")
    print(f"  observed order {math.log2(gaps[0] / gaps[1]):.2f}")
    assert gaps[1] < 5e-5 and gaps[0] / gaps[1] > 16
    with pytest.raises(ValueError, match="scheme.velocity_at"):
        CubedSphereOperator(g, velocity_at="corners")


class BrokenAfter(SolidRotation):
    """A rotation whose velocity turns NaN after ``t_bad`` (a velocity that fails mid-run)."""

    steady = False

    def __init__(self, t_bad: float):
        super().__init__([0.2, -0.3, 1.0], 1.0)
        self.t_bad = t_bad

    def tangent(self, density, grid, t, points):
        v = super().tangent(density, grid, t, points)
        return v * np.nan if t > self.t_bad else v


def test_the_sphere_loop_names_a_non_finite_velocity_and_max_steps():
    """The sphere's loop checks what the flat solver checks: a non-finite velocity ends the
    run with the time it happened; ``max_steps`` bounds the steps."""
    from tpde.schemes.solver import SimulationError

    g = cs.cubed_sphere(8)
    rho = cs.cell_averages(g, vmf(np.array([0.0, 0.0, 1.0]), 4.0))
    with pytest.raises(SimulationError, match="non-finite") as bad:
        solve(g, rho, BrokenAfter(0.205), 1.0, snapshots=3, dt_max=0.01)
    start, end = map(float, re.search(r"from t = (\S+) to (\S+) ", str(bad.value)).groups())
    assert start <= 0.205 < end and end - start <= 0.01 + 1e-15  # the step it happened in
    with pytest.raises(SimulationError, match=r"velocity: non-finite .* at t = 0, step 0"):
        solve(g, rho, BrokenAfter(-1.0), 1.0, snapshots=2)  # at a step's start
    with pytest.raises(SimulationError, match=r"run.max_steps = 3 reached at t = 0\.03\b") as cap:
        solve(g, rho, SolidRotation(), 1.0, snapshots=2, dt_max=0.01, max_steps=3)
    print(f"\n{bad.value}\n{cap.value}")
    # the typed causes a run file records (status_reason) and tpde sweep reads
    assert (bad.value.reason, cap.value.reason) == ("non_finite", "max_steps")


def test_a_step_above_the_positivity_bound_is_halved_and_redone(monkeypatch):
    """With the step bound overestimated tenfold the update goes negative; the loop halves
    the step and redoes it from its start (as the flat solver does), so the run still ends
    positive and with its mass, close to the run with the true bound."""
    g = cs.cubed_sphere(16)
    m = np.array([1.0, 1.0, 1.0]) / math.sqrt(3)
    cap = cs.cell_averages(g, lambda x: (x @ m > math.cos(0.4)).astype(float), nodes=6)
    rho = cap / g.integrate(cap)
    rot = SolidRotation([0.2, -0.3, 1.0], 1.0)
    honest = solve(g, rho, rot, 0.5, cfl=0.9, snapshots=2)
    true_rate = CubedSphereOperator.max_outflow
    monkeypatch.setattr(
        CubedSphereOperator, "max_outflow", lambda self, speeds: true_rate(self, speeds) / 10
    )
    retried = solve(g, rho, rot, 0.5, cfl=0.9, snapshots=2)
    gap = np.abs(retried.final - honest.final).max() / honest.final.max()
    print(
        f"\nrejected steps: {retried.rejected_steps} (true bound: {honest.rejected_steps}); "
        f"steps {retried.steps} vs {honest.steps}; min {retried.final.min():.1e}; "
        f"mass change {abs(retried.masses[-1] - 1):.1e}; gap to the honest run {gap:.1e}"
    )
    assert honest.rejected_steps == 0 and retried.rejected_steps > 0
    assert retried.final.min() >= 0.0 and abs(retried.masses[-1] - 1.0) < 1e-13
    assert gap < 0.05  # the same solution (a discontinuous cap: first order at its edge)


def monitored_rotation(n, kappa, t_end, **options):
    """A vMF under the solid rotation with the resolution monitor: the result and its true L1
    error against the exact rotated law's cell averages."""
    rot = SolidRotation(AXIS, 1.0)
    density = vmf(MEAN, kappa)
    g = cs.cubed_sphere(n)
    result = solve(g, cs.cell_averages(g, density), rot, t_end, cfl=0.5, **options)
    exact = cs.cell_averages(g, rot.exact(density, t_end))
    return result, float(np.sum(np.abs(result.final - exact) * g.areas))


def test_resolution_estimate_tracks_the_true_error():
    # the monitor estimates the misplaced share of the mass; the vMF has mass 1, so the L1
    # error against the exact rotated solution is that share
    rows = []
    for n in (8, 16):
        result, l1 = monitored_rotation(n, 4.0, 0.5)
        rows.append((n, result.steps, l1, result.reconstruction_error))
    print("\nresolution monitor on the sphere: vMF kappa 4, solid rotation, t = 0.5")
    print("    n steps   true L1  estimate  estimate / L1")
    for n, steps, l1, estimate in rows:
        print(f"  {n:3d} {steps:5d} {l1:.3e} {estimate:.3e} {estimate / l1:10.2f}")
    for _, _, l1, estimate in rows:
        assert l1 / 3 < estimate < 3 * l1
    # it falls at the scheme's order, like the error
    assert math.log2(rows[0][3] / rows[1][3]) > 3.0


def test_resolution_monitor_only_reads_and_stays_quiet_when_resolved():
    result, _ = monitored_rotation(16, 4.0, 0.5)
    plain, _ = monitored_rotation(16, 4.0, 0.5, resolution_tolerance=None)
    print(f"\nestimate {result.reconstruction_error:.3e}, events {result.events}")
    assert result.events == []
    assert 0 < result.reconstruction_error < RESOLUTION_TOLERANCE
    assert plain.reconstruction_error == 0.0
    assert all(np.array_equal(a, b) for a, b in zip(result.densities, plain.densities, strict=True))


def test_an_under_resolved_sphere_run_records_one_event_with_its_time():
    # kappa 6 on 8 cells a panel: the L1 error passes the default tolerance within the run
    result, l1 = monitored_rotation(8, 6.0, 0.5)
    print(f"\nkappa 6 on 8 cells a panel: L1 {l1:.3e}, estimate {result.reconstruction_error:.3e}")
    for e in result.events:
        print(f"  {e.kind} at t = {e.time:.4g}: {e.message}")
    assert [e.kind for e in result.events] == ["under_resolved"]
    event = result.events[0]
    assert 0.0 < event.time < 0.5
    assert f"at t = {event.time:.6g}" in event.message
    assert "cells a panel" in event.message and "atoms" in event.message
    assert result.reconstruction_error > RESOLUTION_TOLERANCE and l1 > RESOLUTION_TOLERANCE
    # the same run stopped at the event's time: the estimate still inside the tolerance, and
    # no event (the event is the first step that would pass it)
    early, _ = monitored_rotation(8, 6.0, event.time)
    print(f"  to t = {event.time:.4g}: estimate {early.reconstruction_error:.3e}")
    assert early.events == [] and 0 < early.reconstruction_error <= RESOLUTION_TOLERANCE


def test_the_wide_halo_extends_the_scheme_halo():
    # the monitor's 4-deep halo repeats the scheme's 3 layers exactly, one layer deeper
    n = 8
    narrow = cs.halo_matrix(n).toarray().reshape(6, 4, 3, n, -1)
    wide = cs.halo_matrix(n, ghosts=4).toarray().reshape(6, 4, 4, n, -1)
    assert np.array_equal(wide[:, :, :3], narrow)
    # and its fourth layer is a ghost cell average like the others: fifth order
    density = vmf([0.6, 0.0, 0.8], 2.0)
    errors = []
    for n in (8, 16):
        g = cs.cubed_sphere(n)
        ghost = cs.halo_matrix(n, ghosts=4) @ g.to_coordinate(cs.cell_averages(g, density)).ravel()
        s, w = cs.gauss_nodes(10)
        k = np.arange(n)
        normal = 3.5 + s[:, None] * np.ones(10)[None, :]
        along = (k[:, None, None] + 0.5) + s[None, None, :] * np.ones(10)[None, :, None]
        worst = 0.0
        for side in range(4):
            row = ((0 * 4 + side) * 4 + 3) * n
            a, b = cs._side_points(g, side, np.broadcast_to(normal, along.shape), along)
            x = cs.to_sphere(0, a, b)
            exact = (density(x) * cs.metric(a, b) * (w[:, None] * w[None, :])).sum((1, 2))
            worst = max(worst, np.abs(ghost[row : row + n] - exact).max())
        errors.append(worst)
    print(f"\nfourth ghost layer: max error {errors}, order {math.log2(errors[0] / errors[1]):.2f}")
    assert math.log2(errors[0] / errors[1]) > 4.0


def test_the_resolution_estimate_carries_over_a_resumed_run():
    # a run stopped at a snapshot and solved on from it with its estimate ends with the
    # uninterrupted run's estimate and events
    rot = SolidRotation(AXIS, 1.0)
    g = cs.cubed_sphere(8)
    rho = cs.cell_averages(g, vmf(MEAN, 6.0))
    whole = solve(g, rho, rot, 0.5, snapshots=[0.0, 0.25, 0.5])
    first = solve(g, rho, rot, 0.25, snapshots=[0.0, 0.25])
    rest = solve(
        g,
        first.final,
        rot,
        0.5,
        snapshots=[0.25, 0.5],
        reconstruction_error=first.reconstruction_error,
    )
    print(f"\nestimate {whole.reconstruction_error:.6e} vs {rest.reconstruction_error:.6e}")
    assert np.array_equal(rest.final, whole.final)
    assert rest.reconstruction_error == pytest.approx(whole.reconstruction_error, rel=1e-12)
    assert first.events + rest.events == whole.events
