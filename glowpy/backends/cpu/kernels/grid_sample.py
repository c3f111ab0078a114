"""GridSample and RoiAlign. GridSample: per output point (threads split the N x points), the taps' indices and weights are
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


def emit_roi_align(module: ir.Module, name: str, dtype: np.dtype, x_shape: tuple[int, ...], idx_dtype: np.dtype,
                   n_rois: int, attrs: dict) -> ir.Function:
    """void name(out, x, rois, batch_indices, tid, nthreads): RoiAlign (glowpy.ir.ops.grid_sample.roi_align's
    arithmetic: coordinates and weights in float32, sums in float64). Threads split the (roi, channel) pairs; the sample grid of a roi is known
    only at run time when sampling_ratio is 0, so its loops have runtime bounds."""
    dt = np.dtype(dtype)
    params = [("out", U.ptr_type(dt)), ("x", U.ptr_type(dt)), ("rois", U.ptr_type(dt)),
              ("batch_indices", U.ptr_type(idx_dtype)), ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, rois, bidx, tid, nt = fn.args
    n, ch, hgt, wid = x_shape
    ph, pw = attrs["output_height"], attrs["output_width"]
    if n_rois * ch * ph * pw == 0:
        b.ret_void()
        return fn
    f = lambda v: ir.Constant(U.F32, float(np.float32(v)))  # noqa: E731  (coordinates in float32)
    d = lambda v: ir.Constant(U.F64, float(v))  # noqa: E731
    half = bool(attrs["half_pixel"])
    sr = attrs["sampling_ratio"]
    is_max = attrs["mode"] == "max"
    acc_slot = U.entry_alloca(b, U.F64, "acc.slot")
    lo_t, hi_t = U.thread_range(b, n_rois * ch, tid, nt, "pairs")
    with U.for_range(b, lo_t, hi_t, "rc") as rc:
        r = b.sdiv(rc, U.i64(ch))
        c = b.srem(rc, U.i64(ch))

        def coord(k: int) -> ir.Value:
            v = U.load(b, rois, b.add(b.mul(r, U.i64(4)), U.i64(k)), dt)
            v = b.fptrunc(v, U.F32) if v.type == U.F64 else v
            return b.fsub(b.fmul(v, f(attrs["spatial_scale"])), f(0.5 if half else 0.0))

        sw, sh, ew, eh = (coord(k) for k in range(4))
        rw, rh = b.fsub(ew, sw), b.fsub(eh, sh)
        if not half:
            rw, rh = U.intrinsic(b, "llvm.maxnum", rw, f(1)), U.intrinsic(b, "llvm.maxnum", rh, f(1))
        bh, bw = b.fdiv(rh, f(ph)), b.fdiv(rw, f(pw))
        if sr > 0:
            gh = gw = U.i64(sr)
        else:
            # a NaN or huge extent gives no samples rather than a runaway loop
            def grid_n(extent: ir.Value, pooled: int) -> ir.Value:
                g = U.intrinsic(b, "llvm.ceil", b.fdiv(extent, f(pooled)))
                g = U.intrinsic(b, "llvm.minnum", U.intrinsic(b, "llvm.maxnum", g, f(-1e6)), f(1e6))
                return b.fptosi(g, U.I64)

            gh, gw = grid_n(rh, ph), grid_n(rw, pw)
        prod = b.mul(gh, gw)
        count = b.sitofp(b.select(b.icmp_signed(">", prod, U.i64(1)), prod, U.i64(1)), U.F64)
        bi = U.load(b, bidx, r, idx_dtype)
        bi = b.sext(bi, U.I64) if bi.type != U.I64 else bi
        bi = b.select(b.icmp_signed("<", bi, U.i64(0)), U.i64(0),
                      b.select(b.icmp_signed(">=", bi, U.i64(n)), U.i64(n - 1), bi))
        xb = b.mul(b.add(b.mul(bi, U.i64(ch)), c), U.i64(hgt * wid))
        ghf, gwf = b.sitofp(gh, U.F32), b.sitofp(gw, U.F32)

        def axis(start: ir.Value, bin_: ir.Value, p: ir.Value, i: ir.Value, g: ir.Value, size: int):
            v = b.fadd(b.fadd(start, b.fmul(b.sitofp(p, U.F32), bin_)),
                       b.fdiv(b.fmul(b.fadd(b.sitofp(i, U.F32), f(0.5)), bin_), g))
            outside = b.or_(b.fcmp_unordered("<", v, f(-1.0)), b.fcmp_unordered(">", v, f(size)))
            v = U.intrinsic(b, "llvm.minnum", U.intrinsic(b, "llvm.maxnum", v, f(0.0)), f(size))
            low = b.fptosi(v, U.I64)
            edge = b.icmp_signed(">=", low, U.i64(size - 1))
            low = b.select(edge, U.i64(size - 1), low)
            high = b.select(edge, U.i64(size - 1), b.add(low, U.i64(1)))
            frac = b.select(edge, f(0.0), b.fsub(v, b.sitofp(low, U.F32)))
            return low, high, b.fsub(f(1.0), frac), frac, outside

        with U.for_range(b, 0, ph, "ph") as p_h:
            with U.for_range(b, 0, pw, "pw") as p_w:
                b.store(d(-math.inf) if is_max else d(0.0), acc_slot)
                with U.for_range(b, U.i64(0), gh, "iy") as iy:
                    yl, yh, wyl, wyh, oy = axis(sh, bh, p_h, iy, ghf, hgt)
                    with U.for_range(b, U.i64(0), gw, "ix") as ix:
                        xl, xh, wxl, wxh, ox = axis(sw, bw, p_w, ix, gwf, wid)
                        keep = b.uitofp(b.not_(b.or_(oy, ox)), U.F32)
                        vals = []
                        for yy, wy in ((yl, wyl), (yh, wyh)):
                            for xx, wx in ((xl, wxl), (xh, wxh)):
                                v = U.load(b, x, b.add(xb, b.add(b.mul(yy, U.i64(wid)), xx)), dt)
                                v = b.fpext(v, U.F64) if v.type != U.F64 else v
                                vals.append(b.fmul(b.fpext(b.fmul(b.fmul(wy, wx), keep), U.F64), v))
                        acc = b.load(acc_slot)
                        if is_max:
                            for v in vals:
                                acc = U.fmax_nan(b, acc, v)
                        else:
                            acc = b.fadd(acc, b.fadd(b.fadd(vals[0], vals[1]), b.fadd(vals[2], vals[3])))
                        b.store(acc, acc_slot)
                res = b.load(acc_slot)
                if is_max:  # no samples: 0, as the reference's initial value
                    res = b.select(b.icmp_signed(">", prod, U.i64(0)), res, d(0.0))
                else:
                    res = b.fdiv(res, count)
                ct = U.compute_type(dt)
                o = b.add(b.mul(rc, U.i64(ph * pw)), b.add(b.mul(p_h, U.i64(pw)), p_w))
                U.store(b, out, o, b.fptrunc(res, ct) if ct != U.F64 else res, dt)
    b.ret_void()
    return fn
