"""Sinkhorn attention on the grid: the entropic self-transport plan.

docs/theory.md, 'Sinkhorn attention' (the model) and 'Sinkhorn iterations' (on the grid).

The plan of mu with itself for the kernel exp(<A x, y> / eps),

    pi(x, y) = exp((<A x, y> + f(x) + g(y)) / eps) mu(x) mu(y),   pi in Pi(mu, mu),

has potentials f, g fixed by the two marginal conditions; the velocity is the conditional
mean of the plan, mapped by C = W V:

    Gamma(x) = C int y dpi(y | x) = C m_w(A x / eps),   w(y) = e^{g(y)/eps} mu(y),

the tilted mean of the reweighted density (the softmax engines). The potentials
come from log-domain Sinkhorn iterations on the cell centres, each half-step one
log-partition evaluation through the same engines:

    f(x) = -eps log sum_y q_y e^{(<A x, y> + g(y))/eps}   at c = A x / eps,
    g(y) = -eps log sum_x q_x e^{(<A x, y> + f(x))/eps}   at c = A^T y / eps,

with q the normalised quadrature weights of the density: eighth-order point values of the
cell averages (as for l2: g is not an exponential, so the exact cell-average correction of
softmax does not apply; trapezoid sums of smooth integrands are spectrally accurate). The
iteration stops when the marginal error sum_x q_x |e^{(f - f_new)/eps} - 1| (the row
marginal of the current plan against mu, relative to its mass) is below ``tol``. The
potentials of the last evaluation warm-start the next one (the next RK stage sees a nearby
density), and ``iterations`` records the count of every evaluation.
"""

from __future__ import annotations

import numpy as np

from tpde.grid import Grid, profile
from tpde.grid.stencils import point_values

from .engines.direct import support_box
from .parameters import ParamSpec, SinkhornHead, as_param_spec, head_at
from .softmax import TiltedMeanField, with_constant
from .truncation import cut_lattices


class SinkhornError(RuntimeError):
    """The Sinkhorn iterations did not reach the marginal tolerance."""


@profile.timed("velocity.sinkhorn")
def sinkhorn_iterations(
    half_f,
    half_g,
    q: np.ndarray,
    f: np.ndarray,
    g: np.ndarray,
    eps: float,
    tol: float,
    max_iter: int,
):
    """Alternating log-domain Sinkhorn updates f = half_f(g), g = half_g(f) from (f, g).

    Stops when the l1 row-marginal error of the plan (f, g), sum_x q_x |e^{(f - f_new)/eps}
    - 1| over the points with q > 0, is <= tol, or after max_iter updates of f. Shared by the
    grid field and the token system. Returns (f, g, iterations, marginal error).
    """
    mass = q > 0
    count = 0
    while True:
        count += 1
        f_new = half_f(g)
        error = float(np.sum(q[mass] * np.abs(np.expm1((f - f_new)[mass] / eps))))
        f = f_new
        if error <= tol or count == max_iter:
            return f, g, count, error
        g = half_g(f)


def quadrature_weights(density: np.ndarray, grid: Grid) -> np.ndarray:
    """q >= 0 with sum q = 1: point values of the density at the centres, grid.shape."""
    values = np.maximum(point_values(density, grid), 0.0)
    total = values.sum()
    if not total > 0:
        raise ValueError("attention: the density is zero everywhere (no mass on the grid)")
    return values / total


