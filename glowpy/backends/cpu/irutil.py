"""Small helpers over llvmlite.ir shared by the kernel emitters: element types, constants, loops,
thread partitioning, and the scalar math the elementwise ops and epilogues are made of.

Conventions: indices are i64; float16 values are computed in float32 (rounded back to half after
every op, as numpy does); bfloat16 is stored as i16 (the top half of a float32: widened by a shift,
narrowed round-to-nearest-even with NaN kept quiet and signed, as ml_dtypes) and computed in float32;
bools are stored as one byte (0/1) and computed as i1. The storage-only types (float8, float4, int4,
int2: one element per byte) are computed as their raw i8 bits: only Cast interprets them
(kernels/lowfloat.py), movement kernels copy them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from llvmlite import ir

from glowpy.errors import InternalError, UnsupportedDatatype
from glowpy.ir.types import BFLOAT16, FLOAT_TYPES, STORAGE_TYPES

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I16 = ir.IntType(16)
I64 = ir.IntType(64)
F16 = ir.HalfType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
VOID = ir.VoidType()
I8P = I8.as_pointer()

# Element types the CPU backend generates code for (every glowpy dtype).
_STORAGE = {
    "f2": F16, "f4": F32, "f8": F64,
    "i1": I8, "i2": ir.IntType(16), "i4": I32, "i8": I64,
    "u1": I8, "u2": ir.IntType(16), "u4": I32, "u8": I64,
    "b1": I8,
    "bf16": I16, "raw1": I8,
}


def _key(dtype: np.dtype) -> str:
    dt = np.dtype(dtype)
    if dt == BFLOAT16:
        return "bf16"
    if dt in STORAGE_TYPES:
        return "raw1"
    return f"{dt.kind}{dt.itemsize}"


def supported_dtype(dtype: np.dtype) -> bool:
    return _key(dtype) in _STORAGE


def storage_type(dtype: np.dtype) -> ir.Type:
    """The LLVM type of one element in memory."""
    t = _STORAGE.get(_key(dtype))
    if t is None:
        raise UnsupportedDatatype("element type has no CPU code generation", found=str(np.dtype(dtype)))
    return t


def compute_type(dtype: np.dtype) -> ir.Type:
    """The LLVM type values are computed in: half widens to float, bool is i1."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return I1
    if dt == np.float16 or dt == BFLOAT16:
        return F32
    return storage_type(dt)


def ptr_type(dtype: np.dtype) -> ir.PointerType:
    return storage_type(dtype).as_pointer()


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in FLOAT_TYPES


def is_signed(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "i"


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, int(v))


def i32(v: int) -> ir.Constant:
    return ir.Constant(I32, int(v))


def const(dtype: np.dtype, value: float | int | bool) -> ir.Constant:
    """A constant in the compute type of `dtype` (value converted like numpy's astype)."""
    dt = np.dtype(dtype)
    t = compute_type(dt)
    if dt.kind == "b":
        return ir.Constant(I1, int(bool(value)))
    if dt in FLOAT_TYPES:
        v = float(np.asarray(value).astype(dt))  # round to the storage precision first
        return ir.Constant(t, v)
    v = int(np.asarray(value).astype(dt))
    return ir.Constant(t, v & ((1 << t.width) - 1) if v < 0 else v)


