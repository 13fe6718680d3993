"""One geometry registry (tpde.geometries): every hook it names loads, files and configs map
to their entries, and no module of the face branches on a geometry by itself: no
``geometry ==``, no comparison with a geometry's name outside the modules its entry names,
no ``is_circle_file`` / ``is_sphere_file`` (gone), no reading of the ``geometry`` attribute
outside the registry and no ``getattr`` probe of a geometry or snapshot member outside the
one place the writer reads a snapshot (``tpde.io.Record.of``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np

from tpde import config, geometries, io

ROOT = Path(__file__).resolve().parent.parent
#: members that are read through the registry or a typed record, never probed
PROBED = {"geometry", "representation", "frame", "atoms", "next_atom_id", "step"}
PROBED |= {"status_reason", "positions"}
#: the one function allowed to look up a snapshot's optional members (tpde.io.Record)
RECORD_READER = ("tpde/io.py", "Record.of")
BRANCH = re.compile(r"\bgeometry\b[\"')\]]{0,3}\s*[!=]=")
ATTRIBUTE = re.compile(r"(attrs\.get|getncattr)\(\s*[\"']geometry[\"']")
GONE = re.compile(r"\b(is_circle_file|is_sphere_file|_sphere_file|_compare_sphere)\b")


def owners() -> dict[str, set[str]]:
    """geometry name -> the modules its entry names (they may check their own name)."""
    out: dict[str, set[str]] = {}
    for name, entry in geometries.GEOMETRIES.items():
        hooks = [v for k, v in vars(entry).items() if k != "name" and isinstance(v, str)]
        out[name] = {hook.partition(":")[0] for hook in hooks}
    return out


def _probes(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, enclosing Class.function, member) of each getattr/hasattr of a PROBED member."""
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                inner = f"{where}.{child.name}" if where else child.name
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Name)
                and child.func.id in ("getattr", "hasattr")
                and len(child.args) >= 2
                and isinstance(child.args[1], ast.Constant)
                and child.args[1].value in PROBED
            ):
                found.append((child.lineno, where, str(child.args[1].value)))
            visit(child, inner)

    visit(tree, "")
    return found


def violations(relative: str, text: str, module: str) -> list[str]:
    """What ``text`` (the source of ``module``, at ``relative``) does that the registry is for."""
    found = []
    mine = {name for name, modules in owners().items() if module in modules}
    names = "|".join(geometries.GEOMETRIES)
    literal = re.compile(rf"[!=]=\s*[\"']({names})[\"']|[\"']({names})[\"']\s*[!=]=")
    for number, line in enumerate(text.splitlines(), start=1):
        code = line.split("#", 1)[0]
        where = f"{relative}:{number}: {line.strip()}"
        if BRANCH.search(code) or ATTRIBUTE.search(code) or GONE.search(code):
            found.append(where)
            continue
        for match in literal.finditer(code):
            if (match.group(1) or match.group(2)) not in mine:
                found.append(where)
    for number, function, member in _probes(ast.parse(text)):
        if (relative, function) != RECORD_READER:
            found.append(f"{relative}:{number}: getattr probe of {member!r} in {function}")
    return found


def test_no_geometry_branches_outside_the_registry():
    found = []
    files = sorted((ROOT / "tpde").glob("*.py"))
    for path in files:
        if path.name == "geometries.py":
            continue
        relative = path.relative_to(ROOT).as_posix()
        module = "tpde." + path.stem if path.stem != "__init__" else "tpde"
        found += violations(relative, path.read_text(encoding="utf-8"), module)
    print(f"\nscanned {len(files) - 1} modules of tpde/; geometry branches left: {len(found)}")
    for line in found:
        print("  " + line)
    assert not found, "\n".join(found)


def test_the_scan_finds_what_it_forbids():
    """The scan is not vacuous: each forbidden form in a made-up module is found."""
    text = (
        'if ds.attrs.get("geometry") == "circle":\n'
        "    pass\n"
        'if kind == "sphere":\n'
        "    pass\n"
        "is_sphere_file(path)\n"
        "def write(s):\n"
        '    return getattr(s, "frame", None)\n'
    )
    found = violations("tpde/made_up.py", text, "tpde.made_up")
    print("\n" + "\n".join(found))
    assert [line.split(":")[1] for line in found] == ["1", "3", "5", "7"]
    assert not violations("tpde/circle.py", 'if name != "circle":\n    pass\n', "tpde.circle")


def test_every_hook_loads_and_files_map_to_their_entry():
    """Each dotted name of the registry imports to a callable (a mapping for ``sections``,
    a class for ``grid``); attributes map to entries (absent or unknown: flat); the config's
    builders and the reader's grid classes are the registry's."""
    rows = []
    for name, entry in geometries.GEOMETRIES.items():
        for key, hook in vars(entry).items():
            if key == "name" or hook is None:
                continue
            value = geometries.load(hook)
            ok = isinstance(value, dict) if key == "sections" else callable(value)
            rows.append((name, key, hook, ok))
    print("\ngeometry  hook      target")
    for name, key, hook, ok in rows:
        print(f"{name:9s} {key:9s} {hook}{'' if ok else '  (not loadable)'}")
    assert all(ok for *_, ok in rows)
    fields = set(vars(geometries.FLAT)) - {"name"}
    assert {key for _, key, _, _ in rows} == fields  # (every hook is some geometry's)
    assert geometries.of_dataset({}) is geometries.FLAT
    assert geometries.of_dataset({"geometry": "torus"}) is geometries.FLAT
    assert geometries.of_dataset({"geometry": "sphere"}).layout == "tpde.sphere:SphereLayout"
    assert set(config.GEOMETRY_BUILDERS) == {"circle", "sphere"}
    assert config.GEOMETRY_BUILDERS["circle"] == ("tpde.circle", "build_circle")
    from tpde.grid.circle import CircleGrid

    assert io._grid_kind({"geometry": "circle"}) is CircleGrid
    assert io._grid_kind({}) is io.Grid


def test_file_geometry_is_read_from_the_attribute(tmp_path):
    """of_file reads the ``geometry`` attribute without loading the file; a file without one,
    a missing file and a file that is not NetCDF are flat."""
    import xarray as xr

    for name in geometries.GEOMETRIES:
        path = tmp_path / f"{name}.nc"
        attrs = {} if name == "flat" else {"geometry": name}
        xr.Dataset({"density": ("x", np.ones(3))}, attrs=attrs).to_netcdf(path)
        assert geometries.of_file(path) is geometries.GEOMETRIES[name]
    junk = tmp_path / "junk.nc"
    junk.write_text("not netcdf")
    assert geometries.of_file(junk) is geometries.FLAT
    assert geometries.of_file(tmp_path / "missing.nc") is geometries.FLAT


def test_the_writer_reads_a_snapshot_once():
    """Record.of: a plain SnapshotLike has no frame, atoms or step; the solver's Snapshot
    keeps them (its step as an int)."""
    from types import SimpleNamespace

    from tpde.schemes.solver import Snapshot

    plain = SimpleNamespace(time=0.5, density=np.ones(2), outflow=0.0, max_speed=1.0, dt=0.1)
    record = io.Record.of(plain)
    assert record.frame is None and record.atoms is None and record.step is None
    assert record.next_atom_id == 0 and record.time == 0.5
    snap = Snapshot(1.0, np.ones(2), 2.0, 0.0, 1.0, 0.1, np.int64(7), next_atom_id=3)
    record = io.Record.of(snap)
    assert record.step == 7 and type(record.step) is int and record.next_atom_id == 3
