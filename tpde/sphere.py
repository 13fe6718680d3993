"""Configurations on the sphere S^2: ``[grid] geometry = "sphere"`` (the cubed sphere).

docs/theory.md, 'The cubed sphere', 'General attention on the sphere' and 'Tokens on the
sphere'; docs/user-guide.md, 'The sphere'. :func:`build_sphere` turns the raw tables of a
sphere configuration into a :class:`SphereConfig`; ``tpde run`` (:func:`tpde.run.run_config`)
hands it to :func:`run_sphere`, which runs :func:`tpde.schemes.cubed_sphere.solve` and writes
a CF-1.10 NetCDF file that ParaView and xarray read on a globe: ``density (time, panel, j, i)``
per unit area (cell averages; ``i`` along the panel's first local angle, fastest) with the
auxiliary coordinates ``lat``, ``lon`` (cell centres, degrees_north / degrees_east) and their
cell bounds ``lat_bounds``, ``lon_bounds`` (the 4 corners), ``cell_area`` (steradians),
``mass (time)``, ``mean_vector (time, xyz)``, ``second_moment (time, xyz, xyz2)``; the file
says ``geometry = "sphere"``. ``tpde info``, ``tpde plot`` and ``tpde particles`` know it.

Keys::

    [grid]       geometry = "sphere", cells (per panel edge, >= 6; 6 cells^2 in all)
    [initial]    kind = "uniform" (optional modes = [[l, amplitude], ...] of zonal P_l about
                 axis, default [0, 0, 1]), "noise" (amplitude, l_max, seed),
                 "von_mises_fisher" (mean, kappa), "mixture" (weights, means, kappas)
    [attention]  variant = "softmax"; beta (A = beta I, V = I) or A, V (3 x 3);
                 normalised (default true); nodes (Gauss nodes a cell axis, default 3)
    [scheme]     reconstruction (weno5z), integrator (ssprk3), cfl (0.5), dt_max,
                 limiter (true), velocity_at ("nodes" | "centres")
    [run]        t_end, snapshots (a count or a list of times), output
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time as _time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tpde.grid import cubed_sphere as cs
from tpde.variants.cubed_sphere import CubedSphereAttention

from .config import ConfigError, _number, dumps

__all__ = [
    "SphereConfig",
    "build_sphere",
    "is_sphere_file",
    "particle_reference",
    "run_sphere",
    "sphere_dataset",
    "sphere_info",
    "write_dataset",
]

KEYS = {
    "grid": {"geometry", "cells"},
    "initial": {"kind", "modes", "axis", "amplitude", "l_max", "seed", "mean", "kappa"}
    | {"weights", "means", "kappas"},
    "attention": {"variant", "beta", "A", "V", "normalised", "nodes"},
    "scheme": {"reconstruction", "integrator", "cfl", "dt_max", "limiter", "velocity_at"},
    "run": {"t_end", "snapshots", "output"},
}
INITIAL_KINDS = ("uniform", "noise", "von_mises_fisher", "mixture")
RECONSTRUCTIONS = ("upwind", "muscl", "weno5", "weno5z")
INTEGRATORS = ("euler", "ssprk2", "ssprk3")
VELOCITY_AT = ("nodes", "centres")
MAX_CELLS = 256


@dataclass
class SphereConfig:
    """A validated sphere configuration: grid, initial density, attention, scheme, run."""

    grid: cs.CubedSphere
    density: np.ndarray
    field: CubedSphereAttention
    scheme: dict
    times: np.ndarray
    output: str | None
    text: str
    raw: dict
    initial: dict = dataclasses.field(default_factory=dict)
    variant: str = "sphere"
    geometry: str = "sphere"

    @property
    def t_end(self) -> float:
        return float(self.times[-1])


def _numbers(key: str, value: Any, count: int | None = None) -> list[float]:
    if not isinstance(value, list) or (count is not None and len(value) != count):
        what = f"a list of {count} numbers" if count is not None else "a list of numbers"
        raise ConfigError(f"{key}: expected {what}, got {value!r:.60}")
    return [_number(f"{key}[{i}]", v) for i, v in enumerate(value)]


def _matrix(key: str, value: Any) -> np.ndarray:
    if not (isinstance(value, list) and len(value) == 3):
        raise ConfigError(f"{key}: expected a 3 x 3 matrix [[..3..], [..3..], [..3..]]")
    return np.array([_numbers(f"{key}[{i}]", row, 3) for i, row in enumerate(value)])


def _vector(key: str, value: Any) -> list[float]:
    v = _numbers(key, value, 3)
    if not math.hypot(*v) > 0:
        raise ConfigError(f"{key}: expected a non-zero 3-vector, got {value!r:.60}")
    return v


def _check_keys(raw: Mapping) -> None:
    for section, table in raw.items():
        if section not in KEYS:
            raise ConfigError(
                f"{section}: not a section of the sphere geometry; choose from {', '.join(KEYS)}"
            )
        if not isinstance(table, Mapping):
            raise ConfigError(f"{section}: expected a [{section}] table")
        for key in table:
            if key not in KEYS[section]:
                raise ConfigError(
                    f"{section}.{key}: not a key of the sphere geometry; "
                    f"choose from {', '.join(sorted(KEYS[section]))}"
                )
    for section in ("grid", "attention", "run"):
        if section not in raw:
            raise ConfigError(f"{section}: missing section [{section}]")


def _grid(table: Mapping) -> cs.CubedSphere:
    if "cells" not in table:
        raise ConfigError("grid.cells: missing (cells per panel edge of the cubed sphere, >= 6)")
    cells = int(_number("grid.cells", table["cells"], positive=True, integer=True))
    if not 6 <= cells <= MAX_CELLS:
        raise ConfigError(
            f"grid.cells: expected 6 .. {MAX_CELLS} cells per panel edge, got {cells}"
        )
    return cs.cubed_sphere(cells)


def _initial(table: Mapping, grid: cs.CubedSphere) -> np.ndarray:
    kind = table.get("kind", "uniform")
    if kind not in INITIAL_KINDS:
        raise ConfigError(
            f"initial.kind: unknown {kind!r} on the sphere; choose one of "
            f"{', '.join(INITIAL_KINDS)}"
        )
    try:
        if kind == "uniform":
            modes = table.get("modes", [])
            if not isinstance(modes, list):
                raise ConfigError("initial.modes: expected [[l, amplitude], ...]")
            axis = _vector("initial.axis", table.get("axis", [0.0, 0.0, 1.0]))
            density = np.full(grid.shape, 1.0 / cs.FOUR_PI)
            for i, mode in enumerate(modes):
                l, amplitude = _numbers(f"initial.modes[{i}]", mode, 2)
                if int(l) != l or l < 1:
                    raise ConfigError(f"initial.modes[{i}]: the degree l must be an integer >= 1")
                density += cs.harmonic_mode(grid, int(l), amplitude, axis) - 1.0 / cs.FOUR_PI
            if density.min() < 0:
                raise ConfigError(
                    "initial.modes: the density would be negative; lower the amplitudes"
                )
            return density
        if kind == "noise":
            return cs.noise(
                grid,
                _number("initial.amplitude", table.get("amplitude", 1e-3)),
                int(_number("initial.l_max", table.get("l_max", 8), True, True)),
                int(_number("initial.seed", table.get("seed", 0), integer=True)),
            )
        if kind == "von_mises_fisher":
            return cs.von_mises_fisher(
                grid,
                _vector("initial.mean", table.get("mean", [0.0, 0.0, 1.0])),
                _number("initial.kappa", table.get("kappa", 1.0), positive=True),
            )
        return cs.mixture(grid, _components(table))
    except ConfigError:
        raise
    except ValueError as exc:
        message = str(exc).splitlines()[0]
        raise ConfigError(
            message if message.startswith("initial") else f"initial: {message}"
        ) from None


def _components(table: Mapping) -> list[tuple[float, list[float], float]]:
    for key in ("weights", "means", "kappas"):
        if key not in table:
            raise ConfigError(f"initial.{key}: missing for kind = 'mixture'")
    weights = _numbers("initial.weights", table["weights"])
    means = table["means"]
    if not isinstance(means, list) or len(means) != len(weights):
        raise ConfigError(f"initial.means: expected {len(weights)} 3-vectors, one per weight")
    kappas = _numbers("initial.kappas", table["kappas"], len(weights))
    if min(weights, default=0.0) <= 0:
        raise ConfigError(f"initial.weights: must be > 0, got {weights}")
    if min(kappas) <= 0:
        raise ConfigError(f"initial.kappas: must be > 0, got {kappas}")
    total = sum(weights)
    return [
        (w / total, _vector(f"initial.means[{i}]", m), k)
        for i, (w, m, k) in enumerate(zip(weights, means, kappas, strict=True))
    ]


def _attention(table: Mapping) -> CubedSphereAttention:
    variant = table.get("variant", "softmax")
    if variant != "softmax":
        raise ConfigError(
            f"attention.variant: the sphere has softmax attention (normalised = false for "
            f"the unnormalised one), got {variant!r}"
        )
    normalised = table.get("normalised", True)
    if not isinstance(normalised, bool):
        raise ConfigError(f"attention.normalised: expected true or false, got {normalised!r}")
    nodes = int(_number("attention.nodes", table.get("nodes", 3), True, True))
    if not 2 <= nodes <= 5:
        raise ConfigError(f"attention.nodes: expected 2 .. 5 Gauss nodes a cell axis, got {nodes}")
    if "beta" in table:
        for key in ("A", "V"):
            if key in table:
                raise ConfigError(f"attention.{key}: give beta (A = beta I, V = I) or A and V")
        beta = _number("attention.beta", table["beta"], positive=True)
        kwargs: dict[str, Any] = {"beta": beta}
    else:
        if "A" not in table:
            raise ConfigError("attention.beta: missing (A = beta I), or give attention.A")
        kwargs = {"A": _matrix("attention.A", table["A"])}
        if "V" in table:
            kwargs["V"] = _matrix("attention.V", table["V"])
    try:
        return CubedSphereAttention(
            nodes=nodes, cache_entries=60_000_000, normalised=normalised, **kwargs
        )
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{key}: unknown {value!r}; choose one of {', '.join(choices)}")
    return str(value)


def _scheme(table: Mapping) -> dict:
    cfl = _number("scheme.cfl", table.get("cfl", 0.5), positive=True)
    if cfl > 1:
        raise ConfigError(f"scheme.cfl: expected 0 < cfl <= 1, got {cfl}")
    dt_max = table.get("dt_max")
    limiter = table.get("limiter", True)
    if not isinstance(limiter, bool):
        raise ConfigError(f"scheme.limiter: expected true or false, got {limiter!r}")
    return {
        "reconstruction": _choice(
            "scheme.reconstruction", table.get("reconstruction", "weno5z"), RECONSTRUCTIONS
        ),
        "integrator": _choice("scheme.integrator", table.get("integrator", "ssprk3"), INTEGRATORS),
        "cfl": cfl,
        "dt_max": None if dt_max is None else _number("scheme.dt_max", dt_max, positive=True),
        "limiter": limiter,
        "velocity_at": _choice(
            "scheme.velocity_at", table.get("velocity_at", "nodes"), VELOCITY_AT
        ),
    }


def _times(table: Mapping) -> np.ndarray:
    if "t_end" not in table:
        raise ConfigError("run.t_end: missing (the final time, > 0)")
    t_end = _number("run.t_end", table["t_end"], positive=True)
    snapshots = table.get("snapshots", 41)
    if isinstance(snapshots, list):
        times = np.array(_numbers("run.snapshots", snapshots))
        if times.size < 2 or times[0] != 0 or np.any(np.diff(times) <= 0) or times[-1] > t_end:
            raise ConfigError("run.snapshots: expected increasing times from 0 up to run.t_end")
        return times if times[-1] == t_end else np.append(times, t_end)
    count = int(_number("run.snapshots", snapshots, True, True))
    if not 2 <= count <= 10_000:
        raise ConfigError(f"run.snapshots: expected 2 .. 10000 snapshots, got {count}")
    return np.linspace(0.0, t_end, count)


def build_sphere(raw: dict) -> SphereConfig:
    """The :class:`SphereConfig` of a sphere configuration (raw TOML tables)."""
    _check_keys(raw)
    grid = _grid(raw["grid"])
    attention = _attention(raw["attention"])
    scheme = _scheme(raw.get("scheme", {}))
    times = _times(raw["run"])
    output = raw["run"].get("output", "out.nc")
    if output is not None and not isinstance(output, str):
        raise ConfigError(f"run.output: expected a file name, got {output!r:.60}")
    initial = dict(raw.get("initial", {}))
    density = _initial(initial, grid)
    stored = {section: dict(table) for section, table in raw.items()}
    stored["attention"].setdefault("normalised", True)
    stored["attention"].setdefault("nodes", attention.nodes)
    stored.setdefault("scheme", {})
    for key, value in scheme.items():
        if value is not None:
            stored["scheme"].setdefault(key, value)
    return SphereConfig(
        grid, density, attention, scheme, times, output, dumps(stored), raw, initial
    )


# ---- the file ---------------------------------------------------------------------------------
def _to_file(density: np.ndarray) -> np.ndarray:
    """``(..., 6, n, n)`` indexed ``[p, i, j]`` -> the file's ``(..., panel, j, i)``."""
    return np.swapaxes(np.asarray(density, float), -1, -2)


