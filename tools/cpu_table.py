"""Tables of the per-test CPU seconds that tools/cputime_plugin.py writes.

One file: the total, the CPU per test file and the costliest tests. Two files (before and
after a change, measured the same way): the CPU per test file side by side and the change.
``cpu`` is the test process's own time, ``children`` that of the processes it waited for
(``tpde`` in a subprocess, dask workers); the tables add the two as ``total``.

    .venv/bin/python tools/cpu_table.py /tmp/cpu.jsonl [--top 40]
    .venv/bin/python tools/cpu_table.py /tmp/before.jsonl /tmp/after.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def read(path: Path) -> list[Row]:
    """The rows of one CPUTIME_OUT file (a test run twice into one file counts twice)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def total(row: Row) -> float:
    """Own plus children's CPU seconds of one row (files from before ``children``: own)."""
    return float(row["cpu"]) + float(row.get("children", 0.0))


def per_file(rows: list[Row]) -> dict[str, float]:
    """Total CPU seconds per test file (the node id up to ``::``), costliest first."""
    files: defaultdict[str, float] = defaultdict(float)
    for row in rows:
        files[row["id"].split("::")[0]] += total(row)
    return dict(sorted(files.items(), key=lambda item: -item[1]))


def summary(rows: list[Row], top: int) -> str:
    """Totals, the ``top`` costliest files and the ``top`` costliest tests."""
    own = sum(float(row["cpu"]) for row in rows)
    children = sum(total(row) for row in rows) - own
    lines = [
        f"{len(rows)} tests, CPU {own + children:.0f} s = {(own + children) / 60:.1f} min "
        f"(own {own:.0f} s, children {children:.0f} s)",
        "--- per file: total s",
    ]
    lines += [f"{cpu:8.1f}  {name}" for name, cpu in list(per_file(rows).items())[:top]]
    lines.append("--- per test: total, children, wall s")
    for row in sorted(rows, key=total, reverse=True)[:top]:
        lines.append(
            f"{total(row):8.1f} {float(row.get('children', 0.0)):8.1f} "
            f"{float(row['wall']):8.1f}  {row['id']}"
        )
    return "\n".join(lines)


def comparison(before: list[Row], after: list[Row], top: int) -> str:
    """CPU per file before and after, the ``top`` largest changes first, and the totals."""
    old, new = per_file(before), per_file(after)

    def change(name: str) -> float:
        """The size of one file's change, the sort key."""
        return abs(new.get(name, 0.0) - old.get(name, 0.0))

    names = sorted(set(old) | set(new), key=change, reverse=True)
    lines = [f"{'before':>8} {'after':>8} {'change':>8}  file (total s)"]
    for name in names[:top]:
        a, b = old.get(name, 0.0), new.get(name, 0.0)
        lines.append(f"{a:8.1f} {b:8.1f} {b - a:+8.1f}  {name}")
    a, b = sum(old.values()), sum(new.values())
    share = f"{100 * (b - a) / a:+.1f} %" if a else "n/a"
    lines.append(
        f"{a:8.1f} {b:8.1f} {b - a:+8.1f}  all ({len(before)} -> {len(after)} tests, {share})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the summary of one file or the comparison of two."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="one file, or before and after")
    parser.add_argument("--top", type=int, default=40, help="rows per table (default 40)")
    args = parser.parse_args(argv)
    if len(args.files) == 1:
        print(summary(read(args.files[0]), args.top))
    elif len(args.files) == 2:
        print(comparison(read(args.files[0]), read(args.files[1]), args.top))
    else:
        parser.error("one file, or two (before and after)")


if __name__ == "__main__":
    main()
