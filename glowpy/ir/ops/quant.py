"""Quantization ops: linear (de)quantization and the integer matrix products.

Semantics are ONNX's, bit for bit: division by the scale in the scale's type (or `precision`), round half
to even, add the zero point, saturate to the target type. Scales and zero points are operands (weights
in practice), always present: the importer supplies a zero point of zeros where ONNX omits it.

Granularity of a (de)quantization parameter, with `axis` and `block_size` as ONNX defines them:
per tensor (one element), per axis (1-D, one value per index of `axis`, `block_size` 0), or blocked
(the operand's rank, equal except at `axis`, where it has ceil(dim / block_size) entries).

The integer products take their zero points in the form that broadcasts against their operand (the
importer reshapes ONNX's per-row vectors): per tensor, per output channel for Conv weights (M,), per
row of A (..., M, 1) and per column of B (..., 1, N) or (N,) for the matrix products. Accumulation is
exact (float64 holds every int8 x int8 sum glowpy can meet) and wraps to int32, as ONNX allows.
"""

from __future__ import annotations

import math

import numpy as np

from glowpy.errors import MismatchingDatatype, MismatchingShape, UnsupportedAttribute, UnsupportedDatatype
from glowpy.ir.ops.nn import matmul_shape
from glowpy.ir.ops.registry import REQUIRED, get_op, op
from glowpy.ir.types import TensorType

I8, U8, I16, U16, I32 = (np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32))
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
QUANT_TYPES = frozenset({I8, U8, I16, U16})  # what QuantizeLinear produces
DEQUANT_TYPES = QUANT_TYPES | {I32}  # what DequantizeLinear reads
SCALE_TYPES = frozenset({F32, F16})
MATMUL_INT_TYPES = frozenset({I8, U8})  # the 8-bit operands of QLinear* / *Integer


def saturate(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Clip exact integer-valued floats to `dtype`'s range and convert; NaN (which ONNX leaves
    undefined) becomes 0, so the result never depends on the host's float-to-int conversion."""
    info = np.iinfo(dtype)
    return np.nan_to_num(np.clip(values, info.min, info.max), nan=0.0).astype(dtype)


# --- quantization parameters ---------------------------------------------------------------------


