"""The configuration layer every geometry shares: parsing (TOML, numbers, vectors,
matrices, choices), the known keys and their check, the run settings, the scheme, position
slices, memory checks, :class:`Config` and :class:`ConfigError`, the canonical form and the
TOML text a run stores. tpde.config (flat grids and the dispatch on ``grid.geometry``),
tpde.circle and tpde.sphere build on it; it imports none of them, so the three form no
import cycle."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import math
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from tpde.grid import (
    SINK_MASS,
    Positions,
)
from tpde.schema import FLAT
from tpde.schemes.frame import AffineFrame
from tpde.schemes.monitor import (
    BOX_ACTIONS,
    RESOLUTION_ACTION,
    RESOLUTION_ACTIONS,
    RESOLUTION_TOLERANCE,
)
from tpde.schemes.solver import Problem, Scheme
from tpde.variants import (
    ATTENTION,
    MASKABLE,
    Head,
    L2Head,
    SigmoidHead,
    SinkhornHead,
)
from tpde.variants.parameters import checked_matrix

#: the known keys of each section: [grid], [initial] and [run] from the documented schema
#: (tpde.schema, whose table docs/reference/config.md is generated from), [attention] and
#: [scheme] from the code that reads them (below)
SECTIONS = {
    "grid": set(FLAT["grid"]),
    "initial": set(FLAT["initial"]),
    "attention": set(),  # ATTENTION_KEYS, below: read from the variants
    "scheme": set(),  # the fields of tpde.schemes.solver.Scheme
    "run": set(FLAT["run"]),
    "atoms": set(FLAT["atoms"]),
}

# ---- the attention schema, read from the variants ---------------------------------------------
#: the attention options the config passes to a variant's constructor, where it takes them
ATTENTION_OPTIONS = ("engine", "nodes", "tol", "max_iter")
#: the head class of each variant (tpde.variants.parameters); the others use Head
HEAD_CLASSES: dict[str, type] = {"l2": L2Head, "sinkhorn": SinkhornHead, "sigmoid": SigmoidHead}
#: config key -> head field, where the names differ
HEAD_FIELD_NAMES = {"epsilon": "eps"}


def variant_keys(variant: str) -> tuple[frozenset[str], frozenset[str]]:
    """The attention keys ``variant`` reads, as (options, head keys): the options are the
    ATTENTION_OPTIONS its class's constructor takes, the head keys the fields of its head
    class (config names), plus ``scale`` and, for heads that hold ``A``, ``Q`` and ``K``
    (A = scale K^T Q). Any other attention key is refused for that variant, like a typo."""
    parameters = inspect.signature(ATTENTION[variant]).parameters
    options = frozenset(k for k in ATTENTION_OPTIONS if k in parameters)
    fields = {f.name for f in dataclasses.fields(HEAD_CLASSES.get(variant, Head))}
    config_name = {field: key for key, field in HEAD_FIELD_NAMES.items()}
    keys = {config_name.get(name, name) for name in fields} | {"scale"}
    if "A" in fields:
        keys |= {"Q", "K"}
    return options, frozenset(keys)


#: every head key of any variant (a [[attention.heads]] table, or [attention] itself)
HEAD_KEYS = frozenset().union(*(variant_keys(v)[1] for v in ATTENTION))
SECTIONS["attention"] = (
    {"variant", "masked", "heads", "layers"}
    | set().union(*(variant_keys(v)[0] for v in ATTENTION))
    | HEAD_KEYS
)
SECTIONS["scheme"] = {f.name for f in dataclasses.fields(Scheme)}
LAYER_KEYS = frozenset({"t_start", "heads"})


class ConfigError(ValueError):
    """A bad configuration value: the message names the key and the fix."""


#: what a configuration defines: a tpde.schemes.solver.Problem on a Grid (flat, circle), or a
#: geometry's own (tpde.sphere.SphereProblem)
P = TypeVar("P")


@dataclass
class Config(Generic[P]):
    """A validated configuration of any geometry: the problem it defines (``problem``: a
    :class:`tpde.schemes.solver.Problem` on a Grid, or the geometry's own, which its
    ``session`` runs), the run settings, and the hooks where a geometry differs."""

    problem: P
    output: str | None
    variant: str
    text: str
    raw: dict
    #: ``grid.geometry`` (a name of tpde.geometries: "flat", "circle", "sphere")
    geometry: str = "flat"
    #: a geometry's own energies of a run (``() -> (density, t) -> {name: Energy}``) and
    #: token reference (``(n, seed, quantiles) -> Dataset``); None: the flat grid's
    energies: Callable[[], Callable[[np.ndarray, float], dict]] | None = None
    particles: Callable[[int, int, bool], Any] | None = None
    #: what ``tpde gaussian`` says where the geometry has no Gaussian closure (None: it has)
    no_gaussian: str | None = None
    #: a geometry with its own solver and file layout (tpde.sphere):
    #: ``session(config) -> tpde.run.RunSession`` (the writer and solver that
    #: tpde.run.run_config drives; None: tpde.run.FlatSession)
    session: Callable[[Any], Any] | None = None


def load(source: str | Path | Mapping) -> dict:
    """The raw TOML tables from a path, a TOML string or a mapping (a deep copy)."""
    if isinstance(source, Mapping):
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in source.items()}
    text = str(source)
    path = Path(text)
    if "\n" not in text and (path.suffix == ".toml" or path.exists()):
        text = read_text(path, "config")
    return parse_toml(text, "config")


#: the largest config or sweep file read (a TOML file is a few KiB; a larger one is a
#: mistake, e.g. a NetCDF output passed where the config goes)
MAX_TEXT_BYTES = 16 * 2**20


def read_text(path: Path, what: str) -> str:
    """The text of a file, or a ConfigError naming ``what`` (config, sweep) and the path:
    unreadable, larger than MAX_TEXT_BYTES, or not UTF-8 text."""
    try:
        if path.is_file() and path.stat().st_size > MAX_TEXT_BYTES:
            raise ConfigError(
                f"{what}: {path} is {path.stat().st_size / 2**20:.0f} MiB, not a TOML {what} "
                f"file (at most {MAX_TEXT_BYTES // 2**20} MiB)"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}; check the path") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        hint = (
            "; it looks like a NetCDF output: give the TOML file first and the output with -o"
            if data[:4] in (b"CDF\x01", b"CDF\x02", b"\x89HDF")
            else ""
        )
        raise ConfigError(f"{what}: {path} is not a UTF-8 text (TOML) file{hint}") from None


def parse_toml(text: str, what: str, where: str = "") -> dict:
    """TOML text -> tables, or a ConfigError ``"<what>: malformed TOML<where>: ..."``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what}: malformed TOML{where}: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"{what}: malformed TOML{where}: arrays or tables nested too deeply"
        ) from None


