"""Parameter sweeps: a grid of run configurations mapped onto dask (``tpde sweep``).

A sweep file names a base run configuration and lists values for any of its keys; every
combination (the cartesian product, in table order) is one run, one task on a
``dask.distributed`` cluster (a local one on every core by default, or an existing scheduler),
written to ``<output>/runs/<run_id>.nc``. The outcome of every run goes into
``<output>/summary.nc`` (the parameter grid, one dimension per key: :func:`summary_grid`;
:func:`read_summary` gives the table along ``run``) and ``<output>/phase.png``.

```toml
base = "softmax.toml"               # a run config, relative to this file (or an inline [base])
output = "out/sweep_softmax"        # directory, relative to the working directory
[parameters]                        # dotted config keys, [i] indexes into lists
"attention.scale" = [0.5, 1.0, 1.5, 2.0]
"attention.A[0][1]" = [-0.5, 0.0, 0.5, 1.0]
"grid.cells" = [[32, 32], [48, 48]]
[rank]
tolerance = 0.05                    # see classify()
[phase]                             # the two parameters on the figure's axes
x = "attention.scale"
y = "attention.A[0][1]"
```

Outcomes (:func:`classify`, from the typed status a run file records, never from its
message): ``converged`` (with the rank of the limit), ``blowup`` (with its time),
``mass_left`` (with the time the outflow passed ``run.max_outflow``), ``box_limited`` (with
the time the box stopped holding the dynamics), ``under_resolved`` or ``failed`` (with its
typed reason, its time and the message). A failed run is recorded, never fatal. A rerun
skips the runs whose file holds a terminal status (completed, blowup, mass_left_domain,
box_limited, under_resolved) for the same configuration and redoes the others; the run id
hashes the whole resolved configuration, so editing the base config reruns everything it
touches.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import logging
import math
import os
import re
import time as _time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpde.grid.threads import THREADS_VARIABLE, parse_threads
from tpde.validation.outcomes import (
    DEFAULT_TOLERANCE,
    OUTCOMES,
    covariance_evidence,
)
from tpde.validation.outcomes import (
    outcome as outcome_of,
)

from . import geometries, io
from .config import (
    SECTIONS,
    ConfigError,
    check_keys,
    dumps,
    known_keys,
    load,
    parse_toml,
    read_text,
    resolve_paths,
    same_config,
)
from .run import StatusLine

__all__ = [
    "Run",
    "Sweep",
    "SweepProgress",
    "classify",
    "load_sweep",
    "parameter_names",
    "plot_phase",
    "read_outcome",
    "read_summary",
    "run_one",
    "run_sweep",
    "summary_dataset",
    "summary_grid",
]

TOP_KEYS = ("base", "output", "parameters", "rank", "phase")
TERMINAL = io.RESULTS  # statuses a rerun skips: results of the dynamics
#: the most runs a sweep may hold without --force (force=True): a bigger grid is usually a
#: mistake (one more parameter list than meant) and takes minutes to even enumerate
MAX_RUNS = 10_000
_SEGMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)")


# ---- the sweep file -------------------------------------------------------------------------
@dataclass
class Run:
    """One point of the grid: its id, swept values and resolved run configuration."""

    run_id: str
    values: dict[str, Any]
    raw: dict
    text: str  # tpde.config.dumps(raw): the config stored in the run's NetCDF


@dataclass
class Sweep:
    """A parsed sweep file: the runs (cartesian product, table order) and the settings."""

    base: dict
    output: Path
    parameters: dict[str, list]
    tolerance: float
    phase: tuple[str, str | None]
    text: str
    runs: list[Run]


def load_sweep(
    source: str | Path | Mapping, output: str | Path | None = None, force: bool = False
) -> Sweep:
    """Parse and check a sweep (a TOML path or a mapping); errors are one-line
    :class:`~tpde.config.ConfigError` naming the key. ``output`` overrides the file's
    ``output``. More than MAX_RUNS runs are refused unless ``force``. A generated config
    that fails validation is not an error here: that run is recorded as failed when it
    runs."""
    if isinstance(source, Mapping):
        raw, folder, text = dict(source), Path.cwd(), json.dumps(source, default=str)
        stem = None
    else:
        path = Path(source)
        text = read_text(path, "sweep")
        raw = parse_toml(text, "sweep", f" in {path}")
        folder, stem = path.parent, path.stem
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(
                f"{key}: unknown key in the sweep file; expected one of {', '.join(TOP_KEYS)}"
            )
    base = _base(raw.get("base"), folder)
    if output is None:
        output = raw.get("output", None if stem is None else f"out/{stem}")
        if not isinstance(output, str) or not output:
            raise ConfigError(f"output: expected a directory name, got {output!r}")
    parameters = _parameters(raw.get("parameters"), base)
    count = math.prod(len(v) for v in parameters.values())
    if count > MAX_RUNS and not force:
        raise ConfigError(
            f"parameters: {count} runs (the product of the value lists); at most {MAX_RUNS} "
            "without --force"
        )
    tolerance = _rank(raw.get("rank", {}))
    phase = _phase(raw.get("phase", {}), list(parameters))
    runs = _runs(base, parameters)
    return Sweep(base, Path(output), parameters, tolerance, phase, text, runs)


def _base(value: Any, folder: Path) -> dict:
    if value is None:
        raise ConfigError(
            'base: missing; give a run config file (base = "run.toml", '
            "relative to the sweep file) or an inline [base] table"
        )
    if isinstance(value, str):
        path = Path(value)
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            raise ConfigError(
                f"base: cannot read {path}; give a run config file relative to the sweep file"
            )
        raw = resolve_paths(load(path), path.parent)  # initial.file: beside the base
    elif isinstance(value, Mapping):
        raw = resolve_paths(load(value), folder)
    else:
        raise ConfigError(f"base: expected a file name or a table, got {value!r:.60}")
    try:  # the base's keys follow its geometry's schema (its values are checked per run)
        check_keys(raw, *geometry_sections(raw))
    except ConfigError as exc:
        raise ConfigError(f"base: {exc}") from None
    return copy.deepcopy(raw)


def _parameters(table: Any, base: dict) -> dict[str, list]:
    if not isinstance(table, Mapping) or not table:
        raise ConfigError(
            "parameters: missing or empty; give [parameters] with "
            '"section.key" = [value, ...] entries'
        )
    out: dict[str, list] = {}
    for key, values in _flatten(table).items():
        if not isinstance(values, list) or not values:
            raise ConfigError(
                f'parameters."{key}": expected a non-empty list of values, got {values!r}'
            )
        seen = set()
        for v in values:
            canon = _canonical(v)
            if canon in seen:
                raise ConfigError(f'parameters."{key}": value {v!r} appears twice')
            seen.add(canon)
        _check_path(base, key, _steps(key))
        out[key] = list(values)
    return out


def _flatten(table: Mapping, prefix: str = "") -> dict:
    """Unquoted dotted keys (attention.scale = [...]) parse as nested tables: join them."""
    out = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _rank(table: Any) -> float:
    if not isinstance(table, Mapping):
        raise ConfigError("rank: expected a table [rank] with tolerance = ...")
    for key in table:
        if key != "tolerance":
            raise ConfigError(f"rank.{key}: unknown key; expected tolerance")
    tol = table.get("tolerance", DEFAULT_TOLERANCE)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
        raise ConfigError(f"rank.tolerance: expected a number in (0, 1), got {tol!r}")
    return float(tol)


def _phase(table: Any, keys: list[str]) -> tuple[str, str | None]:
    if not isinstance(table, Mapping):
        raise ConfigError("phase: expected a table [phase] with x = ... and y = ...")
    for key in table:
        if key not in ("x", "y"):
            raise ConfigError(f"phase.{key}: unknown key; expected x or y")
    axes = []
    for i, axis in enumerate(("x", "y")):
        default = keys[i] if i < len(keys) else None
        name = table.get(axis, default)
        if name is not None and name not in keys:
            raise ConfigError(
                f"phase.{axis}: {name!r} is not a swept parameter; choose one of {', '.join(keys)}"
            )
        axes.append(name)
    if axes[0] is None or axes[0] == axes[1]:
        raise ConfigError(f"phase.y: must differ from phase.x = {axes[0]!r}")
    return axes[0], axes[1]


def _steps(key: str) -> list[str | int]:
    steps: list[str | int] = []
    for part in key.split("."):
        match = _SEGMENT.fullmatch(part)
        if match is None:
            raise ConfigError(
                f'parameters."{key}": not a config key; write section.key '
                'with [i] indices into lists, e.g. "attention.A[0][1]"'
            )
        steps.append(match.group(1))
        steps += [int(i) for i in re.findall(r"\d+", match.group(2))]
    return steps


def _render(steps: list) -> str:
    out = ""
    for s in steps:
        out += f"[{s}]" if isinstance(s, int) else (f".{s}" if out else s)
    return out


def _check_path(base: dict, key: str, steps: list) -> None:
    """The key must exist in the base config, up to a missing last key (or missing section
    plus key) that the configuration format knows (e.g. attention.scale, scheme.cfl), in
    the base's geometry (:func:`geometry_sections`)."""
    sections = geometry_sections(base)[0]
    node: Any = base
    for depth, step in enumerate(steps):
        where = _render(steps[:depth]) or "the base config"
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                size = f"{len(node)} entries" if isinstance(node, list) else "not a list"
                raise ConfigError(
                    f'parameters."{key}": no entry [{step}] in {where} of the base config ({size})'
                )
            node = node[step]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f'parameters."{key}": {where} is not a table in the base config')
        if step in node:
            node = node[step]
            continue
        rest = steps[depth + 1 :]
        known = step in _known_keys(steps[:depth], sections)
        if known and (
            not rest
            or (
                depth == 0
                and len(rest) == 1
                and isinstance(rest[0], str)
                and rest[0] in sections.get(step, ())
            )
        ):
            return
        raise ConfigError(
            f'parameters."{key}": {_render(steps[: depth + 1])} is not in the '
            "base config (and not a key to add); check the spelling against "
            "the base"
        )


