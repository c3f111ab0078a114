"""Fused elementwise kernels: a tree of elementwise ops evaluated per element in one loop nest.

The loop runs over the output shape. Every operand is read through its broadcast strides (0 along
broadcast dims); adjacent dims that are contiguous for every operand are merged, so a same-shape
chain becomes one flat loop that LLVM vectorizes, and a bias broadcast becomes an outer loop over
channels with a stride-0 inner operand. Threads split the outermost merged dim.

`scalar_op` holds the per-element semantics of every elementwise IR op (and the BatchNormalization
affine; activations come from their emitters in backends/cpu/activations.py), matching the numpy
reference in glowpy.ir.ops: NaN propagates through Max/Min/Relu/Clip, integer Div / Mod never trap
(a zero divisor gives 0, INT_MIN / -1 wraps), shifts by the bit width or more shift every bit out,
float16 rounds after every op. Bools are computed as i1 (stored as one byte).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import activations
from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.kernels import lowfloat
from glowpy.backends.cpu.vector import PTR, VecIR
from glowpy.errors import UnsupportedDatatype, UnsupportedOperator
from glowpy.ir.activations import ACTIVATIONS
from glowpy.ir.ops import OPS
from glowpy.ir.types import BFLOAT16

# The elementwise IR ops (OpDef.elementwise) `scalar_op` generates: the activations through their
# emitters (backends/cpu/activations.py), the rest below; plus BatchNormalization as a per-channel affine.
_OWN_CODE = frozenset({
    "Relu", "Clip", "Exp", "Log", "Sqrt", "Erf", "Neg", "Abs", "Reciprocal", "Softplus", "Gelu", "Identity",
    "Dropout", "Cast", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Greater", "Less", "Where",
    "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Not", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    "BitwiseNot", "BitShift", "Mod", "PRelu", "Mean", "Sign", "IsNaN", "IsInf", "Shrink",
    "Floor", "Ceil", "Round", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
})
_LIBM_UNARY = {"Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
               "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh"}
_INTRINSIC_UNARY = {"Floor": "llvm.floor", "Ceil": "llvm.ceil", "Round": "llvm.roundeven"}
_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Greater", "Less", "GreaterOrEqual",
                     "LessOrEqual", "And", "Or", "Xor", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu"})
SCALAR_OPS = frozenset(
    name for name, d in OPS.items() if d.elementwise and (name in _OWN_CODE or name in activations.EMITTED_OPS)
) | {"BatchNormalization"}


# --- per-element semantics -----------------------------------------------------------------------


def _f64_to_f32_round_to_odd(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """f64 -> f32 truncated toward zero with the last bit set when inexact ("round to odd")."""
    t = b.fptrunc(v, U.F32, name="rto.rne")
    back = b.fpext(t, U.F64, name="rto.back")
    mask = ir.Constant(U.I64, 0x7FFF_FFFF_FFFF_FFFF)
    grew = b.icmp_unsigned(">", b.and_(b.bitcast(back, U.I64), mask), b.and_(b.bitcast(v, U.I64), mask),
                           name="rto.grew")  # RNE rounded away from zero: step back toward it
    bits = b.bitcast(t, U.I32)
    bits = b.select(grew, b.sub(bits, ir.Constant(U.I32, 1)), bits)
    inexact = b.fcmp_unordered("!=", back, v, name="rto.inexact")
    bits = b.select(inexact, b.or_(bits, ir.Constant(U.I32, 1)), bits)
    return b.bitcast(bits, U.F32, name="rto")


def _cast(b: ir.IRBuilder, v: ir.Value, src: np.dtype, dst: np.dtype, attrs: dict[str, Any] | None = None
          ) -> ir.Value:
    src, dst = np.dtype(src), np.dtype(dst)
    if src == dst:
        return v
    if src in lowfloat.STORAGE_TYPES:
        v, src = lowfloat.decode(b, v, src), lowfloat.decoded_dtype(src)
        if src.kind == "f" and (dst.kind in "iu" or dst in lowfloat.SUBBYTE_INT_TYPES):
            return lowfloat.float_to_int(b, v, dst, lambda x: _cast(b, x, src, dst, attrs))
    if dst in lowfloat.STORAGE_TYPES:
        return lowfloat.encode(b, v, src, dst, **(attrs or {}))
    if src == BFLOAT16:  # computed as float32
        src = np.dtype(np.float32)
    if dst == BFLOAT16:  # ml_dtypes rounds float64 to float32 first, then to bfloat16
        return U.round_half(b, _cast(b, v, src, np.dtype(np.float32)), dst)
    if src == dst:
        return v
    st, dt = U.compute_type(src), U.compute_type(dst)
    if dst.kind == "b":
        if src.kind == "f":
            return b.fcmp_unordered("!=", v, ir.Constant(st, 0.0))  # NaN is truthy, as in numpy
        return b.icmp_unsigned("!=", v, ir.Constant(st, 0))
    if src.kind == "b":
        return b.uitofp(v, dt) if dst.kind == "f" else b.zext(v, dt)
    if src.kind == "f" and dst.kind == "f":
        if dst == np.float16:
            # Round once from the source precision. x86 has no f64 -> f16 instruction and LLVM would call
            # compiler-rt's __truncdfhf2, which a JIT process may not have: go through f32 rounded to
            # odd, which makes the second rounding (f32 -> f16, F16C) give the single-rounding result.
            if st == U.F64:
                v = _f64_to_f32_round_to_odd(b, v)
            h = b.fptrunc(v, U.F16)
            return b.fpext(h, U.F32)
        if st == dt:
            return v
        return b.fpext(v, dt) if st == U.F32 else b.fptrunc(v, dt)
    if src.kind == "f":
        if dst.kind == "u" and dst.itemsize < 8:
            # numpy goes through a signed conversion: -1.0 -> 255 for uint8.
            return b.trunc(b.fptosi(v, U.I64), dt)
        return b.fptoui(v, dt) if dst.kind == "u" else b.fptosi(v, dt)
    if dst.kind == "f":
        r = b.uitofp(v, dt) if src.kind == "u" else b.sitofp(v, dt)
        return U.round_half(b, r, dst)
    # int -> int
    if dt.width < st.width:
        return b.trunc(v, dt)
    if dt.width > st.width:
        return b.zext(v, dt) if src.kind == "u" else b.sext(v, dt)
    return v


def _fmax(b: ir.IRBuilder, x: ir.Value, y: ir.Value, dtype: np.dtype) -> ir.Value:
    if U.is_float(dtype):
        return U.fmax_nan(b, x, y)
    cmp = b.icmp_signed if U.is_signed(dtype) else b.icmp_unsigned
    return b.select(cmp(">", x, y), x, y)


def _fmin(b: ir.IRBuilder, x: ir.Value, y: ir.Value, dtype: np.dtype) -> ir.Value:
    if U.is_float(dtype):
        return U.fmin_nan(b, x, y)
    cmp = b.icmp_signed if U.is_signed(dtype) else b.icmp_unsigned
    return b.select(cmp("<", x, y), x, y)


def _int_div(b: ir.IRBuilder, x: ir.Value, y: ir.Value, dtype: np.dtype) -> ir.Value:
    t = x.type
    zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
    is_zero = b.icmp_unsigned("==", y, zero)
    if U.is_signed(dtype):
        # x / -1 is a negation (INT_MIN / -1 would trap), x / 0 gives 0 (numpy warns, we must not trap).
        minus1 = ir.Constant(t, (1 << t.width) - 1)
        is_m1 = b.icmp_unsigned("==", y, minus1)
        safe = b.select(b.or_(is_zero, is_m1), one, y)
        q = b.sdiv(x, safe)
        q = b.select(is_m1, b.sub(zero, x), q)
    else:
        q = b.udiv(x, b.select(is_zero, one, y))
    return b.select(is_zero, zero, q)


def _ipow_function(module: ir.Module, dtype: np.dtype) -> ir.Function:
    """int power by squaring (wrapping like numpy); a negative exponent gives 0 unless |base| == 1."""
    t = U.compute_type(dtype)
    name = f"glowpy.ipow.{np.dtype(dtype).name}"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    fn = ir.Function(module, ir.FunctionType(t, [t, t]), name=name)
    fn.linkage = "internal"
    base, exp = fn.args
    base.name, exp.name = "base", "exp"
    entry = fn.append_basic_block("entry")
    loop = fn.append_basic_block("loop")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
    negative = b.icmp_signed("<", exp, zero) if U.is_signed(dtype) else ir.Constant(U.I1, 0)
    start_e = b.select(negative, zero, exp)
    b.cbranch(b.icmp_unsigned("==", start_e, zero), done, loop)
    b.position_at_end(loop)
    r = b.phi(t, name="r")
    x = b.phi(t, name="x")
    e = b.phi(t, name="e")
    r.add_incoming(one, entry)
    x.add_incoming(base, entry)
    e.add_incoming(start_e, entry)
    odd = b.icmp_unsigned("!=", b.and_(e, one), zero)
    r2 = b.select(odd, b.mul(r, x), r)
    x2 = b.mul(x, x)
    e2 = b.lshr(e, one)
    r.add_incoming(r2, loop)
    x.add_incoming(x2, loop)
    e.add_incoming(e2, loop)
    b.cbranch(b.icmp_unsigned("==", e2, zero), done, loop)
    b.position_at_end(done)
    res = b.phi(t, name="result")
    res.add_incoming(one, entry)
    res.add_incoming(r2, loop)
    if U.is_signed(dtype):
        # base ** negative: 1 for base 1, +-1 for base -1, else 0.
        is_one = b.icmp_signed("==", base, one)
        is_m1 = b.icmp_signed("==", base, ir.Constant(t, (1 << t.width) - 1))
        odd_e = b.icmp_unsigned("!=", b.and_(exp, one), zero)
        neg_val = b.select(is_one, one, b.select(is_m1, b.select(odd_e, base, one), zero))
        res2 = b.select(negative, neg_val, res)
        b.ret(res2)
    else:
        b.ret(res)
    return fn


def scalar_op(b: ir.IRBuilder, op: str, attrs: dict[str, Any], args: Sequence[ir.Value],
              in_dtypes: Sequence[np.dtype], out_dtype: np.dtype) -> ir.Value:
    """One elementwise op on compute-type values; returns the result in the compute type of out_dtype."""
    dt = np.dtype(in_dtypes[0]) if in_dtypes else np.dtype(out_dtype)
    r = _scalar(b, op, attrs, args, dt, np.dtype(out_dtype), in_dtypes)
    return U.round_half(b, r, out_dtype) if op not in ("Identity", "Dropout", "Cast") else r


def _scalar(b: ir.IRBuilder, op: str, attrs: dict[str, Any], args: Sequence[ir.Value], dt: np.dtype,
            out: np.dtype, in_dtypes: Sequence[np.dtype]) -> ir.Value:
    x = args[0]
    t = x.type
    flt = dt.kind == "f"
    if op in ("Identity", "Dropout"):
        return x
    if op == "Cast":
        return _cast(b, x, dt, out, {"saturate": bool(attrs["saturate"]), "round_mode": attrs["round_mode"]})
    if flt and op in activations.EMITTED_OPS:
        name = activations.EMITTED_OPS[op]
        storage = dt if dt == np.float16 else None
        return activations.emit(activations.ScalarMath(b, t, storage), x, name, ACTIVATIONS[name].params_of(attrs))
    if op == "Relu":
        if dt.kind == "u":
            return x
        return b.select(b.icmp_signed("<", x, ir.Constant(t, 0)), ir.Constant(t, 0), x)
    if op == "Neg":
        return b.fneg(x) if flt else b.sub(ir.Constant(t, 0), x)
    if op == "Abs":
        if flt:
            return U.intrinsic(b, "llvm.fabs", x)
        if dt.kind == "u":
            return x
        return b.select(b.icmp_signed("<", x, ir.Constant(t, 0)), b.sub(ir.Constant(t, 0), x), x)
    if op == "Clip":
        return _clip(b, x, attrs["min"], attrs["max"], dt)
    if op == "Where":
        return b.select(args[0], args[1], args[2])
    if op in _BINARY:
        return _binary(b, op, x, args[1], dt)
    if op == "Mod":
        return _fmod(b, x, args[1], dt, attrs["fmod"]) if flt else _int_mod(b, x, args[1], dt, attrs["fmod"])
    if op == "BitShift":
        return _bitshift(b, x, args[1], dt, attrs["direction"])
    if op == "Not":
        return b.xor(x, ir.Constant(t, 1))
    if op == "BitwiseNot":
        return b.not_(x)
    if op == "Sign":
        return _sign(b, x, dt)
    if op == "Shrink":  # integers: in double, truncated back as numpy's astype does
        f64 = np.dtype(np.float64)
        y = activations.emit(activations.ScalarMath(b, U.F64), _cast(b, x, dt, f64), "shrink",
                             ACTIVATIONS["shrink"].params_of(attrs))
        return _cast(b, y, f64, dt)
    if op == "BatchNormalization":
        scale, bias, mean, var = args[1:5]
        inv = b.fdiv(scale, U.intrinsic(b, "llvm.sqrt", b.fadd(var, U.fconst(t, attrs["epsilon"]))))
        return b.fadd(b.fmul(b.fsub(x, mean), inv), bias)
    if not flt:
        raise UnsupportedDatatype("op needs a float element type", op=op, expected="float", found=str(dt))
    one = U.fconst(t, 1.0)
    if op in _LIBM_UNARY:
        return U.libm(b, _LIBM_UNARY[op], x)
    if op in _INTRINSIC_UNARY:
        return U.intrinsic(b, _INTRINSIC_UNARY[op], x)
    if op == "IsNaN":
        return b.fcmp_unordered("uno", x, x)
    if op == "IsInf":
        return _isinf(b, x, attrs["detect_negative"], attrs["detect_positive"])
    if op == "Mean":
        acc = x
        for y in args[1:]:  # float16 rounds after every add, as the reference accumulates in its type
            acc = U.round_half(b, b.fadd(acc, y), out)
        return b.fdiv(acc, U.fconst(t, float(len(args))))
    if op == "Exp":
        return U.intrinsic(b, "llvm.exp", x)
    if op == "Log":
        return U.intrinsic(b, "llvm.log", x)
    if op == "Sqrt":
        return U.intrinsic(b, "llvm.sqrt", x)
    if op == "Erf":
        return U.libm(b, "erf", x)
    if op == "Reciprocal":
        return b.fdiv(one, x)
    if op == "Softplus":
        # logaddexp(0, x) = max(x, 0) + log1p(exp(-|x|)): no overflow for large x.
        ax = U.intrinsic(b, "llvm.fabs", x)
        pos = b.select(b.fcmp_ordered(">", x, U.fconst(t, 0.0)), x, U.fconst(t, 0.0))
        return b.fadd(pos, U.libm(b, "log1p", U.intrinsic(b, "llvm.exp", b.fneg(ax))))
    raise UnsupportedOperator("no elementwise code generation for op", op=op)


def _isinf(b: ir.IRBuilder, x: ir.Value, negative: int, positive: int) -> ir.Value:
    inf = U.fconst(x.type, math.inf)
    if negative and positive:
        return b.fcmp_ordered("==", U.intrinsic(b, "llvm.fabs", x), inf)
    if negative or positive:
        return b.fcmp_ordered("==", x, b.fneg(inf) if negative else inf)
    return ir.Constant(U.I1, 0)


def _sign(b: ir.IRBuilder, x: ir.Value, dt: np.dtype) -> ir.Value:
    t = x.type
    if dt.kind == "f":
        zero = U.fconst(t, 0.0)
        y = b.select(b.fcmp_ordered("==", x, zero), zero, x)  # -0.0 -> 0.0, NaN stays
        y = b.select(b.fcmp_ordered("<", x, zero), U.fconst(t, -1.0), y)
        return b.select(b.fcmp_ordered(">", x, zero), U.fconst(t, 1.0), y)
    zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
    if dt.kind == "u":
        return b.zext(b.icmp_unsigned("!=", x, zero), t)
    y = b.select(b.icmp_signed("<", x, zero), ir.Constant(t, (1 << t.width) - 1), zero)
    return b.select(b.icmp_signed(">", x, zero), one, y)


def _fmod(b: ir.IRBuilder, x: ir.Value, y: ir.Value, dt: np.dtype, c_fmod: int) -> ir.Value:
    r = b.frem(x, y)
    if c_fmod:
        return r
    # numpy's float mod: the remainder takes the divisor's sign; a zero remainder is a zero of that sign.
    zero = U.fconst(x.type, 0.0)
    differ = b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", y, zero))
    fix = b.and_(b.fcmp_ordered("!=", r, zero), differ)
    r = b.select(fix, b.fadd(r, y), r)
    return b.select(b.fcmp_ordered("==", r, zero), U.intrinsic(b, "llvm.copysign", zero, y), r)


def _int_mod(b: ir.IRBuilder, x: ir.Value, y: ir.Value, dt: np.dtype, c_fmod: int) -> ir.Value:
    t = x.type
    zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
    is_zero = b.icmp_unsigned("==", y, zero)
    if not U.is_signed(dt):
        return b.select(is_zero, zero, b.urem(x, b.select(is_zero, one, y)))
    # x % 0 gives 0; x % -1 is 0 (INT_MIN % -1 would trap).
    bad = b.or_(is_zero, b.icmp_unsigned("==", y, ir.Constant(t, (1 << t.width) - 1)))
    r = b.srem(x, b.select(bad, one, y))
    if not c_fmod:  # Python's %: the divisor's sign
        fix = b.and_(b.icmp_unsigned("!=", r, zero),
                     b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
        r = b.select(fix, b.add(r, y), r)
    return b.select(bad, zero, r)


def _bitshift(b: ir.IRBuilder, x: ir.Value, y: ir.Value, dt: np.dtype, direction: str) -> ir.Value:
    t = x.type
    width = ir.Constant(t, t.width)
    out_of_range = b.icmp_unsigned(">=", y, width)  # a negative signed amount too
    zero = ir.Constant(t, 0)
    if direction == "LEFT":
        return b.select(out_of_range, zero, b.shl(x, b.select(out_of_range, zero, y)))
    if U.is_signed(dt):  # arithmetic: an out-of-range shift leaves the sign in every bit
        return b.ashr(x, b.select(out_of_range, ir.Constant(t, t.width - 1), y))
    return b.select(out_of_range, zero, b.lshr(x, b.select(out_of_range, zero, y)))


def _clip(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float, dt: np.dtype) -> ir.Value:
    t = x.type
    if dt.kind == "f":
        y = x
        if not (isinstance(lo, float) and math.isinf(lo) and lo < 0):
            y = b.select(b.fcmp_ordered("<", y, U.fconst(t, lo)), U.fconst(t, lo), y)
        if not (isinstance(hi, float) and math.isinf(hi) and hi > 0):
            y = b.select(b.fcmp_ordered(">", y, U.fconst(t, hi)), U.fconst(t, hi), y)
        return y
    info = np.iinfo(dt)
    cmp = b.icmp_signed if dt.kind == "i" else b.icmp_unsigned
    y = x
    # numpy clips an int array against float bounds in float, then truncates back: x < lo is
    # x < ceil(lo) for integers, and the value put there is trunc(lo).
    if not math.isinf(lo):
        bound, value = math.ceil(lo), int(np.clip(math.trunc(lo), info.min, info.max))
        if bound > info.max:
            y = U.const(dt, value)
        elif bound > info.min:
            y = b.select(cmp("<", y, U.const(dt, bound)), U.const(dt, value), y)
    if not math.isinf(hi):
        bound, value = math.floor(hi), int(np.clip(math.trunc(hi), info.min, info.max))
        if bound < info.min:
            y = U.const(dt, value)
        elif bound < info.max:
            y = b.select(cmp(">", y, U.const(dt, bound)), U.const(dt, value), y)
    return y


def _binary(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dt: np.dtype) -> ir.Value:
    if op in ("And", "BitwiseAnd"):
        return b.and_(x, y)
    if op in ("Or", "BitwiseOr"):
        return b.or_(x, y)
    if op in ("Xor", "BitwiseXor"):
        return b.xor(x, y)
    if dt.kind == "b":
        if op == "Equal":
            return b.icmp_unsigned("==", x, y)
        raise UnsupportedDatatype("op does not take bool operands", op=op, found="bool")
    if dt.kind == "f":
        if op == "Add":
            return b.fadd(x, y)
        if op == "Sub":
            return b.fsub(x, y)
        if op == "Mul":
            return b.fmul(x, y)
        if op == "Div":
            return b.fdiv(x, y)
        if op == "Pow":
            return U.libm(b, "pow", x, y)
        if op == "Max":
            return _fmax(b, x, y, dt)
        if op == "Min":
            return _fmin(b, x, y, dt)
        if op == "Equal":
            return b.fcmp_ordered("==", x, y)
        if op == "Greater":
            return b.fcmp_ordered(">", x, y)
        if op == "Less":
            return b.fcmp_ordered("<", x, y)
        if op == "GreaterOrEqual":
            return b.fcmp_ordered(">=", x, y)
        if op == "LessOrEqual":
            return b.fcmp_ordered("<=", x, y)
        if op == "PRelu":
            return b.select(b.fcmp_ordered(">", x, U.fconst(x.type, 0.0)), x, b.fmul(x, y))
    cmp = b.icmp_signed if dt.kind == "i" else b.icmp_unsigned
    if op == "Add":
        return b.add(x, y)
    if op == "Sub":
        return b.sub(x, y)
    if op == "Mul":
        return b.mul(x, y)
    if op == "Div":
        return _int_div(b, x, y, dt)
    if op == "Pow":
        return b.call(_ipow_function(b.module, dt), [x, y])
    if op == "Max":
        return _fmax(b, x, y, dt)
    if op == "Min":
        return _fmin(b, x, y, dt)
    if op == "Equal":
        return b.icmp_unsigned("==", x, y)
    if op == "Greater":
        return cmp(">", x, y)
    if op == "Less":
        return cmp("<", x, y)
    if op == "GreaterOrEqual":
        return cmp(">=", x, y)
    if op == "LessOrEqual":
        return cmp("<=", x, y)
    if op == "PRelu":
        return b.select(cmp(">", x, ir.Constant(x.type, 0)), x, b.mul(x, y))
    raise UnsupportedOperator("no elementwise code generation for op", op=op)


# --- the fused loop ------------------------------------------------------------------------------


@dataclass
class Expr:
    """One op of a fused group. Args: ("in", k) external operand k, ("expr", j) an earlier expr,
    ("imm", value) a scalar constant of the arg's dtype, ("cat", 0) the group's Concat (FusedElementwise)."""

    op: str
    attrs: dict[str, Any]
    args: list[tuple[str, Any]]
    in_dtypes: list[np.dtype]
    dtype: np.dtype
    name: str = ""


@dataclass
class Operand:
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class FusedElementwise:
    """A fused group: evaluates `exprs` in order per element; the last expr is stored to the output.
    With `concat` = (axis, operand indices), ("cat", 0) reads the concatenation of those operands along
    the axis of the output, which is never stored: each part's slab of the output is a loop of its own."""

    out_shape: tuple[int, ...]
    out_dtype: np.dtype
    operands: list[Operand]
    exprs: list[Expr]
    names: list[str] = field(default_factory=list)  # operand parameter names
    concat: tuple[int, list[int]] | None = None


def broadcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Element strides of a C-contiguous `shape` read as broadcast to `out` (0 on broadcast dims)."""
    strides = [0] * len(out)
    off = len(out) - len(shape)
    acc = 1
    for d in range(len(shape) - 1, -1, -1):
        if shape[d] != 1:
            strides[off + d] = acc
        acc *= shape[d]
    return strides


@dataclass
class _Region:
    """A box of the output, looped over on its own: merged dims, per pointer (output first) its
    element strides and the offset of the box's first element, and the exprs with ("cat", 0) resolved."""

    dims: list[int]
    strides: list[list[int]]
    bases: list[int]
    exprs: list[Expr]


def _regions(group: FusedElementwise) -> list[_Region]:
    out = group.out_shape
    full = [broadcast_strides(out, out)] + [broadcast_strides(o.shape, out) for o in group.operands]
    if group.concat is None:
        boxes = [(out, full, [0] * len(full), group.exprs)]
    else:
        axis, parts = group.concat
        boxes, at = [], 0
        for k in parts:
            box = out[:axis] + (group.operands[k].shape[axis],) + out[axis + 1:]
            strides = [list(s) for s in full]
            bases = [s[axis] * at for s in full]
            for j in parts:  # the other parts are not read in this box
                strides[1 + j], bases[1 + j] = [0] * len(out), 0
            strides[1 + k] = broadcast_strides(group.operands[k].shape, box)
            exprs = [Expr(e.op, e.attrs, [("in", k) if r[0] == "cat" else r for r in e.args], e.in_dtypes, e.dtype,
                          e.name) for e in group.exprs]
            boxes.append((box, strides, bases, exprs))
            at += box[axis]
    regions = []
    for box, strides, bases, exprs in boxes:
        dims, merged = U.merge_nest(box, strides)
        if not dims:  # a single element
            dims, merged = [1], [[0] for _ in strides]
        if math.prod(dims):
            regions.append(_Region(dims, merged, bases, exprs))
    return regions


