"""Figures and animations of run outputs (tpde.plots) on synthetic Datasets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import matplotlib.image as mpimg
import numpy as np
import pytest
import xarray as xr
from PIL import Image

from tpde import plots
from tpde.grid import Grid, Positions, gaussian
from tpde.io import SnapshotWriter, read

AXES = ("x", "y", "z")
CELLS = {1: (64,), 2: (36, 28), 3: (20, 16, 12)}  # non-square: catches transposed axes
LOWER = {1: (-5.0,), 2: (-4.0, -3.0), 3: (-4.0, -3.5, -3.0)}
UPPER = {1: (5.0,), 2: (4.0, 3.5), 3: (4.0, 3.0, 3.5)}
NT = 5
LEAK = 0.02  # outflow rate: mass(t) = 1 - LEAK t, outflow(t) = LEAK t


def exact_moments(d: int, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Gaussian that drifts, rotates and spreads: mean (m, d), covariance (m, d, d)."""
    t = np.atleast_1d(t)
    mean = np.outer(1.0 + 0.0 * t, 0.3 * np.arange(1, d + 1)) + np.outer(t, [0.8, -0.5, 0.3][:d])
    base = np.diag([0.6, 0.35, 0.25][:d])
    cov = np.empty((t.size, d, d))
    for k, s in enumerate(t):
        rot = np.eye(d)
        if d >= 2:
            c, sn = np.cos(0.6 * s), np.sin(0.6 * s)
            rot[:2, :2] = [[c, -sn], [sn, c]]
        cov[k] = (1.0 + 0.4 * s) * rot @ base @ rot.T
    return mean, cov


def make_dataset(d: int, nt: int = NT, title: str = "synthetic") -> xr.Dataset:
    """A run-shaped Dataset (docs/user-guide.md, 'Output files') holding a moving Gaussian with
    consistent moments."""
    names = AXES[:d]
    edges = [
        np.linspace(lo, hi, n + 1) for lo, hi, n in zip(LOWER[d], UPPER[d], CELLS[d], strict=True)
    ]
    centres = [0.5 * (e[1:] + e[:-1]) for e in edges]
    volume = float(np.prod([e[1] - e[0] for e in edges]))
    grids = np.meshgrid(*centres, indexing="ij")
    points = np.stack(grids, axis=-1)
    times = np.linspace(0.0, 1.0, nt)
    mean_t, cov_t = exact_moments(d, times)
    density = np.empty((nt, *CELLS[d]))
    mass = np.empty(nt)
    mean = np.empty((nt, d))
    cov = np.empty((nt, d, d))
    for k in range(nt):
        diff = points - mean_t[k]
        prec = np.linalg.inv(cov_t[k])
        q = np.einsum("...i,ij,...j->...", diff, prec, diff)
        rho = np.exp(-0.5 * q)
        rho *= (1.0 - LEAK * times[k]) / (rho.sum() * volume)
        density[k] = rho
        mass[k] = rho.sum() * volume
        weights = rho.reshape(-1) * volume / mass[k]
        flat = points.reshape(-1, d)
        mean[k] = weights @ flat
        centred = flat - mean[k]
        cov[k] = (centred * weights[:, None]).T @ centred
    coords = {"time": ("time", times, {"units": "1", "long_name": "time"})}
    data = {}
    for a, name in enumerate(names):
        coords[name] = (
            name,
            centres[a],
            {
                "units": "1",
                "axis": name.upper(),
                "long_name": f"cell centre {name}",
                "bounds": f"{name}_bounds",
            },
        )
        data[f"{name}_bounds"] = ((name, "nv"), np.stack([edges[a][:-1], edges[a][1:]], axis=1))
    data.update(
        {
            "density": (("time", *names), density),
            "mass": ("time", mass),
            "mean": (("time", "dim"), mean),
            "covariance": (("time", "dim", "dim2"), cov),
            "outflow": ("time", LEAK * times),
            "max_speed": ("time", np.full(nt, 1.0)),
            "dt": ("time", np.full(nt, 0.01)),
        }
    )
    attrs = {"title": title, "status": "completed", "status_time": float(times[-1]), "config": ""}
    return xr.Dataset(data, coords=coords, attrs=attrs)


