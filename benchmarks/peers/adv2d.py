"""ADV2D: the fixed advection problem on which tpde is timed beside an established solver.

This module belongs to tpde's benchmarks. It defines the problem, the timing protocol and
the JSON line of every row of ``benchmarks/advection.py``: the tpde rows
(``benchmarks/adv2d_tpde.py``) and the SharpClaw peer (``benchmarks/peers/pyclaw_adv2d.py``,
run in the separate Clawpack venv that ``benchmarks/setup_peers.sh`` builds). It needs
nothing but the standard library and numpy, because the peer venv has nothing else.

Import it before numpy, numba or a Fortran extension is loaded: it sets the thread-count
variables of the common runtimes to 1 unless the caller has set them, so that every row
runs on the threads the benchmark asks for.

Problem
-------
    rho_t + div(rho u) = 0 on the periodic unit square [0, 1)^2, u = (UX, UY) = (1, 0.5).
    N x N cells, dx = dy = 1/N; array index [i, j] is the cell centred at
    ((i + 1/2) dx, (j + 1/2) dy), axis 0 along x.
    Fixed step: nsteps = ceil(T / (CFL dx / max|u|)) with CFL = 0.4 and T = 0.25, then
    dt = T / nsteps (for N = 128, 256, 512 the division is exact: nsteps = 0.625 N).

Profiles (both separable, so their exact cell averages have closed forms)
    gauss: rho0 = exp(-|x - (1/2, 1/2)|^2 / (2 SIGMA^2)), SIGMA = 0.05; periodic images are
           added in the averages (the nearest one only matters: the others are < 1e-21).
    sin:   rho0 = 1 + sin(2 pi x) sin(2 pi y) / 2, smooth, for order studies.

Finite-volume rows start from, and are scored against, exact cell averages of the translated
profile (``Problem.field(t, "avg")``); a finite-difference row would use point values at the
centres (``"point"``). Errors: L1 = dx dy sum |q - q_exact|, Linf = max |q - q_exact|, and the
mass drift.

Timing protocol
---------------
Only the stepping loop is timed (set-up, JIT compilation and first touch of the work arrays
belong in an untimed warm-up), and the median of ``--repeat`` runs is reported.
Throughput: Mcell-updates/s = N^2 nsteps / seconds / 1e6, a full (multi-stage) step counting
once. Absolute times drift on shared machines, so every row also times a fixed reference
kernel in the same process, interleaved with its own repeats, and reports its throughput as a
ratio to it (``ratio_to_ref``): figures measured on different days can be compared through
it. The reference kernel (version ``REF_KERNEL_VERSION``; a change means a new version, never
an edit) is 100 steps of the first-order upwind update

    q <- q - cx (q - roll(q, 1, axis 0)) - cy (q - roll(q, 1, axis 1)),  cx = UX dt/dx, ...

on the same N x N float64 array, written with preallocated buffers and in-place ufuncs. That
way it measures arithmetic and memory bandwidth rather than the allocator: a version with
``np.roll`` temporaries spent most of its time in page faults (glibc hands blocks of 128 KiB
and more back to the kernel when they are freed) and varied by a factor of 3 between
processes.

A row script: ``import adv2d`` first; parse its command line with ``make_parser``; build the
solver for ``Problem(n)``; give ``measure`` three callables (reset the state, advance exactly
``nsteps`` steps of ``dt`` returning (seconds, final array), untimed warm-up); print
``report(...)`` with ``emit``. ``benchmarks/adv2d_tpde.py`` is the tpde row.
"""

from __future__ import annotations

import os

# The thread counts must be fixed before numpy / numba / Fortran runtimes start.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
for _var in THREAD_VARS:
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from importlib import metadata  # noqa: E402

import numpy as np  # noqa: E402

UX, UY = 1.0, 0.5
SIGMA = 0.05
TFINAL = 0.25
CFL = 0.4
REF_KERNEL_VERSION = 1
REF_STEPS = 100
MALLOC_VARS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
)

#: per timed run of the last ``measure``: minor page faults, system and user CPU seconds
RUN_STATS: list[dict] = []