def _number(key: str, value: Any, positive: bool = False, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}: expected a number, got {_short(value)}")
    if isinstance(value, int) and abs(value) >= 2**63:
        raise ConfigError(f"{key}: {value:.3g} is out of range (at most 2^63)")
    if not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    if integer and int(value) != value:
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if positive and not value > 0:
        raise ConfigError(f"{key}: expected a number > 0, got {value!r}")
    return int(value) if integer else float(value)


def _short(value: Any) -> str:
    """repr of a config value, cut to one short line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _vector(key: str, value: Any, d: int | None = None) -> np.ndarray:
    try:
        arr = np.array(value, dtype=float)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key}: expected a list of numbers, got {_short(value)}") from None
    if arr.ndim != 1 or (d is not None and arr.size != d):
        want = f"{d} numbers" if d else "a list of numbers"
        raise ConfigError(f"{key}: expected {want}, got {_short(value)}")
    if not np.all(np.isfinite(arr)):
        raise ConfigError(f"{key}: entries must be finite, got {_short(value)}")
    return arr


def _matrix(key: str, value: Any, shape=None) -> np.ndarray:
    try:
        return checked_matrix(key, value, shape)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _choice(key: str, value: Any, choices) -> str:
    if value not in choices:
        raise ConfigError(f"{key}: unknown {value!r}; choose one of {', '.join(choices)}")
    return value


#: how deep lists and tables may nest in a config (a 3-D matrix list of heads is 5 deep)
MAX_DEPTH = 8


def check_keys(
    raw: Mapping,
    sections: Mapping[str, Any] = SECTIONS,
    geometry: str | None = None,
    required: Sequence[str] = (),
) -> None:
    """Every section and key known to the schema (``sections``: the flat one, or that of a
    ``geometry``, named in the messages), nesting within MAX_DEPTH, every ``required``
    section present."""
    where = f" of the {geometry} geometry" if geometry else ""
    for section, table in raw.items():
        if section not in sections:
            raise ConfigError(
                f"{section}: unknown section{where}; expected {', '.join(sorted(sections))}"
            )
        if not isinstance(table, Mapping):
            raise ConfigError(f"{section}: expected a table [{section}]")
        for key in table:
            if key not in sections[section]:
                raise ConfigError(
                    f"{section}.{key}: unknown key{where}; expected one of "
                    f"{', '.join(sorted(sections[section]))}"
                )
            _check_depth(f"{section}.{key}", table[key], 1)
    for section in required:
        if section not in raw:
            raise ConfigError(f"{section}: missing section [{section}]")


def numbers(key: str, value: Any, count: int | None = None) -> list[float]:
    """``value`` as a list of (``count``) finite numbers, each checked by name."""
    if not isinstance(value, list) or (count is not None and len(value) != count):
        what = f"a list of {count} numbers" if count is not None else "a list of numbers"
        raise ConfigError(f"{key}: expected {what}, got {value!r:.60}")
    return [_number(f"{key}[{i}]", v) for i, v in enumerate(value)]


@contextlib.contextmanager
def section_errors(section: str):
    """Turn a ValueError raised while building ``section`` into one ConfigError line that
    names the section (a ConfigError passes unchanged)."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as exc:
        message = str(exc).splitlines()[0]
        raise ConfigError(
            message if message.startswith(section) else f"{section}: {message}"
        ) from None