def reference(d: int) -> dict[str, np.ndarray]:
    t = np.linspace(0.0, 1.0, 21)
    mean, cov = exact_moments(d, t)
    return {"time": t, "mean": mean, "covariance": cov}


def panels(fig) -> list:
    """The image axes of a figure (not its colour bar)."""
    return [ax for ax in fig.axes if ax.collections and ax.get_label() != "<colorbar>"]


def check_png(path) -> None:
    assert path.is_file() and path.stat().st_size > 5_000, path
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.01, f"{path} is uniform"


def check_animation(path) -> None:
    assert path.is_file() and path.stat().st_size > 5_000, path
    if path.suffix == ".gif":
        with Image.open(path) as image:
            assert image.n_frames > 1
    else:
        assert path.suffix == ".mp4"
        assert path.read_bytes()[4:8] == b"ftyp"


@pytest.mark.parametrize("d", [1, 2, 3])
def test_plot_all_writes_every_file(tmp_path, d):
    ds = make_dataset(d)
    written = plots.plot_all(ds, tmp_path / "figs", reference=reference(d), animate_density=True)
    names = ["density.png", "moments.png", "mass.png"] + (["projections.png"] if d == 3 else [])
    assert [p.name for p in written[:-1]] == names
    for path in written[:-1]:
        check_png(path)
    assert written[-1].stem == "density"
    check_animation(written[-1])
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == sorted(p.name for p in written)


def test_plot_all_without_reference_or_animation(tmp_path):
    written = plots.plot_all(make_dataset(2), tmp_path)
    assert [p.name for p in written] == ["density.png", "moments.png", "mass.png"]


def test_default_snapshots_and_chosen_times():
    ds = make_dataset(2, nt=9)
    fig = plots.density_figure(ds)
    images = panels(fig)
    assert len(images) == 5
    titles = [ax.get_title() for ax in images]
    assert titles[0] == "t = 0" and titles[-1] == "t = 1"
    fig = plots.density_figure(ds, times=[0.1, 0.9])
    assert [ax.get_title() for ax in panels(fig)] == ["t = 0.125", "t = 0.875"]
    few = plots.density_figure(make_dataset(1, nt=2))
    assert len(few.axes[0].lines) == 2


def test_2d_images_use_bounds_and_reference_ellipses():
    ds = make_dataset(2)
    fig = plots.density_figure(ds, times=[0.0, 1.0], reference=reference(2))
    images = panels(fig)
    assert len(images) == 2
    for ax in images:
        mesh = ax.collections[0]
        assert mesh.get_array().shape == (CELLS[2][1], CELLS[2][0])  # (y, x) on screen
        assert ax.get_xlim() == (LOWER[2][0], UPPER[2][0])
        assert ax.get_ylim() == (LOWER[2][1], UPPER[2][1])
        assert len(ax.lines) == 2  # the 1- and 2-sigma ellipses
    # the 1-sigma ellipse at t = 1 encloses the final mean and has the exact semi-axes
    xy = np.stack(images[1].lines[0].get_data())
    mean, cov = exact_moments(2, np.array([1.0]))
    assert np.allclose(xy.mean(axis=1), mean[0], atol=1e-2)
    radii = np.linalg.norm(xy - mean[0][:, None], axis=0)
    assert np.allclose([radii.min(), radii.max()], np.sqrt(np.linalg.eigvalsh(cov[0])), rtol=1e-3)
    # shared colour scale
    assert len({ax.collections[0].get_clim() for ax in images}) == 1


def test_1d_reference_and_3d_slices():
    fig = plots.density_figure(make_dataset(1), reference=reference(1))
    ax = fig.axes[0]
    assert sum(line.get_linestyle() == "--" for line in ax.lines) == NT
    fig = plots.density_figure(make_dataset(3), times=[0.5], reference=reference(3))
    images = panels(fig)
    assert len(images) == 3
    shapes = [ax.collections[0].get_array().shape for ax in images]
    nx, ny, nz = CELLS[3]
    assert shapes == [(ny, nx), (nz, nx), (nz, ny)]
    assert all(len(ax.lines) == 2 for ax in images)


