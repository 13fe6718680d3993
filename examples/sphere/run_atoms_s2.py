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

from tpde.config_core import parse_toml
from tpde.grid import cubed_sphere as cs
from tpde.sphere import build_sphere
from tpde.validation.sphere_atoms import (
    HarmonicTokens,
    cell_masses,
    lattice_tokens,
    token_energy_harmonic,
)

CONFIG = Path(__file__).with_name("clusters_s2_atoms.toml")


def tokens(seed: int, t_end: float = 200.0, n: int = 40_000, dt: float = 0.1) -> Path:
    config = build_sphere(parse_toml(CONFIG.read_text(), "config"))
    init = config.initial
    _, density = cs.noise_function(
        config.grid, init["amplitude"], init["l_max"], init.get("seed", 0)
    )
    x, w = lattice_tokens(density, n, seed)
    system = HarmonicTokens(x, config.field.beta, w)
    out = Path(f"tokens_s2_{seed}.jsonl")
    start = time.perf_counter()
    with out.open("w") as f:
        for t in config.times[config.times <= t_end]:
            system.integrate([t], dt)
            rho = cell_masses(config.grid, system.x, system.weights)
            centres, masses = cs.clusters(config.grid, rho)
            line = {
                "t": float(t),
                "energy": token_energy_harmonic(system.x, system.weights, config.field.beta),
                "centres": centres.tolist(),
                "masses": masses.tolist(),
                "wall": time.perf_counter() - start,
            }
            f.write(json.dumps(line) + "\n")
            f.flush()
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    tokens(int(args[0]), *(float(a) for a in args[1:2]), *(int(a) for a in args[2:3]),
           *(float(a) for a in args[3:4]))  # fmt: skip
