"""Figures and animations of a run's output (the ``xarray.Dataset`` of docs/user-guide.md,
'Output files (CF-1.10 NetCDF)').

Every function takes the Dataset that a run returns or writes (or the path of a NetCDF file
holding one) and draws from its variables only: ``density(time, x[, y[, z]])`` with the cell
edges from the bounds variables ``x_bounds(x, nv)`` ..., ``mass``, ``mean``, ``covariance``
and ``outflow``. A run of masked (causal) attention has ``density(time, s, x[, y[, z]])``
with a position coordinate ``s``; every figure above then draws the x-marginal (the density
summed over s; ``mass``, ``mean`` and ``covariance`` are already those of the x-marginal),
and :func:`slices_figure` and :func:`position_marginal_figure` draw the slices themselves
(from ``slice_mass``, ``slice_mean`` when present, else from the density).

Figures are plain :class:`matplotlib.figure.Figure` objects on their own Agg canvas: nothing
here selects a global backend, touches ``pyplot`` or needs a display, so the module is safe to
call from a terminal, a notebook or a dask worker alike.

Optional ``reference`` moments (for instance the Gaussian mean/covariance ODE solution) are a
mapping with arrays ``time`` (m,), ``mean`` (m, d) and ``covariance`` (m, d, d); they are
interpolated linearly in time (a convex combination of covariances stays a covariance) and
drawn dashed: the 1- and 2-sigma ellipses on 2-D images and 3-D slices, the Gaussian density
in 1-D, the moment curves in :func:`moments_figure`.

>>> from tpde.plots import plot_all
>>> plot_all("out.nc", "figures", animate_density=True)  # doctest: +SKIP
[PosixPath('figures/density.png'), ...]
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from tpde.validation import figure_data as fd

from . import geometries

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.axes import Axes
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

__all__ = [
    "animate",
    "compare_figure",
    "density_figure",
    "energies_figure",
    "mass_figure",
    "moments_figure",
    "plot_all",
    "position_marginal_figure",
    "projection_figure",
    "slices_figure",
]

AXES = ("x", "y", "z")
DEFAULT_SNAPSHOTS = 5
CMAP = "magma"
REF_COLOUR = "cyan"
DPI = 110
SIGMAS = (1.0, 2.0)
# The three slice / projection planes of a 3-D density: (horizontal axis, vertical axis).
PLANES = ((0, 1), (0, 2), (1, 2))
ROUNDOFF = fd.ROUNDOFF  # zero to round-off (tpde.validation.figure_data)
POSITION = "s"  # the position dimension of masked (causal) attention
#: a record whose largest magnitude is at most this times its natural scale (the spread for a
#: mean, the initial mass for a mass drift) is zero to round-off: said in words, not drawn
#: (a 1e-14 curve on its own axis looks like an exponential blow-up)
#: what an energy record is, in words (the panel's title) and as a formula (its axis label);
#: docs/theory.md, 'Energies and Lyapunov functions'
ENERGY_NAMES = {
    "trace_lyapunov": ("trace Lyapunov function", "tr(V^-1 Sigma)"),
    "interaction": ("interaction energy", "1/2 iint exp(<A x, y>) dmu dmu"),
    "sinkhorn_self_cost": ("entropic self-transport cost", "1/2 OT_eps(mu, mu)"),
}
#: what the theory says of an energy record's ``monotone`` attribute, in words
MONOTONE_WORDS = {
    "decreasing": "the theory: never increases",
    "increasing": "the theory: never decreases",
    "none": "the theory: no monotonicity proven for these parameters",
}


# ---- inputs ---------------------------------------------------------------------------------
def _as_dataset(ds: xr.Dataset | str | os.PathLike[str]) -> xr.Dataset:
    """The Dataset itself, or the one in the NetCDF file ``ds`` (opened lazily); variables
    of earlier layouts under their current names (``mean`` -> ``mean_position``)."""
    from tpde.io import renamed

    if isinstance(ds, str | os.PathLike):
        import xarray as xr

        path = Path(ds)
        if not path.is_file():
            raise ValueError(f"plot: {path} does not exist or is not a file")
        return renamed(xr.open_dataset(path))
    return renamed(ds)


def _source(ds: xr.Dataset) -> str:
    """How error messages name ``ds``: its file when it was read from one."""
    source = ds.encoding.get("source") if hasattr(ds, "encoding") else None
    return str(source) if source else "the dataset"


def _spatial_dims(ds: xr.Dataset) -> tuple[str, ...]:
    """The spatial dimensions of ``ds.density`` in x, y, z order; ValueError if unusable."""
    if "density" not in getattr(ds, "data_vars", {}):
        raise ValueError(f"plot: {_source(ds)} has no 'density' variable; is it a tpde output?")
    dims = ds["density"].dims
    spatial = tuple(a for a in AXES if a in dims)
    other = [dim for dim in dims if dim not in ("time", POSITION) and dim not in AXES]
    if "time" not in dims or other or spatial != AXES[: len(spatial)] or not spatial:
        raise ValueError(
            f"plot: {_source(ds)} has density with dims {dims}; expected "
            "(time, x), (time, x, y) or (time, x, y, z), optionally with s"
        )
    return spatial


def _sliced(ds: xr.Dataset) -> bool:
    """Whether ``ds.density`` has the position dimension ``s`` (masked attention)."""
    return POSITION in ds["density"].dims


def _edges(ds: xr.Dataset, name: str) -> np.ndarray:
    """Cell edges along axis ``name``: from its bounds variable, else from the centres."""
    bounds = ds[name].attrs.get("bounds", f"{name}_bounds") if name in ds.coords else None
    if bounds is not None and bounds in ds.variables:
        b = np.asarray(ds[bounds].values, dtype=float)
        if b.ndim == 2 and b.shape[1] == 2:
            return np.r_[b[:, 0], b[-1, 1]]
    centres = np.asarray(ds[name].values, dtype=float)
    if centres.size == 1:
        return np.array([centres[0] - 0.5, centres[0] + 0.5])
    mid = 0.5 * (centres[1:] + centres[:-1])
    return np.r_[2 * centres[0] - mid[0], mid, 2 * centres[-1] - mid[-1]]


def _centres(ds: xr.Dataset, name: str) -> np.ndarray:
    if name in ds.coords:
        return np.asarray(ds[name].values, dtype=float)
    edges = _edges(ds, name)
    return 0.5 * (edges[1:] + edges[:-1])


def _times(ds: xr.Dataset) -> np.ndarray:
    if "time" in ds.coords:
        return np.asarray(ds["time"].values, dtype=float)
    return np.arange(ds.sizes["time"], dtype=float)


def _snapshot(ds: xr.Dataset, spatial: tuple[str, ...], index: int) -> np.ndarray:
    """One density snapshot as a float array indexed ``[x, y, z]`` (only it is loaded); with
    positions the x-marginal, the sum over s (NaN where any slice is NaN)."""
    rho = ds["density"].isel(time=index)
    if POSITION in rho.dims:
        rho = rho.sum(POSITION, skipna=False)
    return np.asarray(rho.transpose(*spatial).values, dtype=float)


def _slices(ds: xr.Dataset, spatial: tuple[str, ...], index: int) -> np.ndarray:
    """The slices of one snapshot, float array (S, *cells) indexed ``[k, x, y, z]``."""
    rho = ds["density"].isel(time=index).transpose(POSITION, *spatial)
    return np.asarray(rho.values, dtype=float)


def _positions(ds: xr.Dataset) -> np.ndarray:
    """The positions s (S,): the ``s`` coordinate, else evenly spaced in [0, 1]."""
    if POSITION in ds.coords:
        return np.asarray(ds[POSITION].values, dtype=float)
    count = ds.sizes[POSITION]
    return np.arange(count) / max(count - 1, 1)


def _cell_volume(ds: xr.Dataset, spatial: tuple[str, ...]) -> np.ndarray:
    """Cell volumes, broadcastable to a snapshot indexed ``[x, y, z]``."""
    return fd.cell_volumes([_edges(ds, name) for name in spatial])


def _slice_stats(
    ds: xr.Dataset, spatial: tuple[str, ...], index: int
) -> tuple[np.ndarray, np.ndarray]:
    """slice_mass (S,) and slice_mean (S, d) of snapshot ``index``: the stored records,
    else computed from the density (mean of the cell centres, weighted by cell mass)."""
    d = len(spatial)
    if "slice_mass" in ds and "slice_mean" in ds:
        mass = np.asarray(ds["slice_mass"].isel(time=index).values, dtype=float)
        stored = ds["slice_mean"].isel(time=index).transpose(POSITION, ...)
        return mass, np.asarray(stored.values, dtype=float).reshape(mass.size, d)
    volumes = _cell_volume(ds, spatial)
    return fd.slice_statistics(
        _slices(ds, spatial, index), volumes, [_centres(ds, a) for a in spatial]
    )


def _pick(times: np.ndarray, wanted: Sequence[float] | None) -> list[int]:
    """Snapshot indices: up to 5 evenly spaced ones, or the nearest to each wanted time."""
    return fd.pick_snapshots(times, wanted, DEFAULT_SNAPSHOTS)


# ---- drawing helpers ------------------------------------------------------------------------
def _roundoff_notice(ax: Axes, what: str, bound: float, y: float = 0.5) -> None:
    """Say on ``ax`` that ``what`` is zero to round-off, instead of drawing its noise."""
    ax.text(
        0.5,
        y,
        f"{what}:\nzero to round-off (|.| <= {bound:.1e})",
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize="medium",
        color="0.25",
    )


def new_figure(
    width: float, height: float, layout: Literal["constrained", "compressed"] = "constrained"
) -> Figure:
    """A new figure on its own Agg canvas (no pyplot, no global backend switch).
    ``layout="compressed"`` for grids of equal-aspect images (constrained layout leaves
    them floating: titles ran into the suptitle and x labels off the bottom)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(fig)
    return fig


