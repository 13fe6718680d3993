"""Thread policy of the compiled loops, the BLAS products and the FFTs, applied on import.

One number sets numba's parallel loops (fluxes, limiter, table interpolation) and the row
blocks of the separable tables' matrix products (:func:`row_split_tensordot`). The FFT
engine's transforms run on one thread (:data:`tpde.variants.fft.FFT_THREADS`: FFTW's own
threads lose to numba's spinning workers inside a step). BLAS itself is held at one
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
            raise ValueError(
                f"{THREADS_VARIABLE}: expected a positive integer, got {value!r}"
            ) from None
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
def blocked_dot(matrix, level1, out, first, end, block_rows):
    """out[r0:r1, c0:c1] = matrix[r0:r1] @ level1[c0:c1].T for each block of ``block_rows``
    rows, c0 = first[block], c1 = end[block]; NaN in the rest of the block's rows. One
    one-thread BLAS product per block, the blocks on numba's own workers (numba's np.dot calls
    scipy's BLAS). matrix (m, n), level1 (m', n), both C-contiguous; out (m, m')."""
    for block in nb.prange(first.size):
        r0 = block * block_rows
        r1 = min(r0 + block_rows, matrix.shape[0])
        c0 = first[block]
        c1 = max(end[block], c0)
        out[r0:r1, :c0] = np.nan
        out[r0:r1, c1:] = np.nan
        if c1 > c0:
            out[r0:r1, c0:c1] = np.dot(matrix[r0:r1], level1[c0:c1].T)


def row_split_tensordot(matrix: np.ndarray, array: np.ndarray, axis: int) -> np.ndarray:
    """``np.tensordot(matrix, array, axes=([1], [axis]))``, (m, *rest), with the rows of
    ``matrix`` (m, n) split over numba's threads (:func:`blocked_dot`).

    The blocks run on numba's own OpenMP workers: a second pool (Python threads, or BLAS
    threads) would wait for the cores those workers spin on after each parallel loop.
    Measured, 2-D 256^2 table product (408 x 256 times 256 x 161) after a parallel loop,
    2 cores: 0.39 ms here, 0.95 ms split over Python threads, 0.80 ms as one BLAS call.
    """
    operand = np.moveaxis(array, axis, 0)
    rest = operand.shape[1:]
    operand = operand.reshape(operand.shape[0], -1)
    matrix = np.ascontiguousarray(matrix)
    out = np.empty((matrix.shape[0], operand.shape[1]))
    threads = min(nb.get_num_threads(), matrix.shape[0])
    if threads == 1 or matrix.size * operand.shape[1] < SPLIT_MIN_WORK:
        np.dot(matrix, operand, out=out)
    else:
        rows = -(-matrix.shape[0] // threads)
        blocks = -(-matrix.shape[0] // rows)
        blocked_dot(
            matrix,
            np.ascontiguousarray(operand.T),
            out,
            np.zeros(blocks, np.int64),
            np.full(blocks, operand.shape[1], np.int64),
            rows,
        )
    return out.reshape((matrix.shape[0],) + rest)
