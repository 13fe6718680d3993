"""Masked (causal) attention: the velocity at position s averages over the tokens at s' <= s.

docs/theory.md, 'Masked attention' and 'Masked attention on the grid'. Tokens are pairs
(s, x); the density is stored as position
slices, ``density[k]`` the cell averages of slice k (shape ``(S, *grid.shape)``, see
:class:`tpde.grid.Positions`: slice 0 is the attention sink at s = 0). For the normalised
variants

    Gamma(s_k, x) = V sum_{j<=k} int y e^{<A x, y>} rho_j(y) dy
                      / sum_{j<=k} int e^{<A x, y>} rho_j(y) dy,

and for sigmoid and linear attention the unnormalised sums over j <= k. Every numerator and
denominator is linear in the density, so the sums over j <= k are the sums of the
*cumulative density* ``R_k = sum_{j<=k} rho_j`` (a cumulative sum along s), and the masked
velocity on slice k is the unmasked field of ``R_k`` (its normalisation by nu([0, s_k])
cancels for softmax, multi-head and l2). Cost: one evaluation of the unmasked field per
slice, O(S m N_x) with the separable engine, never O(S^2 N_x) (benchmarks/masked.py).

Causality is exact in floating point: ``R_k`` is accumulated in slice order (each partial
sum depends on slices j <= k only) and the field of ``R_k`` reads nothing else, so the
velocity of slices <= k is bit-for-bit independent of the slices after k; each slice has
its own copy of the unmasked field, so a warm start (the adaptive table spacing of the
separable engine) follows that slice's own history. The sink slice
feels its own attention only (``R_0 = rho_0``). Sinkhorn has no causal form here (its plan
couples all tokens both ways) and is refused.
"""

from __future__ import annotations

import copy

import numpy as np

from tpde.grid import Grid
from tpde.schemes.velocity import VelocityField

#: variants with a causal form (the attention registry names)
MASKABLE = ("softmax", "multihead", "l2", "sigmoid", "linear")


class CausalAttention(VelocityField):
    """The causal (masked) version of an attention field over position slices.

    base : the unmasked field (SoftmaxAttention for softmax and multi-head, L2Attention,
        SigmoidAttention or LinearAttention). The density passed to it has shape
        ``(S, *grid.shape)`` (slice 0 the sink); velocities come back as
        ``(d, S, *lattice_shape)`` (one component: ``(S, *lattice_shape)``).
    """

    attention = True

    def __init__(self, base: VelocityField):
        from .sinkhorn import SinkhornAttention

        if isinstance(base, SinkhornAttention):
            raise ValueError(
                "attention.masked: Sinkhorn attention has no causal form (its "
                "plan couples every pair of tokens); use softmax, multihead, l2, "
                "sigmoid or linear"
            )
        if not isinstance(base, VelocityField):
            raise TypeError("attention.masked: expected an attention VelocityField")
        self.base = base
        self.spec = getattr(base, "spec", None)  # layer starts (breakpoints)
        self._slice_fields: list[VelocityField] = []  # one copy of base per slice

    def reset(self) -> None:
        for field in [self.base, *self._slice_fields]:
            field.reset()

    def at(self, density: np.ndarray, grid: Grid, t: float, offset) -> np.ndarray:
        return self.at_many(density, grid, t, [offset])[0]

    def at_many(self, density, grid: Grid, t: float, offsets) -> list[np.ndarray]:
        return self.components(density, grid, t, offsets, [None] * len(offsets))

    def components(self, density, grid: Grid, t: float, offsets, components) -> list[np.ndarray]:
        density = np.asarray(density, float)
        if density.ndim != grid.ndim + 1:
            raise ValueError(
                f"attention.masked: expected position slices, a density of shape "
                f"(S, *{grid.shape}), got {density.shape}"
            )
        cumulative = np.cumsum(density, axis=0)  # R_k = sum_{j<=k} rho_j, in s order
        while len(self._slice_fields) < density.shape[0]:
            self._slice_fields.append(copy.deepcopy(self.base))
        slices = [
            self._slice_fields[k].components(cumulative[k], grid, t, offsets, components)
            for k in range(density.shape[0])
        ]
        # one component: (S, *lattice); all of them: (d, S, *lattice)
        return [
            np.stack([per[i] for per in slices], axis=0 if comp is not None else 1)
            for i, comp in enumerate(components)
        ]
