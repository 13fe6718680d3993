#!/usr/bin/env python
"""The diffusion substep of a noisy run: three solvers of ``exp(tau eps Delta)`` side by side.

    .venv/bin/python benchmarks/diffusion.py [--n 128] [--repeat 5]

On the 2-D periodic n^2 box (+-8) with a Gaussian N(0, I), eps = 0.1 and tau = the CFL step
of a unit speed (0.4 h), each row times one substep (best of ``--repeat``) and records the
relative error in the Gaussian's tails (the cell 6 standard deviations out on an axis) against
the exact heat flow of the fourth-order operator's continuum limit (the Gaussian of covariance
``I + 2 eps tau I``). Rows: ``axis_exponentials`` (what tpde runs: dense ``exp(tau eps L_a)``
per axis, one matrix product each, formed once per step length; the forming time is its own
figure), ``fft`` (the same operator's symbol in Fourier space, numpy's FFT),
``expm_multiply`` (scipy's action of the sparse 2-D operator's exponential). Prints one JSON
line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import expm_multiply

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import best_of, emit  # noqa: E402

from tpde.grid import Grid, gaussian  # noqa: E402
from tpde.schemes.diffusion import Diffusion, laplacian_matrix  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    start = time.perf_counter()
    n, eps = args.n, 0.1
    grid = Grid([-8.0, -8.0], [8.0, 8.0], [n, n], "periodic")
    h = grid.spacing[0]
    tau = 0.4 * h
    density = gaussian(grid, np.zeros(2), np.eye(2))
    exact = gaussian(grid, np.zeros(2), (1.0 + 2.0 * eps * tau) * np.eye(2))
    tail = (n // 2, int(np.argmin(np.abs(grid.centres(1) - 6.0))))

    diffusion = Diffusion(grid, eps)
    forming = best_of(lambda: (diffusion._cache.clear(), diffusion._exponentials(tau)), 1)
    dense_out = diffusion.step(density, tau)[0]
    dense = best_of(lambda: diffusion.step(density, tau), args.repeat)

    theta = 2.0 * np.pi * np.fft.fftfreq(n)
    sigma = (32.0 * np.cos(theta) - 2.0 * np.cos(2.0 * theta) - 30.0) / (12.0 * h**2)
    rtheta = 2.0 * np.pi * np.fft.rfftfreq(n)
    rsigma = (32.0 * np.cos(rtheta) - 2.0 * np.cos(2.0 * rtheta) - 30.0) / (12.0 * h**2)
    factor = np.exp(tau * eps * (sigma[:, None] + rsigma[None, :]))

    def fft() -> np.ndarray:
        return np.fft.irfftn(np.fft.rfftn(density) * factor, s=density.shape)

    fft_out = fft()
    fft_time = best_of(fft, args.repeat)

    lap = sparse.csr_matrix(laplacian_matrix(n, h, "periodic"))
    eye = sparse.identity(n, format="csr")
    operator = (sparse.kron(lap, eye) + sparse.kron(eye, lap)).tocsr() * (tau * eps)
    flat = density.reshape(-1)
    krylov_out = expm_multiply(operator, flat).reshape(density.shape)
    krylov = best_of(lambda: expm_multiply(operator, flat), args.repeat)

    def tail_error(out: np.ndarray) -> float:
        return float(abs(out[tail] / exact[tail] - 1.0))

    emit(
        "diffusion",
        start,
        n=n,
        tau=tau,
        tail_cell_value=float(exact[tail]),
        axis_exponentials_s=dense,
        axis_exponentials_forming_s=forming,
        fft_s=fft_time,
        expm_multiply_s=krylov,
        fft_over_axis=fft_time / dense,
        expm_multiply_over_axis=krylov / dense,
        axis_tail_error=tail_error(dense_out),
        fft_tail_error=tail_error(fft_out),
        expm_multiply_tail_error=tail_error(krylov_out),
        fft_vs_axis_max=float(np.abs(fft_out - dense_out).max()),
    )


if __name__ == "__main__":
    main()
