"""Velocity fields: prescribed fields and (later) the attention variants of the Transformer PDE."""

from .base import VelocityField
from .prescribed import AffineVelocity, ConstantVelocity, FunctionVelocity

__all__ = ["VelocityField", "ConstantVelocity", "AffineVelocity", "FunctionVelocity"]
