"""Register-blocked GEMM kernel generator, and the vector machinery conv.py shares.

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

from glowpy.backends.cpu import activations
from glowpy.backends.cpu import irutil as U
from glowpy.errors import InternalError, MismatchingShape, UnsupportedAttribute, UnsupportedShape

from .common import KernelInfo

F32 = ir.FloatType()
I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()

# Reduction code is pure fma chains: full fast-math is safe and lets LLVM reassociate address math.
FAST = ("fast",)
# Epilogues may see inf from the user's data: keep nnan/ninf out so clamps and selects stay exact.
EPI = ("nsz", "arcp", "contract", "afn", "reassoc")

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


def choose_tile(rows: int, vector_width: int) -> tuple[int, int]:
    """(MR, NV): rows per register block and vectors per row, fitting the register file.

    AVX-512 has 32 vector registers: 8 x 2 accumulators + 2 B vectors + a broadcast fit; AVX2/SSE have
    16, so 6 x 2. Tiny row counts take a wider block so enough independent fma chains hide latency.
    """
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


class Loop:
    """A counted loop `for i in [start, stop) step` with optional loop-carried values.

    Usage: `lp = Loop(vx, "k", 0, n, carried=[...]); ... body using lp.i / lp.vals ...; out = lp.close(new)`.
    After close() the builder sits in the exit block and `out` are the carried values at exit.
    """

    def __init__(self, vx: VecIR, name: str, start, stop, step: int = 1, carried=()) -> None:
        b = self.b = vx.b
        self.step = step
        pre = b.block
        self.head = b.append_basic_block(f"{name}.head")
        body = b.append_basic_block(f"{name}.body")
        self.exit = b.append_basic_block(f"{name}.exit")
        start, stop = vx.i64(start), vx.i64(stop)
        b.branch(self.head)
        b.position_at_end(self.head)
        self.i = b.phi(I64, name)
        self.i.add_incoming(start, pre)
        self.vals = []
        for j, v in enumerate(carried):
            phi = b.phi(v.type, f"{name}.acc{j}")
            phi.add_incoming(v, pre)
            self.vals.append(phi)
        b.cbranch(b.icmp_signed("<", self.i, stop, name=f"{name}.more"), body, self.exit)
        b.position_at_end(body)

    def close(self, new_vals=()) -> list:
        b = self.b
        nxt = b.add(self.i, ir.Constant(I64, self.step), name="next")
        self.i.add_incoming(nxt, b.block)
        for phi, v in zip(self.vals, new_vals):
            phi.add_incoming(v, b.block)
        b.branch(self.head)
        b.position_at_end(self.exit)
        return list(self.vals)


class VecIR:
    """Builder helpers at one vector width: typed constants, intrinsics, masked memory ops, math."""

    def __init__(self, module: ir.Module, builder: ir.IRBuilder, vector_width: int) -> None:
        if vector_width not in (4, 8, 16):
            raise UnsupportedAttribute("vector width must be 4, 8 or 16", expected="4, 8 or 16",
                                       found=vector_width)
        self.m = module
        self.b = builder
        self.vw = vector_width
        self.vty = ir.VectorType(F32, vector_width)
        self.ity = ir.VectorType(I32, vector_width)
        self.mty = ir.VectorType(I1, vector_width)
        self.pty = ir.VectorType(PTR, vector_width)
        self.zero = ir.Constant(self.vty, [0.0] * vector_width)
        self.iota = ir.Constant(self.ity, list(range(vector_width)))

    # --- constants and scalars ---
    @staticmethod
    def i64(v):
        return ir.Constant(I64, int(v)) if isinstance(v, int | np.integer) else v

    def fconst(self, v: float) -> ir.Constant:
        return ir.Constant(self.vty, [float(np.float32(v))] * self.vw)

    def iconst(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, [int(v)] * self.vw)

    def intrinsic(self, name: str, ret, args) -> ir.Function:
        fn = self.m.globals.get(name)
        if fn is None:
            fn = ir.Function(self.m, ir.FunctionType(ret, list(args)), name)
        return fn

    def _suffix(self) -> str:
        return f"v{self.vw}f32"

    # --- address arithmetic (no inbounds: masked-off lanes may point before a buffer) ---
    def gep(self, base, index, name: str = ""):
        if isinstance(index, int | np.integer):
            if index == 0:
                return base
            index = ir.Constant(I64, int(index))
        return self.b.gep(base, [index], source_etype=F32, name=name)

    def off(self, *terms):
        """Sum of i64 terms: ints fold, (value, int) pairs multiply."""
        b = self.b
        const = 0
        acc = None
        for t in terms:
            if isinstance(t, int | np.integer):
                const += int(t)
                continue
            if isinstance(t, tuple):
                v, k = t
                if isinstance(v, int | np.integer):
                    const += int(v) * int(k)
                    continue
                if k == 0:
                    continue
                t = v if k == 1 else b.mul(v, ir.Constant(I64, int(k)), name="scaled")
            acc = t if acc is None else b.add(acc, t, name="off")
        if acc is None:
            return ir.Constant(I64, const)
        return acc if const == 0 else b.add(acc, ir.Constant(I64, const), name="off")

    # --- vector memory ---
    def load(self, ptr, mask=None, name: str = ""):
        if mask is None:
            return self.b.load(ptr, name=name, align=4, typ=self.vty)
        fn = self.intrinsic(f"llvm.masked.load.{self._suffix()}.p0", self.vty, [PTR, I32, self.mty, self.vty])
        return self.b.call(fn, [ptr, ir.Constant(I32, 4), mask, self.zero], name=name)

    def store(self, val, ptr, mask=None) -> None:
        if mask is None:
            self.b.store(val, ptr, align=4)
            return
        fn = self.intrinsic(f"llvm.masked.store.{self._suffix()}.p0", VOID, [self.vty, PTR, I32, self.mty])
        self.b.call(fn, [val, ptr, ir.Constant(I32, 4), mask])

    def ptrs(self, base, idx, name: str = ""):
        """<VW x ptr>: base + idx[l] floats (idx: <VW x i32>)."""
        ptrs = self.b.gep(base, [idx], source_etype=F32, name=name)
        ptrs.type = self.pty  # llvmlite types a vector-index gep as a scalar ptr
        return ptrs

    def gather(self, base, idx, mask, name: str = ""):
        """Lanes base[idx[l]] where mask[l], else 0 (idx: <VW x i32>)."""
        return self.gather_ptrs(self.ptrs(base, idx, name=f"{name}.ptrs"), mask, name=name)

    def gather_ptrs(self, ptrs, mask, name: str = ""):
        if mask is None:
            mask = self.lane_mask(self.vw)
        fn = self.intrinsic(f"llvm.masked.gather.{self._suffix()}.v{self.vw}p0", self.vty,
                            [self.pty, I32, self.mty, self.vty])
        return self.b.call(fn, [ptrs, ir.Constant(I32, 4), mask, self.zero], name=name)

    def scatter(self, val, ptrs, mask) -> None:
        if mask is None:
            mask = self.lane_mask(self.vw)
        fn = self.intrinsic(f"llvm.masked.scatter.{self._suffix()}.v{self.vw}p0", VOID,
                            [self.vty, self.pty, I32, self.mty])
        self.b.call(fn, [val, ptrs, ir.Constant(I32, 4), mask])

    def splat(self, scalar, name: str = ""):
        """Broadcast a float or i32 scalar value to all lanes."""
        vty = self.vty if scalar.type == F32 else self.ity
        undef = ir.Constant(vty, ir.Undefined)
        one = self.b.insert_element(undef, scalar, ir.Constant(I32, 0), name=f"{name}.lane0" if name else "")
        return self.b.shuffle_vector(one, undef, ir.Constant(self.ity, [0] * self.vw), name=name)

    def load_splat(self, ptr, name: str = ""):
        return self.splat(self.b.load(ptr, align=4, typ=F32, name=f"{name}.s" if name else ""), name=name)

    def lane_mask(self, count: int):
        """Constant mask with the first `count` lanes on."""
        return ir.Constant(self.mty, [1 if i < count else 0 for i in range(self.vw)])

    # --- arithmetic ---
    def fma(self, a, b, c, name: str = ""):
        fn = self.intrinsic(f"llvm.fma.{self._suffix()}", self.vty, [self.vty] * 3)
        return self.b.call(fn, [a, b, c], name=name, fastmath=FAST)

    def _unary(self, op: str, x, name: str = ""):
        fn = self.intrinsic(f"llvm.{op}.{self._suffix()}", self.vty, [self.vty])
        return self.b.call(fn, [x], name=name, fastmath=EPI)

    def fadd(self, a, b, name: str = ""):
        return self.b.fadd(a, b, name=name, flags=EPI)

    def fsub(self, a, b, name: str = ""):
        return self.b.fsub(a, b, name=name, flags=EPI)

    def fmul(self, a, b, name: str = ""):
        return self.b.fmul(a, b, name=name, flags=EPI)

    def fdiv(self, a, b, name: str = ""):
        return self.b.fdiv(a, b, name=name, flags=EPI)

    def fmax(self, a, b, name: str = ""):
        return self.b.select(self.b.fcmp_ordered(">", a, b), a, b, name=name)

    def fmin(self, a, b, name: str = ""):
        return self.b.select(self.b.fcmp_ordered("<", a, b), a, b, name=name)

    def exp(self, x, name: str = "exp"):
        """exp(x) for a vector: 2^n * p(r) with x = n ln2 + r (Cephes expf polynomial, ~1 ulp)."""
        b = self.b
        x = self.fmin(self.fmax(x, self.fconst(-87.3)), self.fconst(88.3))
        n = self._unary("floor", self.fadd(self.fmul(x, self.fconst(1.4426950408889634)), self.fconst(0.5)))
        r = self.fsub(x, self.fmul(n, self.fconst(0.693359375)))
        r = self.fsub(r, self.fmul(n, self.fconst(-2.12194440e-4)))
        p = self.fconst(1.9875691500e-4)
        for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            p = self.fadd(self.fmul(p, r), self.fconst(c))
        y = self.fadd(self.fadd(self.fmul(self.fmul(p, r), r), r), self.fconst(1.0))
        ni = b.fptosi(n, self.ity)
        pow2 = b.bitcast(b.shl(b.add(ni, self.iconst(127)), self.iconst(23)), self.vty)
        return self.fmul(y, pow2, name=name)

    def fabs(self, x, name: str = "abs"):
        return self._unary("fabs", x, name=name)

    def activation(self, x, kind: str, params=()):
        """A fused epilogue activation (backends/cpu/activations.py) of a vector."""
        return activations.emit(activations.VectorMath(self), x, kind, params)


def emit_tile(vx: VecIR, *, mr: int, nv: int, kc: int, a_ptr, a_rs: int, a_ks: int, b_ptr, b_ks: int,
              b_masks=None, init=None, name: str = "tile") -> list[list]:
    """acc[r][v] = init[r][v] + sum_{k < kc} A[r, k] * B[k, v*VW : (v+1)*VW].

    A[r, k] is the float at a_ptr + r*a_rs + k*a_ks (broadcast), B's vector (k, v) starts at
    b_ptr + k*b_ks + v*VW (masked by b_masks[v] when given). Returns the accumulators (mr lists of nv).
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
    new = []
    for r in range(mr):
        a = vx.load_splat(vx.gep(ak, r * a_rs), name=f"{name}.a{r}")
        new.extend(vx.fma(a, bv[v], acc[r][v], name=f"{name}.c{r}_{v}") for v in range(nv))
    out = lp.close(new)
    del b
    return [out[r * nv:(r + 1) * nv] for r in range(mr)]


