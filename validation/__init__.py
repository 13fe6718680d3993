"""Validation: Gaussian mean/covariance ODEs (gaussian.py), the interacting-token system
(particles.py) and distances (metrics.py); the studies that run the grid solver against
them are ``tpde.validation.studies`` (behind ``tpde validate``).

The names of gaussian.py are re-exported here; the other modules are imported by name
(``from tpde.validation.particles import TokenSystem``).
"""

from . import gaussian
from .gaussian import *  # noqa: F403  (the public names of gaussian.py)

__all__ = list(gaussian.__all__)
