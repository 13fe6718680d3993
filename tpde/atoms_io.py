"""The atoms in the output file: a fill-valued ``atom`` dimension per record.

docs/user-guide.md, 'Atoms'. A run with atoms (``[atoms]``) writes, per snapshot, up to
:data:`ATOM_SLOTS` atoms along a fixed ``atom`` dimension (unused slots hold the fill value,
so xarray reads them as NaN / -1 and ParaView skips them):

    atom_id(time, atom)        the atom's number (-1: empty slot)
    atom_mass(time, atom)      its mass
    atom_centre(time, atom)    its centre (the angle, radians)
    atom_variance(time, atom)  its variance
    atom_born(time, atom)      when it was born or merged (NaN: given at the start)
    atom_parents(time, atom, pair)  the ids it merged from (-1: none)
    next_atom_id(time)         the number the next atom gets (a resumed run goes on from it)

In the flat co-moving frame (docs/guide/atoms.md) the atoms are Gaussians in d dimensions:
``atom_centre`` and ``atom_covariance`` are physical, ``m + L xi`` and ``L S L^T`` (with the
record's ``frame_mean`` m and ``frame_matrix`` L), and the frame coordinates the run advances
are kept exactly beside them for ``--resume``:

    atom_centre(time, atom, dim)                 physical centre
    atom_covariance(time, atom, dim, dim2)       physical covariance
    atom_frame_centre(time, atom, dim)           xi, the centre in frame coordinates
    atom_frame_covariance(time, atom, dim, dim2) S, the covariance in frame coordinates

(``atom_id``, ``atom_mass``, ``atom_born``, ``atom_parents``, ``next_atom_id`` as above).
On a fixed flat box the run advances the physical ``atom_centre (time, atom, dim)`` and
``atom_covariance (time, atom, dim, dim2)`` themselves, and the file holds only those.

An atom's track is its id across the records (positions and masses over time); births and
merges are ``atom_born`` and ``atom_parents``, and the run's events name them too. A resumed
run reads the last record back exactly (:func:`read_atoms`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tpde.schemes.atoms import Atoms

__all__ = ["ATOM_SLOTS", "atom_lines", "read_atoms", "write_atoms"]

#: the length of the ``atom`` dimension: the most atoms a record holds
ATOM_SLOTS = 64

_VARIABLES = {
    "atom_id": ("i8", -1, "atom number (its track across records; -1: empty slot)", "1"),
    "atom_mass": ("f8", np.nan, "atom mass", "1"),
    "atom_centre": ("f8", np.nan, "atom centre (angle)", "radian"),
    "atom_variance": ("f8", np.nan, "atom variance (of the wrapped normal)", "radian2"),
    "atom_born": ("f8", np.nan, "time the atom was born or merged", "1"),
}


#: the d-dimensional Gaussian atoms of the flat co-moving frame: name -> (trailing dims,
#: long name); ``atom_centre`` / ``atom_variance`` of the circle's layout are not written
_FRAME_VARIABLES = {
    "atom_centre": (("dim",), "atom centre (physical, m + L xi)"),
    "atom_covariance": (("dim", "dim2"), "atom covariance (physical, L S L^T)"),
    "atom_frame_centre": (("dim",), "atom centre xi in frame coordinates"),
    "atom_frame_covariance": (("dim", "dim2"), "atom covariance S in frame coordinates"),
}
_SCALARS = ("atom_id", "atom_mass", "atom_born")


#: a fixed flat box's atoms: physical is what the run advances, no frame coordinates
_BOX_VARIABLES = {
    "atom_centre": (("dim",), "atom centre"),
    "atom_covariance": (("dim", "dim2"), "atom covariance"),
}


def _define(nc: Any, framed: bool, flat: bool) -> None:
    nc.createDimension("atom", ATOM_SLOTS)
    nc.createDimension("pair", 2)
    for name, (kind, fill, long_name, units) in _VARIABLES.items():
        if flat and name not in _SCALARS:
            continue
        var = nc.createVariable(name, kind, ("time", "atom"), fill_value=fill)
        var.setncatts({"long_name": long_name, "units": units})
    if flat:  # (the dim / dim2 dimensions are the file's, of mean and covariance)
        for name, (dims, long_name) in (_FRAME_VARIABLES if framed else _BOX_VARIABLES).items():
            var = nc.createVariable(name, "f8", ("time", "atom", *dims), fill_value=np.nan)
            var.setncatts({"long_name": long_name})
    var = nc.createVariable("atom_parents", "i8", ("time", "atom", "pair"), fill_value=-1)
    var.setncatts({"long_name": "ids of the two atoms this one merged from (-1: none)"})
    var = nc.createVariable("next_atom_id", "i8", ("time",), fill_value=-1)
    var.setncatts({"long_name": "the number the next atom gets"})


def write_atoms(
    nc: Any, i: int, atoms: Atoms, next_id: int, frame: Any = None, flat: bool = False
) -> None:
    """Record ``i`` of the atom variables (defined with the first record that has atoms);
    ``frame``: the record's co-moving frame (an :class:`~tpde.schemes.frame.AffineFrame`),
    whose atoms are d-dimensional Gaussians in frame coordinates, None for the circle's
    and a fixed box's; ``flat``: a flat box's d-dimensional atoms (the frame's or a fixed
    box's, physical), not the circle's angles."""
    if atoms.count > ATOM_SLOTS:
        raise ValueError(
            f"atoms: {atoms.count} atoms at one time, the file holds {ATOM_SLOTS}; raise "
            "atoms.width (fewer, later conversions) or refine the grid"
        )
    flat = flat or frame is not None
    if "atom_id" not in nc.variables:
        _define(nc, frame is not None, flat)
    k = atoms.count
    ids = np.full(ATOM_SLOTS, -1, dtype=np.int64)
    ids[:k] = atoms.ids
    nc["atom_id"][i, :] = ids
    rows: list[tuple[str, np.ndarray]] = [("atom_mass", atoms.mass), ("atom_born", atoms.born)]
    if not flat:
        rows += [("atom_centre", atoms.centre[:, 0]), ("atom_variance", atoms.cov[:, 0, 0])]
    elif frame is None:
        rows += [("atom_centre", atoms.centre), ("atom_covariance", atoms.cov)]
    else:
        L = frame.matrix
        rows += [
            ("atom_centre", frame.physical(atoms.centre)),
            ("atom_covariance", np.einsum("ij,kjl,ml->kim", L, atoms.cov, L)),
            ("atom_frame_centre", atoms.centre),
            ("atom_frame_covariance", atoms.cov),
        ]
    for name, values in rows:
        row = np.full((ATOM_SLOTS, *values.shape[1:]), np.nan)
        row[:k] = values
        nc[name][i, ...] = row
    parents = np.full((ATOM_SLOTS, 2), -1, dtype=np.int64)
    parents[:k] = atoms.parents
    nc["atom_parents"][i, :, :] = parents
    nc["next_atom_id"][i] = int(next_id)


def read_atoms(nc: Any, i: int) -> tuple[Atoms, int] | None:
    """The atoms of record ``i`` and the next id, or None when the file has no atoms."""
    if "atom_id" not in nc.variables:
        return None
    ids = np.asarray(nc["atom_id"][i, :], dtype=np.int64)
    used = ids >= 0
    k = int(used.sum())

    def row(name: str) -> np.ndarray:
        return np.asarray(nc[name][i, ...], dtype=np.float64)[used]

    parents = np.asarray(nc["atom_parents"][i, :, :], dtype=np.int64)[used]
    if "atom_frame_centre" in nc.variables:  # (the frame's d-D atoms, frame coordinates)
        centre, cov = row("atom_frame_centre"), row("atom_frame_covariance")
    elif "atom_covariance" in nc.variables:  # (a fixed flat box's, physical)
        centre, cov = row("atom_centre"), row("atom_covariance")
    else:
        centre, cov = row("atom_centre").reshape(k, 1), row("atom_variance").reshape(k, 1, 1)
    atoms = Atoms(
        row("atom_mass"),
        centre,
        cov,
        ids[used],
        row("atom_born"),
        parents.reshape(k, 2),
    )
    return atoms, int(nc["next_atom_id"][i])


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
