"""Linear quantization kernels: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear, bit for bit
as ir/ops/quant.py computes them (division in the declared precision, round half to even, saturation,
NaN to 0; the dequantizing product in float32).

The operand is walked as runs of contiguous elements, each with its parameter either one value (per
tensor, per axis with elements after the axis, blocked along the last axis) or a stream beside the
elements (per axis along the last axis, blocked with elements after the axis): see `_runs`. A run is
vector code at the target's width with a masked tail; threads split the runs. No fast-math flags: every
float op rounds as numpy's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.steps import Step
from glowpy.ir.graph import Node
from glowpy.ir.ops.quant import granularity

if TYPE_CHECKING:
    from glowpy.backends.cpu.lowering import Lowering

F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
PTR = ir.PointerType()
CHUNK = 1 << 14  # elements per run of a per-tensor operand (the unit threads split)
NP_F16, NP_F32, NP_F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def _elem(dtype: np.dtype) -> ir.Type:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return {2: F16, 4: F32, 8: F64}[dt.itemsize]
    return ir.IntType(8 * dt.itemsize)


def _suffix(t: ir.Type) -> str:
    return {F16: "f16", F32: "f32", F64: "f64"}.get(t, f"i{getattr(t, 'width', 0)}")


@dataclass(frozen=True)
class Runs:
    """How an operand of `count` elements splits into runs: run r covers elements
    [base(r), base(r) + length(r)) and reads its parameter at index pbase(r) (+ j for element j of the
    run when `stream`). Per tensor: fixed-size chunks; otherwise the operand as (outer, channels, inner)
    around the quantization axis, blocked by `block` (0: per axis)."""

    kind: str  # tensor | axis | block
    count: int
    outer: int = 1
    channels: int = 1
    inner: int = 1
    block: int = 0

    @property
    def stream(self) -> bool:
        return (self.kind == "axis" and self.inner == 1) or (self.kind == "block" and self.inner > 1)

    @property
    def number(self) -> int:
        if self.kind == "tensor":
            return -(-self.count // CHUNK)
        if self.kind == "axis" and self.inner == 1:
            return self.outer
        if self.kind == "block" and self.inner == 1:
            return self.outer * -(-self.channels // self.block)
        return self.outer * self.channels


def _runs(shape: tuple[int, ...], pshape: tuple[int, ...], axis: int, block: int) -> Runs:
    kind = granularity(shape, pshape, axis, block)
    count = math.prod(shape)
    if kind == "tensor":
        return Runs("tensor", count)
    return Runs(kind, count, math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]), block)


def _run_geometry(b: ir.IRBuilder, runs: Runs, r: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(element base, length, parameter base) of run r, as i64."""
    c = U.i64
    if runs.kind == "tensor":
        base = b.mul(r, c(CHUNK))
        length = b.sub(c(runs.count), base)
        length = b.select(b.icmp_signed("<", length, c(CHUNK)), length, c(CHUNK))
        return base, length, c(0)
    if runs.kind == "axis":
        if runs.inner == 1:
            return b.mul(r, c(runs.channels)), c(runs.channels), c(0)
        return b.mul(r, c(runs.inner)), c(runs.inner), b.urem(r, c(runs.channels))
    nb = -(-runs.channels // runs.block)
    if runs.inner == 1:  # run r = (o, block cb): up to `block` contiguous elements of one parameter
        o, cb = b.udiv(r, c(nb)), b.urem(r, c(nb))
        start = b.mul(cb, c(runs.block))
        length = b.sub(c(runs.channels), start)
        length = b.select(b.icmp_signed("<", length, c(runs.block)), length, c(runs.block))
        return b.add(b.mul(o, c(runs.channels)), start), length, r
    o, ch = b.udiv(r, c(runs.channels)), b.urem(r, c(runs.channels))
    prow = b.add(b.mul(o, c(nb)), b.udiv(ch, c(runs.block)))
    return b.mul(r, c(runs.inner)), c(runs.inner), b.mul(prow, c(runs.inner))


class _Vec:
    """Vector memory at width vw for any element type (masked loads and stores for run tails)."""

    def __init__(self, b: ir.IRBuilder, vw: int) -> None:
        self.b, self.vw = b, vw
        self.iota = ir.Constant(ir.VectorType(I64, vw), list(range(vw)))

    def ty(self, t: ir.Type) -> ir.VectorType:
        return ir.VectorType(t, self.vw)

    def splat(self, v: ir.Value) -> ir.Value:
        vt = self.ty(v.type)
        one = self.b.insert_element(ir.Constant(vt, ir.Undefined), v, U.i32(0))
        return self.b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), ir.Constant(self.ty(I32), [0] * self.vw))

    def mask(self, remaining: ir.Value) -> ir.Value:
        return self.b.icmp_signed("<", self.iota, self.splat(remaining))

    def load(self, base: ir.Value, index: ir.Value, t: ir.Type, mask=None) -> ir.Value:
        b = self.b
        p = b.gep(base, [index], source_etype=t)
        vt = self.ty(t)
        if mask is None:
            return b.load(p, typ=vt, align=1)
        fn = U.declare(b.module, f"llvm.masked.load.v{self.vw}{_suffix(t)}.p0", vt, [PTR, I32, self.ty(I1), vt])
        return b.call(fn, [p, U.i32(1), mask, ir.Constant(vt, None)])

    def store(self, v: ir.Value, base: ir.Value, index: ir.Value, mask=None) -> None:
        b = self.b
        t = v.type.element
        p = b.gep(base, [index], source_etype=t)
        if mask is None:
            b.store(v, p, align=1)
            return
        fn = U.declare(b.module, f"llvm.masked.store.v{self.vw}{_suffix(t)}.p0", ir.VoidType(),
                       [v.type, PTR, I32, self.ty(I1)])
        b.call(fn, [v, p, U.i32(1), mask])

    def roundeven(self, v: ir.Value) -> ir.Value:
        fn = U.declare(self.b.module, f"llvm.roundeven.v{self.vw}{_suffix(v.type.element)}", v.type, [v.type])
        return self.b.call(fn, [v])


