"""Attention parameters shared by the grid variants, the token system and the Gaussian ODEs.

One head is ``Head(A, V, W=None)`` with ``A = K^T Q`` (d x d) and the value matrix ``V``
(d x d, or k x d with an output matrix ``W``, d x k; the head acts through ``C = W V``);
``head_from_qk`` builds it from queries and keys (``A = scale K^T Q``). The l2 kernel needs
``Q`` and ``K`` themselves: ``L2Head(Q, K, V, scale, W)``, kernel exp(-|scale Q x - K y|^2).
Sinkhorn adds the entropic parameter: ``SinkhornHead(A, V, W, eps)``; sigmoid its bias:
``SigmoidHead(A, V, W, bias)``. Multi-head attention is a
sequence of heads (docs/theory.md, 'Conventions'). Time dependence (docs/theory.md,
'Layer-wise parameters'): a constant parameter object, piecewise-constant
``Layers`` (or ``{"layers": [(t_start, params), ...]}``), or a callable ``t -> params``;
``params_at(spec, t)`` resolves any of them. Invalid entries raise ValueError with one line
naming the field (``Head.A: expected 2 x 2, got 3 x 3``); for a head's own fields it is a
:class:`ParameterError`, which carries the field name.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "Head",
    "L2Head",
    "Layers",
    "ParamSpec",
    "ParameterError",
    "Params",
    "SigmoidHead",
    "SinkhornHead",
    "as_param_spec",
    "checked_matrix",
    "head_at",
    "head_from_qk",
    "params_at",
    "shape_str",
]


# ------------------------------------------------------------------------------
class ParameterError(ValueError):
    """An invalid attention parameter. ``str()`` is ``"<name>: <detail>"`` (one line);
    ``name`` is the qualified name (``Head.A``, ``SinkhornHead.eps``), ``field`` its last
    part (``A``, ``eps``): a caller can name the key it came from without parsing text."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.field = name.rsplit(".", 1)[-1]
        self.detail = detail


def shape_str(shape: tuple[int, ...]) -> str:
    return " x ".join(str(s) for s in shape) if shape else "a scalar"


