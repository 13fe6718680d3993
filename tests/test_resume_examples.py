"""Issue 25: ``kill -9`` then ``tpde run CONFIG -o OUT --resume`` of every shipped example,
bit for bit.

Every example that ``tpde run`` takes (examples/*.toml, examples/sphere/*.toml: flat 2-D
with fixed box, co-moving frame, masked, every variant, the circle and the cubed sphere) is
run to a reference file with a shortened ``run.t_end`` and few ``run.snapshots`` (a copied
TOML, everything else as shipped). The same config is then run again as a subprocess,
SIGKILLed once its file holds at least :data:`RECORDS_BEFORE_KILL` complete records
(``tests/exact.py``'s :func:`kill_after`, one progress line per snapshot written, checked
on the file with :func:`tpde.io.complete_records`), and resumed with ``tpde run CONFIG -o
OUT --resume`` (in this process). Every variable of the two files must be identical
(``np.array_equal``, NaN-aware): the reference is one uninterrupted run, independent of
the killed one.

Not taken: examples/sweeps/*.toml (``tpde sweep`` files, no ``[run]`` of their own; the sweep
reruns are covered by tests/test_sweep.py) and examples/continuation/*.toml (``tpde
continuation`` files: a steady-state solve, no time loop to kill).

The default tier runs three representatives (flat 2-D, circle, sphere); the full set is
slow. ``pytest -s`` prints the table (example, records before the kill, variables compared,
identical).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from exact import kill_after

from tpde import io
from tpde.cli import main
from tpde.config import dumps

ROOT = Path(__file__).resolve().parents[1]
#: every example ``tpde run`` takes (sweep and continuation files are not run configs)
EXAMPLES = sorted(
    str(p.relative_to(ROOT))
    for p in [*ROOT.glob("examples/*.toml"), *ROOT.glob("examples/sphere/*.toml")]
)
#: the default tier's representatives: flat 2-D (fixed box), circle, cubed sphere
DEFAULT_TIER = (
    "examples/softmax.toml",
    "examples/sphere/clusters.toml",
    "examples/sphere/clusters_s2.toml",
)
#: snapshots of the shortened run; the kill comes after RECORDS_BEFORE_KILL of them
SNAPSHOTS = 5
RECORDS_BEFORE_KILL = 2
#: shortened t_end: a few steps per snapshot interval (the circle's and sphere's dt_max
#: steps; a fraction of the flat runs' t_end)
T_END = {"circle": 4 * 0.137, "sphere": 4 * 0.139}
FLAT_T_END_FRACTION = 0.04
TABLE: list[tuple[str, int, int, str]] = []


def shortened(example: str, folder: Path) -> Path:
    """A copy of ``example`` with ``run.t_end`` and ``run.snapshots`` made small."""
    raw = tomllib.loads((ROOT / example).read_text())
    geometry = raw["grid"].get("geometry", "flat")
    t_end = T_END.get(geometry, FLAT_T_END_FRACTION * float(raw["run"]["t_end"]))
    raw["run"].update(t_end=t_end, snapshots=SNAPSHOTS)
    path = folder / (Path(example).stem + ".toml")
    path.write_text(dumps(raw))
    return path


def values(path: Path) -> dict[str, np.ndarray]:
    """Every variable of a NetCDF file as a plain array (masked entries as NaN)."""
    with netCDF4.Dataset(path) as nc:
        nc.set_auto_mask(False)
        return {name: np.asarray(var[...]) for name, var in nc.variables.items()}


def differing(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """The names whose arrays are not bit for bit the same (NaN equal to NaN)."""
    out = sorted(set(a) ^ set(b))
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        nan = x.dtype.kind in "fc"
        if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y, equal_nan=nan):
            out.append(name)
    return out


def kill_then_resume(example: str, folder: Path) -> tuple[int, int, list[str]]:
    """(records before the kill, variables compared, the names that differ)."""
    config = shortened(example, folder)
    reference, target = folder / "reference.nc", folder / "resumed.nc"
    assert main(["run", str(config), "-o", str(reference), "--quiet"]) == 0
    kill_after(["run", str(config), "-o", str(target)], RECORDS_BEFORE_KILL, "[")
    with netCDF4.Dataset(target) as nc:
        before = io.complete_records(nc["time"][:].filled(np.nan))
    assert RECORDS_BEFORE_KILL <= before < SNAPSHOTS, f"{example}: {before} records at the kill"
    # the resume in this process (the same ``tpde run`` entry point; one interpreter start
    # less): it reads only the killed file, nothing of the reference run
    assert main(["run", str(config), "-o", str(target), "--resume", "--quiet"]) == 0, example
    a, b = values(reference), values(target)
    assert b["time"].size == SNAPSHOTS
    return before, len(a), differing(a, b)


def check(example: str, folder: Path) -> None:
    before, compared, diff = kill_then_resume(example, folder)
    TABLE.append((example, before, compared, "yes" if not diff else "no: " + ", ".join(diff)))
    print(f"\n{example}: {before} records before the kill, {compared} variables, differ {diff}")
    assert not diff, f"{example}: resumed file differs in {diff}"


@pytest.mark.parametrize("example", DEFAULT_TIER)
def test_kill_then_resume_bit_for_bit(example, tmp_path):
    check(example, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("example", [e for e in EXAMPLES if e not in DEFAULT_TIER])
def test_kill_then_resume_bit_for_bit_every_example(example, tmp_path):
    check(example, tmp_path)


def test_a_killed_segments_events_survive_the_resume(tmp_path):
    """The events a killed run gave before its last complete record are in the resumed
    file's ``events`` (and ``steps`` counts the killed segment's), as the uninterrupted
    run's: the resumed run does not repeat them (its monitor state says they were given),
    so they must come from the killed file (``tpde.io.UNCLOSED_EVENTS``). The case:
    examples/softmax.toml to t = 0.25 with ``run.resolution_tolerance = 1e-5``, which warns
    ``under_resolved`` at its first snapshot interval; killed after four records."""
    raw = tomllib.loads((ROOT / "examples/softmax.toml").read_text())
    raw["run"].update(t_end=0.25, snapshots=6, resolution_tolerance=1e-5)
    raw["run"].pop("output", None)
    config = tmp_path / "softmax_warns.toml"
    config.write_text(dumps(raw))
    reference, target = tmp_path / "reference.nc", tmp_path / "resumed.nc"
    assert main(["run", str(config), "-o", str(reference), "--quiet"]) == 0
    kill_after(["run", str(config), "-o", str(target)], 4, "[")
    killed = io.events(target)
    with netCDF4.Dataset(target) as nc:
        unclosed = str(nc.getncattr(io.UNCLOSED_EVENTS)).splitlines()
        records = io.complete_records(nc["time"][:].filled(np.nan))
    assert main(["run", str(config), "-o", str(target), "--resume", "--quiet"]) == 0
    want, got = io.events(reference), io.events(target)
    print(f"\nkilled after {records} records: events {killed}, unclosed {unclosed}")
    print(f"uninterrupted: {want}\nresumed:       {got}")
    assert [e.split()[0] for e in want] == ["under_resolved"]
    assert 4 <= records < 6 and unclosed == want
    assert killed == want  # (tpde info on the killed file lists them too)
    assert got == want
    steps = [int(netCDF4.Dataset(f).getncattr("steps")) for f in (reference, target)]
    assert steps[0] == steps[1], steps


def test_examples_found():
    """The list covers both folders and the three geometries (a moved example is noticed)."""
    assert set(DEFAULT_TIER) <= set(EXAMPLES) and len(EXAMPLES) >= 15
    geometries = {
        tomllib.loads((ROOT / e).read_text())["grid"].get("geometry", "flat") for e in EXAMPLES
    }
    assert geometries == {"flat", "circle", "sphere"}


def test_zz_table():
    print(f"\n{'example':42s} {'records before kill':>19s} {'variables':>9s}  identical")
    for example, before, compared, same in TABLE:
        print(f"{example:42s} {before:19d} {compared:9d}  {same}")


# ---- the comparison itself: defaults filled on both sides, one function for every geometry --
def without(text: str, section: str, *keys: str) -> str:
    """A config text with ``keys`` of ``section`` removed (a file that omits defaults)."""
    raw = tomllib.loads(text)
    for key in keys:
        raw[section].pop(key)
    return dumps(raw)


@pytest.mark.parametrize(
    "example, section, defaults, changed",
    [
        ("examples/softmax.toml", "scheme", ("cfl", "positivity"), {"cfl": 0.3}),
        ("examples/sphere/clusters.toml", "attention", ("normalised",), {"normalised": False}),
        ("examples/sphere/clusters.toml", "grid", ("copies",), {"copies": 2}),
        ("examples/sphere/clusters_s2.toml", "scheme", ("cfl",), {"cfl": 0.4}),
        ("examples/sphere/clusters_s2.toml", "attention", ("nodes", "normalised"), {"nodes": 4}),
    ],
)
def test_same_config_fills_the_geometrys_defaults_on_both_sides(
    example, section, defaults, changed
):
    """The shipped example (defaults omitted) is the same as the text a run stores
    (defaults written out), either way round and as a raw mapping (the sweep's); a file
    that omits a default is the same as one that writes it; a changed default is not the
    same, also where it equals another geometry's default (the sphere's ``cfl`` 0.5 is not
    the flat grid's 0.4)."""
    from tpde.config import build, canonical, same_config

    shipped = (ROOT / example).read_text()
    if "sphere" in tomllib.loads(shipped)["grid"].get("geometry", ""):
        small = tomllib.loads(shipped)  # 8 cells a panel: the sphere's noise sum is costly
        small["grid"]["cells"] = 8
        shipped = dumps(small)
    config = build(shipped)
    stored = config.text
    raw = tomllib.loads(shipped)
    older = without(stored, section, *defaults)
    other = tomllib.loads(shipped)
    other.setdefault(section, {}).update(changed)
    cases = {
        "stored vs shipped text": (same_config(stored, shipped), True),
        "shipped vs stored text": (same_config(shipped, stored), True),
        "stored vs raw mapping": (same_config(stored, raw), True),
        "stored vs built config": (same_config(stored, config), True),
        "older file vs config": (same_config(older, config), True),
        "older file vs changed default": (same_config(older, other), False),
        "stored vs changed default": (same_config(stored, other), False),
    }
    print(f"\n{example} [{section}] {defaults} -> {changed}")
    for name, (got, want) in cases.items():
        print(f"  {name:30s} {got!s:5s} (want {want})")
    print(f"  (canonical() alone, no build: {canonical(stored) == canonical(shipped)})")
    assert all(got == want for got, want in cases.values())
