"""The resolution monitor (tpde.schemes.monitor.reconstruction_error_rate and the
``under_resolved`` event): docs/theory.md, 'The resolution monitor'.

References: the exact face values of a Gaussian (the error of the fifth-order reconstruction
the estimate stands for) and the Gaussian closed form of a blowing-up softmax run."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf

from tpde.grid import Grid, gaussian, gaussian_mixture, moments
from tpde.schemes.frame import AffineFrame
from tpde.schemes.monitor import reconstruction_error_rate
from tpde.schemes.operator import FluxOperator
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.validation import solve
from tpde.validation.gaussian import softmax_blowup_time, softmax_scalar_v_covariance
from tpde.validation.studies import fitted_box
from tpde.variants import ATTENTION, Head

#: E5 (docs/theory.md, 'Paper experiments E1-E6'): softmax, V = I, blowing up at t*
E5_A = (
    np.array([[-0.01629, 1.04422], [-1.08488, -2.20592]]).T
    @ np.array([[-0.09678, 0.4222], [-0.22546, -0.63794]])
    / np.sqrt(2.0)
)
E5_COV = np.array([[0.6, 0.2], [0.2, 0.4]])
#: the seventh-order upwind face value from the cell averages j-3 .. j+3 (face j + 1/2)
SEVENTH = np.array([-3.0, 25.0, -101.0, 319.0, 214.0, -38.0, 4.0]) / 420.0


def e5_fixed_run(cells: int, t_end: float, times, **options):
    """E5 on a fixed box of cells^2 fitted to the ODE up to 0.9 t*, run to t_end with
    snapshots at ``times``: (t*, the result, the covariance error of each snapshot against
    the closed form, relative in the 2-norm)."""
    t_star = softmax_blowup_time(E5_COV, E5_A, 1.0)
    params = Head(E5_A, np.eye(2))
    solution = solve("softmax", np.zeros(2), E5_COV, params, 0.9 * t_star)
    box = Grid(*fitted_box(solution, 0.9 * t_star, 7.0), [cells, cells])
    result = Solver(
        Problem(
            box,
            gaussian(box, np.zeros(2), E5_COV),
            ATTENTION["softmax"](params),
            t_end,
            snapshots=list(times),
            **options,
        )
    ).run()
    errors = []
    for snap in result.snapshots:
        exact = softmax_scalar_v_covariance(E5_COV, E5_A, 1.0, snap.time)
        covariance = moments(snap.density, box)[2]
        errors.append(float(np.linalg.norm(covariance - exact, 2) / np.linalg.norm(exact, 2)))
    return t_star, result, errors


def gaussian_averages(edges: np.ndarray) -> np.ndarray:
    cdf = 0.5 * (1.0 + erf(edges / np.sqrt(2.0)))
    return np.diff(cdf) / np.diff(edges)


def test_the_estimate_is_the_scheme_face_error():
    """On exact cell averages of N(0, 1) the estimate |q - q7| (q: the scheme's WENO5-Z face
    state) tends to the true error of q (ratio -> 1), and the rate falls like h^5."""
    rows = []
    for n in (32, 64, 128, 256):
        grid = Grid([-8.0], [8.0], [n])
        edges = grid.edges(0)
        rho = gaussian_averages(edges)
        left, _ = FluxOperator(grid).face_states(rho, 0)
        padded = np.concatenate([np.zeros(4), rho, np.zeros(4)])
        seventh = sum(w * padded[k : k + n + 1] for k, w in enumerate(SEVENTH))
        true = np.abs(left - np.exp(-0.5 * edges**2) / np.sqrt(2.0 * np.pi)).max()
        estimate = np.abs(left - seventh).max()
        rate = reconstruction_error_rate(
            rho, grid, [np.ones(n + 1)], partial(FluxOperator(grid).face_states, rho)
        )
        rows.append((n, true, estimate, rate))
    print("\n   n   true face error   estimate   ratio   rate")
    for n, true, estimate, rate in rows:
        print(f"{n:4d}   {true:.3e}        {estimate:.3e}   {estimate / true:.3f}   {rate:.3e}")
    assert all(0.9 <= e / t <= 1.1 for _, t, e, _ in rows[2:])
    orders = [np.log2(a[3] / b[3]) for a, b in zip(rows, rows[1:], strict=False)]
    print("rate orders", np.round(orders, 2))
    assert orders[-1] > 4.5


def test_the_covariance_drift_is_the_moment_rate_of_the_flux_error():
    """The covariance term of the estimate against an independent evaluation: a 2-D Gaussian
    on 24^2 cells moved by a linear field; the moment rate of the flux error, summed cell by
    cell from the divergence (d/dt sum_c g_c rho_c with g = (x - m)(x - m)^T), equals the
    face-sum form of the monitor."""
    grid = Grid([-5.0, -4.0], [5.0, 4.0], [24, 20])
    cov = np.array([[1.2, 0.5], [0.5, 0.7]])
    rho = gaussian(grid, np.array([0.3, -0.2]), cov)
    normal = [  # u = (0.4 x - 0.9 y + 0.2, 1.1 x + 0.3 y - 0.1) at the face centres
        0.4 * grid.edges(0)[:, None] - 0.9 * grid.centres(1)[None, :] + 0.2,
        1.1 * grid.centres(0)[:, None] + 0.3 * grid.edges(1)[None, :] - 0.1,
    ]
    operator = FluxOperator(grid)
    rate = reconstruction_error_rate(rho, grid, normal, partial(operator.face_states, rho))
    # independently: the divergence of the flux error, cell by cell, and its moments
    total = rho.sum()
    xc, yc = np.meshgrid(grid.centres(0), grid.centres(1), indexing="ij")
    m = np.array([(rho * xc).sum(), (rho * yc).sum()]) / total
    offsets = np.stack([xc - m[0], yc - m[1]])
    sigma = np.einsum("ixy,jxy,xy->ij", offsets, offsets, rho) / total
    divergence = np.zeros(grid.shape)
    for a in range(2):
        left, right = (q.copy() for q in operator.face_states(rho, a))
        cells = np.moveaxis(rho, a, 0)
        # the scheme's ghosts at an outflow face: the edge cell repeated
        padded = np.pad(cells, [(4, 4), (0, 0)], mode="edge")
        n = grid.cells[a]
        q7l = sum(w * padded[k : k + n + 1] for k, w in enumerate(SEVENTH))
        q7r = sum(w * padded[::-1][k : k + n + 1] for k, w in enumerate(SEVENTH))[::-1]
        u = np.moveaxis(normal[a], a, 0)
        error = np.where(u > 0, np.moveaxis(left, a, 0) - q7l, np.moveaxis(right, a, 0) - q7r)
        error[0] = np.where(u[0] > 0, 0.0, error[0])
        error[-1] = np.where(u[-1] > 0, error[-1], 0.0)
        flux = u * error / grid.spacing[a]
        np.moveaxis(divergence, a, 0)[...] += flux[1:] - flux[:-1]
    drift = np.einsum("ixy,jxy,xy->ij", offsets, offsets, divergence)
    expected = max(
        np.abs(divergence).sum() / total,
        np.linalg.norm(drift, 2) / (np.linalg.norm(sigma, 2) * total),
    )
    print(f"\nmonitor {rate:.6e}, cell-by-cell {expected:.6e}")
    assert rate > 0 and abs(rate - expected) <= 1e-10 * expected


def test_a_periodic_axis_wraps():
    """A bump rolled across the periodic seam has the same estimate."""
    grid = Grid([-8.0], [8.0], [64], boundary="periodic")
    rho = gaussian_averages(grid.edges(0))
    u = 0.7 * np.ones(65)
    operator = FluxOperator(grid)
    base = reconstruction_error_rate(rho, grid, [u], partial(operator.face_states, rho))
    rolled_rho = np.roll(rho, 32)
    rolled = reconstruction_error_rate(
        rolled_rho, grid, [u], partial(operator.face_states, rolled_rho)
    )
    assert base > 0 and abs(rolled - base) <= 1e-12 * base


def test_an_under_resolved_fixed_box_is_reported_before_its_error_grows():
    """E5 on a fixed 96^2 box fitted to 0.9 t* (1.9 cells per standard deviation),
    run.resolution_tolerance = 1e-4: the event comes before the covariance error reaches it,
    and the error does grow past it after (3.3e-4 at 0.1 t*, printed); the co-moving frame on
    48^2
    (residual 0 for Gaussian data) records none up to the same time. (On 64^2 the first step
    would already pass the tolerance: the event comes at t = 0.)"""
    t_star = softmax_blowup_time(E5_COV, E5_A, 1.0)
    t_end = 0.1 * t_star
    times = list(np.linspace(0.0, t_end, 11))
    _, fixed, covariance_errors = e5_fixed_run(96, t_end, times, resolution_tolerance=1e-4)
    errors = {s.time: e for s, e in zip(fixed.snapshots, covariance_errors, strict=True)}
    events = [e for e in fixed.events if e.kind == "under_resolved"]
    print(f"\nfixed 96^2: event at {events[0].time / t_star:.4f} t*" if events else "no event")
    for t, err in errors.items():
        print(f"  t = {t / t_star:.3f} t*: covariance error {err:.2e}")
    assert len(events) == 1
    assert all(err <= 1e-4 for t, err in errors.items() if t <= events[0].time)
    assert max(errors.values()) > 1e-4  # (the event is not idle: the error passes it)
    xi = Grid([-16.0, -16.0], [16.0, 16.0], [48, 48])
    framed = Solver(
        Problem(
            xi,
            gaussian(xi, np.zeros(2), np.eye(2)),
            ATTENTION["softmax"](Head(E5_A, np.eye(2))),
            t_end,
            scheme=Scheme(frame="affine", frame_tolerance=1e-8),
            frame=AffineFrame.following(np.zeros(2), E5_COV),
        )
    ).run()
    print(f"frame 48^2: estimate {framed.reconstruction_error:.2e}, events {framed.events}")
    assert framed.status == "completed"
    assert not [e for e in framed.events if e.kind == "under_resolved"]


def test_the_stop_action_ends_the_run_before_its_error_grows():
    """run.resolution_action = "stop": the same fixed E5 run ends with status under_resolved
    before the step that would take its estimate past the tolerance (1e-4), its covariance
    within 1e-4 of the closed form there."""
    t_half = 0.5 * softmax_blowup_time(E5_COV, E5_A, 1.0)
    t_star, result, errors = e5_fixed_run(
        96,
        t_half,
        np.linspace(0.0, t_half, 51),
        resolution_action="stop",
        resolution_tolerance=1e-4,
    )
    error = errors[-1]
    print(f"\nstopped {result.status} at {result.status_time / t_star:.4f} t*: error {error:.2e}")
    assert result.status == "under_resolved"
    assert result.snapshots[-1].time == result.status_time > 0
    assert error <= 1e-4


def test_tpde_run_says_what_it_warned(tmp_path, capsys):
    """A run that goes on past an under_resolved event (resolution_action = "warn", the
    default) ends with one warning line saying so, not only an event in the file:
    examples/softmax.toml (64^2 fixed box, its covariance error 3.7e-4 at t = 1)."""
    from tpde import io
    from tpde.cli import main

    example = Path(__file__).resolve().parents[1] / "examples" / "softmax.toml"
    out = tmp_path / "softmax.nc"
    assert main(["run", str(example), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("tpde: warning: under_resolved")]
    print("\n" + "\n".join(warned))
    assert len(warned) == 1 and "run.resolution_tolerance" in warned[0]
    assert io.outcome(out).status == "completed"
    assert [e.split()[0] for e in io.events(out)] == ["under_resolved"]


def test_every_run_is_watched_1d_and_steady_fields_too():
    """The monitor reads the step's own face velocities, so 1-D runs and steady prescribed
    fields (exact face velocities, evaluated once) are watched at every step too: N(-3, 0.25)
    translated by u = 1 to t = 4, whose covariance should not change. The estimate follows
    the covariance error (within a factor 3 either way, printed) and each run records its
    under_resolved event."""
    from tpde.variants.prescribed import ConstantVelocity

    rows = []
    for n in (32, 64, 128):
        grid = Grid([-8.0], [8.0], [n])
        result = Solver(
            Problem(grid, gaussian(grid, [-3.0], [[0.25]]), ConstantVelocity([1.0]), 4.0)
        ).run()
        error = abs(moments(result.snapshots[-1].density, grid)[2][0, 0] - 0.25) / 0.25
        events = [e.time for e in result.events if e.kind == "under_resolved"]
        rows.append((n, result.reconstruction_error, error, events))
    print("\n   n   estimate   covariance error   event at")
    for n, estimate, error, events in rows:
        print(f"{n:4d}   {estimate:.2e}   {error:.2e}           {events}")
    assert all(
        1 / 3 <= estimate / error <= 3 and len(events) == 1 for _, estimate, error, events in rows
    )


def test_the_event_suggests_the_frame_only_where_it_helps():
    """The under_resolved message suggests the co-moving frame for a fixed-box run of a field
    that has one (softmax), not for one without (sigmoid), nor for a run already in it."""
    from tpde.variants import SigmoidHead

    grid = Grid([-6.0, -6.0], [6.0, 6.0], [16, 16])
    rho = gaussian(grid, [0.3, -0.2], [[0.5, 0.1], [0.1, 0.4]])
    messages = {}
    fields = {
        "softmax": ATTENTION["softmax"](Head(0.3 * np.eye(2), -np.eye(2))),
        "sigmoid": ATTENTION["sigmoid"](SigmoidHead(0.3 * np.eye(2), -np.eye(2), bias=-1.0)),
    }
    for name, field in fields.items():
        result = Solver(Problem(grid, rho, field, 0.05, resolution_action="stop")).run()
        assert result.status == "under_resolved"
        messages[name] = result.status_message
    framed = Solver(
        Problem(
            grid,
            gaussian_mixture(  # (a Gaussian's residual vanishes: none to estimate)
                grid, [0.3, 0.7], [[-1.0, 0.0], [0.8, 0.3]], [0.3 * np.eye(2), 0.6 * np.eye(2)]
            ),
            fields["softmax"],
            0.05,
            scheme=Scheme(frame="affine"),
            frame=AffineFrame.following(np.zeros(2), E5_COV),
            resolution_action="stop",
            resolution_tolerance=1e-12,
        )
    ).run()
    print("\n" + "\n".join(list(messages.values()) + [framed.status_message]))
    assert 'scheme.frame = "affine"' in messages["softmax"]
    assert "frame" not in messages["sigmoid"] and "refine the grid" in messages["sigmoid"]
    assert framed.status == "under_resolved" and "frame" not in framed.status_message


# ---- calibration (docs/theory.md, 'Calibrating the resolution monitor') -------------------
#: softmax on the c1 matrices (examples/softmax.toml): its box, N(MEAN1, COV1), to t = 1
C1_A = np.array([[-0.6, 0.8], [-0.2, -0.3]])
C1_V = np.array([[1.0, 0.5], [-0.3, 0.8]])
C1_MEAN, C1_COV = np.array([0.5, -0.3]), np.array([[1.0, 0.4], [0.4, 0.6]])


def c1_run(cells: int, t_end: float = 1.0, **options):
    """examples/softmax.toml on cells^2 to t_end (21 snapshots): the result and, per
    snapshot, (t, the density's relative L1 error against the exact cell averages of the
    Gaussian solution, the relative covariance error, the mean error / ||Sigma||^1/2)."""
    grid = Grid([-5.5, -5.25], [6.5, 4.5], [cells, cells])
    params = Head(C1_A, C1_V)
    result = Solver(
        Problem(
            grid,
            gaussian(grid, C1_MEAN, C1_COV),
            ATTENTION["softmax"](params),
            t_end,
            snapshots=21,
            **options,
        )
    ).run()
    solution = solve("softmax", C1_MEAN, C1_COV, params, t_end)
    rows = []
    for snap in result.snapshots:
        mean_ref, cov_ref = solution.at(snap.time)
        exact = gaussian(grid, mean_ref, cov_ref)
        _, mean, cov = moments(snap.density, grid)
        scale = np.linalg.norm(cov_ref, 2)
        rows.append(
            (
                snap.time,
                float(np.abs(snap.density - exact).sum() / exact.sum()),
                float(np.linalg.norm(cov - cov_ref, 2) / scale),
                float(np.linalg.norm(mean - mean_ref) / np.sqrt(scale)),
            )
        )
    return result, rows


def test_the_warning_fires_where_the_true_error_passes_the_tolerance():
    """The default tolerance (1e-3) against the true errors of the softmax example (the
    Gaussian solution): on 80^2 the density's L1 error and the moments' stay below it to
    t = 1 and no warning fires; on 48^2 (resolution_action = "stop", to read the state at
    the warning) the run ends under_resolved where the true L1 error is 1.0..1.5 times the
    tolerance (the estimate tracks it to 0.7..1.0), with the covariance and mean errors
    below the L1 error, and before that every snapshot was below 1.5 times the tolerance."""
    from tpde.schemes.monitor import RESOLUTION_TOLERANCE

    resolved, fine = c1_run(80)
    stopped, coarse = c1_run(48, resolution_action="stop")
    print("\n   n  status          t      l1 error   cov error   mean error   estimate")
    for n, result, rows in ((80, resolved, fine), (48, stopped, coarse)):
        t, l1, cov, mean = rows[-1]
        print(
            f"{n:4d}  {result.status:14s} {t:5.3f}  {l1:.2e}   {cov:.2e}    {mean:.2e}     "
            f"{result.reconstruction_error:.2e}"
        )
    assert resolved.status == "completed" and not resolved.events
    assert max(max(r[1:]) for r in fine) < RESOLUTION_TOLERANCE
    assert stopped.status == "under_resolved" and 0 < stopped.status_time < 1
    t, l1, cov, mean = coarse[-1]
    assert t == stopped.status_time
    assert RESOLUTION_TOLERANCE <= l1 <= 1.5 * RESOLUTION_TOLERANCE
    assert max(cov, mean) < l1
    assert all(row[1] < 1.5 * RESOLUTION_TOLERANCE for row in coarse)


def test_a_fixed_box_far_beyond_its_resolution_stops():
    """resolution_action = "warn_then_stop": the softmax example on 32^2 records the
    event at the tolerance and then stops, status under_resolved with its time, before the
    step that takes the estimate past 10 times the tolerance (its true L1 error there within
    a factor 1.5 of that); the event's advice names the co-moving frame and a cell count."""
    from tpde.schemes.monitor import RESOLUTION_STOP_FACTOR, RESOLUTION_TOLERANCE

    stopped, rows = c1_run(32, resolution_action="warn_then_stop")
    events = [e for e in stopped.events if e.kind == "under_resolved"]
    t, l1, cov, mean = rows[-1]
    print(f"\n32^2: {stopped.status} at t = {stopped.status_time:.4g}: l1 error {l1:.2e}")
    print(events[0].message)
    print(stopped.status_message)
    limit = RESOLUTION_STOP_FACTOR * RESOLUTION_TOLERANCE
    assert stopped.status == "under_resolved" and t == stopped.status_time < 1.0
    assert len(events) == 1 and events[0].time < stopped.status_time
    assert limit / 1.5 <= l1 <= 1.5 * limit
    assert "far beyond" in stopped.status_message
    assert 'scheme.frame = "affine"' in events[0].message
    assert "refine the grid to about" in events[0].message


