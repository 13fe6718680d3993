"""Softmax (and multi-head softmax) attention on the grid; linear attention from moments.

Velocity (docs/theory.md, 'Softmax attention' and 'Multi-head attention'; A = K^T Q, kernel
exp(<A x, y>)):

    Gamma(x) = sum_h C_h m(A_h x),   m(c) = int y e^{c.y} dmu(y) / int e^{c.y} dmu(y),

``C_h = W_h V_h`` (``C = V`` for one head): ``m(c)`` is the mean of the exponentially tilted
law, the gradient of the cumulant generating function ``log int e^{c.y} dmu``.

Cell averages, exactly (docs/theory.md, 'Exact cell-average correction'). The density is
known by its cell averages ``rho_bar = B * rho`` (``B`` the cell box filter). Since
``B * e^{c.y} = S(c) e^{c.y}`` with ``S(c) = prod_a sinh(c_a h_a / 2) / (c_a h_a / 2)`` and
``B * (y e^{c.y}) = (y + grad log S(c)) S(c) e^{c.y}``, the midpoint sums over cell averages
give the point-value integrals once the mean is shifted back:

    m(c) = sum_s rho_bar_s y_s e^{c.y_s} / sum_s rho_bar_s e^{c.y_s}  -  grad log S(c),
    d/dc_a log S = (h_a / 2) coth(c_a h_a / 2) - 1 / c_a   (= c_a h_a^2 / 12 + O(c^3 h^4)).

The remaining error is the trapezoid error of a smooth, decaying integrand: spectrally small
for a resolved density (the naive sum has an O(h^2) error).

Engines (``engine=``):

* ``"direct"``: :mod:`tpde.variants.engines.direct` evaluates the sums densely, blocked over
  targets, with each row's exponents shifted by its maximum (every term <= 1, all terms
  positive: relative accuracy ~ n eps however small the sums are; no overflow, no NaN where
  the density underflows). The exact reference, O(targets x sources): up to about 2-D 64^2.
* ``"separable"``: :mod:`tpde.variants.engines.separable`, the moment-generating function on a
  tensor grid of ``c`` by one matrix product per axis, interpolated to ``c = A x``;
  ``O(m N^d)``. Measured against the direct engine (tests/test_engines.py): 1e-15..1e-11
  on Gaussians and two-bump mixtures in 1-D, 2-D and 3-D.
* ``"fft"`` (symmetric A only): :mod:`tpde.variants.engines.fft`, convolutions; absolute accuracy
  only (measured on two bumps at 48^2: 1e-15 for A = s [[1, .3], [.3, .8]] with s <= 0.5,
  lost sums for s = 2 or a negative-definite A), so never chosen automatically.
* ``"auto"`` (default): direct up to 1024 cells (32^2), separable above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from tpde.grid import Grid, moments, raw_moment
from tpde.schemes.atom_run import identity_frame
from tpde.schemes.frame import ACTIVE_FLOOR, HELD_CUT, transported
from tpde.schemes.velocity import VelocityField

from .engines.cache import Recent
from .engines.direct import (
    DirectSums,
    component_bounds,
    grad_log_box_factor,
    lattice_tilts,
    support_box,
)
from .engines.fft import FFTSoftmaxSums, checked_total
from .engines.policy import Choice, EnginePolicy
from .engines.registry import check_engine, engine_names
from .engines.separable import SeparableSums
from .flat_atoms import atom_field, log_box_factor, mixture_means
from .parameters import Head, ParamSpec, as_param_spec, params_at
from .truncation import MEASURED_HELD, cut_lattices, gaussian_like, held_window, measured_cut

#: the warm start's mark of a grid and matrix whose tables the sheared passes could not
#: resolve under the node cap (interpolated pointwise from then on): EnginePolicy.warm
POINTWISE = Choice.TABLE_POINTWISE


def _heads(params) -> list[Head]:
    heads = [params] if isinstance(params, Head) else list(params)
    if not heads or not all(isinstance(h, Head) for h in heads):
        raise ValueError("attention.heads: expected a Head or a non-empty list of Head")
    return heads


def with_constant(
    values: list[np.ndarray], components: Sequence[int | None], constant: np.ndarray
) -> list[np.ndarray]:
    """Add the vector ``constant`` (d,) to per-lattice velocities: (P,) arrays hold component
    ``components[i]``, (P, d) arrays all of them."""
    return [
        v + (constant if comp is None else constant[comp])
        for v, comp in zip(values, components, strict=True)
    ]


class TiltedMeanField(VelocityField):
    """Shared machinery of the normalised kernels: tilted means m(c) of a weight field.

    engine : "auto" | "direct" | "separable" (module docstring); nodes: separable table
    nodes per axis (default: automatic from the tilt range and the support width,
    :func:`tpde.variants.engines.separable.table_nodes`, refined for the sheared passes; in 2-D
    and 3-D that size bounds the velocity tables, which are resolved a posteriori and
    warm-started from the previous evaluation, :func:`.engines.separable.resolved_sums`;
    the interpolation uses 12 points per axis; a fixed ``nodes`` table, or a capped one the
    passes cannot resolve, is interpolated pointwise); block: targets per block of the
    direct sums. ``policy`` (:class:`~.engines.policy.EnginePolicy`) holds these, chooses
    the engine and table of every request and owns the warm starts that :meth:`reset`
    forgets.
    """

    attention = True

    #: the variant whose engine names (:data:`~.engines.registry.CONFIG_ENGINES`) it takes:
    #: the tilted-mean engines without the FFT (l2's, Sinkhorn's)
    engine_variant = "l2"

    @property
    def engines(self) -> tuple[str, ...]:
        """The engine names it takes ("auto" first; aliases are read as these)."""
        return engine_names("flat", self.engine_variant)

    def __init__(self, engine: str = "auto", nodes: int | None = None, block: int = 256):
        engine = check_engine(engine, "flat", self.engine_variant)
        self.policy = EnginePolicy(engine, nodes, block)
        #: the co-moving frame's cut of a step's first stage, kept for its later stages
        self._step_cut: tuple[list[np.ndarray], float] | None = None

    @property
    def engine(self) -> str:
        return self.policy.engine

    @property
    def nodes(self) -> int | None:
        return self.policy.nodes

    @property
    def block(self) -> int:
        return self.policy.block

    @property
    def _table_steps(self) -> Recent:
        """The policy's warm starts (per grid, matrix and fields)."""
        return self.policy.warm

    def reset(self) -> None:
        self.policy.reset()
        self._step_cut = None

    def engine_for(self, grid: Grid) -> str:
        return self.policy.engine_for(grid)

    def at(self, density: np.ndarray, grid: Grid, t: float, offset: ArrayLike) -> np.ndarray:
        return self.at_many(density, grid, t, [offset])[0]

    def at_many(self, density, grid: Grid, t: float, offsets) -> list[np.ndarray]:
        return self.components(density, grid, t, offsets, [None] * len(offsets))

    def sums(
        self,
        weights: np.ndarray,
        grid: Grid,
        lattices: list,
        matrix: np.ndarray,
        fields: str = "means",
        sheared: bool = False,
    ) -> DirectSums | SeparableSums:
        """The kernel-sum engine of ``weights`` (uncorrected sums) for tilts c = matrix x,
        x on ``lattices`` (per-axis coordinates, as from :meth:`lattice_points`): an object
        with ``means(c)``, ``log_partition(c)``, ``on_lattice`` and ``velocity_table`` (a
        table holds only ``fields``). ``sheared``: the table will serve ``on_lattice`` of
        these lattices only (refined, padded and, in 2-D, formed only where the sheared
        passes read: :mod:`tpde.variants.engines.sheared`; a table of means or of log M on
        the adaptive resolution). The choice: :class:`~.engines.policy.EnginePolicy`."""
        return self.policy.sums(weights, grid, lattices, matrix, fields, sheared)

    def head_velocities(
        self,
        weights: np.ndarray,
        grid: Grid,
        offsets,
        components,
        matrix: np.ndarray,
        C: np.ndarray,
        box: tuple[np.ndarray, np.ndarray],
        spacing: Sequence[float] | None = None,
        shift: np.ndarray | None = None,
        lattices: list | None = None,
    ) -> list[np.ndarray]:
        """One head's velocity ``C clip(m_w(matrix x) - grad log S, box)`` (docs/theory.md,
        'Clip of tilted means'):
        component ``components[i]`` (None: all) on the lattice ``offsets[i]``, each (P,) or
        (P, d) over the lattice points in C order.

        ``spacing``: the cell widths of the exact cell-average correction (softmax), None for
        point-value weights (l2, Sinkhorn). The engine's ``velocity_table`` serves every
        lattice: the tables tabulate the velocity components themselves, so a lattice that
        needs one component interpolates one field, clipped to the range ``C box`` allows;
        the dense sums evaluate it at the lattice points.
        ``shift`` (d,): the tilts are ``matrix (x + shift)`` (the co-moving frame's offset).
        """
        if lattices is None:
            lattices = [grid.lattice(offset) for offset in offsets]
        if shift is not None:
            lattices = [[x + s for x, s in zip(coords, shift, strict=True)] for coords in lattices]
        sums = self.sums(weights, grid, lattices, matrix, sheared=True)
        table = sums.velocity_table(np.asarray(C, float), box, spacing)
        return [
            table.on_lattice(coords, matrix, comp)
            for coords, comp in zip(lattices, components, strict=True)
        ]

    def on_windows(
        self,
        grid: Grid,
        lattices: list,
        components: Sequence[int | None],
        moving: list[np.ndarray],
        evaluate: Callable[[list, list], list[np.ndarray]],
    ) -> list[np.ndarray]:
        """The co-moving frame's velocity, evaluated only where the frame uses it
        (docs/theory.md, "The co-moving affine frame"): on each lattice (per-axis
        coordinates), the window (:func:`.truncation.held_window`) of the points that are
        transported (``moving[i]``, :func:`tpde.schemes.frame.transported`) and held (a cut
        at most ``self.held_cut``, where ``self.cut`` was measured); 0 outside the windows,
        whose points keep the frame's affine fit (:func:`tpde.schemes.frame.affine_fit`).
        The tables then span the tilts of the windows only, not those of the far tails.

        ``evaluate(sub, wanted)``: the velocity, (P,) or (P, d) in C order as
        :meth:`head_velocities` returns it, on the sub-lattices ``sub`` (per-axis
        coordinates) of the lattices that hold a window, component ``wanted[i]`` (None:
        all). Returns arrays shaped like :meth:`shaped`'s."""
        if self.cut is not None:
            moving = [m & (cut <= self.held_cut) for m, cut in zip(moving, self.cut, strict=True)]
        windows = [held_window(m) for m in moving]
        d = grid.ndim
        out = []
        for coords, comp in zip(lattices, components, strict=True):
            shape = tuple(len(x) for x in coords)
            out.append(np.zeros(shape if comp is not None else (d, *shape)))
        held = {i: window for i, window in enumerate(windows) if window is not None}
        busy = list(held)
        if not busy:
            return out
        sub = [[x[w] for x, w in zip(lattices[i], held[i], strict=True)] for i in busy]
        velocity = evaluate(sub, [components[i] for i in busy])
        for i, coords, values in zip(busy, sub, velocity, strict=True):
            shape = tuple(len(x) for x in coords)
            if values.ndim == 1:
                out[i][held[i]] += values.reshape(shape)
            else:
                out[i][(slice(None), *held[i])] += values.T.reshape((d, *shape))
        return out

    @staticmethod
    def shaped(values: list[np.ndarray], grid: Grid, offsets) -> list[np.ndarray]:
        """(P,) / (P, d) lists over lattice points -> (*lattice_shape) / (d, *lattice_shape)."""
        out = []
        for v, offset in zip(values, offsets, strict=True):
            shape = tuple(len(c) for c in grid.lattice(offset))
            out.append(v.reshape(shape) if v.ndim == 1 else v.T.reshape((v.shape[1],) + shape))
        return out


