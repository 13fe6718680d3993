"""The kernel-sums interface every engine implements (:class:`KernelSums`).

For a measure ``mu = sum_s w_s delta_{y_s}`` (``w_s >= 0``, points ``y_s`` in R^d, on the
circle S^1 in R^2, on the sphere S^2 in R^3) and a kernel ``k(c, y)`` of the tilt ``c = A x``
of a target ``x``, an engine returns at tilts ``c (P, d)``

    log Z(c) = log sum_s w_s k(c, y_s)                     (P,)
    m(c)     = sum_s w_s y_s k(c, y_s) / Z(c)              (P, d)

with ``k = e^{c . y}`` for the exponential variants (softmax, multi-head, l2, Sinkhorn, on
every geometry: ``m`` is the tilted mean, ``grad log Z``) and ``k = sigma(c . y + b)`` for
sigmoid. ``tolerance`` is the engine's stated accuracy against the dense sums of the same
measure: ``|log Z - log Z_direct| <= tolerance`` and ``|m - m_direct| <= tolerance * R``,
``R = max_s |y_s|`` (on a case inside its stated domain: symmetric ``A`` for the FFT, tilts in
the table's box, ...); ``error()`` is the engine's own a posteriori estimate of its last call
in the same units, 0 where the sums are exact to round-off, NaN where the engine has none.
``name`` is its name in :data:`~.registry.ENGINES`.

Engines that serve lattices only (the convolutions, the sheared passes, sigmoid's recurrence)
are built for a lattice and answer at its tilts, raising ValueError at any others.
:mod:`tpde.variants.kernel_sums` holds the adapters where an engine's own call differs.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["KernelSums"]


@runtime_checkable
class KernelSums(Protocol):
    """What a kernel-sum engine provides (module docstring)."""

    #: the engine's name in :data:`~.registry.ENGINES`
    name: str
    #: its stated accuracy against the dense sums (module docstring)
    tolerance: float

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        """``log Z(c)`` at tilts ``c (P, d)``: (P,)."""
        ...

    def means(self, c: np.ndarray) -> np.ndarray:
        """``m(c)`` at tilts ``c (P, d)``: (P, d)."""
        ...

    def error(self) -> float:
        """The a posteriori estimate of the last call's error (0: exact to round-off; NaN:
        none)."""
        ...
