"""Configurations on the sphere S^2: ``[grid] geometry = "sphere"`` (the cubed sphere).

docs/theory.md, 'The cubed sphere', 'General attention on the sphere' and 'Tokens on the
sphere'; docs/user-guide.md, 'The sphere'. :func:`build_sphere` turns the raw tables of a
sphere configuration into a :class:`tpde.config_core.Config` (its problem a
:class:`SphereProblem`); ``tpde run`` (:func:`tpde.run.run_config`,
the one run path) runs it through its :class:`SphereSession`, whose
:class:`tpde.schemes.cubed_sphere.SphereSolver` hands each snapshot as it is reached to
:class:`tpde.io.SnapshotWriter` in the sphere's :class:`SphereLayout`, which writes a
CF-1.10 NetCDF file that ParaView and xarray (:func:`tpde.io.read`) read on a globe.
The cells are one dimension, ``cell`` (6 n^2; cell number
``(panel n + j) n + i``, ``i`` along the panel's first local angle): ``density (time, cell)``
per unit area (cell averages) with the auxiliary coordinates ``lat``, ``lon`` (cell centres,
degrees_north / degrees_east) and their cell bounds ``lat_bounds``, ``lon_bounds`` (``(cell,
nv)``, the 4 corners counter-clockwise), the integer coordinates ``panel``, ``j``, ``i`` of
each cell (:func:`panels` unstacks ``cell`` into ``(panel, j, i)`` with them),
``cell_area (cell)`` (steradians), ``mass (time)``, ``mean_vector (time, xyz)``,
``second_moment (time, xyz, xyz2)``, the degree amplitudes ``harmonic_amplitude (time,
degree)`` (``l = 0 .. 8``) and, for ``A = beta I``, ``V = I`` (where it is the Lyapunov
function), the interaction energy ``energy_interaction (time)`` (:func:`diagnostics`); the
file says ``geometry = "sphere"``. 1-D latitude and
longitude with 4-corner bounds are what ParaView's CF reader (vtkNetCDFCFReader) turns into
polygons on the unit sphere (its "p-sided cells"); a ``(panel, j, i)`` layout it loads as an
image of panels instead. ``tpde info``, ``tpde plot`` and ``tpde particles`` know the file.

Keys::

    [grid]       geometry = "sphere", cells (per panel edge, >= 6; 6 cells^2 in all)
    [initial]    kind = "uniform" (optional modes = [[l, amplitude], ...] of zonal P_l about
                 axis, default [0, 0, 1]), "noise" (amplitude, l_max, seed),
                 "von_mises_fisher" (mean, kappa), "mixture" (weights, means, kappas)
    [attention]  variant = "softmax"; beta (A = beta I, V = I) or A, V (3 x 3);
                 normalised (default true); nodes (Gauss nodes a cell axis, default 3);
                 engine ("auto" | "direct" | "harmonic"; auto: harmonic)
    [scheme]     reconstruction (weno5z), integrator (ssprk3), cfl (0.5), dt_max,
                 limiter (true), velocity_at ("nodes" | "centres")
    [run]        t_end, snapshots (a count or a list of times), output
    [atoms]      (optional) width, floor, level, absorb, merge, release: von Mises-Fisher
                 atoms for the collapsed clusters (docs/theory.md, 'Atoms on the sphere')
"""

from __future__ import annotations

import dataclasses
import math
import time as _time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import xarray as xr

from tpde.grid import cubed_sphere as cs
from tpde.schemes.atoms import AtomOptions
from tpde.schemes.monitor import event_lines
from tpde.variants.cubed_sphere import CubedSphereAttention
from tpde.variants.engines.registry import check_engine

from . import io
from .config_core import (
    Config,
    ConfigError,
    _choice,
    _matrix,
    _number,
    check_keys,
    dumps,
    numbers,
    parse_toml,
    section_errors,
)
from .layout import _TIME_CHUNK

__all__ = [
    "SphereLayout",
    "SphereProblem",
    "SphereSession",
    "build_sphere",
    "grid_of",
    "panels",
    "particle_reference",
    "info_lines",
    "sphere_dataset",
]