def band(
    ax: Axes, t: Any, values: Sequence[Any], colour: str, name: str, style: str = ":", **line: Any
) -> None:
    """One reference over several seeds: the median of ``values`` (seeds, times) against
    ``t`` drawn ``style``, and (several seeds) the band from their min to their max."""
    stack = np.asarray(values, dtype=float)
    if len(values) > 1:
        ax.fill_between(
            t,
            stack.min(axis=0),
            stack.max(axis=0),
            color=colour,
            alpha=0.3,
            label=f"{name}: min to max over {len(values)} seeds",
        )
    label = name if len(values) == 1 else f"{name}: median"
    ax.plot(t, np.median(stack, axis=0), style, color=colour, label=label, **line)


#: more token files than this share one legend line in the staircase panels
LABELLED_TOKEN_FILES = 4


def staircase_panels(
    ax_e: Axes,
    ax_c: Axes,
    run: Mapping[str, Any],
    references: Sequence[Mapping[str, Any]],
    *,
    many: str = "token files",
    missing: str = "interaction energy: not recorded (attention A is not beta I)",
    fontsize: str | float = "medium",
    ylabel: bool = True,
) -> None:
    """The energy staircase (energy over a point mass's) and the cluster count against t
    (the circle's and the sphere's ``compare``): the grid run solid (``grid + atoms`` when it
    has atoms), each token file dotted in its own colour beside it (its ``label``; more than
    :data:`LABELLED_TOKEN_FILES` share one legend line, ``<count> <many>``). ``run`` and each
    reference: ``time``, ``energy`` (None: not recorded), ``clusters``; the run's ``atoms``
    and ``beta``."""
    name = "grid + atoms" if run["atoms"] else "grid run"
    if run["energy"] is not None:
        ax_e.plot(run["time"], run["energy"], color="C0", lw=1.6, label=name)
    ax_c.step(run["time"], run["clusters"], where="post", color="C0", lw=1.6, label=name)
    shared = len(references) > LABELLED_TOKEN_FILES
    for i, one in enumerate(references):
        colour = "C1" if shared else f"C{i + 1}"
        label = one["label"] if not shared else (f"{len(references)} {many}" if i == 0 else None)
        if one["energy"] is not None:
            ax_e.plot(one["time"], one["energy"], ":", color=colour, lw=1.4, label=label)
        ax_c.step(one["time"], one["clusters"], ":", where="post", color=colour, lw=1.4,
                  label=label)  # fmt: skip
    if run["energy"] is None:
        ax_e.set_title(missing, fontsize=fontsize)
    else:
        ax_e.set_title(
            f"energy staircase (beta = {run['beta']:g}; 1: one point mass)", fontsize=fontsize
        )
        ax_e.set_ylabel("E / (e^beta / (2 beta))")
    ax_c.set_ylim(bottom=0)
    # (the default locator is a MaxNLocator, which takes integer; the stubs type Locator)
    ax_c.yaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]
    if ylabel:
        ax_c.set_ylabel("clusters")
    ax_c.set_title("clusters (maxima above 2 x uniform)", fontsize=fontsize)
    for axis in (ax_e, ax_c):
        axis.set_xlabel("t")
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="small")


