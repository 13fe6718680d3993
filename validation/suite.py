"""``tpde validate``: the standard validation suite, with PASS/FAIL checks and a report.

    tpde validate [--suite quick|full] [-o DIR]

Three independent descriptions of the same dynamics are compared (tpde.validation.studies):
the grid solution, the interacting tokens and, for Gaussian data, the mean/covariance ODEs
(docs/theory.md, 'The Transformer PDE' and 'Gaussian closures'). The quick suite (18
checks; 11 minutes measured on 2 cores shared at a load of 10-14) covers every variant on
1-D and 2-D, Gaussian and non-Gaussian data; the full suite adds the 2-D refinement of all
five closed-form variants to 128^2, the 2-D mean-field study with n up to 3 x 10^4 tokens
and the 2-D masked check (31 checks; 22 minutes measured on a loaded 2-core machine). The
report is ``DIR/report.md`` with its figures (``covariance.png``,
``mean_field.png``); the exit code is 1 if any check fails.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tpde.grid import Grid, Positions, gaussian_mixture, uniform_ball
from tpde.validation import gaussian as ode
from tpde.validation import studies
from tpde.variants import Head, L2Head, SigmoidHead, SinkhornHead

# case c1 (non-symmetric A and V) and its initial Gaussian: docs/theory.md, 'Test matrices c1
# and c2'
A1 = np.array([[-0.6, 0.8], [-0.2, -0.3]])
V1 = np.array([[1.0, 0.5], [-0.3, 0.8]])
MEAN1 = np.array([0.5, -0.3])
COV1 = np.array([[1.0, 0.4], [0.4, 0.6]])
Q1 = np.array([[0.8, -0.3], [0.5, 0.6]])
K1 = np.array([[0.4, 0.7], [-0.6, 0.2]])
# the 1-D heads of the two-bumps and drifting-bumps checks
A_BUMPS, A_DRIFT, V_1D = np.array([[0.8]]), np.array([[0.6]]), np.array([[-1.0]])
CLOSED_FORM_PARAMS = {
    "softmax": Head(A1, V1),
    "l2": L2Head(Q1, K1, V1),
    "sinkhorn": SinkhornHead(A1, V1, eps=1.0),
    "linear": Head(A1, V1),
    "multihead": [Head(A1, 0.5 * V1), Head(0.5 * A1.T, np.array([[0.3, -0.2], [0.4, 0.5]]))],
}


@dataclass
class Check:
    """One PASS/FAIL line: ``low <= value <= high``."""

    name: str
    value: float
    high: float = math.inf
    low: float = -math.inf

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.value) and self.low <= self.value <= self.high)

    def limit(self) -> str:
        if math.isinf(self.low):
            return f"<= {self.high:.3g}"
        return f"in [{self.low:.3g}, {self.high:.3g}]"


@dataclass
class Report:
    checks: list[Check]
    sections: list[str]
    figures: list[str]


def _table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        return f"{v:.3e}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# ---- studies --------------------------------------------------------------------------------
def tokens_vs_odes(report: Report, log: Callable[[str], None]) -> dict:
    rows, kept = [], {}
    for variant, params in CLOSED_FORM_PARAMS.items():
        nodes = 16 if variant == "sinkhorn" else 24
        out = studies.tokens_vs_ode(
            variant, params, MEAN1, COV1, 0.5, nodes=nodes, times=np.linspace(0, 0.5, 11)
        )
        kept[variant] = out
        rows.append([variant, f"{nodes}^2", out["mean_error"], out["cov_error"]])
        report.checks.append(
            Check(f"Gauss-Hermite tokens vs ODE, {variant} (cov, t = 0.5)", out["cov_error"], 1e-8)
        )
        log(f"tokens vs ODE {variant}: cov {out['cov_error']:.1e}")
    report.sections.append(
        "## Gauss-Hermite tokens vs the Gaussian ODEs (2-D, c1, RK4 dt "
        "0.01, t = 0.5)\n\n" + _table(["variant", "tokens", "mean error", "cov error"], rows)
    )
    return kept


def closed_forms(report: Report, log: Callable[[str], None]) -> None:
    rows = []
    # blow-up of softmax with V = v I: t* = 1 / lambda_max(v S0^1/2 (A + A^T) S0^1/2)
    head = Head(0.5 * np.eye(2), np.eye(2))
    sol = ode.solve("softmax", MEAN1, COV1, head, 2.0)
    t_star = ode.softmax_blowup_time(COV1, head.A, 1.0)
    # the event fires at lambda_max = 1e8 lambda_max(Sigma_0), i.e. at t* (1 - 1e-8)
    gap = abs(sol.status_time - t_star * (1 - 1e-8))
    rows.append(["softmax blow-up time (V = I, A = I/2)", sol.status_time, t_star, gap])
    report.checks.append(Check("softmax blow-up time vs t*", gap, 1e-6))
    # inverse covariance of softmax with V = v I: Sigma(t)^-1 = Sigma0^-1 - v t (A + A^T)
    A = np.array([[0.3, 0.2], [-0.1, 0.25]])
    sol = ode.solve("softmax", MEAN1, COV1, Head(A, 0.7 * np.eye(2)), 0.8)
    exact = ode.softmax_scalar_v_covariance(COV1, A, 0.7, 0.8)
    err = float(np.linalg.norm(sol.at(0.8)[1] - exact) / np.linalg.norm(exact))
    rows.append(["softmax V = vI covariance (t = 0.8)", "", "", err])
    report.checks.append(Check("softmax V = vI covariance closed form", err, 1e-10))
    # isotropic l2 and Sinkhorn: t = G(lambda) - G(lambda0)
    for name, variant, params, time_of in (
        (
            "l2 isotropic",
            "l2",
            L2Head(0.8 * np.eye(2), 0.6 * np.eye(2), -0.5 * np.eye(2)),
            lambda lam: ode.l2_isotropic_time(lam, 0.7, 0.8, 0.6, -0.5),
        ),
        (
            "Sinkhorn isotropic",
            "sinkhorn",
            SinkhornHead(0.9 * np.eye(2), 0.6 * np.eye(2)),
            lambda lam: ode.sinkhorn_isotropic_time(lam, 0.7, 0.9, 0.6),
        ),
    ):
        sol = ode.solve(variant, np.zeros(2), 0.7 * np.eye(2), params, 0.6)
        lam = float(sol.at(0.6)[1][0, 0])
        err = abs(time_of(lam) - 0.6)
        rows.append([f"{name}: t(lambda(0.6)) - 0.6", lam, "", err])
        report.checks.append(Check(f"{name} closed form", err, 1e-10))
    log("closed forms done")
    report.sections.append(
        "## Closed forms (docs/theory.md, 'Closed forms')\n\n"
        + _table(["case", "ODE", "closed form", "error"], rows)
    )


def grid_vs_odes(report: Report, log, variants: list[str], cells: list[int], t_end: float) -> dict:
    rows, kept = [], {}
    for variant in variants:
        out = studies.gaussian_refinement(
            variant, CLOSED_FORM_PARAMS[variant], MEAN1, COV1, cells, t_end
        )
        kept[variant] = out
        orders = [float("nan")] + list(out.orders)
        for n, em, ec, p in zip(cells, out.mean_errors, out.cov_errors, orders, strict=True):
            rows.append([variant, f"{n}^2", em, ec, f"{p:.2f}"])
        report.checks.append(
            Check(
                f"grid vs ODE, {variant}: cov error at {cells[-1]}^2",
                out.cov_errors[-1],
                1e-3 if cells[-1] <= 64 else 1e-5,
            )
        )
        report.checks.append(
            Check(
                f"grid vs ODE, {variant}: observed order {cells[-2]}->{cells[-1]}",
                float(out.orders[-1]),
                low=4.0,
            )
        )
        log(f"grid vs ODE {variant}: {out.cov_errors}")
    report.sections.append(
        f"## Grid (WENO5-Z + SSP-RK3) vs the Gaussian ODEs (2-D, c1, "
        f"t = {t_end})\n\n" + _table(["variant", "cells", "mean error", "cov error", "order"], rows)
    )
    return kept


def grid_vs_tokens(report: Report, log, cases: list[tuple]) -> None:
    rows = []
    for name, variant, params, grid, density, n, p in cases:
        try:
            out = studies.grid_vs_tokens(variant, params, grid, density, n, 1.0, 0.05, p=p)
        except (RuntimeError, FloatingPointError) as exc:  # a failed run is a failed check
            report.checks.append(Check(f"grid vs tokens, {name}: {exc}", math.inf, 2.0))
            log(f"grid vs tokens {name}: FAILED {exc}")
            continue
        rows.append([name, n, f"W{p}", out["distance_start"], out["distance_end"]])
        report.checks.append(
            Check(
                f"grid vs tokens, {name}: W{p}(t=1) / W{p}(t=0)",
                out["distance_end"] / out["distance_start"],
                2.0,
            )
        )
        log(f"grid vs tokens {name}: {out['distance_start']:.3e} -> {out['distance_end']:.3e}")
    report.sections.append(
        "## Grid vs sampled tokens on non-Gaussian data (t = 1)\n\nThe distance at t = 0 is "
        "the sampling distance of the n tokens; the check asks that the distance at t = 1 "
        "stays within twice it.\n\n" + _table(["case", "tokens", "metric", "t = 0", "t = 1"], rows)
    )


def masked_checks(report: Report, log, cases: list[tuple]) -> None:
    """Masked attention: the masked token system against the masked grid run in the
    conditional distance W_{2,nu}, tokens sampled per position slice (studies)."""
    rows = []
    for name, variant, params, grid, positions, density, per_slice in cases:
        try:
            out = studies.masked_grid_vs_tokens(
                variant, params, grid, positions, density, per_slice, 1.0, 0.02, seed=1
            )
        except (RuntimeError, FloatingPointError) as exc:
            report.checks.append(Check(f"masked grid vs tokens, {name}: {exc}", math.inf, 1.0))
            log(f"masked {name}: FAILED {exc}")
            continue
        ratio = out["distance_end"] / out["distance_start"]
        rows.append([name, out["tokens"], out["distance_start"], out["distance_end"]])
        report.checks.append(
            Check(f"masked grid vs tokens, {name}: W2,nu(t=1) / W2,nu(t=0)", ratio, 1.0)
        )
        log(f"masked {name}: {out['distance_start']:.3e} -> {out['distance_end']:.3e}")
    report.sections.append(
        "## Masked attention: grid vs the masked token system (t = 1)\n\nPosition-dependent "
        "data, tokens sampled per slice (the sink included); conditional distance "
        "W_{2,nu} = (sum_k nu_k W_2(slice_k)^2)^{1/2}. The check asks that the distance at "
        "t = 1 stays below the sampling distance at t = 0 (contracting dynamics).\n\n"
        + _table(["case", "tokens", "t = 0", "t = 1"], rows)
    )


def drifting_slices_1d(positions: Positions) -> tuple[Grid, np.ndarray]:
    grid = Grid([-6.0], [6.0], [240])
    return grid, positions.sliced(
        lambda s: gaussian_mixture(
            grid, [0.6 - 0.3 * s, 0.4 + 0.3 * s], [[-1.5 + s], [1.2]], [[[0.3]], [[0.25]]]
        ),
        grid,
    )


def mean_field_study(
    report: Report,
    log,
    grid: Grid,
    density: np.ndarray,
    params,
    ns: list[int],
    label: str,
    seeds: int = 3,
) -> dict:
    out = studies.mean_field("softmax", params, grid, density, ns, 0.5, 0.05, seeds=seeds)
    report.checks.append(
        Check(f"mean-field slope of W1 vs n ({label})", out["slope"], high=-0.3, low=-0.8)
    )
    rows = [[n, d] for n, d in zip(out["n"], out["distances"], strict=True)]
    report.sections.append(
        f"## Mean-field limit ({label}, softmax, t = 0.5)\n\nW1 between n i.i.d. tokens and "
        f"the grid solution (mean of {seeds} samples per n); fitted slope {out['slope']:.3f} "
        f"(docs/theory.md, 'Support and speed bounds': n^-1/2 in 1-D, n^-1/2 log n in 2-D)."
        "\n\n" + _table(["n", "W1"], rows)
    )
    log(f"mean field {label}: slope {out['slope']:.3f}")
    return out


# ---- figures --------------------------------------------------------------------------------
def _figure(width: float, height: float):
    """A constrained-layout figure on its own Agg canvas (no pyplot, no backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _log_ticks(axis) -> None:
    """Ticks of a log axis at 1, 2 and 5 times the powers of ten, labelled plainly ("200"),
    no labels on the minor ticks: matplotlib labels every minor tick of an axis spanning
    less than a decade or so, and those labels ran into one another."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def covariance_figure(path: Path, refinement, tokens: dict):
    """Covariance eigenvalues of the grid, the Gauss-Hermite tokens and the Gaussian ODE
    against t, written to ``path``; returns the figure."""
    fig = _figure(6.4, 4.2)
    ax = fig.add_subplot()
    ode_eigs = np.linalg.eigvalsh(refinement.ode_covariances)
    grid_eigs = np.linalg.eigvalsh(np.array(refinement.grid_covariances))
    token_eigs = np.linalg.eigvalsh(tokens["covariances"])
    for k in range(ode_eigs.shape[1]):
        ax.plot(
            refinement.times, ode_eigs[:, k], "k-", lw=1.5, label="Gaussian ODE" if k == 0 else None
        )
        ax.plot(
            refinement.times,
            grid_eigs[:, k],
            "o",
            mfc="none",
            color="C0",
            label=f"grid {refinement.cells[-1]}^2" if k == 0 else None,
        )
        ax.plot(
            tokens["times"],
            token_eigs[:, k],
            "x",
            color="C3",
            label=f"{tokens['tokens']} Gauss-Hermite tokens" if k == 0 else None,
        )
    ax.set_xlabel("t")
    ax.set_ylabel("eigenvalues of the covariance")
    ax.set_title("softmax, c1 matrices: grid vs tokens vs Gaussian ODE", fontsize="medium")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return fig


def mean_field_figure(path: Path, studies_out: dict[str, dict]):
    """W1 between n tokens and the grid against n (log-log) with the fitted slopes and
    n^-1/2, written to ``path``; returns the figure."""
    fig = _figure(6.4, 4.2)
    ax = fig.add_subplot()
    n = np.array([1.0])
    out: dict = {}
    for k, (label, out) in enumerate(studies_out.items()):
        n = np.array(out["n"], float)
        ax.loglog(n, out["distances"], "o", color=f"C{k}", label=f"{label}")
        fit = np.exp(np.polyval(np.polyfit(np.log(n), np.log(out["distances"]), 1), np.log(n)))
        ax.loglog(n, fit, "-", color=f"C{k}", label=f"slope {out['slope']:.2f}")
    if out:
        ax.loglog(n, out["distances"][0] * (n / n[0]) ** -0.5, "k:", label="n^-1/2")
    _log_ticks(ax.xaxis)
    _log_ticks(ax.yaxis)
    ax.set_xlabel("tokens n")
    ax.set_ylabel("W1(tokens, grid) at t = 0.5")
    ax.set_title("mean-field limit: tokens -> grid solution", fontsize="medium")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return fig


# ---- the suites -----------------------------------------------------------------------------
def two_bumps_1d() -> tuple[Grid, np.ndarray]:
    grid = Grid([-5.0], [5.0], [400])
    return grid, gaussian_mixture(grid, [0.5, 0.5], [[-1.5], [1.2]], [[[0.3]], [[0.5]]])


def run_suite(suite: str, outdir: Path, log: Callable[[str], None] = print) -> Report:
    """Run the quick or full suite; write ``outdir/report.md`` and its figures."""
    if suite not in ("quick", "full"):
        raise ValueError(f"validate.suite: unknown {suite!r}; choose quick or full")
    outdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report = Report([], [], [])
    tokens = tokens_vs_odes(report, log)
    closed_forms(report, log)
    if suite == "quick":
        refinements = grid_vs_odes(report, log, ["softmax"], [32, 64], 0.5)
    else:
        refinements = grid_vs_odes(report, log, list(CLOSED_FORM_PARAMS), [32, 64, 128], 1.0)
    covariance_figure(outdir / "covariance.png", refinements["softmax"], tokens["softmax"])
    report.figures.append("covariance.png")

    line, bumps = two_bumps_1d()
    disc_grid = Grid([-5, -5], [5, 5], [40, 40])
    disc = uniform_ball(disc_grid, [0.3, -0.2], 2.0)
    mix_grid = Grid([-5, -5], [5, 5], [40, 40])
    mix = gaussian_mixture(
        mix_grid, [0.5, 0.5], [[-1.5, 0.0], [1.5, 0.5]], [0.4 * np.eye(2), [[0.5, 0.1], [0.1, 0.3]]]
    )
    cases = [
        ("1-D two bumps, softmax", "softmax", Head(A_BUMPS, V_1D), line, bumps, 4000, 1),
        (
            "1-D two bumps, sigmoid",
            "sigmoid",
            SigmoidHead(A_BUMPS, V_1D, bias=-1.0),
            line,
            bumps,
            4000,
            1,
        ),
        (
            "1-D two bumps, Sinkhorn",
            "sinkhorn",
            SinkhornHead(A_BUMPS, V_1D),
            line,
            bumps,
            1000,
            1,
        ),
        ("2-D uniform disc, softmax", "softmax", Head(A1, V1), disc_grid, disc, 2000, 2),
        (
            "2-D two bumps, l2 (Q = K)",
            "l2",
            L2Head(0.7 * np.eye(2), 0.7 * np.eye(2), -0.5 * np.eye(2)),
            mix_grid,
            mix,
            2000,
            2,
        ),
    ]
    if suite == "full":
        cases += [
            (
                "2-D two bumps, multi-head",
                "multihead",
                CLOSED_FORM_PARAMS["multihead"],
                mix_grid,
                mix,
                4000,
                2,
            ),
            (
                "2-D two bumps, Sinkhorn",
                "sinkhorn",
                SinkhornHead(0.5 * np.eye(2), -0.5 * np.eye(2)),
                mix_grid,
                mix,
                1000,
                2,
            ),
        ]
    grid_vs_tokens(report, log, cases)

    positions = Positions(3, 0.2)
    masked = [
        (
            "1-D drifting bumps, softmax",
            "softmax",
            Head(A_DRIFT, V_1D),
            *drifting_slices_1d(positions),
            250,
        )
    ]
    if suite == "full":
        grid2 = Grid([-5.0, -5.0], [5.0, 5.0], [40, 40])
        slices2 = positions.sliced(
            lambda s: gaussian_mixture(
                grid2,
                [0.6 - 0.3 * s, 0.4 + 0.3 * s],
                [[-1.5 + s, 0.0], [1.2, 0.5 - s]],
                [0.4 * np.eye(2), [[0.3, 0.1], [0.1, 0.35]]],
            ),
            grid2,
        )
        masked += [
            (
                "1-D drifting bumps, softmax",
                "softmax",
                Head(A_DRIFT, V_1D),
                *drifting_slices_1d(positions),
                1000,
            ),
            (
                "2-D drifting bumps, softmax",
                "softmax",
                Head(-0.5 * np.eye(2), np.eye(2)),
                grid2,
                slices2,
                500,
            ),
        ]
    masked_checks(
        report,
        log,
        [
            (name, variant, params, grid, positions, density, n)
            for name, variant, params, grid, density, n in masked
        ],
    )

    mean_fields = {
        "1-D two bumps": mean_field_study(
            report, log, line, bumps, Head(A_BUMPS, V_1D), [250, 1000, 4000], "1-D"
        )
    }
    if suite == "full":
        mean_fields["2-D two bumps"] = mean_field_study(
            report,
            log,
            mix_grid,
            mix,
            Head(-0.5 * np.eye(2), np.eye(2)),
            [1000, 3000, 10000, 30000],
            "2-D",
            seeds=2,
        )
    mean_field_figure(outdir / "mean_field.png", mean_fields)
    report.figures.append("mean_field.png")
    write_report(report, outdir / "report.md", suite, time.perf_counter() - start)
    return report


def write_report(report: Report, path: Path, suite: str, seconds: float) -> None:
    failed = [c for c in report.checks if not c.passed]
    lines = [
        f"# tpde validation report ({suite} suite)",
        "",
        f"{len(report.checks) - len(failed)} of {len(report.checks)} checks passed "
        f"in {seconds:.0f} s.",
        "",
        _table(
            ["check", "value", "limit", "result"],
            [
                [c.name, float(c.value), c.limit(), "PASS" if c.passed else "**FAIL**"]
                for c in report.checks
            ],
        ),
        "",
    ]
    for figure in report.figures:
        lines += [f"![{figure}]({figure})", ""]
    lines += [s + "\n" for s in report.sections]
    path.write_text("\n".join(lines))
