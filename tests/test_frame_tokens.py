"""The co-moving frame on non-Gaussian data against the token system.

docs/theory.md, 'The co-moving affine frame'. A two-component Gaussian mixture (unequal
weights, different covariances) under clustering parameters: softmax with V = -I and A + A^T of
rank one (the law collapses onto a line and its components merge), and l2 with Q = K and
V = -I (it contracts to a point). The reference is the token system itself
(tpde.validation.particles, exact i.i.d. samples of the mixture, SSP-RK3 at dt 0.2: within
8e-4 (whitened RMS displacement) of dt 0.05 up to t = 4 on one seed): W2 between a grid run and
the tokens, in the units of the measure's spread (every point whitened by the tokens' own mean
and covariance, x -> S^-1/2 (x - m)). Both measures are binned on the grid being compared (the
tokens by cell, atoms at the cells' physical centres), so the two sides see the same atoms.

**Within the tokens' noise**, decided from t = 0, where the grid holds the exact cell
averages: the largest, over seeds, W2(grid, tokens of that seed) is at most the mean, over
pairs of seeds, W2(tokens of one seed, tokens of another). Two empirical measures are about
sqrt(2) times as far apart as either is from the law, so this admits a grid whose own error is
up to one token run's sampling error. At t = 0 the exact grid sits at 0.87..0.90 of that noise
with 10^4 tokens (every grid measured; 0.95 on 32^2 with 2000); a grid run is within the
noise while the ratio stays at most 1.
"""

from __future__ import annotations

import itertools

import numpy as np
import ot
import pytest

from tpde.grid import Grid, gaussian_mixture, profile, uniform_ball
from tpde.schemes.frame import AffineFrame, face_density, mixture_frame
from tpde.schemes.monitor import edge_mass
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.validation.particles import TokenSystem, simulate
from tpde.variants import ATTENTION, Head, L2Head
from tpde.variants.truncation import gaussian_like, measured_cut

WEIGHTS = [0.3, 0.7]
MEANS = [np.array([2.0, -1.2]), np.array([-0.8, 0.6])]
COVS = [np.array([[0.25, 0.05], [0.05, 0.15]]), np.array([[0.5, -0.15], [-0.15, 0.6]])]
#: V = -I, A + A^T = diag(2, 0) plus a skew part (tests/test_frame.py's collapse)
HEAD = Head(np.array([[1.0, 0.7], [-0.7, 0.0]]), -np.eye(2))
#: the clustering parameters of each variant (l2: tests/test_frame.py's, Q = K, V = -I)
PARAMS = {
    "softmax": HEAD,
    "l2": L2Head([[0.8, -0.3], [0.5, 0.6]], [[0.8, -0.3], [0.5, 0.6]], -np.eye(2)),
}


def mixture_tokens(n: int, seed: int) -> np.ndarray:
    """n i.i.d. samples of the mixture (n, 2)."""
    rng = np.random.default_rng(seed)
    component = rng.choice(len(WEIGHTS), size=n, p=WEIGHTS)
    out = np.empty((n, 2))
    for k, (mean, cov) in enumerate(zip(MEANS, COVS, strict=True)):
        rows = component == k
        out[rows] = rng.multivariate_normal(mean, cov, size=int(rows.sum()))
    return out


def token_runs(variant: str, n: int, seeds, times, dt: float) -> list:
    """The token system from each seed: positions (len(times), n, 2)."""
    runs = []
    for seed in seeds:
        solution = simulate(
            TokenSystem(variant, PARAMS[variant]),
            mixture_tokens(n, seed),
            times[-1],
            dt,
            times=times,
            method="ssprk3",
        )
        runs.append(np.array([solution.at(t) for t in times]))
    return runs


def frame_run(variant: str, cells: int, times, radius: float):
    """The frame run on the xi box +-radius: (grid, result)."""
    frame, xi_means, xi_covs = mixture_frame(WEIGHTS, MEANS, COVS)
    xi = Grid([-radius] * 2, [radius] * 2, [cells, cells])
    return xi, Solver(
        Problem(
            xi,
            gaussian_mixture(xi, WEIGHTS, xi_means, xi_covs),
            ATTENTION[variant](PARAMS[variant]),
            times[-1],
            scheme=Scheme(frame="affine", frame_tolerance=1e-8),
            snapshots=list(times),
            frame=frame,
        )
    ).run()


