"""Sigmoid attention on the grid: unnormalised, no Gaussian closure.

docs/theory.md, 'Sigmoid attention' (the model) and 'Sigmoid sums' (the discretisation):

    Gamma(x) = C int sigma(<A x, y> + b) y dmu(y),   sigma(z) = 1 / (1 + e^{-z}),

with C = W V (C = V for one head) and bias b. The kernel is bounded (0 < sigma < 1), so the
sum needs no range shifts; it is evaluated densely as a trapezoid sum over the cells,

    Gamma(x) ~ C sum_s sigma(c . y_s + b) y_s p_s |cell|,   c = A x,

with ``p`` eighth-order point values of the cell averages (``tpde.grid.stencils``): the
integrand is smooth, so the sum is spectrally accurate once the density is resolved (the
naive sum over cell averages has an O(h^2) error). Bound (docs/theory.md, 'Support and speed
bounds'):
|Gamma| <= ||C|| int |y| dmu.

Engine: direct only (a numba loop, O(targets x cells)). sigma(<A x, y> + b) is not a
product of a function of x and one of y, so the separable tables of the exponential
variants do not apply; runs are practical up to about 2-D 48^2. A fast engine is future
work (docs/theory.md, 'Sigmoid sums').
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np

from tpde.grid import Grid
from tpde.grid.stencils import point_values
from tpde.grid.threads import ensure_policy
from tpde.schemes.velocity import VelocityField

from .engines.direct import density_sources
from .parameters import ParamSpec, SigmoidHead, as_param_spec, head_at

JIT: dict[str, Any] = {"cache": True, "error_model": "numpy"}
ENGINES = ("auto", "direct")


@nb.njit(parallel=True, **JIT)
def sigmoid_sums(c, bias, sources, weights, out):
    """out[i] = sum_s sigma(c_i . y_s + bias) y_s w_s; c (P, d), sources (S, d), w (S,)."""
    d = c.shape[1]
    for i in nb.prange(c.shape[0]):
        acc = np.zeros(d)
        for s in range(sources.shape[0]):
            z = bias
            for a in range(d):
                z += c[i, a] * sources[s, a]
            if z >= 0.0:
                sigma = 1.0 / (1.0 + np.exp(-z))
            else:
                e = np.exp(z)
                sigma = e / (1.0 + e)
            weight = sigma * weights[s]
            for a in range(d):
                acc[a] += weight * sources[s, a]
        for a in range(d):
            out[i, a] = acc[a]


class SigmoidAttention(VelocityField):
    """Sigmoid attention, one head (:class:`SigmoidHead`, or Layers / a callable of them).

    engine : "auto" | "direct" (the only engine; module docstring).
    """

    attention = True

    def __init__(self, params: ParamSpec, engine: str = "auto"):
        if engine not in ENGINES:
            raise ValueError(
                f"attention.engine: unknown {engine!r} for sigmoid; choose one of "
                f"{', '.join(ENGINES)}"
            )
        self.spec = as_param_spec(params)
        self.engine = engine

    def at(self, density, grid: Grid, t: float, offset) -> np.ndarray:
        return self.at_many(density, grid, t, [offset])[0]

    def at_many(self, density, grid: Grid, t: float, offsets) -> list[np.ndarray]:
        ensure_policy()  # (its parallel loop may be the first of the process)
        head = head_at(self.spec, t, SigmoidHead, "sigmoid", grid.ndim)
        values = np.maximum(point_values(density, grid), 0.0)
        lattices, points = self.lattice_points(grid, offsets)
        has_mass = bool(np.any(values > 0))  # unnormalised: no mass gives the zero field
        if has_mass:
            sources, weights = density_sources(values * grid.cell_volume, grid)
            sources = np.ascontiguousarray(sources)
        out = []
        for coords, x in zip(lattices, points, strict=True):
            sums = np.zeros_like(x)
            if has_mass:
                sigmoid_sums(np.ascontiguousarray(x @ head.A.T), head.bias, sources, weights, sums)
            velocity = sums @ head.C.T
            out.append(velocity.T.reshape((grid.ndim,) + tuple(len(v) for v in coords)))
        return out
