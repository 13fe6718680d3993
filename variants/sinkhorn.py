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
iteration stops when the marginal error sum_y q_y |e^{(g - G)/eps} - 1| (the column
marginal of the plan (f, g), f = half_f(g), against mu; G = half_g(f)) is below ``tol``.
``iterations`` records the count of every evaluation.

Fewer iterations (docs/theory.md, 'Sinkhorn iterations'): the iterations are a fixed-point
map ``g -> half_g(half_f(g))``, accelerated by Anderson mixing over the last ANDERSON_MEMORY
secants (a restart wherever the marginal error grows), the secants kept from one evaluation
to the next; each evaluation starts from the potentials of the earlier ones at the nearest
times, interpolated or extrapolated linearly in t to its own (the RK stages of a step sit at
t, t + dt, t + dt/2: the start is then O(dt^2) from the answer instead of O(dt)). The warm
start holds across a change of A (the co-moving frame changes it every step); it is dropped
by :meth:`SinkhornAttention.reset`.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tpde.grid import Grid, profile
from tpde.grid.stencils import point_values
from tpde.schemes.frame import transported

from .engines.direct import support_box
from .parameters import ParamSpec, SinkhornHead, as_param_spec, head_at
from .softmax import TiltedMeanField, with_constant


class SinkhornError(RuntimeError):
    """The Sinkhorn iterations did not reach the marginal tolerance."""


#: secants mixed by the Anderson acceleration of :func:`sinkhorn_iterations` (0: plain
#: alternating updates). 2-D 256^2 c1 run, eps = 1, secants kept, mean iterations per stage:
#: 5.1 with 2, 4.2 with 3, 3.3 with 4, 2.8 with 6, 2.6 with 8 (eps 0.5: 7.3, 4.3, 4.0 with
#: 3, 6, 8); 10.1 plain with the same warm starts. Memory: 2 m doubles per cell
ANDERSON_MEMORY = 8
#: Tikhonov term of the mixing's normal equations, relative to their diagonal
ANDERSON_REGULARISATION = 1e-10
#: evaluations kept for the warm start, and how far (in units of the spacing of the two
#: nearest) their line is extrapolated in t (SSP-RK3: the second stage lies 2 spacings out)
WARM_HISTORY = 3
WARM_REACH = 2.5
#: keep the secants of an evaluation for the next (with a warm start): 4.2 instead of 5.0
#: iterations per stage with 3 secants
CARRY_SECANTS = True


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
    memory: int | None = None,
    secants: Secants | None = None,
):
    """Log-domain Sinkhorn iterations from the potential g: each one ``F = half_f(g)``
    (the rows of the plan (F, g) exact), ``G = half_g(F)``, and the next g.

    The plan (F, g) has the l1 column-marginal error sum_y q_y |e^{(g - G)/eps} - 1| over
    the points with q > 0; the iterations stop when it is <= tol, or after max_iter, and
    return (F, g, iterations, that error). Plain Sinkhorn takes g = G next; with ``memory``
    (default ANDERSON_MEMORY) > 0 the next g is the Anderson mixture (:class:`Secants`) of
    G with the last ``memory`` secants (the differences of consecutive G and of their
    residuals sqrt(q) (G - g)), and after a growth of the error a plain step with the
    secants dropped. ``secants``: those of earlier evaluations, kept by the caller (they
    describe the Jacobian of a nearby map; default none). ``f`` (the caller's previous
    potential) is not needed: the iterations start from g. Shared by the grid field and the
    token system.
    """
    q = np.ascontiguousarray(q, dtype=float)
    root = np.sqrt(q)
    memory = ANDERSON_MEMORY if memory is None else memory
    if secants is None or secants.shape != (max(memory, 0), q.size):
        secants = Secants(memory, q.size)
    residual = np.empty(q.size)
    last: tuple[np.ndarray, np.ndarray] | None = None  # the previous G and its residual
    previous = np.inf
    count = 0
    while True:
        count += 1
        f = half_f(g)
        image = half_g(f)
        error = _marginal_step(g, image, q, root, float(eps), residual)
        if error <= tol or count == max_iter:
            return f, g, count, error
        if not error < previous:  # restart: a plain step, no secants
            secants.clear()
            last = None
        elif last is not None:
            secants.add(image - last[0], residual - last[1])
        previous = error
        last = (image, residual.copy())
        g = secants.mix(image, residual)


