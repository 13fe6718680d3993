"""Configurations on the circle: ``[grid] geometry = "circle"``.

docs/theory.md, 'Attention dynamics on the sphere' and 'The circle on the grid';
docs/user-guide.md, 'The circle'. :func:`build_circle` turns the raw tables of a circle
configuration into a :class:`tpde.config.Config` (``tpde.config.build`` hands them over), so
``tpde run``, ``tpde.simulate`` and the writer work unchanged: the output holds the density
per unit angle on the angle cells, the coordinate ``x`` is the angle in radians (CF
attributes of :class:`tpde.grid.circle.CircleGrid`) and the file says
``geometry = "circle"``. :func:`circle_energies` is what the writer records:
the interaction energy ``E = 1/(2 beta) iint e^{beta cos(phi - theta)} dmu dmu`` for
``A = beta I`` (increasing along the flow for ``C`` a positive multiple of ``I``).

Keys::

    [grid]       geometry = "circle", cells (>= 7), copies (m-fold reduction, default 1)
    [initial]    kind = "uniform" (optional modes = [[k, amplitude, phase], ...]),
                 "noise" (amplitude, k_max, seed), "von_mises" (mean, kappa),
                 "mixture" (weights, means, kappas)
    [attention]  variant = "softmax"; beta (A = beta I, V = I) or A, V (2 x 2), optional W;
                 normalised (default true); engine = "auto" | "fft" | "bessel" | "direct";
                 masked = true: causal attention over position slices (grid.positions,
                 grid.sink_mass as on R^d)
    [scheme], [run]  as on R^d
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from tpde.grid import circle as geo
from tpde.grid import moments as cell_moments
from tpde.schemes.atoms import AtomOptions
from tpde.schemes.solver import Problem
from tpde.validation.circle_metastability import clusters_from_noise
from tpde.variants.energies import circle_energies
from tpde.variants.engines.registry import check_engine
from tpde.variants.masked import CausalAttention
from tpde.variants.parameters import Head
from tpde.variants.spherical import CircleAttention

from . import geometries
from .config_core import (
    SECTIONS,
    Config,
    ConfigError,
    _matrix,
    _number,
    _run_settings,
    build_positions,
    build_scheme,
    check_keys,
    dumps,
    make_problem,
    numbers,
    section_errors,
)

__all__ = ["GEOMETRIES", "build_circle", "circle_energies", "clusters_from_noise"]

#: the geometries a config may name (tpde.geometries)
GEOMETRIES = tuple(geometries.GEOMETRIES)
KEYS = {
    "grid": {"geometry", "cells", "copies", "positions", "sink_mass"},
    "initial": {"kind", "modes", "amplitude", "k_max", "seed", "mean", "kappa"}
    | {"weights", "means", "kappas"},
    "attention": {"variant", "beta", "A", "V", "W", "normalised", "engine", "masked"},
    "atoms": {f.name for f in dataclasses.fields(AtomOptions)},
}
#: every section's known keys ([scheme] and [run] are the flat geometry's): build_circle
#: and tpde.sweep (a base config's keys, its parameter paths) check against it
CONFIG_SECTIONS = {**KEYS, "scheme": SECTIONS["scheme"], "run": SECTIONS["run"]}
INITIAL_KINDS = ("uniform", "noise", "von_mises", "mixture")


def _grid(table: Mapping) -> geo.CircleGrid:
    if "cells" not in table:
        raise ConfigError("grid.cells: missing (the number of angle cells, >= 7)")
    cells = _number("grid.cells", table["cells"], positive=True, integer=True)
    copies = _number("grid.copies", table.get("copies", 1), positive=True, integer=True)
    try:
        return geo.circle_grid(int(cells), int(copies))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _initial(table: Mapping, grid: geo.CircleGrid) -> np.ndarray:
    kind = table.get("kind", "uniform")
    if kind not in INITIAL_KINDS:
        raise ConfigError(
            f"initial.kind: unknown {kind!r} on the circle; choose one of "
            f"{', '.join(INITIAL_KINDS)}"
        )
    with section_errors("initial"):
        if kind == "uniform":
            modes = table.get("modes", [])
            if not isinstance(modes, list):
                raise ConfigError("initial.modes: expected [[k, amplitude, phase], ...]")
            triples = []
            for i, mode in enumerate(modes):
                k, amplitude, phase = numbers(f"initial.modes[{i}]", mode, 3)
                triples.append((int(k), amplitude, phase))
            return geo.uniform_modes(grid, triples)
        if kind == "noise":
            return geo.smooth_noise(
                grid,
                _number("initial.amplitude", table.get("amplitude", 1e-3)),
                int(_number("initial.k_max", table.get("k_max", 32), True, True)),
                int(_number("initial.seed", table.get("seed", 0), integer=True)),
            )
        if kind == "von_mises":
            return geo.von_mises(
                grid,
                _number("initial.mean", table.get("mean", 0.0)),
                _number("initial.kappa", table.get("kappa", 1.0)),
            )
        for key in ("weights", "means", "kappas"):
            if key not in table:
                raise ConfigError(f"initial.{key}: missing for kind = 'mixture'")
        weights = numbers("initial.weights", table["weights"])
        means = numbers("initial.means", table["means"], len(weights))
        kappas = numbers("initial.kappas", table["kappas"], len(weights))
        if min(weights, default=0.0) <= 0:
            raise ConfigError(f"initial.weights: must be > 0, got {weights}")
        total = sum(weights)
        return geo.von_mises_mixture(
            grid, [(w / total, m, k) for w, m, k in zip(weights, means, kappas, strict=True)]
        )


def _attention(table: Mapping) -> CircleAttention:
    variant = table.get("variant", "softmax")
    if variant != "softmax":
        raise ConfigError(
            f"attention.variant: the circle has softmax attention (normalised = false for "
            f"the unnormalised one), got {variant!r}"
        )
    if "beta" in table:
        for key in ("A", "V"):
            if key in table:
                raise ConfigError(f"attention.{key}: give beta (A = beta I, V = I) or A and V")
        beta = _number("attention.beta", table["beta"])
        A, V = beta * np.eye(2), np.eye(2)
    else:
        if "A" not in table:
            raise ConfigError("attention.beta: missing (A = beta I), or give attention.A")
        A = _matrix("attention.A", table["A"], (2, 2))
        V = _matrix("attention.V", table.get("V", [[1.0, 0.0], [0.0, 1.0]]), (2, 2))
    W = _matrix("attention.W", table["W"], (2, 2)) if "W" in table else None
    normalised = table.get("normalised", True)
    if not isinstance(normalised, bool):
        raise ConfigError(f"attention.normalised: expected true or false, got {normalised!r}")
    try:
        engine = check_engine(table.get("engine", "auto"), "circle")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if float(np.linalg.norm(A, 2)) > 300.0:
        raise ConfigError("attention.A: |A| > 300 overflows the kernel e^{<A x, y>} on the circle")
    try:
        return CircleAttention(Head(A, V, W), normalised=normalised, engine=engine)
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None


def build_circle(raw: dict) -> Config[Problem]:
    """The :class:`Config` of a circle configuration (raw TOML tables, paths resolved)."""
    name = geometries.of_config(raw)
    if name != "circle":  # (tpde.geometries' entry "circle" calls it on its own configs)
        raise ConfigError(f"grid.geometry: unknown {name!r}; choose one of {', '.join(GEOMETRIES)}")
    check_keys(raw, CONFIG_SECTIONS, "circle", required=("grid", "attention", "run"))
    grid = _grid(raw["grid"])
    field = _attention(raw["attention"])
    try:
        field.choose(field.spec, grid.copies)  # the m-fold grid's needs, before any run
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    scheme = build_scheme(raw.get("scheme", {}))
    run = _run_settings(raw["run"])
    density = _initial(raw.get("initial", {}), grid)
    positions = build_positions(raw["grid"], raw["attention"])
    velocity: CircleAttention | CausalAttention = field
    if positions is not None:
        velocity = CausalAttention(field)
        velocity.attention = False  # no box to hold the measure: the circle is periodic
        density = positions.product(density, grid)
    atoms = _atoms(raw["atoms"], field, grid, positions) if "atoms" in raw else None
    problem = make_problem(grid, density, velocity, scheme, run, positions, atoms=atoms)
    stored = {section: dict(table) for section, table in raw.items()}
    stored["grid"].setdefault("copies", 1)
    stored["attention"].setdefault("normalised", True)
    stored["attention"].setdefault("engine", "auto")
    # raw with the defaults filled in, as stored
    config: Config[Problem] = Config(
        problem, run["output"], "softmax", dumps(stored), stored, geometry="circle"
    )
    config.no_gaussian = "tpde gaussian: the circle has no Gaussian closure; use tpde particles"
    if positions is None:
        config.energies = lambda: circle_energies(field, grid)
        config.particles = lambda n, seed, quantiles: circle_particles(
            config, field, n, seed, quantiles
        )
    else:  # one law per slice: no energy of the run, no token system
        config.energies = lambda: lambda density, t: {}
        config.particles = _no_masked_tokens
    return config


def _no_masked_tokens(n: int, seed: int = 0, quantiles: bool = False) -> Any:
    """``tpde particles`` of masked attention on the circle: refused in one line."""
    raise ConfigError(
        "grid.positions: the circle's token system has no position slices; "
        "tpde particles runs unmasked circle configs"
    )


def circle_particles(
    config: Config[Problem], field: CircleAttention, n: int, seed: int = 0, quantiles: bool = False
):
    """``tpde particles`` on the circle: ``n`` tokens of the initial cell averages (i.i.d.
    with ``seed``, or the deterministic mid-quantiles with ``quantiles``) moved by the
    token system on the circle (classical RK4 in the angles, the run's head and
    normalisation), in the run's file layout: the tokens' histogram as ``density``, the
    angles as ``tokens`` (time, token, dim)."""
    import time as _time

    import xarray as xr

    from tpde.validation.sphere_tokens import circle_token_run

    from .references import reference_dataset

    problem = config.problem
    grid = problem.grid
    if n < 1:
        raise ConfigError(f"--tokens: expected an integer >= 1, got {n}")
    if geo.circle_copies(grid) != 1:
        raise ConfigError("grid.copies: tokens live on the whole circle; set copies = 1")
    start = _time.perf_counter()
    angles, density, step = circle_token_run(
        problem.density, grid, field.spec, field.normalised, problem.times, problem.t_start,
        n, seed, quantiles,
    )  # fmt: skip
    moments = [cell_moments(d, grid)[1:] for d in density]
    title = f"tpde token system on the circle, n = {n}" + (" (mid-quantiles)" if quantiles else "")
    ds: xr.Dataset = reference_dataset(
        problem.times,
        [m[0] for m in moments],
        [m[1] for m in moments],
        density,
        config,
        title,
        "tokens",
    )
    ds["tokens"] = (
        ("time", "token", "dim"),
        angles[:, :, None],
        {"long_name": "token angles theta", "units": "radian"},
    )
    ds.attrs.update(
        status="completed",
        status_time=float(problem.times[-1]),
        status_message="",
        seed=-1 if quantiles else seed,
        sampling="mid-quantiles" if quantiles else "i.i.d.",
        dt=step,
        wall_time=_time.perf_counter() - start,
    )
    return ds


def _atoms(table: Mapping, field: CircleAttention, grid: geo.CircleGrid, positions) -> AtomOptions:
    """``[atoms]``: the options (docs/theory.md, 'Cells plus atoms'), checked with what
    the atoms need of the run."""
    if positions is not None:
        raise ConfigError("atoms: not with masked attention (grid.positions); remove [atoms]")
    options = AtomOptions(**{key: table[key] for key in table})
    try:
        options.validate()
        head = field.spec
        if not isinstance(head, Head):
            raise ValueError("atoms: need one constant head (A, V); remove [atoms]")
        field._check_atoms(grid, head, field.choose(head, grid.copies), grid.copies)
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    return options
