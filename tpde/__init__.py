"""tpde: a finite-volume solver for the Transformer PDE.

``tpde.simulate(config)`` runs a configuration (a TOML path or text, or a mapping) and
returns an ``xarray.Dataset``; the physics lives in ``tpde.grid``, ``tpde.schemes``,
``tpde.variants`` and ``tpde.validation``.
"""

from .threads import set_num_threads

__version__ = "0.1.0"

set_num_threads()

__all__ = ["set_num_threads", "simulate"]


def __getattr__(name: str):
    # lazy: importing tpde.grid must not pull in xarray / netCDF4 through tpde.run
    if name == "simulate":
        from .run import simulate

        return simulate
    raise AttributeError(f"module 'tpde' has no attribute {name!r}")