def fixed_run(variant: str, cells: int, times, sigmas: float = 7.0):
    """The fixed box of sigmas standard deviations of the initial law about its mean, the
    same cells, told to go on past a box_limited event: (grid, result)."""
    frame, _, _ = mixture_frame(WEIGHTS, MEANS, COVS)
    spread = sigmas * np.sqrt(np.diag(frame.matrix @ frame.matrix.T))
    box = Grid(frame.mean - spread, frame.mean + spread, [cells, cells])
    return box, Solver(
        Problem(
            box,
            gaussian_mixture(box, WEIGHTS, MEANS, COVS),
            ATTENTION[variant](PARAMS[variant]),
            times[-1],
            snapshots=list(times),
            box_action="warn",
        )
    ).run()


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


def distances(grid, result, runs, i: int, framed: bool) -> tuple[float, float]:
    """At snapshot i: the largest W2 / spread from the grid run to a seed's tokens, and the
    tokens' noise (mean W2 / spread over pairs of seeds), both on the grid's cells."""
    whiten = whitening(runs[0][i])
    snap = result.snapshots[i]
    frame = snap.frame if framed else None
    positions = cell_positions(grid, frame)
    masses = [binned(run[i], grid, frame) for run in runs]
    density = snap.density / snap.density.sum()
    errors = [whitened_w2(density, m, positions, whiten) for m in masses]
    noise = [whitened_w2(a, b, positions, whiten) for a, b in itertools.combinations(masses, 2)]
    return max(errors), float(np.mean(noise))


def compare(
    variant: str, cells: int, radius: float, n: int, seeds, times, dt: float, fixed: bool
) -> tuple[list[tuple], object, object]:
    """Per time: t, the frame's W2 / spread and the tokens' noise on its cells, and (with
    ``fixed``) the fixed box's on its own cells; then the frame's and the fixed box's
    results (None without ``fixed``)."""
    xi, framed = frame_run(variant, cells, times, radius)
    box, boxed = fixed_run(variant, cells, times) if fixed else (None, None)
    runs = token_runs(variant, n, seeds, times, dt)
    rows = []
    for i, t in enumerate(times):
        row = [t, *distances(xi, framed, runs, i, True)] if i < len(framed.snapshots) else [t]
        if boxed is not None:
            row += distances(box, boxed, runs, i, False)
        rows.append(tuple(row))
    print(
        f"\nmixture, {variant} clustering, frame {cells}^2 on +-{radius}, {n} tokens x "
        f"{len(seeds)} seeds: W2 / spread (whitened)\nframe: {framed.status} at t = "
        f"{framed.status_time:.4g}"
        + "".join(f"; {e.kind} at t = {e.time:.4g}" for e in framed.events)
        + (
            f"\nfixed box: {boxed.status} at t = {boxed.status_time:.4g}"
            + "".join(f"; {e.kind} at t = {e.time:.4g}" for e in boxed.events)
            if boxed is not None
            else ""
        )
    )
    header = ["t", "frame W2", "noise"] + (["fixed W2", "noise"] if boxed is not None else [])
    print(" ".join(f"{h:>11}" for h in header))
    for row in rows:
        print(" ".join(f"{v:11.4g}" for v in row))
    return rows, framed, boxed


#: a mixture that the Gaussian surrogate turns away (tpde.variants.truncation.gaussian_like)
#: and a tilt large enough that a tight box cuts its tilted laws while holding its mass
CUT_WEIGHTS = [0.3, 0.7]
CUT_MEANS = [[1.0, -0.6], [-0.4, 0.3]]
CUT_COVS = [[[0.12, 0.02], [0.02, 0.08]], [[0.25, -0.07], [-0.07, 0.3]]]
CUT_A = np.array([[1.5, 0.4], [-0.3, 1.2]])


def reference_share(weights: np.ndarray, grid: Grid, points: np.ndarray, matrix) -> np.ndarray:
    """Independent reference of the measured cut: by plain sums over every cell, the share of
    the tilted law e^{c.y} w(y), c = matrix x, on the cells the box does not hold (below 1e-40
    of the largest weight, or in the grid's outermost cells)."""
    w = np.maximum(weights, 0.0)
    out = w < 1e-40 * w.max()
    out[0, :] = out[-1, :] = out[:, 0] = out[:, -1] = True
    y = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    logits = points @ np.asarray(matrix).T @ y.T
    tilted = np.exp(logits - logits.max(axis=1, keepdims=True)) * w.reshape(-1)
    return tilted[:, out.reshape(-1)].sum(axis=1) / tilted.sum(axis=1)


