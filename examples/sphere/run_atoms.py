"""Metastable clusters with atoms: cells plus atoms against 10^4 tokens on the circle.

    python examples/sphere/run_atoms.py [-o examples/sphere] [--t-end 40]

The case of run_metastability.py (``A = 9 I``, modes 3, 4, 5 at 0.1) on 512 and 256 cells
with atoms on (docs/theory.md, 'Cells plus atoms'), against the 10^4 mid-quantile tokens of
the law, snapshots every 0.1
(:func:`tpde.validation.circle_atoms.atoms_against_tokens`). Prints the table and the merge
times and draws ``metastability_atoms.png``: the energy staircase and the atoms' tracks over
the cells' density in space-time.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import tpde
from tpde.validation.circle_atoms import atoms_against_tokens, plateau_gaps

BETA = 9.0
MODES = [(3, 0.1, 0.0), (4, 0.1, 1.0), (5, 0.1, 2.0)]
CELLS = (512, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--outdir", type=Path, default=Path("out/sphere"))
    parser.add_argument("--t-end", type=float, default=40.0)
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args()
    tpde.set_num_threads(1)
    args.outdir.mkdir(parents=True, exist_ok=True)
    study = atoms_against_tokens(BETA, args.t_end, CELLS, args.n, modes=MODES, spacing=0.1)
    times = study["times"]
    keys = ["mid"] + [str(c) for c in CELLS]
    print("| t | " + " | ".join(f"clusters {k}" for k in keys) + " | E mid | E 512 | E 256 |")
    print("|" + "---|" * (2 * len(keys) + 1))
    for i in range(0, times.size, 50):
        counts = " | ".join(str(study[f"clusters {k}"][i]) for k in keys)
        energies = " | ".join(f"{study[f'E {k}'][i]:.6f}" for k in keys)
        print(f"| {times[i]:g} | {counts} | {energies} |")
    print()
    for k in keys:
        print(f"merge times {k}: {study[f'merges {k}']}")
    for c in CELLS:
        gaps = plateau_gaps(times, study[f"E {c}"], study["E mid"], [(10, 20), (30, 40)])
        print(f"{c} cells, largest plateau gaps: " + ", ".join(f"{g:.2e}" for *_, g in gaps))
    figure(study).savefig(args.outdir / "metastability_atoms.png", dpi=120)


def figure(study: dict):
    times = study["times"]
    fig, (ax_e, ax_s) = plt.subplots(1, 2, figsize=(12, 4.6), constrained_layout=True)
    ax_e.plot(times, study["E mid"], "k-", lw=2, label="10^4 mid tokens")
    ax_e.plot(times, study["E 512"], "C0--", label="512 cells + atoms")
    ax_e.plot(times, study["E 256"], "C1:", label="256 cells + atoms")
    for count in (3, 4):  # equal point masses: E = 1 / count of a point mass's
        ax_e.axhline(1.0 / count, color="0.8", lw=0.8)
    ax_e.set_xlabel("t")
    ax_e.set_ylabel("E / (e^beta / (2 beta))")
    ax_e.set_title("interaction energy with atoms (beta = 9)")
    ax_e.legend(fontsize=8, loc="lower right")
    result = study["results"][512]
    density = np.stack([s.density for s in result.snapshots])
    uniform = 1.0 / (2 * math.pi)
    ax_s.imshow(
        np.log10(np.maximum(density.T / uniform, 1e-3)),
        origin="lower",
        aspect="auto",
        extent=(times[0], times[-1], 0.0, 2 * math.pi),
        cmap="Blues",
        vmin=-3,
        vmax=3,
        interpolation="nearest",
    )
    for s in result.snapshots[::5]:
        atoms = s.atoms
        ax_s.scatter(np.full(atoms.count, s.time), atoms.centre[:, 0], s=20 * atoms.mass, c="C3")
    ax_s.scatter([], [], c="C3", label="atoms (512 cells)")
    ax_s.set_xlabel("t")
    ax_s.set_ylabel("theta")
    ax_s.set_title("log10(rho / uniform) on the cells, 512 cells, and the atoms")
    ax_s.legend(fontsize=8, loc="upper right")
    return fig


if __name__ == "__main__":
    main()
