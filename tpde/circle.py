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
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tpde.grid import circle as geo
from tpde.grid import moments as cell_moments
from tpde.schemes.atoms import AtomOptions
from tpde.schemes.solver import Problem
from tpde.variants.circle_atoms import energy_with_atoms
from tpde.variants.engines.registry import check_engine
from tpde.variants.masked import CausalAttention
from tpde.variants.parameters import Head
from tpde.variants.spherical import CircleAttention, interaction_energy

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


def build_circle(raw: dict) -> Config:
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
    config = Config(problem, run["output"], "circle", dumps(stored), stored)
    config.no_gaussian = "tpde gaussian: the circle has no Gaussian closure; use tpde particles"
    if positions is None:
        config.energies = lambda: circle_energies(field, grid)
        config.particles = lambda n, seed, quantiles: circle_particles(
            config, field, n, seed, quantiles
        )
    else:  # one law per slice: no energy of the run
        config.energies = lambda: lambda density, t: {}
    return config


def circle_particles(
    config: Config, field: CircleAttention, n: int, seed: int = 0, quantiles: bool = False
):
    """``tpde particles`` on the circle: ``n`` tokens of the initial cell averages (i.i.d.
    with ``seed``, or the deterministic mid-quantiles with ``quantiles``) moved by the
    token system on the circle (classical RK4 in the angles, the run's head and
    normalisation), in the run's file layout: the tokens' histogram as ``density``, the
    angles as ``tokens`` (time, token, dim)."""
    import time as _time

    import xarray as xr

    from tpde.validation.particles import quantile_tokens_of_cells
    from tpde.validation.sphere_tokens import CircleTokens, sample_circle_tokens

    from .references import reference_dataset

    problem = config.problem
    grid = problem.grid
    if n < 1:
        raise ConfigError(f"--tokens: expected an integer >= 1, got {n}")
    if geo.circle_copies(grid) != 1:
        raise ConfigError("grid.copies: tokens live on the whole circle; set copies = 1")
    if quantiles:
        theta = quantile_tokens_of_cells(problem.density, grid, n)[:, 0]
    else:
        theta = sample_circle_tokens(problem.density, grid, n, seed)
    start = _time.perf_counter()
    step = float(np.min(np.diff(problem.times))) / 10 if len(problem.times) > 1 else 0.01
    tokens = CircleTokens(theta, field.spec, normalised=field.normalised)
    tokens.t = problem.t_start
    angles = tokens.integrate(problem.times, step)
    edges = grid.edges(0)
    density = np.stack(
        [np.histogram(a, bins=edges)[0] / (n * grid.spacing[0]) for a in angles]
    ).astype(float)
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


def circle_energies(
    field: CircleAttention, grid: geo.CircleGrid
) -> Callable[[np.ndarray, float], dict]:
    """``(density, t) -> {"interaction": Energy}`` for ``A = beta I`` (the energy of
    docs/theory.md, 'Attention dynamics on the sphere'; ``increasing`` when ``C`` is a
    positive multiple of the identity); ``{}`` for other matrices."""
    from tpde.variants.energies import Energy

    head = field.spec if isinstance(field.spec, Head) else None
    if head is None:
        return lambda density, t: {}
    A, C = np.asarray(head.A, float), np.asarray(head.C, float)
    beta = float(A[0, 0])
    scalar = np.allclose(A, beta * np.eye(2), rtol=0, atol=1e-12 * max(abs(beta), 1e-300))
    if not (scalar and beta > 0):
        return lambda density, t: {}
    positive = np.allclose(C, C[0, 0] * np.eye(2), rtol=0, atol=1e-12) and C[0, 0] > 0
    monotone = "increasing" if positive else "none"

    def evaluate(density: np.ndarray, t: float) -> dict:
        # with atoms, the field holds the snapshot's atoms while the writer runs (the
        # solver's snapshot callback): their exact share joins the cells'
        atoms = field.atoms
        value = (
            interaction_energy(density, grid, beta)
            if atoms is None
            else energy_with_atoms(density, grid, beta, atoms)
        )
        return {
            "interaction": Energy(
                value,
                monotone,
                "interaction energy on the circle",
                "1/(2 beta) iint exp(beta cos(phi - theta)) dmu dmu",
            )
        }

    return evaluate


def clusters_from_noise(
    beta: float,
    cells: int = 512,
    amplitude: float = 1e-4,
    k_noise: int = 48,
    seed: int = 0,
    extra: float = 4.0,
    snapshots: int = 41,
    threshold: float = 2.0,
) -> dict[str, Any]:
    """Run ``A = beta I``, ``V = I`` from the uniform density times ``1 + amplitude *
    noise`` (:func:`tpde.grid.circle.smooth_noise` of degree ``k_noise``) until the fastest
    mode has grown to order one and ``extra`` e-folds more,
    ``T = (log(1 / amplitude) + extra) / lambda_max``, and count the clusters there (local
    maxima above ``threshold`` times the uniform density). Returns the count, the fastest
    mode ``k_max``, the clusters' angles and masses, and the solver's Result."""
    from tpde.schemes.solver import Scheme, Solver
    from tpde.validation.sphere_rates import fastest_mode, linear_rate
    from tpde.variants.spherical import circle_head

    grid = geo.circle_grid(cells)
    k_max = fastest_mode(beta)
    t_end = (math.log(1.0 / amplitude) + extra) / linear_rate(k_max, beta)
    density = geo.smooth_noise(grid, amplitude, k_noise, seed)
    # the CFL bound is a positivity bound: while the velocity is O(amplitude) it allows steps
    # far beyond what SSP-RK3 resolves of the growth, hence dt_max = 0.1 / lambda_max
    scheme = Scheme(dt_max=0.1 / linear_rate(k_max, beta))
    problem = Problem(
        grid,
        density,
        CircleAttention(circle_head(beta)),
        t_end,
        scheme=scheme,
        snapshots=snapshots,
    )
    result = Solver(problem).run()
    angles, masses = geo.clusters(result.final, grid, threshold)
    return {
        "beta": float(beta),
        "k_max": k_max,
        "count": int(angles.size),
        "angles": angles,
        "masses": masses,
        "t_end": t_end,
        "result": result,
        "grid": grid,
    }
