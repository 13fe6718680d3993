#!/usr/bin/env python
"""Cells plus atoms against tokens on the circle's clusters from noise: wall time and agreement.

    .venv/bin/python benchmarks/clusters_atoms.py [--t-end 500] [--n 10000] [--cells 512]

examples/sphere/clusters.toml's law (``A = beta I`` with beta = 32, noise of amplitude 1e-4 up
to k = 48, seed 0) on ``--cells`` cells with atoms on (docs/theory.md, 'Cells plus atoms')
and as ``--n`` mid-quantile tokens (RK4, dt = 0.05), both to ``--t-end`` with snapshots every
0.5, one after the other in this process
(:func:`tpde.validation.circle_atoms.atoms_against_tokens`). ``atoms_over_tokens``: the
ratio of the two wall times (issue target: at most 1); beside it what makes the comparison
fair: the snapshots whose cluster counts differ, the merge times of both, the largest energy
gap on the plateaus (units of a point mass's energy). One thread. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import emit, loadavg  # noqa: E402

from tpde.grid.circle import noise_modes  # noqa: E402
from tpde.grid.threads import set_num_threads  # noqa: E402
from tpde.validation.circle_atoms import (  # noqa: E402
    atoms_against_tokens,
    plateau_gaps,
    plateau_windows,
)

BETA = 32.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t-end", type=float, default=500.0)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--cells", type=int, default=512)
    args = parser.parse_args()
    set_num_threads(1)
    start, load = time.perf_counter(), loadavg()
    modes = noise_modes(1e-4, 48, 0)
    study = atoms_against_tokens(
        BETA, args.t_end, (args.cells,), args.n, modes=modes, spacing=0.5, dt=0.05
    )
    times, key = study["times"], str(args.cells)
    differ = int(np.sum(np.array(study["clusters mid"]) != np.array(study[f"clusters {key}"])))
    windows = plateau_windows(times, study["clusters mid"], margin=2.0)
    gaps = plateau_gaps(times, study[f"E {key}"], study["E mid"], windows)
    emit(
        "clusters_atoms",
        start,
        cells=args.cells,
        tokens=args.n,
        t_end=args.t_end,
        wall_tokens_s=round(study["wall mid"], 1),
        wall_atoms_s=round(study[f"wall {key}"], 1),
        atoms_over_tokens=round(study[f"wall {key}"] / study["wall mid"], 3),
        steps=study["results"][args.cells].steps,
        clusters_final=int(study["clusters mid"][-1]),
        snapshots_counts_differ=differ,
        merges_tokens=study["merges mid"],
        merges_atoms=study[f"merges {key}"],
        plateau_gap=max((g for *_, g in gaps), default=None),
        load_before=load,
        load_after=loadavg(),
    )


if __name__ == "__main__":
    main()
