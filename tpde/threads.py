"""Thread policy of the compiled loops, the BLAS products and the FFTs, applied on import.

One number sets numba's parallel loops (fluxes, limiter, table interpolation), the row blocks
of the separable tables' matrix products (:func:`row_split_tensordot`) and the pyfftw /
scipy.fft transforms (planned with ``numba.get_num_threads()``). BLAS itself is held at one
thread (through threadpoolctl, numpy's and scipy's BLAS): OpenBLAS threads spin-wait after
each product and take the cores from the parallel loops that follow, and numba's workers,
spinning after each loop, take them from any second pool. Measured on a 2-core machine,
2-D 256^2 softmax step: 57 ms with numba 2 / BLAS 1 threads, 108 ms with numba 2 / BLAS 2
(before the row blocks; benchmarks/step.py times 1 and 2 threads).
"""

from __future__ import annotations

import os

import numba as nb
import numpy as np

THREADS_VARIABLE = "TPDE_NUM_THREADS"


def default_threads() -> int:
    """``TPDE_NUM_THREADS`` if set, else every core numba may use (``NUMBA_NUM_THREADS``,
    the core count unless that variable lowers it)."""
    value = os.environ.get(THREADS_VARIABLE, "").strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise ValueError(f"{THREADS_VARIABLE}: expected a positive integer, got "
                             f"{value!r}") from None
    return nb.config.NUMBA_NUM_THREADS


def set_num_threads(threads: int | None = None) -> int:
    """Threads for the compiled loops (BLAS: one, see the module docstring); returns the
    number in use.

    Default (``None``): :func:`default_threads`. On an idle 2-core machine two threads
    make a 2-D 256^2 softmax step about 1.5x faster than one (benchmarks/step.py); on cores
    shared with other busy processes one thread can be faster (``TPDE_NUM_THREADS=1``).
    At most ``numba.config.NUMBA_NUM_THREADS``.
    """
    if threads is None:
        threads = default_threads()
    threads = max(1, min(int(threads), nb.config.NUMBA_NUM_THREADS))
    nb.set_num_threads(threads)
    try:
        import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot: limit it too)
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency; without it BLAS keeps its own
        return threads
    threadpool_limits(limits=1, user_api="blas")
    return threads


#: products below this many multiply-adds run as one BLAS call
SPLIT_MIN_WORK = 2_000_000


@nb.njit(parallel=True, cache=True)
def _blocked_dot(matrix, operand, out, bounds):
    for t in nb.prange(bounds.size - 1):
        np.dot(matrix[bounds[t]:bounds[t + 1]], operand, out[bounds[t]:bounds[t + 1]])


def row_split_tensordot(matrix: np.ndarray, array: np.ndarray, axis: int) -> np.ndarray:
    """``np.tensordot(matrix, array, axes=([1], [axis]))``, (m, *rest), with the rows of
    ``matrix`` (m, n) split over numba's threads, each a one-thread BLAS product into its
    block of the result.

    The blocks run on numba's own OpenMP workers (numba's ``np.dot`` calls scipy's BLAS):
    a second pool (Python threads, or BLAS threads) would wait for the cores those workers
    spin on after each parallel loop. Measured, 2-D 256^2 table product (408 x 256 times
    256 x 161) after a parallel loop, 2 cores: 0.39 ms here, 0.95 ms split over Python
    threads, 0.80 ms as one BLAS call.
    """
    operand = np.moveaxis(array, axis, 0)
    rest = operand.shape[1:]
    operand = operand.reshape(operand.shape[0], -1)
    if not (operand.flags.c_contiguous or operand.flags.f_contiguous):
        operand = np.ascontiguousarray(operand)
    matrix = np.ascontiguousarray(matrix)
    out = np.empty((matrix.shape[0], operand.shape[1]))
    threads = min(nb.get_num_threads(), matrix.shape[0])
    if threads == 1 or matrix.size * operand.shape[1] < SPLIT_MIN_WORK:
        np.dot(matrix, operand, out=out)
    else:
        _blocked_dot(matrix, operand, out,
                     np.linspace(0, matrix.shape[0], threads + 1).astype(np.int64))
    return out.reshape((matrix.shape[0],) + rest)