def lowest(dtype: np.dtype) -> ir.Constant:
    """The identity of max: -inf for floats, the type's minimum for integers."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return ir.Constant(compute_type(dt), -math.inf)
    if dt.kind == "b":
        return ir.Constant(I1, 0)
    return const(dt, np.iinfo(dt).min)


# --- memory --------------------------------------------------------------------------------------


def load(b: ir.IRBuilder, ptr: ir.Value, index: ir.Value, dtype: np.dtype, name: str = "") -> ir.Value:
    """Load element `index` of `ptr` and widen it to the compute type."""
    p = b.gep(ptr, [index], inbounds=True, name=f"{name}.addr" if name else "")
    v = b.load(p, name=name)
    return widen(b, v, dtype)


def store(b: ir.IRBuilder, ptr: ir.Value, index: ir.Value, value: ir.Value, dtype: np.dtype) -> None:
    p = b.gep(ptr, [index], inbounds=True)
    b.store(narrow(b, value, dtype), p)


def widen(b: ir.IRBuilder, v: ir.Value, dtype: np.dtype) -> ir.Value:
    dt = np.dtype(dtype)
    if dt == np.float16:
        return b.fpext(v, F32)
    if dt == BFLOAT16:
        return b.bitcast(b.shl(b.zext(v, I32), ir.Constant(I32, 16)), F32)
    if dt.kind == "b":
        return b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
    return v


def narrow(b: ir.IRBuilder, v: ir.Value, dtype: np.dtype) -> ir.Value:
    dt = np.dtype(dtype)
    if dt == np.float16:
        return b.fptrunc(v, F16)
    if dt == BFLOAT16:
        return to_bfloat16(b, v)
    if dt.kind == "b":
        return b.zext(v, I8)
    return v


def to_bfloat16(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """float32 -> bfloat16 bits (i16): round to nearest even; NaN becomes the quiet NaN of its sign."""
    bits = b.bitcast(v, I32)
    lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = b.lshr(b.add(b.add(bits, ir.Constant(I32, 0x7FFF)), lsb), ir.Constant(I32, 16))
    nan = b.or_(b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 0x8000)), ir.Constant(I32, 0x7FC0))
    is_nan = b.fcmp_unordered("uno", v, v)
    return b.trunc(b.select(is_nan, nan, rounded), I16, name="bf16")


def round_half(b: ir.IRBuilder, v: ir.Value, dtype: np.dtype) -> ir.Value:
    """numpy rounds every float16 (ml_dtypes every bfloat16) op result to its type; values stay
    float32 in registers."""
    dt = np.dtype(dtype)
    if dt == np.float16:
        return b.fpext(b.fptrunc(v, F16), F32)
    if dt == BFLOAT16:
        return widen(b, to_bfloat16(b, v), dt)
    return v


# --- control flow --------------------------------------------------------------------------------


def _as_i64(v: int | ir.Value) -> ir.Value:
    return i64(v) if isinstance(v, int) else v


@contextmanager
def for_range(b: ir.IRBuilder, start: int | ir.Value, stop: int | ir.Value, name: str,
              step: int = 1) -> Iterator[ir.Value]:
    """`for (i = start; i < stop; i += step)` as a rotated loop (guard, body, latch, exit)."""
    if isinstance(start, int) and isinstance(stop, int) and start >= stop:
        # Statically empty: give the body a dead block so callers can emit into it unconditionally.
        dead = b.function.append_basic_block(f"{name}.dead")
        after = b.function.append_basic_block(f"{name}.exit")
        b.branch(after)
        with b.goto_block(dead):
            yield i64(start)
            b.unreachable()
        b.position_at_end(after)
        return
    fn = b.function
    pre = b.block
    body = fn.append_basic_block(f"{name}.body")
    exit_ = fn.append_basic_block(f"{name}.exit")
    start_v, stop_v = _as_i64(start), _as_i64(stop)
    if isinstance(start, int) and isinstance(stop, int):
        b.branch(body)
    else:
        b.cbranch(b.icmp_signed("<", start_v, stop_v, name=f"{name}.guard"), body, exit_)
    b.position_at_end(body)
    i = b.phi(I64, name=name)
    i.add_incoming(start_v, pre)
    yield i
    nxt = b.add(i, i64(step), name=f"{name}.next", flags=("nsw",))
    i.add_incoming(nxt, b.block)
    b.cbranch(b.icmp_signed("<", nxt, stop_v, name=f"{name}.more"), body, exit_)
    b.position_at_end(exit_)


@contextmanager
def if_then(b: ir.IRBuilder, cond: ir.Value, name: str) -> Iterator[None]:
    then = b.function.append_basic_block(f"{name}.then")
    after = b.function.append_basic_block(f"{name}.end")
    b.cbranch(cond, then, after)
    b.position_at_end(then)
    yield
    b.branch(after)
    b.position_at_end(after)


def thread_range(b: ir.IRBuilder, n: int, tid: ir.Value, nthreads: ir.Value, name: str = "part"
                 ) -> tuple[ir.Value, ir.Value]:
    """Thread `tid`'s contiguous share [lo, hi) of range(n) (balanced, empty when n < nthreads)."""
    t = b.sext(tid, I64, name=f"{name}.tid")
    nt = b.sext(nthreads, I64, name=f"{name}.nt")
    lo = b.sdiv(b.mul(i64(n), t), nt, name=f"{name}.lo")
    hi = b.sdiv(b.mul(i64(n), b.add(t, i64(1))), nt, name=f"{name}.hi")
    return lo, hi


def input_band(b: ir.IRBuilder, oh0: ir.Value, oh1: ir.Value, *, stride: int, pad: int, reach: int, size: int,
               name: str = "band") -> tuple[ir.Value, ir.Value]:
    """[first, end) of the input rows, within [0, size), that output rows [oh0, oh1) of a window op read
    (output row o reads input rows o * stride - pad up to o * stride - pad + reach - 1)."""
    first = b.sub(b.mul(oh0, i64(stride)), i64(pad), name=f"{name}.in0")
    end = b.add(b.mul(b.sub(oh1, i64(1)), i64(stride)), i64(reach - pad), name=f"{name}.in1")
    first = b.select(b.icmp_signed("<", first, i64(0)), i64(0), first, name=f"{name}.first")
    return first, b.select(b.icmp_signed("<", end, i64(size)), end, i64(size), name=f"{name}.end")