def _to_int(b: ir.IRBuilder, v: ir.Value, dtype: np.dtype, t: ir.Type) -> ir.Value:
    """An integer (vector) of `dtype` widened to integer type t."""
    return b.sext(v, t) if np.dtype(dtype).kind == "i" else b.zext(v, t)


def _int_to_float(b: ir.IRBuilder, v: ir.Value, dtype: np.dtype, t: ir.Type) -> ir.Value:
    return b.sitofp(v, t) if np.dtype(dtype).kind == "i" else b.uitofp(v, t)


def _to_precision(b: ir.IRBuilder, v: ir.Value, dtype: np.dtype, prec: np.dtype) -> ir.Value:
    """A loaded (vector) value of `dtype` in numpy's `prec`, held as float32 when prec is float16
    (rounded to half first), else in prec's own LLVM type."""
    dt, vw = np.dtype(dtype), v.type.count
    vt = ir.VectorType
    target = F16 if prec == NP_F16 else _elem(prec)
    if dt.kind in "iu":
        v = _int_to_float(b, v, dt, vt(target, vw))
    elif dt.itemsize < prec.itemsize:
        v = b.fpext(v, vt(target, vw))
    elif dt.itemsize > prec.itemsize:
        v = b.fptrunc(v, vt(target, vw))
    return b.fpext(v, vt(F32, vw)) if prec == NP_F16 else v


@dataclass(frozen=True)
class QuantizeSpec:
    runs: Runs
    x: np.dtype
    scale: np.dtype
    out: np.dtype
    precision: np.dtype  # numpy type of the division
    vw: int


def _walk(b: ir.IRBuilder, vec: _Vec, runs: Runs, tid, nt, body) -> None:
    """body(element index, parameter index or None (scalar parameter loaded per run), pbase, mask) over
    every run of thread tid's share, full vectors then the masked tail."""
    lo, hi = U.thread_range(b, runs.number, tid, nt, "run")
    with U.for_range(b, lo, hi, "r") as r:
        base, length, pbase = _run_geometry(b, runs, r)
        full = b.and_(length, U.i64(-vec.vw))
        with U.for_range(b, U.i64(0), full, "j", step=vec.vw) as j:
            body(b.add(base, j), b.add(pbase, j), pbase, None)
        with U.if_then(b, b.icmp_signed("<", full, length), "tail"):
            body(b.add(base, full), b.add(pbase, full), pbase, vec.mask(b.sub(length, full)))


def _param(vec: _Vec, runs: Runs, ptr, t: ir.Type, pidx, pbase, mask) -> ir.Value:
    """A parameter vector: streamed beside the elements, or one value splat."""
    if runs.stream:
        return vec.load(ptr, pidx, t, mask)
    return vec.splat(vec.b.load(vec.b.gep(ptr, [pbase], source_etype=t), typ=t))


