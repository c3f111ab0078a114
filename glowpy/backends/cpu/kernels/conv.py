"""Conv2D kernel generator (NCHW, float32), built on gemm.py's register-blocked micro-kernel.

Per group, a conv is the GEMM out[m, p] = sum_k Wp[m, k] * B[k, p] over output pixels p (flat OH*OW index)
and k = (c, kh, kw). The weights are packed at compile time as [group][m-block][k][MR] and broadcast;
B is read as vectors along p:
- 1x1, stride 1, no padding: B is the input itself; a panel's rows (a plane apart) are copied into scratch,
  or, where the input is panel-major (PANEL LAYOUT below: the producer, a pixel-path conv, wrote each panel's
  channel rows one after another), read in place.
- stride 1 with OW == W ("same" width): input pixel = output pixel + a constant shift per (kh, kw), so
  one panel of B (K x NR pixels) is packed with masked contiguous loads (the mask zeroes padding).
- anything else (strides, other paddings): per image and reduction chunk the input is first rearranged
  into phase planes (`_PhasePlanes`: per channel, kernel column and row phase, rows of OW floats with
  the padding as zeros), in which every tap of a panel is again one contiguous load at a constant offset.
A panel is packed once per thread into its scratch and reused by every row block of output channels. A
panel-major input (other than a 1x1 conv's) is packed by gathers.
Small maps (up to 17x17) would waste vector lanes over pixels or stream their large weights once per pixel
panel, so there the tile is transposed: a few pixels broadcast x vectors of output channels, every weight
read once; a panel's finished tiles go back to NCHW rows through VW x VW register transposes.
Depthwise convs (group == C == M) have their own direct kernel (depthwise.py).

Contract for callers: the work (pixel panels x row blocks, or channel planes) is split in contiguous,
balanced ranges by (tid, nthreads), any nthreads >= 1; a thread writes only its outputs and its scratch.
No alignment is assumed for any pointer. `out` must not overlap `x`; it may be the residual buffer itself
(every output element is read as residual before it is first written, by the same thread).

One file for the three GEMM-like paths (GEMM over panels, channel vectors, Winograd): they share the
geometry, the panel packing and the fused epilogue, and `pack_conv2d` must mirror each emitter exactly.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import activations, hugepages
from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.vector import (
    I32,
    I64,
    PTR,
    Loop,
    VecIR,
    block_loop,
    choose,
    chunk_loop,
    imin,
    panel_walk,
    when,
)
from glowpy.errors import InternalError, MismatchingShape, UnsupportedShape
from glowpy.ir.ops.nn import conv_out_dim

from .common import KernelInfo
from .depthwise import _phase_lanes, emit_depthwise, pack_depthwise, use_direct
from .depthwise import splits_rows as depthwise_splits_rows
from .gemm import choose_tile, emit_tile, full_or_edge_panel, kernel_function

# Reduction chunking: a panel's chunk of the vector operand (kc x NR floats) and the chunk of
# weights (rows x kc) should stay cache-resident while the tiles pass over them. Measured on Zen 4
# (1 MiB L2): L1-sized chunks (24 KB) were ~4% slower than none, L2 streams well; these budgets only
# split very large reductions, which bounds the scratch and keeps the weights of a chunk in L2/L3.
L1_PANEL_BYTES = 128 * 1024
L2_WEIGHT_BYTES = 4 * 1024 * 1024
# A chunk's phase planes (strided convs): a band of output rows at a time, read back by its panels
# while still in L2.
PHASE_PLANE_BYTES = 512 * 1024


def chunk_channels(cg: int, khkw: int, nr: int, m_padded: int, plane_floats: int = 0) -> int:
    """Channels per reduction chunk within the budgets (plane_floats: phase-plane floats per channel),
    balanced (chunks differ by at most one channel)."""
    kc = min(L1_PANEL_BYTES // (nr * 4), L2_WEIGHT_BYTES // (m_padded * 4))
    cc = max(1, min(cg, kc // khkw))
    if plane_floats:
        cc = max(1, min(cc, PHASE_PLANE_BYTES // (plane_floats * 4)))
    return math.ceil(cg / math.ceil(cg / cc))


class _Geometry:
    """Shapes of one conv, and the per-panel lane vectors (output row / column of every lane)."""

    def __init__(self, x_shape, w_shape, strides, pads, dilations, group) -> None:
        self.N, self.C, self.H, self.W = (int(d) for d in x_shape)
        self.M, self.Cg, self.KH, self.KW = (int(d) for d in w_shape)
        self.sh, self.sw = (int(s) for s in strides)
        self.pt, self.pl, self.pb, self.pr = (int(p) for p in pads)
        self.dh, self.dw = (int(d) for d in dilations)
        self.group = int(group)
        self.OH = conv_out_dim(self.H, self.KH, self.sh, self.pt + self.pb, self.dh)
        self.OW = conv_out_dim(self.W, self.KW, self.sw, self.pl + self.pr, self.dw)
        self.P = self.OH * self.OW
        self.HW = self.H * self.W
        self.KHKW = self.KH * self.KW
        self.Mg = self.M // self.group

    @property
    def direct(self) -> bool:
        return (self.KH == self.KW == 1 and self.sh == self.sw == 1 and not any((self.pt, self.pl, self.pb, self.pr))
                and self.P == self.HW)

    @property
    def shift(self) -> bool:
        return self.sh == self.sw == 1 and self.OW == self.W

    def taps(self):
        """(kh, kw, dy, dx): input offset of every kernel tap relative to the output pixel's origin."""
        for kh in range(self.KH):
            for kw in range(self.KW):
                yield kh, kw, kh * self.dh - self.pt, kw * self.dw - self.pl


class _Panel:
    """Lane vectors of a panel of output pixels p0 + v*VW + lane: validity, output row and column."""

    def __init__(self, vx: VecIR, geo: _Geometry, p0, nvec: int, last_lanes: int) -> None:
        b = vx.b
        self.vx, self.geo, self.nvec = vx, geo, nvec
        base = vx.splat(b.trunc(p0, I32), name="p0v")
        self.p = [b.add(base, b.add(vx.iota, vx.iconst(v * vx.vw), name="lanes"), name=f"pix{v}")
                  for v in range(nvec)]
        self.lane_masks = [None] * nvec
        if last_lanes:
            self.lane_masks[-1] = vx.lane_mask(last_lanes)
        self.oh = [b.udiv(p, vx.iconst(geo.OW), name=f"oh{v}") for v, p in enumerate(self.p)]
        self.ow = [b.urem(p, vx.iconst(geo.OW), name=f"ow{v}") for v, p in enumerate(self.p)]

    def valid(self, v: int, iy, ix):
        """Lanes whose input (iy, ix) is inside the image and whose pixel is inside the output."""
        vx, b, geo = self.vx, self.vx.b, self.geo
        ok = b.and_(b.icmp_unsigned("<", iy, vx.iconst(geo.H)), b.icmp_unsigned("<", ix, vx.iconst(geo.W)),
                    name="inimg")
        if self.lane_masks[v] is not None:
            ok = b.and_(ok, self.lane_masks[v], name="inpanel")
        return ok

    def tap_sources(self):
        """Per tap and vector: how to load the input values of that tap for the panel's pixels.

        Returns [(kh, kw, [(offset_or_idx, mask)] * nvec)]: in shift mode an int element offset
        from the panel start (contiguous masked load); otherwise an index vector for a gather."""
        vx, b, geo = self.vx, self.vx.b, self.geo
        out = []
        for kh, kw, dy, dx in geo.taps():
            per_v = []
            for v in range(self.nvec):
                if geo.shift:
                    iy = b.add(self.oh[v], vx.iconst(dy), name="iy")
                    ix = b.add(self.ow[v], vx.iconst(dx), name="ix")
                    per_v.append((dy * geo.W + dx + v * vx.vw, self.valid(v, iy, ix)))
                else:
                    iy = b.add(b.mul(self.oh[v], vx.iconst(geo.sh)), vx.iconst(dy), name="iy")
                    ix = b.add(b.mul(self.ow[v], vx.iconst(geo.sw)), vx.iconst(dx), name="ix")
                    idx = b.add(b.mul(iy, vx.iconst(geo.W)), ix, name="idx")
                    per_v.append((idx, self.valid(v, iy, ix)))
            out.append((kh, kw, per_v))
        return out


def _pack(vx: VecIR, geo: _Geometry, pan: _Panel, buf, x_img, c0, ncc: int, p0, nr: int, x_width: int = 0) -> None:
    """Rows [c0*KHKW, (c0+ncc)*KHKW) of the panel's im2col matrix into buf ([k][NR] floats). x_width: x is
    panel-major in panels of that many pixels (gathers only)."""
    b = vx.b
    sources = pan.tap_sources()  # masks and offsets are per panel: computed once, outside the channel loop
    if x_width:
        sources = [(kh, kw, [_panel_source(vx, geo, idx, x_width) + (mask,) for idx, mask in per_v])
                   for kh, kw, per_v in sources]
    lp = Loop(vx, "pack.c", 0, ncc)
    c = b.add(c0, lp.i, name="pack.ch")
    plane = vx.gep(x_img, vx.off((c, geo.HW)), name="plane")
    cv = vx.splat(b.trunc(c, I32), name="pack.chv") if x_width else None
    row0 = vx.gep(buf, vx.off((lp.i, geo.KHKW * nr)), name="brow")
    for kh, kw, per_v in sources:
        for v, src in enumerate(per_v):
            if x_width:  # element (c, q) of a panel-major x: the pixel's panel offset + c * its panel's width
                base, width, mask = src
                val = vx.gather(x_img, b.add(base, b.mul(cv, width), name="pidx"), mask, name=f"t{kh}_{kw}")
            else:
                val = _load_tap(vx, plane, p0, src[0], src[1], name=f"t{kh}_{kw}")
            vx.store(val, vx.gep(row0, (kh * geo.KW + kw) * nr + v * vx.vw))
    lp.close()