KEYS = {
    "grid": {"geometry", "cells"},
    "initial": {"kind", "modes", "axis", "amplitude", "l_max", "seed", "mean", "kappa"}
    | {"weights", "means", "kappas"},
    "attention": {"variant", "beta", "A", "V", "normalised", "nodes", "engine"},
    "scheme": {"reconstruction", "integrator", "cfl", "dt_max", "limiter", "velocity_at"},
    "run": {"t_end", "snapshots", "output", "noise"},
    "atoms": {f.name for f in dataclasses.fields(AtomOptions)},
}
#: every section's known keys (tpde.sweep checks a base config and its parameter paths)
CONFIG_SECTIONS = KEYS
INITIAL_KINDS = ("uniform", "noise", "von_mises_fisher", "mixture")
RECONSTRUCTIONS = ("upwind", "muscl", "weno5", "weno5z")
INTEGRATORS = ("euler", "ssprk2", "ssprk3")
VELOCITY_AT = ("nodes", "centres")
MAX_CELLS = 256


@dataclass
class SphereProblem:
    """What a sphere configuration defines (its :class:`tpde.config_core.Config`'s
    ``problem``, run by :class:`SphereSession`): the cubed sphere, the initial density
    ``(6, n, n)``, the attention field, the snapshot times, the
    :class:`tpde.schemes.cubed_sphere.SphereSolver` options (``scheme``: reconstruction,
    integrator, cfl, dt_max, limiter, velocity_at, noise), the ``[initial]`` table (the
    tokens sample vMF and mixture starts exactly) and the ``[atoms]`` options (None: off)."""

    grid: cs.CubedSphere
    density: np.ndarray
    velocity: CubedSphereAttention
    times: np.ndarray
    scheme: dict
    initial: dict = dataclasses.field(default_factory=dict)
    atoms: AtomOptions | None = None

    @property
    def t_start(self) -> float:
        return float(self.times[0])

    @property
    def t_end(self) -> float:
        return float(self.times[-1])


#: what ``tpde gaussian`` says of a sphere config
NO_GAUSSIAN = "attention: the sphere has no Gaussian closure; use tpde particles"


def _tokens(config: Config[SphereProblem], n: int, seed: int = 0, quantiles: bool = False):
    """``tpde particles`` on the sphere (:func:`particle_reference`; i.i.d. tokens only)."""
    if quantiles:
        raise ConfigError(
            "--quantiles: mid-quantile tokens are defined in 1-D and on the circle; "
            "drop --quantiles for i.i.d. tokens"
        )
    return particle_reference(config, n, seed)


def _vector(key: str, value: Any) -> list[float]:
    v = numbers(key, value, 3)
    if not math.hypot(*v) > 0:
        raise ConfigError(f"{key}: expected a non-zero 3-vector, got {value!r:.60}")
    return v


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
    with section_errors("initial"):
        if kind == "uniform":
            modes = table.get("modes", [])
            if not isinstance(modes, list):
                raise ConfigError("initial.modes: expected [[l, amplitude], ...]")
            axis = _vector("initial.axis", table.get("axis", [0.0, 0.0, 1.0]))
            density = np.full(grid.shape, 1.0 / cs.FOUR_PI)
            for i, mode in enumerate(modes):
                l, amplitude = numbers(f"initial.modes[{i}]", mode, 2)
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