def emit_quantize(module: ir.Module, name: str, spec: QuantizeSpec) -> ir.Function:
    """out = saturate(round_half_even(x / scale) + zero_point), the division in spec.precision; NaN gives 0."""
    fn, b = U.new_function(module, name, [("out", PTR), ("x", PTR), ("scale", PTR), ("zp", PTR),
                                          ("tid", I32), ("nthreads", I32)], internal=False)
    out, x, scale, zp, tid, nt = fn.args
    for a in (x, scale, zp):
        a.add_attribute("noalias")
    vec = _Vec(b, spec.vw)
    prec = spec.precision
    info = np.iinfo(spec.out)
    xt, st, ot = _elem(spec.x), _elem(spec.scale), _elem(spec.out)
    ft = F64 if prec == NP_F64 else F32  # the register type of the quotient

    def body(idx, pidx, pbase, mask) -> None:
        q = b.fdiv(_to_precision(b, vec.load(x, idx, xt, mask), spec.x, prec),
                   _to_precision(b, _param(vec, spec.runs, scale, st, pidx, pbase, mask), spec.scale, prec))
        if prec == NP_F16:
            q = b.fpext(b.fptrunc(q, vec.ty(F16)), vec.ty(F32))
        r = vec.roundeven(q)
        z = _to_int(b, _param(vec, spec.runs, zp, ot, pidx, pbase, mask), spec.out, vec.ty(I32))
        zf = b.sitofp(z, vec.ty(ft))
        lo = b.fsub(vec.splat(ir.Constant(ft, float(info.min))), zf)  # exact: small integers
        hi = b.fsub(vec.splat(ir.Constant(ft, float(info.max))), zf)
        r = b.select(b.fcmp_ordered("<", r, lo), lo, r)
        r = b.select(b.fcmp_ordered(">", r, hi), hi, r)
        r = b.select(b.fcmp_unordered("uno", q, q), b.fneg(zf), r)  # NaN: 0 once the zero point is added
        y = b.add(b.fptosi(r, vec.ty(I32)), z)
        vec.store(b.trunc(y, vec.ty(ot)), out, idx, mask)

    _walk(b, vec, spec.runs, tid, nt, body)
    b.ret_void()
    return fn


def emit_dequantize(module: ir.Module, name: str, runs: Runs, x_dtype: np.dtype, scale_dtype: np.dtype,
                    out_dtype: np.dtype, vw: int) -> ir.Function:
    """out = float32(x - zero_point) * float32(scale), then the output type."""
    fn, b = U.new_function(module, name, [("out", PTR), ("x", PTR), ("scale", PTR), ("zp", PTR),
                                          ("tid", I32), ("nthreads", I32)], internal=False)
    out, x, scale, zp, tid, nt = fn.args
    for a in (x, scale, zp):
        a.add_attribute("noalias")
    vec = _Vec(b, vw)
    xt, st = _elem(x_dtype), _elem(scale_dtype)
    wide = I64 if np.dtype(x_dtype).itemsize == 4 else I32  # x - zero_point exactly

    def body(idx, pidx, pbase, mask) -> None:
        xv = _to_int(b, vec.load(x, idx, xt, mask), x_dtype, vec.ty(wide))
        z = _to_int(b, _param(vec, runs, zp, xt, pidx, pbase, mask), x_dtype, vec.ty(wide))
        s = _param(vec, runs, scale, st, pidx, pbase, mask)
        if st == F16:
            s = b.fpext(s, vec.ty(F32))
        y = b.fmul(b.sitofp(b.sub(xv, z), vec.ty(F32)), s)
        if out_dtype == NP_F16:
            y = b.fptrunc(y, vec.ty(F16))
        vec.store(y, out, idx, mask)

    _walk(b, vec, runs, tid, nt, body)
    b.ret_void()
    return fn


