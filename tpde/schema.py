"""The configuration schema: every key of every section and geometry, with its default and
what it means, in one table (docs/reference/config.md is generated from it by
tools/reference.py).

``FLAT[section][key] = (default, description)``, and the same for ``CIRCLE`` and ``SPHERE``
(their sections hold only the keys they read themselves; the circle takes the flat
``[scheme]`` and ``[run]``). Defaults are written as they would be in TOML (``"required"``
for the physics that has none). tpde.config derives the known keys of the flat
``[grid]``, ``[initial]`` and ``[run]`` sections from ``FLAT``; the ``[attention]`` and
``[scheme]`` keys are read from the variants' and ``Scheme``'s own code, and
tests/test_docs.py checks that this table documents exactly those keys (and the circle's and
sphere's ``KEYS``). Importing it loads nothing but the standard library.
"""

from __future__ import annotations

__all__ = ["CIRCLE", "FLAT", "GEOMETRIES", "SPHERE", "Entry"]

#: (default as written in TOML, one-line description)
Entry = tuple[str, str]

FLAT: dict[str, dict[str, Entry]] = {
    "grid": {
        "geometry": ('"flat"', '`"flat"` (R^d), `"circle"` or `"sphere"` (the tables below)'),
        "lower": ("required", "lower corner of the box, one value per axis (d = 1, 2, 3)"),
        "upper": ("required", "upper corner of the box"),
        "cells": ("required", "cells per axis (a scalar: the same for every axis)"),
        "boundary": (
            '"outflow"',
            "`outflow`, `periodic`, `noflux`, or one per axis; outflow counts what leaves",
        ),
        "positions": ("16", "masked attention only: position slices of s in (0, 1]"),
        "sink_mass": ("0.1", "masked attention only: nu-mass of the attention sink at s = 0"),
    },
    "initial": {
        "kind": (
            '"gaussian"',
            "`gaussian`, `mixture`, `uniform`, `tokens` or `file` (the keys below say which)",
        ),
        "mean": ("required", "gaussian: the mean"),
        "covariance": ("required", "gaussian: the covariance (symmetric positive definite)"),
        "mean_drift": (
            "none",
            "gaussian, masked attention: the mean moves with the position, `mean + s * mean_drift`",
        ),
        "weights": ("required", "mixture: the components' weights (normalised)"),
        "means": ("required", "mixture: the components' means, one list per component"),
        "covariances": ("required", "mixture: the components' covariances"),
        "center": ("required", "uniform ball: its centre (with `radius`)"),
        "radius": ("required", "uniform ball: its radius"),
        "lower": ("required", "uniform box: its lower corner (with `upper`)"),
        "upper": ("required", "uniform box: its upper corner"),
        "file": (
            "required",
            "tokens: a .npy of (n, d) samples; file: a tpde output on the same grid; "
            "relative to the config file's folder",
        ),
        "deposit": ('"cic"', "tokens: `cic` (cloud in cell) or `ngp` (nearest grid point)"),
        "snapshot": ("-1", "file: which snapshot of the file to start from"),
    },
    "attention": {
        "variant": (
            '"softmax"',
            "`softmax`, `multihead`, `l2`, `sinkhorn`, `sigmoid` or `linear`",
        ),
        "A": ("required", "the d x d kernel matrix `A = scale K^T Q` (or give `Q` and `K`)"),
        "Q": ("none", "queries (k x d); with `K`: `A = scale K^T Q` (l2 needs `Q` and `K`)"),
        "K": ("none", "keys (k x d)"),
        "V": ("required", "values: d x d, or k x d with `W`"),
        "W": ("none", "output matrix (d x k): the value map is `W V`"),
        "scale": (
            "1.0",
            "multiplies `A` (l2: `Q`); the authors' code uses 1/sqrt(d)",
        ),
        "epsilon": ("1.0", "sinkhorn: the entropic regularisation"),
        "bias": ("0.0", "sigmoid: the bias inside the sigmoid"),
        "engine": (
            '"auto"',
            "kernel sums: `auto`, `direct`, `separable`; `fft` (softmax, symmetric A), "
            "`lattice` (sigmoid); aliases `dense`, `tables`, `convolution`",
        ),
        "nodes": ("automatic", "separable engine: table nodes per axis"),
        "tol": ("1e-11", "sinkhorn: stop when the marginal error is below this"),
        "max_iter": ("1000", "sinkhorn: most iterations per evaluation (then an error)"),
        "masked": (
            "false",
            "causal attention over `grid.positions` slices (not for sinkhorn)",
        ),
        "heads": ("none", "`[[attention.heads]]`: one table per head (A or Q, K; V; W)"),
        "layers": (
            "none",
            "`[[attention.layers]]`: `t_start` plus the keys above (or heads) per layer",
        ),
    },
    "scheme": {
        "reconstruction": (
            '"weno5z"',
            "`upwind`, `muscl`, `muscl-mc`, `muscl-vanleer`, `weno5` (JS), `weno5z`",
        ),
        "integrator": ('"ssprk3"', "`ssprk1`, `ssprk2`, `ssprk3`"),
        "cfl": ("0.4", "fraction (0, 1] of the positivity bound on the step"),
        "dt": ("none", "a fixed step (must satisfy the bound; shortened to land on snapshots)"),
        "dt_max": ("none", "upper bound on the adaptive step"),
        "face_quadrature": (
            '"auto"',
            "`auto`, `midpoint`, `gauss` (auto: Gauss unless face-constant)",
        ),
        "face_velocity": (
            '"auto"',
            "`auto`, `exact`, `interpolated`: how the velocity reaches the faces' Gauss nodes",
        ),
        "positivity": ("true", "the positivity-preserving flux limiter"),
        "frame": ('"fixed"', "`fixed` box, or `affine`: the co-moving frame (grid in frame units)"),
        "frame_tolerance": (
            "1e-10",
            "the co-moving frame's local error per step, relative to ||L||",
        ),
    },
    "run": {
        "t_end": ("required", "the final time (> `t_start`)"),
        "t_start": ("0.0", "the initial time"),
        "snapshots": ("41", "a count (both ends included) or a list of times"),
        "output": ('"out.nc"', "the output file (`-o` overrides; `.zarr` for a Zarr store)"),
        "max_outflow": ("1e-3", "stop with status `mass_left_domain` beyond this fraction"),
        "box_tolerance": ("1e-4", "the box measures' limit (edge mass, cut of the tilted laws)"),
        "box_action": ('"stop"', "`stop` with status `box_limited`, or `warn`: record an event"),
        "collapse_ratio": ("1e-4", "record a `collapse` event below this eigenvalue ratio"),
        "resolution_tolerance": (
            "1e-3",
            "the resolution monitor's limit: the share of the mass the reconstruction misplaced",
        ),
        "noise": ("0.0", "eps of the noise term eps Delta mu (>= 0; docs/guide/noise.md)"),
        "resolution_action": (
            '"warn"',
            "`warn`: record an `under_resolved` event and go on; `stop`: end the run there; "
            "`warn_then_stop`: end a fixed box at 10x the tolerance",
        ),
    },
}

