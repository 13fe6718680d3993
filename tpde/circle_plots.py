"""Figures of a run on the circle (``geometry = "circle"`` files; :mod:`tpde.circle`).

``space_time_figure``: the density over angle and time (clusters forming from noise);
``ring_figure``: snapshots drawn around the circle with the clusters marked;
``modes_figure``: the Fourier mode amplitudes ``|c_k(t)|`` and the interaction energy;
``snapshots_figure``: density snapshots in stacked panels (``tpde plot``'s ``density.png`` of a
circle run: overlaid on one axes, the later ones hid the earlier); ``order_figure``: the order
parameter ``|<e^{i theta}>|``, the first mode amplitudes and the cluster count against time
(``moments.png``: the mean and variance of an angle mean little on the circle).
``compare_figure``: a grid run against one or several token runs (``tpde compare`` on the
circle; several seeds drawn as a band; with the energy staircase and the cluster count of
grid plus atoms beside each token file's). ``circle_figures`` writes the first three. The
reading helpers take a Dataset or a path of a tpde output.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from tpde.grid.circle import (
    TWO_PI,
    atoms_on_cells,
    circle_grid,
    clusters,
    fourier_modes,
    full_circle,
    order_parameter,
)
from tpde.validation.figure_data import common_times

from . import geometries
from .plots import band, new_figure, staircase_panels

__all__ = [
    "cells_plus_atoms",
    "circle_figures",
    "circle_series",
    "compare_figure",
    "compare_runs",
    "config_beta",
    "grid_staircase",
    "modes_figure",
    "order_figure",
    "plot_figures",
    "ring_figure",
    "snapshots_figure",
    "space_time_figure",
    "token_staircase",
]

DPI = 150
#: snapshots in the stacked density figure (the first and the last among them)
SNAPSHOTS = 5
#: mode amplitudes drawn in the order figure (k = m, 2m, ..: the first ones)
FIRST_MODES = 4
#: a snapshot whose density / uniform varies by less than this is drawn around 1, not from 0
NEARLY_UNIFORM = 0.5
#: the clusters of tokens are counted on their histogram at this many cells (coarse enough
#: that the sampling noise of i.i.d. tokens stays below the threshold; the metastability
#: study's count, tpde.validation.circle_metastability)
TOKEN_COUNT_CELLS = 128


def _angle_ticks(ax) -> None:
    ax.set_xlim(0.0, TWO_PI)
    ax.set_xticks(np.linspace(0.0, TWO_PI, 5), ["0", "pi/2", "pi", "3pi/2", "2pi"])


def _dataset(ds: xr.Dataset | str | os.PathLike[str]) -> xr.Dataset:
    if isinstance(ds, str | os.PathLike):
        with xr.open_dataset(Path(ds)) as opened:
            return opened.load()
    return ds


def circle_series(ds: xr.Dataset | str | os.PathLike[str]) -> dict[str, Any]:
    """The arrays of a circle run: ``time``, ``theta`` (cell centres), ``density``
    (time, cells), ``copies`` and the grid."""
    ds = _dataset(ds)
    if not geometries.is_a(ds, "circle"):
        raise ValueError("plot: not a run on the circle (no geometry = 'circle' attribute)")
    copies = int(ds.attrs.get("circle_copies", 1))
    density = np.asarray(ds["density"].values, float)
    return {
        "time": np.asarray(ds["time"].values, float),
        "theta": np.asarray(ds["x"].values, float),
        "density": density,
        "copies": copies,
        "grid": circle_grid(density.shape[-1], copies),
        "title": " ".join(str(ds.attrs.get("title", "")).split())[:80].replace("$", r"\$"),
        "energy": (
            np.asarray(ds["energy_interaction"].values, float)
            if "energy_interaction" in ds
            else None
        ),
    }


def cells_plus_atoms(ds: xr.Dataset | str | os.PathLike[str]) -> np.ndarray:
    """The cell averages ``(time, cells)`` of the whole measure of a circle file: its
    ``density`` plus, in a run with atoms, each atom's wrapped normal averaged over the cells
    (:func:`tpde.grid.circle.atoms_on_cells`). The file's density unchanged without atoms."""
    data = _dataset(ds)
    s = circle_series(data)
    if "atom_centre" not in data.variables:
        return s["density"].copy()
    return atoms_on_cells(
        s["density"],
        s["grid"],
        np.asarray(data["atom_centre"].values, float),
        np.asarray(data["atom_mass"].values, float),
        np.asarray(data["atom_variance"].values, float),
    )


