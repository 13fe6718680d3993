"""Validation: Gaussian mean/covariance ODEs (gaussian.py); the token system, distances and
reports come next (see docs/architecture.md)."""

from . import gaussian
from .gaussian import *  # noqa: F403  (the public names of gaussian.py)

__all__ = list(gaussian.__all__)
