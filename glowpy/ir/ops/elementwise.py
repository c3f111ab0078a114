"""Elementwise ops: unary math, binary arithmetic with numpy broadcasting, Where, Cast. The activations
(Relu, Clip, Sigmoid, ...) are declared from their entries in glowpy/ir/activations.py."""

from __future__ import annotations

import math

import numpy as np

import glowpy.ir.activations  # noqa: F401  (declares the activation ops)
from glowpy.errors import MismatchingDatatype, MismatchingShape
from glowpy.ir.ops.registry import REQUIRED, op
from glowpy.ir.types import ALL_TYPES, FLOAT_TYPES, NUMERIC_TYPES, TensorType

_SQRT1_2 = 1.0 / math.sqrt(2.0)


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; math.erf vectorised keeps the oracle exact to double precision.
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        return (0.5 * x * (1.0 + np.tanh(inner))).astype(x.dtype)
    return (0.5 * x * (1.0 + _erf(x * _SQRT1_2))).astype(x.dtype)


def same_as_first(attrs: dict, x: TensorType, *rest: TensorType) -> TensorType:
    return x


def broadcast_shapes(*shapes: tuple[int, ...], node: str | None = None, op: str | None = None) -> tuple:
    """numpy / ONNX multidirectional broadcasting, with a structured error."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise MismatchingShape(
            "operands do not broadcast", node=node, op=op, expected="broadcastable shapes",
            found=" vs ".join(str(list(s)) for s in shapes),
        ) from None


def _same_dtype(name: str, *types: TensorType) -> None:
    dts = {t.dtype for t in types}
    if len(dts) > 1:
        raise MismatchingDatatype(
            "operands differ in element type", op=name, expected=str(types[0].dtype),
            found=", ".join(str(t.dtype) for t in types),
        )


def _unary(name: str, fn, dtypes=FLOAT_TYPES, attrs=None, doc: str = "") -> None:
    attrs = attrs or {}
    op(name, infer=same_as_first, dtypes=dtypes, attrs=attrs, elementwise=True)(fn)
    fn.__doc__ = doc


_unary("Exp", lambda a, x: np.exp(x))
_unary("Log", lambda a, x: np.log(x))
_unary("Sqrt", lambda a, x: np.sqrt(x))
_unary("Erf", lambda a, x: _erf(x))
_unary("Neg", lambda a, x: np.negative(x), NUMERIC_TYPES)
_unary("Abs", lambda a, x: np.abs(x), NUMERIC_TYPES)
_unary("Reciprocal", lambda a, x: (1.0 / x).astype(x.dtype))
_unary("Softplus", lambda a, x: np.logaddexp(0, x).astype(x.dtype))
_unary("Gelu", lambda a, x: _gelu(x, a["approximate"]), attrs={"approximate": "none"})
_unary("Identity", lambda a, x: x, ALL_TYPES)
# Inference-mode Dropout: the identity. Kept as a node so the optimizer shows its removal.
_unary("Dropout", lambda a, x: x, FLOAT_TYPES)


def _cast_infer(attrs: dict, x: TensorType) -> TensorType:
    return TensorType(attrs["to"], x.shape)


@op("Cast", infer=_cast_infer, attrs={"to": REQUIRED}, elementwise=True)
def cast(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Convert to the element type `to` (a numpy dtype)."""
    return x.astype(attrs["to"])


def _binary(name: str, fn, *, result_bool: bool = False, dtypes=NUMERIC_TYPES) -> None:
    def infer(attrs: dict, a: TensorType, b: TensorType) -> TensorType:
        _same_dtype(name, a, b)
        shape = broadcast_shapes(a.shape, b.shape, op=name)
        return TensorType(np.bool_ if result_bool else a.dtype, shape)

    def compute(attrs: dict, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = fn(a, b)
        return np.asarray(out, dtype=np.bool_ if result_bool else a.dtype)

    op(name, infer=infer, inputs=(2, 2), dtypes=dtypes, elementwise=True)(compute)


def _int_safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        # ONNX integer Div truncates toward zero (C semantics), numpy floors. Exact for every int64
        # (going through float64 would round quotients beyond 2**53); x / 0 gives 0 rather than trapping.
        with np.errstate(divide="ignore", over="ignore"):
            q = np.floor_divide(a, b)
            inexact = (a - q * b != 0) & ((a < 0) != (b < 0))
        return np.where(inexact, q + 1, q).astype(a.dtype)
    return a / b


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return np.power(a, b)
    return np.power(a, b, dtype=a.dtype)


_binary("Add", np.add)
_binary("Sub", np.subtract)
_binary("Mul", np.multiply)
_binary("Div", _int_safe_div)
_binary("Pow", _pow)
_binary("Max", np.maximum)
_binary("Min", np.minimum)
_binary("Equal", np.equal, result_bool=True, dtypes=ALL_TYPES)
_binary("Greater", np.greater, result_bool=True)
_binary("Less", np.less, result_bool=True)


def _where_infer(attrs: dict, c: TensorType, x: TensorType, y: TensorType) -> TensorType:
    if c.dtype != np.bool_:
        raise MismatchingDatatype("condition must be bool", op="Where", expected="bool", found=str(c.dtype))
    _same_dtype("Where", x, y)
    return TensorType(x.dtype, broadcast_shapes(c.shape, x.shape, y.shape, op="Where"))


@op("Where", infer=_where_infer, inputs=(3, 3), dtypes=frozenset({np.dtype(np.bool_)}), elementwise=True)
def where(attrs: dict, c: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Select x where c is true, else y (broadcasting all three)."""
    return np.where(c, x, y).astype(x.dtype)
