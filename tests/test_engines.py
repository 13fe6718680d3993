"""Fast (separable) kernel-sum engines against the dense reference, every exponential variant.

Seeded random non-symmetric matrices, Gaussian and two-bump mixture densities, 1-D, 2-D and
3-D; errors are max |fast - direct| / max |direct| over the cells where the density exceeds
1e-8 of its maximum (the issue's acceptance metric). The 2-D softmax table shows the
convergence in the number of table nodes.
"""

from __future__ import annotations

import numpy as np
import pytest
from exact import print_table
from test_variants import A1, COV1, MEAN1, V1

from tpde.grid import Grid, gaussian, gaussian_mixture
from tpde.variants import ATTENTION, Head, L2Head, SinkhornHead
from tpde.variants.engines.separable import _shifted_table, mgf_table

CELLS = {1: 240, 2: 48, 3: 16}


def densities(grid: Grid) -> dict[str, np.ndarray]:
    d = grid.ndim
    means = [[-1.5] + [0.0] * (d - 1), [1.5] + [0.5] * (d - 1)]
    cov_b = 0.3 * np.eye(d) + 0.1 * np.ones((d, d))
    return {
        "gaussian": gaussian(
            grid, MEAN1[:d] if d <= 2 else [0.5, -0.3, 0.2], COV1 if d == 2 else 0.7 * np.eye(d)
        ),
        "two bumps": gaussian_mixture(grid, [0.5, 0.5], means, [0.4 * np.eye(d), cov_b]),
    }


