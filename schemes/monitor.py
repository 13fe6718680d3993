"""What the solver watches after every step: whether the box still holds the dynamics, whether
the covariance is blowing up, and when it collapses to a lower rank.

* **Truncation** (status ``box_limited``). Two measures, the larger counts: the mass fraction
  in the outer ``EDGE_CELLS`` cells of every face (the density reaching the box), and the
  velocity's cut (:attr:`tpde.schemes.velocity.VelocityField.cut`, the mass-weighted estimate
  of how much the box cuts the tilted laws behind the velocity; the largest over the step's
  stages). Above ``box_tolerance`` the run stops (``box_action = "stop"``) or records a
  ``box_limited`` event once and goes on (``"warn"``).
* **Blow-up** (status ``blowup``). The inverse covariance ``P = Sigma^-1`` of the last steps is
  extrapolated linearly in time (exact for Gaussian softmax data with V = vI, where
  ``P(t) = P(0) - v t (A + A^T)``); the predicted blow-up time is where ``P`` first becomes
  singular. A run that stops on truncation while the covariance has grown and a blow-up is
  predicted ends as ``blowup``, with the prediction in its message.
* **Resolution** (an ``under_resolved`` event and the run goes on, or with
  ``resolution_action = "stop"`` the status ``under_resolved``). The relative error the
  scheme's reconstruction makes per unit time (:func:`reconstruction_error_rate`: the larger
  of the share of the mass it misplaces and the relative drift of the covariance it causes,
  at the start of every step) is integrated over the run; before a step that would take it
  past ``resolution_tolerance`` the event records the time (or the run ends there). No box
  measure sees this: a law that thins (clustering) or a grid too coarse for its data loses
  accuracy while it stays inside.
* **Collapse** (an event, the run goes on). When the ratio of the smallest to the largest
  covariance eigenvalue first falls below ``collapse_ratio``, the time and the rank (the
  eigenvalues above that fraction of the largest) are recorded; then again at each lower rank.

docs/theory.md, "The co-moving affine frame" and docs/user-guide.md, "How a run ends".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tpde.grid import Grid
from tpde.grid.stencils import ghost_index_map

from .kernels import seventh_order_flux_error
from .operator import view3

#: cells along each face whose mass counts as reaching the box
EDGE_CELLS = 1
BOX_ACTIONS = ("stop", "warn")


@dataclass
class Event:
    """Something that happened during a run: ``kind`` ("collapse", "box_limited"), its time
    and a one-line message."""

    kind: str
    time: float
    message: str


def edge_mass(
    density: np.ndarray, axes: tuple[int, ...] | None = None, cells: int = EDGE_CELLS
) -> float:
    """Fraction of the total mass in the outer ``cells`` cells of the faces normal to
    ``axes`` (default: every axis; a periodic axis has no faces)."""
    total = float(density.sum())
    if not total > 0:
        return 0.0
    inner = density
    for axis in range(density.ndim) if axes is None else axes:
        n = density.shape[axis]
        if n <= 2 * cells:
            return 1.0
        inner = np.take(inner, np.arange(cells, n - cells), axis=axis)
    return max(0.0, (total - float(inner.sum())) / total)


#: ghost cells the seventh-order stencil needs on each side
SEVENTH_GHOSTS = 4


FaceStates = Callable[[int], tuple[np.ndarray, np.ndarray]]


def reconstruction_error_rate(
    density: np.ndarray, grid: Grid, normal: list[np.ndarray], face_states: FaceStates
) -> float:
    """The relative error the reconstruction makes per unit time: the larger of

    * the share of the mass it misplaces, ``sum_c |div dF| / sum_c rho``, and
    * the relative drift of the covariance it causes,
      ``|| sum_f dF_f Delta_f[(x - m)(x - m)^T] || / (||Sigma|| sum_c rho)``
      (spectral norms; ``Delta_f`` the difference across face f of the cell-centre values),

    with the flux error ``dF = u_n (q - q7) / h`` at every face: q the scheme's own upwind face
    state (``face_states(axis)`` returns the left and right states at the faces normal to
    ``axis``, the operator's reconstruction, nonlinear weights and boundary ghosts included),
    q7 the seventh-order linear one from the same cell averages. Their difference is the
    leading error of the scheme's face values on smooth data (docs/theory.md, 'The resolution
    monitor'); the covariance term is the one a second moment amplifies: the misplaced mass
    of a law's flanks moves its covariance most.

    density: grid.shape cell averages (``m``, ``Sigma`` their mean and covariance, cell
    centres ``x``); normal[a]: the normal velocity on the faces of axis a (the face lattice's
    shape: cells + 1 along a)."""
    total = float(density.sum())
    if not total > 0:
        return 0.0
    density, d = np.ascontiguousarray(density), grid.ndim
    # the covariance drift needs coordinates: none on a periodic axis
    moments = not any(mode == "periodic" for mode in grid.boundary)
    offsets = []
    for a in range(d):
        marginal = density.sum(axis=tuple(b for b in range(d) if b != a))
        x = grid.centres(a)
        offsets.append(x - float(marginal @ x) / total)
    divergence = np.zeros(density.shape)
    drift = np.zeros((d, d))
    for a, u in enumerate(normal):
        n, h = grid.cells[a], grid.spacing[a]
        left, right = face_states(a)
        flux = np.empty(left.shape)
        seventh_order_flux_error(
            view3(density, a),
            ghost_index_map(n, grid.boundary[a], SEVENTH_GHOSTS),
            view3(left, a),
            view3(right, a),
            view3(np.ascontiguousarray(u), a),
            1.0 / h,
            grid.boundary[a] == "outflow",
            view3(flux, a),
        )
        flux = np.moveaxis(flux, a, 0)
        if grid.boundary[a] == "periodic":
            flux[-1] = flux[0]  # (face n is face 0)
        np.moveaxis(divergence, a, 0)[...] += flux[1:] - flux[:-1]
        if not moments:
            continue
        # d/dt sum_c g_c rho_c = sum_f F_f (g_left(f) - g_right(f)) for g = (x - m)(x - m)^T
        # (g = 0 beyond the box: what crosses it leaves), whose components varying along a
        # are (a, a) and (a, b)
        x = np.concatenate([[0.0], offsets[a], [0.0]])
        jump, rest = x[1:] - x[:-1], tuple(range(1, d))
        drift[a, a] += float((x[1:] ** 2 - x[:-1] ** 2) @ flux.sum(axis=rest))
        for b in range(d):
            if b != a:
                axis_b = b + 1 if b < a else b  # (where b lies in the moved array)
                summed = flux.sum(axis=tuple(k for k in rest if k != axis_b))
                cross = float(jump @ summed @ offsets[b])
                drift[a, b] += cross
                drift[b, a] += cross
    mass_rate = float(np.abs(divergence).sum()) / total
    scale = float(np.linalg.norm(_covariance(density, offsets, total), 2)) if moments else 0.0
    if not scale > 0:
        return mass_rate
    return max(mass_rate, float(np.linalg.norm(drift, 2)) / (scale * total))


def _covariance(density: np.ndarray, offsets: list[np.ndarray], total: float) -> np.ndarray:
    """sum_c rho_c (x - m)(x - m)^T / sum_c rho_c from the centred cell-centre offsets."""
    d = density.ndim
    out = np.zeros((d, d))
    for a in range(d):
        for b in range(a, d):
            weight = density
            for axis, x in ((a, offsets[a]), (b, offsets[b])):
                shape = [1] * d
                shape[axis] = x.size
                weight = weight * x.reshape(shape)
            out[a, b] = out[b, a] = float(weight.sum()) / total
    return out


def predicted_blowup(times: list[float], covariances: list[np.ndarray]) -> float:
    """The time where the linear extrapolation of ``Sigma^-1`` through the last two
    covariances becomes singular (inf when it never does, or the data cannot tell)."""
    if len(times) < 2 or times[-1] <= times[-2]:
        return math.inf
    try:
        p0 = np.linalg.inv(covariances[-2])
        p1 = np.linalg.inv(covariances[-1])
    except np.linalg.LinAlgError:
        return math.inf
    slope = (p1 - p0) / (times[-1] - times[-2])
    # P(t1 + s) = p1 + s slope is singular where s = -1 / mu, mu an eigenvalue of p1^-1 slope
    try:
        mu = np.linalg.eigvals(np.linalg.solve(p1, slope))
    except np.linalg.LinAlgError:
        return math.inf
    real = mu.real[(np.abs(mu.imag) <= 1e-9 * np.abs(mu).max(initial=1.0)) & (mu.real < 0)]
    if real.size == 0:
        return math.inf
    return float(times[-1] + (-1.0 / real).min())


@dataclass
class Monitor:
    """Checks after every step (module docstring). ``check`` returns a status ending the run
    (``box_limited``, ``blowup``) with its message, or None."""

    box_tolerance: float = 1e-4
    box_action: str = "stop"
    collapse_ratio: float = 1e-4
    events: list[Event] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    covariances: list[np.ndarray] = field(default_factory=list)
    largest0: float = math.nan
    rank: int | None = None
    warned: bool = False
    #: the largest truncation measure seen (indicator or edge mass)
    largest: float = 0.0
    #: the reconstruction error a run may accumulate before an ``under_resolved`` event
    resolution_tolerance: float = 1e-4
    #: the accumulated estimate: the integral over time of :func:`reconstruction_error_rate`
    #: (the relative error the reconstruction has injected), carried over resumes
    reconstruction_error: float = 0.0
    resolution_warned: bool = False
    #: "warn" (record an ``under_resolved`` event, go on) or "stop" (end the run so)
    resolution_action: str = "warn"
    #: what the ``under_resolved`` message suggests (the solver adds the co-moving frame
    #: where the run is in a fixed box and its field has one)
    resolution_advice: str = "refine the grid"

    def check_resolution(self, amount: float, t: float, t_next: float) -> tuple[str, str] | None:
        """Before the step from t to t_next, which adds ``amount`` (rate times step) to the
        estimate: when that would first take it past the tolerance, with
        ``resolution_action = "stop"`` return the status that ends the run at t, before the
        step (``under_resolved``) and its message, else record one event at t (the run goes
        on). The run then adds the step's amount with :meth:`add_reconstruction_error`."""
        projected = self.reconstruction_error + amount
        if self.resolution_warned or not projected > self.resolution_tolerance:
            return None
        self.resolution_warned = True
        message = (
            f"the grid no longer resolves the dynamics at t = {t:.6g}: the step to "
            f"t = {t_next:.6g} would take the estimated reconstruction error to "
            f"{projected:.2e} > run.resolution_tolerance = {self.resolution_tolerance:g} "
            f"({self.resolution_advice})"
        )
        if self.resolution_action == "stop":
            return "under_resolved", message
        self.events.append(Event("under_resolved", t, message))
        return None

    def add_reconstruction_error(self, amount: float) -> None:
        """Add a step's ``amount`` (rate times step) to the estimate."""
        self.reconstruction_error += amount

    def record(self, t: float, covariance: np.ndarray) -> None:
        """Keep the physical covariance at time t (the last three) and record collapses."""
        cov = 0.5 * (covariance + covariance.T)
        if not np.all(np.isfinite(cov)):
            return
        self.times = (self.times + [t])[-3:]
        self.covariances = (self.covariances + [cov])[-3:]
        values = np.linalg.eigvalsh(cov)
        largest = float(values[-1])
        if math.isnan(self.largest0):
            self.largest0 = largest
        if not largest > 0:
            return
        rank = int(np.sum(values > self.collapse_ratio * largest))
        if self.rank is None:
            self.rank = rank
        elif rank < self.rank:
            self.rank = rank
            self.events.append(
                Event(
                    "collapse",
                    t,
                    f"covariance collapsed to rank {rank} at t = {t:.6g} (eigenvalues "
                    f"{', '.join(f'{v:.3g}' for v in values)})",
                )
            )

    def check(
        self, t: float, truncation: float, density: np.ndarray, axes: tuple[int, ...]
    ) -> tuple[str, str] | None:
        """The status that ends the run at time t, with its message, or None. density:
        grid.shape; axes: those whose faces bound the box (not periodic)."""
        edge = edge_mass(density, axes)
        worst = max(truncation, edge)
        self.largest = max(self.largest, worst)
        if not worst > self.box_tolerance:
            return None
        what = (
            f"mass {edge:.2e} in the outer {EDGE_CELLS} cells"
            if edge >= truncation
            else f"tilted laws cut by the box (indicator {truncation:.2e})"
        )
        message = (
            f"the box no longer holds the dynamics at t = {t:.6g}: {what} > "
            f"run.box_tolerance = {self.box_tolerance:g}"
        )
        if self.box_action == "warn":
            if not self.warned:
                self.warned = True
                self.events.append(Event("box_limited", t, message))
            return None
        return self.ended(t, "box_limited", message, what)

    def ended(self, t: float, status: str, message: str, why: str) -> tuple[str, str]:
        """The status of a run that has to stop at time t, and its message: ``blowup`` with
        the predicted time where the covariance has grown (its largest eigenvalue past
        twice the initial one) and a blow-up is predicted (:func:`predicted_blowup`), the
        stop's own ``status`` and ``message`` otherwise. ``why``: the stop's reason, for the
        blow-up message. The box's truncation, the frame's step control and a non-finite
        value in a frame run all end here."""
        with np.errstate(all="ignore"):  # (a covariance near singular: inf is an answer)
            t_star = predicted_blowup(self.times, self.covariances)
            grown = bool(self.covariances) and float(
                np.linalg.eigvalsh(self.covariances[-1])[-1]
            ) > (2.0 * self.largest0)
        if math.isfinite(t_star) and grown:
            return "blowup", (
                f"covariance blowing up: predicted blow-up at t* = {t_star:.9g} "
                f"(inverse covariance extrapolated linearly); stopped at t = {t:.6g} "
                f"= {t / t_star:.3f} t* because {why}"
            )
        return status, message
