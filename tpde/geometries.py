"""One registry of the geometries: what the face does differently on each.

A geometry is named by ``[grid] geometry`` in a configuration and by the ``geometry``
attribute of the files its runs write (files without one are flat boxes). Each entry of
:data:`GEOMETRIES` says, by dotted name ``"module:attribute"`` (imported only when used, so
this module imports nothing of tpde and no module that registers here forms an import cycle):

* ``build``: the config builder ``raw tables -> tpde.config.Config`` (None: tpde.config's
  flat schema); ``sections``: the config's known keys per section (sweep checks its keys);
* ``grid``: the ``tpde.grid.Grid`` class a file's ``grid_*`` attributes rebuild (None: Grid);
* ``layout``: the file layout (a ``tpde.layout.FileLayout`` class) that
  ``tpde.io.SnapshotWriter`` writes and resumes for a mesh that is not a Grid (None: the
  grid runs' layout, ``tpde.layout``);
* ``mesh``: ``Dataset -> mesh``, the mesh of a file of a layout of its own (None: the Grid of
  ``tpde.io.grid_from_dataset``);
* ``info``: ``(Dataset, mesh) -> list[str]``, what ``tpde info`` says of the last snapshot
  beyond every file's lines (None: the mesh's ``state_lines`` of a grid run's density);
* ``plot``: ``(path, outdir, *, times, title) -> list[Path]``, ``tpde plot``'s whole figure
  set (None: tpde.plots.plot_all); ``figures``: ``(ds, times) -> {file name: () -> Figure}``,
  the geometry's own figures inside plot_all (a name plot_all has is replaced in place, a new
  one is appended);
* ``compare``: ``(run, token_runs, gaussian, time, title) -> Figure``, ``tpde compare`` in
  the geometry's own terms (None: tpde.plots' grid comparison).

Adding a geometry takes its modules (config, file, figures: one per layer) and one entry
here.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FLAT", "GEOMETRIES", "Geometry", "is_a", "load", "of_config", "of_dataset", "of_file"]


@dataclass(frozen=True)
class Geometry:
    """The registration of one geometry (module docstring: each hook's signature)."""

    name: str
    build: str | None = None
    sections: str | None = None
    grid: str | None = None
    layout: str | None = None
    mesh: str | None = None
    info: str | None = None
    plot: str | None = None
    figures: str | None = None
    compare: str | None = None


FLAT = Geometry("flat")
#: geometry name (the config's ``grid.geometry``, the file's ``geometry`` attribute) -> hooks
GEOMETRIES: dict[str, Geometry] = {
    g.name: g
    for g in (
        FLAT,
        # docs/theory.md, 'The circle on the grid': flat files with a periodic angle grid
        Geometry(
            "circle",
            build="tpde.circle:build_circle",
            sections="tpde.circle:CONFIG_SECTIONS",
            grid="tpde.grid.circle:CircleGrid",
            figures="tpde.circle_plots:plot_figures",
            compare="tpde.circle_plots:compare_runs",
        ),
        # the cubed sphere: its own run, file layout (one cell axis, lat/lon) and figures
        Geometry(
            "sphere",
            build="tpde.sphere:build_sphere",
            sections="tpde.sphere:CONFIG_SECTIONS",
            layout="tpde.sphere:SphereLayout",
            mesh="tpde.sphere:grid_of",
            info="tpde.sphere:info_lines",
            plot="tpde.sphere_plots:plot_sphere",
            compare="tpde.sphere_plots:compare_runs",
        ),
    )
}


def load(dotted: str) -> Any:
    """The attribute a registry entry names: ``"tpde.sphere:info_lines"`` -> the function."""
    module, _, name = dotted.partition(":")
    return vars(importlib.import_module(module))[name]


def of_config(raw: Mapping) -> Any:
    """The ``grid.geometry`` of raw config tables ("flat" when absent; any value as given,
    an unknown one is the builder's to name)."""
    grid = raw.get("grid")
    return grid.get("geometry", "flat") if isinstance(grid, Mapping) else "flat"


def of_dataset(ds: Any) -> Geometry:
    """The geometry of a Dataset (or a mapping of file attributes) by its ``geometry``
    attribute; absent or unknown: flat (the grid reader then checks the file)."""
    import xarray as xr

    attrs = ds.attrs if isinstance(ds, xr.Dataset) else ds  # (a Dataset maps its variables)
    return GEOMETRIES.get(str(attrs.get("geometry", "flat")), FLAT)


def is_a(ds: Any, name: str) -> bool:
    """Whether a Dataset (or its attributes) is a file of geometry ``name``: how a
    geometry's own module checks its input (:func:`of_dataset`)."""
    return of_dataset(ds).name == name


def of_file(path: str | os.PathLike[str]) -> Geometry:
    """The geometry of a file by its ``geometry`` attribute, read without loading the file;
    flat when absent, unknown or not a readable NetCDF file (the grid reader names why)."""
    import netCDF4

    try:
        with netCDF4.Dataset(path) as nc:
            name = str(nc.getncattr("geometry")) if "geometry" in nc.ncattrs() else "flat"
    except (OSError, ValueError):
        return FLAT
    return GEOMETRIES.get(name, FLAT)
