"""The sphere through the face: ``[grid] geometry = "sphere"`` configurations (tpde.sphere),
the CF NetCDF file on a globe, ``tpde info`` / ``plot`` / ``particles`` on it, and the run
against tokens."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import tpde
from tpde.config import ConfigError, build
from tpde.grid import cubed_sphere as cs
from tpde.sphere import SphereProblem, from_file, panels

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

#: A = beta I, V = I (the interaction energy's case), from (1 + a P_3(<axis, x>)) / 4 pi
BETA, MODE, AMPLITUDE = 4.0, 3, 0.2
BETA_RUN = f"""
[grid]
geometry = "sphere"
cells = 8

[initial]
kind = "uniform"
modes = [[{MODE}, {AMPLITUDE}]]
axis = [0.3, -0.5, 0.8]

[attention]
beta = {BETA}

[run]
t_end = 0.6
snapshots = 4
"""


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    tpde.set_num_threads(1)


def test_sphere_config_round_trip():
    config = build(RUN)
    problem = config.problem
    assert config.geometry == "sphere" and isinstance(problem, SphereProblem)
    assert problem.grid.n == 8
    assert problem.grid.integrate(problem.density) == pytest.approx(1.0, abs=1e-14)
    assert problem.velocity.beta is None and problem.velocity.A[0, 1] == 0.35
    assert np.allclose(problem.times, [0, 0.2, 0.4, 0.6])
    # the stored text builds the same configuration (defaults written out)
    again = build(config.text)
    assert again.text == config.text
    assert np.array_equal(again.problem.density, problem.density)
    assert np.array_equal(again.problem.velocity.A, problem.velocity.A)
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
        c = build(text).problem
        assert c.grid.integrate(c.density) == pytest.approx(check, abs=1e-14)
    uniform = build(RUN.replace(RUN[RUN.index("[initial]") : RUN.index("[attention]")], ""))
    assert np.allclose(uniform.problem.density, 1 / (4 * math.pi), rtol=1e-15)
    # the zonal mode is recovered by projection
    modes = build(
        RUN.replace(
            RUN[RUN.index("[initial]") : RUN.index("[attention]")],
            '[initial]\nkind = "uniform"\nmodes = [[3, 0.2]]\n\n',
        )
    ).problem
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
        (("A = [[1.0, 0.35, -0.2],", "A = [[1.0, 0.35],"), "attention.A: expected"),
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
    assert ds["density"].dims == ("time", "cell") and ds["lat_bounds"].dims == ("cell", "nv")
    assert ds.sizes["cell"] == 6 * 8 * 8 and ds.sizes["time"] == 4
    # xarray users get (panel, j, i) back from the cells' integer coordinates
    cube = panels(ds)
    assert cube["density"].dims == ("time", "panel", "j", "i")
    assert cube.sizes["panel"] == 6 and cube.sizes["j"] == cube.sizes["i"] == 8
    assert np.array_equal(cube["density"].values.reshape(4, -1), ds["density"].values)
    assert (
        ds["lat"].attrs["units"] == "degrees_north"
        and ds["lon"].attrs["standard_name"] == "longitude"
    )
    import netCDF4

    with netCDF4.Dataset(path) as nc:  # as stored (xarray moves "coordinates" to encoding)
        assert nc["density"].coordinates == "lat lon panel j i" and nc["lat"].bounds == "lat_bounds"
        assert nc["lon"].bounds == "lon_bounds" and nc.dimensions["time"].isunlimited()
    lat, lon = cube["lat"].values, cube["lon"].values
    lat_b, lon_b = cube["lat_bounds"].values, cube["lon_bounds"].values
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
    assert code == 0 and "grid run, the sphere S^2" in out
    assert "clusters at the last snapshot" in out
    assert "interaction energy" not in out  # a general A: no E of this form
    assert "energy_interaction" not in ds and ds["harmonic_amplitude"].dims == ("time", "degree")
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
    assert ds["density"].shape == (4, 6 * 8 * 8) and ds.attrs["geometry"] == "sphere"
    assert panels(ds)["density"].shape == (4, 6, 8, 8)


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


def _globe(path, dims: str | None):
    """ParaView's CF reader (vtkNetCDFCFReader, spherical coordinates on, as ParaView opens a
    file) with Dimensions ``dims`` chosen, or none (``None``: ParaView's default): the time
    steps and the loaded data set."""
    vtk = pytest.importorskip("vtk", reason="the ParaView reader check needs vtk")
    vtk.vtkObject.GlobalWarningDisplayOff()
    reader = vtk.vtkNetCDFCFReader()
    reader.SetFileName(str(path))
    reader.SphericalCoordinatesOn()
    reader.UpdateMetaData()
    reader.UpdateInformation()
    if dims is not None:
        choices = reader.GetAllDimensions()
        listed = [choices.GetValue(i) for i in range(choices.GetNumberOfValues())]
        assert dims in listed, listed
        reader.SetDimensions(dims)
        reader.UpdateInformation()
    info = reader.GetOutputInformation(0)
    key = vtk.vtkStreamingDemandDrivenPipeline.TIME_STEPS()
    steps = info.Get(key) if info.Has(key) else ()
    reader.Update()
    return tuple(steps or ()), reader.GetOutput()


@pytest.mark.parametrize("dims", [None, "(cell)"])
def test_paraview_reads_the_file_on_the_globe(tmp_path, dims):
    """The user guide's recipe: ParaView's "NetCDF CF" reader, spherical coordinates on (its
    default), Apply (``None``: no Dimensions chosen) or Dimensions "(cell)": an unstructured
    grid of the 6 n^2 cells, every cell the quadrilateral of its 4 corners on the unit sphere
    (the reader's p-sided cells from 1-D lat / lon with bounds), the density as cell data,
    the file's time steps."""
    from vtkmodules.util.numpy_support import vtk_to_numpy

    path = tmp_path / "run.nc"
    tpde.simulate(RUN, output=path)
    steps, out = _globe(path, dims)
    with xr.open_dataset(path) as ds:
        times, first = ds["time"].values, ds["density"].values[0]
    n, cells = 8, 6 * 8 * 8
    points = vtk_to_numpy(out.GetPoints().GetData())
    radius = np.linalg.norm(points, axis=1)
    print(
        f"\nvtkNetCDFCFReader, Dimensions {dims}: {out.GetClassName()}, "
        f"{out.GetNumberOfCells()} cells, {out.GetNumberOfPoints()} points, radius "
        f"{radius.min():.16f} .. {radius.max():.16f}, {len(steps)} time steps"
    )
    assert out.GetClassName() == "vtkUnstructuredGrid" and out.GetNumberOfCells() == cells
    np.testing.assert_array_equal(steps, times)
    assert np.abs(radius - 1).max() < 1e-14
    values = vtk_to_numpy(out.GetCellData().GetArray("density"))
    np.testing.assert_array_equal(values, first)
    # cell (p n + j) n + i is panel p's cell (i, j): its corners, counter-clockwise
    g = cs.cubed_sphere(n)
    e = g.edges
    p, j, i = np.indices(g.shape).reshape(3, -1)
    corners = np.stack(
        [cs.to_sphere(p, e[i + di], e[j + dj]) for di, dj in ((0, 0), (1, 0), (1, 1), (0, 1))],
        axis=1,
    )  # (cells, 4, 3)
    ids = vtk_to_numpy(out.GetCells().GetConnectivityArray()).reshape(cells, 4)
    placed = points[ids]  # the vertices of each cell, in the cell's order
    gap = np.abs(placed - corners).max()
    print(f"largest distance of a cell's vertex from its cubed-sphere corner {gap:.1e}")
    assert placed.shape == (cells, 4, 3) and gap < 1e-13


@pytest.mark.parametrize("text", [RUN, BETA_RUN], ids=["general", "beta"])
def test_cf_checker_finds_nothing_but_time_units(tmp_path, text):
    """compliance-checker's cf:1.10 suite on a run's file (with ``A = beta I``, ``V = I`` it
    has the energy record too): of high priority only the two findings every tpde file has
    about Transformer time's ``units = "1"`` (tests/test_formats.py says why no
    representation avoids them)."""
    runner = pytest.importorskip("compliance_checker.runner")
    path = tmp_path / "run.nc"
    tpde.simulate(text.replace("snapshots = 4", "snapshots = 2"), output=path)
    runner.CheckSuite.load_all_available_checkers()
    checker = runner.CheckSuite()
    groups, errors = checker.run_all(checker.load_dataset(str(path)), ["cf:1.10"], [])["cf:1.10"]
    assert not errors
    report = checker.build_structure("cf:1.10", groups, str(path), limit=1)
    high = [m for group in report["high_priorities"] for m in group.msgs]
    print(f"\ncf:1.10 {report['scored_points']}/{report['possible_points']}, high: {high}")
    assert sorted(high) == sorted(
        (
            "time must be in a valid units format <unit> since <epoch> not 1",
            "time does not have correct time units",
        )
    )


@pytest.mark.parametrize("text", [RUN, BETA_RUN], ids=["general", "beta"])
def test_interrupted_run_resumes_bit_for_bit(tmp_path, capsys, monkeypatch, text):
    """A sphere run writes each snapshot as it is reached; replacing an existing file
    (--overwrite) it writes ``.NAME.partial``, and an interruption (SIGINT right after the
    second snapshot) leaves the old file as it was and the partial file with two snapshots,
    status ``interrupted``. ``--resume`` continues it and replaces the old file at the end:
    the same times, densities, energies, amplitudes and step count as an uninterrupted run,
    bit for bit."""
    import os
    import signal

    import netCDF4

    from tpde.io import SnapshotWriter

    config = tmp_path / "run.toml"
    config.write_text(text)
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert cli(capsys, "run", config, "-o", full, "--quiet")[0] == 0
    cut.write_bytes(full.read_bytes())  # an earlier file that the new run replaces
    old = cut.read_bytes()
    write = SnapshotWriter.write

    def interrupting(self, *args, **kwargs):
        done = write(self, *args, **kwargs)
        if self.snapshots == 2:
            os.kill(os.getpid(), signal.SIGINT)  # held until the record is written
        return done

    monkeypatch.setattr(SnapshotWriter, "write", interrupting)
    code, _, err = cli(capsys, "run", config, "-o", cut, "--overwrite", "--quiet")
    monkeypatch.undo()
    partial = tmp_path / ".cut.nc.partial"
    assert code == 130 and "--resume" in err, err
    assert cut.read_bytes() == old and partial.is_file()
    assert not (tmp_path / ".cut.nc.lock").exists()
    with netCDF4.Dataset(partial) as nc:
        assert nc.status == "interrupted" and len(nc.dimensions["time"]) == 2, nc.status
        assert nc.status_time == pytest.approx(0.2)
    code, out, _ = cli(capsys, "info", partial)
    assert code == 0 and "status: interrupted" in out and "snapshots: 2" in out
    assert cli(capsys, "run", config, "-o", cut, "--resume", "--quiet")[0] == 0
    assert not partial.exists()
    with xr.open_dataset(cut) as resumed, xr.open_dataset(full) as reference, capsys.disabled():
        print(
            f"\nresumed from t = 0.2: max |resumed - uninterrupted| = "
            f"{float(np.abs(resumed['density'] - reference['density']).max()):.1e}; steps "
            f"{resumed.attrs['steps']} vs {reference.attrs['steps']}"
        )
        assert resumed.attrs["status"] == "completed" and "resumed" in resumed.attrs["history"]
        np.testing.assert_array_equal(resumed["time"].values, reference["time"].values)
        np.testing.assert_array_equal(resumed["density"].values, reference["density"].values)
        np.testing.assert_array_equal(resumed["mass"].values, reference["mass"].values)
        assert resumed.attrs["steps"] == reference.attrs["steps"]
        records = ["harmonic_amplitude"] + (["energy_interaction"] if text is BETA_RUN else [])
        assert sorted(records) == sorted(k for k in resumed.data_vars if k in RECORDS)
        for name in records:  # continued past the interruption, as the uninterrupted run's
            assert resumed[name].sizes["time"] == 4 and not resumed[name].isnull().any()
            np.testing.assert_array_equal(resumed[name].values, reference[name].values)
    code, _, err = cli(capsys, "run", config, "-o", cut, "--resume", "--quiet")
    assert code == 2 and "already complete" in err
    other = tmp_path / "other.toml"
    other.write_text(text.replace("t_end = 0.6", "t_end = 0.8"))
    with netCDF4.Dataset(cut, "a") as nc:  # an interrupted file of the first config
        nc.status = "interrupted"
    code, _, err = cli(capsys, "run", other, "-o", cut, "--resume", "--quiet")
    assert code == 2 and "different config" in err


RECORDS = ("energy_interaction", "harmonic_amplitude")


def test_run_records_energy_and_amplitudes(tmp_path, capsys):
    """``energy_interaction (time)`` and ``harmonic_amplitude (time, degree)``: at t = 0 the
    closed forms of ``(1 + a P_3(<axis, x>)) / 4 pi`` (Funk-Hecke: ``E = 1/(2 beta) (kappa_0 +
    kappa_3 a^2 / 7)``, ``kappa_0 = sinh(beta) / beta``; ``A_0 = 1``, ``A_3 = a``, the others
    0), then E non-decreasing (the Lyapunov function of A = beta I, V = I) and the mode
    growing; the tokens' file has their exact values."""
    from tpde.validation.s2_tokens import token_energy
    from tpde.validation.sphere_rates import funk_hecke

    config, path = tmp_path / "beta.toml", tmp_path / "beta.nc"
    config.write_text(BETA_RUN)
    code, _, err = cli(capsys, "run", config, "-o", path, "--quiet")
    assert code == 0, err
    with xr.open_dataset(path) as ds:
        ds = ds.load()
    energy, amplitude = ds["energy_interaction"], ds["harmonic_amplitude"]
    assert energy.dims == ("time",) and amplitude.dims == ("time", "degree")
    assert ds["degree"].values.tolist() == list(range(9))
    for var in (energy, amplitude, ds["degree"]):
        assert var.attrs["units"] == "1" and var.attrs["long_name"]
    assert energy.attrs["beta"] == BETA and energy.attrs["monotone"] == "increasing"
    kappa = [funk_hecke(l, BETA, 3) for l in (0, MODE)]
    assert kappa[0] == pytest.approx(math.sinh(BETA) / BETA, rel=1e-14)
    closed = (kappa[0] + kappa[1] * AMPLITUDE**2 / (2 * MODE + 1)) / (2 * BETA)
    e = energy.values
    print(f"\nE(0) {e[0]:.12g} vs {closed:.12g}; E(t) {e}; A_3(t) {amplitude.values[:, MODE]}")
    assert e[0] == pytest.approx(closed, rel=1e-6)  # n = 8 quadrature: 2e-7
    assert np.all(np.diff(e) > 0) and e[-1] < math.exp(BETA) / (2 * BETA)
    a = amplitude.values
    assert np.abs(a[:, 0] - 1).max() < 1e-8  # the nodes' quadrature of the mass
    assert a[0, MODE] == pytest.approx(AMPLITUDE, abs=1e-3)
    others = np.delete(a[0], [0, MODE])
    assert others.max() < 2e-3 and np.all(np.diff(a[:, MODE]) > 0)
    code, out, _ = cli(capsys, "info", path)
    assert code == 0 and f"(beta = 4): {e[-1]:.10g}" in out
    code, _, err = cli(capsys, "plot", path, "-o", tmp_path / "figs")
    assert code == 0, err
    assert (tmp_path / "figs" / "moments.png").stat().st_size > 10_000
    tokens = tmp_path / "tokens.nc"
    code, _, err = cli(capsys, "particles", config, "--tokens", "300", "-o", tokens)
    assert code == 0, err
    with xr.open_dataset(tokens) as t:
        x = t["tokens"].values
        assert t["energy_interaction"].values[-1] == pytest.approx(
            token_energy(x[-1], BETA), rel=1e-14
        )
        assert np.abs(t["harmonic_amplitude"].values[:, 0] - 1).max() < 1e-12


def test_info_prints_the_interaction_energy(tmp_path, capsys):
    from tpde.variants.cubed_sphere import interaction_energy

    text = RUN.split("[attention]")[0] + "[attention]\nbeta = 4.0\n\n[run]\nt_end = 0.2\n"
    config = tmp_path / "beta.toml"
    config.write_text(text + "snapshots = 2\n")
    path = tmp_path / "beta.nc"
    code, _, err = cli(capsys, "run", config, "-o", path, "--quiet")
    assert code == 0, err
    code, out, _ = cli(capsys, "info", path)
    with xr.open_dataset(path) as ds:
        rho = from_file(ds["density"].values[-1])
    energy = interaction_energy(rho, cs.cubed_sphere(8), 4.0)
    print(next(line for line in out.splitlines() if "interaction energy" in line))
    assert code == 0
    assert f"interaction energy at the last snapshot (beta = 4): {energy:.10g}" in out


def test_user_guide_snippet_reads_the_diagnostics(tmp_path, capsys):
    """The xarray snippet of docs/guide/circle-and-sphere.md ('The sphere', Diagnostics), run
    as printed on a small file of the uniform law with ``beta = 4`` (stationary):
    ``E(t) = sinh(beta) / (2 beta^2)`` at every snapshot, ``A_l = 0`` for ``l >= 1``, no
    clusters, and a W2 from the density to 300 tokens sampled from it of the order of their
    sampling noise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    guide = Path(__file__).resolve().parents[1] / "docs" / "guide" / "circle-and-sphere.md"
    section = guide.read_text().split("\n## The sphere\n")[1].split("\n## ")[0]
    snippet = section.split("```python\n")[1].split("```")[0]
    assert "energy_interaction" in snippet and "sphere_w2" in snippet
    run, tokens, config = tmp_path / "run.nc", tmp_path / "tokens.nc", tmp_path / "u.toml"
    uniform = BETA_RUN.replace(f"modes = [[{MODE}, {AMPLITUDE}]]\n", "")
    config.write_text(uniform.replace("t_end = 0.6", "t_end = 0.4"))
    assert cli(capsys, "run", config, "-o", run, "--quiet")[0] == 0
    assert cli(capsys, "particles", config, "--tokens", "300", "-o", tokens)[0] == 0
    names: dict = {}
    exec(
        snippet.replace("out/clusters_s2.nc", str(run)).replace("out/tokens.nc", str(tokens)), names
    )
    plt.close("all")
    ds = names["ds"]
    closed = math.sinh(BETA) / (2 * BETA**2)
    e, a = ds["energy_interaction"].values, ds["harmonic_amplitude"].values
    print(
        f"\nE - closed {np.abs(e - closed).max():.1e}; max A_l, l > 0: "
        f"{a[:, 1:].max():.1e}; W2 {names['w2']:.3f}"
    )
    assert e.shape == (4,) and np.abs(e / closed - 1).max() < 3e-9
    assert a.shape == (4, 9) and a[:, 1:].max() < 1e-6
    assert names["masses"].size == 0 and names["centres"].shape == (0, 3)
    assert 0.01 < names["w2"] < 0.5


#: a law a few cells wide on 6 cells a panel: the resolution monitor's ``under_resolved``
#: comes at the first step (estimate 0.8 by t = 0.6 against the tolerance 1e-3)
NARROW_RUN = """
[grid]
geometry = "sphere"
cells = 6

[initial]
kind = "von_mises_fisher"
mean = [0.0, 0.0, 1.0]
kappa = 40.0

[attention]
beta = 4.0

[scheme]
dt_max = 0.1

[run]
t_end = 0.6
snapshots = 4
"""


def test_resumed_run_keeps_the_monitor_state(tmp_path, capsys, monkeypatch):
    """A run whose ``under_resolved`` warning came before it was interrupted (SIGINT after
    two snapshots) and resumed: the warning is not given again (one in the file's events,
    as in the uninterrupted run), the resolution estimate is continued exactly (the stored
    ``monitor_state`` equals the uninterrupted run's, its estimate > the tolerance), and
    every variable is bit for bit the uninterrupted run's. Before the state was stored the
    resumed run started from estimate 0 and warned a second time."""
    import json
    import os
    import signal

    import netCDF4

    from tpde.io import SnapshotWriter
    from tpde.schemes.monitor import RESOLUTION_TOLERANCE

    config = tmp_path / "narrow.toml"
    config.write_text(NARROW_RUN)
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert cli(capsys, "run", config, "-o", full, "--quiet")[0] == 0
    write = SnapshotWriter.write

    def interrupting(self, *args, **kwargs):
        done = write(self, *args, **kwargs)
        if self.snapshots == 2:
            os.kill(os.getpid(), signal.SIGINT)  # held until the record is written
        return done

    monkeypatch.setattr(SnapshotWriter, "write", interrupting)
    assert cli(capsys, "run", config, "-o", cut, "--quiet")[0] == 130
    monkeypatch.undo()
    with netCDF4.Dataset(cut) as nc:
        assert str(nc.events).count("under_resolved") == 1, nc.events  # (before the cut)
    assert cli(capsys, "run", config, "-o", cut, "--resume", "--quiet")[0] == 0

    def contents(path):
        with netCDF4.Dataset(path) as nc:
            nc.set_auto_mask(False)
            return (
                {name: np.asarray(var[...]) for name, var in nc.variables.items()},
                str(nc.events),
                json.loads(nc.monitor_state),
            )

    (resumed, events, state), (reference, ref_events, ref_state) = contents(cut), contents(full)
    print(f"\nresumed: events {events.splitlines()}\nmonitor state {state} vs {ref_state}")
    assert events.count("under_resolved") == ref_events.count("under_resolved") == 1
    assert state == ref_state and state["resolution_warned"] is True
    assert state["reconstruction_error"] > RESOLUTION_TOLERANCE
    assert sorted(resumed) == sorted(reference)
    for name, values in reference.items():
        np.testing.assert_array_equal(resumed[name], values, err_msg=name)


@pytest.mark.slow
def test_killed_run_keeps_the_monitor_state(tmp_path, capsys):
    """As :func:`test_resumed_run_keeps_the_monitor_state` after ``kill -9`` (two records
    written): the resumed segment gives no second ``under_resolved`` (the killed segment's
    events die with it: a kill closes nothing) and ends with the uninterrupted run's
    monitor state and variables, bit for bit."""
    import json

    import netCDF4
    from exact import kill_after

    config = tmp_path / "narrow.toml"
    config.write_text(NARROW_RUN)
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert cli(capsys, "run", config, "-o", full, "--quiet")[0] == 0
    kill_after(["run", str(config), "-o", str(cut), "--threads", "1"], 2)
    assert cli(capsys, "run", config, "-o", cut, "--resume", "--quiet")[0] == 0
    with netCDF4.Dataset(cut) as a, netCDF4.Dataset(full) as b:
        a.set_auto_mask(False)
        b.set_auto_mask(False)
        print(f"\nkilled and resumed: events {str(a.events)!r}, state {a.monitor_state}")
        assert "under_resolved" not in str(a.events)
        assert json.loads(a.monitor_state) == json.loads(b.monitor_state)
        assert sorted(a.variables) == sorted(b.variables)
        for name in b.variables:
            np.testing.assert_array_equal(a[name][...], b[name][...], err_msg=name)