class SoftmaxAttention(TiltedMeanField):
    """Softmax attention, one head or several (multi-head: the heads' fields add up).

    params : a :class:`Head`, a list of heads, :class:`Layers` of those, or a callable
        ``t -> params`` (docs/theory.md, 'Layer-wise parameters').
    engine, nodes, block : see :class:`TiltedMeanField`; softmax also has ``engine="fft"``
        for symmetric A (:mod:`tpde.variants.engines.fft`: absolute accuracy only, never chosen by
        "auto").
    """

    engine_variant = "softmax"

    def __init__(
        self, params: ParamSpec, engine: str = "auto", nodes: int | None = None, block: int = 256
    ):
        super().__init__(engine, nodes, block)
        self.spec = as_param_spec(params)
        self._fft = Recent(4)  # per A: plans and kernel spectra
        self._corrections = Recent(8)
        if not callable(self.spec):
            first = self.spec.params[0] if hasattr(self.spec, "params") else self.spec
            _heads(first)

    def heads_at(self, t: float, grid: Grid) -> list[Head]:
        """The heads in force at time t, checked against the grid's dimension."""
        heads = _heads(params_at(self.spec, t))
        for i, head in enumerate(heads):
            if head.dim != grid.ndim:
                raise ValueError(
                    f"attention.heads[{i}].A: expected {grid.ndim} x {grid.ndim} "
                    f"for a {grid.ndim}-D grid, got {head.dim} x {head.dim}"
                )
        return heads

    def has_frame(self) -> bool:
        return self.engine != "fft"  # (the FFT engine holds one fixed A)

    def frame_components(
        self, density, grid: Grid, t: float, offsets, components, frame
    ) -> list[np.ndarray]:
        """In the frame ``x = m + L xi``: head h tilts the frame density by
        ``L^T A_h L (xi + L^-1 m)`` and ``L^-1 Gamma = sum_h L^-1 C_h m + L^-1 C_h L m_rho``
        (docs/theory.md, "The co-moving affine frame")."""
        if self.engine == "fft":
            raise ValueError(
                'scheme.frame: the affine frame needs attention.engine = "auto", '
                '"direct" or "separable" (the FFT engine holds one fixed A)'
            )
        L, inverse = frame.matrix, frame.inverse
        shift = inverse @ frame.mean
        heads = self.heads_at(t, grid)
        matrices = [L.T @ head.A @ L for head in heads]
        lattices = [grid.lattice(offset) for offset in offsets]
        if not np.any(density > 0):  # (every cell's mass in atoms: nothing to transport)
            self.cut = None
            d = grid.ndim
            shapes = [tuple(len(x) for x in coords) for coords in lattices]
            return [
                np.zeros(shape if comp is not None else (d, *shape))
                for shape, comp in zip(shapes, components, strict=True)
            ]
        # evaluated only on the window of each lattice where some point is held and above
        # the transport floor, from the density the scheme trusts (on_windows): everything
        # else keeps the frame's affine fit (schemes.frame), so neither the cut nor the
        # tables need span the tilts of the far tails
        moving = [transported(density, offset) for offset in offsets]
        kept = self._step_cut
        shapes = [tuple(len(x) for x in coords) for coords in lattices]
        if self.measure_cut or kept is None or [c.shape for c in kept[0]] != shapes:
            self.cut = None
            gaussian = gaussian_like(density, grid)  # else the cut is measured (.truncation)
            for matrix in matrices:
                self._cut(density, grid, lattices, matrix, shift, moving, gaussian)
            self._step_cut = None if self.cut is None else (self.cut, self.held_cut)
        else:  # a later stage of the step: the first stage's cut (the tilts barely move)
            self.cut, self.held_cut = kept
        weights = np.where(density >= ACTIVE_FLOOR * density.max(), density, 0.0)
        box = support_box(weights, grid)
        atoms = self.atoms if self.atoms is not None and self.atoms.count else None

        def evaluate(sub: list, wanted: list) -> list[np.ndarray]:
            if atoms is not None:  # cells plus atoms, pointwise (flat_atoms)
                return self._mixture_velocities(weights, grid, sub, wanted, t, frame, box, atoms)
            total: list[np.ndarray] | None = None
            for head, matrix in zip(heads, matrices, strict=True):
                velocity = self.head_velocities(
                    weights,
                    grid,
                    None,
                    wanted,
                    matrix,
                    inverse @ head.C @ L,
                    box,
                    grid.spacing,
                    shift,
                    lattices=sub,
                )
                velocity = with_constant(velocity, wanted, inverse @ head.C @ frame.mean)
                total = (
                    velocity
                    if total is None
                    else [a + b for a, b in zip(total, velocity, strict=True)]
                )
            assert total is not None  # (heads_at: at least one head)
            return total

        return self.on_windows(grid, lattices, components, moving, evaluate)

    def has_frame_atoms(self) -> bool:
        return self.has_frame()

    def _frame_heads(self, t: float, grid: Grid, frame) -> tuple[list, list, list, list]:
        """The heads in the frame: tilt matrices ``L^T A L``, gains ``L^-1 C L`` and
        constants ``L^-1 C m`` (:meth:`frame_components`)."""
        L, inverse = frame.matrix, frame.inverse
        heads = self.heads_at(t, grid)
        return (
            heads,
            [L.T @ head.A @ L for head in heads],
            [inverse @ head.C @ L for head in heads],
            [inverse @ head.C @ frame.mean for head in heads],
        )

    def _mixture_velocities(
        self, weights, grid: Grid, sub: list, wanted: list, t: float, frame, box, atoms
    ) -> list[np.ndarray]:
        """The frame's velocity of cells plus atoms on the sub-lattices ``sub``, pointwise:
        the cells' ``log Z`` and clipped tilted mean from the engine's sums at each point,
        mixed with the atoms' closed forms (:func:`.flat_atoms.mixture_means`); the tables
        of the velocity cannot hold the atoms' share (it is not the cells')."""
        heads, matrices, gains, constants = self._frame_heads(t, grid, frame)
        shift = frame.inverse @ frame.mean
        shifted = [[x + s for x, s in zip(coords, shift, strict=True)] for coords in sub]
        volume = float(np.prod(grid.spacing))
        out: list[np.ndarray] = []
        for _, matrix, gain, constant in zip(heads, matrices, gains, constants, strict=True):
            sums = self.sums(weights, grid, shifted, matrix, fields="both")
            for i, (coords, comp) in enumerate(zip(shifted, wanted, strict=True)):
                c = lattice_tilts(coords, matrix)
                cells_log = sums.log_partition(c) + np.log(volume) - log_box_factor(c, grid.spacing)
                cells_mean = sums.means(c) - grad_log_box_factor(c, grid.spacing)
                np.clip(cells_mean, *box, out=cells_mean)
                _, mean = mixture_means(cells_log, cells_mean, atoms, c)
                velocity = mean @ gain.T + constant
                part = velocity if comp is None else velocity[:, comp]
                if len(out) <= i:
                    out.append(part)
                else:
                    out[i] = out[i] + part
        return out

    def frame_atom_velocity(
        self, density, grid: Grid, t: float, atoms, frame
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """At the atoms' centres (frame coordinates): ``u``, ``Du``, ``D^2 u`` of the frame's
        field ``u(xi) = L^-1 Gamma(m + L xi)`` of cells plus atoms, (K, d), (K, d, d),
        (K, d, d, d), by the mixture's cumulants (:func:`.flat_atoms.atom_field`)."""
        heads, matrices, gains, constants = self._frame_heads(t, grid, frame)
        weights = np.where(density >= ACTIVE_FLOOR * density.max(), density, 0.0)
        cells = weights if np.any(weights > 0) else None
        shift = frame.inverse @ frame.mean
        return atom_field(cells, grid, heads, atoms, shift, matrices, gains, constants)

    def frame_atom_closure(self, density, grid: Grid, t: float, atoms, frame) -> np.ndarray:
        """How far each atom's Gaussian closure is from its limit: ``max_c sqrt(c^T S_k c)``
        (K,) over the tilts ``c = L^T A L (x + L^-1 m)`` of every head at the corners of the
        cells' support box and at the atoms' centres (the measure's extreme points). Below
        1 the tilted sums see the atom's first two moments only; above, they feel its tails
        (a Gaussian's tilted mean ``a + S c`` runs on, a compact cluster's stops at its
        edge), docs/theory.md, 'Atoms in the co-moving frame'."""
        heads, matrices, _, _ = self._frame_heads(t, grid, frame)
        shift = frame.inverse @ frame.mean
        targets = [atoms.centre]
        if np.any(density > 0):
            low, high = support_box(density, grid)
            mesh = np.meshgrid(*zip(low, high, strict=True), indexing="ij")
            targets.append(np.stack([m.reshape(-1) for m in mesh], axis=1))
        x = np.vstack(targets) + shift
        worst = np.zeros(atoms.count)
        for matrix in matrices:
            c = x @ matrix.T  # (P, d)
            spread = np.einsum("pi,kij,pj->kp", c, atoms.cov, c)
            worst = np.maximum(worst, np.sqrt(np.maximum(spread.max(axis=1), 0.0)))
        return worst

    def _cut(
        self, weights, grid: Grid, lattices, matrix, shift=None, where=None, gaussian=True
    ) -> None:
        """Take this head's cut (:mod:`.truncation`) into ``self.cut`` (the worst head):
        the Gaussian surrogate's for Gaussian-like weights, else the measured one (with the
        held threshold of that cut in ``self.held_cut``)."""
        self.held_cut = HELD_CUT if gaussian else MEASURED_HELD
        cut = (
            cut_lattices(weights, grid, lattices, matrix, shift, where)
            if gaussian
            else measured_cut(
                weights, grid, lattices, matrix, shift, where, self.engine_for(grid) == "direct"
            )
        )
        self.cut = (
            cut
            if self.cut is None
            else [np.maximum(a, b) for a, b in zip(self.cut, cut, strict=True)]
        )

    def components(self, density, grid: Grid, t: float, offsets, components) -> list[np.ndarray]:
        heads = self.heads_at(t, grid)
        lattices = [grid.lattice(offset) for offset in offsets]
        self.cut = None
        if self.atoms is not None and self.atoms.count:  # a fixed box with atoms
            return self._box_mixture(density, grid, t, offsets, components, lattices, heads)
        box = support_box(density, grid)
        total: list[np.ndarray] | None = None
        for head in heads:
            if self.engine == "fft":
                velocity = self._fft_velocities(density, grid, offsets, components, head, box)
            else:
                velocity = self.head_velocities(
                    density, grid, offsets, components, head.A, head.C, box, grid.spacing
                )
            total = (
                velocity if total is None else [a + b for a, b in zip(total, velocity, strict=True)]
            )
            if self.measure_cut:
                self._cut(density, grid, lattices, head.A, gaussian=gaussian_like(density, grid))
        assert total is not None  # (heads_at: at least one head)
        return self.shaped(total, grid, offsets)

    def _box_mixture(self, density, grid: Grid, t, offsets, components, lattices, heads):
        """A fixed box's velocity of cells plus atoms: the frame's pointwise mixture
        (:meth:`_mixture_velocities`) in the identity frame ``x = 0 + I xi``, whose tilts,
        gains and constants are the heads' own (``A``, ``C``, 0) bit for bit. No cells (all
        their mass in atoms): 0, there is nothing on them to move. The FFT engine's one
        fixed ``A`` cannot take the atoms (:func:`~tpde.schemes.atom_run.check_atom_run`)."""
        d = grid.ndim
        if not np.any(density > 0):
            shapes = [tuple(len(x) for x in coords) for coords in lattices]
            return [
                np.zeros(shape if comp is not None else (d, *shape))
                for shape, comp in zip(shapes, components, strict=True)
            ]
        if self.measure_cut:  # (the cells' cut, as without atoms: the box's indicator)
            for head in heads:
                self._cut(density, grid, lattices, head.A, gaussian=gaussian_like(density, grid))
        box = support_box(density, grid)
        values = self._mixture_velocities(
            density, grid, lattices, list(components), t, identity_frame(d), box, self.atoms
        )
        return self.shaped(values, grid, offsets)

    def _fft_velocities(self, density, grid, offsets, components, head, box):
        """One head by FFT convolutions (symmetric A): a lattice that needs component a
        convolves the denominator and the combined numerator w (C y)_a (two inverse
        transforms); a full lattice the d tilted-mean numerators."""
        sums = self._fft.get_or_make(head.A.tobytes(), lambda: FFTSoftmaxSums(head.A))
        w = sums.weights(density, grid)
        y, d, C = grid.mesh(), grid.ndim, head.C
        fields = (
            [w]
            + [w * y[b] for b in range(d)]
            + [w * sum(C[a, b] * y[b] for b in range(d)) for a in range(d)]
        )
        requests = [
            (offset, [0] + (list(range(1, d + 1)) if comp is None else [1 + d + comp]))
            for offset, comp in zip(offsets, components, strict=True)
        ]
        low, high = component_bounds(C, box)
        out = []
        for convolved, offset, comp in zip(
            sums.convolve(fields, grid, requests), offsets, components, strict=True
        ):
            total = checked_total(convolved[0])
            correction = self._correction(grid, offset, head, comp)
            if comp is None:
                means = np.stack(convolved[1:], axis=1) / total[:, None] - correction
                out.append(np.clip(means, *box, out=means) @ C.T)
            else:
                velocity = convolved[1] / total - correction
                out.append(np.clip(velocity, low[comp], high[comp], out=velocity))
        return out

    def _correction(self, grid: Grid, offset, head: Head, comp: int | None) -> np.ndarray:
        """grad log S(A x) on a lattice, (P, d), or its C-combination for one component,
        (P,): fixed while the parameters are, so kept for the last few lattices."""
        key = (
            grid.shape,
            tuple(grid.lower),
            tuple(grid.upper),
            tuple(map(float, offset)),
            head.A.tobytes(),
            head.C.tobytes(),
            comp,
        )

        def make() -> np.ndarray:
            _, (x,) = self.lattice_points(grid, [offset])
            correction = grad_log_box_factor(x @ head.A.T, grid.spacing)
            return correction if comp is None else correction @ head.C[comp]

        return self._corrections.get_or_make(key, make)


class LinearAttention(VelocityField):
    """Linear attention, Gamma(x) = C M2 A x with M2 = int y y^T dmu, in O(N).

    docs/theory.md, 'Linear attention'.

    M2 comes from the cell averages without the h^2/12 bias (tpde.grid moments).
    """

    attention = True

    def __init__(self, params: ParamSpec):
        self.spec = as_param_spec(params)

    def at(self, density, grid: Grid, t: float, offset) -> np.ndarray:
        return self.at_many(density, grid, t, [offset])[0]

    def at_many(self, density, grid: Grid, t: float, offsets) -> list[np.ndarray]:
        heads = _heads(params_at(self.spec, t))
        matrix = sum(head.C @ second_moment(density, grid) @ head.A for head in heads)
        return affine_lattices(grid, offsets, np.zeros(grid.ndim), matrix)

    def frame_components(
        self, density, grid: Grid, t: float, offsets, components, frame
    ) -> list[np.ndarray]:
        """In the frame ``x = m + L xi``: ``M2 = L M2_rho L^T + L xi_bar m^T + m xi_bar^T L^T
        + m m^T`` and ``L^-1 Gamma(m + L xi) = L^-1 B m + L^-1 B L xi``, ``B = sum_h C_h M2 A_h``:
        affine in xi for any density, so the frame carries all of the dynamics."""
        heads = _heads(params_at(self.spec, t))
        L, inverse, m = frame.matrix, frame.inverse, frame.mean
        _, xi_mean, _ = moments(density, grid)
        outer = np.outer(L @ xi_mean, m)
        second = L @ second_moment(density, grid) @ L.T + outer + outer.T + np.outer(m, m)
        gain = sum(head.C @ second @ head.A for head in heads)
        full = affine_lattices(grid, offsets, inverse @ gain @ m, inverse @ gain @ L)
        return [u if comp is None else u[comp] for u, comp in zip(full, components, strict=True)]


def second_moment(density: np.ndarray, grid: Grid) -> np.ndarray:
    """M2 = int y y^T d mu (d, d), from the cell averages without the h^2/12 bias."""
    d = grid.ndim
    second = np.empty((d, d))
    for a in range(d):
        for b in range(a, d):
            powers = [0] * d
            powers[a] += 1
            powers[b] += 1
            second[a, b] = second[b, a] = raw_moment(density, grid, powers)
    return second


def affine_lattices(grid: Grid, offsets, constant: np.ndarray, matrix: np.ndarray) -> list:
    """The field ``constant + matrix x`` on each lattice, (d, *lattice_shape)."""
    d = grid.ndim
    out = []
    for offset in offsets:
        coords = grid.lattice(offset)
        mesh = np.meshgrid(*coords, indexing="ij", sparse=True)
        field = np.zeros((d,) + tuple(len(x) for x in coords))
        for a in range(d):
            field[a] += constant[a]
            for b in range(d):
                field[a] = field[a] + matrix[a, b] * mesh[b]
        out.append(field)
    return out