def _components(table: Mapping) -> list[tuple[float, list[float], float]]:
    for key in ("weights", "means", "kappas"):
        if key not in table:
            raise ConfigError(f"initial.{key}: missing for kind = 'mixture'")
    weights = numbers("initial.weights", table["weights"])
    means = table["means"]
    if not isinstance(means, list) or len(means) != len(weights):
        raise ConfigError(f"initial.means: expected {len(weights)} 3-vectors, one per weight")
    kappas = numbers("initial.kappas", table["kappas"], len(weights))
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
    try:
        engine = check_engine(table.get("engine", "auto"), "sphere")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if "beta" in table:
        for key in ("A", "V"):
            if key in table:
                raise ConfigError(f"attention.{key}: give beta (A = beta I, V = I) or A and V")
        beta = _number("attention.beta", table["beta"], positive=True)
        kwargs: dict[str, Any] = {"beta": beta}
    else:
        if "A" not in table:
            raise ConfigError("attention.beta: missing (A = beta I), or give attention.A")
        kwargs = {"A": _matrix("attention.A", table["A"], (3, 3))}
        if "V" in table:
            kwargs["V"] = _matrix("attention.V", table["V"], (3, 3))
    try:
        return CubedSphereAttention(
            nodes=nodes,
            cache_entries=60_000_000,
            normalised=normalised,
            engine=str(engine),
            **kwargs,
        )
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None


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
        times = np.array(numbers("run.snapshots", snapshots))
        if times.size < 2 or times[0] != 0 or np.any(np.diff(times) <= 0) or times[-1] > t_end:
            raise ConfigError("run.snapshots: expected increasing times from 0 up to run.t_end")
        return times if times[-1] == t_end else np.append(times, t_end)
    count = int(_number("run.snapshots", snapshots, True, True))
    if not 2 <= count <= 10_000:
        raise ConfigError(f"run.snapshots: expected 2 .. 10000 snapshots, got {count}")
    return np.linspace(0.0, t_end, count)


