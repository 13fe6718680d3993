"""The atoms in the output file: a fill-valued ``atom`` dimension per record, one layout for
every geometry.

docs/user-guide.md, 'Atoms'; docs/guide/sphere.md, 'Atoms'. A run with atoms (``[atoms]``)
writes, per snapshot, up to :data:`ATOM_SLOTS` atoms along a fixed ``atom`` dimension (unused
slots hold the fill value, so xarray reads them as NaN / -1 and ParaView skips them). Every
geometry writes

    atom_id(time, atom)        the atom's number (-1: empty slot)
    atom_mass(time, atom)      its mass
    atom_born(time, atom)      when it was born or merged (NaN: given at the start)
    atom_parents(time, atom, pair)  the ids it merged from (-1: none)
    next_atom_id(time)         the number the next atom gets (a resumed run goes on from it)

and its own columns (:data:`COLUMNS`, the writer names its layout): the circle's wrapped
normals ``atom_centre(time, atom)`` (the angle, radians) and ``atom_variance(time, atom)``;
the flat co-moving frame's d-dimensional Gaussians (docs/guide/atoms.md), physical
``atom_centre(time, atom, dim)`` = m + L xi and ``atom_covariance(time, atom, dim, dim2)`` =
L S L^T (the record's ``frame_mean`` m and ``frame_matrix`` L) with the frame coordinates the
run advances kept exactly beside them for ``--resume`` (``atom_frame_centre``,
``atom_frame_covariance``); a fixed flat box's (``box``), the physical ``atom_centre(time,
atom, dim)`` and ``atom_covariance(time, atom, dim, dim2)`` the run advances, nothing else;
the sphere's von Mises-Fisher atoms, ``atom_centre(time, atom,
xyz)`` (the mean direction, a unit vector), ``atom_lat``, ``atom_lon`` (degrees) and
``atom_spread`` (1 / kappa, radian^2).

An atom's track is its id across the records (positions and masses over time); births and
merges are ``atom_born`` and ``atom_parents``, and the run's events name them too. A resumed
run reads the last record back exactly (:func:`read_atoms`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpde.schemes.atoms import Atoms

__all__ = [
    "ATOM_SLOTS",
    "COLUMNS",
    "AtomLayout",
    "atom_lines",
    "atoms_of_record",
    "read_atoms",
    "write_atoms",
]

#: the length of the ``atom`` dimension: the most atoms a record holds
ATOM_SLOTS = 64

#: the columns every layout has: name -> (type, fill value, long name, units)
_COMMON = {
    "atom_id": ("i8", -1, "atom number (its track across records; -1: empty slot)", "1"),
    "atom_mass": ("f8", np.nan, "atom mass", "1"),
    "atom_born": ("f8", np.nan, "time the atom was born or merged", "1"),
}


def _circle_rows(atoms: Any, frame: Any) -> dict[str, np.ndarray]:
    return {"atom_centre": atoms.centre[:, 0], "atom_variance": atoms.cov[:, 0, 0]}


def _frame_rows(atoms: Any, frame: Any) -> dict[str, np.ndarray]:
    L = frame.matrix
    return {
        "atom_centre": frame.physical(atoms.centre),
        "atom_covariance": np.einsum("ij,kjl,ml->kim", L, atoms.cov, L),
        "atom_frame_centre": atoms.centre,
        "atom_frame_covariance": atoms.cov,
    }


def _box_rows(atoms: Any, frame: Any) -> dict[str, np.ndarray]:
    return {"atom_centre": atoms.centre, "atom_covariance": atoms.cov}


def _sphere_rows(atoms: Any, frame: Any) -> dict[str, np.ndarray]:
    from tpde.grid.cubed_sphere import lat_lon

    lat, lon = lat_lon(atoms.centre)
    rows = {"atom_lat": lat, "atom_lon": lon, "atom_spread": atoms.spread}
    return {**rows, "atom_centre": atoms.centre}


@dataclass(frozen=True)
class AtomLayout:
    """One geometry's own float columns: name -> (trailing dims, long name, units; None: no
    units attribute), ``rows(atoms, frame)`` their values (rows: the atoms), and the
    dimensions it adds where the file lacks them (name -> size)."""

    columns: dict[str, tuple[tuple[str, ...], str, str | None]]
    rows: Callable[[Any, Any], dict[str, np.ndarray]]
    dimensions: dict[str, int] = field(default_factory=dict)


#: layout name (the writer's) -> its columns
COLUMNS: dict[str, AtomLayout] = {
    "circle": AtomLayout(
        {
            "atom_centre": ((), "atom centre (angle)", "radian"),
            "atom_variance": ((), "atom variance (of the wrapped normal)", "radian2"),
        },
        _circle_rows,
    ),
    "frame": AtomLayout(
        {
            "atom_centre": (("dim",), "atom centre (physical, m + L xi)", None),
            "atom_covariance": (("dim", "dim2"), "atom covariance (physical, L S L^T)", None),
            "atom_frame_centre": (("dim",), "atom centre xi in frame coordinates", None),
            "atom_frame_covariance": (
                ("dim", "dim2"),
                "atom covariance S in frame coordinates",
                None,
            ),
        },
        _frame_rows,
    ),
    # a fixed flat box's: physical is what the run advances, no frame coordinates
    "box": AtomLayout(
        {
            "atom_centre": (("dim",), "atom centre", None),
            "atom_covariance": (("dim", "dim2"), "atom covariance", None),
        },
        _box_rows,
    ),
    "sphere": AtomLayout(
        {
            "atom_lat": ((), "atom mean direction, latitude", "degrees_north"),
            "atom_lon": ((), "atom mean direction, longitude", "degrees_east"),
            "atom_spread": ((), "atom spread 1 / kappa (von Mises-Fisher)", "radian2"),
            "atom_centre": (("xyz",), "atom mean direction (unit vector)", "1"),
        },
        _sphere_rows,
        {"xyz": 3},
    ),
}


def _define(nc: Any, layout: AtomLayout) -> None:
    nc.createDimension("atom", ATOM_SLOTS)
    nc.createDimension("pair", 2)
    for dim, size in layout.dimensions.items():
        if dim not in nc.dimensions:
            nc.createDimension(dim, size)
    for name, (kind, fill, long_name, units) in _COMMON.items():
        var = nc.createVariable(name, kind, ("time", "atom"), fill_value=fill)
        var.setncatts({"long_name": long_name, "units": units})
    for name, (dims, long_name, unit) in layout.columns.items():
        var = nc.createVariable(name, "f8", ("time", "atom", *dims), fill_value=np.nan)
        var.setncatts({"long_name": long_name, **({} if unit is None else {"units": unit})})
    var = nc.createVariable("atom_parents", "i8", ("time", "atom", "pair"), fill_value=-1)
    var.setncatts({"long_name": "ids of the two atoms this one merged from (-1: none)"})
    var = nc.createVariable("next_atom_id", "i8", ("time",), fill_value=-1)
    var.setncatts({"long_name": "the number the next atom gets"})


def write_atoms(
    nc: Any, i: int, atoms: Any, next_id: int, frame: Any = None, layout: str | None = None
) -> None:
    """Record ``i`` of the atom variables (defined with the first record that has atoms).
    ``layout``: one of :data:`COLUMNS` (None: ``frame`` when the record has a co-moving
    frame, an :class:`~tpde.schemes.frame.AffineFrame` whose atoms are d-dimensional
    Gaussians in frame coordinates, else ``circle``); the sphere's writer names ``sphere``
    (``atoms`` a :class:`tpde.schemes.sphere_atoms.VMFAtoms`)."""
    chosen = COLUMNS[layout or ("circle" if frame is None else "frame")]
    if atoms.count > ATOM_SLOTS:
        raise ValueError(
            f"atoms: {atoms.count} atoms at one time, the file holds {ATOM_SLOTS}; raise "
            "atoms.width (fewer, later conversions) or refine the grid"
        )
    if "atom_id" not in nc.variables:
        _define(nc, chosen)
    k = atoms.count
    ids = np.full(ATOM_SLOTS, -1, dtype=np.int64)
    ids[:k] = atoms.ids
    nc["atom_id"][i, :] = ids
    rows = {"atom_mass": atoms.mass, "atom_born": atoms.born, **chosen.rows(atoms, frame)}
    for name, values in rows.items():
        row = np.full((ATOM_SLOTS, *np.shape(values)[1:]), np.nan)
        row[:k] = values
        nc[name][i, ...] = row
    parents = np.full((ATOM_SLOTS, 2), -1, dtype=np.int64)
    parents[:k] = atoms.parents
    nc["atom_parents"][i, :, :] = parents
    nc["next_atom_id"][i] = int(next_id)


def _atoms_of(names: Any, get: Callable[[str], np.ndarray]) -> Any:
    """The atoms of one record, ``get(name)`` its values of a variable (fill values as -1
    or NaN): :class:`~tpde.schemes.atoms.Atoms` (the circle's, the frame's in frame
    coordinates) or the sphere's :class:`~tpde.schemes.sphere_atoms.VMFAtoms`."""
    ids = np.nan_to_num(np.asarray(get("atom_id"), float), nan=-1).astype(np.int64)
    used = ids >= 0
    k = int(used.sum())

    def row(name: str) -> np.ndarray:
        return np.asarray(get(name), dtype=np.float64)[used]

    parents = np.nan_to_num(np.asarray(get("atom_parents"), float), nan=-1).astype(np.int64)
    parents = parents[used].reshape(k, 2)
    if "atom_spread" in names:  # (the sphere's von Mises-Fisher atoms)
        from tpde.schemes.sphere_atoms import VMFAtoms

        centre = row("atom_centre").reshape(k, 3)
        return VMFAtoms(
            row("atom_mass"), centre, row("atom_spread"), ids[used], row("atom_born"), parents
        )
    if "atom_frame_centre" in names:  # (the frame's d-D atoms, frame coordinates)
        centre, cov = row("atom_frame_centre"), row("atom_frame_covariance")
    elif "atom_covariance" in names:  # (a fixed flat box's, physical)
        centre, cov = row("atom_centre"), row("atom_covariance")
    else:
        centre, cov = row("atom_centre").reshape(k, 1), row("atom_variance").reshape(k, 1, 1)
    return Atoms(row("atom_mass"), centre, cov, ids[used], row("atom_born"), parents)


