"""Run configuration: TOML (docs/user-guide.md, 'Configuration files') -> validated objects
-> a Problem.

Every key has a documented default except the physics (``grid.lower/upper/cells``, the
initial data, the attention matrices, ``run.t_end``). Errors are ``ConfigError``: one line
that names the key, the bad value and the fix (the CLI turns them into exit code 2).

```toml
[grid]
lower = [-6.0, -6.0]      # required
upper = [6.0, 6.0]        # required
cells = [128, 128]        # required
boundary = "outflow"      # outflow | periodic | noflux, or one per axis
# positions = 16          # masked attention only: position slices in (0, 1]
# sink_mass = 0.1         # masked attention only: nu-mass of the attention sink at s = 0

[initial]
kind = "gaussian"         # gaussian | mixture | uniform | tokens | file
mean = [0.0, 0.0]         # gaussian
covariance = [[1.0, 0.3], [0.3, 0.5]]
# mixture: weights = [...], means = [[...], ...], covariances = [[[...]]]
# uniform: center = [...], radius = r (ball)  or  lower = [...], upper = [...] (box)
# tokens:  file = "tokens.npy", deposit = "cic" (or "ngp")
# file:    file = "previous.nc", snapshot = -1 (a tpde output on the same grid)
# masked attention: every position slice starts from this law (nu x mu_0), or, for a
# gaussian, mean_drift = [...] moves the mean with the position: mean + s * mean_drift

[attention]
variant = "softmax"       # softmax | multihead | l2 | sinkhorn | sigmoid | linear
A = [[-0.5, 0.2], [0.1, -0.4]]   # A = K^T Q; or Q and K (required for l2)
V = [[1.0, 0.0], [0.0, 1.0]]     # d x d, or k x d with W (d x k)
scale = 1.0               # multiplies A (l2: multiplies Q); the authors' code uses 1/sqrt(d)
epsilon = 1.0             # sinkhorn
bias = 0.0                # sigmoid
engine = "auto"           # auto | direct | separable (| fft for softmax with symmetric A)
masked = false            # causal attention over position slices (not for sinkhorn)
# [[attention.heads]]: A (or Q, K), V[, W] per head (multihead);
# [[attention.layers]]: t_start plus the keys above (or heads) per layer.

[scheme]
reconstruction = "weno5z" # upwind | muscl | muscl-mc | muscl-vanleer | weno5 | weno5z
integrator = "ssprk3"     # ssprk1 | ssprk2 | ssprk3
cfl = 0.4                 # (0, 1]

[run]
t_end = 2.0               # required
snapshots = 41
output = "out.nc"
max_outflow = 1e-3        # stop with status mass_left_domain beyond this fraction
```
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpde.grid import (
    SINK_MASS,
    Grid,
    Positions,
    from_array,
    from_tokens,
    gaussian,
    gaussian_mixture,
    uniform_ball,
    uniform_box,
)
from tpde.schemes import INTEGRATORS, RECONSTRUCTIONS
from tpde.schemes.solver import Problem, Scheme
from tpde.variants import (
    ATTENTION,
    MASKABLE,
    CausalAttention,
    Head,
    L2Head,
    Layers,
    SigmoidHead,
    SinkhornHead,
)
from tpde.variants.parameters import checked_matrix

SECTIONS = {
    "grid": {"lower", "upper", "cells", "boundary", "positions", "sink_mass"},
    "initial": {
        "kind",
        "mean",
        "covariance",
        "weights",
        "means",
        "covariances",
        "center",
        "radius",
        "lower",
        "upper",
        "file",
        "deposit",
        "snapshot",
        "mean_drift",
    },
    "attention": {
        "variant",
        "A",
        "Q",
        "K",
        "V",
        "W",
        "scale",
        "epsilon",
        "bias",
        "engine",
        "heads",
        "layers",
        "tol",
        "max_iter",
        "nodes",
        "masked",
    },
    "scheme": {
        "reconstruction",
        "integrator",
        "cfl",
        "dt",
        "dt_max",
        "positivity",
        "face_quadrature",
        "face_velocity",
    },
    "run": {"t_end", "snapshots", "output", "max_outflow", "t_start"},
}
HEAD_KEYS = {"A", "Q", "K", "V", "W", "scale", "epsilon", "bias"}
MASS_TOLERANCE = 1e-6  # the box must hold the initial mass up to this fraction


class ConfigError(ValueError):
    """A bad configuration value: the message names the key and the fix."""


@dataclass
class Config:
    """A validated configuration: the Problem it defines plus the run settings."""

    problem: Problem
    output: str | None
    variant: str
    text: str
    raw: dict


def load(source: str | Path | Mapping) -> dict:
    """The raw TOML tables from a path, a TOML string or a mapping (a deep copy)."""
    if isinstance(source, Mapping):
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in source.items()}
    text = str(source)
    path = Path(text)
    if "\n" not in text and (path.suffix == ".toml" or path.exists()):
        text = read_text(path, "config")
    return parse_toml(text, "config")


def read_text(path: Path, what: str) -> str:
    """The text of a file, or a ConfigError naming ``what`` (config, sweep) and the path."""
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}; check the path") from None


def parse_toml(text: str, what: str, where: str = "") -> dict:
    """TOML text -> tables, or a ConfigError ``"<what>: malformed TOML<where>: ..."``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what}: malformed TOML{where}: {exc}") from None