class Problem:
    """ADV2D on N x N cells: step count, step, exact solutions and error norms."""

    def __init__(self, n: int, tfinal: float = TFINAL, cfl: float = CFL, profile: str = "gauss"):
        self.n = n
        self.dx = self.dy = 1.0 / n
        self.tfinal = tfinal
        self.cfl = cfl
        self.profile = profile
        dt_cfl = cfl * self.dx / max(abs(UX), abs(UY))
        self.nsteps = math.ceil(tfinal / dt_cfl - 1e-9)
        self.dt = tfinal / self.nsteps
        self.ux, self.uy = UX, UY
        self.xc = (np.arange(n) + 0.5) * self.dx  # cell centres, the same along x and y

    # 1-D factors of the separable profiles, translated by ``shift``
    def _gauss_average(self, shift: float) -> np.ndarray:
        """Exact cell averages of exp(-(x - 1/2 - shift)^2 / (2 SIGMA^2)), periodised."""
        erf = np.frompyfunc(math.erf, 1, 1)  # N + 1 values: no scipy needed in the peer venv
        edges = np.arange(self.n + 1) * self.dx
        scale = SIGMA * math.sqrt(2.0)
        centre = (0.5 + shift) % 1.0
        total = np.zeros(self.n)
        for image in (-1.0, 0.0, 1.0):
            e = erf((edges - centre - image) / scale).astype(np.float64)
            total += e[1:] - e[:-1]
        return total * (SIGMA * math.sqrt(math.pi / 2.0)) / self.dx

    def _gauss_point(self, shift: float) -> np.ndarray:
        centre = (0.5 + shift) % 1.0
        d = (self.xc - centre + 0.5) % 1.0 - 0.5  # distance to the nearest image
        return np.exp(-(d * d) / (2.0 * SIGMA * SIGMA))

    def _sin_average(self, shift: float) -> np.ndarray:
        a = np.arange(self.n) * self.dx - shift
        b = a + self.dx
        return (np.cos(2 * np.pi * a) - np.cos(2 * np.pi * b)) / (2 * np.pi * self.dx)

    def _sin_point(self, shift: float) -> np.ndarray:
        return np.sin(2 * np.pi * (self.xc - shift))

    def field(self, t: float = 0.0, kind: str = "avg") -> np.ndarray:
        """Exact solution at time t: cell averages (``"avg"``) or centre values (``"point"``)."""
        sx, sy = self.ux * t, self.uy * t
        if self.profile == "gauss":
            f = self._gauss_average if kind == "avg" else self._gauss_point
            return np.outer(f(sx), f(sy))
        if self.profile == "sin":
            f = self._sin_average if kind == "avg" else self._sin_point
            return 1.0 + 0.5 * np.outer(f(sx), f(sy))
        raise ValueError(f"unknown profile {self.profile!r} (gauss, sin)")

    def errors(self, q: np.ndarray, kind: str = "avg") -> dict:
        """L1, Linf and mass drift of ``q`` against the exact solution at ``tfinal``."""
        exact = self.field(self.tfinal, kind)
        d = np.abs(np.asarray(q, dtype=np.float64) - exact)
        mass0 = np.sum(self.field(0.0, kind))
        return {
            "l1": float(d.sum() * self.dx * self.dy),
            "linf": float(d.max()),
            "mass_drift": float((np.sum(q) - mass0) * self.dx * self.dy),
        }


def ref_kernel_run(q0: np.ndarray, cx: float, cy: float, steps: int = REF_STEPS) -> float:
    """The version-1 reference kernel (first-order upwind for u > 0, no allocation in the
    loop): seconds taken by ``steps`` steps. Bit for bit the ``np.roll`` update of the module
    docstring."""
    q = q0.copy()
    a = np.empty_like(q)
    b = np.empty_like(q)
    t0 = time.perf_counter()
    for _ in range(steps):
        np.subtract(q[1:], q[:-1], out=a[1:])  # a = q - roll(q, 1, axis 0)
        np.subtract(q[0], q[-1], out=a[0])
        np.subtract(q[:, 1:], q[:, :-1], out=b[:, 1:])  # b = q - roll(q, 1, axis 1)
        np.subtract(q[:, 0], q[:, -1], out=b[:, 0])
        a *= cx
        b *= cy
        q -= a
        q -= b
    elapsed = time.perf_counter() - t0
    if not np.isfinite(q[0, 0]):
        raise RuntimeError("reference kernel blew up")
    return elapsed


