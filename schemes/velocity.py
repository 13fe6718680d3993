"""The velocity-field protocol every transport velocity implements.

A velocity field maps ``(density, grid, t)`` to ``u(x)`` on a tensor lattice of points:
the cell centres shifted by ``offset`` cell widths (``offset = 0``: centres; ``offset[a] =
1/2``: the faces normal to axis ``a``, with ``cells[a] + 1`` points along it). The scheme
asks for the lattices it needs (face centres, or the Gauss nodes of the faces) and the field
answers each with an array ``(d, *lattice_shape)``. Prescribed fields ignore ``density``;
attention variants compute a nonlocal average of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from tpde.grid import Grid

from .frame import HELD_CUT


class VelocityField:
    """Base class. Subclasses implement :meth:`at`.

    Attributes
    ----------
    face_constant : bool
        True when ``u_a`` does not vary along the faces normal to axis ``a`` (then the
        midpoint face rule is exact and the scheme skips the transverse Gauss nodes).
    steady : bool
        True when ``u`` depends on neither the density nor the time (prescribed steady
        fields): the solver then evaluates it once and reuses it at every stage.
    spec : parameter specification or None
        The attention parameters an attention field was built from (constant, ``Layers``
        or a callable of t: :mod:`tpde.variants.parameters`); None for prescribed fields.
    """

    face_constant: bool = False
    steady: bool = False
    #: True for attention: the field depends on the whole measure, so the box must hold the
    #: measure (the solver's truncation checks, :mod:`tpde.schemes.monitor`, apply)
    attention: bool = False
    spec: Any = None
    #: after an evaluation of :meth:`components` / :meth:`frame_components`: one array per
    #: lattice, the estimated relative error of the velocity there from the box cutting what
    #: it depends on (tilted-mean variants: :mod:`tpde.variants.truncation`); None where the
    #: field does not measure it
    cut: list[np.ndarray] | None = None
    #: with ``cut``: the largest cut at which a point's velocity still counts as held (in the
    #: co-moving frame the others keep the affine fit, :mod:`tpde.schemes.frame`). The field
    #: sets it with each ``cut``, since its meaning is the cut's: a mean shift in standard
    #: deviations for the Gaussian surrogate (``HELD_CUT``), the share of a tilted law in the
    #: cells the box does not hold for the measured cut (:mod:`tpde.variants.truncation`)
    held_cut: float = HELD_CUT
    #: set by the solver before an evaluation: whether to measure ``cut`` (at the first stage of
    #: each step: once per step is enough for the truncation indicator; in the co-moving frame,
    #: where the fit needs a cut at every stage, a field may keep the first stage's for the
    #: step's later stages)
    measure_cut: bool = True
    #: set by the solver before an evaluation: the atoms of the measure (a
    #: :class:`tpde.schemes.atoms.Atoms`) whose share a field with atoms adds to its sums
    #: (docs/theory.md, 'Cells plus atoms'); None: the cells alone
    atoms: Any = None

    def at(self, density: np.ndarray, grid: Grid, t: float, offset: ArrayLike) -> np.ndarray:
        """Velocity on the lattice ``grid.lattice(offset)``, shape ``(d, *lattice_shape)``."""
        raise NotImplementedError

    def at_many(
        self, density: np.ndarray, grid: Grid, t: float, offsets: Sequence[ArrayLike]
    ) -> list[np.ndarray]:
        """The velocity on several shifted lattices at once (one array per offset).

        The solver asks for all the lattices a stage needs in one call, so a nonlocal field
        can share its work between them (one forward transform of the density, then one
        phase-shifted inverse per lattice). The default evaluates them one by one.
        """
        return [self.at(density, grid, t, off) for off in offsets]

    def components(
        self,
        density: np.ndarray,
        grid: Grid,
        t: float,
        offsets: Sequence[ArrayLike],
        components: Sequence[int | None],
    ) -> list[np.ndarray]:
        """Component ``components[i]`` of the velocity on the lattice ``offsets[i]``, shape
        ``(*lattice_shape)``; ``None`` gives all of them, ``(d, *lattice_shape)``.

        The finite-volume scheme needs only the normal component on the faces of each axis;
        a field that can compute one component for less overrides this (the attention
        variants interpolate one tabulated field instead of d). The default picks the
        components out of :meth:`at_many`.
        """
        full = self.at_many(density, grid, t, offsets)
        return [u if comp is None else u[comp] for u, comp in zip(full, components, strict=True)]

    def frame_components(
        self,
        density: np.ndarray,
        grid: Grid,
        t: float,
        offsets: Sequence[ArrayLike],
        components: Sequence[int | None],
        frame,
    ) -> list[np.ndarray]:
        """Like :meth:`components`, in the co-moving frame ``x = m + L xi``
        (:class:`tpde.schemes.frame.AffineFrame`): ``density`` is the frame density on the
        ``xi`` grid and the answer is ``u(xi) = L^-1 Gamma(m + L xi)`` on the ``xi``
        lattices. Fields that cannot be evaluated in a frame raise ``ValueError``."""
        raise ValueError(
            f"scheme.frame: {type(self).__name__} has no co-moving frame; "
            'use scheme.frame = "fixed"'
        )

    def atom_velocity(
        self, density: np.ndarray, grid: Grid, t: float, atoms
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """At the atoms' centres: ``Gamma`` (K, d), ``DGamma`` (K, d, d) and ``D^2 Gamma``
        (K, d, d, d) of the measure cells plus ``atoms`` (fields with atoms implement it)."""
        raise ValueError(f"atoms: {type(self).__name__} has no atoms; set atoms off")

    def has_atoms(self) -> bool:
        """Whether this field adds atoms to its sums (:meth:`atom_velocity`)."""
        return type(self).atom_velocity is not VelocityField.atom_velocity

    def frame_atom_velocity(
        self, density: np.ndarray, grid: Grid, t: float, atoms, frame
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """In the co-moving frame, at the atoms' centres (frame coordinates): ``u`` (K, d),
        ``Du`` (K, d, d), ``D^2 u`` (K, d, d, d) of ``u(xi) = L^-1 Gamma(m + L xi)`` of the
        measure cells plus ``atoms`` (docs/theory.md, 'Atoms in the co-moving frame')."""
        raise ValueError(f"atoms: {type(self).__name__} has no atoms in the frame; set atoms off")

    def frame_atom_closure(self, density: np.ndarray, grid: Grid, t: float, atoms, frame):
        """Per atom (K,), how far its Gaussian closure is from its limit (1: the sums begin
        to feel its tails); None where the field does not say."""
        return None

    def has_frame_atoms(self) -> bool:
        """Whether this field adds atoms to its sums in the co-moving frame
        (:meth:`frame_atom_velocity`)."""
        return type(self).frame_atom_velocity is not VelocityField.frame_atom_velocity

    def has_frame(self) -> bool:
        """Whether :meth:`frame_components` evaluates this field in a co-moving frame."""
        return type(self).frame_components is not VelocityField.frame_components

    def reset(self) -> None:
        """Forget the warm starts (state that only speeds up the next evaluation: Sinkhorn
        potentials, the adaptive table spacing). The solver calls this at every snapshot, so
        a run resumed from a snapshot repeats the uninterrupted run's evaluations."""

    @staticmethod
    def lattice_points(grid: Grid, offsets) -> tuple[list, list[np.ndarray]]:
        """The lattices (1-D coordinates per axis) and their points flattened to (P, d)."""
        lattices = [grid.lattice(offset) for offset in offsets]
        points = [
            np.stack([m.reshape(-1) for m in np.meshgrid(*coords, indexing="ij")], axis=1)
            for coords in lattices
        ]
        return lattices, points

    def breakpoints(self) -> tuple[float, ...]:
        """Times where the field jumps (layer starts of piecewise-constant parameters,
        ``self.spec.starts`` where the field has such a spec).

        The solver lands a step on each of them: a Runge-Kutta step across a jump of the
        parameters would be first-order accurate only.
        """
        return tuple(getattr(getattr(self, "spec", None), "starts", ()))

    def __call__(self, density: np.ndarray, grid: Grid, t: float) -> np.ndarray:
        """Velocity at the cell centres, shape ``(d, *grid.shape)``."""
        return self.at(density, grid, t, np.zeros(grid.ndim))
