"""The paper's numerical experiments with the grid solver: E1-E6 and the rank histograms.

docs/theory.md, 'Paper experiments E1-E6' and 'Rank histograms'.

The authors integrate only the covariance ODE of Gaussian initial data (``2d_plots.py``,
``histograms.py``; docs/theory.md gives the matrices, re-derived from their seeds). Here each
experiment evolves a set of initial covariances twice: by the Gaussian ODE (tpde.validation.
gaussian, DOP853) and by the grid solver from the Gaussian density N(0, Sigma_0) (WENO5-Z,
SSP-RK3, in the co-moving affine frame, or with ``frame=False`` on the box fitted to the ODE
solution, tpde.validation.studies.fitted_box), and draws both in the
authors' coordinates: (x, y, z) = (a - b, 2c, a + b) for Sigma = [[a, c], [c, b]], where the PSD
cone is z >= sqrt(x^2 + y^2) and its boundary the rank-1 matrices, and the trace-normalised
(a - b, 2c) / tr Sigma in the unit disc (the unit circle: rank 1). Blow-up (tr Sigma > 1e3, the
authors' rule, or the ODE's blow-up event) is marked where it is detected; frame runs go
until the truncation monitor stops them (``Trajectory.grid_status``), fixed-box runs of
blowing-up data stop at half the blow-up time (every discretisation departs near it,
docs/theory.md, 'Blow-up and tails').

The rank histograms integrate the d = 3, 4, 5 covariance ODEs of 'Rank histograms' (the authors'
draws: Q = randn(d // 2, d) for every d in one stream from seed 40, Sigma_0 = G G^T with the
seed reset to 41 per dimension, K = -Q, A = -Q^T Q / sqrt(d)) to a long horizon and count the
eigenvalues of the limit above 0.1; for softmax with V = I the exact limit
Sigma_inf = P (P^T Sigma_0^{-1} P)^{-1} P^T (P: a basis of ker Q, 'Closed forms') is counted
beside them, and the paper's counts (as reproduced from the authors' script) are quoted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpde.grid import Grid, gaussian, moments
from tpde.schemes.frame import AffineFrame
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.validation.gaussian import solve
from tpde.validation.studies import fitted_box, grid_run
from tpde.variants import ATTENTION, Head, L2Head, SinkhornHead

SQ2 = np.sqrt(2.0)
#: the authors' explosion rule (tr Sigma above this: blow-up)
TRACE_BLOWUP = 1e3

# docs/theory.md, 'Paper experiments E1-E6': matrices re-derived from the authors' seeds
Q_E1 = np.array([[0.45805, 0.30835], [0.23149, 0.27742]])
V_E1 = np.array([[2.66938, -0.69153], [-0.69153, 2.68745]])
Q_E2 = np.array([[0.40632, 0.91373]])
Q_E4 = np.array([[0.67641, 1.5211], [-0.51188, 1.15019]])
K_E4 = np.array([[-0.59072, -0.76877], [-0.33501, 0.093]])
V_E4 = np.array([[-0.34889, 0.9837], [0.58092, 0.07028]])
Q_E5 = np.array([[-0.09678, 0.4222], [-0.22546, -0.63794]])
K_E5 = np.array([[-0.01629, 1.04422], [-1.08488, -2.20592]])
V_E6 = np.array([[1.83175, -0.37689], [0.34811, -0.11628]])
I2 = np.eye(2)


def _softmax(Q, K, V):
    """A = K^T Q / sqrt(2) (the authors' single-head scaling, d = 2)."""
    return Head(K.T @ Q / SQ2, V)


def _l2(Q, K, V):
    return L2Head(Q, K, V, scale=1.0 / SQ2)


def _multihead_e3():
    """H = 2, k = 1, W = I, only head 1 active (docs/theory.md, 'Closed forms'): A_1 = -q^T q (scale
    1/sqrt(k) = 1), C_1 = e_1 e_1^T."""
    q = Q_E2
    return [Head(-q.T @ q, np.array([[1.0, 0.0]]), np.array([[1.0], [0.0]]))]


@dataclass(frozen=True)
class Experiment:
    """One experiment of docs/theory.md, 'Paper experiments E1-E6': parameters per variant,
    the authors' initial-data limits (u, w ranges of init_grid) and the horizon of the grid
    runs."""

    name: str
    title: str
    params: dict[str, Any]
    limits: tuple[float, float, float, float] = (-0.5, 0.5, -0.5, 0.5)
    t_end: float = 20.0


EXPERIMENTS = {
    # E1 grid runs stop at t = 8: the zero mean is unstable (for softmax
    # alpha' = V (I + Sigma A) alpha with V SPD, eigenvalues up to 3.4), so round-off grows
    # like e^{3.4 t} and carries the grid density out of the box near t = 10; the authors
    # integrate Sigma alone, whose ODE does not see the mean
    "E1": Experiment(
        "E1",
        "convergence to zero",
        {
            "softmax": _softmax(Q_E1, -Q_E1, V_E1),
            "l2": _l2(Q_E1, -Q_E1, V_E1),
            "sinkhorn": SinkhornHead(-Q_E1.T @ Q_E1, V_E1, eps=1.0),
        },
        t_end=8.0,
    ),
    "E2": Experiment(
        "E2",
        "convergence to a line",
        {"softmax": _softmax(Q_E2, -Q_E2, I2), "l2": _l2(Q_E2, -Q_E2, I2)},
    ),
    "E3": Experiment("E3", "convergence to a plane", {"multihead": _multihead_e3()}),
    "E4": Experiment(
        "E4",
        "convergence to two lines",
        {"softmax": _softmax(Q_E4, K_E4, V_E4), "l2": _l2(Q_E4, K_E4, V_E4)},
        limits=(-1.0, 1.0, -1.0, 1.0),
        t_end=10.0,
    ),
    "E5": Experiment(
        "E5",
        "blow-up or divergence",
        {"softmax": _softmax(Q_E5, K_E5, I2), "l2": _l2(Q_E5, K_E5, I2)},
        limits=(-1.0, 1.0, -1.0, 1.0),
        t_end=2.0,
    ),
    "E6": Experiment(
        "E6",
        "convergence and blow-up depending on initial data",
        {"softmax": _softmax(Q_E4, K_E4, V_E6), "l2": _l2(Q_E4, K_E4, V_E6)},
        limits=(-1.0, 1.0, -1.0, 1.0),
        t_end=10.0,
    ),
}


def initial_covariances(limits: Sequence[float], n_u: int, n_w: int) -> list[np.ndarray]:
    """The authors' init_grid with trace 1: Sigma_0 = [[(1 + u)/2, w/2], [w/2, (1 - u)/2]],
    u on n_u points of [limits[0], limits[1]], w on n_w points of [limits[2], limits[3]],
    strictly positive definite ones only (1 - u^2 > w^2)."""
    out = []
    for u in np.linspace(limits[0], limits[1], n_u):
        for w in np.linspace(limits[2], limits[3], n_w):
            if 1.0 - u * u - w * w > 1e-3:
                out.append(np.array([[(1.0 + u) / 2, w / 2], [w / 2, (1.0 - u) / 2]]))
    return out


def authors_coordinates(cov: np.ndarray) -> np.ndarray:
    """(a - b, 2c, a + b) of Sigma = [[a, c], [c, b]]; cov (..., 2, 2) -> (..., 3)."""
    a, b, c = cov[..., 0, 0], cov[..., 1, 1], cov[..., 0, 1]
    return np.stack([a - b, 2 * c, a + b], axis=-1)


@dataclass
class Trajectory:
    """One initial covariance evolved by the ODE (and the grid): covariances at ``times``."""

    variant: str
    cov0: np.ndarray
    times: np.ndarray
    ode: np.ndarray  # (m, 2, 2)
    ode_status: str = "completed"
    ode_event: float = float("nan")  # blow-up time (tr Sigma > 1e3 or the ODE's event)
    grid_times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    grid: np.ndarray = field(default_factory=lambda: np.zeros((0, 2, 2)))
    grid_ode: np.ndarray = field(default_factory=lambda: np.zeros((0, 2, 2)))  # the ODE there
    cells: int = 0
    grid_failure: str = ""
    grid_status: str = ""  # how the grid run ended (the solver's status) ...
    grid_stop: float = float("nan")  # ... at this time ...
    grid_message: str = ""  # ... and why
    params: Any = None  # the experiment's parameters of ``variant``

    def normalised_gap(self) -> float:
        """max over the grid snapshots of |Sigma/tr - Sigma_ode/tr| (entries)."""
        if not len(self.grid_times):
            return float("nan")
        return float(
            max(
                np.abs(g / np.trace(g) - o / np.trace(o)).max()
                for g, o in zip(self.grid, self.grid_ode, strict=True)
            )
        )


def solve_covariance(variant: str, params: Any, cov0: np.ndarray, t_end: float):
    """The Gaussian ODE from N(0, cov0) (a GaussianSolution with dense output), stopped at
    blow-up: tr Sigma above TRACE_BLOWUP (the authors' rule) or the ODE's own event."""
    return solve(
        variant,
        np.zeros(2),
        cov0,
        params,
        t_end,
        rtol=1e-10,
        atol=1e-13,
        blowup_threshold=TRACE_BLOWUP / np.linalg.eigvalsh(cov0)[-1],
    )


#: the frame box (+-radius in frame units) of each variant's co-moving runs: softmax-type
#: tilts need +-16 to be held (docs/theory.md, 'The co-moving affine frame'); l2's tilts
#: need +-12 for E4 (+-8 stopped three of six runs box_limited before t = 0.003; +-16 at
#: 64^2 loses resolution, gaps up to 1e-6); Sinkhorn's conditional laws stay inside the
#: measure
FRAME_RADIUS = {"softmax": 16.0, "multihead": 16.0, "l2": 12.0, "sinkhorn": 7.0}


@dataclass
class GridRun:
    """A grid run's covariances at its snapshots and how it ended (the solver's status:
    completed, box_limited, blowup, ...; its time and message)."""

    times: np.ndarray
    covariances: np.ndarray  # (m, 2, 2)
    status: str
    status_time: float
    message: str


def grid_covariances(
    variant: str,
    params: Any,
    cov0: np.ndarray,
    solution,
    t_end: float,
    times: Sequence[float] | np.ndarray,
    cells: int,
    frame: bool = True,
) -> GridRun:
    """The grid run from N(0, cov0) up to t_end, covariances at ``times``.

    frame: in the co-moving affine frame (the xi box +-FRAME_RADIUS, started on N(0, I)),
    stopping where the truncation monitor says the box no longer holds the dynamics
    (box_limited, or blowup with a predicted time); else on the fixed box fitted to the ODE
    ``solution`` (7 sigma for softmax and multi-head, 6 otherwise), which raises
    RuntimeError unless it completes."""
    if not frame:
        sigmas = 7.0 if variant in ("softmax", "multihead") else 6.0
        lower, upper = fitted_box(solution, t_end, sigmas)
        grid = Grid(lower, upper, [cells, cells])
        result = grid_run(
            variant,
            params,
            grid,
            gaussian(grid, np.zeros(2), cov0),
            t_end,
            snapshots=list(times),
            max_outflow=1e-4,
        )
        covs = np.array([moments(s.density, grid)[2] for s in result.snapshots])
        return GridRun(result.times, covs, result.status, result.status_time, "")
    radius = FRAME_RADIUS[variant]
    grid = Grid([-radius, -radius], [radius, radius], [cells, cells])
    result = Solver(
        Problem(
            grid,
            gaussian(grid, np.zeros(2), np.eye(2)),
            ATTENTION[variant](params),
            t_end,
            scheme=Scheme(frame="affine", frame_tolerance=1e-8),
            snapshots=list(times),
            frame=AffineFrame.following(np.zeros(2), cov0),
        )
    ).run()
    framed = []
    for snap in result.snapshots:
        assert snap.frame is not None  # (a frame run's snapshots carry their frame)
        _, xi_mean, xi_cov = moments(snap.density, grid)
        framed.append(snap.frame.moments(xi_mean, xi_cov)[1])
    return GridRun(
        result.times, np.array(framed), result.status, result.status_time, result.status_message
    )


def run_experiment(
    name: str,
    variant: str,
    count: int = 6,
    cells: int = 64,
    snapshots: int = 21,
    grid: bool = True,
    frame: bool = True,
) -> list[Trajectory]:
    """``count`` initial covariances of the experiment (spread over the authors' grid),
    each by the ODE to t_end (or its blow-up) and, if ``grid``, by the grid solver: in the
    co-moving frame (``frame``) to t_end or the blow-up, or until its truncation monitor stops
    it (``Trajectory.grid_status``, ``grid_stop``, ``grid_message``); on a fixed box to t_end
    or half the blow-up time."""
    experiment = EXPERIMENTS[name]
    params = experiment.params[variant]
    covs = initial_covariances(experiment.limits, 10, 10)
    picks = np.linspace(0, len(covs) - 1, count).round().astype(int)
    out = []
    for cov0 in (covs[i] for i in picks):
        solution = solve_covariance(variant, params, cov0, experiment.t_end)
        times = np.linspace(0.0, experiment.t_end, snapshots)
        kept = times[times <= solution.status_time]
        event = solution.status_time if solution.status != "completed" else float("nan")
        traj = Trajectory(
            variant, cov0, kept, solution.at(kept)[1], solution.status, event, params=params
        )
        if grid:
            # the frame runs until its monitor stops it; the fixed box to half the blow-up
            horizon = experiment.t_end if np.isnan(event) else (1.0 if frame else 0.5) * event
            grid_times = np.linspace(0.0, horizon, snapshots)
            try:
                run = grid_covariances(
                    variant, params, cov0, solution, horizon, grid_times, cells, frame
                )
            except RuntimeError as exc:  # recorded, drawn without grid markers
                traj.grid_failure = str(exc)
            else:
                traj.grid_times, traj.grid = run.times, run.covariances
                traj.grid_ode = solution.at(run.times)[1]
                traj.grid_status, traj.grid_stop = run.status, run.status_time
                traj.grid_message = run.message
            traj.cells = cells
        out.append(traj)
    return out


def trajectory_figures(trajectories: list[Trajectory], title: str, path_3d, path_2d) -> None:
    """The authors' two pictures: 3-D (a - b, 2c, a + b) with the PSD cone, and the
    trace-normalised disc; ODE lines, grid markers, blow-up crosses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = plt.cm.viridis(np.linspace(0, 1, max(len(trajectories), 2)))
    fig = plt.figure(figsize=(6.4, 5.6))
    ax = fig.add_subplot(projection="3d")
    top = max(float(authors_coordinates(t.ode)[:, 2].max()) for t in trajectories)
    top = min(max(top, 1.0), 3.0)
    r, phi = np.meshgrid(np.linspace(0, top, 12), np.linspace(0, 2 * np.pi, 40))
    ax.plot_surface(r * np.cos(phi), r * np.sin(phi), r, alpha=0.12, color="grey")
    for k, t in enumerate(trajectories):
        xyz = authors_coordinates(t.ode)
        inside = xyz[:, 2] <= top
        ax.plot(*xyz[inside].T, color=colours[k], lw=1.2)
        if len(t.grid_times):
            g = authors_coordinates(t.grid)
            keep = g[:, 2] <= top
            ax.plot(*g[keep].T, "o", ms=2.5, mfc="none", color=colours[k])
        if not np.isnan(t.ode_event):
            ax.plot(*xyz[inside][-1], "x", color="red", ms=7)
        else:
            ax.plot(*xyz[-1], "o", color=colours[k], ms=4)
    ax.set_xlabel("a - b")
    ax.set_ylabel("2c")
    ax.set_zlabel("a + b")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path_3d, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.6, 5.6))
    circle = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(circle), np.sin(circle), "k-", lw=0.8, label="rank 1 (unit circle)")
    labelled: set[str] = set()

    def label(name: str) -> str | None:
        if name in labelled:
            return None
        labelled.add(name)
        return name

    for k, t in enumerate(trajectories):
        xyz = authors_coordinates(t.ode)
        ax.plot(
            xyz[:, 0] / xyz[:, 2],
            xyz[:, 1] / xyz[:, 2],
            "-",
            color=colours[k],
            lw=1.2,
            label=label("Gaussian ODE"),
        )
        if len(t.grid_times):
            g = authors_coordinates(t.grid)
            ax.plot(
                g[:, 0] / g[:, 2],
                g[:, 1] / g[:, 2],
                "o",
                ms=3,
                mfc="none",
                color=colours[k],
                label=label(f"grid {t.cells}^2"),
            )
        if not np.isnan(t.ode_event):
            ax.plot(
                xyz[-1, 0] / xyz[-1, 2],
                xyz[-1, 1] / xyz[-1, 2],
                "x",
                color="red",
                ms=8,
                label=label("blow-up detected (ODE)"),
            )
    ax.set_aspect("equal")
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(-1.1, 1.1)
    ax.set_xlabel("(a - b) / tr")
    ax.set_ylabel("2c / tr")
    ax.set_title(f"{title}\n(trace-normalised)", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path_2d, dpi=120)
    plt.close(fig)


# ---- rank histograms (docs/theory.md, 'Rank histograms') ---------------------------------------
#: the authors' projected-Euler ranks (their script's logic re-run on their draws),
#: {d: {rank: count}}
PAPER_COUNTS = {
    ("softmax", "identity"): {
        3: {0: 3, 1: 48, 2: 49},
        4: {0: 11, 1: 47, 2: 42},
        5: {1: 5, 2: 54, 3: 41},
    },
    ("l2", "identity"): {3: {1: 32, 2: 68}, 4: {1: 31, 2: 69}, 5: {2: 46, 3: 54}},
}


def histogram_draws(d: int, runs: int = 100) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The authors' Q (d // 2 x d) and Sigma_0 = G G^T for dimension d (module docstring)."""
    stream = np.random.RandomState(40)
    qs = {dim: [stream.randn(dim // 2, dim) for _ in range(runs)] for dim in (3, 4, 5)}
    start = np.random.RandomState(41)
    covs = []
    for _ in range(runs):
        g = start.randn(d, d)
        covs.append(g @ g.T)
    return qs[d], covs


def exact_limit_rank(Q: np.ndarray, cov0: np.ndarray, threshold: float = 0.1) -> int:
    """Softmax, V = I: rank of Sigma_inf = P (P^T Sigma_0^{-1} P)^{-1} P^T (P spans ker Q)."""
    _, s, vt = np.linalg.svd(Q)
    P = vt[int(np.sum(s > 1e-12)) :].T
    limit = P @ np.linalg.inv(P.T @ np.linalg.inv(cov0) @ P) @ P.T
    return int(np.sum(np.linalg.eigvalsh(limit) > threshold))


def ode_limit_rank(
    variant: str,
    Q: np.ndarray,
    cov0: np.ndarray,
    V: np.ndarray,
    horizon: float = 5000.0,
    threshold: float = 0.1,
) -> int:
    """Rank (eigenvalues above ``threshold``) of the covariance ODE at a long horizon (the
    decay to the limit is O(1/t))."""
    d = cov0.shape[0]
    params = (
        Head(-Q.T @ Q / np.sqrt(d), V)
        if variant == "softmax"
        else L2Head(Q, -Q, V, scale=1.0 / np.sqrt(d))
    )
    sol = solve(variant, np.zeros(d), cov0, params, horizon, times=[horizon], rtol=1e-9, atol=1e-12)
    return int(np.sum(np.linalg.eigvalsh(sol.at(horizon)[1]) > threshold))


def rank_counts(variant: str, d: int, runs: int = 100, horizon: float = 5000.0) -> dict:
    """{"ode": {rank: count}, "exact": {rank: count} (softmax only)} for V = I."""
    qs, covs = histogram_draws(d, runs)
    ode = [ode_limit_rank(variant, Q, c, np.eye(d), horizon) for Q, c in zip(qs, covs, strict=True)]
    out = {"ode": dict(zip(*np.unique(ode, return_counts=True), strict=True))}
    if variant == "softmax":
        exact = [exact_limit_rank(Q, c) for Q, c in zip(qs, covs, strict=True)]
        out["exact"] = dict(zip(*np.unique(exact, return_counts=True), strict=True))
    return {k: {int(r): int(n) for r, n in v.items()} for k, v in out.items()}


def rank_histogram_figure(counts: dict, path) -> None:
    """Bars per dimension: ODE limit ranks, exact limit ranks (softmax), the paper's counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = sorted({v for v, _ in counts})
    dims = sorted({d for _, d in counts})
    fig, axes = plt.subplots(
        len(variants), len(dims), figsize=(3.2 * len(dims), 2.8 * len(variants)), squeeze=False
    )
    for i, variant in enumerate(variants):
        for j, d in enumerate(dims):
            ax = axes[i, j]
            ranks = np.arange(d + 1)
            series = [("ODE limit", counts[(variant, d)]["ode"])]
            if "exact" in counts[(variant, d)]:
                series.append(("exact limit", counts[(variant, d)]["exact"]))
            series.append(("paper (Euler)", PAPER_COUNTS[(variant, "identity")][d]))
            width = 0.8 / len(series)
            for k, (label, c) in enumerate(series):
                ax.bar(
                    ranks + (k - (len(series) - 1) / 2) * width,
                    [c.get(int(r), 0) for r in ranks],
                    width,
                    label=label,
                )
            ax.set_title(f"{variant}, V = I, d = {d}", fontsize=9)
            ax.set_xticks(ranks)
            ax.set_xlabel("rank of the limit")
            if j == 0:
                ax.set_ylabel("runs of 100")
            if j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
