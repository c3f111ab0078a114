"""Max and average pooling over N-d windows (ceil_mode, explicit pads, dilations, count_include_pad).

Threads split the N*C planes. Float32 2-D max / average pools without dilation or indices, windows of
1..7 and strides 1 or 2 (`fast_2d`) run in vectors (`emit_pool_2d`): each plane is copied into a
per-thread scratch image whose padding (and ceil_mode overhang, and the columns the last output vector
reads past the row) holds the identity (-inf for max, 0 for average), so every tap of a vector of
output columns is one unchecked load (stride 2: two loads and one even-lane shuffle). Average adds the
taps in window order from 0 as the generic kernel does, then divides by the window's cell count (a
compile-time table: per row times per column), so both give the same bits.

Otherwise, per spatial dim, the output range is cut at compile time into the
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
from glowpy.backends.cpu.kernels.common import KernelInfo
from glowpy.backends.cpu.kernels.depthwise import _phase_lanes
from glowpy.backends.cpu.kernels.elementwise import _fmax
from glowpy.backends.cpu.kernels.gemm import kernel_function
from glowpy.backends.cpu.target import host_target
from glowpy.backends.cpu.vector import I32, I64, PTR, Loop, VecIR

# The largest scratch image (floats per thread) the vector path uses; bigger planes take the generic one.
_MAX_IMAGE = 1 << 22
ALIGN_ROWS = True


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


class _Image:
    """The scratch image of one plane: rows [0, hp) are input rows - pt, columns [0, wp) input columns - pl."""

    def __init__(self, x_shape, out_shape, kernel, strides, pads, vw: int) -> None:
        self.h, self.w = x_shape[2:]
        self.oh, self.ow = out_shape[2:]
        (self.kh, self.kw), (self.sh, self.sw) = kernel, strides
        self.pt, self.pl = pads[0], pads[1]
        self.ncv = math.ceil(self.ow / vw)  # column vectors per output row
        self.hp = (self.oh - 1) * self.sh + self.kh
        # stride s reads s vectors from column s * ow0 + kw for the vector of output columns at ow0
        self.wp = self.sw * self.ncv * vw + self.kw - 1
        self.rows = max(0, min(self.h, self.hp - self.pt))  # input rows some window reads
        self.cols = max(0, min(self.w, self.wp - self.pl))
        # Image column c lives at row offset lead + c, so that input columns (and rows: the row stride is
        # whole vectors) start vector-aligned: the copy's stores do not split cache lines (measured on a
        # Xeon: the 64 x 112 x 112 stride-2 max pool of ResNet and GoogLeNet 0.30 -> 0.27 ms).
        self.lead = (-self.pl) % vw if ALIGN_ROWS else 0
        self.stride = math.ceil((self.lead + self.wp) / vw) * vw if ALIGN_ROWS else self.wp
        self.floats = math.ceil(self.hp * self.stride / vw) * vw


def fast_2d(dtype: np.dtype, x_shape: tuple[int, ...], out_shape: tuple[int, ...], kind: str,
            kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
            index_order: int | None, vw: int) -> bool:
    """Whether emit_pool_2d computes this pool (else emit_pool)."""
    if (np.dtype(dtype) != np.float32 or kind not in ("max", "avg") or index_order is not None
            or len(kernel) != 2 or any(d != 1 for d in dilations) or math.prod(out_shape) == 0):
        return False
    if not all(1 <= k <= 7 for k in kernel) or not all(s in (1, 2) for s in strides):
        return False
    img = _Image(x_shape, out_shape, kernel, strides, (0, 0), vw)
    return img.floats + 2 * sum(kernel) * vw <= _MAX_IMAGE


def _counts(size: int, out: int, k: int, stride: int, pad: int, pad_end: int, include_pad: bool) -> np.ndarray:
    """Per output coordinate, the window's cells inside the input (or inside input + pads)."""
    lo, hi = (-pad, size + pad_end) if include_pad else (0, size)
    start = np.arange(out) * stride - pad
    return (np.minimum(start + k, hi) - np.maximum(start, lo)).clip(0)


# Threads split a pool's output rows (every plane) rather than its planes only on maps this large (output
# pixels), where the rows a band reads are worth keeping on the core that wrote them (below it a band's
# plane setup and halo rows cost more): ResNet-50's 112x112 -> 56x56 max pool after conv1 (whose pixel path
# splits by pixels) took 1.38x less time on 2 threads than on 1, planes split; rows split, 1.9x (Xeon).
ROW_SPLIT_MIN_PIXELS = 48 * 48