def emit_dynamic_range(module: ir.Module, name: str, count: int, vw: int) -> ir.Function:
    """DynamicQuantizeLinear's parameters from x (float32, `count` elements), on thread 0:
    scale = (max(0, max x) - min(0, min x)) / 255 (1 / 255 for an empty range),
    zero_point = round_half_even(clip(-min / scale, 0, 255)); a NaN anywhere makes the range empty."""
    fn, b = U.new_function(module, name, [("scale", PTR), ("zp", PTR), ("x", PTR), ("tid", I32),
                                          ("nthreads", I32)], internal=False)
    scale, zp, x, tid, _ = fn.args
    x.add_attribute("noalias")
    vec = _Vec(b, vw)
    vt, mt = vec.ty(F32), vec.ty(I1)
    with U.if_then(b, b.icmp_signed("==", tid, U.i32(0)), "t0"):
        acc = [U.entry_alloca(b, t, n) for t, n in ((vt, "hi"), (vt, "lo"), (mt, "nan"))]
        for slot, init in zip(acc, (ir.Constant(vt, None), ir.Constant(vt, None), ir.Constant(mt, None))):
            b.store(init, slot)

        def step(v, mask=None) -> None:
            hi, lo, nan = (b.load(s) for s in acc)
            b.store(b.select(b.fcmp_ordered(">", v, hi), v, hi), acc[0])
            b.store(b.select(b.fcmp_ordered("<", v, lo), v, lo), acc[1])
            b.store(b.or_(nan, b.fcmp_unordered("uno", v, v)), acc[2])

        full = count - count % vw
        if full:
            with U.for_range(b, U.i64(0), U.i64(full), "j", step=vw) as j:
                step(vec.load(x, j, F32))
        if full < count:
            step(vec.load(x, U.i64(full), F32, vec.mask(U.i64(count - full))))  # masked-off lanes read 0
        hi, lo, nan = (b.load(s) for s in acc)
        h, lw = b.extract_element(hi, U.i32(0)), b.extract_element(lo, U.i32(0))
        for k in range(1, vw):
            e, f = b.extract_element(hi, U.i32(k)), b.extract_element(lo, U.i32(k))
            h = b.select(b.fcmp_ordered(">", e, h), e, h)
            lw = b.select(b.fcmp_ordered("<", f, lw), f, lw)
        any_nan = b.call(U.declare(module, f"llvm.vector.reduce.or.v{vw}i1", I1, [mt]), [nan])
        zero = ir.Constant(F32, 0.0)
        h, lw = b.select(any_nan, zero, h), b.select(any_nan, zero, lw)
        width = b.select(b.fcmp_ordered("==", h, lw), ir.Constant(F32, 1.0), b.fsub(h, lw))
        s = b.fdiv(width, ir.Constant(F32, 255.0))
        z = b.fsub(zero, b.fdiv(lw, s))
        z = b.select(b.fcmp_ordered("<", z, zero), zero, z)
        z = b.select(b.fcmp_ordered(">", z, ir.Constant(F32, 255.0)), ir.Constant(F32, 255.0), z)
        z = b.call(U.declare(module, "llvm.roundeven.f32", F32, [F32]), [z])
        b.store(s, scale)
        b.store(b.fptoui(z, I8), zp)
    b.ret_void()
    return fn


# --- lowering --------------------------------------------------------------------------------------


def _lower_QuantizeLinear(low: Lowering, node: Node) -> None:
    x, s, z = node.inputs
    out = node.outputs[0]
    a = node.attrs
    prec = np.dtype(a["precision"]) if a["precision"] is not None else np.result_type(x.dtype, s.dtype)
    spec = QuantizeSpec(_runs(x.shape, s.shape, a["axis"], a["block_size"]), x.dtype, s.dtype, out.dtype,
                        np.dtype(prec), low.vector_width)
    fn = emit_quantize(low.kmod(), low.fname([node]), spec)
    low.add(Step(fn.name, fn, [low.val(out), low.val(x), low.val(s), low.val(z)], [out], [node],
                 work=4.0 * out.type.size))


def _lower_DequantizeLinear(low: Lowering, node: Node) -> None:
    x, s, z = node.inputs
    out = node.outputs[0]
    a = node.attrs
    fn = emit_dequantize(low.kmod(), low.fname([node]), _runs(x.shape, s.shape, a["axis"], a["block_size"]),
                         x.dtype, s.dtype, out.dtype, low.vector_width)
    low.add(Step(fn.name, fn, [low.val(out), low.val(x), low.val(s), low.val(z)], [out], [node],
                 work=2.0 * out.type.size))


def _lower_DynamicQuantizeLinear(low: Lowering, node: Node) -> None:
    """Two steps: the range on one thread (it is one pass of compares), then QuantizeLinear's kernel
    with the parameters it wrote."""
    x = node.inputs[0]
    y, scale, zp = node.outputs
    fn = emit_dynamic_range(low.kmod(), low.fname([node]), x.type.size, low.vector_width)
    low.add(Step(fn.name, fn, [low.val(scale), low.val(zp), low.val(x)], [scale, zp], [node], work=0.0))
    spec = QuantizeSpec(Runs("tensor", x.type.size), x.dtype, scale.dtype, y.dtype, NP_F32, low.vector_width)
    fn = emit_quantize(low.kmod(), low.fname([node]), spec)
    low.add(Step(fn.name, fn, [low.val(y), low.val(x), low.val(scale), low.val(zp)], [y], [node],
                 work=4.0 * y.type.size))


KERNELS = {"QuantizeLinear": _lower_QuantizeLinear, "DequantizeLinear": _lower_DequantizeLinear,
           "DynamicQuantizeLinear": _lower_DynamicQuantizeLinear}