CIRCLE: dict[str, dict[str, Entry]] = {
    "grid": {
        "geometry": ('"circle"', "the unit circle S^1 as a periodic angle grid"),
        "cells": ("required", "angle cells (>= 7)"),
        "copies": ("1", "m > 1: one period of an m-fold symmetric density"),
        "positions": ("16", "masked attention: position slices"),
        "sink_mass": ("0.1", "masked attention: nu-mass of the attention sink"),
    },
    "initial": {
        "kind": ('"uniform"', "`uniform`, `noise`, `von_mises` or `mixture`"),
        "modes": ("[]", "uniform: `[[k, amplitude, phase], ...]` added to the uniform law"),
        "amplitude": ("1e-3", "noise: its amplitude"),
        "k_max": ("32", "noise: highest Fourier mode of the noise"),
        "seed": ("0", "noise: random seed"),
        "mean": ("0.0", "von_mises: the mean angle"),
        "kappa": ("1.0", "von_mises: the concentration"),
        "weights": ("required", "mixture: the components' weights"),
        "means": ("required", "mixture: the components' mean angles"),
        "kappas": ("required", "mixture: the components' concentrations"),
    },
    "attention": {
        "variant": ('"softmax"', "softmax only (`normalised = false` for the unnormalised one)"),
        "beta": ("required", "`A = beta I`, `V = I`; or give `A` (and `V`)"),
        "A": ("none", "a 2 x 2 kernel matrix instead of `beta`"),
        "V": ("identity", "2 x 2 values (with `A`)"),
        "W": ("none", "2 x 2 output matrix"),
        "normalised": ("true", "false: the unnormalised variant"),
        "engine": (
            '"auto"',
            "`auto`, `fft` (convolution; the Bessel series where A is not a I + b J), "
            "`bessel` (the series), `direct` (dense sums); aliases `series`, `dense`",
        ),
        "masked": ("false", "causal attention over `grid.positions` slices"),
    },
    "atoms": {  # the table turns atoms on (docs/guide/atoms.md); every key optional
        "width": ("2.0", "a cluster narrower than this many cells (its sd) becomes an atom"),
        "floor": ("0.01", "its cells reach down to this fraction of its peak"),
        "level": ("2.0", "only maxima above this times the uniform density count"),
        "absorb": ("2.0", "the cells within this many cells of an atom join it"),
        "merge": ("0.5", "atoms closer than this many cells (or their widths) merge"),
        "release": ("4.0", "an atom wider than this many cells goes back to the cells"),
    },
}

