"""Max and average pooling over N-d windows (ceil_mode, explicit pads, dilations, count_include_pad).

Threads split the N*C planes. Per spatial dim, the output range is cut at compile time into the
border (windows that reach into padding or past the input: every tap is checked, and a clamped
address plus a select keeps reads inside the plane) and the interior (no checks at all, so LLVM
unrolls the window and vectorizes the innermost output loop).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.kernels.elementwise import _fmax


def _segments(size: int, out: int, k: int, stride: int, pad: int, dil: int) -> list[tuple[int, int, bool]]:
    """(start, stop, checked) ranges of output coordinates along one dim."""
    lo = -(-pad // stride)  # first o whose window starts inside the input
    hi = (size - 1 - (k - 1) * dil + pad) // stride + 1 if size - 1 - (k - 1) * dil + pad >= 0 else 0
    lo, hi = max(lo, 0), min(hi, out)
    if lo >= hi:
        return [(0, out, True)]
    segs = []
    if lo > 0:
        segs.append((0, lo, True))
    segs.append((lo, hi, False))
    if hi < out:
        segs.append((hi, out, True))
    return segs


def emit_pool(module: ir.Module, name: str, dtype: np.dtype, x_shape: tuple[int, ...], out_shape: tuple[int, ...],
              kind: str, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
              dilations: Sequence[int], count_include_pad: bool = False,
              index_order: int | None = None, norm_p: int = 0) -> ir.Function:
    """void name(out, [i64* indices,] x, tid, nthreads); kind is "max", "avg" or "lp" (the p-norm of each
    window, padding contributing nothing; p = norm_p). With `index_order`
    (max only) the kernel also writes the flat input index of each max (first in window order wins),
    numbering the spatial dims row major (0) or column major (1)."""
    nsp = len(kernel)
    params = [("out", U.ptr_type(dtype))] + ([("indices", U.I64.as_pointer())] if index_order is not None else [])
    params += [("x", U.ptr_type(dtype)), ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, tid, nt = fn.args[0], fn.args[-3], fn.args[-2], fn.args[-1]
    planes = x_shape[0] * x_shape[1]
    sp_in, sp_out = x_shape[2:], out_shape[2:]
    in_st = U.contiguous_strides(sp_in)
    out_st = U.contiguous_strides(sp_out)
    plane_in, plane_out = math.prod(sp_in), math.prod(sp_out)
    if planes * plane_out == 0:
        b.ret_void()
        return fn
    acc_t = U.compute_type(dtype) if kind == "max" else (U.F64 if np.dtype(dtype) == np.float64 else U.F32)
    segs = [_segments(sp_in[d], sp_out[d], kernel[d], strides[d], pads[d], dilations[d]) for d in range(nsp)]
    lo, hi = U.thread_range(b, planes, tid, nt, "planes")

    with U.for_range(b, lo, hi, "plane") as p:
        xb = b.gep(x, [b.mul(p, U.i64(plane_in))], inbounds=True, name="xplane")
        ob = b.gep(out, [b.mul(p, U.i64(plane_out))], inbounds=True, name="oplane")
        ind = None
        if index_order is not None:
            flat = [math.prod(sp_in[:d]) for d in range(nsp)] if index_order else in_st
            ind = (b.gep(fn.args[1], [b.mul(p, U.i64(plane_out))], inbounds=True, name="iplane"),
                   b.mul(p, U.i64(plane_in)), flat)

        def spatial(d: int, coords: list[ir.Value], checked: list[bool]) -> None:
            if d == nsp:
                _window(b, xb, ob, coords, checked, dtype, acc_t, kind, kernel, strides, pads, dilations,
                        sp_in, in_st, out_st, count_include_pad, ind, norm_p)
                return
            for s, (a, z, chk) in enumerate(segs[d]):
                with U.for_range(b, a, z, f"o{d}.{s}") as o:
                    spatial(d + 1, coords + [o], checked + [chk])

        spatial(0, [], [])
    b.ret_void()
    return fn


def _window(b: ir.IRBuilder, xb: ir.Value, ob: ir.Value, coords: list[ir.Value], checked: list[bool],
            dtype: np.dtype, acc_t: ir.Type, kind: str, kernel, strides, pads, dilations, sp_in, in_st, out_st,
            count_include_pad: bool, ind: tuple | None = None, p: int = 0) -> None:
    nsp = len(kernel)
    ends = [sp_in[d] + pads[d + nsp] for d in range(nsp)]
    starts = [b.sub(b.mul(coords[d], U.i64(strides[d])), U.i64(pads[d]), name=f"start{d}") for d in range(nsp)]
    is_f = np.dtype(dtype).kind == "f"
    init = U.lowest(dtype) if kind == "max" else ir.Constant(acc_t, 0.0)
    acc_slot = U.entry_alloca(b, acc_t, "acc.slot")
    b.store(init, acc_slot)
    cnt_slot = None
    if kind == "avg" and any(checked):
        cnt_slot = U.entry_alloca(b, U.I64, "count.slot")
        b.store(U.i64(0), cnt_slot)

    idx_slot = None
    if ind is not None:
        idx_slot = U.entry_alloca(b, U.I64, "index.slot")
        b.store(U.i64(-1), idx_slot)

    def taps(d: int, offset: ir.Value, valid: ir.Value | None, counted: ir.Value | None,
             flat: ir.Value | None = None) -> None:
        if d == nsp:
            if valid is None:
                v = U.widen(b, b.load(b.gep(xb, [offset], inbounds=True)), dtype)
            else:
                safe = b.select(valid, offset, U.i64(0))
                raw = U.widen(b, b.load(b.gep(xb, [safe], inbounds=True)), dtype)
                v = b.select(valid, raw, init if kind == "max" else (
                    ir.Constant(U.compute_type(dtype), 0.0) if is_f else ir.Constant(raw.type, 0)))
            acc = b.load(acc_slot)
            if idx_slot is not None:
                # strictly greater (NaN never), or the first tap that is inside the input
                old = b.load(idx_slot)
                gt = b.fcmp_ordered(">", v, acc) if is_f else (
                    b.icmp_signed if U.is_signed(dtype) else b.icmp_unsigned)(">", v, acc)
                take = b.or_(gt, b.icmp_signed("<", old, U.i64(0)))
                if valid is not None:
                    take = b.and_(take, valid)
                b.store(b.select(take, v, acc), acc_slot)
                b.store(b.select(take, flat, old), idx_slot)
            elif kind == "max":
                b.store(_fmax(b, acc, v, dtype), acc_slot)
            else:
                if v.type != acc_t:
                    v = b.fpext(v, acc_t)
                if kind == "lp":
                    v = U.intrinsic(b, "llvm.fabs", v) if p == 1 else b.fmul(v, v) if p == 2 else \
                        U.intrinsic(b, "llvm.pow", U.intrinsic(b, "llvm.fabs", v), ir.Constant(acc_t, float(p)))
                b.store(b.fadd(acc, v), acc_slot)
                if cnt_slot is not None:
                    inc = counted if count_include_pad else valid
                    if inc is None:
                        inc = ir.Constant(U.I1, 1)
                    b.store(b.add(b.load(cnt_slot), b.zext(inc, U.I64)), cnt_slot)
            return
        with U.for_range(b, 0, kernel[d], f"k{d}") as k:
            pos = b.add(starts[d], b.mul(k, U.i64(dilations[d])), name=f"pos{d}")
            v_ok, c_ok = valid, counted
            if checked[d]:
                inside = b.and_(b.icmp_signed(">=", pos, U.i64(0)), b.icmp_signed("<", pos, U.i64(sp_in[d])))
                v_ok = inside if valid is None else b.and_(valid, inside)
                if kind == "avg" and count_include_pad:
                    in_pad = b.and_(b.icmp_signed(">=", pos, U.i64(-pads[d])), b.icmp_signed("<", pos, U.i64(ends[d])))
                    c_ok = in_pad if counted is None else b.and_(counted, in_pad)
            f_next = b.add(flat, b.mul(pos, U.i64(ind[2][d]))) if ind is not None else None
            taps(d + 1, b.add(offset, b.mul(pos, U.i64(in_st[d]))), v_ok, c_ok, f_next)

    taps(0, U.i64(0), None, None, ind[1] if ind is not None else None)
    acc = b.load(acc_slot)
    if kind == "lp":
        if p == 2:
            acc = U.intrinsic(b, "llvm.sqrt", acc)
        elif p != 1:
            acc = U.intrinsic(b, "llvm.pow", acc, ir.Constant(acc_t, 1.0 / p))
        ct = U.compute_type(dtype)
        if acc.type != ct:
            acc = b.fptrunc(acc, ct)
    if kind == "avg":
        if cnt_slot is None:
            count = ir.Constant(acc_t, float(math.prod(kernel)))
        else:
            c = b.load(cnt_slot)
            # A window entirely in ceil_mode overhang has no cells; numpy gives nan there (0/0).
            count = b.sitofp(c, acc_t)
        acc = b.fdiv(acc, count)
        ct = U.compute_type(dtype)
        if acc.type != ct:
            acc = b.fptrunc(acc, ct)
    out_off = U.i64(0)
    for d in range(nsp):
        out_off = b.add(out_off, b.mul(coords[d], U.i64(out_st[d])))
    U.store(b, ob, out_off, acc, dtype)
    if idx_slot is not None:
        b.store(b.load(idx_slot), b.gep(ind[0], [out_off], inbounds=True))


def emit_unpool(module: ir.Module, name: str, dtype: np.dtype, x_size: int, full_shape: tuple[int, ...],
                out_shape: tuple[int, ...]) -> ir.Function:
    """void name(out, x, i64* indices, tid, nthreads): MaxUnpool. One thread zeroes `out` and scatters
    x[k] to flat position indices[k] of `full_shape` (placed at the start of `out_shape`), in order, so a
    later duplicate wins; an index outside the shape is skipped."""
    params = [("out", U.ptr_type(dtype)), ("x", U.ptr_type(dtype)), ("indices", U.I64.as_pointer()),
              ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, idx, tid, _ = fn.args
    with U.if_then(b, b.icmp_signed("==", tid, U.i32(0)), "first"):
        zero = U.const(dtype, 0)
        with U.for_range(b, 0, math.prod(out_shape), "z") as z:
            U.store(b, out, z, zero, dtype)
        full = math.prod(full_shape)
        f_st, o_st = U.contiguous_strides(full_shape), U.contiguous_strides(out_shape)
        with U.for_range(b, 0, x_size, "k") as k:
            i = b.load(b.gep(idx, [k], inbounds=True), name="i")
            inside = b.and_(b.icmp_signed(">=", i, U.i64(0)), b.icmp_signed("<", i, U.i64(full)))
            with U.if_then(b, inside, "scatter"):
                o = i
                if tuple(full_shape) != tuple(out_shape):
                    o, rest = U.i64(0), i
                    for fs, os_ in zip(f_st, o_st):
                        o = b.add(o, b.mul(b.sdiv(rest, U.i64(fs)), U.i64(os_)))
                        rest = b.srem(rest, U.i64(fs))
                U.store(b, out, o, U.load(b, x, k, dtype), dtype)
    b.ret_void()
    return fn
