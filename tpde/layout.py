"""The CF-1.10 layout of the grid runs' files (the format: tpde.io's docstring): names,
attributes, dimensions, chunks, the stored axis order (x fastest), the file's header and
records as NetCDF variables, and the Grid / Positions rebuilt from a file's attributes.
What the layout writes is made durable by :mod:`tpde.durable`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import netCDF4
import numpy as np
import xarray as xr

import tpde
from tpde.grid import Grid, Positions, moments

from . import geometries
from .durable import RESERVE_MARGIN, OutputError, _now, _source

CONVENTIONS = "CF-1.10"
#: the values of an energy record's ``monotone`` attribute (tpde.variants.energies.MONOTONE)
ENERGY_MONOTONE = ("increasing", "decreasing", "none")
AXES = ("x", "y", "z")
_TIME_CHUNK = 256
_RECORD_CHUNK_VALUES = 8192  # at most this many values (64 KiB) per chunk of a moment record
#: values per chunk of a spatial record (density, physical_<axis>): one snapshot per chunk,
#: cut into tiles of about this many values (32 KiB), so a cell's or a line's time series
#: reads one tile per snapshot instead of the whole file (benchmarks/chunking.py)
SPATIAL_CHUNK_VALUES = 4096
_CHUNK_INDEX_BYTES = 128  # an HDF5 chunk-index entry (48 bytes in 3-D) and its node's share
S_COMMENT = "slice 0 is the attention sink at s = 0; slice k stands for positions in ((k-1)/N, k/N]"
MARGINAL_COMMENT = "of the x-marginal (density summed over s)"
#: the record of the mean (``mean`` would shadow ``xarray.Dataset.mean``: ``ds.mean.plot()``)
MEAN = "mean_position"
#: names of files written before the current layout -> the names :func:`read` gives them
RENAMED = {"mean": MEAN}
#: the time coordinate: Transformer time is the layer depth, a plain number (docstring)
TIME_ATTRIBUTES = {
    "standard_name": "time",
    "axis": "T",
    "units": "1",
    "long_name": "layer depth (Transformer time)",
}

_LONG_NAMES = {
    "density": "token density (cell averages)",
    "mass": "mass in the box",
    MEAN: "mean position of the density",
    "covariance": "covariance of the density",
    "outflow": "cumulative mass that left the box",
    "max_speed": "largest face velocity of the last step",
    "dt": "last time step",
    "slice_mass": "mass of each position slice",
    "slice_mean": "mean of each position slice",
    "slice_covariance": "covariance of each position slice",
    "frame_mean": "co-moving frame: origin m",
    "frame_matrix": "co-moving frame: matrix L",
    "frame_jacobian": "co-moving frame: |det L|",
}
#: the detail of a record beyond its short long_name (xarray's plots label an axis with the
#: long_name: a long one was clipped)
_COMMENTS = {
    "slice_mean": "normalised by the slice's mass",
    "slice_covariance": "normalised by the slice's mass",
    "frame_mean": "origin m of the frame map x = m + L xi",
    "frame_matrix": "matrix L of the frame map x = m + L xi",
    "frame_jacobian": "|det L| of x = m + L xi: physical density = density / frame_jacobian",
}
#: the physical coordinate of every cell centre in the co-moving frame, per axis
PHYSICAL = "physical_"
#: ``density``'s attributes in a co-moving-frame file: it is mass per frame volume
FRAME_DENSITY_ATTRIBUTES = {
    "long_name": "density per frame-coordinate volume",
    "comment": "cell averages in the frame coordinates xi of x = m + L xi; the physical "
    "density is density / frame_jacobian (tpde.io.physical_density)",
}
#: where an energy record's theory is told (its ``comment``)
ENERGY_COMMENT = (
    "docs/theory.md, 'Gradient flows and energies' and 'Energies and Lyapunov functions'"
)
#: the attributes of :func:`physical_density`
PHYSICAL_DENSITY_ATTRIBUTES = {
    "long_name": "token density (physical space)",
    "comment": "density / frame_jacobian: mass per unit physical volume, at the cell "
    "centres physical_<axis> (x = m + L xi)",
}
#: the static measure of the density's cells, by the grid's dimension (:func:`_define_cell_measure`)
CELL_MEASURES = {1: "cell_length", 2: "cell_area", 3: "cell_volume"}
_CELL_MEASURE_COMMENT = (
    "h_x{} of the grid: mass = sum(density * {}). Not a CF cell_measures variable (CF asks "
    "m2 or m3 of those; token coordinates are dimensionless). Named to sort first: "
    "ParaView's CF reader opens the first variable's dimensions by default"
)
_CELL_MEASURE_SLICES = ", the density's. The same for every position slice s"
_CELL_MEASURE_4D = ". (The density's (s, z, y, x) are four: that reader does not load them)"
_CELL_MEASURE_FRAME = (
    ". Cells of the co-moving frame's coordinates xi (the grid), in which the density is "
    "stored: a cell's physical measure is this times frame_jacobian (|det L|, per time)"
)


class FileLayout(Protocol):
    """A geometry's own file layout, which :class:`tpde.io.SnapshotWriter` writes where the
    grid runs' layout (this module's) does not fit the mesh: the geometry registers its class
    (``layout`` in :mod:`tpde.geometries`; the cubed sphere's ``tpde.sphere.SphereLayout``).
    The writer keeps the durability (lock, staging, reserved room, the record's time last,
    the run state, the status); the layout says what a file and a record hold."""

    #: the mesh (``grid.shape``: the shape of every density written)
    grid: Any

    @classmethod
    def reopen(cls, nc: netCDF4.Dataset, attrs: dict, where: str) -> FileLayout:
        """The layout of an existing file (its records continued by a resumed writer);
        OutputError when the file is not one of this layout."""
        ...

    def header_bytes(self, config_text: str) -> int:
        """What the empty file may take (its header)."""
        ...

    def record_bytes(self) -> int:
        """What one record may add, at most (RESERVE_MARGIN included)."""
        ...

    def create(self, path: str, config_text: str, title: str, history: str) -> None:
        """Write the empty file (every dimension, static variable and attribute; status
        ``running``) at ``path``."""
        ...

    def record(self, record: Any) -> Callable[[netCDF4.Dataset, int], None]:
        """The store of ``record`` (a :class:`tpde.io.Record`, density checked): what it
        computes (moments, diagnostics) before the writer reserves room, then ``store(nc,
        i)`` writes record ``i``'s variables (not ``time``, not the run state)."""
        ...

    def density(self, nc: netCDF4.Dataset, i: int) -> np.ndarray:
        """Record ``i``'s density in tpde's shape (``grid.shape``)."""
        ...


def _record_bytes(grid: Grid, positions: Positions | None) -> int:
    """What one record may add to a file, at most: the density (deflate can grow
    incompressible data by a few bytes per block) and an index entry per density chunk
    (_CHUNK_INDEX_BYTES, B-tree nodes included), a new chunk of every moment record (a chunk
    holds _TIME_CHUNK records), up to 8 energy records, and RESERVE_MARGIN."""
    d = grid.ndim
    sizes = (*(() if positions is None else (positions.count,)), *grid.cells[::-1])
    tiles = math.prod(-(-n // c) for n, c in zip(sizes, spatial_chunks(sizes, d)[1:], strict=True))
    cells = math.prod(grid.shape) * (1 if positions is None else positions.count)
    chunks = _TIME_CHUNK * (1 + 1 + d + d * d + 3 + 8)  # time, mass, mean, cov, 3 scalars, energies
    if positions is not None:
        chunks += sum(
            math.prod(_moment_chunks((positions.count, *inner))) for inner in ((), (d,), (d, d))
        )
    return int(1.05 * 8 * cells) + _CHUNK_INDEX_BYTES * tiles + 8 * chunks + RESERVE_MARGIN


# ---- file layout ----------------------------------------------------------------------------
def _spatial_order(dims: Sequence[str], reverse: bool) -> tuple[str, ...]:
    """``dims`` with its spatial dimensions in x, y, z order (``reverse``: z, y, x), in the
    places they had; every other dimension stays where it is."""
    out = list(dims)
    where = [i for i, name in enumerate(out) if name in AXES]
    spatial = sorted((out[i] for i in where), key=AXES.index, reverse=reverse)
    for i, name in zip(where, spatial, strict=True):
        out[i] = name
    return tuple(out)


def file_order(dims: Sequence[str]) -> tuple[str, ...]:
    """The stored order of a variable whose tpde dimensions are ``dims``: CF's ..., Z, Y, X
    (``(time, s, x, y)`` is stored ``(time, s, y, x)``; ``x_bounds(x, nv)`` stays)."""
    return _spatial_order(dims, True)


def xyz_order(dims: Sequence[str]) -> tuple[str, ...]:
    """The order tpde's arrays use (``[x, y, z]``) for a variable stored with ``dims``."""
    return _spatial_order(dims, False)


def _transposed(values: np.ndarray, have: Sequence[str], want: Sequence[str]) -> np.ndarray:
    """``values`` (dimensions ``have``) with its axes in the order ``want`` (a view)."""
    have = tuple(have)
    return np.transpose(values, [have.index(name) for name in want])


def _define_axes(nc: netCDF4.Dataset, grid: Grid) -> None:
    """Spatial dimensions, cell-centre coordinates and their bounds (cell edges). No
    ``axis`` on x and y: CF tools take ``axis = "X"/"Y"`` for longitude/latitude."""
    nc.createDimension("nv", 2)
    for a in range(grid.ndim):
        name = AXES[a]
        nc.createDimension(name, grid.cells[a])
        coord = nc.createVariable(name, "f8", (name,))
        coord.setncatts(_axis_attributes(a))
        coord.setncatts(grid.axis_attributes)  # a geometry's (the circle)
        coord[:] = grid.centres(a)
        bounds = nc.createVariable(f"{name}_bounds", "f8", (name, "nv"))
        bounds[:] = _bounds(grid, a)


def _axis_attributes(a: int) -> dict[str, str]:
    name = AXES[a]
    attributes = {
        "units": "1",
        "long_name": f"token coordinate {a + 1}",
        "comment": f"cell centres; the cells' edges are {name}_bounds",
        "bounds": f"{name}_bounds",
    }
    if name == "z":
        attributes.update(axis="Z", positive="up")
    return attributes


def _bounds(grid: Grid, a: int) -> np.ndarray:
    """The cells' edges along axis a, (cells, 2)."""
    edges = grid.edges(a)
    return np.stack([edges[:-1], edges[1:]], axis=1)


def _component_attributes(d: int, name: str) -> dict[str, Any]:
    what = "component" if name == "dim" else "second component"
    return {
        "long_name": f"{what} (axis)",
        "flag_values": np.arange(d, dtype=np.int32),
        "flag_meanings": " ".join(AXES[:d]),
    }


S_ATTRIBUTES = {"units": "1", "long_name": "token position", "comment": S_COMMENT}
WEIGHT_ATTRIBUTES = {"units": "1", "long_name": "position marginal nu (mass per slice)"}


def coordinates(grid: Grid, positions: Positions | None = None) -> xr.Dataset:
    """The coordinates every tpde file has, as a Dataset to build others on (the
    references, :func:`to_dataset`): ``x(x)``.. cell centres with ``x_bounds(x, nv)``..,
    ``dim(dim)`` and ``dim2(dim2)``, with positions ``s(s)`` and ``position_weight(s)``;
    the attributes of the run files."""
    d = grid.ndim
    variables: dict[str, Any] = {}
    coords: dict[str, Any] = {}
    for a, name in enumerate(grid.axis_names):
        coords[name] = (name, grid.centres(a), _axis_attributes(a))
        variables[f"{name}_bounds"] = ((name, "nv"), _bounds(grid, a))
    for name in ("dim", "dim2"):
        coords[name] = (name, np.arange(d, dtype=np.int32), _component_attributes(d, name))
    if positions is not None:
        coords["s"] = ("s", positions.s, dict(S_ATTRIBUTES))
        variables["position_weight"] = ("s", positions.weights, dict(WEIGHT_ATTRIBUTES))
    return xr.Dataset(variables, coords=coords)


def _cell_measure_dims(grid: Grid, positions: Positions | None) -> tuple[str, ...]:
    """The stored dimensions of the cell measure: the density's after ``time`` (``(s, y,
    x)`` with positions) when they are at most three, the ones ParaView's CF reader loads;
    else (3-D with positions, which that reader cannot load) the grid's ``(z, y, x)``."""
    dims = file_order(_density_dims(grid, positions))
    return dims if len(dims) <= 3 else file_order(grid.axis_names)


def _define_cell_measure(
    nc: netCDF4.Dataset, grid: Grid, positions: Positions | None, frame: bool = False
) -> None:
    """``cell_length(x)``, ``cell_area(y, x)`` or ``cell_volume(z, y, x)`` (``(s, ...)``
    with positions, :func:`_cell_measure_dims`): the measure of the density's cells, the
    grid's h_x h_y .., written once when the file is created. Its name sorts before every
    other data variable, so ParaView's CF reader, which loads the dimensions of the
    alphabetically first variable when none are chosen, opens the density's. ``frame``:
    the file holds a co-moving frame (the comment says which cells these are)."""
    name, measure = cell_measure(grid, positions, frame)
    dims = _cell_measure_dims(grid, positions)
    values = measure.transpose(*dims)
    var = nc.createVariable(
        name,
        "f8",
        dims,
        chunksizes=spatial_chunks(values.shape, grid.ndim)[1:],
        zlib=True,
        complevel=4,
    )
    var.setncatts(values.attrs)
    var[:] = values.values


def cell_measure(
    grid: Grid, positions: Positions | None = None, frame: bool = False
) -> tuple[str, xr.Variable]:
    """The name and the variable (tpde's axis order) of the cells' measure every file with
    a density carries (:func:`_define_cell_measure`; the references add it to their
    Datasets): ``cell_length``, ``cell_area`` or ``cell_volume``, h_x [h_y [h_z]]."""
    d = grid.ndim
    dims = xyz_order(_cell_measure_dims(grid, positions))
    sizes = {"s": 0 if positions is None else positions.count}
    sizes.update(zip(grid.axis_names, grid.cells, strict=True))
    unit = grid.axis_attributes.get("units", "1")  # the circle's radian
    attributes = {
        "long_name": f"{CELL_MEASURES[d].split('_')[1]} of each grid cell",
        "units": "1" if unit == "1" else unit + (str(d) if d > 1 else ""),
        "comment": _cell_measure_comment(grid, positions, frame),
    }
    values = np.full([sizes[n] for n in dims], grid.cell_volume)
    return CELL_MEASURES[d], xr.Variable(dims, values, attributes)


def _cell_measure_comment(grid: Grid, positions: Positions | None, frame: bool) -> str:
    d = grid.ndim
    text = _CELL_MEASURE_COMMENT.format(" h_y h_z"[: 4 * (d - 1)], CELL_MEASURES[d])
    if positions is None:
        text += ", the density's"
    else:
        text += _CELL_MEASURE_SLICES if d < 3 else _CELL_MEASURE_4D
    return text + (_CELL_MEASURE_FRAME if frame else "")


def _define_positions(nc: netCDF4.Dataset, positions: Positions) -> None:
    """The ``s`` dimension, its coordinate ``s(s)`` and ``position_weight(s)``."""
    nc.createDimension("s", positions.count)
    coord = nc.createVariable("s", "f8", ("s",))
    coord.setncatts(S_ATTRIBUTES)
    coord[:] = positions.s
    weight = nc.createVariable("position_weight", "f8", ("s",))
    weight.setncatts(WEIGHT_ATTRIBUTES)
    weight[:] = positions.weights


def _define_components(nc: netCDF4.Dataset, d: int) -> None:
    """``dim`` and ``dim2`` (the indices of a mean and a covariance): integer coordinates
    0 .. d-1 whose ``flag_meanings`` name the axes (a string coordinate is variable-length
    in NetCDF4, which CF checkers and older tools do not read)."""
    for name in ("dim", "dim2"):
        nc.createDimension(name, d)
        var = nc.createVariable(name, "i4", (name,))
        var.setncatts(_component_attributes(d, name))
        var[:] = np.arange(d, dtype=np.int32)


def _record_variable(
    nc: netCDF4.Dataset,
    name: str,
    dims: tuple[str, ...],
    chunks: tuple[int, ...],
    comment: str = "",
    cell_methods: str = "time: point",
    units: str | None = "1",
    **compression: Any,
) -> None:
    """A float64 record ``name(time, *dims)`` (``dims`` in the stored order, NaN fill);
    ``units=None``: none (CF asks none of a dimensionless quantity, and xarray's plots
    label a variable ``long_name [units]``)."""
    var = nc.createVariable(
        name, "f8", ("time", *dims), fill_value=np.nan, chunksizes=chunks, **compression
    )
    var.setncatts({"long_name": _LONG_NAMES[name], "cell_methods": cell_methods})
    if units is not None:
        var.setncattr("units", units)
    comment = comment or _COMMENTS.get(name, "")
    if comment:
        var.setncattr("comment", comment)


def spatial_chunks(
    sizes: Sequence[int], ndim: int, values: int = SPATIAL_CHUNK_VALUES, times: int = 1
) -> tuple[int, ...]:
    """Chunk sizes of a spatial record ``(time, [s,] *space)`` whose stored sizes after
    ``time`` are ``sizes`` (the last ``ndim`` spatial, in the stored order).

    ``times`` records per chunk (1: a snapshot writes new chunks only and never rewrites one
    holding earlier snapshots, which a kill during the rewrite of a compressed chunk could
    lose), spatial tiles of edge about ``values ** (1/ndim)`` (whole axes when the slab
    holds at most ``values``), and as many position slices as keep a chunk within
    ``values`` (at least one): reading one cell over time reads one tile per snapshot,
    reading a snapshot reads its tiles."""
    lead, space = tuple(sizes[: len(sizes) - ndim]), tuple(sizes[len(sizes) - ndim :])
    if math.prod(space) <= values:
        tile = space
    else:
        edge = max(1, round(values ** (1.0 / ndim)))
        tile = tuple(min(n, edge) for n in space)
    room = max(1, values // math.prod(tile))
    return (times, *(min(n, room) for n in lead), *tile)


def record_chunks(name: str, dims: Sequence[Any], inner: Sequence[int]) -> tuple[int, ...]:
    """The chunks of a record ``name(time, *dims)`` of stored sizes ``inner`` (those after
    ``time``): ``time`` in _TIME_CHUNK records, the density one snapshot in tiles of its
    spatial axes (:func:`spatial_chunks`; every axis but ``s`` spatial), every other record
    :func:`_moment_chunks`."""
    inner = tuple(int(n) for n in inner)
    if name == "time":
        return (_TIME_CHUNK,)
    if name == "density":
        return spatial_chunks(inner, sum(str(d) != "s" for d in dims))
    return _moment_chunks(inner)


def _moment_chunks(inner: tuple[int, ...]) -> tuple[int, ...]:
    """Chunk sizes of a moment record ``(time, *inner)``: up to _TIME_CHUNK records, and
    at most _RECORD_CHUNK_VALUES values per chunk (many slices would make it huge)."""
    per_record = int(np.prod(inner, dtype=np.int64))
    return (max(1, min(_TIME_CHUNK, _RECORD_CHUNK_VALUES // per_record)), *inner)


def _define_slice_records(nc: netCDF4.Dataset, d: int, count: int) -> None:
    """slice_mass(time, s), slice_mean(time, s, dim), slice_covariance(time, s, dim, dim2)."""
    _record_variable(nc, "slice_mass", ("s",), _moment_chunks((count,)))
    _record_variable(nc, "slice_mean", ("s", "dim"), _moment_chunks((count, d)))
    _record_variable(nc, "slice_covariance", ("s", "dim", "dim2"), _moment_chunks((count, d, d)))


def _density_dims(grid: Grid, positions: Positions | None) -> tuple[str, ...]:
    """The dimensions of a density after ``time``, in tpde's order (``[s,] x[, y[, z]]``)."""
    return (*(() if positions is None else ("s",)), *grid.axis_names)


def _define_records(nc: netCDF4.Dataset, grid: Grid, positions: Positions | None) -> None:
    """The unlimited ``time`` axis and every per-snapshot variable."""
    d = grid.ndim
    nc.createDimension("time", None)
    _define_components(nc, d)
    # no _FillValue on a coordinate (CF 2.5.1): an unwritten time reads as TIME_FILL
    time = nc.createVariable("time", "f8", ("time",), chunksizes=(_TIME_CHUNK,))
    time.setncatts(TIME_ATTRIBUTES)
    dims = file_order(_density_dims(grid, positions))
    sizes = {"s": 0 if positions is None else positions.count}
    sizes.update(zip(grid.axis_names, grid.cells, strict=True))
    _record_variable(
        nc,
        "density",
        dims,
        spatial_chunks([sizes[name] for name in dims], grid.ndim),
        cell_methods="time: point " + " ".join(f"{a}:" for a in grid.axis_names) + " mean",
        units=None,  # (the density is what users plot: no "[1]" on its label)
        compression="zlib",
        complevel=4,
        shuffle=True,
    )
    marginal = "" if positions is None else MARGINAL_COMMENT
    _record_variable(nc, "mass", (), (_TIME_CHUNK,), marginal)
    _record_variable(nc, MEAN, ("dim",), (_TIME_CHUNK, d), marginal)
    _record_variable(nc, "covariance", ("dim", "dim2"), (_TIME_CHUNK, d, d), marginal)
    for name in ("outflow", "max_speed", "dt"):
        _record_variable(nc, name, (), (_TIME_CHUNK,))
    if positions is not None:
        _define_slice_records(nc, d, positions.count)


def _global_attributes(
    grid: Grid, config_text: str, title: str, history: str, positions: Positions | None = None
) -> dict:
    created = f"{_now()}: created by {_source()}" + (f": {history}" if history else "")
    attributes = {
        "Conventions": CONVENTIONS,
        "title": title,
        "history": created,
        "source": _source(),
        "tpde_version": tpde.__version__,
        "config": config_text,
        "status": "running",
        "status_time": math.nan,
        "status_message": "",
        "status_reason": "",
        "grid_lower": np.asarray(grid.lower, dtype=np.float64),
        "grid_upper": np.asarray(grid.upper, dtype=np.float64),
        "grid_cells": np.asarray(grid.cells, dtype=np.int64),
        "grid_boundary": ",".join(grid.boundary),
    }
    if positions is not None:
        attributes["positions"] = np.int64(positions.slices)
        attributes["sink_mass"] = np.float64(positions.sink_mass)
    attributes.update(grid.file_attributes)  # a geometry's (the circle)
    return attributes


#: the global attributes of a tpde file (the references' and :func:`to_dataset`'s as well)
global_attributes = _global_attributes


def to_netcdf(ds: xr.Dataset, path: str | os.PathLike, records: bool = False) -> None:
    """Write a Dataset in the layout of the run files (the references, the sweep summary,
    a layout's header: :class:`FileLayout`): the stored CF order (:func:`file_order`, x
    fastest), no ``_FillValue`` on coordinates, bounds, integer and text variables, text as
    fixed-length characters (a NetCDF4 variable-length string is what CF checkers and older
    tools fail on). ``records``: chunked as a run's records (:func:`record_chunks`, the
    density deflated), so a writer appends to it. Writes ``path`` as is (callers stage and
    rename)."""
    stored = reordered(renamed(ds), file_order).copy()
    encoding: dict[str, dict[str, Any]] = {}
    for key, var in stored.variables.items():
        name = str(key)
        var.encoding = {}  # what a read left (chunks, coordinates of another layout)
        kind = var.dtype.kind
        if name in stored.coords or name.endswith("_bounds") or kind not in "fc":
            encoding[name] = {"_FillValue": None}
        if kind in "UOS":
            encoding[name] = {"_FillValue": None, "dtype": "S1"}
        if records and "time" in var.dims:
            chunks = record_chunks(name, var.dims[1:], var.shape[1:])
            encoding.setdefault(name, {})["chunksizes"] = chunks
            if name == "density":
                encoding[name].update(zlib=True, complevel=4, shuffle=True)
    unlimited = ["time"] if "time" in stored.dims else None  # as the run files (CF: T first)
    stored.to_netcdf(
        path, engine="netcdf4", format="NETCDF4", encoding=encoding, unlimited_dims=unlimited
    )


def _create(path: str, grid: Grid, attributes: dict, positions: Positions | None = None) -> None:
    """Write an empty file with every dimension, variable and attribute."""
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        nc.setncatts(attributes)
        _define_axes(nc, grid)
        if positions is not None:
            _define_positions(nc, positions)
        _define_cell_measure(nc, grid, positions)
        _define_records(nc, grid, positions)


# ---- reading helpers ------------------------------------------------------------------------
def _grid_kind(attrs: dict) -> type[Grid]:
    """The Grid class of a file's ``geometry`` attribute (a geometry's ``file_attributes``;
    its ``grid`` in tpde.geometries); files without one are flat boxes."""
    hook = geometries.of_dataset(attrs).grid
    return Grid if hook is None else geometries.load(hook)


def _grid_from_attributes(
    attrs: dict, where: str, density_shape: tuple[int, ...] | None = None
) -> Grid:
    """Rebuild the Grid from the ``grid_*`` global attributes (exact: float64 stored as is).

    Attributes are untrusted: the cells must be those of the ``density`` variable (its last
    d dimensions, ``density_shape``), so a crafted attribute cannot make a reader allocate
    more than the file holds."""
    missing = [
        k for k in ("grid_lower", "grid_upper", "grid_cells", "grid_boundary") if k not in attrs
    ]
    if missing:
        raise OutputError(
            f"run.output: {where} has no {missing[0]} attribute; not a tpde output file"
        )
    if density_shape == ():
        raise OutputError(f"run.output: {where} has no density; not a tpde output file")
    try:
        lower = np.atleast_1d(np.asarray(attrs["grid_lower"], dtype=np.float64))
        upper = np.atleast_1d(np.asarray(attrs["grid_upper"], dtype=np.float64))
        cells = np.atleast_1d(np.asarray(attrs["grid_cells"], dtype=np.int64))
        boundary = [b.strip() for b in str(attrs["grid_boundary"]).split(",")]
        if density_shape is not None and tuple(density_shape[-cells.size :]) != tuple(
            cells.tolist()
        ):
            raise ValueError(
                f"grid_cells {cells.tolist()} do not match the density's shape "
                f"{list(density_shape)}"
            )
        kind = _grid_kind(attrs)
        return kind(lower.tolist(), upper.tolist(), cells.tolist(), boundary)
    except (TypeError, ValueError, OverflowError) as exc:
        raise OutputError(
            f"run.output: {where} is not a valid tpde output: {str(exc).splitlines()[0]}"
        ) from None


def _density_shape(nc: netCDF4.Dataset) -> tuple[int, ...]:
    """The shape of the file's density in tpde's order (``time[, s], x[, y[, z]]``, from the
    dimension names: files of either layout), () when it has none."""
    if "density" not in nc.variables:
        return ()
    var = nc["density"]
    sizes = dict(zip(var.dimensions, var.shape, strict=True))
    return tuple(sizes[name] for name in xyz_order(var.dimensions))


def _positions_from_attributes(attrs: dict, where: str) -> Positions | None:
    """The Positions of the ``positions`` / ``sink_mass`` global attributes, else None."""
    if "positions" not in attrs:
        return None
    if "sink_mass" not in attrs:
        raise ValueError(f"run.output: {where} has a positions attribute but no sink_mass")
    slices = np.asarray(attrs["positions"]).reshape(-1)
    sink = np.asarray(attrs["sink_mass"]).reshape(-1)
    if slices.size != 1 or sink.size != 1 or int(slices[0]) != slices[0]:
        raise ValueError(
            f"run.output: {where} has positions = {attrs['positions']!r}, "
            f"sink_mass = {attrs['sink_mass']!r}; expected an integer and a number"
        )
    return Positions(int(slices[0]), float(sink[0]))


def _slice_moments(
    density: np.ndarray, grid: Grid, positions: Positions
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Moments of each slice of ``density`` (S, *grid.shape), S = positions.count: mass (S,)
    (:meth:`Positions.marginal`), mean (S, d) and covariance (S, d, d) normalised by the
    slice mass (:func:`tpde.grid.moments`); NaN mean and covariance where the mass is not > 0.
    """
    d, count = grid.ndim, positions.count
    mass = positions.marginal(density, grid)
    mean = np.full((count, d), np.nan)
    cov = np.full((count, d, d), np.nan)
    for k in range(count):
        if mass[k] > 0:
            _, mean[k], cov[k] = moments(density[k], grid)
    return mass, mean, cov


def _energy_names(attrs: dict) -> tuple[str, ...] | None:
    """The energy names of a file (its ``energies`` attribute), None before the first
    snapshot of a run with energies (or for a file without them)."""
    if "energies" not in attrs:
        return None
    text = str(attrs["energies"]).strip()
    return tuple(name.strip() for name in text.split(",")) if text else ()


def renamed(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with the variables of earlier layouts under their current names
    (:data:`RENAMED`: ``mean`` -> ``mean_position``)."""
    names = {old: new for old, new in RENAMED.items() if old in ds.variables and new not in ds}
    return ds.rename(names) if names else ds


def reordered(ds: xr.Dataset, order: Callable[[Sequence[str]], tuple[str, ...]]) -> xr.Dataset:
    """``ds`` with every variable's dimensions in ``order(dims)`` (:func:`xyz_order`: tpde's
    ``[x, y, z]``; :func:`file_order`: the stored CF order); chunk sizes follow."""
    out = ds.copy(deep=False)
    for name, var in ds.variables.items():
        dims = order([str(dim) for dim in var.dims])
        if dims == var.dims:
            continue
        moved = var.transpose(*dims)
        chunks = var.encoding.get("chunksizes")
        if chunks is not None and len(chunks) == len(dims):
            where = dict(zip(var.dims, chunks, strict=True))
            moved.encoding = {**var.encoding, "chunksizes": tuple(where[n] for n in dims)}
        if name in ds.coords:
            out = out.assign_coords({name: moved})
        else:
            out[name] = moved
    return out


def grid_from_dataset(ds: xr.Dataset) -> Grid:
    """The exact :class:`Grid` of a run (from the ``grid_*`` global attributes, checked
    against the shape of its ``density``)."""
    shape = None
    if "density" in ds.variables:
        sizes = ds["density"].sizes
        shape = tuple(sizes[name] for name in xyz_order([str(d) for d in ds["density"].dims]))
    return _grid_from_attributes(dict(ds.attrs), "dataset", shape)


def positions_from_dataset(ds: xr.Dataset) -> Positions | None:
    """The :class:`Positions` of a run (from the ``positions`` and ``sink_mass`` global
    attributes), or None for a run without position slices."""
    return _positions_from_attributes(dict(ds.attrs), "dataset")


def physical_density(ds: xr.Dataset) -> xr.DataArray:
    """The token density in physical space of a file read by :func:`read`: in a co-moving
    frame run ``density / frame_jacobian`` (the frame map x = m + L xi takes a frame cell of
    volume v onto a physical one of volume |det L| v, so mass per physical volume is the
    stored density, mass per frame volume, divided by |det L|), with the coordinates
    ``physical_<axis>`` of the cell centres; in any other file ``density`` itself.

    >>> rho = physical_density(read("out.nc")).isel(time=-1)  # doctest: +SKIP
    >>> rho.plot(x="physical_x", y="physical_y")  # doctest: +SKIP
    """
    density = ds["density"]
    if "frame_jacobian" not in ds.variables:
        return density
    out = density / ds["frame_jacobian"]
    out.attrs = dict(PHYSICAL_DENSITY_ATTRIBUTES)
    return out.rename("physical_density")
