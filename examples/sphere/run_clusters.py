"""Clusters on the circle: the README figure and the cluster counts against k_max.

    python examples/sphere/run_clusters.py [-o examples/sphere] [--seeds 3]

1. Runs ``clusters.toml`` (beta = 32, 512 cells, noise 1e-4) and draws the space-time and
   ring figures (``clusters_space_time.png``, ``clusters_ring.png``).
2. For beta in {1, 2, 4, 8, 16, 32, 64, 100} and a few noise seeds, counts the clusters at
   ``T = (log(1 / amplitude) + 4) / lambda_max``
   (:func:`tpde.validation.circle_metastability.clusters_from_noise`) and prints them
   beside the fastest mode ``k_max`` and ``sqrt(2 beta)``.

docs/theory.md, 'Attention dynamics on the sphere'; the numbers are in README.md.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import tpde
from tpde.circle_plots import ring_figure, space_time_figure
from tpde.validation.circle_metastability import clusters_from_noise

HERE = Path(__file__).resolve().parent
BETAS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--outdir", type=Path, default=Path("out/sphere"))
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    tpde.set_num_threads(1)  # 1-D: numba's workers cost more than they give
    args.outdir.mkdir(parents=True, exist_ok=True)

    ds = tpde.simulate(HERE / "clusters.toml")
    space_time_figure(ds, title="beta = 32: clusters forming from noise (k_max = 8)").savefig(
        args.outdir / "clusters_space_time.png", dpi=120
    )
    ring_figure(ds, count=5).savefig(args.outdir / "clusters_ring.png", dpi=120)

    print("| `beta` | `k_max` | `sqrt(2 beta)` | clusters (seeds 0..) |")
    print("|---|---|---|---|")
    for beta in BETAS:
        runs = [clusters_from_noise(beta, seed=seed) for seed in range(args.seeds)]
        counts = ", ".join(str(r["count"]) for r in runs)
        print(f"| {beta:g} | {runs[0]['k_max']} | {math.sqrt(2 * beta):.2f} | {counts} |")


if __name__ == "__main__":
    main()
