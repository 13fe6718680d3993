"""``tpde gaussian`` and ``tpde particles``: the references of a configuration, alone.

Both read the same TOML as ``tpde run`` and write NetCDF in the run's layout and with its
names (:mod:`tpde.io`): ``time``, the grid coordinates, ``density(time, [z,] [y,] x)`` on the
run's grid, ``mass(time)``, ``mean_position(time, dim)``, ``covariance(time, dim, dim2)`` and
the run's global attributes (``config``, ``status``, ``grid_*``), so ``tpde info``, ``tpde
plot``, ``tpde compare``, ParaView and xarray read the three files alike:

* ``gaussian_reference(config)``: the mean/covariance ODEs (docs/theory.md, 'Gaussian
  closures') from the Gaussian initial data (variants with a Gaussian closure only);
  ``status`` is ``blowup`` with its time when the covariance blows up, and the records stop
  at the last snapshot time before it. ``density`` is the exact cell averages of the
  Gaussian N(mean, covariance) of unit mass.
* ``particle_reference(config, n, seed)``: n i.i.d. tokens sampled from the initial density,
  moved by the token system (docs/theory.md, 'The Transformer PDE'; SSP-RK3 with the run's
  snapshot times), stored as ``tokens(time, token, dim)``; ``density`` is their histogram on
  the run's grid (token weights per cell over the cell volume; tokens outside the box are
  not counted in it or in ``mass``), the moments are those of all tokens. Masked runs:
  n // (positions + 1) tokens per position slice (``token_position(token)``,
  ``token_weight(token)``), moved by the masked system, ``density(time, s, ...)`` one
  histogram per slice, as in the run.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import xarray as xr

from tpde.schemes.solver import Problem

from . import io
from .config_core import Config, ConfigError, check_memory

__all__ = ["gaussian_reference", "particle_reference", "write_reference"]

AXES = ("x", "y", "z")


def reference_dataset(
    times, means, covs, density, config: Config[Problem], title: str, what: str, positions=None
) -> xr.Dataset:
    """A reference in the run's layout: the grid's coordinates (:func:`tpde.io.coordinates`),
    ``density`` (times, [S,] *grid.shape) with its mass, the moments, the run's global
    attributes."""
    grid = config.problem.grid
    times = np.asarray(times, dtype=float)
    dims = ("time", *(() if positions is None else ("s",)), *grid.axis_names)
    cells = np.asarray(density, dtype=float)
    mass = cells.reshape(times.size, -1).sum(axis=1) * grid.cell_volume
    point = {"units": "1", "cell_methods": "time: point"}
    ds = io.coordinates(grid, positions).assign(
        density=(
            dims,
            cells,
            {
                "long_name": f"density of the {what} (cell averages)",
                "units": "1",
                "cell_methods": "time: point "
                + " ".join(f"{a}:" for a in grid.axis_names)
                + " mean",
            },
        ),
        mass=(("time",), mass, {"long_name": f"mass of the {what} in the box", **point}),
        mean_position=(
            ("time", "dim"),
            np.asarray(means, dtype=float).reshape(times.size, grid.ndim),
            {"long_name": f"mean position of the {what}", **point},
        ),
        covariance=(
            ("time", "dim", "dim2"),
            np.asarray(covs, dtype=float).reshape(times.size, grid.ndim, grid.ndim),
            {"long_name": f"covariance of the {what}", **point},
        ),
    )
    ds = ds.assign_coords(time=("time", times, dict(io.TIME_ATTRIBUTES)))
    name, measure = io.cell_measure(grid, positions)  # ParaView's default: the density's
    ds[name] = measure
    ds.attrs = io.global_attributes(grid, config.text, title, "", positions)
    return ds


def gaussian_reference(config: Config[Problem]) -> xr.Dataset:
    """The Gaussian mean/covariance ODE solution at the run's snapshot times."""
    from tpde.grid import gaussian
    from tpde.validation.gaussian import VARIANTS, solve

    if config.no_gaussian is not None:
        raise ConfigError(config.no_gaussian)
    initial = config.raw.get("initial", {})
    if initial.get("kind", "gaussian") != "gaussian":
        raise ConfigError(
            "initial.kind: tpde gaussian needs Gaussian initial data (kind = 'gaussian')"
        )
    if "mean_drift" in initial:
        raise ConfigError(
            "initial.mean_drift: position-dependent data have no Gaussian "
            "closure; tpde gaussian needs the same Gaussian at every position "
            "(then every slice follows the ODEs: docs/theory.md, 'Masked attention')"
        )
    if config.variant not in VARIANTS:
        raise ConfigError(
            f"attention.variant: {config.variant!r} has no Gaussian closure; "
            f"tpde gaussian supports {', '.join(VARIANTS)}"
        )
    problem = config.problem
    d = problem.grid.ndim
    mean0 = np.asarray(initial.get("mean", [0.0] * d), float)
    cov0 = np.asarray(initial.get("covariance", np.eye(d)), float)
    start = time.perf_counter()
    solution = solve(
        config.variant, mean0, cov0, problem.velocity.spec, problem.t_end, t0=problem.t_start
    )
    times = problem.times[problem.times <= solution.status_time]
    means, covs = solution.at(times)
    grid = problem.grid
    density = np.stack([gaussian(grid, m, c) for m, c in zip(means, covs, strict=True)])
    ds = reference_dataset(
        times, means, covs, density, config, "tpde Gaussian ODE reference", "Gaussian"
    )
    ds.attrs.update(
        status=solution.status,
        status_time=float(solution.status_time),
        status_message=solution.message,
        wall_time=time.perf_counter() - start,
    )
    return ds


