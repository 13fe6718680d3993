"""The position coordinate of masked (causal) attention: slices in s, an attention sink at 0.

docs/theory.md, 'Masked attention': tokens are pairs (s, x) with a position s in [0, 1]
fixed in time; the token at s attends to the tokens at s' <= s. The position marginal nu is
invariant (no transport along s), and the model is well posed when nu has an atom at s = 0 (a
first token every token attends to: the attention sink, BOS).

Discretisation: ``slices`` positions ``s_k = k / slices`` (k = 1 .. slices), each standing
for the positions in ((k - 1) / slices, k / slices], with nu-mass ``(1 - sink_mass) /
slices``, plus the sink slice ``s_0 = 0`` with mass ``sink_mass``. The state is an array of
shape ``(slices + 1, *grid.shape)``: slice k holds the cell averages of the joint density,
so slice k has mass nu_k and the whole array mass 1. Slice k attends to the slices j <= k
(itself included): the finite model with tokens at the positions s_k, and the mean-field
model with nu = sink_mass delta_0 + (1 - sink_mass) U(0, 1] up to O(1 / slices) in s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .grid import Grid

#: default mass of the attention sink (the slice at s = 0)
SINK_MASS = 0.1


@dataclass(frozen=True)
class Positions:
    """``slices`` positions in (0, 1] plus the sink at s = 0 (module docstring).

    slices : int >= 1; sink_mass : float in (0, 1), default 0.1.
    """

    slices: int
    sink_mass: float = SINK_MASS

    def __post_init__(self) -> None:
        if (
            isinstance(self.slices, bool)
            or not isinstance(self.slices, int | np.integer)
            or self.slices < 1
        ):
            raise ValueError(f"grid.positions: expected an integer >= 1, got {self.slices!r}")
        if not (isinstance(self.sink_mass, int | float) and 0.0 < self.sink_mass < 1.0):
            raise ValueError(
                f"grid.sink_mass: expected a number in (0, 1) (the attention "
                f"sink at s = 0 needs positive mass), got {self.sink_mass!r}"
            )

    @property
    def count(self) -> int:
        """Slices in the state, the sink included: slices + 1."""
        return self.slices + 1

    @property
    def s(self) -> np.ndarray:
        """Positions (slices + 1,): 0 (the sink), then k / slices."""
        return np.arange(self.count) / self.slices

    @property
    def weights(self) -> np.ndarray:
        """nu-mass of each slice (slices + 1,), summing to 1."""
        out = np.full(self.count, (1.0 - self.sink_mass) / self.slices)
        out[0] = self.sink_mass
        return out

    def shape(self, grid: Grid) -> tuple[int, ...]:
        return (self.count,) + grid.shape

    def product(self, density: np.ndarray, grid: Grid) -> np.ndarray:
        """nu x mu: every slice the same law (``density`` of cell averages, normalised to
        mass 1 here) scaled by the slice's nu-mass; shape (slices + 1, *grid.shape)."""
        return self.sliced(lambda s: density, grid)

    def sliced(self, law: Callable[[float], np.ndarray], grid: Grid) -> np.ndarray:
        """Position-dependent data: slice k is ``law(s_k)`` (cell averages on ``grid``,
        normalised to mass 1 here) times nu_k. E.g. a mean drifting with s:
        ``positions.sliced(lambda s: gaussian(grid, m0 + s * drift, cov), grid)``."""
        out = np.empty(self.shape(grid))
        for k, (s, weight) in enumerate(zip(self.s, self.weights, strict=True)):
            density = grid.check_density(law(float(s)), f"initial density at s = {s:g}")
            mass = grid.integrate(density)
            if not mass > 0:
                raise ValueError(f"initial density at s = {s:g}: zero mass in the box")
            out[k] = density * (weight / mass)
        return out

    def marginal(self, density: np.ndarray, grid: Grid) -> np.ndarray:
        """The s-marginal: mass of each slice, (slices + 1,)."""
        return density.reshape(self.count, -1).sum(axis=1) * grid.cell_volume

    def check_density(self, density: np.ndarray, grid: Grid, name: str = "density") -> np.ndarray:
        """float64 array of shape (slices + 1, *grid.shape), finite and >= 0, else ValueError."""
        return grid.check_density(density, name, leading=(self.count,))

    def to_dict(self) -> dict:
        return {"positions": self.slices, "sink_mass": self.sink_mass}
