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
  ``resolution_action = "stop"`` the status ``under_resolved``). The share of the mass the
  fifth-order reconstruction misplaces per unit time (:func:`reconstruction_error_rate`, at
  the start of every step) is integrated over the run; when it passes
  ``resolution_tolerance`` the event records the time. No box measure sees this: a law that
  thins (clustering) or a grid too coarse for its data loses accuracy while it stays inside.
* **Collapse** (an event, the run goes on). When the ratio of the smallest to the largest
  covariance eigenvalue first falls below ``collapse_ratio``, the time and the rank (the
  eigenvalues above that fraction of the largest) are recorded; then again at each lower rank.

docs/theory.md, "The co-moving affine frame" and docs/user-guide.md, "How a run ends".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

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


#: linear upwind face values from cell averages, for the face between cells j and j + 1 from
#: the upwind side: fifth order (cells j-2..j+2), seventh order (cells j-3..j+3)
FIFTH = np.array([2.0, -13.0, 47.0, 27.0, -3.0]) / 60.0
SEVENTH = np.array([-3.0, 25.0, -101.0, 319.0, 214.0, -38.0, 4.0]) / 420.0


def _upwind_difference(padded: np.ndarray, faces: int) -> np.ndarray:
    """(fifth - seventh)-order upwind face values from the left, for ``faces`` faces, of an
    array padded with 4 cells on each side along axis 0 (face f lies between padded cells
    f + 3 and f + 4)."""
    fifth = sum(w * padded[1 + k : 1 + k + faces] for k, w in enumerate(FIFTH))
    seventh = sum(w * padded[k : k + faces] for k, w in enumerate(SEVENTH))
    return fifth - seventh


def reconstruction_error_rate(
    density: np.ndarray,
    spacing: tuple[float, ...],
    normal: list[np.ndarray],
    periodic: tuple[bool, ...],
) -> float:
    """The share of the mass the reconstruction misplaces per unit time: the L1 norm of the
    divergence of the flux error ``u_n (q5 - q7) |face|``, over the total mass, with q5, q7 the
    fifth- and seventh-order linear upwind face values of the cell averages (their difference
    is the leading error of a fifth-order reconstruction of smooth data; docs/theory.md,
    'The resolution monitor').

    density: grid.shape cell averages; spacing: cell widths; normal[a]: the normal velocity at
    the face centres of axis a (cells + 1 along a, as the solver's face lattices); periodic:
    per axis (wrapped), else the cells beyond the box count as empty."""
    total = float(density.sum())
    if not total > 0:
        return 0.0
    divergence = np.zeros(density.shape)
    for a, u in enumerate(normal):
        cells = np.moveaxis(density, a, 0)
        n = cells.shape[0]
        u_faces = np.moveaxis(u, a, 0)[: n + 1]
        if periodic[a]:
            padded = np.concatenate([cells[-4:], cells, cells[:4]])
        else:
            empty = np.zeros((4,) + cells.shape[1:])
            padded = np.concatenate([empty, cells, empty])
        faces = n + 1
        from_left = _upwind_difference(padded, faces)
        from_right = _upwind_difference(padded[::-1], faces)[::-1]
        flux = u_faces * np.where(u_faces > 0, from_left, from_right) / spacing[a]
        if periodic[a]:
            flux[-1] = flux[0]  # (face n is face 0)
        np.moveaxis(divergence, a, 0)[...] += flux[1:] - flux[:-1]
    return float(np.abs(divergence).sum()) / total


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
    #: (the share of the mass the reconstruction has misplaced), carried over resumes
    reconstruction_error: float = 0.0
    resolution_warned: bool = False
    #: "warn" (record an ``under_resolved`` event, go on) or "stop" (end the run so)
    resolution_action: str = "warn"

    def add_reconstruction_error(self, amount: float, t: float) -> tuple[str, str] | None:
        """Add ``amount`` (rate times step) to the estimate at time t. When it first exceeds
        the tolerance: with ``resolution_action = "stop"`` return the status that ends the
        run (``under_resolved``) and its message, else record one event (the run goes on)."""
        self.reconstruction_error += amount
        if self.resolution_warned or not self.reconstruction_error > self.resolution_tolerance:
            return None
        self.resolution_warned = True
        message = (
            f"the grid no longer resolves the dynamics at t = {t:.6g}: estimated "
            f"reconstruction error {self.reconstruction_error:.2e} of the mass > "
            f"run.resolution_tolerance = {self.resolution_tolerance:g} (refine the grid, "
            'or follow the law with scheme.frame = "affine")'
        )
        if self.resolution_action == "stop":
            return "under_resolved", message
        self.events.append(Event("under_resolved", t, message))
        return None

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
        t_star = predicted_blowup(self.times, self.covariances)
        grown = self.covariances and float(np.linalg.eigvalsh(self.covariances[-1])[-1]) > (
            2.0 * self.largest0
        )
        if math.isfinite(t_star) and grown:
            return "blowup", (
                f"covariance blowing up: predicted blow-up at t* = {t_star:.9g} "
                f"(inverse covariance extrapolated linearly); stopped at t = {t:.6g} "
                f"= {t / t_star:.3f} t* because {what}"
            )
        return "box_limited", message
