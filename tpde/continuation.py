"""``tpde continue``: branches of stationary states as NetCDF, bifurcation diagrams, and the
phase diagram over (beta, eps) on dask.

docs/user-guide.md, 'Stationary states and continuation'; the mathematics in
docs/theory.md, 'Stationary states and phase transitions'. One TOML table:

    [continuation]
    geometry = "circle"          # or "sphere" (zonal states on the Gauss-Legendre latitudes)
    model = "unnormalised"       # or "normalised"
    beta = 5.0                   # a list of betas: the phase diagram (one dask task each)
    cells = 128
    eps_min = 2.0                # default 0.5 x the linear threshold
    eps_max = 12.0               # default 4 x the linear threshold
    amplitude_max = 0.97
    steps = 400
    output = "branch.nc"         # default: out/<config name>.nc (a set name: beside the config)
    figure = "branch.png"        # default: out/<config name>.png

:func:`continuation` (one beta) and :func:`phase_diagram` (many) are the API the command
runs; both take plain arguments (a sweep maps them over its grid).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpde.config import ConfigError
from tpde.validation import continuation as ct
from tpde.validation import stationary as st
from tpde.validation.continuation import (
    DEFAULT_EPS_MAX,
    DEFAULT_EPS_MIN,
    continuation,
    critical_points,
    diagram_dataset,
)

__all__ = [
    "DEFAULT_EPS_MAX",
    "DEFAULT_EPS_MIN",
    "continuation",
    "critical_points",
    "diagram_dataset",
    "info",
    "load",
    "phase_diagram",
    "plot_diagram",
    "plot_phase_diagram",
    "run_file",
]

_KEYS = {
    "geometry",
    "model",
    "beta",
    "cells",
    "eps_min",
    "eps_max",
    "amplitude_max",
    "steps",
    "output",
    "figure",
}
#: where a config without output / figure keys writes (relative to the working folder)
OUT = Path("out")


def _number(table: Mapping, key: str, default: Any, low: float, high: float) -> Any:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
        raise ConfigError(
            f"continuation.{key}: expected a number in ({low:g}, {high:g}], got {value!r}"
        )
    return value


def load(path: str | Path) -> dict:
    """The validated ``[continuation]`` table of a TOML file (ConfigError names the key)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    table = raw.get("continuation")
    if not isinstance(table, dict):
        raise ConfigError("continuation: the file needs a [continuation] table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(
            f"continuation.{unknown[0]}: unknown key; expected one of {', '.join(sorted(_KEYS))}"
        )
    geometry = table.get("geometry", "circle")
    if geometry not in st.GEOMETRIES:
        raise ConfigError(
            f"continuation.geometry: expected one of {', '.join(st.GEOMETRIES)}, got {geometry!r}"
        )
    model = table.get("model", "unnormalised")
    if model not in st.MODELS:
        raise ConfigError(
            f"continuation.model: expected one of {', '.join(st.MODELS)}, got {model!r}"
        )
    beta = table.get("beta")
    betas = beta if isinstance(beta, list) else [beta]
    if not betas:
        raise ConfigError("continuation.beta: expected a number in (0, 60] or a list of them")
    values: list[float] = []
    for b in betas:
        if b is None:
            raise ConfigError("continuation.beta: missing; give a number in (0, 60]")
        values.append(float(_number({"beta": b}, "beta", None, 0.0, 60.0)))
    cells = table.get("cells", 128)
    if isinstance(cells, bool) or not isinstance(cells, int) or cells < 16 or cells % 2:
        raise ConfigError(f"continuation.cells: expected an even integer >= 16, got {cells!r}")
    steps = table.get("steps", 400)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"continuation.steps: expected an integer >= 1, got {steps!r}")
    eps_min = _number(table, "eps_min", None, 0.0, math.inf)
    eps_max = _number(table, "eps_max", None, 0.0, math.inf)
    if eps_min is not None and eps_max is not None and eps_min >= eps_max:
        raise ConfigError("continuation.eps_min: must be below continuation.eps_max")
    if isinstance(beta, list) and (eps_min is not None or eps_max is not None):
        raise ConfigError(
            "continuation.eps_min: with a list of betas the range is relative to each "
            "threshold; leave eps_min and eps_max out"
        )
    for key in ("output", "figure"):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"continuation.{key}: expected a file name (a string)")
    folder = path.parent
    return {
        "geometry": geometry,
        "model": model,
        "beta": values if isinstance(beta, list) else values[0],
        "cells": cells,
        "eps_min": eps_min,
        "eps_max": eps_max,
        "amplitude_max": float(_number(table, "amplitude_max", 0.97, 0.0, 0.999)),
        "steps": steps,
        # an example run as it is writes under out/, never beside the config
        "output": folder / table["output"] if "output" in table else OUT / f"{path.stem}.nc",
        "figure": folder / table["figure"] if "figure" in table else OUT / f"{path.stem}.png",
    }


