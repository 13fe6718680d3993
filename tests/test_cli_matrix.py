"""Every command on every geometry kind: `tpde run`, `info`, `plot`, `particles`,
`gaussian`, `compare` and `sweep` on flat 1-D, 2-D and 3-D grids, the co-moving frame,
masked attention, the circle and the sphere (tiny grids, a few snapshots), and `tpde
validate` (which takes no geometry and has no tiny suite: its refusals only). Each command
works (exit 0, its output written) or refuses in one line with exit 2; no command prints a
traceback or a third-party warning (every stderr line is tpde's own, ``tpde: ...``).

The default tier builds every figure but does not render it (``Figure.savefig`` writes an
empty file: drawing is 80-90 % of a plot's cost, measured 2.1 s of 2.5 s for a 2-D run;
tests/test_figures.py renders and reads every plot kind) and skips the token file's
figures; ``-m slow`` renders every figure, the tokens' too."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tpde.cli import main
from tpde.config import dumps

distributed = pytest.importorskip("distributed")

I2 = [[1.0, 0.0], [0.0, 1.0]]
I3 = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
RUN = {"t_end": 0.1, "snapshots": 3}
FLAT2 = {
    "grid": {"lower": [-7.0, -7.0], "upper": [7.0, 7.0], "cells": [12, 12]},
    "initial": {"kind": "gaussian", "mean": [0.0, 0.0], "covariance": I2},
    "attention": {"A": [[0.5, 0.1], [0.0, 0.3]], "V": I2},
    "run": RUN,
}
#: geometry kind -> (config, the swept key, the commands refused in one line; "quantiles":
#: tpde particles --quantiles, mid-quantile tokens defined in 1-D and on the circle)
GEOMETRIES: dict[str, tuple[dict, str, tuple[str, ...]]] = {
    "flat-1d": (
        {
            "grid": {"lower": [-7.0], "upper": [7.0], "cells": [16]},
            "initial": {"kind": "gaussian", "mean": [0.0], "covariance": [[1.0]]},
            "attention": {"A": [[0.5]], "V": [[1.0]]},
            "run": RUN,
        },
        "attention.scale",
        (),
    ),
    "flat-2d": (FLAT2, "attention.scale", ("quantiles",)),
    "flat-3d": (
        {
            "grid": {"lower": [-7.0] * 3, "upper": [7.0] * 3, "cells": [6, 6, 6]},
            "initial": {"kind": "gaussian", "mean": [0.0] * 3, "covariance": I3},
            "attention": {"A": [[0.5, 0, 0], [0, 0.3, 0], [0, 0, 0.2]], "V": I3},
            "run": RUN,
        },
        "attention.scale",
        ("quantiles",),
    ),
    "frame": (
        {**copy.deepcopy(FLAT2), "scheme": {"frame": "affine"}},
        "attention.scale",
        ("quantiles",),
    ),
    "masked": (
        {
            **copy.deepcopy(FLAT2),
            "grid": {**FLAT2["grid"], "positions": 2, "sink_mass": 0.1},
            "attention": {**FLAT2["attention"], "masked": True},
        },
        "attention.scale",
        ("quantiles",),
    ),
    "circle": (
        {
            "grid": {"geometry": "circle", "cells": 32},
            "initial": {"kind": "noise", "amplitude": 1e-3, "k_max": 4},
            "attention": {"beta": 4.0},
            "run": {"t_end": 0.2, "snapshots": 3},
        },
        "attention.beta",
        ("gaussian",),
    ),
    "sphere": (
        {
            "grid": {"geometry": "sphere", "cells": 6},
            "initial": {"kind": "noise", "amplitude": 1e-3, "l_max": 3},
            "attention": {"beta": 4.0},
            "run": RUN,
        },
        "attention.beta",
        ("gaussian", "quantiles"),
    ),
}


@pytest.fixture(scope="module")
def scheduler():
    """One in-process dask cluster (tcp, one worker thread) for every sweep of the matrix:
    a local cluster of processes would start (and import tpde) once per sweep."""
    with distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tcp://",
        dashboard_address=None,
        silence_logs=50,
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture
def render(request, monkeypatch):
    """The default tier builds each figure and writes an empty file in its place."""
    if request.node.get_closest_marker("slow") is None:
        from matplotlib.figure import Figure

        monkeypatch.setattr(Figure, "savefig", lambda self, name, *a, **k: Path(name).touch())


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def check(
    capsys,
    name: str,
    command: str,
    code: int,
    err: str,
    refused: tuple[str, ...],
    output: Path | None = None,
) -> None:
    """Exit 0 and ``output`` written (a file or a folder with files), or 2 with one line
    for a refusal; stderr only tpde's own lines."""
    lines = err.splitlines()
    with capsys.disabled():  # (not into the next command's captured output)
        print(f"\n{name:8s} {command:10s} exit {code}  {lines[-1][:90] if lines else ''}", end="")
    assert "Traceback" not in err, err
    assert all(line.startswith("tpde: ") for line in lines), err  # no third-party warning
    if command in refused:
        assert code == 2 and len(lines) == 1, err
        return
    assert code == 0, err
    if output is not None:
        assert output.is_file() or any(output.iterdir()), f"{command} wrote no {output}"