def _number(key: str, value: Any, positive: bool = False, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    if integer and int(value) != value:
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if positive and not value > 0:
        raise ConfigError(f"{key}: expected a number > 0, got {value!r}")
    return int(value) if integer else float(value)


def _vector(key: str, value: Any, d: int | None = None) -> np.ndarray:
    try:
        arr = np.array(value, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected a list of numbers, got {value!r}") from None
    if arr.ndim != 1 or (d is not None and arr.size != d):
        want = f"{d} numbers" if d else "a list of numbers"
        raise ConfigError(f"{key}: expected {want}, got {value!r}")
    if not np.all(np.isfinite(arr)):
        raise ConfigError(f"{key}: entries must be finite, got {value!r}")
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


def _check_keys(raw: dict) -> None:
    for section, table in raw.items():
        if section not in SECTIONS:
            raise ConfigError(f"{section}: unknown section; expected {', '.join(sorted(SECTIONS))}")
        if not isinstance(table, dict):
            raise ConfigError(f"{section}: expected a table [{section}]")
        for key in table:
            if key not in SECTIONS[section]:
                raise ConfigError(
                    f"{section}.{key}: unknown key; expected one of "
                    f"{', '.join(sorted(SECTIONS[section]))}"
                )


# ---- sections -------------------------------------------------------------------------------
def build_grid(table: dict) -> Grid:
    for key in ("lower", "upper", "cells"):
        if key not in table:
            raise ConfigError(f"grid.{key}: missing (one entry per axis, d = 1, 2 or 3)")
    lower = _vector("grid.lower", table["lower"])
    d = lower.size
    if d not in (1, 2, 3):
        raise ConfigError(f"grid.lower: expected 1, 2 or 3 numbers, got {d}")
    upper = _vector("grid.upper", table["upper"], d)
    cells = [
        _number(f"grid.cells[{a}]", c, positive=True, integer=True)
        for a, c in enumerate(_list("grid.cells", table["cells"], d))
    ]
    if np.any(upper <= lower):
        raise ConfigError(
            f"grid.upper: must exceed grid.lower on every axis, got "
            f"{upper.tolist()} vs {lower.tolist()}"
        )
    boundary = table.get("boundary", "outflow")
    try:
        return Grid(lower, upper, cells, boundary)
    except ValueError as exc:
        raise ConfigError(f"grid.boundary: {exc}") from None


def _list(key: str, value: Any, d: int) -> list:
    if not isinstance(value, list) or len(value) != d:
        raise ConfigError(f"{key}: expected a list of {d} entries, got {value!r}")
    return value


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


def build_initial(table: dict, grid: Grid, positions: Positions | None = None) -> np.ndarray:
    """The initial cell averages: grid.shape, or (positions.count, *grid.shape) for masked
    runs (every slice the same law scaled by its nu-mass, or a drifting gaussian mean)."""
    if "mean_drift" in table:
        if positions is None or table.get("kind", "gaussian") != "gaussian":
            raise ConfigError(
                "initial.mean_drift: only for a gaussian with masked attention "
                "(attention.masked = true); remove it"
            )
        drift = _vector("initial.mean_drift", table["mean_drift"], grid.ndim)
        base = {k: v for k, v in table.items() if k != "mean_drift"}
        mean = _vector("initial.mean", table.get("mean", [0.0] * grid.ndim), grid.ndim)
        try:
            return positions.sliced(
                lambda s: _initial({**base, "mean": (mean + s * drift).tolist()}, grid), grid
            )
        except ConfigError as exc:
            raise ConfigError(
                f"{exc} (with initial.mean_drift, at every position up to s = 1)"
            ) from None
        except ValueError as exc:
            raise ConfigError(f"initial: {exc}") from None
    density = _initial(table, grid)
    return density if positions is None else positions.product(density, grid)


def _initial(table: dict, grid: Grid) -> np.ndarray:
    d = grid.ndim
    kind = _choice(
        "initial.kind",
        table.get("kind", "gaussian"),
        ("gaussian", "mixture", "uniform", "tokens", "file"),
    )
    try:
        if kind == "gaussian":
            mean = _vector("initial.mean", table.get("mean", [0.0] * d), d)
            cov = _matrix("initial.covariance", table.get("covariance", np.eye(d).tolist()), (d, d))
            _spd("initial.covariance", cov)
            density = gaussian(grid, mean, cov)
        elif kind == "mixture":
            for key in ("weights", "means", "covariances"):
                if key not in table:
                    raise ConfigError(f"initial.{key}: missing for kind = 'mixture'")
            weights = _vector("initial.weights", table["weights"])
            means = [
                _vector(f"initial.means[{i}]", m, d)
                for i, m in enumerate(_list("initial.means", table["means"], weights.size))
            ]
            covs = [
                _matrix(f"initial.covariances[{i}]", c, (d, d))
                for i, c in enumerate(
                    _list("initial.covariances", table["covariances"], weights.size)
                )
            ]
            for i, c in enumerate(covs):
                _spd(f"initial.covariances[{i}]", c)
            if np.any(weights <= 0):
                raise ConfigError(f"initial.weights: must be > 0, got {weights.tolist()}")
            density = gaussian_mixture(grid, weights / weights.sum(), means, covs)
        elif kind == "uniform":
            if "radius" in table:
                center = _vector("initial.center", table.get("center", [0.0] * d), d)
                radius = _number("initial.radius", table["radius"], positive=True)
                density = uniform_ball(grid, center, radius)
            else:
                low = _vector("initial.lower", table.get("lower"), d)
                high = _vector("initial.upper", table.get("upper"), d)
                density = uniform_box(grid, low, high)
        elif kind == "tokens":
            from tpde.validation.particles import load_tokens

            path = table.get("file")
            if not isinstance(path, str):
                raise ConfigError("initial.file: missing (a .npy file of n x d tokens)")
            try:
                tokens = load_tokens(path, d)
            except OSError as exc:
                raise ConfigError(f"initial.file: cannot read {path}: {exc}") from None
            deposit = _choice("initial.deposit", table.get("deposit", "cic"), ("ngp", "cic"))
            density = from_tokens(grid, tokens, method=deposit)
        else:
            density = _from_file(table, grid)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"initial: {exc}") from None
    mass = grid.integrate(density)
    if kind in ("gaussian", "mixture") and mass < 1.0 - MASS_TOLERANCE:
        raise ConfigError(
            f"grid: the box holds only {mass:.6g} of the initial mass (limit "
            f"1 - {MASS_TOLERANCE:g}); widen grid.lower / grid.upper"
        )
    if not mass > 0:
        raise ConfigError(
            "initial: the initial density has no mass inside the box; move it "
            "into grid.lower / grid.upper"
        )
    return density


def _spd(key: str, cov: np.ndarray) -> None:
    if not np.allclose(cov, cov.T) or np.linalg.eigvalsh(0.5 * (cov + cov.T))[0] <= 0:
        raise ConfigError(f"{key}: must be symmetric positive definite, got {cov.tolist()}")


def _from_file(table: dict, grid: Grid) -> np.ndarray:
    from tpde.io import grid_from_dataset, read

    path = table.get("file")
    if not isinstance(path, str):
        raise ConfigError("initial.file: missing (a tpde NetCDF output)")
    try:
        ds = read(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"initial.file: cannot read {path}: {exc}") from None
    source = grid_from_dataset(ds)
    if source.shape != grid.shape or not np.allclose(
        [source.centres(a) for a in range(grid.ndim)], [grid.centres(a) for a in range(grid.ndim)]
    ):
        raise ConfigError(f"initial.file: {path} is on a different grid; use the same grid keys")
    index = int(_number("initial.snapshot", table.get("snapshot", -1), integer=True))
    return from_array(grid, np.asarray(ds["density"][index]))


def _head(key: str, table: dict, variant: str, d: int):
    unknown = set(table) - HEAD_KEYS - {"t_start", "heads"}
    if unknown:
        raise ConfigError(
            f"{key}.{sorted(unknown)[0]}: unknown key; expected one of "
            f"{', '.join(sorted(HEAD_KEYS))}"
        )
    if "V" not in table:
        raise ConfigError(f"{key}.V: missing (the value matrix, {d} x {d})")
    scale = _number(f"{key}.scale", table.get("scale", 1.0))
    W = _matrix(f"{key}.W", table["W"]) if "W" in table else None
    V = _matrix(f"{key}.V", table["V"])
    try:
        if variant == "l2":
            if "Q" not in table or "K" not in table:
                raise ConfigError(f"{key}.Q: the l2 variant needs Q and K (k x {d} each)")
            return L2Head(
                _matrix(f"{key}.Q", table["Q"]), _matrix(f"{key}.K", table["K"]), V, scale, W
            )
        if "A" in table:
            A = scale * _matrix(f"{key}.A", table["A"], (d, d))
        elif "Q" in table and "K" in table:
            Q = _matrix(f"{key}.Q", table["Q"])
            K = _matrix(f"{key}.K", table["K"], Q.shape)
            if Q.shape[1] != d:
                raise ConfigError(f"{key}.Q: expected k x {d}, got {Q.shape[0]} x {Q.shape[1]}")
            A = scale * K.T @ Q
        else:
            raise ConfigError(f"{key}.A: missing (give A, or Q and K)")
        if variant == "sinkhorn":
            return SinkhornHead(
                A, V, W, _number(f"{key}.epsilon", table.get("epsilon", 1.0), positive=True)
            )
        if variant == "sigmoid":
            return SigmoidHead(A, V, W, _number(f"{key}.bias", table.get("bias", 0.0)))
        return Head(A, V, W)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        field_name = str(exc).split(":", 1)[0].split(".")[-1]
        raise ConfigError(f"{key}.{field_name}:{str(exc).split(':', 1)[1]}") from None


def _params(key: str, table: dict, variant: str, d: int):
    heads = table.get("heads")
    if heads is not None:
        if not isinstance(heads, list) or not heads or not all(isinstance(h, dict) for h in heads):
            raise ConfigError(f"{key}.heads: expected [[{key}.heads]] tables")
        shared = {k: v for k, v in table.items() if k in ("scale", "epsilon", "bias")}
        return [
            _head(f"{key}.heads[{i}]", {**shared, **h}, variant, d) for i, h in enumerate(heads)
        ]
    return _head(key, table, variant, d)


def build_attention(table: dict, d: int):
    variant = _choice("attention.variant", table.get("variant", "softmax"), tuple(ATTENTION))
    engine = table.get("engine", "auto")
    common = {k: v for k, v in table.items() if k in HEAD_KEYS or k == "heads"}
    layers = table.get("layers")
    if layers is not None:
        if not isinstance(layers, list) or not layers:
            raise ConfigError("attention.layers: expected [[attention.layers]] tables")
        items = []
        for i, layer in enumerate(layers):
            if "t_start" not in layer:
                raise ConfigError(f"attention.layers[{i}].t_start: missing")
            t_start = _number(f"attention.layers[{i}].t_start", layer["t_start"])
            merged = {**common, **{k: v for k, v in layer.items() if k != "t_start"}}
            items.append((t_start, _params(f"attention.layers[{i}]", merged, variant, d)))
        try:
            params = Layers(items)
        except ValueError as exc:
            raise ConfigError(f"attention.{exc}") from None
    else:
        params = _params("attention", common, variant, d)
    options = {}
    if variant != "linear":
        options["engine"] = engine
    if variant == "sinkhorn":
        for key in ("tol", "max_iter"):
            if key in table:
                options[key] = _number(
                    f"attention.{key}", table[key], positive=True, integer=key == "max_iter"
                )
    if "nodes" in table and variant in ("softmax", "multihead", "l2", "sinkhorn"):
        options["nodes"] = _number("attention.nodes", table["nodes"], positive=True, integer=True)
    try:
        field_ = ATTENTION[variant](params, **options)
        first = params.params[0] if isinstance(params, Layers) else params
        heads = first if isinstance(first, list) else [first]
        for h in heads:
            if h.dim != d:
                raise ConfigError(
                    f"attention: the matrices are {h.dim}-D but the grid is "
                    f"{d}-D; give {d} x {d} matrices"
                )
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None
    return variant, params, field_


def build_scheme(table: dict) -> Scheme:
    kwargs: dict[str, Any] = {}
    if "reconstruction" in table:
        kwargs["reconstruction"] = _choice(
            "scheme.reconstruction", table["reconstruction"], tuple(RECONSTRUCTIONS)
        )
    if "integrator" in table:
        kwargs["integrator"] = _choice("scheme.integrator", table["integrator"], tuple(INTEGRATORS))
    if "cfl" in table:
        cfl = _number("scheme.cfl", table["cfl"], positive=True)
        if cfl > 1:
            raise ConfigError(f"scheme.cfl: expected a number in (0, 1], got {cfl}")
        kwargs["cfl"] = cfl
    for key in ("dt", "dt_max"):
        if key in table:
            kwargs[key] = _number(f"scheme.{key}", table[key], positive=True)
    if "positivity" in table:
        if not isinstance(table["positivity"], bool):
            raise ConfigError(
                f"scheme.positivity: expected true or false, got {table['positivity']!r}"
            )
        kwargs["positivity"] = table["positivity"]
    if "face_quadrature" in table:
        kwargs["face_quadrature"] = _choice(
            "scheme.face_quadrature", table["face_quadrature"], ("auto", "midpoint", "gauss")
        )
    if "face_velocity" in table:
        kwargs["face_velocity"] = _choice(
            "scheme.face_velocity", table["face_velocity"], ("auto", "exact", "interpolated")
        )
    scheme = Scheme(**kwargs)
    try:
        scheme.validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return scheme


def build(source: str | Path | Mapping) -> Config:
    """Validate a configuration (path, TOML text or mapping) and build its Problem."""
    raw = load(source)
    _check_keys(raw)
    for section in ("grid", "attention", "run"):
        if section not in raw:
            raise ConfigError(f"{section}: missing section [{section}]")
    grid = build_grid(raw["grid"])
    positions = build_positions(raw["grid"], raw["attention"])
    density = build_initial(raw.get("initial", {}), grid, positions)
    variant, _, velocity = build_attention(raw["attention"], grid.ndim)
    if positions is not None:
        velocity = CausalAttention(velocity)
    scheme = build_scheme(raw.get("scheme", {}))
    run = raw["run"]
    if "t_end" not in run:
        raise ConfigError("run.t_end: missing (the final time, > 0)")
    t_start = _number("run.t_start", run.get("t_start", 0.0))
    t_end = _number("run.t_end", run["t_end"])
    if not t_end > t_start:
        raise ConfigError(f"run.t_end: must be > run.t_start = {t_start}, got {t_end}")
    snapshots = run.get("snapshots", 41)
    if isinstance(snapshots, list):
        snapshots = _vector("run.snapshots", snapshots).tolist()
    else:
        snapshots = _number("run.snapshots", snapshots, integer=True)
        if snapshots < 2:
            raise ConfigError(f"run.snapshots: expected an integer >= 2, got {snapshots}")
    max_outflow = _number("run.max_outflow", run.get("max_outflow", 1e-3), positive=True)
    output = run.get("output", "out.nc")
    if output is not None and not isinstance(output, str):
        raise ConfigError(f"run.output: expected a file name, got {output!r}")
    try:
        problem = Problem(
            grid,
            density,
            velocity,
            t_end,
            scheme=scheme,
            snapshots=snapshots,
            t_start=t_start,
            max_outflow=max_outflow,
            positions=positions,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return Config(problem, output, variant, dumps(raw), raw)


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
