"""Every plot kind, rendered on small grids and read as a figure is read: no text leaves the
figure, no two tick labels of an axis overlap, every image has its colour bar, quantities
that are zero to round-off are said to be (not drawn as noise), reference curves are drawn
on top of the run's, and no matplotlib warning is raised (tpde.plots, tpde.circle_plots,
tpde.sphere_plots, tpde.validation.suite's figures, tpde.sweep's phase diagram, xarray's default
plot of a tpde file)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import xarray as xr
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import QuadMesh
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

import tpde
import tpde.io as io
from tpde.grid import Grid, gaussian
from tpde.variants.energies import Energy

pytestmark = pytest.mark.filterwarnings("error")  # a warning of matplotlib fails the test

TIMES = (0.0, 0.5, 1.0, 1.5)
#: pixels a text may overhang the figure or another text (anti-aliasing)
SLACK = 0.5
#: pixels (at the figure's dpi) between two tick labels of one axis, below which they read
#: as one ("3x10^24x10^2" in validate's mean_field.png before)
TICK_GAP = 2.0
#: the longest long_name a file holds (xarray's labels: longer ones were clipped)
LONG_NAME = 40


# ---- what a drawn figure shows --------------------------------------------------------------
def _texts(fig: Figure) -> list[tuple[str, object]]:
    """(text, window box) of everything a drawn figure writes: (sub)figure titles and
    labels, axes titles, labels and texts, offset texts, legends, the tick labels in view."""
    renderer = fig.canvas.get_renderer()
    out: list[tuple[str, object]] = []

    def add(artist, name: str | None = None) -> None:
        if artist is None or not artist.get_visible():
            return
        if hasattr(artist, "get_text") and not artist.get_text().strip():
            return
        box = artist.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            out.append((name or artist.get_text(), box))

    for figure in (fig, *fig.subfigs):
        for attr in ("_suptitle", "_supxlabel", "_supylabel"):
            add(getattr(figure, attr, None))
        for text in figure.texts:
            add(text)
        for legend in figure.legends:
            add(legend, "figure legend")
    for ax in fig.get_axes():
        if not ax.get_visible():
            continue
        for text in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label):
            add(text)
        for text in ax.texts:
            add(text)
        if ax.axison:
            for axis in (ax.xaxis, ax.yaxis):
                for label in _tick_labels(axis):
                    add(label)
                add(axis.offsetText)
        add(ax.get_legend(), "legend")
    return out


def _tick_labels(axis) -> list:
    """The drawn tick labels of an axis (major and minor ticks inside the view)."""
    labels = []
    for tick in axis._update_ticks():
        if tick.get_visible():
            labels += [
                label
                for label in (tick.label1, tick.label2)
                if label.get_visible() and label.get_text()
            ]
    return labels


def _overlap(a, b, gap: float = -SLACK) -> bool:
    """Whether two boxes overlap, or come closer than ``gap`` pixels."""
    dx = min(a.x1, b.x1) - max(a.x0, b.x0)
    dy = min(a.y1, b.y1) - max(a.y0, b.y0)
    return dx > -gap and dy > -gap


def problems(fig: Figure) -> list[str]:
    """What a reader would stumble on in ``fig``: a text cut by the figure's edge, two tick
    labels of one axis on top of each other, an image without a colour bar."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    fig.canvas.draw()  # (the layout settles in a second pass, as savefig does)
    width, height = fig.bbox.width, fig.bbox.height
    found = []
    for name, box in _texts(fig):
        if box.x0 < -SLACK or box.y0 < -SLACK or box.x1 > width + SLACK or box.y1 > height + SLACK:
            found.append(f"clipped by the figure's edge: {name!r}")
    renderer = fig.canvas.get_renderer()
    for ax in fig.get_axes():
        if not (ax.get_visible() and ax.axison):
            continue
        for axis in (ax.xaxis, ax.yaxis):
            labels = _tick_labels(axis)
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels]
            for i, (a, box_a) in enumerate(boxes):
                for b, box_b in boxes[i + 1 :]:
                    if _overlap(box_a, box_b, TICK_GAP):
                        found.append(f"tick labels overlap: {a!r} / {b!r}")
    for ax in fig.get_axes():  # a note written in axes coordinates stays in its axes
        frame = ax.get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            inside = box.x0 >= frame.x0 - SLACK and box.x1 <= frame.x1 + SLACK
            if text.get_transform() == ax.transAxes and not inside:
                found.append(f"a note runs out of its axes: {text.get_text()!r}")
    found += _missing_colour_bars(fig)
    return found