@pytest.mark.slow
@pytest.mark.parametrize("cells", [40, 48, 56])
def test_the_suggested_cells_resolve_the_run(cells):
    """The cell count the under_resolved event of the softmax example suggests (40^2, 48^2,
    56^2, run to t = 1): the run on that many cells ends without a
    warning, its true L1 error below the tolerance at t = 1."""
    from tpde.schemes.monitor import RESOLUTION_TOLERANCE

    coarse, _ = c1_run(cells)
    message = coarse.events[0].message
    suggested = int(message.split("refine the grid to about ")[1].split(" x ")[0])
    refined, rows = c1_run(suggested)
    print(
        f"\n{cells}^2: estimate {coarse.reconstruction_error:.2e} at t = 1; suggested "
        f"{suggested}^2: {refined.status}, events {len(refined.events)}, estimate "
        f"{refined.reconstruction_error:.2e}, l1 error {rows[-1][1]:.2e}"
    )
    assert cells < suggested < 2 * cells
    assert refined.status == "completed" and not refined.events
    assert rows[-1][1] < RESOLUTION_TOLERANCE


def test_the_width_test_measures_a_cluster_in_cells():
    """cluster_width on exact cell averages of Gaussians: the standard deviation in cells
    to 3 % from 0.6 to 6 cells (the narrowest axis counts), inf for a flat density."""
    from tpde.schemes.monitor import cluster_width

    grid = Grid([-6.0, -6.0], [6.0, 6.0], [60, 60])  # h = 0.2
    rows = []
    for sigma in (0.12, 0.3, 0.6, 1.2):
        rho = gaussian(grid, [0.31, -0.47], [[4 * sigma**2, 0.0], [0.0, sigma**2]])
        width, centre = cluster_width(rho, grid)
        rows.append((sigma / 0.2, width, centre))
    print("\n  sigma/h   width test   at")
    for expected, width, centre in rows:
        print(f"  {expected:6.2f}   {width:8.3f}    {centre}")
    assert all(abs(w / e - 1) <= 0.03 for e, w, _ in rows)
    assert all(np.allclose(c, [0.3, -0.5]) for _, _, c in rows)
    assert cluster_width(np.ones(grid.shape), grid)[0] == np.inf


