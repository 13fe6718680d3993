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

Engines (O(targets x cells) both: sigma(<A x, y> + b) is not a product of a function of x
and one of y, so the separable tables of the exponential variants do not apply):

* ``lattice`` (``auto`` takes it): the targets of a velocity lattice lie on rows
  ``c_i = c_0 + i A h e_d``, along which ``e^{-z}`` is a geometric sequence per cell, so a
  pair costs a product and a division instead of an exponential
  (:func:`sigmoid_lattice_sums`); exact to round-off while ``|z| <= RECURRENCE_RANGE``.
  Cells holding together at most ``NEGLIGIBLE_SHARE`` of ``sum w |y|`` are left out
  (:func:`significant_sources`).
* ``direct``: one exponential per pair (:func:`sigmoid_sums`), any targets; ``auto`` falls
  back to it beyond that range.

docs/theory.md, 'Sigmoid sums', says why no sub-quadratic engine exact to the sums exists
here yet.
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
from .engines.registry import check_engine, engine_names
from .parameters import ParamSpec, SigmoidHead, as_param_spec, head_at

JIT: dict[str, Any] = {"cache": True, "error_model": "numpy"}
#: the engine names sigmoid takes (:data:`~.engines.registry.CONFIG_ENGINES`)
ENGINES = engine_names("flat", "sigmoid")


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


#: the largest |c . y + bias| the lattice recurrence carries: E = e^{-z} stays a normal
#: float64 (e^{+-700} within 1e-304 .. 1e304), so no factor under- or overflows
RECURRENCE_RANGE = 700.0


@nb.njit(parallel=True, fastmath={"reassoc", "contract"}, **JIT)
def sigmoid_lattice_sums(c_start, c_step, inner, bias, sources, weights, out):
    """out[r, i] = sum_s sigma(c_{r,i} . y_s + bias) w_s on a lattice of targets
    c_{r,i} = c_start[r] + i c_step (r: rows of the lattice, i = 0 .. inner - 1 along its
    last axis); c_start (R, d), sources (S, d), weights (S,) (any sign: a component of
    C y_s times the cell's mass), out (R, inner).

    Along a row E_s = e^{-z} obeys E_{s,i+1} = E_{s,i} q_s with q_s = e^{-c_step . y_s}, so
    sigma = 1 / (1 + E) costs a product and a division per pair instead of an exponential;
    a row's E starts from its exponential (the rounding of i products stays below
    i ulps). Exact to round-off when |z| <= RECURRENCE_RANGE at every pair (the caller
    checks; beyond it a factor could underflow and stop following z). Four targets share a
    pass over the sources (one load of E, q and w per four pairs)."""
    rows, d = c_start.shape
    count = sources.shape[0]
    q = np.empty(count)
    for s in range(count):
        z = 0.0
        for a in range(d):
            z += c_step[a] * sources[s, a]
        q[s] = np.exp(-z)
    for r in nb.prange(rows):
        e = np.empty(count)
        for s in range(count):
            z = bias
            for a in range(d):
                z += c_start[r, a] * sources[s, a]
            e[s] = np.exp(-z)
        i = 0
        while i < inner:
            a0 = a1 = a2 = a3 = 0.0
            for s in range(count):
                e0 = e[s]
                e1 = e0 * q[s]
                e2 = e1 * q[s]
                e3 = e2 * q[s]
                e[s] = e3 * q[s]
                a0 += weights[s] / (1.0 + e0)
                a1 += weights[s] / (1.0 + e1)
                a2 += weights[s] / (1.0 + e2)
                a3 += weights[s] / (1.0 + e3)
            block = min(4, inner - i)  # (at the row's end the last factors ran past it)
            sums = (a0, a1, a2, a3)
            for k in range(block):
                out[r, i + k] = sums[k]
            i += 4


#: the share of sum_s w_s |y_s| the smallest cells may hold and be left out of the lattice
#: engine's sums: the round-off of the sums themselves (sigma <= 1, so leaving them out moves
#: every sum by at most this share of that scale)
NEGLIGIBLE_SHARE = 1e-15


