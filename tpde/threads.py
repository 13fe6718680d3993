"""Thread policy of the compiled loops, the BLAS products and the FFTs, applied on import.

One number sets numba's parallel loops (fluxes, limiter, table interpolation) and the
pyfftw / scipy.fft transforms (planned with ``numba.get_num_threads()``). The BLAS behind
the separable tables' matrix products is held at one thread (through threadpoolctl, which
works whichever BLAS numpy links): OpenBLAS threads spin-wait after each product and take
the cores from the parallel loops that follow. Measured on a 2-core machine, 2-D 256^2
softmax step: 57 ms with numba 2 / BLAS 1 threads, 108 ms with numba 2 / BLAS 2, 75 ms on
one thread (benchmarks/step.py times the policy).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

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
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency; without it BLAS keeps its own
        return threads
    threadpool_limits(limits=1, user_api="blas")
    return threads


#: products below this many multiply-adds run on the calling thread alone
SPLIT_MIN_WORK = 2_000_000
_POOL: ThreadPoolExecutor | None = None


def row_split_tensordot(matrix: np.ndarray, array: np.ndarray, axis: int) -> np.ndarray:
    """``np.tensordot(matrix, array, axes=([1], [axis]))``, (m, *rest), with the rows of
    ``matrix`` (m, n) split over ``numba.get_num_threads()`` threads, each a one-thread BLAS
    product into its block of the result (numpy releases the GIL in BLAS). This keeps the
    BLAS at one thread (module docstring) and still uses every core for the separable
    tables' products."""
    global _POOL
    operand = np.moveaxis(array, axis, 0)
    rest = operand.shape[1:]
    operand = np.ascontiguousarray(operand.reshape(operand.shape[0], -1))
    matrix = np.ascontiguousarray(matrix)
    out = np.empty((matrix.shape[0], operand.shape[1]))
    threads = min(nb.get_num_threads(), matrix.shape[0])
    if threads == 1 or matrix.size * operand.shape[1] < SPLIT_MIN_WORK:
        np.dot(matrix, operand, out=out)
        return out.reshape((matrix.shape[0],) + rest)
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, nb.config.NUMBA_NUM_THREADS - 1),
                                   thread_name_prefix="tpde-blas")
    bounds = np.linspace(0, matrix.shape[0], threads + 1).astype(int)
    futures = [_POOL.submit(np.dot, matrix[lo:hi], operand, out[lo:hi])
               for lo, hi in zip(bounds[1:-1], bounds[2:], strict=True)]
    np.dot(matrix[:bounds[1]], operand, out[:bounds[1]])
    for future in futures:
        future.result()
    return out.reshape((matrix.shape[0],) + rest)
