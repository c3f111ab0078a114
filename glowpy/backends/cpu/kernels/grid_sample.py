"""GridSample: per output point (threads split the N x points), the taps' indices and weights are
computed once from the grid (glowpy.ir.ops.grid_sample's arithmetic, coordinates in float32), then
every channel sums its taps (unrolled: 1, 2 or 4 per dim)."""

from __future__ import annotations

import itertools
import math

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.ir.ops.grid_sample import CUBIC_A


def _reflect(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    """glowpy.ir.ops.grid_sample.reflect for one float64."""
    f = lambda v: ir.Constant(U.F64, float(v))  # noqa: E731
    span = hi - lo

    def side(dx: ir.Value, near: float, far: float, sign: float) -> ir.Value:
        n = U.intrinsic(b, "llvm.trunc", b.fdiv(dx, f(span)))
        r = b.fsub(dx, b.fmul(n, f(span)))
        even = b.fcmp_ordered("==", b.frem(n, f(2.0)), f(0.0))
        return b.select(even, b.fadd(f(near), b.fmul(f(sign), r)), b.fsub(f(far), b.fmul(f(sign), r)))

    below, above = b.fsub(f(lo), x), b.fsub(x, f(hi))
    out = b.select(b.fcmp_ordered(">", above, f(0.0)), side(above, hi, lo, -1.0), x)
    return b.select(b.fcmp_ordered(">", below, f(0.0)), side(below, lo, hi, 1.0), out)


def _cubic_weights(b: ir.IRBuilder, t: ir.Value) -> list[ir.Value]:
    """glowpy.ir.ops.grid_sample.cubic_coeffs for one float64 fraction."""
    A = CUBIC_A
    f = lambda v: ir.Constant(U.F64, float(v))  # noqa: E731

    def outer(s: ir.Value) -> ir.Value:  # ((A s - 5A) s + 8A) s - 4A
        r = b.fadd(b.fmul(b.fsub(b.fmul(f(A), s), f(5 * A)), s), f(8 * A))
        return b.fsub(b.fmul(r, s), f(4 * A))

    def inner(s: ir.Value) -> ir.Value:  # ((A + 2) s - (A + 3)) s s + 1
        r = b.fsub(b.fmul(f(A + 2), s), f(A + 3))
        return b.fadd(b.fmul(b.fmul(r, s), s), f(1))

    return [outer(b.fadd(t, f(1))), inner(t), inner(b.fsub(f(1), t)), outer(b.fsub(f(2), t))]


def emit_grid_sample(module: ir.Module, name: str, dtype: np.dtype, x_shape: tuple[int, ...],
                     grid_shape: tuple[int, ...], mode: str, padding: str, align_corners: bool) -> ir.Function:
    """void name(out, x, grid, tid, nthreads)."""
    dt = np.dtype(dtype)
    params = [("out", U.ptr_type(dt)), ("x", U.ptr_type(dt)), ("grid", U.ptr_type(dt)), ("tid", U.I32),
              ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, grid, tid, nt = fn.args
    n, ch = x_shape[:2]
    dims = x_shape[2:]
    nd = len(dims)
    points = math.prod(grid_shape[1:-1])
    plane = math.prod(dims)
    if n * ch * points == 0:
        b.ret_void()
        return fn
    acc_t = U.F64 if dt == np.float64 else U.F32
    f32 = lambda v: ir.Constant(U.F32, float(v))  # noqa: E731
    f64 = lambda v: ir.Constant(U.F64, float(v))  # noqa: E731
    lo = [0.0 if align_corners else -0.5] * nd
    hi = [d - (1.0 if align_corners else 0.5) for d in dims]
    strides = U.contiguous_strides(dims)
    lo_t, hi_t = U.thread_range(b, n * points, tid, nt, "points")
    with U.for_range(b, lo_t, hi_t, "pt") as pt:
        bn = b.sdiv(pt, U.i64(points))
        q = b.srem(pt, U.i64(points))
        taps = []  # per dim: [(index i64, weight f64)]
        for d in range(nd):
            g = U.load(b, grid, b.add(b.mul(pt, U.i64(nd)), U.i64(nd - 1 - d)), dt)
            g = b.fptrunc(g, U.F32) if g.type == U.F64 else g
            size = f32(dims[d])
            if align_corners:
                c = b.fmul(b.fdiv(b.fadd(g, f32(1)), f32(2)), f32(dims[d] - 1))
            else:
                c = b.fdiv(b.fsub(b.fmul(b.fadd(g, f32(1)), size), f32(1)), f32(2))
            if mode == "nearest":
                c = U.intrinsic(b, "llvm.roundeven", c)
            outside = b.or_(b.fcmp_ordered("<", c, f32(lo[d])), b.fcmp_ordered(">", c, f32(hi[d])))
            if padding == "border":
                c = b.select(outside, U.fmin_nan(b, U.fmax_nan(b, c, f32(0)), f32(dims[d] - 1)), c)
            elif padding == "reflection":
                c = b.select(outside, b.fptrunc(_reflect(b, b.fpext(c, U.F64), lo[d], hi[d]), U.F32), c)
            c = b.fpext(c, U.F64)
            # far-off coordinates only reach padding: clamp before the integer conversion (maxnum takes a
            # NaN coordinate to -8, so no index is ever out of the plane)
            c = U.intrinsic(b, "llvm.minnum", U.intrinsic(b, "llvm.maxnum", c, f64(-8)), f64(dims[d] + 8))
            if mode == "nearest":
                offs, base, ws = [0], c, [f64(1.0)]
            else:
                base = U.intrinsic(b, "llvm.floor", c)
                t = b.fsub(c, base)
                if mode == "linear":
                    offs, ws = [0, 1], [b.fsub(f64(1), t), t]
                else:
                    offs, ws = [-1, 0, 1, 2], _cubic_weights(b, t)
            base_i = b.fptosi(base, U.I64)
            dim_taps = []
            for o, wt in zip(offs, ws):
                pos = b.add(base_i, U.i64(o))
                if padding == "reflection":
                    pos = b.fptosi(U.intrinsic(b, "llvm.trunc", _reflect(b, b.sitofp(pos, U.F64), lo[d], hi[d])),
                                   U.I64)
                inside = b.and_(b.icmp_signed(">=", pos, U.i64(0)), b.icmp_signed("<", pos, U.i64(dims[d])))
                idx = b.select(b.icmp_signed("<", pos, U.i64(0)), U.i64(0),
                               b.select(b.icmp_signed(">=", pos, U.i64(dims[d])), U.i64(dims[d] - 1), pos))
                if padding == "zeros":
                    wt = b.select(inside, wt, f64(0))
                dim_taps.append((b.mul(idx, U.i64(strides[d])), wt))
            taps.append(dim_taps)
        combos = []
        for combo in itertools.product(*taps):
            flat, wt = combo[0]
            for off, w in combo[1:]:
                flat, wt = b.add(flat, off), b.fmul(wt, w)
            combos.append((flat, wt if acc_t == U.F64 else b.fptrunc(wt, U.F32)))
        xb = b.mul(bn, U.i64(ch * plane))
        ob = b.add(b.mul(bn, U.i64(ch * points)), q)
        with U.for_range(b, 0, ch, "c") as c_:
            xc = b.add(xb, b.mul(c_, U.i64(plane)))
            acc = ir.Constant(acc_t, 0.0)
            for flat, wt in combos:
                v = U.load(b, x, b.add(xc, flat), dt)
                v = b.fpext(v, acc_t) if v.type != acc_t else v
                acc = b.fadd(acc, b.fmul(wt, v))
            ct = U.compute_type(dt)
            U.store(b, out, b.add(ob, b.mul(c_, U.i64(points))), b.fptrunc(acc, ct) if acc.type != ct else acc, dt)
    b.ret_void()
    return fn
