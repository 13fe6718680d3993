"""The resolution monitor (tpde.schemes.monitor.reconstruction_error_rate and the
``under_resolved`` event): docs/theory.md, 'The resolution monitor'.

References: the exact face values of a Gaussian (the error of the fifth-order reconstruction
the estimate stands for) and the Gaussian closed form of a blowing-up softmax run."""

from __future__ import annotations

import numpy as np
from scipy.special import erf

from tpde.grid import Grid, gaussian, moments
from tpde.schemes.frame import AffineFrame
from tpde.schemes.monitor import FIFTH, _upwind_difference, reconstruction_error_rate
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.studies import fitted_box
from tpde.validation import solve
from tpde.validation.gaussian import softmax_blowup_time, softmax_scalar_v_covariance
from tpde.variants import ATTENTION, Head

#: E5 (docs/theory.md, 'Paper experiments E1-E6'): softmax, V = I, blowing up at t*
E5_A = (
    np.array([[-0.01629, 1.04422], [-1.08488, -2.20592]]).T
    @ np.array([[-0.09678, 0.4222], [-0.22546, -0.63794]])
    / np.sqrt(2.0)
)
E5_COV = np.array([[0.6, 0.2], [0.2, 0.4]])


def gaussian_averages(edges: np.ndarray) -> np.ndarray:
    cdf = 0.5 * (1.0 + erf(edges / np.sqrt(2.0)))
    return np.diff(cdf) / np.diff(edges)


def test_the_estimate_is_the_fifth_order_face_error():
    """On exact cell averages of N(0, 1) the estimate |q5 - q7| tends to the true error of the
    fifth-order face values (ratio -> 1), and the rate falls like h^5."""
    rows = []
    for n in (32, 64, 128, 256):
        edges = np.linspace(-8.0, 8.0, n + 1)
        rho = gaussian_averages(edges)
        padded = np.concatenate([np.zeros(4), rho, np.zeros(4)])
        q5 = sum(w * padded[1 + k : 2 + k + n] for k, w in enumerate(FIFTH))
        true = np.abs(q5 - np.exp(-0.5 * edges**2) / np.sqrt(2.0 * np.pi)).max()
        estimate = np.abs(_upwind_difference(padded, n + 1)).max()
        rate = reconstruction_error_rate(rho, (edges[1] - edges[0],), [np.ones(n + 1)], (False,))
        rows.append((n, true, estimate, rate))
    print("\n   n   true face error   estimate   ratio   rate")
    for n, true, estimate, rate in rows:
        print(f"{n:4d}   {true:.3e}        {estimate:.3e}   {estimate / true:.3f}   {rate:.3e}")
    assert all(0.9 <= e / t <= 1.1 for _, t, e, _ in rows[2:])
    orders = [np.log2(a[3] / b[3]) for a, b in zip(rows, rows[1:], strict=False)]
    print("rate orders", np.round(orders, 2))
    assert orders[-1] > 4.5


def test_a_periodic_axis_wraps():
    """A bump rolled across the periodic seam has the same estimate."""
    edges = np.linspace(-8.0, 8.0, 65)
    rho = gaussian_averages(edges)
    spacing = (edges[1] - edges[0],)
    u = 0.7 * np.ones(65)
    base = reconstruction_error_rate(rho, spacing, [u], (True,))
    rolled = reconstruction_error_rate(np.roll(rho, 32), spacing, [u], (True,))
    assert base > 0 and abs(rolled - base) <= 1e-12 * base


def test_an_under_resolved_fixed_box_is_reported_before_its_error_grows():
    """E5 on a fixed 64^2 box fitted to 0.9 t* (1.25 cells per standard deviation): the event
    comes before the covariance error reaches 1e-3; the co-moving frame on 48^2 (residual 0
    for Gaussian data) records none up to the same time."""
    t_star = softmax_blowup_time(E5_COV, E5_A, 1.0)
    t_end = 0.1 * t_star
    times = list(np.linspace(0.0, t_end, 11))
    params = Head(E5_A, np.eye(2))
    solution = solve("softmax", np.zeros(2), E5_COV, params, 0.9 * t_star)
    box = Grid(*fitted_box(solution, 0.9 * t_star, 7.0), [64, 64])
    fixed = Solver(
        Problem(
            box,
            gaussian(box, np.zeros(2), E5_COV),
            ATTENTION["softmax"](params),
            t_end,
            snapshots=times,
        )
    ).run()
    errors = {
        s.time: float(
            np.linalg.norm(
                moments(s.density, box)[2] - softmax_scalar_v_covariance(E5_COV, E5_A, 1.0, s.time),
                2,
            )
            / np.linalg.norm(softmax_scalar_v_covariance(E5_COV, E5_A, 1.0, s.time), 2)
        )
        for s in fixed.snapshots
    }
    events = [e for e in fixed.events if e.kind == "under_resolved"]
    print(f"\nfixed 64^2: event at {events[0].time / t_star:.4f} t*" if events else "no event")
    for t, err in errors.items():
        print(f"  t = {t / t_star:.3f} t*: covariance error {err:.2e}")
    assert len(events) == 1
    assert all(err <= 1e-3 for t, err in errors.items() if t <= events[0].time)
    assert max(errors.values()) > 1e-3  # (the event is not idle: the error does grow)
    xi = Grid([-16.0, -16.0], [16.0, 16.0], [48, 48])
    framed = Solver(
        Problem(
            xi,
            gaussian(xi, np.zeros(2), np.eye(2)),
            ATTENTION["softmax"](params),
            t_end,
            scheme=Scheme(frame="affine", frame_tolerance=1e-8),
            frame=AffineFrame.following(np.zeros(2), E5_COV),
        )
    ).run()
    print(f"frame 48^2: estimate {framed.reconstruction_error:.2e}, events {framed.events}")
    assert framed.status == "completed"
    assert not [e for e in framed.events if e.kind == "under_resolved"]


def test_the_stop_action_ends_the_run_before_its_error_grows():
    """run.resolution_action = "stop": the same fixed E5 run ends with status under_resolved,
    its covariance within 1e-3 of the closed form up to there."""
    t_star = softmax_blowup_time(E5_COV, E5_A, 1.0)
    params = Head(E5_A, np.eye(2))
    solution = solve("softmax", np.zeros(2), E5_COV, params, 0.9 * t_star)
    box = Grid(*fitted_box(solution, 0.9 * t_star, 7.0), [64, 64])
    result = Solver(
        Problem(
            box,
            gaussian(box, np.zeros(2), E5_COV),
            ATTENTION["softmax"](params),
            0.5 * t_star,
            snapshots=list(np.linspace(0.0, 0.5 * t_star, 51)),
            resolution_action="stop",
        )
    ).run()
    exact = softmax_scalar_v_covariance(E5_COV, E5_A, 1.0, result.status_time)
    error = float(
        np.linalg.norm(moments(result.snapshots[-1].density, box)[2] - exact, 2)
        / np.linalg.norm(exact, 2)
    )
    print(f"\nstopped {result.status} at {result.status_time / t_star:.4f} t*: error {error:.2e}")
    assert result.status == "under_resolved"
    assert result.snapshots[-1].time == result.status_time
    assert error <= 1e-3
