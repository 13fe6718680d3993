"""Sheared two-pass interpolation of the separable tables (tpde.variants.engines.sheared).

References: the exact function the table samples, the pointwise ORDER^2 stencils, a brute-force
marking of every table node the passes read, and the dense kernel sums.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_variants import A1, V1

import tpde
from tpde.grid import Grid, gaussian_mixture
from tpde.variants import Head
from tpde.variants.engines.direct import DirectSums, grad_log_box_factor, support_box
from tpde.variants.engines.lagrange import LOW, ORDER
from tpde.variants.engines.products import row_split_tensordot
from tpde.variants.engines.separable import TiltTable, mgf_table
from tpde.variants.engines.sheared import extra_nodes, nodes_read, plan_passes, sheared_on_lattice
from tpde.variants.softmax import SoftmaxAttention

MATRICES = {
    "c1": np.asarray(A1),
    "antidiagonal": np.array([[0.0, 1.0], [1.0, 1.0]]),
    "shear": np.array([[1.0, 1.0], [0.0, 1.0]]),
    "rank one": np.array([[2.0, 0.0], [0.0, 0.0]]),
    "random": np.random.default_rng(1).normal(size=(2, 2)),
}


def table_for(matrix, grid: Grid, inner=(80, 80)):
    """start, step, node counts of a table covering c = matrix x over the box, padded."""
    corners = (
        np.array(
            [[x, y] for x in grid.lower for y in grid.upper]
            + [[x, y] for x in grid.upper for y in grid.lower]
            + [list(grid.lower), list(grid.upper)]
        )
        @ matrix.T
    )
    lower, upper = corners.min(axis=0), corners.max(axis=0)
    step = np.maximum(upper - lower, 1e-12) / (np.asarray(inner) - 1)
    pad = ORDER // 2 + 1 + extra_nodes(matrix, step)
    return lower - pad * step, step, np.asarray(inner) + 2 * pad


@pytest.mark.parametrize("name", list(MATRICES))
def test_sheared_passes_interpolate_like_the_pointwise_stencils(name):
    """A smooth function sampled on the table: both routes reproduce it to round-off."""
    matrix = MATRICES[name]
    grid = Grid([-3.0, -2.0], [3.0, 4.0], [64, 70])
    start, step, counts = table_for(matrix, grid)
    nodes = [start[a] + step[a] * np.arange(counts[a]) for a in range(2)]
    c0, c1 = np.meshgrid(*nodes, indexing="ij")

    def f(u, v):
        return np.sin(0.7 * u + 0.3) * np.cos(0.4 * v) + 0.1 * u * v

    table = TiltTable(f(c0, c1)[None], start, step)
    for offset in ([-0.5, 0.0], [0.0, -0.5], [0.0, 0.0]):
        coords = grid.lattice(offset)
        x = np.stack([m.ravel() for m in np.meshgrid(*coords, indexing="ij")], axis=1)
        exact = f(*(x @ matrix.T).T)
        sheared = sheared_on_lattice(table.values, start, step, coords, matrix)
        assert sheared is not None
        pointwise = table(x @ matrix.T, 0)
        assert np.abs(sheared[0].ravel() - exact).max() <= 1e-13
        assert np.abs(pointwise - exact).max() <= 1e-13


@pytest.mark.parametrize("name", list(MATRICES))
def test_nodes_read_is_exactly_what_the_passes_read(name):
    matrix = MATRICES[name]
    grid = Grid([-3.0, -2.0], [3.0, 4.0], [41, 37])
    lattices = [grid.lattice(o) for o in ([-0.5, 0.0], [0.0, -0.5])]
    start, step, counts = table_for(matrix, grid, (60, 45))
    t2, lo, hi = nodes_read(counts, start, step, lattices, matrix)
    marked = np.zeros((counts[t2], counts[1 - t2]), dtype=bool)
    for coords in lattices:
        passes = plan_passes(counts, start, step, coords, matrix)
        for i in range(passes.a.size):
            for k in range(passes.first_node[i], passes.last_node[i] + 1):
                first = int(np.floor(passes.a[i] + passes.b * k)) - LOW
                marked[k, first : first + ORDER] = True
    for k in range(marked.shape[0]):
        read = np.flatnonzero(marked[k])
        if read.size:
            assert (lo[k], hi[k]) == (read[0], read[-1])
        else:
            assert lo[k] > hi[k]


def three_bumps(grid: Grid) -> np.ndarray:
    return gaussian_mixture(
        grid,
        [0.3, 0.4, 0.3],
        [[-3.0, -1.0], [2.5, 1.0], [0.0, 3.0]],
        [0.3 * np.eye(2), [[0.5, 0.2], [0.2, 0.3]], [[0.2, 0.0], [0.0, 0.6]]],
    )


def test_banded_table_is_the_full_table_where_the_passes_read():
    grid = Grid([-7.0, -7.0], [7.0, 7.0], [128, 128])  # the band applies from 128 cells
    rho = three_bumps(grid)
    matrix = np.asarray(A1)
    lattices = [grid.lattice(o) for o in ([-0.5, 0.0], [0.0, -0.5])]
    start, step, counts = table_for(matrix, Grid([-7.5, -7.5], [7.5, 7.5], [1, 1]), (200, 90))
    tilts = [start[a] + step[a] * np.arange(counts[a]) for a in range(2)]
    band = nodes_read(counts, start, step, lattices, matrix)
    full = mgf_table(rho, grid, tilts)
    banded = mgf_table(rho, grid, tilts, band=band)
    t2, lo, hi = band
    read = np.zeros(counts, dtype=bool)
    for k in range(lo.size):
        if lo[k] <= hi[k]:
            index = (k, slice(lo[k], hi[k] + 1)) if t2 == 0 else (slice(lo[k], hi[k] + 1), k)
            read[index] = True
    assert 0.3 < read.mean() < 0.8
    assert np.all(np.isfinite(banded[:, read]))
    assert np.isnan(banded[:, ~read]).mean() > 0.5  # formed only near the band
    assert np.abs(banded[:, read] - full[:, read]).max() <= 1e-13 * np.abs(full).max()


def test_sheared_engine_is_as_accurate_as_the_pointwise_stencils(monkeypatch):
    """Three bumps, against the dense sums on a subset of face points, the sheared passes vs
    the pointwise stencils on the table they replaced. The table is refined along the pass-2
    axis (sheared.resolution_factor); without it the passes were 4x less accurate (3.5e-9 vs
    8.8e-10 at 256^2)."""
    grid = Grid([-7.0, -7.0], [7.0, 7.0], [128, 128])
    rho = three_bumps(grid)
    box = support_box(rho, grid)
    direct = DirectSums(rho, grid, 256)
    offsets = [np.array([-0.5, 0.0]), np.array([0.0, -0.5])]
    import tpde.variants.engines.separable as separable

    all_errors = {}
    for scale in (1.0, 2.0):
        matrix = scale * np.asarray(A1)
        errors = {}
        for route in ("sheared", "pointwise"):
            if route == "pointwise":  # the engine before the passes: no shear, no refinement
                monkeypatch.setattr(separable, "sheared_on_lattice", lambda *a, **k: None)
                monkeypatch.setattr(
                    separable, "resolution_factor", lambda matrix, extent: np.ones(len(extent))
                )
            field = SoftmaxAttention(Head(matrix, V1), engine="separable")
            values = field.components(rho, grid, 0.0, offsets, [0, 1])
            worst = 0.0
            for lattice, (offset, comp) in enumerate(zip(offsets, (0, 1), strict=True)):
                coords = grid.lattice(offset)
                index = [np.random.default_rng(lattice).integers(0, len(c), 600) for c in coords]
                x = np.stack([coords[a][index[a]] for a in range(2)], axis=1)
                c = x @ matrix.T
                means = direct.means(c) - grad_log_box_factor(c, grid.spacing)
                reference = (np.clip(means, *box) @ np.asarray(V1).T)[:, comp]
                got = values[lattice][index[0], index[1]]
                worst = max(worst, np.abs(got - reference).max() / np.abs(reference).max())
            errors[route] = worst
            monkeypatch.undo()
        print(
            f"\nthree bumps 128^2, A = {scale} c1: sheared {errors['sheared']:.2e}, "
            f"pointwise {errors['pointwise']:.2e} (vs dense)"
        )
        all_errors[scale] = errors
    for errors in all_errors.values():
        assert errors["sheared"] <= 1e-8
        assert errors["sheared"] <= 2.0 * errors["pointwise"] + 1e-14


@pytest.mark.parametrize("threads", [1, 2])
def test_row_split_tensordot_is_tensordot(threads):
    used = tpde.set_num_threads(threads)
    try:
        rng = np.random.default_rng(2)
        for shape, axis in (((300, 200), 0), ((300, 200), 1), ((40, 30, 50), 1)):
            array = rng.random(shape)
            matrix = rng.random((700, shape[axis]))
            expected = np.tensordot(matrix, array, axes=([1], [axis]))
            got = row_split_tensordot(matrix, array, axis)
            assert got.shape == expected.shape
            assert np.abs(got - expected).max() <= 1e-12 * np.abs(expected).max()
    finally:
        tpde.set_num_threads()
    assert used >= 1


MATRICES_3D = {
    "random": np.random.default_rng(2).normal(0.0, 0.5, (3, 3)),
    "permutation-like": np.array([[0.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.5, 1.0]]),
    "diagonal": np.diag([1.0, 2.0, 3.0]),
    "rank two": np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
}


@pytest.mark.parametrize("name", list(MATRICES_3D))
def test_sheared_passes_3d_interpolate_like_the_pointwise_stencils(name):
    """3-D: the padding from the dry run of the windows keeps every read in the table, and
    the three passes reproduce a smooth function to round-off, as the 12^3 stencils do."""
    from tpde.variants.engines.sheared3d import padding, sheared_on_lattice3

    matrix = MATRICES_3D[name]
    grid = Grid([-3.0, -2.0, -1.0], [3.0, 4.0, 2.0], [20, 22, 18])
    lattices = [grid.lattice(o) for o in ([-0.5, 0, 0], [0, -0.5, 0], [0, 0, -0.5])]
    corners = np.array([[x, y, z] for x in (-3, 3) for y in (-2, 4) for z in (-1, 2)])
    lower, upper = (corners @ matrix.T).min(axis=0), (corners @ matrix.T).max(axis=0)
    inner = np.array([40, 36, 30])
    step = np.maximum(upper - lower, 1e-12) / (inner - 1)
    pad = np.full(3, ORDER // 2 + 1)
    pad = pad + padding(inner + 2 * pad, lower - pad * step, step, lattices, matrix, None)
    start, counts = lower - pad * step, inner + 2 * pad
    nodes = np.meshgrid(
        *[start[a] + step[a] * np.arange(counts[a]) for a in range(3)], indexing="ij"
    )

    def f(c0, c1, c2):
        return np.sin(0.7 * c0 + 0.3) * np.cos(0.4 * c1) + 0.1 * c0 * c2 + np.exp(0.2 * c1)

    table = TiltTable(f(*nodes)[None], start, step)
    for coords in lattices:
        x = np.stack([m.ravel() for m in np.meshgrid(*coords, indexing="ij")], axis=1)
        exact = f(*(x @ matrix.T).T)
        sheared = sheared_on_lattice3(table.values, start, step, coords, matrix)
        assert sheared is not None
        scale = np.abs(exact).max()
        assert np.abs(sheared[0].ravel() - exact).max() <= 1e-12 * scale
        assert np.abs(table(x @ matrix.T, 0) - exact).max() <= 1e-12 * scale


def test_sheared_engine_3d_is_as_accurate_as_the_pointwise_stencils(monkeypatch):
    """Two bumps in 3-D with a small A (the refined table fits under the 160-node cap, so the
    passes apply), against the dense sums: the passes vs the pointwise engine they replace."""
    import tpde.variants.engines.separable as separable

    grid = Grid([-5.0] * 3, [5.0] * 3, [32] * 3)
    rho = gaussian_mixture(
        grid,
        [0.5, 0.5],
        [[-1.5, 0.0, 0.0], [1.5, 0.5, 0.5]],
        [0.4 * np.eye(3), 0.3 * np.eye(3) + 0.1],
    )
    matrix = 0.15 * np.random.default_rng(4).normal(size=(3, 3)) + 0.1 * np.eye(3)
    C = np.random.default_rng(5).normal(0.0, 0.7, (3, 3))
    offset = np.array([-0.5, 0.0, 0.0])
    coords = grid.lattice(offset)
    index = [np.random.default_rng(6).integers(0, len(c), 500) for c in coords]
    x = np.stack([coords[a][index[a]] for a in range(3)], axis=1)
    c = x @ matrix.T
    means = DirectSums(rho, grid, 256).means(c) - grad_log_box_factor(c, grid.spacing)
    reference = (np.clip(means, *support_box(rho, grid)) @ C.T)[:, 0]
    calls = []
    original = separable.sheared_on_lattice3
    monkeypatch.setattr(
        separable, "sheared_on_lattice3", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    errors = {}
    for route in ("sheared", "pointwise"):
        if route == "pointwise":
            monkeypatch.setattr(separable, "sheared_on_lattice3", lambda *a, **k: None)
            monkeypatch.setattr(
                separable, "resolution_factor3", lambda matrix, extent: np.ones(len(extent))
            )
        field = SoftmaxAttention(Head(matrix, C), engine="separable")
        values = field.components(rho, grid, 0.0, [offset], [0])[0]
        got = values[index[0], index[1], index[2]]
        errors[route] = np.abs(got - reference).max() / np.abs(reference).max()
    print(
        f"\nthree-pass 3-D engine vs dense: {errors['sheared']:.2e} "
        f"(pointwise {errors['pointwise']:.2e})"
    )
    assert calls  # the passes ran
    assert errors["sheared"] <= 1e-9
    assert errors["sheared"] <= 2.0 * errors["pointwise"] + 1e-14
