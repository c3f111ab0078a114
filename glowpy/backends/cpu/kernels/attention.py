"""Fused attention (IR op Attention, float32): out[g] = softmax(Q[g] @ KT[g] * scale + mask[g]) @ V[g].

A work unit is one batch index g (batch x heads) and one block of MR query rows (gemm's tile height).
Its scores, MR x T, go into this thread's scratch (MR * T floats: L1 / L2 even for T = 1500) through
gemm's micro-kernel over KT's column panels, scaled and masked as they are stored; each row is then a
softmax in place (norm.softmax_row), and the block times V comes out through the micro-kernel again,
its reduction over T summed in chunks of batched.KC as the batched MatMul sums it. No S x T matrix is
materialized. Threads split the (batch, row block) units in contiguous ranges. Operands are read in
place (row-major); batch strides of 0 broadcast an operand, the mask also along its rows or columns.
"""

from __future__ import annotations

import math

from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.kernels.batched import B_PREFETCH, KC, batch_offsets
from glowpy.backends.cpu.kernels.gemm import choose_tile, emit_tile, full_or_edge_panel
from glowpy.backends.cpu.kernels.norm import softmax_row
from glowpy.backends.cpu.vector import I64, PTR, Loop, VecIR
from glowpy.errors import InternalError, MismatchingShape

from .common import KernelInfo


