"""tpde: a finite-volume solver for the Transformer PDE."""

from .threads import set_num_threads

__version__ = "0.1.0"

set_num_threads()

__all__ = ["set_num_threads"]
