"""pytest plugin: the CPU seconds of every test, one JSON line each.

CPU seconds (user + system) do not grow when other jobs share the cores, wall seconds do: on
a busy machine this is the measure to compare two versions of a test with. For each test
(setup + call + teardown) the plugin appends to the file named by ``$CPUTIME_OUT``

    {"id": nodeid, "cpu": s, "children": s, "wall": s}

``cpu`` is this process's own time (``RUSAGE_SELF``), ``children`` the time of the child
processes it waited for during the test (``RUSAGE_CHILDREN``: ``tpde`` runs in a subprocess,
dask's worker processes); a child that is still running when the test ends is not counted.
With pytest-xdist every worker appends to the same file (one ``write`` per line, opened with
``O_APPEND``). Without ``$CPUTIME_OUT`` the plugin does nothing.

    CPUTIME_OUT=/tmp/cpu.jsonl TPDE_NUM_THREADS=1 .venv/bin/python -m pytest -p tools.cputime_plugin
    .venv/bin/python tools/cpu_table.py /tmp/cpu.jsonl        # the tables: make test-cpu
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator

import pytest


def cpu_seconds(who: int) -> float:
    """User + system CPU seconds of ``who`` (``resource.RUSAGE_SELF`` or ``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Time one test's setup, call and teardown and append its line to ``$CPUTIME_OUT``."""
    own, children = cpu_seconds(resource.RUSAGE_SELF), cpu_seconds(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    yield
    out = os.environ.get("CPUTIME_OUT")
    if not out:
        return
    row = {
        "id": item.nodeid,
        "cpu": round(cpu_seconds(resource.RUSAGE_SELF) - own, 3),
        "children": round(cpu_seconds(resource.RUSAGE_CHILDREN) - children, 3),
        "wall": round(time.perf_counter() - wall, 3),
    }
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)
