"""tpde: a finite-volume solver for the Transformer PDE."""

__version__ = "0.1.0"
