"""Register-blocked GEMM kernel generator: the micro-kernel gemm and conv share (vector helpers: vector.py).

The micro-kernel keeps an MR x (NV * VW) block of the output in vector registers across the whole
reduction: per k it loads NV vectors of the "B" operand (contiguous), broadcasts MR scalars of the "A"
operand and issues MR * NV fma's. Every operand address is base + compile-time strides, so the same
micro-kernel serves conv (A = packed weights, B = an im2col panel or the input itself) and gemm
(A = the runtime left operand, B = packed constant or runtime right operand). Edges are handled by a
smaller MR (rows) and by masked loads/stores on the last vector (columns), never by scalar code.

emit_gemm: constant B is packed at compile time into [N/NR][K][NR] panels (zero-padded); a runtime B
is read in place (row-major K x N) or, when transposed, gathered panel by panel into scratch. Threads
split (column panel, row block) tiles in contiguous ranges; no pointer alignment is assumed.
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
    VOID,
    Loop,
    VecIR,
    block_loop,
    choose,
    chunk_loop,
    panel_walk,
    when,
)
from glowpy.errors import InternalError, MismatchingShape, UnsupportedAttribute, UnsupportedShape

from .common import KernelInfo

KERNEL_ARG_NAMES = ("out", "x", "res_or_b", "scratch")


def kernel_function(module: ir.Module, name: str, n_packed: int) -> ir.Function:
    """Declare `void name(out, x, residual_or_b, scratch, packed..., i32 tid, i32 nthreads)`."""
    fnty = ir.FunctionType(VOID, [PTR] * (4 + n_packed) + [I32, I32])
    fn = ir.Function(module, fnty, name)
    names = list(KERNEL_ARG_NAMES) + [f"packed{i}" for i in range(n_packed)] + ["tid", "nthreads"]
    for arg, nm in zip(fn.args, names):
        arg.name = nm
    # out may alias the residual (in-place residual add); everything else is disjoint from out.
    for i in (1, 3, *range(4, 4 + n_packed)):
        fn.args[i].add_attribute("noalias")
    fn.attributes.add("nounwind")
    return fn


def choose_tile(rows: int, vector_width: int, wide: bool = False, tall: bool = False) -> tuple[int, int]:
    """(MR, NV): rows per register block and vectors per row, fitting the register file.

    AVX-512 has 32 vector registers: 8 x 2 accumulators + 2 B vectors + a broadcast fit; AVX2/SSE have
    16, so 6 x 2. Tiny row counts take a wider block so enough independent fma chains hide latency.
    wide (matrix products, AVX-512 only): 24 accumulators, MR <= rows: per k, 24 fma's against 2-3 B
    loads and 8-12 broadcasts instead of 16 against 10; with two 512-bit fma units (Intel, Zen 5) a
    16-accumulator block leaves them waiting on loads. 8 x 3, or with `tall` 12 x 2, which reads B
    once per 12 rows but A once per 32 columns (the caller's choice: batched.wide_tile).
    """
    if wide and vector_width >= 16:
        if rows <= 12:
            return rows, max(2, min(4, 24 // rows))
        return (12, 2) if tall else (8, 3)
    if vector_width >= 16:
        cands, acc_regs = (8, 7, 6), 26
    else:
        cands, acc_regs = (6, 5, 4), 12
    if rows <= cands[0]:
        mr = rows
    else:
        # fewest padded rows; ties go to the larger block (fewer B loads per fma)
        mr = min(cands, key=lambda c: (math.ceil(rows / c) * c, -c))
    nv = 2
    while mr * (nv + 1) <= acc_regs and mr * nv < 8 and nv < 4:
        nv += 1
    return mr, nv


def emit_tile(vx: VecIR, *, mr: int, nv: int, kc: int, a_ptr, a_rs: int, a_ks: int, b_ptr, b_ks: int,
              b_masks=None, init=None, a_prefetch: int = 0, b_prefetch: int = 0, stream: tuple | None = None,
              name: str = "tile") -> list[list]:
    """acc[r][v] = init[r][v] + sum_{k < kc} A[r, k] * B[k, v*VW : (v+1)*VW].

    A[r, k] is the float at a_ptr + r*a_rs + k*a_ks (broadcast), B's vector (k, v) starts at
    b_ptr + k*b_ks + v*VW (masked by b_masks[v] when given). a_prefetch > 0: every k also prefetches A
    that many floats ahead (A streamed from memory). b_prefetch > 0: every k also prefetches each cache
    line of B's row k + b_prefetch (a B panel streamed from L2 or memory). stream = (ptr, ks): every k
    also fetches the line at ptr + k*ks floats into L2 (data the following tiles read, fetched while this
    one computes rather than in a burst when they start). Returns the accumulators (mr lists of nv).
    """
    b = vx.b
    if init is None:
        init = [[vx.zero] * nv for _ in range(mr)]
    lp = Loop(vx, f"{name}.k", 0, kc, carried=[a for row in init for a in row])
    k = lp.i
    acc = [lp.vals[r * nv:(r + 1) * nv] for r in range(mr)]
    bk = vx.gep(b_ptr, vx.off((k, b_ks)), name=f"{name}.bk")
    bv = [vx.load(vx.gep(bk, v * vx.vw), None if b_masks is None else b_masks[v], name=f"{name}.b{v}")
          for v in range(nv)]
    ak = vx.gep(a_ptr, vx.off((k, a_ks)), name=f"{name}.ak")
    if a_prefetch:
        vx.prefetch(vx.gep(ak, a_prefetch))
    if b_prefetch:
        for off in range(0, nv * vx.vw, 16):  # 16 floats: one 64-byte line
            vx.prefetch(vx.gep(bk, b_prefetch * b_ks + off))
    if stream is not None:
        vx.prefetch(vx.gep(stream[0], vx.off((k, stream[1]))), locality=2)
    new = []
    for r in range(mr):
        a = vx.load_splat(vx.gep(ak, r * a_rs), name=f"{name}.a{r}")
        new.extend(vx.fma(a, bv[v], acc[r][v], name=f"{name}.c{r}_{v}") for v in range(nv))
    out = lp.close(new)
    del b
    return [out[r * nv:(r + 1) * nv] for r in range(mr)]


def _epilogue_store(vx: VecIR, val, ptr, mask, activation, params) -> None:
    vx.store(vx.activation(val, activation, params), ptr, mask)


def full_or_edge_panel(b: ir.IRBuilder, nb: ir.Value, *, nfull: int, edge: int, nv: int, vw: int, run) -> None:
    """Emit `run(nvec, tail_lanes)` for panel `nb`: the full width for the first `nfull` panels, the
    masked edge of `edge` columns for the last one (code for a case only where it can occur)."""
    edge_args = (math.ceil(edge / vw), edge % vw)
    if edge == 0:
        run(nv, 0)
    elif nfull == 0:
        run(*edge_args)
    else:
        with b.if_else(b.icmp_signed("<", nb, ir.Constant(I64, nfull), name="panel.isfull")) as (full, part):
            with full:
                run(nv, 0)
            with part:
                run(*edge_args)



def emit_gemm(module: ir.Module, name: str, *, M: int, N: int, K: int, a_trans: bool, b: np.ndarray | None,
              b_trans: bool, alpha: float, bias: np.ndarray | None, bias_kind: str, activation: str,
              activation_params, vector_width: int) -> KernelInfo:
    """out(M,N) = act(alpha * op(A) @ op(B) + bias); see the module docstring for the blocking."""
    activations.check(activation, activation_params)
    if min(M, N, K) < 1:
        raise MismatchingShape("gemm dimensions must be positive", expected="M, N, K >= 1", found=(M, N, K))
    if bias_kind not in ("none", "col", "full"):
        raise UnsupportedAttribute("unknown gemm bias kind", expected="none, col, full", found=bias_kind)
    if bias_kind != "none" and bias is None:
        raise InternalError("gemm bias_kind needs a bias array", expected=bias_kind, found=None)
    vw = vector_width
    mr, nv = choose_tile(M, vw)
    nr = nv * vw
    mblocks, mfull = math.ceil(M / mr), M // mr
    nblocks, nfull = math.ceil(N / nr), N // nr
    n_edge = N - nfull * nr  # columns in the last, partial panel (0: none)

    packed: list[np.ndarray] = []
    b_const = None
    if b is not None:
        bm = np.asarray(b, dtype=np.float32)
        bm = bm.T if b_trans else bm
        if bm.shape != (K, N):
            raise MismatchingShape("gemm B does not match K x N", expected=(K, N), found=bm.shape)
        # panels [nblocks][K][NR], zero-padded columns: the tile reads B contiguously, no masks
        padded = np.zeros((K, nblocks * nr), np.float32)
        padded[:, :N] = bm
        b_const = len(packed)
        packed.append(hugepages.contiguous(padded.reshape(K, nblocks, nr).transpose(1, 0, 2)).ravel())
    bias_arg = None
    if bias_kind == "col":
        bb = np.asarray(bias, np.float32).reshape(-1)
        if bb.size != N:
            raise MismatchingShape("gemm column bias must have N values", expected=N, found=bb.size)
        padded = np.zeros(nblocks * nr, np.float32)
        padded[:N] = bb
        bias_arg = len(packed)
        packed.append(padded)
    elif bias_kind == "full":
        bb = np.asarray(bias, np.float32)
        if bb.size != M * N:
            raise MismatchingShape("gemm full bias must be M x N", expected=(M, N), found=bb.shape)
        bias_arg = len(packed)
        packed.append(np.ascontiguousarray(bb.reshape(M * N)))

    pack_b = b is None and b_trans  # runtime B^T: transpose each panel into scratch
    if pack_b and N * K >= 1 << 31:
        raise UnsupportedShape("runtime transposed B too large for 32-bit gather indices", expected="< 2^31",
                               found=N * K)
    # One reduction chunk: splitting K (as conv does) measured 5-15% slower here at 512..2048, since the
    # unpacked A rows then restart every chunk and L2 streams a whole B panel fast enough.
    kcr = K
    scratch_bytes = kcr * nr * 4 + 64 if pack_b else 0

    fn = kernel_function(module, name, len(packed))
    out_p, a_p, rb_p, scratch_p = fn.args[:4]
    pk = fn.args[4:4 + len(packed)]
    tid, nthreads = fn.args[-2:]
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    vx = VecIR(module, builder, vw)
    bl = builder
    if pack_b:
        # align the private panel to a cache line (the caller promises nothing)
        raw = bl.ptrtoint(scratch_p, I64, name="scratch.addr")
        aligned = bl.and_(bl.add(raw, ir.Constant(I64, 63), name="scratch.up"), ir.Constant(I64, ~63),
                          name="scratch.al")
        panel_buf = bl.inttoptr(aligned, PTR, name="panel.buf")

    lo, hi = U.thread_range(vx.b, nblocks * mblocks, tid, nthreads, "unit")

    def chunk(k0, kc, first, last) -> None:
        """Rows [k0, k0 + kc) of the reduction for every tile this thread owns."""

        def do_panel(nb, mb_lo, mb_hi) -> None:
            n0 = bl.mul(nb, ir.Constant(I64, nr), name="n0")

            def run(nvec: int, last_lanes: int) -> None:
                masks = [None] * nvec
                if last_lanes:
                    masks[-1] = vx.lane_mask(last_lanes)
                if b_const is not None:
                    bptr = vx.gep(pk[b_const], vx.off((nb, K * nr), (k0, nr)), name="bpanel")
                    b_ks, b_masks = nr, None
                elif pack_b:
                    # gather column n0+j of op(B) = row n0+j of the stored (N, K) matrix
                    lp = Loop(vx, "packk", 0, kc)
                    kk = bl.trunc(bl.add(k0, lp.i), I32)
                    for v in range(nvec):
                        col = bl.add(vx.splat(bl.trunc(n0, I32)), vx.iconst(v * vw), name="col")
                        col = bl.add(col, vx.iota)
                        idx = bl.add(bl.mul(col, vx.iconst(K)), vx.splat(kk), name="bt.idx")
                        val = vx.gather(rb_p, idx, masks[v], name="bt")
                        vx.store(val, vx.gep(panel_buf, vx.off((lp.i, nr), v * vw)))
                    lp.close()
                    bptr, b_ks, b_masks = panel_buf, nr, None
                else:
                    bptr = vx.gep(rb_p, vx.off((k0, N), n0), name="bcols")
                    b_ks, b_masks = N, masks

                def tile(mb, edge: bool) -> None:
                    rows = M - mfull * mr if edge else mr
                    i0 = bl.mul(mb, ir.Constant(I64, mr), name="i0")
                    if a_trans:  # A stored (K, M)
                        aptr, a_rs, a_ks = vx.gep(a_p, vx.off(i0, (k0, M))), 1, M
                    else:
                        aptr, a_rs, a_ks = vx.gep(a_p, vx.off((i0, K), k0)), K, 1
                    orow = [vx.gep(out_p, vx.off((vx.off(i0, r), N), n0)) for r in range(rows)]
                    flat = choose(vx, first, lambda: [vx.zero] * (rows * nvec),
                                  lambda: [vx.load(vx.gep(orow[r], v * vw), masks[v], name="part")
                                           for r in range(rows) for v in range(nvec)])
                    acc = emit_tile(vx, mr=rows, nv=nvec, kc=kc, a_ptr=aptr, a_rs=a_rs, a_ks=a_ks, b_ptr=bptr,
                                    b_ks=b_ks, b_masks=b_masks, init=[flat[r * nvec:(r + 1) * nvec]
                                                                     for r in range(rows)], name="gemm")

                    def final() -> None:
                        col_bias = None
                        if bias_kind == "col":
                            col_bias = [vx.load(vx.gep(pk[bias_arg], vx.off(n0, v * vw))) for v in range(nvec)]
                        for r in range(rows):
                            row = vx.off(i0, r)
                            for v in range(nvec):
                                val = acc[r][v]
                                if alpha != 1.0:
                                    val = vx.fmul(val, vx.fconst(alpha))
                                if col_bias is not None:
                                    val = vx.fadd(val, col_bias[v])
                                elif bias_kind == "full":
                                    fb = vx.gep(pk[bias_arg], vx.off((row, N), n0, v * vw))
                                    val = vx.fadd(val, vx.load(fb, masks[v]))
                                _epilogue_store(vx, val, vx.gep(orow[r], v * vw), masks[v], activation,
                                                activation_params)

                    def partial() -> None:
                        for r in range(rows):
                            for v in range(nvec):
                                vx.store(acc[r][v], vx.gep(orow[r], v * vw), masks[v])

                    when(vx, last, final, partial)

                block_loop(vx, lo=mb_lo, hi=mb_hi, blocks=mblocks, full=mfull, body=tile)

            full_or_edge_panel(bl, nb, nfull=nfull, edge=n_edge, nv=nv, vw=vw, run=run)

        panel_walk(vx, lo=lo, hi=hi, mblocks=mblocks, body=do_panel)

    chunk_loop(vx, K, kcr, chunk)
    bl.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch_bytes)
