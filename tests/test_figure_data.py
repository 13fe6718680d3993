"""What the figures draw (tpde.validation.figure_data) against closed forms: cell volumes,
slice mass and mean, reference moments in time, Gaussian ellipses and their conditional
restriction to a plane, eigenvalues, projections, snapshot matching, round-off bounds and
relative changes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpde.validation import figure_data as fd


def test_cell_volumes_are_products_of_widths():
    edges = [np.array([0.0, 1.0, 3.0]), np.array([-1.0, 0.5]), np.array([0.0, 0.25, 1.0])]
    v = fd.cell_volumes(edges)
    assert v.shape == (2, 1, 2)
    # closed form: widths (1, 2) x (1.5) x (0.25, 0.75)
    expected = np.array([[[0.375, 1.125]], [[0.75, 2.25]]])
    print(v.ravel(), expected.ravel())
    np.testing.assert_array_equal(v, expected)


def test_slice_statistics_of_point_like_slices():
    # two slices on a 1-D grid of 4 unit cells: slice 0 all in cell 2 (centre 2.5), slice 1
    # split evenly between the cells with centres 0.5 and 3.5 (mean 2), slice 2 empty
    centres = [np.array([0.5, 1.5, 2.5, 3.5])]
    rho = np.zeros((3, 4))
    rho[0, 2] = 2.0
    rho[1, [0, 3]] = 0.5
    mass, mean = fd.slice_statistics(rho, np.ones(4), centres)
    print(mass, mean.ravel())
    np.testing.assert_array_equal(mass, [2.0, 1.0, 0.0])
    np.testing.assert_array_equal(mean[:2, 0], [2.5, 2.0])
    assert np.isnan(mean[2, 0])


def test_reference_moments_sort_and_interpolate_linearly():
    t = np.array([1.0, 0.0, 2.0])
    mean = np.array([[2.0, 0.0], [0.0, 0.0], [4.0, 2.0]])
    cov = np.stack([np.eye(2) * (1 + s) for s in t])
    cov[2, 0, 1] = 1.0  # an asymmetric entry: the interpolant is symmetrised
    ref = fd.reference_moments({"time": t, "mean_position": mean, "covariance": cov}, 2)
    assert ref is not None
    np.testing.assert_array_equal(ref["time"], [0.0, 1.0, 2.0])
    m, c = fd.interpolate_moments(ref, 1.5)
    print(m, c)
    np.testing.assert_allclose(m, [3.0, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(c, [[2.5, 0.25], [0.25, 2.5]], rtol=0, atol=1e-15)
    assert fd.interpolate_moments(ref, 2.1) is None  # past a reference's end: not drawn
    with pytest.raises(ValueError, match="missing covariance"):
        fd.reference_moments({"time": t, "mean": mean}, 2)
    with pytest.raises(ValueError, match="do not match"):
        fd.reference_moments({"time": t, "mean": mean, "covariance": cov}, 3)


def test_ellipse_lies_on_its_level_set():
    mean = np.array([1.0, -2.0])
    cov = np.array([[2.0, 0.6], [0.6, 0.5]])
    xy = fd.ellipse(mean, cov, 2.0)
    r2 = np.einsum("in,ij,jn->n", xy - mean[:, None], np.linalg.inv(cov), xy - mean[:, None])
    print(r2.min(), r2.max())
    np.testing.assert_allclose(r2, 4.0, rtol=1e-12)


def test_conditional_gaussian_is_the_schur_complement():
    # N(0, S) with S = [[1, r, 0], [r, 1, 0], [0, 0, 1]] on the plane x1 = v: x0 | x1 = v is
    # N(r v, 1 - r^2) and independent of x2 ~ N(0, 1) (closed form)
    r, v = 0.6, 1.5
    cov = np.array([[1.0, r, 0.0], [r, 1.0, 0.0], [0.0, 0.0, 1.0]])
    m, c = fd.conditional_gaussian(np.zeros(3), cov, (0, 2), 1, v)
    print(m, c)
    np.testing.assert_allclose(m, [r * v, 0.0], rtol=1e-15)
    np.testing.assert_allclose(c, [[1 - r * r, 0.0], [0.0, 1.0]], rtol=1e-15)


def test_gaussian_pdf_and_eigenvalues():
    x = np.array([0.0, 1.0])
    np.testing.assert_allclose(
        fd.gaussian_pdf(x, 0.0, 1.0, 2.0), 2.0 * np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)
    )
    cov = np.array([[[2.0, 1.0], [1.0, 2.0]], [[np.nan, 0.0], [0.0, 1.0]]])
    eig = fd.eigenvalues(cov)
    print(eig)
    np.testing.assert_allclose(eig[0], [1.0, 3.0], rtol=1e-15)
    assert np.isnan(eig[1]).all()


def test_projections_integrate_to_the_mass():
    rng = np.random.default_rng(3)
    rho = rng.random((3, 4, 5))
    widths = [np.full(3, 0.5), np.full(4, 0.25), np.full(5, 0.2)]
    mass = float(np.sum(rho) * 0.5 * 0.25 * 0.2)
    for (a, b), p in zip(fd.PLANES, fd.projections(rho, widths), strict=True):
        total = float(np.sum(p) * widths[a][0] * widths[b][0])
        assert math.isclose(total, mass, rel_tol=1e-13), (a, b)
    np.testing.assert_allclose(fd.xy_marginal(rho, widths[2]), fd.projections(rho, widths)[0])
    at = fd.max_index(rho)
    assert rho[at] == rho.max()
    np.testing.assert_array_equal(fd.plane_slice(rho, (0, 2), at), rho[:, at[1], :])
    assert fd.top_value([rho, -rho]) == rho.max()
    assert fd.top_value([np.full(2, np.nan)]) == 1.0


def test_snapshot_matching():
    times = np.array([0.0, 0.5, 1.0])
    assert fd.snapshot_at(times, 0.5 + 1e-12) == 1
    assert fd.snapshot_at(times, 0.6) is None
    assert fd.snapshot_at_or_before(times, 0.6) == 1  # the records go on past 0.6
    assert fd.snapshot_at_or_before(times, 1.2) is None  # they ended before 1.2
    pairs = fd.shared_snapshots(np.linspace(0, 1, 11), times, 2)
    print(pairs)
    assert pairs == [(0, 0), (10, 2)]
    assert fd.shared_snapshots(times, np.array([5.0]), 3) == []
    assert fd.pick_snapshots(np.linspace(0, 1, 9), None, 5) == [0, 2, 4, 6, 8]
    assert fd.pick_snapshots(times, [0.9, 0.1], 5) == [2, 0]
    with pytest.raises(ValueError, match="no snapshots"):
        fd.pick_snapshots(np.zeros(0), None, 5)


def test_roundoff_and_relative_change():
    assert fd.roundoff_bound(np.array([1e-12, -3e-12, np.nan]), 1.0) == 3e-12
    assert fd.roundoff_bound(np.array([1e-3]), 1.0) is None
    assert fd.roundoff_bound(np.array([np.nan]), 1.0) is None
    values, note = fd.relative_change(np.array([2.0, 3.0, 1.0]))
    np.testing.assert_array_equal(values, [0.0, 0.5, -0.5])
    assert note == ""
    values, note = fd.relative_change(np.array([-4.0, -4.0 * (1 + 1e-14), np.nan]))
    assert note == " (constant to round-off)"
    np.testing.assert_array_equal(values[:2], [0.0, 0.0])
    assert np.isnan(values[2])
    values, note = fd.relative_change(np.array([0.0, 1.0]))
    assert note == " (absolute)"
    np.testing.assert_array_equal(values, [0.0, 1.0])
