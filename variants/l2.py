"""l2 attention on the grid (MATH.md 1.3 and 3.3): kernel exp(-|Q_s x - K y|^2), Q_s = scale Q.

Expanding the square, the factor exp(-|Q_s x|^2) cancels between numerator and denominator:

    Gamma(x) = C m_w(c),   c = 2 K^T Q_s x,   m_w(c) = int y e^{c.y} w(y) dy / int e^{c.y} w(y) dy,

the tilted mean of the reweighted density ``w(y) = exp(-|K y|^2) rho(y)``: the softmax
machinery (direct or separable engine) applied to ``w``. The weight is not an exponential, so
the exact cell-average correction of the softmax module does not apply; instead ``w`` is built
from eighth-order point values of the density (``tpde.grid.stencils.point_values``), after which
the sums are trapezoid sums of smooth integrands. Point values that the deconvolution makes
negative next to steep features are set to zero (the kernel sums need non-negative weights).
"""

from __future__ import annotations

import numpy as np

from tpde.grid import Grid
from tpde.grid.stencils import point_values

from .base import VelocityField
from .parameters import L2Head, ParamSpec, as_param_spec, params_at
from .separable import SEPARABLE_DEFAULTS, SEPARABLE_ORDER, SeparableTiltedMeans
from .softmax import DIRECT_MAX_CELLS, ENGINES, density_sources, tilted_means


def reweighted_density(density: np.ndarray, grid: Grid, head: L2Head) -> np.ndarray:
    """w(y_c) = exp(-|K y_c|^2) rho(y_c) at the cell centres (non-negative), grid.shape."""
    centres = np.stack(grid.mesh(sparse=False), axis=-1)          # (*cells, d)
    weight = np.exp(-np.sum((centres @ head.K.T) ** 2, axis=-1))
    return np.maximum(point_values(density, grid), 0.0) * weight


class L2Attention(VelocityField):
    """l2 attention, one head (:class:`L2Head`, or Layers / a callable of them).

    engine : "auto" | "direct" | "separable" as for :class:`SoftmaxAttention`.
    """

    def __init__(self, params: ParamSpec, engine: str = "auto", nodes: int | None = None,
                 order: int = SEPARABLE_ORDER, block: int = 256):
        self.spec = as_param_spec(params)
        if engine not in ENGINES:
            raise ValueError(f"attention.engine: unknown {engine!r}; choose one of "
                             f"{', '.join(ENGINES)}")
        self.engine = engine
        self.nodes = nodes
        self.order = int(order)
        self.block = int(block)

    def at(self, density, grid: Grid, t: float, offset) -> np.ndarray:
        return self.at_many(density, grid, t, [offset])[0]

    def at_many(self, density, grid: Grid, t: float, offsets) -> list[np.ndarray]:
        head = params_at(self.spec, t)
        if not isinstance(head, L2Head):
            raise ValueError(f"attention: the l2 variant needs Q and K (an L2Head), got "
                             f"{type(head).__name__}")
        if head.K.shape[1] != grid.ndim:
            raise ValueError(f"attention.K: expected k x {grid.ndim} for a {grid.ndim}-D grid, "
                             f"got {head.K.shape[0]} x {head.K.shape[1]}")
        coupling = 2.0 * head.K.T @ (head.scale * head.Q)              # c = coupling x
        weights = reweighted_density(density, grid, head)
        lattices = [grid.lattice(offset) for offset in offsets]
        points = [np.stack([m.reshape(-1) for m in np.meshgrid(*coords, indexing="ij")], axis=1)
                  for coords in lattices]
        engine = self.engine
        if engine == "auto":
            engine = "direct" if grid.size <= DIRECT_MAX_CELLS else "separable"
        if engine == "direct":
            sources, values = density_sources(weights, grid)

            def means(c):
                return tilted_means(c, sources, values, (0.0,) * grid.ndim, self.block)
        else:
            density_sources(weights, grid)  # raises when there is no mass
            lower = np.min([p.min(axis=0) for p in points], axis=0)
            upper = np.max([p.max(axis=0) for p in points], axis=0)
            corners = np.stack(np.meshgrid(*zip(lower, upper, strict=True), indexing="ij"),
                               axis=-1).reshape(-1, grid.ndim) @ coupling.T
            bounds = np.stack([corners.min(axis=0), corners.max(axis=0)], axis=1)
            means = SeparableTiltedMeans(weights, grid, bounds,
                                         self.nodes or SEPARABLE_DEFAULTS[grid.ndim], self.order)
        return [(means(x @ coupling.T) @ head.C.T).T.reshape((grid.ndim,)
                                                             + tuple(len(v) for v in coords))
                for coords, x in zip(lattices, points, strict=True)]