class Secants:
    """The last ``memory`` secant pairs (dG, dR) of the Anderson mixing (type II): the next
    iterate is ``G - dG gamma`` with gamma minimising ``|R - dR gamma|`` (normal equations,
    a relative Tikhonov term ANDERSON_REGULARISATION)."""

    def __init__(self, memory: int, size: int):
        self.shape = (max(int(memory), 0), int(size))
        self.dg = np.empty(self.shape)
        self.dr = np.empty(self.shape)
        self.count = 0
        self.next = 0

    def clear(self) -> None:
        self.count = self.next = 0

    def add(self, dg: np.ndarray, dr: np.ndarray) -> None:
        if not self.shape[0]:
            return
        self.dg[self.next], self.dr[self.next] = dg, dr
        self.next = (self.next + 1) % self.shape[0]
        self.count = min(self.count + 1, self.shape[0])

    def mix(self, image: np.ndarray, residual: np.ndarray) -> np.ndarray:
        """The mixed iterate (``image`` itself without secants or if the system fails)."""
        k = self.count
        if not k:
            return image
        dr, dg = self.dr[:k], self.dg[:k]
        gram = dr @ dr.T
        diagonal = np.diag_indices(k)
        gram[diagonal] *= 1.0 + ANDERSON_REGULARISATION
        gram[diagonal] += 1e-300
        try:
            gamma = np.linalg.solve(gram, dr @ residual)
        except np.linalg.LinAlgError:
            return image
        if not np.all(np.isfinite(gamma)):
            return image
        return image - gamma @ dg


@nb.njit(cache=True, error_model="numpy")
def _marginal_step(g, image, q, root, eps, residual):
    """residual = sqrt(q) (image - g), 0 where q = 0; returns sum_q>0 q |e^{(g - image)/eps}
    - 1| (sequential: the same sum on any number of threads)."""
    error = 0.0
    for i in range(g.size):
        if q[i] > 0:
            step = image[i] - g[i]
            residual[i] = root[i] * step
            error += q[i] * abs(np.expm1(-step / eps))
        else:
            residual[i] = 0.0
    return error


