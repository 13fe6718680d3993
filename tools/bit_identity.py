#!/usr/bin/env python
"""Every shipped example's output before and after a change: bit for bit, or how far apart.

    # in each checkout, with its own .venv (one thread, so both see the same sums)
    .venv/bin/python tools/bit_identity.py run OUTDIR [--examples-from DIR]
    # then, in either
    .venv/bin/python tools/bit_identity.py compare BEFORE_DIR AFTER_DIR

``run`` runs every example ``tpde run`` takes (examples/*.toml, examples/sphere/*.toml; the
sweep and continuation files are not run configs) shortened as tests/test_resume_examples.py
shortens them (``run.t_end`` to a few steps, 5 snapshots), with ``tpde run --quiet``, into
``OUTDIR/<name>.nc``; ``--examples-from`` takes the example files from another checkout
(the same inputs on both sides). ``compare`` prints one table row per example: the
variables present on both sides, how many are bit-identical, and for the others the largest
difference relative to the variable's largest magnitude and the largest absolute one (a
variable near zero, such as the sphere's mean vector of a near-uniform law, has a large
relative one from round-off), plus the variables only one side has (listed, not compared).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import netCDF4
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = 5
#: a few dt_max steps for the circle and the sphere; a fraction of the flat runs' t_end
T_END = {"circle": 4 * 0.137, "sphere": 4 * 0.139}
FLAT_T_END_FRACTION = 0.04


def examples(root: Path) -> list[Path]:
    return sorted([*root.glob("examples/*.toml"), *root.glob("examples/sphere/*.toml")])


def shortened_text(path: Path) -> str:
    """The example's TOML with ``run.t_end`` and ``run.snapshots`` made small (and relative
    paths of its ``initial.file`` kept relative to the example's folder)."""
    raw = tomllib.loads(path.read_text())
    geometry = raw["grid"].get("geometry", "flat")
    t_end = T_END.get(geometry, FLAT_T_END_FRACTION * float(raw["run"]["t_end"]))
    raw["run"].update(t_end=t_end, snapshots=SNAPSHOTS)
    raw["run"].pop("output", None)
    from tpde.config import dumps

    return dumps(raw)


def run(outdir: Path, source: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TPDE_NUM_THREADS": "1"}
    tpde = Path(sys.executable).with_name("tpde")
    for example in examples(source):
        config = outdir / (example.stem + ".toml")
        config.write_text(shortened_text(example))
        target = outdir / (example.stem + ".nc")
        done = subprocess.run(
            [str(tpde), "run", str(config), "-o", str(target), "--overwrite", "--quiet"],
            env=env,
            capture_output=True,
            text=True,
        )
        print(f"{example.relative_to(source)}: exit {done.returncode} {done.stderr.strip()[:200]}")


def values(path: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as nc:
        nc.set_auto_mask(False)
        return {name: np.asarray(var[...]) for name, var in nc.variables.items()}


def compare(before: Path, after: Path) -> None:
    print(
        "| example | compared | identical | largest difference, relative to the variable's "
        "largest value and absolute | only before | only after |"
    )
    print("|---|---|---|---|---|---|")
    for path in sorted(before.glob("*.nc")):
        other = after / path.name
        if not other.is_file():
            print(f"| {path.stem} | - | - | missing after | | |")
            continue
        a, b = values(path), values(other)
        common = sorted(set(a) & set(b))
        same, worst, where, largest, at = 0, 0.0, "", 0.0, ""
        for name in common:
            x, y = a[name], b[name]
            if x.shape == y.shape and (
                np.array_equal(x, y, equal_nan=True)
                if x.dtype.kind == "f"
                else np.array_equal(x, y)
            ):
                same += 1
                continue
            if x.shape != y.shape or x.dtype.kind not in "fiu":
                worst, where = float("inf"), f"{name} (shape or type)"
                continue
            scale = max(float(np.nanmax(np.abs(x))), 1e-300)
            absolute = float(np.nanmax(np.abs(x.astype(float) - y.astype(float))))
            if absolute / scale > worst:
                worst, where = absolute / scale, name
            if absolute > largest:
                largest, at = absolute, name
        only_a = ", ".join(sorted(set(a) - set(b)))
        only_b = ", ".join(sorted(set(b) - set(a)))
        shown = "-" if not where else f"{worst:.1e} ({where}); absolute {largest:.1e} ({at})"
        print(f"| {path.stem} | {len(common)} | {same} | {shown} | {only_a} | {only_b} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("outdir", type=Path)
    r.add_argument("--examples-from", type=Path, default=ROOT)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.outdir, args.examples_from)
    else:
        compare(args.before, args.after)


if __name__ == "__main__":
    main()