def _missing_colour_bars(fig: Figure) -> list[str]:
    """Images (meshes, imshow) whose colour scale no colour bar of the figure shows."""
    images = [
        artist
        for ax in fig.get_axes()
        for artist in (*ax.collections, *ax.images)
        if isinstance(artist, QuadMesh | AxesImage) and ax.get_visible()
    ]
    shown = {id(image.norm) for image in images if getattr(image, "colorbar", None) is not None}
    return [
        f"image without a colour bar in {image.axes.get_title()!r}"
        for image in images
        if id(image.norm) not in shown
    ]


def all_text(fig: Figure) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))


# ---- small files of every kind --------------------------------------------------------------
def _run(path: Path, grid: Grid, mean, energies=None, frame: bool = False) -> Path:
    """A run file: a Gaussian contracting about ``mean``, optionally in a co-moving frame
    of its own per snapshot, with the energy records ``energies(t)``."""
    from tpde.schemes.frame import AffineFrame

    d = grid.ndim
    writer = io.SnapshotWriter(
        path,
        grid,
        config_text="x",
        energies=None if energies is None else (lambda rho, t: energies(t)),
    )
    for i, t in enumerate(TIMES):
        cov = np.diag(np.linspace(0.9, 0.6, d)) * (1.0 - 0.15 * i)
        snap = SimpleNamespace(
            time=t, density=gaussian(grid, mean, cov), outflow=0.0, max_speed=1.0, dt=0.1
        )
        if frame:
            snap.frame = AffineFrame(np.zeros(d), [[1.0 + 0.3 * i, 0.2 * i], [0.0, 0.9]])
        writer.write(snap)
    writer.close("completed", TIMES[-1])
    return path


def _energies(t: float) -> dict[str, Energy]:
    """A trace Lyapunov function near 1 and an interaction energy near 1e8, 1e8 apart."""
    return {
        "trace_lyapunov": Energy(1.4 - 0.2 * t, "decreasing", "trace", "tr(V^-1 Sigma)"),
        "interaction": Energy(1e8 * (1.0 + 0.01 * t), "none", "interaction", "E"),
    }


CIRCLE = """
[grid]
geometry = "circle"
cells = 64

[initial]
kind = "noise"
amplitude = 1e-3
k_max = 12
seed = 1

[attention]
beta = 16.0

[run]
t_end = 12.0
snapshots = 7
"""

