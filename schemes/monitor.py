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
  past ``resolution_tolerance`` the event records the time (or the run ends there;
  ``"warn_then_stop"``: a fixed box ends at RESOLUTION_STOP_FACTOR times it). The estimate
  is the density's relative L1 error (0.72-1.00 of it on the flat examples, which bounds
  their mean and covariance errors; docs/theory.md, 'Calibrating the resolution monitor'),
  and the message names the remedies in reach: the co-moving frame, a cell count, atoms
  (:func:`cluster_width`). No box measure sees this: a law that thins (clustering) or a grid
  too coarse for its data loses accuracy while it stays inside.
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

# ---- the resolution policy (docs/theory.md, 'Calibrating the resolution monitor') -----------
#: run.resolution_action: "warn" (an event at the tolerance, and the run goes on), "stop" (the
#: run ends with status ``under_resolved`` at the tolerance), "warn_then_stop" (the event,
#: and a fixed box ends ``under_resolved`` before its estimate passes RESOLUTION_STOP_FACTOR
#: times the tolerance)
RESOLUTION_ACTIONS = ("warn", "stop", "warn_then_stop")
#: the default run.resolution_action ("warn_then_stop" would stop the far-beyond runs, and
#: the coarse smoke and I/O runs of the tests with them: docs/theory.md, 'Calibrating the
#: resolution monitor')
RESOLUTION_ACTION = "warn"
#: the default run.resolution_tolerance: the share of the mass the reconstruction may have
#: misplaced (the density's relative L1 error, which the estimate tracks to 0.7-1.0 and which
#: bounds the mean and covariance errors of every flat example)
RESOLUTION_TOLERANCE = 1e-3
#: "far beyond the tolerance": a warned fixed-box run ("warn_then_stop") stops there
RESOLUTION_STOP_FACTOR = 10.0
#: the order the estimate falls with the cell size (h^5: WENO5 against the seventh-order
#: value), from which the message suggests a cell count
RESOLUTION_ORDER = 5
#: the cells the message suggests aim at 1 / SUGGESTED_MARGIN of the tolerance at t_end (the
#: extrapolation of the estimate fell short by up to 1.7x where the rate grows)
SUGGESTED_MARGIN = 3.0
#: the largest growth exponent the extrapolation of the estimate assumes (E ~ t^q)
MAX_GROWTH_EXPONENT = 6.0
#: a cluster whose standard deviation at the density's maximum is below this many cells is
#: beyond what refining the grid buys cheaply: the message suggests atoms
ATOM_WIDTH_CELLS = 2.0


@dataclass
class Event:
    """Something that happened during a run: ``kind`` ("collapse", "box_limited"), its time
    and a one-line message."""

    kind: str
    time: float
    message: str


def event_lines(events: list[Event]) -> str:
    """The text a file keeps of ``events``: ``"kind t message"`` per line, ``t`` to 9
    significant digits (read back by ``tpde.io.events``)."""
    return "\n".join(f"{e.kind} {e.time:.9g} {e.message}" for e in events)


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
    """The monitor's rate: the larger of :func:`reconstruction_error_rates` (same
    arguments)."""
    return max(reconstruction_error_rates(density, grid, normal, face_states))