def emit_fused(module: ir.Module, name: str, group: FusedElementwise, vector_width: int | None = None
               ) -> ir.Function:
    """void name(out, in_0, ..., in_k, i32 tid, i32 nthreads). With `vector_width`, a float32 group of
    arithmetic ops runs its innermost dim in vectors of that many lanes (_lane_row)."""
    regions = _regions(group)
    lanes = vector_width if vector_width and lane_group(group) and all(
        r.strides[0][-1] == 1 and {s[-1] for s in r.strides} <= {0, 1} for r in regions) else None
    params = [("out", PTR if lanes else U.ptr_type(group.out_dtype))]
    for k, opnd in enumerate(group.operands):
        pname = group.names[k] if k < len(group.names) else f"in{k}"
        params.append((pname, PTR if lanes else U.ptr_type(opnd.dtype)))
    params += [("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out_ptr, in_ptrs = fn.args[0], fn.args[1:1 + len(group.operands)]
    tid, nt = fn.args[-2], fn.args[-1]
    for r in regions:
        _nest(b, group, r, lanes, out_ptr, in_ptrs, tid, nt)
    b.ret_void()
    return fn


def _nest(b: ir.IRBuilder, group: FusedElementwise, r: _Region, lanes: int | None, out_ptr: ir.Value,
          in_ptrs: Sequence[ir.Value], tid: ir.Value, nt: ir.Value) -> None:
    """The loops over one region; threads split its outermost dim."""
    dims, strides = r.dims, r.strides
    lo, hi = U.thread_range(b, dims[0], tid, nt)
    inner = [s[-1] for s in strides]

    def nest(level: int, offs: list[ir.Value]) -> None:
        start, stop = (lo, hi) if level == 0 else (0, dims[level])
        if lanes and level == len(dims) - 1:
            _lane_row(b, group, r.exprs, lanes, out_ptr, in_ptrs, offs, inner, start, stop)
            return
        with U.for_range(b, start, stop, f"i{level}") as i:
            new = []
            for a, off in enumerate(offs):
                s = strides[a][level]
                if s == 0:
                    new.append(off)
                elif s == 1 and isinstance(off, ir.Constant) and off.constant == 0:
                    new.append(i)
                else:
                    new.append(b.add(off, b.mul(i, U.i64(s)), name=f"off{a}.{level}"))
            if level + 1 < len(dims):
                nest(level + 1, new)
            else:
                _body(b, group, r.exprs, out_ptr, in_ptrs, new)

    nest(0, [U.i64(base) for base in r.bases])


def _body(b: ir.IRBuilder, group: FusedElementwise, exprs: list[Expr], out_ptr: ir.Value,
          in_ptrs: Sequence[ir.Value], offs: list[ir.Value]) -> None:
    loaded: dict[int, ir.Value] = {}
    values: list[ir.Value] = []

    def arg(ref: tuple[str, Any], dtype: np.dtype) -> ir.Value:
        kind, v = ref
        if kind == "in":
            if v not in loaded:
                opnd = group.operands[v]
                name = group.names[v] if v < len(group.names) else f"in{v}"
                loaded[v] = U.load(b, in_ptrs[v], offs[1 + v], opnd.dtype, name=f"{name}.v")
            return loaded[v]
        if kind == "expr":
            return values[v]
        return U.const(dtype, v)

    for e in exprs:
        args = [arg(r, dt) for r, dt in zip(e.args, e.in_dtypes)]
        values.append(scalar_op(b, e.op, e.attrs, args, e.in_dtypes, e.dtype))
    U.store(b, out_ptr, offs[0], values[-1], group.out_dtype)


# --- the vector row ------------------------------------------------------------------------------

# Ops whose float32 code below is the scalar code's instructions on vectors (same bits per element).
_LANE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "PRelu", "Identity", "Dropout"})
_F32 = np.dtype(np.float32)


