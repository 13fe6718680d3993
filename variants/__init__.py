"""Velocity fields: prescribed fields and the attention variants of the Transformer PDE.

``ATTENTION`` maps a variant name to its velocity-field class (one file per variant):
softmax and multi-head (:mod:`.softmax`), linear (moments, O(N)), l2 (:mod:`.l2`), Sinkhorn
(:mod:`.sinkhorn`) and sigmoid (:mod:`.sigmoid`). The exponential-kernel variants share the
kernel-sum engines of :mod:`.direct` (dense reference) and :mod:`.separable` (fast tables).
:class:`CausalAttention` (:mod:`.masked`) makes softmax, multi-head, l2, sigmoid and linear
causal over position slices.
"""

from tpde.schemes.velocity import VelocityField

from .l2 import L2Attention
from .masked import MASKABLE, CausalAttention
from .parameters import (
    Head,
    L2Head,
    Layers,
    SigmoidHead,
    SinkhornHead,
    head_from_qk,
    params_at,
)
from .prescribed import AffineVelocity, ConstantVelocity, FunctionVelocity
from .sigmoid import SigmoidAttention
from .sinkhorn import SinkhornAttention, SinkhornError
from .softmax import LinearAttention, SoftmaxAttention

ATTENTION = {
    "softmax": SoftmaxAttention,
    "multihead": SoftmaxAttention,
    "linear": LinearAttention,
    "l2": L2Attention,
    "sinkhorn": SinkhornAttention,
    "sigmoid": SigmoidAttention,
}

__all__ = [
    "VelocityField",
    "ConstantVelocity",
    "AffineVelocity",
    "FunctionVelocity",
    "Head",
    "L2Head",
    "Layers",
    "SigmoidHead",
    "SinkhornHead",
    "head_from_qk",
    "params_at",
    "ATTENTION",
    "SoftmaxAttention",
    "LinearAttention",
    "L2Attention",
    "SinkhornAttention",
    "SinkhornError",
    "SigmoidAttention",
    "CausalAttention",
    "MASKABLE",
]
