"""The time loop: SSP Runge-Kutta over the finite-volume operator, with events and snapshots.

Data flow of one step (docs/architecture.md, 'One step')::

    for each SSP-RK stage k:
        u_faces = velocity.at(u^(k), grid, t + c_k dt, face nodes)   # nonlocal: every stage
        F       = high-order face fluxes of u^(k)
        Euler   = u^(k) - (beta/alpha) dt div F   (positivity-limited)
        u^(k+1) = convex combination of the u^(j) and the Euler steps

The time step is ``dt = cfl / max_c sum_a (u+_{c+1/2} - u-_{c-1/2}) / h_a`` from the stage-0
velocity (``cfl <= 1``: the positivity bound of the limiter), shortened to land exactly on
every snapshot time. A step whose stage velocity grew past the bound is rejected and redone
with half the step. Events end a run: a non-finite value (:class:`SimulationError`, naming
time and step) and mass leaving the box above ``max_outflow`` (status ``mass_left_domain``).

The loop itself is :class:`.loop.TimeLoop`'s, shared with the cubed sphere: :class:`Solver`
supplies the flat operator side (``plan``, ``land``, ``attempt``, ``snapshot``) and its
callbacks (the step budget, :class:`FrameStepControl` / :class:`NoiseStepControl`, the
resolution monitor, the atom transfers, :class:`OutflowGuard`, :class:`BoxMonitor`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

import numpy as np

from tpde.grid import Grid, Positions, moments, profile
from tpde.grid.threads import ensure_policy

from . import kernels
from .atom_run import AtomRun, PinningWatch
from .atoms import AtomOptions, Atoms, merge_moments
from .diffusion import Diffusion, check_noise, frame_step_bound, quantised_step
from .frame import (
    FRAMES,
    AffineFrame,
    FitPoints,
    affine_fit,
    embedded_error,
    face_density,
    frame_step_tolerance,
    narrowed,
    rough_rates,
    truncation_indicator,
    unheld_share,
)
from .loop import (
    FAILURE_REASONS,
    MAX_STEPS,
    STEP_TRIES,
    AtomTransfers,
    Callback,
    ResolutionMonitor,
    SimulationError,
    StepBudget,
    StepPlan,
    Stop,
    TimeLoop,
    plain_snapshot_callbacks,
)
from .monitor import (
    BOX_ACTIONS,
    RESOLUTION_ACTION,
    RESOLUTION_ACTIONS,
    RESOLUTION_TOLERANCE,
    Event,
    Monitor,
    cluster_width,
    event_lines,
    reconstruction_error_rate,
)
from .operator import (
    FACE_VELOCITIES,
    FaceVelocity,
    FluxOperator,
    PositivityError,
    check_face_quadrature,
)
from .reconstruction import get_reconstruction
from .rk import get_integrator
from .velocity import VelocityField

__all__ = [
    "FAILURE_REASONS",
    "MAX_STEPS",
    "STEP_TRIES",
    "STATUSES",
    "SimulationError",
    "FrameStepRejected",
    "Scheme",
    "Problem",
    "Snapshot",
    "Result",
    "Solver",
    "FrameStepControl",
    "NoiseStepControl",
    "OutflowGuard",
    "BoxMonitor",
    "simulate_transport",
]

STATUSES = (
    "completed",
    "blowup",
    "box_limited",
    "under_resolved",
    "mass_left_domain",
    "interrupted",
    "failed",
)


class FrameStepRejected(ArithmeticError):
    """A step whose frame error exceeded the tolerance (redone with a shorter step)."""

    def __init__(self, error: float, tolerance: float):
        super().__init__(f"frame error {error:.3e} > {tolerance:.1e}")
        self.error = error


@dataclass
class Scheme:
    """Numerical method.

    reconstruction : "upwind" | "muscl" (minmod) | "muscl-mc" | "muscl-vanleer" | "weno5"
        (WENO5-JS) | "weno5z" (default).
    integrator : "ssprk1" | "ssprk2" | "ssprk3" (default).
    cfl : float in (0, 1], default 0.4. Fraction of the positivity bound
        ``1 / max_c sum_a outflow_rate_a(c)``; for a constant velocity this is the usual
        ``dt * sum_a |u_a| / h_a``.
    dt : float or None. Fixed step (still shortened to land on snapshot times); it must
        satisfy the CFL bound 1, else the run fails with a clear message.
    dt_max : float or None. Upper bound on the adaptive step.
    face_quadrature : "auto" | "midpoint" | "gauss" (see tpde.schemes.operator).
    face_velocity : "auto" | "exact" | "interpolated". How the velocity reaches the Gauss
        nodes of the faces (d >= 2): "exact" evaluates the field at every node (3^(d-1)
        lattices per axis); "interpolated" evaluates the normal component at the face
        centres only (one lattice per axis) and interpolates it along the faces with
        8-point Lagrange stencils (error O(h^8), below the scheme's O(h^5)). "auto"
        (default) interpolates for fields that change in time (attention: 3x fewer kernel
        evaluations in 2-D, 9x in 3-D) and evaluates steady fields exactly (once per run).
        Interpolation needs >= 8 cells per axis; smaller grids evaluate exactly.
    positivity : bool, default True. The positivity-preserving flux limiter.
    frame : "fixed" (default) | "affine". "affine": the grid is the co-moving frame of
        :mod:`tpde.schemes.frame` (the problem then carries the initial
        :class:`~tpde.schemes.frame.AffineFrame` and its density is the frame density).
    frame_tolerance : float, default 1e-10. Local error allowed per step in the frame
        (relative to ||L||), estimated by the SSP-RK3 stages' embedded Heun step; the step
        is shortened (or rejected) to meet it.
    """

    reconstruction: str = "weno5z"
    integrator: str = "ssprk3"
    cfl: float = 0.4
    dt: float | None = None
    dt_max: float | None = None
    face_quadrature: str = "auto"
    face_velocity: str = "auto"
    positivity: bool = True
    frame: str = "fixed"
    frame_tolerance: float = 1e-10

    def validate(self) -> None:
        """Check every option (types, then values); ValueError naming ``scheme.<option>``.
        The one check of these options: tpde.config passes the [scheme] table here."""
        for option in fields(self):
            value, default = getattr(self, option.name), option.default
            if not isinstance(default, bool | str | int | float | None):
                continue  # (no plain default: the field checks itself below)
            if isinstance(default, bool):
                ok, kind = isinstance(value, bool), "true or false"
            elif isinstance(default, str):
                ok, kind = isinstance(value, str), "a name"
            else:  # a number (None where the default is None)
                number = isinstance(value, int | float) and not isinstance(value, bool)
                ok, kind = number or (value is None and default is None), "a number"
            if not ok:
                raise ValueError(f"scheme.{option.name}: expected {kind}, got {value!r:.60}")
        get_reconstruction(self.reconstruction)
        get_integrator(self.integrator)
        if not (isinstance(self.cfl, int | float) and 0.0 < self.cfl <= 1.0):
            raise ValueError(
                f"scheme.cfl: {self.cfl!r} is outside (0, 1]; the positivity "
                "bound of the flux limiter is 1 (default 0.4)"
            )
        for name in ("dt", "dt_max"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"scheme.{name}: must be a positive number, got {value!r}")
        check_face_quadrature(self.face_quadrature)
        if self.frame not in FRAMES:
            raise ValueError(
                f"scheme.frame: unknown {self.frame!r}; choose one of {', '.join(FRAMES)}"
            )
        if self.frame == "affine" and self.integrator != "ssprk3":
            raise ValueError(
                "scheme.frame: the affine frame controls its step with the SSP-RK3 stages; "
                'set scheme.integrator = "ssprk3"'
            )
        if not (math.isfinite(self.frame_tolerance) and 0.0 < self.frame_tolerance < 1.0):
            raise ValueError(
                f"scheme.frame_tolerance: must be in (0, 1), got {self.frame_tolerance!r}"
            )
        if self.face_velocity not in FACE_VELOCITIES:
            raise ValueError(
                f"scheme.face_velocity: unknown {self.face_velocity!r}; "
                f"choose one of {', '.join(FACE_VELOCITIES)}"
            )


def snapshot_times(t_start: float, t_end: float, snapshots: int | Sequence[float]) -> np.ndarray:
    """Snapshot times: an int n gives n equally spaced times from t_start to t_end inclusive."""
    if isinstance(snapshots, int | np.integer):
        if snapshots < 2:
            raise ValueError(f"run.snapshots: need at least 2 (start and end), got {snapshots}")
        return np.linspace(t_start, t_end, int(snapshots))
    times = np.asarray(snapshots, dtype=float)
    if times.ndim != 1 or times.size < 1 or not np.all(np.isfinite(times)):
        raise ValueError("run.snapshots: expected an integer or a list of finite times")
    if np.any(np.diff(times) <= 0) or times[0] < t_start or times[-1] > t_end:
        raise ValueError("run.snapshots: times must increase within [t_start, t_end]")
    return times


@dataclass
class Problem:
    """Everything that defines a run.

    grid : Grid. density : initial cell averages, shape grid.shape (>= 0, finite).
    velocity : a :class:`tpde.variants.VelocityField` (prescribed or attention).
    t_end : final time (> t_start). snapshots : int (equally spaced, ends included) or times.
    max_outflow : the run ends with status ``mass_left_domain`` when the mass that left
        through outflow boundaries exceeds this fraction of the initial mass (default 1e-3).
    initial_outflow : mass that had already left before t_start (a resumed run); the initial
        mass is then ``mass(density) + initial_outflow``.
    positions : a :class:`tpde.grid.Positions` for masked (causal) attention, else None.
        The density then has shape ``(positions.count, *grid.shape)``: one slice per
        position, each transported in x only (the position marginal is invariant).
    frame : the initial :class:`~tpde.schemes.frame.AffineFrame` when ``scheme.frame =
        "affine"`` (grid and density are then the frame's), else None.
    box_tolerance : the run stops with ``box_limited`` (or ``blowup``) when the box no
        longer holds the dynamics: the mass in the outer cells, or the mass-weighted cut of
        the tilted laws behind the velocity, above this (default 1e-4; :mod:`.monitor`).
    box_action : "stop" (default) | "warn" (record a ``box_limited`` event and go on).
    collapse_ratio : record a ``collapse`` event when the covariance's smallest/largest
        eigenvalue ratio falls below this (default 1e-4).
    resolution_tolerance : record an ``under_resolved`` event when the estimated share of the
        mass the reconstruction has misplaced since t = 0 exceeds this (default
        RESOLUTION_TOLERANCE = 1e-3; :mod:`.monitor`). resolution_action : "warn" (default:
        the event, and the run goes on) | "stop" (the run ends with status ``under_resolved``
        at the tolerance) | "warn_then_stop" (the event; a fixed box ends ``under_resolved``
        before the estimate passes RESOLUTION_STOP_FACTOR = 10 times the tolerance).
        initial_reconstruction_error : that estimate at t_start (a resumed run).
    noise : eps >= 0 of the noisy PDE ``d/dt mu + div(mu Gamma) = eps Delta mu`` (default 0):
        Strang splitting with the exact diffusion substep of :mod:`.diffusion`.
    """

    grid: Grid
    density: np.ndarray
    velocity: VelocityField
    t_end: float
    scheme: Scheme = field(default_factory=Scheme)
    snapshots: int | Sequence[float] = 2
    t_start: float = 0.0
    max_outflow: float = 1e-3
    max_steps: int = MAX_STEPS
    initial_outflow: float = 0.0
    positions: Positions | None = None
    frame: AffineFrame | None = None
    box_tolerance: float = 1e-4
    box_action: str = "stop"
    collapse_ratio: float = 1e-4
    resolution_tolerance: float = RESOLUTION_TOLERANCE
    resolution_action: str = RESOLUTION_ACTION
    initial_reconstruction_error: float = 0.0
    noise: float = 0.0
    #: atoms on (:class:`~tpde.schemes.atoms.AtomOptions`) or None (off); the atoms at
    #: t_start and the next atom id (a resumed run)
    atoms: AtomOptions | None = None
    initial_atoms: Atoms | None = None
    next_atom_id: int = 0

    def __post_init__(self) -> None:
        self.noise = check_noise(self.noise)
        leading = () if self.positions is None else (self.positions.count,)
        self.density = self.grid.check_density(self.density, "initial density", leading)
        self.scheme.validate()
        if not isinstance(self.velocity, VelocityField):
            raise TypeError("velocity: expected a tpde.variants.VelocityField")
        if not (math.isfinite(self.t_end) and self.t_end > self.t_start):
            raise ValueError(
                f"run.t_end: must be finite and > t_start = {self.t_start}, got {self.t_end}"
            )
        if not self.max_outflow > 0:
            raise ValueError(f"run.max_outflow: must be > 0, got {self.max_outflow}")
        if not (math.isfinite(self.box_tolerance) and 0.0 < self.box_tolerance < 1.0):
            raise ValueError(f"run.box_tolerance: must be in (0, 1), got {self.box_tolerance!r}")
        if not (math.isfinite(self.resolution_tolerance) and self.resolution_tolerance > 0):
            raise ValueError(
                f"run.resolution_tolerance: must be > 0, got {self.resolution_tolerance!r}"
            )
        if self.resolution_action not in RESOLUTION_ACTIONS:
            raise ValueError(
                f"run.resolution_action: unknown {self.resolution_action!r}; choose one of "
                f"{', '.join(RESOLUTION_ACTIONS)}"
            )
        if self.box_action not in BOX_ACTIONS:
            raise ValueError(
                f"run.box_action: unknown {self.box_action!r}; choose one of "
                f"{', '.join(BOX_ACTIONS)}"
            )
        if not (math.isfinite(self.collapse_ratio) and 0.0 < self.collapse_ratio < 1.0):
            raise ValueError(f"run.collapse_ratio: must be in (0, 1), got {self.collapse_ratio!r}")
        self.times = snapshot_times(self.t_start, self.t_end, self.snapshots)
        if (self.frame is not None) != (self.scheme.frame == "affine"):
            raise ValueError(
                "scheme.frame: a problem in the affine frame needs scheme.frame = "
                '"affine" and its initial AffineFrame (Problem.frame), and only then'
            )
        if self.frame is not None:
            if self.positions is not None:
                raise ValueError("scheme.frame: the affine frame does not support masked attention")
            if self.frame.mean.size != self.grid.ndim:
                raise ValueError(
                    f"frame: a {self.frame.mean.size}-D frame for a {self.grid.ndim}-D grid"
                )
        if self.grid.size and self.grid.integrate(self.density) <= 0:
            raise ValueError("initial density: zero mass in the box")


@dataclass
class Snapshot:
    time: float
    density: np.ndarray
    mass: float
    outflow: float
    max_speed: float
    dt: float
    step: int
    frame: AffineFrame | None = None
    #: the atoms (None: atoms off) and the id the next atom will get
    atoms: Atoms | None = None
    next_atom_id: int = 0
    #: the loop's :meth:`.loop.TimeLoop.monitor_state` at this snapshot (what a run resumed
    #: from it restores: the resolution estimate, the warnings already given)
    state: dict = field(default_factory=dict)
    #: the run segment's events up to this snapshot (:func:`.monitor.event_lines`): stored
    #: with its record, so a killed run's file keeps what happened before its last record
    events: str = ""


@dataclass
class Result:
    """What a run produced: the snapshots and how it ended."""

    grid: Grid
    snapshots: list[Snapshot]
    status: str = "completed"
    status_time: float = float("nan")
    status_message: str = ""
    #: the typed cause of a ``failed`` status (:data:`FAILURE_REASONS`), else ""
    status_reason: str = ""
    steps: int = 0
    rejected_steps: int = 0
    limited_stages: int = 0
    wall_time: float = 0.0
    positions: Positions | None = None
    events: list[Event] = field(default_factory=list)
    #: the largest truncation measure the monitor saw (schemes.monitor; 0 if not measured)
    truncation: float = 0.0
    #: the resolution monitor's estimate at the end (schemes.monitor; 0 if not measured)
    reconstruction_error: float = 0.0
    #: the atoms' births, merges and releases (schemes.atom_cells.AtomTransfer)
    atom_transfers: list = field(default_factory=list)

    @property
    def times(self) -> np.ndarray:
        return np.array([s.time for s in self.snapshots])

    def to_xarray(self, **kwargs: object) -> object:
        """The run as an ``xarray.Dataset``: the variables and attributes of the file
        ``tpde run`` writes (``tpde.io.to_dataset``; ``tpde.io.write(result, path)`` writes
        that file). kwargs: ``order`` ("xyz" or "file"), ``config_text``, ``title``.

        The converter is the entry point ``xarray`` of the group :data:`EXPORTERS`, which
        the face declares (pyproject.toml): the physics names no module of the face."""
        return _exporter("xarray")(self, **kwargs)

    @property
    def densities(self) -> np.ndarray:
        return np.stack([s.density for s in self.snapshots])

    @property
    def final(self) -> np.ndarray:
        return self.snapshots[-1].density


#: the entry-point group of Result's converters (``xarray = "tpde.io:to_dataset"``)
EXPORTERS = "tpde.exporters"


def _exporter(name: str) -> Callable[..., object]:
    from importlib.metadata import entry_points

    found = list(entry_points(group=EXPORTERS, name=name))
    if not found:
        raise RuntimeError(
            f"Result.to_{name}: no converter {name!r} in the entry points {EXPORTERS!r}; "
            "reinstall tpde (pip install -e .)"
        )
    return found[0].load()


class Solver(TimeLoop):
    """Advances a :class:`Problem` on a flat grid (fixed box, co-moving frame, position
    slices, atoms). ``run()`` goes to t_end; ``step(dt)`` does one step.

    The loop is :class:`.loop.TimeLoop`'s; ``self.callbacks`` runs, in order, the step
    budget, the frame's or the noise's step control, the resolution monitor, the atom
    transfers, the outflow guard and the box / collapse / blow-up monitor
    (:class:`BoxMonitor`), then ``on_snapshot``: callables called with each snapshot (a
    writer, a progress bar), or :class:`.loop.Callback` objects with hooks of their own.
    """

    retryable = (PositivityError, FrameStepRejected)

    def __init__(
        self, problem: Problem, on_snapshot: Callable[[Snapshot], None] | Sequence[Callable] = ()
    ):
        ensure_policy()
        self.problem = problem
        self.grid = problem.grid
        scheme = problem.scheme
        self.integrator = get_integrator(scheme.integrator)
        positions = problem.positions
        self.operator = FluxOperator(
            self.grid,
            scheme.reconstruction,
            scheme.face_quadrature,
            scheme.positivity,
            None if positions is None else positions.count,
        )
        face_constant = problem.velocity.face_constant
        self.nodes = self.operator.face_nodes(face_constant)
        self.interpolate_faces = (
            scheme.face_velocity != "exact"
            and self.operator.can_interpolate(face_constant)
            and (scheme.face_velocity == "interpolated" or not problem.velocity.steady)
        )
        self.t = float(problem.t_start)
        self.density = problem.density.copy()
        self.outflow = float(problem.initial_outflow)
        self.atom_run = None if problem.atoms is None else AtomRun(problem, self.density)
        self.pin_watch = PinningWatch.maybe(problem)  # atoms off: say when a cluster pins
        self.mass0 = self.grid.integrate(self.density) + self.outflow
        if self.atom_run is not None:
            self.mass0 += self.atom_run.atoms.total_mass
        self.steps = 0
        self.rejected = 0
        self.last_dt = float("nan")
        self.last_speed = float("nan")
        self._steady_velocity: FaceVelocity | None = None
        self._steady_bound: float | None = None
        # work arrays for the intermediate stages u^(1) .. u^(s-1) (u^(0) is self.density)
        self._stage = [np.empty(self.operator.shape) for _ in range(self.integrator.stages - 1)]
        self._last_stage0_use = max(
            i
            for i in range(self.integrator.stages)
            if self.integrator.alpha[i][0] != 0.0 and self.integrator.beta[i][0] != 0.0
        )
        self._euler = np.empty(self.operator.shape)
        self._next = np.empty(self.operator.shape)
        # the co-moving frame (None: fixed box) and the step its accuracy allows
        self.frame = problem.frame
        self._frame_dt = math.inf
        self._cells_rate = 0.0  # the cells' error rate at the step's start (frame tolerance)
        # the frame's densest cluster's width in cells at the run's start (FrameNarrowing;
        # None: not measured yet, a resumed run restores it with the monitor state)
        self.frame_width0: float | None = None
        # the largest fraction of the mass whose velocity the box did not hold, since the
        # last check (variants.truncation; 0 where the field does not measure it)
        self.truncation = 0.0
        self.monitor = Monitor(problem.box_tolerance, problem.box_action, problem.collapse_ratio)
        self.monitor.resolution_tolerance = problem.resolution_tolerance
        self.monitor.resolution_action = problem.resolution_action
        self.monitor.watch_resolution(
            self.grid, problem.t_end, self.frame is not None, problem.velocity.has_frame()
        )
        self.monitor.reconstruction_error = float(problem.initial_reconstruction_error)
        if (
            self.atom_run is not None
            and self.atom_run.identity is not None
            and problem.initial_atoms is None
        ):
            # a fixed box converts the clusters of its data before the first step: that step
            # is the cells' CFL step (not the frame's 1e-3 of its time scale), and a bump
            # narrower than a cell left on the cells for it is smeared into its neighbours.
            # Without atoms the transfer is a function of the density alone and leaves a
            # density it has converted unchanged, so a resumed run (whose density is a
            # transfer's) repeats the uninterrupted one; with atoms given it is skipped
            self.density = self.atom_run.transfer(self.density, self.t, self.monitor.events)
        self.status_message = ""
        self.status_reason = ""  # (a failed status's FAILURE_REASONS entry)
        # noise: the exact diffusion substeps around each transport step (.diffusion)
        self.diffusion = (
            Diffusion(self.grid, problem.noise, self.operator.lead) if problem.noise else None
        )
        if self.frame is not None and not self.interpolate_faces:
            raise ValueError(
                "scheme.frame: the affine frame needs the interpolated face velocity "
                '(scheme.face_velocity = "auto" or "interpolated", >= 8 cells per axis)'
            )
        steering: list[Callback] = [StepBudget(problem.max_steps)]
        if self.frame is not None:
            steering.append(FrameStepControl())
        elif self.diffusion is not None and scheme.dt is None:
            steering.append(NoiseStepControl())
        steering.append(ResolutionMonitor())
        if self.atom_run is not None or self.pin_watch is not None:
            steering.append(AtomTransfers())
        steering += [OutflowGuard(), BoxMonitor()]
        if self.frame is not None and self.atom_run is None:
            steering.append(FrameNarrowing())
        self.callbacks = [*steering, *plain_snapshot_callbacks(on_snapshot)]

    # ---- velocity on the faces ---------------------------------------------------------------
    @profile.timed("velocity")
    def face_velocity(
        self,
        density: np.ndarray,
        t: float,
        frame: AffineFrame | None = None,
        measure: bool = True,
    ) -> FaceVelocity:
        """Evaluate the velocity field on every face node the scheme asked for.

        A steady field (``velocity.steady``) is evaluated once and reused. In the affine
        frame (``frame`` given) the field is the residual ``w`` of :mod:`.frame` and the
        returned object carries the frame's rates as ``frame_rates``. ``measure``: whether
        a fixed-box evaluation measures the velocity's cut (the stage-0 evaluation of each
        step does; the frame always measures it, its fit needs it).
        """
        if self._steady_velocity is not None:
            return self._steady_velocity
        field, d = self.problem.velocity, self.grid.ndim
        weights = [w for _, w in self.nodes]
        if self.interpolate_faces:  # normal components at the face centres, then along faces
            centres = [np.where(np.arange(d) == a, 0.5, 0.0) for a in range(d)]
            field.measure_cut = measure
            if frame is None:
                normal = field.components(density, self.grid, t, centres, list(range(d)))
            else:
                normal = field.frame_components(
                    density, self.grid, t, centres, list(range(d)), frame
                )
            cut = field.cut
            held = faces = None
            if cut is not None:
                faces = [face_density(density, a) for a in range(d)]
                found = truncation_indicator(faces, cut)
                if frame is not None:
                    # the frame keeps faces it does not hold on its affine fit: their mass
                    # is what that extrapolation moves, and counts as truncated
                    held = [c <= field.held_cut for c in cut]
                    found = max(found, unheld_share(faces, held))
                self.truncation = max(self.truncation, found)
            if frame is not None:
                points = self._fit_points(density, t, frame)
                normal, rates = affine_fit(density, self.grid, normal, frame, held, faces, points)
                if not (np.all(np.isfinite(rates.mean)) and np.all(np.isfinite(rates.matrix))):
                    raise SimulationError(f"frame: non-finite rates at t = {t:.6g}")
            values = list(normal)  # the operator interpolates them along the faces
        else:
            offsets = [off for node_offsets, _ in self.nodes for off in node_offsets]
            axes = [a for a, (node_offsets, _) in enumerate(self.nodes) for _ in node_offsets]
            lattices = iter(field.components(density, self.grid, t, offsets, axes))
            values = [
                np.stack([next(lattices) for _ in node_offsets]) for node_offsets, _ in self.nodes
            ]
        try:
            if self.interpolate_faces:
                velocity = self.operator.centre_face_velocity(values, weights)
            else:
                velocity = self.operator.face_velocity(values, weights, copy=False)
        except FloatingPointError as exc:
            raise SimulationError(f"{exc} at t = {t:.6g}, step {self.steps}") from None
        if frame is not None:
            velocity.frame_rates = rates
        elif self.problem.velocity.steady:
            self._steady_velocity = velocity
        return velocity

    def _fit_points(self, density: np.ndarray, t: float, frame: AffineFrame) -> FitPoints | None:
        """The frame's atoms (the field's, set by the atom run for this stage) as weighted
        points of its fit, with the field at their centres (None: no atoms)."""
        atoms = None if self.atom_run is None else self.problem.velocity.atoms
        if atoms is None or not atoms.count:
            return None
        u, du, d2u = self.problem.velocity.frame_atom_velocity(density, self.grid, t, atoms, frame)
        volume = float(np.prod(self.grid.spacing))
        return FitPoints(atoms.mass / volume, atoms.centre, atoms.cov, u, du, d2u)

    def reconstruction_error_rate(self, velocity: FaceVelocity) -> float:
        """The resolution monitor's rate at the step's start (:mod:`.monitor`), from the
        face-mean normal velocity (the residual ``w`` in the frame). Position slices (masked
        attention) are watched one by one; the largest rate counts."""
        normal = [p + m for p, m in zip(velocity.positive, velocity.negative, strict=True)]
        if self.problem.positions is None:
            return reconstruction_error_rate(
                self.density, self.grid, normal, partial(self.operator.face_states, self.density)
            )
        states = []
        for a in range(self.grid.ndim):  # (copies: the operator's work arrays are reused)
            left, right = self.operator.face_states(self.density, a)
            states.append((left.copy(), right.copy()))

        def of_slice(k: int, a: int) -> tuple[np.ndarray, np.ndarray]:
            return states[a][0][k], states[a][1][k]

        return max(
            reconstruction_error_rate(
                self.density[k], self.grid, [u[k] for u in normal], partial(of_slice, k)
            )
            for k in range(self.density.shape[0])
        )

    def stable_dt(self, velocity: FaceVelocity) -> float:
        """The positivity bound 1 / max outflow rate (cached for a steady field)."""
        if velocity is self._steady_velocity and self._steady_bound is not None:
            return self._steady_bound
        rate = self.operator.outflow_rate(velocity)
        bound = math.inf if rate <= 0 else 1.0 / rate
        if velocity is self._steady_velocity:
            self._steady_bound = bound
        return bound

    # ---- one step ---------------------------------------------------------------------------
    def step(self, dt: float, velocity0: FaceVelocity | None = None) -> None:
        """Advance ``self.density`` by one SSP-RK step of size dt (raises PositivityError)."""
        rk = self.integrator
        c = rk.stage_times
        stages = [self.density] + self._stage
        stage_outflow = [0.0] * rk.stages
        # the frame of each stage (None: fixed box), combined like the densities
        frames: list[AffineFrame | None] = [self.frame] + [None] * (rk.stages - 1)
        atoms = None if self.atom_run is None else self.atom_run.stages(rk.stages)
        out = self._next
        flat_out = out.reshape(-1)
        for i in range(rk.stages):
            first = True
            new_outflow = 0.0
            frame_weights: list[float] = []
            frame_terms: list[AffineFrame] = []
            for k, (alpha, beta) in enumerate(zip(rk.alpha[i], rk.beta[i], strict=True)):
                if alpha == 0.0:
                    continue
                if beta == 0.0:
                    term = stages[k]
                    new_outflow += alpha * stage_outflow[k]
                    frame_term = frames[k]
                    if atoms is not None:
                        atoms.keep(k, alpha)
                else:
                    if atoms is not None:  # the field sees stage k's atoms
                        atoms.see(k)
                    if k == 0 and velocity0 is not None:
                        vel = velocity0
                        if i == self._last_stage0_use:
                            velocity0 = None  # memory: one FaceVelocity alive at a time
                    else:
                        vel = self.face_velocity(
                            stages[k], self._stage_time(c[k], dt), frames[k], measure=k == 0
                        )
                    if atoms is not None:  # ... and they move with it
                        atoms.move(
                            k,
                            alpha,
                            beta / alpha * dt,
                            stages[k],
                            self._stage_time(c[k], dt),
                            None if vel.frame_rates is None else vel.frame_rates.points,
                        )
                    frame_term = frames[k]
                    if frame_term is not None:
                        assert vel.frame_rates is not None  # (evaluated in this frame)
                        frame_term = frame_term.advanced(vel.frame_rates, beta / alpha * dt)
                    left = self.operator.euler_step(stages[k], vel, beta / alpha * dt, self._euler)
                    del vel  # memory: one FaceVelocity alive at a time
                    term = self._euler
                    new_outflow += alpha * (stage_outflow[k] + left)
                if frame_term is not None:
                    frame_weights.append(alpha)
                    frame_terms.append(frame_term)
                with profile.phase("rk.combine"):
                    if first:
                        np.multiply(term, alpha, out=out)
                        first = False
                    else:
                        kernels.axpy(flat_out, alpha, term.reshape(-1))
            frame_out = AffineFrame.combination(frame_weights, frame_terms) if frame_terms else None
            if atoms is not None:
                atoms.combine(i)
            if i + 1 < rk.stages:
                stages[i + 1][...] = out
                stage_outflow[i + 1] = new_outflow
                frames[i + 1] = frame_out
            else:
                final_outflow = new_outflow
        if frame_out is not None:
            # the frame's own accuracy: SSP-RK3 against its embedded Heun step
            start, heun = frames[0], frames[2]
            assert start is not None and heun is not None  # (every stage has a frame then)
            error = embedded_error(start, heun, frame_out)
            if atoms is not None:  # (the atoms' centres and widths, in frame coordinates)
                error = max(error, atoms.embedded_error())
            tolerance = self.frame_tolerance(dt)
            factor = 0.9 * (tolerance / error) ** (1.0 / 3.0) if error > 0 else 4.0
            self._frame_dt = dt * min(4.0, max(0.2, factor))
            if error > 2.0 * tolerance:
                raise FrameStepRejected(error, tolerance)
        if not kernels.all_finite(flat_out):
            raise SimulationError(
                f"non-finite density at t = {self.t + dt:.6g}, step {self.steps + 1}"
            )
        self.density, self._next = out, self.density
        self.frame = frame_out
        if atoms is not None:
            atoms.accept()
        self.outflow += final_outflow
        self.t += dt
        self.steps += 1
        self.last_dt = dt

    def noisy_step(self, dt: float) -> None:
        """Strang splitting: diffusion dt / 2, the transport step (its stage-0 velocity from
        the diffused density), diffusion dt / 2 (second order; :mod:`.diffusion`). A rejected
        transport step leaves the density as it was before the first half."""
        assert self.diffusion is not None
        start = self.density
        matrix = None if self.frame is None else self.frame.matrix
        self.density, left = self.diffusion.step(start, 0.5 * dt, matrix)
        # the atoms' half substeps, exact: variance + 2 eps (dt / 2) (AtomRun.diffuse)
        spread = self.problem.noise * dt
        atoms = None if self.atom_run is None else self.atom_run.diffuse(spread)
        try:
            self.step(dt)
        except (PositivityError, FrameStepRejected):
            self.density = start
            if self.atom_run is not None and atoms is not None:
                self.atom_run.restore(atoms)
            raise
        matrix = None if self.frame is None else self.frame.matrix
        self.density, right = self.diffusion.step(self.density, 0.5 * dt, matrix)
        if self.atom_run is not None:
            self.atom_run.diffuse(spread)
        self.outflow += left + right

    def frame_tolerance(self, dt: float) -> float:
        """The frame's allowed local error in a step of ``dt``: the scheme's tolerance or the
        cells' share (:func:`.frame.frame_step_tolerance`). With atoms the scheme's tolerance
        alone: the cells' error there is that of the clusters about to become atoms, whose
        motion is exact, not an error of the measure the frame could hide in."""
        if self.atom_run is not None:
            return self.problem.scheme.frame_tolerance
        return frame_step_tolerance(self.problem.scheme.frame_tolerance, self._cells_rate, dt)

    def _initial_frame_dt(self, velocity: FaceVelocity) -> float:
        """Before the first frame step: 1e-3 of the frame's time scale 1 / ||G||."""
        if math.isfinite(self._frame_dt):
            return math.inf
        assert velocity.frame_rates is not None  # (called in frame runs only)
        gain = velocity.frame_rates.gain
        rate = float(np.linalg.norm(gain, 2))
        return 1e-3 / rate if rate > 0 else math.inf

    def _stage_time(self, fraction: float, dt: float) -> float:
        """t + c_k dt; a stage at the end of the step (c_k = 1) is taken a hair before it,
        so that a step ending on a layer start uses the layer it belongs to (the left limit:
        parameters are right-continuous, docs/theory.md, 'Layer-wise parameters')."""
        t = self.t + fraction * dt
        if fraction == 1.0:
            t -= min(1e-12 * max(1.0, abs(t)), 1e-3 * dt)
        return t

    # ---- the run ----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        # warm starts never cross a snapshot: a run resumed from one repeats this run (the
        # frame's step controller too: it restarts from its first-step rule)
        self.problem.velocity.reset()
        self._frame_dt = math.inf
        snap = Snapshot(
            time=self.t,
            density=self.density.copy(),
            mass=self.grid.integrate(self.density),
            outflow=self.outflow,
            max_speed=self.last_speed,
            dt=self.last_dt,
            step=self.steps,
            frame=self.frame,
        )
        if self.atom_run is not None:
            snap.atoms = self.atom_run.atoms
            snap.next_atom_id = self.atom_run.next_id
            snap.mass += snap.atoms.total_mass
        snap.state = self.monitor_state()
        snap.events = event_lines(self.monitor.events)
        self.handed(snap)
        return snap

    def monitor_state(self) -> dict[str, float | bool | int]:
        """The resolution estimate and warned flag, the box's ``warn`` flag, the frame
        atoms' ``atom_closure`` flag and the pinning watch's flag and step count."""
        monitor = self.monitor
        state: dict[str, float | bool | int] = {
            "reconstruction_error": float(monitor.reconstruction_error),
            "resolution_warned": bool(monitor.resolution_warned),
            "box_warned": bool(monitor.warned),
        }
        if self.atom_run is not None:
            state["atom_closure_warned"] = bool(self.atom_run.closure_warned)
        if self.pin_watch is not None:
            state["pinning_warned"] = bool(self.pin_watch.warned)
            state["pinning_steps"] = int(self.pin_watch.steps)
        if self.frame_width0 is not None:  # (inf: no peak at the start, the rule is off)
            state["frame_width0"] = float(self.frame_width0)
        return state

    def restore_monitor_state(self, state: Mapping[str, Any]) -> None:
        monitor = self.monitor
        monitor.reconstruction_error = float(
            state.get("reconstruction_error", monitor.reconstruction_error)
        )
        monitor.resolution_warned = bool(state.get("resolution_warned", False))
        monitor.warned = bool(state.get("box_warned", False))
        if self.atom_run is not None:
            self.atom_run.closure_warned = bool(state.get("atom_closure_warned", False))
        if self.pin_watch is not None:
            self.pin_watch.warned = bool(state.get("pinning_warned", False))
            self.pin_watch.steps = int(state.get("pinning_steps", 0))
        if "frame_width0" in state:
            self.frame_width0 = float(state["frame_width0"])

    def advance_to(self, t_target: float) -> str:
        """Step until t == t_target exactly. Returns a status (``completed`` when reached).

        In the co-moving frame a non-finite value (:class:`SimulationError`) ends the run
        with a status instead: ``blowup`` with its prediction where the covariance has grown
        (:meth:`.monitor.Monitor.ended`), else ``failed``; numpy's floating-point warnings
        are off in the step (every non-finite value is checked for and named)."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if self.frame is None:
                return self._advance_to(t_target)
            try:
                return self._advance_to(t_target)
            except SimulationError as exc:
                status, self.status_message = self.monitor.ended(
                    self.t, "failed", str(exc), f"the numerics failed: {exc}"
                )
                self.status_reason = exc.reason if status == "failed" else ""
                return status

    # ---- the operator side of the loop (.loop.TimeLoop) --------------------------------------
    def plan(self) -> StepPlan:
        """The face velocity at the step's start and the step its positivity bound allows:
        ``cfl`` times the bound (at most ``dt_max``), or the fixed ``scheme.dt`` (a
        SimulationError where it exceeds the bound)."""
        scheme = self.problem.scheme
        velocity = self.face_velocity(self.density, self.t, self.frame)
        self.last_speed = velocity.max_speed()
        bound = self.stable_dt(velocity)
        if scheme.dt is not None:
            dt = scheme.dt
            if dt > bound * (1 + 1e-12):
                raise SimulationError(
                    f"scheme.dt = {dt:.4g} exceeds the positivity bound "
                    f"{bound:.4g} at t = {self.t:.6g}: lower dt",
                    "step_bound",
                )
        else:
            dt = scheme.cfl * bound
            if scheme.dt_max is not None:
                dt = min(dt, scheme.dt_max)
        return StepPlan(velocity, dt)

    def land(self, dt: float, remaining: float) -> float:
        """The whole remainder when the step reaches it (or is unbounded), else ``dt``."""
        if dt >= remaining * (1 - 1e-12):
            return remaining
        if not math.isfinite(dt):
            return remaining
        return dt

    def attempt(self, plan: StepPlan, dt: float) -> None:
        """One step (Strang-split with noise); the first attempt uses the plan's velocity."""
        if self.diffusion is None:
            self.step(dt, plan.take())
        else:
            self.noisy_step(dt)

    def retried(self, exc: BaseException, dt: float, tries: list) -> float | Stop:
        """A frame step over its tolerance is redone with the step its error allows; a
        storm of such rejections (:func:`.frame.rough_rates`) ends the run."""
        if not isinstance(exc, FrameStepRejected):
            return super().retried(exc, dt, tries)
        self.rejected += 1
        tries.append((dt, exc.error))
        rough = rough_rates(tries, self.frame_tolerance(dt))
        if rough is not None:
            status, message = self.monitor.ended(
                self.t, "under_resolved", f"at t = {self.t:.6g}: {rough}", rough
            )
            return Stop(status, message)
        return self._frame_dt

    def accepted(self, target: float) -> None:
        if abs(self.t - target) <= 1e-13 * max(1.0, abs(target)):
            self.t = target

    def check_resolution(self, plan: StepPlan, dt: float) -> Stop | None:
        """The resolution monitor before a step (:meth:`.monitor.Monitor.check_resolution`)."""
        plan.rate = self.reconstruction_error_rate(plan.velocity)  # of this step's start
        self._cells_rate = plan.rate  # (the frame's step tolerance reads it)
        unresolved = self.monitor.check_resolution(
            plan.rate * dt, self.t, self.t + dt, self.density
        )
        return None if unresolved is None else Stop(*unresolved)

    def add_resolution(self, plan: StepPlan) -> None:
        self.monitor.add_reconstruction_error(plan.rate * self.last_dt)  # (the step taken)

    def transfer_atoms(self) -> None:
        """Cells <-> atoms, conserving mass and moments; atoms off, the pinning watch."""
        if self.atom_run is not None:
            self.density = self.atom_run.transfer(
                self.density, self.t, self.monitor.events, self.frame
            )
        elif self.pin_watch is not None:
            self.pin_watch.check(self.density, self.t, self.monitor.events)

    def schedule(self) -> tuple[bool, list[tuple[float, bool]]]:
        """The snapshot times, and the jumps of the velocity field (steps land on both)."""
        times = self.problem.times
        initial = bool(times[0] <= self.t)
        if initial:
            times = times[1:]
        jumps = [
            float(b)
            for b in self.problem.velocity.breakpoints()
            if self.t < b < times[-1] and not np.any(np.isclose(times, b, rtol=1e-14, atol=0.0))
        ]
        return initial, sorted([(float(t), True) for t in times] + [(b, False) for b in jumps])

    def new_result(self) -> Result:
        return Result(self.grid, [], positions=self.problem.positions)

    def finish(self, result: Result, wall_time: float) -> None:
        result.events = list(self.monitor.events)
        result.truncation = self.monitor.largest
        result.reconstruction_error = self.monitor.reconstruction_error
        if self.atom_run is not None:
            result.atom_transfers = list(self.atom_run.transfers)
        result.steps = self.steps
        result.rejected_steps = self.rejected
        result.limited_stages = self.operator.limited_steps
        result.wall_time = wall_time

    def physical_moments(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Mean and covariance of the measure in physical coordinates (None for masked runs,
        whose density has position slices)."""
        if self.problem.positions is not None:
            return None
        mass, mean, cov = moments(self.density, self.grid)
        atoms = None if self.atom_run is None or not self.atom_run.on_box else self.atom_run.atoms
        if atoms is not None and atoms.count and not mass > 0:  # (every cell emptied)
            _, mean, cov = merge_moments(atoms.mass, atoms.centre, atoms.cov)
        elif atoms is not None and atoms.count:  # a flat box's measure is cells plus atoms
            _, mean, cov = merge_moments(
                np.concatenate([[mass], atoms.mass]),
                np.vstack([mean[None], atoms.centre]),
                np.concatenate([cov[None], atoms.cov]),
            )
        return (mean, cov) if self.frame is None else self.frame.moments(mean, cov)

    def _watch(self) -> str | None:
        """The monitor's checks after a step (:mod:`.monitor`): a status that ends the run
        (its message in ``self.status_message``) or None."""
        found = self.physical_moments()
        if found is not None:
            self.monitor.record(self.t, found[1])
        ended = (
            self.monitor.check(
                self.t,
                self.truncation,
                self.density if self.problem.positions is None else self.density.sum(axis=0),
                tuple(a for a, mode in enumerate(self.grid.boundary) if mode != "periodic"),
            )
            if self.problem.velocity.attention
            else None
        )
        self.truncation = 0.0
        if ended is None:
            return None
        self.status_message = ended[1]
        return ended[0]

    def run(self) -> Result:
        result: Result = super().run()
        return result


class FrameStepControl(Callback):
    """The co-moving frame's step control: the step its embedded error allows
    (``Solver._frame_dt``, set by the last step), 1e-3 of the frame's time scale before the
    first, and with noise the frame's diffusion bound (:func:`.diffusion.frame_step_bound`)."""

    def limit_dt(self, loop: TimeLoop, plan: StepPlan, dt: float) -> float:
        assert isinstance(loop, Solver)
        velocity = plan.velocity
        dt = min(dt, loop._frame_dt, loop._initial_frame_dt(velocity))
        if loop.diffusion is not None and velocity.frame_rates is not None:
            rate = frame_step_bound(velocity.frame_rates.gain, loop.grid)
            dt = min(dt, loop.problem.scheme.cfl / rate) if rate > 0 else dt
        return dt


class NoiseStepControl(Callback):
    """Noise in a fixed box with an adaptive step: the step rounded down to a few values
    (:func:`.diffusion.quantised_step`), so the diffusion's exponentials repeat."""

    def limit_dt(self, loop: TimeLoop, plan: StepPlan, dt: float) -> float:
        return quantised_step(dt)


class OutflowGuard(Callback):
    """``mass_left_domain``: the mass that left through outflow boundaries above
    ``run.max_outflow`` of the initial mass."""

    def after_step(self, loop: TimeLoop, plan: StepPlan) -> Stop | None:
        assert isinstance(loop, Solver)
        limit = loop.problem.max_outflow
        if loop.outflow > limit * loop.mass0:
            return Stop(
                "mass_left_domain",
                f"outflow {loop.outflow:.3e} exceeds {limit:g} of the initial mass "
                f"{loop.mass0:.6g} at t = {loop.t:.6g}",
            )
        return None


class BoxMonitor(Callback):
    """The monitor's checks after a step (:mod:`.monitor`): the covariance recorded (collapse
    events, the blow-up prediction), the box's truncation (``box_limited``, or ``blowup``
    where the covariance is blowing up)."""

    def after_step(self, loop: TimeLoop, plan: StepPlan) -> Stop | None:
        assert isinstance(loop, Solver)
        status = loop._watch()
        return None if status is None else Stop(status, loop.status_message)


class FrameNarrowing(Callback):
    """The frame's hold on its clusters (:func:`.frame.narrowed`): the width in cells of the
    densest cluster (:func:`.monitor.cluster_width`) at the run's start (restored on resume)
    against its width after every step; when it has narrowed past FRAME_NARROWING the run
    ends through :meth:`.monitor.Monitor.ended` (``blowup`` with its prediction where the
    covariance has grown, else ``under_resolved``). Frame runs without atoms only: atoms are
    what takes a narrowing cluster off the cells."""

    def start(self, loop: TimeLoop) -> None:
        assert isinstance(loop, Solver)
        if loop.frame_width0 is None:
            loop.frame_width0 = cluster_width(loop.density, loop.grid)[0]

    def after_step(self, loop: TimeLoop, plan: StepPlan) -> Stop | None:
        assert isinstance(loop, Solver) and loop.frame_width0 is not None
        width, centre = cluster_width(loop.density, loop.grid)
        where = " (at xi = (" + ", ".join(f"{x:.3g}" for x in centre) + "))"
        why = narrowed(loop.frame_width0, width, where)
        if why is None:
            return None
        status, message = loop.monitor.ended(
            loop.t, "under_resolved", f"at t = {loop.t:.6g}: {why}", why
        )
        return Stop(status, message)


def simulate_transport(
    grid: Grid, density: np.ndarray, velocity: VelocityField, t_end: float, **kwargs
) -> Result:
    """Convenience: build a Problem (kwargs: scheme, snapshots, ...) and run it."""
    return Solver(Problem(grid, density, velocity, t_end, **kwargs)).run()