def test_projection_integrates_to_mass():
    ds = make_dataset(3)
    fig = plots.projection_figure(ds, time=0.5)
    images = panels(fig)
    widths = [np.diff(plots._edges(ds, a))[0] for a in AXES]
    mass = float(ds.mass.sel(time=0.5))
    for ax, (a, b) in zip(images, plots.PLANES, strict=True):
        assert np.asarray(ax.collections[0].get_array()).sum() * widths[a] * widths[b] == (
            pytest.approx(mass, rel=1e-12)
        )
    with pytest.raises(ValueError, match="3-D"):
        plots.projection_figure(make_dataset(2))


def test_moments_log_and_reference():
    ds = make_dataset(2)
    fig = plots.moments_figure(ds, reference=reference(2), log=True)
    ax_mean, ax_eig = fig.axes
    assert ax_eig.get_yscale() == "log" and ax_mean.get_yscale() == "linear"
    assert len(ax_eig.lines) == 4 and len(ax_mean.lines) == 4
    eig = np.linalg.eigvalsh(ds.covariance.values)
    assert np.allclose(ax_eig.lines[1].get_ydata(), eig[:, 1])
    assert plots.moments_figure(ds).axes[1].get_yscale() == "linear"


def test_mass_figure_and_status_title():
    ds = make_dataset(1)
    ds.attrs.update(status="blowup", status_time=0.75)
    fig = plots.mass_figure(ds)
    assert "blowup at t = 0.75" in fig.get_suptitle()
    ax = fig.axes[0]
    assert np.allclose(ax.lines[2].get_ydata(), 1.0)  # mass + outflow is conserved here
    # its drift is round-off: said in words (with its bound), not drawn as a noisy curve
    total = ds["mass"].values + ds["outflow"].values
    drift = np.abs(total - total[0]).max()
    assert drift <= 1e-12 and not fig.axes[1].lines
    notice = [t.get_text() for t in fig.axes[1].texts]
    assert notice == [f"drift:\nzero to round-off (|.| <= {drift:.1e})"]
    ds["covariance"][-1] = np.nan  # a blow-up leaves a gap, not an exception
    eig = plots.moments_figure(ds, log=True).axes[1].lines[0].get_ydata()
    assert np.isnan(eig[-1]) and np.isfinite(eig[:-1]).all()


def test_gif_suffix_is_honoured(tmp_path):
    path = plots.animate(make_dataset(1, nt=3), tmp_path / "sub" / "movie.gif", fps=5)
    assert path == tmp_path / "sub" / "movie.gif"
    with Image.open(path) as image:
        assert image.n_frames == 3


def test_netcdf_path_round_trip(tmp_path):
    ds = make_dataset(2, nt=3)
    path = tmp_path / "run.nc"
    ds.to_netcdf(path)
    written = plots.plot_all(str(path), tmp_path / "figs")
    for p in written:
        check_png(p)
    bad = tmp_path / "bad.nc"
    ds.drop_vars("density").to_netcdf(bad)
    with pytest.raises(ValueError, match=r"bad\.nc has no 'density' variable"):
        plots.plot_all(bad, tmp_path / "none")


def test_bad_datasets():
    ds = make_dataset(2)
    with pytest.raises(ValueError, match="has no 'density' variable; is it a tpde output"):
        plots.plot_all(ds.drop_vars("density"), "unused")
    four = xr.Dataset({"density": (("time", "x", "y", "z", "w"), np.zeros((1, 2, 2, 2, 2)))})
    with pytest.raises(ValueError, match="expected"):
        plots.density_figure(four)
    for bad in (
        xr.Dataset({"density": (("time", "y"), np.zeros((2, 3)))}),
        xr.Dataset({"density": (("x",), np.zeros(3))}),
    ):
        with pytest.raises(ValueError, match="dims"):
            plots.moments_figure(bad)
    with pytest.raises(ValueError, match="reference"):
        plots.density_figure(ds, reference={"time": [0.0], "mean": [[0.0, 0.0]]})
    with pytest.raises(ValueError, match="do not match"):
        plots.density_figure(ds, reference=reference(3))


