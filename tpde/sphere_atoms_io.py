"""The sphere's atoms in the output file: a fill-valued ``atom`` dimension per record.

docs/guide/sphere.md, 'Atoms'. A sphere run with atoms (``[atoms]``) writes, per snapshot, up
to :data:`ATOM_SLOTS` von Mises-Fisher atoms along a fixed ``atom`` dimension (unused slots
hold the fill value: xarray reads NaN / -1, ParaView skips them):

    atom_id(time, atom)            the atom's number (-1: empty slot)
    atom_mass(time, atom)          its mass
    atom_centre(time, atom, xyz)   its mean direction (a unit vector)
    atom_lat, atom_lon(time, atom) the same in degrees
    atom_spread(time, atom)        1 / kappa (its tangent variance, radian^2)
    atom_born(time, atom)          when it was born or merged (NaN: given at the start)
    atom_parents(time, atom, pair) the ids it merged from (-1: none)
    next_atom_id(time)             the number the next atom gets

An atom's track is its id across the records; a resumed run reads the last record back
exactly (:func:`read_sphere_atoms`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tpde.grid import cubed_sphere as cs
from tpde.schemes.sphere_atoms import VMFAtoms

from .atoms_io import ATOM_SLOTS, history_lines

__all__ = ["atoms_of_record", "read_sphere_atoms", "sphere_atom_lines", "write_sphere_atoms"]

_VARIABLES = {
    "atom_id": ("i8", -1, "atom number (its track across records; -1: empty slot)", "1"),
    "atom_mass": ("f8", np.nan, "atom mass", "1"),
    "atom_lat": ("f8", np.nan, "atom mean direction, latitude", "degrees_north"),
    "atom_lon": ("f8", np.nan, "atom mean direction, longitude", "degrees_east"),
    "atom_spread": ("f8", np.nan, "atom spread 1 / kappa (von Mises-Fisher)", "radian2"),
    "atom_born": ("f8", np.nan, "time the atom was born or merged", "1"),
}


def _define(nc: Any) -> None:
    nc.createDimension("atom", ATOM_SLOTS)
    nc.createDimension("pair", 2)
    if "xyz" not in nc.dimensions:
        nc.createDimension("xyz", 3)
    for name, (kind, fill, long_name, units) in _VARIABLES.items():
        var = nc.createVariable(name, kind, ("time", "atom"), fill_value=fill)
        var.setncatts({"long_name": long_name, "units": units})
    var = nc.createVariable("atom_centre", "f8", ("time", "atom", "xyz"), fill_value=np.nan)
    var.setncatts({"long_name": "atom mean direction (unit vector)", "units": "1"})
    var = nc.createVariable("atom_parents", "i8", ("time", "atom", "pair"), fill_value=-1)
    var.setncatts({"long_name": "ids of the two atoms this one merged from (-1: none)"})
    var = nc.createVariable("next_atom_id", "i8", ("time",), fill_value=-1)
    var.setncatts({"long_name": "the number the next atom gets"})


def write_sphere_atoms(nc: Any, i: int, atoms: VMFAtoms, next_id: int) -> None:
    """Record ``i`` of the atom variables (defined with the first record that has atoms)."""
    if atoms.count > ATOM_SLOTS:
        raise ValueError(
            f"atoms: {atoms.count} atoms at one time, the file holds {ATOM_SLOTS}; raise "
            "atoms.width (fewer, later conversions)"
        )
    if "atom_id" not in nc.variables:
        _define(nc)
    k = atoms.count
    ids = np.full(ATOM_SLOTS, -1, dtype=np.int64)
    ids[:k] = atoms.ids
    nc["atom_id"][i, :] = ids
    lat, lon = cs.lat_lon(atoms.centre)
    for name, values in (
        ("atom_mass", atoms.mass),
        ("atom_lat", lat),
        ("atom_lon", lon),
        ("atom_spread", atoms.spread),
        ("atom_born", atoms.born),
    ):
        row = np.full(ATOM_SLOTS, np.nan)
        row[:k] = values
        nc[name][i, :] = row
    centre = np.full((ATOM_SLOTS, 3), np.nan)
    centre[:k] = atoms.centre
    nc["atom_centre"][i, :, :] = centre
    parents = np.full((ATOM_SLOTS, 2), -1, dtype=np.int64)
    parents[:k] = atoms.parents
    nc["atom_parents"][i, :, :] = parents
    nc["next_atom_id"][i] = int(next_id)


def read_sphere_atoms(nc: Any, i: int) -> tuple[VMFAtoms, int] | None:
    """The atoms of record ``i`` and the next id, or None when the file has no atoms."""
    if "atom_id" not in nc.variables:
        return None
    ids = np.asarray(nc["atom_id"][i, :], dtype=np.int64)
    used = ids >= 0

    def row(name: str) -> np.ndarray:
        return np.asarray(nc[name][i, :], dtype=np.float64)[used]

    centre = np.asarray(nc["atom_centre"][i, :, :], dtype=np.float64)[used]
    parents = np.asarray(nc["atom_parents"][i, :, :], dtype=np.int64)[used]
    atoms = VMFAtoms(
        row("atom_mass"), centre, row("atom_spread"), ids[used], row("atom_born"),
        parents.reshape(-1, 2),
    )  # fmt: skip
    return atoms, int(nc["next_atom_id"][i])


def atoms_of_record(ds: Any, i: int) -> VMFAtoms | None:
    """The atoms of record ``i`` of a sphere file read by xarray (:func:`tpde.sphere.
    read_sphere`: the integer fill value -1 reads as NaN), or None when it has no atoms
    (``tpde plot``'s markers)."""
    if "atom_id" not in ds.variables:
        return None
    ids = np.nan_to_num(np.asarray(ds["atom_id"].values[i], float), nan=-1).astype(np.int64)
    used = ids >= 0

    def row(name: str) -> np.ndarray:
        return np.asarray(ds[name].values[i], dtype=np.float64)[used]

    parents = np.asarray(ds["atom_parents"].values[i], dtype=np.float64)[used]
    return VMFAtoms(
        row("atom_mass"),
        np.asarray(ds["atom_centre"].values[i], dtype=np.float64)[used].reshape(-1, 3),
        row("atom_spread"),
        ids[used],
        row("atom_born"),
        np.nan_to_num(parents, nan=-1).astype(np.int64).reshape(-1, 2),
    )


def sphere_atom_lines(ds: Any) -> list[str]:
    """``tpde info``'s lines: the atoms of the last record and every atom ever born or
    merged."""
    if "atom_id" not in ds.variables or ds.sizes.get("time", 0) == 0:
        return []
    ids = np.nan_to_num(np.asarray(ds["atom_id"].values, float), nan=-1).astype(int)
    mass = np.asarray(ds["atom_mass"].values)
    lat, lon = np.asarray(ds["atom_lat"].values), np.asarray(ds["atom_lon"].values)
    born = np.asarray(ds["atom_born"].values)
    parents = np.nan_to_num(np.asarray(ds["atom_parents"].values, float), nan=-1).astype(int)
    times = np.asarray(ds["time"].values)
    last = ids[-1] >= 0
    lines = [f"  atoms at t = {times[-1]:.6g}: {int(last.sum())}"]
    for j in np.flatnonzero(last):
        lines.append(
            f"    atom {int(ids[-1, j])}: lat {lat[-1, j]:7.2f}  lon {lon[-1, j]:8.2f}  "
            f"mass {mass[-1, j]:.6g}"
        )
    return lines + history_lines(ids, born, parents)