def space_time_figure(
    ds: xr.Dataset | str | os.PathLike[str], threshold: float = 2.0, title: str | None = None
) -> Figure:
    """The density per unit angle over (theta, t), on a log colour scale from 1e-3 of the
    uniform density up, with the clusters of the last snapshot marked and, in a run with
    atoms, the atoms' tracks (dots of area proportional to mass; counted in the title)."""
    s = circle_series(ds)
    theta, rho = full_circle(s["theta"], s["density"], s["copies"])
    fig = new_figure(6.4, 4.8)
    ax = fig.add_subplot()
    uniform = 1.0 / TWO_PI
    h = theta[1] - theta[0]
    edges = np.append(theta - 0.5 * h, theta[-1] + 0.5 * h)
    t = s["time"]
    t_edges = np.concatenate([[t[0]], 0.5 * (t[1:] + t[:-1]), [t[-1]]])
    image = ax.pcolormesh(
        edges,
        t_edges,
        np.maximum(rho, 1e-3 * uniform),
        norm=LogNorm(vmin=1e-3 * uniform, vmax=max(rho.max(), 10 * uniform)),
        cmap="magma",
        shading="flat",
    )
    fig.colorbar(image, ax=ax, label="density per radian")
    data = _dataset(ds)
    level = threshold
    if "atom_mass" in data.variables:  # twice the uniform density of cells plus atoms
        cells = float(np.sum(s["density"][-1])) * s["grid"].spacing[0] * s["copies"]
        atoms = float(np.nansum(data["atom_mass"].values[-1]))
        level = threshold * (cells + atoms) / max(cells, 1e-300)
    angles, _ = clusters(s["density"][-1], s["grid"], level)
    if angles.size:
        angles, _ = full_circle(angles, np.zeros(angles.size), s["copies"])
        ax.plot(angles, np.full(angles.size, t[-1]), "v", color="cyan", ms=6, clip_on=False)
    count = angles.size
    if "atom_centre" in data.variables:  # the atoms' tracks (tpde.atoms_io), dot area ~ mass
        centre = np.asarray(data["atom_centre"].values, float)
        mass = np.asarray(data["atom_mass"].values, float)
        held = np.isfinite(centre)
        times = np.broadcast_to(t[:, None], centre.shape)
        ax.scatter(centre[held], times[held], s=30.0 * mass[held], color="cyan", lw=0)
        count += int(held[-1].sum())
    ax.set_xlim(0.0, TWO_PI)
    ax.set_xticks(np.linspace(0.0, TWO_PI, 5), ["0", "pi/2", "pi", "3pi/2", "2pi"])
    ax.set_xlabel("theta")
    ax.set_ylabel("t (layer depth)")
    ax.set_title(title or f"clusters on the circle ({count} at t = {t[-1]:g})")
    return fig


def ring_figure(
    ds: xr.Dataset | str | os.PathLike[str], count: int = 4, threshold: float = 2.0
) -> Figure:
    """``count`` snapshots drawn around the unit circle (radius ``1 + rho / max rho``), the
    clusters of each marked with their masses."""
    s = circle_series(ds)
    theta, rho = full_circle(s["theta"], s["density"], s["copies"])
    picks = np.unique(np.linspace(0, len(s["time"]) - 1, count).round().astype(int))
    fig = new_figure(3.2 * len(picks), 3.4)
    closed = np.append(theta, theta[0] + TWO_PI)
    for i, index in enumerate(picks):
        ax = fig.add_subplot(1, len(picks), i + 1, projection="polar")
        values = rho[index]
        radius = 1.0 + values / max(values.max(), 1e-300)
        ax.plot(closed, np.append(radius, radius[0]), color="C0")
        ax.plot(closed, np.ones_like(closed), color="0.7", lw=0.8)
        angles, masses = clusters(s["density"][index], s["grid"], threshold)
        angles, masses = full_circle(angles, masses, s["copies"])
        for angle, mass in zip(angles, masses, strict=True):
            ax.plot([angle], [2.05], "o", color="C3", ms=3 + 20 * mass)
        ax.set_ylim(0.0, 2.2)
        ax.set_yticks([])
        ax.set_xticks([])
        ax.set_title(f"t = {s['time'][index]:.3g}: {angles.size} clusters", fontsize=9)
    return fig


