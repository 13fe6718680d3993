"""The engine vocabulary: every kernel-sum engine's name, and which names each geometry's
``[attention] engine`` takes.

One table (``ENGINES``) names every engine once, with the module that implements it and the
:class:`~.protocol.KernelSums` adapter that states its accuracy
(:mod:`tpde.variants.kernel_sums`). ``CONFIG_ENGINES`` says, per geometry and (on flat grids)
per variant, which names the config accepts, ``"auto"`` first; :func:`check_engine` is the one
validation every config and every velocity field uses, with the one-line error that names the
allowed values. ``ALIASES`` are other spellings of a name, read as that name.

Not every engine is a config value: the sheared passes are how the separable tables reach a
lattice (the policy chooses them under ``"separable"`` or ``"auto"``), and on the circle
``"fft"`` takes the Bessel series where the convolution does not apply (a head that is not
``a I + b J``), as it always has; ``"bessel"`` asks for the series at every head.

Imports nothing: the face's config modules and the variants read it alike.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALIASES",
    "CONFIG_ENGINES",
    "ENGINES",
    "Engine",
    "canonical",
    "check_engine",
    "engine_names",
]


@dataclass(frozen=True)
class Engine:
    """One kernel-sum engine: its name, where it lives, what it sums and on which geometry."""

    name: str
    module: str
    geometry: str
    summary: str


#: every engine, by name (one vocabulary; "auto" is a choice, not an engine)
ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine(
            "direct",
            "tpde.variants.engines.direct",
            "every",
            "dense sums over the cells or nodes that hold mass (the reference)",
        ),
        Engine(
            "separable",
            "tpde.variants.engines.separable",
            "flat",
            "tables of the moment-generating function, interpolated to the tilts",
        ),
        Engine(
            "sheared",
            "tpde.variants.engines.sheared",
            "flat",
            "the separable tables onto a lattice by sheared 1-D passes (chosen by the policy)",
        ),
        Engine(
            "fft",
            "tpde.variants.engines.fft",
            "flat, circle",
            "convolutions: symmetric A on a flat grid, A = a I + b J on the circle",
        ),
        Engine(
            "bessel",
            "tpde.variants.engines.bessel",
            "circle",
            "the Jacobi-Anger series for any 2 x 2 A, cut a posteriori",
        ),
        Engine(
            "harmonic",
            "tpde.variants.engines.sphere_harmonics",
            "sphere",
            "spherical harmonics (the plane-wave expansion, non-uniform transforms)",
        ),
        Engine(
            "lattice",
            "tpde.variants.sigmoid",
            "flat",
            "sigmoid's recurrence along the rows of a lattice of targets",
        ),
    )
}

#: the tilted-mean variants' names on a flat grid (softmax adds "fft")
_TILTED = ("auto", "direct", "separable")

#: the names ``[attention] engine`` takes: per geometry, and on a flat grid per variant
#: ("linear" has no kernel sums, so no engine key)
CONFIG_ENGINES: dict[str, dict[str, tuple[str, ...]]] = {
    "flat": {
        "softmax": _TILTED + ("fft",),
        "multihead": _TILTED + ("fft",),
        "l2": _TILTED,
        "sinkhorn": _TILTED,
        "sigmoid": ("auto", "lattice", "direct"),
    },
    "circle": {"softmax": ("auto", "fft", "bessel", "direct")},
    "sphere": {"softmax": ("auto", "harmonic", "direct")},
}

#: other spellings, read as the name they map to (in every geometry that takes that name)
ALIASES: dict[str, str] = {
    "dense": "direct",
    "tables": "separable",
    "convolution": "fft",
    "series": "bessel",
    "jacobi-anger": "bessel",
    "harmonics": "harmonic",
}

_WHERE = {"flat": "on a flat grid", "circle": "on the circle", "sphere": "on the sphere"}


def engine_names(geometry: str, variant: str = "softmax") -> tuple[str, ...]:
    """The names ``[attention] engine`` takes for ``variant`` on ``geometry`` ("auto" first);
    () where the variant has no kernel sums."""
    return CONFIG_ENGINES[geometry].get(variant, ())


def canonical(name: str) -> str:
    """``name`` with an alias replaced by the name it stands for."""
    return ALIASES.get(name, name)


def check_engine(name: object, geometry: str, variant: str = "softmax") -> str:
    """The engine name ``name`` stands for (an alias read as its name), or a ValueError in one
    line that names the allowed values for ``variant`` on ``geometry``."""
    allowed = engine_names(geometry, variant)
    if not isinstance(name, str):
        raise ValueError(f"attention.engine: expected a name, got {name!r:.40}")
    engine = canonical(name)
    if engine not in allowed:
        what = variant if geometry == "flat" else "attention"
        raise ValueError(
            f"attention.engine: {name!r} is not an engine of {what} {_WHERE[geometry]}; "
            f"choose one of {', '.join(allowed)}"
        )
    return engine