def emit_pool_2d(module: ir.Module, name: str, x_shape: tuple[int, ...], out_shape: tuple[int, ...], kind: str,
                 kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int], count_include_pad: bool,
                 vw: int, split_rows: bool = False) -> KernelInfo:
    """void name(out, x, null, scratch, [divisors,] tid, nthreads): a float32 2-D max or average pool
    that fast_2d accepts. Average's packed table: the per-column counts (ncv * vw entries, 1 past the
    row), then the per-row counts; a window's divisor is their product. split_rows (on maps of at least
    ROW_SPLIT_MIN_PIXELS): each thread a band of output rows of every plane, copying only the input rows
    the band reads (for an input written by pixel ranges, e.g. by conv.py's pixel path)."""
    img = _Image(x_shape, out_shape, kernel, strides, pads, vw)
    packed = []
    if kind == "avg":
        cw = np.ones(img.ncv * vw, np.float32)
        cw[:img.ow] = _counts(img.w, img.ow, img.kw, img.sw, pads[1], pads[3], count_include_pad)
        ch = _counts(img.h, img.oh, img.kh, img.sh, pads[0], pads[2], count_include_pad).astype(np.float32)
        packed = [np.concatenate([cw, ch])]
    fn = kernel_function(module, name, len(packed))
    out_p, x_p, _, scratch_p = fn.args[:4]
    tid, nthreads = fn.args[-2:]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vx = VecIR(module, b, vw)
    planes = x_shape[0] * x_shape[1]
    if split_rows and img.oh * img.ow >= ROW_SPLIT_MIN_PIXELS:
        lo, hi = ir.Constant(I64, 0), ir.Constant(I64, planes)
        r_lo, r_hi = U.thread_range(b, img.oh, tid, nthreads, "band")
        band = U.input_band(b, r_lo, r_hi, stride=img.sh, pad=img.pt, reach=img.kh, size=img.rows)
    else:
        lo, hi = U.thread_range(b, planes, tid, nthreads, "planes")
        r_lo, r_hi, band = ir.Constant(I64, 0), ir.Constant(I64, img.oh), None

    raw = b.ptrtoint(scratch_p, I64, name="scratch.addr")
    up = b.add(raw, ir.Constant(I64, 63), name="scratch.up")
    scr = b.inttoptr(b.and_(up, ir.Constant(I64, ~63), name="scratch.al"), PTR, name="scratch")
    ident = vx.fconst(-math.inf if kind == "max" else 0.0)
    fl = Loop(vx, "fill", 0, img.floats // vw)
    vx.store(ident, vx.gep(scr, vx.off((fl.i, vw))))
    fl.close()

    lp = Loop(vx, "plane", lo, hi)
    _copy_rows(vx, img, vx.gep(x_p, vx.off((lp.i, img.h * img.w)), name="x.plane"), scr, band)
    o_plane = vx.gep(out_p, vx.off((lp.i, img.oh * img.ow)), name="o.plane")
    rl = Loop(vx, "orow", r_lo, r_hi)
    row = vx.gep(scr, vx.off((rl.i, img.sh * img.stride), img.lead), name="img.row")
    o_row = vx.gep(o_plane, vx.off((rl.i, img.ow)), name="o.row")
    div_h = vx.load_splat(vx.gep(fn.args[4], vx.off(img.ncv * vw, rl.i)), name="count.h") if packed else None
    full, tail = img.ow // vw, img.ow % vw
    fmax = _vector_maximum(vx) if kind == "max" else None

    def vector(ow0, mask) -> None:
        taps = []
        for kh in range(img.kh):
            for kw in range(img.kw):
                at = vx.gep(row, vx.off(ow0 if img.sw == 1 else (ow0, img.sw), kh * img.stride + kw))
                if img.sw == 1:
                    taps.append(vx.load(at, name="tap"))
                else:
                    pair = [vx.load(at, name="tap.even"), vx.load(vx.gep(at, vw), name="tap.odd")]
                    taps.append(_phase_lanes(vx, pair, 0, 2))
        if kind == "max":
            while len(taps) > 1:  # a tree: maximum is exact in any order
                taps = [fmax(*taps[i:i + 2]) if i + 1 < len(taps) else taps[i] for i in range(0, len(taps), 2)]
            val = taps[0]
        else:
            acc = vx.zero
            for t in taps:  # window order from 0: the generic kernel's sums, bit for bit
                acc = b.fadd(acc, t, name="sum")
            div = b.fmul(div_h, vx.load(vx.gep(fn.args[4], ow0), name="count.w"), name="count")
            val = b.fdiv(acc, div, name="avg")
        vx.store(val, vx.gep(o_row, ow0), mask)

    if full:
        cl = Loop(vx, "ocol", 0, full)
        vector(b.mul(cl.i, ir.Constant(I64, vw), name="ow0"), None)
        cl.close()
    if tail:
        vector(ir.Constant(I64, full * vw), vx.lane_mask(tail))
    rl.close()
    lp.close()
    b.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=img.floats * 4 + 64)