def emit_attention(module: ir.Module, name: str, *, batch: tuple[int, ...], s: int, t: int, d: int, e: int,
                   q_strides: tuple[int, ...], kt_strides: tuple[int, ...], v_strides: tuple[int, ...],
                   mask_strides: tuple[int, ...] | None = None, mask_row: int = 0, mask_col: int = 0,
                   scale: float = 1.0, nan_to_zero: bool = False, vector_width: int) -> KernelInfo:
    """void name(out, q, kt, v, mask_or_null, scratch, tid, nthreads) for Q (S, D), KT (D, T), V (T, E)
    and out (S, E) per batch index; `*_strides` are the operands' element strides per batch dim, the
    mask (None: no mask) also has a row and a column stride (0 or its row length, 0 or 1)."""
    if min(s, t, d, e) < 1:
        raise MismatchingShape("attention dimensions must be positive", op="Attention", expected="S, T, D, E >= 1",
                               found=(s, t, d, e))
    strides = [q_strides, kt_strides, v_strides] + ([mask_strides] if mask_strides is not None else [])
    if any(len(st) != len(batch) for st in strides) or mask_col not in (0, 1):
        raise InternalError("one stride per batch dim, a mask column stride of 0 or 1", op="Attention",
                            expected=len(batch), found=[len(st) for st in strides] + [mask_col])
    params = [("out", PTR), ("q", PTR), ("kt", PTR), ("v", PTR), ("mask", PTR), ("scratch", PTR),
              ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out_p, q_p, kt_p, v_p, mask_p, scratch, tid, nt = fn.args
    vw = vector_width
    vx = VecIR(module, b, vw)
    # every row block reads all of K^T and V: the tallest wide block (12 x 2) measured 3-6% faster than
    # 8 x 3 or 6 x 4 here (BERT, ViT, Whisper, wav2vec2 shapes; Xeon, 1 thread)
    mr, nv = (12, 2) if vw >= 16 and s > 12 else choose_tile(s, vw, wide=True)
    nr = nv * vw
    mblocks, mfull = math.ceil(s / mr), s // mr
    tp = math.ceil(t / vw) * vw  # scratch row stride
    groups = math.prod(batch)

    lo, hi = U.thread_range(b, groups * mblocks, tid, nt, "unit")
    unit = Loop(vx, "unit", lo, hi)
    g = b.udiv(unit.i, ir.Constant(I64, mblocks), name="g")
    mb = b.urem(unit.i, ir.Constant(I64, mblocks), name="mb")
    offs = batch_offsets(b, g, batch, strides)
    q_g, kt_g, v_g = (vx.gep(p, o, name=f"{n}.g") for p, o, n in zip((q_p, kt_p, v_p), offs, ("q", "kt", "v")))
    mask_g = vx.gep(mask_p, offs[3], name="mask.g") if mask_strides is not None else None
    out_g = vx.gep(out_p, vx.off((g, s * e)), name="out.g")
    i0 = b.mul(mb, ir.Constant(I64, mr), name="i0")

    def panels(n: int, label: str, run) -> None:
        """run(n0, nvec, masks) over the column panels of an n-wide row (the last one masked)."""
        nblocks, nfull = math.ceil(n / nr), n // nr
        lp = Loop(vx, label, 0, nblocks)
        n0 = b.mul(lp.i, ir.Constant(I64, nr), name=f"{label}.n0")

        def one(nvec: int, last_lanes: int) -> None:
            masks = [None] * nvec
            if last_lanes:
                masks[-1] = vx.lane_mask(last_lanes)
            run(n0, nvec, masks)

        full_or_edge_panel(b, lp.i, nfull=nfull, edge=n - nfull * nr, nv=nv, vw=vw, run=one)
        lp.close()

    def block(rows: int) -> None:
        def scores(n0, nvec, masks) -> None:
            acc = emit_tile(vx, mr=rows, nv=nvec, kc=d, a_ptr=vx.gep(q_g, vx.off((i0, d))), a_rs=d, a_ks=1,
                            b_ptr=vx.gep(kt_g, n0), b_ks=t, b_masks=masks, b_prefetch=B_PREFETCH, name="qk")
            for r in range(rows):
                row = vx.off(i0, r)
                mrow = vx.gep(mask_g, vx.off((row, mask_row))) if mask_g is not None else None
                for j in range(nvec):
                    val = acc[r][j]
                    if scale != 1.0:
                        val = vx.fmul(val, vx.fconst(scale))
                    if mrow is not None:
                        col = vx.off(n0, j * vw)
                        m = vx.load(vx.gep(mrow, col), masks[j]) if mask_col else vx.load_splat(mrow)
                        val = vx.fadd(val, m)
                    vx.store(val, vx.gep(scratch, vx.off(r * tp, n0, j * vw)), masks[j])

        panels(t, "qk.panel", scores)
        rl = Loop(vx, "sm.row", 0, rows)
        prow = vx.gep(scratch, vx.off((rl.i, tp)), name="prow")
        softmax_row(vx, prow, prow, t, nan_to_zero)
        rl.close()

        def times_v(n0, nvec, masks) -> None:
            def part(k0, kcn):
                return emit_tile(vx, mr=rows, nv=nvec, kc=kcn, a_ptr=vx.gep(scratch, k0), a_rs=tp, a_ks=1,
                                 b_ptr=vx.gep(v_g, vx.off((k0, e), n0)), b_ks=e, b_masks=masks, b_prefetch=B_PREFETCH,
                                 name="pv")

            chunks = math.ceil(t / KC)
            if chunks == 1:
                acc = part(0, t)
            else:  # each chunk summed from zero, the chunk sums added (batched.py's precision rule)
                flat = [x for row in part(0, KC) for x in row]
                if chunks > 2:
                    lp = Loop(vx, "pv.chunk", 1, chunks - 1, carried=flat)
                    more = part(b.mul(lp.i, ir.Constant(I64, KC), name="k0"), KC)
                    flat = lp.close([vx.fadd(a, x) for a, x in zip(lp.vals, [x for row in more for x in row])])
                last = part((chunks - 1) * KC, t - (chunks - 1) * KC)
                flat = [vx.fadd(a, x) for a, x in zip(flat, [x for row in last for x in row])]
                acc = [flat[r * nvec:(r + 1) * nvec] for r in range(rows)]
            for r in range(rows):
                orow = vx.gep(out_g, vx.off((vx.off(i0, r), e), n0))
                for j in range(nvec):
                    vx.store(acc[r][j], vx.gep(orow, j * vw), masks[j])

        panels(e, "pv.panel", times_v)

    if mfull == mblocks:
        block(mr)
    else:  # choose_tile gives mr <= s, so full blocks come first and one edge block last
        with b.if_else(b.icmp_signed("<", mb, ir.Constant(I64, mfull), name="mb.isfull")) as (full, edge):
            with full:
                block(mr)
            with edge:
                block(s - mfull * mr)
    unit.close()
    b.ret_void()
    return KernelInfo(function=fn, scratch_bytes_per_thread=4 * mr * tp)