def build_sphere(raw: dict) -> Config[SphereProblem]:
    """The :class:`tpde.config_core.Config` of a sphere configuration (raw TOML tables): its
    problem a :class:`SphereProblem`, its session :class:`SphereSession`."""
    check_keys(raw, KEYS, "sphere", required=("grid", "attention", "run"))
    grid = _grid(raw["grid"])
    attention = _attention(raw["attention"])
    scheme = _scheme(raw.get("scheme", {}))
    if "noise" in raw["run"]:  # eps of eps Delta mu (Laplace-Beltrami), a keyword of solve
        from tpde.schemes.diffusion import check_noise

        try:
            scheme["noise"] = check_noise(raw["run"]["noise"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    times = _times(raw["run"])
    output = raw["run"].get("output", "out.nc")
    if output is not None and not isinstance(output, str):
        raise ConfigError(f"run.output: expected a file name, got {output!r:.60}")
    initial = dict(raw.get("initial", {}))
    density = _initial(initial, grid)
    stored = {section: dict(table) for section, table in raw.items()}
    stored["attention"].setdefault("normalised", True)
    stored["attention"].setdefault("nodes", attention.nodes)
    stored["attention"].setdefault("engine", attention.engine)
    stored.setdefault("scheme", {})
    for key, value in scheme.items():
        if value is not None and key != "noise":
            stored["scheme"].setdefault(key, value)
    atoms = None
    if "atoms" in raw:
        atoms = AtomOptions(**raw["atoms"])
        try:
            atoms.validate()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    problem = SphereProblem(grid, density, attention, times, scheme, initial, atoms)
    config: Config[SphereProblem] = Config(
        problem, output, "softmax", dumps(stored), raw, geometry="sphere",
        no_gaussian=NO_GAUSSIAN, session=SphereSession,
    )  # fmt: skip
    config.particles = lambda n, seed, quantiles: _tokens(config, n, seed, quantiles)
    return config


# ---- the file ---------------------------------------------------------------------------------
#: the file's one cell axis <-> tpde's (6, n, n) (tpde.grid.cubed_sphere)
_to_file = cs.cell_list
from_file = cs.cell_panels


def _file_geometry(values: np.ndarray) -> np.ndarray:
    """The geography's ``(panel, j, i, ...)`` arrays (:func:`cs.cell_geography`) -> the
    file's ``(cell, ...)``."""
    values = np.asarray(values)
    return values.reshape(-1, *values.shape[3:])


def grid_of(ds: xr.Dataset) -> cs.CubedSphere:
    """The cubed sphere of a sphere file's dataset (its ``cell`` dimension, 6 n^2)."""
    n = math.isqrt(int(ds.sizes["cell"]) // 6)
    return cs.cubed_sphere(n)


def panels(ds: xr.Dataset) -> xr.Dataset:
    """A sphere file's dataset with ``cell`` unstacked into ``(panel, j, i)`` (``i`` fastest):
    ``density (time, panel, j, i)``, ``lat (panel, j, i)``, ``lat_bounds (panel, j, i,
    nv)``, ... (xarray's ``ds.set_index(cell=["panel", "j", "i"]).unstack("cell")``, the
    dimensions put back in the file's order)."""
    out = ds.set_index(cell=["panel", "j", "i"]).unstack("cell")
    return out.transpose("time", "panel", "j", "i", ..., missing_dims="ignore")


def sphere_dataset(
    grid: cs.CubedSphere,
    times: np.ndarray,
    densities: list[np.ndarray] | np.ndarray,
    text: str,
    title: str,
    what: str = "density",
    beta: float | None = None,
    degrees: int | None = None,
    energy: np.ndarray | None = None,
    amplitudes: np.ndarray | None = None,
) -> xr.Dataset:
    """The CF dataset of densities on the cubed sphere (module docstring). ``beta`` (``A =
    beta I``, ``V = I``) adds ``energy_interaction (time)``, ``degrees`` (``L``) adds
    ``harmonic_amplitude (time, degree)``, ``l = 0 .. L`` (:func:`diagnostics` of each
    density, unless ``energy`` / ``amplitudes`` give the values, as the tokens' exact
    ones)."""
    from tpde import __version__

    geo = cs.cell_geography(grid)
    dims = ("cell",)
    rho = np.asarray(densities, float).reshape(-1, *grid.shape)
    index = np.indices(grid.shape, dtype=np.int32)  # panel, j, i of each file cell
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
                    "coordinates": "lat lon panel j i",
                    "cell_methods": "time: point area: mean",
                },
            ),
            "cell_area": (
                dims,
                _to_file(grid.areas),
                {
                    "long_name": "cell area on the unit sphere",
                    "units": "sr",
                    "comment": "mass = sum(density * cell_area). Not a CF cell_measures "
                    "variable (CF asks m2 of those; the sphere is the unit sphere)",
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
            **_diagnostic_variables(grid, rho, beta, degrees, energy, amplitudes),
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
            "panel": (dims, index[0].ravel(), {"long_name": "cubed-sphere panel of the cell"}),
            "j": (
                dims,
                index[1].ravel(),
                {"long_name": "cell index along the panel's second local angle"},
            ),
            "i": (
                dims,
                index[2].ravel(),
                {"long_name": "cell index along the panel's first local angle"},
            ),
            "lat": (
                dims,
                _file_geometry(geo["lat"]),
                {
                    "standard_name": "latitude",
                    "long_name": "latitude of the cell centre",
                    "units": "degrees_north",
                    "bounds": "lat_bounds",
                },
            ),
            "lon": (
                dims,
                _file_geometry(geo["lon"]),
                {
                    "standard_name": "longitude",
                    "long_name": "longitude of the cell centre",
                    "units": "degrees_east",
                    "bounds": "lon_bounds",
                },
            ),
            "xyz": ("xyz", np.array(["x", "y", "z"]), {"long_name": "Cartesian component"}),
            "xyz2": ("xyz2", np.array(["x", "y", "z"]), {"long_name": "Cartesian component"}),
            **(
                {}
                if degrees is None
                else {
                    "degree": (
                        "degree",
                        np.arange(int(degrees) + 1, dtype=np.int32),
                        {"long_name": "degree l of the spherical harmonics", "units": "1"},
                    )
                }
            ),
        },
    )
    ds["lat_bounds"] = (
        (*dims, "nv"),
        _file_geometry(geo["lat_bounds"]),
        {"units": "degrees_north"},
    )
    ds["lon_bounds"] = ((*dims, "nv"), _file_geometry(geo["lon_bounds"]), {"units": "degrees_east"})
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


#: the degrees ``l = 0 .. DEGREES`` whose amplitudes a sphere run records
DEGREES = 8
#: Gauss nodes a cell axis of the recorded energy (:func:`interaction_energy`'s quadrature)
ENERGY_NODES = 3


def diagnostics(
    grid: cs.CubedSphere, density: np.ndarray, beta: float | None, degrees: int | None
) -> tuple[float | None, np.ndarray | None]:
    """The interaction energy ``E = 1/(2 beta) iint e^{beta <x, y>} rho rho dA dA`` (None
    without ``beta``; :func:`tpde.variants.cubed_sphere.interaction_energy`, 3 x 3 Gauss nodes
    a cell) and the degree amplitudes ``A_l``, ``l = 0 .. degrees`` (None without ``degrees``;
    :func:`tpde.grid.cubed_sphere.harmonic_amplitudes`) of one density (tpde's ``(6, n,
    n)``)."""
    from tpde.variants.cubed_sphere import interaction_energy

    energy = None if beta is None else interaction_energy(density, grid, beta, ENERGY_NODES)
    amplitudes = None if degrees is None else cs.harmonic_amplitudes(grid, density, int(degrees))
    return energy, amplitudes


def _diagnostic_variables(
    grid: cs.CubedSphere,
    rho: np.ndarray,
    beta: float | None,
    degrees: int | None,
    energy: np.ndarray | None,
    amplitudes: np.ndarray | None,
) -> dict[str, tuple]:
    """``energy_interaction (time)`` and ``harmonic_amplitude (time, degree)`` of
    :func:`sphere_dataset`."""
    out: dict[str, tuple] = {}
    if beta is not None:
        if energy is None:
            energy = np.array([diagnostics(grid, d, beta, None)[0] for d in rho], dtype=float)
        out["energy_interaction"] = (
            ("time",),
            np.asarray(energy, float).reshape(-1),
            _energy_attributes(float(beta)),
        )
    if degrees is not None:
        if amplitudes is None:
            amplitudes = np.array([diagnostics(grid, d, None, degrees)[1] for d in rho])
        out["harmonic_amplitude"] = (
            ("time", "degree"),
            np.asarray(amplitudes, float).reshape(-1, int(degrees) + 1),
            {
                "long_name": "amplitude of the degree-l spherical harmonics of the density "
                "relative to the mass, sqrt(4 pi (2 l + 1) sum_m |c_lm|^2) / mass",
                "units": "1",
                "cell_methods": "time: point",
            },
        )
    return out


def _energy_attributes(beta: float) -> dict[str, Any]:
    """The attributes of ``energy_interaction``: those of the grid runs' ``energy_<name>``
    records (:mod:`tpde.io`) and ``beta``."""
    return {
        "long_name": "interaction energy on the sphere",
        "formula": "1/(2 beta) iint exp(beta <x, y>) dmu(x) dmu(y)",
        "units": "1",
        "monotone": "increasing",
        "beta": beta,
        "cell_methods": "time: point",
    }


# ---- the file's layout and the run -----------------------------------------------------------
class SphereLayout:
    """The sphere's file layout (module docstring), a :class:`tpde.layout.FileLayout` that
    :class:`tpde.io.SnapshotWriter` writes and resumes (registered as the sphere's ``layout``
    in :mod:`tpde.geometries`): the header is the dataset of :func:`sphere_dataset` without
    records and with ``status = "running"``; ``beta`` (``A = beta I``, ``V = I``) adds the
    interaction energy's record and ``degrees`` the degree amplitudes' (:func:`diagnostics`,
    evaluated before a record is stored: at about the cost of one evaluation of the field);
    a record with atoms holds the moments of cells plus atoms (exact vMF moments)."""

    def __init__(
        self, grid: cs.CubedSphere, beta: float | None = None, degrees: int | None = DEGREES
    ):
        self.grid, self.beta, self.degrees = grid, beta, degrees

    @classmethod
    def reopen(cls, nc: netCDF4.Dataset, attrs: dict, where: str) -> SphereLayout:
        """The layout of a sphere run's file: its cubed sphere (``cell``, 6 n^2) and the
        records it has (none in files of tpde before them)."""
        if "cell" not in nc.dimensions:
            raise io.OutputError(
                f"run.output: {where} is not the file of a sphere run; choose another output"
            )
        n = math.isqrt(len(nc.dimensions["cell"]) // 6)
        energy = nc.variables.get("energy_interaction")
        beta = None if energy is None else float(energy.getncattr("beta"))
        amplitudes = "harmonic_amplitude" in nc.variables
        degrees = len(nc.dimensions["degree"]) - 1 if amplitudes else None
        return cls(cs.cubed_sphere(n), beta, degrees)

    def header_bytes(self, config_text: str) -> int:
        """The header: the cells' coordinates, bounds and areas, and the config text."""
        return 64 * 1024 + 80 * 6 * self.grid.n**2 + 2 * len(config_text)

    def record_bytes(self) -> int:
        """What one record may add: the density (deflate may grow it a little), an index entry
        per density tile, a new chunk of each moment record (mass, mean, second moment, energy
        and the ``degrees + 1`` amplitudes), and the reserve margin."""
        cells = 6 * self.grid.n**2
        tiles = -(-cells // io.spatial_chunks((cells,), 1)[1])
        return (
            int(1.05 * 8 * cells)
            + 128 * tiles
            + 8 * _TIME_CHUNK * (16 + (self.degrees or 0))
            + io.RESERVE_MARGIN
        )

    def create(self, path: str, config_text: str, title: str, history: str) -> None:
        """The empty file of a sphere run."""
        grid = self.grid
        empty = np.empty((0, *grid.shape))
        header = sphere_dataset(
            grid, np.empty(0), empty, config_text, title, beta=self.beta, degrees=self.degrees
        )
        created = f"{io._now()}: created by tpde {header.attrs['tpde_version']}"
        header.attrs.update(
            history=created + (f": {history}" if history else ""),
            status=io.RUNNING,
            status_time=math.nan,
            status_message="",
        )
        io.to_netcdf(header, path, records=True)

    def record(self, record: io.Record) -> Any:
        """The store of a snapshot (``density`` of shape ``(6, n, n)``; the optional
        ``atoms``, ``next_atom_id`` of :class:`tpde.io.Record`) with its mass, moments,
        interaction energy and degree amplitudes (those the file has)."""
        rho = np.asarray(record.density, dtype=np.float64)
        atoms, next_id = record.atoms, record.next_atom_id
        grid = self.grid
        mass, mean, second = grid.integrate(rho), cs.mean(grid, rho), cs.second_moment(grid, rho)
        energy, amplitudes = diagnostics(grid, rho, self.beta, self.degrees)
        if atoms is not None:  # the cells' moments plus the atoms' (exact vMF moments)
            from tpde.variants.cubed_sphere import energy_with_atoms

            mass, mean, second = atoms.with_moments(mass, mean, second)
            if energy is not None and self.beta is not None:
                energy = energy_with_atoms(rho, grid, self.beta, atoms)

        def store(nc: netCDF4.Dataset, i: int) -> None:
            if atoms is not None:
                from .atoms_io import write_atoms

                write_atoms(nc, i, atoms, next_id, layout="sphere")
            nc["density"][i, :] = _to_file(rho)
            nc["mass"][i] = mass
            nc["mean_vector"][i, :] = mean
            nc["second_moment"][i, :, :] = second
            if energy is not None:
                nc["energy_interaction"][i] = energy
            if amplitudes is not None:
                nc["harmonic_amplitude"][i, :] = amplitudes

        return store

    def density(self, nc: netCDF4.Dataset, i: int) -> np.ndarray:
        """Record ``i``'s density (tpde's ``(6, n, n)``)."""
        return from_file(np.array(nc["density"][i, :], dtype=np.float64))


class SphereSession:
    """The run of a sphere :class:`tpde.config_core.Config` in :func:`tpde.run.run_config` (a
    :class:`tpde.run.RunSession`): :class:`tpde.schemes.cubed_sphere.SphereSolver` with its
    atoms (``[atoms]``) or the pinning watch; a resumed run
    continues the file's last snapshot bit for bit (its density, atoms and monitor state,
    the snapshot times after it). The writer is :class:`tpde.io.SnapshotWriter` in the
    sphere's :class:`SphereLayout`. NetCDF only."""

    zarr = False

    def __init__(self, config: Config[SphereProblem]):
        self.config = config
        self.problem = config.problem
        self.times = np.asarray(self.problem.times, float)
        self.density = self.problem.density
        self.t_start, self.t_end = float(self.times[0]), self.problem.t_end
        self.found: tuple | None = None  # the atoms of the resumed snapshot
        self.state: dict = {}
        self.events: list = []
        self.atom_run: Any = None

    def new_writer(self, output: Path, overwrite: bool, history: str) -> io.SnapshotWriter:
        problem = self.problem
        beta = problem.velocity.beta if problem.velocity.identity_v else None
        return io.SnapshotWriter(
            output,
            problem.grid,
            self.config.text,
            title="tpde run on the sphere",
            overwrite=overwrite,
            history=history,
            layout=SphereLayout(problem.grid, beta),
        )

    def resume_writer(self, output: Path) -> io.SnapshotWriter:
        from .resume import times_after
        from .run import check_resumable

        times = self.times

        def accept(found: dict) -> None:
            check_resumable(output, found, self.config, times)

        writer = io.SnapshotWriter.resume(output, accept=accept)
        assert writer.last_time is not None  # (accept refused a file without records)
        assert isinstance(writer.layout, SphereLayout)  # (accept: the same config)
        start = writer.last_time
        self.density = writer.read_last(writer.layout.density)
        self.times = np.array([start, *times_after(times, start)])
        self.t_start = start
        if self.problem.atoms is not None:
            from .atoms_io import read_atoms

            self.found = writer.read_last(read_atoms)
        self.state = writer.state
        return writer

    def solver(self, callbacks: list) -> Any:
        from tpde.schemes.cubed_sphere import SphereSolver

        problem = self.problem
        if problem.atoms is not None:
            from tpde.schemes.sphere_atoms import SphereAtomRun

            found = self.found
            self.atom_run = SphereAtomRun(
                problem.grid,
                problem.velocity,
                problem.atoms,
                None if found is None else found[0],
                0 if found is None else found[1],
            )
        solver = SphereSolver(
            problem.grid,
            self.density,
            problem.velocity,
            float(self.times[-1]),
            snapshots=self.times,
            on_snapshot=callbacks,
            atoms=self.atom_run,
            pinning=self.atom_run is None,
            events=self.events,
            **problem.scheme,
        )
        solver.restore_monitor_state(self.state)
        return solver

    def outcome(self, result: Any) -> io.Outcome:
        from .run import result_outcome

        outcome = result_outcome(result)
        if outcome.status == "completed" and result.clipped:
            message = f"noise: {result.clipped} substeps had negatives clipped at zero (mass kept)"
            outcome = io.Outcome("completed", outcome.time, message)
        return outcome

    def provenance(self, solver: Any, recorder: Any) -> dict[str, Any]:
        """The steps up to the last snapshot (a resumed run repeats those after it) and the
        events."""
        return {
            "steps": recorder.last_step,
            "events": event_lines(self.events),
        }


def particle_reference(
    config: Config[SphereProblem], n: int, seed: int = 0, dt: float | None = None
) -> xr.Dataset:
    """``n`` tokens from the initial law moved by the CF4 token system
    (:mod:`tpde.validation.s2_tokens`), at the run's snapshot times: ``tokens (time, token,
    xyz)``, their histogram ``density`` on the run's cells, mass, moments, interaction
    energy (``A = beta I``, ``V = I``) and degree amplitudes of all tokens (exact sums).
    vMF and mixture starts are sampled exactly; other kinds from the cell averages."""
    from tpde.validation.s2_tokens import (
        SphereTokens,
        sample_cell_tokens,
        sample_mixture,
        sample_von_mises_fisher,
        token_amplitudes,
        token_energy,
        token_moments,
    )

    if n < 1:
        raise ConfigError(f"--tokens: expected an integer >= 1, got {n}")
    problem = config.problem
    kind = problem.initial.get("kind", "uniform")
    if kind == "von_mises_fisher":
        x0 = sample_von_mises_fisher(
            n,
            problem.initial.get("mean", [0.0, 0.0, 1.0]),
            float(problem.initial.get("kappa", 1.0)),
            seed,
        )
    elif kind == "mixture":
        x0 = sample_mixture(n, _components(problem.initial), seed)
    else:
        x0 = sample_cell_tokens(problem.density, problem.grid, n, seed)
    field = problem.velocity
    step = dt or float(np.min(np.diff(problem.times))) / 10
    start = _time.perf_counter()
    system = SphereTokens(x0, field.A, field.V, normalised=field.normalised)
    path = system.integrate(problem.times, step)
    grid = problem.grid
    density = np.stack([cs.point_histogram(grid, x) for x in path])
    beta = field.beta if field.identity_v else None
    ds = sphere_dataset(
        grid,
        problem.times,
        density,
        config.text,
        f"tpde tokens on the sphere, n = {n}",
        "token histogram",
        beta=beta,
        degrees=DEGREES,
        energy=None if beta is None else np.array([token_energy(x, beta) for x in path]),
        amplitudes=token_amplitudes(path, DEGREES),
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
        status_time=float(problem.times[-1]),
        status_message="",
        seed=int(seed),
        dt=step,
        steps=int(system.evaluations // 4),
        wall_time=_time.perf_counter() - start,
    )
    return ds


def _config_beta(text: str) -> float | None:
    """``beta`` of a stored sphere config with ``A = beta I``, ``V = I``, normalised or not
    (the interaction energy's case), else None."""
    try:
        field = build_sphere(parse_toml(text, "config")).problem.velocity
    except (ConfigError, ValueError):
        return None
    return field.beta if field.identity_v else None


def info_lines(ds: xr.Dataset, grid: cs.CubedSphere) -> list[str]:
    """What ``tpde info`` says of a sphere file's last snapshot beyond every file's lines
    (:func:`tpde.cli.cmd_info`): the mean vector, the clusters (cells plus atoms: an atom's
    mass in the cell of its centre) and the interaction energy (``A = beta I``, ``V = I``)."""
    if not ds.sizes["time"]:
        return []
    m = ds["mean_vector"].values[-1]
    lines = [f"  mean vector ({m[0]:.6g}, {m[1]:.6g}, {m[2]:.6g})"]
    last = from_file(ds["density"].values[-1])
    held = ""
    if "atom_id" in ds:  # cells plus atoms
        from tpde.validation.sphere_atoms import cell_masses

        used = np.nan_to_num(np.asarray(ds["atom_id"].values[-1], float), nan=-1) >= 0
        centre = np.asarray(ds["atom_centre"].values[-1])[used]
        last = last + cell_masses(grid, centre, np.asarray(ds["atom_mass"].values[-1])[used])
        held = ", cells plus atoms"
    centres, masses = cs.clusters(grid, last)
    lines.append(f"  clusters at the last snapshot (> 2x uniform{held}): {len(masses)}")
    for x, mass in list(zip(centres, masses, strict=True))[:12]:
        lat, lon = cs.lat_lon(x)
        lines.append(f"    lat {float(lat):7.2f}  lon {float(lon):8.2f}  mass {mass:.4f}")
    beta: float | None = None
    energy = math.nan
    if "energy_interaction" in ds:  # recorded at every snapshot (grid or tokens)
        beta = float(ds["energy_interaction"].attrs["beta"])
        energy = float(ds["energy_interaction"].values[-1])
    elif "tokens" not in ds:  # a file of tpde before the record
        beta = _config_beta(str(ds.attrs.get("config", "")))
        if beta is not None:
            from tpde.variants.cubed_sphere import interaction_energy

            energy = interaction_energy(from_file(ds["density"].values[-1]), grid, beta)
    if beta is not None:
        lines.append(
            f"  interaction energy at the last snapshot (beta = {beta:g}): {energy:.10g} "
            f"(uniform {math.sinh(beta) / (2 * beta * beta):.6g}, "
            f"point mass {math.exp(beta) / (2 * beta):.6g})"
        )
    return lines
