"""The default example (``make demo``): a Gaussian carried by a sheared, rotating field.

u(x) = M x + b keeps Gaussians Gaussian (mean' = M mean + b, Sigma' = M Sigma + Sigma M^T),
so the exact solution is known: the demo runs WENO5-Z + SSP-RK3 on a 2-D grid, prints the
L1 error of the density and the errors of mean and covariance, and draws the density with the
exact 1- and 2-sigma ellipses (out/demo.png).

    python examples/affine_demo.py -o out [--cells 128]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.linalg import expm

from tpde.grid import Grid, gaussian, moments
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.variants import AffineVelocity

MATRIX = np.array([[0.1, -1.0], [0.4, -0.15]])
OFFSET = np.array([0.2, -0.1])
MEAN0 = np.array([0.3, -0.2])
COV0 = np.array([[0.8, 0.25], [0.25, 0.6]])


def exact_moments(t: float) -> tuple[np.ndarray, np.ndarray]:
    augmented = np.zeros((3, 3))
    augmented[:2, :2] = MATRIX
    augmented[:2, 2] = OFFSET
    flow = expm(MATRIX * t)
    return (expm(augmented * t) @ np.r_[MEAN0, 1.0])[:2], flow @ COV0 @ flow.T


def ellipse(mean: np.ndarray, cov: np.ndarray, radius: float) -> np.ndarray:
    angle = np.linspace(0, 2 * np.pi, 200)
    values, vectors = np.linalg.eigh(cov)
    circle = np.stack([np.cos(angle), np.sin(angle)])
    return mean[:, None] + radius * vectors @ (np.sqrt(values)[:, None] * circle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="out", help="output folder (default out)")
    parser.add_argument("--cells", type=int, default=128, help="cells per axis (default 128)")
    parser.add_argument("--t-end", type=float, default=3.0, help="final time (default 3)")
    args = parser.parse_args(argv)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)

    grid = Grid([-7.0, -7.0], [7.0, 7.0], [args.cells, args.cells], "outflow")
    problem = Problem(
        grid,
        gaussian(grid, MEAN0, COV0),
        AffineVelocity(MATRIX, OFFSET),
        args.t_end,
        scheme=Scheme("weno5z", "ssprk3", cfl=0.4),
        snapshots=4,
    )
    solver = Solver(
        problem,
        on_snapshot=lambda s: print(
            f"t = {s.time:6.3f}  step {s.step:5d}  mass {s.mass:.15f}  outflow {s.outflow:.2e}"
        ),
    )
    start = time.perf_counter()
    result = solver.run()
    wall = time.perf_counter() - start

    mean_t, cov_t = exact_moments(args.t_end)
    exact = gaussian(grid, mean_t, cov_t)
    _, mean, cov = moments(result.final, grid)
    l1 = float(np.abs(result.final - exact).sum() * grid.cell_volume)
    print(
        f"{result.steps} steps in {wall:.2f} s ({grid.size * result.steps / wall / 1e6:.2f} "
        f"Mcell-updates/s); status {result.status}"
    )
    print(
        f"L1 error of the density {l1:.3e}; mean error {np.abs(mean - mean_t).max():.3e}; "
        f"covariance error {np.abs(cov - cov_t).max():.3e}"
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1,
        len(result.snapshots),
        figsize=(4 * len(result.snapshots), 4),
        sharey=True,
        constrained_layout=True,
    )
    extent = [grid.lower[0], grid.upper[0], grid.lower[1], grid.upper[1]]
    for ax, snap in zip(axes, result.snapshots, strict=True):
        ax.imshow(snap.density.T, origin="lower", extent=extent, cmap="magma")
        m, c = exact_moments(snap.time)
        for r in (1.0, 2.0):
            xy = ellipse(m, c, r)
            ax.plot(xy[0], xy[1], color="cyan", lw=0.8)
        ax.set_title(f"t = {snap.time:.2f}")
        ax.set_xlim(-4, 4)
        ax.set_ylim(-4, 4)
        ax.set_xlabel("x")
    axes[0].set_ylabel("y")
    fig.suptitle(
        "density (WENO5-Z + SSP-RK3) under u = Mx + b; cyan: exact 1- and 2-sigma ellipses"
    )
    figure = out / "demo.png"
    fig.savefig(figure, dpi=110)
    print(f"wrote {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
