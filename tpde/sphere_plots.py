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

__all__ = ["plot_sphere", "raster"]


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


def plot_sphere(
    path: str | Path,
    outdir: str | Path,
    times: Sequence[float] | None = None,
    title: str | None = None,
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .sphere import from_file, grid_of, read_sphere

    ds = read_sphere(path)
    if ds.sizes.get("time", 0) == 0:
        raise ValueError(f"plot: {path} has no snapshots")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
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
    fig = plt.figure(figsize=(6.4 * columns, 3.6 * rows), layout="constrained")
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
    fig.suptitle(title or str(ds.attrs.get("title", "tpde on the sphere")))
    out = [outdir / "density.png"]
    fig.savefig(out[0], dpi=110)
    plt.close(fig)

    recorded = [name for name in ("energy_interaction", "harmonic_amplitude") if name in ds]
    rows = 2 if recorded else 1
    fig, axes = plt.subplots(rows, 2, figsize=(10, 3.6 * rows), layout="constrained", squeeze=False)
    left, right = axes[0]
    mean = ds["mean_vector"].values
    for c, name in enumerate("xyz"):
        left.plot(all_times, mean[:, c], label=f"mean {name}")
    left.plot(all_times, np.linalg.norm(mean, axis=1), "k--", label="|mean|")
    left.set_xlabel("t")
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
    out.append(outdir / "moments.png")
    fig.savefig(out[1], dpi=110)
    plt.close(fig)
    return out
