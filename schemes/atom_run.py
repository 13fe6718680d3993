"""Atoms in a run: their SSP-RK stages beside the cells' and the transfers after each step.

docs/theory.md, 'Cells plus atoms'. The solver (:mod:`.solver`) calls :class:`AtomRun` at
four places of a step: ``stages`` at its start; ``keep``, or ``see`` before and ``move``
after the stage's face velocity, for every term of a stage (a stage's atoms are the same
convex combination of the earlier stages and their Euler steps as the cells'); ``combine``
at the end of each stage and ``accept`` once the step stands; then ``transfer`` moves mass
between cells and atoms (:mod:`.atom_cells`) and records the births, merges and releases as
events. Before every evaluation of the velocity the field's ``atoms`` is the stage's, so the
cells see the atoms and the atoms see the cells and themselves.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from .atom_cells import AtomTransfer, PeriodicCells, absorb, convert, merge, release
from .atoms import AtomRates, Atoms, atom_rates

__all__ = ["AtomRun", "PinningWatch", "check_atom_run", "describe", "identity_frame", "on_box"]


class Transfer(Protocol):
    """What :func:`describe` reads of a transfer (the circle's or the sphere's)."""

    @property
    def kind(self) -> str: ...
    @property
    def ident(self) -> int: ...
    @property
    def parents(self) -> tuple[int, ...]: ...
    @property
    def mass(self) -> float: ...
    @property
    def centre(self) -> Any: ...


def describe(event: Transfer, place: str | None = None) -> str:
    """One line for an atom's event (the run's events and ``tpde info``); ``place``: where
    it is, as its geometry writes it (default: the angle)."""
    where = f"at {event.centre:.6f}" if place is None else f"at {place}"
    where += f" with mass {event.mass:.6g}"
    if event.kind == "atom_merge":
        a, b = event.parents
        return f"atoms {a} and {b} merge into atom {event.ident} {where}"
    if event.kind == "atom_release":
        return f"atom {event.ident} {where} spreads past the release width: back to the cells"
    return f"atom {event.ident} is born {where} (a cluster narrower than the cells allow)"


def on_box(problem) -> bool:
    """Whether ``problem``'s atoms are the flat grid's d-dimensional Gaussians on a box
    (:mod:`.box_atoms`: the co-moving frame, or a fixed box without periodic axes), not the
    circle's (a periodic 1-D grid)."""
    return problem.frame is not None or "periodic" not in problem.grid.boundary


def check_atom_run(problem) -> None:
    """Whether ``problem.atoms`` can run (raises a one-line ValueError naming the fix): the
    options valid; on a flat box (the co-moving frame, or a fixed box without periodic axes)
    a field with Gaussian atoms (softmax, multi-head softmax), an unmasked grid and no
    noise; on a periodic 1-D grid the circle's attention."""
    problem.atoms.validate()
    field, grid = problem.velocity, problem.grid
    if on_box(problem):
        where = "in the co-moving frame" if problem.frame is not None else "in a fixed box"
        if not field.has_frame_atoms():
            raise ValueError(
                f"atoms: {type(field).__name__} has no atoms {where} yet "
                "(softmax and multi-head softmax have); set atoms off"
            )
        if "periodic" in grid.boundary or problem.positions is not None:
            raise ValueError(
                f"atoms: the flat atoms {where} need an unmasked grid without periodic axes; "
                "set atoms off"
            )
        if problem.noise > 0:  # (in frame coordinates the heat kernel is L^-1 L^-T, not I)
            raise ValueError(
                f"atoms: not with run.noise {where} yet; set atoms off or the noise to 0"
            )
    else:
        if not field.has_atoms():
            raise ValueError(
                f"atoms: {type(field).__name__} has no atoms on a periodic grid yet (attention "
                "on the circle has; softmax on a flat box without periodic axes); set atoms off"
            )
        if grid.ndim != 1 or problem.positions is not None:
            raise ValueError(
                "atoms: on a periodic grid only the circle's (1-D, unmasked); else a flat box "
                "without periodic axes; set atoms off"
            )


def identity_frame(d: int):
    """The frame ``x = 0 + I xi`` of a fixed box (:class:`.frame.AffineFrame`)."""
    from .frame import AffineFrame

    return AffineFrame(np.zeros(d), np.eye(d))