def _panel_source(vx: VecIR, geo: _Geometry, idx, width: int) -> tuple:
    """(offset of channel 0, row width) per lane of input pixels idx (i32 vector) in a panel-major image
    (PANEL LAYOUT) of panels of `width` pixels: masked-off lanes may hold any index, their values unused."""
    b = vx.b
    if isinstance(idx, int):
        raise InternalError("a shifted load from a panel-major input", op="Conv", expected="gathers", found=idx)
    panel = b.udiv(idx, vx.iconst(width), name="ppanel")
    base = b.add(b.mul(panel, vx.iconst(geo.C * width)), b.urem(idx, vx.iconst(width)), name="pbase")
    edge = geo.HW % width
    if not edge:
        return base, vx.iconst(width)
    last = b.icmp_unsigned("==", panel, vx.iconst(geo.HW // width), name="plast")
    return base, b.select(last, vx.iconst(edge), vx.iconst(width), name="pwidth")


def _load_tap(vx: VecIR, plane, p0, src, mask, name: str):
    """Input values of one tap for one vector of the panel; plane = this channel's first float."""
    where, m = src, mask
    if isinstance(where, int):
        return vx.load(vx.gep(vx.gep(plane, p0), where), m, name=name)
    return vx.gather(plane, where, m, name=name)


class _PhasePlanes:
    """The input of a strided or width-changing conv rearranged so that each tap of a panel is contiguous,
    for a band of `band` output rows starting at row b0.

    Per input channel, kernel column kw and row phase py (input rows r * sh + py): rows of OW floats,
    row r holding x[r * sh + py, ow * sw + kw * dw - pl] (zero where that is padding), for the rows the
    band's output rows read: band + (qmax - qmin) per phase, for the taps' row quotients
    q = (kh * dh - pt) // sh of that phase. Output pixel p = oh * OW + ow (b0 <= oh < b0 + band) of tap
    (kh, kw) then sits at `tap(kh, kw)` + p - b0 * OW of its channel."""

    def __init__(self, geo: _Geometry, band: int) -> None:
        self.geo, self.band = geo, band
        quot: dict[int, list[int]] = {}
        for kh in range(geo.KH):
            py, q = (kh * geo.dh - geo.pt) % geo.sh, (kh * geo.dh - geo.pt) // geo.sh
            quot.setdefault(py, []).append(q)
        self.segments = []  # (py, qmin, rows, float offset within a kernel column)
        at = 0
        for py in sorted(quot):
            qmin, rows = min(quot[py]), band + max(quot[py]) - min(quot[py])
            self.segments.append((py, qmin, rows, at))
            at += rows * geo.OW
        self._seg = {py: (qmin, at_) for py, qmin, _, at_ in self.segments}
        self.column = at  # floats per kernel column of one channel
        self.channel = geo.KW * at

    @classmethod
    def for_panels(cls, geo: _Geometry, nr: int, m_padded: int) -> tuple[_PhasePlanes, int]:
        """(planes, channels per chunk): the tallest band whose chunk fits PHASE_PLANE_BYTES, at least the
        rows one panel of nr pixels touches; fewer channels per chunk where even that does not fit."""
        span = min(geo.OH, (nr - 1) // geo.OW + 2)
        least = cls(geo, span)
        cc = chunk_channels(geo.Cg, geo.KHKW, nr, m_padded, least.channel)
        per_row = geo.KW * len(least.segments) * geo.OW  # floats per channel and band row
        band = (PHASE_PLANE_BYTES // (4 * cc) - (least.channel - span * per_row)) // per_row
        return cls(geo, max(span, min(geo.OH, band))), cc

    def tap(self, kh: int, kw: int) -> int:
        geo = self.geo
        dy = kh * geo.dh - geo.pt
        qmin, at = self._seg[dy % geo.sh]
        return kw * self.column + at + (dy // geo.sh - qmin) * geo.OW


def _build_phase_planes(vx: VecIR, geo: _Geometry, ph: _PhasePlanes, planes, x_img, c0, ncc, b0) -> None:
    """Channels [c0, c0 + ncc) of one image (group) into `planes`, for the band from output row b0. A
    row's kernel column is OW strided input values: per output vector, sw contiguous vectors masked to
    the image row, deinterleaved. The loops stay loops (runtime masks): unrolled over kernel columns,
    LLVM's O3 took seconds on them."""
    b, vw = vx.b, vx.vw
    lp = Loop(vx, "phase.c", 0, ncc)
    src_c = vx.gep(x_img, vx.off((b.add(c0, lp.i), geo.HW)), name="phase.src")
    kl = Loop(vx, "phase.kw", 0, geo.KW)
    dst_kw = vx.gep(planes, vx.off((lp.i, ph.channel), (kl.i, ph.column)), name="phase.dst")
    dx = vx.off((kl.i, geo.dw), -geo.pl)  # input column of output column 0
    for py, qmin, rows, at in ph.segments:
        rl = Loop(vx, "phase.row", 0, rows)
        iy = vx.off((b.add(b0, rl.i), geo.sh), qmin * geo.sh + py)  # may be negative: padding
        dst_row = vx.gep(dst_kw, vx.off((rl.i, geo.OW), at), name="phase.drow")
        with b.if_else(b.icmp_unsigned("<", iy, ir.Constant(I64, geo.H), name="phase.inimg")) as (inside, pad):
            with inside:
                src_row = vx.gep(src_c, vx.off((iy, geo.W)), name="phase.srow")
                jl = Loop(vx, "phase.col", 0, geo.OW // vw)
                _strided_columns(vx, geo, src_row, dst_row, dx, jl.i, 0)
                jl.close()
                if geo.OW % vw:  # a masked store only for the row's last vector (slow on AVX2 hosts)
                    _strided_columns(vx, geo, src_row, dst_row, dx, ir.Constant(I64, geo.OW // vw), geo.OW % vw)
            with pad:
                _zero_floats(vx, dst_row, geo.OW)
        rl.close()
    kl.close()
    lp.close()


def _strided_columns(vx: VecIR, geo: _Geometry, src_row, dst_row, dx, j, tail: int) -> None:
    """dst_row[ow] = src_row[ow * sw + dx] (0 outside the row) for ow in [j * vw, j * vw + (tail or vw))."""
    b, vw, s = vx.b, vx.vw, geo.sw
    x0 = b.add(dx, vx.off((j, vw * s)), name="phase.x0")  # first source vector's lane 0
    vecs = []
    for t in range(s):
        xt = vx.off(x0, t * vw)
        cols = b.add(vx.splat(b.trunc(xt, I32)), vx.iota, name="phase.cols")
        inrow = b.icmp_unsigned("<", cols, vx.iconst(geo.W), name="phase.inrow")
        vecs.append(vx.load(vx.gep(src_row, xt), inrow, name="phase.in"))
    val = vecs[0] if s == 1 else _phase_lanes(vx, vecs, 0, s)
    vx.store(val, vx.gep(dst_row, vx.off((j, vw))), vx.lane_mask(tail) if tail else None)


def _zero_floats(vx: VecIR, ptr, n: int) -> None:
    if n:
        fn = U.declare(vx.m, "llvm.memset.p0.i64", U.VOID, [PTR, U.I8, I64, U.I1])
        vx.b.call(fn, [ptr, ir.Constant(U.I8, 0), ir.Constant(I64, 4 * n), ir.Constant(U.I1, 0)])


def _pack_phases(vx: VecIR, geo: _Geometry, ph: _PhasePlanes, buf, planes, ncc, p0, b0, nr: int, nvec: int,
                 last_lanes: int) -> None:
    """The panel's im2col rows of a chunk (ncc channels) from the phase planes of the band from output
    row b0 (holding the panel's rows): contiguous loads."""
    lp = Loop(vx, "pack.c", 0, ncc)
    plane = vx.gep(planes, vx.off((lp.i, ph.channel), (b0, -geo.OW)), name="pplane")
    row0 = vx.gep(buf, vx.off((lp.i, geo.KHKW * nr)), name="brow")
    masks = [None] * (nvec - 1) + [vx.lane_mask(last_lanes) if last_lanes else None]
    for kh, kw, _, _ in geo.taps():
        for v in range(nvec):
            val = _load_tap(vx, plane, p0, ph.tap(kh, kw) + v * vx.vw, masks[v], name=f"t{kh}_{kw}")
            vx.store(val, vx.gep(row0, (kh * geo.KW + kw) * nr + v * vx.vw))
    lp.close()


def _prepare(x_shape, w, bias, strides, pads, dilations, group) -> tuple[_Geometry, np.ndarray, np.ndarray]:
    w = np.asarray(w, np.float32)
    if w.ndim != 4 or len(x_shape) != 4:
        raise UnsupportedShape("conv2d needs NCHW input and MCKK weight", op="Conv", expected="rank 4",
                               found=(len(x_shape), w.ndim))
    geo = _Geometry(x_shape, w.shape, strides, pads, dilations, group)
    if geo.C != geo.Cg * geo.group or geo.M % geo.group:
        raise MismatchingShape("channels do not match weight and group", op="Conv",
                               expected=f"C = {geo.Cg} * {geo.group}, M divisible by group",
                               found=(geo.C, geo.M))
    if geo.OH < 1 or geo.OW < 1:
        raise UnsupportedShape("kernel larger than padded input", op="Conv", expected="positive output dims",
                               found=(geo.OH, geo.OW))
    bias = np.zeros(geo.M, np.float32) if bias is None else np.asarray(bias, np.float32).reshape(-1)
    if bias.size != geo.M:
        raise MismatchingShape("bias must have one value per output channel", op="Conv", expected=geo.M,
                               found=bias.size)
    return geo, w, bias


def _kind(geo: _Geometry, vw: int) -> str:
    if use_direct(geo, vw):
        return "depthwise"
    if winograd_tile(geo, vw):
        return "winograd"
    if use_channel_vectors(geo, vw):
        return "channel"
    return "pixel"


def splits_pixels(*, x_shape, w_shape, strides, pads, dilations, group: int, vector_width: int) -> bool:
    """Whether threads split this conv's output by pixels, each writing a range of pixels of every channel:
    the pixel path, and Winograd on maps of many panels of tiles (bands of tile rows); the other paths
    split channels or planes."""
    geo = _Geometry(x_shape, w_shape, strides, pads, dilations, group)
    kind = _kind(geo, vector_width)
    if kind == "winograd":
        mh, mw = winograd_tile(geo, vector_width)
        return math.ceil(_wino_tiles(geo, mh, mw)[2] / _wino_panel(geo, mh, mw, vector_width)) >= WINO_PIXEL_PANELS
    return kind == "pixel"


# PANEL LAYOUT. Between pixel-path convs an activation may be panel-major instead of NCHW: per image, pixel
# panel b (pixels [b*NR, min(P, (b+1)*NR)), NR the pixel path's panel width) holds its C channel rows of
# width w_b one after another, element (c, p) at b*C*NR + c*w_b + (p - b*NR); an image still spans C*P
# floats. A direct 1x1 conv then reads its B panel in place as one contiguous block (in NCHW, its K rows lie
# a plane apart: too many streams to prefetch, so they are copied, and the copy waits on memory: ResNet-50's
# 256 -> 64 on 56x56 ran at 128 GFLOP/s against 169 with the copy left out, Xeon); the producer writes rows
# of w_b floats instead of rows a plane apart.
def _panel_width(geo: _Geometry, vw: int) -> int:
    """NR where this conv runs on the pixel path ungrouped (its output and residual may be panel-major),
    else 0."""
    if geo.group != 1 or _kind(geo, vw) != "pixel":
        return 0
    return _pixel_tile(geo, vw)[1] * vw


def panel_pixels(*, x_shape, w_shape, strides, pads, dilations, group: int, vector_width: int) -> int:
    """NR where emit_conv2d can write this conv's output (and read its residual) panel-major, else 0."""
    return _panel_width(_Geometry(x_shape, w_shape, strides, pads, dilations, group), vector_width)


def _reads_panels(geo: _Geometry, vw: int) -> int:
    """The panel width of a panel-major input this conv can read: its own NR (a direct 1x1 conv on the pixel
    path reads its panels in place), -1 for any (the pixel and channel paths that pack their input by gathers),
    0 for none."""
    if geo.group != 1:
        return 0
    kind = _kind(geo, vw)
    if kind == "pixel":
        return _panel_width(geo, vw) if geo.direct else (-1 if not geo.shift else 0)
    return -1 if kind == "channel" and not geo.direct and not geo.shift else 0


def reads_panels(*, x_shape, w_shape, strides, pads, dilations, group: int, vector_width: int) -> int:
    """Which panel-major input emit_conv2d can read for this conv: NR (that width only), -1 (any) or 0."""
    return _reads_panels(_Geometry(x_shape, w_shape, strides, pads, dilations, group), vector_width)


def emit_conv2d(module: ir.Module, name: str, *, x_shape, w: np.ndarray, bias: np.ndarray | None, strides, pads,
                dilations, group: int, activation: str, activation_params, has_residual: bool,
                vector_width: int, split: str = "", panels: tuple[int, int, int] = (0, 0, 0)) -> KernelInfo:
    """2-D convolution kernel: out(N, M, OH, OW) = act(conv(x, w) + bias [+ residual]). `split` asks threads
    to divide the output as a neighbouring step does, so that the data between them stays on the core that
    wrote it: "pixels" (a depthwise conv: its rows, where splits_rows holds) or "channels" (the pixel path:
    ranges of output channels over every pixel panel); other kernels split their own way. `panels`: the panel
    widths of x, out and the residual (PANEL LAYOUT above; 0: NCHW): x where reads_panels allows that width,
    out and the residual on the pixel path (panel_pixels nonzero) in whole vectors."""
    activations.check(activation, activation_params)
    geo, w, bias = _prepare(x_shape, w, bias, strides, pads, dilations, group)
    kind = _kind(geo, vector_width)
    x_width, out_width, res_width = panels
    if any(panels):
        takes = _reads_panels(geo, vector_width)
        if ((x_width and takes not in (x_width, -1)) or ((out_width or res_width) and not _panel_width(geo, vector_width))
                or (res_width and not has_residual) or out_width % vector_width or res_width % vector_width):
            raise InternalError("a panel-major operand for a conv that cannot take it", op="Conv",
                                expected="out, residual: the pixel path, ungrouped; x: a 1x1 conv of its panel width "
                                "there, or a packing pixel or channel path", found=dict(kind=kind, panels=panels))
    if kind == "depthwise":
        return emit_depthwise(module, name, geo, w, bias, activation, activation_params, has_residual, vector_width,
                              split_rows=split == "pixels")
    if kind == "pixel":
        return _emit_gemm_conv(module, name, geo, w, bias, activation, activation_params, has_residual, vector_width,
                               by_channels=split == "channels", panels=panels)
    if kind == "channel":
        return _emit_channel_conv(module, name, geo, w, bias, activation, activation_params, has_residual,
                                  vector_width, x_width=x_width)
    return _emit_winograd(module, name, geo, w, bias, activation, activation_params, has_residual, vector_width)


def splits_rows(*, x_shape, w_shape, strides, pads, dilations, group: int, vector_width: int,
                has_residual: bool) -> bool:
    """Whether emit_conv2d splits this conv's rows when asked to split by pixels (a depthwise conv on a
    large map)."""
    geo = _Geometry(x_shape, w_shape, strides, pads, dilations, group)
    return _kind(geo, vector_width) == "depthwise" and depthwise_splits_rows(geo, vector_width, has_residual)


def pack_conv2d(*, x_shape, w: np.ndarray, bias: np.ndarray | None, strides, pads, dilations, group: int,
                vector_width: int, **_code_only) -> list[np.ndarray]:
    """The `packed` arrays emit_conv2d returns for these weights, without generating code (same keyword
    arguments; activation and residual do not matter). Convs of one configuration can thus share one
    generated function, each with its own packed arrays, even where packing is not a rearrangement
    (Winograd transforms the weights)."""
    geo, w, bias = _prepare(x_shape, w, bias, strides, pads, dilations, group)
    pack = {"depthwise": pack_depthwise, "winograd": _pack_winograd, "channel": _pack_channel_conv,
            "pixel": _pack_gemm_conv}[_kind(geo, vector_width)]
    return pack(geo, w, bias, vector_width)


PIXEL_WIDE_MIN = 56 * 56
PIXEL_TILE = None  # (MR, NV): overrides the choice below, for measurements


def _pixel_tile(geo: _Geometry, vw: int) -> tuple[int, int]:
    """(MR, NV) of the pixel path's tile: rows of output channels x vectors of pixels."""
    if PIXEL_TILE is not None:
        return min(PIXEL_TILE[0], geo.Mg), PIXEL_TILE[1]
    if vw >= 16 and geo.P >= PIXEL_WIDE_MIN and geo.Mg >= 24:
        # 6 x 4: 10 loads per 24 fma instead of 8 x 2's 10 per 16; on large maps (ResNet's 112x112 and
        # 56x56) 4-9% faster in the model, on 28x28 ones with a residual 3% slower (measured on a Xeon)
        return 6, 4
    if vw >= 16 and not geo.direct and geo.Mg >= 8:
        # 8 x 3 on a packed panel (im2col, phase planes) of a smaller map: 24 fma's per 11 loads; ResNet-50's
        # 3x3 stride-2 conv to 28x28 in the model, Xeon, thread CPU time: 1.81 -> 1.74 ms at 1 thread, 0.99
        # -> 0.94 ms at 2 (8 x 2 before)
        return 8, 3
    return choose_tile(geo.Mg, vw)


def _pack_gemm_conv(geo: _Geometry, w, bias, vw) -> list[np.ndarray]:
    """Weights as [group][m-block][k][MR] (rows past Mg zero): one tile reads them front to back."""
    mr, _ = _pixel_tile(geo, vw)
    kg = geo.Cg * geo.KHKW
    mblocks = math.ceil(geo.Mg / mr)
    wg = np.zeros((geo.group, mblocks * mr, kg), np.float32)
    wg[:, :geo.Mg] = w.reshape(geo.group, geo.Mg, kg)
    return [hugepages.contiguous(wg.reshape(geo.group, mblocks, mr, kg).transpose(0, 1, 3, 2)).ravel(), bias]


def _pack_channel_conv(geo: _Geometry, w, bias, vw) -> list[np.ndarray]:
    """Weights as [group][channel panel][k][NR], bias as [group][panel * NR] (channels past Mg zero)."""
    _, nv = _channel_tile(geo, vw)
    nr = nv * vw
    kg = geo.Cg * geo.KHKW
    mpanels = math.ceil(geo.Mg / nr)
    wg = np.zeros((geo.group, mpanels * nr, kg), np.float32)
    wg[:, :geo.Mg] = w.reshape(geo.group, geo.Mg, kg)
    bp = np.zeros((geo.group, mpanels * nr), np.float32)
    bp[:, :geo.Mg] = bias.reshape(geo.group, geo.Mg)
    return [hugepages.contiguous(wg.reshape(geo.group, mpanels, nr, kg).transpose(0, 1, 3, 2)).ravel(), bp.ravel()]


def _cost_range(b: ir.IRBuilder, tid, nthreads, *, images: int, panels: int, edge_cost: int, full_cost: int,
               mblocks: int) -> tuple:
    """Thread tid's contiguous share [lo, hi) of the units (image, panel, row block), balanced by cost
    rather than count: a unit of each image's last panel costs edge_cost, the others full_cost (a narrow
    edge panel, e.g. 13x13 = 169 pixels in panels of 32: 5 full + one vector, would otherwise leave the
    thread holding it ~10% idle at 2 threads). Cost positions split evenly, each mapped to the first unit
    starting at or after it, so the shares of consecutive threads meet."""
    if edge_cost == full_cost:
        return U.thread_range(b, images * panels * mblocks, tid, nthreads, "unit")
    full_units = (panels - 1) * mblocks
    fulls = full_units * full_cost  # cost of an image's full panels
    per_image = fulls + mblocks * edge_cost
    pos_lo, pos_hi = U.thread_range(b, images * per_image, tid, nthreads, "cost")

    def unit(pos):
        i64 = U.i64
        img, r = b.udiv(pos, i64(per_image)), b.urem(pos, i64(per_image))
        in_full = b.udiv(b.add(r, i64(full_cost - 1)), i64(full_cost))
        in_edge = b.add(i64(full_units), b.udiv(b.add(b.sub(r, i64(fulls)), i64(edge_cost - 1)), i64(edge_cost)))
        at = b.select(b.icmp_unsigned("<", r, i64(fulls)), in_full, in_edge)
        return b.add(b.mul(img, i64(panels * mblocks)), at, name="unit")

    return unit(pos_lo), unit(pos_hi)


# A direct 1x1 conv's pixel panel (kc rows of NR floats, one per input plane) is copied into a contiguous
# scratch panel before its row blocks run: read in place, its rows lie a plane apart (3-12 KB), each on its
# own page, and the panel does not stay in L1 across row blocks (measured, Xeon AVX-512, warm: ResNet-50's
# 512 -> 128 on 28x28 116 -> 146 GFLOP/s; in the model its 64-plane 1x1 convs 1-3% faster).
COPY_DIRECT = True
# Software prefetches where the hardware prefetcher sees too many streams (switches for measurements).
COPY_PREFETCH = True
OUT_PREFETCH = True


def _copy_rows(vx: VecIR, src, stride: int, buf, nr: int, rows, nvec: int, masks) -> None:
    """buf[k][0 : nvec * VW] = src[k * stride + ...] for k < rows (masked lanes become zeros)."""
    lp = Loop(vx, "copy.k", 0, rows)
    row = vx.gep(src, vx.off((lp.i, stride)), name="copy.src")
    dst = vx.gep(buf, vx.off((lp.i, nr)), name="copy.dst")
    for v in range(nvec):
        vx.store(vx.load(vx.gep(row, v * vx.vw), masks[v], name="copy.v"), vx.gep(dst, v * vx.vw))
    if COPY_PREFETCH:  # the same rows of the next panel: one stream per input plane, too many to track
        for j in range(math.ceil(nr / 16)):
            vx.prefetch(vx.gep(row, nr + 16 * j), locality=2)
    lp.close()


def _emit_gemm_conv(module, name, geo: _Geometry, w, bias, activation, params, has_residual, vw,
                    by_channels: bool = False, panels: tuple[int, int, int] = (0, 0, 0)) -> KernelInfo:
    """The pixel path. Threads split its units (image, pixel panel, row block of output channels) in
    contiguous ranges, so each writes a range of pixels of every channel; by_channels: each takes a range
    of row blocks over every pixel panel instead (and packs every panel). panels: the panel widths of x, out
    and the residual (PANEL LAYOUT; 0: NCHW); a direct conv reads x's panels in place, others gather."""
    x_width, out_width, res_width = panels
    x_panels = bool(x_width) and geo.direct
    mr, nv = _pixel_tile(geo, vw)
    nr = nv * vw
    kg = geo.Cg * geo.KHKW
    mblocks, mfull = math.ceil(geo.Mg / mr), geo.Mg // mr
    nblocks, nfull = math.ceil(geo.P / nr), geo.P // nr
    p_edge = geo.P - nfull * nr

    packed = _pack_gemm_conv(geo, w, bias, vw)

    direct = geo.direct
    copy = direct and COPY_DIRECT and not x_panels
    phases = None
    if direct or geo.shift or x_width:
        cc = chunk_channels(geo.Cg, geo.KHKW, nr, mblocks * mr)
    else:
        phases, cc = _PhasePlanes.for_panels(geo, nr, mblocks * mr)
    panel_floats = cc * geo.KHKW * nr
    in_place = direct and not copy
    scratch_bytes = 0 if in_place else (panel_floats + (cc * phases.channel if phases else 0)) * 4 + 64

    fn = kernel_function(module, name, len(packed))
    out_p, x_p, res_p, scratch_p, w_p, bias_p = fn.args[:6]
    tid, nthreads = fn.args[-2:]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vx = VecIR(module, b, vw)
    buf = planes = None
    if not in_place:
        raw = b.ptrtoint(scratch_p, I64, name="scratch.addr")
        up = b.add(raw, ir.Constant(I64, 63), name="scratch.up")
        buf = b.inttoptr(b.and_(up, ir.Constant(I64, ~63), name="scratch.al"), PTR, name="panel.buf")
    if phases:
        planes = vx.gep(buf, panel_floats, name="phase.planes")
        planes_of = b.alloca(I64, name="phase.img")  # the image (x group) the planes hold, -1: none
        band_of = b.alloca(I64, name="phase.band")  # and their band's first output row

    if by_channels:
        mb_lo, mb_hi = U.thread_range(b, mblocks, tid, nthreads, "mblocks")
    else:
        lo, hi = _cost_range(b, tid, nthreads, images=geo.N * geo.group, panels=nblocks, mblocks=mblocks,
                             full_cost=nv, edge_cost=math.ceil(p_edge / vw) if p_edge else nv)

    def chunk(c0, ncc, first, last) -> None:
        """Channels [c0, c0 + ncc) of every panel and row block this thread owns. The first chunk starts
        from bias (+ residual), later ones from the partial sums in out; the last applies the activation.
        Reading the residual before out is first written keeps out == residual (in place) safe."""
        kc = ncc * geo.KHKW if isinstance(ncc, int) else b.mul(ncc, ir.Constant(I64, geo.KHKW), name="kc")
        if phases:
            b.store(ir.Constant(I64, -1), planes_of)
            b.store(ir.Constant(I64, 0), band_of)

        def do_panel(panel, mb_lo, mb_hi) -> None:
            nb = b.urem(panel, ir.Constant(I64, nblocks), name="nb")
            img_g = b.udiv(panel, ir.Constant(I64, nblocks), name="img_g")  # n * group + g
            g = b.urem(img_g, ir.Constant(I64, geo.group), name="g")
            x_img = vx.gep(x_p, vx.off((img_g, geo.Cg * geo.HW)), name="x.img")
            p0 = b.mul(nb, ir.Constant(I64, nr), name="p0")
            if phases:  # a thread walks its panels in order: planes are rebuilt when a panel leaves the band
                last_row = b.udiv(imin(b, vx.off(p0, nr - 1), ir.Constant(I64, geo.P - 1)),
                                  ir.Constant(I64, geo.OW), name="phase.lastrow")
                band_end = vx.off(b.load(band_of, typ=I64), phases.band)
                stale = b.or_(b.icmp_signed("!=", img_g, b.load(planes_of, typ=I64)),
                              b.icmp_signed(">=", last_row, band_end), name="phase.stale")
                with b.if_then(stale):
                    b0 = imin(b, b.udiv(p0, ir.Constant(I64, geo.OW)), ir.Constant(I64, geo.OH - phases.band),
                              name="phase.b0")
                    _build_phase_planes(vx, geo, phases, planes, x_img, c0, ncc, b0)
                    b.store(img_g, planes_of)
                    b.store(b0, band_of)
            out_img = vx.gep(out_p, vx.off((img_g, geo.Mg * geo.P)), name="out.img")
            res_img = vx.gep(res_p, vx.off((img_g, geo.Mg * geo.P)), name="res.img") if has_residual else None

            def run(nvec: int, last_lanes: int) -> None:
                lane_masks = [None] * (nvec - 1) + [vx.lane_mask(last_lanes) if last_lanes else None]
                width = (nvec - 1) * vw + last_lanes if last_lanes else nvec * vw  # this panel's pixels

                def panel_layout(pw: int):
                    """Per vector of the panel: (offset of its first pixel in channel 0, row width) in an
                    image of Mg channels panel-major in panels of pw pixels (PANEL LAYOUT); None: NCHW."""
                    if not pw:
                        return None
                    out = []
                    for v in range(nvec):
                        pv = vx.off(p0, v * vw)
                        if pw == nr:  # the kernel's own panels
                            out.append((vx.off((nb, geo.Mg * nr), v * vw), ir.Constant(I64, width)))
                            continue
                        pan = b.udiv(pv, ir.Constant(I64, pw), name="opanel")
                        base = b.add(b.mul(pan, ir.Constant(I64, geo.Mg * pw)), b.urem(pv, ir.Constant(I64, pw)),
                                     name="obase")
                        wl = ir.Constant(I64, pw)
                        if geo.P % pw:
                            last = b.icmp_unsigned("==", pan, ir.Constant(I64, geo.P // pw), name="olast")
                            wl = b.select(last, ir.Constant(I64, geo.P % pw), wl, name="owidth")
                        out.append((base, wl))
                    return out

                out_layout, res_layout = panel_layout(out_width), panel_layout(res_width)
                if x_panels:  # its K rows of `width` floats, one block
                    bptr = vx.gep(x_img, vx.off((nb, geo.Cg * nr), (c0, width)), name="bpanel")
                    b_ks, b_masks = width, lane_masks
                elif copy:
                    _copy_rows(vx, vx.gep(x_img, vx.off((c0, geo.HW), p0), name="bdirect"), geo.HW, buf, nr, ncc,
                               nvec, lane_masks)
                    bptr, b_ks, b_masks = buf, nr, None
                elif direct:
                    bptr, b_ks, b_masks = vx.gep(x_img, vx.off((c0, geo.HW), p0), name="bdirect"), geo.HW, lane_masks
                elif phases:
                    _pack_phases(vx, geo, phases, buf, planes, ncc, p0, b.load(band_of, typ=I64), nr, nvec,
                                 last_lanes)
                    bptr, b_ks, b_masks = buf, nr, None
                else:
                    _pack(vx, geo, _Panel(vx, geo, p0, nvec, last_lanes), buf, x_img, c0, ncc, p0, nr, x_width)
                    bptr, b_ks, b_masks = buf, nr, None

                def tile(mb, edge: bool) -> None:
                    rows = geo.Mg - mfull * mr if edge else mr
                    m0 = b.mul(mb, ir.Constant(I64, mr), name="m0")
                    wtile = vx.gep(w_p, vx.off((b.add(b.mul(g, ir.Constant(I64, mblocks)), mb), kg * mr),
                                               (c0, geo.KHKW * mr)), name="wtile")
                    def at(layout) -> list:
                        """[row][vector]: offset of each output vector of the tile in out (or the residual)."""
                        if layout is None:
                            rows_at = [vx.off((vx.off(m0, r), geo.P), p0) for r in range(rows)]
                            return [[vx.off(ra, v * vw) for v in range(nvec)] for ra in rows_at]
                        return [[b.add(base, b.mul(vx.off(m0, r), wl)) for base, wl in layout] for r in range(rows)]

                    oat, rat = at(out_layout), at(res_layout)
                    # the same rows in the next panel (prefetched): a panel on, or a plane's panel width on
                    o_next = geo.Mg * out_width if out_width else nr
                    r_next = geo.Mg * res_width if res_width else nr

                    def from_bias() -> list:
                        init = []
                        for r in range(rows):
                            chan = b.add(b.mul(g, ir.Constant(I64, geo.Mg)), vx.off(m0, r), name="chan")
                            bias_v = vx.load_splat(vx.gep(bias_p, chan), name="bias")
                            for v in range(nvec):
                                if has_residual:
                                    rp = vx.gep(res_img, rat[r][v])
                                    init.append(vx.fadd(bias_v, vx.load(rp, lane_masks[v], name="res")))
                                else:
                                    init.append(bias_v)
                        return init

                    def from_out() -> list:  # partial sums of earlier chunks live in out
                        return [vx.load(vx.gep(out_img, oat[r][v]), lane_masks[v], name="part")
                                for r in range(rows) for v in range(nvec)]

                    if OUT_PREFETCH:
                        # this row block's outputs (and residuals) in the next panel: one stream per
                        # output plane, too many for the hardware prefetcher; measured on ResNet-50's
                        # residual 1x1 convs in the model: 0.70-0.82x the time
                        for r in range(rows):
                            for j in range(math.ceil(nr / 16)):
                                vx.prefetch(vx.gep(out_img, vx.off(oat[r][0], o_next + 16 * j)), write=True, locality=2)
                                if has_residual:
                                    vx.prefetch(vx.gep(res_img, vx.off(rat[r][0], r_next + 16 * j)), locality=2)
                    flat = choose(vx, first, from_bias, from_out)
                    init = [flat[r * nvec:(r + 1) * nvec] for r in range(rows)]
                    acc = emit_tile(vx, mr=rows, nv=nvec, kc=kc, a_ptr=wtile, a_rs=1, a_ks=mr, b_ptr=bptr,
                                    b_ks=b_ks, b_masks=b_masks, init=init, name="conv")

                    def store(final: bool) -> None:
                        for r in range(rows):
                            for v in range(nvec):
                                val = vx.activation(acc[r][v], activation, params) if final else acc[r][v]
                                vx.store(val, vx.gep(out_img, oat[r][v]), lane_masks[v])

                    when(vx, last, lambda: store(True), lambda: store(False))

                block_loop(vx, lo=mb_lo, hi=mb_hi, blocks=mblocks, full=mfull, body=tile)

            full_or_edge_panel(b, nb, nfull=nfull, edge=p_edge, nv=nv, vw=vw, run=run)

        if by_channels:
            with b.if_then(b.icmp_signed("<", mb_lo, mb_hi)):
                pl = Loop(vx, "panel", 0, geo.N * geo.group * nblocks)
                do_panel(pl.i, mb_lo, mb_hi)
                pl.close()
        else:
            panel_walk(vx, lo=lo, hi=hi, mblocks=mblocks, body=do_panel)

    chunk_loop(vx, geo.Cg, cc, chunk)
    b.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch_bytes)


# Maps up to this many output pixels may take the channel path (inception_v3's 17x17 = 289 does).
CHANNEL_MAX_PIXELS = 300
# Weights (of one group) past this size are re-read from beyond L2 by every pixel panel of the pixel path.
CHANNEL_WEIGHT_BYTES = 512 * 1024


def use_channel_vectors(geo: _Geometry, vw: int) -> bool:
    """Vectors over pixels waste lanes on small maps (7x7: 64 lanes for 49 pixels; 1x1: 16 for 1), and
    each of their panels streams all the weights: the channel path vectors over output channels and reads
    each weight once, at the price of a transposing epilogue. It is taken where the pixel path wastes 10% more
    lanes, or wastes no fewer and the weights are too large to stay cached between pixel panels (measured
    on AVX-512 with cold caches, as in a model: 1.1-1.6x on 7x7 to 17x17 maps; with L2-sized weights and
    short reductions the scatters cost more than the streaming, 0.6x at 96 -> 576 on 14x14)."""
    if geo.P > CHANNEL_MAX_PIXELS:
        return False
    by_pixels = math.ceil(geo.P / vw) * vw * geo.Mg
    by_channels = geo.P * math.ceil(geo.Mg / vw) * vw
    big_weights = geo.Mg * geo.Cg * geo.KHKW * 4 > CHANNEL_WEIGHT_BYTES
    return by_channels * 1.1 < by_pixels or (big_weights and by_channels <= by_pixels)


CHANNEL_TILE = None  # (pixels, channel vectors): overrides the choice below, for measurements
CHANNEL_PREFETCH = True
# A direct 1x1 conv's tile reads its pixels in place, one row segment per input channel: too many streams
# for the hardware prefetcher, and at 2 threads half of them were written by the other core (a snoop each).
# Every k step fetches the line X_PREFETCH floats ahead in its row (the next tiles' pixels).
X_PREFETCH = 16
TRANSPOSE_EPILOGUE = True


def _transpose(vx: VecIR, rows: list) -> list:
    """The VW x VW transpose of VW vectors (out[j][i] = rows[i][j]): log2(VW) rounds of two-source
    shuffles, each swapping the off-diagonal h x h blocks of every 2h x 2h block."""
    n, r, h = len(rows), list(rows), len(rows) // 2
    while h:
        lo = ir.Constant(ir.VectorType(I32, n), [j if not j & h else n + j - h for j in range(n)])
        hi = ir.Constant(ir.VectorType(I32, n), [j + h if not j & h else n + j for j in range(n)])
        for i in range(n):
            if not i & h:
                r[i], r[i + h] = (vx.b.shuffle_vector(r[i], r[i + h], lo, name="tr.lo"),
                                  vx.b.shuffle_vector(r[i], r[i + h], hi, name="tr.hi"))
        h //= 2
    return r


def _channel_tile(geo: _Geometry, vw: int) -> tuple[int, int]:
    """(pixels, channel vectors) per tile of the channel path; pixels <= 8 (the pixel buffer's row).
    AVX-512's 32 registers hold 6 x 4 accumulators: for direct 1x1 convs into 256+ channels that measured
    up to 1.35x over gemm's 7 x 2 (fewer loads per fma, a 64-channel panel); on packed pixels (strided 1x1,
    3x3) it was even or slower (more pixel blocks in the buffer), 7 x 3 faster."""
    if CHANNEL_TILE is not None:
        return CHANNEL_TILE
    if vw >= 16 and geo.direct and geo.Mg >= 256 and geo.P >= 6:
        # 7 x 3 where 7-pixel blocks waste fewer lanes (ResNet's 14x14 and 7x7 maps: no partial block;
        # 6-pixel blocks leave a 4- or 1-pixel one); in ResNet-50, 1 thread, Xeon: ~1% faster
        if math.ceil(geo.P / 7) * 7 < math.ceil(geo.P / 6) * 6:
            return 7, 3
        return 6, 4
    if vw >= 16 and not geo.direct and geo.Mg >= 3 * vw:
        # 7 x 3 on packed pixels (strided convs) of 3+ channel vectors: ResNet-50's stride-2 convs to 14x14 and
        # 7x7 in the model, Xeon, thread CPU time, two runs each: 1 thread 2-12% faster each (0.4-0.5 ms in
        # all); 2 threads the downsamples 3-7% and the 3x3 to 7x7 2-3% faster, the 3x3 to 14x14 1-5% slower
        # (choose_tile's 7 x 2 before; 8 x 3 and 6 x 4 were mixed)
        return 7, 3
    return choose_tile(geo.P, vw)


# The channel path's reduction chunk: one channel panel's weights (kc x NR) and the pixels of the whole
# map for those kc rows, reused by every pixel block, should stay in L2 (1 MiB on Zen 4/5, 512 KiB on Zen 3).
CHANNEL_CHUNK_SHARE = 8  # of L2_WEIGHT_BYTES
# ... and the chunk of one channel panel's weights (kc x NR), which every pixel block of the panel streams
# again, should stay in L1 beside the pixel rows (measured, Xeon: ResNet-50 at 1 thread 3-4% faster than
# with only the L2 budget; 8-24 KiB all alike).
CHANNEL_PANEL_BYTES = 16 * 1024


# Threads split the channel path's units by channel panels (pixel blocks innermost: a thread reads only its
# panels' weights, but packs every pixel block of the map) or by pixel blocks (a thread packs only its blocks
# but reads every panel's weights). Packing a float (a masked load or gather and a store into scratch) costs
# about as much as streaming PACK_COST weight floats, a gather (strided input) about four times that.
PACK_COST = 2


def _split_by_pixels(geo: _Geometry, pix_floats: int, weight_floats: int) -> bool:
    """Whether the channel path splits its packed pixel blocks (pix_floats per k row) across threads."""
    return not geo.direct and pix_floats * PACK_COST * (1 if geo.shift else 4) > weight_floats


def _channel_chunk(geo: _Geometry, nr: int, pix_floats: int) -> int:
    """Channels per reduction chunk of the channel path, balanced; pix_floats: pixel floats per k row."""
    per_channel = geo.KHKW * (nr + pix_floats) * 4
    cc = max(1, min(geo.Cg, L2_WEIGHT_BYTES // CHANNEL_CHUNK_SHARE // per_channel,
                    CHANNEL_PANEL_BYTES // (geo.KHKW * nr * 4)))
    return math.ceil(geo.Cg / math.ceil(geo.Cg / cc))


def _emit_channel_conv(module, name, geo: _Geometry, w, bias, activation, params, has_residual,
                       vw, x_width: int = 0) -> KernelInfo:
    """The transposed blocking for small maps: a tile is (a few output pixels) x (NV vectors of output
    channels); the pixels' input values are broadcast, the weights ([group][channel panel][k][NR]) are the
    vectors; the last chunk's tiles of a panel are kept in scratch as [pixel][channel] and written out per
    VW pixels x VW channels through a register transpose (rows of NCHW: no scatters, and residuals read as
    rows). Work units are (image and group,
    channel panel, pixel block) with pixel blocks innermost, so a channel panel's weights are read from
    memory once and reused from cache by every pixel block (the weights of these layers are far larger than
    their maps); without the 1x1 direct read, a thread packs the pixels of a reduction chunk once per image
    and group: the whole map's, or where packing costs more than re-reading the weights (`_split_by_pixels`)
    only its own pixel blocks', its units then ordered (pixel block, channel panel). Reduction chunks keep their partial sums in a per-thread scratch tile store,
    so out is written once (out == residual is safe). x_width: x is panel-major in panels of that width
    (PANEL LAYOUT), packed by gathers."""
    pr, nv = _channel_tile(geo, vw)  # pixels per tile, channel vectors per tile
    nr = nv * vw
    kg = geo.Cg * geo.KHKW
    pblocks, pfull = math.ceil(geo.P / pr), geo.P // pr
    p_edge = geo.P - pfull * pr
    mpanels, mpfull = math.ceil(geo.Mg / nr), geo.Mg // nr
    m_edge = geo.Mg - mpfull * nr
    packed = _pack_channel_conv(geo, w, bias, vw)

    direct = geo.direct
    pix_stride = 8  # pixel buffer row: pr <= 8 floats, one <8 x float> per k
    cc = _channel_chunk(geo, nr, geo.P if direct else pblocks * pix_stride)
    chunks = math.ceil(geo.Cg / cc)
    per_image = mpanels * pblocks
    units = geo.N * geo.group * per_image
    by_pixels = _split_by_pixels(geo, pblocks * pix_stride, mpanels * nr)
    block_floats = cc * geo.KHKW * pix_stride  # one pixel block's rows of a chunk
    pbuf_floats = 0 if direct else pblocks * block_floats
    cbuf_floats = units * pr * nr if chunks > 1 else 0
    transposed = TRANSPOSE_EPILOGUE and not by_pixels
    # the finished tiles of a panel, [pixel][NR] (VW rows of slack: a transposed block reads whole vectors)
    tbuf_floats = (geo.P + vw) * nr if transposed else 0
    scratch_floats = pbuf_floats + cbuf_floats + tbuf_floats
    scratch_bytes = scratch_floats * 4 + 64 if scratch_floats else 0

    fn = kernel_function(module, name, len(packed))
    out_p, x_p, res_p, scratch_p, w_p, bias_p = fn.args[:6]
    tid, nthreads = fn.args[-2:]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vx = VecIR(module, b, vw)
    v8 = VecIR(module, b, 8)
    pbuf = cbuf = None
    if scratch_bytes:
        raw = b.ptrtoint(scratch_p, I64, name="scratch.addr")
        up = b.add(raw, ir.Constant(I64, 63), name="scratch.up")
        base = b.inttoptr(b.and_(up, ir.Constant(I64, ~63), name="scratch.al"), PTR, name="scratch.base")
        pbuf = base
        cbuf = vx.gep(base, pbuf_floats, name="partials")
        tbuf = vx.gep(cbuf, cbuf_floats, name="finished")
    # image-group whose pixels pbuf holds (split by channel panels: every pixel block of it)
    packed_for = None if direct or by_pixels else b.alloca(I64, name="packed.for")
    if by_pixels:
        lo, hi = U.thread_range(vx.b, units, tid, nthreads, "unit")
    else:  # a narrow last channel panel costs less (ResNet-50's 256 channels: 5 panels of 48 and one of 16)
        lo, hi = _cost_range(b, tid, nthreads, images=geo.N * geo.group, panels=mpanels, mblocks=pblocks,
                             full_cost=nv, edge_cost=math.ceil(m_edge / vw) if m_edge else nv)
    mpn = ir.Constant(I64, mpanels)

    def unit_of(outer, pb):
        """Index of unit (outer = image-group * mpanels + channel panel, pixel block pb) in the split's order:
        (image-group, pixel block, channel panel) when split by pixels, else (image-group, panel, block)."""
        if not by_pixels:
            return b.add(b.mul(outer, ir.Constant(I64, pblocks)), pb, name="u")
        img_g, mp = b.udiv(outer, mpn), b.urem(outer, mpn)
        return b.add(b.mul(img_g, ir.Constant(I64, per_image)), b.add(b.mul(pb, mpn), mp), name="u")

    def chunk(c0, ncc, first, last) -> None:
        kc = ncc * geo.KHKW if isinstance(ncc, int) else b.mul(ncc, ir.Constant(I64, geo.KHKW), name="kc")
        if packed_for is not None:
            b.store(ir.Constant(I64, -1), packed_for)

        def pack_map(x_img, pb_lo=0, pb_hi=pblocks) -> None:
            """Pixel blocks [pb_lo, pb_hi)'s rows [c0*KHKW, (c0+ncc)*KHKW) of the im2col matrix into pbuf."""

            def pack_block(pb, edge: bool) -> None:
                rows = p_edge if edge else pr
                q0 = b.mul(pb, ir.Constant(I64, pr), name="pq0")
                pan = _Panel(v8, geo, q0, 1, rows if rows < 8 else 0)
                _pack(v8, geo, pan, vx.gep(pbuf, vx.off((pb, block_floats)), name="pblock"), x_img, c0, ncc, q0,
                      pix_stride, x_width)

            block_loop(vx, lo=vx.i64(pb_lo), hi=vx.i64(pb_hi), blocks=pblocks, full=pfull, body=pack_block)

        def do_panel(outer, pb_lo, pb_hi) -> None:
            mp = b.urem(outer, ir.Constant(I64, mpanels), name="mp")
            img_g = b.udiv(outer, ir.Constant(I64, mpanels), name="img_g")
            g = b.urem(img_g, ir.Constant(I64, geo.group), name="g")
            x_img = vx.gep(x_p, vx.off((img_g, geo.Cg * geo.HW)), name="x.img")
            out_img = vx.gep(out_p, vx.off((img_g, geo.Mg * geo.P)), name="out.img")
            res_img = vx.gep(res_p, vx.off((img_g, geo.Mg * geo.P)), name="res.img") if has_residual else None
            if packed_for is not None:
                stale = b.icmp_signed("!=", b.load(packed_for, name="packed.img"), img_g, name="pbuf.stale")
                with b.if_then(stale):
                    pack_map(x_img)
                    b.store(img_g, packed_for)
            wtile = vx.gep(w_p, vx.off((b.add(b.mul(g, ir.Constant(I64, mpanels)), mp), kg * nr),
                                       (c0, geo.KHKW * nr)), name="wtile")
            m0 = b.mul(mp, ir.Constant(I64, nr), name="m0")

            def run(nvec: int, lanes: int) -> None:
                masks = [None] * (nvec - 1) + [vx.lane_mask(lanes) if lanes else None]

                def tile(pb, edge: bool) -> None:
                    rows = p_edge if edge else pr
                    q0 = b.mul(pb, ir.Constant(I64, pr), name="q0")
                    if direct:
                        aptr, a_ks = vx.gep(x_img, vx.off((c0, geo.HW), q0), name="apix"), geo.HW
                    else:
                        aptr, a_ks = vx.gep(pbuf, vx.off((pb, block_floats)), name="apix"), pix_stride
                    cb = None
                    if chunks > 1:
                        cb = vx.gep(cbuf, vx.off((b.sub(unit_of(outer, pb), lo), pr * nr)), name="cb")
                    flat = choose(vx, first, lambda: [vx.zero] * (rows * nvec),
                                  lambda: [vx.load(vx.gep(cb, r * nr + v * vw), name="part")
                                           for r in range(rows) for v in range(nvec)])
                    init = [flat[r * nvec:(r + 1) * nvec] for r in range(rows)]
                    stream = None
                    if CHANNEL_PREFETCH:
                        # the next channel panel's chunk of weights (kc rows of `lines` lines), one line per
                        # k step spread over this panel's first pixel blocks: line (pb mod lines) * kc + k.
                        # Streamed by the first pixel block alone they stall it (measured in ResNet-50 on a
                        # Xeon: its 7x7 1x1 convs take 0.71-0.86x the time)
                        lines = math.ceil(nr / 16)
                        kcl = ir.Constant(I64, kc) if isinstance(kc, int) else kc
                        line = b.mul(b.urem(pb, ir.Constant(I64, lines)), kcl, name="pf.line")
                        stream = (vx.gep(wtile, vx.off((line, 16), kg * nr), name="pf"), 16)
                    acc = emit_tile(vx, mr=rows, nv=nvec, kc=kc, a_ptr=aptr, a_rs=1, a_ks=a_ks, b_ptr=wtile,
                                    b_ks=nr, init=init, a_prefetch=X_PREFETCH if direct else 0, stream=stream,
                                    name="convc")

                    def keep_partials() -> None:
                        for r in range(rows):
                            for v in range(nvec):
                                vx.store(acc[r][v], vx.gep(cb, r * nr + v * vw))

                    def keep_finished() -> None:
                        for r in range(rows):
                            for v in range(nvec):
                                vx.store(acc[r][v], vx.gep(tbuf, vx.off((vx.off(q0, r), nr), v * vw)))

                    if transposed:
                        when(vx, last, keep_finished, keep_partials)
                    else:
                        when(vx, last, lambda: finish(q0, masks, acc, nvec, rows), keep_partials)

                def finish(q0, masks, acc, nvec: int, rows: int) -> None:
                    brow = vx.gep(bias_p, vx.off((g, mpanels * nr), m0), name="brow")
                    m0v = vx.splat(b.trunc(m0, I32))
                    cols = []  # element offset of channel (m0 + v*VW + lane) in an NCHW image
                    for v in range(nvec):
                        ch = b.add(m0v, b.add(vx.iota, vx.iconst(v * vw)), name="chv")
                        cols.append(b.mul(ch, vx.iconst(geo.P), name="colidx"))
                    bias_v = [vx.load(vx.gep(brow, v * vw), name="bias") for v in range(nvec)]
                    for r in range(rows):
                        q = vx.off(q0, r)
                        for v in range(nvec):
                            val = vx.fadd(acc[r][v], bias_v[v])
                            if has_residual:
                                rp = vx.ptrs(vx.gep(res_img, q), cols[v], name="resp")
                                val = vx.fadd(val, vx.gather_ptrs(rp, masks[v], name="res"))
                            val = vx.activation(val, activation, params)
                            vx.scatter(val, vx.ptrs(vx.gep(out_img, q), cols[v], name="outp"), masks[v])

                block_loop(vx, lo=pb_lo, hi=pb_hi, blocks=pblocks, full=pfull, body=tile)
                if transposed:
                    when(vx, last, lambda: finish_transposed(pb_lo, pb_hi, nvec, lanes), lambda: None)

            def finish_transposed(pb_lo, pb_hi, nvec: int, lanes: int) -> None:
                """The panel's pixels [pb_lo * pr, min(pb_hi * pr, P)) from tbuf to out: per VW pixels and
                vector of channels a VW x VW transpose, then bias, residual and activation on contiguous
                rows of NCHW (no scatters, no gathers)."""
                q_lo = b.mul(pb_lo, ir.Constant(I64, pr), name="t.qlo")
                q_hi = imin(b, b.mul(pb_hi, ir.Constant(I64, pr)), ir.Constant(I64, geo.P), name="t.qhi")
                n_q = b.sub(q_hi, q_lo, name="t.nq")
                gl = Loop(vx, "t.grp", 0, b.udiv(vx.off(n_q, vw - 1), ir.Constant(I64, vw)))
                q = b.add(q_lo, b.mul(gl.i, ir.Constant(I64, vw)), name="t.q")
                left = b.trunc(b.sub(q_hi, q), I32, name="t.left")
                pmask = b.icmp_signed("<", vx.iota, vx.splat(left), name="t.mask")
                if OUT_PREFETCH:
                    # the out (and residual, usually the same) lines of the group after next, for writing:
                    # at 2 threads out is typically a buffer both cores just read (in ResNet, the block
                    # input the first 1x1 conv read whole), so each line's first store waited for the other
                    # core's copy to be invalidated (ResNet-50's 14x14 256 -> 1024 convs 1.45x -> faster)
                    for j in range(nvec * vw if not lanes else (nvec - 1) * vw + lanes):
                        at = vx.off((vx.off(m0, j), geo.P), vx.off(q, 2 * vw))
                        vx.prefetch(vx.gep(out_img, at), write=True, locality=2)
                for v in range(nvec):
                    cols = [vx.load(vx.gep(tbuf, vx.off((vx.off(q, i), nr), v * vw)), name="t.row") for i in range(vw)]
                    for j, val in enumerate(_transpose(vx, cols)):
                        if v == nvec - 1 and lanes and j >= lanes:
                            break
                        ch = vx.off(m0, v * vw + j)
                        at = vx.off((ch, geo.P), q)
                        val = vx.fadd(val, vx.load_splat(vx.gep(bias_p, vx.off((g, mpanels * nr), ch)), name="t.bias"))
                        if has_residual:
                            val = vx.fadd(val, vx.load(vx.gep(res_img, at), pmask, name="t.res"))
                        vx.store(vx.activation(val, activation, params), vx.gep(out_img, at), pmask)
                gl.close()

            full_or_edge_panel(b, mp, nfull=mpfull, edge=m_edge, nv=nv, vw=vw, run=run)

        def walk_by_pixels() -> None:
            """Per image-group in [lo, hi): pack the pixel blocks of its units once, then run its units channel
            panel by channel panel, so a panel's weights are read once per image-group."""
            pi = ir.Constant(I64, per_image)
            il = Loop(vx, "img", b.udiv(lo, pi), b.add(b.udiv(b.sub(hi, ir.Constant(I64, 1)), pi), ir.Constant(I64, 1)))
            base = b.mul(il.i, pi, name="img.base")
            lo_i = b.select(b.icmp_signed("<", lo, base), ir.Constant(I64, 0), b.sub(lo, base), name="lo.img")
            hi_i = imin(b, b.sub(hi, base), pi, name="hi.img")
            pack_map(vx.gep(x_p, vx.off((il.i, geo.Cg * geo.HW)), name="x.img"), b.udiv(lo_i, mpn),
                     vx.off(b.udiv(vx.off(hi_i, -1), mpn), 1))
            ml = Loop(vx, "mp", 0, mpanels)
            ceil_from = b.sub(ir.Constant(I64, mpanels - 1), ml.i)  # unit pb * mpanels + mp in [lo_i, hi_i)
            pb_lo = b.udiv(b.add(lo_i, ceil_from), mpn, name="pb.lo")
            pb_hi = b.udiv(b.add(hi_i, ceil_from), mpn, name="pb.hi")
            with b.if_then(b.icmp_signed("<", pb_lo, pb_hi)):
                do_panel(b.add(b.mul(il.i, mpn), ml.i), pb_lo, pb_hi)
            ml.close()
            il.close()

        if by_pixels:
            with b.if_then(b.icmp_signed("<", lo, hi)):
                walk_by_pixels()
        else:
            panel_walk(vx, lo=lo, hi=hi, mblocks=pblocks, body=do_panel)

    chunk_loop(vx, geo.Cg, cc, chunk)
    b.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch_bytes)


# Winograd F(mh x mw, 3x3): Y = A_h^T [ (G_h g G_w^T) . (B_h^T d B_w) ] A_w per mh x mw output tile:
# (mh+2)(mw+2) products per tile and channel pair instead of 9 mh mw multiplies, exact up to float rounding.
# Each axis takes the 1-D F(2, 3) (4 points) or F(4, 3) (6 points): F(2x2) is 2.25x fewer multiplies,
# F(2x4) 3x, F(4x4) 4x. F(4, 3) interpolates at 0, 1, -1, 2, -1/2 (and infinity): a search over pairs of
# small rationals next to 0, +-1 found none with a clearly smaller float32 error (best: the mirror
# 0, 1, -1, -2, 1/2, max error 0.82x, rms 0.98x), so F(4x4)'s error is not a matter of points.
WINOGRAD = True
WINOGRAD_DILATED = True
# A dilated conv takes Winograd only where it multiplies at most 1/WINO_DILATED_GAIN as often as the direct
# kernel (tile slots counted in whole vectors): fcn_resnet50's d = 2 and 4 convs on 28x28 maps, 2.3-2.6x
# fewer, run in 0.47-0.53x the time (Xeon); deeplabv3's d = 12 on 14x14, 2 x 2 sub-maps with one output
# in four of every tile, 0.8x as many, took 2.3x the time.
WINO_DILATED_GAIN = 2
_WG = {
    2: np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]]),
    4: np.array([[1, 0, 0], [-1 / 3, -1 / 3, -1 / 3], [1 / 3, -1 / 3, 1 / 3], [1 / 15, 2 / 15, 4 / 15],
                 [-16 / 15, 8 / 15, -4 / 15], [0, 0, 1]]),
}
# A Winograd variant streams its transformed weights ((mh+2)(mw+2) / 9 times the direct ones) once per
# panel of tiles. It pays where the weights stay cached between panels, the map has enough tiles to fill
# the panels, or all of its tiles, at least WINO_STREAM_TILES, fit one panel: each weight is then read
# from memory once, in one contiguous stream per row block prefetched WINO_PREFETCH_FLOATS ahead (the
# hardware prefetcher alone left these layers 1.5-2x slower). Zen 5, 1 thread, warm / cold caches:
# ResNet's 14x14 maps with 256 channels, F(2x4)'s 28 tiles 0.52 / 0.70 ms, F(2x2) 0.68 / 0.87, direct
# 1.12 / 1.29; its 7x7 maps with 512 channels, F(2x2)'s 16 tiles (16.7 MB of weights) 0.89 / 1.08, direct
# 1.29 / 1.42 (2.0 / 2.3 without the prefetch).
WINO_CACHED_WEIGHTS = 4 * 1024 * 1024
WINO_STREAM_TILES = 16
WINO_PREFETCH_FLOATS = 1024
WINO_MIN_TILE_VECTORS = 3
# The tiles the selection may take, (mh, mw), preferred first. Float32 error against float64, per layer
# relative to the largest output (tools/bench_kernels.py --winograd, C = 32..512): F(2x2) ~0.5x the direct
# kernel's (its sums are 9x shorter), F(2x4) ~1x, F(4x4) ~3.5x. F(4x4) put the zoo's inception_v3 at
# 1.5e-4 from float64 (onnxruntime: 6e-5; the direct kernel 7.6e-5), past the zoo tolerance, even on its
# two 32-channel stem layers alone: its error is amplified by the layers after it, which a kernel cannot
# see, so it is left out; F(2x4)'s error is the direct kernel's, so it is bounded like the direct kernel's.
WINOGRAD_TILES: tuple[tuple[int, int], ...] = ((2, 4), (2, 2))
# On maps this large (output pixels) F(2x2)'s 16 gathers per 4 outputs cost more than its saved multiplies
# (inception_v3's 147x147 stem, C = 32, M = 64: 4.7-4.9 ms direct, 5.2-5.5 ms F(2x2), 4.2-4.6 ms F(2x4)).
WINO_F2_MAX_PIXELS = 128 * 128


def use_winograd(geo: _Geometry) -> bool:
    """3x3, stride 1, ungrouped, with enough channels that the transforms amortize. A dilation d (the same
    both ways) splits the map into d x d interleaved sub-maps, each an undilated conv of its own (outputs
    and inputs d apart): their tiles are the kernel's tiles, each sub-map at least 2 x 2."""
    return (WINOGRAD and geo.KH == geo.KW == 3 and geo.sh == geo.sw == 1 and geo.dh == geo.dw
            and (geo.dh == 1 or WINOGRAD_DILATED) and geo.group == 1 and geo.Cg >= 16 and geo.M >= 16
            and math.ceil(geo.OH / geo.dh) >= 2 and math.ceil(geo.OW / geo.dw) >= 2)


def _wino_tiles(geo: _Geometry, mh: int, mw: int) -> tuple[int, int, int]:
    """(tile rows, tile columns) of one sub-map, and the tiles of all d x d sub-maps."""
    d = geo.dh
    th, tw = math.ceil(math.ceil(geo.OH / d) / mh), math.ceil(math.ceil(geo.OW / d) / mw)
    return th, tw, d * d * th * tw


def _wino_weights_cached(geo: _Geometry, mh: int, mw: int) -> bool:
    """Whether F(mh x mw)'s transformed weights fit WINO_CACHED_WEIGHTS (stay cached between panels)."""
    return (mh + 2) * (mw + 2) * geo.Cg * geo.M * 4 <= WINO_CACHED_WEIGHTS


def winograd_tile(geo: _Geometry, vw: int) -> tuple[int, int] | None:
    """Output tile (mh, mw) for this layer, or None for no Winograd: the first of WINOGRAD_TILES whose
    tiles fill WINO_MIN_TILE_VECTORS vectors, or are WINO_STREAM_TILES or more in one panel, or whose
    transformed weights fit WINO_CACHED_WEIGHTS, and whose patches, counted in whole vectors of tiles, do
    not outnumber F(2x2)'s (small maps: larger tiles would compute mostly padding or empty lanes, e.g.
    F(2x4) on densenet's 7x7 maps: 8 tiles in 16 lanes, 0.028 against 0.021 ms); measured per 3x3 layer shape of ResNet-50, inception_v3, googlenet, densenet and
    squeezenet (tools/bench_kernels.py --winograd)."""
    if not use_winograd(geo):
        return None
    def lanes(t: int) -> int:
        return math.ceil(t / vw) * vw

    f2_patches = lanes(_wino_tiles(geo, 2, 2)[2]) * 16
    panel = choose_tile(geo.M, vw)[1] * vw
    for mh, mw in WINOGRAD_TILES:
        tiles = _wino_tiles(geo, mh, mw)[2]
        patches = (mh + 2) * (mw + 2)
        if (mh, mw) != (2, 2) and lanes(tiles) * patches >= f2_patches:
            continue
        if (mh, mw) == (2, 2) and geo.P > WINO_F2_MAX_PIXELS:
            continue
        if geo.dh > 1 and lanes(tiles) * patches * WINO_DILATED_GAIN > geo.P * 9:
            continue  # sub-maps too small for whole tiles: mostly empty tile slots
        streamed_once = WINO_STREAM_TILES <= tiles <= panel
        if tiles >= WINO_MIN_TILE_VECTORS * vw or streamed_once or _wino_weights_cached(geo, mh, mw):
            return mh, mw
    return None


def _bt_rows(vx: VecIR, xs: list) -> tuple:
    """B^T x along one axis of a patch: 4 points (F(2, 3)) or 6 (F(4, 3))."""
    b, c = vx.b, vx.fconst
    if len(xs) == 4:
        x0, x1, x2, x3 = xs
        return (b.fsub(x0, x2, name="bt0"), b.fadd(x1, x2, name="bt1"), b.fsub(x2, x1, name="bt2"),
                b.fsub(x1, x3, name="bt3"))
    # B^T rows: [1, 3/2, -2, -3/2, 1, 0], [0, -1, -5/2, -1/2, 1, 0], [0, 1, 1/2, -5/2, 1, 0],
    # [0, -1/2, -1, 1/2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 1, 3/2, -2, -3/2, 1]
    x0, x1, x2, x3, x4, x5 = xs
    d13, d42 = b.fsub(x1, x3, name="d13"), b.fsub(x4, x2, name="d42")
    return (vx.fma(c(-2.0), x2, vx.fma(c(1.5), d13, b.fadd(x0, x4)), name="bt0"),
            vx.fma(c(-2.5), x2, vx.fma(c(-0.5), x3, b.fsub(x4, x1)), name="bt1"),
            vx.fma(c(0.5), x2, vx.fma(c(-2.5), x3, b.fadd(x1, x4)), name="bt2"),
            vx.fma(c(-0.5), d13, d42, name="bt3"), vx.fma(c(2.0), d13, d42, name="bt4"),
            vx.fma(c(-2.0), x3, vx.fma(c(-1.5), d42, b.fadd(x1, x5)), name="bt5"))


def _at_rows(vx: VecIR, xs: list) -> tuple:
    """A^T x along one axis: 4 values to 2 outputs (F(2, 3)) or 6 to 4 (F(4, 3))."""
    b, c = vx.b, vx.fconst
    if len(xs) == 4:
        x0, x1, x2, x3 = xs
        return b.fadd(b.fadd(x0, x1), x2, name="at0"), b.fsub(b.fsub(x1, x2), x3, name="at1")
    # A^T rows: [1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -1/2, 0], [0, 1, 1, 4, 1/4, 0], [0, 1, -1, 8, -1/8, 1]
    x0, x1, x2, x3, x4, x5 = xs
    s12, d12 = b.fadd(x1, x2, name="s12"), b.fsub(x1, x2, name="d12")
    return (b.fadd(b.fadd(x0, s12), b.fadd(x3, x4), name="at0"),
            vx.fma(c(2.0), x3, vx.fma(c(-0.5), x4, d12), name="at1"),
            vx.fma(c(4.0), x3, vx.fma(c(0.25), x4, s12), name="at2"),
            vx.fma(c(8.0), x3, vx.fma(c(-0.125), x4, b.fadd(d12, x5)), name="at3"))


def _wino_input(vx: VecIR, d: list[list], ah: int, aw: int) -> list:
    """B_h^T d B_w for an ah x aw patch of vectors (lanes = tiles), d[i][j]: index aw*i + j."""
    cols = [_bt_rows(vx, [d[i][j] for i in range(ah)]) for j in range(aw)]  # cols[j][i]
    return [v for i in range(ah) for v in _bt_rows(vx, [cols[j][i] for j in range(aw)])]


def _wino_output(vx: VecIR, mv: list, ah: int, aw: int) -> list:
    """A_h^T M A_w for ah*aw vectors M[aw*i + j]: the (ah-2) x (aw-2) outputs, index (aw-2)*r + c."""
    cols = [_at_rows(vx, [mv[aw * i + j] for i in range(ah)]) for j in range(aw)]  # cols[j][r]
    return [v for r in range(ah - 2) for v in _at_rows(vx, [cols[j][r] for j in range(aw)])]


def _pack_winograd(geo: _Geometry, w, bias, vw) -> list[np.ndarray]:
    """U = G_h g G_w^T as [m-block][(mh+2)(mw+2)][C][MR], zero past M: a row block's T GEMMs read one
    contiguous stream (cold weights prefetch as one stream, not T short ones). Transformed in float64 one
    m-block at a time, written straight into the float32 result (a whole-tensor float64 pass peaked at ~6x
    the weights)."""
    C, M = geo.Cg, geo.M
    mh, mw = winograd_tile(geo, vw)
    gh, gw = _WG[mh], _WG[mw]
    taps = gh.shape[0] * gw.shape[0]
    mr, _ = choose_tile(M, vw)
    mblocks = math.ceil(M / mr)
    by_product = _wino_by_product(geo, mh, mw, vw)
    out = hugepages.zeros((taps, mblocks, C, mr) if by_product else (mblocks, taps, C, mr), dtype=np.float32)
    for mb in range(mblocks):
        rows = w[mb * mr:min(M, (mb + 1) * mr)].astype(np.float64)
        u = np.einsum("ai,mcij,bj->abcm", gh, rows, gw).reshape(taps, C, rows.shape[0])
        if by_product:
            out[:, mb, :, :rows.shape[0]] = u
        else:
            out[mb, :, :, :rows.shape[0]] = u
    return [out.ravel(), bias]


# A panel's transformed input (T x C x NR floats) is read again by every row block. Where it fits
# WINO_INPUT_BYTES (L2) the GEMMs run row block by row block, all T products of one at a time. Past it they
# run product by product (`_wino_by_product`): one product's transformed input, in chunks of channels within
# WINO_PRODUCT_BYTES, stays cached while every row block streams its weights for that product (packed
# [T][m-block][C][MR] for it), the products of all row blocks kept in scratch until the last chunk. Xeon,
# 1 thread: fcn_resnet50's 2048 -> 512 head on 28x28 (98 F(2x4) tiles, 33 MB of transformed input) 90 ->
# 50 ms (2 MiB chunks 58 ms, 128 KiB 51 ms); by product, ResNet-50's 7x7 layers (0.5 MB) took 1.2-1.35x.
WINO_INPUT_BYTES = 2 << 20
WINO_PRODUCT_BYTES = 512 << 10


def _wino_by_product(geo: _Geometry, mh: int, mw: int, vw: int) -> bool:
    """Whether a panel's transformed input exceeds WINO_INPUT_BYTES: the GEMMs then run product by product."""
    return (mh + 2) * (mw + 2) * geo.Cg * _wino_panel(geo, mh, mw, vw) * 4 > WINO_INPUT_BYTES


def _wino_chunk(geo: _Geometry, nr: int) -> int:
    """Channels per chunk of the product-by-product reduction, balanced: chunk x NR floats of one product's
    transformed input within WINO_PRODUCT_BYTES (the whole C where it fits)."""
    cc = max(1, min(geo.Cg, WINO_PRODUCT_BYTES // (nr * 4)))
    return math.ceil(geo.Cg / math.ceil(geo.Cg / cc))


# Winograd on a map of at least this many panels of tiles counts as split by pixels (splits_pixels): each
# thread's units are then mostly whole panels, bands of tile rows.
WINO_PIXEL_PANELS = 8


# Where the transformed weights are streamed (not cached), each panel reads all of them: a panel then takes
# up to this many vectors of tiles, computed in register tiles of choose_tile's width, so the weights are
# read once per map rather than once per register panel (fcn_resnet50's 2048 -> 512 head on 28x28: 98
# F(2x4) tiles, 151 MB of weights, were read 4 times).
WINO_WIDE_VECTORS = 8


def _wino_panel(geo: _Geometry, mh: int, mw: int, vw: int) -> int:
    """Tiles per panel (NR): choose_tile's vectors, fewer where there are few tiles (a narrower panel
    keeps the T B panels dense, in L1); with streamed weights, all the tiles in as few panels of at most
    WINO_WIDE_VECTORS vectors as hold them."""
    vecs = math.ceil(_wino_tiles(geo, mh, mw)[2] / vw)
    if not _wino_weights_cached(geo, mh, mw):
        return math.ceil(vecs / math.ceil(vecs / WINO_WIDE_VECTORS)) * vw
    return min(choose_tile(geo.M, vw)[1], vecs) * vw


def _emit_winograd(module, name, geo: _Geometry, w, bias, activation, params, has_residual, vw) -> KernelInfo:
    """Winograd F(mh x mw, 3x3) with vectors over output tiles. Per panel of NR tiles a thread transforms the
    input into T = (mh+2)(mw+2) B panels (C x NR, gathers of the patches), then per row block of output channels
    runs the T GEMMs with the register-blocked micro-kernel (transformed weights packed [m-block][T][C][MR]
    at compile time), keeps the T results in scratch, and transforms them back to mh x mw pixels per tile
    with bias, residual and activation (scatter into NCHW). Where a panel's transformed input exceeds
    WINO_INPUT_BYTES the GEMMs run product by product instead (weights packed [T][m-block][C][MR]), per
    chunk of channels, the products of every row block kept in scratch and transformed back after the last
    chunk."""
    C, M = geo.Cg, geo.M
    mh, mw = winograd_tile(geo, vw)
    ah, aw = mh + 2, mw + 2
    T = ah * aw
    th, tw, tiles = _wino_tiles(geo, mh, mw)
    d = geo.dh
    mr, nvt = choose_tile(M, vw)  # the register tile: MR rows x NVT vectors of tiles
    nr = _wino_panel(geo, mh, mw, vw)
    nv = nr // vw
    nvt = min(nvt, nv)
    mblocks, mfull = math.ceil(M / mr), M // mr
    nblocks, nfull = math.ceil(tiles / nr), tiles // nr
    t_edge = tiles - nfull * nr

    packed = _pack_winograd(geo, w, bias, vw)
    by_product = _wino_by_product(geo, mh, mw, vw)
    cc = _wino_chunk(geo, nr) if by_product else C
    vbuf_floats = T * cc * nr
    # one row block's T products, or by product every row block's
    mbuf_floats = T * mr * nr * (mblocks if by_product else 1)
    scratch_bytes = (vbuf_floats + mbuf_floats) * 4 + 64

    fn = kernel_function(module, name, len(packed))
    out_p, x_p, res_p, scratch_p, w_p, bias_p = fn.args[:6]
    tid, nthreads = fn.args[-2:]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vx = VecIR(module, b, vw)
    raw = b.ptrtoint(scratch_p, I64, name="scratch.addr")
    up_ = b.add(raw, ir.Constant(I64, 63), name="scratch.up")
    vbuf = b.inttoptr(b.and_(up_, ir.Constant(I64, ~63), name="scratch.al"), PTR, name="vpanels")
    mbuf = vx.gep(vbuf, vbuf_floats, name="products")
    # Balanced by compute where the transformed weights stay cached (ResNet-50's 28x28 maps: 3 full panels
    # of F(2x4) tiles and one of 2 tiles); else every panel streams all the weights, a narrow one as long as
    # a full one, so by count (fcn_resnet50's 2048 -> 512 head, 151 MB of weights: 3% slower by compute)
    if _wino_weights_cached(geo, mh, mw):
        lo, hi = _cost_range(b, tid, nthreads, images=geo.N, panels=nblocks, mblocks=mblocks, full_cost=nv,
                             edge_cost=math.ceil(t_edge / vw) if t_edge else nv)
    else:
        lo, hi = U.thread_range(vx.b, geo.N * nblocks * mblocks, tid, nthreads, "unit")

    def do_panel(panel, mb_lo, mb_hi) -> None:
        nb = b.urem(panel, ir.Constant(I64, nblocks), name="nb")
        img = b.udiv(panel, ir.Constant(I64, nblocks), name="img")
        x_img = vx.gep(x_p, vx.off((img, C * geo.HW)), name="x.img")
        out_img = vx.gep(out_p, vx.off((img, M * geo.P)), name="out.img")
        res_img = vx.gep(res_p, vx.off((img, M * geo.P)), name="res.img") if has_residual else None
        t0 = b.trunc(b.mul(nb, ir.Constant(I64, nr)), I32, name="t0")

        def run(nvec: int, last_lanes: int) -> None:
            t0v = vx.splat(t0, name="t0v")
            # per vector: the patch origin's input index, T tap masks; the output index, mh*mw output masks.
            # A tap's gather is the origin index from the plane shifted by the tap's constant offset.
            origin, tapmask, opix, outmask = [], [], [], []
            for v in range(nvec):
                t = b.add(t0v, b.add(vx.iota, vx.iconst(v * vw)), name=f"tile{v}")
                if d == 1:
                    ty = b.udiv(t, vx.iconst(tw), name="ty")
                    tx = b.urem(t, vx.iconst(tw), name="tx")
                    oy = b.mul(ty, vx.iconst(mh), name="oy")
                    ox = b.mul(tx, vx.iconst(mw), name="ox")
                else:  # tile t of sub-map (a, c) = divmod(t // (th * tw), d): outputs and inputs d apart
                    sub = b.udiv(t, vx.iconst(th * tw), name="sub")
                    rem = b.urem(t, vx.iconst(th * tw), name="subtile")
                    oy = b.add(b.udiv(sub, vx.iconst(d)), b.mul(b.udiv(rem, vx.iconst(tw)), vx.iconst(d * mh)),
                               name="oy")
                    ox = b.add(b.urem(sub, vx.iconst(d)), b.mul(b.urem(rem, vx.iconst(tw)), vx.iconst(d * mw)),
                               name="ox")
                live = vx.lane_mask(last_lanes) if (last_lanes and v == nvec - 1) else None
                oky = [b.icmp_unsigned("<", b.add(oy, vx.iconst(i * d - geo.pt)), vx.iconst(geo.H), name="oky")
                       for i in range(ah)]
                okx = [b.icmp_unsigned("<", b.add(ox, vx.iconst(j * d - geo.pl)), vx.iconst(geo.W), name="okx")
                       for j in range(aw)]
                if live is not None:
                    oky = [b.and_(ok, live, name="inpanel") for ok in oky]
                tapmask.append([b.and_(oky[i], okx[j], name="inimg") for i in range(ah) for j in range(aw)])
                origin.append(b.add(b.mul(oy, vx.iconst(geo.W)), ox, name="pidx"))
                oka = [b.icmp_unsigned("<", b.add(oy, vx.iconst(r * d)), vx.iconst(geo.OH), name="oka")
                       for r in range(mh)]
                okc = [b.icmp_unsigned("<", b.add(ox, vx.iconst(c_ * d)), vx.iconst(geo.OW), name="okc")
                       for c_ in range(mw)]
                if live is not None:
                    oka = [b.and_(ok, live, name="inpanel") for ok in oka]
                outmask.append([b.and_(oka[r], okc[c_], name="inout") for r in range(mh) for c_ in range(mw)])
                opix.append(b.add(b.mul(oy, vx.iconst(geo.OW)), ox, name="oidx"))

            def products(mb):
                """Row block mb's T products, [xi][MR][NR]."""
                return vx.gep(mbuf, vx.off((mb, T * mr * nr))) if by_product else mbuf

            def chunk(c0, ncc, first, last) -> None:
                """Channels [c0, c0 + ncc): the input transform into V, then every row block's T GEMMs,
                starting from the products of the chunks before (row block by row block, the last chunk
                transforms them out; product by product, the panel does after its last chunk)."""
                # input transform: V[xi][c][tile] into T panels of ncc x NR (xi stride cc * NR)
                lp = Loop(vx, "wino.c", 0, ncc)
                plane = vx.gep(x_img, vx.off((vx.off(c0, lp.i), geo.HW)), name="plane")
                for v in range(nvec):
                    pat = [[vx.gather(vx.gep(plane, (i * d - geo.pt) * geo.W + j * d - geo.pl), origin[v],
                                      tapmask[v][aw * i + j], name=f"d{i}{j}") for j in range(aw)]
                           for i in range(ah)]
                    for xi, val in enumerate(_wino_input(vx, pat, ah, aw)):
                        vx.store(val, vx.gep(vbuf, vx.off((lp.i, nr), xi * cc * nr + v * vw)))
                lp.close()

                def gemms(mb, edge: bool, xi) -> None:
                    """Row block mb's product xi over this chunk, for every register tile of the panel
                    (each reads the same row block of weights)."""
                    rows = M - mfull * mr if edge else mr
                    at = ((xi, mblocks * C * mr), (mb, C * mr)) if by_product else ((mb, T * C * mr), (xi, C * mr))
                    a_ptr = vx.gep(w_p, vx.off(*at, (c0, mr)), name="uxi")
                    for v0 in range(0, nvec, nvt):
                        nvs = min(nvt, nvec - v0)
                        b_ptr = vx.gep(vbuf, vx.off((xi, cc * nr), v0 * vw), name="vxi")
                        mrow = vx.gep(products(mb), vx.off((xi, mr * nr), v0 * vw), name="mxi")
                        flat = choose(vx, first, lambda n=nvs: [vx.zero] * (rows * n),
                                      lambda p=mrow, n=nvs: [vx.load(vx.gep(p, r * nr + v * vw), name="part")
                                                             for r in range(rows) for v in range(n)])
                        acc = emit_tile(vx, mr=rows, nv=nvs, kc=ncc, a_ptr=a_ptr, a_rs=1, a_ks=mr, b_ptr=b_ptr,
                                        b_ks=nr, init=[flat[r * nvs:(r + 1) * nvs] for r in range(rows)],
                                        a_prefetch=WINO_PREFETCH_FLOATS, name="wino")
                        for r in range(rows):
                            for v in range(nvs):
                                vx.store(acc[r][v], vx.gep(mrow, r * nr + v * vw))

                if by_product:
                    # product-major: each product's transformed input stays cached while every row block
                    # streams its weights for that product
                    xl = Loop(vx, "wino.xi", 0, T)
                    block_loop(vx, lo=mb_lo, hi=mb_hi, blocks=mblocks, full=mfull,
                               body=lambda mb, edge: gemms(mb, edge, xl.i))
                    xl.close()
                    return

                def tile(mb, edge: bool) -> None:
                    # the T GEMMs, one runtime loop so the micro-kernel is emitted once
                    xl = Loop(vx, "wino.xi", 0, T)
                    gemms(mb, edge, xl.i)
                    xl.close()
                    when(vx, last, lambda: out_transform(mb, edge), lambda: None)

                block_loop(vx, lo=mb_lo, hi=mb_hi, blocks=mblocks, full=mfull, body=tile)

            def out_transform(mb, edge: bool) -> None:
                """Row block mb's products to mh x mw pixels per tile, with bias, residual and activation."""
                rows = M - mfull * mr if edge else mr
                mb_products = products(mb)
                # output transform, one channel row at a time (a runtime loop keeps the code small)
                m0 = b.mul(mb, ir.Constant(I64, mr), name="m0")
                rl = Loop(vx, "wino.r", 0, rows)
                chan = b.add(m0, rl.i, name="chan")
                bias_v = vx.load_splat(vx.gep(bias_p, chan), name="bias")
                orow = vx.gep(out_img, vx.off((chan, geo.P)), name="orow")
                rrow = vx.gep(res_img, vx.off((chan, geo.P)), name="rrow") if has_residual else None
                mrow = vx.gep(mb_products, vx.off((rl.i, nr)), name="mrow")
                for v in range(nvec):
                    mv = [vx.load(vx.gep(mrow, xi * mr * nr + v * vw), name="mv") for xi in range(T)]
                    for k, y in enumerate(_wino_output(vx, mv, ah, aw)):
                        shift = (k // mw) * d * geo.OW + (k % mw) * d
                        ok = outmask[v][k]
                        val = vx.fadd(y, bias_v)
                        if has_residual:
                            val = vx.fadd(val, vx.gather(vx.gep(rrow, shift), opix[v], ok, name="res"))
                        val = vx.activation(val, activation, params)
                        vx.scatter(val, vx.ptrs(vx.gep(orow, shift), opix[v], name="outp"), ok)
                rl.close()

            chunk_loop(vx, C, cc, chunk)
            if by_product:
                block_loop(vx, lo=mb_lo, hi=mb_hi, blocks=mblocks, full=mfull, body=out_transform)

        full_or_edge_panel(b, nb, nfull=nfull, edge=t_edge, nv=nv, vw=vw, run=run)

    panel_walk(vx, lo=lo, hi=hi, mblocks=mblocks, body=do_panel)
    b.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch_bytes)