def checked_matrix(
    name: str,
    value: Any,
    shape: tuple[int | None, int | None] | None = None,
    what: str | None = None,
) -> np.ndarray:
    """Return ``value`` as a read-only float 2-D array, checking shape and finiteness.

    ``shape`` entries that are None are free.  Raises ValueError with one line naming ``name``.
    """
    try:
        arr = np.array(value, dtype=float)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ParameterError(name, f"expected a real matrix, got {type(value).__name__}") from exc
    if shape is not None:
        expect = what or " x ".join("?" if s is None else str(s) for s in shape)
        if arr.ndim != 2 or any(
            s is not None and s != n for s, n in zip(shape, arr.shape, strict=True)
        ):
            raise ParameterError(name, f"expected {expect}, got {shape_str(arr.shape)}")
    if not np.all(np.isfinite(arr)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        raise ParameterError(name, f"entries must be finite, got {arr[bad]} at {bad}")
    arr.setflags(write=False)
    return arr


def _value_and_output(owner: str, d: int, V: Any, W: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """Check V (d x d, or k x d with W of shape d x k)."""
    if W is None:
        return checked_matrix(f"{owner}.V", V, (d, d), f"{d} x {d} (no W given)"), None
    Vm = checked_matrix(f"{owner}.V", V, (None, d), f"k x {d}")
    Wm = checked_matrix(
        f"{owner}.W", W, (d, Vm.shape[0]), f"{d} x {Vm.shape[0]} (d x k, V is k x d)"
    )
    return Vm, Wm


@dataclass(frozen=True, eq=False)
class Head:
    """One softmax / linear / multi-head attention head (docs/theory.md, 'Conventions').

    A: (d, d), the attention matrix A = K^T Q (kernel exp(<A x, y>)); V: (d, d), or (k, d)
    with the output matrix W: (d, k).  The value map applied to the attention average is
    C = W V (d x d), or C = V without W.
    """

    A: np.ndarray
    V: np.ndarray
    W: np.ndarray | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        A = checked_matrix(f"{owner}.A", self.A)
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ParameterError(
                f"{owner}.A", f"expected a square d x d matrix, got {shape_str(A.shape)}"
            )
        V, W = _value_and_output(owner, A.shape[0], self.V, self.W)
        object.__setattr__(self, "A", A)
        object.__setattr__(self, "V", V)
        object.__setattr__(self, "W", W)

    @property
    def dim(self) -> int:
        return self.A.shape[0]

    @property
    def C(self) -> np.ndarray:
        """C = W V (d x d); C = V when there is no W (docs/theory.md, 'Conventions')."""
        return self.V if self.W is None else self.W @ self.V


@dataclass(frozen=True, eq=False)
class SinkhornHead(Head):
    """Sinkhorn attention head (docs/theory.md, 'Sinkhorn attention'): entropic plan for
    exp(<A x, y>/eps).

    A: (d, d) with A = K^T Q (no 1/sqrt(d) in the authors' code); V: (d, d), or (k, d) with
    W: (d, k); eps > 0 the entropic regularisation (1 in the authors' code).
    """

    eps: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        eps = float(self.eps)
        if not (math.isfinite(eps) and eps > 0):
            raise ParameterError("SinkhornHead.eps", f"expected a finite number > 0, got {eps}")
        object.__setattr__(self, "eps", eps)


@dataclass(frozen=True, eq=False)
class SigmoidHead(Head):
    """Sigmoid attention head (docs/theory.md, 'Sigmoid attention'):
    Gamma(x) = C int sigma(<A x, y> + bias) y dmu(y).

    A: (d, d); V: (d, d), or (k, d) with W: (d, k); bias: real (Ramapuram et al. use
    -log n for n tokens). Unnormalised: the field scales with the mass of mu.
    """

    bias: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        bias = float(self.bias)
        if not math.isfinite(bias):
            raise ParameterError("SigmoidHead.bias", f"expected a finite number, got {bias}")
        object.__setattr__(self, "bias", bias)


@dataclass(frozen=True, eq=False)
class L2Head:
    """l2 attention head (docs/theory.md, 'l2 attention'): kernel exp(-|scale Q x - K y|^2).

    Q, K: (k, d); V: (d, d), or (k', d) with W: (d, k'); scale: multiplies Q only (pass
    scale = 1/sqrt(d) to reproduce the authors' code, docs/theory.md, 'l2 attention').
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    scale: float = 1.0
    W: np.ndarray | None = None

    def __post_init__(self) -> None:
        Q = checked_matrix("L2Head.Q", self.Q)
        if Q.ndim != 2:
            raise ParameterError("L2Head.Q", f"expected k x d, got {shape_str(Q.shape)}")
        K = checked_matrix("L2Head.K", self.K, Q.shape, f"{shape_str(Q.shape)} (the shape of Q)")
        V, W = _value_and_output("L2Head", Q.shape[1], self.V, self.W)
        scale = float(self.scale)
        if not math.isfinite(scale):
            raise ParameterError("L2Head.scale", f"expected a finite number, got {scale}")
        object.__setattr__(self, "Q", Q)
        object.__setattr__(self, "K", K)
        object.__setattr__(self, "V", V)
        object.__setattr__(self, "W", W)
        object.__setattr__(self, "scale", scale)

    @property
    def dim(self) -> int:
        return self.Q.shape[1]

    @property
    def C(self) -> np.ndarray:
        return self.V if self.W is None else self.W @ self.V


def head_from_qk(Q: Any, K: Any, V: Any, W: Any = None, scale: float = 1.0) -> Head:
    """Head with A = scale K^T Q (docs/theory.md, 'Conventions': <Q x, K y> = <A x, y>).

    Q, K: (k, d); V: (d, d) or (k', d) with W: (d, k').  scale = 1/sqrt(d) reproduces the
    authors' single-head code, 1/sqrt(k) their multi-head code.
    """
    Qm = checked_matrix("Q", Q)
    if Qm.ndim != 2:
        raise ValueError(f"Q: expected k x d, got {shape_str(Qm.shape)}")
    Km = checked_matrix("K", K, Qm.shape, f"{shape_str(Qm.shape)} (the shape of Q)")
    return Head(float(scale) * Km.T @ Qm, V, W)


Params = Head | L2Head | SinkhornHead | SigmoidHead | Sequence[Head]


@dataclass(frozen=True, eq=False)
class Layers:
    """Piecewise-constant parameters: ``Layers([(t_start_0, p_0), (t_start_1, p_1), ...])``.

    Layer i is active on [t_start_i, t_start_{i+1}) (right-continuous; the last layer has no
    end).  Starts must be finite and strictly increasing.
    """

    layers: Sequence[tuple[float, Any]]
    starts: tuple[float, ...] = field(init=False, repr=False)
    params: tuple[Any, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        items = list(self.layers)
        if not items:
            raise ValueError("layers: expected at least one (t_start, params) pair, got none")
        starts: list[float] = []
        params: list[Any] = []
        for i, item in enumerate(items):
            try:
                t_start, p = item
                t_start = float(t_start)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"layers[{i}]: expected a (t_start, params) pair") from exc
            if not math.isfinite(t_start):
                raise ValueError(f"layers[{i}].t_start: expected a finite number, got {t_start}")
            if starts and t_start <= starts[-1]:
                raise ValueError(
                    f"layers[{i}].t_start: expected > {starts[-1]} (strictly increasing), "
                    f"got {t_start}"
                )
            starts.append(t_start)
            params.append(p)
        object.__setattr__(self, "layers", tuple(zip(starts, params, strict=True)))
        object.__setattr__(self, "starts", tuple(starts))
        object.__setattr__(self, "params", tuple(params))

    def at(self, t: float) -> Any:
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            raise ValueError(f"layers: t = {t} is before the first layer start {self.starts[0]}")
        return self.params[i]


ParamSpec = Params | Layers | Mapping[str, Any] | Callable[[float], Params]
_H = TypeVar("_H", bound=Head | L2Head)


def as_param_spec(spec: Any) -> Params | Layers | Callable[[float], Params]:
    if isinstance(spec, Mapping):
        if set(spec) != {"layers"}:
            raise ValueError(
                f"params: a mapping must have the single key 'layers', got {list(spec)}"
            )
        return Layers(spec["layers"])
    return spec


def head_at(spec: ParamSpec, t: float, kind: type[_H], variant: str, ndim: int) -> _H:
    """The single head of type ``kind`` in force at t, checked against the grid dimension."""
    head = params_at(spec, t)
    if not isinstance(head, kind):
        raise ValueError(
            f"attention: the {variant} variant needs a {kind.__name__}, got {type(head).__name__}"
        )
    if head.dim != ndim:
        raise ValueError(
            f"attention.A: expected {ndim} x {ndim} for a {ndim}-D grid, got "
            f"{head.dim} x {head.dim}"
        )
    return head


def params_at(spec: ParamSpec, t: float) -> Params:
    """Parameters in force at time t.

    spec: a constant parameter object (``Head``, ``L2Head``, ``SinkhornHead`` or a sequence of
    ``Head``), ``Layers`` / ``{"layers": [(t_start, params), ...]}`` (piecewise constant,
    right-continuous), or a callable ``t -> params``.
    """
    spec = as_param_spec(spec)
    if isinstance(spec, Layers):
        return spec.at(t)
    if callable(spec):
        return spec(t)
    return spec
