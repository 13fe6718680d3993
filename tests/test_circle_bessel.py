"""Any 2 x 2 head on the circle by the Jacobi-Anger series (docs/theory.md, 'Any head on the
circle: the Jacobi-Anger series'): the series sums against dense sums of the exact density,
against the convolution engine of A = a I + b J, its a posteriori truncation order against
the tail it leaves, and a run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.special import ive

from tpde.grid.circle import TWO_PI, circle_grid, uniform_modes
from tpde.schemes.solver import Problem, Solver
from tpde.variants import Head
from tpde.variants.engines.bessel import SERIES_TOLERANCE, series_order, tail_bounds
from tpde.variants.spherical import CircleAttention

#: a band-limited density (modes 1..9): its cell averages are exact and its coefficients
#: below the grid's Nyquist mode are all it has, so the series sums are exact up to the cut
MODES = [(1, 0.5, 0.3), (2, 0.3, 2.0), (5, 0.15, 4.0), (9, 0.05, 1.0)]
HEADS = {
    "general": Head(np.array([[2.0, 1.5], [-0.5, 3.5]]), np.array([[0.5, -0.2], [0.8, 1.1]])),
    "symmetric": Head(np.array([[4.0, 2.5], [2.5, -1.0]]), np.array([[1.0, 0.3], [0.3, 0.7]])),
    "rank one": Head(np.outer([1.0, 2.0], [2.0, -1.0]), np.eye(2)),
}


def band_limited(theta: np.ndarray) -> np.ndarray:
    """The point values of uniform_modes(MODES)."""
    return (1.0 + sum(a * np.cos(k * (theta - p)) for k, a, p in MODES)) / TWO_PI


def dense_sums(theta, A, C, normalised=True, m=4096):
    """theta' from dense sums over m points of the exact density (the trapezoid rule: exact
    for this band-limited density times the analytic kernel, to round-off)."""
    phi = TWO_PI * np.arange(m) / m
    rho = band_limited(phi) * TWO_PI / m
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    y = np.stack([np.cos(phi), np.sin(phi)], 1)
    tangent = np.stack([-np.sin(theta), np.cos(theta)], 1)
    kernel = np.exp((x @ A.T) @ y.T) * rho
    numerator = np.einsum("ij,ij->i", (kernel @ y) @ C.T, tangent)
    return numerator / kernel.sum(axis=1) if normalised else numerator


@pytest.mark.parametrize("name", list(HEADS))
@pytest.mark.parametrize("normalised", [True, False])
def test_series_equals_the_dense_sums(name, normalised):
    head = HEADS[name]
    g = circle_grid(64)
    rho = uniform_modes(g, MODES)
    field = CircleAttention(head, normalised)
    assert field.choose(head) == "fft"  # "auto": the series for any head with |A| <= 8
    rows = []
    for offset in (0.0, 0.5, 0.25):
        u = field.at(rho, g, 0.0, [offset])[0]
        shift = -0.5 if offset == 0.5 else offset  # (face j at centre j - 1/2; n + 1 faces)
        targets = g.lower[0] + (np.arange(u.size) + 0.5 + shift) * g.spacing[0]
        exact = dense_sums(targets, head.A, head.C, normalised)
        error = float(np.abs(u - exact).max() / np.abs(exact).max())
        rows.append((offset, error))
        assert error < 1e-12, (name, normalised, offset, error)
    print(f"\n{name}, normalised {normalised}: offset, error vs dense sums: {rows}")


def test_series_equals_the_convolution_for_a_conformal_head():
    g = circle_grid(96)
    rho = uniform_modes(g, MODES)
    head = Head(np.array([[3.0, -1.2], [1.2, 3.0]]), np.array([[0.5, -0.2], [0.8, 1.1]]))
    field = CircleAttention(head, engine="fft")
    for shift in (0.0, -0.5):
        convolution = field._fft(rho, g, head, 1, [shift])[0]
        series = field._bessel(rho, g, head, [shift])[0]
        error = np.abs(series - convolution).max() / np.abs(convolution).max()
        print(f"\nshift {shift}: series vs convolution {error:.2e}")
        assert error < 1e-13


@pytest.mark.parametrize("radius", [0.0, 0.3, 4.0, 8.0, 40.0, 250.0])
def test_the_truncation_order_is_the_smallest_that_holds_the_tail(radius):
    r = np.array([radius, 0.5 * radius, 0.1])
    orders, table = series_order(r)
    assert table.shape == (3, int(orders.max()) + 1)
    assert np.array_equal(table, ive(np.arange(table.shape[1])[None, :], r[:, None]))
    for ri, order in zip(r, orders, strict=True):
        k = np.arange(order + 1, order + 400)
        tail = 2.0 * ive(k, ri).sum() / ive(0, ri)  # what the cut series leaves out
        bound = tail_bounds(ive(np.arange(order + 3), ri)[None, :])[0, order]
        assert tail <= bound * (1.0 + 1e-12) and bound <= SERIES_TOLERANCE, (ri, order, bound)
        if order > 0:  # one order less breaks the bound: the order is the smallest
            less = tail_bounds(ive(np.arange(order + 2), ri)[None, :])[0, order - 1]
            assert less > SERIES_TOLERANCE, (ri, order, less)
        print(f"\nr = {ri:g}: order {order}, tail {tail:.2e} <= bound {bound:.2e}")


def test_large_tilts_stay_finite_and_quiet():
    g = circle_grid(128)
    rho = uniform_modes(g, MODES)
    head = Head(np.array([[60.0, 10.0], [-20.0, 30.0]]), np.eye(2))
    field = CircleAttention(head, engine="fft")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        u = field.at(rho, g, 0.0, [0.5])[0]
    assert np.all(np.isfinite(u)) and np.abs(u).max() <= np.linalg.norm(head.C, 2)
    assert CircleAttention(head).choose(head) == "direct"  # "auto": relative accuracy


def test_a_run_with_a_general_head_matches_the_dense_engine():
    g = circle_grid(96)
    rho = uniform_modes(g, MODES)
    head = HEADS["general"]
    finals = {}
    for engine in ("fft", "direct"):
        result = Solver(Problem(g, rho, CircleAttention(head, engine=engine), 0.5)).run()
        assert result.status == "completed"
        finals[engine] = result.final
    mass = [g.integrate(f) for f in finals.values()]
    difference = np.abs(finals["fft"] - finals["direct"]).max() / finals["direct"].max()
    print(f"\nt = 0.5 on 96 cells: series vs dense run {difference:.2e}, mass {mass}")
    assert abs(mass[0] - 1.0) < 1e-13
    assert difference < 1e-8  # the dense engine's point values are eighth order