# the flat geometry's atoms: Gaussian atoms in the co-moving frame (scheme.frame = "affine",
# softmax or multi-head softmax), the same keys in cells of the frame's grid
FLAT["atoms"] = CIRCLE["atoms"]

SPHERE: dict[str, dict[str, Entry]] = {
    "grid": {
        "geometry": ('"sphere"', "the unit sphere S^2 as the equiangular cubed sphere"),
        "cells": ("required", "cells per panel edge, 6 .. 256 (6 n^2 cells)"),
    },
    "initial": {
        "kind": ('"uniform"', "`uniform`, `noise`, `von_mises_fisher` or `mixture`"),
        "modes": ("[]", "uniform: `[[l, amplitude], ...]` zonal modes about `axis`"),
        "axis": ("[0.0, 0.0, 1.0]", "uniform: the modes' axis"),
        "amplitude": ("1e-3", "noise: its amplitude"),
        "l_max": ("8", "noise: highest spherical-harmonic degree"),
        "seed": ("0", "noise: random seed"),
        "mean": ("[0.0, 0.0, 1.0]", "von_mises_fisher: the mean direction"),
        "kappa": ("1.0", "von_mises_fisher: the concentration"),
        "weights": ("required", "mixture: the components' weights"),
        "means": ("required", "mixture: the components' mean directions"),
        "kappas": ("required", "mixture: the components' concentrations"),
    },
    "attention": {
        "variant": ('"softmax"', "softmax only"),
        "beta": ("required", "`A = beta I`, `V = I`; or give `A` (and `V`)"),
        "A": ("none", "a general 3 x 3 kernel matrix instead of `beta`"),
        "V": ("identity", "3 x 3 values (with `A`)"),
        "normalised": ("true", "false: the unnormalised variant"),
        "nodes": ("3", "Gauss nodes a cell axis for the attention sums (2 .. 5)"),
        "engine": (
            '"auto"',
            "`auto` = `harmonic` (spherical harmonics), `direct` (dense sums); aliases "
            "`harmonics`, `dense`",
        ),
    },
    "scheme": {
        "reconstruction": ('"weno5z"', "`upwind`, `muscl`, `weno5`, `weno5z`"),
        "integrator": ('"ssprk3"', "`euler`, `ssprk2`, `ssprk3`"),
        "cfl": ("0.5", "fraction (0, 1] of the step bound"),
        "dt_max": ("none", "upper bound on the step"),
        "limiter": ("true", "the positivity (FCT) limiter"),
        "velocity_at": (
            '"nodes"',
            "`nodes`: the field at every Gauss node; `centres`: at face centres, interpolated",
        ),
    },
    "run": {
        "t_end": ("required", "the final time"),
        "snapshots": ("41", "a count (2 .. 10000) or a list of times from 0"),
        "output": ('"out.nc"', "the output file (`-o` overrides)"),
        "noise": ("0.0", "eps of the noise term eps Delta mu, Laplace-Beltrami (>= 0)"),
    },
    # the table turns von Mises-Fisher atoms on (docs/guide/sphere.md); every key optional
    "atoms": CIRCLE["atoms"],
}

#: geometry name -> (title, schema) in the order the reference lists them
GEOMETRIES: dict[str, tuple[str, dict[str, dict[str, Entry]]]] = {
    "flat": ("Flat grids (R^d, d = 1, 2, 3)", FLAT),
    "circle": (
        'The circle (`geometry = "circle"`; `[scheme]` and `[run]` as on flat grids)',
        CIRCLE,
    ),
    "sphere": ('The sphere (`geometry = "sphere"`)', SPHERE),
}
