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
marginal of the current plan against mu, relative to its mass) is below ``tol``.
``iterations`` records the count of every evaluation.

Fewer iterations (docs/theory.md, 'Sinkhorn iterations'): the iterations are a fixed-point
map ``g -> half_g(half_f(g))``, accelerated by Anderson mixing of the last ANDERSON_MEMORY
iterates (a restart wherever the marginal error grows), and each evaluation starts from the
potentials of the earlier ones at the nearest times, interpolated or extrapolated linearly
in t to its own (the RK stages of a step sit at t, t + dt, t + dt/2: the start is then
O(dt^2) from the answer instead of O(dt)). The warm start holds across a change of A (the
co-moving frame changes it every step); it is dropped by :meth:`SinkhornAttention.reset`.
"""

from __future__ import annotations

import numpy as np

from tpde.grid import Grid, profile
from tpde.grid.stencils import point_values

from .engines.direct import support_box
from .parameters import ParamSpec, SinkhornHead, as_param_spec, head_at
from .softmax import TiltedMeanField, with_constant


class SinkhornError(RuntimeError):
    """The Sinkhorn iterations did not reach the marginal tolerance."""


#: iterates mixed by the Anderson acceleration of :func:`sinkhorn_iterations` (0: plain
#: alternating updates). 2-D 256^2 c1 stage, warm start: 13 plain iterations, 6 with 3, 5
#: or 8 (3 the cheapest: benchmarks/step.py)
ANDERSON_MEMORY = 3
#: Tikhonov term of the mixing's normal equations, relative to their diagonal
ANDERSON_REGULARISATION = 1e-10


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
    memory: int = ANDERSON_MEMORY,
):
    """Log-domain Sinkhorn iterations from the potential g: each one ``F = half_f(g)``
    (the rows of the plan (F, g) exact), ``G = half_g(F)``, and the next g.

    The plan (F, g) has the l1 column-marginal error sum_y q_y |e^{(g - G)/eps} - 1| over
    the points with q > 0; the iterations stop when it is <= tol, or after max_iter, and
    return (F, g, iterations, that error). Plain Sinkhorn takes g = G next; with ``memory``
    > 0 the next g is the Anderson mixture of the last ``memory + 1`` values of G whose
    residuals G - g (weighted by sqrt(q)) combine to the smallest norm (type II, normal
    equations), restarted from g = G wherever the error grew. ``f`` (the caller's previous
    potential) is not needed: the iterations start from g. Shared by the grid field and the
    token system.
    """
    mass = q > 0
    weights = q[mass]
    root = np.sqrt(weights)
    images: list[np.ndarray] = []  # G of recent iterations (every point)
    residuals: list[np.ndarray] = []  # their sqrt(q) (G - g) on the points with mass
    previous = np.inf
    count = 0
    while True:
        count += 1
        f = half_f(g)
        image = half_g(f)
        step = image[mass] - g[mass]
        error = float(np.sum(weights * np.abs(np.expm1(-step / eps))))
        if error <= tol or count == max_iter:
            return f, g, count, error
        if memory <= 0 or not error < previous:  # plain step, history restarted
            images.clear()
            residuals.clear()
        previous = error
        images.append(image)
        residuals.append(root * step)
        if len(images) > memory + 1:
            images.pop(0)
            residuals.pop(0)
        g = anderson_mixture(images, residuals) if len(images) > 1 else image


def anderson_mixture(images: list[np.ndarray], residuals: list[np.ndarray]) -> np.ndarray:
    """The type-II Anderson iterate: ``images[-1] - dG gamma`` with gamma minimising
    ``|residuals[-1] - dR gamma|`` (dG, dR: the differences of consecutive entries)."""
    dr = np.stack([b - a for a, b in zip(residuals[:-1], residuals[1:], strict=True)], axis=1)
    gram = dr.T @ dr
    gram[np.diag_indices_from(gram)] *= 1.0 + ANDERSON_REGULARISATION
    gram[np.diag_indices_from(gram)] += 1e-300
    try:
        gamma = np.linalg.solve(gram, dr.T @ residuals[-1])
    except np.linalg.LinAlgError:
        return images[-1]
    if not np.all(np.isfinite(gamma)):
        return images[-1]
    out = images[-1].copy()
    for k, weight in enumerate(gamma):
        out -= weight * (images[k + 1] - images[k])
    return out


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
        # no cut: the conditional law of the plan, N(E[y|x], Sigma - C^T Sigma^-1 C) for
        # Gaussians, stays inside the measure's own support, which the edge mass watches
        # (a surrogate from the weights q e^(g/eps) would be far too wide)
        velocity = self.head_velocities(
            tilted, grid, offsets, components, head.A / head.eps, head.C, support_box(weights, grid)
        )
        return self.shaped(velocity, grid, offsets) if shaped else velocity