def _check_depth(key: str, value: Any, depth: int) -> None:
    """Refuse lists and tables nested deeper than MAX_DEPTH (before numpy or the TOML
    writer recurse into them)."""
    if depth > MAX_DEPTH:
        raise ConfigError(f"{key}: nested more than {MAX_DEPTH} levels deep; check the brackets")
    if isinstance(value, list):
        for item in value:
            _check_depth(key, item, depth + 1)
    elif isinstance(value, Mapping):
        for item in value.values():
            _check_depth(key, item, depth + 1)


DEFAULT_POSITIONS = 16


def build_positions(grid_table: dict, attention_table: dict) -> Positions | None:
    """The position slices of masked attention (None for unmasked runs)."""
    masked = attention_table.get("masked", False)
    if not isinstance(masked, bool):
        raise ConfigError(f"attention.masked: expected true or false, got {masked!r}")
    if not masked:
        for key in ("positions", "sink_mass"):
            if key in grid_table:
                raise ConfigError(
                    f"grid.{key}: only for masked attention; set "
                    f"attention.masked = true or remove it"
                )
        return None
    variant = attention_table.get("variant", "softmax")
    if variant not in MASKABLE:
        raise ConfigError(
            f"attention.masked: no causal form for {variant!r}; choose one of {', '.join(MASKABLE)}"
        )
    slices = _number(
        "grid.positions",
        grid_table.get("positions", DEFAULT_POSITIONS),
        positive=True,
        integer=True,
    )
    sink = _number("grid.sink_mass", grid_table.get("sink_mass", SINK_MASS), positive=True)
    try:
        return Positions(int(slices), float(sink))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def build_scheme(table: dict) -> Scheme:
    """The [scheme] table as a :class:`Scheme`: its keys are the Scheme's fields, and
    :meth:`Scheme.validate` is the one check of their types and values."""
    try:
        scheme = Scheme(**table)
        scheme.validate()
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    return scheme


# ---- resources ----------------------------------------------------------------------------------
#: the most snapshots a run may ask for (each is a record in the file and a copy in memory)
MAX_SNAPSHOTS = 100_000
#: the share of the available memory a run may plan to use; the rest is for the system,
#: other processes and the estimate's error
MEMORY_FRACTION = 0.8


