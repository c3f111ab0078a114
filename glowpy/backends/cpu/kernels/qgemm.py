"""int8 matrix products and convolutions (QLinearConv, ConvInteger, QLinearMatMul, MatMulInteger) with
int32 accumulation and requantization fused in the epilogue, bit-equal with ir/ops/quant.py.

Every product is one shape: out[r, p] = sum_k (x[k, p] - xz) * (w[r, k] - wz[r]) for R weight rows
(output channels of a group; columns of a matmul's B) and P activation columns (output pixels; rows
of a matmul's A). The activations are the unsigned vector operand, the weights the signed broadcast
operand: int8 activations are flipped to uint8 (x ^ 0x80, zero point + 128) and uint8 weights to int8
(w - 128, zero point - 128) at no cost to exactness. Per thread and column panel of NR = NV * VW
columns, the activations are packed into scratch as [K/4][NR][4] bytes; weights are packed at compile
time as [R/MR][K/4][MR][4]. The micro-kernel keeps MR x NV int32 vectors and per 4-byte k-group issues:

- AVX-512 VNNI: one `vpdpbusd` per (row, vector);
- otherwise (AVX2, AVX-512 without VNNI): bytes widened to int16 and `pmaddwd` (exact: a pair of
  u8 * s8 products fits int32; `pmaddubsw` would saturate int16). Each vector then keeps two int32
  halves holding pair sums, added once in the epilogue.

With VNNI, few columns against many rows (transposed_tile: a 7x7 map's 49 columns, a matrix-vector
product's 1) swap the roles: the weights, packed with MR = NV * VW, are the vectors (rows on lanes), the
panel of all P columns the broadcast operand, and results leave through a small tile in scratch.

Packing is vector code (four rows of VW bytes interleaved by shuffles) wherever row k of the im2col is
a contiguous run x[ktab[k] + p]: a 1x1 stride-1 convolution as it is, any other convolution over its
input padded with the zero point and split into the stride phases its taps read (emit_qpad), the
product's column p = (oh, ow) reading row oh of that plane, a vector's lanes from up to one load per
output row they span (QProduct.rows). The matrix products pack from offset tables (matmul_tables).
Depthwise convolutions have their own kernel (emit_qdepthwise); operands known only at run time,
plain loops (emit_q*_runtime).

The zero points fold into per-row constants at pack time: sum (x - xz)(w - wz) = sum x w + c[r]
- wz[r] * colsum(x), c[r] = bias[r] - xz * sum_k w[r] + K * xz * wz[r]; colsum (one more pass of
the same instruction against ones) only when some wz is not 0. Requantization: float(acc) * multiplier
in float32 (or float64), round half to even, + y_zero_point, saturate; relu as max with y_zero_point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.steps import NULL, SCRATCH, Step
from glowpy.backends.cpu.target import host_target
from glowpy.errors import UnsupportedOperator, UnsupportedShape
from glowpy.ir.graph import Node, Value
from glowpy.ir.types import TensorType

from .common import KernelInfo

if TYPE_CHECKING:
    from glowpy.backends.cpu.lowering import Lowering

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()


@dataclass(frozen=True)
class QProduct:
    """The shape of one int8 product (see the module docstring); offsets in elements."""

    units: int  # independent (batch, group) products
    R: int  # weight rows per unit
    K: int  # reduction length
    P: int  # activation columns per unit
    x_unit: tuple[int, int]  # x offset of unit u: (u // groups) * a + (u % groups) * b
    groups: int
    out_unit: tuple[int, int]  # out offset of unit u, same form
    out_rs: int  # out stride between rows r
    out_ps: int  # out stride between columns p (1: vector stores)
    H: int  # bounds of the im2col rows (1 for a matmul)
    W: int
    x_unsigned: bool
    out_kind: str  # "i32" (accumulator) or "u8" / "i8" (requantized)
    float64: bool = False
    relu: bool = False
    dense: bool = False  # im2col row k is x[ktab[k] + p]: vector packing
    # (OW, J, OH) with J > 0: x[ktab[k] + p + (p // OW) * J] instead, p < OH * OW (output rows of OW
    # pixels over input rows of OW + J: a padded convolution's plane); reads past P stay in row OH - 1
    rows: tuple[int, int, int] = (0, 0, 0)


def _vnni(vw: int) -> bool:
    return vw == 16 and host_target().has("avx512vnni")


def choose_tile(rows: int, cols: int, vw: int) -> tuple[int, int]:
    """(MR, NV): the register block with the least padded work (rows to MR, columns to whole vectors:
    the last panel has only the vectors its columns need), weighted by its load overhead per multiply
    (1/MR + 1/NV). VNNI keeps MR * NV accumulators (of 32 registers), pmaddwd twice that (two halves
    per vector)."""
    if _vnni(vw):
        cands = ((8, 3), (6, 4), (4, 6))
    elif vw == 16:
        cands = ((6, 2), (4, 3))
    else:  # 16 registers: 6 x 2 accumulator halves, 2 widened x halves and the weights
        cands = ((6, 1),)

    def cost(c: tuple[int, int]) -> float:
        mr, nv = min(c[0], rows), c[1]
        padded = -(-rows // mr) * mr * -(-cols // vw) * vw
        return padded * (1 + 0.5 * (1 / mr + 1 / nv))

    mr, nv = min(cands, key=cost)
    return max(1, min(mr, rows)), nv


def transposed_tile(rows: int, cols: int, K: int, vw: int) -> tuple[int, int] | None:
    """(MC, NV) when few columns fit the vectors badly (ResNet's 7x7 maps: 49 of 64 lanes; a matrix-vector
    product: 1 of 16) and VNNI can swap the roles: weight rows in NV vectors, MC activation columns
    broadcast, no column padding; results leave through a small tile in scratch (2 moves per element,
    against K/64 dot-product steps). None: choose_tile's layout is cheaper."""
    if not _vnni(vw) or cols > 4 * vw:
        return None
    mr, nv = choose_tile(rows, cols, vw)
    normal = -(-rows // mr) * mr * -(-cols // vw) * vw * (1 + 0.5 * (1 / mr + 1 / nv))
    best = None
    for mc, nvr in ((7, 3), (8, 3), (6, 4)):  # MC * NV accumulators, NV weight vectors, one broadcast
        mc = min(mc, cols)
        rem = cols % mc  # a last block of fewer columns, at a further loop's cost
        per_row = (cols - rem) * (1 + 0.5 * (1 / mc + 1 / nvr)) + (
            rem * (1 + 0.5 * (1 / rem + 1 / nvr)) + 0.5 * mc if rem else 0)
        cost = -(-rows // vw) * vw * per_row * (1 + 64 / max(K, 1))
        if cost < normal and (best is None or cost < best[0]):
            best = (cost, mc, nvr)
    return None if best is None else best[1:]


def pack_weights(w: np.ndarray, wz: np.ndarray, bias: np.ndarray | None, xz: int, units_g: int,
                 mr: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """w (G, R, K) int8 / uint8 -> ([G][R/MR][K/4][MR][4] int8, per-row constants c (G*Rp) int32,
    per-row weight zero points (G*Rp) int32, any zero point not 0). xz is the (flipped) activation zp."""
    G, R, K = w.shape
    wi = w.astype(np.int64)
    wzi = np.broadcast_to(wz.astype(np.int64).reshape(-1, 1) if wz.size > 1 else wz.astype(np.int64).reshape(()),
                          (G * R, 1)).reshape(G, R)
    if w.dtype == np.uint8:
        wi, wzi = wi - 128, wzi - 128
    rb = -(-R // mr)
    kg = -(-K // 4)
    packed = np.zeros((G, rb * mr, kg * 4), np.int8)
    packed[:, :R, :K] = wi.astype(np.int8)
    packed = packed.reshape(G, rb, mr, kg, 4).transpose(0, 1, 3, 2, 4)
    b = np.zeros((G, R), np.int64) if bias is None else bias.astype(np.int64).reshape(G, R)
    c = b - xz * wi.sum(axis=2) + K * xz * wzi
    cp = np.zeros((G, rb * mr), np.int64)
    cp[:, :R] = c
    zp = np.zeros((G, rb * mr), np.int64)
    zp[:, :R] = wzi
    wrap = lambda a: (a & 0xFFFFFFFF).astype(np.uint32).view(np.int32)  # noqa: E731 (int32 wraps as ONNX allows)
    return np.ascontiguousarray(packed).ravel(), wrap(cp).ravel(), wrap(zp).ravel(), bool(np.any(wzi != 0))


def emit_qproduct(module: ir.Module, name: str, *, spec: QProduct, w: np.ndarray, wz: np.ndarray,
                  bias: np.ndarray | None, xz: int, k_tables: np.ndarray, p_tables: np.ndarray,
                  mult: np.ndarray | None, yz: int, vector_width: int) -> KernelInfo:
    """The kernel `void name(out, x, scratch, wpack, rowc, rowzp, ktab, ptab[, mult], tid, nthreads)`.

    w: (groups, R, K); k_tables (3, K) int32: x offset, row and column displacement of reduction
    element k; p_tables (3, P) int32: x offset, first row and first column of column p (the bounds
    check is 0 <= row < H and 0 <= col < W). mult: per weight row (groups * R) multipliers.
    """
    vw = vector_width
    vnni = _vnni(vw)
    R, K, P = spec.R, spec.K, spec.P
    tt = transposed_tile(R, P, K, vw)
    if tt is None:
        mr, nv = choose_tile(R, P, vw)
        nr = nv * vw
    else:  # mr: weight rows per block (nv vectors); the panel holds all P columns
        mr, nr = tt[1] * vw, -(-P // vw) * vw
    kg = -(-K // 4)
    rb = -(-R // mr)
    rfull = R // mr
    npanels = -(-P // nr)
    xz_u = xz if spec.x_unsigned else xz + 128  # the activation zero point as uint8
    wpack, rowc, rowzp, need_colsum = pack_weights(w, wz, bias, xz_u, spec.groups, mr)
    quant = spec.out_kind != "i32"
    ft = F64 if spec.float64 else F32
    packed = [wpack, rowc, rowzp, np.ascontiguousarray(k_tables, np.int32).ravel(),
              np.ascontiguousarray(p_tables, np.int32).ravel()]
    if quant:
        mp = np.zeros((spec.groups, rb * mr), np.float64 if spec.float64 else np.float32)
        mp[:, :R] = np.asarray(mult).reshape(spec.groups, R)
        packed.append(mp.ravel())
    if spec.units * max(R, 1) * max(P, 1) * max(K, 1) >= 1 << 62 or kg * nr * 4 >= 1 << 31:
        raise UnsupportedShape("int8 product too large", found=(spec.units, R, K, P))
    panel_bytes = kg * nr * 4
    tile_bytes = 0 if tt is None else tt[0] * mr * 4
    scratch = panel_bytes + nr * 4 + tile_bytes + 128

    params = [("out", PTR), ("x", PTR), ("scratch", PTR), ("wpack", PTR), ("rowc", PTR), ("rowzp", PTR),
              ("ktab", PTR), ("ptab", PTR)] + ([("mult", PTR)] if quant else []) + [("tid", I32), ("nthreads", I32)]
    fn, b = U.new_function(module, name, params, internal=False)
    args = {a.name: a for a in fn.args}
    for a in fn.args[1:-2]:
        a.add_attribute("noalias")
    fn.attributes.add("nounwind")
    g = _Gen(b, module, vw, vnni)

    raw = b.ptrtoint(args["scratch"], I64)
    al = b.and_(b.add(raw, U.i64(63)), U.i64(~63))
    panel = b.inttoptr(al, PTR, name="panel")
    colsum = b.gep(panel, [U.i64(panel_bytes)], source_etype=I8, name="colsum")
    if tt is not None:
        _transposed_body(g, spec, args, panel, colsum, b.gep(colsum, [U.i64(nr * 4)], source_etype=I8),
                         mc=tt[0], mr=mr, nr=nr, kg=kg, rb=rb, need_colsum=need_colsum, quant=quant, ft=ft, yz=yz,
                         xz_u=xz_u)
        b.ret_void()
        return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch)
    lo, hi = U.thread_range(b, spec.units * npanels, args["tid"], args["nthreads"], "unit")

    with U.for_range(b, lo, hi, "u") as u:
        pn, grp, xbase, obase = _unit_of(b, spec, u, npanels)
        p0 = b.mul(pn, U.i64(nr), name="p0")
        ncols = b.sub(U.i64(P), p0, name="ncols")  # valid columns from p0 (may exceed nr)

        def panel_body(nv: int) -> None:
            _pack(g, spec, args, panel, colsum, xbase, p0, nv, kg, xz_u, need_colsum)

            def block(rbi, rows: int) -> None:
                wrow = b.add(b.mul(grp, U.i64(rb)), rbi, name="wrow")  # row block index in [G][RB]
                wptr = b.gep(args["wpack"], [b.mul(wrow, U.i64(kg * mr * 4))], source_etype=I8, name="wblk")
                acc = _kloop(g, panel, wptr, kg, nv * vw, rows, nv, "mk", mr=mr)
                r0 = b.add(b.mul(grp, U.i64(rb * mr)), b.mul(rbi, U.i64(mr)), name="r0")  # into rowc / mult
                rloc = b.mul(rbi, U.i64(mr), name="rloc")
                for r in range(rows):
                    ri = b.add(r0, U.i64(r))
                    c = g.splat32(b.load(b.gep(args["rowc"], [ri], source_etype=I32), typ=I32))
                    zpr = g.splat32(b.load(b.gep(args["rowzp"], [ri], source_etype=I32), typ=I32)) if need_colsum else None
                    m = None
                    if quant:
                        m = g.splat(b.load(b.gep(args["mult"], [ri], source_etype=ft), typ=ft), ft)
                    orow = b.add(obase, b.mul(b.add(rloc, U.i64(r)), U.i64(spec.out_rs)), name="orow")
                    for v in range(nv):
                        t = b.add(g.finish(acc[r][v]), c)
                        if need_colsum:
                            cs = b.load(b.gep(colsum, [U.i64(v * vw * 4)], source_etype=I8), typ=g.i32v, align=4)
                            t = b.sub(t, b.mul(zpr, cs))
                        _store_out(g, spec, args["out"], orow, p0, v, ncols, t, m, yz, ft)

            rloop = U.for_range(b, 0, rfull, "rb") if rfull else None
            if rloop is not None:
                with rloop as rbi:
                    block(rbi, mr)
            if R % mr:
                block(U.i64(rfull), R % mr)

        # the last panel with as many vectors as its columns need (the rest of P, not a whole nr)
        _last_narrower(b, pn, npanels, nv, -(-(P - (npanels - 1) * nr) // vw), panel_body)
    b.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch)


def _last_narrower(b: ir.IRBuilder, index, count: int, nv: int, nv_last: int, emit) -> None:
    """emit(nv) for blocks 0 .. count - 2 and emit(nv_last) for the last one (one body when equal)."""
    if nv_last >= nv:
        emit(nv)
        return
    with b.if_else(b.icmp_unsigned("==", index, U.i64(count - 1))) as (last, other):
        with last:
            emit(nv_last)
        with other:
            emit(nv)


def _unit_of(b: ir.IRBuilder, spec: QProduct, item, per_unit: int):
    """(index within the unit, group, x offset, out offset) of work item `item` of `per_unit` per unit."""
    unit = b.udiv(item, U.i64(per_unit), name="unit")
    grp = b.urem(unit, U.i64(spec.groups), name="grp")
    img = b.udiv(unit, U.i64(spec.groups), name="img")
    xbase = b.add(b.mul(img, U.i64(spec.x_unit[0])), b.mul(grp, U.i64(spec.x_unit[1])), name="xbase")
    obase = b.add(b.mul(img, U.i64(spec.out_unit[0])), b.mul(grp, U.i64(spec.out_unit[1])), name="obase")
    return b.urem(item, U.i64(per_unit)), grp, xbase, obase


def _pack(g: _Gen, spec: QProduct, args: dict, panel, colsum, xbase, p0, nv: int, kg: int, xz_u: int,
          need_colsum: bool) -> None:
    """The panel of nv vectors of columns from p0, and its column sums when some wz is not 0."""
    b, vw = g.b, g.vw
    if spec.dense:
        _pack_dense(g, spec, args["x"], args["ktab"], panel, xbase, p0, nv, kg)
    else:
        _pack_panel(b, spec, args, panel, xbase, p0, nv * vw, kg, xz_u)
    if need_colsum:
        sums = _kloop(g, panel, None, kg, nv * vw, 1, nv, "cs", ones_w=True)
        for v in range(nv):
            b.store(g.finish(sums[0][v]), b.gep(colsum, [U.i64(v * vw * 4)], source_etype=I8), align=4)


def _transposed_body(g: _Gen, spec: QProduct, args: dict, panel, colsum, tile, *, mc: int, mr: int, nr: int,
                     kg: int, rb: int, need_colsum: bool, quant: bool, ft, yz: int, xz_u: int) -> None:
    """emit_qproduct with transposed_tile's roles: per (unit, block of mr weight rows), MC columns at a
    time into acc[c][v] (rows on lanes), requantized into tile[c][row], then copied row by row to out."""
    b, vw = g.b, g.vw
    R, P = spec.R, spec.P
    lo, hi = U.thread_range(b, spec.units * rb, args["tid"], args["nthreads"], "item")
    with U.for_range(b, lo, hi, "it") as it:
        rbi, grp, xbase, obase = _unit_of(b, spec, it, rb)
        # the panel of all P columns, once per unit (a thread's first item may start mid-unit)
        with U.if_then(b, b.or_(b.icmp_unsigned("==", it, lo), b.icmp_unsigned("==", rbi, U.i64(0))), "tpack"):
            _pack(g, spec, args, panel, colsum, xbase, U.i64(0), nr // vw, kg, xz_u, need_colsum)
        r0 = b.add(b.mul(grp, U.i64(rb * mr)), b.mul(rbi, U.i64(mr)), name="r0")  # into rowc / rowzp / mult
        rloc = b.mul(rbi, U.i64(mr), name="rloc")
        nrows = b.sub(U.i64(R), rloc)
        nrows = b.select(b.icmp_signed("<", nrows, U.i64(mr)), nrows, U.i64(mr), name="nrows")
        wptr = b.gep(args["wpack"], [b.mul(b.add(b.mul(grp, U.i64(rb)), rbi), U.i64(kg * mr * 4))], source_etype=I8)

        def vec(name: str, t, v: int):
            return b.load(b.gep(args[name], [b.add(r0, U.i64(v * vw))], source_etype=t), typ=ir.VectorType(t, vw),
                          align=4)

        def rblock(nv: int) -> None:
            cv = [vec("rowc", I32, v) for v in range(nv)]
            zv = [vec("rowzp", I32, v) for v in range(nv)] if need_colsum else None
            mv = [vec("mult", ft, v) for v in range(nv)] if quant else [None] * nv

            def cblock(c0, cols: int) -> None:
                acc = _kloop(g, panel, wptr, kg, nr, cols, nv, "tk", mr=mr, col0=c0)
                et = I32
                for c in range(cols):
                    cs = None
                    if need_colsum:
                        cs = g.splat32(b.load(b.gep(colsum, [b.mul(b.add(c0, U.i64(c)), U.i64(4))], source_etype=I8),
                                              typ=I32, align=4))
                    for v in range(nv):
                        t = b.add(acc[c][v][0], cv[v])
                        if cs is not None:
                            t = b.sub(t, b.mul(zv[v], cs))
                        val, et = _requant(g, spec, t, mv[v], yz, ft)
                        b.store(val, b.gep(tile, [U.i64(c * mr + v * vw)], source_etype=et), align=1)
                with U.for_range(b, 0, nrows, "trow") as r:
                    orow = b.add(obase, b.mul(b.add(rloc, r), U.i64(spec.out_rs)))
                    for c in range(cols):
                        e = b.load(b.gep(tile, [b.add(r, U.i64(c * mr))], source_etype=et), typ=et)
                        at = b.add(orow, b.mul(b.add(c0, U.i64(c)), U.i64(spec.out_ps)))
                        b.store(e, b.gep(args["out"], [at], source_etype=et))

            full = P // mc
            if full:
                with U.for_range(b, 0, full, "cb") as cb:
                    cblock(b.mul(cb, U.i64(mc)), mc)
            if P % mc:
                cblock(U.i64(full * mc), P % mc)

        # the last row block with the vectors its rows need
        _last_narrower(b, rbi, rb, mr // vw, -(-(R - (rb - 1) * mr) // vw), rblock)


class _Gen:
    """Vector types and the dot-product step of one instruction set."""

    def __init__(self, b: ir.IRBuilder, module: ir.Module, vw: int, vnni: bool) -> None:
        self.b, self.m, self.vw, self.vnni = b, module, vw, vnni
        self.i32v = ir.VectorType(I32, vw)
        self.bytes = ir.VectorType(I8, 4 * vw)
        self.zero = ir.Constant(self.i32v, [0] * vw)

    def splat32(self, s):
        return self.splat(s, I32)

    def splat(self, s, t):
        vt = ir.VectorType(t, self.vw)
        one = self.b.insert_element(ir.Constant(vt, ir.Undefined), s, U.i32(0))
        return self.b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), ir.Constant(self.i32v, [0] * self.vw))

    def init(self) -> list:
        """Zero accumulator state of one (row, vector)."""
        return [self.zero] if self.vnni else [self.zero, self.zero]

    def widen_x(self, xb):
        """The vector operand in the form step() takes (pmaddwd: two int16 halves)."""
        if self.vnni:
            return self.b.bitcast(xb, self.i32v)
        x16 = self.b.zext(xb, ir.VectorType(I16, 4 * self.vw))
        idx = list(range(4 * self.vw))
        lo = self.b.shuffle_vector(x16, x16, ir.Constant(ir.VectorType(I32, 2 * self.vw), idx[:2 * self.vw]))
        hi = self.b.shuffle_vector(x16, x16, ir.Constant(ir.VectorType(I32, 2 * self.vw), idx[2 * self.vw:]))
        return [lo, hi]

    def widen_w(self, w4):
        """A broadcast 4-byte weight group (i32 holding 4 int8) in step()'s form."""
        if self.vnni:
            return self.splat32(w4)
        v4 = self.b.bitcast(w4, ir.VectorType(I8, 4))
        w16 = self.b.sext(v4, ir.VectorType(I16, 4))
        return self.b.shuffle_vector(w16, w16, ir.Constant(ir.VectorType(I32, 2 * self.vw),
                                                           [i % 4 for i in range(2 * self.vw)]))

    def step(self, acc: list, x, w) -> list:
        if self.vnni:
            fn = U.declare(self.m, "llvm.x86.avx512.vpdpbusd.512", self.i32v, [self.i32v] * 3)
            return [self.b.call(fn, [acc[0], x, w])]
        h16 = ir.VectorType(I16, 2 * self.vw)
        name = "llvm.x86.avx512.pmaddw.d.512" if self.vw == 16 else "llvm.x86.avx2.pmadd.wd"
        fn = U.declare(self.m, name, self.i32v, [h16, h16])
        return [self.b.add(acc[0], self.b.call(fn, [x[0], w])), self.b.add(acc[1], self.b.call(fn, [x[1], w]))]

    def finish(self, acc: list):
        """The per-column int32 sums of an accumulator state."""
        if self.vnni:
            return acc[0]
        ev = ir.Constant(self.i32v, [2 * i for i in range(self.vw)])
        od = ir.Constant(self.i32v, [2 * i + 1 for i in range(self.vw)])
        return self.b.add(self.b.shuffle_vector(acc[0], acc[1], ev), self.b.shuffle_vector(acc[0], acc[1], od))


def _kloop(g: _Gen, panel, wptr, kg: int, nr: int, rows: int, nv: int, name: str, *,
           mr: int = 1, ones_w: bool = False, col0=None) -> list[list[list]]:
    """acc[r][v] over all k-groups: weights at wptr + (kgi * mr + r) * 4 (or all ones: column sums).
    With col0 (VNNI only) the roles swap: acc[c][v] sums panel column col0 + c (broadcast) against the
    weight rows v * VW.. of the block (vectors at wptr + (kgi * mr + v * VW) * 4)."""
    b = g.b
    if col0 is not None:
        return _kloop_t(g, panel, wptr, kg, nr, rows, nv, name, mr, col0)
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(I64, f"{name}.k")
    k.add_incoming(U.i64(0), pre)
    states = []
    for _r in range(rows):
        row = []
        for _v in range(nv):
            st = []
            for z in g.init():
                phi = b.phi(z.type, f"{name}.acc")
                phi.add_incoming(z, pre)
                st.append(phi)
            row.append(st)
        states.append(row)
    b.cbranch(b.icmp_signed("<", k, U.i64(kg)), body, done)
    b.position_at_end(body)
    xrow = b.gep(panel, [b.mul(k, U.i64(nr * 4))], source_etype=I8)
    xs = [g.widen_x(b.load(b.gep(xrow, [U.i64(v * g.vw * 4)], source_etype=I8), typ=g.bytes, align=64))
          for v in range(nv)]
    new = []
    for r in range(rows):
        if ones_w:
            wv = g.widen_w(ir.Constant(I32, 0x01010101))
        else:
            wv = g.widen_w(b.load(b.gep(wptr, [b.add(b.mul(k, U.i64(mr * 4)), U.i64(r * 4))], source_etype=I8),
                                  typ=I32, align=4))
        new.append([g.step(states[r][v], xs[v], wv) for v in range(nv)])
    nxt = b.add(k, U.i64(1))
    k.add_incoming(nxt, b.block)
    for r in range(rows):
        for v in range(nv):
            for phi, val in zip(states[r][v], new[r][v]):
                phi.add_incoming(val, b.block)
    b.branch(head)
    b.position_at_end(done)
    return states


def _kloop_t(g: _Gen, panel, wptr, kg: int, nr: int, cols: int, nv: int, name: str, mr: int, col0):
    b = g.b
    pre = b.block
    head, body, done = (b.append_basic_block(f"{name}.{t}") for t in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(I64, f"{name}.k")
    k.add_incoming(U.i64(0), pre)
    states = [[b.phi(g.i32v, f"{name}.acc") for _v in range(nv)] for _c in range(cols)]
    for row in states:
        for phi in row:
            phi.add_incoming(g.zero, pre)
    b.cbranch(b.icmp_signed("<", k, U.i64(kg)), body, done)
    b.position_at_end(body)
    wrow = b.gep(wptr, [b.mul(k, U.i64(mr * 4))], source_etype=I8)
    ws = [b.load(b.gep(wrow, [U.i64(v * g.vw * 4)], source_etype=I8), typ=g.i32v, align=4) for v in range(nv)]
    xrow = b.gep(panel, [b.mul(b.add(b.mul(k, U.i64(nr)), col0), U.i64(4))], source_etype=I8)
    new = []
    for c in range(cols):
        xc = g.splat32(b.load(b.gep(xrow, [U.i64(c * 4)], source_etype=I8), typ=I32, align=4))
        new.append([g.step([states[c][v]], xc, ws[v])[0] for v in range(nv)])
    k.add_incoming(b.add(k, U.i64(1)), b.block)
    for c in range(cols):
        for v in range(nv):
            states[c][v].add_incoming(new[c][v], b.block)
    b.branch(head)
    b.position_at_end(done)
    return [[[st] for st in row] for row in states]


def _pack_panel(b: ir.IRBuilder, spec: QProduct, args: dict, panel, xbase, p0, nr: int, kg: int,
                xz_u: int) -> None:
    """panel[k/4][j][k%4] = x column p0 + j, reduction element k (xz outside the image, 0 past K or P)."""
    K, P = spec.K, spec.P
    x, ktab, ptab = args["x"], args["ktab"], args["ptab"]
    flip = not spec.x_unsigned
    with U.for_range(b, 0, nr, "j") as j:
        p = b.add(p0, j, name="p")
        inside = b.icmp_signed("<", p, U.i64(P))
        pc = b.select(inside, p, U.i64(0))
        pofs = b.sext(b.load(b.gep(ptab, [pc], source_etype=I32), typ=I32), I64)
        prow = b.load(b.gep(ptab, [b.add(pc, U.i64(P))], source_etype=I32), typ=I32)
        pcol = b.load(b.gep(ptab, [b.add(pc, U.i64(2 * P))], source_etype=I32), typ=I32)
        src = b.add(xbase, pofs)
        dst = b.gep(panel, [b.mul(j, U.i64(4))], source_etype=I8)
        with U.for_range(b, 0, K, "k") as k:
            kofs = b.sext(b.load(b.gep(ktab, [k], source_etype=I32), typ=I32), I64)
            row = b.add(prow, b.load(b.gep(ktab, [b.add(k, U.i64(K))], source_etype=I32), typ=I32))
            col = b.add(pcol, b.load(b.gep(ktab, [b.add(k, U.i64(2 * K))], source_etype=I32), typ=I32))
            ok = b.and_(b.icmp_unsigned("<", row, U.i32(spec.H)), b.icmp_unsigned("<", col, U.i32(spec.W)))
            ok = b.and_(ok, inside)
            at = b.select(ok, b.add(src, kofs), U.i64(0))
            v = b.load(b.gep(x, [at], source_etype=I8), typ=I8)
            if flip:
                v = b.xor(v, ir.Constant(I8, 0x80))
            v = b.select(ok, v, ir.Constant(I8, xz_u - 256 if xz_u > 127 else xz_u))
            v = b.select(inside, v, ir.Constant(I8, 0))
            off = b.add(b.mul(b.lshr(k, U.i64(2)), U.i64(nr * 4)), b.and_(k, U.i64(3)))
            b.store(v, b.gep(dst, [off], source_etype=I8))
        with U.for_range(b, K, kg * 4, "kt") as k:
            off = b.add(b.mul(b.lshr(k, U.i64(2)), U.i64(nr * 4)), b.and_(k, U.i64(3)))
            b.store(ir.Constant(I8, 0), b.gep(dst, [off], source_etype=I8))


def _pack_dense(g: _Gen, spec: QProduct, x, ktab, panel, xbase, p0, nv: int, kg: int) -> None:
    """_pack_panel where row k of the im2col is x[ktab[k] + p] (a 1x1 convolution, or a stride-1 one
    over its padded input): four rows of VW bytes interleaved into one [VW][4] vector (columns past P
    are loaded as 0 and never stored)."""
    b, vw, K, P = g.b, g.vw, spec.K, spec.P
    row_t = ir.VectorType(I8, vw)
    mask_t = ir.VectorType(ir.IntType(1), vw)
    load = U.declare(g.m, f"llvm.masked.load.v{vw}i8.p0", row_t, [PTR, I32, mask_t, row_t])
    zero = ir.Constant(row_t, [0] * vw)
    pair = ir.Constant(ir.VectorType(I32, 2 * vw), [i // 2 + (vw if i % 2 else 0) for i in range(2 * vw)])
    quad = ir.Constant(ir.VectorType(I32, 4 * vw),
                       [(i // 4) * 2 + (i % 2) + (2 * vw if i % 4 >= 2 else 0) for i in range(4 * vw)])
    iota = ir.Constant(ir.VectorType(I64, vw), list(range(vw)))
    masks = []
    for v in range(nv):
        left = b.sub(U.i64(P), b.add(p0, U.i64(v * vw)))
        masks.append(b.icmp_signed("<", iota, g.splat(left, I64)))
    OW, J, OH = spec.rows
    segs: list[list] = []  # per vector: (offset from xbase, lanes it serves) of each output row it spans
    if J:
        for v in range(nv):
            pv = b.add(p0, U.i64(v * vw))
            oh0 = b.udiv(pv, U.i64(OW))
            segs.append([])
            for sg in range(-(-(vw - 1) // OW) + 1):
                ohs = b.add(oh0, U.i64(sg))
                ohs = b.select(b.icmp_unsigned("<", ohs, U.i64(OH)), ohs, U.i64(OH - 1))
                first = b.sub(b.mul(b.add(oh0, U.i64(sg)), U.i64(OW)), pv)  # lane where output row oh0 + sg starts
                segs[v].append((b.add(pv, b.mul(ohs, U.i64(J))), b.icmp_signed(">=", iota, g.splat(first, I64))))

    def row(v: int, kofs, whole: bool):
        if J:  # plain loads: the padded plane has slack past its last row
            r = None
            for off, lanes in segs[v]:
                seg = b.load(b.gep(x, [b.add(b.add(xbase, off), kofs)], source_etype=I8), typ=row_t, align=1)
                r = seg if r is None else b.select(lanes, seg, r)
            return r
        src = b.gep(x, [b.add(b.add(b.add(xbase, p0), U.i64(v * vw)), kofs)], source_etype=I8)
        return b.load(src, typ=row_t, align=1) if whole else b.call(load, [src, U.i32(1), masks[v], zero])

    def group(k0, rows: int, whole: bool) -> None:
        for v in range(nv):
            rs = []
            for t in range(4):
                if t >= rows:
                    rs.append(zero)
                    continue
                kofs = b.load(b.gep(ktab, [b.add(k0, U.i64(t))], source_etype=I32), typ=I32)
                r = row(v, b.sext(kofs, I64), whole)
                if not spec.x_unsigned:
                    r = b.xor(r, ir.Constant(row_t, [-128] * vw))
                rs.append(r)
            q = b.shuffle_vector(b.shuffle_vector(rs[0], rs[1], pair), b.shuffle_vector(rs[2], rs[3], pair), quad)
            kgi = b.lshr(k0, U.i64(2))
            dst = b.gep(panel, [b.add(b.mul(kgi, U.i64(nv * vw * 4)), U.i64(v * vw * 4))], source_etype=I8)
            b.store(q, dst, align=64)

    def pack(whole: bool) -> None:
        full = K // 4
        if full:
            with U.for_range(b, 0, full, "pk") as kk:
                group(b.mul(kk, U.i64(4)), 4, whole)
        if K % 4:
            group(U.i64(full * 4), K % 4, whole)

    if J:
        pack(True)
        return
    # panels wholly inside P load plainly (byte masked loads are scalar code without AVX-512)
    with b.if_else(b.icmp_signed("<=", b.add(p0, U.i64(nv * vw)), U.i64(P))) as (inside, edge):
        with inside:
            pack(True)
        with edge:
            pack(False)
    del kg


def _requant(g: _Gen, spec: QProduct, t, m, yz: int, ft) -> tuple[ir.Value, ir.Type]:
    """One vector of int32 results as stored: as is, or requantized to 8 bits; and its element type."""
    b, vw = g.b, g.vw
    if spec.out_kind == "i32":
        return t, I32
    # clip(rint(y) + yz, lo, hi) == rint(clip(y, lo - yz, hi - yz)) + yz (rounding is monotonic and
    # fixes integers): the clipped value converts in range, rounding half to even (lrint)
    fv = ir.VectorType(ft, vw)
    y = b.fmul(b.sitofp(t, fv), m)
    lo, hi = (0, 255) if spec.out_kind == "u8" else (-128, 127)
    if spec.relu:
        lo = max(lo, yz)
    flo, fhi = ir.Constant(fv, [float(lo - yz)] * vw), ir.Constant(fv, [float(hi - yz)] * vw)
    y = b.select(b.fcmp_ordered("<", y, flo), flo, y)
    y = b.select(b.fcmp_ordered(">", y, fhi), fhi, y)
    lrint = U.declare(g.m, f"llvm.lrint.v{vw}i32.v{vw}{'f64' if ft == F64 else 'f32'}", g.i32v, [fv])
    q = b.add(b.call(lrint, [y]), ir.Constant(g.i32v, [yz] * vw))
    return b.trunc(q, ir.VectorType(I8, vw)), I8


def _store_out(g: _Gen, spec: QProduct, out, orow, p0, v: int, ncols, t, m, yz: int, ft) -> None:
    """Store one vector of results: int32 as is, or requantized to 8 bits."""
    b, vw = g.b, g.vw
    val, et = _requant(g, spec, t, m, yz, ft)
    pv = b.add(p0, U.i64(v * vw))
    left = b.sub(ncols, U.i64(v * vw))
    mask = b.icmp_signed("<", ir.Constant(ir.VectorType(I64, vw), list(range(vw))),
                         g.b.shuffle_vector(b.insert_element(ir.Constant(ir.VectorType(I64, vw), ir.Undefined), left,
                                                             U.i32(0)),
                                            ir.Constant(ir.VectorType(I64, vw), ir.Undefined),
                                            ir.Constant(g.i32v, [0] * vw)))
    vt = val.type
    tag = f"v{vw}i{et.width}"
    if spec.out_ps == 1:
        # whole vectors store plainly (byte masked stores are scalar code without AVX-512)
        ptr = b.gep(out, [b.add(orow, pv)], source_etype=et)
        fn = U.declare(g.m, f"llvm.masked.store.{tag}.p0", ir.VoidType(), [vt, PTR, I32, mask.type])
        with b.if_else(b.icmp_signed(">=", left, U.i64(vw))) as (whole, part):
            with whole:
                b.store(val, ptr, align=1)
            with part:
                b.call(fn, [val, ptr, U.i32(et.width // 8), mask])
        return
    idx = b.add(b.mul(b.add(g.splat(pv, I64), ir.Constant(ir.VectorType(I64, vw), list(range(vw)))),
                      ir.Constant(ir.VectorType(I64, vw), [spec.out_ps] * vw)), g.splat(orow, I64))
    ptrs = b.gep(out, [idx], source_etype=et)
    ptrs.type = ir.VectorType(PTR, vw)
    fn = U.declare(g.m, f"llvm.masked.scatter.{tag}.v{vw}p0", ir.VoidType(), [vt, ptrs.type, I32, mask.type])
    b.call(fn, [val, ptrs, U.i32(et.width // 8), mask])


# --- depthwise convolution (group == channels, one filter each) -------------------------------------


def emit_qdepthwise(module: ir.Module, name: str, *, spec: QProduct, x_shape, w: np.ndarray, wz: np.ndarray,
                    bias: np.ndarray | None, xz: int, strides, pads, dilations, out_hw, mult: np.ndarray | None,
                    yz: int, vector_width: int) -> KernelInfo:
    """`void name(out, x, scratch, wc, bias, [mult,] tid, nthreads)`: per (image, channel) plane, the
    centered input (x - xz, int32, zero padding) is laid out in scratch split by column phase
    (column c of the padded plane at [c % stride][row][c // stride]), so every tap reads a contiguous
    run of output columns; the taps (w - wz, int32) accumulate in VW-lane int32 vectors."""
    vw = vector_width
    N, C, H, W = x_shape
    KH, KW = w.shape[2:]
    OH, OW = out_hw
    sh, sw = strides
    dh, dw_ = dilations
    pt, pl, pb, pr = pads[0], pads[1], pads[2], pads[3]
    Hp, Wp = H + pt + pb, W + pl + pr
    Wq = -(-Wp // sw) + vw  # one phase row, with slack so whole-vector loads stay inside
    plane = sw * Hp * Wq + vw
    wz64 = np.broadcast_to(wz.astype(np.int64).reshape(-1), (C,))
    wc = (w.astype(np.int64).reshape(C, KH * KW) - wz64[:, None]).astype(np.int32)
    bb = np.zeros(C, np.int32) if bias is None else bias.astype(np.int32).reshape(C)
    quant = spec.out_kind != "i32"
    ft = F64 if spec.float64 else F32
    packed = [np.ascontiguousarray(wc).ravel(), bb]
    if quant:
        packed.append(np.asarray(mult, np.float64 if spec.float64 else np.float32).reshape(C))
    params = [("out", PTR), ("x", PTR), ("scratch", PTR), ("wc", PTR), ("bias", PTR)] + (
        [("mult", PTR)] if quant else []) + [("tid", I32), ("nthreads", I32)]
    fn, b = U.new_function(module, name, params, internal=False)
    args = {a.name: a for a in fn.args}
    for a in fn.args[1:-2]:
        a.add_attribute("noalias")
    fn.attributes.add("nounwind")
    g = _Gen(b, module, vw, False)
    raw = b.ptrtoint(args["scratch"], I64)
    xp = b.inttoptr(b.and_(b.add(raw, U.i64(63)), U.i64(~63)), PTR, name="xp")
    lo, hi = U.thread_range(b, N * C, args["tid"], args["nthreads"], "plane")
    memset = U.declare(module, "llvm.memset.p0.i64", ir.VoidType(), [PTR, I8, I64, ir.IntType(1)])
    # Every plane writes the same cells (input rows, whole chunks), so the padding stays zero from one
    # memset per call.
    b.call(memset, [xp, ir.Constant(I8, 0), U.i64(plane * 4), ir.Constant(ir.IntType(1), 0)])
    with U.for_range(b, lo, hi, "pl") as pi:
        ch = b.urem(pi, U.i64(C), name="ch")
        _dw_rows(g, args["x"], xp, b.mul(pi, U.i64(H * W)), H=H, W=W, pt=pt, pl=pl, sw=sw, Hp=Hp, Wq=Wq, xz=xz,
                 unsigned=spec.x_unsigned)
        wrow = b.gep(args["wc"], [b.mul(ch, U.i64(KH * KW))], source_etype=I32)
        taps = [g.splat32(b.load(b.gep(wrow, [U.i64(t)], source_etype=I32), typ=I32)) for t in range(KH * KW)]
        bias_v = g.splat32(b.load(b.gep(args["bias"], [ch], source_etype=I32), typ=I32))
        m = g.splat(b.load(b.gep(args["mult"], [ch], source_etype=ft), typ=ft), ft) if quant else None
        nvec = -(-OW // vw)
        with U.for_range(b, 0, OH, "oh") as oh:
            orow = b.add(b.mul(pi, U.i64(OH * OW)), b.mul(oh, U.i64(OW)), name="orow")
            with U.for_range(b, 0, nvec, "ov") as ov:
                ow0 = b.mul(ov, U.i64(vw))
                acc = bias_v
                for kh in range(KH):
                    rbase = b.mul(b.add(b.mul(oh, U.i64(sh)), U.i64(kh * dh)), U.i64(Wq))
                    for kw in range(KW):
                        col = kw * dw_
                        at = b.add(b.add(U.i64((col % sw) * Hp * Wq + col // sw), rbase), ow0)
                        xv = b.load(b.gep(xp, [at], source_etype=I32), typ=g.i32v, align=4)
                        acc = b.add(acc, b.mul(xv, taps[kh * KW + kw]))
                _store_out(g, spec, args["out"], orow, ow0, 0, b.sub(U.i64(OW), ow0), acc, m, yz, ft)
    b.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=plane * 4 + 128)


def _dw_rows(g: _Gen, x, xp, xbase, *, H: int, W: int, pt: int, pl: int, sw: int, Hp: int, Wq: int, xz: int,
             unsigned: bool) -> None:
    """The H input rows of one plane into emit_qdepthwise's layout, as int32 x - xz: per chunk j of
    sw * VW padded columns, one byte load (masked at the edges, xz outside the input) split into its
    sw column phases, each VW cells at [phase][pt + row][j * VW]."""
    b, vw = g.b, g.vw
    span = sw * vw
    row_t = ir.VectorType(I8, span)
    mask_t = ir.VectorType(ir.IntType(1), span)
    load = U.declare(g.m, f"llvm.masked.load.v{span}i8.p0", row_t, [PTR, I32, mask_t, row_t])
    fill = ir.Constant(row_t, [xz & 0xFF] * span)
    iota = ir.Constant(ir.VectorType(I64, span), list(range(span)))
    xzv = ir.Constant(g.i32v, [xz] * vw)
    chunks = -(-(pl + W) // span)  # chunks holding input columns
    whole0 = -(-pl // span)  # chunks wholly inside the input: [whole0, whole1)
    whole1 = (pl + W) // span
    with U.for_range(b, 0, H, "ih") as ih:
        src_row = b.add(xbase, b.mul(ih, U.i64(W)))
        dst_row = b.mul(b.add(ih, U.i64(pt)), U.i64(Wq))
        with U.for_range(b, 0, chunks, "dj") as j:
            c0 = b.sub(b.mul(j, U.i64(span)), U.i64(pl))  # input column of lane 0
            src = b.gep(x, [b.add(src_row, c0)], source_etype=I8)
            slot = U.entry_alloca(b, row_t, "dwrow")
            inside = b.and_(b.icmp_signed(">=", j, U.i64(whole0)), b.icmp_signed("<", j, U.i64(whole1)))
            with b.if_else(inside) as (whole, edge):
                with whole:
                    b.store(b.load(src, typ=row_t, align=1), slot)
                with edge:
                    col = b.add(_splat_n(b, c0, span), iota)
                    ok = b.and_(b.icmp_signed(">=", col, ir.Constant(col.type, [0] * span)),
                                b.icmp_signed("<", col, ir.Constant(col.type, [W] * span)))
                    b.store(b.call(load, [src, U.i32(1), ok, fill]), slot)
            r = b.load(slot, typ=row_t)
            for ph in range(sw):
                part = r if sw == 1 else b.shuffle_vector(
                    r, ir.Constant(row_t, ir.Undefined), ir.Constant(g.i32v, [ph + sw * i for i in range(vw)]))
                wide = (b.zext if unsigned else b.sext)(part, g.i32v)
                at = b.add(U.i64(ph * Hp * Wq), b.add(dst_row, b.mul(j, U.i64(vw))))
                b.store(b.sub(wide, xzv), b.gep(xp, [at], source_etype=I32), align=4)


def _splat_n(b: ir.IRBuilder, s, n: int):
    """An n-lane vector of the scalar s."""
    vt = ir.VectorType(s.type, n)
    one = b.insert_element(ir.Constant(vt, ir.Undefined), s, U.i32(0))
    return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, n), [0] * n))


def emit_qpad(module: ir.Module, name: str, *, planes: int, H: int, W: int, pads: tuple[int, int],
              stride: tuple[int, int], out_hw: tuple[int, int], phases: tuple[tuple[int, int], ...],
              value: int) -> ir.Function:
    """`void name(out, x, tid, nthreads)`: each byte plane (H, W), padded by `value` (the zero point) with
    top / left `pads`, as the stride phases the taps read: out[f][i][j] = padded[i * sh + rh][j * sw + rw]
    for phase f = (rh, rw) of `phases`, i < Hq, j < Wq (`out_hw`), `value` where that is outside the input."""
    pt, pl = pads
    sh, sw = stride
    Hq, Wq = out_hw
    fn, b = U.new_function(module, name, [("out", PTR), ("x", PTR), ("tid", I32), ("nthreads", I32)],
                           internal=False)
    out, x, tid, nt = fn.args
    x.add_attribute("noalias")
    memset = U.declare(module, "llvm.memset.p0.i64", ir.VoidType(), [PTR, I8, I64, ir.IntType(1)])
    memcpy = U.declare(module, "llvm.memcpy.p0.p0.i64", ir.VoidType(), [PTR, PTR, I64, ir.IntType(1)])
    fill = ir.Constant(I8, value - 256 if value > 127 else value)
    no = ir.Constant(ir.IntType(1), 0)
    lo, hi = U.thread_range(b, planes, tid, nt, "plane")
    plane = len(phases) * Hq * Wq
    with U.for_range(b, lo, hi, "pl") as pi:
        b.call(memset, [b.gep(out, [b.mul(pi, U.i64(plane))], source_etype=I8), fill, U.i64(plane), no])
        src = b.gep(x, [b.mul(pi, U.i64(H * W))], source_etype=I8)
        for f, (rh, rw) in enumerate(phases):
            i0 = max(0, -(-(pt - rh) // sh))
            i1 = min(Hq - 1, (H - 1 + pt - rh) // sh)
            j0 = max(0, -(-(pl - rw) // sw))
            j1 = min(Wq - 1, (W - 1 + pl - rw) // sw)
            if i1 < i0 or j1 < j0:
                continue
            phase = b.add(b.mul(pi, U.i64(plane)), U.i64(f * Hq * Wq))
            with U.for_range(b, i0, i1 + 1, f"i{rh}{rw}") as i:
                srow = b.gep(src, [b.mul(b.add(b.mul(i, U.i64(sh)), U.i64(rh - pt)), U.i64(W))], source_etype=I8)
                drow = b.gep(out, [b.add(phase, b.mul(i, U.i64(Wq)))], source_etype=I8)
                if sw == 1:
                    b.call(memcpy, [b.gep(drow, [U.i64(j0)], source_etype=I8),
                                    b.gep(srow, [U.i64(j0 - pl + rw)], source_etype=I8), U.i64(j1 - j0 + 1), no])
                else:
                    with U.for_range(b, j0, j1 + 1, f"j{rh}{rw}") as j:
                        at = b.add(b.mul(j, U.i64(sw)), U.i64(rw - pl))
                        b.store(b.load(b.gep(srow, [at], source_etype=I8), typ=I8), b.gep(drow, [j], source_etype=I8))
    b.ret_void()
    return fn


# --- the tables of a convolution and a matrix product ----------------------------------------------


def conv_tables(x_shape, w_shape, strides, pads, dilations, out_shape) -> tuple[np.ndarray, np.ndarray]:
    """(k_tables, p_tables) of a 2-D convolution over NCHW (see emit_qproduct)."""
    _, _, H, W = x_shape
    _, cg, KH, KW = w_shape
    OH, OW = out_shape[2:]
    ci, kh, kw = np.meshgrid(np.arange(cg), np.arange(KH), np.arange(KW), indexing="ij")
    dr, dc = kh.ravel() * dilations[0], kw.ravel() * dilations[1]
    kt = np.stack([ci.ravel() * H * W + dr * W + dc, dr, dc])
    oh, ow = np.meshgrid(np.arange(OH), np.arange(OW), indexing="ij")
    r0, c0 = oh.ravel() * strides[0] - pads[0], ow.ravel() * strides[1] - pads[1]
    pt = np.stack([r0 * W + c0, r0, c0])
    if max(H * W * x_shape[1], 1) * max(x_shape[0], 1) >= 1 << 31:
        raise UnsupportedShape("int8 convolution input too large for 32-bit offsets", found=list(x_shape))
    return kt.astype(np.int32), pt.astype(np.int32)


def matmul_tables(M: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(k_tables, p_tables) of A (M, K) row-major as the activation operand (no bounds)."""
    if M * K >= 1 << 31:
        raise UnsupportedShape("int8 matmul operand too large for 32-bit offsets", found=(M, K))
    kt = np.stack([np.arange(K), np.zeros(K, np.int64), np.zeros(K, np.int64)])
    pt = np.stack([np.arange(M) * K, np.zeros(M, np.int64), np.zeros(M, np.int64)])
    return kt.astype(np.int32), pt.astype(np.int32)


# --- any operand at run time: plain loops (the reference arithmetic, one output at a time) ----------


def _scalar_requant(b: ir.IRBuilder, acc, mult, yz, out_dtype: np.dtype, relu: bool, ft) -> ir.Value:
    """saturate(rint(ft(acc) * mult) + yz) (max with yz under relu) as 8 bits; yz an i32 value."""
    rfn = U.declare(b.module, f"llvm.roundeven.{'f64' if ft == F64 else 'f32'}", ft, [ft])
    y = b.fadd(b.call(rfn, [b.fmul(b.sitofp(acc, ft), mult)]), b.sitofp(yz, ft))
    lo, hi = (0.0, 255.0) if np.dtype(out_dtype) == np.uint8 else (-128.0, 127.0)
    if relu:
        zf = b.sitofp(yz, ft)
        y = b.select(b.fcmp_ordered("<", y, zf), zf, y)
    y = b.select(b.fcmp_ordered("<", y, ir.Constant(ft, lo)), ir.Constant(ft, lo), y)
    y = b.select(b.fcmp_ordered(">", y, ir.Constant(ft, hi)), ir.Constant(ft, hi), y)
    return b.trunc(b.fptosi(y, I32), I8)


def _int_load(b: ir.IRBuilder, ptr, index, dtype: np.dtype):
    v = b.load(b.gep(ptr, [index], source_etype=I8 if np.dtype(dtype).itemsize == 1 else I32),
               typ=I8 if np.dtype(dtype).itemsize == 1 else I32)
    if np.dtype(dtype).itemsize == 4:
        return v
    return b.zext(v, I32) if np.dtype(dtype) == np.uint8 else b.sext(v, I32)


def _float_load(b: ir.IRBuilder, ptr, index, dtype: np.dtype):
    """A scale as float32 (float16 widened exactly)."""
    if np.dtype(dtype) == np.float16:
        return b.fpext(b.load(b.gep(ptr, [index], source_etype=ir.HalfType()), typ=ir.HalfType()), F32)
    return b.load(b.gep(ptr, [index], source_etype=F32), typ=F32)


def _scale_op(b: ir.IRBuilder, op: str, x, y, dtype: np.dtype):
    """x op y in the scales' type (float16 rounds after each op, as numpy)."""
    r = b.fmul(x, y) if op == "*" else b.fdiv(x, y)
    return b.fpext(b.fptrunc(r, ir.HalfType()), F32) if np.dtype(dtype) == np.float16 else r


def emit_qconv_runtime(module: ir.Module, name: str, *, op: str, x_shape, w_shape, out_shape, group: int, strides,
                       pads, dilations, dtypes: tuple, per_channel: tuple[bool, bool], float64: bool,
                       relu: bool) -> ir.Function:
    """`void name(out, x, w, xz, wz[, xs, ws, ys, yz, bias], tid, nthreads)`: one output at a time."""
    N, C, H, W = x_shape
    M, cg, KH, KW = w_shape
    OH, OW = out_shape[2:]
    R = M // group
    xdt, wdt, ydt = dtypes
    quant = op == "QLinearConv"
    names = ["out", "x", "w", "xz", "wz"] + (["xs", "ws", "ys", "yz", "bias"] if quant else [])
    fn, b = U.new_function(module, name, [(n, PTR) for n in names] + [("tid", I32), ("nthreads", I32)],
                           internal=False)
    a = {arg.name: arg for arg in fn.args}
    ft = F64 if float64 else F32
    xz = _int_load(b, a["xz"], U.i64(0), xdt)
    lo, hi = U.thread_range(b, N * M, a["tid"], a["nthreads"], "nm")
    with U.for_range(b, lo, hi, "nm") as nm:
        n, co = b.udiv(nm, U.i64(M)), b.urem(nm, U.i64(M))
        ch = co if per_channel[0] else U.i64(0)
        wz = _int_load(b, a["wz"], ch, wdt)
        g0 = b.mul(b.udiv(co, U.i64(R)), U.i64(cg))
        if quant:
            ws = _float_load(b, a["ws"], co if per_channel[1] else U.i64(0), np.float32)
            mult = b.fdiv(b.fmul(_float_load(b, a["xs"], U.i64(0), np.float32), ws), _float_load(b, a["ys"], U.i64(0),
                                                                                                   np.float32))
            mult = b.fpext(mult, F64) if float64 else mult
            bias = _int_load(b, a["bias"], co, np.int32)
            yz = _int_load(b, a["yz"], U.i64(0), ydt)
        with U.for_range(b, 0, OH, "oh") as oh, U.for_range(b, 0, OW, "ow") as ow:
            slot = U.entry_alloca(b, I32, "acc")
            b.store(ir.Constant(I32, 0), slot)
            with U.for_range(b, 0, cg, "ci") as ci, U.for_range(b, 0, KH, "kh") as kh, \
                    U.for_range(b, 0, KW, "kw") as kw:
                ih = b.add(b.mul(oh, U.i64(strides[0])), b.sub(b.mul(kh, U.i64(dilations[0])), U.i64(pads[0])))
                iw = b.add(b.mul(ow, U.i64(strides[1])), b.sub(b.mul(kw, U.i64(dilations[1])), U.i64(pads[1])))
                ok = b.and_(b.icmp_unsigned("<", ih, U.i64(H)), b.icmp_unsigned("<", iw, U.i64(W)))
                with U.if_then(b, ok, "inside"):
                    xi = b.add(b.mul(b.add(b.mul(n, U.i64(C)), b.add(g0, ci)), U.i64(H * W)),
                               b.add(b.mul(ih, U.i64(W)), iw))
                    wi = b.add(b.mul(b.add(b.mul(co, U.i64(cg)), ci), U.i64(KH * KW)), b.add(b.mul(kh, U.i64(KW)), kw))
                    prod = b.mul(b.sub(_int_load(b, a["x"], xi, xdt), xz), b.sub(_int_load(b, a["w"], wi, wdt), wz))
                    b.store(b.add(b.load(slot, typ=I32), prod), slot)
            acc = b.load(slot, typ=I32)
            oi = b.add(b.mul(nm, U.i64(OH * OW)), b.add(b.mul(oh, U.i64(OW)), ow))
            if quant:
                b.store(_scalar_requant(b, b.add(acc, bias), mult, yz, ydt, relu, ft),
                        b.gep(a["out"], [oi], source_etype=I8))
            else:
                b.store(acc, b.gep(a["out"], [oi], source_etype=I32))
    b.ret_void()
    return fn


def emit_qmatmul_runtime(module: ir.Module, name: str, *, op: str, out_dims, K: int, strides: dict, dtypes: dict,
                         float64: bool, relu: bool, has_bias: bool) -> ir.Function:
    """`void name(out, a, b, az, bz[, as, bs, ys, yz, bias], tid, nthreads)`: out_dims = batch + (M, N);
    strides[operand] are its element strides over those dims (0 where it broadcasts; for a and b the
    offset of k = 0), k steps 1 in a and N_b in b (strides["bk"])."""
    quant = op == "QLinearMatMul"
    names = ["out", "a", "b", "az", "bz"] + (["as", "bs", "ys", "yz", "bias"] if quant else [])
    fn, bl = U.new_function(module, name, [(n, PTR) for n in names] + [("tid", I32), ("nthreads", I32)],
                            internal=False)
    a = {arg.name: arg for arg in fn.args}
    ft = F64 if float64 else F32
    keys = ["out", "a", "b", "az", "bz"] + (["as", "bs", "bias"] if quant else [])
    st = [strides[k] for k in keys]

    def body(offs, _idx) -> None:
        o = dict(zip(keys, offs))
        az = _int_load(bl, a["az"], o["az"], dtypes["a"])
        bz = _int_load(bl, a["bz"], o["bz"], dtypes["b"])
        slot = U.entry_alloca(bl, I32, "acc")
        bl.store(ir.Constant(I32, 0), slot)
        with U.for_range(bl, 0, K, "k") as k:
            av = bl.sub(_int_load(bl, a["a"], bl.add(o["a"], k), dtypes["a"]), az)
            bv = bl.sub(_int_load(bl, a["b"], bl.add(o["b"], bl.mul(k, U.i64(strides["bk"]))), dtypes["b"]), bz)
            bl.store(bl.add(bl.load(slot, typ=I32), bl.mul(av, bv)), slot)
        acc = bl.load(slot, typ=I32)
        if not quant:
            bl.store(acc, bl.gep(a["out"], [o["out"]], source_etype=I32))
            return
        if has_bias:
            acc = bl.add(acc, _int_load(bl, a["bias"], o["bias"], np.int32))
        sd = dtypes["scale"]
        mult = _scale_op(bl, "/", _scale_op(bl, "*", _float_load(bl, a["as"], o["as"], sd),
                                            _float_load(bl, a["bs"], o["bs"], sd), sd),
                         _float_load(bl, a["ys"], U.i64(0), sd), sd)
        mult = bl.fpext(mult, F64) if float64 else mult
        yz = _int_load(bl, a["yz"], U.i64(0), dtypes["y"])
        bl.store(_scalar_requant(bl, acc, mult, yz, dtypes["y"], relu, ft), bl.gep(a["out"], [o["out"]], source_etype=I8))

    U.nest(bl, list(out_dims), st, [U.i64(0)] * len(keys), body, split=(a["tid"], a["nthreads"]), name="q")
    bl.ret_void()
    return fn


# --- lowering: the graph nodes onto emit_qproduct ---------------------------------------------------


def _const(node: Node, values: list[Value]) -> list[np.ndarray]:
    """The compile-time values of operands the kernel folds; refused when one is computed at run time."""
    for v in values:
        if not v.is_constant:
            raise UnsupportedOperator("the CPU int8 kernels need constant weights, scales and zero points",
                                      node=node.name, op=node.op, expected="an initializer", found=v.name)
    return [np.asarray(v.data) for v in values]


def _one(a: np.ndarray, node: Node, what: str) -> int:
    if a.size != 1:
        raise UnsupportedOperator(f"the CPU int8 kernels need a per-tensor {what}", node=node.name, op=node.op,
                                  expected="one value", found=list(a.shape))
    return int(a.reshape(-1)[0])


def _step(low: Lowering, node: Node, spec: QProduct, x: Value, out: Value | None = None, **kw) -> None:
    out = out if out is not None else node.outputs[0]
    info = low.generate(emit_qproduct, low.fname([node]), ("w", "wz", "bias", "mult"), spec=spec,
                        vector_width=low.vector_width, **kw)
    args = [low.val(out), low.val(x), SCRATCH] + [low.array(p) for p in info.packed]
    work = 2.0 * spec.units * spec.R * spec.K * spec.P
    low.add(Step(info.function.name, info.function, args, [out], [node], work=work,
                 scratch=info.scratch_bytes_per_thread))


def _lower_qconv_packed(low: Lowering, node: Node) -> None:
    """QLinearConv and ConvInteger over NCHW (1-D as height 1) with constant weights."""
    if node.op == "QLinearConv":
        x, _, xz_v, w_v, ws_v, wz_v, ys_v, yz_v, b_v = node.inputs
        xs, xz, w, ws, wz, ys, yz, bias = _const(node, [node.inputs[1], xz_v, w_v, ws_v, wz_v, ys_v, yz_v, b_v])
    else:
        x, w_v, xz_v, wz_v = node.inputs
        xz, w, wz = _const(node, [xz_v, w_v, wz_v])
        bias = None
    out = node.outputs[0]
    a = node.attrs
    xz_i = _one(xz, node, "x_zero_point")
    yz_i = _one(yz, node, "y_zero_point") if node.op == "QLinearConv" else 0
    xs_shape, w4, strides, pads, dil = tuple(x.shape), w, a["strides"], a["pads"], a["dilations"]
    if x.type.rank == 3:
        xs_shape = (x.shape[0], x.shape[1], 1, x.shape[2])
        w4 = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])
        strides, pads, dil = (1, strides[0]), (0, pads[0], 0, pads[1]), (1, dil[0])
    elif x.type.rank != 4:
        raise UnsupportedOperator("the CPU int8 convolution is 1-D or 2-D", node=node.name, op=node.op,
                                  expected="rank 3 or 4", found=x.type.rank)
    o_shape = (out.shape[0], out.shape[1], *(((1,) + tuple(out.shape[2:])) if x.type.rank == 3 else out.shape[2:]))
    N, C, H, W = xs_shape
    M, G = w4.shape[0], a["group"]
    R, cg = M // G, w4.shape[1]
    K, P = cg * w4.shape[2] * w4.shape[3], o_shape[2] * o_shape[3]
    mult = None
    kind = "i32"
    if node.op == "QLinearConv":
        m = (xs.reshape(()) * ws / ys.reshape(())).astype(np.float32)
        mult = np.broadcast_to(m.reshape(-1), (M,)).copy()
        kind = "u8" if out.dtype == np.uint8 else "i8"
    if G == C == M:
        spec = QProduct(units=N * G, R=1, K=K, P=P, x_unit=(0, 0), groups=G, out_unit=(0, 0), out_rs=0, out_ps=1,
                        H=H, W=W, x_unsigned=x.dtype == np.uint8, out_kind=kind,
                        float64=not a.get("float32", False), relu=bool(a.get("relu", False)))
        info = low.generate(emit_qdepthwise, low.fname([node]), ("w", "wz", "bias", "mult"), spec=spec,
                            x_shape=xs_shape, w=w4, wz=np.broadcast_to(wz.reshape(-1), (M,)).copy(), bias=bias,
                            xz=xz_i, strides=tuple(strides), pads=tuple(pads), dilations=tuple(dil),
                            out_hw=o_shape[2:], mult=mult, yz=yz_i, vector_width=low.vector_width)
        args = [low.val(out), low.val(x), SCRATCH] + [low.array(p) for p in info.packed]
        low.add(Step(info.function.name, info.function, args, [out], [node], work=2.0 * N * M * K * P,
                     scratch=info.scratch_bytes_per_thread))
        return
    kt, pt = conv_tables(xs_shape, w4.shape, strides, pads, dil, o_shape)
    dense = w4.shape[2:] == (1, 1) and tuple(strides) == (1, 1) and not any(pads)
    common = dict(groups=G, out_unit=(M * P, R * P), out_rs=P, out_ps=1, x_unsigned=x.dtype == np.uint8,
                  out_kind=kind, float64=not a.get("float32", False), relu=bool(a.get("relu", False)))
    spec = QProduct(units=N * G, R=R, K=K, P=P, x_unit=(C * H * W, cg * H * W), H=H, W=W, dense=dense, **common)
    src = x
    if not dense:
        # Over its zero-point-padded input split into stride phases, every tap of a convolution reads
        # a contiguous run per output row: tap (kh, kw) at phase (kh*dh % sh, kw*dw % sw), row
        # oh + kh*dh // sh, column ow + kw*dw // sw (QProduct.rows). Spare rows: a vector's reads past
        # its last row (up to a panel and a vector beyond the last tap's).
        sh, sw = strides
        OH, OW = o_shape[2:]
        KH, KW = w4.shape[2:]
        Wq = max(OW + (KW - 1) * dil[1] // sw, -(-(W + pads[1]) // sw))
        Hq = max(OH + (KH - 1) * dil[0] // sh + 1, -(-(H + pads[0]) // sh)) + -(-128 // Wq)
        ci, kh, kw = (t.ravel() for t in np.meshgrid(np.arange(cg), np.arange(KH), np.arange(KW), indexing="ij"))
        rh, rw = kh * dil[0] % sh, kw * dil[1] % sw
        phases = tuple(sorted(set(zip(rh.tolist(), rw.tolist()))))
        phase_of = {ph: f for f, ph in enumerate(phases)}
        plane = len(phases) * Hq * Wq
        src = Value(f"{out.name}.qpad", TensorType(x.dtype, (N, C, len(phases) * Hq, Wq)), "node")
        fn = emit_qpad(low.kmod(), low.fname([node]), planes=N * C, H=H, W=W, pads=(pads[0], pads[1]),
                       stride=(sh, sw), out_hw=(Hq, Wq), phases=phases, value=xz_i)
        low.add(Step(fn.name, fn, [low.val(src), low.val(x)], [src], [node], work=float(src.type.size)))
        f = np.array([phase_of[ph] for ph in zip(rh.tolist(), rw.tolist())], np.int64)
        kofs = ci * plane + f * Hq * Wq + (kh * dil[0] // sh) * Wq + kw * dil[1] // sw
        kt = np.stack([kofs, 0 * kofs, 0 * kofs])
        pt = np.zeros((3, 1), np.int64)
        spec = QProduct(units=N * G, R=R, K=K, P=P, x_unit=(C * plane, cg * plane), H=1, W=1, dense=True,
                        rows=(OW, Wq - OW, OH), **common)
    _step(low, node, spec, src, w=w4.reshape(G, R, K), wz=np.broadcast_to(wz.reshape(-1), (M,)).copy(), bias=bias,
          xz=xz_i, k_tables=kt, p_tables=pt, mult=mult, yz=yz_i)


def _lower_qmatmul_packed(low: Lowering, node: Node) -> None:
    """QLinearMatMul and MatMulInteger with a constant 2-D B (A of any rank: its rows are the columns)."""
    if node.op == "QLinearMatMul":
        a_v, _, az_v, b_v, bs_v, bz_v, ys_v, yz_v, *rest = node.inputs
        as_, az, bm, bs, bz, ys, yz = _const(node, [node.inputs[1], az_v, b_v, bs_v, bz_v, ys_v, yz_v])
        bias = _const(node, rest)[0] if rest else None
    else:
        a_v, b_v, az_v, bz_v = node.inputs
        az, bm, bz = _const(node, [az_v, b_v, bz_v])
        bias = None
    out = node.outputs[0]
    az_i = _one(az, node, "a_zero_point")
    yz_i = _one(yz, node, "y_zero_point") if node.op == "QLinearMatMul" else 0
    if bm.ndim != 2:
        raise UnsupportedOperator("the CPU int8 matmul needs a 2-D B", node=node.name, op=node.op,
                                  expected="rank 2", found=bm.ndim)
    K, N = bm.shape
    Mrows = int(np.prod(a_v.shape[:-1])) if a_v.type.rank > 1 else 1
    if bz.size not in (1, N):
        raise UnsupportedOperator("the CPU int8 matmul needs b_zero_point per tensor or per column",
                                  node=node.name, op=node.op, expected=f"1 or {N} values", found=list(bz.shape))
    mult, kind = None, "i32"
    if node.op == "QLinearMatMul":
        if as_.size != 1 or bs.size not in (1, N):
            raise UnsupportedOperator("the CPU int8 matmul needs a per-tensor a_scale", node=node.name, op=node.op,
                                      expected="one value", found=list(as_.shape))
        m = np.asarray(as_ * bs / ys.reshape(()))
        mult = np.broadcast_to(m.reshape(-1), (N,)).astype(np.float32 if node.attrs.get("float32") else np.float64)
        kind = "u8" if out.dtype == np.uint8 else "i8"
    kt, pt = matmul_tables(Mrows, K)
    spec = QProduct(units=1, R=N, K=K, P=Mrows, x_unit=(0, 0), groups=1, out_unit=(0, 0), out_rs=1, out_ps=N,
                    H=1, W=1, x_unsigned=a_v.dtype == np.uint8, out_kind=kind,
                    float64=not node.attrs.get("float32", False), relu=bool(node.attrs.get("relu", False)))
    _step(low, node, spec, a_v, w=np.ascontiguousarray(bm.T).reshape(1, N, K),
          wz=np.broadcast_to(bz.reshape(-1), (N,)).copy(), bias=bias, xz=az_i,
          k_tables=kt, p_tables=pt, mult=mult, yz=yz_i)


def _bcast(shape, full) -> list[int]:
    """Element strides of a tensor of `shape` broadcast (right-aligned) over `full`."""
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    st = U.contiguous_strides(padded)
    return [0 if padded[d] == 1 and full[d] != 1 else st[d] for d in range(len(full))]


def _lower_qconv(low: Lowering, node: Node) -> None:
    """The packed kernels where weights, scales and zero points are constants, else plain loops."""
    try:
        _lower_qconv_packed(low, node)
        return
    except UnsupportedOperator:
        if node.inputs[0].type.rank not in (3, 4):
            raise
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    quant = node.op == "QLinearConv"
    w = node.inputs[3] if quant else node.inputs[1]
    x4 = tuple(x.shape) if x.type.rank == 4 else (x.shape[0], x.shape[1], 1, x.shape[2])
    w4 = tuple(w.shape) if w.type.rank == 4 else (w.shape[0], w.shape[1], 1, w.shape[2])
    o4 = tuple(out.shape) if out.type.rank == 4 else (out.shape[0], out.shape[1], 1, out.shape[2])
    one = x.type.rank == 3
    strides = (1, a["strides"][0]) if one else a["strides"]
    pads = (0, a["pads"][0]) if one else a["pads"][:2]
    dil = (1, a["dilations"][0]) if one else a["dilations"]
    if quant:
        xv, xs, xz, wv, ws, wz, ys, yz, bias = node.inputs
        ins, dts, pc = [xv, wv, xz, wz, xs, ws, ys, yz, bias], (x.dtype, w.dtype, out.dtype), (wz.type.size > 1,
                                                                                             ws.type.size > 1)
    else:
        xv, wv, xz, wz = node.inputs
        ins, dts, pc = [xv, wv, xz, wz], (x.dtype, w.dtype, None), (wz.type.size > 1, False)
    fn = emit_qconv_runtime(low.kmod(), low.fname([node]), op=node.op, x_shape=x4, w_shape=w4, out_shape=o4,
                            group=a["group"], strides=tuple(strides), pads=tuple(pads), dilations=tuple(dil),
                            dtypes=dts, per_channel=pc, float64=not a.get("float32", False),
                            relu=bool(a.get("relu", False)))
    low.add(Step(fn.name, fn, [low.val(out)] + [low.val(v) for v in ins], [out], [node],
                 work=2.0 * out.type.size * math.prod(w4[1:])))


def _lower_qmatmul(low: Lowering, node: Node) -> None:
    """The packed kernels where B, scales and zero points are constants, else plain loops."""
    try:
        _lower_qmatmul_packed(low, node)
        return
    except UnsupportedOperator:
        pass
    quant = node.op == "QLinearMatMul"
    if quant:
        av, as_, az, bv, bs, bz, ys, yz, *rest = node.inputs
    else:
        av, bv, az, bz = node.inputs
        rest = []
    out = node.outputs[0]
    a2 = (1, *av.shape) if av.type.rank == 1 else tuple(av.shape)
    b2 = (*bv.shape, 1) if bv.type.rank == 1 else tuple(bv.shape)
    K, N, M = a2[-1], b2[-1], a2[-2]
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    fa, fb, fo = batch + (M, K), batch + (K, N), batch + (M, N)
    sa, sb = _bcast(a2, fa), _bcast(b2, fb)
    row = lambda v: (lambda t: t[:-1] + [0])(_bcast(v.shape, fa))  # noqa: E731 (a-side: per row)
    col = lambda v: (lambda t: t[:-2] + [0, t[-1]])(_bcast(v.shape, fb))  # noqa: E731 (b-side: per column)
    strides = {"out": U.contiguous_strides(fo), "a": sa[:-1] + [0], "b": sb[:-2] + [0, sb[-1]], "bk": sb[-2],
               "az": row(az), "bz": col(bz)}
    dtypes = {"a": av.dtype, "b": bv.dtype, "y": out.dtype}
    ins = [av, bv, az, bz]
    if quant:
        strides.update({"as": row(as_), "bs": col(bs), "bias": _bcast((N,), fo) if rest else [0] * len(fo)})
        dtypes.update({"scale": as_.dtype, "y": yz.dtype})
        ins += [as_, bs, ys, yz]
    fn = emit_qmatmul_runtime(low.kmod(), low.fname([node]), op=node.op, out_dims=fo, K=K, strides=strides,
                              dtypes=dtypes, float64=not node.attrs.get("float32", False),
                              relu=bool(node.attrs.get("relu", False)), has_bias=bool(rest))
    args = [low.val(out)] + [low.val(v) for v in ins]
    if quant:
        args.append(low.val(rest[0]) if rest else NULL)
    low.add(Step(fn.name, fn, args, [out], [node], work=2.0 * math.prod(fo) * K))


KERNELS = {"QLinearConv": _lower_qconv, "ConvInteger": _lower_qconv, "QLinearMatMul": _lower_qmatmul,
           "MatMulInteger": _lower_qmatmul}