def plot_diagram(datasets: Sequence, path: str | Path, titles: Sequence[str] | None = None) -> Path:
    """Amplitude against eps, one panel per dataset: stable solid, unstable dashed, the fold
    and the first-order point marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 4.0), squeeze=False)
    for i, (ax, ds) in enumerate(zip(axes[0], datasets, strict=True)):
        for b, colour in ((0, "0.3"), (1, "C0")):
            sel = ds["branch"].values == b
            eps = ds["eps"].values[sel]
            amp = ds["amplitude"].values[sel]
            stable = ds["unstable_modes"].values[sel] == 0
            # draw each run of equal stability as its own line (stable solid, unstable dashed)
            start = 0
            for j in range(1, eps.size + 1):
                if j == eps.size or stable[j] != stable[start]:
                    stop = min(j + 1, eps.size)
                    ax.plot(
                        eps[start:stop],
                        amp[start:stop],
                        "-" if stable[start] else "--",
                        color=colour,
                        lw=1.6,
                    )
                    start = j
        a = ds.attrs
        ax.plot([], [], "-", color="C0", label="stable")
        ax.plot([], [], "--", color="C0", label="unstable")
        ax.plot([a["eps_threshold"]], [0.0], "ks", ms=5, label="linear threshold")
        if math.isfinite(a["eps_fold"]):
            ax.plot([a["eps_fold"]], [a["amplitude_fold"]], "v", color="C3", label="fold")
        if math.isfinite(a["eps_first_order"]) and a["transition"] == "discontinuous":
            ax.axvline(a["eps_first_order"], color="C2", lw=0.8, ls=":")
            ax.plot(
                [a["eps_first_order"]] * 2,
                [0.0, a["amplitude_first_order"]],
                "o",
                color="C2",
                label="first-order point",
            )
        clustered = ds["eps"].values[ds["branch"].values == 1]
        lo = min(float(clustered.min()), a["eps_threshold"])
        hi = max(float(clustered.max()), a["eps_threshold"])
        pad = 0.08 * (hi - lo) + 1e-3 * hi
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_xlabel("noise eps")
        ax.set_ylabel("amplitude" if i == 0 else "")
        title = titles[i] if titles else f"{a['geometry']}, beta = {a['beta']:g}"
        ax.set_title(title)
        ax.legend(loc="best", fontsize=8)
        ax.set_ylim(-0.03, 1.0)
    return _save(fig, path)


# ---- the phase diagram on dask -------------------------------------------------------------
def phase_diagram(
    geometry: str,
    betas: Sequence[float],
    cells: int = 128,
    model: str = "unnormalised",
    scheduler: Any = None,
    workers: int | None = None,
    **options: Any,
):
    """The critical eps of every beta (one dask task each: a local cluster, a scheduler
    address or a Client, as ``tpde sweep``) as a Dataset over ``beta``: the linear threshold,
    the fold, the first-order point (the threshold itself where the transition is
    continuous), the curvature and the transition type."""

    from tpde.sweep import _client

    tasks = [
        {"geometry": geometry, "beta": float(b), "cells": cells, "model": model, **options}
        for b in betas
    ]
    with _client(scheduler, workers, len(tasks)) as client:
        records = client.gather(client.map(critical_points, tasks, pure=False))
    return ct.phase_dataset(records, geometry, model, cells)


def plot_phase_diagram(ds, path: str | Path) -> Path:
    """The (beta, eps / eps_c) plane: uniform stable above the fold, coexistence between the
    fold and the threshold, the first-order line, clustered below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    beta = ds["beta"].values
    ref = ds["eps_threshold"].values
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    ax.plot(beta, np.ones_like(beta), "k-", label="linear threshold")
    ax.plot(beta, ds["eps_fold"].values / ref, "C3--", label="fold (clustered states appear)")
    ax.plot(beta, ds["eps_first_order"].values / ref, "C2-", label="first-order point")
    fold = np.where(np.isfinite(ds["eps_fold"].values), ds["eps_fold"].values, ref) / ref
    first = ds["eps_first_order"].values / ref
    ax.fill_between(beta, first, fold, color="C3", alpha=0.12, label="cluster metastable")
    ax.fill_between(beta, 1.0, first, color="C2", alpha=0.12, label="uniform metastable")
    ax.axvline(ds.attrs["beta_star_closed_form"], color="0.5", lw=0.8, ls=":", label="beta*")
    ax.set_xlabel("beta")
    ax.set_ylabel("eps / eps_c(beta)")
    ax.set_title(f"{ds.attrs['geometry']}: phases of the stationary states")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    """Write a figure to ``path`` (its folder made if missing), close it, return the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


_TITLES = ("tpde stationary branches", "tpde phase diagram")


def info(path: str | Path) -> list[str] | None:
    """``tpde info`` of a file this module wrote (None for any other file)."""
    import xarray as xr

    try:
        with xr.open_dataset(path) as ds:
            if ds.attrs.get("title") not in _TITLES:
                return None
            a = dict(ds.attrs)
            if a["title"] == _TITLES[1]:
                return [
                    f"{path}: phase diagram ({a['geometry']}, {a['model']}, {a['cells']} cells)"
                ] + [
                    f"  beta {b:g}: threshold {c:.10g}, fold {f:.10g}, first-order {e:.10g} ({t})"
                    for b, c, f, e, t in zip(
                        ds["beta"].values,
                        ds["eps_threshold"].values,
                        ds["eps_fold"].values,
                        ds["eps_first_order"].values,
                        ds["transition"].values,
                        strict=True,
                    )
                ]
            points = int((ds["branch"].values == 1).sum())
    except (OSError, ValueError, KeyError):
        return None
    return [
        f"{path}: stationary branches ({a['geometry']}, {a['model']}, beta {a['beta']:g}, "
        f"{a['cells']} cells)",
        f"  threshold {a['eps_threshold']:.12g} (closed form "
        f"{a['eps_threshold_closed_form']:.12g}), transition {a['transition']}",
        f"  fold {a['eps_fold']:.12g}, first-order point {a['eps_first_order']:.12g}",
        f"  clustered branch: {points} points, ended {a['status']} at eps = {a['status_eps']:.6g}",
    ]


def _write(ds, path: Path) -> None:
    from tpde import io

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    io.to_netcdf(ds, tmp)
    os.replace(tmp, path)


def run_file(path: str | Path, output: str | Path | None = None, workers: int | None = None):
    """``tpde continue CONFIG``: one beta -> the branches (NetCDF + bifurcation diagram); a
    list of betas -> the phase diagram (NetCDF + figure). Returns ``(dataset, paths)``."""
    config = load(path)
    out = Path(output) if output is not None else config["output"]
    options = {
        k: config[k] for k in ("cells", "model", "eps_min", "eps_max", "amplitude_max", "steps")
    }
    try:
        if isinstance(config["beta"], list):
            ds = phase_diagram(config["geometry"], config["beta"], workers=workers, **options)
            _write(ds, out)
            figure = plot_phase_diagram(ds, config["figure"])
        else:
            d = continuation(config["geometry"], config["beta"], **options)
            ds = diagram_dataset(d)
            _write(ds, out)
            figure = plot_diagram([ds], config["figure"])
    except ValueError as exc:
        if str(exc).startswith("continuation."):
            raise ConfigError(str(exc)) from None
        raise
    return ds, (out, figure)