def available_memory() -> int | None:
    """Bytes this process can still allocate: ``MemAvailable`` of /proc/meminfo, lowered to
    the room left under a cgroup memory limit (containers, batch jobs); None if unknown."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        with contextlib.suppress(OSError, ValueError):
            with open(limit) as f:
                text = f.read().strip()
            if text != "max" and int(text) < 2**60:
                with open(usage) as f:
                    found.append(max(0, int(text) - int(f.read().strip())))
    return min(found) if found else None


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**28 else f"{nbytes / 2**20:.3g} MiB"


def check_memory(key: str, nbytes: float, what: str) -> None:
    """ConfigError naming ``key`` when ``nbytes`` exceed MEMORY_FRACTION of the available
    memory (no check where that is unknown)."""
    available = available_memory()
    if available is not None and nbytes > MEMORY_FRACTION * available:
        raise ConfigError(
            f"{key}: the run needs about {_gib(nbytes)} ({what}), more than "
            f"{MEMORY_FRACTION:.0%} of the {_gib(available)} of memory available; make it smaller"
        )


def _run_settings(run: dict) -> dict:
    """The [run] table's values, type-checked (Problem checks their ranges)."""
    if "t_end" not in run:
        raise ConfigError("run.t_end: missing (the final time, > 0)")
    out: dict[str, Any] = {
        "t_start": _number("run.t_start", run.get("t_start", 0.0)),
        "t_end": _number("run.t_end", run["t_end"]),
        "max_outflow": _number("run.max_outflow", run.get("max_outflow", 1e-3)),
        "box_tolerance": _number("run.box_tolerance", run.get("box_tolerance", 1e-4)),
        "box_action": _choice("run.box_action", run.get("box_action", "stop"), BOX_ACTIONS),
        "collapse_ratio": _number("run.collapse_ratio", run.get("collapse_ratio", 1e-4)),
        "resolution_tolerance": _number(
            "run.resolution_tolerance", run.get("resolution_tolerance", RESOLUTION_TOLERANCE)
        ),
        "resolution_action": _choice(
            "run.resolution_action",
            run.get("resolution_action", RESOLUTION_ACTION),
            RESOLUTION_ACTIONS,
        ),
        "noise": _number("run.noise", run.get("noise", 0.0)),  # eps of eps Delta mu
    }
    snapshots = run.get("snapshots", 41)
    if isinstance(snapshots, list):
        if len(snapshots) > MAX_SNAPSHOTS:
            raise ConfigError(f"run.snapshots: {len(snapshots)} times; at most {MAX_SNAPSHOTS}")
        out["snapshots"] = _vector("run.snapshots", snapshots).tolist()
        out["count"] = len(snapshots)
    else:
        out["snapshots"] = out["count"] = _number("run.snapshots", snapshots, integer=True)
    output = run.get("output", "out.nc")
    if output is not None and not isinstance(output, str):
        raise ConfigError(f"run.output: expected a file name, got {_short(output)}")
    out["output"] = output
    return out


def make_problem(
    grid: Any,
    density: np.ndarray,
    velocity: Any,
    scheme: Scheme,
    run: dict,
    positions: Positions | None = None,
    frame: AffineFrame | None = None,
    atoms: Any = None,
) -> Problem:
    """The Problem of a run's settings (:func:`_run_settings`); Problem's own checks end
    in a one-line ConfigError."""
    try:
        return Problem(
            grid,
            density,
            velocity,
            run["t_end"],
            scheme=scheme,
            snapshots=run["snapshots"],
            t_start=run["t_start"],
            max_outflow=run["max_outflow"],
            positions=positions,
            frame=frame,
            box_tolerance=run["box_tolerance"],
            box_action=run["box_action"],
            collapse_ratio=run["collapse_ratio"],
            resolution_tolerance=run["resolution_tolerance"],
            resolution_action=run["resolution_action"],
            noise=run.get("noise", 0.0),
            atoms=atoms,
        )
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None


def resolved(raw: Mapping) -> dict:
    """``raw`` with the default of every key that has a plain one filled in: the sections
    of :data:`DEFAULTS` (every [scheme] option), the variant's options (``engine``, ``tol``,
    ...), a Gaussian's ``mean`` and ``covariance``, the position slices of a masked run.
    What a run stores as its ``config`` attribute: the configuration it actually used."""
    out = copy.deepcopy(dict(raw))
    for section, defaults in DEFAULTS.items():
        table = out.setdefault(section, {})
        if isinstance(table, dict):
            for key, default in defaults.items():
                table.setdefault(key, default)
    attention, grid = out["attention"], out.get("grid", {})
    variant = attention.get("variant") if isinstance(attention, dict) else None
    if isinstance(variant, str) and variant in ATTENTION:
        parameters = inspect.signature(ATTENTION[variant]).parameters
        for name in sorted(variant_keys(variant)[0]):
            default = parameters[name].default
            if isinstance(default, bool | str | int | float) and name not in attention:
                attention[name] = default
        if attention.get("masked") is True and isinstance(grid, dict):
            grid.setdefault("positions", DEFAULT_POSITIONS)
            grid.setdefault("sink_mass", SINK_MASS)
    initial = out.get("initial")
    lower = grid.get("lower") if isinstance(grid, dict) else None
    if isinstance(initial, dict) and initial.get("kind") == "gaussian" and isinstance(lower, list):
        d = len(lower)
        initial.setdefault("mean", [0.0] * d)
        initial.setdefault("covariance", np.eye(d).tolist())
    return out


