"""tpde: a finite-volume solver for the Transformer PDE.

``tpde.simulate(config)`` runs a configuration (a TOML path or text, or a mapping) and
returns an ``xarray.Dataset``; the physics lives in ``tpde.grid``, ``tpde.schemes``,
``tpde.variants`` and ``tpde.validation``. Importing ``tpde`` (or a subpackage) has no side
effect: the thread policy is applied when a solver is built
(:func:`tpde.grid.threads.set_num_threads` sets it explicitly).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tpde")
except PackageNotFoundError:  # pragma: no cover - running from a tree that is not installed
    __version__ = "0+unknown"

__all__ = ["__version__", "set_num_threads", "simulate"]


def __getattr__(name: str):
    # lazy: importing tpde.grid must load neither numba nor xarray / netCDF4
    if name == "simulate":
        from .run import simulate

        return simulate
    if name == "set_num_threads":
        from tpde.grid.threads import set_num_threads

        return set_num_threads
    if name in SUBMODULES:  # ``import tpde; tpde.io.read(...)`` as the docs write it
        import importlib

        return importlib.import_module(f"tpde.{name}")
    raise AttributeError(f"module 'tpde' has no attribute {name!r}")


#: the subpackages and face modules ``tpde.NAME`` reaches without an import of its own
SUBMODULES = frozenset(
    (
        "grid",
        "schemes",
        "variants",
        "validation",
        "config",
        "run",
        "io",
        "cli",
        "plots",
        "sweep",
        "circle",
        "sphere",
        "circle_plots",
        "sphere_plots",
        "geometries",
        "references",
    )
)
