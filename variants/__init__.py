"""Velocity fields: prescribed fields and (later) the attention variants of the Transformer PDE."""

from .base import VelocityField
from .parameters import Head, L2Head, Layers, SinkhornHead, head_from_qk, params_at
from .prescribed import AffineVelocity, ConstantVelocity, FunctionVelocity

__all__ = ["VelocityField", "ConstantVelocity", "AffineVelocity", "FunctionVelocity", "Head",
           "L2Head", "Layers", "SinkhornHead", "head_from_qk", "params_at"]
