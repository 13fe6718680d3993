"""``tpde gaussian`` and ``tpde particles``: the references of a configuration, alone.

Both read the same TOML as ``tpde run`` and write NetCDF with the run's names where they apply
(``time``, ``mean(time, dim)``, ``covariance(time, dim, dim2)``, the ``config`` and ``status``
attributes):

* ``gaussian_reference(config)``: the mean/covariance ODEs (docs/theory.md, 'Gaussian
  closures') from the Gaussian initial data (variants with a Gaussian closure only);
  ``status`` is ``blowup`` with its time when the covariance blows up.
* ``particle_reference(config, n, seed)``: n i.i.d. tokens sampled from the initial density,
  moved by the token system (docs/theory.md, 'The Transformer PDE'; SSP-RK3 with the run's
  snapshot times), stored as ``tokens(time, token, dim)``. Masked runs: n // (positions + 1)
  tokens per position slice (``token_position(token)``, ``token_weight(token)``), moved by
  the masked system.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

import tpde

from .config import Config, ConfigError, check_memory

__all__ = ["gaussian_reference", "particle_reference", "write_reference"]

AXES = ("x", "y", "z")


def _moments_dataset(times, means, covs, config: Config, title: str) -> xr.Dataset:
    d = means.shape[1]
    return xr.Dataset(
        {
            "mean": (("time", "dim"), means, {"long_name": "mean of the token distribution"}),
            "covariance": (
                ("time", "dim", "dim2"),
                covs,
                {"long_name": "covariance of the token distribution"},
            ),
        },
        coords={
            "time": (
                "time",
                np.asarray(times, float),
                {"units": "1", "long_name": "time (depth through the network)"},
            ),
            "dim": ("dim", list(AXES[:d])),
            "dim2": ("dim2", list(AXES[:d])),
        },
        attrs={
            "Conventions": "CF-1.10",
            "title": title,
            "source": f"tpde {tpde.__version__}",
            "config": config.text,
        },
    )


def gaussian_reference(config: Config) -> xr.Dataset:
    """The Gaussian mean/covariance ODE solution at the run's snapshot times."""
    from tpde.validation.gaussian import VARIANTS, solve

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
    solution = solve(
        config.variant, mean0, cov0, problem.velocity.spec, problem.t_end, t0=problem.t_start
    )
    times = problem.times[problem.times <= solution.status_time]
    means, covs = solution.at(times)
    ds = _moments_dataset(times, means, covs, config, "tpde Gaussian ODE reference")
    ds.attrs.update(
        status=solution.status,
        status_time=float(solution.status_time),
        status_message=solution.message,
    )
    return ds


def particle_reference(
    config: Config, n: int, seed: int = 0, dt: float | None = None
) -> xr.Dataset:
    """n tokens sampled from the initial density, moved by the token system."""
    from tpde.validation.particles import (
        TokenSystem,
        sample_sliced_tokens,
        sample_tokens,
        simulate,
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
    if positions is None:
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
    ds = _moments_dataset(solution.times, means, covs, config, f"tpde token system, n = {n}")
    ds["tokens"] = (("time", "token", "dim"), solution.tokens, {"long_name": "token positions"})
    if token_s is not None:
        ds["token_position"] = (("token",), token_s, {"long_name": "token position s"})
        ds["token_weight"] = (("token",), solution.weights, {"long_name": "token weight"})
    ds.attrs.update(
        status="completed",
        status_time=float(solution.times[-1]),
        status_message="",
        seed=seed,
        dt=step,
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
    ds.to_netcdf(tmp)
    tmp.replace(path)
    return path
