"""The covariance record of a run read as evidence: its trace, its growth, the rank of its
last finite covariance, and the sweep's outcome from the run's typed status.

``tpde sweep`` (tpde.sweep.classify) maps the status a run file records (tpde.io.Outcome)
to an outcome and reads the covariance only through :func:`covariance_evidence` and
:func:`outcome`: no message is parsed. Tested against closed forms in
tests/test_outcomes.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "BLOWUP_GROWTH",
    "DEFAULT_TOLERANCE",
    "OUTCOME_OF_STATUS",
    "OUTCOMES",
    "covariance_evidence",
    "outcome",
]

OUTCOMES = ("converged", "blowup", "mass_left", "box_limited", "failed", "under_resolved")
DEFAULT_TOLERANCE = 0.05
BLOWUP_GROWTH = 1e3  # a completed run whose trace grew by more than this is a blow-up
#: the run file's status (tpde.io.RESULTS) -> the sweep's outcome; any other status
#: (``error``, ``interrupted``, a file still ``running``) is ``failed``
OUTCOME_OF_STATUS: Mapping[str, str] = {
    "completed": "converged",
    "blowup": "blowup",
    "mass_left_domain": "mass_left",
    "box_limited": "box_limited",
    "under_resolved": "under_resolved",
}


def covariance_evidence(
    time: np.ndarray, covariance: np.ndarray, growth: float = BLOWUP_GROWTH
) -> dict[str, Any]:
    """What a covariance record ``(m, d, d)`` (or flat, ``m d^2`` values) at ``time`` (m,)
    says: ``finite`` (m,) whether each matrix is finite; ``trace_initial`` ``tr Sigma_0``;
    ``grown`` the first time with ``tr Sigma > growth tr Sigma_0`` (NaN: none, or
    ``tr Sigma_0 <= 0``); ``last`` the index of the last finite matrix (None: none),
    ``last_time``; ``trace_final`` ``tr S`` of its symmetric part S, ``eigenvalues`` those of
    ``S / tr S`` descending (NaN where ``tr S <= 0``), ``covariance`` S (lists; NaN / empty
    without a finite matrix)."""
    time = np.asarray(time, dtype=float)
    cov = np.asarray(covariance, dtype=float)
    d = int(round(math.sqrt(cov.size / len(time)))) if cov.size else 0
    cov = cov.reshape(len(time), d, d)
    finite = np.isfinite(cov).all(axis=(1, 2)) if d else np.zeros(len(time), bool)
    traces = np.where(finite, np.trace(np.nan_to_num(cov), axis1=1, axis2=2), np.nan)
    last = int(np.nonzero(finite)[0][-1]) if finite.any() else None
    tr0 = float(traces[0]) if len(traces) else math.nan
    grown = np.nonzero(finite & (traces > growth * tr0))[0] if tr0 > 0 else np.zeros(0, int)
    out: dict[str, Any] = {
        "finite": finite,
        "trace_initial": tr0,
        "grown": float(time[grown[0]]) if len(grown) else math.nan,
        "last": last,
        "last_time": float(time[last]) if last is not None else math.nan,
        "trace_final": math.nan,
        "eigenvalues": [],
        "covariance": [],
    }
    if last is not None:
        sigma = 0.5 * (cov[last] + cov[last].T)
        trace = float(np.trace(sigma))
        eig = (
            np.sort(np.linalg.eigvalsh(sigma))[::-1] / trace if trace > 0 else np.full(d, math.nan)
        )
        out.update(trace_final=trace, eigenvalues=eig.tolist(), covariance=sigma.tolist())
    return out


def outcome(
    status: str | None,
    status_time: float,
    message: str,
    evidence: Mapping[str, Any],
    tolerance: float = DEFAULT_TOLERANCE,
    reason: str = "",
) -> dict[str, Any]:
    """The sweep's outcome of a run from its typed ``status`` / ``status_time`` / ``reason``
    and :func:`covariance_evidence` (the message is carried, never read): ``outcome``,
    ``reason``, ``rank``, ``event_time`` and the ``message`` (a default one where empty).

    - ``completed`` -> ``converged`` with ``rank``: 0 when ``trace_final <= tolerance
      trace_initial`` (collapse to a point), else the count of normalised eigenvalues above
      ``tolerance``; a last covariance that is not finite, or a trace grown by more than
      :data:`BLOWUP_GROWTH`, makes it a ``blowup`` at that snapshot.
    - a result of the dynamics (:data:`OUTCOME_OF_STATUS`) -> that outcome at
      ``status_time`` (a ``blowup`` without a time: the last finite snapshot's).
    - ``error`` -> ``failed`` with its reason, except ``non_finite`` after the trace grew:
      ``blowup`` at ``status_time``.
    - anything else (``interrupted``, ``running``) -> ``failed``, reason the status.
    """
    finite = evidence["finite"]
    grown = evidence["grown"]
    out: dict[str, Any] = {
        "outcome": "failed",
        "reason": "",
        "rank": -1,
        "event_time": math.nan,
        "message": message,
    }
    kind = OUTCOME_OF_STATUS.get(str(status))
    if kind == "converged":
        if len(finite) and not finite[-1]:
            out.update(
                outcome="blowup",
                event_time=evidence["last_time"],
                message=message or "non-finite covariance",
            )
        elif not math.isnan(grown):
            out.update(
                outcome="blowup",
                event_time=grown,
                message=message or f"tr(Sigma) grew by more than {BLOWUP_GROWTH:g}",
            )
        elif evidence["last"] is None:
            out.update(message=message or "no finite snapshot in the output")
        else:
            eig = np.asarray(evidence["eigenvalues"])
            tr0 = evidence["trace_initial"]
            collapsed = tr0 > 0 and evidence["trace_final"] <= tolerance * tr0
            out.update(outcome="converged", rank=0 if collapsed else int(np.sum(eig > tolerance)))
    elif kind is not None:
        t = status_time if math.isfinite(status_time) or kind != "blowup" else evidence["last_time"]
        out.update(outcome=kind, event_time=float(t))
    elif status == "error":
        why = reason or "exception"
        out.update(reason=why, event_time=float(status_time))
        if why == "non_finite" and not math.isnan(grown):
            out.update(outcome="blowup")
        else:
            out["message"] = message or f"run ended with an error ({why})"
    else:  # interrupted, running: the run gave no result of the dynamics
        out.update(reason=str(status), event_time=float(status_time))
        out["message"] = message or f"run ended with status {status!r}"
    return out
