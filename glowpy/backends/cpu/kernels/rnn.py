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
    """(JB, MR): hidden blocks per tile and batch rows per tile, the accumulators fitting the register
    file (32 vector registers on AVX-512, 16 below) with at least 8 independent fma chains when possible."""
    budget = 26 if vw >= 16 else 12
    jb = max(1, min(math.ceil(hidden / vw), 8 // gates))
    mr = max(1, min(batch, budget // (jb * gates)))
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
    vw = vector_width
    G, H, T, N, D = GATES[cell], hidden, steps, batch, len(directions)
    GH = G * H
    nhb = math.ceil(H / vw)
    hp_ = nhb * vw  # padded row of a state buffer
    passes = _passes(cell, linear_before_reset)
    pass_size = [nhb_size(H, vw, len(g)) for g in passes]
    dir_size = sum(pass_size)
    if r is None and D * GH * H >= 1 << 31:
        raise UnsupportedShape("recurrent weights too large for 32-bit gather indices", expected="< 2^31",
                               found=D * GH * H)
    packed = []
    if r is not None:
        packed.append(pack_recurrent(r, cell=cell, hidden=H, linear_before_reset=linear_before_reset,
                                     vector_width=vw))
    two_pass = len(passes) == 2
    bufs = 3 + (2 if two_pass else 0)  # h, h', c [, z, r ⊙ h]
    scratch_floats = bufs * N * hp_ + (D * dir_size if r is None else 0)
    params = [(n, PTR) for n in ARG_NAMES] + [(f"packed{i}", PTR) for i in range(len(packed))]
    params += [("tid", I32), ("nthreads", I32)]
    fn, b = U.new_function(module, name, params)
    fn.attributes.add("nounwind")
    y, y_h, y_c, xw, r_rt, bias, seq, h0, c0, peep, scratch = fn.args[:11]
    tid = fn.args[-2]
    vx = VecIR(module, b, vw)
    i64 = U.i64

    with U.if_then(b, b.icmp_signed("==", tid, U.i32(0)), "main"):
        raw = b.ptrtoint(scratch, I64)
        base = b.inttoptr(b.and_(b.add(raw, i64(63)), i64(~63)), PTR, name="scratch.al")
        buf = [vx.gep(base, i * N * hp_, name=f"buf{i}") for i in range(bufs)]
        rpack = fn.args[11] if packed else vx.gep(base, bufs * N * hp_, name="rpack")
        memset = U.declare(module, "llvm.memset.p0.i64", ir.VoidType(), [PTR, U.I8, I64, U.I1])
        b.call(memset, [y, ir.Constant(U.I8, 0), i64(T * D * N * H * 4), ir.Constant(U.I1, 0)])
        if r is None:
            _pack_runtime(vx, r_rt, rpack, passes, G, H, D, dir_size)

        # sequence length of each entry, clamped to [0, T]
        def length(n):
            v = b.sext(b.load(b.gep(seq, [n], source_etype=I32), typ=I32), I64)
            v = b.select(b.icmp_signed("<", v, i64(0)), i64(0), v)
            return imin(b, v, i64(T), name="len")

        def state_off(d: int, n):
            return vx.off((n, D * H), d * H) if layout else vx.off((n, H), d * N * H)

        def lanes_mask(lanes: int):
            return vx.lane_mask(lanes) if lanes else None

        for d, backward in enumerate(directions):
            rdir = vx.gep(rpack, d * dir_size, name=f"rdir{d}")
            bw, br = vx.gep(bias, d * 2 * GH), vx.gep(bias, d * 2 * GH + GH)
            act = acts[d]
            # initial state into the padded buffers
            with U.for_range(b, 0, N, f"init{d}") as n, U.for_range(b, 0, H, f"init{d}.j") as j:
                src = vx.off(state_off(d, n), j)
                dst = vx.off((n, hp_), j)
                b.store(b.load(vx.gep(h0, src), typ=U.F32), vx.gep(buf[0], dst))
                if cell == "LSTM":
                    b.store(b.load(vx.gep(c0, src), typ=U.F32), vx.gep(buf[2], dst))

            lp = Loop(vx, f"step{d}", 0, T, carried=[buf[0], buf[1]])
            s = lp.i
            h_prev, h_next = lp.vals
            for pi, gates in enumerate(passes):
                gp = len(gates)
                jb, mr = _blocking(gp, H, N, vw)
                rbase = vx.gep(rdir, sum(pass_size[:pi]))
                a_buf = buf[4] if pi == 1 else h_prev

                def group(r0, rows: int, hb0, jbc: int, lanes: int, gates=gates, gp=gp, rbase=rbase,
                          a_buf=a_buf, pi=pi, d=d, backward=backward, act=act, bw=bw, br=br,
                          h_prev=h_prev, h_next=h_next, s=s) -> None:
                    acc = emit_tile(vx, mr=rows, nv=jbc * gp, kc=H, a_ptr=vx.gep(a_buf, vx.off((r0, hp_))),
                                    a_rs=hp_, a_ks=1, b_ptr=vx.gep(rbase, vx.off((hb0, H * gp * vw))),
                                    b_ks=jbc * gp * vw, name="rec")
                    for rr in range(rows):
                        n = vx.off(r0, rr)
                        ln = length(n)
                        active = b.icmp_signed("<", s, ln, name="active")
                        t = b.sub(b.sub(ln, i64(1)), s) if backward else s
                        t = b.select(active, t, i64(0), name="t")
                        xrow = vx.off((n, T * D * GH), (t, D * GH)) if layout else vx.off((t, N * D * GH),
                                                                                         (n, D * GH))
                        xrow = vx.gep(xw, vx.off(xrow, d * GH))
                        yrow = vx.off((n, T * D * H), (t, D * H), d * H) if layout else \
                            vx.off((t, D * N * H), d * N * H, (n, H))
                        for j in range(jbc):
                            mask = lanes_mask(lanes)
                            j0 = vx.off((vx.off(hb0, j), vw))
                            st = vx.off((n, hp_), j0)
                            accs = {g: acc[rr][j * gp + k] for k, g in enumerate(gates)}
                            _gate_math(vx, cell, pi, accs, act=act, clip=clip, input_forget=input_forget,
                                       lbr=linear_before_reset, mask=mask, j0=j0, H=H, st=st, xrow=xrow,
                                       bw=bw, br=br, peep=vx.gep(peep, d * 3 * H), h_prev=h_prev,
                                       h_next=h_next, bufs=buf, active=active, yptr=vx.gep(y, yrow))

                def row_block(r0, rows: int, group=group, jb=jb) -> None:
                    nfg, rem, part = _groups(H, vw, jb)
                    if nfg:
                        g_lp = Loop(vx, "grp", 0, nfg)
                        group(r0, rows, b.mul(g_lp.i, i64(jb)), jb, 0)
                        g_lp.close()
                    if rem:
                        group(r0, rows, i64(nfg * jb), rem, 0)
                    if part:
                        group(r0, rows, i64(H // vw), 1, part)

                mfull, edge = divmod(N, mr)
                if mfull:
                    r_lp = Loop(vx, "rows", 0, mfull)
                    row_block(b.mul(r_lp.i, i64(mr)), mr)
                    r_lp.close()
                if edge:
                    row_block(i64(mfull * mr), edge)
            h_fin, _ = lp.close([h_next, h_prev])

            # final states: zero for an entry that ran no step
            with U.for_range(b, 0, N, f"final{d}") as n:
                ran = b.icmp_signed(">", length(n), i64(0))
                with U.for_range(b, 0, H, f"final{d}.j") as j:
                    dst = vx.off(state_off(d, n), j)
                    src = vx.off((n, hp_), j)
                    zero = ir.Constant(U.F32, 0.0)
                    b.store(b.select(ran, b.load(vx.gep(h_fin, src), typ=U.F32), zero), vx.gep(y_h, dst))
                    if cell == "LSTM":
                        b.store(b.select(ran, b.load(vx.gep(buf[2], src), typ=U.F32), zero), vx.gep(y_c, dst))
    b.ret_void()
    return KernelInfo(function=fn, packed=packed, scratch_bytes_per_thread=scratch_floats * 4 + 64)


def _gate_math(vx: VecIR, cell: str, pi: int, accs: dict, *, act, clip, input_forget, lbr, mask, j0, H, st,
               xrow, bw, br, peep, h_prev, h_next, bufs, active, yptr) -> None:
    """The gates of one vector of hidden units of one batch row, from the recurrent accumulators."""
    b = vx.b

    def ld(ptr, g, m=mask):
        return vx.load(vx.gep(ptr, vx.off(j0, g * H)), m)

    def x_of(g):  # this step's input projection + Wb
        return vx.fadd(ld(xrow, g), ld(bw, g))

    def pre(g):  # + R h + Rb
        return vx.fadd(x_of(g), vx.fadd(accs[g], ld(br, g)))

    def cl(v):
        if clip is None:
            return v
        return vx.fmin(vx.fmax(v, vx.fconst(-clip)), vx.fconst(clip))

    def f(k, v):
        return _act(vx, v, act[k])

    hp = vx.load(vx.gep(h_prev, st))
    one = vx.fconst(1.0)
    if cell == "GRU" and not lbr and pi == 0:
        z = f(0, cl(pre(0)))
        rg = f(0, cl(pre(1)))
        vx.store(z, vx.gep(bufs[3], st))
        vx.store(vx.fmul(rg, hp), vx.gep(bufs[4], st))
        return
    c_new = None
    if cell == "LSTM":
        cp = vx.load(vx.gep(bufs[2], st))
        i = f(0, cl(vx.fadd(pre(0), vx.fmul(ld(peep, 0), cp))))
        fg = vx.fsub(one, i) if input_forget else f(0, cl(vx.fadd(pre(2), vx.fmul(ld(peep, 2), cp))))
        c_new = vx.fadd(vx.fmul(fg, cp), vx.fmul(i, f(1, cl(pre(3)))))
        o = f(0, cl(vx.fadd(pre(1), vx.fmul(ld(peep, 1), c_new))))
        h_new = vx.fmul(o, f(2, c_new))
        vx.store(b.select(active, c_new, cp), vx.gep(bufs[2], st))
    elif cell == "RNN":
        h_new = f(0, cl(pre(0)))
    else:
        if lbr:
            z = f(0, cl(pre(0)))
            rg = f(0, cl(pre(1)))
            cand = f(1, cl(vx.fadd(x_of(2), vx.fmul(rg, vx.fadd(accs[2], ld(br, 2))))))
        else:
            z = vx.load(vx.gep(bufs[3], st))
            cand = f(1, cl(pre(2)))
        h_new = vx.fadd(vx.fmul(vx.fsub(one, z), cand), vx.fmul(z, hp))
    vx.store(b.select(active, h_new, hp), vx.gep(h_next, st))
    with U.if_then(b, active, "emit"):
        vx.store(h_new, vx.gep(yptr, j0), mask)


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

            nfg, rem, part = _groups(H, vw, jb)
            if nfg:
                g_lp = Loop(vx, "pack.grp", 0, nfg)
                group(b.mul(g_lp.i, U.i64(jb)), jb, 0)
                g_lp.close()
            if rem:
                group(U.i64(nfg * jb), rem, 0)
            if part:
                group(U.i64(H // vw), 1, part)
            at += nhb_size(H, vw, gp)


def nhb_size(hidden: int, vw: int, gates: int) -> int:
    return math.ceil(hidden / vw) * vw * hidden * gates
