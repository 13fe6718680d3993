"""The co-moving frame on non-Gaussian data against the token system.

docs/theory.md, 'The co-moving affine frame'. A two-component Gaussian mixture (unequal
weights, different covariances) under clustering parameters (softmax V = -I with A + A^T of
rank one: the law collapses onto a line and its components merge). The reference is the
token system itself (tpde.validation.particles, exact i.i.d. samples of the mixture, several
seeds): W2 between a grid run and the tokens, in the units of the measure's spread (every
point whitened by the tokens' own mean and covariance, x -> S^-1/2 (x - m)), against the
tokens' own sampling noise, W2 between the token runs of two seeds. Both measures are binned
on the grid being compared (the tokens by cell, atoms at the cells' physical centres), so the
two sides see the same atoms. The fixed box with the same cells is printed beside.
"""

from __future__ import annotations

import itertools

import numpy as np
import ot
import pytest

from tpde.grid import Grid, gaussian_mixture
from tpde.schemes.frame import AffineFrame, mixture_frame
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.validation.particles import TokenSystem, simulate
from tpde.variants import ATTENTION, Head

WEIGHTS = [0.3, 0.7]
MEANS = [np.array([2.0, -1.2]), np.array([-0.8, 0.6])]
COVS = [np.array([[0.25, 0.05], [0.05, 0.15]]), np.array([[0.5, -0.15], [-0.15, 0.6]])]
#: V = -I, A + A^T = diag(2, 0) plus a skew part (tests/test_frame.py's collapse)
HEAD = Head(np.array([[1.0, 0.7], [-0.7, 0.0]]), -np.eye(2))


def mixture_tokens(n: int, seed: int) -> np.ndarray:
    """n i.i.d. samples of the mixture (n, 2)."""
    rng = np.random.default_rng(seed)
    component = rng.choice(len(WEIGHTS), size=n, p=WEIGHTS)
    out = np.empty((n, 2))
    for k, (mean, cov) in enumerate(zip(MEANS, COVS, strict=True)):
        rows = component == k
        out[rows] = rng.multivariate_normal(mean, cov, size=int(rows.sum()))
    return out


def token_runs(n: int, seeds, times, dt: float) -> list:
    """The token system from each seed: positions (len(times), n, 2)."""
    runs = []
    for seed in seeds:
        solution = simulate(
            TokenSystem("softmax", HEAD),
            mixture_tokens(n, seed),
            times[-1],
            dt,
            times=times,
            method="ssprk3",
        )
        runs.append(np.array([solution.at(t) for t in times]))
    return runs


def grid_runs(cells: int, times, radius: float = 16.0, sigmas: float = 7.0):
    """The frame run (xi box +-radius) and the fixed box (sigmas standard deviations of the
    initial law about its mean), same cells; each: (grid, result)."""
    frame, xi_means, xi_covs = mixture_frame(WEIGHTS, MEANS, COVS)
    xi = Grid([-radius] * 2, [radius] * 2, [cells, cells])
    framed = Solver(
        Problem(
            xi,
            gaussian_mixture(xi, WEIGHTS, xi_means, xi_covs),
            ATTENTION["softmax"](HEAD),
            times[-1],
            scheme=Scheme(frame="affine", frame_tolerance=1e-8),
            snapshots=list(times),
            frame=frame,
        )
    ).run()
    spread = sigmas * np.sqrt(np.diag(frame.matrix @ frame.matrix.T))
    box = Grid(frame.mean - spread, frame.mean + spread, [cells, cells])
    fixed = Solver(
        Problem(
            box,
            gaussian_mixture(box, WEIGHTS, MEANS, COVS),
            ATTENTION["softmax"](HEAD),
            times[-1],
            snapshots=list(times),
            box_action="warn",
        )
    ).run()
    return (xi, framed), (box, fixed)


def cell_positions(grid: Grid, frame: AffineFrame | None) -> np.ndarray:
    """Physical centres of the cells (cells, 2), C order."""
    centres = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    return centres if frame is None else frame.physical(centres)


def binned(tokens: np.ndarray, grid: Grid, frame: AffineFrame | None) -> np.ndarray:
    """Token mass per cell (grid.shape), the tokens mapped to the grid's coordinates; tokens
    outside the box are left out (and reported by the caller)."""
    x = tokens if frame is None else (tokens - frame.mean) @ frame.inverse.T
    index = [np.floor((x[:, a] - grid.lower[a]) / grid.spacing[a]).astype(int) for a in range(2)]
    inside = np.all([(i >= 0) & (i < n) for i, n in zip(index, grid.shape, strict=True)], axis=0)
    counts = np.zeros(grid.shape)
    np.add.at(counts, (index[0][inside], index[1][inside]), 1.0)
    return counts / tokens.shape[0]


