#!/usr/bin/env python
"""Reproduce the paper's experiments (docs/theory.md, 'Paper experiments E1-E6') with the grid
solver: figures in OUT.

    .venv/bin/python examples/paper/run_paper.py [-o out/paper] [--cells 64] [--count 6]
                                                 [--no-grid] [--only E2 E5] [--threads N]

For each experiment E1-E6 and each of its variants: ``--count`` initial covariances of the authors'
trace-1 grid, evolved by the Gaussian ODE and (unless --no-grid) by the grid solver at --cells^2,
drawn as ``<E>_<variant>_3d.png`` (a - b, 2c, a + b with the PSD cone) and ``<E>_<variant>_2d.png``
(trace-normalised, the unit circle = rank 1); blow-ups are marked where detected. The grid runs
follow the law in the co-moving affine frame and go until t_end, the blow-up, or until their
truncation monitor stops them (box_limited, blowup), which ``summary.md`` records with the time
and the reason; ``--fixed`` runs them on fixed boxes fitted to the ODE (to half the blow-up
time) instead. Then the rank histograms (docs/theory.md, 'Rank
histograms'; ``ranks.png``; softmax and l2 with V = I, d = 3, 4, 5: ODE limits at t = 5000, exact
limits for softmax, the paper's counts beside them) and a table ``summary.md`` with the largest
|Sigma/tr - Sigma_ode/tr| of every grid trajectory and where and why it stopped. The full set
at 64^2 takes about 10 minutes on one core; --no-grid about 1 minute.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tpde import set_num_threads
from tpde.validation.paper import (
    EXPERIMENTS,
    rank_counts,
    rank_histogram_figure,
    run_experiment,
    trajectory_figures,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=Path("out/paper"))
    parser.add_argument("--cells", type=int, default=64)
    parser.add_argument("--count", type=int, default=6)
    parser.add_argument("--no-grid", action="store_true")
    parser.add_argument(
        "--fixed", action="store_true", help="fixed boxes instead of the co-moving frame"
    )
    parser.add_argument("--only", nargs="*", default=list(EXPERIMENTS))
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads of the compiled loops (default: tpde's, docs/user-guide.md, 'Threads')",
    )
    args = parser.parse_args()
    if args.threads is not None:
        set_num_threads(args.threads)
    args.output.mkdir(parents=True, exist_ok=True)
    rows = [
        "| experiment | variant | Sigma_0 | grid to t | ended | ODE blow-up | max gap of Sigma/tr "
        "| why it stopped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in args.only:
        experiment = EXPERIMENTS[name]
        for variant in experiment.params:
            start = time.perf_counter()
            trajectories = run_experiment(
                name, variant, args.count, args.cells, grid=not args.no_grid, frame=not args.fixed
            )
            title = f"{name} {experiment.title}: {variant}"
            trajectory_figures(
                trajectories,
                title,
                args.output / f"{name}_{variant}_3d.png",
                args.output / f"{name}_{variant}_2d.png",
            )
            for t in trajectories:
                if t.grid_failure:
                    rows.append(
                        f"| {name} | {variant} | {t.cov0.round(3).tolist()} | "
                        f"failed | | {t.ode_event:.3g} | | {t.grid_failure} |"
                    )
                elif len(t.grid_times):
                    rows.append(
                        f"| {name} | {variant} | {t.cov0.round(3).tolist()} | "
                        f"{t.grid_times[-1]:.3g} | {t.grid_status} | {t.ode_event:.3g} | "
                        f"{t.normalised_gap():.2e} | {t.grid_message} |"
                    )
            print(f"{title}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    counts = {
        (variant, d): rank_counts(variant, d) for variant in ("softmax", "l2") for d in (3, 4, 5)
    }
    rank_histogram_figure(counts, args.output / "ranks.png")
    rows += ["", "| variant | d | ODE limit ranks | exact limit ranks |", "|---|---|---|---|"]
    rows += [f"| {v} | {d} | {c['ode']} | {c.get('exact', '')} |" for (v, d), c in counts.items()]
    (args.output / "summary.md").write_text("\n".join(rows) + "\n")
    print(f"figures and summary.md in {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
