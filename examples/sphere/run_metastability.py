"""Metastable clusters on the circle: the energy staircase, grid against 10^4 tokens.

    python examples/sphere/run_metastability.py [-o examples/sphere] [--t-end 80]

Attention ``A = 9 I``, ``V = I`` from ``(1 + 0.1 sum_k cos(k (theta - p_k))) / (2 pi)``,
``k = 3, 4, 5``: the grid at 512 and 2048 cells, the 10^4 mid-quantile tokens of the law
(the mean field without sampling noise) and 10^4 i.i.d. tokens for three seeds
(:func:`tpde.validation.circle_metastability.metastability_study`). Prints the table
(clusters, energies, W2 on the circle to the mid tokens, the seeds' W2 to each other) and
draws ``metastability.png``: the energy staircase and the clusters in space-time.

docs/theory.md, 'Metastability on the circle'; the numbers are in README.md.
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
from tpde.grid.circle import circle_grid, clusters
from tpde.validation.circle_metastability import (
    format_table,
    merge_times,
    metastability_study,
    token_clusters,
)

BETA = 9.0
MODES = [(3, 0.1, 0.0), (4, 0.1, 1.0), (5, 0.1, 2.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--outdir", type=Path, default=Path("out/sphere"))
    parser.add_argument("--t-end", type=float, default=80.0)
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args()
    tpde.set_num_threads(1)
    args.outdir.mkdir(parents=True, exist_ok=True)
    snapshots = int(round(args.t_end)) + 1
    study = metastability_study(
        BETA,
        MODES,
        args.t_end,
        cells=(512, 2048),
        n=args.n,
        seeds=(0, 1, 2),
        snapshots=snapshots,
        w2_every=max(1, snapshots // 8),
    )
    rows = study["rows"]
    table = [r for r in rows if not math.isnan(r["noise"])]
    print(
        format_table(
            table,
            ["t", "clusters 512", "clusters 2048", "clusters mid"]
            + [f"clusters seed {s}" for s in (0, 1, 2)]
            + ["E 512", "E 2048", "E mid"]
            + [f"E seed {s}" for s in (0, 1, 2)],
        )
    )
    print()
    print(
        format_table(
            table,
            ["t", "W2 512", "W2 2048"] + [f"W2 seed {s}" for s in (0, 1, 2)] + ["noise"],
        )
    )
    print()
    print("| run | merge times (the cluster count falls) |")
    print("|---|---|")
    for key in ["512", "2048", "mid"] + [f"seed {s}" for s in (0, 1, 2)]:
        counts = [r[f"clusters {key}"] for r in rows]
        print(f"| {key} | {', '.join(f'{t:g}' for t in merge_times(study['times'], counts))} |")
    figure(study).savefig(args.outdir / "metastability.png", dpi=120)


def figure(study: dict):
    times = study["times"]
    rows = study["rows"]
    fig, (ax_e, ax_s) = plt.subplots(1, 2, figsize=(12, 4.6), constrained_layout=True)
    scale = math.exp(BETA) / (2 * BETA)
    for key, style in (("E seed 0", ":"), ("E seed 1", ":"), ("E seed 2", ":")):
        ax_e.plot(times, [r[key] / scale for r in rows], style, color="0.5", lw=1)
    ax_e.plot([], [], ":", color="0.5", label="10^4 i.i.d. tokens (3 seeds)")
    ax_e.plot(times, [r["E mid"] / scale for r in rows], "k-", lw=2, label="10^4 mid tokens")
    ax_e.plot(times, [r["E 512"] / scale for r in rows], "C1--", label="grid, 512 cells")
    ax_e.plot(times, [r["E 2048"] / scale for r in rows], "C0-", label="grid, 2048 cells")
    for count in (3, 4):  # equal point masses: E = sum m_a^2 e^beta / (2 beta)
        ax_e.axhline(1.0 / count, color="0.8", lw=0.8)
    ax_e.set_xlabel("t")
    ax_e.set_ylabel("E / (e^beta / (2 beta))")
    ax_e.set_title("interaction energy: the staircase (beta = 9)")
    ax_e.legend(fontsize=8, loc="lower right")

    grid = study["grids"][2048]
    density = np.stack(study["densities"][2048])
    extent = (times[0], times[-1], 0.0, 2 * math.pi)
    image = ax_s.imshow(
        np.log10(np.maximum(density.T * 2 * math.pi, 1e-3)),
        origin="lower",
        aspect="auto",
        extent=extent,
        cmap="Blues",
        vmin=-3,
        vmax=3,
        interpolation="nearest",
    )
    for cells, color in ((2048, "C0"), (512, "C1")):  # one cell wide: too thin to see
        g = study["grids"][cells]
        for t, rho in zip(times, study["densities"][cells], strict=True):
            where, _ = clusters(rho, g)
            ax_s.plot(np.full(where.size, t), where, "_", ms=5, color=color)
        ax_s.plot([], [], "_", color=color, label=f"clusters, grid {cells} cells")
    counting = circle_grid(128)
    for name, marker, color in (("mid", "o", "k"), ("seed 0", "x", "C3")):
        for t, angles in zip(times, study["tokens"][name], strict=True):
            where, _ = token_clusters(angles, counting)
            ax_s.plot(np.full(where.size, t), where, marker, ms=2.5, color=color, mfc="none")
    ax_s.plot([], [], "o", color="k", mfc="none", label="clusters, mid tokens")
    ax_s.plot([], [], "x", color="C3", label="clusters, i.i.d. tokens (seed 0)")
    ax_s.set_xlabel("t")
    ax_s.set_ylabel("theta")
    ax_s.set_title(f"density, grid {grid.cells[0]} cells, and the clusters")
    fig.colorbar(image, ax=ax_s, label="log10(2 pi rho) = log10(density / uniform)")
    ax_s.legend(fontsize=8, loc="upper right")
    return fig


if __name__ == "__main__":
    main()
