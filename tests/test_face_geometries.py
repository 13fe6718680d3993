"""The face on every geometry: kill -9 then --resume of the shipped circle example, `tpde
info` in a circle's own terms, tokens on the circle (i.i.d. and mid-quantile), commands that
have no meaning refused in one line, the sweep's summary counting every outcome, and the
small promises of the user guide (`import tpde` reaches its submodules, --quiet keeps
warnings)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from exact import kill_after

from tpde.cli import main
from tpde.config import dumps

ROOT = Path(__file__).resolve().parents[1]


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def shortened_circle(
    tmp_path: Path, cells: int = 64, t_end: float = 6.0, snapshots: int = 61
) -> Path:
    """examples/sphere/clusters.toml on fewer cells and a shorter time (its keys as shipped:
    the defaults ``copies``, ``normalised`` and ``engine`` omitted)."""
    raw = tomllib.loads((ROOT / "examples/sphere/clusters.toml").read_text())
    raw["grid"]["cells"] = cells
    raw["initial"]["k_max"] = 16
    raw["run"].update(t_end=t_end, snapshots=snapshots)
    raw["run"].pop("output")
    path = tmp_path / "clusters.toml"
    path.write_text(dumps(raw))
    return path


def test_killed_circle_example_resumes_bit_for_bit(tmp_path, capsys):
    """The shipped circle example, killed with SIGKILL after five snapshots, resumes from
    its file and ends with the uninterrupted run's times, densities, energies and step
    count bit for bit (the stored config has the circle's defaults filled in, the example
    omits them: both sides are compared with the defaults filled)."""
    config = shortened_circle(tmp_path)
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert cli(capsys, "run", config, "-o", full, "--quiet")[0] == 0
    kill_after(["run", str(config), "-o", str(cut)], 5)  # after 5 snapshots
    code, out, _ = cli(capsys, "info", cut)
    assert code == 0 and "t = nan" not in out
    code, _, err = cli(capsys, "run", config, "-o", cut, "--resume", "--quiet")
    assert code == 0, err
    with xr.open_dataset(cut) as resumed, xr.open_dataset(full) as reference:
        print(
            f"\ncircle example killed and resumed: {resumed.sizes['time']} snapshots, "
            f"steps {resumed.attrs['steps']} vs {reference.attrs['steps']}, max |gap| "
            f"{float(np.abs(resumed['density'] - reference['density']).max()):.1e}"
        )
        assert resumed.attrs["status"] == "completed"
        np.testing.assert_array_equal(resumed["time"].values, reference["time"].values)
        np.testing.assert_array_equal(resumed["density"].values, reference["density"].values)
        np.testing.assert_array_equal(
            resumed["energy_interaction"].values, reference["energy_interaction"].values
        )
        assert resumed.attrs["steps"] == reference.attrs["steps"]


def test_killed_sphere_example_resumes_bit_for_bit(tmp_path, capsys):
    """The shipped sphere example (fewer cells, shorter), killed with SIGKILL after four
    snapshots, resumes to the uninterrupted run's densities, energies and step count. All
    three runs on one thread: the harmonic engine's transforms (ducc0) sum in thread order,
    so bit for bit holds at equal thread counts (measured: 1-ulp differences between a run
    on one thread and one on two)."""
    raw = tomllib.loads((ROOT / "examples/sphere/clusters_s2.toml").read_text())
    raw["grid"]["cells"] = 8
    raw["run"].update(t_end=1.2, snapshots=13)
    raw["run"].pop("output")
    config = tmp_path / "s2.toml"
    config.write_text(dumps(raw))
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert cli(capsys, "run", config, "-o", full, "--quiet", "--threads", 1)[0] == 0
    kill_after(["run", str(config), "-o", str(cut), "--threads", "1"], 4)
    code, _, err = cli(capsys, "run", config, "-o", cut, "--resume", "--quiet", "--threads", 1)
    assert code == 0, err
    with xr.open_dataset(cut) as resumed, xr.open_dataset(full) as reference:
        print(
            f"\nsphere example killed and resumed: steps {resumed.attrs['steps']} vs "
            f"{reference.attrs['steps']}"
        )
        assert resumed.attrs["status"] == "completed"
        np.testing.assert_array_equal(resumed["time"].values, reference["time"].values)
        np.testing.assert_array_equal(resumed["density"].values, reference["density"].values)
        assert resumed.attrs["steps"] == reference.attrs["steps"]


def test_info_speaks_the_circle_and_its_clusters(tmp_path, capsys):
    """`tpde info` on a circle run names the circle and its angle cells (not a 1-D grid)
    and lists the clusters of the last snapshot, the same as tpde.grid.circle.clusters."""
    from tpde.grid.circle import circle_grid, clusters

    config = shortened_circle(tmp_path, cells=128, t_end=30.0)
    out_file = tmp_path / "run.nc"
    assert cli(capsys, "run", config, "-o", out_file, "--quiet")[0] == 0
    code, out, _ = cli(capsys, "info", out_file)
    print("\n" + "\n".join(out.splitlines()[:6]))
    assert code == 0 and "the circle S^1, 128 angle cells" in out and "1-D grid" not in out
    with xr.open_dataset(out_file) as ds:
        angles, masses = clusters(ds["density"].values[-1], circle_grid(128))
    assert angles.size >= 2
    assert f"clusters at the last snapshot: {angles.size}," in out
    assert f"{angles[0]:.4f} ({masses[0]:.4g})" in out
    assert "status: completed at t = 30\n" in out  # no dangling colon without a message


def test_circle_tokens_mid_quantiles_and_iid(tmp_path, capsys):
    """`tpde particles` on the circle: tokens of the initial cell averages moved on the
    circle. The mid-quantile tokens' histogram at t = 0 equals the cell averages to 1/n per
    cell (no sampling noise); i.i.d. tokens are within a few standard errors; `tpde
    gaussian` is refused in one line (exit 2)."""
    config = shortened_circle(tmp_path, cells=64, t_end=1.0, snapshots=5)
    n = 4000
    mid, iid = tmp_path / "mid.nc", tmp_path / "iid.nc"
    assert cli(capsys, "particles", config, "--tokens", n, "--quantiles", "-o", mid)[0] == 0
    assert cli(capsys, "particles", config, "--tokens", n, "--seed", 3, "-o", iid)[0] == 0
    from tpde.config import build

    initial = build(config).problem.density
    h = 2 * np.pi / 64
    with xr.open_dataset(mid) as q, xr.open_dataset(iid) as s:
        gap_q = np.abs(q["density"].values[0] - initial).max() * h
        gap_s = np.abs(s["density"].values[0] - initial).max() * h
        assert q["tokens"].shape == (q.sizes["time"], n, 1)
        assert q.attrs["sampling"] == "mid-quantiles"
    print(f"\ncell mass error at t = 0: mid-quantiles {gap_q:.2e}, i.i.d. {gap_s:.2e}")
    assert gap_q <= 1.0 / n + 1e-15
    assert gap_s > 3 * gap_q  # the i.i.d. sample's noise is what mid-quantiles remove
    code, out, _ = cli(capsys, "info", mid)
    assert "tokens: 4000 (mid-quantiles)" in out
    code, _, err = cli(capsys, "gaussian", config, "-o", tmp_path / "g.nc")
    assert code == 2 and err.count("\n") == 1 and "no Gaussian closure" in err


def test_quantile_tokens_invert_the_cells_cdf():
    """Mid-quantile tokens of cell averages: F(x_i) = (i - 1/2) / n exactly for the
    piecewise-linear CDF of the cells (independent check by interpolation)."""
    from tpde.grid import Grid
    from tpde.validation.particles import quantile_tokens_of_cells

    grid = Grid([-2.0], [3.0], [10])
    rng = np.random.default_rng(0)
    density = rng.uniform(0.0, 1.0, 10)
    density[[2, 3]] = 0.0  # empty cells hold no token
    x = quantile_tokens_of_cells(density, grid, 501)[:, 0]
    cdf = np.concatenate(([0.0], np.cumsum(density))) / density.sum()
    u = np.interp(x, grid.edges(0), cdf)
    assert np.max(np.abs(u - (np.arange(501) + 0.5) / 501)) < 1e-14
    empty = (x > grid.edges(0)[2]) & (x < grid.edges(0)[4])
    assert not empty.any()
    with pytest.raises(ValueError, match="1-D"):
        quantile_tokens_of_cells(np.ones((4, 4)), Grid([0, 0], [1, 1], [4, 4]), 5)


def test_quantiles_refused_where_undefined(tmp_path, capsys):
    raw = {
        "grid": {"lower": [-6.0, -6.0], "upper": [6.0, 6.0], "cells": [12, 12]},
        "attention": {"A": [[1.0, 0.0], [0.0, 1.0]], "V": [[1.0, 0.0], [0.0, 1.0]]},
        "run": {"t_end": 0.1},
    }
    path = tmp_path / "flat.toml"
    path.write_text(dumps(raw))
    code, _, err = cli(capsys, "particles", path, "--tokens", 10, "--quantiles")
    assert code == 2 and err.count("\n") == 1 and "--quantiles" in err


def test_sweep_lines_count_every_outcome():
    """The sweep's summary line and `tpde info` name every outcome the summary counts."""
    from tpde.sweep import OUTCOMES, outcome_counts

    attrs = {o: i + 1 for i, o in enumerate(OUTCOMES)}
    line = outcome_counts(attrs)
    for i, outcome in enumerate(OUTCOMES):
        assert f"{i + 1} {outcome}" in line
    assert "box_limited" in line and "under_resolved" in line