def from_file(density: np.ndarray) -> np.ndarray:
    """The file's ``(..., panel, j, i)`` -> tpde's ``(..., 6, n, n)`` indexed ``[p, i, j]``."""
    return np.swapaxes(np.asarray(density, float), -1, -2)


def sphere_dataset(
    grid: cs.CubedSphere,
    times: np.ndarray,
    densities: list[np.ndarray] | np.ndarray,
    text: str,
    title: str,
    what: str = "density",
) -> xr.Dataset:
    """The CF dataset of densities on the cubed sphere (module docstring)."""
    from tpde import __version__

    geo = cs.cell_geography(grid)
    dims = ("panel", "j", "i")
    rho = np.asarray(densities, float).reshape(-1, *grid.shape)
    means = np.array([cs.mean(grid, d) for d in rho]).reshape(-1, 3)
    seconds = np.array([cs.second_moment(grid, d) for d in rho]).reshape(-1, 3, 3)
    point = {"units": "1", "cell_methods": "time: point"}
    ds = xr.Dataset(
        {
            "density": (
                ("time", *dims),
                _to_file(rho),
                {
                    "long_name": f"{what} per unit area on the sphere (cell averages)",
                    "units": "1",
                    "coordinates": "lat lon",
                    "cell_measures": "area: cell_area",
                    "cell_methods": "time: point area: mean",
                },
            ),
            "cell_area": (
                dims,
                _to_file(grid.areas),
                {
                    "long_name": "cell area on the unit sphere",
                    "standard_name": "cell_area",
                    "units": "sr",
                },
            ),
            "mass": (
                ("time",),
                np.array([grid.integrate(d) for d in rho]),
                {"long_name": "mass", **point},
            ),
            "mean_vector": (
                ("time", "xyz"),
                means,
                {"long_name": "mean vector int x rho dA", **point},
            ),
            "second_moment": (
                ("time", "xyz", "xyz2"),
                seconds,
                {"long_name": "second moment int x x^T rho dA", **point},
            ),
        },
        coords={
            "time": (
                "time",
                np.asarray(times, float),
                {
                    "standard_name": "time",
                    "axis": "T",
                    "units": "1",
                    "long_name": "layer depth (Transformer time)",
                },
            ),
            "panel": ("panel", np.arange(6, dtype=np.int32), {"long_name": "cubed-sphere panel"}),
            "j": (
                "j",
                np.arange(grid.n, dtype=np.int32),
                {"long_name": "cell index along the panel's second local angle"},
            ),
            "i": (
                "i",
                np.arange(grid.n, dtype=np.int32),
                {"long_name": "cell index along the panel's first local angle"},
            ),
            "lat": (
                dims,
                geo["lat"],
                {
                    "standard_name": "latitude",
                    "long_name": "latitude of the cell centre",
                    "units": "degrees_north",
                    "bounds": "lat_bounds",
                },
            ),
            "lon": (
                dims,
                geo["lon"],
                {
                    "standard_name": "longitude",
                    "long_name": "longitude of the cell centre",
                    "units": "degrees_east",
                    "bounds": "lon_bounds",
                },
            ),
            "xyz": ("xyz", np.array(["x", "y", "z"]), {"long_name": "Cartesian component"}),
            "xyz2": ("xyz2", np.array(["x", "y", "z"]), {"long_name": "Cartesian component"}),
        },
    )
    ds["lat_bounds"] = ((*dims, "nv"), geo["lat_bounds"], {"units": "degrees_north"})
    ds["lon_bounds"] = ((*dims, "nv"), geo["lon_bounds"], {"units": "degrees_east"})
    ds = ds.set_coords(["lat_bounds", "lon_bounds"])
    ds.attrs = {
        "Conventions": "CF-1.10",
        "title": title,
        "geometry": "sphere",
        "grid": "equiangular gnomonic cubed sphere (docs/theory.md, 'The cubed sphere')",
        "cells": int(grid.n),
        "source": f"tpde {__version__}",
        "tpde_version": __version__,
        "config": text,
    }
    return ds


