"""Table products split over numba's own workers (the separable engine's matrix products).

A second pool (Python threads, or BLAS threads) would wait for the cores that numba's
OpenMP workers spin on after each parallel loop, so the row blocks of one product run on
those same workers, each block a one-thread BLAS call (numba's ``np.dot`` calls scipy's
BLAS, held at one thread by :func:`tpde.grid.threads.set_num_threads`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tpde.grid.threads import ensure_policy

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
    threads) would wait for the cores those workers spin on after each parallel loop, and
    was slower than these blocks both split over Python threads and as one BLAS call
    (``benchmarks/step.py`` times the step at 1 and 2 threads).
    """
    ensure_policy()
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
