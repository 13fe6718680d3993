"""Velocity fields: prescribed fields and the attention variants of the Transformer PDE.

``ATTENTION`` maps a variant name to its velocity-field class (one file per variant). Done:
softmax and multi-head (dense or separable sums), linear (moments, O(N)), l2 (the softmax
engines on the reweighted density). To come: Sinkhorn, sigmoid, masked.
"""

from .base import VelocityField
from .l2 import L2Attention
from .parameters import Head, L2Head, Layers, SinkhornHead, head_from_qk, params_at
from .prescribed import AffineVelocity, ConstantVelocity, FunctionVelocity
from .softmax import LinearAttention, SoftmaxAttention

ATTENTION = {
    "softmax": SoftmaxAttention,
    "multihead": SoftmaxAttention,
    "linear": LinearAttention,
    "l2": L2Attention,
}

__all__ = ["VelocityField", "ConstantVelocity", "AffineVelocity", "FunctionVelocity", "Head",
           "L2Head", "Layers", "SinkhornHead", "head_from_qk", "params_at", "ATTENTION",
           "SoftmaxAttention", "LinearAttention", "L2Attention"]