def test_import_tpde_reaches_its_submodules():
    code = "import tpde; print(tpde.io.read.__name__, tpde.grid.Grid.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["read", "Grid"], out.stderr
    import tpde

    with pytest.raises(AttributeError):
        _ = tpde.no_such_module  # type: ignore[attr-defined]


def test_quiet_keeps_the_warnings(tmp_path, capsys):
    """--quiet drops the progress, never the end-of-run warnings (box_limited and
    under_resolved events the run went past)."""
    raw = {
        "grid": {"lower": [-3.0], "upper": [3.0], "cells": [16]},
        "initial": {"kind": "gaussian", "mean": [0.0], "covariance": [[0.05]]},
        "attention": {"A": [[1.0]], "V": [[1.0]]},
        "run": {"t_end": 0.2, "snapshots": 3},
    }
    path = tmp_path / "coarse.toml"
    path.write_text(dumps(raw))
    code, _, loud = cli(capsys, "run", path, "-o", tmp_path / "a.nc")
    code_q, _, quiet = cli(capsys, "run", path, "-o", tmp_path / "b.nc", "--quiet")
    warned = [line for line in loud.splitlines() if line.startswith("tpde: warning:")]
    print("\n" + "\n".join(warned))
    assert code == code_q == 0 and warned  # a law of 1.2 cells per standard deviation
    assert [line for line in quiet.splitlines() if line.startswith("tpde: warning:")] == warned
    assert "status" not in quiet