def _lane_expr(e: Expr) -> bool:
    if e.dtype != _F32 or any(np.dtype(d) != _F32 for d in e.in_dtypes):
        return False
    return e.op in activations.EMITTED_OPS or e.op in _LANE_OPS


def lane_group(group: FusedElementwise) -> bool:
    """Whether every operand and value of `group` is float32 and every op has a vector form."""
    return (group.out_dtype == _F32 and all(o.dtype == _F32 for o in group.operands)
            and all(_lane_expr(e) for e in group.exprs))


class _LaneMath(activations.ScalarMath):
    """ScalarMath on float32 vectors: the same instructions, constants splatted over the lanes; exp,
    tanh and erf as the fused epilogues compute them (VectorMath's polynomials, not libm per lane: a
    GELU after a normalization, wav2vec2's first feature layer, took 11 ns per element through libm)."""

    def __init__(self, b: ir.IRBuilder, t: ir.Type) -> None:
        super().__init__(b, t)
        self.vec = activations.VectorMath(VecIR(b.module, b, t.count))

    def const(self, v: float) -> ir.Value:
        return ir.Constant(self.t, [float(v)] * self.t.count)

    bound = const

    def exp(self, x):
        return self.vec.exp(x)

    def expm1(self, x):
        return self.vec.expm1(x)

    def tanh(self, x):
        return self.vec.tanh(x)

    def erf(self, x):
        return self.vec.erf(x)