def whitened_w2(mass_a, mass_b, positions, whiten) -> float:
    """W2 between two cell-mass vectors on the same atoms, in whitened coordinates."""
    z = whiten(positions)
    a, b = mass_a.reshape(-1), mass_b.reshape(-1)
    keep_a, keep_b = a > 1e-14, b > 1e-14
    wa, wb = a[keep_a] / a[keep_a].sum(), b[keep_b] / b[keep_b].sum()
    cost = ot.dist(z[keep_a], z[keep_b])
    return float(np.sqrt(ot.emd2(wa, wb, cost, numItermax=10_000_000)))


def whitening(tokens: np.ndarray):
    mean = tokens.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(tokens.T))
    root = (vectors / np.sqrt(values)) @ vectors.T
    return lambda x: (x - mean) @ root.T


def compare(cells: int, n: int, seeds, times, dt: float, radius: float = 16.0) -> list[tuple]:
    """Per time: t, the frame's largest W2 / spread to the seeds' tokens, the tokens' noise
    (mean W2 / spread between seeds, on the frame's cells), the fixed box's largest W2 /
    spread and its noise on its own cells, and the token mass outside the fixed box."""
    (xi, framed), (box, fixed) = grid_runs(cells, times, radius)
    runs = token_runs(n, seeds, times, dt)
    rows = []
    for i, t in enumerate(times):
        whiten = whitening(runs[0][i])
        out = [t]
        for grid, result in ((xi, framed), (box, fixed)):
            if i >= len(result.snapshots):
                out += [np.nan, np.nan]
                continue
            snap = result.snapshots[i]
            positions = cell_positions(grid, snap.frame)
            masses = [binned(run[i], grid, snap.frame) for run in runs]
            density = snap.density / snap.density.sum()
            errors = [whitened_w2(density, m, positions, whiten) for m in masses]
            noise = [
                whitened_w2(a, b, positions, whiten) for a, b in itertools.combinations(masses, 2)
            ]
            out += [max(errors), float(np.mean(noise))]
        out.append(max(1.0 - binned(run[i], box, None).sum() for run in runs))
        rows.append(tuple(out))
    print(
        f"\nmixture, softmax V = -I (collapse onto a line), {cells}^2, {n} tokens x "
        f"{len(seeds)} seeds: W2 / spread (whitened)\n"
        f"frame: {framed.status} at t = {framed.status_time:.4g}; fixed box: {fixed.status} "
        f"at t = {fixed.status_time:.4g}; "
        + "; ".join(e.message for e in fixed.events if e.kind == "box_limited")
    )
    header = ["t", "frame W2", "noise", "fixed W2", "noise", "out of box"]
    print(" ".join(f"{h:>11}" for h in header))
    for row in rows:
        print(" ".join(f"{v:11.4g}" for v in row))
    assert framed.status == "completed", framed.status_message
    return rows


def test_frame_follows_a_clustering_mixture_within_token_noise():
    """Default tier (seconds): 48^2, 2000 tokens x 3 seeds to t = 0.5."""
    rows = compare(48, 2000, [0, 1, 2], [0.0, 0.25, 0.5], 0.1)
    assert all(row[1] <= row[2] for row in rows)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="measured: frame W2 / spread 0.172, 0.191, 0.204 vs noise 0.157, 0.155, 0.152 at "
    "t = 1, 2, 4 (fixed box 0.186, 0.314, 0.441): 48^2 on +-16 (h = 0.67 of the spread) does "
    "not resolve the narrow component; a finer frame grid is untried",
)
def test_frame_follows_a_clustering_mixture_to_t_4():
    """48^2, 10^4 tokens x 3 seeds to t = 4: the frame stays within the tokens' noise at every
    time; the fixed box with the same cells leaves it once the law is thinner than its cells."""
    rows = compare(48, 10_000, [0, 1, 2], [0.0, 1.0, 2.0, 4.0], 0.2)
    assert all(row[1] <= row[2] for row in rows)
    assert rows[-1][3] > rows[-1][4]  # the fixed box has lost it by t = 4