def reconstruction_error_rates(
    density: np.ndarray, grid: Grid, normal: list[np.ndarray], face_states: FaceStates
) -> tuple[float, float, float]:
    """The relative errors the reconstruction makes per unit time, ``(mass, covariance,
    mean)``:

    * the share of the mass it misplaces, ``sum_c |div dF| / sum_c rho``,
    * the relative drift of the covariance it causes,
      ``|| sum_f dF_f Delta_f[(x - m)(x - m)^T] || / (||Sigma|| sum_c rho)``
      (spectral norms; ``Delta_f`` the difference across face f of the cell-centre values),
      and
    * the drift of the mean it causes, ``| sum_f dF_f Delta_f[x - m] | / (||Sigma||^1/2
      sum_c rho)`` (the moments' rates are 0 on a periodic axis),

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
        return 0.0, 0.0, 0.0
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
    shift = np.zeros(d)
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
        along = flux.sum(axis=rest)
        drift[a, a] += float((x[1:] ** 2 - x[:-1] ** 2) @ along)
        shift[a] = float(jump @ along)
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
        return mass_rate, 0.0, 0.0
    return (
        mass_rate,
        float(np.linalg.norm(drift, 2)) / (scale * total),
        float(np.linalg.norm(shift)) / (math.sqrt(scale) * total),
    )


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


def extrapolated_estimate(estimate: float, rate: float, t: float, t_end: float) -> float:
    """The estimate E at t_end from its value and rate at t, as the power law through both:
    ``E(T) = E (T / t)^q`` with ``q = r t / E`` (a rate growing like t^(q - 1), as a law
    that narrows makes it: the linear extrapolation ``E + r (T - t)`` fell short by 2x on
    the softmax example at 40^2, this one by 1.7x); linear where t = 0 (q unknown), E
    itself where t_end is not finite. q is capped at MAX_GROWTH_EXPONENT."""
    if not math.isfinite(t_end) or t_end <= t:
        return estimate
    if not (t > 0 and estimate > 0):
        return estimate + rate * (t_end - t)
    q = min(MAX_GROWTH_EXPONENT, rate * t / estimate)
    return estimate * (t_end / t) ** q


def cluster_width(density: np.ndarray, grid: Grid) -> tuple[float, np.ndarray]:
    """The width test: the standard deviation, in cells, of the density around its largest
    cell, the smallest over the axes, and that cell's centre (grid coordinates).

    Along axis a, from the second difference ``D_a`` of ``log rho`` at the maximum c:
    ``sigma_a^2 = h_a^2 (-1 / D_a - 1/12)`` (exact for the cell averages of a Gaussian to
    O(h^4): their log curvature is ``-1 / (sigma^2 + h^2 / 12)``); an empty neighbour gives
    0, a flat or convex top no width along that axis, an outflow edge cell is read inwards
    only (no width). density: grid.shape, or with leading position slices (summed)."""
    rho = np.asarray(density, dtype=float)
    d = grid.ndim
    if rho.ndim > d:
        rho = rho.reshape(-1, *rho.shape[-d:]).sum(axis=0)
    c = np.unravel_index(int(np.argmax(rho)), rho.shape)
    centre = np.array([grid.centres(a)[c[a]] for a in range(d)])
    peak = float(rho[c])
    if not peak > 0:
        return math.inf, centre
    width = math.inf
    for a in range(d):
        n = grid.cells[a]
        if n < 3 or (grid.boundary[a] != "periodic" and c[a] in (0, n - 1)):
            continue
        values = []
        for step in (-1, 1):
            index = list(c)
            index[a] = (c[a] + step) % n
            values.append(float(rho[tuple(index)]))
        if min(values) <= 0.0:
            return 0.0, centre
        curvature = math.log(values[0]) + math.log(values[1]) - 2.0 * math.log(peak)
        if curvature >= 0.0:
            continue
        width = min(width, math.sqrt(max(0.0, -1.0 / curvature - 1.0 / 12.0)))
    return width, centre


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
    resolution_tolerance: float = RESOLUTION_TOLERANCE
    #: the accumulated estimate: the integral over time of :func:`reconstruction_error_rate`
    #: (the relative error the reconstruction has injected), carried over resumes
    reconstruction_error: float = 0.0
    resolution_warned: bool = False
    #: one of RESOLUTION_ACTIONS
    resolution_action: str = RESOLUTION_ACTION
    #: what the advice of an ``under_resolved`` message knows (:meth:`watch_resolution`)
    grid: Grid | None = None
    t_end: float = math.inf
    #: whether the co-moving frame is in reach (a fixed-box run of a field that has one)
    frame_advice: bool = False
    in_frame: bool = False
    #: a fixed box (a bounded axis, not the frame): where "warn_then_stop" stops far beyond
    fixed_box: bool = False

    def watch_resolution(self, grid: Grid, t_end: float, in_frame: bool, has_frame: bool) -> None:
        """What the ``under_resolved`` advice needs: the run's grid (its cells, and the
        width test of :func:`cluster_width`), its end, whether it runs in the co-moving
        frame and whether its field has one."""
        self.grid, self.t_end, self.in_frame = grid, t_end, in_frame
        self.frame_advice = has_frame and not in_frame
        self.fixed_box = not in_frame and any(mode != "periodic" for mode in grid.boundary)

    def check_resolution(
        self, amount: float, t: float, t_next: float, density: np.ndarray | None = None
    ) -> tuple[str, str] | None:
        """Before the step from t to t_next, which adds ``amount`` (rate times step) to the
        estimate: when that would first take it past the tolerance, with
        ``resolution_action = "stop"`` return the status that ends the run at t, before the
        step (``under_resolved``) and its message, else record one event at t (the run goes
        on); with "warn_then_stop", in a fixed box (:meth:`watch_resolution`), return it too
        once the step would take the estimate past RESOLUTION_STOP_FACTOR times the
        tolerance. The message says which remedies are in
        reach (:meth:`advice`; ``density``: the cell averages at t, for the width test). The
        run then adds the step's amount with :meth:`add_reconstruction_error`."""
        projected = self.reconstruction_error + amount
        tolerance = self.resolution_tolerance
        if not projected > tolerance:
            return None
        limit = RESOLUTION_STOP_FACTOR * tolerance
        far = self.resolution_action == "warn_then_stop" and self.fixed_box and projected > limit
        if self.resolution_warned and not far:
            return None
        advice = self.advice(projected, amount / max(t_next - t, 1e-300), t, density)
        if not self.resolution_warned:
            self.resolution_warned = True
            message = (
                f"the grid no longer resolves the dynamics at t = {t:.6g}: the step to "
                f"t = {t_next:.6g} would take the estimated reconstruction error to "
                f"{projected:.2e} > run.resolution_tolerance = {tolerance:g} ({advice})"
            )
            if self.resolution_action == "stop":
                return "under_resolved", message
            self.events.append(Event("under_resolved", t, message))
        if not far:
            return None
        return "under_resolved", (
            f"stopped at t = {t:.6g}, far beyond the resolution: the step to t = "
            f"{t_next:.6g} would take the estimated reconstruction error to {projected:.2e} "
            f"> {RESOLUTION_STOP_FACTOR:g} x run.resolution_tolerance = {tolerance:g} "
            f'({advice}; run.resolution_action = "warn" goes on regardless)'
        )

    def advice(self, estimate: float, rate: float, t: float, density: np.ndarray | None) -> str:
        """The remedies in reach, in one clause: the co-moving frame (``frame_advice``), a
        finer grid (the cells per axis that bring the estimate, extrapolated to t_end by
        :func:`extrapolated_estimate`, to 1 / SUGGESTED_MARGIN of the tolerance: it falls like
        h^RESOLUTION_ORDER) and atoms (when :func:`cluster_width` finds the density's
        maximum narrower than ATOM_WIDTH_CELLS)."""
        remedies = []
        if self.frame_advice:
            remedies.append('follow the law with scheme.frame = "affine"')
        if self.grid is None:
            remedies.append("refine the grid")
        else:
            end = extrapolated_estimate(estimate, rate, t, self.t_end)
            factor = (SUGGESTED_MARGIN * end / self.resolution_tolerance) ** (
                1.0 / RESOLUTION_ORDER
            )
            cells = " x ".join(str(math.ceil(n * factor)) for n in self.grid.cells)
            until = f" by t = {self.t_end:.6g}" if math.isfinite(self.t_end) else ""
            remedies.append(
                f"refine the grid to about {cells} cells (the estimate falls like "
                f"h^{RESOLUTION_ORDER}, and extrapolates to {end:.1e}{until})"
            )
            if density is not None:
                width, centre = cluster_width(density, self.grid)
                if width < ATOM_WIDTH_CELLS:
                    at = "xi" if self.in_frame else "x"  # (frame or physical coordinates)
                    position = ", ".join(f"{c:.4g}" for c in centre)
                    remedies.append(
                        f"atoms: the cluster at {at} = ({position}) is {width:.2g} cells wide "
                        "(standard deviation)"
                    )
        return "; or ".join(remedies)

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
