#!/usr/bin/env python
"""Time to accuracy: grid solver vs interacting tokens on the 2-D Gaussian softmax case.

    .venv/bin/python benchmarks/time_to_accuracy.py [--budget 10]

Initial N(alpha_0, Sigma_0) with the c1 test matrices (docs/theory.md, 'Test matrices c1 and
c2'), softmax, t = 1; the error is the relative Frobenius error of the covariance against the
Gaussian ODE (docs/theory.md, 'Gaussian closures', solved
to 1e-13). Both methods in one run, one process, default threads:

* grid: tpde's default scheme (WENO5-Z, SSP-RK3) on the box fitted to alpha(t) +- 7 sigma(t)
  (tpde.validation.studies.fitted_box), n^2 cells for n in 24 .. 192; wall time of the whole run
  (problem set-up included, numba compiled beforehand).
* tokens: n i.i.d. samples of N(alpha_0, Sigma_0) (the particle system of docs/theory.md, 'The
  Transformer PDE', the model the PDE is the mean-field limit of), RK4 with dt = 0.05 (time error
  ~1e-7, far below the sampling error), dense O(n^2) sums; 3 seeds per n (median error and time).

``at_budget``: per method the most accurate run that finished within ``--budget`` seconds, and the
ratio of the token error to the grid error there. An extra row gives Gauss-Hermite tokens
(quadrature nodes, docs/theory.md, 'Gaussian closures'): exact for Gaussian data only, so not "the
token method" for general densities, but shown for completeness. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numba  # noqa: E402
from _machine import A1, V1, emit  # noqa: E402

from tpde.grid import Grid, gaussian, moments  # noqa: E402
from tpde.validation.gaussian import solve  # noqa: E402
from tpde.validation.particles import (  # noqa: E402
    TokenSystem,
    gauss_hermite_tokens,
    simulate,
    token_moments,
)
from tpde.validation.studies import fitted_box, grid_run, relative_errors  # noqa: E402
from tpde.variants import Head  # noqa: E402

MEAN0 = np.array([0.5, -0.3])
COV0 = np.array([[1.0, 0.4], [0.4, 0.6]])
T_END = 1.0


def grid_rows(cells: list[int], reference) -> list[dict]:
    head = Head(A1, V1)
    lower, upper = fitted_box(solve("softmax", MEAN0, COV0, head, T_END), T_END, 7.0)
    small = Grid(lower, upper, [16, 16])
    grid_run("softmax", head, small, gaussian(small, MEAN0, COV0), 0.05)  # compile
    rows = []
    for n in cells:
        start = time.perf_counter()
        grid = Grid(lower, upper, [n, n])
        result = grid_run("softmax", head, grid, gaussian(grid, MEAN0, COV0), T_END)
        _, mean, cov = moments(result.final, grid)
        wall = time.perf_counter() - start
        rows.append(
            {
                "method": "grid",
                "size": n * n,
                "label": f"{n}^2 cells",
                "wall_s": wall,
                "cov_error": relative_errors(mean, cov, reference)[1],
                "steps": result.steps,
            }
        )
        print(
            f"# grid {n}^2: {wall:.2f} s, covariance error {rows[-1]['cov_error']:.2e}",
            file=sys.stderr,
            flush=True,
        )
    return rows


def token_rows(sizes: list[int], reference, seeds: int = 3, dt: float = 0.05) -> list[dict]:
    system = TokenSystem("softmax", Head(A1, V1))
    root = np.linalg.cholesky(COV0)
    simulate(system, MEAN0 + np.random.default_rng(0).normal(size=(64, 2)) @ root.T, 0.1, dt)
    rows = []
    for n in sizes:
        walls, errors = [], []
        for seed in range(seeds):
            tokens = MEAN0 + np.random.default_rng(seed).normal(size=(n, 2)) @ root.T
            start = time.perf_counter()
            final = simulate(system, tokens, T_END, dt).tokens[-1]
            mean, cov = token_moments(final)
            walls.append(time.perf_counter() - start)
            errors.append(relative_errors(mean, cov, reference)[1])
        rows.append(
            {
                "method": "tokens",
                "size": n,
                "label": f"{n} tokens",
                "wall_s": float(np.median(walls)),
                "cov_error": float(np.median(errors)),
                "seeds": seeds,
            }
        )
        print(
            f"# tokens n = {n}: {rows[-1]['wall_s']:.2f} s, covariance error "
            f"{rows[-1]['cov_error']:.2e} (median of {seeds})",
            file=sys.stderr,
            flush=True,
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--budget", type=float, default=10.0, help="wall seconds (default 10)")
    args = parser.parse_args()
    start = time.perf_counter()
    reference = solve("softmax", MEAN0, COV0, Head(A1, V1), T_END).at(T_END)
    rows = grid_rows([24, 32, 48, 64, 96, 128, 192], reference)
    rows += token_rows([250, 500, 1000, 2000, 4000], reference)
    nodes, weights = gauss_hermite_tokens(MEAN0, COV0, 30)
    t0 = time.perf_counter()
    final = simulate(
        TokenSystem("softmax", Head(A1, V1)), nodes, T_END, 0.05, weights=weights
    ).tokens[-1]
    gh_error = relative_errors(*token_moments(final, weights), reference)[1]
    rows.append(
        {
            "method": "gauss-hermite tokens (Gaussian data only)",
            "size": 900,
            "label": "30^2 nodes",
            "wall_s": time.perf_counter() - t0,
            "cov_error": gh_error,
        }
    )
    best = {}
    for method in ("grid", "tokens"):
        within = [r for r in rows if r["method"] == method and r["wall_s"] <= args.budget]
        best[method] = min(within, key=lambda r: r["cov_error"]) if within else None
    ratio = (
        best["tokens"]["cov_error"] / best["grid"]["cov_error"]
        if best["grid"] and best["tokens"]
        else None
    )
    print(
        f"# within {args.budget:g} s: grid {best['grid'] and best['grid']['label']}, tokens "
        f"{best['tokens'] and best['tokens']['label']}: token error / grid error = "
        f"{ratio if ratio is None else f'{ratio:.3g}'}",
        file=sys.stderr,
    )
    emit(
        "time_to_accuracy",
        start,
        case="2-D Gaussian softmax c1, t = 1",
        budget_s=args.budget,
        grid_at_budget=best["grid"] and best["grid"]["label"],
        grid_error_at_budget=best["grid"] and best["grid"]["cov_error"],
        tokens_at_budget=best["tokens"] and best["tokens"]["label"],
        tokens_error_at_budget=best["tokens"] and best["tokens"]["cov_error"],
        token_over_grid_error=ratio,
        threads=numba.get_num_threads(),
        rows=rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