def imin(b: ir.IRBuilder, x, y, name: str = ""):
    return b.select(b.icmp_signed("<", x, y), x, y, name=name)


def block_loop(vx: VecIR, *, lo, hi, blocks: int, full: int, body) -> None:
    """Run body(mb, edge) for mb in [lo, hi) of a range of `blocks` row blocks, the first `full` of
    them full-height; the (single) last block is the edge when full < blocks."""
    b = vx.b
    stop = imin(b, hi, ir.Constant(I64, full), name="mb.fullstop")
    lp = Loop(vx, "mb", lo, stop)
    body(lp.i, False)
    lp.close()
    if full < blocks:
        has_edge = b.icmp_signed(">", hi, ir.Constant(I64, full), name="mb.has_edge")
        with b.if_then(has_edge):
            body(ir.Constant(I64, full), True)


def panel_walk(vx: VecIR, *, lo, hi, mblocks: int, body) -> None:
    """Walk work units [lo, hi) where unit = panel * mblocks + mb, grouping runs of the same panel:
    body(panel, mb_lo, mb_hi) once per panel touched (so its B panel is packed once per thread)."""
    b = vx.b
    mbs = ir.Constant(I64, mblocks)
    pre = b.block
    head = b.append_basic_block("panel.head")
    work = b.append_basic_block("panel.body")
    done = b.append_basic_block("panel.done")
    b.branch(head)
    b.position_at_end(head)
    u = b.phi(I64, "unit")
    u.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", u, hi, name="unit.more"), work, done)
    b.position_at_end(work)
    panel = b.udiv(u, mbs, name="panel")
    mb_lo = b.urem(u, mbs, name="mb.lo")
    left = b.add(mb_lo, b.sub(hi, u, name="units.left"), name="mb.want")
    mb_hi = imin(b, left, mbs, name="mb.hi")
    body(panel, mb_lo, mb_hi)
    u.add_incoming(b.add(u, b.sub(mb_hi, mb_lo, name="mb.count"), name="unit.next"), b.block)
    b.branch(head)
    b.position_at_end(done)