def test_no_pyplot_and_no_backend_switch(tmp_path):
    code = (
        "import sys, matplotlib; matplotlib.use('svg'); import tpde.plots as p; "
        "assert 'matplotlib.pyplot' not in sys.modules; "
        "sys.path.insert(0, 'tests'); from test_plots import make_dataset; "
        f"p.plot_all(make_dataset(1, nt=2), {str(tmp_path)!r}, animate_density=True); "
        "assert 'matplotlib.pyplot' not in sys.modules; "
        "assert matplotlib.get_backend() == 'svg'"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent.parent,
    )
    assert out.returncode == 0, out.stderr


# ---- position slices (masked attention) ------------------------------------------------------
POSITIONS = Positions(4)


def make_sliced_dataset(d: int, directory: Path, nt: int = 3) -> xr.Dataset:
    """A masked-attention run written by tpde.io and read back: density (time, s, x[, y..])
    of a Gaussian whose mean drifts with s and t."""
    grid = Grid(LOWER[d], UPPER[d], CELLS[d])
    path = directory / f"sliced{d}.nc"
    with SnapshotWriter(path, grid, title="sliced", positions=POSITIONS) as writer:
        for i, t in enumerate(np.linspace(0.0, 1.0, nt)):
            shift = np.array([0.8, -0.5, 0.3][:d])
            density = POSITIONS.sliced(
                lambda s, t=t, shift=shift: gaussian(grid, (s + 0.3 * t) * shift, 0.5 * np.eye(d)),
                grid,
            )
            writer.write(
                SimpleNamespace(
                    time=float(t), density=density, outflow=0.0, max_speed=1.0, dt=0.01 * (i + 1)
                )
            )
    return read(path)


@pytest.mark.parametrize("d", [1, 2, 3])
def test_plot_all_sliced(tmp_path, d):
    ds = make_sliced_dataset(d, tmp_path)
    assert ds["density"].dims[:2] == ("time", "s")
    written = plots.plot_all(ds, tmp_path / "figs", reference=reference(d))
    names = (
        ["density.png", "moments.png", "mass.png"]
        + (["projections.png"] if d == 3 else [])
        + ["slices.png", "position_marginal.png"]
    )
    assert [p.name for p in written] == names
    for path in written:
        check_png(path)


def test_sliced_figures_draw_marginal_and_slices(tmp_path):
    ds = make_sliced_dataset(1, tmp_path)
    marginal = ds["density"].sum("s").values
    lines = plots.density_figure(ds, times=[0.0, 1.0]).axes[0].lines
    assert np.array_equal(lines[0].get_ydata(), marginal[0])
    assert np.array_equal(lines[1].get_ydata(), marginal[-1])

    fig = plots.slices_figure(ds)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["s = 0 (sink), mass 0.1", "s = 0.5, mass 0.225", "s = 1, mass 0.225"]
    for ax, k in zip(fig.axes, [0, 2, 4], strict=True):
        assert np.array_equal(ax.lines[0].get_ydata(), ds["density"].values[-1, k])

    ax_mass, ax_mean = plots.position_marginal_figure(ds).axes
    first, last = (line.get_ydata() for line in ax_mass.lines)
    np.testing.assert_allclose(first, last, rtol=1e-12)  # the position marginal is invariant
    np.testing.assert_allclose(last, POSITIONS.weights, rtol=1e-6)
    assert np.array_equal(ax_mass.lines[0].get_xdata(), POSITIONS.s)
    np.testing.assert_allclose(ax_mean.lines[1].get_ydata(), ds["slice_mean"].values[-1, :, 0])

    # without the slice records the figures compute them from the density
    bare = ds.drop_vars(["slice_mass", "slice_mean", "slice_covariance"])
    ax_mass, ax_mean = plots.position_marginal_figure(bare).axes
    np.testing.assert_allclose(
        ax_mass.lines[1].get_ydata(), ds["slice_mass"].values[-1], rtol=1e-12
    )
    np.testing.assert_allclose(
        ax_mean.lines[1].get_ydata(), ds["slice_mean"].values[-1, :, 0], rtol=1e-10, atol=1e-12
    )


def test_slice_figures_need_positions():
    ds = make_dataset(2)
    for figure in (plots.slices_figure, plots.position_marginal_figure):
        with pytest.raises(ValueError, match="no position dimension 's'"):
            figure(ds)
