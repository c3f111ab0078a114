"""Conversions to and from the storage-only element types (float8 e4m3fn / e4m3fnuz / e5m2 / e5m2fnuz /
e8m0, float4 e2m1, int4 / uint4 / int2 / uint2), bit-exact with ml_dtypes' astype and ONNX Cast.

Each element is one byte (the sub-byte integers in the low bits, not sign-extended); the integers
decode by sign extension.
Decoding a float format builds the float32 bits from the fields; encoding rounds a float32 to nearest even with integer arithmetic on its bits: a normal result by
rounding away the low mantissa bits and rebiasing the exponent, a subnormal one by scaling into the
subnormal step (exact: a power of two) and rounding to an integer. The special codes (NaN, infinity,
overflow) are read from ml_dtypes when the code is generated, so every format's quirks (e4m3fn has no
infinity, the fnuz formats one NaN and no negative zero, float4 saturates) come from one place.
Float64 and integer sources go through float32 first, as ml_dtypes does.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.ir.types import LOWFLOAT_TYPES, STORAGE_TYPES, SUBBYTE_INT_TYPES, int_range

E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
F4E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
F32 = np.dtype(np.float32)
I8 = np.dtype(np.int8)
U8 = np.dtype(np.uint8)
# The float8 types ONNX Cast saturates (attribute `saturate`); float4 always saturates, e8m0 has its own rule.
SATURATING = LOWFLOAT_TYPES - {E8M0, F4E2M1}


def _c32(v: int) -> ir.Constant:
    return ir.Constant(U.I32, v & 0xFFFF_FFFF)


def _c8(v: int) -> ir.Constant:
    return ir.Constant(U.I8, v & 0xFF)


def _codes(dtype: np.dtype, values) -> list[int]:
    return np.asarray(values, np.float32).astype(dtype).view(np.uint8).tolist()


def _bits(dtype: np.dtype) -> int:
    return 4 if dtype == F4E2M1 else 8


def decoded_dtype(dtype: np.dtype) -> np.dtype:
    """What `decode` gives: float32 for the float formats, int8 / uint8 for the integers."""
    dt = np.dtype(dtype)
    if dt in SUBBYTE_INT_TYPES:
        return I8 if int_range(dt)[0] < 0 else U8
    return F32


def decode(b: ir.IRBuilder, v: ir.Value, dtype: np.dtype) -> ir.Value:
    """The i8 bits of a storage-type element as a float32 (float formats) or an i8 integer."""
    dt = np.dtype(dtype)
    if dt in SUBBYTE_INT_TYPES:
        bits = 4 if dt.itemsize == 1 and int_range(dt)[1] > 3 else 2
        if int_range(dt)[0] < 0:
            sh = _c8(8 - bits)
            return b.ashr(b.shl(v, sh), sh, name="sx")
        return b.and_(v, _c8((1 << bits) - 1))
    return _decode_float(b, v, dt)


def _layout(dt: np.dtype) -> tuple[int, int, int, int | None]:
    """(exponent bits, mantissa bits, exponent bias, sign bit or None) of a storage float format."""
    if dt == E8M0:
        return 8, 0, 127, None
    info = ml_dtypes.finfo(dt)
    m = int(info.nmant)
    bias = 1 - round(math.log2(float(info.smallest_normal)))
    return _bits(dt) - 1 - m, m, bias, _bits(dt) - 1


def _formula_bits(dt: np.dtype, code: int) -> int:
    """float32 bits of `code` by the IEEE-like rule `_decode_float` emits (specials aside)."""
    e_bits, m, bias, sbit = _layout(dt)
    sign = (code >> sbit) & 1 if sbit is not None else 0
    e, mant = (code >> m) & ((1 << e_bits) - 1), code & ((1 << m) - 1)
    if e == 0:
        val = np.float32(mant * 2.0 ** (1 - bias - m)) * np.float32(-1.0 if sign else 1.0)
        return int(np.asarray(val, np.float32).view(np.uint32))
    return (sign << 31) | ((e - bias + 127) << 23) | (mant << (23 - m))


def _decode_float(b: ir.IRBuilder, v: ir.Value, dt: np.dtype) -> ir.Value:
    """Fields to float32 bits (subnormals by scaling the mantissa); the codes whose ml_dtypes value the
    rule misses (NaN, infinities, e8m0's 2**-127) are selected by value."""
    e_bits, m, bias, sbit = _layout(dt)
    n = 1 << _bits(dt)
    c = b.zext(b.and_(v, _c8(n - 1)), U.I32)
    e = b.and_(b.lshr(c, _c32(m)), _c32((1 << e_bits) - 1))
    mant = b.and_(c, _c32((1 << m) - 1))
    sign = b.shl(b.lshr(c, _c32(sbit)), _c32(31)) if sbit is not None else _c32(0)
    normal = b.or_(b.shl(b.add(e, _c32(127 - bias)), _c32(23)), b.shl(mant, _c32(23 - m)))
    sub = b.bitcast(b.fmul(b.sitofp(mant, U.F32), ir.Constant(U.F32, 2.0 ** (1 - bias - m))), U.I32)
    r = b.or_(b.select(b.icmp_unsigned("==", e, _c32(0)), sub, normal), sign)
    want = np.arange(n, dtype=np.uint8).view(dt).astype(np.float32).view(np.uint32).tolist()
    for code in range(n):
        if _formula_bits(dt, code) != want[code]:
            r = b.select(b.icmp_unsigned("==", c, _c32(code)), _c32(want[code]), r)
    return b.bitcast(r, U.F32, name="dec")


def float_to_int(b: ir.IRBuilder, x: ir.Value, dst: np.dtype, convert) -> ir.Value:
    """A decoded storage float to an integer type as ml_dtypes: NaN gives 0, +inf the type's maximum
    (int32's, wrapped, for the sub-byte types), -inf a signed type's minimum; `convert(x)` does the rest."""
    r = convert(b.select(b.fcmp_unordered("uno", x, x), ir.Constant(U.F32, 0.0), x))
    if dst in SUBBYTE_INT_TYPES:
        hi, lo = (2 ** 31 - 1) & (int_range(dst)[1] - int_range(dst)[0]), None
    else:
        info = np.iinfo(dst)
        hi, lo = int(info.max), int(info.min) if info.min < 0 else None
    r = b.select(b.fcmp_ordered("==", x, ir.Constant(U.F32, math.inf)), ir.Constant(r.type, hi), r)
    if lo is not None:
        r = b.select(b.fcmp_ordered("==", x, ir.Constant(U.F32, -math.inf)), ir.Constant(r.type, lo), r)
    return r


def encode(b: ir.IRBuilder, v: ir.Value, src: np.dtype, dtype: np.dtype, *, saturate: bool = True,
           round_mode: str = "up") -> ir.Value:
    """A value of compute type `src` (float32 / float64 / an integer / bool) as the i8 bits of `dtype`."""
    dt, src = np.dtype(dtype), np.dtype(src)
    if dt in SUBBYTE_INT_TYPES:
        return _encode_int(b, v, src, dt)
    x = _to_f32(b, v, src)
    if dt == E8M0:
        return _encode_e8m0(b, x, saturate, round_mode)
    return _encode_float(b, x, dt, saturate=saturate and dt in SATURATING)


def _to_f32(b: ir.IRBuilder, v: ir.Value, src: np.dtype) -> ir.Value:
    if v.type == U.F32:
        return v
    if v.type == U.F64:
        return b.fptrunc(v, U.F32)
    if src.kind == "b":
        return b.uitofp(v, U.F32)
    return b.uitofp(v, U.F32) if src.kind == "u" else b.sitofp(v, U.F32)


def _encode_int(b: ir.IRBuilder, v: ir.Value, src: np.dtype, dt: np.dtype) -> ir.Value:
    """Wrap to the low bits, as ml_dtypes: a float truncates toward zero through int32 (NaN, infinities
    and |x| >= 2**31 give int32's minimum, whose low bits are 0)."""
    mask = _c8(int_range(dt)[1] - int_range(dt)[0])
    if isinstance(v.type, (ir.FloatType, ir.DoubleType)):
        ok = b.fcmp_ordered("<", U.intrinsic(b, "llvm.fabs", v), ir.Constant(v.type, 2.0 ** 31))
        v = b.fptosi(b.select(ok, v, ir.Constant(v.type, 0.0)), U.I32)
    elif v.type.width == 1:
        v = b.zext(v, U.I8)
    if v.type.width > 8:
        v = b.trunc(v, U.I8)
    return b.and_(v, mask, name="enc")


def _encode_float(b: ir.IRBuilder, x: ir.Value, dt: np.dtype, *, saturate: bool) -> ir.Value:
    info = ml_dtypes.finfo(dt)
    _, m, bias, sbit = _layout(dt)
    max_code = _codes(dt, [float(info.max)])[0]
    nan_pos, nan_neg, inf_pos, inf_neg = _codes(dt, [np.nan, -np.nan, np.inf, -np.inf])
    if saturate:
        inf_pos, inf_neg = max_code, max_code | (1 << sbit)
    neg_zero = _codes(dt, [-0.0])[0]

    bits = b.bitcast(x, U.I32)
    sign = b.icmp_signed("<", bits, _c32(0), name="neg")
    a = b.and_(bits, _c32(0x7FFF_FFFF))
    af = b.bitcast(a, U.F32)
    min_normal = float(info.smallest_normal)
    # Subnormal results: |x| / (smallest subnormal), rounded half to even (exact scaling by 2**k).
    small = b.fcmp_ordered("<", af, ir.Constant(U.F32, min_normal))
    scaled = b.fmul(b.select(small, af, ir.Constant(U.F32, 0.0)), ir.Constant(U.F32, 2.0 ** (m - 1 + bias)))
    q_sub = b.fptosi(U.intrinsic(b, "llvm.roundeven", scaled), U.I32)
    # Normal results: drop 23 - m mantissa bits rounding half to even, then rebias the exponent.
    shift = 23 - m
    lsb = b.and_(b.lshr(a, _c32(shift)), _c32(1))
    r = b.add(b.add(a, _c32((1 << (shift - 1)) - 1)), lsb)
    q_norm = b.sub(b.lshr(r, _c32(shift)), _c32((127 - bias) << m))
    q = b.select(small, q_sub, q_norm, name="mag")
    over = b.icmp_signed(">", q, _c32(max_code))
    if saturate:
        q = b.select(over, _c32(max_code), q)
        over = ir.Constant(U.I1, 0)
    code = b.trunc(q, U.I8)
    signed = b.or_(code, _c8(1 << sbit))
    if neg_zero == 0:  # no negative zero: -0 and negatives that round to 0 are +0
        signed = b.select(b.icmp_unsigned("==", code, _c8(0)), code, signed)
    code = b.select(sign, signed, code)
    ovf_pos, ovf_neg = _codes(dt, [np.inf, -np.inf]) if not saturate else (max_code, max_code | (1 << sbit))
    code = b.select(over, b.select(sign, _c8(ovf_neg), _c8(ovf_pos)), code)
    is_inf = b.icmp_unsigned("==", a, _c32(0x7F80_0000))
    code = b.select(is_inf, b.select(sign, _c8(inf_neg), _c8(inf_pos)), code)
    is_nan = b.icmp_unsigned(">", a, _c32(0x7F80_0000))
    return b.select(is_nan, b.select(sign, _c8(nan_neg), _c8(nan_pos)), code, name="enc")


def _encode_e8m0(b: ir.IRBuilder, x: ir.Value, saturate: bool, round_mode: str) -> ir.Value:
    """onnx.numpy_helper.to_float8e8m0: the float32 exponent, rounded up / down / to nearest; NaN and
    infinities give 0xFF; with `saturate` rounding never carries past 0xFE."""
    bits = b.bitcast(x, U.I32)
    e = b.and_(b.lshr(bits, _c32(23)), _c32(0xFF))
    special = b.icmp_unsigned("==", e, _c32(0xFF))
    if round_mode == "nearest":
        g = b.icmp_unsigned("!=", b.and_(bits, _c32(0x40_0000)), _c32(0))
        rest = b.icmp_unsigned("!=", b.and_(bits, _c32(0x3F_FFFF)), _c32(0))  # r or s
        odd = b.icmp_unsigned(">", e, _c32(0))
        up = b.and_(g, b.or_(rest, odd))
    elif round_mode == "up":
        up = b.icmp_unsigned("!=", b.and_(bits, _c32(0x7F_FFFF)), _c32(0))
    else:
        up = ir.Constant(U.I1, 0)
    if saturate:
        up = b.and_(up, b.icmp_unsigned("!=", e, _c32(0xFE)))
    e = b.add(e, b.zext(up, U.I32))
    return b.select(special, _c8(0xFF), b.trunc(e, U.I8), name="enc")


__all__ = ["SATURATING", "STORAGE_TYPES", "SUBBYTE_INT_TYPES", "decode", "decoded_dtype", "encode", "float_to_int"]