def chunk_loop(vx: VecIR, cg: int, cc: int, body) -> None:
    """body(c0, ncc, first, last) per reduction chunk of cc channels. One chunk is emitted inline with
    constants; several run as one runtime loop (first/last are i1 values) so tile code exists once."""
    b = vx.b
    chunks = math.ceil(cg / cc)
    if chunks == 1:
        body(ir.Constant(I64, 0), cg, True, True)
        return
    lp = Loop(vx, "chunk", 0, chunks)
    c0 = b.mul(lp.i, ir.Constant(I64, cc), name="c0")
    ncc = imin(b, ir.Constant(I64, cc), b.sub(ir.Constant(I64, cg), c0), name="ncc")
    first = b.icmp_signed("==", lp.i, ir.Constant(I64, 0), name="chunk.first")
    last = b.icmp_signed("==", lp.i, ir.Constant(I64, chunks - 1), name="chunk.last")
    body(c0, ncc, first, last)
    lp.close()


def choose(vx: VecIR, cond, make_a, make_b) -> list:
    """make_a() if cond else make_b(), for cond a Python bool or an i1 (two branches joined by phis)."""
    if cond is True:
        return make_a()
    if cond is False:
        return make_b()
    b = vx.b
    with b.if_else(cond) as (then, otherwise):
        with then:
            va, ba = make_a(), b.block
        with otherwise:
            vb, bb = make_b(), b.block
    out = []
    for x, y in zip(va, vb):
        phi = b.phi(x.type, name="sel")
        phi.add_incoming(x, ba)
        phi.add_incoming(y, bb)
        out.append(phi)
    return out


def when(vx: VecIR, cond, then_fn, else_fn) -> None:
    if cond is True or cond is False:
        (then_fn if cond else else_fn)()
        return
    with vx.b.if_else(cond) as (then, otherwise):
        with then:
            then_fn()
        with otherwise:
            else_fn()


def _epilogue_store(vx: VecIR, val, ptr, mask, activation, params) -> None:
    vx.store(vx.activation(val, activation, params), ptr, mask)


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
        packed.append(np.ascontiguousarray(padded.reshape(K, nblocks, nr).transpose(1, 0, 2)).ravel())
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

            if n_edge == 0:
                run(nv, 0)
            elif nfull == 0:
                run(math.ceil(n_edge / vw), n_edge % vw)
            else:
                is_full = bl.icmp_signed("<", nb, ir.Constant(I64, nfull), name="panel.isfull")
                with bl.if_else(is_full) as (then, otherwise):
                    with then:
                        run(nv, 0)
                    with otherwise:
                        run(math.ceil(n_edge / vw), n_edge % vw)

        panel_walk(vx, lo=lo, hi=hi, mblocks=mblocks, body=do_panel)

    chunk_loop(vx, K, kcr, chunk)
    bl.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch_bytes)
