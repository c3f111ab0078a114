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
its state and writes no Y (Y is zeroed first); Y_h / Y_c are the final states, zero for length 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import activations
from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.kernels.gemm import emit_tile
from glowpy.backends.cpu.vector import I32, I64, PTR, Loop, VecIR, imin
from glowpy.errors import UnsupportedAttribute, UnsupportedShape

from .common import KernelInfo

ARG_NAMES = ("y", "y_h", "y_c", "xw", "r", "b", "seq", "h0", "c0", "p", "scratch")
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
    into the fma's and 12 accumulators fit (1 row measured fastest there)."""
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
             linear_before_reset: int, r: np.ndarray | None, vector_width: int) -> KernelInfo:
    """void name(y, y_h, y_c, xw, r, b, seq, h0, c0, p, scratch, [packed Rᵀ], tid, nthreads).

    `directions` holds, per direction, whether it runs backward; `acts` the (name, alpha, beta) triples
    of each direction; `r` the constant R [D, G*H, H] (packed here) or None (read from the `r` argument
    and packed into scratch once per run). Runs on thread 0 (serial step)."""
    k = _Kernel(cell=cell, steps=steps, batch=batch, hidden=hidden, dirs=len(directions), layout=layout,
                clip=clip, input_forget=input_forget, lbr=linear_before_reset, vw=vector_width)
    if r is None and k.D * k.GH * k.H >= 1 << 31:
        raise UnsupportedShape("recurrent weights too large for 32-bit gather indices", expected="< 2^31",
                               found=k.D * k.GH * k.H)
    packed = []
    if r is not None:
        packed.append(pack_recurrent(r, cell=cell, hidden=hidden, linear_before_reset=linear_before_reset,
                                     vector_width=vector_width))
    params = [(n, PTR) for n in ARG_NAMES] + [(f"packed{i}", PTR) for i in range(len(packed))]
    params += [("tid", I32), ("nthreads", I32)]
    fn, b = U.new_function(module, name, params)
    fn.attributes.add("nounwind")
    k.emit(VecIR(module, b, vector_width), fn.args, directions, acts, packed=bool(packed))
    b.ret_void()
    scratch_floats = k.nbufs * k.N * k.HP + (k.D * k.dir_size if r is None else 0)
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch_floats * 4 + 64)