def _vector_maximum(vx: VecIR):
    """(a, b) -> llvm.maximum(a, b) lane by lane: NaN if either is (an input NaN, quieted), -0 < +0.
    With AVX-512DQ: vrangeps (imm 0b0101: max, the sign of the selected operand) orders zeros right but
    returns the number beside a NaN, so lanes with a NaN take a + b instead (that NaN): three
    instructions where LLVM lowers llvm.maximum to six."""
    b, vw = vx.b, vx.vw
    if vw == 16 and host_target().has("avx512dq"):
        rng = vx.intrinsic("llvm.x86.avx512.mask.range.ps.512", vx.vty, [vx.vty, vx.vty, I32, vx.vty, U.I16, I32])

        def vmax(x, y):
            r = b.call(rng, [x, y, ir.Constant(I32, 0b0101), vx.zero, ir.Constant(U.I16, -1), ir.Constant(I32, 4)],
                       name="range")
            return b.select(b.fcmp_unordered("uno", x, y), b.fadd(x, y, name="nan"), r, name="max")
        return vmax
    fn = vx.intrinsic(f"llvm.maximum.v{vw}f32", vx.vty, [vx.vty, vx.vty])
    return lambda x, y: b.call(fn, [x, y], name="max")


def _copy_rows(vx: VecIR, img: _Image, x_plane, scr, band: tuple | None = None) -> None:
    """The input rows (those of `band`, [first, end), else all) and columns some window reads into the
    image's interior; masked stores keep the identity around it."""
    if img.rows == 0 or img.cols == 0:
        return
    vw = vx.vw
    rl = Loop(vx, "copy.row", *(band or (0, img.rows)))
    src = vx.gep(x_plane, vx.off((rl.i, img.w)), name="src.row")
    dst = vx.gep(scr, vx.off((rl.i, img.stride), img.pt * img.stride + img.lead + img.pl), name="dst.row")
    full, tail = img.cols // vw, img.cols % vw
    if full:
        cl = Loop(vx, "copy.col", 0, full)
        c0 = vx.off((cl.i, vw))
        vx.store(vx.load(vx.gep(src, c0), name="src"), vx.gep(dst, c0))
        cl.close()
    if tail:
        mask = vx.lane_mask(tail)
        vx.store(vx.load(vx.gep(src, full * vw), mask, name="src"), vx.gep(dst, full * vw), mask)
    rl.close()


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


def emit_col2im(module: ir.Module, name: str, dtype: np.dtype, planes: int, cols: int, plane_out: int
                ) -> ir.Function:
    """void name(out, x, i32* table, tid, nthreads): Col2Im. Per (n, c) plane (threads split them) the
    output is zeroed, then column entry j adds into position table[j] (-1: padding, skipped)."""
    params = [("out", U.ptr_type(dtype)), ("x", U.ptr_type(dtype)), ("table", U.I32.as_pointer()),
              ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, tab, tid, nt = fn.args
    lo, hi = U.thread_range(b, planes, tid, nt, "planes")
    with U.for_range(b, lo, hi, "plane") as p:
        ob, xb = b.mul(p, U.i64(plane_out)), b.mul(p, U.i64(cols))
        with U.for_range(b, 0, plane_out, "z") as z:
            U.store(b, out, b.add(ob, z), U.const(dtype, 0), dtype)
        with U.for_range(b, 0, cols, "j") as j:
            o = b.sext(b.load(b.gep(tab, [j], inbounds=True)), U.I64)
            with U.if_then(b, b.icmp_signed(">=", o, U.i64(0)), "inside"):
                at = b.add(ob, o)
                v = U.load(b, x, b.add(xb, j), dtype)
                acc = U.load(b, out, at, dtype)
                s = b.fadd(acc, v) if U.is_float(dtype) else b.add(acc, v)
                U.store(b, out, at, U.round_half(b, s, dtype) if U.is_float(dtype) else s, dtype)
    b.ret_void()
    return fn