def canonical(source: str | Mapping, defaults: bool = True) -> dict:
    """A config's values in one form, to compare two configs (resume, sweep reruns): TOML
    text or a mapping; numbers as float, the defaults of the keys that have one filled in
    (the flat grid's; ``defaults=False``: the values as written), ``run.output`` dropped
    (where a run writes is not what it computes)."""
    raw = parse_toml(source, "config") if isinstance(source, str) else load(source)
    if defaults:
        raw = resolved(raw)

    def norm(value: Any) -> Any:
        if isinstance(value, bool) or isinstance(value, str):
            return value
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, Mapping):
            return {str(k): norm(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [norm(v) for v in value]
        return value

    out = norm(raw)
    for section, table in DEFAULTS.items() if defaults else ():
        if section in out and isinstance(out[section], dict):
            for key, default in table.items():
                out[section].setdefault(key, norm(default))
    if isinstance(out.get("run"), dict):
        out["run"].pop("output", None)
    return out


def same_config(
    stored: str, other: str | Mapping | Any, build: Callable[[str | Mapping], Any]
) -> bool:
    """Whether a file's stored config text has the values of ``other`` (a config's text, a
    raw mapping, or a built config with a ``text``), with every default of the geometry filled
    in on both sides: each side is built by ``build`` (tpde.config.build dispatches on
    ``grid.geometry``; the sphere passes its own builder) and compared as
    :func:`canonical` of the built text, the one text every geometry writes with its own
    defaults (the circle's ``copies``, ``normalised``; the sphere's ``nodes``, ``engine``,
    its scheme's ``cfl``). Key order, ``1`` vs ``1.0``, omitted defaults and ``run.output``
    do not count. Two texts with the same values as written are the same without a build
    (a resume of a file this version wrote: its text is ``config.text``); a stored text that
    no longer builds (an initial-density file since moved) is compared as written; one that
    does not parse is never the same."""

    def text(source: str | Mapping | Any) -> str | Mapping:
        return source if isinstance(source, str | Mapping) else source.text

    def filled(source: str | Mapping | Any) -> dict:
        if not isinstance(source, str | Mapping):  # already built: its text has the defaults
            return canonical(source.text)
        try:
            return canonical(build(source).text)
        except (ConfigError, ValueError):
            return canonical(source)

    try:
        if canonical(stored, defaults=False) == canonical(text(other), defaults=False):
            return True
        return filled(stored) == filled(other)
    except ConfigError:
        return False


#: the defaults of the keys that have a plain one (canonical() fills them in)
DEFAULTS: dict[str, dict[str, Any]] = {
    "grid": {"boundary": "outflow"},
    "initial": {"kind": "gaussian"},
    "attention": {"variant": "softmax", "scale": 1.0, "masked": False},
    "scheme": {
        f.name: f.default
        for f in dataclasses.fields(Scheme)
        if isinstance(f.default, bool | str | int | float)
    },
    "run": {"t_start": 0.0, "snapshots": 41, "max_outflow": 1e-3, "noise": 0.0},
}


def dumps(raw: Mapping) -> str:
    """TOML text of a configuration mapping (the resolved config stored in the output)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, Mapping):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, float):
            return repr(v)
        return str(v)

    lines: list[str] = []
    for section, table in raw.items():
        arrays = {
            k: v
            for k, v in table.items()
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)
        }
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in table.items() if k not in arrays]
        lines.append("")
        for key, items in arrays.items():
            for item in items:
                lines.append(f"[[{section}.{key}]]")
                lines += [f"{k} = {value(v)}" for k, v in item.items()]
                lines.append("")
    return "\n".join(lines)