def _lane_op(b: ir.IRBuilder, e: Expr, args: Sequence[ir.Value]) -> ir.Value:
    x = args[0]
    t = x.type
    act = activations.EMITTED_OPS.get(e.op)
    if act is not None:
        return activations.emit(_LaneMath(b, t), x, act, ACTIVATIONS[act].params_of(e.attrs))
    if e.op in ("Identity", "Dropout"):
        return x
    if e.op == "Neg":
        return b.fneg(x)
    if e.op in ("Max", "Min"):  # the scalar code's intrinsic (NaN in either operand gives NaN)
        name = f"llvm.{'maximum' if e.op == 'Max' else 'minimum'}.v{t.count}f32"
        return b.call(U.declare(b.module, name, t, [t, t]), [x, args[1]])
    if e.op == "PRelu":
        zero = ir.Constant(t, [0.0] * t.count)
        return b.select(b.fcmp_ordered(">", x, zero), x, b.fmul(x, args[1]))
    return _binary(b, e.op, x, args[1], _F32)


def _lane_row(b: ir.IRBuilder, group: FusedElementwise, exprs: list[Expr], vw: int, out_ptr: ir.Value,
              in_ptrs: Sequence[ir.Value], offs: list[ir.Value], inner: list[int], start: int | ir.Value,
              stop: int | ir.Value) -> None:
    """Elements [start, stop) of the innermost dim in vectors of `vw` lanes, the last one masked. An
    operand with stride 0 along it (a per-channel scale) is loaded and splatted once per row. A vector
    is loaded before the store, so an output in place over an operand reads each element first."""
    vx = VecIR(b.module, b, vw)
    names = [group.names[k] if k < len(group.names) else f"in{k}" for k in range(len(group.operands))]
    used = sorted({r[1] for e in exprs for r in e.args if r[0] == "in"})
    hoisted = {k: vx.load_splat(vx.gep(in_ptrs[k], offs[1 + k]), name=names[k]) for k in used if inner[1 + k] == 0}

    def vec(j: ir.Value, mask: ir.Value | None) -> None:
        loaded = dict(hoisted)
        values: list[ir.Value] = []

        def arg(ref: tuple[str, Any]) -> ir.Value:
            kind, v = ref
            if kind == "in":
                if v not in loaded:
                    loaded[v] = vx.load(vx.gep(in_ptrs[v], b.add(offs[1 + v], j)), mask, name=f"{names[v]}.v")
                return loaded[v]
            if kind == "expr":
                return values[v]
            return vx.fconst(v)

        for e in exprs:
            values.append(_lane_op(b, e, [arg(r) for r in e.args]))
        vx.store(values[-1], vx.gep(out_ptr, b.add(offs[0], j)), mask)

    if isinstance(start, int) and isinstance(stop, int):
        full: int | ir.Value = start + (stop - start) // vw * vw
        rest: int | ir.Value = stop - full
    else:
        start_v, stop_v = U.i64(start) if isinstance(start, int) else start, U.i64(stop) if isinstance(stop, int) else stop
        rest = b.and_(b.sub(stop_v, start_v), U.i64(vw - 1), name="lanes.rest")
        full = b.sub(stop_v, rest, name="lanes.full")
    with U.for_range(b, start, full, "j", step=vw) as j:
        vec(j, None)
    if isinstance(rest, int):
        if rest:
            vec(U.i64(full), vx.lane_mask(rest))
        return
    with U.if_then(b, b.icmp_signed(">", rest, U.i64(0)), "lanes.tail"):
        count = vx.splat(b.trunc(rest, U.I32))
        vec(full, b.icmp_signed("<", vx.iota, count, name="lanes.mask"))
