"""Tokens for examples/sphere/clusters_s2_atoms.toml: clusters, masses and energy over time.

docs/validation.md, 'Atoms on the sphere'. ``python examples/sphere/run_atoms_s2.py SEEDS
[T_END] [N] [DT] [MATCH]`` moves ``N`` (4 x 10^4) lattice tokens of the run's initial density
(:func:`tpde.validation.sphere_atoms.lattice_tokens`, the lattice turned by each of
``SEEDS`` (a comma list, advanced in turn), the
weights matched to the density's coefficients up to degree ``MATCH`` (76, 0: not) to
``T_END`` (200) with CF4 steps ``DT`` (0.1), and writes one JSON line per snapshot of the
config (time, energy, cluster centres and masses) to ``tokens_s2_SEED_nN_mMATCH.jsonl``;
the grid run is
``tpde run examples/sphere/clusters_s2_atoms.toml``; ``python
examples/sphere/run_atoms_s2.py compare GRID.nc TOKENS.jsonl ...`` prints the table of
docs/validation.md, the plateaus' largest gaps and the seeds' spread.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from tpde.config_core import parse_toml
from tpde.sphere import build_sphere
from tpde.validation.sphere_atoms import (
    cluster_table,
    compare_clusters,
    measure_clusters,
    plateau_failures,
    token_clusters,
)

CONFIG = Path(__file__).with_name("clusters_s2_atoms.toml")


def tokens(
    seeds: list[int], t_end: float = 200.0, n: int = 40_000, dt: float = 0.1, match: int = 76
) -> list[Path]:
    """The seeds' token systems advanced in turn, one snapshot each (all reach the same time
    when stopped early); one file per seed."""
    problem = build_sphere(parse_toml(CONFIG.read_text(), "config")).problem
    tag = f"_n{n}_m{match}"
    outs = [Path(f"tokens_s2_{seed}{tag}.jsonl") for seed in seeds]
    start = time.perf_counter()
    times = problem.times[problem.times <= t_end]
    files = [out.open("w") for out in outs]
    runs = [token_clusters(problem, seed, times, n, dt, match) for seed in seeds]
    for rows in zip(*runs, strict=True):
        for f, (t, energy, centres, masses) in zip(files, rows, strict=True):
            line = {"t": t, "energy": energy, "centres": centres.tolist(),
                    "masses": masses.tolist(), "wall": time.perf_counter() - start}  # fmt: skip
            f.write(json.dumps(line) + "\n")
            f.flush()
    for f in files:
        f.close()
    return outs


def grid_clusters(grid_file: str | Path) -> tuple[list, float]:
    """The grid+atoms run's clusters per snapshot ``(t, energy, centres, masses)`` (cells
    plus atoms, :func:`tpde.validation.sphere_atoms.measure_clusters`) and its cell width."""
    import netCDF4

    from tpde.atoms_io import read_atoms
    from tpde.io import read
    from tpde.sphere import from_file, grid_of

    ds = read(grid_file)
    grid = grid_of(ds)
    out = []
    with netCDF4.Dataset(grid_file) as nc:
        nc.set_auto_mask(False)
        for i, t in enumerate(ds["time"].values):
            found = read_atoms(nc, i)
            atoms = None if found is None else found[0]
            centres, masses = measure_clusters(grid, from_file(ds["density"].values[i]), atoms)
            out.append((float(t), float(ds["energy_interaction"].values[i]), centres, masses))
    return out, grid.h


def token_file(path: str | Path) -> list:
    """A seed's snapshots ``(t, energy, centres, masses)`` from its JSON lines."""
    rows = map(json.loads, Path(path).read_text().splitlines())
    return [(r["t"], r["energy"], np.asarray(r["centres"]).reshape(-1, 3),
             np.asarray(r["masses"])) for r in rows]  # fmt: skip


def compare(grid_file: str | Path, token_files: list[str | Path]) -> list[str]:
    """Print the table of docs/validation.md and the plateaus' summary; return the
    failures (:func:`tpde.validation.sphere_atoms.plateau_failures`)."""
    grid, h = grid_clusters(grid_file)
    rows = compare_clusters(grid, [token_file(f) for f in token_files])
    print(cluster_table(rows))
    on = [r for r in rows if r["plateau"]]
    if on:
        print(f"plateau rows {len(on)} of {len(rows)} (t = {rows[0]['t']:g} .. {rows[-1]['t']:g})")
        print(f"largest mass gap {max(max(r['mass_gap']) for r in on):.2e}, largest seed "
              f"spread {np.nanmax([r['spread'] for r in on]):.2e}, largest angle "
              f"{max(max(r['angle']) for r in on) / h:.2f} h")  # fmt: skip
    failures = plateau_failures(rows, h)
    print("\n".join(failures) or "every plateau row within the tolerances")
    return failures


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "compare":
        compare(args[1], args[2:])
    else:
        tokens([int(a) for a in args[0].split(",")], *(float(a) for a in args[1:2]),
               *(int(a) for a in args[2:3]), *(float(a) for a in args[3:4]),
               *(int(a) for a in args[4:5]))  # fmt: skip
