"""Figures of a sphere run (``tpde plot`` on a ``geometry = "sphere"`` file, tpde.sphere).

``density.png``: the density at up to four snapshots on Mollweide's equal-area projection
(each pixel of a 0.5-degree latitude-longitude raster shows the cell it falls in; a colour
scale per snapshot, in units of the uniform density), the
clusters of the last one marked (local maxima above twice the uniform density,
:func:`tpde.grid.cubed_sphere.clusters`, with their masses); ``moments.png``: the mean vector,
its length and the eigenvalues of the second moment over time, and, when the file records them,
the interaction energy (its staircase) and the degree amplitudes ``A_l``, ``l >= 1`` (log
scale: the modes' growth).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tpde.grid import cubed_sphere as cs

__all__ = ["density_map_figure", "moments_figure", "plot_sphere", "raster"]


def raster(grid: cs.CubedSphere, density: np.ndarray, step: float = 0.5):
    """``(lon, lat, values)``: the cell values on a latitude-longitude raster of ``step``
    degrees (pixel centres; radians for matplotlib's geographic axes)."""
    lat = np.radians(np.arange(-90 + step / 2, 90, step))
    lon = np.radians(np.arange(-180 + step / 2, 180, step))
    la, lo = np.meshgrid(lat, lon, indexing="ij")
    x = np.stack([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)], -1)
    p, a, b = cs.to_panel(x)
    i = np.clip(((a + cs.QUARTER) / grid.h).astype(int), 0, grid.n - 1)
    j = np.clip(((b + cs.QUARTER) / grid.h).astype(int), 0, grid.n - 1)
    return lon, lat, np.asarray(density)[p, i, j]


def _figure(width: float, height: float):
    """A constrained-layout figure on its own Agg canvas (no pyplot, no backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def density_map_figure(ds, times: Sequence[float] | None = None, title: str | None = None):
    """The density at up to four snapshots (or the nearest to each of ``times``) on
    Mollweide maps, each with its colour bar (density / uniform), the clusters of the last
    marked; ``ds`` a sphere file read by :func:`tpde.sphere.read_sphere`."""
    from .sphere import from_file, grid_of

    if ds.sizes.get("time", 0) == 0:
        raise ValueError("plot: the sphere file has no snapshots")
    grid = grid_of(ds)
    all_times = ds["time"].values
    if times:
        picks = sorted({int(np.argmin(np.abs(all_times - t))) for t in times})
    else:
        picks = sorted(set(np.linspace(0, all_times.size - 1, min(4, all_times.size)).astype(int)))
    rho = from_file(ds["density"].values)
    uniform = 1.0 / cs.FOUR_PI
    columns = min(2, len(picks))
    rows = (len(picks) + columns - 1) // columns
    fig = _figure(6.4 * columns, 3.6 * rows)
    for slot, k in enumerate(picks):
        ax = fig.add_subplot(rows, columns, slot + 1, projection="mollweide")
        lon, lat, values = raster(grid, rho[k])
        mesh = ax.pcolormesh(lon, lat, values / uniform, shading="nearest", cmap="magma", vmin=0)
        fig.colorbar(mesh, ax=ax, shrink=0.7, label="density / uniform")
        ax.set_xticklabels([])
        ax.grid(alpha=0.3)
        ax.set_title(f"t = {all_times[k]:.4g}", fontsize=10)
        if slot == len(picks) - 1:
            centres, masses = cs.clusters(grid, rho[k])
            la, lo = cs.lat_lon(centres)
            ax.scatter(np.radians(lo), np.radians(la), s=40, facecolors="none", edgecolors="cyan")
            ax.set_title(
                f"t = {all_times[k]:.4g}: {masses.size} clusters (> 2x uniform)", fontsize=10
            )
    text = title or " ".join(str(ds.attrs.get("title", "tpde on the sphere")).split())[:100]
    fig.suptitle(text.replace("$", r"\$"))
    return fig


def moments_figure(ds):
    """The mean vector and its length, the eigenvalues of the second moment and, when the
    file records them, the interaction energy and the degree amplitudes ``A_l``, ``l >= 1``
    (log scale), against t."""
    all_times = ds["time"].values
    recorded = [name for name in ("energy_interaction", "harmonic_amplitude") if name in ds]
    rows = 2 if recorded else 1
    fig = _figure(10, 3.6 * rows)
    axes = fig.subplots(rows, 2, squeeze=False)
    left, right = axes[0]
    mean = ds["mean_vector"].values
    for c, name in enumerate("xyz"):
        left.plot(all_times, mean[:, c], label=f"mean {name}")
    left.plot(all_times, np.linalg.norm(mean, axis=1), "k--", label="|mean|")
    left.set_xlabel("t")
    left.set_title("mean vector int x dmu", fontsize=10)
    left.legend(fontsize=8)
    eig = np.linalg.eigvalsh(ds["second_moment"].values)
    right.plot(all_times, eig)
    right.set_xlabel("t")
    right.set_title("eigenvalues of int x x^T dmu", fontsize=10)
    for ax, name in zip(axes[1], recorded, strict=False):
        if name == "energy_interaction":
            beta = float(ds[name].attrs.get("beta", float("nan")))
            ax.plot(all_times, ds[name].values, "k")
            ax.set_title(f"interaction energy E (beta = {beta:g})", fontsize=10)
        else:
            amplitudes = ds[name].values
            for l in range(1, amplitudes.shape[1]):
                ax.semilogy(all_times, np.maximum(amplitudes[:, l], 1e-300), label=f"l = {l}")
            ax.set_title("degree amplitudes A_l", fontsize=10)
            ax.legend(fontsize=7, ncol=2)
        ax.set_xlabel("t")
    if len(recorded) == 1:
        axes[1, 1].set_visible(False)
    for ax in axes.ravel():
        ax.grid(alpha=0.3)
    return fig


def plot_sphere(
    path: str | Path,
    outdir: str | Path,
    times: Sequence[float] | None = None,
    title: str | None = None,
) -> list[Path]:
    """Write ``density.png`` (:func:`density_map_figure`) and ``moments.png``
    (:func:`moments_figure`) of the sphere file ``path`` into ``outdir``."""
    from .sphere import read_sphere

    ds = read_sphere(path)
    if ds.sizes.get("time", 0) == 0:
        raise ValueError(f"plot: {path} has no snapshots")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    out = [outdir / "density.png", outdir / "moments.png"]
    for target, fig in zip(
        out, (density_map_figure(ds, times, title), moments_figure(ds)), strict=True
    ):
        fig.savefig(target, dpi=110)
        fig.clear()
    return out
