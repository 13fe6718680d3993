"""Figures of a sphere run (``tpde plot`` on a ``geometry = "sphere"`` file, tpde.sphere).

``density.png``: the density at up to four snapshots on Mollweide's equal-area projection
(each pixel of a 0.5-degree latitude-longitude raster shows the cell it falls in; a colour
scale per snapshot, in units of the uniform density), the
clusters of the last one marked (local maxima above twice the uniform density,
:func:`tpde.grid.cubed_sphere.clusters`, with their masses) and, in a run with atoms, each
snapshot's atoms drawn at their mean directions (the clusters then of cells plus atoms,
as ``tpde info`` counts them) (area proportional to mass, the wider ones
with their spread as a dashed circle); ``moments.png``: the mean vector,
its length and the eigenvalues of the second moment over time, and, when the file records them,
the interaction energy (its staircase) and the degree amplitudes ``A_l``, ``l >= 1`` (log
scale: the modes' growth). ``compare_figure``: a grid run against one or several token
runs (``tpde compare`` on the sphere; several seeds drawn as a band), in moments, degree
amplitudes and ``W_2`` on the sphere.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tpde.grid import cubed_sphere as cs
from tpde.validation.figure_data import common_times

from .plots import band, new_figure, staircase_panels

__all__ = [
    "compare_figure",
    "density_map_figure",
    "draw_atoms",
    "moments_figure",
    "plot_sphere",
    "raster",
    "sphere_staircase",
]

#: W_2 is computed at up to this many snapshot times (an exact transport LP each)
COMPARE_DISTANCES = 8
#: the largest transport problem (density atoms x tokens) computed for the W_2 panel; a
#: density's atoms per cell side drop from 3 to 1 above it, and the panel says so beyond
COMPARE_COST_ENTRIES = 2e7
#: an atom's marker area (points^2) per unit mass: a unit mass is about 9 points across
ATOM_MARKER_AREA = 60.0
#: an atom's spread (angular radius sqrt(1 / kappa)) is drawn as a circle from this many
#: degrees up; a narrower one lies under its marker
SPREAD_LEGIBLE_DEG = 4.0
#: points on an atom's spread circle
SPREAD_POINTS = 73


def raster(grid: cs.CubedSphere, density: np.ndarray, step: float = 0.5):
    """``(lon, lat, values)`` of the maps: :func:`tpde.grid.cubed_sphere.lat_lon_raster`."""
    return cs.lat_lon_raster(grid, density, step)


def draw_atoms(ax, atoms) -> tuple[int, int]:
    """The atoms (:class:`tpde.schemes.sphere_atoms.VMFAtoms`) on a Mollweide axes: a white
    disc of area ``ATOM_MARKER_AREA`` x mass at each mean direction and, where the spread's
    angular radius ``sqrt(1 / kappa)`` is at least ``SPREAD_LEGIBLE_DEG``, its circle
    (dashed), each kind named once in the legend. Returns (markers, circles) drawn."""
    if atoms is None or atoms.count == 0:
        return 0, 0
    lat, lon = cs.lat_lon(atoms.centre)
    ax.scatter(
        np.radians(lon),
        np.radians(lat),
        s=ATOM_MARKER_AREA * atoms.mass,
        facecolors="white",
        edgecolors="black",
        linewidths=0.8,
        zorder=3,
        label=f"{atoms.count} atom{'s' if atoms.count != 1 else ''} (area ~ mass)",
    )
    circles = 0
    for centre, spread in zip(atoms.centre, atoms.spread, strict=True):
        radius = float(np.sqrt(spread))
        if np.degrees(radius) < SPREAD_LEGIBLE_DEG:
            continue
        x, y = cs.small_circle(centre, radius, SPREAD_POINTS)
        label = "atom spread sqrt(1/kappa)" if circles == 0 else None
        ax.plot(x, y, "--", color="white", lw=0.8, zorder=3, label=label)
        circles += 1
    ax.legend(loc="lower right", fontsize=7, framealpha=0.6)
    return atoms.count, circles


def density_map_figure(ds, times: Sequence[float] | None = None, title: str | None = None):
    """The density at up to four snapshots (or the nearest to each of ``times``) on
    Mollweide maps, each with its colour bar (density / uniform), the clusters of the last
    marked; ``ds`` a sphere file read by :func:`tpde.io.read`."""
    from tpde.validation.sphere_atoms import measure_clusters

    from .atoms_io import atoms_of_record
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
    fig = new_figure(6.4 * columns, 3.6 * rows)
    for slot, k in enumerate(picks):
        ax = fig.add_subplot(rows, columns, slot + 1, projection="mollweide")
        lon, lat, values = raster(grid, rho[k])
        mesh = ax.pcolormesh(lon, lat, values / uniform, shading="nearest", cmap="magma", vmin=0)
        fig.colorbar(mesh, ax=ax, shrink=0.7, label="density / uniform")
        ax.set_xticklabels([])
        ax.grid(alpha=0.3)
        ax.set_title(f"t = {all_times[k]:.4g}", fontsize=10)
        atoms = atoms_of_record(ds, k)
        drawn, _ = draw_atoms(ax, atoms)
        if slot == len(picks) - 1:
            # the clusters of cells plus atoms (an atom's mass in the cell of its centre),
            # as tpde info counts them
            centres, masses = measure_clusters(grid, rho[k], atoms)
            la, lo = cs.lat_lon(centres)
            ax.scatter(np.radians(lo), np.radians(la), s=40, facecolors="none", edgecolors="cyan")
            held = (
                f", cells plus {drawn} atom{'s' if drawn != 1 else ''}" if atoms is not None else ""
            )
            ax.set_title(
                f"t = {all_times[k]:.4g}: {masses.size} clusters (> 2x uniform{held})",
                fontsize=10,
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
    fig = new_figure(10, 3.6 * rows)
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
    from . import io

    ds = io.read(path)
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


def compare_runs(run, tokens: Sequence, gaussian, time: float | None, title: str | None):
    """``tpde compare`` on the sphere (tpde.geometries' ``compare`` hook): the sphere has no
    Gaussian closure; :func:`compare_figure` of the token runs (paths or Datasets; the run's
    snapshots are compared at the times all files hold, ``time`` is not used)."""
    from . import io

    if gaussian is not None:
        raise ValueError("compare: the sphere has no Gaussian closure; give token files")
    sets = [io.read(Path(one)) if isinstance(one, str | os.PathLike) else one for one in tokens]
    return compare_figure(run, sets, title)


def whole_measure(ds, i: int):
    """The cell averages ``(6, n, n)`` of record ``i`` of a sphere file: the cells plus, in a
    run with atoms, each atom's mass in the cell of its centre (as ``tpde info`` counts
    clusters), and the record's atoms (None without)."""
    from tpde.validation.sphere_atoms import cell_masses

    from .atoms_io import atoms_of_record
    from .sphere import from_file, grid_of

    rho = from_file(ds["density"].values[i])
    atoms = atoms_of_record(ds, i)
    if atoms is not None and atoms.count:
        rho = rho + cell_masses(grid_of(ds), atoms.directions, atoms.mass)
    return rho, atoms


