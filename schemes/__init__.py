"""Finite-volume schemes: reconstructions, fluxes, positivity limiter, SSP Runge-Kutta, and
the time loop that drives them (:mod:`.solver`, imported by name) against the velocity
protocol of :mod:`.velocity`."""

from .operator import FaceVelocity, FluxOperator, PositivityError
from .reconstruction import RECONSTRUCTIONS, get_reconstruction
from .rk import INTEGRATORS, SSPRK, get_integrator
from .velocity import VelocityField

__all__ = [
    "FluxOperator",
    "FaceVelocity",
    "PositivityError",
    "RECONSTRUCTIONS",
    "get_reconstruction",
    "INTEGRATORS",
    "SSPRK",
    "get_integrator",
    "VelocityField",
]
