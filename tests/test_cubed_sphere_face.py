"""The sphere through the face: ``[grid] geometry = "sphere"`` configurations (tpde.sphere),
the CF NetCDF file on a globe, ``tpde info`` / ``plot`` / ``particles`` on it, and the run
against tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

import tpde
from tpde.config import ConfigError, build
from tpde.grid import cubed_sphere as cs
from tpde.sphere import SphereConfig, from_file

RUN = """
[grid]
geometry = "sphere"
cells = 8

[initial]
kind = "mixture"
weights = [0.6, 0.4]
means = [[1, 0, 0], [0, 0.6, -0.8]]
kappas = [3.0, 5.0]

[attention]
A = [[1.0, 0.35, -0.2], [-0.15, 0.6, 0.45], [0.25, -0.3, 1.25]]
V = [[1.0, -0.8, 0.2], [0.6, 0.9, 0.0], [-0.3, 0.4, 1.1]]

[run]
t_end = 0.6
snapshots = 4
"""


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    tpde.set_num_threads(1)


def test_sphere_config_round_trip():
    config = build(RUN)
    assert isinstance(config, SphereConfig) and config.grid.n == 8
    assert config.grid.integrate(config.density) == pytest.approx(1.0, abs=1e-14)
    assert config.field.beta is None and config.field.A[0, 1] == 0.35
    assert np.allclose(config.times, [0, 0.2, 0.4, 0.6])
    # the stored text builds the same configuration (defaults written out)
    again = build(config.text)
    assert again.text == config.text
    assert np.array_equal(again.density, config.density)
    assert np.array_equal(again.field.A, config.field.A)
    assert 'velocity_at = "nodes"' in config.text and "nodes = 3" in config.text
    # every initial kind
    for initial, check in (
        ('kind = "von_mises_fisher"\nmean = [0, 1, 1]\nkappa = 4.0', 1.0),
        ('kind = "uniform"\nmodes = [[3, 0.2], [2, -0.1]]\naxis = [1, 0, 0]', 1.0),
        ('kind = "noise"\namplitude = 0.01\nl_max = 6\nseed = 3', 1.0),
    ):
        text = RUN.replace(
            RUN[RUN.index("[initial]") : RUN.index("[attention]")], f"[initial]\n{initial}\n\n"
        )
        c = build(text)
        assert c.grid.integrate(c.density) == pytest.approx(check, abs=1e-14)
    uniform = build(RUN.replace(RUN[RUN.index("[initial]") : RUN.index("[attention]")], ""))
    assert np.allclose(uniform.density, 1 / (4 * math.pi), rtol=1e-15)
    # the zonal mode is recovered by projection
    modes = build(
        RUN.replace(
            RUN[RUN.index("[initial]") : RUN.index("[attention]")],
            '[initial]\nkind = "uniform"\nmodes = [[3, 0.2]]\n\n',
        )
    )
    assert cs.zonal_projection(modes.grid, modes.density, 3) == pytest.approx(0.2, abs=1e-3)


@pytest.mark.parametrize(
    "change, message",
    [
        (("cells = 8", "cells = 4"), "grid.cells"),
        (("cells = 8", "cells = 8\nlower = [0]"), "grid.lower"),
        (('kind = "mixture"', 'kind = "gaussian"'), "initial.kind"),
        (("kappas = [3.0, 5.0]", "kappas = [3.0, -5.0]"), "initial.kappas"),
        (
            ("means = [[1, 0, 0], [0, 0.6, -0.8]]", "means = [[1, 0], [0, 0.6, -0.8]]"),
            "initial.means[0]",
        ),
        (("A = [[1.0, 0.35, -0.2],", "A = [[1.0, 0.35],"), "attention.A[0]"),
        (("[attention]", '[attention]\nvariant = "l2"'), "attention.variant"),
        (("[attention]", "[attention]\nbeta = 2.0"), "attention.A"),
        (("[run]", '[scheme]\nvelocity_at = "corners"\n[run]'), "scheme.velocity_at"),
        (("snapshots = 4", "snapshots = [0.5, 0.2]"), "run.snapshots"),
    ],
)
def test_sphere_config_errors_name_the_key(change, message):
    with pytest.raises(ConfigError) as info:
        build(RUN.replace(*change))
    text = str(info.value)
    print(f"\n{message}: {text}")
    assert text.startswith(message) and "\n" not in text


def cli(capsys, *args: str) -> tuple[int, str, str]:
    from tpde.cli import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_run_writes_a_cf_file_on_the_globe(tmp_path, capsys):
    path = tmp_path / "run.nc"
    config = tmp_path / "run.toml"
    config.write_text(RUN)
    code, _, err = cli(capsys, "run", config, "-o", path, "--quiet")
    assert code == 0, err
    with xr.open_dataset(path) as ds:
        ds = ds.load()
    assert ds["density"].dims == ("time", "panel", "j", "i")
    assert ds.sizes["panel"] == 6 and ds.sizes["i"] == ds.sizes["j"] == 8 and ds.sizes["time"] == 4
    assert (
        ds["lat"].attrs["units"] == "degrees_north"
        and ds["lon"].attrs["standard_name"] == "longitude"
    )
    import netCDF4

    with netCDF4.Dataset(path) as nc:  # as stored (xarray moves "coordinates" to encoding)
        assert nc["density"].coordinates == "lat lon" and nc["lat"].bounds == "lat_bounds"
        assert nc["lon"].bounds == "lon_bounds" and nc["density"].cell_measures == "area: cell_area"
    lat, lon = ds["lat"].values, ds["lon"].values
    lat_b, lon_b = ds["lat_bounds"].values, ds["lon_bounds"].values
    print(
        f"\nlat {lat.min():.2f} .. {lat.max():.2f}, lon {lon.min():.2f} .. {lon.max():.2f}; "
        f"bounds lat {lat_b.min():.2f} .. {lat_b.max():.2f}, lon offsets up to "
        f"{np.abs(lon_b - lon[..., None]).max():.1f}"
    )
    assert (
        -90 < lat.min() < -80
        and 80 < lat.max() < 90
        and lat_b.min() == pytest.approx(-90, abs=1e-9)
    )
    assert -180 <= lon.min() < -170 and 170 < lon.max() <= 180
    assert np.abs(lon_b - lon[..., None]).max() <= 180
    # centres: the file's (panel, j, i) cell is the cubed sphere's [p, i, j]
    g = cs.cubed_sphere(8)
    la, lo = cs.lat_lon(g.centres_3d())
    assert np.allclose(lat, la.swapaxes(1, 2), atol=1e-12) and np.allclose(
        lon, lo.swapaxes(1, 2), atol=1e-12
    )
    masses = ds["mass"].values
    print(f"mass change {np.abs(masses - 1).max():.1e}")
    assert np.abs(masses - 1).max() < 1e-13
    assert float(ds["cell_area"].sum()) == pytest.approx(4 * math.pi, abs=1e-13)
    # the stored density integrates to the mass, and the moments are the grid's
    rho = from_file(ds["density"].values[-1])
    assert g.integrate(rho) == pytest.approx(masses[-1], abs=1e-15)
    assert np.allclose(ds["mean_vector"].values[-1], cs.mean(g, rho), atol=1e-15)
    assert ds.attrs["status"] == "completed" and ds.attrs["geometry"] == "sphere"
    # info, plot and particles through the command line
    code, out, _ = cli(capsys, "info", path)
    assert code == 0 and "grid run on the sphere" in out
    assert "clusters at the last snapshot" in out
    code, _, err = cli(capsys, "plot", path, "-o", tmp_path / "figs")
    assert code == 0, err
    assert (tmp_path / "figs" / "density.png").stat().st_size > 10_000
    tokens = tmp_path / "tokens.nc"
    code, _, err = cli(capsys, "particles", config, "--tokens", "400", "-o", tokens)
    assert code == 0, err
    with xr.open_dataset(tokens) as t:
        assert t["tokens"].shape == (4, 400, 3)
        assert np.abs(np.linalg.norm(t["tokens"].values, axis=-1) - 1).max() < 1e-14
        assert float((t["density"][-1] * t["cell_area"]).sum()) == pytest.approx(1.0, abs=1e-13)
    code, _, err = cli(capsys, "gaussian", config, "-o", tmp_path / "g.nc")
    assert code == 2 and "Gaussian closure" in err
    code, _, err = cli(capsys, "run", config, "-o", path)
    assert code == 2 and "--overwrite" in err


def test_simulate_returns_the_dataset():
    ds = tpde.simulate(RUN)
    assert ds["density"].shape == (4, 6, 8, 8) and ds.attrs["geometry"] == "sphere"


def test_clusters_and_noise():
    g = cs.cubed_sphere(12)
    rho = cs.mixture(g, [(0.5, [1, 0, 0], 30.0), (0.3, [0, 0, 1], 30.0), (0.2, [0, -1, -1], 40.0)])
    centres, masses = cs.clusters(g, rho)
    print(f"\nclusters: masses {np.round(masses, 4)}")
    assert masses.size == 3 and np.allclose(masses, [0.5, 0.3, 0.2], atol=2e-3)
    assert np.abs(centres @ np.array([1.0, 0, 0])).max() > 0.99
    noise = cs.noise(g, 0.2, 6, 1)
    assert g.integrate(noise) == pytest.approx(1.0, abs=1e-14)
    assert noise.min() * 4 * math.pi == pytest.approx(
        0.8, abs=1e-12
    ) or noise.max() * 4 * math.pi == pytest.approx(1.2, abs=1e-12)
    # band-limited: no zonal projection beyond l_max about any axis
    assert abs(cs.zonal_projection(g, noise, 9, [0.3, 0.4, 0.5])) < 1e-4


def test_vtk_reads_the_file_as_panels(tmp_path):
    """ParaView's reader (vtkNetCDFCFReader) loads ``(panel, j, i)`` as an image of 6 layers of
    n x n points with the density's values: readable, but not on a globe (the reader places
    cells by 1-D or 2-D latitude / longitude only; docs/user-guide.md, 'The sphere')."""
    vtk = pytest.importorskip("vtk", reason="the ParaView reader check needs vtk")
    from vtkmodules.util.numpy_support import vtk_to_numpy

    path = tmp_path / "run.nc"
    tpde.simulate(RUN.replace("snapshots = 4", "snapshots = 2"), output=path)
    vtk.vtkObject.GlobalWarningDisplayOff()
    reader = vtk.vtkNetCDFCFReader()
    reader.SetFileName(str(path))
    reader.UpdateMetaData()
    reader.UpdateInformation()
    choices = reader.GetAllDimensions()
    listed = [choices.GetValue(i) for i in range(choices.GetNumberOfValues())]
    assert "(panel, j, i)" in listed
    reader.SetDimensions("(panel, j, i)")
    reader.UpdateInformation()
    reader.Update()
    out = reader.GetOutput()
    values = vtk_to_numpy(out.GetPointData().GetArray("density"))
    with xr.open_dataset(path) as ds:
        first = ds["density"].values[0]
    print(f"\nvtkNetCDFCFReader: {out.GetClassName()} {out.GetDimensions()}, {values.size} values")
    assert out.GetDimensions() == (8, 8, 6)
    assert np.allclose(values, first.ravel(), rtol=1e-6)