def face_points(grid: Grid, axis: int) -> tuple[list[np.ndarray], np.ndarray]:
    lattice = grid.lattice(np.where(np.arange(2) == axis, 0.5, 0.0))
    mesh = np.meshgrid(*lattice, indexing="ij")
    return lattice, np.stack([m.reshape(-1) for m in mesh], axis=1)


@pytest.mark.parametrize("radius", [3.0, 5.0])
def test_measured_cut_is_the_share_the_box_does_not_hold(radius):
    """The measured cut is the true share of each tilted law outside what the box holds (no
    rescaling: the truncation indicator compares it with run.box_tolerance as it is), against
    plain sums over every cell: dense sums to round-off, the separable log tables within 1e-2
    (their log accuracy, 7e-4, is what a cut needs)."""
    grid = Grid([-radius] * 2, [radius] * 2, [32, 32])
    weights = gaussian_mixture(grid, CUT_WEIGHTS, CUT_MEANS, CUT_COVS)
    assert not gaussian_like(weights, grid)
    rows = []
    for axis in range(2):
        lattice, points = face_points(grid, axis)
        exact = reference_share(weights, grid, points, CUT_A)
        for direct in (True, False):
            cut = measured_cut(weights, grid, [lattice], CUT_A, direct=direct)[0].reshape(-1)
            error = float(np.max(np.abs(cut / exact - 1.0)))
            rows.append((axis, direct, float(exact.max()), float(np.median(exact)), error))
            assert error <= (1e-12 if direct else 1e-2)
    print(f"\nmeasured cut, mixture on +-{radius}, 32^2: axis, dense, max, median, rel. error")
    for row in rows:
        print(f"{row[0]:5d} {row[1]!s:>6} {row[2]:11.3e} {row[3]:11.3e} {row[4]:11.2e}")