@nb.njit(cache=True, error_model="numpy")
def tilted_field(potential, q, eps, out):
    """out = q e^{(potential - top)/eps} where q > 0 (else 0), top the largest potential
    there (the exponents <= 0; returns top)."""
    top = -np.inf
    for i in range(q.size):
        if q[i] > 0 and potential[i] > top:
            top = potential[i]
    for i in range(q.size):
        out[i] = q[i] * np.exp(min(potential[i] - top, 0.0) / eps) if q[i] > 0 else 0.0
    return top


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
    warm_start : start from the potentials of earlier evaluations, at the nearest times,
        linear in t (default True; module docstring).
    engine, nodes, block : as for :class:`SoftmaxAttention`.

    After each evaluation ``iterations`` (list) holds the iteration counts so far and
    ``marginal_error`` the error reached by the last one.
    """

    engine_variant = "sinkhorn"

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
        #: (grid shape, eps, [(t, g), ...]) of the last WARM_HISTORY evaluations
        self._previous: tuple | None = None
        self._secants: Secants | None = None

    def reset(self) -> None:
        super().reset()
        self._previous = None
        self._secants = None

    def warm_potential(self, shape: tuple, eps: float, t: float) -> np.ndarray | None:
        """The start of the iterations at time ``t`` (module docstring): from the earlier
        evaluations on this grid and eps, the one nearest in t, and where another lies at a
        different time, the line through the two nearest evaluated at t (no farther than
        WARM_REACH of their spacing); None without one."""
        previous = self._previous
        if not self.warm_start or previous is None or previous[:2] != (shape, eps):
            return None
        # nearest first; among equally near, the latest
        entries = sorted(reversed(previous[2]), key=lambda entry: abs(entry[0] - t))
        (t1, g1), others = entries[0], entries[1:]
        times = [entry[0] for entry in entries] + [t]
        close = 1e-6 * (max(times) - min(times))  # (stage times carry rounding)
        if abs(t1 - t) <= close:
            return g1.copy()
        for t0, g0 in others:
            if abs(t1 - t0) > close:
                step = (t - t1) / (t1 - t0)
                if abs(step) <= WARM_REACH:
                    return g1 + step * (g1 - g0)
                break
        return g1.copy()

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
        g = self.warm_potential(grid.shape, eps, t)
        secants = self._secants if g is not None and CARRY_SECANTS else None
        if secants is None or secants.shape != (ANDERSON_MEMORY, q.size):
            secants = Secants(ANDERSON_MEMORY, q.size)
        f, g = np.zeros(q.size), (np.zeros(q.size) if g is None else g)

        def half_step(potential: np.ndarray, matrix: np.ndarray) -> np.ndarray:
            """-eps log sum_s q_s e^{c.y_s + potential_s/eps} at c = matrix x (potential
            shifted by its max)."""
            field = np.empty(q.size)  # (new each time: the engines may keep it)
            top = tilted_field(potential, q, eps, field)
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
            secants=secants,
        )
        self._secants = secants
        self.iterations.append(count)
        self.marginal_error = error
        if not error <= self.tol:
            raise SinkhornError(
                f"attention.max_iter: Sinkhorn marginal error {error:.2e} > tol {self.tol:.0e} "
                f"after {self.max_iter} iterations at t = {t:.6g}; raise max_iter or tol, or "
                f"increase eps"
            )
        history = self._previous[2] if self._previous is not None else []
        if self._previous is None or self._previous[:2] != (grid.shape, eps):
            history = []
        self._previous = (grid.shape, eps, [*history, (float(t), g)][-WARM_HISTORY:])
        return f, g

    def components(self, density, grid: Grid, t: float, offsets, components) -> list[np.ndarray]:
        head = head_at(self.spec, t, SinkhornHead, "sinkhorn", grid.ndim)
        tilted, box = self.plan_weights(density, grid, t, head)
        velocity = self.head_velocities(
            tilted, grid, offsets, components, head.A / head.eps, head.C, box
        )
        return self.shaped(velocity, grid, offsets)

    def frame_components(
        self, density, grid: Grid, t: float, offsets, components, frame
    ) -> list[np.ndarray]:
        """In the frame ``x = m + L xi``, ``y = m + L eta``: ``<A x, y> = <L^T A L xi, eta>``
        plus terms in xi or eta alone, which the potentials absorb, so the plan in the frame
        is Sinkhorn's for ``L^T A L``, and ``L^-1 Gamma = L^-1 C m + L^-1 C L E[eta | xi]``.

        The potentials come from the cells alone (:meth:`plan_weights`); the conditional
        means are evaluated only on the windows of the points the frame transports, 0
        elsewhere (:meth:`TiltedMeanField.on_windows`, as softmax and l2; Sinkhorn measures
        no cut, so every transported point counts as held)."""
        head = head_at(self.spec, t, SinkhornHead, "sinkhorn", grid.ndim)
        L, inverse, m = frame.matrix, frame.inverse, frame.mean
        framed = SinkhornHead(L.T @ head.A @ L, inverse @ head.C @ L, eps=head.eps)
        tilted, box = self.plan_weights(density, grid, t, framed)
        lattices = [grid.lattice(offset) for offset in offsets]
        moving = [transported(density, offset) for offset in offsets]
        constant = inverse @ head.C @ m

        def evaluate(sub: list, wanted: list) -> list[np.ndarray]:
            velocity = self.head_velocities(
                tilted, grid, None, wanted, framed.A / framed.eps, framed.C, box, lattices=sub
            )
            return with_constant(velocity, wanted, constant)

        return self.on_windows(grid, lattices, components, moving, evaluate)

    def plan_weights(
        self, density, grid: Grid, t: float, head: SinkhornHead
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """The weights ``w = q e^{g/eps}`` (grid.shape, shifted by the largest g where q > 0)
        whose tilted means at ``c = A x / eps`` are the plan's conditional means, from the
        potentials at time ``t`` (:meth:`potentials`, on the cell centres), and the support
        box of ``q``."""
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
        return tilted, support_box(weights, grid)