def random_params(variant: str, d: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    A, V = rng.normal(0, 0.5, (d, d)), rng.normal(0, 0.7, (d, d))
    if variant == "l2":
        return L2Head(rng.normal(0, 0.4, (d, d)), rng.normal(0, 0.4, (d, d)), V)
    if variant == "sinkhorn":
        return SinkhornHead(A, V, eps=0.8)
    return Head(A, V)


def engine_error(
    variant: str, params, grid: Grid, rho: np.ndarray, nodes: int | None = None
) -> float:
    field = ATTENTION[variant]
    direct = field(params, engine="direct")(rho, grid, 0.0)
    fast = field(params, engine="separable", nodes=nodes)(rho, grid, 0.0)
    mask = rho > 1e-8 * rho.max()
    return float(np.abs(fast - direct)[:, mask].max() / np.abs(direct[:, mask]).max())


@pytest.mark.parametrize("variant", ["softmax", "l2", "sinkhorn"])
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_fast_engine_matches_the_dense_reference(variant, ndim):
    """Automatic table size (table_nodes): <= 1e-10 everywhere except where the 3-D cap of
    160 nodes per axis binds (l2, two narrow bumps at h = 0.75: 2 cells per bump width)."""
    cells = CELLS[ndim]
    grid = Grid([-6.0] * ndim, [6.0] * ndim, [cells] * ndim)
    params = random_params(variant, ndim)
    for kind, rho in densities(grid).items():
        error = engine_error(variant, params, grid, rho)
        print(f"\n{variant} {ndim}-D {cells}^{ndim} {kind}: separable vs direct {error:.2e}")
        assert error <= (1e-8 if (variant, ndim, kind) == ("l2", 3, "two bumps") else 1e-10)


@pytest.mark.parametrize("kind", ["gaussian", "two bumps"])
def test_separable_engine_converges_in_the_table_nodes_2d(kind):
    grid = Grid([-8, -8], [8, 8], [64, 64])
    rho = densities(grid)[kind]
    nodes = [64, 128, 256, 512]
    errors = [engine_error("softmax", Head(A1, V1), grid, rho, m) for m in nodes]
    print_table(
        f"separable vs direct softmax velocity, 2-D 64^2, {kind}, interpolation order 12"
        " (N = table nodes per axis)",
        nodes,
        errors,
    )
    assert errors[-1] <= 1e-10
    assert errors[-1] < errors[0]


def test_separable_multihead_with_rank_one_heads():
    heads = [
        Head(0.5 * np.outer([0.8, 0.5], [0.4, 0.7]), V1[:1], np.eye(2)[:, :1]),
        Head(0.5 * np.outer([-0.3, 0.6], [-0.6, 0.2]), V1[1:], np.eye(2)[:, 1:]),
    ]
    grid = Grid([-8, -8], [8, 8], [48, 48])
    error = engine_error("multihead", heads, grid, densities(grid)["two bumps"])
    print(f"\nmulti-head rank-1 heads, separable vs direct: {error:.2e}")
    assert error <= 1e-10


def test_fft_engine_keeps_only_absolute_accuracy():
    """Symmetric A: the FFT convolution engine forms the same sums; its error grows with the dynamic
    range of the kernel (docs/theory.md, 'Other engines'), which is why "auto" never picks it."""
    grid = Grid([-8, -8], [8, 8], [48, 48])
    rho = densities(grid)["two bumps"]
    mask = rho > 1e-8 * rho.max()
    errors = {}
    for scale in (0.1, 0.5, 2.0, -0.5):
        head = Head(scale * np.array([[1.0, 0.3], [0.3, 0.8]]), V1)
        direct = ATTENTION["softmax"](head, engine="direct")(rho, grid, 0.0)
        try:
            fft = ATTENTION["softmax"](head, engine="fft")(rho, grid, 0.0)
        except ValueError as error:  # a kernel sum came out <= 0: reported, not NaN
            assert "use engine='separable'" in str(error)
            errors[scale] = np.inf
            continue
        assert np.all(np.isfinite(fft))
        errors[scale] = float(np.abs(fft - direct)[:, mask].max() / np.abs(direct[:, mask]).max())
    print(f"\nFFT engine vs direct, two bumps 48^2, A = s [[1, .3], [.3, .8]]: {errors}")
    assert errors[0.1] <= 1e-12 and errors[0.5] <= 1e-12
    assert errors[2.0] > 1e-3 and errors[-0.5] > 1e-3  # large range: the small sums are lost
    with pytest.raises(ValueError, match="symmetric A"):
        ATTENTION["softmax"](Head(A1, V1), engine="fft")(rho, grid, 0.0)


@pytest.mark.parametrize("variant", ["softmax", "l2", "sinkhorn"])
@pytest.mark.parametrize("engine", ["direct", "separable"])
def test_normalised_fields_ignore_the_density_scale_and_stay_in_the_support_box(variant, engine):
    """No overflow, underflow or NaN: a density scaled by 1e-250 (tails underflowing to 0)
    gives the same field; every tilted mean lies in the support box (docs/theory.md, 'Clip of
    tilted means')."""
    grid = Grid([-6, -6], [6, 6], [40, 40])
    rho = densities(grid)["two bumps"]
    rho[rho < 1e-30] = 0.0  # compact support: a hard edge to respect
    params = random_params(variant, 2)
    field = ATTENTION[variant](params, engine=engine)
    u = field(rho, grid, 0.0)
    tiny = field(1e-250 * rho, grid, 0.0)
    assert np.all(np.isfinite(tiny))
    assert np.allclose(tiny, u, rtol=1e-9, atol=1e-12 * np.abs(u).max())
    support = np.flatnonzero(rho.sum(axis=1) > 0), np.flatnonzero(rho.sum(axis=0) > 0)
    bound = np.linalg.norm(params.C, 2) * np.hypot(
        max(abs(grid.edges(0)[support[0][0]]), abs(grid.edges(0)[support[0][-1] + 1])),
        max(abs(grid.edges(1)[support[1][0]]), abs(grid.edges(1)[support[1][-1] + 1])),
    )
    speed = np.sqrt((u**2).sum(axis=0)).max()
    print(f"\n{variant} {engine}: max |Gamma| {speed:.3f} <= bound {bound:.3f}")
    assert speed <= bound * (1 + 1e-12)


def log_domain_sums(weights: np.ndarray, grid: Grid, tilts: np.ndarray):
    """log M(c) and m(c) by dense sums shifted per tilt by max_s (c.y_s + log w_s), the
    largest term itself: every sum holds a term equal to 1 (the reference for weights whose
    largest term no per-axis shift can follow)."""
    centres = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    flat = weights.reshape(-1)
    keep = flat > 0
    y, log_w = centres[keep], np.log(flat[keep])
    logs, means = np.empty(len(tilts)), np.empty((len(tilts), grid.ndim))
    for start in range(0, len(tilts), 512):
        exponent = tilts[start : start + 512] @ y.T + log_w
        top = exponent.max(axis=1, keepdims=True)
        e = np.exp(exponent - top)
        total = e.sum(axis=1)
        logs[start : start + 512] = np.log(total) + top[:, 0]
        means[start : start + 512] = (e @ y) / total[:, None]
    return logs, means


@pytest.mark.parametrize("ndim", [2, 3])
def test_tables_are_exact_where_the_per_axis_shifts_underflow(ndim):
    """Weights narrow about a diagonal line (the co-moving frame's l2 key weight) and large tilts:
    the tilted law sits far from the cells where each axis takes its largest c_a y_a, so the
    per-axis shifts leave the sums hundreds of e-folds below 1 (subnormal or 0: 0 / 0 in the
    means, the E5 l2 frame run's NaN velocity at t = 0.87). Those nodes are formed again on
    recentred tiles: log M and m at every node against dense sums shifted per tilt by their
    largest term."""
    cells, radius, reach = {2: (48, 12.0, (50.0, 50.0)), 3: (16, 8.0, (40.0, 40.0, 40.0))}[ndim]
    grid = Grid([-radius] * ndim, [radius] * ndim, [cells] * ndim)
    direction = np.array([0.37, 0.93, 0.5][:ndim])
    direction /= np.linalg.norm(direction)
    y = grid.mesh()
    along = sum(u * x for u, x in zip(direction, y, strict=True))
    across = sum((x - u * along) ** 2 for u, x in zip(direction, y, strict=True))
    weights = gaussian(grid, np.zeros(ndim), np.eye(ndim)) * np.exp(-8.0 * across)
    nodes = [np.linspace(-r, r, 41 if ndim == 2 else 17) for r in reach]
    with np.errstate(divide="ignore", invalid="ignore"):
        _, out_of_range = _shifted_table(weights, grid, nodes, "both")
    table = mgf_table(weights, grid, nodes, "both")
    tilts = np.stack([m.reshape(-1) for m in np.meshgrid(*nodes, indexing="ij")], axis=1)
    logs, means = log_domain_sums(weights, grid, tilts)
    log_error = float(np.abs(table[0].reshape(-1) - logs).max() / np.abs(logs).max())
    mean_error = float(np.abs(table[1:].reshape(ndim, -1).T - means).max() / radius)
    count = 0 if out_of_range is None else int(out_of_range.sum())
    print(
        f"\n{ndim}-D {cells}^{ndim}, tilts up to {reach}: {count} of {tilts.shape[0]} nodes out "
        f"of range of the per-axis shifts; log M error {log_error:.2e} (of max |log M| "
        f"{np.abs(logs).max():.0f}), means error {mean_error:.2e} (of the radius)"
    )
    assert count > 0  # the case is the one the per-axis shifts cannot hold
    assert np.all(np.isfinite(table))
    assert log_error <= 1e-14 and mean_error <= 1e-13


def test_the_dense_sums_keep_relative_accuracy_in_subnormal_tails():
    """The direct engine shifts each row's exponents c.y + log w by their maximum: a tilt
    pointing into the tails of the weights, where they are subnormal (w = e^{-7.4 y^2} on
    [-10, 10]: down to 4e-322), keeps log M and the mean to round-off against 60-digit
    decimal sums of the same float weights. (A shift by the maximum of c.y alone left the
    terms at c = -150 subnormal: mean off by 6e-4 of the extent, 7.6e-9 at c = 130.)"""
    from decimal import Decimal, getcontext

    from tpde.variants.engines.direct import log_partition, tilted_means

    getcontext().prec = 60
    y = np.linspace(-10.0, 10.0, 81)
    weights = np.exp(-7.4 * y**2)
    tilts = np.array([[-150.0], [-120.0], [-90.0], [130.0]])
    logs = log_partition(tilts, y[:, None], weights)
    means = tilted_means(tilts, y[:, None], weights)[:, 0]
    rows = []
    for c, log_m, mean in zip(tilts[:, 0], logs, means, strict=True):
        terms = [
            Decimal(w) * (Decimal(float(c * ys))).exp() for w, ys in zip(weights, y, strict=True)
        ]
        total = sum(terms, Decimal(0))
        exact_log = float(total.ln())
        exact_mean = float(
            sum((t * Decimal(ys) for t, ys in zip(terms, y, strict=True)), Decimal(0)) / total
        )
        rows.append((c, abs(log_m - exact_log) / abs(exact_log), abs(mean - exact_mean) / 10.0))
    print("\n    c   log M rel. error   mean error / extent")
    for c, log_error, mean_error in rows:
        print(f"{c:5.0f}   {log_error:.1e}            {mean_error:.1e}")
    assert all(log_error <= 1e-14 and mean_error <= 1e-14 for _, log_error, mean_error in rows)
