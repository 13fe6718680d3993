"""Four clusters in the co-moving frame with atoms against 10^4 tokens (examples/frame_atoms.toml).

    tpde run examples/frame_atoms.toml -o frame_atoms.nc
    python examples/frame_atoms.py frame_atoms.nc [SEEDS...]    # default seeds 1 2

The tokens: 10^4 per seed, the images under the square's 8 symmetries (signed permutations,
which commute with both heads) of 1250 i.i.d. uniform draws on the triangle 0 <= y <= x <= 1,
so each seed is a uniform sample of [-1, 1]^2 with the square's symmetry, moved by RK4 with
dt = 0.1 (the velocity of the 1250 representatives only: validation.particles.SymmetricTokens);
each seed is kept in ``frame_atoms_tokens_<seed>.npy`` beside the run file.

The table, per snapshot: the atoms, the law's sd (tokens), the widest corner cluster's sd and
its width times the largest tilt ``max |A1 x|`` over the tokens (the Gaussian closure's
condition, docs/theory.md, 'Atoms in the co-moving frame'), the W2 of cells plus atoms to each
seed over the law's sd, and the tokens' sampling noise: the W2 between the two seeds over the
sd. Both measures have the square's symmetry (the run's to round-off, printed), so their W2 is
that of the measures folded onto the triangle (``fold``: exact for symmetric measures, and a
plan of the folded ones unfolds to one of the same cost); the cells enter as 8 x 8 points each
(validation.metrics.cell_points), each atom as 8 x 8 points of its Gaussian
(:func:`gaussian_points`: at the centres alone an atom adds ``sqrt(tr S)``, 0.05 of the sd at
``t = 4``, to the W2).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

from tpde.grid import Grid
from tpde.io import read
from tpde.validation.metrics import cell_points, wasserstein_points
from tpde.validation.particles import (
    SymmetricTokens,
    TokenSystem,
    simulate,
    square_group,
    symmetric_tokens,
)
from tpde.variants import Head

HEADS = [Head(3.0 * np.eye(2), np.eye(2)), Head(0.1 * np.eye(2), -10.0 * np.eye(2))]
TOKENS = 10_000
DT = 0.1
#: each cell as SUB x SUB points in the W2 (the cells' quantisation: |h| / (SUB sqrt 12))
SUB = 8
#: each atom as Q x Q points in the W2 (:func:`gaussian_points`; 0: one point at its centre)
Q = 8


def tokens(seed: int, times, n: int = TOKENS, dt: float = DT) -> np.ndarray:
    """The symmetric tokens of one seed at ``times`` (the first 0): (len(times), n, 2)."""
    group = square_group(2)
    reps = np.sort(np.random.default_rng(seed).uniform(0.0, 1.0, (n // 8, 2)), axis=1)[:, ::-1]
    system = SymmetricTokens(TokenSystem("multihead", HEADS), group)
    solution = simulate(system, symmetric_tokens(reps, group), times[-1], dt, times=times[1:])
    return solution.tokens


def fold(x: np.ndarray) -> np.ndarray:
    """The square's symmetries folded out: ``(|x|, |y|)`` sorted descending (the triangle)."""
    return np.sort(np.abs(x), axis=1)[:, ::-1]