def test_the_advice_names_atoms_only_for_a_narrow_cluster():
    """A mixture with one component 0.7 cells wide gets "atoms" in its under_resolved advice
    (at that component's position), a law 4 cells wide does not."""
    grid = Grid([-6.0, -6.0], [6.0, 6.0], [48, 48])  # h = 0.25
    field = ATTENTION["softmax"](Head(0.3 * np.eye(2), -np.eye(2)))
    laws = {
        "narrow": gaussian_mixture(
            grid, [0.5, 0.5], [[-2.0, 0.0], [1.6, 1.1]], [np.eye(2), 0.03 * np.eye(2)]
        ),
        "wide": gaussian(grid, [0.0, 0.0], np.eye(2)),
    }
    messages = {}
    for name, rho in laws.items():
        result = Solver(
            Problem(grid, rho, field, 0.01, resolution_action="stop", resolution_tolerance=1e-14)
        ).run()
        assert result.status == "under_resolved"
        messages[name] = result.status_message
    print("\n" + "\n".join(messages.values()))
    assert "atoms: the cluster at x = (1.625, 1.125)" in messages["narrow"]
    assert "atoms" not in messages["wide"] and "refine the grid to about" in messages["wide"]


def test_the_resolution_keys_of_a_config():
    """run.resolution_action takes "warn" (the default), "stop" and "warn_then_stop"; another
    value is one ConfigError naming the key and the choices; the default tolerance is the
    policy's (RESOLUTION_TOLERANCE)."""
    from tpde.config import ConfigError, build
    from tpde.schemes.monitor import RESOLUTION_ACTIONS, RESOLUTION_TOLERANCE

    raw = {
        "grid": {"lower": [-8.0], "upper": [8.0], "cells": [16]},
        "attention": {"variant": "softmax", "A": [[0.3]], "V": [[-1.0]]},
        "run": {"t_end": 0.1},
    }
    problem = build(raw).problem
    assert problem.resolution_action == "warn"
    assert problem.resolution_tolerance == RESOLUTION_TOLERANCE == 1e-3
    for action in RESOLUTION_ACTIONS:
        raw["run"]["resolution_action"] = action
        assert build(raw).problem.resolution_action == action
    raw["run"]["resolution_action"] = "continue"
    try:
        build(raw)
    except ConfigError as exc:
        message = str(exc)
    print("\n" + message)
    assert message.startswith("run.resolution_action") and "warn_then_stop" in message
    assert "\n" not in message
