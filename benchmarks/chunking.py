#!/usr/bin/env python
"""Chunking benchmark: how the density's chunk shape costs the snapshot write and the reads.

    .venv/bin/python benchmarks/chunking.py [--snapshots N]

A run file is written by the real writer (``tpde.io.SnapshotWriter``: open, append one
record, sync, close, per snapshot) for every chunk policy below, then read back with
netCDF4 in a fresh open per read (best of 3): one cell's time series (``density[:, j, i]``),
one line's time series (``density[:, j, :]``, a row along x), one whole snapshot. Policies
(``tpde.io.spatial_chunks(sizes, ndim, values, times)``):

* ``slab``: one chunk per snapshot, the whole slab (the layout before the tiles);
* ``tile1k``, ``tile4k`` (the default), ``tile16k``: one snapshot per chunk, spatial tiles
  of about 1024 / 4096 / 16384 values;
* ``tile4k_t16``: 16 snapshots per chunk, tiles of 4096 values (a time series reads 16x
  fewer chunks, but every append rewrites the compressed chunks holding earlier snapshots).

Grids: 2-D 256^2 and 3-D 64^3, a Gaussian that moves and widens over the snapshots (so the
compression is that of a real run). The files live in the page cache: the reads time HDF5's
chunk lookups and inflating, which is what a chunk shape changes. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import netCDF4
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import best_of, emit  # noqa: E402

from tpde import io  # noqa: E402
from tpde.grid import Grid, gaussian  # noqa: E402

POLICIES = {
    "slab": {"values": 1 << 62, "times": 1},
    "tile1k": {"values": 1024, "times": 1},
    "tile4k": {"values": io.SPATIAL_CHUNK_VALUES, "times": 1},
    "tile16k": {"values": 16384, "times": 1},
    "tile4k_t16": {"values": io.SPATIAL_CHUNK_VALUES, "times": 16},
}
GRIDS = {
    "2d_256": Grid([-8.0] * 2, [8.0] * 2, [256] * 2),
    "3d_64": Grid([-8.0] * 3, [8.0] * 3, [64] * 3),
}


def write(path: Path, grid: Grid, snapshots: int) -> list[float]:
    """Write ``snapshots`` records; the seconds of each ``SnapshotWriter.write``."""
    d = grid.ndim
    writer = io.SnapshotWriter(path, grid, config_text="chunking benchmark")
    seconds = []
    for i in range(snapshots):
        s = i / max(1, snapshots - 1)
        rho = gaussian(grid, np.full(d, -1.0 + 2.0 * s), np.eye(d) * (0.6 + 1.5 * s))
        snap = SimpleNamespace(time=0.1 * i, density=rho, outflow=0.0, max_speed=1.0, dt=0.1)
        start = time.perf_counter()
        writer.write(snap)
        seconds.append(time.perf_counter() - start)
    writer.close("completed", 0.1 * (snapshots - 1))
    return seconds


def reads(path: Path) -> dict[str, float]:
    def read(index) -> None:
        with netCDF4.Dataset(path) as nc:
            nc["density"][index]

    with netCDF4.Dataset(path) as nc:
        shape = nc["density"].shape
    mid = tuple(n // 2 for n in shape[1:])
    return {
        "cell_series_ms": 1e3 * best_of(lambda: read((slice(None), *mid))),
        "line_series_ms": 1e3 * best_of(lambda: read((slice(None), *mid[:-1], slice(None)))),
        "snapshot_ms": 1e3 * best_of(lambda: read(shape[0] // 2)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshots", type=int, default=48)
    args, _ = parser.parse_known_args()  # (run_all passes its extra arguments to every script)
    start = time.perf_counter()
    default = io.spatial_chunks
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        for gname, grid in GRIDS.items():
            for name, policy in POLICIES.items():
                io.spatial_chunks = lambda sizes, ndim, p=policy: default(sizes, ndim, **p)
                path = Path(folder) / f"{gname}_{name}.nc"
                try:
                    seconds = write(path, grid, args.snapshots)
                finally:
                    io.spatial_chunks = default
                with netCDF4.Dataset(path) as nc:
                    chunks = nc["density"].chunking()
                rows[f"{gname}/{name}"] = {
                    "chunks": chunks,
                    "write_ms_median": round(1e3 * float(np.median(seconds)), 2),
                    "write_ms_last": round(1e3 * seconds[-1], 2),
                    "file_mb": round(path.stat().st_size / 2**20, 2),
                    **{k: round(v, 2) for k, v in reads(path).items()},
                }
    emit(
        "chunking",
        start,
        snapshots=args.snapshots,
        default_values=io.SPATIAL_CHUNK_VALUES,
        rows=rows,
    )


if __name__ == "__main__":
    main()