class SinkhornAttention(TiltedMeanField):
    """Sinkhorn attention, one head (:class:`SinkhornHead`, or Layers / a callable of them).

    tol : marginal error at which the iterations stop (default 1e-11).
    max_iter : iterations per evaluation before :class:`SinkhornError` (default 1000).
    warm_start : reuse the potentials of the previous evaluation (default True).
    engine, nodes, block : as for :class:`SoftmaxAttention`.

    After each evaluation ``iterations`` (list) holds the iteration counts so far and
    ``marginal_error`` the error reached by the last one.
    """

    def __init__(
        self,
        params: ParamSpec,
        engine: str = "auto",
        nodes: int | None = None,
        block: int = 256,
        tol: float = 1e-11,
        max_iter: int = 1000,
        warm_start: bool = True,
    ):
        super().__init__(engine, nodes, block)
        if not (np.isfinite(tol) and tol > 0):
            raise ValueError(f"attention.tol: expected a finite number > 0, got {tol}")
        if int(max_iter) < 1:
            raise ValueError(f"attention.max_iter: expected an integer >= 1, got {max_iter}")
        self.spec = as_param_spec(params)
        self.tol = float(tol)
        self.max_iter = int(max_iter)
        self.warm_start = bool(warm_start)
        self.iterations: list[int] = []
        self.marginal_error = np.nan
        self._previous: tuple | None = None  # (shape, A, eps, f, g)

    def reset(self) -> None:
        super().reset()
        self._previous = None

    def potentials(
        self, weights: np.ndarray, grid: Grid, head: SinkhornHead, t: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sinkhorn potentials (f, g) at every cell centre, each (N,) in C order.

        weights: q (grid.shape, sum 1). The formulas define f and g everywhere; only the
        cells with q > 0 enter the sums. Records the iteration count and marginal error.
        """
        eps = head.eps
        q = weights.reshape(-1)
        lattices = [grid.lattice(np.zeros(grid.ndim))]
        forward, backward = head.A / eps, head.A.T / eps
        previous = self._previous
        if (
            self.warm_start
            and previous is not None
            and previous[0] == grid.shape
            and np.array_equal(previous[1], head.A)
            and previous[2] == eps
        ):
            f, g = previous[3].copy(), previous[4].copy()
        else:
            f, g = np.zeros(q.size), np.zeros(q.size)
        mass = q > 0

        def half_step(potential: np.ndarray, matrix: np.ndarray) -> np.ndarray:
            """-eps log sum_s q_s e^{c.y_s + potential_s/eps} at c = matrix x (potential
            shifted by its max)."""
            top = potential[mass].max()
            field = np.where(mass, q * np.exp(np.minimum(potential - top, 0.0) / eps), 0.0)
            sums = self.sums(
                field.reshape(grid.shape), grid, lattices, matrix, fields="log", sheared=True
            )
            return -eps * sums.on_lattice(lattices[0], matrix, 0) - top

        f, g, count, error = sinkhorn_iterations(
            lambda pot: half_step(pot, forward),
            lambda pot: half_step(pot, backward),
            q,
            f,
            g,
            eps,
            self.tol,
            self.max_iter,
        )
        self.iterations.append(count)
        self.marginal_error = error
        if not error <= self.tol:
            raise SinkhornError(
                f"attention.max_iter: Sinkhorn marginal error {error:.2e} > tol {self.tol:.0e} "
                f"after {self.max_iter} iterations at t = {t:.6g}; raise max_iter or tol, or "
                f"increase eps"
            )
        self._previous = (grid.shape, head.A, eps, f, g)
        return f, g

    def components(self, density, grid: Grid, t: float, offsets, components) -> list[np.ndarray]:
        head = head_at(self.spec, t, SinkhornHead, "sinkhorn", grid.ndim)
        return self._velocities(density, grid, t, offsets, components, head)

    def frame_components(
        self, density, grid: Grid, t: float, offsets, components, frame
    ) -> list[np.ndarray]:
        """In the frame ``x = m + L xi``, ``y = m + L eta``: ``<A x, y> = <L^T A L xi, eta>``
        plus terms in xi or eta alone, which the potentials absorb, so the plan in the frame
        is Sinkhorn's for ``L^T A L``, and ``L^-1 Gamma = L^-1 C m + L^-1 C L E[eta | xi]``."""
        head = head_at(self.spec, t, SinkhornHead, "sinkhorn", grid.ndim)
        L, inverse, m = frame.matrix, frame.inverse, frame.mean
        framed = SinkhornHead(L.T @ head.A @ L, inverse @ head.C @ L, eps=head.eps)
        velocity = self._velocities(density, grid, t, offsets, components, framed, shaped=False)
        return self.shaped(with_constant(velocity, components, inverse @ head.C @ m), grid, offsets)

    def _velocities(
        self, density, grid: Grid, t: float, offsets, components, head, shaped: bool = True
    ) -> list[np.ndarray]:
        weights = quadrature_weights(density, grid)
        _, g = self.potentials(weights, grid, head, t)
        g = g.reshape(grid.shape)
        mass = weights > 0
        tilted = np.where(
            mass, weights * np.exp(np.minimum(g - g[mass].max(), 0.0) / head.eps), 0.0
        )
        lattices = [grid.lattice(offset) for offset in offsets]
        self.cut = cut_lattices(tilted, grid, lattices, head.A / head.eps)
        velocity = self.head_velocities(
            tilted, grid, offsets, components, head.A / head.eps, head.C, support_box(weights, grid)
        )
        return self.shaped(velocity, grid, offsets) if shaped else velocity