class AtomRun:
    """The atoms of one run (``problem.atoms`` on): state, stages, transfers."""

    def __init__(self, problem, density: np.ndarray):
        options = problem.atoms
        check_atom_run(problem)
        field, grid = problem.velocity, problem.grid
        #: the co-moving frame's atoms (flat grid, frame coordinates)
        self.in_frame = problem.frame is not None
        #: the flat box's Gaussian atoms (the frame's or a fixed box's, :mod:`.box_atoms`),
        #: else the circle's
        self.on_box = on_box(problem)
        #: a fixed box is the frame ``x = 0 + I xi``: the frame's sums and closure check
        #: serve it unchanged (``L^T A L = A``, ``L^-1 C L = C`` exactly for ``L = I``)
        self.identity = None if not self.on_box or self.in_frame else identity_frame(grid.ndim)
        self.cells = (
            None
            if self.on_box
            else PeriodicCells(float(grid.lower[0]), float(grid.spacing[0]), grid.cells[0])
        )
        self.options = options
        self.field = field
        self.grid = grid
        start = problem.initial_atoms
        self.atoms = Atoms.empty(grid.ndim) if start is None else start
        if self.atoms.dim != grid.ndim:
            raise ValueError(
                f"atoms: {self.atoms.dim}-D atoms on a {grid.ndim}-D grid (initial_atoms)"
            )
        used = int(self.atoms.ids.max()) + 1 if self.atoms.count else 0
        self.next_id = max(int(problem.next_atom_id), used)
        self.transfers: list[AtomTransfer] = []
        #: whether the frame's atoms have said that their closure no longer holds
        self.closure_warned = False
        field.atoms = self.atoms
        self._stage: list[Atoms | None] = []
        self._rates: dict[int, AtomRates] = {}
        self._weights: list[float] = []
        self._terms: list[Atoms] = []
        self._final: Atoms | None = None

    # ---- the stages -------------------------------------------------------------------------
    def stages(self, count: int) -> AtomRun:
        self._stage = [self.atoms] + [None] * (count - 1)
        self._rates = {}
        self._weights, self._terms = [], []
        self.field.atoms = self.atoms
        return self

    def keep(self, k: int, alpha: float) -> None:
        stage = self._stage[k]
        assert stage is not None
        self._weights.append(alpha)
        self._terms.append(stage)

    def see(self, k: int) -> None:
        """The field sees stage k's atoms (before its evaluation on the cells' faces)."""
        self.field.atoms = self._stage[k]

    def move(
        self,
        k: int,
        alpha: float,
        dt: float,
        density: np.ndarray,
        t: float,
        rates: AtomRates | None = None,
    ) -> None:
        """The term ``alpha (atoms_k + dt rates_k)`` (after the stage's face velocity: a field
        may reuse that evaluation's sums). ``rates``: the stage's rates where its face
        velocity formed them (the co-moving frame's fit, ``FrameRates.points``)."""
        stage = self._stage[k]
        assert stage is not None
        self.field.atoms = stage
        if rates is not None:
            self._rates[k] = rates
        if k not in self._rates:
            if stage.count and self.in_frame:
                raise AssertionError("atoms: the frame's atom rates come from its fit")
            if stage.count and self.identity is not None:  # (a fixed box: the field itself)
                u, du, d2u = self.field.frame_atom_velocity(
                    density, self.grid, t, stage, self.identity
                )
                self._rates[k] = atom_rates(u, du, d2u, stage.cov)
            elif stage.count:
                u, du, d2u = self.field.atom_velocity(density, self.grid, t, stage)
                self._rates[k] = atom_rates(u, du, d2u, stage.cov)
            else:
                self._rates[k] = AtomRates(stage.centre.copy(), stage.cov.copy())
        self._weights.append(alpha)
        self._terms.append(stage.advanced(self._rates[k], dt))

    def combine(self, i: int) -> None:
        out = Atoms.combination(self._weights, self._terms)
        self._weights, self._terms = [], []
        if i + 1 < len(self._stage):
            self._stage[i + 1] = out
        else:
            self._final = out

    def accept(self) -> None:
        assert self._final is not None
        self.atoms = self._final
        self.field.atoms = self.atoms

    # ---- noise ------------------------------------------------------------------------------
    def diffuse(self, variance: float) -> Atoms:
        """The atoms' part of a diffusion substep ``exp(tau eps Delta)``, exact: a Gaussian
        (on the circle a wrapped normal) convolved with the heat kernel of variance
        ``2 eps tau`` per axis is the Gaussian ``N(a, S + 2 eps tau I)``, same mass and centre
        (docs/theory.md, 'Atoms with noise'). ``variance``: ``2 eps tau``. Returns the atoms
        before the substep (:meth:`restore` them when the step is rejected)."""
        before = self.atoms
        if before.count:
            added = variance * np.eye(before.dim)
            self.atoms = Atoms(
                before.mass,
                before.centre,
                before.cov + added,
                before.ids,
                before.born,
                before.parents,
            )
            self.field.atoms = self.atoms
        return before

    def restore(self, atoms: Atoms) -> None:
        """Back to ``atoms`` (a rejected noisy step starts again from them)."""
        self.atoms = atoms
        self.field.atoms = atoms

    def embedded_error(self) -> float:
        """The atoms' share of the frame's step control (:func:`.frame.embedded_error`):
        the largest difference, in frame coordinates, between the step's centres and
        covariances and those of the embedded Heun step ``2 u^(2) - u^(0)`` (0: no atoms)."""
        start, second, end = self._stage[0], self._stage[2], self._final
        if start is None or second is None or end is None or not end.count:
            return 0.0
        return max(
            float(np.abs(end.centre - (2.0 * second.centre - start.centre)).max()),
            float(np.abs(end.cov - (2.0 * second.cov - start.cov)).max()),
        )

    # ---- after the step ---------------------------------------------------------------------
    def transfer(self, density: np.ndarray, t: float, events: list, frame=None) -> np.ndarray:
        """Absorb, merge, convert, release (:mod:`.atom_cells`; in the co-moving frame
        :mod:`.box_atoms`, ``frame`` the step's, for the events' physical places);
        ``density`` is updated in place and returned; one event per birth, merge and
        release."""
        from .monitor import Event

        if self.on_box:  # (a fixed box: its identity frame)
            return self._frame_transfer(density, t, events, frame or self.identity)
        cells, options = self.cells, self.options
        assert cells is not None  # (the circle's)
        atoms = self.atoms
        if atoms.count:  # the centres stay on [lower, lower + 2 pi)
            atoms = atoms.moved(cells.wrap(atoms.centre))
            if np.logical_or.reduce(
                atoms.cov.reshape(-1) < 0.0
            ):  # (round-off of a collapsed width, ~1e-16 h^2)
                atoms = Atoms(
                    atoms.mass,
                    atoms.centre,
                    np.maximum(atoms.cov, 0.0),
                    atoms.ids,
                    atoms.born,
                    atoms.parents,
                )
        rho, atoms = absorb(density, cells, atoms, options)
        atoms, merged, self.next_id = merge(atoms, cells, options, t, self.next_id)
        rho, atoms, born, self.next_id = convert(rho, cells, atoms, options, t, self.next_id)
        rho, atoms, released = release(rho, cells, atoms, options, t)
        for event in merged + born + released:
            self.transfers.append(event)
            events.append(Event(event.kind, t, describe(event)))
        self.atoms = atoms
        self.field.atoms = atoms
        if rho is not density:
            density[...] = rho
        return density

    def _frame_transfer(self, density: np.ndarray, t: float, events: list, frame) -> np.ndarray:
        """The flat box's transfers (:func:`.box_atoms.transfer_all`), in frame coordinates
        (a fixed box's are physical: ``frame`` its identity); the events name the physical
        places ``m + L xi``."""
        from .box_atoms import transfer_all
        from .monitor import Event

        atoms = self.atoms
        if atoms.count:  # (round-off: keep every covariance symmetric)
            cov = 0.5 * (atoms.cov + np.swapaxes(atoms.cov, 1, 2))
            atoms = Atoms(atoms.mass, atoms.centre, cov, atoms.ids, atoms.born, atoms.parents)
        rho, atoms, found, self.next_id = transfer_all(
            density, self.grid, atoms, self.options, t, self.next_id
        )
        for event in found:
            where = event.centre if frame is None else frame.physical(event.centre)
            place = "(" + ", ".join(f"{float(x):.6f}" for x in where) + ")"
            self.transfers.append(event)
            events.append(Event(event.kind, t, describe(event, place)))
        self.atoms = atoms
        self.field.atoms = atoms
        if rho is not density:
            density[...] = rho
        if atoms.count and frame is not None and not self.closure_warned:
            self._check_closure(density, t, events, frame)
        return density

    def _check_closure(self, density: np.ndarray, t: float, events: list, frame) -> None:
        """One ``atom_closure`` event when an atom's width times the largest tilt passes
        :data:`CLOSURE_TILT` (the field's ``frame_atom_closure``): from then on the atoms'
        Gaussian tails, not the clusters' shapes, decide the sums."""
        from .monitor import Event

        found = self.field.frame_atom_closure(density, self.grid, t, self.atoms, frame)
        if found is None or not np.any(found > CLOSURE_TILT):
            return
        k = int(np.argmax(found))
        self.closure_warned = True
        events.append(
            Event(
                "atom_closure",
                t,
                f"atom {int(self.atoms.ids[k])}'s Gaussian closure no longer holds at t = "
                f"{t:.6g}: its width times the largest tilt is {float(found[k]):.3g} > "
                f"{CLOSURE_TILT:g}, so the sums feel its Gaussian tails rather than the "
                "cluster's shape; results from here on are not held (refine the grid: "
                "narrower atoms)",
            )
        )


