"""Velocity fields: prescribed fields and the attention variants of the Transformer PDE.

``ATTENTION`` maps a variant name to its velocity-field class (one file per variant). Done:
softmax and multi-head (exact dense sums), linear (moments, O(N)). To come: l2, Sinkhorn,
sigmoid, masked, and the fast engines (FFT / separable sums).
"""

from .base import VelocityField
from .parameters import Head, L2Head, Layers, SinkhornHead, head_from_qk, params_at
from .prescribed import AffineVelocity, ConstantVelocity, FunctionVelocity
from .softmax import LinearAttention, SoftmaxAttention

ATTENTION = {
    "softmax": SoftmaxAttention,
    "multihead": SoftmaxAttention,
    "linear": LinearAttention,
}

__all__ = ["VelocityField", "ConstantVelocity", "AffineVelocity", "FunctionVelocity", "Head",
           "L2Head", "Layers", "SinkhornHead", "head_from_qk", "params_at", "ATTENTION",
           "SoftmaxAttention", "LinearAttention"]
