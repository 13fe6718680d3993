"""The circle through the face: ``[grid] geometry = "circle"`` configurations, the NetCDF
output in angles, the interaction energy record and the figures (tpde.circle,
tpde.circle_plots)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tpde
from tpde.config import ConfigError, build
from tpde.grid.circle import TWO_PI, CircleGrid

NOISE = """
[grid]
geometry = "circle"
cells = 128

[initial]
kind = "noise"
amplitude = 1e-3
k_max = 24
seed = 2

[attention]
beta = 16.0

[run]
t_end = 16.0
snapshots = 9
"""


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import numba

    before = numba.get_num_threads()
    tpde.set_num_threads(1)
    yield
    tpde.set_num_threads(before)


def test_circle_config_builds_the_circle_problem():
    config = build(NOISE)
    grid = config.problem.grid
    assert isinstance(grid, CircleGrid) and grid.cells == (128,) and grid.copies == 1
    assert grid.integrate(config.problem.density) == pytest.approx(1.0, abs=1e-14)
    assert config.geometry == "circle" and config.variant == "softmax"
    assert 'geometry = "circle"' in config.text and "copies = 1" in config.text
    # the flat default is unchanged, and "flat" may be written out
    flat = build(
        '[grid]\ngeometry = "flat"\nlower = [-9]\nupper = [9]\ncells = [32]\n'
        "[attention]\nA = [[-0.5]]\nV = [[1.0]]\n[run]\nt_end = 0.1\n"
    )
    assert not isinstance(flat.problem.grid, CircleGrid)


@pytest.mark.parametrize(
    "change, message",
    [
        (("grid", "geometry", "torus"), "grid.geometry: unknown 'torus'"),
        (("grid", "lower", [0.0]), "grid.lower: unknown key of the circle"),
        (("initial", "kind", "gaussian"), "initial.kind: unknown 'gaussian'"),
        (("attention", "variant", "l2"), "attention.variant"),
        (("attention", "engine", "separable"), "attention.engine"),
        (("grid", "cells", 4), "grid.cells: the circle needs at least 7"),
        (("grid", "copies", 3), "grid.copies"),
    ],
)
def test_circle_config_errors_name_the_key(change, message):
    import tomllib

    raw = tomllib.loads(NOISE)
    section, key, value = change
    raw[section][key] = value
    if key == "copies":  # an m-fold grid with a general A
        raw["attention"] = {"A": [[1.0, 0.0], [0.0, 2.0]]}
    with pytest.raises(ConfigError, match=message.replace("(", "\\(")):
        build(raw)


def test_circle_run_writes_angles_energy_and_figures(tmp_path):
    ds = tpde.simulate(NOISE, output=tmp_path / "run.nc")
    assert ds.attrs["geometry"] == "circle" and int(ds.attrs["circle_copies"]) == 1
    assert ds["x"].attrs["units"] == "radian"
    theta = ds["x"].values
    assert theta[0] == pytest.approx(math.pi / 128) and theta[-1] < TWO_PI
    mass = ds["mass"].values
    assert np.abs(mass - 1.0).max() < 1e-13
    energy = ds["energy_interaction"].values
    assert ds["energy_interaction"].attrs["monotone"] == "increasing"
    assert np.all(np.diff(energy) > -1e-12 * energy[0])
    # uniform start: E = I_0(beta) / (2 beta) to the noise's second order
    assert energy[0] == pytest.approx(np.i0(16.0) / 32.0, rel=1e-5)
    assert energy[-1] > 1.5 * energy[0]  # clusters formed
    from tpde.circle_plots import circle_figures, circle_series
    from tpde.grid.circle import clusters

    series = circle_series(ds)
    count = clusters(series["density"][-1], series["grid"])[0].size
    assert 3 <= count <= 7  # about k_max = 6 for beta = 16
    paths = circle_figures(tmp_path / "run.nc", tmp_path / "figures")
    assert [p.name for p in paths] == ["space_time.png", "ring.png", "modes.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_reduced_circle_run_through_the_config():
    text = NOISE.replace("cells = 128", "cells = 16\ncopies = 4").replace(
        'kind = "noise"\namplitude = 1e-3\nk_max = 24\nseed = 2',
        'kind = "uniform"\nmodes = [[4, 1e-6, 0.0]]',
    )
    text = text.replace("t_end = 16.0", "t_end = 4.0")
    ds = tpde.simulate(text)
    assert int(ds.attrs["circle_copies"]) == 4 and ds["x"].size == 16
    from tpde.grid.circle import circle_grid, mode_amplitude
    from tpde.validation.sphere_rates import linear_rate

    grid = circle_grid(16, 4)
    a = [mode_amplitude(d, grid, 4) for d in ds["density"].values]
    rate = np.log(a[-1] / a[0]) / 4.0
    assert rate == pytest.approx(linear_rate(4, 16.0), rel=2e-3)  # the CFL step's RK3 error


def test_example_configuration_builds():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    config = build(root / "examples" / "sphere" / "clusters.toml")
    assert isinstance(config.problem.grid, CircleGrid) and config.problem.grid.cells == (512,)
    assert config.problem.scheme.dt_max == pytest.approx(0.137)


@pytest.mark.slow
def test_cluster_counts_follow_the_fastest_mode():
    from tpde.circle import clusters_from_noise

    print("\nbeta k_max sqrt(2 beta) clusters")
    for beta in (4.0, 16.0, 32.0, 64.0, 100.0):
        run = clusters_from_noise(beta)
        print(f"  {beta:5g} {run['k_max']:3d} {math.sqrt(2 * beta):6.2f} {run['count']:3d}")
        assert abs(run["count"] - run["k_max"]) <= 2
        assert run["masses"].sum() > 0.85  # the rest: basins still below the threshold
        assert run["result"].final.min() >= 0.0


def test_masked_circle_through_the_config():
    text = NOISE.replace("cells = 128", "cells = 64\npositions = 4").replace(
        "beta = 16.0", "beta = 16.0\nmasked = true"
    )
    text = text.replace("t_end = 16.0", "t_end = 2.0")
    ds = tpde.simulate(text)
    assert ds["density"].shape == (9, 5, 64)
    assert "energy_interaction" not in ds
    with pytest.raises(ConfigError, match="grid.positions: only for masked"):
        build(NOISE.replace("cells = 128", "cells = 64\npositions = 4"))