def significant_sources(
    sources: np.ndarray, weights: np.ndarray, share: float = NEGLIGIBLE_SHARE
) -> tuple[np.ndarray, np.ndarray]:
    """The cells without the smallest ones whose ``sum w |y|`` stays within ``share`` of the
    total (sources (S, d), weights (S,) > 0): a clustered law's empty tails cost no pairs."""
    size = weights * np.sqrt((sources * sources).sum(axis=1))
    order = np.argsort(size)
    dropped = int(np.searchsorted(np.cumsum(size[order]), share * size.sum(), side="right"))
    if dropped == 0:
        return sources, weights
    kept = np.sort(order[dropped:])  # (the cells' order: the sums' rounding as before)
    return sources[kept], weights[kept]


class SigmoidAttention(VelocityField):
    """Sigmoid attention, one head (:class:`SigmoidHead`, or Layers / a callable of them).

    engine : "auto" | "lattice" | "direct" (module docstring).
    """

    attention = True

    def __init__(self, params: ParamSpec, engine: str = "auto"):
        self.engine = check_engine(engine, "flat", "sigmoid")
        self.spec = as_param_spec(params)

    def _recurrence(self, c: np.ndarray, sources: np.ndarray, bias: float, coords) -> bool:
        """Whether this lattice's sums go through :func:`sigmoid_lattice_sums`: engine
        "lattice" or "auto", two or more points along the last axis, and every
        |c . y + bias| within RECURRENCE_RANGE (bounded by |c| |y| + |bias|)."""
        if self.engine == "direct" or len(coords[-1]) < 2:
            return False
        reach = float(np.sqrt((c * c).sum(axis=1).max() * (sources * sources).sum(axis=1).max()))
        if reach + abs(bias) <= RECURRENCE_RANGE:
            return True
        if self.engine == "lattice":
            raise ValueError(
                f'attention.engine = "lattice": |<A x, y> + b| reaches {reach + abs(bias):.3g} '
                f'> {RECURRENCE_RANGE:g} on this grid; use engine = "auto" or "direct"'
            )
        return False

    def at(self, density, grid: Grid, t: float, offset) -> np.ndarray:
        return self.at_many(density, grid, t, [offset])[0]

    def at_many(self, density, grid: Grid, t: float, offsets) -> list[np.ndarray]:
        return self.components(density, grid, t, offsets, [None] * len(offsets))

    def components(self, density, grid: Grid, t: float, offsets, components) -> list[np.ndarray]:
        """Component ``components[i]`` (None: all) of the velocity on the lattice
        ``offsets[i]``: one sum per component, ``sum_s sigma(c . y_s + b) (C y_s)_a w_s``."""
        ensure_policy()  # (its parallel loop may be the first of the process)
        head = head_at(self.spec, t, SigmoidHead, "sigmoid", grid.ndim)
        values = np.maximum(point_values(density, grid), 0.0)
        lattices, points = self.lattice_points(grid, offsets)
        out = []
        if not np.any(values > 0):  # unnormalised: no mass gives the zero field
            for coords, component in zip(lattices, components, strict=True):
                lead = (grid.ndim,) if component is None else ()
                out.append(np.zeros(lead + tuple(len(v) for v in coords)))
            return out
        sources, weights = density_sources(values * grid.cell_volume, grid)
        if self.engine != "direct":
            sources, weights = significant_sources(sources, weights)
        sources = np.ascontiguousarray(sources)
        mapped = sources @ head.C.T  # C y_s
        for coords, x, component in zip(lattices, points, components, strict=True):
            c = np.ascontiguousarray(x @ head.A.T)
            shape = tuple(len(v) for v in coords)
            wanted = range(grid.ndim) if component is None else [component]
            if self._recurrence(c, sources, head.bias, coords):
                rows = (len(c) // shape[-1], shape[-1])
                step = head.A[:, -1] * (coords[-1][1] - coords[-1][0])
                starts = np.ascontiguousarray(c.reshape(rows + (grid.ndim,))[:, 0])
                parts = []
                for a in wanted:
                    sums = np.empty(rows)
                    sigmoid_lattice_sums(
                        starts,
                        step,
                        rows[1],
                        head.bias,
                        sources,
                        np.ascontiguousarray(weights * mapped[:, a]),
                        sums,
                    )
                    parts.append(sums.reshape(shape))
                velocity = np.stack(parts)
            else:
                sums = np.zeros_like(x)
                sigmoid_sums(c, head.bias, sources, weights, sums)
                velocity = (sums @ head.C.T).T.reshape((grid.ndim,) + shape)[list(wanted)]
            out.append(velocity if component is None else velocity[0])
        return out