def write_dataset(ds: xr.Dataset, path: str | Path) -> None:
    """Write ``ds`` to ``path`` (staged to a hidden name, then renamed): no ``_FillValue`` on
    coordinates and bounds, text as fixed-length characters."""
    path = Path(path)
    encoding: dict[str, dict[str, Any]] = {}
    for name, var in ds.variables.items():
        if var.dtype.kind in "fc" and (name in ds.coords or str(name).endswith("_bounds")):
            encoding[str(name)] = {"_FillValue": None}
        elif var.dtype.kind == "U":
            encoding[str(name)] = {"dtype": "S1"}
    staged = path.with_name(f".{path.name}.tmp")
    ds.to_netcdf(staged, engine="netcdf4", encoding=encoding)
    os.replace(staged, path)


def is_sphere_file(path: str | Path) -> bool:
    """Whether ``path`` is a NetCDF file of a sphere run or reference (its attributes say so)."""
    import netCDF4

    try:
        with netCDF4.Dataset(path) as nc:
            return getattr(nc, "geometry", "") == "sphere"
    except OSError:
        return False


# ---- running ---------------------------------------------------------------------------------
def run_sphere(
    config: SphereConfig,
    output: str | Path,
    overwrite: bool = False,
    resume: bool = False,
    quiet: bool = True,
    history: str = "",
) -> Path:
    """Run a sphere configuration and write its NetCDF file (module docstring). The file is
    written when the run ends (completed; interrupted or failed: the snapshots reached, status
    ``interrupted`` / ``error``); not resumable."""
    from tpde.schemes.cubed_sphere import solve

    from .run import Interrupted, _Signals, error_line

    output = Path(output)
    if resume:
        raise ConfigError(
            "run: --resume is not available on the sphere; run again with --overwrite"
        )
    if output.exists() and not overwrite:
        raise ConfigError(f"run.output: {output} exists; pass --overwrite to replace it")
    if not output.parent.exists():
        raise ConfigError(
            f"run.output: cannot write {output}: directory {output.parent} does not exist"
        )
    times: list[float] = []
    densities: list[np.ndarray] = []
    start = _time.perf_counter()
    steps = [0]

    def on_snapshot(t: float, density: np.ndarray, count: int) -> None:
        times.append(t)
        densities.append(density.copy())
        steps[0] = count
        if not quiet:
            print(
                f"t = {t:.4g}/{config.t_end:.4g}  steps {count}  min rho {density.min():.1e}  "
                f"mass {config.grid.integrate(density):.15f}  {_time.perf_counter() - start:.1f} s",
                file=sys.stderr,
            )

    status, message = "error", "the run did not start"
    try:
        with _Signals():
            solve(
                config.grid,
                config.density,
                config.field,
                config.t_end,
                snapshots=config.times,
                on_snapshot=on_snapshot,
                **config.scheme,
            )
        status, message = "completed", ""
    except KeyboardInterrupt as exc:
        name = exc.name if isinstance(exc, Interrupted) else "SIGINT"
        status, message = "interrupted", f"interrupted by {name}; run again to continue"
        raise
    except BaseException as exc:
        status, message = "error", error_line(exc)
        raise
    finally:
        if densities:
            ds = sphere_dataset(
                config.grid, np.array(times), densities, config.text, "tpde run on the sphere"
            )
            ds.attrs.update(
                status=status,
                status_time=float(times[-1]),
                status_message=message,
                steps=int(steps[0]),
                wall_time=_time.perf_counter() - start,
                history=history,
            )
            write_dataset(ds, output)
    return output