def merged_fold(points: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fold` of weighted points, the points that fold onto the same place (to 1e-9:
    a symmetric grid's 8 images of a point) merged into one with their summed weight."""
    folded = fold(points)
    unique, inverse = np.unique(np.round(folded, 9), axis=0, return_inverse=True)
    return unique, np.bincount(inverse.reshape(-1), weights=weights, minlength=len(unique))


def gaussian_points(
    mass: float, centre: np.ndarray, cov: np.ndarray, q: int = Q
) -> tuple[np.ndarray, np.ndarray]:
    """The Gaussian ``mass N(centre, cov)`` as ``q^d`` equal weights: along each principal
    axis the standard normal's ``q`` mid-quantiles ``Phi^-1((i + 1/2) / q)``, rescaled to
    unit variance, so the points keep the mass, mean and covariance exactly; their W2 to
    the Gaussian is a few per cent of its widest sd for q = 8 (q = 0: one point at the
    centre, W2 ``sqrt(tr cov)``)."""
    from scipy.stats import norm

    centre = np.asarray(centre, float)
    if q == 0:
        return centre[None, :], np.array([float(mass)])
    z = norm.ppf((np.arange(q) + 0.5) / q)
    z /= np.sqrt(np.mean(z * z))
    d = centre.size
    unit = np.stack(np.meshgrid(*([z] * d), indexing="ij"), -1).reshape(-1, d)
    values, vectors = np.linalg.eigh(np.asarray(cov, float))
    root = vectors * np.sqrt(np.maximum(values, 0.0))
    return centre + unit @ root.T, np.full(unit.shape[0], float(mass) / unit.shape[0])


def run_points(
    density, grid: Grid, mean, matrix, atoms, sub: int = SUB, q: int = Q
) -> tuple[np.ndarray, np.ndarray]:
    """Cells (``sub^2`` points each) plus atoms (mass, frame centre, frame covariance; each
    :func:`gaussian_points`) as physical weighted points (the frame ``mean + matrix xi``)."""
    points, weights = cell_points(density, grid, sub)
    if atoms is not None and len(atoms[0]):
        parts = [gaussian_points(m, a, S, q) for m, a, S in zip(*atoms, strict=True)]
        points = np.vstack([points, *[x for x, _ in parts]])
        weights = np.concatenate([weights, *[w for _, w in parts]])
    return mean + points @ matrix.T, weights


def corner_width(x: np.ndarray) -> float:
    """The widest standard deviation of the four corner clusters (the quadrants)."""
    signs = np.sign(x)
    return max(
        float(np.sqrt(np.linalg.eigvalsh(np.cov(x[np.all(signs == s, axis=1)].T))[-1]))
        for s in itertools.product((-1, 1), repeat=2)
    )


def table(snapshots, token_runs) -> list[tuple]:
    """Rows (t, atoms, law sd, corner sd, width x tilt, asymmetry, W2/sd per seed...,
    noise/sd) for ``snapshots`` [(t, index, (points, weights), atoms count, asymmetry)]."""
    rows = []
    for t, i, (points, weights), count, asymmetry in snapshots:
        x = token_runs[0][i]
        sd = float(np.sqrt(np.trace(np.cov(x.T)) / 2.0))  # (the tokens' covariance is sd^2 I)
        width = corner_width(x)
        tilt = float(np.linalg.norm(x @ HEADS[0].A.T, axis=1).max())
        even = np.full(x.shape[0], 1.0 / x.shape[0])
        folded, merged = merged_fold(points, weights)
        seeds = [merged_fold(run[i], even) for run in token_runs]  # (1250 places a seed)
        errors = [wasserstein_points(folded, merged, *seed) / sd for seed in seeds]
        noise = wasserstein_points(*seeds[0], *seeds[1]) / sd if len(seeds) > 1 else np.nan
        rows.append((t, count, sd, width, width * tilt, asymmetry, *errors, noise))
    return rows


def from_file(path: str | Path, times, sub: int = SUB, q: int = Q) -> list[tuple]:
    """The snapshots of a run file as :func:`table` takes them (``sub``, ``q``:
    :func:`run_points`)."""
    ds = read(path)
    x, y = ds["x"].values, ds["y"].values
    h = x[1] - x[0]
    grid = Grid([x[0] - h / 2, y[0] - h / 2], [x[-1] + h / 2, y[-1] + h / 2], [x.size, y.size])
    out = []
    for j, t in enumerate(ds["time"].values):
        if t == 0.0:  # (the start: the cells' uniform averages; the network simplex's
            continue  # ties make its exact W2 slow, and nothing has moved yet)
        i = int(np.argmin(np.abs(np.asarray(times) - t)))
        density = np.asarray(ds["density"].transpose("time", "x", "y").values[j])
        atoms = None
        if "atom_mass" in ds.variables:
            used = np.isfinite(ds["atom_mass"].values[j])
            atoms = (
                ds["atom_mass"].values[j, used],
                ds["atom_frame_centre"].values[j, used],
                ds["atom_frame_covariance"].values[j, used],
            )
        mean, matrix = ds["frame_mean"].values[j], ds["frame_matrix"].values[j]
        asymmetry = float(
            np.abs(density - density[::-1, :]).max() + np.abs(density - density.T).max()
        )
        count = 0 if atoms is None else len(atoms[0])
        points = run_points(density, grid, mean, matrix, atoms, sub, q)
        out.append((float(t), i, points, count, asymmetry))
    return out


def main(argv: list[str]) -> None:
    path = Path(argv[0])
    seeds = [int(s) for s in argv[1:]] or [1, 2]
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    runs = []
    for seed in seeds:
        cache = path.with_name(f"frame_atoms_tokens_{seed}.npy")
        if not cache.exists():
            np.save(cache, tokens(seed, times))
        runs.append(np.load(cache))
    header = ["t", "atoms", "law sd", "corner sd", "width*tilt", "asymmetry"]
    header += [f"W2/sd seed {s}" for s in seeds] + ["noise/sd"]
    print(" ".join(f"{h:>12}" for h in header))
    for row in table(from_file(path, times), runs):
        print(" ".join(f"{v:12.4g}" for v in row))


if __name__ == "__main__":
    main(sys.argv[1:])
