"""A covariance record as evidence (tpde.validation.outcomes) against closed forms: the
trace, its growth, the normalised eigenvalues of the last finite matrix, and the outcome
rules of a typed status; and the phase-diagram dataset of critical-point records
(tpde.validation.continuation.phase_dataset)."""

from __future__ import annotations

import math

import numpy as np

from tpde.validation import outcomes as oc


def test_covariance_evidence_of_a_shrinking_line():
    # Sigma(t) = diag(4, 1) e^{-t} ... then the last one is not finite
    t = np.array([0.0, 1.0, 2.0])
    cov = np.stack([np.diag([4.0, 1.0]) * math.exp(-s) for s in t])
    cov[2, 0, 0] = np.nan
    ev = oc.covariance_evidence(t, cov)
    print({k: ev[k] for k in ("trace_initial", "trace_final", "eigenvalues", "last_time")})
    assert ev["trace_initial"] == 5.0
    assert ev["last"] == 1 and ev["last_time"] == 1.0
    assert math.isclose(ev["trace_final"], 5.0 * math.exp(-1.0), rel_tol=1e-15)
    np.testing.assert_allclose(ev["eigenvalues"], [0.8, 0.2], rtol=1e-15)
    assert math.isnan(ev["grown"])
    np.testing.assert_array_equal(ev["finite"], [True, True, False])


def test_growth_and_the_outcome_rules():
    t = np.array([0.0, 0.5, 1.0])
    grown = np.stack([np.eye(2) * s for s in (1.0, 2e3, 5e3)])  # tr grows past 1e3 at 0.5
    ev = oc.covariance_evidence(t, grown)
    assert ev["grown"] == 0.5
    out = oc.outcome("completed", 1.0, "", ev)
    assert (out["outcome"], out["event_time"]) == ("blowup", 0.5)
    assert "grew by more than 1000" in out["message"]
    # the same growth behind a non-finite error is a blow-up at the error's time
    out = oc.outcome("error", 0.7, "m", ev, reason="non_finite")
    assert (out["outcome"], out["event_time"], out["reason"]) == ("blowup", 0.7, "non_finite")
    out = oc.outcome("error", 0.7, "", ev, reason="max_steps")
    assert out["outcome"] == "failed" and out["message"] == "run ended with an error (max_steps)"
    # rank: a line (eigenvalues 0.99, 0.01) has rank 1 at tolerance 0.05, a point rank 0
    line = np.stack([np.diag([1.0, 1.0]), np.diag([0.99, 0.01])])
    ev = oc.covariance_evidence(t[:2], line)
    assert oc.outcome("completed", 0.5, "", ev)["rank"] == 1
    assert oc.outcome("completed", 0.5, "", ev, tolerance=0.005)["rank"] == 2
    point = np.stack([np.eye(2), 0.01 * np.eye(2)])
    assert oc.outcome("completed", 0.5, "", oc.covariance_evidence(t[:2], point))["rank"] == 0
    for status, kind in oc.OUTCOME_OF_STATUS.items():
        if kind != "converged":
            assert oc.outcome(status, 0.3, "", ev)["outcome"] == kind
    # a predicted blow-up without a time: the last finite snapshot's
    assert oc.outcome("blowup", math.nan, "", ev)["event_time"] == 0.5
    out = oc.outcome("interrupted", 0.2, "", ev)
    assert (out["outcome"], out["reason"]) == ("failed", "interrupted")


def test_phase_dataset_of_records():
    from tpde.validation import stationary as st
    from tpde.validation.continuation import phase_dataset

    records = [
        {"beta": 3.0, "eps_threshold": 1.5, "curvature": -1.0, "eps_fold": math.nan,
         "eps_first_order": 1.5, "status": "completed", "error": ""},
        {"beta": 1.0, "error": "no threshold"},
    ]  # fmt: skip
    ds = phase_dataset(records, "circle", "unnormalised", 64)
    print(ds)
    np.testing.assert_array_equal(ds["beta"].values, [1.0, 3.0])
    assert list(ds["transition"].values) == ["continuous", "continuous"]
    assert list(ds["status"].values) == ["error", "completed"]
    assert math.isnan(ds["eps_threshold"].values[0]) and ds["eps_threshold"].values[1] == 1.5
    assert ds.attrs["beta_star_closed_form"] == st.critical_beta("circle")
