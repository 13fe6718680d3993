"""``tpde validate``: the quick suite passes and writes its report; bad input exits with 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpde.cli import main


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
