"""Resize, one resampled axis per kernel: y[.., o, ..] = c[o] + sum_t w[o, t] * x[.., idx[o, t], ..].

The index / weight tables (glowpy.ir.ops.resize.axis_tables) are built at compile time and go into
the weights block; the tap count is a compile-time constant, so the taps unroll. Along an axis
with contiguous elements behind it (H of NCHW) the inner loop walks those elements with unit
stride, and along the innermost axis (W) it walks the output positions, loading through the index
table (gathers): both are plain counted loops the -O3 loop vectorizer turns into vector code. Each
thread takes a contiguous share of the rows. float16 and float32 compute in float32, float64 and
integers in float64; integer outputs round half to even and saturate.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.vector import PTR, VecIR

_FLAGS = ("contract",)


def emit_resample(module: ir.Module, name: str, in_dtype: np.dtype, out_dtype: np.dtype, shape: tuple[int, ...],
                  axis: int, n_out: int, taps: int, row_stride: int, has_bias: bool,
                  vector_width: int) -> ir.Function:
    """void name(out, x, i32* idx, w, [c,] tid, nthreads): resample `axis` of `shape` to n_out.

    The tables are tap-major: idx[t * row_stride + j] for output position j, row_stride >= n_out
    padded to whole vectors with index 0 and weight 0 (so table loads need no mask)."""
    f32 = np.dtype(in_dtype) == np.float32 and np.dtype(out_dtype) == np.float32
    narrow_f = (np.dtype(np.float16), np.dtype(np.float32))
    acc_t = U.F32 if np.dtype(in_dtype) in narrow_f and np.dtype(out_dtype) in narrow_f else U.F64
    # The vector path's pointers are opaque (VecIR's); the scalar path's are typed like irutil's.
    ptr = (lambda t: PTR) if f32 else (lambda t: t.as_pointer())
    params = [("out", ptr(U.storage_type(out_dtype))), ("x", ptr(U.storage_type(in_dtype))), ("idx", ptr(U.I32)),
              ("w", ptr(acc_t))]
    if has_bias:
        params.append(("c", ptr(acc_t)))
    params += [("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, idx, w = fn.args[:4]
    c = fn.args[4] if has_bias else None
    tid, nt = fn.args[-2], fn.args[-1]
    outer, n_in, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    if outer * n_out * inner == 0:
        b.ret_void()
        return fn
    vx = VecIR(module, b, vector_width) if f32 else None
    vw = vector_width

    def ld(p: ir.Value, i: ir.Value) -> ir.Value:
        v = U.load(b, p, i, in_dtype)
        if np.dtype(in_dtype).kind in "iu":
            return (b.sitofp if np.dtype(in_dtype).kind == "i" else b.uitofp)(v, acc_t)
        return b.fpext(v, acc_t) if v.type != acc_t else v

    def st(i: ir.Value, v: ir.Value) -> None:
        odt = np.dtype(out_dtype)
        ct = U.compute_type(odt)
        if odt.kind in "iu":
            # round half to even and saturate, as onnx.reference's saturate_cast
            info = np.iinfo(odt)
            v = U.intrinsic(b, "llvm.roundeven", v)
            v = U.fmin_nan(b, U.fmax_nan(b, v, ir.Constant(acc_t, float(info.min))), ir.Constant(acc_t, float(info.max)))
            v = (b.fptosi if odt.kind == "i" else b.fptoui)(v, ct)
        elif v.type != ct:
            v = b.fptrunc(v, ct)
        U.store(b, out, i, v, odt)

    def at(p: ir.Value, k: ir.Value, ety: ir.Type) -> ir.Value:
        return b.gep(p, [k], inbounds=True, source_etype=ety)

    def scalar(p: ir.Value, k: ir.Value, ety: ir.Type) -> ir.Value:
        return b.load(at(p, k, ety), typ=ety)

    def entry(t: int, j: ir.Value) -> tuple[ir.Value, ir.Value]:
        k = b.add(j, U.i64(t * row_stride))
        return at(idx, k, U.I32), at(w, k, acc_t)

    def vector_steps(n: int, body) -> None:
        """body(i, mask) over [0, n) in whole vectors, then one masked tail."""
        full = n - n % vw
        if full:
            with U.for_range(b, 0, full, "v", step=vw) as i:
                body(i, None)
        if n % vw:
            body(U.i64(full), vx.lane_mask(n % vw))

    if inner == 1:
        # The resampled axis is innermost: rows are the outer positions, the vector loop runs over j
        # and gathers the taps through the index table.
        lo, hi = U.thread_range(b, outer, tid, nt, "rows")
        with U.for_range(b, lo, hi, "row") as o:
            xrow = at(x, b.mul(o, U.i64(n_in)), U.storage_type(in_dtype))
            ob = b.mul(o, U.i64(n_out))
            if vx is not None:
                def vbody(j: ir.Value, mask) -> None:
                    acc = vx.load(c_ptr(j)) if c is not None else vx.zero
                    for t in range(taps):
                        pi, pw = entry(t, j)
                        iv = b.load(pi, align=4, typ=vx.ity)
                        acc = vx.fma(vx.load(pw), vx.gather(xrow, iv, None), acc)
                    vx.store(acc, vx.gep(out, b.add(ob, j)), mask)

                def c_ptr(j: ir.Value) -> ir.Value:
                    return at(c, j, acc_t)

                vector_steps(n_out, vbody)
            else:
                with U.for_range(b, 0, n_out, "j") as j:
                    acc = scalar(c, j, acc_t) if c is not None else ir.Constant(acc_t, 0.0)
                    for t in range(taps):
                        pi, pw = entry(t, j)
                        s = b.sext(b.load(pi, typ=U.I32), U.I64)
                        acc = b.fadd(acc, b.fmul(b.load(pw, typ=acc_t), ld(xrow, s), flags=_FLAGS), flags=_FLAGS)
                    st(b.add(ob, j), acc)
        b.ret_void()
        return fn
    # Rows are (outer, j) pairs; the vector loop runs over the contiguous inner elements.
    lo, hi = U.thread_range(b, outer * n_out, tid, nt, "rows")
    with U.for_range(b, lo, hi, "row") as r:
        o = b.udiv(r, U.i64(n_out))
        j = b.urem(r, U.i64(n_out))
        srcs, weights = [], []
        for t in range(taps):
            pi, pw = entry(t, j)
            srcs.append(b.mul(b.add(b.mul(o, U.i64(n_in)), b.sext(b.load(pi, typ=U.I32), U.I64)), U.i64(inner)))
            weights.append(b.load(pw, typ=acc_t))
        bias = scalar(c, j, acc_t) if c is not None else ir.Constant(acc_t, 0.0)
        ob = b.mul(r, U.i64(inner))
        if vx is not None:
            wv = [vx.splat(wt) for wt in weights]
            bv = vx.splat(bias)

            def body(i: ir.Value, mask) -> None:
                acc = bv
                for xb, wt in zip(srcs, wv):
                    acc = vx.fma(wt, vx.load(vx.gep(x, b.add(xb, i)), mask), acc)
                vx.store(acc, vx.gep(out, b.add(ob, i)), mask)

            vector_steps(inner, body)
        else:
            with U.for_range(b, 0, inner, "i") as i:
                acc = bias
                for xb, wt in zip(srcs, weights):
                    acc = b.fadd(acc, b.fmul(wt, ld(x, b.add(xb, i)), flags=_FLAGS), flags=_FLAGS)
                st(b.add(ob, i), acc)
    b.ret_void()
    return fn
