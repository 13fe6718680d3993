"""Tokens for examples/sphere/clusters_s2_atoms.toml: clusters, masses and energy over time.

docs/validation.md, 'Atoms on the sphere'. ``python examples/sphere/run_atoms_s2.py SEED
[T_END] [N] [DT]`` moves ``N`` (4 x 10^4) lattice tokens of the run's initial density
(:func:`tpde.validation.sphere_atoms.lattice_tokens`, the lattice turned by ``SEED``) to
``T_END`` (200) with CF4 steps ``DT`` (0.1), and writes one JSON line per snapshot of the
config (time, energy, cluster centres and masses) to ``tokens_s2_SEED.jsonl``; the grid run
is ``tpde run examples/sphere/clusters_s2_atoms.toml``. ``compare(grid_file, token_files)``
prints the table of docs/validation.md.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from tpde.config_core import parse_toml
from tpde.sphere import build_sphere
from tpde.validation.sphere_atoms import token_clusters

CONFIG = Path(__file__).with_name("clusters_s2_atoms.toml")


def tokens(seed: int, t_end: float = 200.0, n: int = 40_000, dt: float = 0.1) -> Path:
    config = build_sphere(parse_toml(CONFIG.read_text(), "config"))
    out = Path(f"tokens_s2_{seed}.jsonl")
    start = time.perf_counter()
    times = config.times[config.times <= t_end]
    with out.open("w") as f:
        for t, energy, centres, masses in token_clusters(config, seed, times, n, dt):
            line = {"t": t, "energy": energy, "centres": centres.tolist(),
                    "masses": masses.tolist(), "wall": time.perf_counter() - start}  # fmt: skip
            f.write(json.dumps(line) + "\n")
            f.flush()
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    tokens(int(args[0]), *(float(a) for a in args[1:2]), *(int(a) for a in args[2:3]),
           *(float(a) for a in args[3:4]))  # fmt: skip


def compare(grid_file: str | Path, token_files: list[str | Path], times=None) -> list[dict]:
    """Rows of the table: per time the grid+atoms clusters (count, masses by decreasing
    mass), the largest mass and position gaps to each token seed's clusters (matched
    nearest first), the energies, and the seeds' own spread (their gaps to seed 0)."""
    import netCDF4

    from tpde.sphere import from_file, grid_of, read_sphere
    from tpde.sphere_atoms_io import read_sphere_atoms
    from tpde.validation.sphere_atoms import match_clusters, measure_clusters

    ds = read_sphere(grid_file)
    grid = grid_of(ds)
    seeds = [
        {round(r["t"], 9): r for r in map(json.loads, Path(f).read_text().splitlines())}
        for f in token_files
    ]
    rows = []
    with netCDF4.Dataset(grid_file) as nc:
        nc.set_auto_mask(False)
        for i, t in enumerate(ds["time"].values):
            key = round(float(t), 9)
            if (times is not None and key not in times) or not all(key in s for s in seeds):
                continue
            found = read_sphere_atoms(nc, i)
            atoms = None if found is None else found[0]
            grid_clusters = measure_clusters(grid, from_file(ds["density"].values[i]), atoms)
            row = {"t": float(t), "grid": grid_clusters, "energy": float(
                ds["energy_interaction"].values[i]), "atoms": 0 if atoms is None else atoms.count,
                "tokens": []}  # fmt: skip
            for s in seeds:
                r = s[key]
                tok = (np.asarray(r["centres"]).reshape(-1, 3), np.asarray(r["masses"]))
                pairs = match_clusters(grid_clusters, tok)
                row["tokens"].append({
                    "count": tok[1].size,
                    "energy": r["energy"],
                    "mass_gap": max((abs(grid_clusters[1][a] - tok[1][b]) for a, b, _ in pairs),
                                    default=np.nan),
                    "angle": max((g for _, _, g in pairs), default=np.nan),
                })  # fmt: skip
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| t | atoms | clusters grid / seeds | E grid | E seeds - grid | mass gap | angle |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        counts = "/".join(str(s["count"]) for s in r["tokens"])
        de = ", ".join(f"{s['energy'] - r['energy']:+.2e}" for s in r["tokens"])
        gap = max(s["mass_gap"] for s in r["tokens"])
        angle = max(s["angle"] for s in r["tokens"])
        lines.append(f"| {r['t']:g} | {r['atoms']} | {r['grid'][1].size} / {counts} | "
                     f"{r['energy']:.6g} | {de} | {gap:.1e} | {angle:.1e} |")  # fmt: skip
    return "\n".join(lines)