def geometry_sections(raw: Mapping) -> tuple[Mapping[str, Any], str | None]:
    """The known keys of every section of ``raw``'s geometry and its name: the flat schema
    (tpde.config.SECTIONS, None), or the ``sections`` a geometry with its own config
    registers (tpde.geometries: tpde.circle, tpde.sphere). An unknown geometry reads as flat
    here; building the run names it."""
    name = geometries.of_config(raw)
    geometry = geometries.GEOMETRIES.get(name) if isinstance(name, str) else None
    if geometry is not None and geometry.sections is not None:
        return geometries.load(geometry.sections), geometry.name
    return SECTIONS, None


def _known_keys(prefix: Sequence[str | int], sections: Mapping[str, Any]) -> frozenset[str]:
    """tpde.config.known_keys for the flat schema; a geometry with its own sections knows
    its sections and their keys (it has no [[attention.heads]] tables)."""
    if sections is SECTIONS:
        return known_keys(prefix)
    if not prefix:
        return frozenset(sections)
    return frozenset(sections.get(str(prefix[0]), ())) if len(prefix) == 1 else frozenset()


def _assign(raw: dict, steps: list, value: Any) -> None:
    node: Any = raw
    for step in steps[:-1]:
        if isinstance(node, dict) and step not in node:
            node[step] = {}
        node = node[step]
    node[steps[-1]] = copy.deepcopy(value)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _slug(key: str, value: Any) -> str:
    def text(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return f"{v:g}"
        if isinstance(v, str):
            return re.sub(r"[^A-Za-z0-9.+-]", "", v)
        if isinstance(v, list):
            return "x".join(text(x) for x in v)
        return ""

    name = re.sub(r"[^A-Za-z0-9]", "", key.rsplit(".", 1)[-1])
    return (name + text(value))[:16]


def run_id(values: Mapping[str, Any], raw: Mapping) -> str:
    """``<readable prefix>_<12 hex>``: the swept values, then the sha1 of the canonical JSON
    of the whole resolved run config (so the id is stable across sweeps of the same runs)."""
    digest = hashlib.sha1(_canonical(raw).encode()).hexdigest()[:12]
    prefix = "_".join(_slug(k, v) for k, v in values.items())[:40].strip("_")
    return f"{prefix}_{digest}" if prefix else digest


def _runs(base: dict, parameters: dict[str, list]) -> list[Run]:
    base = copy.deepcopy(base)
    base.get("run", {}).pop("output", None)  # the sweep chooses the file
    keys = list(parameters)
    steps = [_steps(k) for k in keys]
    runs: list[Run] = []
    ids: dict[str, dict[str, Any]] = {}
    for combo in itertools.product(*(parameters[k] for k in keys)):
        raw = copy.deepcopy(base)
        for s, v in zip(steps, combo, strict=True):
            _assign(raw, s, v)
        values = dict(zip(keys, combo, strict=True))
        rid = run_id(values, raw)
        if rid in ids:
            raise ConfigError(
                f"parameters: {values} and {ids[rid]} give the same "
                "configuration; sweep each config key once"
            )
        ids[rid] = values
        runs.append(Run(rid, values, raw, dumps(raw)))
    return runs


# ---- outcomes -------------------------------------------------------------------------------
#: reasons of a failed run beyond the file's (tpde.io.ERROR_REASONS): a run that ended
#: without a result of the dynamics (``interrupted``, ``running``), a task the cluster lost
SWEEP_REASONS = ("interrupted", "running", "lost")


def classify(
    status: str | None,
    status_time: float,
    message: str,
    time: np.ndarray,
    covariance: np.ndarray,
    tolerance: float = DEFAULT_TOLERANCE,
    reason: str = "",
) -> dict:
    """The outcome of one run from its typed status (``status``, ``status_time``, the
    ``reason`` of an ``error``: tpde.io.Outcome) and its covariance record ``(time, d, d)``:
    :func:`tpde.validation.outcomes.outcome` of :func:`~tpde.validation.outcomes.
    covariance_evidence` (the rules there; the message is carried, never read), with the
    status and the covariance's trace, eigenvalues and last matrix."""
    evidence = covariance_evidence(time, covariance)
    verdict = outcome_of(status, status_time, message, evidence, tolerance, reason)
    return {
        "status": str(status),
        "status_time": float(status_time),
        "message": verdict["message"],
        "outcome": verdict["outcome"],
        "reason": verdict["reason"],
        "rank": verdict["rank"],
        "event_time": verdict["event_time"],
        **{k: evidence[k] for k in ("trace_initial", "trace_final", "eigenvalues", "covariance")},
    }


def outcome_counts(attrs: Mapping[str, Any], ranks: str = "") -> str:
    """``11 converged (reached t_end; rank 1: 4, rank 2: 7), 0 blowup, 0 mass_left, 53
    box_limited, 0 failed, 0 under_resolved``: every outcome of :data:`OUTCOMES` a summary's
    attributes count (``ranks``: the converged runs per rank, if known), so none can go
    unsaid. ``converged`` means the run reached t_end; the rank is that of its last
    covariance."""
    said = {o: f"{attrs.get(o, '?')} {o}" for o in OUTCOMES}
    said["converged"] += " (reached t_end" + (f"; {ranks})" if ranks else ")")
    return ", ".join(said[o] for o in OUTCOMES)


def read_outcome(path: str | Path, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """:func:`classify` of a run's NetCDF output (only the attributes, ``time`` and
    ``covariance`` are read; a trailing incomplete record is ignored)."""
    import xarray as xr

    with xr.open_dataset(path, engine="netcdf4", decode_times=False, cache=False) as ds:
        attrs = dict(ds.attrs)
        time = np.asarray(ds["time"].values, dtype=float)
        if "covariance" in ds.variables:
            cov = np.asarray(ds["covariance"].values, dtype=float)
        else:  # the sphere records raw moments in R^3: Sigma = E[x x^T] - m m^T
            mean = np.asarray(ds["mean_vector"].values, dtype=float)
            second = np.asarray(ds["second_moment"].values, dtype=float)
            cov = second - mean[:, :, None] * mean[:, None, :]
    n = io.complete_records(time)
    outcome = io.Outcome.from_attributes(attrs)  # the typed outcome the run recorded
    record = classify(
        outcome.status, outcome.time, outcome.message, time[:n], cov[:n], tolerance, outcome.reason
    )
    record["config"] = str(attrs.get("config", ""))
    return record


def _failed(run_id_: str, message: str, reason: str, wall: float = math.nan) -> dict:
    """The record of a run without a readable file (``reason``: tpde.io.ERROR_REASONS, e.g.
    ``config`` for a generated config that fails validation, or ``lost``)."""
    return {
        "run_id": run_id_,
        "status": "failed",
        "status_time": math.nan,
        "message": message,
        "outcome": "failed",
        "reason": reason,
        "rank": -1,
        "event_time": math.nan,
        "trace_initial": math.nan,
        "trace_final": math.nan,
        "eigenvalues": [],
        "covariance": [],
        "wall_s": wall,
        "skipped": False,
    }


def run_one(task: Mapping) -> dict:
    """One sweep task (runs on a dask worker): build the config, run it to ``task["path"]``
    and classify the result. Never raises: a failure is a record with outcome ``failed``.

    ``task``: ``run_id``, ``raw`` (the run config mapping), ``path``, ``tolerance``, and
    optionally ``threads`` (``--threads``). Without them and without ``TPDE_NUM_THREADS`` in
    the worker's environment (a local cluster sets it: its share of the cores) the run uses
    one thread.
    """
    start = _time.perf_counter()
    rid, path = str(task["run_id"]), Path(task["path"])
    started = False
    try:
        if task.get("threads"):
            os.environ[THREADS_VARIABLE] = str(int(task["threads"]))
        elif not os.environ.get(THREADS_VARIABLE, "").strip():
            os.environ[THREADS_VARIABLE] = "1"
        from tpde.grid.threads import set_num_threads

        from .config import build
        from .run import run_config

        set_num_threads()
        config = build(task["raw"])
        started = True
        run_config(config, path, overwrite=True, quiet=True)
        error, reason = None, ""
    except Exception as exc:  # noqa: BLE001 - every failure is a result of the sweep
        from .lifecycle import error_line, error_reason

        error, reason = error_line(exc), error_reason(exc)
    record = None
    # a rerun that did not end with a result leaves its records in the staged file (the
    # earlier file of this run is kept, tpde.io.SnapshotWriter): the outcome is there
    staged = Path(io.staged_name(path))
    source = staged if staged.is_file() else path
    if started and source.exists():
        try:
            record = read_outcome(source, float(task.get("tolerance", DEFAULT_TOLERANCE)))
            record.pop("config", None)
            if error and record["outcome"] == "failed":
                record["message"] = record["message"] or error
        except Exception as exc:  # noqa: BLE001
            error = f"{error + '; ' if error else ''}cannot read {source.name}: {exc}"
            record = None
    wall = _time.perf_counter() - start
    if record is None:
        return _failed(rid, error or "the run wrote no output", reason or "exception", wall)
    record.update(run_id=rid, wall_s=wall, skipped=False)
    return record


def _reusable(path: Path, run: Run, tolerance: float) -> dict | None:
    """The record of an earlier run of the same config with a terminal status, or None."""
    if not path.is_file():
        return None
    try:
        record = read_outcome(path, tolerance)
    except Exception:  # noqa: BLE001 - unreadable (killed mid-write): run it again
        return None
    if record["status"] not in TERMINAL or not _same(record.pop("config"), run.raw):
        return None
    record.update(run_id=run.run_id, skipped=True)
    return record


def _same(stored: str, raw: Mapping) -> bool:
    """Whether a file's stored config has the values of ``raw``, the geometry's defaults
    filled in on both sides (tpde.config.same_config: a circle or sphere point is skipped
    too, though its stored text writes out defaults that ``raw`` omits)."""
    return same_config(stored, raw)


# ---- progress -------------------------------------------------------------------------------
class SweepProgress:
    """``runs 37/64 done, 2 failed, 5 skipped`` on stderr (a :class:`tpde.run.StatusLine`:
    redrawn in place on a terminal, one line per update otherwise, nothing when disabled)."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total = total
        self.status = StatusLine(enabled, stream)
        self.done = self.failed = self.skipped = 0

    def update(self, record: dict | None = None) -> None:
        if record is not None:
            self.done += 1
            self.failed += record["outcome"] == "failed"
            self.skipped += bool(record.get("skipped"))
        self.status.show(
            f"runs {self.done}/{self.total} done, {self.failed} failed, "
            f"{self.skipped} skipped  {self.status.elapsed():.1f} s"
        )

    def close(self) -> None:
        self.status.close()


# ---- execution ------------------------------------------------------------------------------
#: the address forms --scheduler takes: protocol://host:port (IPv6 hosts in brackets)
_ADDRESS = re.compile(
    r"(tcp|tls|ucx|ws|wss|inproc)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})/?"
)
SECURITY_KEYS = ("ca_file", "cert", "key", "require_encryption")


def check_scheduler(address: Any, security: Any = None) -> None:
    """A ConfigError naming ``--scheduler`` unless ``address`` is ``protocol://host:port``;
    with ``security`` (TLS) the protocol must be ``tls``."""
    match = _ADDRESS.fullmatch(address.strip()) if isinstance(address, str) else None
    if match is None:
        raise ConfigError(
            f"--scheduler: {address!r:.80} is not an address; give protocol://host:port, "
            "e.g. tls://10.0.0.5:8786 (or tcp:// on a private network)"
        )
    port = int(match.group(3))
    if not 0 < port < 65536:
        raise ConfigError(f"--scheduler: port {port} is out of range (1 .. 65535)")
    if security is not None and not address.strip().startswith("tls://"):
        raise ConfigError("--scheduler: --security needs a tls:// address")


def load_security(path: str | Path):
    """A ``distributed.security.Security`` from a TOML file with ``ca_file`` (the CA that
    signed the scheduler's certificate), ``cert`` and ``key`` (this client's certificate
    and key; mutual TLS) and ``require_encryption`` (default true); paths relative to the
    file. Errors are one-line ConfigErrors naming ``--security``."""
    from distributed.security import Security

    path = Path(path)
    raw = parse_toml(read_text(path, "--security"), "--security", f" in {path}")
    for key in raw:
        if key not in SECURITY_KEYS:
            raise ConfigError(
                f"--security: unknown key {key!r} in {path}; expected {', '.join(SECURITY_KEYS)}"
            )
    files = {}
    for key in ("ca_file", "cert", "key"):
        value = raw.get(key)
        if value is None:
            if key != "key":
                raise ConfigError(f"--security: {key} missing in {path}")
            continue
        if not isinstance(value, str):
            raise ConfigError(f"--security: {key} must be a file name, got {value!r:.60}")
        file = Path(value) if Path(value).is_absolute() else path.parent / value
        if not file.is_file():
            raise ConfigError(f"--security: {key} = {file} does not exist")
        files[key] = str(file)
    encrypt = raw.get("require_encryption", True)
    if not isinstance(encrypt, bool):
        raise ConfigError("--security: require_encryption must be true or false")
    return Security(
        tls_ca_file=files["ca_file"],
        tls_client_cert=files["cert"],
        tls_client_key=files.get("key"),
        require_encryption=encrypt,
    )


def worker_threads(cores: int, workers: int, threads: int | None = None) -> int:
    """Threads of each run on a local cluster of ``workers`` processes on ``cores`` cores:
    ``threads`` if given, else ``TPDE_NUM_THREADS`` if set, else the cores split between the
    workers (at least one each), so the runs never ask for more threads than there are cores
    (docs/user-guide.md, 'Threads')."""
    if threads is not None:
        return int(threads)
    if os.environ.get(THREADS_VARIABLE, "").strip():
        return parse_threads(os.environ[THREADS_VARIABLE], THREADS_VARIABLE)
    return max(1, cores // max(1, workers))


@contextlib.contextmanager
def _client(
    scheduler: Any,
    workers: int | None,
    tasks: int,
    security: Any = None,
    threads: int | None = None,
) -> Iterator[Any]:
    from dask.distributed import Client, LocalCluster

    if isinstance(scheduler, Client):
        yield scheduler
    elif scheduler is not None:
        with Client(scheduler.strip(), timeout="30s", security=security) as client:
            yield client
    else:
        from dask.system import CPU_COUNT

        n = max(1, min(workers or CPU_COUNT, tasks))
        with (
            LocalCluster(
                n_workers=n,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
                env={THREADS_VARIABLE: str(worker_threads(CPU_COUNT, n, threads))},
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client


def run_sweep(
    sweep: str | Path | Mapping | Sweep,
    scheduler: Any = None,
    workers: int | None = None,
    progress: bool = True,
    output: str | Path | None = None,
    on_result: Callable[[dict], None] | None = None,
    force: bool = False,
    security: Any = None,
    threads: int | None = None,
):
    """Run every point of a sweep and return the summary (``xarray.Dataset``, also written
    to ``<output>/summary.nc``, with the figure ``<output>/phase.png``).

    force: allow more than MAX_RUNS runs. security: for a scheduler address, a
    ``distributed.security.Security`` or the path of a TOML file for :func:`load_security`
    (TLS; the address must then be ``tls://``). dask unpickles what its peers send, so
    connect only to a scheduler you run yourself (docs/user-guide.md, 'Parameter sweeps').

    scheduler: None for a local cluster (``workers`` processes, default every core, the
    cores split between them: :func:`worker_threads`), a ``dask.distributed`` scheduler
    address (``tcp://host:8786``) or a ``Client``. Runs whose NetCDF already holds a
    terminal status for the same config are skipped (counted in ``attrs["skipped"]``).
    on_result: called in this process with each run's record as it arrives (skipped runs
    first). Per-run failures, including tasks lost with their workers more often than the
    scheduler allows, are recorded as ``failed``.
    threads: the threads of every run (``tpde sweep --threads``; default above, and one per
    run on a scheduler's workers unless they set ``TPDE_NUM_THREADS``).
    """
    if threads is not None:
        try:
            threads = parse_threads(threads, "threads")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if isinstance(security, str | Path):
        security = load_security(security)
    if scheduler is not None and not _is_client(scheduler):
        check_scheduler(scheduler, security)
    spec = sweep if isinstance(sweep, Sweep) else load_sweep(sweep, output, force)
    if output is not None and isinstance(sweep, Sweep):
        spec = Sweep(**{**spec.__dict__, "output": Path(output)})
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"workers: expected an integer >= 1, got {workers!r}")
        if scheduler is not None:
            raise ConfigError(
                "workers: sets the size of the local cluster; the cluster at "
                "--scheduler has its own workers"
            )
    runs_dir = spec.output / "runs"
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"output: cannot create {runs_dir}: {exc.strerror}") from None
    walls = _previous_walls(spec.output / "summary.nc")
    display = SweepProgress(len(spec.runs), enabled=progress)
    records: dict[str, dict] = {}
    pending: list[Run] = []
    for run in spec.runs:
        record = _reusable(runs_dir / f"{run.run_id}.nc", run, spec.tolerance)
        if record is None:
            pending.append(run)
            continue
        record["wall_s"] = walls.get(run.run_id, math.nan)
        records[run.run_id] = record
        display.done += 1
        display.skipped += 1
        if on_result is not None:
            on_result(record)
    display.update()
    try:
        if pending:
            with _client(scheduler, workers, len(pending), security, threads) as client:
                _gather(
                    client, pending, runs_dir, spec.tolerance, records, display, on_result, threads
                )
    finally:
        display.close()
    summary = summary_dataset(spec, records)
    path = spec.output / "summary.nc"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    io.to_netcdf(summary_grid(summary), tmp)
    os.replace(tmp, path)
    plot_phase(summary, spec.output / "phase.png")
    return summary


def _is_client(scheduler: Any) -> bool:
    from dask.distributed import Client

    return isinstance(scheduler, Client)


def _gather(
    client,
    pending: list[Run],
    runs_dir: Path,
    tolerance: float,
    records: dict,
    display: SweepProgress,
    on_result,
    threads: int | None = None,
) -> None:
    from dask.distributed import as_completed

    futures = {}
    for run in pending:
        task = {
            "run_id": run.run_id,
            "raw": run.raw,
            "tolerance": tolerance,
            "path": str((runs_dir / f"{run.run_id}.nc").resolve()),
            "threads": threads,
        }
        future = client.submit(run_one, task, key=f"tpde-sweep-{run.run_id}", retries=1)
        futures[future] = run
    try:
        for future in as_completed(list(futures)):
            run = futures[future]
            try:
                record = future.result()
            except Exception as exc:  # noqa: BLE001 - e.g. KilledWorker: a failed run
                record = _failed(run.run_id, f"{type(exc).__name__}: {exc}", "lost")
            future.release()
            records[run.run_id] = record
            display.update(record)
            if on_result is not None:
                on_result(record)
    except BaseException:
        client.cancel(list(futures))
        raise


def _previous_walls(path: Path) -> dict[str, float]:
    if not path.is_file():
        return {}
    try:
        ds = read_summary(path)
        return dict(
            zip(
                [str(r) for r in ds["run_id"].values.tolist()],
                ds["wall_s"].values.astype(float).tolist(),
                strict=True,
            )
        )
    except Exception:  # noqa: BLE001 - a stale or foreign file: no wall times
        return {}


# ---- summary --------------------------------------------------------------------------------
def _column(values: list) -> np.ndarray:
    """A parameter's values along ``run``: float for numbers, str otherwise (lists and
    tables as JSON)."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=float)
    if all(isinstance(v, str) for v in values):
        return np.array(values, dtype=str)
    return np.array([json.dumps(v) for v in values], dtype=str)


def summary_dataset(spec: Sweep, records: Mapping[str, dict]):
    """The summary ``xarray.Dataset`` along ``run`` (sweep order): one coordinate per swept
    parameter; ``run_id``, ``outcome``, ``rank`` (-1 unless converged), ``event_time`` (NaN
    for converged runs and failures without a time), ``trace_initial``, ``trace_final``,
    ``eigenvalues(run, eigen)`` (of Sigma / tr Sigma at the last finite snapshot,
    descending), ``status``, ``reason`` (the typed cause of a failure, else ""),
    ``message``, ``wall_s``, ``skipped``; attributes: the sweep text and the counts."""
    import xarray as xr

    runs = spec.runs
    rows = [records.get(r.run_id) or _failed(r.run_id, "no result", "lost") for r in runs]
    width = max([len(r["eigenvalues"]) for r in rows] + [1])
    eig = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        eig[i, : len(r["eigenvalues"])] = r["eigenvalues"]

    def col(name, dtype):
        return ("run", np.array([r[name] for r in rows], dtype=dtype))

    coords: dict[str, Any] = {"run": np.arange(len(rows))}
    for key in spec.parameters:
        coords[key] = ("run", _column([r.values[key] for r in runs]))
    counts = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
    ds = xr.Dataset(
        {
            "run_id": col("run_id", str),
            "outcome": col("outcome", str),
            "rank": col("rank", np.int64),
            "event_time": col("event_time", float),
            "trace_initial": col("trace_initial", float),
            "trace_final": col("trace_final", float),
            "eigenvalues": (("run", "eigen"), eig),
            "status": col("status", str),
            "reason": ("run", np.array([str(r.get("reason", "")) for r in rows], dtype=str)),
            "message": ("run", np.array([str(r["message"]) for r in rows], dtype=str)),
            "wall_s": col("wall_s", float),
            "skipped": col("skipped", np.int8),
        },
        coords=coords,
        attrs={
            "title": "tpde sweep summary",
            "sweep": spec.text,
            "output": str(spec.output),
            "parameters": json.dumps(list(spec.parameters)),
            "phase_x": spec.phase[0],
            "phase_y": spec.phase[1] or "",
            "rank_tolerance": spec.tolerance,
            "runs": len(rows),
            "skipped": int(sum(bool(r.get("skipped")) for r in rows)),
            **counts,
        },
    )
    ds["outcome"].attrs["long_name"] = " | ".join(OUTCOMES)
    ds["rank"].attrs["long_name"] = (
        f"eigenvalues of Sigma/tr(Sigma) above {spec.tolerance:g}"
        " at the last snapshot (0: collapse to a point)"
    )
    ds["event_time"].attrs["long_name"] = (
        "time of the outcome's event (blow-up, mass leaving, box or resolution limit, failure)"
    )
    return ds


# ---- summary.nc: the parameter grid -----------------------------------------------------------
#: the variables of the summary, one value per run
_PER_RUN = (
    "run_id",
    "outcome",
    "rank",
    "event_time",
    "trace_initial",
    "trace_final",
    "status",
    "reason",
    "message",
    "wall_s",
    "skipped",
)
_LONG_NAMES = {
    "run_id": "run identifier (its file: runs/<run_id>.nc)",
    "outcome": " | ".join(OUTCOMES),
    "outcome_code": "outcome of the run",
    "event_time": "time of the outcome's event (blow-up, mass leaving, box or resolution "
    "limit, failure)",
    "trace_initial": "trace of the covariance at the first snapshot",
    "trace_final": "trace of the covariance at the last finite snapshot",
    "eigenvalues": "eigenvalues of Sigma/tr(Sigma) at the last finite snapshot, descending",
    "status": "status the run file records",
    "reason": "typed cause of a failed run (tpde.io.ERROR_REASONS, interrupted, running, lost)",
    "message": "status message or failure",
    "wall_s": "wall time of the run",
    "skipped": "1 if the run was done by an earlier call",
    "run_index": "position of the run in the sweep order",
}


def parameter_names(keys: Sequence[str]) -> dict[str, str]:
    """A NetCDF/CF variable name for each swept key (letters, digits, underscores, a letter
    first; ``attention.A[0][1]`` -> ``attention_A_0_1``), unique."""
    names: dict[str, str] = {}
    for key in keys:
        name = re.sub(r"[^A-Za-z0-9_]+", "_", key).strip("_") or "parameter"
        name = name if name[0].isalpha() else f"p_{name}"
        base, k = name, 2
        while name in names.values() or name in _PER_RUN or name in ("eigen", "eigenvalues"):
            name, k = f"{base}_{k}", k + 1
        names[key] = name
    return names


def summary_grid(summary):
    """The summary as the parameter grid that ``summary.nc`` stores: one dimension per swept
    key (the ``[phase]`` x key last, y before it: x fastest, as the run files), each with a
    coordinate (numbers sorted; other values by index, their text in ``<name>_value``) that
    names its key in the attribute ``parameter``; every per-run variable over those
    dimensions (``eigenvalues`` with ``eigen`` first), ``outcome_code`` (flag_values /
    flag_meanings) beside the text ``outcome``, and ``run_index`` (the sweep order)."""
    keys = json.loads(summary.attrs["parameters"])
    names = parameter_names(keys)
    x = summary.attrs.get("phase_x") or keys[0]
    y = summary.attrs.get("phase_y") or None
    order = [k for k in keys if k not in (x, y)] + ([y] if y else []) + [x]
    flat = summary.assign(
        run_index=("run", np.arange(summary.sizes["run"], dtype=np.int32)),
        outcome_code=(
            "run",
            np.array([OUTCOMES.index(str(o)) for o in summary["outcome"].values], dtype=np.int8),
        ),
    )
    labels: dict[str, Any] = {}
    for key in keys:
        values = flat[key].values
        if values.dtype.kind == "f":
            continue
        texts = list(dict.fromkeys(str(v) for v in values))
        codes = np.array([texts.index(str(v)) for v in values], dtype=np.int32)
        flat[key] = ("run", codes)
        labels[key] = np.array(texts, dtype=str)
    if len(order) > 1:
        grid = flat.set_index(run=order).unstack("run")
    else:  # one key: set_index makes no MultiIndex to unstack
        grid = flat.drop_vars("run", errors="ignore").swap_dims(run=order[0]).sortby(order[0])
    grid = grid.rename({key: names[key] for key in keys})
    for key in keys:
        name = names[key]
        attrs = {"long_name": f"sweep parameter {key}", "parameter": key}
        if key in labels:
            grid = grid.assign_coords({f"{name}_value": (name, labels[key])})
            grid[f"{name}_value"].attrs.update(long_name=f"{key} (text)", parameter=key)
            attrs["long_name"] = f"index of the values of {key} ({name}_value)"
        else:
            attrs["units"] = "1"
        grid[name].attrs.update(attrs)
    dims = [names[k] for k in order]
    grid = grid.transpose("eigen", *dims)
    for name, text in _LONG_NAMES.items():
        if name in grid:
            grid[name].attrs["long_name"] = text
    grid["rank"].attrs["long_name"] = summary["rank"].attrs.get("long_name", "rank")
    grid["outcome_code"].attrs.update(
        flag_values=np.arange(len(OUTCOMES), dtype=np.int8), flag_meanings=" ".join(OUTCOMES)
    )
    for name in ("event_time", "trace_initial", "trace_final", "eigenvalues"):
        grid[name].attrs["units"] = "1"
    grid["wall_s"].attrs["units"] = "s"
    grid.attrs = {
        **{k: v for k, v in summary.attrs.items()},
        "Conventions": io.CONVENTIONS,
        "source": f"tpde {_version()}",
        "tpde_version": _version(),
        "history": f"{_now()}: tpde sweep",
        "parameter_names": json.dumps([names[k] for k in keys]),
    }
    return grid


def read_summary(path: str | Path):
    """A sweep's ``summary.nc`` as the table :func:`run_sweep` returns: dimension ``run``
    (sweep order), one coordinate per swept key (named by the key), the per-run variables.
    Reads the parameter grid :func:`summary_grid` writes and the flat files of earlier
    versions."""
    import xarray as xr

    with xr.open_dataset(path, engine="netcdf4") as stored:
        grid = stored.load()
    if "run" in grid.dims:  # an earlier, flat summary
        return grid
    keys = json.loads(grid.attrs["parameters"])
    names = parameter_names(keys)
    flat = grid.stack(run=[names[k] for k in reversed(keys)])
    flat = flat.dropna("run", subset=["run_index"]) if flat["run_index"].isnull().any() else flat
    flat = flat.reset_index("run").sortby("run_index")
    out = flat.drop_vars(
        [
            v
            for v in flat.variables
            if v not in _PER_RUN
            and v not in (*names.values(), *(f"{n}_value" for n in names.values()), "eigenvalues")
        ]
    )
    for key in keys:
        name = names[key]
        label = f"{name}_value"
        values = (
            out[label].values[out[name].values.astype(int)] if label in grid else out[name].values
        )
        out = out.drop_vars([v for v in (name, label) if v in out.variables])
        out = out.assign_coords({key: ("run", np.asarray(values))})
    out = out.assign_coords(run=np.arange(out.sizes["run"]))
    out = out.transpose("run", ...)
    for name in ("rank", "skipped"):
        out[name] = out[name].astype(np.int64 if name == "rank" else np.int8)
    for key in list(out.variables):
        if out[key].dtype.kind == "O":  # NetCDF text reads as objects
            out[key] = out[key].astype(str)
    out.attrs = {k: v for k, v in grid.attrs.items() if k not in ("parameter_names",)}
    return out


def _version() -> str:
    import tpde

    return tpde.__version__


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the phase diagram ----------------------------------------------------------------------
_RANK_COLOURS = ("black", "tab:blue", "tab:green", "tab:purple", "tab:cyan")
_STYLES = {
    "blowup": ("X", "tab:red"),
    "mass_left": ("^", "tab:orange"),
    "box_limited": ("v", "tab:purple"),
    "under_resolved": ("D", "tab:brown"),
    "failed": ("s", "0.55"),
}


def _category(outcome: str, rank: int) -> tuple[str, str, str]:
    if outcome == "converged":
        return (f"reached t_end, rank {rank}", "o", _RANK_COLOURS[min(rank, 4)])
    marker, colour = _STYLES.get(outcome, _STYLES["failed"])
    return (outcome.replace("_", " "), marker, colour)


def _axis(values: np.ndarray) -> tuple[np.ndarray, list | None, float]:
    """Positions on an axis, tick labels for a categorical one, and the grid spacing."""
    if values.dtype.kind == "f" and np.all(np.isfinite(values)):
        unique = np.unique(values)
        step = float(np.min(np.diff(unique))) if unique.size > 1 else 1.0
        return values, None, step
    labels = list(dict.fromkeys(values.tolist()))
    return np.array([labels.index(v) for v in values.tolist()], float), labels, 1.0


def plot_phase(summary, path: str | Path, x: str | None = None, y: str | None = None) -> Path:
    """Write :func:`phase_figure` of ``summary`` to ``path``."""
    path = Path(path)
    phase_figure(summary, x, y).savefig(path, dpi=110)
    return path


def phase_figure(summary, x: str | None = None, y: str | None = None):
    """The phase diagram of a sweep summary: outcome per run over the parameters ``x`` and
    ``y`` (default: ``[phase]`` of the sweep file). Non-numeric parameters get categorical
    axes; the other parameters get one panel per combination of values (up to 6), or are
    overlaid with a small offset per combination."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    keys = json.loads(summary.attrs["parameters"])
    x = x or summary.attrs.get("phase_x") or keys[0]
    y = y if y is not None else (summary.attrs.get("phase_y") or None)
    others = [k for k in keys if k not in (x, y)]
    n = summary.sizes["run"]
    xs, xlabels, xstep = _axis(summary[x].values)
    ys, ylabels, ystep = _axis(summary[y].values) if y else (np.zeros(n), None, 1.0)
    combos = [tuple(str(summary[k].values[i]) for k in others) for i in range(n)]
    groups = list(dict.fromkeys(combos))
    panels: list[tuple[str, ...] | None] = list(groups) if len(groups) <= 6 else [None]
    dx, dy = np.zeros(n), np.zeros(n)
    if panels == [None]:  # overlay: offset each combination on a small circle
        for i, c in enumerate(combos):
            angle = 2 * math.pi * groups.index(c) / len(groups)
            dx[i], dy[i] = 0.25 * xstep * math.cos(angle), 0.25 * ystep * math.sin(angle)
    cats = [
        _category(str(o), int(r))
        for o, r in zip(summary["outcome"].values, summary["rank"].values, strict=True)
    ]
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.2 * ncols + 2.2, 3.6 * nrows + 0.4), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for p, ax in enumerate(axes.flat):
        if p >= len(panels):
            ax.set_visible(False)
            continue
        panel = panels[p]
        members = [i for i in range(n) if panel is None or combos[i] == panel]
        for label in dict.fromkeys(cats[i][0] for i in members):
            idx = [i for i in members if cats[i][0] == label]
            _, marker, colour = cats[idx[0]]
            filled = label != "failed"
            ax.scatter(
                xs[idx] + dx[idx],
                ys[idx] + dy[idx],
                marker=marker,
                s=46,
                c=colour if filled else "none",
                edgecolors=colour,
                linewidths=1.2,
            )
        if xlabels is not None:
            ax.set_xticks(range(len(xlabels)), xlabels, rotation=30, fontsize=7)
            ax.set_xlim(-0.5, len(xlabels) - 0.5)
        if y is None:
            ax.set_yticks([])
        elif ylabels is not None:
            ax.set_yticks(range(len(ylabels)), ylabels, fontsize=7)
            ax.set_ylim(-0.5, len(ylabels) - 0.5)
        ax.set_xlabel(x)
        if y:
            ax.set_ylabel(y)
        if panel is not None and others:
            ax.set_title(
                ", ".join(f"{k} = {v}" for k, v in zip(others, panel, strict=True)), fontsize=8
            )
        elif others:
            ax.set_title(f"overlaid (offset per value of {', '.join(others)})", fontsize=8)
        ax.grid(alpha=0.3)
    rank = [_category(o, 0)[0].split(",")[0] for o in OUTCOMES]  # the legend's order
    order = sorted(dict.fromkeys(cats), key=lambda c: (rank.index(c[0].split(",")[0]), c[0]))
    counts = {c[0]: sum(k[0] == c[0] for k in cats) for c in order}
    handles = [
        Line2D(
            [],
            [],
            marker=m,
            linestyle="",
            markersize=7,
            markerfacecolor=col if label != "failed" else "none",
            markeredgecolor=col,
            label=f"{label} ({counts[label]})",
        )
        for label, m, col in order
    ]
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False)
    fig.suptitle(f"tpde sweep: {n} runs", fontsize=10)
    return fig
