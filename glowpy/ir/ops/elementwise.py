"""Elementwise ops: unary math, binary arithmetic with numpy broadcasting, comparisons, logic and bitwise
ops, Mod, BitShift, variadic Mean, Where, Cast. The activations (Relu, Clip, Sigmoid, ...) are declared from
their entries in glowpy/ir/activations.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import numpy_helper

from glowpy.errors import MismatchingDatatype, MismatchingShape, UnsupportedAttribute
from glowpy.ir.activations import erf as _erf  # (importing it declares the activation ops)
from glowpy.ir.ops.registry import FROM_ONNX, REQUIRED, op
from glowpy.ir.types import (
    ALL_TYPES,
    ANY_TYPES,
    FLOAT_TYPES,
    INT_TYPES,
    LOWFLOAT_TYPES,
    NUMERIC_TYPES,
    TensorType,
)

BOOL_TYPES = frozenset({np.dtype(np.bool_)})

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


def _unary(name: str, fn, dtypes=FLOAT_TYPES, attrs=None, doc: str = "", *, onnx: str | None = None,
           infer=same_as_first) -> None:
    attrs = attrs or {}
    fn.__doc__ = doc  # before registering: the declaration reads it
    op(name, infer=infer, dtypes=dtypes, attrs=attrs, elementwise=True, onnx=onnx)(fn)


def _quiet(fn):
    """numpy math without warnings: out-of-domain inputs give NaN / inf as in C."""
    def run(a, x):
        with np.errstate(all="ignore"):
            return fn(x).astype(x.dtype)
    return run


def _to_bool(attrs: dict, x: TensorType) -> TensorType:
    return TensorType(np.bool_, x.shape)


def _isinf(attrs: dict, x: np.ndarray) -> np.ndarray:
    neg, pos = attrs["detect_negative"], attrs["detect_positive"]
    return np.isinf(x) & (((x < 0) & bool(neg)) | ((x > 0) & bool(pos)))


_unary("Exp", lambda a, x: np.exp(x))
_unary("Log", lambda a, x: np.log(x))
_unary("Sqrt", lambda a, x: np.sqrt(x))
_unary("Erf", lambda a, x: _erf(x))
_unary("Neg", lambda a, x: np.negative(x), NUMERIC_TYPES)
_unary("Abs", lambda a, x: np.abs(x), NUMERIC_TYPES)
_unary("Reciprocal", lambda a, x: (1.0 / x).astype(x.dtype))
_unary("Softplus", lambda a, x: np.logaddexp(0, x).astype(x.dtype))
_unary("Identity", lambda a, x: x, ANY_TYPES)
for _name, _fn in (("Sin", np.sin), ("Cos", np.cos), ("Tan", np.tan), ("Asin", np.arcsin), ("Acos", np.arccos),
                   ("Atan", np.arctan), ("Sinh", np.sinh), ("Cosh", np.cosh), ("Asinh", np.arcsinh),
                   ("Acosh", np.arccosh), ("Atanh", np.arctanh), ("Floor", np.floor), ("Ceil", np.ceil),
                   ("Round", np.round)):
    _unary(_name, _quiet(_fn), onnx=_name, doc=f"numpy {_fn.__name__}" + (" (half to even)" if _name == "Round" else ""))
_unary("Sign", lambda a, x: np.sign(x), NUMERIC_TYPES, onnx="Sign", doc="-1, 0 or 1 (NaN stays NaN)")
_unary("Not", lambda a, x: np.logical_not(x), BOOL_TYPES, onnx="Not", doc="logical not")
_unary("BitwiseNot", lambda a, x: np.invert(x), INT_TYPES, onnx="BitwiseNot", doc="~x")
_unary("IsNaN", lambda a, x: np.isnan(x), onnx="IsNaN", infer=_to_bool, doc="x != x")
_unary("IsInf", _isinf, attrs={"detect_negative": FROM_ONNX, "detect_positive": FROM_ONNX}, onnx="IsInf",
       infer=_to_bool, doc="x is -inf (detect_negative) or +inf (detect_positive)")
# Inference-mode Dropout: the identity. Kept as a node so the optimizer shows its removal.
_unary("Dropout", lambda a, x: x, FLOAT_TYPES)


E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
CAST_ROUND_MODES = ("up", "down", "nearest")


def _check_cast(attrs: dict) -> None:
    if attrs["round_mode"] not in CAST_ROUND_MODES:
        raise UnsupportedAttribute("'round_mode' must be up, down or nearest", op="Cast",
                                   expected=list(CAST_ROUND_MODES), found=attrs["round_mode"])


def _cast_infer(attrs: dict, x: TensorType) -> TensorType:
    _check_cast(attrs)
    return TensorType(attrs["to"], x.shape)


@op("Cast", infer=_cast_infer, attrs={"to": REQUIRED, "saturate": True, "round_mode": "up"}, elementwise=True,
    dtypes=ANY_TYPES, bfloat16_in_float32=False)
def cast(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Convert to the element type `to` (a numpy dtype) as ml_dtypes' astype does (float64 and
    integers reach the 8- and 4-bit floats through float32), except: with `saturate` a float8
    target clips to its finite range (NaN stays NaN); float8e8m0 keeps the exponent, rounded by
    `round_mode` (onnx.numpy_helper.to_float8e8m0)."""
    to = np.dtype(attrs["to"])
    if to == E8M0:
        return numpy_helper.to_float8e8m0(x, bool(attrs["saturate"]), attrs["round_mode"])
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / inf to integers: numpy's (host's) answer
        if to in LOWFLOAT_TYPES and attrs["saturate"] and to != np.dtype(ml_dtypes.float4_e2m1fn):
            info = ml_dtypes.finfo(to)
            return np.clip(x, info.min, info.max).astype(to)
        return x.astype(to)


