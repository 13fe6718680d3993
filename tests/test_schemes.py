"""Unit tests of the scheme building blocks against exact values."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tpde.grid import Grid, gaussian
from tpde.grid.stencils import average_to_point_weights, ghost_index_map
from tpde.schemes import RECONSTRUCTIONS, get_integrator, get_reconstruction
from tpde.schemes.operator import GAUSS3_NODES
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.variants.prescribed import ConstantVelocity


def averages_of(poly: np.poly1d, centres: np.ndarray, h: float) -> np.ndarray:
    antiderivative = poly.integ()
    return (antiderivative(centres + h / 2) - antiderivative(centres - h / 2)) / h


@pytest.mark.parametrize("name", sorted(RECONSTRUCTIONS))
def test_constant_data_is_reproduced(name):
    recon = get_reconstruction(name).kernel
    assert recon(2.5, 2.5, 2.5, 2.5, 2.5) == pytest.approx(2.5, rel=1e-15)


@pytest.mark.parametrize("name", sorted(set(RECONSTRUCTIONS) - {"upwind"}))
def test_linear_data_gives_the_exact_face_value(name):
    recon = get_reconstruction(name).kernel
    v = averages_of(np.poly1d([0.7, 1.3]), np.arange(-2.0, 3.0), 1.0)
    assert recon(*v) == pytest.approx(0.7 * 0.5 + 1.3, rel=1e-14)
    assert recon(*v[::-1]) == pytest.approx(-0.7 * 0.5 + 1.3, rel=1e-14)  # mirror: right state


@pytest.mark.parametrize("name, order", [("weno5", 5), ("weno5z", 5), ("muscl-vanleer", 2)])
def test_face_value_converges_at_the_formal_order(name, order):
    recon = get_reconstruction(name).kernel
    errors = []
    for h in (0.1, 0.05, 0.025):
        centres = 0.3 + h * np.arange(-2, 3)
        v = (np.exp(centres + h / 2) - np.exp(centres - h / 2)) / h
        errors.append(abs(recon(*v) - np.exp(0.3 + h / 2)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(orders > order - 0.3), orders


@pytest.mark.parametrize("offset", list(GAUSS3_NODES) + [0.5, -0.25])
def test_average_to_point_weights_are_exact_for_quartics(offset):
    weights = average_to_point_weights(offset)
    poly = np.poly1d([0.3, -1.0, 0.5, 2.0, -0.7])
    v = averages_of(poly, np.arange(-2.0, 3.0), 1.0)
    assert weights @ v == pytest.approx(poly(offset), rel=1e-13)
    assert weights.sum() == pytest.approx(1.0, rel=1e-14)


def test_ghost_index_maps():
    assert ghost_index_map(5, "periodic").tolist() == [2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2]
    assert ghost_index_map(5, "noflux").tolist() == [2, 1, 0, 0, 1, 2, 3, 4, 4, 3, 2]
    assert ghost_index_map(5, "outflow").tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4]


def test_integrator_tables():
    rk3 = get_integrator("ssprk3")
    assert rk3.stage_times.tolist() == [0.0, 1.0, 0.5]
    assert get_integrator("ssprk2").stage_times.tolist() == [0.0, 1.0]
    for name in ("ssprk1", "ssprk2", "ssprk3"):
        rk = get_integrator(name)
        for row in rk.alpha:
            # convex combinations whose float weights sum to 1 exactly: else every step
            # scales the mass by their sum (fl(1/3) + fl(2/3) = 1 - 2^-54)
            assert sum(Fraction(a) for a in row) == 1


def test_long_periodic_run_keeps_its_mass():
    """4000 SSP-RK3 steps of a periodic transport: the mass within 1e-13 (2.4e-13 with the
    stage weights fl(1/3), fl(2/3), whose sum is 1 - 2^-54)."""
    grid = Grid([-4.0, -4.0], [4.0, 4.0], [32, 32], boundary="periodic")
    density = gaussian(grid, [0.0, 0.0], [[0.5, 0.1], [0.1, 0.4]])
    problem = Problem(grid, density, ConstantVelocity([0.3, -0.2]), 200.0, Scheme(dt=0.05))
    result = Solver(problem).run()
    change = grid.integrate(result.snapshots[-1].density) / grid.integrate(density) - 1.0
    print(f"\n{result.steps} steps: relative mass change {change:.2e}")
    assert result.steps == 4000 and abs(change) <= 1e-13


def test_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="weno5z"):
        get_reconstruction("eno3")
    with pytest.raises(ValueError, match="ssprk3"):
        get_integrator("rk4")