#: an atom's Gaussian closure holds while sqrt(c^T S c) over the measure's tilts stays below
#: this (the cumulant expansion of log Z past second order is then small)
CLOSURE_TILT = 1.0


#: the pinning watch looks at the clusters every this many steps (a cheap check)
PIN_EVERY = 10


class PinningWatch:
    """With atoms off: one ``pinned`` event when a collapsed cluster's drift falls below what
    its cells can move, about ``h / 2`` per unit time (docs/theory.md, 'Metastability on the
    circle'). A cluster counts as collapsed by the conversion's width test (narrower than
    ``AtomOptions().width`` cells); its drift is the velocity an atom with its moments would
    have. ``maybe(problem)``: a watch where the field and grid could hold atoms, else None."""

    def __init__(self, problem):
        self.field = problem.velocity
        self.grid = problem.grid
        self.cells = PeriodicCells(
            float(self.grid.lower[0]), float(self.grid.spacing[0]), self.grid.cells[0]
        )
        from .atoms import AtomOptions

        self.options = AtomOptions()
        self.steps = 0
        self.warned = False

    @staticmethod
    def maybe(problem) -> PinningWatch | None:
        grid = problem.grid
        if (
            problem.atoms is not None
            or not problem.velocity.has_atoms()
            or grid.ndim != 1
            or grid.boundary[0] != "periodic"
            or problem.positions is not None
            or problem.frame is not None
        ):
            return None
        return PinningWatch(problem)

    def check(self, density: np.ndarray, t: float, events: list) -> None:
        from .monitor import Event

        self.steps += 1
        if self.warned or self.steps % PIN_EVERY:
            return
        rho, candidates, _, _ = convert(density, self.cells, Atoms.empty(1), self.options, t, 0)
        if candidates.count == 0:
            return
        try:
            u, _, _ = self.field.atom_velocity(rho, self.grid, t, candidates)
        except ValueError:  # (a field or grid the atoms' sums do not serve)
            self.warned = True
            return
        drift = np.abs(u[:, 0])
        half = 0.5 * self.cells.h
        slow = np.flatnonzero(drift < half)
        if slow.size == 0:
            return
        k = int(slow[np.argmax(candidates.mass[slow])])
        v = max(float(drift[k]), 1e-300)
        needed = int(2 ** math.ceil(math.log2(max(math.pi / v, 1.0))))
        events.append(
            Event(
                "pinned",
                t,
                f"a collapsed cluster at {float(candidates.centre[k, 0]):.4f} (mass "
                f"{float(candidates.mass[k]):.4g}) drifts at {v:.2e} < h / 2 = {half:.2e} at "
                f"t = {t:.6g}: its cells cannot move it and hold it pinned from here; turn "
                f"atoms on ([atoms]) or use at least {needed} cells (h < 2 x drift)",
            )
        )
        self.warned = True