def _binary(name: str, fn, *, result_bool: bool = False, dtypes=NUMERIC_TYPES, attrs=None, onnx: str | None = None,
            check=None) -> None:
    """`fn(a, b)` or, with `attrs`, `fn(a, b, attrs)`; `check(attrs)` validates attribute values."""
    def infer(attrs: dict, a: TensorType, b: TensorType) -> TensorType:
        if check is not None:
            check(attrs)
        _same_dtype(name, a, b)
        shape = broadcast_shapes(a.shape, b.shape, op=name)
        return TensorType(np.bool_ if result_bool else a.dtype, shape)

    def compute(attrs: dict, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = fn(a, b, attrs) if attrs_given else fn(a, b)
        return np.asarray(out, dtype=np.bool_ if result_bool else a.dtype)

    attrs_given = attrs is not None
    op(name, infer=infer, inputs=(2, 2), dtypes=dtypes, attrs=attrs or {}, elementwise=True, onnx=onnx)(compute)


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
_binary("GreaterOrEqual", np.greater_equal, result_bool=True, onnx="GreaterOrEqual")
_binary("LessOrEqual", np.less_equal, result_bool=True, onnx="LessOrEqual")
_binary("And", np.logical_and, dtypes=BOOL_TYPES, onnx="And")
_binary("Or", np.logical_or, dtypes=BOOL_TYPES, onnx="Or")
_binary("Xor", np.logical_xor, dtypes=BOOL_TYPES, onnx="Xor")
_binary("BitwiseAnd", np.bitwise_and, dtypes=INT_TYPES, onnx="BitwiseAnd")
_binary("BitwiseOr", np.bitwise_or, dtypes=INT_TYPES, onnx="BitwiseOr")
_binary("BitwiseXor", np.bitwise_xor, dtypes=INT_TYPES, onnx="BitwiseXor")
_binary("PRelu", lambda x, s: np.where(x > 0, x, x * s), onnx="PRelu")


def _mod(a: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    # fmod=1: C fmod (the dividend's sign); fmod=0: Python's % (the divisor's sign). x % 0 gives 0 for
    # integers (NaN for floats) rather than trapping.
    with np.errstate(all="ignore"):
        return np.fmod(a, b) if attrs["fmod"] else np.mod(a, b)


def _check_mod(attrs: dict) -> None:
    if attrs["fmod"] not in (0, 1):
        raise UnsupportedAttribute("attribute 'fmod' must be 0 or 1", op="Mod", expected="0 or 1", found=attrs["fmod"])


_binary("Mod", _mod, attrs={"fmod": FROM_ONNX}, onnx="Mod", check=_check_mod)


def _bitshift(a: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    # A shift by a negative amount or by the bit width or more shifts every bit out (C leaves it
    # undefined): 0, or -1 for a negative signed value shifted right. Right shifts of signed values
    # are arithmetic; left shifts wrap.
    a, b = np.broadcast_arrays(a, b)
    with np.errstate(all="ignore"):
        out_of_range = (b < 0) | (b >= a.dtype.itemsize * 8)
        safe = np.where(out_of_range, 0, b).astype(a.dtype)
        if attrs["direction"] == "RIGHT":
            out = np.right_shift(a, safe)
            fill = np.where(a < 0, -1, 0) if a.dtype.kind == "i" else 0
        else:
            unsigned = np.dtype(f"u{a.dtype.itemsize}")
            out = np.left_shift(a.view(unsigned), safe.view(unsigned)).view(a.dtype)
            fill = 0
        return np.where(out_of_range, fill, out).astype(a.dtype)


def _check_bitshift(attrs: dict) -> None:
    if attrs["direction"] not in ("LEFT", "RIGHT"):
        raise UnsupportedAttribute("attribute 'direction' must be LEFT or RIGHT", op="BitShift",
                                   expected="'LEFT' or 'RIGHT'", found=attrs["direction"])


_binary("BitShift", _bitshift, dtypes=INT_TYPES, attrs={"direction": REQUIRED}, onnx="BitShift",
        check=_check_bitshift)


def _mean_infer(attrs: dict, *xs: TensorType) -> TensorType:
    _same_dtype("Mean", *xs)
    return TensorType(xs[0].dtype, broadcast_shapes(*(x.shape for x in xs), op="Mean"))


@op("Mean", infer=_mean_infer, inputs=(1, None), dtypes=FLOAT_TYPES, elementwise=True, onnx="Mean")
def mean(attrs: dict, *xs: np.ndarray) -> np.ndarray:
    """The sum of the operands (broadcasting), in order, divided by their count."""
    acc = xs[0]
    for x in xs[1:]:
        acc = acc + x
    return (acc / len(xs)).astype(xs[0].dtype)


def _where_infer(attrs: dict, c: TensorType, x: TensorType, y: TensorType) -> TensorType:
    if c.dtype != np.bool_:
        raise MismatchingDatatype("condition must be bool", op="Where", expected="bool", found=str(c.dtype))
    _same_dtype("Where", x, y)
    return TensorType(x.dtype, broadcast_shapes(c.shape, x.shape, y.shape, op="Where"))


@op("Where", infer=_where_infer, inputs=(3, 3), dtypes=frozenset({np.dtype(np.bool_)}), elementwise=True)
def where(attrs: dict, c: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Select x where c is true, else y (broadcasting all three)."""
    return np.where(c, x, y).astype(x.dtype)
