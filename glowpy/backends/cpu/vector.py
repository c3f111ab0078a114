"""The vector layer of the CPU backend's code generation: helpers at one vector width (typed
constants, intrinsics, masked loads, stores, gathers and scatters, fma and math), counted loops with
carried values, and the blocked loop shapes the register-blocked kernels (gemm.py, conv.py) walk.
It builds on irutil.py, the scalar layer (types, declarations, thread ranges), and owns no kernel.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import activations
from glowpy.backends.cpu import irutil as U
from glowpy.errors import UnsupportedAttribute

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
        return U.i64(int(v)) if isinstance(v, int | np.integer) else v

    def fconst(self, v: float) -> ir.Constant:
        return ir.Constant(self.vty, [float(np.float32(v))] * self.vw)

    def iconst(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, [int(v)] * self.vw)

    def intrinsic(self, name: str, ret, args) -> ir.Function:
        return U.declare(self.m, name, ret, args)

    def prefetch(self, ptr, *, write: bool = False, locality: int = 3) -> None:
        """Fetch ptr's cache line ahead of use, for reading or writing (never faults, so ptr may lie past
        its buffer); locality 3 keeps the line in L1, 2 in L2."""
        pf = self.intrinsic("llvm.prefetch.p0", VOID, [PTR, I32, I32, I32])
        self.b.call(pf, [ptr, ir.Constant(I32, int(write)), ir.Constant(I32, locality), ir.Constant(I32, 1)])

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
        """exp(x) for a vector: 2^n * p(r) with x = n ln2 + r (Cephes expf polynomial, ~1 ulp).

        Below -87.3 (about ln of the smallest normal float) it is 0, not a subnormal: subnormal operands
        cost Intel cores a microcode assist per instruction (a softmax's masked columns made attention's
        P @ V 10x slower), and the true value is within 1.2e-38 of 0. Above ln(FLT_MAX) it is inf and
        NaN stays NaN, as libm's expf (so sigmoid(NaN) is NaN and x * sigmoid(x) at -inf is NaN)."""
        b = self.b
        lo = self.fconst(-87.3)
        arg = x
        under = b.fcmp_ordered("<", x, lo, name="exp.under")
        x = self.fmin(self.fmax(x, lo), self.fconst(88.3))
        n = self._unary("floor", self.fadd(self.fmul(x, self.fconst(1.4426950408889634)), self.fconst(0.5)))
        r = self.fsub(x, self.fmul(n, self.fconst(0.693359375)))
        r = self.fsub(r, self.fmul(n, self.fconst(-2.12194440e-4)))
        p = self.fconst(1.9875691500e-4)
        for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            p = self.fadd(self.fmul(p, r), self.fconst(c))
        y = self.fadd(self.fadd(self.fmul(self.fmul(p, r), r), r), self.fconst(1.0))
        ni = b.fptosi(n, self.ity)
        pow2 = b.bitcast(b.shl(b.add(ni, self.iconst(127)), self.iconst(23)), self.vty)
        e = b.select(under, self.zero, self.fmul(y, pow2))
        e = b.select(b.fcmp_ordered(">", arg, self.fconst(88.72284)), self.fconst(math.inf), e)
        return b.select(b.fcmp_unordered("uno", arg, arg), arg, e, name=name)

    def fabs(self, x, name: str = "abs"):
        return self._unary("fabs", x, name=name)

    def activation(self, x, kind: str, params=()):
        """A fused epilogue activation (backends/cpu/activations.py) of a vector."""
        return activations.emit(activations.VectorMath(self), x, kind, params)


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
