"""Exact solutions of linear transport used as references by the tests."""

from __future__ import annotations

import numpy as np
from scipy.linalg import expm

from tpde.grid import Grid


def sin2_cell_averages(grid: Grid, shift) -> np.ndarray:
    """Cell averages of prod_a sin^2(pi (x_a - shift_a)) (period 1 in every axis)."""
    out = np.ones(())
    for a in range(grid.ndim):
        e = grid.edges(a) - shift[a]
        antiderivative = e / 2 - np.sin(2 * np.pi * e) / (4 * np.pi)
        out = np.multiply.outer(out, np.diff(antiderivative) / grid.spacing[a])
    return out


def henrick_cell_averages(grid: Grid, shift: float, nodes: int = 12) -> np.ndarray:
    """Cell averages of 2 + sin(pi y - sin(pi y) / pi), y = x - shift (period 2), 1-D.

    Henrick, Aslam & Powers (2005): the profile has critical points where f' = 0 and
    f''' != 0, at which WENO5-JS loses accuracy. Gauss-Legendre per cell (exact to
    round-off for these smooth cells).
    """
    x, w = np.polynomial.legendre.leggauss(nodes)
    e = grid.edges(0)
    h = grid.spacing[0]
    pts = 0.5 * (e[:-1, None] + e[1:, None]) + 0.5 * h * x[None, :] - shift
    f = 2.0 + np.sin(np.pi * pts - np.sin(np.pi * pts) / np.pi)
    return 0.5 * (f * w).sum(axis=1)


def affine_gaussian_moments(matrix, offset, mean0, cov0, t):
    """Mean and covariance at time t of N(mean0, cov0) transported by u = M x + b.

    mean(t) = e^{Mt} m0 + int_0^t e^{Ms} ds b,  cov(t) = e^{Mt} S0 e^{M^T t}.
    """
    matrix = np.asarray(matrix, float)
    d = matrix.shape[0]
    augmented = np.zeros((d + 1, d + 1))
    augmented[:d, :d] = matrix
    augmented[:d, d] = offset
    mean = (expm(augmented * t) @ np.r_[mean0, 1.0])[:d]
    flow = expm(matrix * t)
    return mean, flow @ np.asarray(cov0, float) @ flow.T


def observed_orders(errors, cells=None) -> np.ndarray:
    """log(e_k / e_{k+1}) / log(N_{k+1} / N_k); cells default to doubling refinements."""
    errors = np.asarray(errors, float)
    ratios = 2.0 if cells is None else np.diff(np.log(np.asarray(cells, float)))
    if cells is None:
        return np.log2(errors[:-1] / errors[1:])
    return np.log(errors[:-1] / errors[1:]) / ratios


def print_table(title: str, cells, errors, extra: dict | None = None) -> None:
    """Print a convergence table: resolution, error, observed order (and extra columns)."""
    orders = observed_orders(errors, cells)
    print(f"\n{title}")
    header = f"{'N':>6} {'error':>12} {'order':>7}"
    extra = extra or {}
    for name in extra:
        header += f" {name:>12}"
    print(header)
    for i, (n, e) in enumerate(zip(cells, errors, strict=True)):
        line = f"{n:>6} {e:12.4e} {orders[i - 1] if i else float('nan'):7.3f}"
        for values in extra.values():
            v = values[i]
            line += f" {v:12.4e}" if isinstance(v, float) else f" {v!s:>12}"
        print(line)


def kill_after(args: list[str], lines: int, prefix: str = "[") -> None:
    """Run ``python -m tpde.cli ARGS`` and SIGKILL it once it has printed ``lines`` stderr
    lines starting with ``prefix`` (one per snapshot written: the progress line of every
    geometry); fails if the run ends first."""
    import os
    import signal
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "tpde.cli", *args], stderr=subprocess.PIPE, text=True
    )
    seen = 0
    while seen < lines:
        line = process.stderr.readline()
        assert line, "the run ended before it could be killed"
        seen += line.startswith(prefix)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