def sphere_staircase(ds) -> dict:
    """The staircase of a sphere file (a grid run, with or without atoms, or a token run),
    per record: ``energy`` its recorded interaction energy (cells plus the atoms' share, or
    the tokens') over a point mass's ``e^beta / (2 beta)`` (None without the record), and
    ``clusters`` the local maxima above twice the uniform density of cells plus atoms (each
    atom's mass in the cell of its centre) or of the tokens' histogram on the cells
    (:func:`tpde.grid.cubed_sphere.clusters`, as ``tpde info`` counts them); ``time``,
    ``beta``, ``atoms`` (whether the file has atoms)."""
    from .sphere import grid_of

    grid = grid_of(ds)
    records = ds.sizes.get("time", 0)
    counts = np.array([cs.clusters(grid, whole_measure(ds, i)[0])[1].size for i in range(records)])
    energy, beta = None, None
    if "energy_interaction" in ds and "beta" in ds["energy_interaction"].attrs:
        beta = float(ds["energy_interaction"].attrs["beta"])
        energy = np.asarray(ds["energy_interaction"].values, float) * (2.0 * beta) / np.exp(beta)
    return {
        "time": np.asarray(ds["time"].values, float),
        "energy": energy,
        "clusters": counts,
        "beta": beta,
        "atoms": "atom_id" in ds.variables,
    }


