"""Batched matrix products on gemm's micro-kernel (emit_tile), with a K-blocked reduction.

out[g](M, N) = act(A[g](M, K) @ B[g](K, N) + bias) for every batch index g; A, B and out batch offsets
come from compile-time strides (0 broadcasts an operand). B is either a constant matrix shared by all
batches, packed at compile time into [N/NR][K][NR] panels, or a runtime operand read in place (row-major,
masked on the last panel). Threads split (batch, column panel, row block) units in contiguous ranges.

Precision: each tile sums its reduction in chunks of KC from zero and adds each chunk's partial sums to
the output (as MLAS does), so an output is a sum of K / KC chunk sums of KC products each instead of one
chain of K products: on T5's K = 2048 projections that halves the worst error against float64. The
partials live in the output tile (L1), so A rows and the B panel stream exactly as in one long chain.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import activations
from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.vector import I64, Loop, VecIR, block_loop, imin, panel_walk
from glowpy.errors import InternalError, MismatchingShape

from .common import KernelInfo
from .gemm import choose_tile, emit_tile, full_or_edge_panel, kernel_function

KC = 256  # reduction chunk: an output sums ceil(K / KC) chunk sums
# A row bands of at most this many bytes stay in L2 while every column panel passes over them
A_BAND_BYTES = 1 << 20
# B rows prefetched ahead by the tile: the hardware streamers alone left a B panel read from L2 or
# memory 7-20% short of onnxruntime (Xeon, AVX-512, 1 thread); 8 to 32 rows ahead measured alike.
B_PREFETCH = 16


def batch_offsets(b: ir.IRBuilder, g, batch: tuple[int, ...], strides: list[tuple[int, ...]]) -> list:
    """Element offsets of batch index g (row-major over `batch`) for each operand's batch strides."""
    offs = [ir.Constant(I64, 0) for _ in strides]
    rest = g
    for d in reversed(range(len(batch))):
        idx = b.urem(rest, ir.Constant(I64, batch[d]), name=f"g{d}") if d else rest
        if d:
            rest = b.udiv(rest, ir.Constant(I64, batch[d]), name=f"g{d}.rest")
        for j, st in enumerate(strides):
            if st[d]:
                offs[j] = b.add(offs[j], b.mul(idx, ir.Constant(I64, st[d])), name="g.off")
    return offs


def _pack(N: int, K: int, nr: int, b: np.ndarray | None, bias: np.ndarray | None) -> list[np.ndarray]:
    """The constant B as [N/NR][K][NR] panels (zero-padded columns), then the padded column bias."""
    nblocks = math.ceil(N / nr)
    packed: list[np.ndarray] = []
    if b is not None:
        bm = np.asarray(b, np.float32)
        if bm.shape != (K, N):
            raise MismatchingShape("constant B does not match K x N", expected=(K, N), found=bm.shape)
        panels = np.zeros((nblocks, K, nr), np.float32)  # filled in place: no padded copy of B
        nfull = N // nr
        panels[:nfull] = bm[:, :nfull * nr].reshape(K, nfull, nr).transpose(1, 0, 2)
        if nfull < nblocks:
            panels[nfull, :, :N - nfull * nr] = bm[:, nfull * nr:]
        packed.append(panels.ravel())
    if bias is not None:
        bb = np.asarray(bias, np.float32).reshape(-1)
        if bb.size != N:
            raise MismatchingShape("column bias must have N values", expected=N, found=bb.size)
        padded = np.zeros(nblocks * nr, np.float32)
        padded[:N] = bb
        packed.append(padded)
    return packed


def wide_tile(M: int, K: int, vector_width: int) -> tuple[int, int]:
    """gemm.choose_tile's wide block: 12 x 2 while 12 A rows fit L1 (K <= 1024) and A stays cached
    whole (one row band), so B, streamed from L2, is read once per 12 rows; else 8 x 3, as A is re-read
    once per column panel. ViT's / BERT's K = 768 projections ran 3-9% faster as 12 x 2 than 8 x 3, ViT's
    K = 3072 one and Whisper's 1500-row ones 2-11% slower (Xeon, 1 thread)."""
    return choose_tile(M, vector_width, wide=True, tall=K <= 1024 and 4 * M * K <= A_BAND_BYTES)


