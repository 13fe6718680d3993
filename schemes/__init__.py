"""Finite-volume schemes: reconstructions, fluxes, positivity limiter, SSP Runge-Kutta."""

from tpde.threads import set_num_threads

from .operator import FaceVelocity, FluxOperator, PositivityError
from .reconstruction import RECONSTRUCTIONS, get_reconstruction
from .rk import INTEGRATORS, SSPRK, get_integrator

__all__ = [
    "FluxOperator",
    "FaceVelocity",
    "PositivityError",
    "RECONSTRUCTIONS",
    "get_reconstruction",
    "INTEGRATORS",
    "SSPRK",
    "get_integrator",
    "set_num_threads",
]
