"""The recurrent kernel of LSTM / GRU / RNN: every time step of every direction in one native call.

The input projection of all steps (X · Wᵀ for every direction at once) is a packed GEMM step before
this kernel (backends/cpu/select.py); its output XW [rows, D*G*H] is this kernel's input, row
t*N + n (layout 0) or n*T + t (layout 1). Per direction, per step, per block of batch rows:

- the recurrent GEMM h_{t-1} · Rᵀ runs on gemm.py's register-blocked micro-kernel (emit_tile) over
  Rᵀ packed at compile time (or once per run, into scratch, for a runtime R): per group of JB
  hidden blocks of VW lanes, [k][jb][gate][lane], so one tile accumulates every gate of JB*VW
  hidden units and the gate math runs on those accumulators in registers;
- the gates: biases, peepholes, clip and the activation functions (f, g, h with alpha / beta) in
  vectors over the hidden dimension, the hidden edge by masked loads and stores.

GRU without linear_before_reset needs r before its candidate's product ((r ⊙ h) · Rhᵀ): a first pass
computes z and r ⊙ h into scratch, a second the candidate. The state h is double buffered (the
product reads all of h_{t-1}); c is updated in place. sequence_lens: an entry past its length keeps
its state and writes zeros to Y at t = s (so every Y row is written once); Y_h / Y_c are the final
states, zero for length 0.

Threads (`cooperates`): with a constant R the step is cooperative (threads.py): two directions go to
two threads whole; one direction's time steps are split by hidden groups, the threads meeting after
every pass of every step (_Kernel's docstring). A unit's code is the same for any thread count, so
the outputs are bit-identical to one thread's.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import activations
from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.kernels.gemm import emit_tile
from glowpy.backends.cpu.threads import COOP_DONE, COOP_LEFT, COOP_LINE, COOP_SLEEPERS, emit_sync
from glowpy.backends.cpu.vector import I32, I64, PTR, Loop, VecIR, imin
from glowpy.errors import UnsupportedAttribute, UnsupportedShape

from .common import KernelInfo

ARG_NAMES = ("y", "y_h", "y_c", "xw", "r", "b", "seq", "h0", "c0", "p", "scratch", "sync")
DIR_ARGS = ("y", "y_h", "y_c", "xw", "b", "seq", "h0", "c0", "p", "sync")  # a direction function's pointers
SYNC_PTR = I32.as_pointer()  # typed: the atomics on the sync words need it
SYNC_PREFIX = "glowpy.coop"  # the cooperative kernels' claim / wait / finish (threads.emit_sync)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _passes(cell: str, linear_before_reset: int) -> list[tuple[int, ...]]:
    """The gates (ONNX order) whose recurrent products one pass over the hidden blocks computes."""
    if cell == "GRU" and not linear_before_reset:
        return [(0, 1), (2,)]
    return [tuple(range(GATES[cell]))]


def _blocking(gates: int, hidden: int, batch: int, vw: int) -> tuple[int, int]:
    """(JB, MR): hidden blocks per tile and batch rows per tile, with 8 independent fma chains per row
    where the hidden size allows. AVX-512's 32 registers hold the accumulators, the tile's B vectors
    and a broadcast (2 rows measured fastest at 4 gates x 2 blocks); on 16 registers the B loads fold
    into the fma's and 12 accumulators fit (1 row measured fastest there). Not a function of the thread
    count: a unit's code (and so its bits) is the same however many threads share the step."""
    jb = max(1, min(math.ceil(hidden / vw), 8 // gates))
    nv = jb * gates
    budget = 32 - nv - 2 if vw >= 16 else 12
    mr = max(1, min(batch, budget // nv))
    return jb, mr


def _groups(hidden: int, vw: int, jb: int) -> tuple[int, int, int]:
    """(full groups of jb full blocks, blocks in the remainder group, lanes of the partial block or 0)."""
    full, part = divmod(hidden, vw)
    nfg, rem = divmod(full, jb)
    return nfg, rem, part


def _static_groups(hidden: int, vw: int, jb: int) -> list[tuple[int, int]]:
    nfg, rem, part = _groups(hidden, vw, jb)
    out = [(g * jb, jb) for g in range(nfg)]
    if rem:
        out.append((nfg * jb, rem))
    if part:
        out.append((hidden // vw, 1))
    return out


def pack_recurrent(r: np.ndarray, *, cell: str, hidden: int, linear_before_reset: int, vector_width: int
                   ) -> np.ndarray:
    """Rᵀ of every direction and pass, in the kernel's [group][k][jb][gate][lane] order, zero-padded."""
    vw = vector_width
    nhb = math.ceil(hidden / vw)
    parts = []
    for rd in np.asarray(r, np.float32):
        by_gate = rd.reshape(GATES[cell], hidden, hidden)  # [gate, unit, k]
        for gates in _passes(cell, linear_before_reset):
            padded = np.zeros((len(gates), nhb * vw, hidden), np.float32)
            padded[:, :hidden] = by_gate[list(gates)]
            blocks = padded.reshape(len(gates), nhb, vw, hidden)
            jb, _ = _blocking(len(gates), hidden, 1, vw)
            for hb0, jbc in _static_groups(hidden, vw, jb):
                parts.append(blocks[:, hb0:hb0 + jbc].transpose(3, 1, 0, 2).ravel())
    return np.ascontiguousarray(np.concatenate(parts))


def _act(vx: VecIR, x, spec: tuple[str, float | None, float | None]):
    """One of the recurrent ops' activation functions (glowpy/ir/ops/rnn.py RNN_ACTIVATIONS) of a vector."""
    m = activations.VectorMath(vx)
    name, alpha, beta = spec
    shared = {"Relu": ("relu", ()), "Tanh": ("tanh", ()), "Sigmoid": ("sigmoid", ()),
              "LeakyRelu": ("leaky_relu", (alpha,)), "HardSigmoid": ("hard_sigmoid", (alpha, beta))}
    if name in shared:
        return activations.emit(m, x, *shared[name])
    zero = m.const(0.0)
    if name == "Affine":
        return m.add(m.mul(x, m.const(alpha)), m.const(beta))
    if name == "ThresholdedRelu":
        return m.select(m.cmp(">", x, m.const(alpha)), x, zero)
    if name == "ScaledTanh":
        return m.mul(m.const(alpha), m.tanh(m.mul(x, m.const(beta))))
    if name == "Elu":
        return m.select(m.cmp(">=", x, zero), x, m.mul(m.const(alpha), m.sub(m.exp(x), m.const(1.0))))
    if name == "Softsign":
        return m.div(x, m.add(m.const(1.0), vx.fabs(x)))
    if name == "Softplus":  # max(x, 0) + log(1 + exp(-|x|)): no overflow
        log_fn = vx.intrinsic(f"llvm.log.v{vx.vw}f32", vx.vty, [vx.vty])
        log = vx.b.call(log_fn, [m.add(m.const(1.0), m.exp(m.sub(zero, vx.fabs(x))))])
        return m.add(vx.fmax(x, zero), log)
    raise UnsupportedAttribute("no CPU code for this recurrent activation", expected="the ONNX list", found=name)


def emit_rnn(module: ir.Module, name: str, *, cell: str, steps: int, batch: int, hidden: int,
             directions: tuple[bool, ...], layout: int, acts: tuple, clip: float | None, input_forget: int,
             linear_before_reset: int, r: np.ndarray | None, vector_width: int, threads: int = 1) -> KernelInfo:
    """void name(y, y_h, y_c, xw, r, b, seq, h0, c0, p, scratch, sync, [packed Rᵀ], chunk, chunks).

    `directions` holds, per direction, whether it runs backward; `acts` the (name, alpha, beta) triples
    of each direction; `r` the constant R [D, G*H, H] (packed here) or None (read from the `r` argument
    and packed into scratch once per run). `threads` > 1 (with a constant R) builds a cooperative kernel
    (cooperates(...)): its chunks share the work through the step's `sync` words; otherwise chunk 0 runs
    everything."""
    coop = cooperates(threads, constant_r=r is not None, cell=cell, steps=steps, batch=batch, hidden=hidden,
                      dirs=len(directions), linear_before_reset=linear_before_reset, vector_width=vector_width)
    k = _Kernel(cell=cell, steps=steps, batch=batch, hidden=hidden, dirs=len(directions), layout=layout,
                clip=clip, input_forget=input_forget, lbr=linear_before_reset, vw=vector_width)
    if r is None and k.D * k.GH * k.H >= 1 << 31:
        raise UnsupportedShape("recurrent weights too large for 32-bit gather indices", expected="< 2^31",
                               found=k.D * k.GH * k.H)
    packed = []
    if r is not None:
        packed.append(pack_recurrent(r, cell=cell, hidden=hidden, linear_before_reset=linear_before_reset,
                                     vector_width=vector_width))
    params = [(n, SYNC_PTR if n == "sync" else PTR) for n in ARG_NAMES] + [(f"packed{i}", PTR) for i in range(len(packed))]
    params += [("chunk", I32), ("chunks", I32)]
    fn, b = U.new_function(module, name, params)
    fn.attributes.add("nounwind")
    k.emit(VecIR(module, b, vector_width), fn, directions, acts, packed=bool(packed), coop=coop)
    b.ret_void()
    scratch_floats = k.D * k.nbufs * k.N * k.HP + (k.D * k.dir_size if r is None else 0)
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch_floats * 4 + 64)


# Cooperation pays where a step's recurrent product is this many flops or more: one direction's threads
# meet after every pass (LSTM hidden 128, batch 1 is 2^17: 2 threads 783 -> 546 us for T = 100 on an Intel
# Xeon; half that, e.g. GRU hidden 128 at 3 * 2^15, is let in on the same reasoning but was not measured
# on a quiet host); two directions split whole, so only the ordinary threshold of a split step applies.
COOP_MIN_STEP_FLOPS = 1 << 16
COOP_MIN_FLOPS = 1 << 19


def cooperates(threads: int, *, constant_r: bool, cell: str, steps: int, batch: int, hidden: int, dirs: int,
               linear_before_reset: int, vector_width: int) -> bool:
    """Whether the kernel's chunks share its work: several threads, R packed at compile time (a runtime
    R is packed into scratch by one thread before any step), and either several directions or, for
    one, at least two groups of hidden units in every pass; and enough work (COOP_MIN_*)."""
    if threads < 2 or not constant_r:
        return False
    step_flops = 2 * batch * GATES[cell] * hidden * hidden
    if dirs > 1:
        return steps * dirs * step_flops >= COOP_MIN_FLOPS
    return step_flops >= COOP_MIN_STEP_FLOPS and all(
        len(_static_groups(hidden, vector_width, _blocking(len(g), hidden, 1, vector_width)[0])) >= 2
        for g in _passes(cell, linear_before_reset))


def _word(b: ir.IRBuilder, sync, index, name: str = ""):
    """i32* to word `index` (int or i64) of the sync words (typed: atomics need it)."""
    return b.gep(sync, [U.i64(index) if isinstance(index, int) else index], inbounds=True, name=name)


def _walk_groups(vx: VecIR, hidden: int, jb: int, body, lo=None, hi=None) -> None:
    """body(first hidden block (i64), blocks in the group, lanes of a partial block or 0) per group, in
    the order of _static_groups: the full groups as one loop, the remainder and partial groups after;
    only groups [lo, hi) (run-time i64) where given."""
    b = vx.b
    nfg, rem, part = _groups(hidden, vx.vw, jb)
    ranged = lo is not None

    def within(g: int):
        return b.and_(b.icmp_signed("<=", lo, U.i64(g)), b.icmp_signed(">", hi, U.i64(g)), name=f"grp{g}.mine")

    if nfg:
        lp = Loop(vx, "grp", lo if ranged else 0, imin(b, hi, U.i64(nfg)) if ranged else nfg)
        body(vx.b.mul(lp.i, U.i64(jb)), jb, 0)
        lp.close()
    if rem:
        with U.if_then(b, within(nfg), "grp.rem") if ranged else nullcontext():
            body(U.i64(nfg * jb), rem, 0)
    if part:
        with U.if_then(b, within(nfg + bool(rem)), "grp.part") if ranged else nullcontext():
            body(U.i64(hidden // vx.vw), 1, part)


class _Kernel:
    """The shapes and options of one recurrent kernel, and its code: emit() writes the function body.

    Each direction's work is a sequence of sub-steps: the initial state, then per time step one per pass
    (the final states written by the last). A sub-step splits into `shares` contiguous ranges of hidden
    groups. Unthreaded, one share per sub-step runs everything. Cooperative, with one direction: every chunk
    walks the sub-steps, claims shares (its own first) by the flags in the step's sync words, waits until
    every share of the sub-steps before is done, runs it and counts it done, so a late chunk's shares are
    taken by the others. With several directions each chunk claims whole directions instead (no waits).
    The last chunk to leave zeroes the sync words for the next run."""

    def __init__(self, *, cell: str, steps: int, batch: int, hidden: int, dirs: int, layout: int, clip, input_forget,
                 lbr: int, vw: int) -> None:
        self.cell, self.T, self.N, self.H, self.D = cell, steps, batch, hidden, dirs
        self.G = GATES[cell]
        self.GH = self.G * hidden
        self.layout, self.clip, self.input_forget, self.lbr, self.vw = layout, clip, input_forget, lbr, vw
        self.HP = math.ceil(hidden / vw) * vw  # padded row of a state buffer
        self.passes = _passes(cell, lbr)
        self.pass_size = [nhb_size(hidden, vw, len(g)) for g in self.passes]
        self.dir_size = sum(self.pass_size)
        self.nbufs = 3 + (2 if len(self.passes) == 2 else 0)  # h, h', c [, z, r ⊙ h]
        self.jb = [_blocking(len(g), hidden, batch, vw)[0] for g in self.passes]

    def emit(self, vx: VecIR, fn: ir.Function, directions: tuple[bool, ...], acts: tuple, packed: bool,
             coop: bool) -> None:
        b, i64 = vx.b, U.i64
        self.vx = vx
        args = dict(zip(ARG_NAMES, fn.args))
        chunk, chunks = fn.args[-2], fn.args[-1]
        raw = b.ptrtoint(args["scratch"], I64)
        base = b.inttoptr(b.and_(b.add(raw, i64(63)), i64(~63)), PTR, name="scratch.al")
        rpack = fn.args[len(ARG_NAMES)] if packed else vx.gep(base, self.D * self.nbufs * self.N * self.HP,
                                                                name="rpack")
        dir_fns = [self._direction_function(vx.m, fn, d, backward, acts[d], coop)
                   for d, backward in enumerate(directions)]

        def run(d: int, shares) -> None:
            bufs = vx.gep(base, d * self.nbufs * self.N * self.HP, name=f"bufs{d}")
            rdir = vx.gep(rpack, d * self.dir_size, name=f"rdir{d}")
            b.call(dir_fns[d], [args[n] for n in DIR_ARGS] + [bufs, rdir, chunk, shares])

        def serial() -> None:  # chunk 0 runs everything
            with U.if_then(b, b.icmp_signed("==", chunk, U.i32(0)), "main"):
                if not packed:
                    _pack_runtime(vx, args["r"], rpack, self.passes, self.G, self.H, self.D, self.dir_size)
                for d in range(self.D):
                    run(d, U.i32(1))

        if not coop:
            serial()
            return
        sync = args["sync"]
        alone = b.or_(b.icmp_signed("<=", chunks, U.i32(1)), b.icmp_unsigned("==", sync, ir.Constant(SYNC_PTR, None)),
                      name="alone")
        with b.if_else(alone) as (one, many):
            with one:
                serial()
            with many:
                self._cooperate(sync, chunk, chunks, run)

    def _cooperate(self, sync, chunk, chunks, run) -> None:
        """The chunks' share of the work: the sub-steps' shares of the one direction, or whole directions;
        then the last chunk to leave zeroes the sync words."""
        vx, b = self.vx, self.vx.b
        if self.D == 1:
            run(0, chunks)
        else:  # a direction is claimed by the first chunk to try it, its own direction first
            claim, _, _ = emit_sync(vx.m, SYNC_PREFIX, COOP_LINE)
            flags = _word(b, sync, COOP_LINE, "flags")
            for i in range(self.D):
                d = b.call(claim, [flags, U.i32(1), U.i32(self.D), b.urem(chunk, U.i32(self.D))], name=f"dir{i}")
                for dd in range(self.D):
                    with U.if_then(b, b.icmp_signed("==", d, U.i32(dd)), f"dir{i}.is{dd}"):
                        run(dd, U.i32(1))
        left = b.atomic_rmw("add", _word(b, sync, COOP_LEFT), U.i32(1), "acq_rel", name="left")
        with U.if_then(b, b.icmp_signed("==", left, b.sub(chunks, U.i32(1))), "last"):
            b.store_atomic(U.i32(0), _word(b, sync, COOP_DONE), "monotonic", 4)
            lp = Loop(vx, "flags", 0, b.sext(chunks, I64))  # chunks >= 2 >= directions: every flag used
            b.store_atomic(U.i32(0), _word(b, sync, vx.off((lp.i, COOP_LINE), COOP_LINE)), "monotonic", 4)
            lp.close()
            b.store_atomic(U.i32(0), _word(b, sync, COOP_LEFT), "release", 4)

    def _direction_function(self, module: ir.Module, kernel: ir.Function, d: int, backward: bool, act,
                            coop: bool) -> ir.Function:
        """void KERNEL.dD(DIR_ARGS..., bufs, rdir, i32 chunk, i32 shares): direction d's sub-steps, as one
        share each (shares == 1) or cooperatively, shares = the chunk count (module docstring)."""
        params = [(n, SYNC_PTR if n == "sync" else PTR) for n in DIR_ARGS]
        params += [("bufs", PTR), ("rdir", PTR), ("chunk", I32), ("shares", I32)]
        fn, b = U.new_function(module, f"{kernel.name}.d{d}", params)
        outer = self.vx
        vx = self.vx = VecIR(module, b, outer.vw)
        args = {n: a for (n, _), a in zip(params, fn.args)}
        self.y, self.xw, self.seq, self.bias, self.peep = (args[n] for n in ("y", "xw", "seq", "b", "p"))
        N, HP = self.N, self.HP
        self.bufs = [vx.gep(args["bufs"], i * N * HP, name=f"buf{i}") for i in range(self.nbufs)]
        chunk, shares = args["chunk"], args["shares"]
        subs = 1 + self.T * len(self.passes)
        sync = args["sync"]
        if coop:
            claim, wait, finish = emit_sync(module, SYNC_PREFIX, COOP_LINE)
            done, sleepers = _word(b, sync, COOP_DONE), _word(b, sync, COOP_SLEEPERS)
            flags = _word(b, sync, COOP_LINE, "flags")
        together = b.icmp_signed(">", shares, U.i32(1), name="together")

        sub = Loop(vx, "sub", 0, subs)
        u = b.trunc(sub.i, I32, name="u")
        head, body, nxt = (fn.append_basic_block(f"share.{x}") for x in ("head", "body", "next"))
        pre = b.block
        b.branch(head)
        b.position_at_end(head)
        tries = b.phi(I32, name="tries")
        tries.add_incoming(U.i32(0), pre)
        mine = b.select(b.icmp_signed("==", tries, U.i32(0)), U.i32(0), U.i32(-1), name="share")  # alone: once
        if coop:
            with b.if_then(together):
                claimed = b.call(claim, [flags, b.add(u, U.i32(1)), shares, chunk], name="claimed")
                got = b.block
            picked = b.phi(I32, name="share")
            picked.add_incoming(claimed, got)
            picked.add_incoming(mine, head)
            mine = picked
        exit_bb = fn.append_basic_block("share.out")
        b.cbranch(b.icmp_signed(">=", mine, U.i32(0)), body, exit_bb)
        b.position_at_end(body)
        if coop:
            with U.if_then(b, together, "await"):
                b.call(wait, [done, b.mul(u, shares), sleepers])
        self._sub_step(sub.i, d, backward, act, args, mine, shares)
        if coop:
            with U.if_then(b, together, "count"):
                b.call(finish, [done, sleepers])
        b.branch(nxt)
        b.position_at_end(nxt)
        tries.add_incoming(b.add(tries, U.i32(1)), nxt)
        b.branch(head)
        b.position_at_end(exit_bb)
        sub.close()
        b.ret_void()
        self.vx = outer
        return fn

    def _sub_step(self, u, d: int, backward: bool, act, args, share, shares) -> None:
        """Sub-step u (i64) of direction d, share `share` of `shares` (i32): the initial state (u = 0) or
        pass (u - 1) % P of time step (u - 1) // P; the final states after the last. A share is a range of
        each pass's hidden groups; the states' share is the last pass's (the final states read what the
        same share's last pass wrote)."""
        vx, b = self.vx, self.vx.b
        P, T = len(self.passes), self.T

        def groups(pi: int):
            return U.thread_range(b, len(_static_groups(self.H, vx.vw, self.jb[pi])), share, shares,
                                  name=f"groups{pi}")

        blk = self._units(*groups(P - 1), self.jb[P - 1])
        with b.if_else(b.icmp_signed("==", u, U.i64(0))) as (first, later):
            with first:
                self._init(d, args["h0"], args["c0"], blk)
            with later:
                s, pi = b.sdiv(b.sub(u, U.i64(1)), U.i64(P), name="s"), b.srem(b.sub(u, U.i64(1)), U.i64(P), name="pi")
                even = b.icmp_signed("==", b.and_(s, U.i64(1)), U.i64(0), name="even")
                h_prev = b.select(even, self.bufs[0], self.bufs[1], name="h.prev")
                h_next = b.select(even, self.bufs[1], self.bufs[0], name="h.next")
                step = _Step(d=d, backward=backward, act=act, s=s, h_prev=h_prev, h_next=h_next,
                             bw=vx.gep(self.bias, d * 2 * self.GH), br=vx.gep(self.bias, d * 2 * self.GH + self.GH),
                             peep=vx.gep(self.peep, d * 3 * self.H))
                rbase = args["rdir"]
                for pi_c, gates in enumerate(self.passes):
                    with U.if_then(b, b.icmp_signed("==", pi, U.i64(pi_c)), f"pass{pi_c}") if P > 1 else nullcontext():
                        self._pass(step, pi_c, gates, vx.gep(rbase, sum(self.pass_size[:pi_c])), *groups(pi_c))
        with U.if_then(b, b.icmp_signed("==", u, U.i64(T * P)), "last"):
            self._final(d, self.bufs[T % 2], args["y_h"], args["y_c"], blk)

    def _units(self, lo, hi, jb: int) -> tuple:
        """Hidden units [first, end) of groups [lo, hi) (i64) of jb blocks."""
        b, vw, H = self.vx.b, self.vx.vw, self.H
        nhb, full = math.ceil(H / vw), H // vw
        ng = len(_static_groups(H, vw, jb))

        def first_block(g):
            return b.select(b.icmp_signed(">=", g, U.i64(ng)), U.i64(nhb), imin(b, b.mul(g, U.i64(jb)), U.i64(full)))

        return (b.mul(first_block(lo), U.i64(vw), name="unit.lo"),
                imin(b, b.mul(first_block(hi), U.i64(vw)), U.i64(H), name="unit.hi"))

    def _length(self, n):
        """sequence_lens[n] clamped to [0, T]."""
        b = self.vx.b
        v = b.sext(b.load(b.gep(self.seq, [n], source_etype=I32), typ=I32), I64)
        v = b.select(b.icmp_signed("<", v, U.i64(0)), U.i64(0), v)
        return imin(b, v, U.i64(self.T), name="len")

    def _state_off(self, d: int, n):
        vx, N, H, D = self.vx, self.N, self.H, self.D
        return vx.off((n, D * H), d * H) if self.layout else vx.off((n, H), d * N * H)

    def _init(self, d: int, h0, c0, units) -> None:
        """The initial state of units [units) into the padded buffers."""
        vx, b = self.vx, self.vx.b
        lstm = self.cell == "LSTM"
        with U.for_range(b, 0, self.N, f"init{d}") as n, U.for_range(b, units[0], units[1], f"init{d}.j") as j:
            src, dst = vx.off(self._state_off(d, n), j), vx.off((n, self.HP), j)
            b.store(b.load(vx.gep(h0, src), typ=U.F32), vx.gep(self.bufs[0], dst))
            if lstm:
                b.store(b.load(vx.gep(c0, src), typ=U.F32), vx.gep(self.bufs[2], dst))

    def _final(self, d: int, h_fin, y_h, y_c, units) -> None:
        """The final states of units [units): zero for an entry that ran no step."""
        vx, b = self.vx, self.vx.b
        zero = ir.Constant(U.F32, 0.0)
        with U.for_range(b, 0, self.N, f"final{d}") as n:
            ran = b.icmp_signed(">", self._length(n), U.i64(0))
            with U.for_range(b, units[0], units[1], f"final{d}.j") as j:
                dst, src = vx.off(self._state_off(d, n), j), vx.off((n, self.HP), j)
                b.store(b.select(ran, b.load(vx.gep(h_fin, src), typ=U.F32), zero), vx.gep(y_h, dst))
                if self.cell == "LSTM":
                    b.store(b.select(ran, b.load(vx.gep(self.bufs[2], src), typ=U.F32), zero), vx.gep(y_c, dst))

    def _pass(self, step: _Step, pi: int, gates: tuple[int, ...], rbase, lo, hi) -> None:
        """One recurrent product and its gate math, for every row block and hidden groups [lo, hi)."""
        vx, b = self.vx, self.vx.b
        H, HP, gp = self.H, self.HP, len(gates)
        jb, mr = _blocking(gp, H, self.N, vx.vw)
        a_buf = self.bufs[4] if pi == 1 else step.h_prev

        def group(r0, rows: int, hb0, jbc: int, lanes: int) -> None:
            acc = emit_tile(vx, mr=rows, nv=jbc * gp, kc=H, a_ptr=vx.gep(a_buf, vx.off((r0, HP))), a_rs=HP, a_ks=1,
                            b_ptr=vx.gep(rbase, vx.off((hb0, H * gp * vx.vw))), b_ks=jbc * gp * vx.vw, name="rec")
            for rr in range(rows):
                row = self._row(step, vx.off(r0, rr))
                for j in range(jbc):
                    j0 = vx.off((vx.off(hb0, j), vx.vw))
                    accs = {g: acc[rr][j * gp + k] for k, g in enumerate(gates)}
                    self._gates(step, pi, row, accs, j0, vx.lane_mask(lanes) if lanes else None)

        def row_block(r0, rows: int) -> None:
            _walk_groups(vx, H, jb, lambda hb0, jbc, lanes: group(r0, rows, hb0, jbc, lanes), lo, hi)

        mfull, edge = divmod(self.N, mr)
        if mfull:
            r_lp = Loop(vx, "rows", 0, mfull)
            row_block(b.mul(r_lp.i, U.i64(mr)), mr)
            r_lp.close()
        if edge:
            row_block(U.i64(mfull * mr), edge)

    def _row(self, step: _Step, n) -> _Row:
        """Batch row n at this step: whether it is active, its XW row and its Y row (an inactive row writes
        zeros at t = s: over the steps every Y row of the direction is written once)."""
        vx, b = self.vx, self.vx.b
        T, N, D, GH, H = self.T, self.N, self.D, self.GH, self.H
        ln = self._length(n)
        active = b.icmp_signed("<", step.s, ln, name="active")
        t = b.sub(b.sub(ln, U.i64(1)), step.s) if step.backward else step.s
        tx = b.select(active, t, U.i64(0), name="t")
        ty = b.select(active, t, step.s, name="t.y")
        if self.layout:
            xrow, yrow = vx.off((n, T * D * GH), (tx, D * GH)), vx.off((n, T * D * H), (ty, D * H), step.d * H)
        else:
            xrow, yrow = vx.off((tx, N * D * GH), (n, D * GH)), vx.off((ty, D * N * H), step.d * N * H, (n, H))
        return _Row(n=n, active=active, xrow=vx.gep(self.xw, vx.off(xrow, step.d * GH)), y=vx.gep(self.y, yrow))
    def _gates(self, step: _Step, pi: int, row: _Row, accs: dict, j0, mask) -> None:
        """The gates of one vector of hidden units (from j0) of one batch row, from its accumulators."""
        vx, b, H = self.vx, self.vx.b, self.H
        st = vx.off((row.n, self.HP), j0)
        bufs = self.bufs

        def ld(ptr, g):
            return vx.load(vx.gep(ptr, vx.off(j0, g * H)), mask)

        def x_of(g):  # this step's input projection + Wb
            return vx.fadd(ld(row.xrow, g), ld(step.bw, g))

        def pre(g):  # + R h + Rb
            return vx.fadd(x_of(g), vx.fadd(accs[g], ld(step.br, g)))

        def cl(v):
            if self.clip is None:
                return v
            return vx.fmin(vx.fmax(v, vx.fconst(-self.clip)), vx.fconst(self.clip))

        def f(k, v):
            return _act(vx, v, step.act[k])

        hp = vx.load(vx.gep(step.h_prev, st))
        one = vx.fconst(1.0)
        if self.cell == "GRU" and not self.lbr and pi == 0:
            z, rg = f(0, cl(pre(0))), f(0, cl(pre(1)))
            vx.store(z, vx.gep(bufs[3], st))
            vx.store(vx.fmul(rg, hp), vx.gep(bufs[4], st))
            return
        if self.cell == "LSTM":
            cp = vx.load(vx.gep(bufs[2], st))
            i = f(0, cl(vx.fadd(pre(0), vx.fmul(ld(step.peep, 0), cp))))
            fg = vx.fsub(one, i) if self.input_forget else f(0, cl(vx.fadd(pre(2), vx.fmul(ld(step.peep, 2), cp))))
            c_new = vx.fadd(vx.fmul(fg, cp), vx.fmul(i, f(1, cl(pre(3)))))
            o = f(0, cl(vx.fadd(pre(1), vx.fmul(ld(step.peep, 1), c_new))))
            h_new = vx.fmul(o, f(2, c_new))
            vx.store(b.select(row.active, c_new, cp), vx.gep(bufs[2], st))
        elif self.cell == "RNN":
            h_new = f(0, cl(pre(0)))
        else:
            if self.lbr:
                z, rg = f(0, cl(pre(0))), f(0, cl(pre(1)))
                cand = f(1, cl(vx.fadd(x_of(2), vx.fmul(rg, vx.fadd(accs[2], ld(step.br, 2))))))
            else:
                z = vx.load(vx.gep(bufs[3], st))
                cand = f(1, cl(pre(2)))
            h_new = vx.fadd(vx.fmul(vx.fsub(one, z), cand), vx.fmul(z, hp))
        vx.store(b.select(row.active, h_new, hp), vx.gep(step.h_next, st))
        vx.store(b.select(row.active, h_new, vx.zero), vx.gep(row.y, j0), mask)


@dataclass
class _Step:
    """One time step of one direction: its index, state buffers, and this direction's biases, peepholes
    and activation functions."""

    d: int
    backward: bool
    act: tuple
    s: ir.Value
    h_prev: ir.Value
    h_next: ir.Value
    bw: ir.Value
    br: ir.Value
    peep: ir.Value


@dataclass
class _Row:
    n: ir.Value
    active: ir.Value
    xrow: ir.Value
    y: ir.Value


def _pack_runtime(vx: VecIR, r, dst, passes, G: int, H: int, D: int, dir_size: int) -> None:
    """R [D, G*H, H] -> the layout of pack_recurrent, into scratch (gathers; padded lanes zero)."""
    b, vw = vx.b, vx.vw
    for d in range(D):
        at = d * dir_size
        for gates in passes:
            gp = len(gates)
            jb, _ = _blocking(gp, H, 1, vw)
            base = vx.gep(dst, at)

            def group(hb0, jbc: int, lanes: int, gates=gates, gp=gp, base=base, d=d) -> None:
                k_lp = Loop(vx, "pack.k", 0, H)
                k = b.trunc(k_lp.i, I32)
                gdst = vx.gep(base, vx.off((hb0, H * gp * vw), (k_lp.i, jbc * gp * vw)))
                for j in range(jbc):
                    unit0 = b.trunc(vx.off((vx.off(hb0, j), vw)), I32)
                    for gi, g in enumerate(gates):
                        row = b.add(vx.splat(b.add(unit0, ir.Constant(I32, d * G * H + g * H))), vx.iota)
                        idx = b.add(b.mul(row, vx.iconst(H)), vx.splat(k))
                        val = vx.gather(r, idx, vx.lane_mask(lanes) if lanes else None, name="rt")
                        vx.store(val, vx.gep(gdst, (j * gp + gi) * vw))
                k_lp.close()

            _walk_groups(vx, H, jb, group)
            at += nhb_size(H, vw, gp)


def nhb_size(hidden: int, vw: int, gates: int) -> int:
    """Floats of one direction's packed Rᵀ for a pass of `gates` gates."""
    return math.ceil(hidden / vw) * vw * hidden * gates