def particle_reference(
    config: Config[Problem], n: int, seed: int = 0, dt: float | None = None, quantiles: bool = False
) -> xr.Dataset:
    """n tokens of the initial density, moved by the token system: i.i.d. samples (``seed``)
    or, in 1-D and on the circle, the deterministic mid-quantiles (``quantiles``: the mean
    field without sampling noise). A geometry with tokens of its own (the circle) makes
    them (``config.particles``)."""
    if config.particles is not None:
        return config.particles(n, seed, quantiles)
    from tpde.grid.threads import ensure_policy
    from tpde.validation.particles import (
        TokenSystem,
        quantile_tokens_of_cells,
        sample_sliced_tokens,
        sample_tokens,
        simulate,
        token_histograms,
    )

    if n < 1:
        raise ConfigError(f"--tokens: expected an integer >= 1, got {n}")
    problem = config.problem
    # positions at every snapshot, plus the working copies and blocked kernel sums
    d, snapshots = problem.grid.ndim, len(problem.times)
    check_memory(
        "--tokens", 8.0 * n * (d * (snapshots + 16) + 1024), f"{n} tokens, {snapshots} times"
    )
    positions, token_s, weights = problem.positions, None, None
    if quantiles and (positions is not None or problem.grid.ndim != 1):
        raise ConfigError(
            "--quantiles: mid-quantile tokens are defined in 1-D and on the circle; "
            "drop --quantiles for i.i.d. tokens"
        )
    if quantiles:
        tokens = quantile_tokens_of_cells(problem.density, problem.grid, n)
    elif positions is None:
        tokens = sample_tokens(problem.density, problem.grid, n, seed)
    else:
        if n < positions.count:
            raise ConfigError(
                f"--tokens: a masked run needs at least one token per position "
                f"slice ({positions.count}), got {n}"
            )
        tokens, token_s, weights = sample_sliced_tokens(
            problem.density, problem.grid, positions, n // positions.count, seed
        )
    step = dt or float(np.min(np.diff(problem.times))) / 10
    start = time.perf_counter()
    solution = simulate(
        TokenSystem(config.variant, problem.velocity.spec, positions=token_s),
        tokens,
        problem.t_end,
        step,
        weights=weights,
        times=list(problem.times),
        method="ssprk3",
        t_start=problem.t_start,
    )
    means, covs = solution.moments()
    w, density = token_histograms(solution, problem.grid, positions, token_s)
    ds = reference_dataset(
        solution.times,
        means,
        covs,
        density,
        config,
        f"tpde token system, n = {n}",
        "tokens",
        positions,
    )
    ds["tokens"] = (
        ("time", "token", "dim"),
        np.asarray(solution.tokens),
        {"long_name": "token positions", "units": "1"},
    )
    if token_s is not None:
        ds["token_position"] = (
            ("token",),
            token_s,
            {"long_name": "token position s", "units": "1"},
        )
        ds["token_weight"] = (("token",), w, {"long_name": "token weight", "units": "1"})
    ds.attrs.update(
        status="completed",
        status_time=float(solution.times[-1]),
        status_message="",
        seed=-1 if quantiles else seed,
        sampling="mid-quantiles" if quantiles else "i.i.d.",
        dt=step,
        steps=int(np.ceil((problem.t_end - problem.t_start) / step - 1e-9)),
        threads=ensure_policy(),
        wall_time=time.perf_counter() - start,
    )
    return ds


def write_reference(ds: xr.Dataset, path: str | Path, overwrite: bool = False) -> Path:
    """Write a reference dataset; never replaces an existing file without ``overwrite``."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"run.output: {path} exists; pass --overwrite to replace it")
    if not path.parent.exists():
        raise ConfigError(
            f"run.output: cannot write {path}: directory {path.parent} does not exist"
        )
    tmp = path.with_name(f".{path.name}.tmp")
    io.to_netcdf(ds, tmp)
    tmp.replace(path)
    return path