def pack_batched_gemm(*, M: int, N: int, K: int, b: np.ndarray | None = None, bias: np.ndarray | None = None,
                      vector_width: int, **_: object) -> list[np.ndarray]:
    """emit_batched_gemm's packed arrays without generating its code (kernel sharing's packer)."""
    return _pack(N, K, wide_tile(M, K, vector_width)[1] * vector_width, b, bias)


def row_bands(M: int, N: int, K: int, mr: int, nr: int) -> int:
    """Row blocks per band: all of them, or, when A is too big to stay cached while each of the N / NR
    column panels reads it again, bands of A_BAND_BYTES that the panels pass over one band at a time,
    if re-reading B once per band moves fewer bytes than re-reading A once per panel (Whisper's 1500 x
    384 activations against 32-wide panels)."""
    mblocks, nblocks = math.ceil(M / mr), math.ceil(N / nr)
    a_bytes, b_bytes = 4 * M * K, 4 * K * N
    bands = math.ceil(a_bytes / A_BAND_BYTES)
    if bands <= 1 or 2 * bands * b_bytes >= nblocks * a_bytes:
        return mblocks
    return math.ceil(mblocks / bands)


def emit_batched_gemm(module: ir.Module, name: str, *, M: int, N: int, K: int, batch: tuple[int, ...] = (),
                      a_batch_strides: tuple[int, ...] = (), b_batch_strides: tuple[int, ...] = (),
                      b: np.ndarray | None = None, bias: np.ndarray | None = None, activation: str = "none",
                      activation_params=(), vector_width: int, kc: int = KC) -> KernelInfo:
    """The step for out = act(A @ B + column bias), batched; args (out, A, B or null, scratch, packed...)."""
    activations.check(activation, activation_params)
    if min(M, N, K) < 1:
        raise MismatchingShape("matrix product dimensions must be positive", expected="M, N, K >= 1",
                               found=(M, N, K))
    if len(a_batch_strides) != len(batch) or len(b_batch_strides) != len(batch):
        raise InternalError("one batch stride per batch dim", expected=len(batch),
                            found=(len(a_batch_strides), len(b_batch_strides)))
    if b is not None and any(b_batch_strides):
        raise InternalError("a constant B is one matrix shared by every batch", expected=0, found=b_batch_strides)
    vw = vector_width
    mr, nv = wide_tile(M, K, vw)
    nr = nv * vw
    mblocks, mfull = math.ceil(M / mr), M // mr
    nblocks, nfull = math.ceil(N / nr), N // nr
    n_edge = N - nfull * nr
    groups = math.prod(batch)

    packed = _pack(N, K, nr, b, bias)
    b_const = 0 if b is not None else None
    bias_arg = len(packed) - 1 if bias is not None else None

    fn = kernel_function(module, name, len(packed))
    out_p, a_p, b_p = fn.args[:3]
    pk = fn.args[4:4 + len(packed)]
    tid, nthreads = fn.args[-2:]
    bl = ir.IRBuilder(fn.append_basic_block("entry"))
    vx = VecIR(module, bl, vw)
    band = row_bands(M, N, K, mr, nr)  # row blocks per band: units are (batch, band, panel, block in band)
    bands = math.ceil(mblocks / band)
    lo, hi = U.thread_range(bl, groups * bands * nblocks * band, tid, nthreads, "unit")
    chunks = math.ceil(K / kc)

    def do_panel(gp, mb_lo, mb_hi) -> None:
        if bands == 1:
            panel(bl.udiv(gp, ir.Constant(I64, nblocks), name="g"), bl.urem(gp, ir.Constant(I64, nblocks), name="nb"),
                  mb_lo, mb_hi)
            return
        gb = bl.udiv(gp, ir.Constant(I64, nblocks), name="gb")
        first = bl.mul(bl.urem(gb, ir.Constant(I64, bands)), ir.Constant(I64, band), name="band.mb0")
        lo_b = bl.add(first, mb_lo, name="band.lo")
        hi_b = imin(bl, bl.add(first, mb_hi), ir.Constant(I64, mblocks), name="band.hi")
        # the last band may be short: its units past mblocks do nothing
        with bl.if_then(bl.icmp_signed("<", lo_b, hi_b, name="band.any")):
            panel(bl.udiv(gb, ir.Constant(I64, bands), name="g"), bl.urem(gp, ir.Constant(I64, nblocks), name="nb"),
                  lo_b, hi_b)

    def panel(g, nb, mb_lo, mb_hi) -> None:
        a_off, b_off = batch_offsets(bl, g, batch, [a_batch_strides, b_batch_strides])
        a_g = vx.gep(a_p, a_off, name="a.g")
        b_g = vx.gep(b_p, b_off, name="b.g")
        out_g = vx.gep(out_p, vx.off((g, M * N)), name="out.g")
        n0 = bl.mul(nb, ir.Constant(I64, nr), name="n0")

        def run(nvec: int, last_lanes: int) -> None:
            masks = [None] * nvec
            if last_lanes:
                masks[-1] = vx.lane_mask(last_lanes)

            def tile(mb, edge: bool) -> None:
                rows = M - mfull * mr if edge else mr
                i0 = bl.mul(mb, ir.Constant(I64, mr), name="i0")
                orow = [vx.gep(out_g, vx.off((vx.off(i0, r), N), n0)) for r in range(rows)]

                def part(k0, kcn):
                    aptr = vx.gep(a_g, vx.off((i0, K), k0))
                    if b_const is not None:
                        bptr = vx.gep(pk[b_const], vx.off((nb, K * nr), (k0, nr)), name="bpanel")
                        b_ks, b_masks = nr, None
                    else:
                        bptr = vx.gep(b_g, vx.off((k0, N), n0), name="bcols")
                        b_ks, b_masks = N, masks
                    acc = emit_tile(vx, mr=rows, nv=nvec, kc=kcn, a_ptr=aptr, a_rs=K, a_ks=1, b_ptr=bptr,
                                    b_ks=b_ks, b_masks=b_masks, b_prefetch=B_PREFETCH, name="bmm")
                    return [x for row in acc for x in row]

                def added(flat):
                    return [vx.fadd(vx.load(vx.gep(orow[r], v * vw), masks[v], name="part"), flat[r * nvec + v])
                            for r in range(rows) for v in range(nvec)]

                def store(flat) -> None:
                    for r in range(rows):
                        for v in range(nvec):
                            vx.store(flat[r * nvec + v], vx.gep(orow[r], v * vw), masks[v])

                def final(flat) -> None:
                    col_bias = None
                    if bias_arg is not None:
                        col_bias = [vx.load(vx.gep(pk[bias_arg], vx.off(n0, v * vw))) for v in range(nvec)]
                    for r in range(rows):
                        for v in range(nvec):
                            val = flat[r * nvec + v]
                            if col_bias is not None:
                                val = vx.fadd(val, col_bias[v])
                            vx.store(vx.activation(val, activation, activation_params), vx.gep(orow[r], v * vw),
                                     masks[v])

                if chunks == 1:
                    final(part(0, K))
                    return
                # chunk 0 stores its sums, the middle chunks add theirs, the last one adds and finishes
                store(part(0, kc))
                if chunks > 2:
                    lp = Loop(vx, "kchunk", 1, chunks - 1)
                    store(added(part(bl.mul(lp.i, ir.Constant(I64, kc), name="k0"), kc)))
                    lp.close()
                final(added(part((chunks - 1) * kc, K - (chunks - 1) * kc)))

            block_loop(vx, lo=mb_lo, hi=mb_hi, blocks=mblocks, full=mfull, body=tile)

        full_or_edge_panel(bl, nb, nfull=nfull, edge=n_edge, nv=nv, vw=vw, run=run)

    panel_walk(vx, lo=lo, hi=hi, mblocks=band, body=do_panel)
    bl.ret_void()
    return KernelInfo(function=fn, packed=packed)
