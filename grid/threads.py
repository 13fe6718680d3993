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

The default never collapses on a shared machine (docs/user-guide.md, 'Threads'): the cores
the process may run on less those other processes keep busy at start (:func:`busy_cores`,
the run queue), at least one, with numba's OpenMP workers waiting *passively* between
parallel loops (``OMP_WAIT_POLICY=passive``, set by :func:`set_num_threads` before numba
starts its workers, unless the variable is already set). With the OpenMP default (workers
that spin after each loop) a worker whose core is taken by another process holds every loop
up: a 128^2 softmax step next to a process keeping both cores busy took 8-170x the quiet
one-thread step; with passive workers on both cores 1.7x, on one thread 1.4x, the
``workqueue`` layer 2.7x (``benchmarks/threads.py`` times the candidates side by side). The
passive wait is what prevents the collapse, also when the load comes after the start; the
load check gives a busy machine's cores to the processes already on them. Results do not
depend on the number of threads (bit for bit).
"""

from __future__ import annotations

import os

THREADS_VARIABLE = "TPDE_NUM_THREADS"
#: OpenMP's wait policy, read once when numba starts its workers (libgomp's and Intel's)
WAIT_VARIABLE = "OMP_WAIT_POLICY"
#: the policy tpde sets unless the variable is already set (module docstring)
WAIT_POLICY = "passive"

_applied: int | None = None


def default_threads() -> int:
    """``TPDE_NUM_THREADS`` if set, else the cores numba may use (``NUMBA_NUM_THREADS``: the
    cores of the process's affinity mask unless that variable lowers it) less those that
    other processes keep busy now (:func:`busy_cores`), at least one."""
    value = os.environ.get(THREADS_VARIABLE, "").strip()
    if value:
        return parse_threads(value, THREADS_VARIABLE)
    import numba as nb

    # numba.config sets its NUMBA_* names from the environment at import: untyped.
    cores = int(nb.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    return threads_for(cores, busy_cores())


def threads_for(cores: int, busy: float) -> int:
    """The default's thread count: ``cores`` less the ``busy`` ones (rounded), in [1, cores]."""
    return max(1, min(cores, int(cores - busy + 0.5)))


#: samples of the run queue taken by :func:`busy_cores`, SAMPLE_S apart
SAMPLES, SAMPLE_S = 5, 0.002


def busy_cores(loadavg: str = "/proc/loadavg") -> float:
    """Runnable threads of other processes now: the median over SAMPLES readings of the
    run queue (the fourth field of ``/proc/loadavg``, ``running/total``) less this
    process's one, or where that file is missing the one-minute load average.

    The run queue sees a process that started a second ago, which the load averages (one
    minute and longer) do not, and it does not count this process's own earlier work.
    """
    import statistics
    import time

    counts = []
    for k in range(SAMPLES):
        try:
            with open(loadavg) as fh:
                running = fh.read().split()[3].split("/")[0]
            counts.append(max(0, int(running) - 1))
        except (OSError, IndexError, ValueError):
            break
        if k + 1 < SAMPLES:
            time.sleep(SAMPLE_S)
    if counts:
        return float(statistics.median(counts))
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):  # no load figures on this platform: assume idle
        return 0.0


def parse_threads(value: object, name: str = "--threads") -> int:
    """A thread count (a positive integer) from a string or a number; ``ValueError`` naming
    ``name`` otherwise."""
    try:
        threads = int(str(value).strip())
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}") from None
    return threads


def passive_wait() -> bool:
    """Make numba's OpenMP workers wait passively (``OMP_WAIT_POLICY=passive``) unless the
    variable is set already; returns whether the workers do (or will) wait passively.

    OpenMP reads the variable once, when numba starts its workers (the first parallel loop
    or :func:`set_num_threads`); after that the call changes nothing and says what the
    workers do. Other threading layers (``workqueue``, ``tbb``) do not spin.
    """
    from numba.np.ufunc import parallel

    launched = bool(getattr(parallel, "_is_initialized", False))
    if not launched:
        os.environ.setdefault(WAIT_VARIABLE, WAIT_POLICY)
    return os.environ.get(WAIT_VARIABLE, "").strip().lower() == WAIT_POLICY


def set_num_threads(threads: int | None = None) -> int:
    """Threads for the compiled loops (BLAS: one, see the module docstring); returns the
    number in use.

    Default (``None``): :func:`default_threads`. At most ``numba.config.NUMBA_NUM_THREADS``.
    The first call also sets the workers' passive wait (:func:`passive_wait`), so several
    threads stay fast on cores that other processes keep busy.
    """
    global _applied
    import numba as nb

    threads = default_threads() if threads is None else parse_threads(threads)
    threads = min(threads, nb.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    passive_wait()
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
    the number of threads in use. Called by the solver, the table products and the token
    integrator (:func:`tpde.validation.particles.simulate`)."""
    return _applied if _applied is not None else set_num_threads()
