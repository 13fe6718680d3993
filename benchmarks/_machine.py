"""Machine facts recorded beside every benchmark figure (shared by the benchmark scripts)."""

from __future__ import annotations

import os
import platform


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
