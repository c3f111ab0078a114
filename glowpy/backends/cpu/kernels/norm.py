"""Normalizations over a row: Softmax / LogSoftmax along one axis, LayerNormalization over the
trailing dims, and LRN across channels. Float16 computes in float32, float64 in float64; threads
split the rows (outer x inner positions)."""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.kernels.elementwise import broadcast_strides
from glowpy.backends.cpu.vector import PTR, Loop, VecIR

_REASSOC = ("reassoc", "contract")


def _acc_type(dtype: np.dtype) -> ir.Type:
    return U.F64 if np.dtype(dtype) == np.float64 else U.F32


def emit_softmax(module: ir.Module, name: str, dtype: np.dtype, shape: tuple[int, ...], axis: int,
                 log: bool) -> ir.Function:
    """void name(out, x, tid, nthreads): exp(x - max) / sum, or its log, along `axis`."""
    dt = np.dtype(dtype)
    params = [("out", U.ptr_type(dt)), ("x", U.ptr_type(dt)), ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, tid, nt = fn.args
    axis %= len(shape)
    outer, n, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    if outer * n * inner == 0:
        b.ret_void()
        return fn
    t = _acc_type(dt)
    mx = U.entry_alloca(b, t, "max.slot")
    sm = U.entry_alloca(b, t, "sum.slot")

    def elem(base: ir.Value, a: ir.Value) -> ir.Value:
        return b.add(base, b.mul(a, U.i64(inner)))

    def ld(p: ir.Value) -> ir.Value:
        v = U.load(b, x, p, dt)
        return v if v.type == t else b.fpext(v, t)

    def row(offs: list[ir.Value], idx: list[ir.Value]) -> None:
        o, i = idx
        base = b.add(b.mul(o, U.i64(n * inner)), i, name="row")
        b.store(ir.Constant(t, -math.inf), mx)
        with U.for_range(b, 0, n, "a") as a:
            b.store(U.fmax_nan(b, b.load(mx), ld(elem(base, a))), mx)
        m = b.load(mx, name="rowmax")
        b.store(ir.Constant(t, 0.0), sm)
        with U.for_range(b, 0, n, "e") as a:
            p = elem(base, a)
            e = U.intrinsic(b, "llvm.exp", b.fsub(ld(p), m))
            b.store(b.fadd(b.load(sm), e, flags=_REASSOC), sm)
            if not log:
                U.store(b, out, p, e if e.type == U.compute_type(dt) else b.fptrunc(e, U.compute_type(dt)), dt)
        s = b.load(sm, name="rowsum")
        if log:
            lse = b.fadd(m, U.intrinsic(b, "llvm.log", s), name="logsumexp")
            with U.for_range(b, 0, n, "w") as a:
                p = elem(base, a)
                r = b.fsub(ld(p), lse)
                U.store(b, out, p, r if r.type == U.compute_type(dt) else b.fptrunc(r, U.compute_type(dt)), dt)
        else:
            inv = b.fdiv(ir.Constant(t, 1.0), s, name="inv")
            with U.for_range(b, 0, n, "w") as a:
                p = elem(base, a)
                v = U.load(b, out, p, dt)
                r = b.fmul(v if v.type == t else b.fpext(v, t), inv)
                U.store(b, out, p, r if r.type == U.compute_type(dt) else b.fptrunc(r, U.compute_type(dt)), dt)

    U.nest(b, [outer, inner], [[0, 0]], [U.i64(0)], row, split=(tid, nt), name="sm")
    b.ret_void()
    return fn


def emit_softmax_rows(module: ir.Module, name: str, rows: int, n: int, vector_width: int) -> ir.Function:
    """void name(out, x, tid, nthreads): float32 softmax along the last axis of a (rows, n) block, in
    vectors (softmax_row), threads splitting the rows."""
    params = [("out", PTR), ("x", PTR), ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, tid, nt = fn.args
    if rows * n == 0:
        b.ret_void()
        return fn
    vx = VecIR(module, b, vector_width)
    lo, hi = U.thread_range(b, rows, tid, nt, "rows")
    rl = Loop(vx, "row", lo, hi)
    base = b.mul(rl.i, U.i64(n), name="row.base")
    softmax_row(vx, vx.gep(out, base, name="outrow"), vx.gep(x, base, name="xrow"), n)
    rl.close()
    b.ret_void()
    return fn


def softmax_row(vx: VecIR, outr, xr, n: int, nan_to_zero: bool = False) -> None:
    """Emit the float32 softmax of the n floats at xr into outr (may be xr): a NaN-propagating max,
    exp(x - max) stored while its sum accumulates, one scale by 1 / sum; lanes past n are masked. A row
    holding NaN (or only -inf) gives NaN, as exp(x - max) does, or 0 with `nan_to_zero`."""
    b, vw = vx.b, vx.vw
    full, tail = divmod(n, vw)
    tmask = vx.lane_mask(tail) if tail else None
    vmax = vx.intrinsic(f"llvm.maximum.v{vw}f32", vx.vty, [vx.vty, vx.vty])
    ninf = vx.fconst(-math.inf)

    def lanes(v, op):
        """op over the lanes of v, as a tree of log2(vw) shuffles (a chain of vw steps costs more than
        a short row's whole exp pass)."""
        shift = vw // 2
        while shift:
            perm = ir.Constant(vx.ity, [(i + shift) % vw for i in range(vw)])
            v = op(v, b.shuffle_vector(v, v, perm))
            shift //= 2
        return b.extract_element(v, ir.Constant(U.I32, 0))

    def vloop(label, carried, body):
        """body(ptr offset, mask, carried) -> new carried, over the row's full vectors then its tail."""
        lp = Loop(vx, label, 0, full, carried=carried)
        vals = body(b.mul(lp.i, U.i64(vw)), None, lp.vals)
        vals = lp.close(vals)
        return body(U.i64(full * vw), tmask, vals) if tail else vals

    def load_x(off, mask, fill):
        v = vx.load(vx.gep(xr, off), mask)
        return v if mask is None else b.select(mask, v, fill)

    (mv,) = vloop("max", [ninf], lambda off, mask, c: [b.call(vmax, [c[0], load_x(off, mask, ninf)])])
    m = vx.splat(lanes(mv, lambda a, c: b.call(vmax, [a, c])), name="rowmax")

    def expo(off, mask, c):
        d = vx.fsub(load_x(off, mask, ninf), m)
        e = vx.exp(d)  # NaN (a NaN row, or -inf - -inf) stays NaN, -inf gives 0
        vx.store(e, vx.gep(outr, off), mask)
        return [vx.fadd(c[0], e if mask is None else b.select(mask, e, vx.zero))]

    (sv,) = vloop("exp", [vx.zero], expo)
    inv = vx.fdiv(vx.fconst(1.0), vx.splat(lanes(sv, vx.fadd), name="rowsum"), name="inv")

    def scale(off, mask, c):
        p = vx.gep(outr, off)
        r = vx.fmul(vx.load(p, mask), inv)
        if nan_to_zero:
            r = b.select(b.fcmp_unordered("uno", r, r), vx.zero, r)
        vx.store(r, p, mask)
        return []

    vloop("scale", [], scale)


def emit_layer_norm(module: ir.Module, name: str, dtype: np.dtype, shape: tuple[int, ...], axis: int, eps: float,
                    scale_shape: tuple[int, ...], bias_shape: tuple[int, ...] | None) -> ir.Function:
    """void name(out, x, scale, bias_or_null, tid, nthreads): normalize over dims axis..end."""
    dt = np.dtype(dtype)
    params = [("out", U.ptr_type(dt)), ("x", U.ptr_type(dt)), ("scale", U.ptr_type(dt)),
              ("bias", U.ptr_type(dt)), ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, scale, bias, tid, nt = fn.args
    axis %= len(shape)
    norm_shape = shape[axis:]
    outer, r = math.prod(shape[:axis]), math.prod(norm_shape)
    if outer * r == 0:
        b.ret_void()
        return fn
    t = _acc_type(dt)
    ct = U.compute_type(dt)
    acc = U.entry_alloca(b, t, "acc.slot")
    s_strides = broadcast_strides(scale_shape, norm_shape)
    b_strides = broadcast_strides(bias_shape, norm_shape) if bias_shape is not None else None

    def ld(ptr: ir.Value, p: ir.Value) -> ir.Value:
        v = U.load(b, ptr, p, dt)
        return v if v.type == t else b.fpext(v, t)

    with U.for_range(b, *U.thread_range(b, outer, tid, nt, "rows"), "row") as o:
        base = b.mul(o, U.i64(r), name="base")
        b.store(ir.Constant(t, 0.0), acc)
        with U.for_range(b, 0, r, "s") as j:
            b.store(b.fadd(b.load(acc), ld(x, b.add(base, j)), flags=_REASSOC), acc)
        mean = b.fdiv(b.load(acc), ir.Constant(t, float(r)), name="mean")
        b.store(ir.Constant(t, 0.0), acc)
        with U.for_range(b, 0, r, "v") as j:
            d = b.fsub(ld(x, b.add(base, j)), mean)
            b.store(b.fadd(b.load(acc), b.fmul(d, d), flags=_REASSOC), acc)
        var = b.fdiv(b.load(acc), ir.Constant(t, float(r)), name="var")
        rstd = b.fdiv(ir.Constant(t, 1.0), U.intrinsic(b, "llvm.sqrt", b.fadd(var, ir.Constant(t, eps))), name="rstd")

        def elem(offs: list[ir.Value], idx: list[ir.Value]) -> None:
            p = b.add(base, offs[0])
            y = b.fmul(b.fmul(b.fsub(ld(x, p), mean), rstd), ld(scale, offs[1]))
            if b_strides is not None:
                y = b.fadd(y, ld(bias, offs[2]))
            U.store(b, out, p, y if y.type == ct else b.fptrunc(y, ct), dt)

        strides = [U.contiguous_strides(norm_shape), s_strides] + ([b_strides] if b_strides is not None else [])
        dims, st = U.merge_nest(list(norm_shape), strides)
        if not dims:
            dims, st = [1], [[0] for _ in strides]
        U.nest(b, dims, st, [U.i64(0)] * len(st), elem, name="ln")
    b.ret_void()
    return fn


def emit_lrn(module: ir.Module, name: str, dtype: np.dtype, shape: tuple[int, ...], size: int, alpha: float,
             beta: float, bias: float) -> ir.Function:
    """void name(out, x, tid, nthreads): x / (bias + alpha/size * sum of squares over nearby channels)^beta."""
    dt = np.dtype(dtype)
    params = [("out", U.ptr_type(dt)), ("x", U.ptr_type(dt)), ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, tid, nt = fn.args
    n, c = shape[0], shape[1]
    sp = math.prod(shape[2:])
    if n * c * sp == 0:
        b.ret_void()
        return fn
    t = U.F64 if dt == np.float64 else U.F32
    ct = U.compute_type(dt)
    lo_w, hi_w = (size - 1) // 2, math.ceil((size - 1) / 2)
    acc = U.entry_alloca(b, t, "acc.slot")

    def ld(p: ir.Value) -> ir.Value:
        v = U.load(b, x, p, dt)
        return v if v.type == t else b.fpext(v, t)

    with U.for_range(b, *U.thread_range(b, n * c, tid, nt, "planes"), "plane") as pc:
        ch = b.srem(pc, U.i64(c), name="ch")
        img = b.sub(pc, ch, name="img")  # n * c
        c0 = b.sub(ch, U.i64(lo_w))
        c0 = b.select(b.icmp_signed("<", c0, U.i64(0)), U.i64(0), c0, name="c0")
        c1 = b.add(ch, U.i64(hi_w + 1))
        c1 = b.select(b.icmp_signed(">", c1, U.i64(c)), U.i64(c), c1, name="c1")
        with U.for_range(b, 0, sp, "s") as s:
            b.store(ir.Constant(t, 0.0), acc)
            with U.for_range(b, c0, c1, "cc") as cc:
                v = ld(b.add(b.mul(b.add(img, cc), U.i64(sp)), s))
                b.store(b.fadd(b.load(acc), b.fmul(v, v)), acc)
            denom = b.fadd(ir.Constant(t, bias), b.fmul(ir.Constant(t, alpha / size), b.load(acc)))
            p = b.add(b.mul(pc, U.i64(sp)), s)
            y = b.fdiv(ld(p), U.libm(b, "pow", denom, ir.Constant(t, beta)))
            U.store(b, out, p, y if y.type == ct else b.fptrunc(y, ct), dt)
    b.ret_void()
    return fn