def granularity(x: tuple[int, ...], p: tuple[int, ...], axis: int, block_size: int) -> str:
    """'tensor', 'axis' or 'block': the granularity a parameter of shape `p` has for an operand of shape
    `x`; MismatchingShape if it has none."""
    if block_size:
        if len(p) != len(x):
            raise MismatchingShape("a blocked quantization parameter needs the operand's rank",
                                   expected=f"rank {len(x)}", found=list(p))
        want = tuple(-(-d // block_size) if i == axis else d for i, d in enumerate(x))
        if p != want:
            raise MismatchingShape(f"blocked quantization parameter shape disagrees with the operand and block_size "
                                   f"{block_size} on axis {axis}", expected=list(want), found=list(p))
        return "block"
    if math.prod(p) == 1 and len(p) <= 1:  # as is_scalar, on a bare shape
        return "tensor"
    if len(p) == 1 and len(x) > axis and p[0] == x[axis]:
        return "axis"
    raise MismatchingShape("quantization parameter is neither per tensor nor per axis",
                           expected=f"a scalar or ({x[axis] if len(x) > axis else '?'},) for axis {axis}",
                           found=list(p))


def expand_param(p: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """A (de)quantization parameter as an array that broadcasts against the operand."""
    kind = granularity(shape, p.shape, axis, block_size)
    if kind == "tensor":
        return p.reshape(())
    if kind == "axis":
        return p.reshape([p.size if i == axis else 1 for i in range(len(shape))])
    return np.repeat(p, block_size, axis=axis).take(range(shape[axis]), axis=axis)


def is_scalar(t: TensorType) -> bool:
    """One element, rank 0 or 1: a per-tensor quantization parameter."""
    return t.size == 1 and t.rank <= 1


def _paired(name: str, scale_name: str, scale: TensorType, zp_name: str, zp: TensorType) -> None:
    """A scale and its zero point have one shape; [1] against [] is still per tensor (onnxruntime's
    quantizer writes bias parameters so, and onnx.reference and onnxruntime accept it)."""
    if scale.shape != zp.shape and not (is_scalar(scale) and is_scalar(zp)):
        raise MismatchingShape(f"{scale_name} and {zp_name} differ in shape", op=name, expected=list(scale.shape),
                               found=list(zp.shape))


def _check_params(name: str, x: TensorType, scale: TensorType, zp: TensorType, attrs: dict) -> None:
    if scale.dtype not in SCALE_TYPES:
        raise UnsupportedDatatype("scale element type not supported", op=name,
                                  expected=sorted(map(str, SCALE_TYPES)), found=str(scale.dtype))
    _paired(name, "scale", scale, "zero point", zp)
    per_tensor = is_scalar(scale)
    if attrs["block_size"] < 0:
        raise UnsupportedAttribute("'block_size' must not be negative", op=name, found=attrs["block_size"])
    if (not per_tensor or attrs["block_size"]) and not 0 <= attrs["axis"] < x.rank:
        raise UnsupportedAttribute("axis out of range", op=name, expected=f"0..{x.rank - 1}", found=attrs["axis"])
    granularity(x.shape, scale.shape, attrs["axis"], attrs["block_size"])


def _quantize_infer(attrs: dict, x: TensorType, scale: TensorType, zp: TensorType) -> TensorType:
    _check_params("QuantizeLinear", x, scale, zp, attrs)
    if attrs["dtype"] not in QUANT_TYPES or zp.dtype != attrs["dtype"]:
        raise MismatchingDatatype("zero point and output type must be the same integer type", op="QuantizeLinear",
                                  expected=f"{attrs['dtype']} in {sorted(map(str, QUANT_TYPES))}", found=str(zp.dtype))
    if attrs["precision"] is not None and attrs["precision"] not in SCALE_TYPES:
        raise UnsupportedAttribute("'precision' must be a float type", op="QuantizeLinear",
                                   expected=sorted(map(str, SCALE_TYPES)), found=str(attrs["precision"]))
    return TensorType(attrs["dtype"], x.shape)


@op("QuantizeLinear", infer=_quantize_infer, inputs=(3, 3), dtypes=frozenset({F32, F16, I32}),
    attrs={"axis": 1, "block_size": 0, "dtype": REQUIRED, "precision": None})
def quantize_linear(attrs: dict, x: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """saturate(round_half_even(x / scale) + zero_point); the division in `precision` if set, else in
    numpy's promotion of x and scale (the scale's float type for float x, as onnx.reference)."""
    axis, block = attrs["axis"], attrs["block_size"]
    s = expand_param(scale, x.shape, axis, block)
    z = expand_param(zp, x.shape, axis, block)
    prec = attrs["precision"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = x.astype(prec) / s.astype(prec) if prec is not None else x / s
        return saturate(np.rint(q).astype(np.float64) + z, attrs["dtype"])


def _dequantize_infer(attrs: dict, x: TensorType, scale: TensorType, zp: TensorType) -> TensorType:
    _check_params("DequantizeLinear", x, scale, zp, attrs)
    if zp.dtype != x.dtype:
        raise MismatchingDatatype("zero point type differs from the input", op="DequantizeLinear",
                                  expected=str(x.dtype), found=str(zp.dtype))
    if attrs["dtype"] not in SCALE_TYPES:
        raise UnsupportedDatatype("output element type not supported", op="DequantizeLinear",
                                  expected=sorted(map(str, SCALE_TYPES)), found=str(attrs["dtype"]))
    return TensorType(attrs["dtype"], x.shape)


@op("DequantizeLinear", infer=_dequantize_infer, inputs=(3, 3), dtypes=DEQUANT_TYPES,
    attrs={"axis": 1, "block_size": 0, "dtype": REQUIRED})
def dequantize_linear(attrs: dict, x: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """(x - zero_point) * scale, the subtraction exact, the product in float32, then the output type."""
    axis, block = attrs["axis"], attrs["block_size"]
    z = expand_param(zp, x.shape, axis, block).astype(np.int64)
    s = expand_param(scale, x.shape, axis, block).astype(np.float32)
    return ((x.astype(np.int64) - z).astype(np.float32) * s).astype(attrs["dtype"])


def _dynamic_infer(attrs: dict, x: TensorType) -> list[TensorType]:
    return [TensorType(U8, x.shape), TensorType(F32, ()), TensorType(U8, ())]


@op("DynamicQuantizeLinear", infer=_dynamic_infer, dtypes=frozenset({F32}), num_outputs=3)
def dynamic_quantize_linear(attrs: dict, x: np.ndarray) -> list[np.ndarray]:
    """uint8 quantization of x over its range widened to include 0: (y, scale, zero point), in float32
    throughout as ONNX's function body computes it."""
    hi = np.float32(max(0.0, x.max())) if x.size else np.float32(0)
    lo = np.float32(min(0.0, x.min())) if x.size else np.float32(0)
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    zp = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255)).astype(np.float32)
    y = np.clip(np.rint(x / scale) + zp, 0, 255)
    return [y.astype(U8), np.array(scale, dtype=F32), np.array(zp, dtype=U8)]


# --- integer products ----------------------------------------------------------------------------


def _int_operand(name: str, what: str, t: TensorType, zp: TensorType) -> None:
    if t.dtype not in MATMUL_INT_TYPES:
        raise UnsupportedDatatype(f"{what} element type not supported", op=name,
                                  expected=sorted(map(str, MATMUL_INT_TYPES)), found=str(t.dtype))
    if zp.dtype != t.dtype:
        raise MismatchingDatatype(f"zero point of {what} differs from it in type", op=name, expected=str(t.dtype),
                                  found=str(zp.dtype))


def _scalar(name: str, what: str, t: TensorType) -> None:
    if not is_scalar(t):
        raise MismatchingShape(f"{what} must be per tensor (one element)", op=name, expected="[] or [1]",
                               found=list(t.shape))


def _channel_param(name: str, what: str, t: TensorType, channels: int) -> None:
    """Per tensor or per output channel (Conv weights)."""
    if not is_scalar(t) and t.shape != (channels,):
        raise MismatchingShape(f"{what} must be per tensor or per output channel", op=name,
                               expected=f"[] or [{channels}]", found=list(t.shape))


def _row_col_param(name: str, what: str, t: TensorType, operand: TensorType, row: bool) -> None:
    """A zero point or scale of a matrix product operand: per tensor, per row of A ((..., M, 1)) or per
    column of B ((..., 1, N) or (N,)), broadcasting against the operand."""
    if is_scalar(t):
        return
    fixed = -1 if row else -2  # the dim a per-row (per-column) parameter must not vary along
    ok = operand.rank >= 2 and t.rank <= operand.rank and (t.rank < -fixed or t.shape[fixed] == 1)
    if ok:
        try:
            ok = np.broadcast_shapes(t.shape, operand.shape) == operand.shape
        except ValueError:
            ok = False
    if not ok:
        shape = list(operand.shape)
        want = shape[:-1] + [1] if row else shape[:-2] + [1, shape[-1]] if len(shape) >= 2 else []
        raise MismatchingShape(f"{what} must be per tensor or per {'row' if row else 'column'} of its operand",
                               op=name, expected=f"[] or {want}", found=list(t.shape))


def _wrap_int32(acc: np.ndarray) -> np.ndarray:
    """Exact integer sums (held in float64) as int32, wrapping like a 32-bit accumulator."""
    return acc.astype(np.int64).astype(np.int32)


def _centered(x: np.ndarray, zp: np.ndarray) -> np.ndarray:
    return (x.astype(np.int64) - zp.astype(np.int64)).astype(np.float64)


def _conv_only(attrs: dict) -> dict:
    return {k: attrs[k] for k in CONV_ATTRS}


def _conv_acc(attrs: dict, x: np.ndarray, xz: np.ndarray, w: np.ndarray, wz: np.ndarray,
              bias: np.ndarray | None = None) -> np.ndarray:
    """The int32 accumulator of a quantized convolution: Conv's reference on exact float64 integers."""
    conv = get_op("Conv")
    attrs = _conv_only(attrs)
    wzr = wz.reshape(-1, *([1] * (w.ndim - 1))) if wz.size > 1 else wz.reshape(())
    b = np.zeros(w.shape[0]) if bias is None else bias.astype(np.float64)
    acc = conv.compute(conv.make_attrs(attrs), _centered(x, xz.reshape(())), _centered(w, wzr), b)
    return _wrap_int32(acc)


def _conv_shape(attrs: dict, x: TensorType, w: TensorType) -> tuple[int, ...]:
    conv = get_op("Conv")
    f64 = np.dtype(np.float64)
    return conv.infer(conv.make_attrs(_conv_only(attrs)), TensorType(f64, x.shape), TensorType(f64, w.shape),
                      TensorType(f64, (w.shape[0],))).shape


CONV_ATTRS = {"group": 1, "strides": REQUIRED, "pads": REQUIRED, "dilations": REQUIRED}
# IR only, set by the QDQ rewrite. `relu`: the output is at least y_zero_point, which is exactly
# quantize(relu(v)) since quantization is monotonic and maps 0 to the zero point. `float32`: the
# requantizing product in float32, as onnxruntime's int8 kernels (which execute QDQ models) compute it,
# not in float64 as onnx.reference does (the two differ where the product lands near a half).
QLINEAR_ATTRS = {"relu": False, "float32": False}


def _conv_integer_infer(attrs: dict, x: TensorType, w: TensorType, xz: TensorType, wz: TensorType) -> TensorType:
    _int_operand("ConvInteger", "x", x, xz)
    _int_operand("ConvInteger", "w", w, wz)
    _scalar("ConvInteger", "x_zero_point", xz)
    shape = _conv_shape(attrs, x, w)
    _channel_param("ConvInteger", "w_zero_point", wz, w.shape[0])
    return TensorType(I32, shape)


@op("ConvInteger", infer=_conv_integer_infer, inputs=(4, 4), dtypes=MATMUL_INT_TYPES, attrs=dict(CONV_ATTRS))
def conv_integer(attrs: dict, x: np.ndarray, w: np.ndarray, xz: np.ndarray, wz: np.ndarray) -> np.ndarray:
    """int32 convolution of (x - x_zero_point) and (w - w_zero_point)."""
    return _conv_acc(attrs, x, xz, w, wz)


def _requantize(acc: np.ndarray, multiplier: np.ndarray, yz: np.ndarray, attrs: dict | None = None) -> np.ndarray:
    """saturate(round_half_even(acc * multiplier) + y_zero_point): the int32 accumulator times a
    multiplier computed in the scales' type, the product in float64 (as onnx.reference) or float32
    (QLINEAR_ATTRS); with `relu`, at least y_zero_point."""
    attrs = attrs or {}
    t = np.float32 if attrs.get("float32") else np.float64
    y = np.rint(acc.astype(t) * multiplier.astype(t)).astype(np.float64) + yz.astype(np.float64)
    relu = attrs.get("relu", False)
    return saturate(np.maximum(y, yz.astype(np.float64)) if relu else y, yz.dtype)


def _qlinear_conv_infer(attrs: dict, x, xs, xz, w, ws, wz, ys, yz, b) -> TensorType:
    name = "QLinearConv"
    _int_operand(name, "x", x, xz)
    _int_operand(name, "w", w, wz)
    _int_operand(name, "y_zero_point", yz, yz)
    for what, t in (("x_scale", xs), ("w_scale", ws), ("y_scale", ys)):
        if t.dtype != F32:
            raise UnsupportedDatatype(f"{what} must be float32", op=name, expected="float32", found=str(t.dtype))
    for what, t in (("x_scale", xs), ("x_zero_point", xz), ("y_scale", ys), ("y_zero_point", yz)):
        _scalar(name, what, t)
    shape = _conv_shape(attrs, x, w)
    _channel_param(name, "w_scale", ws, w.shape[0])
    _channel_param(name, "w_zero_point", wz, w.shape[0])
    if b.dtype != I32 or b.shape != (w.shape[0],):
        raise MismatchingShape("bias must be int32 with one value per output channel", op=name,
                               expected=f"int32 [{w.shape[0]}]", found=f"{b.dtype} {list(b.shape)}")
    return TensorType(yz.dtype, shape)


@op("QLinearConv", infer=_qlinear_conv_infer, inputs=(9, 9), dtypes=MATMUL_INT_TYPES,
    attrs={**CONV_ATTRS, **QLINEAR_ATTRS})
def qlinear_conv(attrs: dict, x, xs, xz, w, ws, wz, ys, yz, b) -> np.ndarray:
    """Quantized convolution: the int32 accumulator of the centered operands plus the int32 bias,
    requantized by x_scale * w_scale / y_scale (per output channel if w_scale is)."""
    acc = _conv_acc(attrs, x, xz, w, wz, b)
    mult = (xs.reshape(()) * ws / ys.reshape(())).astype(np.float32)
    mult = mult.reshape(-1, *([1] * (acc.ndim - 2))) if mult.size > 1 else mult.reshape(())
    return _requantize(acc, mult, yz.reshape(()), attrs)


def _matmul_integer_infer(attrs: dict, a: TensorType, b: TensorType, az: TensorType, bz: TensorType) -> TensorType:
    _int_operand("MatMulInteger", "A", a, az)
    _int_operand("MatMulInteger", "B", b, bz)
    _row_col_param("MatMulInteger", "a_zero_point", az, a, row=True)
    _row_col_param("MatMulInteger", "b_zero_point", bz, b, row=False)
    return TensorType(I32, matmul_shape(a.shape, b.shape, "MatMulInteger"))


@op("MatMulInteger", infer=_matmul_integer_infer, inputs=(4, 4), dtypes=MATMUL_INT_TYPES)
def matmul_integer(attrs: dict, a: np.ndarray, b: np.ndarray, az: np.ndarray, bz: np.ndarray) -> np.ndarray:
    """int32 numpy matmul of (A - a_zero_point) and (B - b_zero_point)."""
    return _wrap_int32(np.matmul(_centered(a, az), _centered(b, bz)))


def _qlinear_matmul_infer(attrs: dict, a, as_, az, b, bs, bz, ys, yz, bias=None) -> TensorType:
    name = "QLinearMatMul"
    _int_operand(name, "a", a, az)
    _int_operand(name, "b", b, bz)
    _int_operand(name, "y_zero_point", yz, yz)
    if len({as_.dtype, bs.dtype, ys.dtype}) != 1 or as_.dtype not in SCALE_TYPES:
        raise UnsupportedDatatype("scales must share one float type", op=name, expected=sorted(map(str, SCALE_TYPES)),
                                  found=f"{as_.dtype}, {bs.dtype}, {ys.dtype}")
    for what, s, z in (("a", as_, az), ("b", bs, bz), ("y", ys, yz)):
        _paired(name, f"{what}_scale", s, f"{what}_zero_point", z)
    _row_col_param(name, "a_scale", as_, a, row=True)
    _row_col_param(name, "b_scale", bs, b, row=False)
    _scalar(name, "y_scale", ys)
    shape = matmul_shape(a.shape, b.shape, name)
    n = b.shape[-1] if b.rank >= 2 else 1
    if bias is not None and (bias.dtype != I32 or bias.shape != (n,)):
        raise MismatchingShape("bias must be int32 with one value per column of B", op=name,
                               expected=f"int32 [{n}]", found=f"{bias.dtype} {list(bias.shape)}")
    return TensorType(yz.dtype, shape)


@op("QLinearMatMul", infer=_qlinear_matmul_infer, inputs=(8, 9), dtypes=MATMUL_INT_TYPES,
    attrs=dict(QLINEAR_ATTRS))
def qlinear_matmul(attrs: dict, a, as_, az, b, bs, bz, ys, yz, bias=None) -> np.ndarray:
    """Quantized matmul: the int32 product of the centered operands (plus the optional int32 bias per
    column, IR only: set by the QDQ rewrite) requantized by a_scale * b_scale / y_scale (computed in
    the scales' type). 1-D operands are promoted to matrices for the product, so per-row and
    per-column multipliers line up, and squeezed again."""
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    acc = np.matmul(_centered(a2, az), _centered(b2, bz))
    acc = _wrap_int32(acc if bias is None else acc + bias.astype(np.float64))
    y = _requantize(acc, as_ * bs / ys.reshape(()), yz.reshape(()), attrs)
    if a.ndim == 1:
        y = y[..., 0, :]
    return y[..., 0] if b.ndim == 1 else y


# --- ops onnxruntime's QDQ rewrites produce (IR only) ------------------------------------------------


def _per_tensor_8bit(name: str, pairs: tuple) -> None:
    for what, s, z in pairs:
        if s.dtype != F32:
            raise UnsupportedDatatype(f"{what}_scale must be float32", op=name, expected="float32", found=str(s.dtype))
        _scalar(name, f"{what}_scale", s)
        _scalar(name, f"{what}_zero_point", z)


def _qlinear_add_infer(attrs: dict, a, as_, az, b, bs, bz, ys, yz) -> TensorType:
    name = "QLinearAdd"
    _int_operand(name, "A", a, az)
    _int_operand(name, "B", b, bz)
    _int_operand(name, "y_zero_point", yz, yz)
    _per_tensor_8bit(name, (("a", as_, az), ("b", bs, bz), ("y", ys, yz)))
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise MismatchingShape("operands do not broadcast", op=name, expected=list(a.shape),
                               found=list(b.shape)) from None
    return TensorType(yz.dtype, tuple(shape))


def fma_f32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """float32 x * y + z rounded once, as a fused multiply-add, for x with at most 29 significant bits
    (8- and 16-bit integers): the product is exact in float64, the sum's rounding error is recovered
    (TwoSum) and breaks the one case float64 would round wrongly, a sum exactly halfway between two
    float32 values."""
    p = x.astype(np.float64) * y.astype(np.float64)
    zz = np.broadcast_to(z, p.shape).astype(np.float64)
    s = p + zz
    v = s - p
    err = (p - (s - v)) + (zz - v)
    nudged = np.where(err > 0, np.nextafter(s, np.inf), np.where(err < 0, np.nextafter(s, -np.inf), s))
    return np.where(err != 0, nudged, s).astype(np.float32)


@op("QLinearAdd", infer=_qlinear_add_infer, inputs=(8, 8), dtypes=MATMUL_INT_TYPES)
def qlinear_add(attrs: dict, a, as_, az, b, bs, bz, ys, yz) -> np.ndarray:
    """Quantized Add as onnxruntime's AVX2 kernel (what its QDQ Add becomes on x86-64), in float32:
    with ra = a_scale / y_scale, rb = b_scale / y_scale and the constant c = y_zp - (ra * a_zp + rb * b_zp),
    y = round_half_even(fma(A, ra, fma(B, rb, c))), saturated; an operand of one element is folded
    into c by a product and a sum (no fma)."""
    f = np.float32
    ys, yz = ys.reshape(()), yz.reshape(())
    ra, rb = f(as_.reshape(()) / ys), f(bs.reshape(()) / ys)
    c = f(f(yz) - f(f(ra * f(az.reshape(()))) + f(rb * f(bz.reshape(())))))
    fa, fb = a.astype(f), b.astype(f)
    shape = np.broadcast_shapes(a.shape, b.shape)
    if a.size == 1 or b.size == 1:
        scalar, sr, vec, vr = (fa, ra, fb, rb) if a.size == 1 else (fb, rb, fa, ra)
        c = f(c + f(f(scalar.reshape(())) * sr))
        y = fma_f32(np.broadcast_to(vec, shape), vr, c)
    else:
        y = fma_f32(np.broadcast_to(fa, shape), ra, fma_f32(np.broadcast_to(fb, shape), rb, c))
    info = np.iinfo(yz.dtype)
    return np.clip(np.rint(y), info.min, info.max).astype(yz.dtype)


def _qlinear_gap_infer(attrs: dict, x, xs, xz, ys, yz) -> TensorType:
    name = "QLinearGlobalAveragePool"
    _int_operand(name, "X", x, xz)
    _int_operand(name, "y_zero_point", yz, yz)
    _per_tensor_8bit(name, (("x", xs, xz), ("y", ys, yz)))
    if x.rank < 3:
        raise MismatchingShape("input needs a spatial dim", op=name, expected="rank >= 3", found=list(x.shape))
    return TensorType(yz.dtype, x.shape[:2] + (1,) * (x.rank - 2))


@op("QLinearGlobalAveragePool", infer=_qlinear_gap_infer, inputs=(5, 5), dtypes=MATMUL_INT_TYPES)
def qlinear_global_average_pool(attrs: dict, x, xs, xz, ys, yz) -> np.ndarray:
    """Quantized GlobalAveragePool as onnxruntime's kernel: the exact int32 sum of (X - x_zp) over the
    spatial dims times x_scale / (y_scale * count) in float32, rounded half to even, plus y_zp."""
    spatial = tuple(range(2, x.ndim))
    count = math.prod(x.shape[2:])
    acc = (x.astype(np.int64) - xz.reshape(()).astype(np.int64)).sum(axis=spatial, keepdims=True)
    scale = np.float32(xs.reshape(()) / (ys.reshape(()) * np.float32(count)))
    return saturate(np.rint(acc.astype(np.float32) * scale).astype(np.float64) + yz.reshape(()).astype(np.float64),
                    yz.dtype)