def read_atoms(nc: Any, i: int) -> tuple[Any, int] | None:
    """The atoms of record ``i`` of an open file and the next id, or None when the file has
    no atoms (every layout; what a resumed run continues from, exactly)."""
    if "atom_id" not in nc.variables:
        return None
    atoms = _atoms_of(nc.variables, lambda name: nc[name][i, ...])
    return atoms, int(nc["next_atom_id"][i])


def atoms_of_record(ds: Any, i: int) -> Any:
    """The atoms of record ``i`` of a file read by xarray (the integer fill value -1 reads
    as NaN), or None when it has no atoms (``tpde plot``'s markers)."""
    if "atom_id" not in ds.variables:
        return None
    return _atoms_of(ds.variables, lambda name: ds[name].values[i])


def atom_lines(ds: Any) -> list[str]:
    """``tpde info``'s lines for the atoms of a dataset: the clusters of the last record and
    every atom that was ever born or merged, with its first and last record."""
    if "atom_id" not in ds.variables or ds.sizes.get("time", 0) == 0:
        return []
    # (xarray masks the integer fill value -1 as NaN)
    ids = np.nan_to_num(np.asarray(ds["atom_id"].values, float), nan=-1).astype(int)
    mass = np.asarray(ds["atom_mass"].values)
    centre = np.asarray(ds["atom_centre"].values)
    born = np.asarray(ds["atom_born"].values)
    parents = np.nan_to_num(np.asarray(ds["atom_parents"].values, float), nan=-1).astype(int)
    times = np.asarray(ds["time"].values)
    last = ids[-1] >= 0
    lines = [f"  atoms at t = {times[-1]:.6g}: {int(last.sum())}"]
    for j in np.flatnonzero(last):
        if "atom_lat" in ds.variables:  # (on the sphere: where, in degrees)
            lat, lon = float(ds["atom_lat"].values[-1, j]), float(ds["atom_lon"].values[-1, j])
            spot = f"lat {lat:7.2f}  lon {lon:8.2f} "
            lines.append(f"    atom {int(ids[-1, j])}: {spot} mass {mass[-1, j]:.6g}")
            continue
        where = np.atleast_1d(centre[-1, j])
        place = f"{float(where[0]):.6f}" if where.size == 1 else _point(where)
        lines.append(f"    atom {int(ids[-1, j])}: centre {place}, mass {mass[-1, j]:.6g}")
    return lines + history_lines(ids, born, parents)


def _point(x: np.ndarray) -> str:
    return "(" + ", ".join(f"{float(v):.6f}" for v in x) + ")"


def history_lines(ids: np.ndarray, born: np.ndarray, parents: np.ndarray) -> list[str]:
    """One line per atom ever recorded, in id order: born or merged from which two, and when.
    ids (time, atom) with -1 for empty slots; born (time, atom); parents (time, atom, 2)."""
    seen: dict[int, tuple[float, tuple[int, int]]] = {}
    for r in range(ids.shape[0]):
        for j in np.flatnonzero(ids[r] >= 0):
            n = int(ids[r, j])
            if n not in seen:
                seen[n] = (float(born[r, j]), (int(parents[r, j, 0]), int(parents[r, j, 1])))
    lines = []
    for n, (t, (a, b)) in sorted(seen.items()):
        what = f"merged from atoms {a} and {b}" if a >= 0 else "born"
        when = "at the start" if np.isnan(t) else f"at t = {t:.6g}"
        lines.append(f"    atom {n}: {what} {when}")
    return lines