def particle_reference(
    config: SphereConfig, n: int, seed: int = 0, dt: float | None = None
) -> xr.Dataset:
    """``n`` tokens from the initial law moved by the CF4 token system
    (:mod:`tpde.validation.s2_tokens`), at the run's snapshot times: ``tokens (time, token,
    xyz)``, their histogram ``density`` on the run's cells, mass and moments of all tokens.
    vMF and mixture starts are sampled exactly; other kinds from the cell averages."""
    from tpde.validation.s2_tokens import (
        SphereTokens,
        sample_cell_tokens,
        sample_mixture,
        sample_von_mises_fisher,
        token_moments,
    )

    if n < 1:
        raise ConfigError(f"--tokens: expected an integer >= 1, got {n}")
    kind = config.initial.get("kind", "uniform")
    if kind == "von_mises_fisher":
        x0 = sample_von_mises_fisher(
            n,
            config.initial.get("mean", [0.0, 0.0, 1.0]),
            float(config.initial.get("kappa", 1.0)),
            seed,
        )
    elif kind == "mixture":
        x0 = sample_mixture(n, _components(config.initial), seed)
    else:
        x0 = sample_cell_tokens(config.density, config.grid, n, seed)
    field = config.field
    step = dt or float(np.min(np.diff(config.times))) / 10
    start = _time.perf_counter()
    system = SphereTokens(x0, field.A, field.V, normalised=field.normalised)
    path = system.integrate(config.times, step)
    grid = config.grid
    p, a, b = cs.to_panel(path)
    i = np.clip(((a + cs.QUARTER) / grid.h).astype(int), 0, grid.n - 1)
    j = np.clip(((b + cs.QUARTER) / grid.h).astype(int), 0, grid.n - 1)
    flat = (p * grid.n + i) * grid.n + j
    density = np.stack(
        [
            np.bincount(f, minlength=6 * grid.n**2).reshape(grid.shape) / (n * grid.areas)
            for f in flat
        ]
    )
    ds = sphere_dataset(
        grid,
        config.times,
        density,
        config.text,
        f"tpde tokens on the sphere, n = {n}",
        "token histogram",
    )
    mean, second = token_moments(path)
    ds["mean_vector"].values[:] = mean
    ds["second_moment"].values[:] = second
    ds["mass"].values[:] = 1.0
    ds["tokens"] = (
        ("time", "token", "xyz"),
        path,
        {"long_name": "token positions on the unit sphere", "units": "1"},
    )
    ds.attrs.update(
        status="completed",
        status_time=float(config.times[-1]),
        status_message="",
        seed=int(seed),
        dt=step,
        steps=int(system.evaluations // 4),
        wall_time=_time.perf_counter() - start,
    )
    return ds


def sphere_info(path: str | Path) -> list[str]:
    """The lines ``tpde info`` prints for a sphere file."""
    with xr.open_dataset(path) as opened:
        ds = opened.load()
    n = int(ds.sizes["i"])
    times = ds["time"].values
    what = "token system" if "tokens" in ds else "grid run"
    lines = [
        f"{path}: {what} on the sphere, cubed sphere {n} x {n} cells x 6 panels ({6 * n * n} cells)"
    ]
    if "tokens" in ds:
        lines.append(f"  tokens: {ds.sizes['token']} (seed {ds.attrs.get('seed', '?')})")
    if times.size:
        lines.append(f"  snapshots: {times.size}, t = {times[0]:.6g} .. {times[-1]:.6g}")
    status = " ".join(str(ds.attrs.get("status", "?")).split())[:40]
    message = " ".join(str(ds.attrs.get("status_message", "")).split())[:300]
    when = float(ds.attrs.get("status_time", float("nan")))
    lines.append(f"  status: {status} at t = {when:.6g}: {message}")
    if times.size:
        m = ds["mean_vector"].values[-1]
        lines.append(
            f"  mass {float(ds['mass'][-1]):.15g}; mean vector ({m[0]:.6g}, {m[1]:.6g}, {m[2]:.6g})"
        )
        grid = cs.cubed_sphere(n)
        centres, masses = cs.clusters(grid, from_file(ds["density"].values[-1]))
        lines.append(f"  clusters at the last snapshot (> 2x uniform): {len(masses)}")
        for x, mass in list(zip(centres, masses, strict=True))[:12]:
            lat, lon = cs.lat_lon(x)
            lines.append(f"    lat {float(lat):7.2f}  lon {float(lon):8.2f}  mass {mass:.4f}")
    wall = float(ds.attrs.get("wall_time", float("nan")))
    source = ds.attrs.get("source", "tpde ?")
    steps = ds.attrs.get("steps", "?")
    lines.append(f"  written by {source}, steps {steps}, wall time {wall:.3g} s")
    lines.append("  config:\n    " + str(ds.attrs.get("config", "")).replace("\n", "\n    "))
    return lines