SPHERE = """
[grid]
geometry = "sphere"
cells = 6

[initial]
kind = "noise"
amplitude = 1e-3
l_max = 4
seed = 0

[attention]
beta = 8.0

[scheme]
velocity_at = "centres"

[run]
t_end = 1.0
snapshots = 3
output = "{output}"
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("figures")
    box = Grid([-4.0, -3.5], [4.5, 3.0], [24, 20])
    centred = Grid([-5.0, -5.0], [5.0, 5.0], [24, 24])  # the mean stays 0 to round-off
    out = {
        "flat": _run(folder / "flat.nc", box, [0.4, -0.3], _energies),
        "flat_ode": _run(folder / "flat_ode.nc", box, [0.35, -0.25]),
        "frame": _run(folder / "frame.nc", centred, [0.0, 0.0], frame=True),
        "line": _run(folder / "line.nc", Grid([-5.0], [5.0], [60]), [0.5]),
        "cube": _run(folder / "cube.nc", Grid([-4.0] * 3, [4.0] * 3, [10, 9, 8]), [0.2, 0.0, -0.1]),
    }
    tpde.set_num_threads(1)
    circle = tpde.simulate(CIRCLE)
    out["circle"] = folder / "circle.nc"
    circle.to_netcdf(out["circle"])
    from tpde.cli import main

    out["sphere"] = folder / "sphere.nc"
    config = folder / "sphere.toml"
    config.write_text(SPHERE.format(output=out["sphere"]))
    assert main(["run", str(config), "--quiet"]) == 0
    return out


# ---- the figures ----------------------------------------------------------------------------
def test_flat_run_figures(files, tmp_path):
    from tpde import plots

    written = plots.plot_all(files["flat"], tmp_path / "flat")
    assert [p.name for p in written] == ["density.png", "moments.png", "mass.png", "energies.png"]
    with xr.open_dataset(files["flat"]) as ds:
        for make in (
            plots.density_figure,
            plots.moments_figure,
            plots.mass_figure,
            plots.energies_figure,
        ):
            fig = make(ds)
            assert problems(fig) == [], make.__name__
        mass = ds["mass"].values
        print(f"\nflat: mass drift {np.ptp(mass):.2e} (the Gaussians' tails the box cuts)")
        assert "round-off" not in all_text(plots.mass_figure(ds))
        # a conservative scheme's mass: constant up to a few ulps
        ulps = 1.0 + np.array([0.0, 2.2e-16, -4.4e-16, 1.1e-16])
        conserved = ds.assign(mass=("time", ulps), outflow=("time", np.zeros(4)))
        fig = plots.mass_figure(conserved)
        assert problems(fig) == [] and "drift:\nzero to round-off (|.| <= 4.4e-16)" in all_text(fig)
    for name in ("line", "cube"):
        assert problems(plots.density_figure(files[name])) == [], name
    assert problems(plots.projection_figure(files["cube"])) == []


def test_round_off_is_said_not_drawn(files):
    """The frame run's mean is 0 to 1e-16: no curve, a notice; the flat run's mean is not."""
    from tpde import plots

    with xr.open_dataset(files["frame"]) as ds:
        top = float(np.abs(ds["mean_position"].values).max())
        spread = math.sqrt(float(np.trace(ds["covariance"].values, axis1=1, axis2=2).max()))
        print(f"\nframe run: max |mean| {top:.2e}, spread {spread:.3f}")
        assert top <= plots.ROUNDOFF * spread
        fig = plots.moments_figure(ds)
    assert problems(fig) == []
    ax_mean = fig.axes[0]
    assert not ax_mean.lines and "mean x, mean y:\nzero to round-off (|.| <= " in all_text(fig)
    fig = plots.moments_figure(files["flat"])
    assert len(fig.axes[0].lines) == 2 and "round-off" not in all_text(fig)


def test_reference_curves_are_drawn_on_top(files):
    from tpde import plots

    with xr.open_dataset(files["flat_ode"]) as ref:
        reference = {k: ref[v].values for k, v in (("time", "time"), ("mean", "mean_position"))}
        reference["covariance"] = ref["covariance"].values
    fig = plots.moments_figure(files["flat"], reference=reference)
    assert problems(fig) == []
    for ax in fig.axes[:2]:
        runs = [line for line in ax.lines if line.get_linestyle() == "-"]
        refs = [line for line in ax.lines if line.get_linestyle() == "--"]
        assert runs and refs
        assert min(r.get_zorder() for r in refs) > max(r.get_zorder() for r in runs)
        assert all(r.get_marker() not in ("", "None", None) for r in refs)


def test_energies_say_what_they_are(files):
    from tpde import plots

    fig = plots.energies_figure(files["flat"])
    assert problems(fig) == []
    titles = [ax.get_title() for ax in fig.axes]
    print("\n" + "\n".join(titles))
    assert titles[0] == "trace Lyapunov function\n(the theory: never increases)"
    assert titles[1].startswith("interaction energy\n(the theory: no monotonicity")
    assert fig.axes[0].get_ylabel() == "tr(V^-1 Sigma)"


def test_frame_run_figures_and_physical_density(files, tmp_path):
    from tpde import plots

    plots.plot_all(files["frame"], tmp_path / "frame")
    for frame_space in (False, True):
        assert problems(plots.density_figure(files["frame"], frame_space=frame_space)) == []
    ds = io.read(files["frame"])
    assert ds["density"].attrs["long_name"] == "density per frame-coordinate volume"
    physical = io.physical_density(ds)
    jacobian = ds["frame_jacobian"].values
    np.testing.assert_allclose(physical.values[-1], ds["density"].values[-1] / jacobian[-1])
    # mass in physical space: sum(physical density * |det L| * frame cell area) = the mass
    area = float(np.prod(io.grid_from_dataset(ds).spacing))
    mass = float(physical.values[-1].sum()) * jacobian[-1] * area
    assert mass == pytest.approx(float(ds["mass"].values[-1]), rel=1e-12)
    assert io.physical_density(io.read(files["flat"])).name == "density"  # no frame: itself


def _xarray_label_fits(data: xr.DataArray, **kwargs) -> tuple[str, str]:
    fig = Figure(figsize=(6.4, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    data.plot(ax=ax, **kwargs)
    fig.tight_layout()
    assert problems(fig) == []
    return ax.get_xlabel(), fig.axes[-1].get_ylabel()


def test_xarray_default_plots_read(files):
    """``ds.density.isel(time=-1).plot()`` (and the frame's physical density): labels that
    fit in the figure, no "[1]" on the density."""
    ds = io.read(files["flat"])
    xlabel, bar = _xarray_label_fits(ds["density"].isel(time=-1))
    print(f"\nflat: x {xlabel!r}, colour bar {bar!r}")
    assert bar == "token density (cell averages)" and "\n" not in xlabel  # (xarray wraps at 30)
    ds = io.read(files["frame"])
    xlabel, bar = _xarray_label_fits(
        io.physical_density(ds).isel(time=-1), x="physical_x", y="physical_y"
    )
    print(f"frame: x {xlabel!r}, colour bar {bar!r}")
    assert bar == "token density (physical space)" and xlabel == "physical x of the cell centre"
    from tpde.variants.energies import DESCRIPTIONS

    names = {name: ds[name].attrs.get("long_name", "") for name in ds.variables}
    names.update({f"energy_{k}": v[0] for k, v in DESCRIPTIONS.items()})
    long = {name: text for name, text in names.items() if len(text) > LONG_NAME}
    assert long == {}


def test_compare_figure(files):
    from tpde import plots

    fig = plots.compare_figure(files["flat"], gaussian=files["flat_ode"])
    assert problems(fig) == []
    (ax_energy,) = [ax for ax in fig.axes if ax.get_title().startswith("energies of the grid run")]
    curves = {line.get_label(): np.asarray(line.get_ydata()) for line in ax_energy.lines}
    print(f"\nrelative changes at t = 1.5: { {k: v[-1] for k, v in curves.items()} }")
    # (E(t) - E(0)) / |E(0)|: 1.4 - 0.2 t and 1e8 (1 + 0.01 t) on one readable axis
    assert curves["trace Lyapunov function"][-1] == pytest.approx(-0.3 / 1.4, rel=1e-12)
    assert curves["interaction energy"][-1] == pytest.approx(0.015, rel=1e-9)
    (ax_mean,) = [ax for ax in fig.axes if ax.get_title().startswith("mean (colour")]
    assert len(ax_mean.lines) == 4 and "round-off" not in all_text(fig)
    fig = plots.compare_figure(files["frame"])  # its mean: 0 to round-off
    assert problems(fig) == []
    (ax_mean,) = [ax for ax in fig.axes if ax.get_title().startswith("mean (colour")]
    assert not ax_mean.lines and "mean of the grid run:\nzero to round-off" in all_text(fig)


def test_circle_figures(files, tmp_path):
    from tpde import circle_plots, plots

    written = plots.plot_all(files["circle"], tmp_path / "circle")
    assert [p.name for p in written][:2] == ["density.png", "moments.png"]
    fig = circle_plots.snapshots_figure(files["circle"])
    assert problems(fig) == []
    panels = [ax for ax in fig.axes if ax.lines]
    assert len(panels) == circle_plots.SNAPSHOTS  # stacked: none hidden behind another
    fig = circle_plots.order_figure(files["circle"])
    assert problems(fig) == []
    series = circle_plots.circle_series(files["circle"])
    theta, rho = series["theta"], series["density"]
    h = theta[1] - theta[0]
    order = np.abs((rho * np.exp(1j * theta)).sum(axis=1) * h) / (rho.sum(axis=1) * h)
    drawn = np.asarray(fig.axes[0].lines[0].get_ydata())
    print(f"\norder parameter: {np.round(order, 5)}")
    np.testing.assert_allclose(drawn, order, rtol=1e-3, atol=1e-12)  # (cell-average filter)
    assert problems(circle_plots.space_time_figure(files["circle"])) == []


def test_sphere_figures(files):
    from tpde import sphere_plots

    ds = io.read(files["sphere"])
    assert problems(sphere_plots.density_map_figure(ds)) == []
    assert problems(sphere_plots.moments_figure(ds)) == []


def test_validation_figures(tmp_path):
    """tpde validate's figures on made-up numbers: log axes over less than a decade, whose
    minor tick labels ran into one another."""
    from tpde.validation import suite as validate

    times = np.linspace(0.0, 0.25, 6)
    covs = np.array([np.diag([0.8 - t, 0.5 - 0.5 * t]) for t in times])
    refinement = SimpleNamespace(
        times=times, ode_covariances=covs, grid_covariances=list(covs * 1.001), cells=[32, 64]
    )
    tokens = {"times": times, "covariances": covs * 0.999, "tokens": 256}
    fig = validate.covariance_figure(tmp_path / "covariance.png", refinement, tokens)
    assert problems(fig) == []
    study = {"n": [250, 1000, 4000], "distances": [0.057, 0.038, 0.0145], "slope": -0.49}
    fig = validate.mean_field_figure(tmp_path / "mean_field.png", {"1-D two bumps": study})
    assert problems(fig) == []


def test_sweep_phase_diagram():
    from tpde.sweep import phase_figure

    keys = ["attention.scale", "scheme.reconstruction"]
    scale = np.array([2.0, 0.5, 1.0] * 2)
    summary = xr.Dataset(
        {
            "attention.scale": ("run", scale),
            "scheme.reconstruction": ("run", np.array(["weno5z"] * 3 + ["muscl"] * 3)),
            "outcome": ("run", np.array(["converged", "blowup", "converged"] * 2)),
            "rank": ("run", np.array([2, -1, 1] * 2)),
        },
        attrs={"parameters": __import__("json").dumps(keys), "phase_x": keys[0]},
    )
    assert problems(phase_figure(summary)) == []


# ---- atoms over the density, and the staircase of grid plus atoms beside tokens ----------------
CIRCLE_ATOMS = """
[grid]
geometry = "circle"
cells = 128
[initial]
kind = "mixture"
weights = [0.5, 0.4]
means = [1.0, 1.7]
kappas = [200, 200]
[attention]
beta = 9.0
engine = "fft"
[atoms]
width = 2.0
[run]
t_end = 1.2
snapshots = 5
output = "{output}"
"""

SPHERE_ATOMS = """
[grid]
geometry = "sphere"
cells = 8
[initial]
kind = "mixture"
weights = [0.5, 0.4, 0.1]
means = [[1.0, 0.2, 0.1], [0.8, 0.7, 0.0], [0.0, 0.0, 1.0]]
kappas = [60.0, 60.0, 1.0]
[attention]
beta = 4.0
[scheme]
velocity_at = "centres"
[run]
t_end = 0.5
snapshots = 2
output = "{output}"
[atoms]
"""


@pytest.fixture(scope="module")
def sphere_atoms(tmp_path_factory) -> Path:
    """A sphere run with atoms: 8 cells a panel, two atoms born at t = 0.07, to t = 0.5."""
    from tpde.cli import main

    folder = tmp_path_factory.mktemp("sphere_atoms")
    config = folder / "atoms.toml"
    config.write_text(SPHERE_ATOMS.format(output=folder / "atoms.nc"))
    assert main(["run", str(config), "--quiet"]) == 0
    return folder / "atoms.nc"


def test_sphere_map_draws_the_atoms(sphere_atoms):
    """Each map panel of a sphere run with atoms draws one marker per atom of its record,
    at the atom's direction (against its stored unit vector), of area proportional to its
    mass, the wider spreads as circles of angular radius sqrt(1 / kappa), named in a
    legend."""
    from tpde import sphere_plots

    ds = io.read(sphere_atoms)
    fig = sphere_plots.density_map_figure(ds)
    assert problems(fig) == []
    maps = [ax for ax in fig.axes if ax.name == "mollweide"]
    assert len(maps) == ds.sizes["time"] == 2
    for k, ax in enumerate(maps):
        ids = np.nan_to_num(ds["atom_id"].values[k], nan=-1)
        used = ids >= 0
        centre = ds["atom_centre"].values[k][used]
        mass = ds["atom_mass"].values[k][used]
        spread = ds["atom_spread"].values[k][used]
        discs = [c for c in ax.collections if "atom" in str(c.get_label())]
        print(f"\nrecord {k}: {int(used.sum())} atoms, masses {np.round(mass, 4)}, "
              f"spread radii {np.round(np.degrees(np.sqrt(spread)), 2)} degrees")  # fmt: skip
        if not used.any():
            assert discs == [] and ax.get_legend() is None
            continue
        (disc,) = discs
        offsets = np.asarray(disc.get_offsets())
        assert offsets.shape == (used.sum(), 2)  # one marker per atom
        lon = np.arctan2(centre[:, 1], centre[:, 0])
        lat = np.arcsin(np.clip(centre[:, 2], -1.0, 1.0))
        np.testing.assert_allclose(offsets, np.stack([lon, lat], -1), rtol=0, atol=1e-12)
        np.testing.assert_allclose(disc.get_sizes(), sphere_plots.ATOM_MARKER_AREA * mass)
        wide = np.degrees(np.sqrt(spread)) >= sphere_plots.SPREAD_LEGIBLE_DEG
        rings = [line for line in ax.lines if line.get_linestyle() == "--"]
        assert len(rings) == int(wide.sum())
        for ring, c, s in zip(rings, centre[wide], spread[wide], strict=True):
            x, y = (np.asarray(v, float) for v in (ring.get_xdata(), ring.get_ydata()))
            keep = np.isfinite(x)
            points = np.stack([np.cos(y) * np.cos(x), np.cos(y) * np.sin(x), np.sin(y)], -1)
            angle = np.arccos(np.clip(points[keep] @ c, -1.0, 1.0))
            np.testing.assert_allclose(angle, np.sqrt(s), rtol=1e-9)  # the angular radius
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend[0] == f"{int(used.sum())} atoms (area ~ mass)"
    assert "cells plus 2 atoms" in maps[-1].get_title()


def test_sphere_moments_and_compare_with_atoms(sphere_atoms, tmp_path):
    """The file's second moment of cells plus atoms: the cells' plus each atom's vMF
    moment, against a Gauss-Legendre quadrature of ``int t^2 e^{kappa t} dt`` (``t = x.a``),
    trace 1; ``tpde compare`` against two token seeds draws the staircase (the recorded
    energies over a point mass's) and the clusters of grid plus atoms beside each seed's."""
    from tpde import sphere_plots
    from tpde.cli import main
    from tpde.grid import cubed_sphere as cs
    from tpde.sphere import from_file, grid_of

    ds = io.read(sphere_atoms)
    grid = grid_of(ds)
    nodes, weights = np.polynomial.legendre.leggauss(200)
    for k in range(ds.sizes["time"]):
        cells = cs.second_moment(grid, from_file(ds["density"].values[k]))
        expected = cells.copy()
        used = np.nan_to_num(ds["atom_id"].values[k], nan=-1) >= 0
        for m, a, s in zip(ds["atom_mass"].values[k][used], ds["atom_centre"].values[k][used],
                           ds["atom_spread"].values[k][used], strict=True):  # fmt: skip
            density = np.exp((nodes - 1.0) / s)
            along = float(weights @ (nodes**2 * density) / (weights @ density))
            a = a / np.linalg.norm(a)
            expected += m * (
                along * np.outer(a, a) + 0.5 * (1.0 - along) * (np.eye(3) - np.outer(a, a))
            )
        recorded = ds["second_moment"].values[k]
        print(f"\nrecord {k}: trace {np.trace(recorded):.8f}, mass {float(ds['mass'][k]):.8f}")
        np.testing.assert_allclose(recorded, expected, rtol=0, atol=1e-13)
        assert abs(np.trace(recorded) - float(ds["mass"][k])) < 1e-4  # (the cells' quadrature)
    seeds = []
    config = tmp_path / "atoms.toml"
    config.write_text(SPHERE_ATOMS.format(output=tmp_path / "unused.nc"))
    for seed in (0, 1):
        seeds.append(tmp_path / f"tokens{seed}.nc")
        args = ["particles", str(config), "--tokens", "50", "--seed", str(seed)]
        assert main([*args, "-o", str(seeds[-1])]) == 0
    fig = sphere_plots.compare_figure(ds, [io.read(p) for p in seeds])
    assert problems(fig) == []
    (ax_s,) = [ax for ax in fig.axes if ax.get_title().startswith("energy staircase")]
    (ax_c,) = [ax for ax in fig.axes if ax.get_title().startswith("clusters")]
    assert [line.get_label() for line in ax_s.lines] == [
        "grid + atoms", "tokens n = 50 (seed 0)", "tokens n = 50 (seed 1)"
    ]  # fmt: skip
    point = math.exp(4.0) / 8.0
    np.testing.assert_allclose(ax_s.lines[0].get_ydata(), ds["energy_interaction"].values / point,
                               rtol=1e-14)  # fmt: skip
    counts = np.asarray(ax_c.lines[0].get_ydata())
    print(f"clusters of grid plus atoms: {counts}; energies {ax_s.lines[0].get_ydata()}")
    assert counts[-1] >= 1


def test_circle_compare_staircase_with_atoms(tmp_path):
    """``tpde compare`` of a circle run with atoms (128 cells, two atoms born by t = 0.1)
    against 500 mid-quantile tokens: the energy staircase is the file's record over a point
    mass's ``e^beta / (2 beta)`` for the grid plus atoms and the tokens' double sum for the
    tokens (both against an independent evaluation), the two within 2e-3 of a point mass's;
    the clusters of cells plus atoms equal the tokens' at every record (the cells alone,
    counted against their own residual mass, do not); the run's density, order and ``W_1``
    are of cells plus atoms (unit mass; ``W_1`` to the tokens a tenth or less of the cells'
    residual's, which the unit-mass normalisation of ``W_1`` would blow up)."""
    from tpde import circle_plots
    from tpde.cli import main
    from tpde.grid.circle import clusters
    from tpde.validation.circle_metastability import token_energy
    from tpde.validation.metrics import wasserstein_circle

    grid = circle_plots.circle_grid(128)
    run, tokens = tmp_path / "run.nc", tmp_path / "tokens.nc"
    config = tmp_path / "atoms.toml"
    config.write_text(CIRCLE_ATOMS.format(output=run))
    assert main(["run", str(config), "--quiet"]) == 0
    assert (
        main(["particles", str(config), "--tokens", "500", "--quantiles", "-o", str(tokens)]) == 0
    )
    target = tmp_path / "compare.png"
    assert main(["compare", str(run), str(tokens), "-o", str(target)]) == 0 and target.is_file()
    fig = circle_plots.compare_figure(run, [tokens])
    assert problems(fig) == []
    (ax_e,) = [ax for ax in fig.axes if ax.get_title().startswith("energy staircase")]
    (ax_c,) = [ax for ax in fig.axes if ax.get_title().startswith("clusters")]
    curves = {line.get_label(): np.asarray(line.get_ydata(), float) for line in ax_e.lines}
    assert set(curves) == {"grid + atoms", "tokens n = 500 (mid-quantiles)"}
    point = math.exp(9.0) / 18.0
    with xr.open_dataset(run) as a, xr.open_dataset(tokens) as b:
        recorded = a["energy_interaction"].values / point
        cells_only = [clusters(rho, circle_plots.circle_grid(128))[0].size
                      for rho in a["density"].values]  # fmt: skip
        theta = b["tokens"].values[..., 0]
    direct = np.array([token_energy(x, 9.0, method="direct") for x in theta]) / point
    np.testing.assert_allclose(curves["grid + atoms"], recorded, rtol=1e-14)
    np.testing.assert_allclose(curves["tokens n = 500 (mid-quantiles)"], direct, rtol=1e-10)
    gap = np.abs(recorded - direct)
    print(f"\nE / point mass, grid + atoms: {np.round(recorded, 5)}; tokens: {np.round(direct, 5)}")
    print(f"largest gap {gap.max():.2e}")
    assert gap.max() < 2e-3
    steps = {line.get_label(): np.asarray(line.get_ydata()) for line in ax_c.lines}
    print(f"clusters: {steps}; the cells alone: {cells_only}")
    np.testing.assert_array_equal(steps["grid + atoms"], steps["tokens n = 500 (mid-quantiles)"])
    assert steps["grid + atoms"][-1] == 2 and cells_only[-1] != 2
    whole = circle_plots.cells_plus_atoms(run)
    h = 2.0 * math.pi / 128
    with xr.open_dataset(run) as a, xr.open_dataset(tokens) as b:
        total = a["mass"].values + np.nansum(a["atom_mass"].values, axis=1)
        cells, histogram = a["density"].values, b["density"].values
    np.testing.assert_allclose(whole.sum(axis=1) * h, total, rtol=0, atol=1e-13)
    np.testing.assert_allclose(total, 1.0, rtol=0, atol=1e-13)
    (ax_w,) = [ax for ax in fig.axes if ax.get_title().startswith("distance")]
    drawn = np.asarray(ax_w.lines[0].get_ydata(), float)
    residual = np.array([wasserstein_circle(histogram[i], cells[i], grid) for i in range(5)])
    print(f"W_1 to the tokens: cells plus atoms {np.round(drawn, 5)}, the cells alone "
          f"{np.round(residual, 4)}")  # fmt: skip
    assert np.all(drawn[1:] <= 0.1 * residual[1:])
    with xr.open_dataset(tokens) as b:
        other = b.load()
    other.attrs["config"] = str(other.attrs["config"]).replace("beta = 9.0", "beta = 8.0")
    with pytest.raises(ValueError, match="beta = 8"):
        circle_plots.compare_figure(run, [other])
    alone = circle_plots.compare_figure(run, [])  # (no token file: the run's curves alone)
    assert problems(alone) == []
