"""Bad input never produces a traceback or touches existing output: exit code 2, one line naming the
key (docs/user-guide.md, 'Configuration files'). Table-driven: each case mutates a valid
configuration."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest

from tpde.cli import main
from tpde.config import build, dumps

BASE = {
    "grid": {"lower": [-5.0, -5.0], "upper": [5.0, 5.0], "cells": [16, 16]},
    "initial": {"kind": "gaussian", "mean": [0.0, 0.0], "covariance": [[1.0, 0.3], [0.3, 0.5]]},
    "attention": {
        "variant": "softmax",
        "A": [[-0.5, 0.2], [0.1, -0.4]],
        "V": [[1.0, 0.0], [0.0, 1.0]],
    },
    "scheme": {"reconstruction": "weno5z", "cfl": 0.4},
    "run": {"t_end": 0.1, "snapshots": 2},
}


def edit(section, key, value):
    def apply(raw):
        if value is DELETE:
            raw[section].pop(key)
        else:
            raw.setdefault(section, {})[key] = value

    return apply


DELETE = object()
CASES = [  # (name, mutation or raw TOML text, key the message must name)
    ("malformed TOML", "[grid\nlower = [", "config: malformed TOML"),
    ("unknown section", edit("plots", "dpi", 100), "plots: unknown section"),
    ("unknown key", edit("grid", "size", 3), "grid.size: unknown key"),
    ("missing grid.lower", edit("grid", "lower", DELETE), "grid.lower: missing"),
    ("cells wrong length", edit("grid", "cells", [16, 16, 16]), "grid.cells"),
    ("cells zero", edit("grid", "cells", [0, 16]), "grid.cells[0]"),
    ("cells not integer", edit("grid", "cells", [16.5, 16]), "grid.cells[0]"),
    ("upper below lower", edit("grid", "upper", [5.0, -6.0]), "grid.upper"),
    ("lower not numbers", edit("grid", "lower", ["a", 0.0]), "grid.lower"),
    ("unknown boundary", edit("grid", "boundary", "reflective"), "grid.boundary"),
    ("unknown initial kind", edit("initial", "kind", "blob"), "initial.kind"),
    (
        "covariance not SPD",
        edit("initial", "covariance", [[1.0, 2.0], [2.0, 1.0]]),
        "initial.covariance",
    ),
    (
        "covariance wrong shape",
        edit("initial", "covariance", [[1.0, 0.0, 0.0]] * 3),
        "initial.covariance",
    ),
    ("NaN in the mean", edit("initial", "mean", [math.nan, 0.0]), "initial.mean"),
    ("box too small", edit("grid", "upper", [1.0, 1.0]), "grid: the box holds only"),
    (
        "missing tokens file",
        lambda raw: raw.update(initial={"kind": "tokens", "file": "/nonexistent/t.npy"}),
        "initial.file",
    ),
    ("unknown variant", edit("attention", "variant", "cosine"), "attention.variant"),
    ("A wrong shape", edit("attention", "A", [[1.0, 0.0, 0.0]] * 3), "attention.A"),
    ("NaN in A", edit("attention", "A", [[math.nan, 0.0], [0.0, 1.0]]), "attention.A"),
    ("V missing", edit("attention", "V", DELETE), "attention.V: missing"),
    ("V wrong shape", edit("attention", "V", [[1.0, 0.0]]), "attention.V"),
    ("l2 without Q and K", edit("attention", "variant", "l2"), "attention.Q"),
    (
        "sinkhorn epsilon 0",
        lambda raw: raw["attention"].update(variant="sinkhorn", epsilon=0.0),
        "attention.epsilon",
    ),
    (
        "sigmoid infinite bias",
        lambda raw: raw["attention"].update(variant="sigmoid", bias=math.inf),
        "attention.bias",
    ),
    ("unknown engine", edit("attention", "engine", "gpu"), "attention.engine"),
    ("heads not tables", edit("attention", "heads", [1, 2]), "attention.heads"),
    ("cfl above 1", edit("scheme", "cfl", 1.5), "scheme.cfl"),
    ("unknown reconstruction", edit("scheme", "reconstruction", "weno7"), "scheme.reconstruction"),
    ("unknown face velocity", edit("scheme", "face_velocity", "spline"), "scheme.face_velocity"),
    ("positions without a mask", edit("grid", "positions", 8), "grid.positions"),
    ("masked not a boolean", edit("attention", "masked", "yes"), "attention.masked"),
    (
        "masked sinkhorn",
        lambda raw: raw["attention"].update(variant="sinkhorn", masked=True),
        "attention.masked",
    ),
    (
        "sink mass 1",
        lambda raw: (raw["attention"].update(masked=True), raw["grid"].update(sink_mass=1.0)),
        "grid.sink_mass",
    ),
    (
        "positions zero",
        lambda raw: (raw["attention"].update(masked=True), raw["grid"].update(positions=0)),
        "grid.positions",
    ),
    ("mean drift unmasked", edit("initial", "mean_drift", [1.0, 0.0]), "initial.mean_drift"),
    ("t_end negative", edit("run", "t_end", -1.0), "run.t_end"),
    ("t_end missing", edit("run", "t_end", DELETE), "run.t_end: missing"),
    ("one snapshot", edit("run", "snapshots", 1), "run.snapshots"),
    ("missing [attention]", lambda raw: raw.pop("attention"), "attention: missing section"),
]


def config_text(case) -> str:
    if isinstance(case, str):
        return case
    raw = copy.deepcopy(BASE)
    case(raw)
    return dumps(raw)


@pytest.mark.parametrize("name, case, key", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line_naming_the_key(tmp_path, capsys, name, case, key):
    path = tmp_path / "bad.toml"
    path.write_text(config_text(case))
    out = tmp_path / "existing.nc"
    out.write_bytes(b"a previous result")
    status = main(["run", str(path), "-o", str(out), "--overwrite", "--quiet"])
    err = capsys.readouterr().err.strip()
    print(f"\n{name}: {err}")
    assert status == 2
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("tpde: ") and key in err
    assert out.read_bytes() == b"a previous result"


def test_output_problems_exit_2_and_keep_existing_files(tmp_path, capsys):
    path = tmp_path / "ok.toml"
    path.write_text(dumps(BASE))
    existing = tmp_path / "done.nc"
    existing.write_bytes(b"keep me")
    cases = [
        (["-o", str(existing)], "--overwrite"),
        (["-o", str(tmp_path / "no" / "dir" / "out.nc")], "run.output"),
        (["-o", str(existing), "--resume", "--overwrite"], "exclude each other"),
        ([], "config"),
    ]
    for args, key in cases[:3]:
        status = main(["run", str(path), *args, "--quiet"])
        err = capsys.readouterr().err.strip()
        print(f"\n{args}: {err}")
        assert status == 2 and key in err and "\n" not in err
    assert existing.read_bytes() == b"keep me"
    status = main(["run", str(tmp_path / "missing.toml"), "-o", str(tmp_path / "x.nc")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "config: cannot read" in err


def test_console_script_prints_no_traceback(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(config_text(edit("scheme", "cfl", 2.0)))
    run = subprocess.run(
        [sys.executable, "-m", "tpde.cli", "run", str(path), "-o", str(tmp_path / "o.nc")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "scheme.cfl" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "tpde.cli", "frobnicate"], capture_output=True, text=True
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr


def test_base_config_is_valid_and_dumps_round_trip():
    config = build(dumps(BASE))
    again = build(config.text)
    assert again.text == config.text
    assert config.problem.grid.shape == (16, 16)
