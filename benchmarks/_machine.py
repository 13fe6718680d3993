"""Machine facts recorded beside every benchmark figure (shared by the benchmark scripts)."""

from __future__ import annotations

import json
import os
import platform
import time


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or what platform knows)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loadavg() -> float | None:
    """One-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def host() -> dict:
    """The machine facts every benchmark's JSON line carries under "host"."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "loadavg_end": loadavg(),
    }


def emit(benchmark: str, start: float, **figures) -> dict:
    """Print a benchmark's one JSON line on stdout: its figures, the host and the wall time
    since ``start`` (a ``time.perf_counter()`` value); returns the dict."""
    out = {
        "benchmark": benchmark,
        **figures,
        "host": host(),
        "wall_s": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(out), flush=True)
    return out


def best_of(func, repeat: int = 3) -> float:
    """The shortest of ``repeat`` timings of ``func()``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


#: the c1 test matrices (2-D, non-symmetric A and V; docs/theory.md, 'Test matrices c1 and c2'),
#: shared by the benchmarks
A1 = [[-0.6, 0.8], [-0.2, -0.3]]
V1 = [[1.0, 0.5], [-0.3, 0.8]]
