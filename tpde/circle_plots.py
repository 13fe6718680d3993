"""Figures of a run on the circle (``geometry = "circle"`` files; :mod:`tpde.circle`).

``space_time_figure``: the density over angle and time (clusters forming from noise);
``ring_figure``: snapshots drawn around the circle with the clusters marked;
``modes_figure``: the Fourier mode amplitudes ``|c_k(t)|`` and the interaction energy.
``circle_figures`` writes all three (``tpde plot`` calls it for circle files). The reading
helpers take a Dataset or a path of a tpde output.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from tpde.grid.circle import TWO_PI, circle_grid, clusters, fourier_modes

__all__ = [
    "circle_figures",
    "circle_series",
    "is_circle_file",
    "modes_figure",
    "ring_figure",
    "space_time_figure",
]

DPI = 150


def _dataset(ds: xr.Dataset | str | os.PathLike[str]) -> xr.Dataset:
    if isinstance(ds, str | os.PathLike):
        with xr.open_dataset(Path(ds)) as opened:
            return opened.load()
    return ds


def is_circle_file(ds: xr.Dataset) -> bool:
    return str(ds.attrs.get("geometry", "")) == "circle"


def circle_series(ds: xr.Dataset | str | os.PathLike[str]) -> dict[str, Any]:
    """The arrays of a circle run: ``time``, ``theta`` (cell centres), ``density``
    (time, cells), ``copies`` and the grid."""
    ds = _dataset(ds)
    if not is_circle_file(ds):
        raise ValueError("plot: not a run on the circle (no geometry = 'circle' attribute)")
    copies = int(ds.attrs.get("circle_copies", 1))
    density = np.asarray(ds["density"].values, float)
    return {
        "time": np.asarray(ds["time"].values, float),
        "theta": np.asarray(ds["x"].values, float),
        "density": density,
        "copies": copies,
        "grid": circle_grid(density.shape[-1], copies),
        "energy": (
            np.asarray(ds["energy_interaction"].values, float)
            if "energy_interaction" in ds
            else None
        ),
    }


def _full_circle(theta: np.ndarray, density: np.ndarray, copies: int):
    """An m-fold run drawn on the whole circle (its period repeated m times)."""
    if copies == 1:
        return theta, density
    period = TWO_PI / copies
    theta = np.concatenate([theta + j * period for j in range(copies)])
    return theta, np.concatenate([density] * copies, axis=-1)


def space_time_figure(
    ds: xr.Dataset | str | os.PathLike[str], threshold: float = 2.0, title: str | None = None
) -> Figure:
    """The density per unit angle over (theta, t), on a log colour scale from 1e-3 of the
    uniform density up, with the clusters of the last snapshot marked and, in a run with
    atoms, the atoms' tracks (dots of area proportional to mass; counted in the title)."""
    s = circle_series(ds)
    theta, rho = _full_circle(s["theta"], s["density"], s["copies"])
    fig = Figure(figsize=(6.4, 4.8), layout="constrained")
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
        angles, _ = _full_circle(angles, np.zeros(angles.size), s["copies"])
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
    theta, rho = _full_circle(s["theta"], s["density"], s["copies"])
    picks = np.unique(np.linspace(0, len(s["time"]) - 1, count).round().astype(int))
    fig = Figure(figsize=(3.2 * len(picks), 3.4), layout="constrained")
    closed = np.append(theta, theta[0] + TWO_PI)
    for i, index in enumerate(picks):
        ax = fig.add_subplot(1, len(picks), i + 1, projection="polar")
        values = rho[index]
        radius = 1.0 + values / max(values.max(), 1e-300)
        ax.plot(closed, np.append(radius, radius[0]), color="C0")
        ax.plot(closed, np.ones_like(closed), color="0.7", lw=0.8)
        angles, masses = clusters(s["density"][index], s["grid"], threshold)
        angles, masses = _full_circle(angles, masses, s["copies"])
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
    fig = Figure(figsize=(9.6, 3.8), layout="constrained")
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
        ax2.set_ylabel("E = 1/(2 beta) iint exp(beta cos) dmu dmu")
    ax2.set_xlabel("t")
    ax2.set_title("interaction energy")
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
