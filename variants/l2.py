"""l2 attention on the grid: kernel exp(-|Q_s x - K y|^2), Q_s = scale Q.

docs/theory.md, 'l2 attention' and 'l2 on Gaussians'.

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
from tpde.schemes.frame import HELD_CUT, transported

from .engines.cache import Recent
from .engines.direct import support_box
from .parameters import L2Head, ParamSpec, as_param_spec, head_at
from .softmax import TiltedMeanField, with_constant
from .truncation import MEASURED_HELD, cut_lattices, gaussian_like, measured_cut


def key_weight(grid: Grid, K: np.ndarray) -> np.ndarray:
    """exp(-|K y_c|^2) at the cell centres, grid.shape."""
    centres = np.stack(grid.mesh(sparse=False), axis=-1)  # (*cells, d)
    return np.exp(-np.sum((centres @ np.asarray(K, float).T) ** 2, axis=-1))


def reweighted_density(
    density: np.ndarray, grid: Grid, head: L2Head, weight: np.ndarray | None = None
) -> np.ndarray:
    """w(y_c) = exp(-|K y_c|^2) rho(y_c) at the cell centres (non-negative), grid.shape;
    ``weight``: :func:`key_weight` of the grid and ``head.K``, if already formed."""
    weight = key_weight(grid, head.K) if weight is None else weight
    values = np.maximum(point_values(density, grid), 0.0)
    return np.multiply(values, weight, out=values)


class L2Attention(TiltedMeanField):
    """l2 attention, one head (:class:`L2Head`, or Layers / a callable of them).

    engine, nodes, block : as for :class:`SoftmaxAttention`.
    """

    def __init__(
        self, params: ParamSpec, engine: str = "auto", nodes: int | None = None, block: int = 256
    ):
        super().__init__(engine, nodes, block)
        self.spec = as_param_spec(params)
        self._key_weights = Recent(4)  # fixed while K and the grid are

    def components(self, density, grid: Grid, t: float, offsets, components) -> list[np.ndarray]:
        head = head_at(self.spec, t, L2Head, "l2", grid.ndim)
        coupling = 2.0 * head.K.T @ (head.scale * head.Q)  # c = coupling x
        key = (grid.shape, tuple(grid.lower), tuple(grid.upper), head.K.tobytes())
        weights = reweighted_density(
            density,
            grid,
            head,
            self._key_weights.get_or_make(key, lambda: key_weight(grid, head.K)),
        )
        lattices = [grid.lattice(offset) for offset in offsets]
        self.cut = self._measured(weights, grid, lattices, coupling) if self.measure_cut else None
        return self.shaped(
            self.head_velocities(
                weights, grid, offsets, components, coupling, head.C, support_box(weights, grid)
            ),
            grid,
            offsets,
        )

    def _measured(
        self, weights, grid: Grid, lattices, coupling, shift=None, where=None
    ) -> list[np.ndarray]:
        """The cut (:mod:`.truncation`) of the reweighted density's tilted laws: the
        Gaussian surrogate's for Gaussian-like weights, else the measured one (with the held
        threshold of that cut in ``self.held_cut``); ``where``: the points to measure (the
        others report 1, fully cut)."""
        if gaussian_like(weights, grid):
            self.held_cut = HELD_CUT
            return cut_lattices(weights, grid, lattices, coupling, shift, where)
        self.held_cut = MEASURED_HELD
        direct = self.engine_for(grid) == "direct"
        return measured_cut(weights, grid, lattices, coupling, shift, where, direct)

    def frame_weights(
        self, density, grid: Grid, t: float, frame
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """In the frame ``x = m + L xi``, ``y = m + L eta``: the key weight is
        ``exp(-|K (m + L eta)|^2)``, the tilt ``2 L^T K^T Q L (xi + L^-1 m)`` (the terms in xi
        alone cancel) and ``L^-1 Gamma = L^-1 C m + L^-1 C L m_w`` (docs/theory.md, "The
        co-moving affine frame"). Returns the reweighted frame density ``w`` (grid.shape),
        the coupling ``2 L^T K^T Q L``, the shift ``L^-1 m``, ``L^-1 C L`` and ``L^-1 C m``."""
        head = head_at(self.spec, t, L2Head, "l2", grid.ndim)
        L, inverse, m = frame.matrix, frame.inverse, frame.mean
        coupling = 2.0 * L.T @ head.K.T @ (head.scale * head.Q) @ L
        centres = np.stack(grid.mesh(sparse=False), axis=-1)  # (*cells, d)
        physical = m + centres @ L.T
        weight = np.exp(-np.sum((physical @ np.asarray(head.K, float).T) ** 2, axis=-1))
        weights = reweighted_density(density, grid, head, weight)
        return weights, coupling, inverse @ m, inverse @ head.C @ L, inverse @ head.C @ m

    def frame_components(
        self, density, grid: Grid, t: float, offsets, components, frame
    ) -> list[np.ndarray]:
        """The tilted means of :meth:`frame_weights`, evaluated (and their cut measured) only
        on the windows of the points the frame transports and holds, 0 elsewhere
        (:meth:`TiltedMeanField.on_windows`, as softmax)."""
        weights, coupling, shift, gain, constant = self.frame_weights(density, grid, t, frame)
        lattices = [grid.lattice(offset) for offset in offsets]
        moving = [transported(density, offset) for offset in offsets]
        self.cut = self._measured(weights, grid, lattices, coupling, shift, moving)
        box = support_box(weights, grid)

        def evaluate(sub: list, wanted: list) -> list[np.ndarray]:
            velocity = self.head_velocities(
                weights, grid, None, wanted, coupling, gain, box, None, shift, lattices=sub
            )
            return with_constant(velocity, wanted, constant)

        return self.on_windows(grid, lattices, components, moving, evaluate)