def matrix(tmp_path: Path, capsys, name: str, address: str, full: bool = False) -> None:
    raw, key, refused = GEOMETRIES[name]
    config = tmp_path / "config.toml"
    config.write_text(dumps(raw))
    run, tokens, ode = tmp_path / "run.nc", tmp_path / "tokens.nc", tmp_path / "ode.nc"
    mid = tmp_path / "mid.nc"
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        f'base = "config.toml"\noutput = "{tmp_path / "sweep"}"\n[parameters]\n"{key}" = [2.0]\n'
    )
    figures = tmp_path / "figures"
    steps: list[tuple[str, list, Path | None]] = [
        ("run", ["run", config, "-o", run, "--quiet"], run),
        ("info", ["info", run], None),
        ("plot", ["plot", run, "-o", figures], figures),
        ("particles", ["particles", config, "--tokens", 40, "-o", tokens], tokens),
        ("quantiles", ["particles", config, "--tokens", 40, "--quantiles", "-o", mid], mid),
        ("gaussian", ["gaussian", config, "-o", ode], ode),
        ("info", ["info", tokens], None),
    ]
    if full:  # the tokens' figures: the same plot code as the run's, with their histogram
        steps.append(("plot", ["plot", tokens, "-o", tmp_path / "tf"], tmp_path / "tf"))
    said = {}
    for command, args, output in steps:
        code, out, err = cli(capsys, *args)
        check(capsys, name, command, code, err, refused, output)
        said.setdefault(command, out)  # (the run's info, not the tokens')
    geometry_word = {"circle": "circle", "sphere": "sphere"}.get(name)
    if geometry_word:  # info speaks the geometry (not "1-D grid")
        assert geometry_word in said["info"].lower() and "1-D grid" not in said["info"]
    references = [tokens] + ([ode] if ode.exists() else [])
    picture = tmp_path / "compare.png"
    code, _, err = cli(capsys, "compare", run, *references, "-o", picture)
    check(capsys, name, "compare", code, err, refused, picture)
    code, out, err = cli(capsys, "sweep", sweep, "--scheduler", address, "--quiet")
    check(capsys, name, "sweep", code, err, refused, tmp_path / "sweep" / "summary.nc")
    assert out.startswith("1 runs: ") and "0 failed" in out, out  # the one run is a result
    code, out, err = cli(capsys, "info", tmp_path / "sweep" / "summary.nc")
    check(capsys, name, "info", code, err, refused)
    assert "box_limited" in out and "under_resolved" in out
    phase = tmp_path / "phase"
    code, _, err = cli(capsys, "plot", tmp_path / "sweep" / "summary.nc", "-o", phase)
    check(capsys, name, "plot", code, err, refused, phase)


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_every_command_on_every_geometry(name, tmp_path, capsys, scheduler, render):
    matrix(tmp_path, capsys, name, scheduler)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_every_command_on_every_geometry_rendered(name, tmp_path, capsys, scheduler, render):
    matrix(tmp_path, capsys, name, scheduler, full=True)


def test_validate_refuses_in_one_line(tmp_path, capsys):
    """`tpde validate` takes no geometry (its suites run their own cases; tests/
    test_validate.py runs them): a bad -o or --suite is refused in one line, exit 2."""
    taken = tmp_path / "file"
    taken.write_text("")
    for args in (["-o", taken], ["--suite", "nope"]):
        code, _, err = cli(capsys, "validate", *args) if args[0] == "-o" else _exit(capsys, args)
        print(f"validate {args}: exit {code}, {err.strip()[:90]}")
        assert code == 2 and err.count("\n") == 1 and err.startswith("tpde: "), err


def _exit(capsys, args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:  # argparse exits itself
        main(["validate", *map(str, args)])
    out, err = capsys.readouterr()
    return int(stop.value.code or 0), out, err
