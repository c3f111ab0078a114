"""ONNX → IR converters of the quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger.

Each maps onto the IR op of the same name (glowpy/ir/ops/quant.py), with ONNX's optional zero points made
explicit (zeros) and its opset history resolved here: `axis` from opset 13, `saturate` from 19 (float8
only, so without effect on the integer types glowpy produces), `block_size`, `output_dtype` and the
16-bit types from 21, `precision` from 23, float16 scales for QLinearMatMul from 21.

The 4- and 2-bit integers (one per byte in the IR; ONNX's packed initializers are unpacked at import) go
through the 8-bit op of their signedness: operands widened by Cast, results clipped to their range and
narrowed. Quantization to or from float8 / float4 (per tensor or per axis) is composed of Div / Mul and
Cast, whose float8 conversions are ONNX's (`saturate` included); their zero point is zero by the spec
and not read (float4's is added, as onnx.reference does). float8e8m0 scales, blocked float8 and the
float6 types are refused naming what.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx

from glowpy.errors import MismatchingDatatype, MismatchingShape, UnsupportedDatatype
from glowpy.importer.context import NodeContext
from glowpy.importer.ops import _spatial_attrs, spatial_pads
from glowpy.importer.table import (
    AUTO_PAD,
    BOOL_INT,
    INT,
    NON_NEGATIVE,
    NON_NEGATIVE_INTS,
    POSITIVE,
    POSITIVE_INTS,
    onnx_op,
)
from glowpy.ir.graph import Value
from glowpy.ir.ops.quant import DEQUANT_TYPES, F32, I32, MATMUL_INT_TYPES, QUANT_TYPES, SCALE_TYPES, is_scalar
from glowpy.ir.types import (
    LOWFLOAT_TYPES,
    STORAGE_TYPES,
    SUBBYTE_INT_TYPES,
    dtype_from_onnx,
    dtype_to_onnx,
    int_range,
    is_supported_onnx_dtype,
    onnx_type_name,
)

_TP = onnx.TensorProto
F4E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
_NARROW = SUBBYTE_INT_TYPES  # quantized through int8 / uint8


def _wide(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.int8) if int_range(dtype)[0] < 0 else np.dtype(np.uint8)


def _widened(ctx: NodeContext, v: Value) -> Value:
    return ctx.emit1("Cast", [v], {"to": _wide(v.dtype)}) if v.dtype in _NARROW else v
_SINCE_21 = frozenset({np.dtype(np.int16), np.dtype(np.uint16)})


def _require_opset(ctx: NodeContext, since: dict[str, int]) -> None:
    """Attributes ONNX added to the op later: given under an older opset they are invalid."""
    for key, version in since.items():
        if key in ctx.attrs and ctx.opset < version:
            raise ctx.unsupported(f"attribute '{key}' does not exist before opset {version}",
                                  expected=f"opset >= {version}", found=ctx.opset)


def _quant_dtype(ctx: NodeContext, code: int, what: str, allowed: frozenset) -> np.dtype:
    """The numpy type of an ONNX element type a quantized tensor may have, or the precise refusal."""
    dtype = dtype_from_onnx(code) if is_supported_onnx_dtype(code) else None
    if dtype in LOWFLOAT_TYPES:
        _check_dtype(ctx, dtype, what, allowed)
    if dtype is None or dtype not in allowed:
        raise ctx.error(UnsupportedDatatype, f"{what}: element type not supported",
                        expected=sorted(map(str, allowed)), found=onnx_type_name(code) if dtype is None else str(dtype))
    return dtype


def _check_dtype(ctx: NodeContext, dtype: np.dtype, what: str, allowed: frozenset) -> None:
    if dtype in LOWFLOAT_TYPES and dtype not in allowed:
        name = onnx_type_name(dtype_to_onnx(dtype))
        raise ctx.error(UnsupportedDatatype, f"{what}: quantization with {name} is not implemented",
                        expected=sorted(map(str, allowed)), found=name)
    if dtype not in allowed:
        raise ctx.error(UnsupportedDatatype, f"{what}: element type not supported",
                        expected=sorted(map(str, allowed)), found=str(dtype))
    if dtype in _SINCE_21 and ctx.opset < 21:
        raise ctx.error(UnsupportedDatatype, f"{what}: 16-bit quantized types need opset 21",
                        expected="int8 or uint8", found=str(dtype))


def _zero_point(ctx: NodeContext, i: int, shape: tuple[int, ...], dtype: np.dtype) -> Value:
    """Operand i (a zero point), or zeros of `shape` in `dtype` where ONNX omits it."""
    if ctx.has_input(i):
        return ctx.input(i)
    return ctx.constant(np.zeros(shape, dtype=dtype), f"zero_point{i}")


def _granularity_attrs(ctx: NodeContext, x: Value, scale: Value) -> dict:
    """axis and block_size as the IR op takes them (axis normalized where it matters)."""
    block = ctx.attr("block_size", 0)
    per_tensor = is_scalar(scale.type)
    axis = ctx.attr("axis", 1)
    if not per_tensor or block:
        axis = ctx.axis(axis, x.type.rank)
    if scale.type.rank > 1 and not block:
        what = "before opset 21" if ctx.opset < 21 else "without block_size"
        raise ctx.error(MismatchingShape, f"scale must be a scalar or 1-D {what}",
                        expected="rank <= 1", found=list(scale.shape))
    return {"axis": axis, "block_size": block}


_FLOAT_Q = LOWFLOAT_TYPES - {np.dtype(ml_dtypes.float8_e8m0fnu)}  # the float formats Q / DQ convert to


def _float_quantized(ctx: NodeContext, dtype: np.dtype | None) -> bool:
    return dtype is not None and dtype in _FLOAT_Q


def _broadcast_param(ctx: NodeContext, x: Value, p: Value, attrs: dict) -> Value:
    """A per-tensor or per-axis parameter shaped to broadcast against x (float formats only)."""
    if attrs["block_size"]:
        raise ctx.unsupported("blocked quantization to or from a float format is not implemented",
                              expected="block_size 0", found=attrs["block_size"])
    if is_scalar(p.type):
        return p if p.shape == () else ctx.emit1("Reshape", [p], {"shape": ()})
    shape = tuple(p.shape[0] if i == attrs["axis"] else 1 for i in range(x.type.rank))
    return ctx.emit1("Reshape", [p], {"shape": shape})


def _cast(ctx: NodeContext, v: Value, dtype: np.dtype, **attrs) -> Value:
    return v if v.dtype == dtype else ctx.emit1("Cast", [v], {"to": dtype, **attrs})


def _quantize_float(ctx: NodeContext, x: Value, scale: Value, out: np.dtype, prec: np.dtype | None,
                    attrs: dict) -> list[Value]:
    """x / scale (in `precision`, else numpy's promotion) converted to the float format."""
    t = prec if prec is not None else np.result_type(x.dtype, scale.dtype)
    q = ctx.emit1("Div", [_cast(ctx, x, t), _cast(ctx, _broadcast_param(ctx, x, scale, attrs), t)])
    if out == F4E2M1 and ctx.has_input(2):
        q = ctx.emit1("Add", [q, _cast(ctx, _broadcast_param(ctx, x, ctx.input(2), attrs), t)])
    return [ctx.emit1("Cast", [q], {"to": out, "saturate": bool(ctx.attr("saturate", 1))})]


_Q_ATTRS = {"axis": INT, "saturate": BOOL_INT, "block_size": NON_NEGATIVE, "output_dtype": INT, "precision": INT}


@onnx_op("QuantizeLinear", attrs=_Q_ATTRS, dtypes=frozenset({F32, np.dtype(np.float16), I32}), since=10)
def quantize_linear(ctx: NodeContext) -> list[Value]:
    _require_opset(ctx, {"axis": 13, "saturate": 19, "block_size": 21, "output_dtype": 21, "precision": 23})
    x, scale = ctx.input(0), ctx.input(1)
    _check_dtype(ctx, scale.dtype, "y_scale", SCALE_TYPES)
    code = ctx.attr("output_dtype", 0)
    out = _quant_dtype(ctx, code, "output_dtype", QUANT_TYPES | _NARROW | _FLOAT_Q) if code else None
    if ctx.has_input(2):
        zp_dtype = ctx.input(2).dtype
        if out is not None and zp_dtype != out:
            raise ctx.unsupported("'output_dtype' disagrees with the zero point's type", expected=str(zp_dtype),
                                  found=str(out))
        out = zp_dtype
    out = np.dtype(np.uint8) if out is None else out
    if not _float_quantized(ctx, out):
        _check_dtype(ctx, out, "y_zero_point", QUANT_TYPES | _NARROW)
    precision = ctx.attr("precision", 0)
    prec = dtype_from_onnx(precision) if precision and is_supported_onnx_dtype(precision) else None
    if precision and prec not in SCALE_TYPES:
        raise ctx.unsupported("'precision' must name a float type glowpy has", expected="FLOAT or FLOAT16",
                              found=onnx_type_name(precision))
    if _float_quantized(ctx, out):
        return _quantize_float(ctx, x, scale, out, prec, _granularity_attrs(ctx, x, scale))
    attrs = {**_granularity_attrs(ctx, x, scale), "dtype": _wide(out) if out in _NARROW else out, "precision": prec}
    q = ctx.emit1("QuantizeLinear", [x, scale, _widened(ctx, _zero_point(ctx, 2, scale.shape, out))], attrs)
    if out not in _NARROW:
        return [q]
    lo, hi = int_range(out)
    return ctx.emit("Cast", [ctx.emit1("Clip", [q], {"min": lo, "max": hi})], {"to": out})


@onnx_op("DequantizeLinear", attrs={"axis": INT, "block_size": NON_NEGATIVE, "output_dtype": INT},
         dtypes=DEQUANT_TYPES | STORAGE_TYPES, since=10)
def dequantize_linear(ctx: NodeContext) -> list[Value]:
    _require_opset(ctx, {"axis": 13, "block_size": 21, "output_dtype": 23})
    x, scale = ctx.input(0), ctx.input(1)
    if not _float_quantized(ctx, x.dtype):
        _check_dtype(ctx, x.dtype, "x", DEQUANT_TYPES | _NARROW)
    _check_dtype(ctx, scale.dtype, "x_scale", SCALE_TYPES)
    code = ctx.attr("output_dtype", 0)
    out = _quant_dtype(ctx, code, "output_dtype", SCALE_TYPES) if code else scale.dtype
    attrs = {**_granularity_attrs(ctx, x, scale), "dtype": out}
    if _float_quantized(ctx, x.dtype):  # float32(x) * float32(scale), then the output type
        s = _cast(ctx, _broadcast_param(ctx, x, scale, attrs), F32)
        return [_cast(ctx, ctx.emit1("Mul", [_cast(ctx, x, F32), s]), out)]
    zp = _zero_point(ctx, 2, scale.shape, x.dtype)
    if zp.dtype != x.dtype:  # checked before both widen to one type
        raise ctx.error(MismatchingDatatype, "zero point type differs from the input", expected=str(x.dtype),
                        found=str(zp.dtype))
    return ctx.emit("DequantizeLinear", [_widened(ctx, x), scale, _widened(ctx, zp)], attrs)


@onnx_op("DynamicQuantizeLinear", dtypes=frozenset({F32}), since=11, max_outputs=3)
def dynamic_quantize_linear(ctx: NodeContext) -> list[Value]:
    return ctx.emit("DynamicQuantizeLinear", [ctx.input(0)])


# --- integer convolution and matrix products -------------------------------------------------------

_CONV_ATTRS = {"auto_pad": AUTO_PAD, "dilations": POSITIVE_INTS, "group": POSITIVE, "kernel_shape": POSITIVE_INTS,
               "pads": NON_NEGATIVE_INTS, "strides": POSITIVE_INTS}


def _conv_attrs(ctx: NodeContext, x: Value, w: Value) -> dict:
    if x.type.rank != w.type.rank or x.type.rank < 3:
        raise ctx.error(MismatchingShape, "input and weight need the same rank, N x C x spatial",
                        expected=f"rank {w.type.rank}", found=f"rank {x.type.rank} {list(x.shape)}")
    kernel = tuple(ctx.attr("kernel_shape", w.shape[2:]))
    if kernel != tuple(w.shape[2:]):
        raise ctx.unsupported("'kernel_shape' disagrees with the weight", expected=list(w.shape[2:]),
                              found=list(kernel))
    strides, dilations = _spatial_attrs(ctx, x, kernel)
    pads = spatial_pads(ctx, x.shape[2:], kernel, strides, dilations)
    return {"group": ctx.attr("group", 1), "strides": strides, "pads": pads, "dilations": dilations}


def _int8(ctx: NodeContext, v: Value, what: str) -> Value:
    _check_dtype(ctx, v.dtype, what, MATMUL_INT_TYPES)
    return v


def _same_type(ctx: NodeContext, zp: Value, of: Value, what: str) -> Value:
    if zp.dtype != of.dtype:
        raise ctx.error(MismatchingDatatype, f"{what} differs in type from its operand", expected=str(of.dtype),
                        found=str(zp.dtype))
    return zp


@onnx_op("ConvInteger", attrs=_CONV_ATTRS, dtypes=MATMUL_INT_TYPES, since=10)
def conv_integer(ctx: NodeContext) -> list[Value]:
    x, w = ctx.input(0), _int8(ctx, ctx.input(1), "w")
    xz = _same_type(ctx, _zero_point(ctx, 2, (), x.dtype), x, "x_zero_point")
    wz = _same_type(ctx, _zero_point(ctx, 3, (), w.dtype), w, "w_zero_point")
    return ctx.emit("ConvInteger", [x, w, xz, wz], _conv_attrs(ctx, x, w))


@onnx_op("QLinearConv", attrs=_CONV_ATTRS, dtypes=MATMUL_INT_TYPES, since=10)
def qlinear_conv(ctx: NodeContext) -> list[Value]:
    x, w = ctx.input(0), _int8(ctx, ctx.input(3), "w")
    ops = [x, ctx.input(1), _same_type(ctx, ctx.input(2), x, "x_zero_point"), w, ctx.input(4),
           _same_type(ctx, ctx.input(5), w, "w_zero_point"), ctx.input(6), _int8(ctx, ctx.input(7), "y_zero_point")]
    if ctx.has_input(8):
        b = ctx.input(8)
        if b.dtype != I32:
            raise ctx.error(UnsupportedDatatype, "bias must be int32", expected="int32", found=str(b.dtype))
    else:
        b = ctx.constant(np.zeros(w.shape[0], dtype=np.int32), "bias")
    return ctx.emit("QLinearConv", [*ops, b], _conv_attrs(ctx, x, w))


def _per_row(ctx: NodeContext, p: Value, a: Value) -> Value:
    """ONNX writes a per-row parameter of a 2-D A as an M-vector: make it (M, 1), which broadcasts."""
    if p.type.rank == 1 and p.type.size > 1 and a.type.rank >= 2:
        return ctx.emit1("Reshape", [p], {"shape": (p.shape[0], 1)})
    return p


@onnx_op("MatMulInteger", dtypes=MATMUL_INT_TYPES, since=10)
def matmul_integer(ctx: NodeContext) -> list[Value]:
    a, b = ctx.input(0), _int8(ctx, ctx.input(1), "B")
    az = _per_row(ctx, _same_type(ctx, _zero_point(ctx, 2, (), a.dtype), a, "a_zero_point"), a)
    bz = _same_type(ctx, _zero_point(ctx, 3, (), b.dtype), b, "b_zero_point")
    return ctx.emit("MatMulInteger", [a, b, az, bz])


@onnx_op("QLinearMatMul", dtypes=MATMUL_INT_TYPES, since=10)
def qlinear_matmul(ctx: NodeContext) -> list[Value]:
    a, b = ctx.input(0), _int8(ctx, ctx.input(3), "b")
    scales = [ctx.input(i) for i in (1, 4, 6)]
    for s, what in zip(scales, ("a_scale", "b_scale", "y_scale")):
        _check_dtype(ctx, s.dtype, what, SCALE_TYPES if ctx.opset >= 21 else frozenset({F32}))
    az = _same_type(ctx, ctx.input(2), a, "a_zero_point")
    bz = _same_type(ctx, ctx.input(5), b, "b_zero_point")
    yz = _int8(ctx, ctx.input(7), "y_zero_point")
    return ctx.emit("QLinearMatMul", [a, _per_row(ctx, scales[0], a), _per_row(ctx, az, a), b, scales[1], bz,
                                      scales[2], yz])
