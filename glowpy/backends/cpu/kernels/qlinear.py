"""int8 kernels besides the products: QLinearAdd and QLinearGlobalAveragePool, in float32 as
ir/ops/quant.py (and onnxruntime) compute them, bit for bit. Plain loops over contiguous runs, which
LLVM's loop vectorizer widens (no fast-math flags: every float op rounds as numpy's)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.steps import Step
from glowpy.errors import UnsupportedOperator
from glowpy.ir.graph import Node

if TYPE_CHECKING:
    from glowpy.backends.cpu.lowering import Lowering

I8, I32, F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()


def requantize_scalar(b: ir.IRBuilder, y, yz: int, dtype: np.dtype):
    """round_half_even(y) + yz saturated to dtype (int8 / uint8), y float32."""
    rfn = U.declare(b.module, "llvm.roundeven.f32", F32, [F32])
    y = b.fadd(b.call(rfn, [y]), ir.Constant(F32, float(yz)))
    lo, hi = (0.0, 255.0) if np.dtype(dtype) == np.uint8 else (-128.0, 127.0)
    y = b.select(b.fcmp_ordered("<", y, ir.Constant(F32, lo)), ir.Constant(F32, lo), y)
    y = b.select(b.fcmp_ordered(">", y, ir.Constant(F32, hi)), ir.Constant(F32, hi), y)
    return b.trunc(b.fptosi(y, I32), I8)


def _centered(b: ir.IRBuilder, v, dtype: np.dtype, zp: int):
    wide = b.zext(v, I32) if np.dtype(dtype) == np.uint8 else b.sext(v, I32)
    return b.sitofp(b.sub(wide, ir.Constant(I32, zp)), F32)


def emit_qlinear_add(module: ir.Module, name: str, out_shape, a_strides, b_strides, a_dtype, b_dtype, y_dtype,
                     az: int, bz: int, ra: float, rb: float, yz: int, scalar: str = "") -> ir.Function:
    """out = saturate(rint(fma(A, ra, fma(B, rb, c)))) with c = yz - (ra * az + rb * bz), as onnxruntime's x86
    kernel computes it (ir/ops/quant.py `qlinear_add`); a one-element operand (`scalar` "a" or "b") is
    folded with a plain multiply and add, as there. A and B broadcast by their strides."""
    dims, st = U.merge_nest(list(out_shape), [U.contiguous_strides(out_shape), list(a_strides), list(b_strides)])
    fn, b = U.new_function(module, name, [("out", I8.as_pointer()), ("a", I8.as_pointer()), ("b", I8.as_pointer()),
                                          ("tid", I32), ("nthreads", I32)], internal=False)
    out, pa, pb, tid, nt = fn.args
    for arg in (pa, pb):
        arg.add_attribute("noalias")

    f = np.float32
    c = f(f(yz) - f(f(f(ra) * f(az)) + f(f(rb) * f(bz))))
    fma = U.declare(b.module, "llvm.fma.f32", F32, [F32] * 3)

    def raw(v, dtype):
        return b.sitofp(b.zext(v, I32) if np.dtype(dtype) == np.uint8 else b.sext(v, I32), F32)

    def body(offs, _idx) -> None:
        fa, fb = raw(b.load(b.gep(pa, [offs[1]])), a_dtype), raw(b.load(b.gep(pb, [offs[2]])), b_dtype)
        if scalar == "b":
            y = b.call(fma, [fa, ir.Constant(F32, ra), b.fadd(ir.Constant(F32, float(c)), b.fmul(fb, ir.Constant(F32, rb)))])
        elif scalar == "a":
            y = b.call(fma, [fb, ir.Constant(F32, rb), b.fadd(ir.Constant(F32, float(c)), b.fmul(fa, ir.Constant(F32, ra)))])
        else:
            y = b.call(fma, [fa, ir.Constant(F32, ra), b.call(fma, [fb, ir.Constant(F32, rb), ir.Constant(F32, float(c))])])
        b.store(requantize_scalar(b, y, 0, y_dtype), b.gep(out, [offs[0]]))

    U.nest(b, dims, st, [U.i64(0)] * 3, body, split=(tid, nt) if dims else None, name="q")
    b.ret_void()
    return fn


def emit_qlinear_gap(module: ir.Module, name: str, planes: int, count: int, x_dtype, y_dtype, xz: int,
                     scale: float, yz: int) -> ir.Function:
    """out[p] = saturate(rint(float32(sum (x - xz) over plane p) * scale) + yz)."""
    fn, b = U.new_function(module, name, [("out", I8.as_pointer()), ("x", I8.as_pointer()),
                                          ("tid", I32), ("nthreads", I32)], internal=False)
    out, x, tid, nt = fn.args
    x.add_attribute("noalias")
    lo, hi = U.thread_range(b, planes, tid, nt, "plane")
    wide = b.zext if np.dtype(x_dtype) == np.uint8 else b.sext
    with U.for_range(b, lo, hi, "p") as p:
        base = b.mul(p, U.i64(count))
        pre = b.block
        head, body, done = (b.append_basic_block(f"s.{t}") for t in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(U.I64, "i")
        s = b.phi(I32, "sum")
        i.add_incoming(U.i64(0), pre)
        s.add_incoming(ir.Constant(I32, 0), pre)
        b.cbranch(b.icmp_signed("<", i, U.i64(count)), body, done)
        b.position_at_end(body)
        v = wide(b.load(b.gep(x, [b.add(base, i)])), I32)
        s2 = b.add(s, v)
        i.add_incoming(b.add(i, U.i64(1)), body)
        s.add_incoming(s2, body)
        b.branch(head)
        b.position_at_end(done)
        acc = b.sub(s, ir.Constant(I32, (xz * count) & 0xFFFFFFFF))
        y = b.fmul(b.sitofp(acc, F32), ir.Constant(F32, scale))
        b.store(requantize_scalar(b, y, yz, y_dtype), b.gep(out, [p]))
    b.ret_void()
    return fn


# --- lowering --------------------------------------------------------------------------------------


def _consts(node: Node, idx: tuple[int, ...]) -> list[np.ndarray]:
    for i in idx:
        v = node.inputs[i]
        if not v.is_constant:
            raise UnsupportedOperator("the CPU int8 kernels need constant scales and zero points",
                                      node=node.name, op=node.op, expected="an initializer", found=v.name)
    return [np.asarray(node.inputs[i].data).reshape(()) for i in idx]


def _bcast_strides(shape, out_shape) -> list[int]:
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    st = U.contiguous_strides(padded)
    return [0 if padded[d] == 1 and out_shape[d] != 1 else st[d] for d in range(len(out_shape))]


def _lower_QLinearAdd(low: Lowering, node: Node) -> None:
    a, _, _, bv = node.inputs[:4]
    out = node.outputs[0]
    as_, az, bs, bz, ys, yz = _consts(node, (1, 2, 4, 5, 6, 7))
    ra, rb = np.float32(as_ / ys), np.float32(bs / ys)
    fn = emit_qlinear_add(low.kmod(), low.fname([node]), out.shape, _bcast_strides(a.shape, out.shape),
                          _bcast_strides(bv.shape, out.shape), a.dtype, bv.dtype, out.dtype, int(az), int(bz),
                          float(ra), float(rb), int(yz), "a" if a.type.size == 1 else "b" if bv.type.size == 1 else "")
    low.add(Step(fn.name, fn, [low.val(out), low.val(a), low.val(bv)], [out], [node], work=8.0 * out.type.size))


def _lower_QLinearGlobalAveragePool(low: Lowering, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    xs, xz, ys, yz = _consts(node, (1, 2, 3, 4))
    count = math.prod(x.shape[2:])
    scale = np.float32(xs / (ys * np.float32(count)))
    fn = emit_qlinear_gap(low.kmod(), low.fname([node]), x.shape[0] * x.shape[1], count, x.dtype, out.dtype,
                          int(xz), float(scale), int(yz))
    low.add(Step(fn.name, fn, [low.val(out), low.val(x)], [out], [node], work=float(x.type.size)))


KERNELS = {"QLinearAdd": _lower_QLinearAdd, "QLinearGlobalAveragePool": _lower_QLinearGlobalAveragePool}
