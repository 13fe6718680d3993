"""The mesh interface (tpde.grid.mesh.Mesh): the flat grid, the circle and the cubed sphere
implement it (structurally: mypy checks grid/mesh.py's ``_implementations``; here at run
time), and each member agrees with a closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpde.grid import Grid, gaussian
from tpde.grid import cubed_sphere as cs
from tpde.grid.circle import circle_grid
from tpde.grid.mesh import Mesh

MEMBERS = ("shape", "size", "measures", "integrate", "moments", "halo", "describe")


def meshes() -> dict[str, Mesh]:
    return {
        "flat 1-D": Grid([-3.0], [4.0], [28], "periodic"),
        "flat 2-D": Grid([0.0, -1.0], [2.0, 2.0], [8, 12], ("noflux", "outflow")),
        "flat 3-D": Grid([0.0] * 3, [1.0] * 3, [4, 5, 6]),
        "circle": circle_grid(64),
        "sphere": cs.cubed_sphere(16),
    }


#: the total measure of each mesh in closed form: box volumes, 2 pi, 4 pi
TOTALS = {"flat 1-D": 7.0, "flat 2-D": 6.0, "flat 3-D": 1.0, "circle": 2 * math.pi}
TOTALS["sphere"] = 4 * math.pi


@pytest.mark.parametrize("name", list(meshes()))
def test_each_grid_implements_the_mesh_interface(name: str) -> None:
    mesh = meshes()[name]
    assert isinstance(mesh, Mesh), name
    for member in MEMBERS:
        assert hasattr(mesh, member), (name, member)
    measures = mesh.measures()
    ones = np.ones(mesh.shape)
    print(f"\n{name}: {mesh.describe()}; total measure {measures.sum():.15g}")
    assert measures.shape == mesh.shape and mesh.size == int(np.prod(mesh.shape))
    assert abs(measures.sum() - TOTALS[name]) < 1e-13 * TOTALS[name]
    assert abs(mesh.integrate(ones) - TOTALS[name]) < 1e-13 * TOTALS[name]
    assert isinstance(mesh.describe(), str) and mesh.describe()


def test_flat_moments_and_halo_against_closed_forms() -> None:
    """Exact cell averages of a Gaussian: its mean and covariance (the moments have no
    h^2/12 bias); the halo is numpy's wrap / symmetric / edge padding for the three
    boundary modes."""
    grid = Grid([-9.0, -9.0], [9.0, 9.0], [144, 144])
    mean, cov = np.array([0.3, -0.2]), np.array([[0.8, 0.2], [0.2, 0.5]])
    mass, found_mean, found_cov = grid.moments(gaussian(grid, mean, cov))
    print(f"\nmass {mass:.15f}, mean {found_mean}, cov {found_cov.ravel()}")
    assert abs(mass - 1.0) < 1e-12
    assert np.abs(found_mean - mean).max() < 1e-12 and np.abs(found_cov - cov).max() < 1e-10
    values = np.arange(7.0) ** 2
    for mode, numpy_mode in (("periodic", "wrap"), ("noflux", "symmetric"), ("outflow", "edge")):
        line = Grid([0.0], [1.0], [7], mode)
        assert np.array_equal(line.halo(values, 3), np.pad(values, 3, mode=numpy_mode)), mode


def test_sphere_moments_and_halo_against_closed_forms() -> None:
    """The uniform law: mean 0 and covariance I / 3. The halo of its coordinate averages
    against the exact coordinate averages of the panel's extended cells (closed-form
    areas of the gnomonic cells beyond the edge, divided by h^2)."""
    grid = cs.cubed_sphere(16)
    n, h, g = grid.n, grid.h, 3
    rho = np.full(grid.shape, 1 / (4 * math.pi))
    mass, mean, cov = grid.moments(rho)
    print(f"\nmass {mass:.15f}, |mean| {np.abs(mean).max():.1e}, cov - I/3 ", end="")
    print(f"{np.abs(cov - np.eye(3) / 3).max():.1e}")
    assert abs(mass - 1.0) < 1e-14 and np.abs(mean).max() < 1e-14
    assert np.abs(cov - np.eye(3) / 3).max() < 1e-10
    padded = grid.halo(grid.to_coordinate(np.ones(grid.shape)), g)
    t = np.tan(-math.pi / 4 + h * np.arange(-g, n + g + 1))  # the extended grid lines
    corner = cs._area_antiderivative(t[:, None], t[None, :])
    exact = (corner[1:, 1:] - corner[:-1, 1:] - corner[1:, :-1] + corner[:-1, :-1]) / h**2
    band = np.zeros((n + 2 * g, n + 2 * g), bool)
    band[g : g + n, :] = band[:, g : g + n] = True  # (the corners are not filled)
    band[g : g + n, g : g + n] = False
    error = np.abs(padded[:, band] - exact[band]).max() / exact.max()
    inner = padded[:, g : g + n, g : g + n]
    print(f"halo of the uniform law vs the extended cells' exact averages: {error:.2e}")
    assert np.array_equal(inner, grid.to_coordinate(np.ones(grid.shape)))
    assert error < 1e-5
