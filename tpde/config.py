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
engine = "auto"           # auto | direct | separable | fft (softmax, A = A^T) | lattice (sigmoid)
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
noise = 0.0               # eps of the noisy PDE d/dt mu + div(mu Gamma) = eps Delta mu
```
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpde.grid import (
    Grid,
    Positions,
    from_array,
    from_tokens,
    gaussian,
    gaussian_mixture,
    moments,
    uniform_ball,
    uniform_box,
)
from tpde.schemes.atom_run import check_atom_run
from tpde.schemes.atoms import AtomOptions
from tpde.schemes.frame import (
    AffineFrame,
    cell_subpoints,
    mixture_frame,
    points_frame,
    to_frame,
    uniform_ball_frame,
    uniform_box_frame,
)
from tpde.schemes.solver import Problem, Scheme
from tpde.variants import (
    ATTENTION,
    CausalAttention,
    Head,
    L2Head,
    Layers,
    SigmoidHead,
    SinkhornHead,
)
from tpde.variants.engines.registry import check_engine
from tpde.variants.parameters import ParameterError

from . import geometries
from .config_core import (  # noqa: F401  (shared with tpde.circle and tpde.sphere; re-exported)
    ATTENTION_OPTIONS,
    DEFAULT_POSITIONS,
    DEFAULTS,
    HEAD_CLASSES,
    HEAD_FIELD_NAMES,
    HEAD_KEYS,
    LAYER_KEYS,
    MAX_DEPTH,
    MAX_SNAPSHOTS,
    MAX_TEXT_BYTES,
    MEMORY_FRACTION,
    SECTIONS,
    Config,
    ConfigError,
    _check_depth,
    _choice,
    _gib,
    _matrix,
    _number,
    _run_settings,
    _short,
    _vector,
    available_memory,
    build_positions,
    build_scheme,
    canonical,
    check_keys,
    check_memory,
    dumps,
    load,
    make_problem,
    numbers,
    parse_toml,
    read_text,
    resolved,
    section_errors,
    variant_keys,
)
from .config_core import same_config as core_same_config


def known_keys(prefix: Sequence[str | int]) -> frozenset[str]:
    """The keys the config format knows inside ``prefix`` (a path of keys and list indices,
    e.g. ``["attention", "layers", 0]``), for any variant: the sections at the top, their
    keys, the keys of a [[attention.heads]] or [[attention.layers]] table and of the heads
    of a layer. The one schema that tpde.sweep checks parameter paths against."""
    path = list(prefix)
    if not path:
        return frozenset(SECTIONS)
    if len(path) == 1:
        return frozenset(SECTIONS.get(str(path[0]), ()))
    if path[0] == "attention" and len(path) == 3 and path[1] in ("heads", "layers"):
        return HEAD_KEYS | (LAYER_KEYS if path[1] == "layers" else frozenset())
    if path[0] == "attention" and len(path) == 5 and path[1] == "layers" and path[3] == "heads":
        return HEAD_KEYS
    return frozenset()


MASS_TOLERANCE = 1e-6  # the box must hold the initial mass up to this fraction


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
    try:  # Grid checks the boundary modes (and names the key)
        return Grid(lower, upper, cells, table.get("boundary", "outflow"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _list(key: str, value: Any, d: int) -> list:
    if not isinstance(value, list) or len(value) != d:
        raise ConfigError(f"{key}: expected a list of {d} entries, got {value!r}")
    return value


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
    kind = _choice(
        "initial.kind",
        table.get("kind", "gaussian"),
        ("gaussian", "mixture", "uniform", "tokens", "file"),
    )
    key = {
        "gaussian": "initial.covariance",
        "mixture": "initial.covariances",
        "uniform": "initial.radius" if "radius" in table else "initial.lower",
        "tokens": "initial.file",
        "file": "initial.file",
    }[kind]
    try:
        with np.errstate(all="ignore"):  # an overflow shows as a non-finite density
            density = _density(kind, table, grid)
        mass = grid.integrate(density)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        message = str(exc).splitlines()[0]
        if not message.startswith("initial"):
            message = f"{key}: {message}"
        raise ConfigError(message) from None
    except (OverflowError, FloatingPointError, ZeroDivisionError) as exc:
        raise ConfigError(
            f"{key}: the initial data overflow ({exc}); use moderate values"
        ) from None
    if not (np.isfinite(mass) and np.all(np.isfinite(density))):
        raise ConfigError(f"{key}: the initial density is not finite; use moderate values")
    if kind in ("gaussian", "mixture") and mass < 1.0 - MASS_TOLERANCE:
        covs = [table.get("covariance")] if kind == "gaussian" else table.get("covariances", [])
        spread = max(
            (float(np.sqrt(np.max(np.diag(np.asarray(c, dtype=float))))) for c in covs if c),
            default=0.0,
        )
        width = float(np.min(np.subtract(grid.upper, grid.lower)))
        if spread > width:
            raise ConfigError(
                f"{key}: standard deviations up to {spread:.3g} do not fit in the box "
                f"(narrowest side {width:.3g}): the box holds only {mass:.3g} of the mass"
            )
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


def _density(kind: str, table: dict, grid: Grid) -> np.ndarray:
    """The cell averages of ``initial.kind`` (keys checked on the way)."""
    d = grid.ndim
    if kind == "gaussian":
        mean = _vector("initial.mean", table.get("mean", [0.0] * d), d)
        cov = _matrix("initial.covariance", table.get("covariance", np.eye(d).tolist()), (d, d))
        _spd("initial.covariance", cov)
        return gaussian(grid, mean, cov)
    elif kind == "mixture":
        for key in ("weights", "means", "covariances"):
            if key not in table:
                raise ConfigError(f"initial.{key}: missing for kind = 'mixture'")
        weights = _vector("initial.weights", table["weights"])
        components = table["means"]
        if isinstance(components, list) and len(components) != weights.size:
            raise ConfigError(
                f"initial.weights: {weights.size} weights for {len(components)} means; give "
                "one weight per component (weights, means and covariances alike)"
            )
        means = [
            _vector(f"initial.means[{i}]", m, d)
            for i, m in enumerate(_list("initial.means", table["means"], weights.size))
        ]
        covs = [
            _matrix(f"initial.covariances[{i}]", c, (d, d))
            for i, c in enumerate(_list("initial.covariances", table["covariances"], weights.size))
        ]
        for i, c in enumerate(covs):
            _spd(f"initial.covariances[{i}]", c)
        if np.any(weights <= 0):
            raise ConfigError(f"initial.weights: must be > 0, got {weights.tolist()}")
        return gaussian_mixture(grid, weights / weights.sum(), means, covs)
    elif kind == "uniform":
        if "radius" in table:
            center = _vector("initial.center", table.get("center", [0.0] * d), d)
            radius = _number("initial.radius", table["radius"], positive=True)
            return uniform_ball(grid, center, radius)
        else:
            low = _vector("initial.lower", table.get("lower"), d)
            high = _vector("initial.upper", table.get("upper"), d)
            return uniform_box(grid, low, high)
    elif kind == "tokens":
        deposit = _choice("initial.deposit", table.get("deposit", "cic"), ("ngp", "cic"))
        if FRAMED_TOKENS in table:  # (the co-moving frame: tokens already pushed to xi)
            tokens, weights = table[FRAMED_TOKENS]
            return from_tokens(grid, tokens, weights, method=deposit)
        from tpde.validation.particles import load_tokens

        path = table.get("file")
        if not isinstance(path, str):
            raise ConfigError("initial.file: missing (a .npy file of n x d tokens)")
        try:
            tokens = load_tokens(path, d)
        except OSError as exc:
            raise ConfigError(f"initial.file: cannot read {path}: {exc}") from None
        return from_tokens(grid, tokens, method=deposit)
    else:
        return _from_file(table, grid)


#: the internal key of a pushed [initial] table that carries tokens already in frame units
#: (``(tokens (n, d), weights (n,))``): the frame's push-forward of tokens or of a file
FRAMED_TOKENS = "_framed_tokens"
#: a fixed-box file enters the frame as this many points per cell and axis (each carrying
#: its share of the cell's mass), binned into the frame's cells (nearest grid point: the
#: frame's cell averages of the file's piecewise-constant density, to the points' spacing;
#: cloud-in-cell would add h^2 / 12 of variance per frame axis)
FILE_SUBPOINTS = 8


def framed_initial(table: dict, d: int, grid: Grid | None = None) -> tuple[AffineFrame, dict]:
    """For ``scheme.frame = "affine"``: the initial frame and the [initial] table of the law
    pushed forward to the frame, whose cell averages fill the xi grid (grid.lower /
    grid.upper are then in frame units). The frame is :meth:`AffineFrame.following` the
    law's mean and covariance (exact for gaussian, mixture and uniform; the tokens' own for
    tokens; the file's cell averages' for a fixed-box file; a co-moving-frame file's own
    frame at its snapshot). Every kind is accepted:

    * gaussian / mixture: a mixture with components ``L^-1 (mu_k - m)``, ``L^-1 C_k L^-T``
      (``grid``, the frame's grid: a mixture whose narrowest component would have fewer
      than COMPONENT_CELLS cells per standard deviation gets a smaller frame unit,
      :func:`~tpde.schemes.frame.mixture_frame`; a run with atoms passes no grid, its narrow
      components become atoms);
    * uniform: a box ``[lo, hi]`` has mean ``(lo + hi) / 2`` and covariance
      ``diag((hi - lo)^2 / 12)`` (L diagonal: the pushed box is ``[-sqrt 3, sqrt 3]^d``);
      a ball of radius r has covariance ``r^2 / (d + 2) I`` (pushed: radius ``sqrt(d + 2)``);
    * tokens: ``xi_i = L^-1 (x_i - m)``, deposited as the table says;
    * file: a frame file's density is already in frame units (same grid keys); a fixed-box
      file's cells enter as FILE_SUBPOINTS^d points per cell carrying its mass, pushed and
      deposited cloud-in-cell (mass exact, moments to O(h^2))."""
    kind = table.get("kind", "gaussian")
    raw: list[Any]  # weights, means and covariances as written (checked below)
    if kind == "gaussian":
        cov = table.get("covariance")
        raw = [[1.0], [table.get("mean", [0.0] * d)], [np.eye(d).tolist() if cov is None else cov]]
    elif kind == "mixture":
        raw = [table.get(k) for k in ("weights", "means", "covariances")]
        _density("mixture", table, Grid([-1.0] * d, [1.0] * d, [2] * d))  # the key checks
    elif kind == "uniform":
        return _framed_uniform(table, d)
    elif kind == "tokens":
        return _framed_tokens(table, d)
    elif kind == "file":
        return _framed_file(table, d)
    else:
        raise ConfigError(
            f"initial.kind: unknown {kind!r}; choose one of gaussian, mixture, uniform, "
            "tokens, file"
        )
    weights = _vector("initial.weights", raw[0])
    means = [_vector("initial.mean", m, d) for m in raw[1]]
    covs = [_matrix("initial.covariance", c, (d, d)) for c in raw[2]]
    for c in covs:
        _spd("initial.covariance", c)
    frame, xi_means, xi_covs = mixture_frame(weights, means, covs, grid)
    pushed = {k: v for k, v in table.items() if k not in ("mean", "covariance")}
    pushed.update(
        kind="mixture",
        weights=list(map(float, weights)),
        means=[m.tolist() for m in xi_means],
        covariances=[c.tolist() for c in xi_covs],
    )
    return frame, pushed


def _framed_uniform(table: dict, d: int) -> tuple[AffineFrame, dict]:
    """A uniform box or ball and its frame (closed-form moments, :func:`framed_initial`)."""
    if "radius" in table:
        center = _vector("initial.center", table.get("center", [0.0] * d), d)
        radius = _number("initial.radius", table["radius"], positive=True)
        frame, pushed = uniform_ball_frame(center, radius)
        return frame, {"kind": "uniform", "center": [0.0] * d, "radius": pushed}
    low = _vector("initial.lower", table.get("lower"), d)
    high = _vector("initial.upper", table.get("upper"), d)
    if not np.all(high > low):
        raise ConfigError(f"initial.upper: must exceed initial.lower, got {high} <= {low}")
    frame, half = uniform_box_frame(low, high)
    return frame, {"kind": "uniform", "lower": [-half] * d, "upper": [half] * d}


def _pushed_tokens(
    table: dict,
    points: np.ndarray,
    weights: np.ndarray,
    frame: AffineFrame | None = None,
    deposit: str | None = None,
) -> tuple[AffineFrame, dict]:
    """Weighted points (n, d), weights (n,) summing to 1: the frame following their mean and
    covariance (or ``frame``) and the table that deposits them in frame units (``deposit``,
    else initial.deposit, default cic)."""
    if frame is None:
        try:
            frame = points_frame(points, weights)
        except ValueError:
            raise ConfigError(
                "scheme.frame: the initial tokens' covariance is singular (they lie on a "
                'lower-dimensional set); the frame needs a spread law, or scheme.frame = "fixed"'
            ) from None
    deposit = deposit or table.get("deposit", "cic")
    return frame, {
        "kind": "tokens",
        "deposit": deposit,
        FRAMED_TOKENS: (to_frame(frame, points), weights),
    }


def _framed_tokens(table: dict, d: int) -> tuple[AffineFrame, dict]:
    from tpde.validation.particles import load_tokens

    path = table.get("file")
    if not isinstance(path, str):
        raise ConfigError("initial.file: missing (a .npy file of n x d tokens)")
    try:
        tokens = np.asarray(load_tokens(path, d), dtype=float).reshape(-1, d)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"initial.file: cannot read {path}: {exc}") from None
    _choice("initial.deposit", table.get("deposit", "cic"), ("ngp", "cic"))
    weights = np.full(tokens.shape[0], 1.0 / tokens.shape[0])
    return _pushed_tokens(table, tokens, weights)


def _output_file(table: dict) -> tuple[str, Any, Grid]:
    """``initial.file``: its path, the dataset and its grid (one line per bad input)."""
    from tpde.io import grid_from_dataset, read

    path = table.get("file")
    if not isinstance(path, str):
        raise ConfigError("initial.file: missing (a tpde NetCDF output)")
    if not os.path.isfile(path):
        raise ConfigError(f"initial.file: {path} does not exist (a tpde NetCDF output)")
    try:
        ds = read(path)
        source = grid_from_dataset(ds)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"initial.file: cannot read {path} as a tpde output: {str(exc).splitlines()[0]}"
        ) from None
    return path, ds, source


def _framed_file(table: dict, d: int) -> tuple[AffineFrame, dict]:
    """A tpde output as the frame's initial law (:func:`framed_initial`)."""
    path, ds, source = _output_file(table)
    if source.ndim != d or "s" in ds.dims:
        raise ConfigError(f"initial.file: {path} is not a {d}-D run without position slices")
    count = ds.sizes["time"]
    index = int(_number("initial.snapshot", table.get("snapshot", -1), integer=True))
    if not -count <= index < count:
        raise ConfigError(
            f"initial.snapshot: {index} is out of range; {path} holds {count} snapshots "
            f"(0 .. {count - 1}, or -1 for the last)"
        )
    if "frame_mean" in ds.variables:  # a frame run: its density is already in frame units
        frame = AffineFrame(
            np.asarray(ds["frame_mean"][index], dtype=float),
            np.asarray(ds["frame_matrix"][index], dtype=float),
        )
        return frame, dict(table)
    density = from_array(source, np.asarray(ds["density"][index]))
    mass, mean, cov = moments(density, source)
    if not mass > 0:
        raise ConfigError(f"initial.file: {path} holds no mass at snapshot {index}")
    # FILE_SUBPOINTS^d points per cell, each with its share of the cell's mass
    points, weights = cell_subpoints(source, density, FILE_SUBPOINTS)
    keep = weights > 0
    frame = AffineFrame.following(mean, cov)
    return _pushed_tokens(table, points[keep], weights[keep] / weights[keep].sum(), frame, "ngp")


def _spd(key: str, cov: np.ndarray) -> None:
    scale = float(np.abs(cov).max()) or 1.0  # eigenvalues of the scaled matrix: no overflow
    if (
        not np.allclose(cov / scale, cov.T / scale)
        or np.linalg.eigvalsh(0.5 * (cov + cov.T) / scale)[0] <= 0
    ):
        raise ConfigError(f"{key}: must be symmetric positive definite, got {_short(cov.tolist())}")


def _from_file(table: dict, grid: Grid) -> np.ndarray:
    path, ds, source = _output_file(table)
    if source.shape != grid.shape or not all(  # (axes of different lengths: one at a time)
        np.allclose(source.centres(a), grid.centres(a)) for a in range(grid.ndim)
    ):
        raise ConfigError(f"initial.file: {path} is on a different grid; use the same grid keys")
    if "s" in ds.dims:
        raise ConfigError(f"initial.file: {path} is a masked run (position slices); not supported")
    count = ds.sizes["time"]
    index = int(_number("initial.snapshot", table.get("snapshot", -1), integer=True))
    if not -count <= index < count:
        raise ConfigError(
            f"initial.snapshot: {index} is out of range; {path} holds {count} snapshots "
            f"(0 .. {count - 1}, or -1 for the last)"
        )
    return from_array(grid, np.asarray(ds["density"][index]))


#: entries of a kernel matrix times max |x|^2 over the box (of a value map times max |x|) stay
#: below this: far beyond any attention a grid resolves, far from float64 overflow (1.8e308)
MAGNITUDE_LIMIT = 1e100


def _not_for(key: str, name: str, variant: str, allowed) -> ConfigError:
    if name == "A" and "A" not in allowed and "Q" in allowed:
        return ConfigError(
            f"{key}.A: the {variant} variant takes {key}.Q and {key}.K, not A; give those"
        )
    return ConfigError(
        f"{key}.{name}: not used by the {variant} variant; remove it (its keys: "
        f"{', '.join(sorted(allowed))})"
    )


def _magnitude(key: str, matrix: np.ndarray, factor: float, what: str) -> None:
    largest = float(np.max(np.abs(matrix))) if matrix.size else 0.0
    if not largest * factor <= MAGNITUDE_LIMIT:
        raise ConfigError(
            f"{key}: entries up to {largest:.3g} give {what} up to {largest * factor:.3g} on "
            f"this box (limit {MAGNITUDE_LIMIT:.0e}); use moderate values"
        )


def _head(key: str, table: dict, variant: str, d: int, radius: float = 1.0):
    """One head of ``variant`` from its table; ``radius``: the largest |x| of the box."""
    allowed = variant_keys(variant)[1]
    for name in table:
        if name not in allowed and name not in LAYER_KEYS:
            if name in HEAD_KEYS:
                raise _not_for(key, name, variant, allowed)
            raise ConfigError(
                f"{key}.{name}: unknown key; expected one of {', '.join(sorted(allowed))}"
            )
    if "V" not in table:
        raise ConfigError(f"{key}.V: missing (the value matrix, {d} x {d})")
    scale = _number(f"{key}.scale", table.get("scale", 1.0))
    W = _matrix(f"{key}.W", table["W"]) if "W" in table else None
    V = _matrix(f"{key}.V", table["V"])
    _magnitude(f"{key}.V", V, radius, "velocities")
    if W is not None:
        _magnitude(f"{key}.W", W, radius * float(np.max(np.abs(V)) or 1.0), "velocities")
    kernel = radius * radius
    try:
        if variant == "l2":
            if "Q" not in table or "K" not in table:
                raise ConfigError(f"{key}.Q: the l2 variant needs Q and K (k x {d} each)")
            Q, K = _matrix(f"{key}.Q", table["Q"]), _matrix(f"{key}.K", table["K"])
            _magnitude(f"{key}.Q", Q, radius, "|Q x|")
            _magnitude(f"{key}.K", K, radius, "|K y|")
            _magnitude(f"{key}.scale", np.array([scale]), np.max(np.abs(Q)) * radius, "|scale Q x|")
            return L2Head(Q, K, V, scale, W)
        if "A" in table:
            A = _matrix(f"{key}.A", table["A"], (d, d))
        elif "Q" in table and "K" in table:
            Q = _matrix(f"{key}.Q", table["Q"])
            K = _matrix(f"{key}.K", table["K"], Q.shape)
            if Q.shape[1] != d:
                raise ConfigError(f"{key}.Q: expected k x {d}, got {Q.shape[0]} x {Q.shape[1]}")
            _magnitude(f"{key}.Q", Q, radius, "|Q x|")
            _magnitude(f"{key}.K", K, radius * float(np.max(np.abs(Q))), "<Q x, K y>")
            A = K.T @ Q
        else:
            raise ConfigError(f"{key}.A: missing (give A, or Q and K)")
        _magnitude(f"{key}.A", A, kernel, "exponents <A x, y>")
        _magnitude(
            f"{key}.scale", np.array([scale]), kernel * float(np.max(np.abs(A))), "exponents"
        )
        A = scale * A
        if variant == "sinkhorn":
            return SinkhornHead(
                A, V, W, _number(f"{key}.epsilon", table.get("epsilon", 1.0), positive=True)
            )
        if variant == "sigmoid":
            return SigmoidHead(A, V, W, _number(f"{key}.bias", table.get("bias", 0.0)))
        return Head(A, V, W)
    except ParameterError as exc:  # the head class names its field
        name = {field: k for k, field in HEAD_FIELD_NAMES.items()}.get(exc.field, exc.field)
        raise ConfigError(f"{key}.{name}: {exc.detail}") from None


def _params(key: str, table: dict, variant: str, d: int, radius: float = 1.0):
    heads = table.get("heads")
    if heads is not None:
        if not isinstance(heads, list) or not heads or not all(isinstance(h, dict) for h in heads):
            raise ConfigError(f"{key}.heads: expected [[{key}.heads]] tables")
        shared = {k: v for k, v in table.items() if k in ("scale", "epsilon", "bias")}
        return [
            _head(f"{key}.heads[{i}]", {**shared, **h}, variant, d, radius)
            for i, h in enumerate(heads)
        ]
    return _head(key, table, variant, d, radius)


def build_attention(table: dict, d: int, radius: float = 1.0):
    """(variant, params, velocity field) of the [attention] table; ``radius``: the largest
    |x| of the box (the matrices' magnitudes are checked against it)."""
    variant = _choice("attention.variant", table.get("variant", "softmax"), tuple(ATTENTION))
    option_keys, head_keys = variant_keys(variant)
    allowed = {"variant", "masked", "heads", "layers"} | option_keys | head_keys
    for name in table:
        if name not in allowed:
            raise _not_for("attention", name, variant, allowed)
    common = {k: v for k, v in table.items() if k in HEAD_KEYS or k == "heads"}
    layers = table.get("layers")
    if layers is not None:
        if not isinstance(layers, list) or not layers:
            raise ConfigError("attention.layers: expected [[attention.layers]] tables")
        items = []
        for i, layer in enumerate(layers):
            if not isinstance(layer, dict):
                raise ConfigError(
                    f"attention.layers[{i}]: expected a [[attention.layers]] table with "
                    f"t_start, got {_short(layer)}"
                )
            if "t_start" not in layer:
                raise ConfigError(f"attention.layers[{i}].t_start: missing")
            t_start = _number(f"attention.layers[{i}].t_start", layer["t_start"])
            merged = {**common, **{k: v for k, v in layer.items() if k != "t_start"}}
            items.append((t_start, _params(f"attention.layers[{i}]", merged, variant, d, radius)))
        try:
            params = Layers(items)
        except ValueError as exc:
            raise ConfigError(f"attention.{exc}") from None
    else:
        params = _params("attention", common, variant, d, radius)
    options: dict[str, Any] = {}
    for key in option_keys & set(table):
        value = table[key]
        if key == "engine":  # one vocabulary: tpde.variants.engines.registry
            try:
                options[key] = check_engine(value, "flat", variant)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        else:  # counts are integers >= 1; the variant checks the rest
            count = key != "tol"
            options[key] = _number(f"attention.{key}", value, positive=count, integer=count)
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
        if options.get("engine") == "fft":
            _check_fft(params)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc).splitlines()[0]) from None
    return variant, params, field_


def _check_fft(params) -> None:
    """The FFT engine's own check of every head of every layer (a symmetric A)."""
    from tpde.variants.engines.fft import FFTSoftmaxSums

    layers = params.params if isinstance(params, Layers) else [params]
    for layer in layers:
        for head in layer if isinstance(layer, list) else [layer]:
            FFTSoftmaxSums(head.A)


#: arrays of one density's size that a run holds at its peak, per dimension: measured peaks
#: of 2-D softmax runs (30 per cell at 1024^2, 32 at 512^2) and 3-D ones (74 at 48^3 and
#: 80^3), rounded up; the snapshots the solver keeps come on top
WORK_ARRAYS = {1: 32, 2: 36, 3: 84}


def memory_estimate(
    grid: Grid,
    positions: Positions | None,
    snapshots: int,
    nodes: int | None = None,
    heads: int = 1,
) -> dict[str, float]:
    """Bytes a run needs at its peak, by the key that sets each part: the time loop's work
    arrays (WORK_ARRAYS per cell), the snapshots the solver keeps, the kernel tables of a
    fixed ``attention.nodes`` (nodes^d values, d + 2 tables per head)."""
    d = grid.ndim
    cells = math.prod(grid.shape) * (1 if positions is None else positions.count)
    parts = {
        ("grid.positions" if positions is not None else "grid.cells"): 8.0 * cells * WORK_ARRAYS[d],
        "run.snapshots": 8.0 * (cells + 16) * snapshots,
    }
    if nodes is not None:
        parts["attention.nodes"] = 8.0 * float(nodes) ** d * (d + 2) * heads
    return parts


def check_resources(
    grid: Grid, positions: Positions | None, scheme: Scheme, run: dict, attention: dict
) -> None:
    """Before anything is allocated: the snapshot count (MAX_SNAPSHOTS), the steps a fixed
    ``dt`` (at least ``dt_max``) implies against ``Problem.max_steps``, and the memory of
    :func:`memory_estimate` against :func:`available_memory` (MEMORY_FRACTION)."""
    count = run["count"]
    if count > MAX_SNAPSHOTS:
        raise ConfigError(f"run.snapshots: {count} snapshots; at most {MAX_SNAPSHOTS}")
    span = run["t_end"] - run["t_start"]
    limit = Problem.max_steps
    for key in ("dt", "dt_max"):
        step = getattr(scheme, key)
        if step is not None and span > 0 and span / step > limit:
            raise ConfigError(
                f"scheme.{key}: {step:g} means {'at least ' if key == 'dt_max' else ''}"
                f"{span / step:.3g} steps from t = {run['t_start']:g} to {run['t_end']:g}; "
                f"the limit is {limit:.0e} steps: raise it or shorten run.t_end"
            )
    heads = max(1, max((len(h) for h in _all_heads(attention) if isinstance(h, list)), default=1))
    nodes = attention.get("nodes")
    parts = memory_estimate(
        grid, positions, count, nodes if isinstance(nodes, int) else None, heads
    )
    key = max(parts, key=lambda k: parts[k])
    shape = " x ".join(map(str, grid.shape))
    slices = "" if positions is None else f" x {positions.count} position slices"
    check_memory(
        key, sum(parts.values()), f"grid {shape}{slices}, {count} snapshots kept in memory"
    )


def _all_heads(attention: dict) -> list:
    heads = [attention.get("heads")]
    for layer in attention.get("layers") or []:
        if isinstance(layer, dict):
            heads.append(layer.get("heads"))
    return [h for h in heads if h is not None]


#: the geometries with a config module of their own: name -> (module, builder), read from
#: their registration (tpde.geometries; the builder returns a Config, the sphere's with its
#: own problem and session); "flat" is built here
GEOMETRY_BUILDERS: dict[str, tuple[str, str]] = {
    name: tuple(g.build.split(":"))  # type: ignore[misc]
    for name, g in geometries.GEOMETRIES.items()
    if g.build is not None
}


def build(source: str | Path | Mapping) -> Config:
    """Validate a configuration (path, TOML text or mapping) and build its Problem.

    Everything is checked before the initial density is allocated: keys (for the chosen
    variant), types, finiteness and magnitudes, then :func:`check_resources` (memory,
    snapshot count, steps); each failure is a one-line ConfigError naming the key."""
    raw = resolve_paths(load(source), _folder(source))
    name = geometries.of_config(raw)
    geometry = geometries.GEOMETRIES.get(name) if isinstance(name, str) else None
    if geometry is None:
        choices = ", ".join(geometries.GEOMETRIES)
        raise ConfigError(f"grid.geometry: unknown {name!r}; choose one of {choices}")
    if geometry.build is not None:  # its own module builds it (tpde.geometries)
        return geometries.load(geometry.build)(raw)
    check_keys(raw)
    for section in ("grid", "attention", "run"):
        if section not in raw:
            raise ConfigError(f"{section}: missing section [{section}]")
    grid = build_grid(raw["grid"])
    positions = build_positions(raw["grid"], raw["attention"])
    scheme = build_scheme(raw.get("scheme", {}))
    run = _run_settings(raw["run"])
    corners = np.maximum(np.abs(grid.lower), np.abs(grid.upper))
    radius = max(1.0, float(np.linalg.norm(corners)))
    variant, _, velocity = build_attention(raw["attention"], grid.ndim, radius)
    if positions is not None:
        velocity = CausalAttention(velocity)
    check_resources(grid, positions, scheme, run, raw["attention"])
    initial = raw.get("initial", {})
    frame = None
    if scheme.frame == "affine":
        # (with atoms, components narrower than the cells become atoms: the frame keeps the
        # whole law's units instead of shrinking them to the narrowest component's)
        frame, initial = framed_initial(initial, grid.ndim, None if "atoms" in raw else grid)
    atoms = _flat_atoms(raw["atoms"]) if "atoms" in raw else None
    density = build_initial(initial, grid, positions)
    problem = make_problem(grid, density, velocity, scheme, run, positions, frame, atoms)
    if atoms is not None:
        try:
            check_atom_run(problem)
        except ValueError as exc:
            raise ConfigError(str(exc).splitlines()[0]) from None
    return Config(problem, run["output"], variant, dumps(resolved(raw)), raw)


def _flat_atoms(table: Mapping) -> AtomOptions:
    """``[atoms]`` on the flat grid: Gaussian atoms in the co-moving frame or on a fixed box
    (docs/guide/atoms.md), the options checked here, what they need of the run by
    :func:`~tpde.schemes.atom_run.check_atom_run` once the problem is built."""
    try:
        options = AtomOptions(**{key: table[key] for key in table})
        options.validate()
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    return options


#: the keys that hold paths: a relative one is relative to the config file's folder
PATH_KEYS = (("initial", "file"),)


def _folder(source: str | Path | Mapping) -> Path | None:
    """The folder of a config file (``source`` as :func:`load` reads it), None for TOML
    text or a mapping (their relative paths are relative to the working directory)."""
    if isinstance(source, Mapping):
        return None
    text = str(source)
    path = Path(text)
    if "\n" not in text and (path.suffix == ".toml" or path.exists()):
        return path.parent
    return None


def resolve_paths(raw: dict, folder: str | Path | None) -> dict:
    """Make the relative paths of ``raw`` (:data:`PATH_KEYS`: ``initial.file``) absolute:
    relative to ``folder`` (the config file's), or to the working directory when None, so a
    config means the same file wherever it is run from, and the config stored in an output
    names it. Changes ``raw`` in place and returns it."""
    base = Path(folder) if folder is not None else Path.cwd()
    for section, key in PATH_KEYS:
        table = raw.get(section)
        if not isinstance(table, dict):
            continue
        value = table.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            table[key] = os.path.abspath(base / value)
    return raw


def same_config(stored: str, other: str | Mapping | Config) -> bool:
    """Whether a file's stored config text has the values of ``other`` (a config's text, a
    raw mapping or a built :class:`Config`) on any geometry, defaults filled in on both
    sides (:func:`tpde.config_core.same_config` with :func:`build`): what ``--resume`` and
    the sweep's reruns ask."""
    return core_same_config(stored, other, build)
