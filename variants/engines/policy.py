"""The engine policy: which kernel-sum engine and which table serve one request.

A request is a weight field on a grid, the lattices whose tilts ``c = matrix x`` it serves,
the ``fields`` it needs (``"means"``, ``"log"`` or ``"both"``) and whether it will be read
by the sheared passes (``passes``: the velocity tables and the Sinkhorn log tables, served
with ``on_lattice`` on exactly those lattices). :meth:`EnginePolicy.choose` is the decision
table, first match wins (``wanted``: the a-priori nodes per axis refined for the passes,
:func:`~.separable.wanted_nodes`; the cap: ``MAX_NODES[d]``):

=========================  ===========================================  =====================
condition                  choice                                       table
=========================  ===========================================  =====================
engine "direct", or        ``DIRECT``: :class:`~.direct.DirectSums`     none (dense sums)
"auto" and <= 1024 cells
not ``passes``, or a       ``TABLE_FIXED``                              ``nodes`` or
user's ``nodes``                                                        :func:`table_nodes`,
                                                                        pointwise stencils
fields "means" / "log",    ``TABLE_ADAPTIVE``: :func:`resolved_sums`,   a posteriori, warm-
2-D / 3-D, not remembered  warm-started from the last spacing; where    started; sheared
as ``TABLE_POINTWISE``     the passes miss the tolerance under the
                           cap: ``TABLE_POINTWISE`` (remembered)
``wanted`` <= cap          ``TABLE_SHEARED`` (1-D; fields "both")       a priori, refined and
                                                                        padded for the passes
otherwise (the cap binds)  ``TABLE_POINTWISE``                          :func:`table_nodes`
                                                                        (capped), pointwise
=========================  ===========================================  =====================

The policy owns the only state of the choice, the warm start ``warm``: per grid shape,
matrix and fields, the adaptive table's node spacing, or ``TABLE_POINTWISE`` for a request
whose passes could not be resolved under the cap (it is not tried again).
:meth:`EnginePolicy.reset` forgets it (the field's ``reset``, called by the solver at every
snapshot: a run resumed from a snapshot then chooses as the uninterrupted run did).
``last`` records the choice that served the last request. The FFT engine (symmetric A,
softmax only, never chosen by "auto") is not a kernel-sum engine: softmax asks it directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import numpy as np

from tpde.grid import Grid

from .cache import Recent
from .direct import DIRECT_BLOCK, DirectSums, support_box
from .separable import MAX_NODES, SeparableSums, resolved_sums, table_nodes, wanted_nodes

#: "auto" takes the dense sums up to this many cells (32^2), the tables above
DIRECT_MAX_CELLS = 1024


def warm_key(grid: Grid, matrix: np.ndarray, fields: str) -> tuple:
    """The warm start's key: the grid, the fields and the matrix to one decimal, so that a
    matrix that drifts (the co-moving frame's L^T A L, changed at every stage) keeps its
    warm start while different matrices (heads, layers) keep theirs. A warm start is only
    a first guess: resolved_sums accepts a table by its error estimate alone."""
    return (grid.shape, np.round(matrix, 1).tobytes(), fields)


class Choice(Enum):
    """What serves a request (:class:`EnginePolicy`, module docstring)."""

    DIRECT = "direct sums"
    TABLE_FIXED = "fixed table, pointwise"
    TABLE_ADAPTIVE = "adaptive table, sheared passes"
    TABLE_SHEARED = "a-priori table, sheared passes"
    TABLE_POINTWISE = "capped table, pointwise"


def tilt_bounds(lattices: Sequence[Sequence[np.ndarray]], matrix: np.ndarray) -> np.ndarray:
    """(d, 2) lower / upper ``c = matrix x`` over the boxes of the ``lattices``."""
    lower = np.min([[axis.min() for axis in coords] for coords in lattices], axis=0)
    upper = np.max([[axis.max() for axis in coords] for coords in lattices], axis=0)
    mesh = np.meshgrid(*zip(lower, upper, strict=True), indexing="ij")
    corners = np.stack(mesh, axis=-1).reshape(-1, len(lower)) @ matrix.T
    return np.stack([corners.min(axis=0), corners.max(axis=0)], axis=1)


class EnginePolicy:
    """The engine choice of one field (module docstring): engine "auto" | "direct" |
    "separable"; nodes: fixed table nodes per axis (None: automatic); block: targets per
    block of the dense sums."""

    def __init__(self, engine: str = "auto", nodes: int | None = None, block: int = DIRECT_BLOCK):
        self.engine, self.nodes, self.block = engine, nodes, int(block)
        self.warm: Recent = Recent(8)  # (shape, matrix, fields) -> spacing | TABLE_POINTWISE
        self.last: Choice | None = None

    def reset(self) -> None:
        """Forget the warm starts: the next request is served as by a fresh policy."""
        self.warm.clear()

    def engine_for(self, grid: Grid) -> str:
        if self.engine != "auto":
            return self.engine
        return "direct" if grid.size <= DIRECT_MAX_CELLS else "separable"

    def choose(
        self, grid: Grid, fields: str, passes: bool, matrix: np.ndarray, bounds, extent
    ) -> Choice:
        """The decision table, before an adaptive table is tried."""
        if self.engine_for(grid) == "direct":
            return Choice.DIRECT
        if not passes or self.nodes is not None:
            return Choice.TABLE_FIXED
        capped = self.warm.get(warm_key(grid, matrix, fields)) is Choice.TABLE_POINTWISE
        if fields in ("means", "log") and grid.ndim in (2, 3) and not capped:
            return Choice.TABLE_ADAPTIVE
        if np.all(wanted_nodes(bounds, extent, matrix) <= MAX_NODES[grid.ndim]):
            return Choice.TABLE_SHEARED
        return Choice.TABLE_POINTWISE

    def sums(
        self,
        weights: np.ndarray,
        grid: Grid,
        lattices: Sequence[Sequence[np.ndarray]],
        matrix: np.ndarray,
        fields: str = "means",
        passes: bool = False,
    ) -> DirectSums | SeparableSums:
        """The engine of ``weights`` for tilts ``matrix x``, x on ``lattices``: DirectSums
        or SeparableSums (``means(c)``, ``log_partition(c)``, ``on_lattice``,
        ``velocity_table``). Raises ValueError where no cell holds mass."""
        low, high = support_box(weights, grid)
        bounds, extent = tilt_bounds(lattices, matrix), high - low
        choice = self.choose(grid, fields, passes, matrix, bounds, extent)
        if choice is Choice.TABLE_ADAPTIVE:
            key = warm_key(grid, matrix, fields)
            # tolerance: of the means' size (the support radius); of log M absolutely
            scale = float(np.abs([low, high]).max()) if fields == "means" else 1.0
            step = self.warm.pop(key, None)
            args = (weights, grid, bounds, extent, scale, matrix, lattices, step, fields)
            sums, step = resolved_sums(*args)
            self.warm[key] = Choice.TABLE_POINTWISE if sums is None else step
            if sums is not None:
                self.last = choice
                return sums
            choice = Choice.TABLE_POINTWISE
        self.last = choice
        if choice is Choice.DIRECT:
            return DirectSums(weights, grid, self.block, fields)
        if choice is Choice.TABLE_SHEARED:
            refined = table_nodes(bounds, extent, matrix)
            return SeparableSums(weights, grid, bounds, refined, fields, matrix, lattices, extent)
        nodes = table_nodes(bounds, extent) if self.nodes is None else self.nodes
        return SeparableSums(weights, grid, bounds, nodes, fields)
