"""Depthwise Conv2D kernel (group == C == M, NCHW, float32), any kernel size, stride and dilation; also
the 3x3 convs over a few input channels per group (`use_direct`: a mobile CNN's stem).

Per channel plane (for a stem: per group of input planes, shared by the group's output planes), the
input is first copied into a per-thread scratch image with its zero padding and, for a horizontal
stride s > 1, its columns split into s phase planes (column c of the padded row
goes to phase c % s at c // s; stride 2 deinterleaves with one shuffle per vector pair). Every tap of
every output vector is then one contiguous unmasked load: no gathers, no per-tap masks. The plane is
computed in blocks of R output rows x NV vectors of output columns; each input row vector is loaded
once per block and feeds every output row of the block it touches (register reuse across kh), with
R x NV independent fma chains. The fused epilogue (bias, residual, activation) runs on the
accumulators; only the last column vector of a row is stored with a mask.

Maps narrower than half a vector (7x7 at 16 lanes) are computed flat instead: vectors over the padded
plane's flat index (the lanes at row ends are computed and dropped), the rows then copied out.

The padding of the scratch is zeroed once per call; plane copies overwrite only the interior (their
masked-off lanes store zeros into the right padding). Contract as in conv.py: threads split the
output planes in contiguous ranges; `out` may be the residual buffer (each output element is read as
residual just before it is written, by the same thread).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.vector import I32, I64, PTR, Loop, VecIR, block_loop, imin

from .common import KernelInfo
from .gemm import kernel_function

if TYPE_CHECKING:
    from .conv import _Geometry

# Accumulator vectors per block (R x NV): 32 registers on AVX-512 leave room for loads and weights,
# 16 on AVX2.
_ACC_BUDGET = {16: 8, 8: 6, 4: 6}
ALIGN_ROWS = True


def use_direct(geo: _Geometry, vw: int) -> bool:
    """Depthwise convs, and 3x3 convs from at most 4 to at most 32 channels per group on maps at least a
    vector wide (a mobile CNN's stem). Each output plane rereads the group's scratch images, so more
    output channels favour the GEMM (measured on Zen 5: 3 -> 16 / 32 on 224x224 stride 2 1.3-1.8x faster
    in the network, 3 -> 64 2.6x slower)."""
    if geo.Cg == 1 and geo.Mg == 1:
        return True
    return geo.Cg <= 4 and geo.Mg <= 32 and geo.KH == geo.KW == 3 and geo.OW >= vw


def pack_depthwise(geo: _Geometry, w, bias, vw) -> list[np.ndarray]:
    """Weights as [output channel][input channel of its group][kh][kw] and the bias (what emit_depthwise
    reads)."""
    return [np.ascontiguousarray(w.reshape(geo.M, geo.Cg * geo.KHKW), dtype=np.float32).ravel(),
            np.ascontiguousarray(bias, dtype=np.float32)]


class _Plan:
    """The scratch image's geometry and the register blocking of one depthwise conv."""

    def __init__(self, geo: _Geometry, vw: int, has_residual: bool) -> None:
        self.s = s = geo.sw
        self.hp = geo.pt + geo.H + geo.pb
        wp = geo.pl + geo.W + geo.pr
        self.chunk = s * vw  # input columns per copy step
        self.nchunks = math.ceil(geo.W / self.chunk)
        self.ncv = math.ceil(geo.OW / vw)  # column vectors per output row
        # A phase row holds every stored column (the copy writes whole vectors) and every loaded one.
        self.wq = max(math.ceil(wp / s), (geo.pl + s - 1) // s + self.nchunks * vw,
                      self.ncv * vw + (geo.KW - 1) * geo.dw // s)
        # Each phase's columns start `lead` floats into its row so that the copy's stores and rows are
        # vector-aligned (unaligned, every 64-byte store splits two cache lines: measured on a Xeon, the
        # copy took 2/3 of MobileNet-v2's 96 x 112 x 112 stride-2 depthwise conv).
        self.lead = [0] * s
        if ALIGN_ROWS:
            for r in range(s):
                self.lead[(geo.pl + r) % s] = -((geo.pl + r) // s) % vw
            self.wq = math.ceil((self.wq + max(self.lead)) / vw) * vw
        self.phase = self.hp * self.wq
        self.floats = math.ceil(s * self.phase / vw) * vw
        self.nv = 2 if self.ncv >= 2 else 1
        self.rows = max(1, min(geo.OH, _ACC_BUDGET[vw] // self.nv))
        # Maps narrower than half a vector (7x7 at 16 lanes) run flat: vectors over the padded plane's
        # flat index, row ends included (their lanes are computed and dropped), then rows copied out.
        self.flat = False
        if s == 1 and geo.sh == 1 and not has_residual and 2 * geo.OW <= vw:
            self.nq = math.ceil(geo.OH * wp / vw)
            if self.nq <= _ACC_BUDGET[vw]:
                self.flat, self.wq, self.lead = True, wp, [0] * s
                self.phase = self.hp * wp
                reach = self.nq * vw + (geo.KH - 1) * geo.dh * wp + (geo.KW - 1) * geo.dw
                spill = (geo.pt + geo.H - 1) * wp + geo.pl + self.nchunks * vw
                self.out_at = math.ceil(max(reach, spill, self.phase) / vw) * vw
                self.floats = self.out_at + self.nq * vw


class _Plane(NamedTuple):
    """What the compute of one channel plane reads: the scratch image, the weight splats, where to write."""

    vx: VecIR
    geo: _Geometry
    plan: _Plan
    scr: ir.Value
    weights: list
    bias_v: ir.Value
    out_p: ir.Value
    res_p: ir.Value | None
    o_plane: ir.Value
    activation: str
    params: tuple


# Threads split a depthwise conv's rows only on maps this large (output pixels): a band of every plane
# costs its own plane setup and halo rows, which on small planes outweigh the data kept on its core
# (MobileNet-v2, 2 threads, Xeon: 56x56 1.73x -> 2.16x faster than 1 thread; 28x28 1.6x -> 0.8x).
ROW_SPLIT_MIN_PIXELS = 48 * 48


def splits_rows(geo: _Geometry, vw: int, has_residual: bool) -> bool:
    """Whether threads can split this conv's output rows (every plane) rather than its planes."""
    return geo.P >= ROW_SPLIT_MIN_PIXELS and not _Plan(geo, vw, has_residual).flat


def emit_depthwise(module: ir.Module, name: str, geo: _Geometry, w, bias, activation: str, params,
                   has_residual: bool, vw: int, split_rows: bool = False) -> KernelInfo:
    """out[c] = act(depthwise_conv(x[c], w[c]) + bias[c] [+ residual[c]]) for every (image, channel).
    split_rows (where splits_rows holds): each thread computes a band of row blocks of every plane and
    copies only the input rows its band reads, so a band's data stays on the core that wrote it when the
    producer split the map by pixels (the pixel path of conv.py)."""
    plan = _Plan(geo, vw, has_residual)
    split_rows = split_rows and splits_rows(geo, vw, has_residual)
    if split_rows:
        # row blocks of balanced height (14 rows: 7 + 7, not 8 + 6), so that bands are balanced too
        plan.rows = math.ceil(geo.OH / math.ceil(geo.OH / plan.rows))
    packed = pack_depthwise(geo, w, bias, vw)
    fn = kernel_function(module, name, len(packed))
    out_p, x_p, res_p, scratch_p, w_p, bias_p = fn.args[:6]
    tid, nthreads = fn.args[-2:]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vx = VecIR(module, b, vw)
    rblocks = math.ceil(geo.OH / plan.rows)
    if split_rows:
        lo, hi = ir.Constant(I64, 0), ir.Constant(I64, geo.N * geo.M)
        rb_lo, rb_hi = U.thread_range(b, rblocks, tid, nthreads, "band")
    else:
        lo, hi = U.thread_range(b, geo.N * geo.M, tid, nthreads, "unit")  # units: output planes
        rb_lo, rb_hi = ir.Constant(I64, 0), ir.Constant(I64, rblocks)
    rows = _copy_rows(b, geo, plan, rb_lo, rb_hi) if split_rows else None
    cg, mg = geo.Cg, geo.Mg

    raw = b.ptrtoint(scratch_p, I64, name="scratch.addr")
    up = b.add(raw, ir.Constant(I64, 63), name="scratch.up")
    scr = b.inttoptr(b.and_(up, ir.Constant(I64, ~63), name="scratch.al"), PTR, name="scratch")
    zl = Loop(vx, "zero", 0, cg * plan.floats // vw)
    vx.store(vx.zero, vx.gep(scr, vx.off((zl.i, vw))))
    zl.close()

    lp = Loop(vx, "plane", lo, hi)
    plane_i = lp.i
    m = b.urem(plane_i, ir.Constant(I64, geo.M), name="m")
    # The group's cg input planes: the output planes of a group share them (copied at its first one).
    first_in = b.add(b.mul(b.udiv(plane_i, ir.Constant(I64, geo.M)), ir.Constant(I64, geo.C)),
                     b.mul(b.udiv(m, ir.Constant(I64, mg)), ir.Constant(I64, cg)), name="first.in")

    def copy_group() -> None:
        for ci in range(cg):
            x_plane = vx.gep(x_p, vx.off((b.add(first_in, ir.Constant(I64, ci)), geo.HW)), name="x.plane")
            _copy_plane(vx, geo, plan, x_plane, vx.gep(scr, ci * plan.floats), rows)

    if mg == 1:
        copy_group()
    else:
        new_group = b.or_(b.icmp_signed("==", plane_i, lo), b.icmp_signed("==", b.urem(m, ir.Constant(I64, mg)),
                                                                           ir.Constant(I64, 0)), name="new.group")
        with U.if_then(b, new_group, "copy"):
            copy_group()
    wrow = vx.gep(w_p, vx.off((m, cg * geo.KHKW)), name="wrow")
    weights = [[[vx.load_splat(vx.gep(wrow, (ci * geo.KH + kh) * geo.KW + kw), name=f"w{ci}_{kh}_{kw}")
                 for kw in range(geo.KW)] for kh in range(geo.KH)] for ci in range(cg)]
    bias_v = vx.load_splat(vx.gep(bias_p, m), name="bias")
    o_plane = vx.off((plane_i, geo.P))
    ctx = _Plane(vx, geo, plan, scr, weights, bias_v, out_p, res_p if has_residual else None, o_plane,
                 activation, tuple(params))
    if plan.flat:
        _flat(ctx)
    else:
        _row_blocks(ctx, rb_lo, rb_hi)
    lp.close()
    b.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=cg * plan.floats * 4 + 64)


def _copy_rows(b: ir.IRBuilder, geo: _Geometry, plan: _Plan, rb_lo, rb_hi) -> tuple:
    """[first, end) of the input rows that output row blocks [rb_lo, rb_hi) read."""
    oh0 = b.mul(rb_lo, ir.Constant(I64, plan.rows), name="band.oh0")
    oh1 = imin(b, b.mul(rb_hi, ir.Constant(I64, plan.rows)), ir.Constant(I64, geo.OH), name="band.oh1")
    return U.input_band(b, oh0, oh1, stride=geo.sh, pad=geo.pt, reach=(geo.KH - 1) * geo.dh + 1, size=geo.H)


def _copy_plane(vx: VecIR, geo: _Geometry, plan: _Plan, x_plane, scr, rows: tuple | None = None) -> None:
    """The interior of the scratch image (all phases) from one input plane: input rows [first, end) of
    `rows`, else all."""
    vw, s = vx.vw, plan.s
    rl = Loop(vx, "copy.row", *(rows or (0, geo.H)))
    src_row = vx.gep(x_plane, vx.off((rl.i, geo.W)), name="src.row")
    dst_row = vx.gep(scr, vx.off((rl.i, plan.wq), geo.pt * plan.wq), name="dst.row")
    full = geo.W // plan.chunk

    def chunk(k, lanes_left: int | None) -> None:
        x0 = vx.off((k, plan.chunk))
        vecs = []
        for t in range(s):
            n = None if lanes_left is None else max(0, min(vw, lanes_left - t * vw))
            if n == 0:
                vecs.append(vx.zero)
                continue
            mask = None if n is None or n == vw else vx.lane_mask(n)
            vecs.append(vx.load(vx.gep(src_row, vx.off(x0, t * vw)), mask, name="src"))
        for r in range(s):  # input columns x0 + s*k + r -> phase (pl + r) % s, column (pl + r) // s + x0 / s
            val = vecs[0] if s == 1 else _phase_lanes(vx, vecs, r, s)
            q, j = (geo.pl + r) % s, (geo.pl + r) // s
            dst = vx.gep(dst_row, vx.off((k, vw), q * plan.phase + j + plan.lead[q]), name="dst")
            vx.store(val, dst)

    if full:
        cl = Loop(vx, "copy.chunk", 0, full)
        chunk(cl.i, None)
        cl.close()
    if geo.W % plan.chunk:
        chunk(full, geo.W % plan.chunk)
    rl.close()


def _phase_lanes(vx: VecIR, vecs: list, r: int, s: int):
    """Lanes r, r + s, r + 2s, ... of the concatenation of `vecs` (s vectors)."""
    b, vw = vx.b, vx.vw
    picks = [r + s * k for k in range(vw)]
    if s == 2:
        return b.shuffle_vector(vecs[0], vecs[1], ir.Constant(vx.ity, picks), name=f"phase{r}")
    out = ir.Constant(vx.vty, ir.Undefined)
    for k, p in enumerate(picks):
        e = b.extract_element(vecs[p // vw], ir.Constant(I32, p % vw))
        out = b.insert_element(out, e, ir.Constant(I32, k))
    return out


def _row_blocks(ctx: _Plane, rb_lo, rb_hi) -> None:
    """Output row blocks [rb_lo, rb_hi) of the plane (the last block of the map may be shorter)."""
    vx, geo, plan = ctx.vx, ctx.geo, ctx.plan
    b = vx.b
    full, edge = geo.OH // plan.rows, geo.OH % plan.rows

    def block(rb, is_edge: bool) -> None:
        _col_blocks(ctx, b.mul(rb, ir.Constant(I64, plan.rows), name="oh0"), edge if is_edge else plan.rows)

    block_loop(vx, lo=rb_lo, hi=rb_hi, blocks=full + (1 if edge else 0), full=full, body=block)


def _col_blocks(ctx: _Plane, oh0, rows: int) -> None:
    vx, geo, plan = ctx.vx, ctx.geo, ctx.plan
    b, vw = vx.b, vx.vw
    full_vecs = geo.OW // vw
    tail = geo.OW % vw
    steps = full_vecs // plan.nv
    if steps:
        cl = Loop(vx, "colblock", 0, steps)
        _block(ctx, oh0, b.mul(cl.i, ir.Constant(I64, plan.nv * vw), name="ow0"), rows, plan.nv, 0)
        cl.close()
    left = full_vecs - steps * plan.nv + (1 if tail else 0)
    if left:
        _block(ctx, oh0, ir.Constant(I64, steps * plan.nv * vw), rows, left, tail)


def _block(ctx: _Plane, oh0, ow0, rows: int, nvec: int, tail: int) -> None:
    """Output rows [oh0, oh0 + rows) x nvec column vectors from ow0 (the last one has `tail` lanes if
    nonzero)."""
    vx, geo, plan, scr, weights, bias_v, out_p, res_p, o_plane, activation, params = ctx
    b, vw, s = vx.b, vx.vw, plan.s
    acc = [[vx.zero] * nvec for _ in range(rows)]
    row0 = vx.gep(scr, vx.off((b.mul(oh0, ir.Constant(I64, geo.sh)), plan.wq), ow0), name="blk")
    by_row: dict[int, list[tuple[int, int]]] = {}  # input row offset -> (output row, kh) it feeds
    for r in range(rows):
        for kh in range(geo.KH):
            by_row.setdefault(r * geo.sh + kh * geo.dh, []).append((r, kh))
    for ci in range(geo.Cg):
        for d in sorted(by_row):
            for kw in range(geo.KW):
                q, jo = (kw * geo.dw) % s, (kw * geo.dw) // s
                for v in range(nvec):
                    at = ci * plan.floats + d * plan.wq + q * plan.phase + plan.lead[q] + jo + v * vw
                    x = vx.load(vx.gep(row0, at), name=f"x{d}_{kw}")
                    for r, kh in by_row[d]:
                        acc[r][v] = vx.fma(weights[ci][kh][kw], x, acc[r][v])
    mask = vx.lane_mask(tail) if tail else None
    for r in range(rows):
        orow = vx.off(o_plane, (b.add(oh0, ir.Constant(I64, r)), geo.OW), ow0)
        for v in range(nvec):
            m = mask if v == nvec - 1 else None
            val = vx.fadd(acc[r][v], bias_v)
            dst = vx.off(orow, v * vw)
            if res_p is not None:
                val = vx.fadd(val, vx.load(vx.gep(res_p, dst), m, name="res"))
            vx.store(vx.activation(val, activation, params), vx.gep(out_p, dst), m)


def _flat(ctx: _Plane) -> None:
    """The whole (small) plane as nq vectors over the padded plane's flat index, then each output row
    copied out of the scratch (no residual on this path)."""
    vx, geo, plan, scr, weights, bias_v, out_p, _res, o_plane, activation, params = ctx
    vw = vx.vw
    acc = [vx.zero] * plan.nq
    for ci in range(geo.Cg):
        for kh in range(geo.KH):
            for kw in range(geo.KW):
                off = ci * plan.floats + kh * geo.dh * plan.wq + kw * geo.dw
                for v in range(plan.nq):
                    x = vx.load(vx.gep(scr, off + v * vw), name=f"x{kh}_{kw}")
                    acc[v] = vx.fma(weights[ci][kh][kw], x, acc[v])
    oscr = vx.gep(scr, plan.out_at, name="flat.out")
    for v in range(plan.nq):
        vx.store(vx.activation(vx.fadd(acc[v], bias_v), activation, params), vx.gep(oscr, v * vw))
    mask = vx.lane_mask(geo.OW)
    for oh in range(geo.OH):
        row = vx.load(vx.gep(oscr, oh * plan.wq), mask, name="row")
        vx.store(row, vx.gep(out_p, vx.off(o_plane, oh * geo.OW)), mask)