def _plain(value: Any, limit: int = 120) -> str:
    """File attributes are untrusted text: one line, at most ``limit`` characters, and every
    ``$`` escaped, so matplotlib never parses them as mathtext (a crafted ``$\\frac{$``
    made ``tpde plot`` fail)."""
    text = " ".join(str(value).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text.replace("$", r"\$")


def _suptitle(fig: Figure, ds: xr.Dataset, what: str) -> None:
    title = _plain(ds.attrs.get("title", ""))
    status = _plain(ds.attrs.get("status", ""), 40)
    text = f"{title}: {what}" if title else what
    if status and status != "completed":
        when = ds.attrs.get("status_time", "")  # (float fails on a missing one)
        try:
            text += f" [{status} at t = {float(when):.4g}]"
        except (TypeError, ValueError):
            text += f" [{status}]"
    fig.suptitle(text)


def _draw_ellipses(ax: Axes, mean: np.ndarray, cov: np.ndarray, label: bool) -> None:
    for k, r in enumerate(SIGMAS):
        xy = fd.ellipse(mean, cov, r)
        ax.plot(
            xy[0],
            xy[1],
            "--",
            color=REF_COLOUR,
            lw=0.9,
            label="reference 1, 2 sigma" if label and k == 0 else None,
        )


def _image(
    ax: Axes,
    xe: np.ndarray,
    ye: np.ndarray,
    values: np.ndarray,
    vmax: float | Normalize,
    xlabel: str,
    ylabel: str,
):
    """pcolormesh of ``values[i, j]`` (i along the horizontal axis) on the cell edges; colour
    scale 0 .. ``vmax``, or the :func:`_norm` given."""
    from matplotlib.colors import Normalize

    norm = vmax if isinstance(vmax, Normalize) else Normalize(0.0, vmax)
    mesh = ax.pcolormesh(xe, ye, values.T, cmap=_cmap(), norm=norm, shading="flat")
    ax.set_aspect("equal")
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(ye[0], ye[-1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return mesh


def _physical_density(ds, picks, snaps, edges, scale, ref) -> Figure:
    """2-D snapshots of a co-moving-frame run in physical space: each cell is the
    quadrilateral ``m + L [xi edges]``; the view holds the mean +- 4 standard deviations of
    every drawn snapshot (the cells beyond carry no visible mass)."""
    times = _times(ds)
    means = np.asarray(ds["mean_position"].values, float)
    covs = np.asarray(ds["covariance"].values, float)
    xi = np.stack(np.meshgrid(edges[0], edges[1], indexing="ij"), axis=-1)
    ncol = len(picks)
    fig = new_figure(3.6 * ncol + 1.0, 3.8, "compressed")
    axes = fig.subplots(1, ncol, squeeze=False)[0]
    mesh = None
    for k, (ax, i, rho) in enumerate(zip(axes, picks, snaps, strict=True)):
        corner = np.asarray(ds["frame_mean"].values[i], float)
        matrix = np.asarray(ds["frame_matrix"].values[i], float)
        x = corner + xi @ matrix.T
        mesh = ax.pcolormesh(x[..., 0], x[..., 1], rho, cmap=_cmap(), norm=scale, shading="flat")
        spread = 4.0 * np.sqrt(np.maximum(np.diag(covs[i]), 0.0))
        ax.set_xlim(means[i][0] - spread[0], means[i][0] + spread[0])
        ax.set_ylim(means[i][1] - spread[1], means[i][1] + spread[1])
        ax.set_xlabel("x (physical)")
        ax.set_ylabel("y (physical)" if k == 0 else "")
        ax.set_title(f"t = {times[i]:.4g}")
        gaussian = None if ref is None else fd.interpolate_moments(ref, times[i])
        if gaussian is not None:
            _draw_ellipses(ax, *gaussian, label=k == 0)
    if ref is not None:
        axes[0].legend(fontsize="x-small", loc="upper right")
    assert mesh is not None
    fig.colorbar(mesh, ax=list(axes), label="density (physical)", shrink=0.9)
    _suptitle(fig, ds, "density (co-moving frame, drawn in physical space)")
    return fig


def _cmap():
    """The colour map, with no density (0, or below a log scale) drawn as its lowest colour."""
    import matplotlib

    cmap = matplotlib.colormaps[CMAP]
    return cmap.with_extremes(bad=cmap(0.0), under=cmap(0.0))


def _norm(
    top: float, log: bool = False, vmin: float | None = None, vmax: float | None = None
) -> Normalize:
    """The colour scale of density images: ``vmin`` (default 0; log: ``vmax`` / 1e6) ..
    ``vmax`` (default ``top``, the largest value drawn), linear or logarithmic."""
    from matplotlib.colors import LogNorm, Normalize

    high = float(top if vmax is None else vmax)
    if log:
        low = float(high * 1e-6 if vmin is None else vmin)
        if not 0 < low < high:
            raise ValueError(f"plot: a log scale needs 0 < vmin < vmax, got {low:g}, {high:g}")
        return LogNorm(low, high, clip=False)
    low = float(0.0 if vmin is None else vmin)
    if not low < high:
        raise ValueError(f"plot: vmin must be below vmax, got {low:g}, {high:g}")
    return Normalize(low, high)


# ---- figures --------------------------------------------------------------------------------
def density_figure(
    ds: xr.Dataset | str | os.PathLike[str],
    times: Sequence[float] | None = None,
    reference: Mapping[str, Any] | None = None,
    *,
    log: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
    title: str | None = None,
    frame_space: bool = False,
) -> Figure:
    """Density snapshots.

    Parameters
    ----------
    ds : xarray.Dataset or path
        A run's output.
    times : sequence of float, optional
        The times to draw (each snaps to the nearest stored snapshot); default up to 5 evenly
        spaced snapshots, the first and the last included.
    reference : mapping, optional
        Reference moments ``time`` (m,), ``mean`` (m, d), ``covariance`` (m, d, d); drawn as
        the Gaussian density (1-D, dashed, scaled to the snapshot's mass) or the 1- and
        2-sigma ellipses (2-D images; 3-D slices: the Gaussian's level sets on each plane),
        up to the reference's last time (a reference that blew up is not drawn after).
    log, vmin, vmax : the colour scale (1-D: the density axis): logarithmic, and its limits
        (default 0, or vmax / 1e6 on a log scale, .. the largest value drawn).
    title : replaces the file's ``title`` in the figure title.
    frame_space : a run in the co-moving frame (2-D) is drawn in physical space, the
        density over the cells' physical quadrilaterals (``density / frame_jacobian``);
        True draws the frame's own grid instead.

    Returns
    -------
    matplotlib.figure.Figure
        1-D: one axes with a line per time. 2-D: a row of images on the cell edges with a
        shared colour scale. 3-D: a row per time of the x-y, x-z and y-z slices through the
        density maximum, shared colour scale.
    """
    ds = _as_dataset(ds)
    if title is not None:
        ds = ds.assign_attrs(title=title)
    spatial = _spatial_dims(ds)
    d = len(spatial)
    ref = fd.reference_moments(reference, d)
    all_times = _times(ds)
    picks = _pick(all_times, times)
    snaps = [_snapshot(ds, spatial, i) for i in picks]
    edges = [_edges(ds, a) for a in spatial]

    if d == 1:
        fig = new_figure(7.0, 4.2)
        ax = fig.add_subplot()
        x = _centres(ds, "x")
        mass = np.asarray(ds["mass"].values, float) if "mass" in ds else None
        for k, (i, rho) in enumerate(zip(picks, snaps, strict=True)):
            colour = f"C{k % 10}"
            ax.plot(x, rho, color=colour, lw=1.4, label=f"t = {all_times[i]:.4g}")
            gaussian = None if ref is None else fd.interpolate_moments(ref, all_times[i])
            if gaussian is not None:
                m, c = gaussian
                scale = mass[i] if mass is not None and np.isfinite(mass[i]) else 1.0
                xf = np.linspace(edges[0][0], edges[0][-1], 800)
                pdf = fd.gaussian_pdf(xf, m[0], c[0, 0], scale)
                ax.plot(
                    xf,
                    pdf,
                    "--",
                    color=colour,
                    lw=1.0,
                    label="reference Gaussian" if k == 0 else None,
                )
        ax.set_xlim(edges[0][0], edges[0][-1])
        top = fd.top_value(snaps)
        norm = _norm(top, log, vmin, vmax)
        if log:
            ax.set_yscale("log")
        ax.set_ylim(norm.vmin, 1.05 * top if vmax is None else vmax)
        ax.set_xlabel(_label(ds, "x"))
        ax.set_ylabel("density")
        ax.legend(fontsize="small")
        _suptitle(fig, ds, "density")
        return fig

    framed = d == 2 and "frame_matrix" in ds and not frame_space
    if framed:  # the co-moving frame: the physical density, drawn where it is
        jacobian = np.asarray(ds["frame_jacobian"].values, float)
        snaps = [rho / jacobian[i] for i, rho in zip(picks, snaps, strict=True)]
    scale = _norm(fd.top_value(snaps), log, vmin, vmax)
    if framed:
        return _physical_density(ds, picks, snaps, edges, scale, ref)
    if d == 2:
        ncol = len(picks)
        fig = new_figure(3.6 * ncol + 1.0, 3.8, "compressed")
        axes = fig.subplots(1, ncol, squeeze=False)[0]
        mesh = None
        for k, (ax, i, rho) in enumerate(zip(axes, picks, snaps, strict=True)):
            mesh = _image(ax, edges[0], edges[1], rho, scale, _label(ds, "x"), _label(ds, "y"))
            ax.set_title(f"t = {all_times[i]:.4g}")
            gaussian = None if ref is None else fd.interpolate_moments(ref, all_times[i])
            if gaussian is not None:
                _draw_ellipses(ax, *gaussian, label=k == 0)
                ax.set_xlim(edges[0][0], edges[0][-1])
                ax.set_ylim(edges[1][0], edges[1][-1])
            if k > 0:
                ax.set_ylabel("")
        if ref is not None:
            axes[0].legend(fontsize="x-small", loc="upper right")
        assert mesh is not None  # (_pick: at least one snapshot)
        fig.colorbar(mesh, ax=list(axes), label="density", shrink=0.9)
        _suptitle(fig, ds, "density")
        return fig

    # d == 3
    centres = [_centres(ds, a) for a in spatial]
    fig = new_figure(11.0, 3.4 * len(picks) + 0.6, "compressed")
    axes = fig.subplots(len(picks), 3, squeeze=False)
    mesh = None
    for row, (i, rho) in enumerate(zip(picks, snaps, strict=True)):
        at = fd.max_index(rho)
        gaussian = None if ref is None else fd.interpolate_moments(ref, all_times[i])
        for col, plane in enumerate(PLANES):
            a, b = plane
            fixed = 3 - a - b
            ax = axes[row, col]
            mesh = _image(
                ax,
                edges[a],
                edges[b],
                fd.plane_slice(rho, plane, at),
                scale,
                _label(ds, spatial[a]),
                _label(ds, spatial[b]),
            )
            ax.set_title(
                f"t = {all_times[i]:.4g}, {spatial[fixed]} = {centres[fixed][at[fixed]]:.3g}",
                fontsize="medium",
            )
            if gaussian is not None:
                sm, sc = fd.conditional_gaussian(*gaussian, plane, fixed, centres[fixed][at[fixed]])
                _draw_ellipses(ax, sm, sc, label=row == 0 and col == 0)
                ax.set_xlim(edges[a][0], edges[a][-1])
                ax.set_ylim(edges[b][0], edges[b][-1])
    if ref is not None:
        axes[0, 0].legend(fontsize="x-small", loc="upper right")
    assert mesh is not None  # (_pick: at least one snapshot)
    fig.colorbar(mesh, ax=axes.ravel().tolist(), label="density", shrink=0.8)
    _suptitle(fig, ds, "density slices through the maximum")
    return fig


def projection_figure(
    ds: xr.Dataset | str | os.PathLike[str],
    time: float | None = None,
    reference: Mapping[str, Any] | None = None,
) -> Figure:
    """Marginal projections of a 3-D density onto the x-y, x-z and y-z planes.

    Each panel is the sum along the third axis times its cell widths, so it integrates to
    the snapshot's mass. ``time`` snaps to the nearest snapshot (default: the last one);
    ``reference`` moments, when given, add the 1- and 2-sigma ellipses of the marginal
    covariances (the 2x2 sub-blocks).
    """
    ds = _as_dataset(ds)
    spatial = _spatial_dims(ds)
    if len(spatial) != 3:
        raise ValueError(f"plot: projections need a 3-D density; {_source(ds)} is {len(spatial)}-D")
    ref = fd.reference_moments(reference, 3)
    all_times = _times(ds)
    i = all_times.size - 1 if time is None else _pick(all_times, [time])[0]
    rho = _snapshot(ds, spatial, i)
    edges = [_edges(ds, a) for a in spatial]
    projections = fd.projections(rho, [np.diff(e) for e in edges])
    vmax = _norm(fd.top_value(projections))  # one scale object: the colour bar shows all three
    fig = new_figure(11.0, 3.9, "compressed")
    axes = fig.subplots(1, 3)
    mesh = None
    gaussian = None if ref is None else fd.interpolate_moments(ref, all_times[i])
    for k, ((a, b), proj) in enumerate(zip(PLANES, projections, strict=True)):
        ax = axes[k]
        mesh = _image(
            ax, edges[a], edges[b], proj, vmax, _label(ds, spatial[a]), _label(ds, spatial[b])
        )
        ax.set_title(f"sum over {spatial[3 - a - b]}")
        if gaussian is not None:
            m, c = gaussian
            _draw_ellipses(ax, m[[a, b]], c[np.ix_([a, b], [a, b])], label=k == 0)
            ax.set_xlim(edges[a][0], edges[a][-1])
            ax.set_ylim(edges[b][0], edges[b][-1])
    if ref is not None:
        axes[0].legend(fontsize="x-small", loc="upper right")
    assert mesh is not None  # (three planes)
    fig.colorbar(mesh, ax=list(axes), label="marginal density", shrink=0.9)
    _suptitle(fig, ds, f"marginal projections at t = {all_times[i]:.4g}")
    return fig


def moments_figure(
    ds: xr.Dataset | str | os.PathLike[str],
    reference: Mapping[str, Any] | None = None,
    log: bool = False,
) -> Figure:
    """Mean components and covariance eigenvalues against time.

    The eigenvalues (``numpy.linalg.eigvalsh``, ascending) are drawn as lambda_1 ... lambda_d;
    ``reference`` moments are drawn dashed with open markers in the same colours, on top of
    the run's (wider, paler) curves so that neither hides the other; ``log=True`` puts the
    eigenvalues on a log scale. Snapshots with non-finite covariances (a blow-up) are gaps.
    A mean component that stays zero to round-off (``|mean| <= ROUNDOFF`` times the spread
    ``sqrt(max tr Sigma)``, in the run and in the reference) is not drawn: the panel says so.
    """
    ds = _as_dataset(ds)
    spatial = _spatial_dims(ds)
    d = len(spatial)
    ref = fd.reference_moments(reference, d)
    for name in ("mean_position", "covariance"):
        if name not in ds:
            raise ValueError(f"plot: {_source(ds)} has no {name!r} variable")
    t = _times(ds)
    mean = np.asarray(ds["mean_position"].transpose("time", ...).values, float)
    mean = mean.reshape(t.size, d)
    cov = np.asarray(ds["covariance"].transpose("time", ...).values, float)
    eigs = fd.eigenvalues(cov.reshape(t.size, d, d))
    traces = np.trace(cov.reshape(t.size, d, d), axis1=1, axis2=2)
    spread = float(np.sqrt(np.nanmax(traces))) if np.isfinite(traces).any() else np.nan

    fig = new_figure(11.0, 4.2)
    ax_mean, ax_eig = fig.subplots(1, 2)
    run_style = {"lw": 2.4, "alpha": 0.55, "zorder": 2}
    ref_style = {"lw": 1.1, "marker": "o", "ms": 3.5, "mfc": "none", "zorder": 3}
    zero: list[tuple[int, float]] = []
    for k in range(d):
        bound = fd.roundoff_bound(mean[:, k], spread)
        if bound is not None and ref is not None:
            ref_bound = fd.roundoff_bound(ref["mean"][:, k], spread)
            bound = None if ref_bound is None else max(bound, ref_bound)
        if bound is None:
            ax_mean.plot(t, mean[:, k], "-", color=f"C{k}", label=f"mean {spatial[k]}", **run_style)
        else:
            zero.append((k, bound))
        ax_eig.plot(t, eigs[:, k], "-", color=f"C{k}", label=f"lambda_{k + 1}", **run_style)
    if ref is not None:
        rt = ref["time"]
        every = max(1, rt.size // 12)
        ref_eigs = fd.eigenvalues(ref["cov"])
        drawn_mean = False
        for k in range(d):
            label = "reference (dashed)"
            if k not in [z for z, _ in zero]:
                ax_mean.plot(
                    rt,
                    ref["mean"][:, k],
                    "--",
                    color=f"C{k}",
                    markevery=every,
                    label=None if drawn_mean else label,
                    **ref_style,
                )
                drawn_mean = True
            ax_eig.plot(
                rt,
                ref_eigs[:, k],
                "--",
                color=f"C{k}",
                markevery=every,
                label=label if k == 0 else None,
                **ref_style,
            )
    if zero:
        names = ", ".join(f"mean {spatial[k]}" for k, _ in zero)
        where = 0.5 if len(zero) == d else 0.12
        _roundoff_notice(ax_mean, names, max(b for _, b in zero), where)
        if len(zero) == d:
            ax_mean.set_yticks([])
            if t[-1] > t[0]:
                ax_mean.set_xlim(t[0], t[-1])
    ax_mean.set_xlabel("t")
    ax_mean.set_ylabel("mean")
    ax_mean.set_title("mean")
    ax_eig.set_xlabel("t")
    ax_eig.set_ylabel("eigenvalues")
    ax_eig.set_title("eigenvalues of the covariance")
    if log:
        ax_eig.set_yscale("log")
    for ax in (ax_mean, ax_eig):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    _suptitle(fig, ds, "moments")
    return fig


def _energy_names(name: str, attrs: Mapping[str, Any]) -> tuple[str, str]:
    """(what it is in words, its formula) of the record ``energy_<name>``: tpde's own
    energies by :data:`ENERGY_NAMES`, others by their ``long_name`` and ``formula``."""
    key = name[len("energy_") :]
    if key in ENERGY_NAMES:
        return ENERGY_NAMES[key]
    words = _plain(attrs.get("long_name", key) or key, 40)
    return words, _plain(attrs.get("formula", "") or key, 32)


def energies_figure(ds: xr.Dataset | str | os.PathLike[str]) -> Figure:
    """The run's energy records (``energy_<name>``, docs/theory.md, 'Energies and Lyapunov
    functions') against time, one panel each, titled with what the record is and, in words,
    what the theory predicts of it (its ``monotone`` attribute: :data:`MONOTONE_WORDS`); the
    y axis is labelled with its formula. A record constant to round-off (its range at most
    ``ROUNDOFF`` times its size) is said so on the panel."""
    ds = _as_dataset(ds)
    names = [str(n) for n in ds.data_vars if str(n).startswith("energy_")]
    if not names:
        raise ValueError(f"plot: {_source(ds)} has no energy records (energy_<name>)")
    t = _times(ds)
    fig = new_figure(4.6 * len(names) + 0.6, 4.0)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        attrs = ds[name].attrs
        values = np.asarray(ds[name].values, float)
        words, formula = _energy_names(name, attrs)
        ax.plot(t, values, "-", color="C0")
        monotone = str(attrs.get("monotone", "none"))
        said = MONOTONE_WORDS.get(monotone, f"the theory: {_plain(monotone, 20)}")
        ax.set_title(f"{words}\n({said})", fontsize="medium")
        ax.set_xlabel("t")
        ax.set_ylabel(formula, fontsize="small")
        finite = values[np.isfinite(values)]
        if finite.size:
            bound = fd.roundoff_bound(finite - finite[0], float(np.max(np.abs(finite))))
            if bound is not None and finite.size > 1:
                _roundoff_notice(ax, "change", bound, 0.2)
        ax.grid(True, alpha=0.3)
    _suptitle(fig, ds, "energies")
    return fig


def mass_figure(ds: xr.Dataset | str | os.PathLike[str]) -> Figure:
    """Mass, cumulative outflow and their sum against time.

    The left panel draws the three curves; the right one the drift of ``mass + outflow``
    from its initial value, which a conservative scheme keeps at round-off.
    """
    ds = _as_dataset(ds)
    _spatial_dims(ds)
    if "mass" not in ds:
        raise ValueError(f"plot: {_source(ds)} has no 'mass' variable")
    t = _times(ds)
    mass = np.asarray(ds["mass"].values, float)
    outflow = np.asarray(ds["outflow"].values, float) if "outflow" in ds else np.zeros_like(mass)
    total = mass + outflow
    fig = new_figure(11.0, 4.2)
    ax, ax_drift = fig.subplots(1, 2)
    ax.plot(t, mass, "-", color="C0", label="mass in the box")
    ax.plot(t, outflow, "-", color="C1", label="outflow (cumulative)")
    ax.plot(t, total, "--", color="k", label="mass + outflow")
    ax.set_xlabel("t")
    ax.set_ylabel("mass")
    ax.set_title("mass and outflow")
    ax.legend(fontsize="small")
    drift = total - total[0]
    bound = fd.roundoff_bound(drift, float(abs(total[0])) if np.isfinite(total[0]) else np.nan)
    if bound is None:
        ax_drift.plot(t, drift, "-", color="k")
    else:  # the conservative scheme's round-off: said, not drawn as a curve
        _roundoff_notice(ax_drift, "drift", bound)
        ax_drift.set_yticks([])
        if t.size > 1 and t[-1] > t[0]:
            ax_drift.set_xlim(t[0], t[-1])
    ax_drift.set_xlabel("t")
    ax_drift.set_ylabel("(mass + outflow)(t) - (mass + outflow)(0)", fontsize="small")
    ax_drift.set_title("conservation")
    if bound is None:
        ax_drift.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3), useOffset=False)
    for a in (ax, ax_drift):
        a.grid(True, alpha=0.3)
    _suptitle(fig, ds, "mass")
    return fig


def _require_slices(ds: xr.Dataset) -> None:
    if not _sliced(ds):
        raise ValueError(
            f"plot: {_source(ds)} has no position dimension 's'; position "
            "figures need a masked-attention run"
        )


def _slice_picks(count: int) -> list[int]:
    """The sink (0), the middle (count // 2) and the last slice, without repeats."""
    return sorted({0, count // 2, count - 1})


def _draw_slice(
    fig: Figure, ax: Axes, ds: xr.Dataset, spatial: tuple[str, ...], values: np.ndarray
) -> None:
    """One slice on its own scale: 1-D a line of ``values`` (nx,); 2-D an image of ``values``
    (nx, ny); 3-D an image of its x-y plane through the middle z cell (``values`` (nx, ny,
    nz)), with a colour bar."""
    edges = [_edges(ds, a) for a in spatial]
    if len(spatial) == 1:
        ax.plot(_centres(ds, "x"), values, color="C0", lw=1.4)
        ax.set_xlim(edges[0][0], edges[0][-1])
        ax.set_ylim(bottom=0.0)
        ax.set_xlabel(_label(ds, "x"))
        ax.set_ylabel("density")
        ax.grid(True, alpha=0.3)
        return
    if len(spatial) == 3:
        values = values[:, :, values.shape[2] // 2]
    mesh = _image(
        ax, edges[0], edges[1], values, fd.top_value([values]), _label(ds, "x"), _label(ds, "y")
    )
    fig.colorbar(mesh, ax=ax, label="density", shrink=0.8)


def slices_figure(ds: xr.Dataset | str | os.PathLike[str], time: float | None = None) -> Figure:
    """Three position slices of the density side by side (masked-attention runs).

    The sink (s = 0), the middle slice and the last slice (s = 1) at the last snapshot, or
    the one nearest to ``time``; each panel is titled with s and the slice mass and has its
    own scale (the slices carry different masses). 1-D: a line each; 2-D: an image each;
    3-D: the x-y plane through the middle z cell of each. ValueError without an ``s``
    dimension.
    """
    ds = _as_dataset(ds)
    spatial = _spatial_dims(ds)
    _require_slices(ds)
    all_times = _times(ds)
    i = _pick(all_times, None if time is None else [time])[-1]
    rho = _slices(ds, spatial, i)
    s = _positions(ds)
    mass, _ = _slice_stats(ds, spatial, i)
    picks = _slice_picks(rho.shape[0])
    d = len(spatial)
    fig = new_figure(3.8 * len(picks) + 0.6, 3.6 if d == 1 else 3.9, _layout(d))
    axes = fig.subplots(1, len(picks), squeeze=False)[0]
    for ax, k in zip(axes, picks, strict=True):
        _draw_slice(fig, ax, ds, spatial, rho[k])
        sink = " (sink)" if k == 0 else ""
        ax.set_title(f"s = {s[k]:.3g}{sink}, mass {mass[k]:.4g}", fontsize="medium")
    where = f"t = {all_times[i]:.4g}"
    if d == 3:
        z = _centres(ds, "z")
        where += f", z = {z[z.size // 2]:.3g}"
    _suptitle(fig, ds, f"position slices at {where}")
    return fig


def _layout(d: int) -> Literal["constrained", "compressed"]:
    return "constrained" if d == 1 else "compressed"


def position_marginal_figure(ds: xr.Dataset | str | os.PathLike[str]) -> Figure:
    """The position marginal and the slice means against s, at the first and last time.

    Left: ``slice_mass`` against s (the marginal nu is invariant, so the two times
    coincide up to outflow). Right: the components of ``slice_mean`` against s. The first
    time is dashed with open markers, the last solid. ValueError without an ``s`` dimension.
    """
    ds = _as_dataset(ds)
    spatial = _spatial_dims(ds)
    _require_slices(ds)
    t = _times(ds)
    _pick(t, None)  # ValueError without snapshots
    s = _positions(ds)
    fig = new_figure(11.0, 4.2)
    ax_mass, ax_mean = fig.subplots(1, 2)
    styles = (
        {"ls": "--", "marker": "o", "mfc": "none", "lw": 1.0},
        {"ls": "-", "marker": ".", "lw": 1.4},
    )
    for index, style in zip((0, t.size - 1), styles, strict=True):
        mass, mean = _slice_stats(ds, spatial, index)
        when = f"t = {t[index]:.4g}"
        ax_mass.plot(s, mass, color="k", label=when, **style)
        for a, name in enumerate(spatial):
            ax_mean.plot(s, mean[:, a], color=f"C{a}", label=f"mean {name}, {when}", **style)
    ax_mass.set_ylim(bottom=0.0)
    ax_mass.set_ylabel("slice mass")
    ax_mass.set_title("position marginal nu")
    ax_mean.set_ylabel("slice mean")
    ax_mean.set_title("mean of each slice")
    for ax in (ax_mass, ax_mean):
        ax.set_xlabel("s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    _suptitle(fig, ds, "positions")
    return fig


def _label(ds: xr.Dataset, name: str) -> str:
    units = _plain(ds[name].attrs.get("units", ""), 40) if name in ds.coords else ""
    return f"{name} [{units}]" if units and units != "1" else name


# ---- animation ------------------------------------------------------------------------------
def animate(
    ds: xr.Dataset | str | os.PathLike[str], path: str | os.PathLike[str], fps: int = 10
) -> Path:
    """Animate the density over all snapshots and write it to ``path``.

    1-D: a line; 2-D: an image on the cell edges; 3-D: the x-y slice through the maximum of
    each snapshot; one colour (or y) scale for all frames. The file is an MP4 through
    ffmpeg (``matplotlib.animation.FFMpegWriter``) when ffmpeg is available, else a GIF through
    Pillow; a ``.gif`` path always gets a GIF. The suffix is changed to match the writer.

    Returns
    -------
    pathlib.Path
        The file actually written.
    """
    from matplotlib.animation import FFMpegWriter, FuncAnimation, PillowWriter

    ds = _as_dataset(ds)
    spatial = _spatial_dims(ds)
    d = len(spatial)
    t = _times(ds)
    path = Path(path)
    if path.suffix.lower() != ".gif" and FFMpegWriter.isAvailable():
        writer: Any = FFMpegWriter(fps=fps, bitrate=1800)
        path = path.with_suffix(".mp4")
    else:
        writer = PillowWriter(fps=fps)
        path = path.with_suffix(".gif")
    path.parent.mkdir(parents=True, exist_ok=True)

    top = fd.top_value(_snapshot(ds, spatial, i) for i in range(t.size))
    edges = [_edges(ds, a) for a in spatial]
    fig = new_figure(6.0, 4.2 if d == 1 else 5.0)
    ax = fig.add_subplot()
    title = _plain(ds.attrs.get("title", ""))
    prefix = f"{title}: " if title else ""

    if d == 1:
        (line,) = ax.plot(_centres(ds, "x"), _snapshot(ds, spatial, 0), color="C0")
        ax.set_xlim(edges[0][0], edges[0][-1])
        ax.set_ylim(0.0, 1.05 * top)
        ax.set_xlabel(_label(ds, "x"))
        ax.set_ylabel("density")

        def update(i: int):
            line.set_ydata(_snapshot(ds, spatial, i))
            ax.set_title(f"{prefix}t = {t[i]:.4g}")
            return (line,)
    else:
        centres_z = _centres(ds, "z") if d == 3 else None

        def frame(i: int) -> tuple[np.ndarray, str]:
            rho = _snapshot(ds, spatial, i)
            if d == 2:
                return rho, ""
            at = fd.max_index(rho)
            assert centres_z is not None  # (d == 3)
            return fd.plane_slice(rho, (0, 1), at), f", z = {centres_z[at[2]]:.3g}"

        first, _ = frame(0)
        mesh = _image(ax, edges[0], edges[1], first, top, _label(ds, "x"), _label(ds, "y"))
        fig.colorbar(mesh, ax=ax, label="density")

        def update(i: int):
            values, where = frame(i)
            mesh.set_array(values.T.ravel())
            ax.set_title(f"{prefix}t = {t[i]:.4g}{where}")
            return (mesh,)

    update(0)
    animation = FuncAnimation(fig, update, frames=t.size, blit=False, repeat=False)
    animation.save(path, writer=writer, dpi=DPI)
    fig.clear()
    return path


# ---- everything -----------------------------------------------------------------------------
def plot_all(
    ds: xr.Dataset | str | os.PathLike[str],
    outdir: str | os.PathLike[str],
    reference: Mapping[str, Any] | None = None,
    animate_density: bool = False,
    *,
    times: Sequence[float] | None = None,
    log: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
    title: str | None = None,
    frame_space: bool = False,
) -> list[Path]:
    """Write the standard figures of a run into ``outdir`` (created if needed).

    ``times``, ``log``, ``vmin``, ``vmax``: the snapshots and the colour scale of
    ``density.png`` (:func:`density_figure`); ``title`` replaces the file's title in every
    figure. Works on every file with a density: runs, ``tpde gaussian`` and ``tpde
    particles`` outputs.

    Files: ``density.png``, ``moments.png``, ``mass.png``, with energy records
    ``energies.png`` (:func:`energies_figure`), in 3-D also ``projections.png``
    (at the last snapshot), with position slices (a ``density`` with dimension ``s``) also
    ``slices.png`` (:func:`slices_figure`) and ``position_marginal.png``
    (:func:`position_marginal_figure`), and with ``animate_density`` the animation
    ``density.mp4`` or ``density.gif`` (see :func:`animate`). ``ds`` may be a path of a
    NetCDF file, which is opened lazily and closed at the end.

    Returns
    -------
    list of pathlib.Path
        The files written, in that order.
    """
    opened = isinstance(ds, str | os.PathLike)
    ds = _as_dataset(ds)
    source = ds
    if title is not None:
        ds = ds.assign_attrs(title=title)
    try:
        spatial = _spatial_dims(ds)
        outdir = Path(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        jobs = [
            (
                "density.png",
                lambda: density_figure(
                    ds, times, reference, log=log, vmin=vmin, vmax=vmax, frame_space=frame_space
                ),
            ),
            ("moments.png", lambda: moments_figure(ds, reference=reference)),
            ("mass.png", lambda: mass_figure(ds)),
        ]
        geometry = geometries.of_dataset(ds)
        own: dict = {} if geometry.figures is None else geometries.load(geometry.figures)(ds, times)
        jobs = [(name, own.pop(name, make)) for name, make in jobs]  # (replaced in place)
        if any(str(name).startswith("energy_") for name in ds.data_vars):
            jobs.append(("energies.png", lambda: energies_figure(ds)))
        if len(spatial) == 3:
            jobs.append(("projections.png", lambda: projection_figure(ds, reference=reference)))
        if _sliced(ds):
            jobs += [
                ("slices.png", lambda: slices_figure(ds)),
                ("position_marginal.png", lambda: position_marginal_figure(ds)),
            ]
        jobs += own.items()  # (the geometry's own figures: tpde.geometries)
        written = []
        for name, make in jobs:
            fig = make()
            target = outdir / name
            fig.savefig(target, dpi=DPI, bbox_inches="tight", pad_inches=0.05)
            fig.clear()
            written.append(target)
        if animate_density:
            written.append(animate(ds, outdir / "density.mp4"))
        return written
    finally:
        if opened:
            source.close()


# ---- grid run, tokens and ODE side by side ----------------------------------------------------
COMPARE_DISTANCES = 8  # W2 is computed at up to this many snapshot times (POT, ~0.1 s each)


def _kind(ds: xr.Dataset) -> str:
    """Which tool wrote ``ds``: "particles" (tokens), "gaussian" (the ODE), "run" (a grid
    file without ``outflow`` is a Gaussian ODE's; a layout of a geometry's own has no ODE)."""
    if "tokens" in ds.variables:
        return "particles"
    own = geometries.of_dataset(ds).layout is not None
    if str(ds.attrs.get("title", "")).startswith("tpde Gaussian") or (
        "outflow" not in ds.variables and "density" in ds.variables and not own
    ):
        return "gaussian"
    return "run"


def _marginal(ds: xr.Dataset, spatial: tuple[str, ...], index: int) -> np.ndarray:
    """The x-marginal density of snapshot ``index`` (summed over s), ``[x, y, z]``."""
    return _snapshot(ds, spatial, index)


def _moments_of(ds: xr.Dataset, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = _times(ds)
    mean = np.asarray(ds["mean_position"].transpose("time", ...).values, float).reshape(t.size, d)
    cov = np.asarray(ds["covariance"].transpose("time", ...).values, float).reshape(t.size, d, d)
    return t, mean, cov


def _picture(ds: xr.Dataset, spatial: tuple[str, ...], index: int) -> np.ndarray:
    """What a density panel draws: the density in 1-D and 2-D, the x-y marginal in 3-D."""
    rho = _marginal(ds, spatial, index)
    if len(spatial) == 3:
        rho = fd.xy_marginal(rho, np.diff(_edges(ds, "z")))
    return rho


def compare_figure(
    run: xr.Dataset | str | os.PathLike[str],
    particles: (
        xr.Dataset | str | os.PathLike[str] | Sequence[xr.Dataset | str | os.PathLike[str]] | None
    ) = None,
    gaussian: xr.Dataset | str | os.PathLike[str] | None = None,
    time: float | None = None,
    *,
    log: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
    title: str | None = None,
    distances: int = COMPARE_DISTANCES,
) -> Figure:
    """One configuration's grid run, tokens (``tpde particles``) and Gaussian ODE (``tpde
    gaussian``) side by side (``tpde compare``); either reference may be missing.

    Top: the density at ``time`` (default: the run's last snapshot), the token histogram and
    the ODE's Gaussian on the run's grid, one colour scale (``log``, ``vmin``, ``vmax``),
    with the ODE's 1- and 2-sigma ellipses (1-D: the three curves on one axes; 3-D: the x-y
    marginals; masked runs: the x-marginal). Bottom: the mean and the covariance
    eigenvalues against t (run solid, tokens dotted, ODE dashed), their differences to the
    run on a log scale, the W2 distance of each reference to the run (at up to
    ``distances`` snapshot times; POT, tpde.validation.metrics), and the run's energies.
    A reference's curves stop where it does (the ODE at a blow-up), and its panel says so
    when it has no snapshot at ``time``.

    A run on the circle is drawn in the circle's terms (:func:`tpde.circle_plots.
    compare_figure`: the order parameter and ``W_1`` on the circle, not an angle's mean and
    variance); there ``particles`` may be several token runs (seeds), drawn as a band.
    """
    import xarray

    from tpde.io import grid_from_dataset

    run = _as_dataset(run)
    token_runs: list = []
    if isinstance(particles, str | os.PathLike | xarray.Dataset):
        token_runs = [particles]
    elif particles is not None:
        token_runs = list(particles)  # (several token runs: seeds)

    geometry = geometries.of_dataset(run)
    if geometry.compare is not None:  # (the geometry's own figure: tpde.geometries)
        return geometries.load(geometry.compare)(run, token_runs, gaussian, time, title)
    if len(token_runs) > 1:
        raise ValueError(
            "compare: several token files are drawn as a band on the circle and the sphere "
            "only; "
            "give one tpde particles file"
        )
    particles = token_runs[0] if token_runs else None
    refs = {"tokens": particles, "ODE": gaussian}
    sets = {name: None if value is None else _as_dataset(value) for name, value in refs.items()}
    if title is not None:
        run = run.assign_attrs(title=title)
    spatial = _spatial_dims(run)
    d = len(spatial)
    grid = grid_from_dataset(run)
    for ds in sets.values():
        if ds is None:
            continue
        if _spatial_dims(ds) != spatial or grid_from_dataset(ds) != grid:
            raise ValueError(
                f"compare: {_source(ds)} is not on the grid of {_source(run)}; write the "
                "references with the run's config (tpde particles / tpde gaussian CONFIG)"
            )
    times = _times(run)
    i_run = _pick(times, None if time is None else [time])[-1]
    t = float(times[i_run])
    present = {"grid": run, **{k: v for k, v in sets.items() if v is not None}}
    ode = sets["ODE"]
    ode_moments = None if ode is None else _moments_of(ode, d)
    ode_ref = None
    if ode_moments is not None:
        ode_ref = {"time": ode_moments[0], "mean": ode_moments[1], "cov": ode_moments[2]}

    fig = new_figure(13.0, 9.0 if d > 1 else 8.0)
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.0, 1.15])  # type: ignore[misc]
    edges = [_edges(run, a) for a in spatial]
    pictures: dict[str, np.ndarray | None] = {}
    shown_at: dict[str, str] = {}  # a reference drawn at an earlier snapshot says when
    for name, ds in present.items():
        j = fd.snapshot_at_or_before(_times(ds), t)
        pictures[name] = None if j is None else _picture(ds, spatial, j)
        if j is not None and fd.snapshot_at(_times(ds), t) is None:
            shown_at[name] = f" at t = {float(_times(ds)[j]):.4g}"
    drawn = [p for p in pictures.values() if p is not None]
    scale = _norm(fd.top_value(drawn), log, vmin, vmax)
    labels = {"grid": "grid run", "tokens": "token histogram", "ODE": "Gaussian ODE"}
    styles = {"grid": "-", "tokens": ":", "ODE": "--"}
    if d == 1:
        ax = top.subplots()
        x = _centres(run, "x")
        for name, picture in pictures.items():
            if picture is None:
                last = _times(present[name])
                ax.plot(
                    [], [], styles[name], label=f"{labels[name]}: stopped at t = {last[-1]:.4g}"
                )
                continue
            kind = "steps-mid" if name == "tokens" else "default"
            ax.plot(
                x,
                picture,
                styles[name],
                drawstyle=kind,
                lw=1.3,
                label=labels[name] + shown_at.get(name, ""),
            )
        if log:
            ax.set_yscale("log")
        ax.set_ylim(scale.vmin, 1.05 * fd.top_value(drawn) if vmax is None else vmax)
        ax.set_xlim(edges[0][0], edges[0][-1])
        ax.set_xlabel(_label(run, "x"))
        ax.set_ylabel("density")
        ax.set_title(f"t = {t:.4g}")
        ax.legend(fontsize="small")
    else:
        axes = top.subplots(1, len(pictures), squeeze=False)[0]
        mesh = None
        gaussian_at = None if ode_ref is None else fd.interpolate_moments(ode_ref, t)
        for ax, (name, picture) in zip(axes, pictures.items(), strict=True):
            at = shown_at.get(name, f", t = {t:.4g}")
            ax.set_title(f"{labels[name]}{at}" + (", sum over z" if d == 3 else ""))
            ax.set_aspect("equal")
            ax.set_xlim(edges[0][0], edges[0][-1])
            ax.set_ylim(edges[1][0], edges[1][-1])
            if picture is None:
                last = _times(present[name])
                ax.text(
                    0.5,
                    0.5,
                    f"no snapshot at t = {t:.4g}\n(stopped at t = {last[-1]:.4g})",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
                ax.set_xlabel(_label(run, spatial[0]))
                continue
            mesh = _image(
                ax,
                edges[0],
                edges[1],
                picture,
                scale,
                _label(run, spatial[0]),
                _label(run, spatial[1]),
            )
            if gaussian_at is not None and name != "ODE":
                m, c = gaussian_at
                _draw_ellipses(ax, m[:2], c[:2, :2], label=name == "grid")
        if gaussian_at is not None:
            axes[0].legend(fontsize="x-small", loc="upper right")
        for ax in axes[1:]:
            ax.set_ylabel("")
        if mesh is not None:
            top.colorbar(mesh, ax=list(axes), label="density", shrink=0.9)

    ax_mean, ax_eig, ax_diff, ax_w, ax_energy, ax_info = bottom.subplots(2, 3).ravel()
    labels = {**labels, "tokens": "tokens"}  # the moments are the tokens', not the histogram's
    curves = {name: _moments_of(ds, d) for name, ds in present.items()}
    zero: list[tuple[str, float]] = []  # (whose mean, bound): zero to round-off, not drawn
    for name, (tt, mean, cov) in curves.items():
        eig = fd.eigenvalues(cov)
        traces = np.trace(cov, axis1=1, axis2=2)
        spread = float(np.sqrt(np.nanmax(traces))) if np.isfinite(traces).any() else np.nan
        bounds = [fd.roundoff_bound(mean[:, k], spread) for k in range(d)]
        if all(b is not None for b in bounds):
            zero.append((labels[name], max(b for b in bounds if b is not None)))
        for k in range(d):
            label = f"{labels[name]}" if k == 0 else None
            if bounds[k] is None:
                ax_mean.plot(tt, mean[:, k], styles[name], color=f"C{k}", lw=1.2, label=label)
            ax_eig.plot(tt, eig[:, k], styles[name], color=f"C{k}", lw=1.2, label=label)
    if zero:
        _roundoff_notice(
            ax_mean,
            "mean of the " + ", ".join(who for who, _ in zero),
            max(b for _, b in zero),
            0.5 if not ax_mean.lines else 0.15,
        )
        if not ax_mean.lines:
            ax_mean.set_yticks([])
            run_times = curves["grid"][0]
            if run_times.size > 1 and run_times[-1] > run_times[0]:
                ax_mean.set_xlim(run_times[0], run_times[-1])
    ax_mean.set_title("mean (colour: component)")
    ax_eig.set_title("covariance eigenvalues")
    if np.all([np.nanmin(fd.eigenvalues(c[2])) > 0 for c in curves.values()]):
        ax_eig.set_yscale("log")
    t_run, mean_run, cov_run = curves["grid"]
    for name in ("tokens", "ODE"):
        if name not in curves:
            continue
        tt, mean, cov = curves[name]
        common = fd.shared_snapshots(t_run, tt, t_run.size)
        if not common:
            continue
        ii, jj = (np.array(v) for v in zip(*common, strict=True))
        dmean = np.linalg.norm(mean[jj] - mean_run[ii], axis=1)
        dcov = np.linalg.norm(cov[jj] - cov_run[ii], axis=(1, 2))
        positive = {"mean": dmean, "covariance": dcov}
        for (what, values), marker in zip(positive.items(), ("o", "s"), strict=True):
            shown = np.where(values > 0, values, np.nan)
            ax_diff.plot(
                t_run[ii],
                shown,
                styles[name],
                marker=marker,
                ms=3,
                lw=1.0,
                label=f"|{what}| {labels[name]} - grid",
            )
    if _positive(ax_diff):  # (a log axis of no positive value warns and shows nothing)
        ax_diff.set_yscale("log")
    ax_diff.set_title("differences to the grid run")
    _distances(ax_w, run, sets, spatial, grid, curves, labels, styles, distances)
    energies = [str(n) for n in run.data_vars if str(n).startswith("energy_")]
    _relative_energies(ax_energy, run, t_run, energies)
    ax_info.axis("off")
    lines = [
        f"{labels[name]}: {_plain(ds.attrs.get('title', ''), 60)}"
        f" [{_plain(ds.attrs.get('status', ''), 20)}]"
        for name, ds in present.items()
    ]
    ax_info.text(
        0.0,
        1.0,
        "\n".join(lines),
        va="top",
        ha="left",
        fontsize="small",
        transform=ax_info.transAxes,
        wrap=True,
    )
    for ax in (ax_diff, ax_w):
        if not ax.lines:
            ax.set_yscale("linear")
            ax.text(
                0.5,
                0.5,
                "no reference file given",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
    for ax in (ax_mean, ax_eig, ax_diff, ax_w, ax_energy):
        ax.set_xlabel("t")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    named = ["grid run"] + [
        {"tokens": "tokens", "ODE": "Gaussian ODE"}[k] for k, v in sets.items() if v is not None
    ]
    _suptitle(
        fig, run, " and ".join([", ".join(named[:-1]), named[-1]]) if len(named) > 1 else named[0]
    )
    return fig


def _distances(ax, run, sets, spatial, grid, curves, labels, styles, count) -> None:
    """W2 of the tokens and of the ODE's Gaussian to the grid run's x-marginal, at up to
    ``count`` snapshot times the two share."""
    from tpde.validation.metrics import wasserstein, wasserstein_tokens

    t_run = curves["grid"][0]
    for name, ds in sets.items():
        if ds is None:
            continue
        tt = _times(ds)
        pairs = fd.shared_snapshots(t_run, tt, count)
        if not pairs:
            continue
        ts, values = [], []
        for i, j in pairs:
            rho = _marginal(run, spatial, i)
            if not (np.isfinite(rho).all() and rho.sum() > 0):
                continue
            if name == "tokens":
                tokens = np.asarray(ds["tokens"].isel(time=j).transpose("token", ...).values, float)
                weights = (
                    np.asarray(ds["token_weight"].values, float) if "token_weight" in ds else None
                )
                inside = np.all(np.isfinite(tokens), axis=1)
                w = None if weights is None else weights[inside]
                value = wasserstein_tokens(rho, grid, tokens[inside], w, max_cells=1024).value
            else:
                other = _marginal(ds, spatial, j)
                if not (np.isfinite(other).all() and other.sum() > 0):
                    continue
                value = wasserstein(rho, other, grid, max_cells=1024).value
            ts.append(t_run[i])
            values.append(value)
        ax.plot(ts, values, styles[name], marker="o", ms=3, label=f"{labels[name]} - grid")
    if _positive(ax):
        ax.set_yscale("log")
    ax.set_title("W2 distance to the grid run")


def _positive(ax: Axes) -> bool:
    """Whether a line of ``ax`` has a finite positive value (a log axis can show it)."""
    for line in ax.lines:
        y = np.asarray(line.get_ydata(), float)
        if np.any(np.isfinite(y) & (y > 0)):
            return True
    return False


def _relative_energies(ax: Axes, run: xr.Dataset, t: np.ndarray, energies: list[str]) -> None:
    """The run's energies as relative changes ``(E(t) - E(0)) / |E(0)|`` on one axis: energies
    of very different sizes (1e8 apart) stay readable, and the sign of each change (what the
    theory predicts of it) shows. An energy with E(0) = 0 is drawn as ``E(t)``."""
    for k, name in enumerate(energies):
        values = np.asarray(run[name].values, float)
        words, _ = _energy_names(name, run[name].attrs)
        values, note = fd.relative_change(values)
        words += note
        ax.plot(t, values, "-", color=f"C{k}", label=words)
    ax.set_title("energies of the grid run: relative change")
    if energies:
        ax.set_ylabel("(E(t) - E(0)) / |E(0)|", fontsize="small")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3), useOffset=False)
    else:
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            "no energy records in the run",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
