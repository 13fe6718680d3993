"""A clustering two-component mixture: fixed box, co-moving frame and tokens side by side.

Softmax attention with V = -I and A + A^T of rank one collapses the law onto a line while its
components merge (tests/test_frame_tokens.py). This script runs the fixed box (7 standard
deviations of the initial law) and the co-moving frame (xi box +-12) with the same cells, and
the token system from i.i.d. samples of the mixture, and draws the three in physical space at
the last time: out/frame_mixture.png (--out docs/figures/frame_mixture.png redraws the
user guide's figure). It prints W2 / spread (whitened by the tokens'
covariance, both sides binned on the compared grid) of each run against the tokens.

    python examples/frame_mixture.py [--cells 96] [--tokens 10000] [--t-end 4] [--out PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import ot

from tpde.grid import Grid, gaussian_mixture
from tpde.schemes.frame import mixture_frame
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.validation.particles import TokenSystem, simulate
from tpde.variants import ATTENTION, Head

WEIGHTS = [0.3, 0.7]
MEANS = [np.array([2.0, -1.2]), np.array([-0.8, 0.6])]
COVS = [np.array([[0.25, 0.05], [0.05, 0.15]]), np.array([[0.5, -0.15], [-0.15, 0.6]])]
HEAD = Head(np.array([[1.0, 0.7], [-0.7, 0.0]]), -np.eye(2))


def runs(cells: int, t_end: float):
    frame, xi_means, xi_covs = mixture_frame(WEIGHTS, MEANS, COVS)
    xi = Grid([-12.0] * 2, [12.0] * 2, [cells, cells])
    framed = Solver(
        Problem(
            xi,
            gaussian_mixture(xi, WEIGHTS, xi_means, xi_covs),
            ATTENTION["softmax"](HEAD),
            t_end,
            scheme=Scheme(frame="affine", frame_tolerance=1e-8),
            snapshots=[0.0, t_end],
            frame=frame,
        )
    ).run()
    spread = 7.0 * np.sqrt(np.diag(frame.matrix @ frame.matrix.T))
    box = Grid(frame.mean - spread, frame.mean + spread, [cells, cells])
    fixed = Solver(
        Problem(
            box,
            gaussian_mixture(box, WEIGHTS, MEANS, COVS),
            ATTENTION["softmax"](HEAD),
            t_end,
            snapshots=[0.0, t_end],
            box_action="warn",
        )
    ).run()
    return (xi, framed), (box, fixed)


def tokens(n: int, t_end: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    component = rng.choice(2, size=n, p=WEIGHTS)
    x = np.empty((n, 2))
    for k in range(2):
        rows = component == k
        x[rows] = rng.multivariate_normal(MEANS[k], COVS[k], size=int(rows.sum()))
    return simulate(TokenSystem("softmax", HEAD), x, t_end, 0.2, method="ssprk3").at(t_end)


def w2_to_tokens(grid: Grid, density, frame, points: np.ndarray) -> float:
    """W2 / spread between a grid run and the tokens, both binned on the grid's cells."""
    centres = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    atoms = centres if frame is None else frame.physical(centres)
    local = points if frame is None else (points - frame.mean) @ frame.inverse.T
    index = [np.floor((local[:, a] - grid.lower[a]) / grid.spacing[a]).astype(int) for a in (0, 1)]
    inside = np.all([(i >= 0) & (i < n) for i, n in zip(index, grid.shape, strict=True)], axis=0)
    counts = np.zeros(grid.shape)
    np.add.at(counts, (index[0][inside], index[1][inside]), 1.0)
    values, vectors = np.linalg.eigh(np.cov(points.T))
    z = (atoms - points.mean(axis=0)) @ ((vectors / np.sqrt(values)) @ vectors.T).T
    a, b = density.reshape(-1) / density.sum(), counts.reshape(-1) / counts.sum()
    ka, kb = a > 1e-14, b > 0
    cost = ot.dist(z[ka], z[kb])
    return float(np.sqrt(ot.emd2(a[ka] / a[ka].sum(), b[kb], cost, numItermax=50_000_000)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=96)
    parser.add_argument("--tokens", type=int, default=10_000)
    parser.add_argument("--t-end", type=float, default=4.0)
    parser.add_argument("--out", default=str(Path("out/frame_mixture.png")))
    args = parser.parse_args()
    (xi, framed), (box, fixed) = runs(args.cells, args.t_end)
    points = tokens(args.tokens, args.t_end)
    snap_f, snap_b = framed.snapshots[-1], fixed.snapshots[-1]
    frame = snap_f.frame
    w_frame = w2_to_tokens(xi, snap_f.density, frame, points)
    w_fixed = w2_to_tokens(box, snap_b.density, None, points)
    print(f"t = {args.t_end}: W2 / spread to the tokens: frame {w_frame:.4f}, fixed {w_fixed:.4f}")
    print(f"frame: {framed.status}; fixed box: {fixed.status}")

    # the frame's cell corners in physical space; physical density = xi density / |det L|
    ex, ey = np.meshgrid(xi.edges(0), xi.edges(1), indexing="ij")
    corners = frame.physical(np.stack([ex.reshape(-1), ey.reshape(-1)], axis=1))
    px, py = corners[:, 0].reshape(ex.shape), corners[:, 1].reshape(ex.shape)
    jacobian = abs(float(np.linalg.det(frame.matrix)))
    bx, by = np.meshgrid(box.edges(0), box.edges(1), indexing="ij")
    centre, scale = points.mean(axis=0), 4.0 * np.sqrt(np.cov(points.T).diagonal()).max()
    limits = [(centre[a] - scale, centre[a] + scale) for a in (0, 1)]
    histogram, hx, hy = np.histogram2d(
        points[:, 0], points[:, 1], bins=80, range=limits, density=True
    )
    panels = [
        (f"fixed box {args.cells}^2 (W2/spread {w_fixed:.3f})", bx, by, snap_b.density),
        (
            f"co-moving frame {args.cells}^2 (W2/spread {w_frame:.3f})",
            px,
            py,
            snap_f.density / jacobian,
        ),
        (f"{args.tokens} tokens", *np.meshgrid(hx, hy, indexing="ij"), histogram),
    ]
    top = max(float(p[3].max()) for p in panels)
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.4), sharex=True, sharey=True)
    for ax, (title, x, y, values) in zip(axes, panels, strict=True):
        mesh = ax.pcolormesh(x, y, values, shading="flat", cmap="magma", vmin=0, vmax=top)
        ax.set_title(title, fontsize=10)
        ax.set_xlim(*limits[0])
        ax.set_ylim(*limits[1])
        ax.set_aspect("equal")
        ax.set_xlabel("x1")
    axes[0].set_ylabel("x2")
    fig.colorbar(mesh, ax=axes, shrink=0.85, label="density")
    fig.suptitle(
        f"softmax, V = -I (collapse onto a line), two-component mixture at t = {args.t_end:g}",
        fontsize=11,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