def test_mixture_weights_of_the_wrong_length_name_the_weights():
    from tpde.config import ConfigError, build

    raw = {
        "grid": {"lower": [-4.0, -4.0], "upper": [4.0, 4.0], "cells": [16, 16]},
        "initial": {
            "kind": "mixture",
            "weights": [0.5, 0.3, 0.2],
            "means": [[0.0, 0.0], [1.0, 1.0]],
            "covariances": [np.eye(2).tolist()] * 2,
        },
        "attention": {"A": np.eye(2).tolist(), "V": np.eye(2).tolist()},
        "run": {"t_end": 0.1},
    }
    with pytest.raises(ConfigError, match=r"^initial\.weights: 3 weights for 2 means"):
        build(raw)


def test_compare_draws_a_run_that_stopped_between_snapshots(tmp_path):
    """`tpde compare` of a grid run that stopped between the tokens' snapshot times draws
    the tokens' latest earlier snapshot (saying its time), not an empty panel; the title
    names only the references given."""
    from tpde.plots import compare_figure

    raw = {
        "grid": {"lower": [-6.0, -6.0], "upper": [6.0, 6.0], "cells": [24, 24]},
        "attention": {"A": [[0.5, 0.0], [0.0, 0.2]], "V": [[1.0, 0.0], [0.0, 1.0]]},
        "run": {"t_end": 0.4, "snapshots": 5},
    }
    import tpde
    from tpde.config import build
    from tpde.references import particle_reference

    config = build(raw)
    tokens = particle_reference(config, 300, seed=1)
    run = tpde.simulate(dict(raw, run={"t_end": 0.25, "snapshots": [0.0, 0.1, 0.25]}))
    fig = compare_figure(run, tokens)
    titles = [ax.get_title() for ax in fig.get_axes()]
    texts = [t.get_text() for ax in fig.get_axes() for t in ax.texts]
    print(f"\n{titles[:2]}; suptitle {fig._suptitle.get_text()!r}")
    assert "token histogram at t = 0.2" in titles
    assert not any("no snapshot" in t for t in texts)
    assert "Gaussian ODE" not in fig._suptitle.get_text()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attention": {"beta": 4.0, "engine": "direct"}}, "atoms: on the circle atoms need"),
        ({"grid": {"geometry": "circle", "cells": 16}}, "refine grid.cells"),
    ],
    ids=["direct-engine", "coarse-grid"],
)
def test_atoms_refuse_what_they_do_not_carry(change, message):
    """Atoms on the circle refuse, in one line, what their share of the sums does not carry
    (the direct engine's point sums; a grid whose modes do not hold the kernel), instead of
    running the cells alone."""
    from tpde.config import ConfigError, build

    raw = {
        "grid": {"geometry": "circle", "cells": 128},
        "initial": {"kind": "noise", "amplitude": 1e-3, "k_max": 8},
        "attention": {"beta": 4.0},
        "atoms": {},
        "run": {"t_end": 1.0},
    }
    for section, table in change.items():
        raw[section] = table
    with pytest.raises(ConfigError, match=message):
        build(raw)