def test_measured_cut_by_sheared_passes_on_masked_shifted_lattices():
    """The separable cut reaches the lattices by the sheared passes (no pointwise stencil),
    on what the co-moving frame asks: a shift, a mask whose window is a corner of each
    lattice, two face lattices of different shapes on a grid of unequal axes, and a matrix
    whose passes shear. Every measured point agrees with plain sums over every cell within
    1e-2 (a swapped axis, a wrong shift or a wrong table origin in the passes is off by
    orders of magnitude: the share spans many decades here); the other points report 1."""
    grid = Grid([-3.0, -3.5], [3.5, 3.0], [36, 44])
    weights = gaussian_mixture(grid, CUT_WEIGHTS, CUT_MEANS, CUT_COVS)
    matrix = np.array([[1.5, 0.9], [-0.6, 1.2]])
    shift = np.array([0.3, -0.2])
    lattices, masks, exact = [], [], []
    for axis in range(2):
        lattice, points = face_points(grid, axis)
        shape = tuple(len(x) for x in lattice)
        mask = np.zeros(shape, bool)
        mask[2 : shape[0] * 2 // 3, shape[1] // 4 :] = True
        mask[5, 3] = False
        lattices.append(lattice)
        masks.append(mask)
        exact.append(reference_share(weights, grid, points[mask.reshape(-1)] + shift, matrix))
    with profile.profiling() as phases:
        cuts = measured_cut(weights, grid, lattices, matrix, shift, masks)
    assert phases["velocity.interpolation.passes"]["calls"] == 2
    assert "velocity.interpolation.pointwise" not in phases
    for cut, mask, share in zip(cuts, masks, exact, strict=True):
        assert np.all(cut[~mask] == 1.0)
        assert share.max() / share.min() > 1e6
        error = float(np.max(np.abs(cut[mask] / share - 1.0)))
        print(f"shares {share.min():.2e} .. {share.max():.2e}: largest rel. error {error:.2e}")
        assert error <= 1e-2


def test_a_compactly_supported_law_reports_no_cut():
    """A uniform disc well inside its box (the data of tpde validate's 2-D grid-vs-tokens
    case, under this file's clustering head): its
    tilted laws stay in the disc. After two steps the scheme has smeared the edge into values
    hundreds of decades below the trusted floor, and the cut is 0 to within 1e-30 (the share of
    the outermost trusted cells, the disc's own edge, was 0.6 and stopped that case)."""
    # a step of the scheme smears the disc's edge into values far below the trusted floor
    disc = Grid([-5.0] * 2, [5.0] * 2, [40, 40])
    run = Solver(
        Problem(disc, uniform_ball(disc, [0.3, -0.2], 2.0), ATTENTION["softmax"](HEAD), 0.05)
    ).run()
    lattice, _ = face_points(disc, 0)
    cut = measured_cut(run.final, disc, [lattice], CUT_A, direct=True)[0]
    print(f"uniform disc after {run.steps} steps: largest cut {cut.max():.2e}")
    assert cut.max() <= 1e-30


def test_a_box_that_cuts_the_tilted_laws_stops_the_run():
    """A fixed box (+-2.5, 32^2) that holds the mixture's mass (edge mass below
    run.box_tolerance) but cuts its tilted laws stops box_limited on the cut; the indicator it
    reports is at least the face-mass-weighted true share at t = 0 (the first stage's
    evaluation), from plain sums. The same data on +-5 stay quiet."""
    rows = []
    for radius in (2.5, 5.0):
        grid = Grid([-radius] * 2, [radius] * 2, [32, 32])
        density = gaussian_mixture(grid, CUT_WEIGHTS, CUT_MEANS, CUT_COVS)
        head = Head(CUT_A, -np.eye(2))
        result = Solver(Problem(grid, density, ATTENTION["softmax"](head), 0.2)).run()
        start = 0.0
        for axis in range(2):
            _, points = face_points(grid, axis)
            faces = face_density(density, axis).reshape(-1)
            share = reference_share(density, grid, points, CUT_A)
            start = max(start, float(faces @ share / faces.sum()))
        rows.append((radius, edge_mass(density), start, result.truncation, result.status))
        print(f"\n+-{radius}: {result.status} at t = {result.status_time:.4g}")
    print("  box   edge mass   share t=0   indicator   status")
    for row in rows:
        print(f"{row[0]:5.1f} {row[1]:11.2e} {row[2]:11.2e} {row[3]:11.2e}   {row[4]}")
    tight, wide = rows
    assert tight[1] < 1e-4 < tight[2]
    assert tight[4] == "box_limited" and tight[3] >= 0.99 * tight[2]
    assert wide[4] == "completed" and wide[3] < 1e-4


@pytest.mark.parametrize("variant", ["softmax", "l2"])
def test_frame_follows_a_clustering_mixture_within_token_noise(variant):
    """Default tier (seconds): the frame on 32^2 (+-12), 2000 tokens x 3 seeds, to t = 0.125:
    completed, and within the tokens' noise (module docstring) at every snapshot. (Later the
    32^2 run leaves the noise, 1.07..1.10 of it to t = 4, with an under_resolved event at
    t = 0; docs/theory.md, 'The co-moving affine frame'.)"""
    rows, framed, _ = compare(
        variant, 32, 12.0, 2000, [0, 1, 2], [0.0, 0.0625, 0.125], 0.0625, False
    )
    assert framed.status == "completed", framed.status_message
    assert all(row[1] <= row[2] for row in rows)


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, cells, radius, fixed_loses",
    [("softmax", 96, 12.0, (2.0, 4.0)), ("l2", 64, 8.0, (1.0, 2.0, 4.0))],
)
def test_frame_follows_a_clustering_mixture_to_t_4(variant, cells, radius, fixed_loses):
    """10^4 tokens x 3 seeds to t = 4: the frame run completes (no box_limited stop) and stays
    within the tokens' noise at every snapshot, at its t = 0 level (measured, softmax: 48^2 on
    +-16, cells of 0.67 frame units against the narrow component's 0.23, sat at 1.10..1.33 of
    the noise; 64^2 on +-10 at 0.87..0.90; 96^2 on +-12 at 0.84..0.90). The fixed box with the
    same cells (7 standard deviations of the initial law) is printed beside; where it was
    measured to lose the law (W2 above the noise: softmax at t = 2 and 4, l2 at 1, 2 and 4)
    that is asserted."""
    times = [0.0, 1.0, 2.0, 4.0]
    rows, framed, boxed = compare(variant, cells, radius, 10_000, [0, 1, 2], times, 0.2, True)
    assert framed.status == "completed", framed.status_message
    assert not any(e.kind == "box_limited" for e in framed.events)
    assert all(row[1] <= row[2] for row in rows)
    for row in rows:
        if row[0] in fixed_loses:
            assert row[3] > row[4]