def compare_figure(run, tokens: Sequence, title: str | None = None):
    """A grid run on the sphere against token runs of the same config (``tpde compare``;
    ``tpde particles`` with several ``--seed`` values: their spread drawn as a band, min to
    max over the seeds, with their median). ``run`` and ``tokens``: sphere files read by
    :func:`tpde.io.read`.

    Against t, at the snapshot times every file holds: the length of the mean vector
    ``|int x dmu|`` (the order parameter), the largest and smallest eigenvalue of the
    second moment ``int x x^T dmu``, the degree amplitudes ``A_1, A_2, A_3`` (log), and
    ``W_2`` on the sphere (geodesic cost; :func:`tpde.validation.sphere_transport.
    grid_token_w2`: the run's cells as atoms, exact LP; with atoms, each atom's mass in the
    cell of its centre) of each token run to the run, with the seeds' own distance to one
    another (their sampling noise) at up to ``COMPARE_DISTANCES`` times; last row, the energy
    staircase (over a point mass's) and the cluster count of grid plus atoms beside each
    token run's (:func:`sphere_staircase`). ValueError (one line) for token files of another
    sphere or ``beta``."""
    from tpde.validation.sphere_transport import grid_token_w2

    from .sphere import grid_of

    grid = grid_of(run)
    cells = 6 * grid.n * grid.n
    for one in tokens:
        if one.sizes.get("cell") != run.sizes.get("cell") or "tokens" not in one:
            raise ValueError(
                "compare: a reference is not a token run on the run's sphere (cells differ "
                "or no tokens); write it with the run's config (tpde particles CONFIG)"
            )
    t = np.asarray(run["time"].values, float)
    common, at_run, picks = common_times(t, [one["time"].values for one in tokens])
    common = common if tokens else []  # (no reference: the run's curves alone)
    staircase = sphere_staircase(run)
    references = [sphere_staircase(one) for one in tokens]
    for one in references:
        if staircase["beta"] is not None and one["beta"] is not None:
            if not np.isclose(one["beta"], staircase["beta"], rtol=1e-12):
                raise ValueError(
                    f"compare: a token run has beta = {one['beta']:g}, the run "
                    f"{staircase['beta']:g}; write it with the run's config (tpde particles)"
                )
    fig = new_figure(12.0, 11.0)
    (ax_m, ax_e), (ax_a, ax_w), (ax_s, ax_c) = fig.subplots(3, 2)
    ax_m.plot(t, np.linalg.norm(run["mean_vector"].values, axis=1), color="C0", label="grid run")
    eig = np.linalg.eigvalsh(run["second_moment"].values)
    ax_e.plot(t, eig[:, -1], color="C0", label="grid run: largest")
    ax_e.plot(t, eig[:, 0], "--", color="C0", label="grid run: smallest")
    if common:
        means = [
            np.linalg.norm(one["mean_vector"].values[k], axis=1)
            for one, k in zip(tokens, picks, strict=True)
        ]
        band(ax_m, common, means, "C1", "tokens")
        eigs = [
            np.linalg.eigvalsh(one["second_moment"].values[k])
            for one, k in zip(tokens, picks, strict=True)
        ]
        band(ax_e, common, [e[:, -1] for e in eigs], "C1", "tokens: largest")
        band(ax_e, common, [e[:, 0] for e in eigs], "C2", "tokens: smallest")
    if "harmonic_amplitude" in run:
        amplitude = run["harmonic_amplitude"].values
        for degree in range(1, min(4, amplitude.shape[1])):
            colour = f"C{degree - 1}"
            ax_a.semilogy(
                t,
                np.maximum(amplitude[:, degree], 1e-300),
                color=colour,
                label=f"grid run: l = {degree}",
            )
            if common and all("harmonic_amplitude" in one for one in tokens):
                values = [
                    np.maximum(one["harmonic_amplitude"].values[k, degree], 1e-300)
                    for one, k in zip(tokens, picks, strict=True)
                ]
                band(ax_a, common, values, colour, f"tokens: l = {degree}")
    chosen = (
        np.unique(
            np.linspace(0, len(common) - 1, min(COMPARE_DISTANCES, len(common))).round().astype(int)
        )
        if common
        else np.zeros(0, int)
    )
    sizes = [one.sizes["token"] for one in tokens]
    per_side = 3 if 9 * cells * max(sizes, default=0) <= COMPARE_COST_ENTRIES else 1
    note = ""
    if chosen.size and cells * max(sizes) <= COMPARE_COST_ENTRIES:
        densities = [whole_measure(run, at_run[i])[0] for i in chosen]
        sets = [
            np.asarray(one["tokens"].values)[[k[i] for i in chosen]]
            for one, k in zip(tokens, picks, strict=True)
        ]
        rows = grid_token_w2(grid, densities, sets, per_side)
        when = [common[i] for i in chosen]
        band(
            ax_w,
            when,
            [[r["grid"][s] for r in rows] for s in range(len(tokens))],
            "C1",
            "tokens - grid",
        )
        if len(tokens) > 1:
            ax_w.plot(
                when,
                [r["noise"] for r in rows],
                "k--",
                lw=1,
                label="seeds - seeds (sampling noise)",
            )
        ax_w.set_ylim(bottom=0.0)
    elif chosen.size:
        note = " (not computed: the transport problem is too large)"
    ax_m.set_title("order parameter |int x dmu|", fontsize=10)
    ax_m.set_ylim(0.0, 1.05)
    ax_e.set_title("eigenvalues of int x x^T dmu", fontsize=10)
    ax_a.set_title("degree amplitudes A_l", fontsize=10)
    ax_w.set_title(f"W_2 on the sphere to the grid run{note}", fontsize=10)
    for one, ds in zip(references, tokens, strict=True):
        seed = f" (seed {int(ds.attrs['seed'])})" if "seed" in ds.attrs else ""
        one["label"] = f"tokens n = {ds.sizes['token']}{seed}"
    staircase_panels(
        ax_s,
        ax_c,
        staircase,
        references,
        many="token runs",
        missing="interaction energy: not recorded",
        fontsize=10,
        ylabel=False,
    )
    for ax in (ax_m, ax_e, ax_a, ax_w, ax_s, ax_c):
        ax.set_xlabel("t")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    seeds = f"{len(tokens)} token run{'s' if len(tokens) != 1 else ''}"
    name = title if title is not None else " ".join(str(run.attrs.get("title", "")).split())
    fig.suptitle(f"{name}: grid run and {seeds}" if name else f"grid run and {seeds}")
    return fig