def test_atoms_take_the_noise_and_any_head():
    """``[atoms]`` on the circle with ``run.noise`` and a general 2 x 2 ``A`` (the Bessel
    series): the config builds and a short run ends ``completed`` with its clusters as atoms,
    mass of cells plus atoms to 1e-13."""
    from test_circle_atoms import ATOMS_CONFIG

    import tpde

    raw = {
        **ATOMS_CONFIG,
        "attention": {"A": [[6.0, 0.5], [0.0, 4.0]], "engine": "fft"},
        "atoms": {},
        "run": {"t_end": 0.2, "snapshots": 3, "noise": 1e-3},
    }
    run = tpde.simulate(raw)
    count = int((run["atom_id"].values[-1] >= 0).sum())
    total = run["mass"].values + np.nansum(run["atom_mass"].values, axis=1)
    status = run.attrs.get("status")
    print(f"\n{status}: {count} atoms, mass - 1 = {np.abs(total - 1).max():.1e}")
    assert status == "completed" and count == 2
    assert np.abs(total - 1).max() < 1e-13


def test_sphere_references_through_the_config_hooks(tmp_path, capsys):
    """tpde particles / gaussian on the sphere go through the config's hooks (no geometry
    branch in the CLI): tokens are written in the sphere's layout, --quantiles and tpde
    gaussian are refused in one line each (exit 2)."""
    raw = tomllib.loads((ROOT / "examples/sphere/clusters_s2.toml").read_text())
    raw["grid"]["cells"] = 6
    raw["run"].update(t_end=0.2, snapshots=3)
    raw["run"].pop("output")
    config = tmp_path / "s2.toml"
    config.write_text(dumps(raw))
    out = tmp_path / "tokens.nc"
    assert cli(capsys, "particles", config, "--tokens", 200, "-o", out)[0] == 0
    with xr.open_dataset(out) as ds:
        assert ds["tokens"].shape == (3, 200, 3) and ds.attrs["geometry"] == "sphere"
    for args, said in (
        (["particles", config, "--tokens", 10, "--quantiles"], "--quantiles"),
        (["gaussian", config], "no Gaussian closure"),
    ):
        code, _, err = cli(capsys, *args, "-o", tmp_path / "x.nc")
        assert code == 2 and err.count("\n") == 1 and said in err, err
