"""Thread policy of the compiled loops, the BLAS products and the FFTs.

Nothing happens on import: the policy is applied by :func:`set_num_threads` (explicitly,
or once through :func:`ensure_policy` when a solver is built), so ``import tpde.grid``
loads no numba and leaves the process's BLAS alone.

One number sets numba's parallel loops (fluxes, limiter, table interpolation) and the row
blocks of the separable tables' matrix products
(:func:`tpde.variants.engines.products.row_split_tensordot`). The FFT engine's transforms
run on one thread (:data:`tpde.variants.engines.fft.FFT_THREADS`: FFTW's own threads lose
to numba's spinning workers inside a step). BLAS itself is held at one thread (through
threadpoolctl, numpy's and scipy's BLAS): OpenBLAS threads spin-wait after each product and
take the cores from the parallel loops that follow, and numba's workers, spinning after
each loop, take them from any second pool (``benchmarks/step.py`` times 1 and 2 threads).
"""

from __future__ import annotations

import os

THREADS_VARIABLE = "TPDE_NUM_THREADS"

_applied: int | None = None


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
    import numba as nb

    # numba.config sets its NUMBA_* names from the environment at import: untyped.
    return int(nb.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]


def set_num_threads(threads: int | None = None) -> int:
    """Threads for the compiled loops (BLAS: one, see the module docstring); returns the
    number in use.

    Default (``None``): :func:`default_threads`. On cores shared with other busy processes
    one thread can be much faster than several (``TPDE_NUM_THREADS=1``). At most
    ``numba.config.NUMBA_NUM_THREADS``.
    """
    global _applied
    import numba as nb

    if threads is None:
        threads = default_threads()
    threads = max(1, min(int(threads), nb.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    nb.set_num_threads(threads)
    _applied = threads
    try:
        import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot: limit it too)
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency; without it BLAS keeps its own
        return threads
    threadpool_limits(limits=1, user_api="blas")
    return threads


def ensure_policy() -> int:
    """Apply the default policy once, unless :func:`set_num_threads` already ran; returns
    the number of threads in use. Called by the solver and the table products."""
    return _applied if _applied is not None else set_num_threads()
