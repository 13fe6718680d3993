"""Thread policy of the compiled (numba) loops, applied when ``tpde`` is imported."""

from __future__ import annotations

import os

import numba as nb

THREADS_VARIABLE = "TPDE_NUM_THREADS"


def set_num_threads(threads: int | None = None) -> int:
    """Threads for the compiled loops; returns the number in use.

    Default (``None``): the ``TPDE_NUM_THREADS`` environment variable, else 1. One thread is
    the default because numba's parallel loops slow down badly when the cores are shared with
    other busy processes (launch and spin overheads per loop, and OpenMP threads spinning
    against the BLAS threads of the kernel sums); on an idle 2-core machine two threads make
    a WENO5 step about 1.6x faster (benchmarks/advection.py). At most
    ``numba.config.NUMBA_NUM_THREADS`` (the core count unless ``NUMBA_NUM_THREADS`` is set).
    """
    if threads is None:
        threads = int(os.environ.get(THREADS_VARIABLE, "1") or 1)
    threads = max(1, min(int(threads), nb.config.NUMBA_NUM_THREADS))
    nb.set_num_threads(threads)
    return threads
