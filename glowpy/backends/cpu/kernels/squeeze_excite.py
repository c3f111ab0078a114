"""The fused squeeze-excite kernel (IR op SqueezeExcite, float32 NCHW):
out[n, c] = x[n, c] * gate(W2 act(W1 mean(x[n]) + b1) + b2)[c].

Per image: the channel means (vector sums over each plane), the two small matrix-vector products (dot
products along the rows of W1 (R x C) and W2 (C x R)), the activation and the gate over the short
vectors, then the planes scaled. Threads split the channel planes; the mixing FCs need every channel's
mean, so each thread computes both FCs of the images it touches and scales only its own planes. The
means are computed here (`means_given` False: every thread reads all of x once for them, then its planes
again to scale: one thread's work, as on one thread), or read from an input that an earlier step (a
reduction split by planes) computed, which is how it runs on several threads. `out` must not overlap `x`.
"""

from __future__ import annotations

import math

from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.vector import F32, I64, PTR, Loop, VecIR

from .common import KernelInfo

_UNROLL = 4  # independent vector accumulators in a plane sum


def _hsum(vx: VecIR, v):
    fn = vx.intrinsic(f"llvm.vector.reduce.fadd.v{vx.vw}f32", F32, [F32, vx.vty])
    return vx.b.call(fn, [ir.Constant(F32, 0.0), v], fastmath=("reassoc",), name="hsum")


def _vec_sum(vx: VecIR, ptr, n: int):
    """The sum of n floats from ptr, as a scalar."""
    vw = vx.vw
    step = _UNROLL * vw
    blocks = n // step
    accs = [vx.zero] * _UNROLL
    if blocks:
        lp = Loop(vx, "sum", 0, blocks, carried=accs)
        base = vx.gep(ptr, vx.off((lp.i, step)), name="sum.p")
        accs = lp.close([vx.fadd(a, vx.load(vx.gep(base, u * vw), name="v")) for u, a in enumerate(lp.vals)])
    done = blocks * step
    for u in range(math.ceil((n - done) / vw)):
        lanes = min(vw, n - done - u * vw)
        accs[u] = vx.fadd(accs[u], vx.load(vx.gep(ptr, done + u * vw), vx.lane_mask(lanes) if lanes < vw else None))
    total = accs[0]
    for a in accs[1:]:
        total = vx.fadd(total, a)
    return _hsum(vx, total)


def _dot(vx: VecIR, a, c, n: int):
    """sum_i a[i] * c[i] over n floats, as a scalar."""
    full = n // vx.vw
    acc = vx.zero
    if full:
        lp = Loop(vx, "dot", 0, full, carried=[acc])
        off = vx.off((lp.i, vx.vw))
        acc = lp.close([vx.fma(vx.load(vx.gep(a, off)), vx.load(vx.gep(c, off)), lp.vals[0])])[0]
    tail = n % vx.vw
    if tail:
        m = vx.lane_mask(tail)
        acc = vx.fma(vx.load(vx.gep(a, full * vx.vw), m), vx.load(vx.gep(c, full * vx.vw), m), acc)
    return _hsum(vx, acc)


def _activate(vx: VecIR, ptr, n: int, kind: str, params) -> None:
    """ptr[i] = kind(ptr[i]) for i < n (whole vectors: the scratch is padded)."""
    if kind == "none":
        return
    for v in range(math.ceil(n / vx.vw)):
        p = vx.gep(ptr, v * vx.vw)
        vx.store(vx.activation(vx.load(p), kind, params), p)


def _fc(vx: VecIR, dst, w, bias, src, rows: int, cols: int, name: str) -> None:
    """dst[r] = bias[r] + sum_c w[r, c] * src[c]."""
    b = vx.b
    lp = Loop(vx, name, 0, rows)
    d = _dot(vx, vx.gep(w, vx.off((lp.i, cols))), src, cols)
    bv = b.load(vx.gep(bias, lp.i), typ=F32, name="b")
    b.store(b.fadd(d, bv, name=f"{name}.v"), vx.gep(dst, lp.i))
    lp.close()


def emit_squeeze_excite(module: ir.Module, name: str, *, n: int, c: int, hw: int, r: int, activation: str,
                        activation_params, gate: str, gate_params, vector_width: int, means_given: bool = False
                        ) -> KernelInfo:
    """void name(out, x, [means,] w1, b1, w2, b2, scratch, tid, nthreads); means: (n, c) floats."""
    vw = vector_width
    cp, rp = math.ceil(c / vw) * vw, math.ceil(r / vw) * vw
    params = [("out", PTR), ("x", PTR)] + [("means", PTR)] * means_given + [
        ("w1", PTR), ("b1", PTR), ("w2", PTR), ("b2", PTR), ("scratch", PTR), ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out_p, x_p, *given, w1, b1, w2, b2, scratch, tid, nthreads = fn.args
    for arg in (x_p, w1, b1, w2, b2, scratch, *given):
        arg.add_attribute("noalias")
    vx = VecIR(module, b, vw)
    means, hidden, scale = scratch, vx.gep(scratch, cp, name="hidden"), vx.gep(scratch, cp + rp, name="scale")
    lo, hi = U.thread_range(b, n * c, tid, nthreads, "unit")  # units: channel planes
    img = Loop(vx, "image", 0, n)
    first = b.mul(img.i, ir.Constant(I64, c), name="first")
    start = b.select(b.icmp_signed(">", lo, first), lo, first, name="start")
    end_img = b.add(first, ir.Constant(I64, c), name="end.img")
    stop = b.select(b.icmp_signed("<", hi, end_img), hi, end_img, name="stop")
    with U.if_then(b, b.icmp_signed("<", start, stop), "mine"):
        if given:
            img_means = vx.gep(given[0], first, name="means.img")
        else:
            img_means = means
            x_img = vx.gep(x_p, vx.off((img.i, c * hw)), name="x.img")
            ml = Loop(vx, "mean", 0, c)
            s = _vec_sum(vx, vx.gep(x_img, vx.off((ml.i, hw))), hw)
            b.store(b.fmul(s, ir.Constant(F32, 1.0 / hw), name="mean"), vx.gep(means, ml.i))
            ml.close()
        _fc(vx, hidden, w1, b1, img_means, r, c, "fc1")
        _activate(vx, hidden, r, activation, activation_params)
        _fc(vx, scale, w2, b2, hidden, c, r, "fc2")
        _activate(vx, scale, c, gate, gate_params)
        sl = Loop(vx, "plane", start, stop)
        ch = b.sub(sl.i, first, name="ch")
        sv = vx.splat(b.load(vx.gep(scale, ch), typ=F32, name="s"), name="sv")
        src = vx.gep(x_p, vx.off((sl.i, hw)), name="src")
        dst = vx.gep(out_p, vx.off((sl.i, hw)), name="dst")
        full = hw // vw
        if full:
            pl = Loop(vx, "scale", 0, full)
            o = vx.off((pl.i, vw))
            vx.store(vx.fmul(vx.load(vx.gep(src, o), name="x"), sv), vx.gep(dst, o))
            pl.close()
        if hw % vw:
            m = vx.lane_mask(hw % vw)
            vx.store(vx.fmul(vx.load(vx.gep(src, full * vw), m, name="x"), sv), vx.gep(dst, full * vw), m)
        sl.close()
    img.close()
    b.ret_void()
    return KernelInfo(function=fn, packed=[], scratch_bytes_per_thread=(2 * cp + rp) * 4)