def modes_figure(ds: xr.Dataset | str | os.PathLike[str], k_max: int = 20) -> Figure:
    """``|c_k(t)| / c_0`` for ``k <= k_max`` (log scale) and the interaction energy."""
    s = circle_series(ds)
    grid = s["grid"]
    top = min(k_max, s["copies"] * (grid.cells[0] // 2 - 1))
    modes = fourier_modes(s["density"], grid, top)
    amplitude = np.abs(modes) / np.abs(modes[..., :1])
    fig = new_figure(9.6, 3.8)
    ax = fig.add_subplot(1, 2, 1)
    ks = s["copies"] * np.arange(amplitude.shape[-1])
    colours = iter(np.linspace(0.0, 1.0, max(len(ks) - 1, 1)))
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    for j, k in enumerate(ks):
        if k == 0:
            continue
        ax.semilogy(s["time"], np.maximum(amplitude[:, j], 1e-18), color=cmap(next(colours)))
    ax.set_xlabel("t")
    ax.set_ylabel("|c_k| / c_0")
    ax.set_title(f"Fourier modes k = {ks[1] if len(ks) > 1 else 0}..{ks[-1]} (dark: low k)")
    ax2 = fig.add_subplot(1, 2, 2)
    if s["energy"] is not None:
        ax2.plot(s["time"], s["energy"], color="C1")
        ax2.set_ylabel("E = 1/(2 beta) iint exp(beta cos) dmu dmu", fontsize="small")
    ax2.set_xlabel("t")
    ax2.set_title("interaction energy")
    return fig


def snapshots_figure(
    ds: xr.Dataset | str | os.PathLike[str],
    times: Sequence[float] | None = None,
    threshold: float = 2.0,
) -> Figure:
    """Density snapshots in stacked panels, one per time (default: ``SNAPSHOTS`` evenly
    spaced ones; ``times`` snap to the nearest stored), in units of the uniform density
    ``1 / (2 pi)``, each on its own scale: from 0 once the density has structure, around 1
    while it is nearly uniform (the noise it starts from stays visible). The clusters (local
    maxima above ``threshold`` times uniform, :func:`tpde.grid.circle.clusters`) are marked
    and counted in each panel's title."""
    s = circle_series(ds)
    theta, rho = full_circle(s["theta"], s["density"], s["copies"])
    t = s["time"]
    if times is None:
        picks = np.unique(np.linspace(0, t.size - 1, min(SNAPSHOTS, t.size)).round().astype(int))
    else:
        picks = np.unique([int(np.argmin(np.abs(t - w))) for w in np.atleast_1d(times)])
    fig = new_figure(7.0, 1.35 * len(picks) + 1.0)
    axes = fig.subplots(len(picks), 1, sharex=True, squeeze=False)[:, 0]
    uniform = 1.0 / TWO_PI
    for ax, index in zip(axes, picks, strict=True):
        ratio = rho[index] / uniform
        ax.plot(theta, ratio, color="C0", lw=1.2)
        angles, _ = clusters(s["density"][index], s["grid"], threshold)
        angles, _ = full_circle(angles, np.zeros(angles.size), s["copies"])
        if angles.size:
            ax.plot(angles, np.interp(angles, theta, ratio), "v", color="C3", ms=5)
        finite = ratio[np.isfinite(ratio)]
        if finite.size and np.ptp(finite) > NEARLY_UNIFORM:
            ax.set_ylim(bottom=0.0)
        ax.locator_params(axis="y", nbins=3)
        ax.set_title(f"t = {t[index]:.4g}: {angles.size} clusters", fontsize="small", loc="right")
        ax.grid(True, alpha=0.3)
    _angle_ticks(axes[-1])
    axes[-1].set_xlabel("theta")
    fig.supylabel("density / uniform density (own scale per panel)", fontsize="medium")
    fig.suptitle("density on the circle (markers: clusters)", fontsize="medium")
    return fig


def order_figure(ds: xr.Dataset | str | os.PathLike[str], threshold: float = 2.0) -> Figure:
    """What an angle's moments would say, in the circle's own terms, against time: the order
    parameter ``R = |<e^{i theta}>| = |c_1| / c_0`` (0: spread out or symmetric, 1: one
    point mass; an m-fold run has ``c_1 = 0`` by symmetry, so ``|c_m| / c_0`` is drawn), the
    first ``FIRST_MODES`` mode amplitudes ``|c_k| / c_0`` (log scale: their growth from
    noise) and the number of clusters (:func:`tpde.grid.circle.clusters`)."""
    s = circle_series(ds)
    grid, m, t = s["grid"], s["copies"], s["time"]
    top = min(FIRST_MODES, grid.cells[0] // 2 - 1)
    modes = fourier_modes(s["density"], grid, m * top)
    amplitude = np.abs(modes) / np.maximum(np.abs(modes[..., :1]), 1e-300)
    counts = [clusters(rho, grid, threshold)[0].size * m for rho in s["density"]]
    fig = new_figure(12.0, 3.8)
    ax_r, ax_k, ax_c = fig.subplots(1, 3)
    order = "|<e^{i theta}>|" if m == 1 else f"|c_{m}| / c_0 (c_1 = 0: {m}-fold)"
    ax_r.plot(t, amplitude[:, 1], color="k")
    ax_r.set_ylim(0.0, 1.05)
    ax_r.set_ylabel(order)
    ax_r.set_title("order parameter", fontsize="medium")
    for j in range(1, amplitude.shape[-1]):
        ax_k.semilogy(
            t, np.maximum(amplitude[:, j], 1e-18), color=f"C{j - 1}", label=f"k = {j * m}"
        )
    ax_k.set_ylabel("|c_k| / c_0")
    ax_k.set_title("first Fourier modes", fontsize="medium")
    ax_k.legend(fontsize="small")
    ax_c.step(t, counts, where="post", color="C3")
    ax_c.set_ylim(bottom=0)
    ax_c.yaxis.get_major_locator().set_params(integer=True)
    ax_c.set_ylabel("clusters")
    ax_c.set_title(f"clusters (maxima above {threshold:g} x uniform)", fontsize="medium")
    for ax in (ax_r, ax_k, ax_c):
        ax.set_xlabel("t")
        ax.grid(True, alpha=0.3)
    title = str(s.get("title", "") or "")
    fig.suptitle(f"{title}: order and clusters" if title else "order and clusters")
    return fig


def circle_figures(ds: xr.Dataset | str | os.PathLike[str], outdir: str | os.PathLike) -> list:
    """Write ``space_time.png``, ``ring.png`` and ``modes.png`` into ``outdir``."""
    ds = _dataset(ds)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in (
        ("space_time.png", space_time_figure),
        ("ring.png", ring_figure),
        ("modes.png", modes_figure),
    ):
        fig = make(ds)
        target = outdir / name
        fig.savefig(target, dpi=DPI)
        written.append(target)
    return written


def plot_figures(
    ds: xr.Dataset, times: Sequence[float] | None = None
) -> dict[str, Callable[[], Figure]]:
    """The circle's figures in ``tpde plot`` (tpde.geometries' ``figures`` hook): its own
    ``density.png`` and ``moments.png`` (an angle's mean and variance mean little), then
    ``space_time.png``, ``ring.png`` and ``modes.png``."""
    return {
        "density.png": lambda: snapshots_figure(ds, times),
        "moments.png": lambda: order_figure(ds),
        "space_time.png": lambda: space_time_figure(ds),
        "ring.png": lambda: ring_figure(ds),
        "modes.png": lambda: modes_figure(ds),
    }


def compare_runs(
    run: xr.Dataset,
    tokens: Sequence[xr.Dataset],
    gaussian: xr.Dataset | None,
    time: float | None,
    title: str | None,
) -> Figure:
    """``tpde compare`` on the circle (tpde.geometries' ``compare`` hook): the circle has no
    Gaussian closure; :func:`compare_figure` of the token runs."""
    if gaussian is not None:
        raise ValueError("compare: the circle has no Gaussian closure; give token files")
    return compare_figure(run, tokens, time, title)


def compare_figure(
    run: xr.Dataset | str | os.PathLike[str],
    tokens: Sequence[xr.Dataset | str | os.PathLike[str]],
    time: float | None = None,
    title: str | None = None,
) -> Figure:
    """A grid run on the circle against token runs of the same config (``tpde compare``;
    ``tpde particles`` with several ``--seed`` values: their spread is drawn as a band,
    min to max over the seeds, with their median).

    Top: the density at ``time`` (default: the run's last snapshot; a token run without that
    time is left out of the panel and counted in its title) in units of the uniform density,
    the token histograms on the run's cells; a run with atoms is drawn, ordered and measured
    as cells plus its atoms' cell averages (:func:`cells_plus_atoms`). Bottom: the order
    parameter ``|c_m| / c_0`` against t (:func:`order_figure`), and ``W_1`` on the circle
    between each token histogram and the run (:func:`tpde.validation.metrics.
    wasserstein_circle`, exact for the cells).
    Last row: the energy staircase (interaction energy over a point mass's, the grid's with
    its atoms' share) and the cluster count of the grid run (cells plus atoms) beside each
    token file's (:func:`staircase_panels`). ValueError (one line) for token files not on
    the run's circle or of another ``beta``."""
    from tpde.validation.metrics import wasserstein_circle

    s = circle_series(run)
    grid, m, t = s["grid"], s["copies"], s["time"]
    token_data = [_dataset(ds) for ds in tokens]
    sets = [circle_series(ds) for ds in token_data]
    for one in sets:
        if one["density"].shape[-1] != s["density"].shape[-1] or one["copies"] != m:
            raise ValueError(
                "compare: a token file is not on the run's circle (cells or copies differ); "
                "write it with the run's config (tpde particles CONFIG)"
            )
    staircase = grid_staircase(run)
    beta = staircase["beta"]
    whole = cells_plus_atoms(run)  # (with atoms: their cell averages join the cells')
    run_name = "grid + atoms" if staircase["atoms"] else "grid run"
    for ds in token_data:
        other = config_beta(ds)
        if beta is not None and other is not None and not np.isclose(other, beta, rtol=1e-12):
            raise ValueError(
                f"compare: a token file has beta = {other:g}, the run {beta:g}; write it with "
                "the run's config (tpde particles CONFIG)"
            )
    index = int(np.argmin(np.abs(t - time))) if time is not None else t.size - 1
    at = float(t[index])
    fig = new_figure(12.0, 11.0)
    top, bottom, last = fig.subfigures(3, 1, height_ratios=[1.0, 1.0, 1.0])  # type: ignore[misc]
    ax = top.subplots()
    uniform = 1.0 / TWO_PI
    theta, rho = full_circle(s["theta"], whole[index], m)
    ax.plot(theta, rho / uniform, color="C0", lw=1.5, label=run_name)
    drawn = []
    for one in sets:
        j = np.flatnonzero(np.isclose(one["time"], at, rtol=1e-12, atol=1e-12))
        if j.size:
            drawn.append(full_circle(one["theta"], one["density"][j[0]], m)[1] / uniform)
    seeds = f"{len(sets)} token run{'s' if len(sets) != 1 else ''}"
    if len(drawn) == 1:
        ax.plot(theta, drawn[0], ":", color="C1", drawstyle="steps-mid", label="token histogram")
    elif drawn:
        stack = np.stack(drawn)
        ax.fill_between(
            theta,
            stack.min(axis=0),
            stack.max(axis=0),
            step="mid",
            color="C1",
            alpha=0.3,
            label=f"token histograms, min to max over {len(drawn)} seeds",
        )
        ax.plot(
            theta, np.median(stack, axis=0), ":", color="C1", drawstyle="steps-mid", label="median"
        )
    missing = len(sets) - len(drawn)
    ax.set_title(
        f"t = {at:.4g}" + (f" ({missing} of {seeds} without this time)" if missing else ""),
        fontsize="medium",
    )
    _angle_ticks(ax)
    ax.set_xlabel("theta")
    ax.set_ylabel("density / uniform density")
    ax.set_ylim(bottom=0.0)
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    ax_r, ax_w = bottom.subplots(1, 2)
    ax_r.plot(t, order_parameter(whole, grid, m), color="C0", label=run_name)
    common, run_at, picks = common_times(t, [one["time"] for one in sets])
    orders, distances = [], []
    for one, pick in zip(sets, picks, strict=True):
        orders.append(order_parameter(one["density"][pick], grid, m))
        distances.append(
            [
                wasserstein_circle(one["density"][a], whole[b], grid)
                for a, b in zip(pick, run_at, strict=True)
            ]
        )
    for axis, values, name in ((ax_r, orders, "tokens"), (ax_w, distances, "tokens - grid")):
        if values and common:
            band(axis, common, values, "C1", name, ":o", ms=3)
    order = "|<e^{i theta}>|" if m == 1 else f"|c_{m}| / c_0 (c_1 = 0: {m}-fold)"
    ax_r.set_ylabel(order)
    ax_r.set_ylim(0.0, 1.05)
    ax_r.set_title("order parameter", fontsize="medium")
    ax_w.set_ylabel("W_1 on the circle")
    ax_w.set_title("distance of the token histograms to the grid run", fontsize="medium")
    ax_w.set_ylim(bottom=0.0)
    for axis in (ax_r, ax_w):
        axis.set_xlabel("t")
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:  # (no token file: W_1 has no curve)
            axis.legend(fontsize="small")
    ax_e, ax_c = last.subplots(1, 2)
    energy_beta = beta if staircase["energy"] is not None else None
    staircase_panels(ax_e, ax_c, staircase, [token_staircase(ds, energy_beta) for ds in token_data])
    name = title if title is not None else str(s.get("title", "") or "")
    fig.suptitle(f"{name}: grid run and {seeds}" if name else f"grid run and {seeds}")
    return fig


def config_beta(ds: xr.Dataset) -> float | None:
    """``beta`` of a circle file's attention ``A = beta I`` (its stored config: ``attention.
    beta``, or ``attention.A`` a positive multiple of the identity); None otherwise (no
    interaction energy of that form)."""
    import tomllib

    try:
        table = tomllib.loads(str(ds.attrs.get("config", ""))).get("attention", {})
    except tomllib.TOMLDecodeError:
        return None
    if "beta" in table:
        return float(table["beta"])
    if "A" in table:
        A = np.asarray(table["A"], float)
        if A.shape == (2, 2) and np.allclose(A, A[0, 0] * np.eye(2)) and A[0, 0] > 0:
            return float(A[0, 0])
    return None


def _point_mass_energy(beta: float) -> float:
    """``e^beta / (2 beta)``: the interaction energy of one unit point mass (the staircase's
    top step)."""
    return float(np.exp(beta) / (2.0 * beta))


def grid_staircase(
    ds: xr.Dataset | str | os.PathLike[str], threshold: float = 2.0
) -> dict[str, Any]:
    """The staircase of a grid run (with or without atoms), per record: ``energy`` the
    recorded interaction energy (cells plus the atoms' exact share, :func:`tpde.variants.
    circle_atoms.energy_with_atoms`) over a point mass's ``e^beta / (2 beta)`` (None without
    a record or a ``beta``), and ``clusters`` the clusters of cells plus atoms: each atom's
    wrapped normal averaged over the cells (:func:`cells_plus_atoms`), then the local maxima
    above ``threshold`` times the
    uniform density of the whole measure (:func:`tpde.grid.circle.clusters`, times the
    copies of an m-fold grid), as ``tpde info`` counts them on the sphere. Also ``time``,
    ``beta``, ``atoms`` (whether the file has atoms)."""
    data = _dataset(ds)
    s = circle_series(data)
    grid, m = s["grid"], s["copies"]
    density = cells_plus_atoms(data)
    atoms = "atom_centre" in data.variables
    counts = np.array([clusters(rho, grid, threshold)[0].size * m for rho in density])
    beta = config_beta(data)
    energy = None
    if beta is not None and s["energy"] is not None:
        energy = s["energy"] / _point_mass_energy(beta)
    return {"time": s["time"], "energy": energy, "clusters": counts, "beta": beta, "atoms": atoms}


def token_staircase(
    ds: xr.Dataset | str | os.PathLike[str], beta: float | None, threshold: float = 2.0
) -> dict[str, Any]:
    """The staircase of a token file (``tpde particles`` on the circle), per record:
    ``energy`` the tokens' exact interaction energy (:func:`tpde.validation.
    circle_metastability.token_energy`, the pairs ``i = j`` included) over a point mass's
    (None without ``beta``), ``clusters`` the clusters of their histogram on
    ``TOKEN_COUNT_CELLS`` cells (:func:`~tpde.validation.circle_metastability.
    token_clusters`); ``time`` and ``label`` (its sampling: seed or mid-quantiles)."""
    from tpde.validation.circle_metastability import token_clusters, token_energy

    data = _dataset(ds)
    if "tokens" not in data:
        raise ValueError("compare: a reference has no tokens; write it with tpde particles")
    theta = np.asarray(data["tokens"].values, float)[..., 0]  # (time, token)
    counting = circle_grid(TOKEN_COUNT_CELLS)
    energy = None
    if beta is not None:
        point = _point_mass_energy(beta)
        energy = np.array([token_energy(angles, beta) / point for angles in theta])
    counts = np.array([token_clusters(angles, counting, threshold=threshold)[0].size
                       for angles in theta])  # fmt: skip
    sampling = str(data.attrs.get("sampling", ""))
    seed = int(data.attrs.get("seed", -1))
    how = "mid-quantiles" if "quantile" in sampling else f"seed {seed}"
    label = f"tokens n = {theta.shape[1]} ({how})"
    return {"time": np.asarray(data["time"].values, float), "energy": energy,
            "clusters": counts, "label": label}  # fmt: skip