def new_function(module: ir.Module, name: str, params: Sequence[tuple[str, ir.Type]],
                 *, internal: bool = True) -> tuple[ir.Function, ir.IRBuilder]:
    """A void function with named parameters and a builder positioned in its first code block.
    The entry block holds only stack slots (see entry_alloca) and a branch to "start"."""
    fn = ir.Function(module, ir.FunctionType(VOID, [t for _, t in params]), name=name)
    for arg, (pname, _) in zip(fn.args, params):
        arg.name = pname
    if internal:
        fn.linkage = "internal"
    entry = fn.append_basic_block("entry")
    start = fn.append_basic_block("start")
    ir.IRBuilder(entry).branch(start)
    return fn, ir.IRBuilder(start)


def declare(module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    """Get-or-declare an external function (libm, libc, pthreads, intrinsics)."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret, list(args)), name=name)


# --- scalar math ---------------------------------------------------------------------------------

_LIBM = {F32: "f", F64: ""}


def libm(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """Call a libm function (expf/exp, tanhf/tanh, erff/erf, log1pf/log1p ...) for the args' type."""
    t = args[0].type
    fn = declare(b.module, name + _LIBM[t], t, [t] * len(args))
    return b.call(fn, list(args))


def intrinsic(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """A type-overloaded LLVM intrinsic, e.g. intrinsic(b, "llvm.sqrt", x)."""
    t = args[0].type
    suffix = {F32: "f32", F64: "f64"}.get(t) or f"i{t.width}"
    fn = declare(b.module, f"{name}.{suffix}", t, [t] * len(args))
    return b.call(fn, list(args))


def fmax_nan(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """numpy maximum: NaN in either operand gives NaN."""
    return intrinsic(b, "llvm.maximum", x, y)


def fmin_nan(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return intrinsic(b, "llvm.minimum", x, y)


def fconst(t: ir.Type, v: float) -> ir.Constant:
    return ir.Constant(t, float(v))


def nest(b: ir.IRBuilder, dims: Sequence[int], strides: Sequence[Sequence[int]], bases: Sequence[ir.Value],
         body, *, split: tuple[ir.Value, ir.Value] | None = None, name: str = "i") -> None:
    """Loop over `dims` (outermost first), calling body(offsets, indices) innermost, where
    offsets[a] = bases[a] + sum_d i_d * strides[a][d]. `split` = (tid, nthreads) shares dim 0."""
    if any(d == 0 for d in dims):
        return
    if not dims:
        body(list(bases), [])
        return
    if split is not None:
        lo, hi = thread_range(b, dims[0], split[0], split[1], name=f"{name}.part")
    else:
        lo, hi = 0, dims[0]

    def level(d: int, offs: list[ir.Value], idx: list[ir.Value]) -> None:
        start, stop = (lo, hi) if d == 0 else (0, dims[d])
        with for_range(b, start, stop, f"{name}{d}") as i:
            new = []
            for a, off in enumerate(offs):
                s = strides[a][d]
                if s == 0:
                    new.append(off)
                elif s == 1 and isinstance(off, ir.Constant) and off.constant == 0:
                    new.append(i)
                else:
                    new.append(b.add(off, b.mul(i, i64(s)), name=f"{name}.off{a}.{d}"))
            if d + 1 < len(dims):
                level(d + 1, new, idx + [i])
            else:
                body(new, idx + [i])

    level(0, list(bases), [])


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def merge_nest(dims: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge adjacent dims that are contiguous for every stride list."""
    keep = [d for d in range(len(dims)) if dims[d] != 1]
    out_dims = [dims[d] for d in keep]
    st = [[s[d] for d in keep] for s in strides]
    i = len(out_dims) - 2
    while i >= 0:
        if all(s[i] == s[i + 1] * out_dims[i + 1] for s in st):
            out_dims[i] *= out_dims[i + 1]
            for s in st:
                s[i] = s[i + 1]
                del s[i + 1]
            del out_dims[i + 1]
        i -= 1
    return out_dims, st


def entry_alloca(b: ir.IRBuilder, t: ir.Type, name: str) -> ir.Value:
    """A stack slot in the function's entry block (an alloca inside a loop would grow the stack
    every iteration); SROA turns these into registers. Functions from new_function keep their entry
    block for these, so inserting at its start never moves the builder's own position."""
    entry = b.function.entry_basic_block
    if b.block is entry:
        raise InternalError("entry_alloca needs a function made by new_function")
    eb = ir.IRBuilder(entry)
    eb.position_at_start(entry)
    return eb.alloca(t, name=name)