def _walk_groups(vx: VecIR, hidden: int, jb: int, body) -> None:
    """body(first hidden block (i64), blocks in the group, lanes of a partial block or 0) per group, in
    the order of _static_groups: the full groups as one loop, the remainder and partial groups after."""
    nfg, rem, part = _groups(hidden, vx.vw, jb)
    if nfg:
        lp = Loop(vx, "grp", 0, nfg)
        body(vx.b.mul(lp.i, U.i64(jb)), jb, 0)
        lp.close()
    if rem:
        body(U.i64(nfg * jb), rem, 0)
    if part:
        body(U.i64(hidden // vx.vw), 1, part)


class _Kernel:
    """The shapes and options of one recurrent kernel, and its code: emit() writes the function body."""

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

    def emit(self, vx: VecIR, args, directions: tuple[bool, ...], acts: tuple, packed: bool) -> None:
        b, i64 = vx.b, U.i64
        T, N, H, D, HP = self.T, self.N, self.H, self.D, self.HP
        self.vx = vx
        y, y_h, y_c, xw, r_rt, bias, seq, h0, c0, peep, scratch = args[:11]
        self.y, self.xw, self.seq, self.bias, self.peep = y, xw, seq, bias, peep
        with U.if_then(b, b.icmp_signed("==", args[-2], U.i32(0)), "main"):
            raw = b.ptrtoint(scratch, I64)
            base = b.inttoptr(b.and_(b.add(raw, i64(63)), i64(~63)), PTR, name="scratch.al")
            self.bufs = [vx.gep(base, i * N * HP, name=f"buf{i}") for i in range(self.nbufs)]
            rpack = args[11] if packed else vx.gep(base, self.nbufs * N * HP, name="rpack")
            memset = U.declare(vx.m, "llvm.memset.p0.i64", ir.VoidType(), [PTR, U.I8, I64, U.I1])
            b.call(memset, [y, ir.Constant(U.I8, 0), i64(T * D * N * H * 4), ir.Constant(U.I1, 0)])
            if not packed:
                _pack_runtime(vx, r_rt, rpack, self.passes, self.G, H, D, self.dir_size)
            for d, backward in enumerate(directions):
                self._direction(d, backward, acts[d], vx.gep(rpack, d * self.dir_size, name=f"rdir{d}"), h0, c0,
                                y_h, y_c)

    def _length(self, n):
        """sequence_lens[n] clamped to [0, T]."""
        b = self.vx.b
        v = b.sext(b.load(b.gep(self.seq, [n], source_etype=I32), typ=I32), I64)
        v = b.select(b.icmp_signed("<", v, U.i64(0)), U.i64(0), v)
        return imin(b, v, U.i64(self.T), name="len")

    def _state_off(self, d: int, n):
        vx, N, H, D = self.vx, self.N, self.H, self.D
        return vx.off((n, D * H), d * H) if self.layout else vx.off((n, H), d * N * H)

    def _direction(self, d: int, backward: bool, act, rdir, h0, c0, y_h, y_c) -> None:
        vx, b = self.vx, self.vx.b
        N, H, HP, lstm = self.N, self.H, self.HP, self.cell == "LSTM"
        h_buf, h_buf2, c_buf = self.bufs[:3]
        # the initial state into the padded buffers
        with U.for_range(b, 0, N, f"init{d}") as n, U.for_range(b, 0, H, f"init{d}.j") as j:
            src, dst = vx.off(self._state_off(d, n), j), vx.off((n, HP), j)
            b.store(b.load(vx.gep(h0, src), typ=U.F32), vx.gep(h_buf, dst))
            if lstm:
                b.store(b.load(vx.gep(c0, src), typ=U.F32), vx.gep(c_buf, dst))
        lp = Loop(vx, f"step{d}", 0, self.T, carried=[h_buf, h_buf2])
        step = _Step(d=d, backward=backward, act=act, s=lp.i, h_prev=lp.vals[0], h_next=lp.vals[1],
                     bw=vx.gep(self.bias, d * 2 * self.GH), br=vx.gep(self.bias, d * 2 * self.GH + self.GH),
                     peep=vx.gep(self.peep, d * 3 * H))
        for pi, gates in enumerate(self.passes):
            self._pass(step, pi, gates, vx.gep(rdir, sum(self.pass_size[:pi])))
        h_fin, _ = lp.close([step.h_next, step.h_prev])
        # the final states: zero for an entry that ran no step
        zero = ir.Constant(U.F32, 0.0)
        with U.for_range(b, 0, N, f"final{d}") as n:
            ran = b.icmp_signed(">", self._length(n), U.i64(0))
            with U.for_range(b, 0, H, f"final{d}.j") as j:
                dst, src = vx.off(self._state_off(d, n), j), vx.off((n, HP), j)
                b.store(b.select(ran, b.load(vx.gep(h_fin, src), typ=U.F32), zero), vx.gep(y_h, dst))
                if lstm:
                    b.store(b.select(ran, b.load(vx.gep(c_buf, src), typ=U.F32), zero), vx.gep(y_c, dst))

    def _pass(self, step: _Step, pi: int, gates: tuple[int, ...], rbase) -> None:
        """One recurrent product and its gate math, for every row block and hidden group."""
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
            _walk_groups(vx, H, jb, lambda hb0, jbc, lanes: group(r0, rows, hb0, jbc, lanes))

        mfull, edge = divmod(self.N, mr)
        if mfull:
            r_lp = Loop(vx, "rows", 0, mfull)
            row_block(b.mul(r_lp.i, U.i64(mr)), mr)
            r_lp.close()
        if edge:
            row_block(U.i64(mfull * mr), edge)

    def _row(self, step: _Step, n) -> _Row:
        """Batch row n at this step: whether it is active, its XW row and its Y row."""
        vx, b = self.vx, self.vx.b
        T, N, D, GH, H = self.T, self.N, self.D, self.GH, self.H
        ln = self._length(n)
        active = b.icmp_signed("<", step.s, ln, name="active")
        t = b.sub(b.sub(ln, U.i64(1)), step.s) if step.backward else step.s
        t = b.select(active, t, U.i64(0), name="t")
        if self.layout:
            xrow, yrow = vx.off((n, T * D * GH), (t, D * GH)), vx.off((n, T * D * H), (t, D * H), step.d * H)
        else:
            xrow, yrow = vx.off((t, N * D * GH), (n, D * GH)), vx.off((t, D * N * H), step.d * N * H, (n, H))
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
        with U.if_then(b, row.active, "emit"):
            vx.store(h_new, vx.gep(row.y, j0), mask)


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
