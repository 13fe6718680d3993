"""The mesh interface: what every geometry's grid offers the operator, the time loop's
callbacks and the face.

docs/architecture.md, 'The mesh, the operator, the loop'. Three grids implement it,
structurally (no common base class): :class:`tpde.grid.Grid` (the flat 1-3-D box, or the
co-moving frame's cells), :class:`tpde.grid.circle.CircleGrid` (S^1 as a periodic angle
grid; a Grid) and :class:`tpde.grid.cubed_sphere.CubedSphere` (S^2). The checks are mypy's
(``_implementations`` below is type-checked) and ``isinstance(grid, Mesh)`` at run time
(``tests/test_mesh.py``, which also checks each member against closed forms).

Members (``density``: cell averages per unit measure, shape ``shape``):

* ``shape``, ``size``: the cell array's shape and number of cells;
* ``measures()``: each cell's measure (length, area, volume) ``|c|``, shape ``shape``;
* ``integrate(density)``: the mass ``sum_c |c| density_c`` (exact for cell averages);
* ``moments(density)``: mass, mean and covariance of the measure in the mesh's ambient
  coordinates (R^d for the flat grid and the angle for the circle, as the monitors read
  them; R^3 for the sphere, whose mean lies inside the ball);
* ``halo(values, ghosts)``: the cell values with ``ghosts`` layers of ghost cells on every
  side of each block, as the reconstructions read them (the flat grid's boundary modes:
  periodic, noflux reflection, outflow zero gradient; the sphere's panels: the neighbours'
  cells interpolated onto the panel's extended grid lines, acting on coordinate averages
  ``q = J rho``, :func:`tpde.grid.cubed_sphere.halo_matrix`; corners 0);
* ``describe()``: one line for people (``tpde info``, logs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

__all__ = ["Mesh"]


@runtime_checkable
class Mesh(Protocol):
    """The interface every geometry's grid implements (module docstring)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def size(self) -> int: ...

    def measures(self) -> np.ndarray: ...

    def integrate(self, density: np.ndarray) -> float: ...

    def moments(self, density: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]: ...

    def halo(self, values: np.ndarray, ghosts: int) -> np.ndarray: ...

    def describe(self) -> str: ...


if TYPE_CHECKING:  # mypy checks that each grid implements the interface
    from .circle import CircleGrid
    from .cubed_sphere import CubedSphere
    from .grid import Grid

    def _implementations(grid: Grid, circle: CircleGrid, sphere: CubedSphere) -> list[Mesh]:
        return [grid, circle, sphere]
