"""``tpde validate``: the quick suite passes and writes its report; bad input exits with 2.

The quick suite takes minutes (slow tier); its default-tier twin runs the suite's own studies
on smaller cases through the same command, checks and report.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tpde.cli import main
from tpde.grid import Grid, gaussian_mixture, uniform_ball
from tpde.validation import studies
from tpde.validation import suite as validate
from tpde.variants import Head, L2Head, SigmoidHead, SinkhornHead


@pytest.mark.slow
def test_quick_suite_passes_and_writes_its_report(tmp_path, capsys):
    status = main(["validate", "--suite", "quick", "-o", str(tmp_path / "report")])
    out = capsys.readouterr().out
    print(out)
    assert status == 0
    assert "FAIL" not in out and "checks passed" in out
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| PASS |" in report and "**FAIL**" not in report
    for figure in ("covariance.png", "mean_field.png"):
        assert (tmp_path / "report" / figure).stat().st_size > 10_000


def small_suite(suite: str, outdir: Path, log=print) -> validate.Report:
    """The quick suite's studies on smaller cases: the closed forms, grid vs the Gaussian ODE
    (softmax c1, 32^2 -> 64^2, to t = 0.25), Gauss-Hermite tokens vs the ODE (softmax, 16^2
    nodes), grid vs sampled tokens for each of the suite's cases (fewer tokens; 1-D on 200
    cells) and the mean-field slope (1-D two bumps); the masked grid vs tokens check is
    tests/test_masked.py's (the suite's case)."""
    outdir.mkdir(parents=True, exist_ok=True)
    report = validate.Report([], [], [])
    validate.closed_forms(report, log)
    refinement = validate.grid_vs_odes(report, log, ["softmax"], [32, 64], 0.25)["softmax"]
    times = np.linspace(0.0, 0.25, 6)
    head = validate.CLOSED_FORM_PARAMS["softmax"]
    tokens = studies.tokens_vs_ode(
        "softmax", head, validate.MEAN1, validate.COV1, 0.25, nodes=16, times=times
    )
    report.checks.append(validate.Check("Gauss-Hermite tokens vs ODE", tokens["cov_error"], 1e-8))
    validate.covariance_figure(outdir / "covariance.png", refinement, tokens)
    line = Grid([-5.0], [5.0], [200])
    bumps = gaussian_mixture(line, [0.5, 0.5], [[-1.5], [1.2]], [[[0.3]], [[0.5]]])
    A, V = validate.A_BUMPS, validate.V_1D
    bumps_head = Head(A, V)
    box = Grid([-5.0, -5.0], [5.0, 5.0], [40, 40])
    disc = uniform_ball(box, [0.3, -0.2], 2.0)
    mix = gaussian_mixture(
        box, [0.5, 0.5], [[-1.5, 0.0], [1.5, 0.5]], [0.4 * np.eye(2), [[0.5, 0.1], [0.1, 0.3]]]
    )
    l2_head = L2Head(0.7 * np.eye(2), 0.7 * np.eye(2), -0.5 * np.eye(2))
    cases = [
        ("1-D two bumps, softmax", "softmax", bumps_head, line, bumps, 1000, 1),
        ("1-D two bumps, sigmoid", "sigmoid", SigmoidHead(A, V, bias=-1.0), line, bumps, 1000, 1),
        ("1-D two bumps, Sinkhorn", "sinkhorn", SinkhornHead(A, V), line, bumps, 250, 1),
        ("2-D uniform disc, softmax", "softmax", Head(validate.A1, validate.V1), box, disc, 500, 2),
        ("2-D two bumps, l2 (Q = K)", "l2", l2_head, box, mix, 500, 2),
    ]
    validate.grid_vs_tokens(report, log, cases)
    study = validate.mean_field_study(report, log, line, bumps, bumps_head, [100, 400, 1600], "1-D")
    validate.mean_field_figure(outdir / "mean_field.png", {"1-D two bumps": study})
    report.figures += ["covariance.png", "mean_field.png"]
    validate.write_report(report, outdir / "report.md", suite, 0.0)
    return report


def test_small_suite_passes_and_writes_its_report(tmp_path, capsys, monkeypatch):
    """Default-tier twin of the quick suite: ``tpde validate`` with :func:`small_suite`."""
    monkeypatch.setattr(validate, "run_suite", small_suite)
    status = main(["validate", "--suite", "quick", "-o", str(tmp_path / "report")])
    out = capsys.readouterr().out
    print(out)
    assert status == 0
    assert "FAIL" not in out and "checks passed" in out
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| PASS |" in report and "**FAIL**" not in report
    for check in ("grid vs ODE", "observed order", "tokens vs ODE", "slope", "2-D two bumps, l2"):
        assert check in report
    for figure in ("covariance.png", "mean_field.png"):
        assert (tmp_path / "report" / figure).stat().st_size > 10_000


def test_bad_arguments_exit_with_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["validate", "-o", str(blocker)]) == 2
    with pytest.raises(SystemExit) as info:
        main(["validate", "--suite", "huge"])
    assert info.value.code == 2
    run = subprocess.run(
        [sys.executable, "-m", "tpde.cli", "validate", "--suite", "huge"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "invalid choice" in run.stderr
    assert "Traceback" not in run.stderr