def make_parser(description: str | None) -> argparse.ArgumentParser:
    """The command line every row accepts."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=256, help="cells per direction")
    p.add_argument("--repeat", type=int, default=3, help="timed repeats (median reported)")
    p.add_argument("--profile", choices=["gauss", "sin"], default="gauss")
    p.add_argument("--tfinal", type=float, default=TFINAL)
    p.add_argument("--cfl", type=float, default=CFL)
    p.add_argument("--no-ref", action="store_true", help="skip the numpy reference kernel")
    return p


def versions(*dists: str) -> dict:
    out: dict = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def thread_env() -> dict:
    return {v: os.environ.get(v) for v in THREAD_VARS}


def malloc_env() -> dict:
    return {v: os.environ[v] for v in MALLOC_VARS if v in os.environ}


def measure(
    prob: Problem,
    reset: Callable[[], None],
    run: Callable[[], tuple[float, np.ndarray]],
    repeat: int,
    with_ref: bool = True,
    warmup: Callable[[], None] | None = None,
) -> tuple[list[float], list[float], np.ndarray | None]:
    """Time ``repeat`` runs of the row, interleaved with runs of the reference kernel.

    ``reset()`` restores the initial state (untimed); ``run()`` advances ``prob.nsteps``
    steps, times its own stepping loop and returns (seconds, final array); ``warmup()``, if
    given, is called once first. Returns the row's times, the reference times (one more
    than ``repeat``, so that the reference brackets the row) and the last final array.
    """
    if warmup is not None:
        warmup()
    q0 = prob.field(0.0, "avg")
    cx, cy = prob.ux * prob.dt / prob.dx, prob.uy * prob.dt / prob.dy
    if with_ref:
        ref_kernel_run(q0, cx, cy, steps=5)  # warm the allocator and the caches
    times: list[float] = []
    ref_times: list[float] = []
    q = None
    RUN_STATS.clear()
    for _ in range(repeat):
        if with_ref:
            ref_times.append(ref_kernel_run(q0, cx, cy))
        reset()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        elapsed, q = run()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        times.append(elapsed)
        RUN_STATS.append(
            {
                "minflt": r1.ru_minflt - r0.ru_minflt,
                "sys_s": round(r1.ru_stime - r0.ru_stime, 3),
                "user_s": round(r1.ru_utime - r0.ru_utime, 3),
            }
        )
    if with_ref:
        ref_times.append(ref_kernel_run(q0, cx, cy))
    return times, ref_times, q


def report(
    prob: Problem,
    peer: str,
    scheme: str,
    times: list[float],
    ref_times: list[float],
    errs: dict,
    extra: dict | None = None,
    dists: tuple[str, ...] = (),
) -> dict:
    """The row's JSON object: problem, times, throughput, reference ratio, errors, machine."""
    cells = prob.n * prob.n
    median = statistics.median(times)
    res: dict = {
        "peer": peer,
        "scheme": scheme,
        "n": prob.n,
        "profile": prob.profile,
        "steps": prob.nsteps,
        "dt": prob.dt,
        "tfinal": prob.tfinal,
        "cfl": prob.cfl,
        "repeat": len(times),
        "times_s": [round(t, 6) for t in times],
        "median_s": median,
        "mcups": cells * prob.nsteps / median / 1e6,
    }
    if ref_times:
        ref_median = statistics.median(ref_times)
        res["ref_kernel"] = f"numpy-upwind1-v{REF_KERNEL_VERSION}"
        res["ref_times_s"] = [round(t, 6) for t in ref_times]
        res["ref_median_s"] = ref_median
        res["ref_mcups"] = cells * REF_STEPS / ref_median / 1e6
        res["ratio_to_ref"] = res["mcups"] / res["ref_mcups"]
    res.update(errs)
    res["run_stats"] = list(RUN_STATS)
    res["threads"] = thread_env()
    res["malloc_env"] = malloc_env()
    res["versions"] = versions(*dists)
    res["host"] = {"cpus": os.cpu_count(), "machine": platform.machine()}
    if extra:
        res.update(extra)
    return res


def emit(res: dict) -> None:
    """A human-readable line on stderr, then the JSON line on stdout (the row's last line)."""
    line = (
        f"# {res['peer']:<22s} N={res['n']:4d} steps={res['steps']:4d} "
        f"median={res['median_s']:.4f}s  {res['mcups']:8.2f} Mcups"
    )
    if "ratio_to_ref" in res:
        line += f"  ratio={res['ratio_to_ref']:.3f}"
    line += f"  L1={res['l1']:.3e}"
    print(line, file=sys.stderr)
    sys.stdout.flush()
    print(json.dumps(res), flush=True)
