"""Straightforward (but vectorizable) convolution and matrix-product kernels for every float type,
integer MatMul, runtime weights, N-d convolutions and ConvTranspose.

These are the backend's own kernels behind the same call sites as the fast float32 generators in
conv.py / gemm.py (`generic_conv2d` / `generic_gemm` have their exact signatures and are used when
those generators are absent or decline a case). Accumulation happens in a per-thread float32 (float64
for float64) scratch row or plane, so float16 keeps precision and the output may alias nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import activations
from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.kernels.common import KernelInfo

_REASSOC = ("reassoc", "contract")


def acc_dtype(dtype: np.dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    return dt


def _to(b: ir.IRBuilder, v: ir.Value, t: ir.Type) -> ir.Value:
    if v.type == t:
        return v
    if isinstance(t, ir.DoubleType) or (isinstance(t, ir.FloatType) and isinstance(v.type, ir.HalfType)):
        return b.fpext(v, t)
    return b.fptrunc(v, t)


def _store_out(b: ir.IRBuilder, ptr: ir.Value, idx: ir.Value, v: ir.Value, dtype: np.dtype) -> None:
    ct = U.compute_type(dtype)
    if np.dtype(dtype).kind == "f":
        v = _to(b, v, ct)
    U.store(b, ptr, idx, v, dtype)


# --- convolution ---------------------------------------------------------------------------------


def emit_conv_generic(module: ir.Module, name: str, dtype: np.dtype, *, x_shape: tuple[int, ...],
                      w_shape: tuple[int, ...], strides: Sequence[int], pads: Sequence[int],
                      dilations: Sequence[int], group: int, activation: str, activation_params: Sequence[float],
                      has_residual: bool) -> tuple[ir.Function, int]:
    """void name(out, x, residual_or_null, scratch, w, bias, tid, nthreads) for an N-d grouped conv.
    Returns (function, scratch bytes per thread)."""
    dt = np.dtype(dtype)
    at = acc_dtype(dt)
    t = U.compute_type(at)
    p = U.ptr_type(dt)
    params = [("out", p), ("x", p), ("residual", p), ("scratch", U.ptr_type(at)), ("w", p), ("bias", p),
              ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, res, acc, w, bias, tid, nt = fn.args
    nsp = len(x_shape) - 2
    n_img, c_in = x_shape[0], x_shape[1]
    m_out, cg = w_shape[0], w_shape[1]
    ks = w_shape[2:]
    sp_in = x_shape[2:]
    sp_out = tuple((sp_in[d] + pads[d] + pads[d + nsp] - (ks[d] - 1) * dilations[d] - 1) // strides[d] + 1
                   for d in range(nsp))
    plane_in, plane_out = math.prod(sp_in), math.prod(sp_out)
    in_st, out_st = U.contiguous_strides(sp_in), U.contiguous_strides(sp_out)
    ksize = math.prod(ks)
    k_st = U.contiguous_strides(ks)
    mg = m_out // group
    scratch = plane_out * at.itemsize
    if n_img * m_out * plane_out == 0:
        b.ret_void()
        return fn, scratch

    with U.for_range(b, *U.thread_range(b, n_img * m_out, tid, nt, "planes"), "plane") as pl:
        m = b.srem(pl, U.i64(m_out), name="m")
        img = b.sdiv(pl, U.i64(m_out), name="n")
        g = b.sdiv(m, U.i64(mg), name="g")
        bv = _to(b, U.load(b, bias, m, dt), t) if dt.kind == "f" else U.load(b, bias, m, dt)
        with U.for_range(b, 0, plane_out, "init") as o:
            b.store(bv, b.gep(acc, [o], inbounds=True))
        with U.for_range(b, 0, cg, "c") as c:
            ch = b.add(b.mul(g, U.i64(cg)), c, name="ch")
            xc = b.gep(x, [b.mul(b.add(b.mul(img, U.i64(c_in)), ch), U.i64(plane_in))], inbounds=True, name="xc")
            wbase = b.mul(b.add(b.mul(m, U.i64(cg)), c), U.i64(ksize), name="wbase")

            def taps(d: int, kidx: list[ir.Value]) -> None:
                if d < nsp:
                    with U.for_range(b, 0, ks[d], f"k{d}") as k:
                        taps(d + 1, kidx + [k])
                    return
                woff = wbase
                for dd in range(nsp):
                    woff = b.add(woff, b.mul(kidx[dd], U.i64(k_st[dd])))
                wv = _to(b, U.load(b, w, woff, dt, name="wv"), t)
                rows(0, kidx, wv, U.i64(0), U.i64(0))

            def rows(d: int, kidx: list[ir.Value], wv: ir.Value, ooff: ir.Value, ioff: ir.Value) -> None:
                shift = b.sub(b.mul(kidx[d], U.i64(dilations[d])), U.i64(pads[d]), name=f"shift{d}")
                if d < nsp - 1:
                    with U.for_range(b, 0, sp_out[d], f"o{d}") as o:
                        pos = b.add(b.mul(o, U.i64(strides[d])), shift)
                        ok = b.and_(b.icmp_signed(">=", pos, U.i64(0)), b.icmp_signed("<", pos, U.i64(sp_in[d])))
                        with U.if_then(b, ok, f"row{d}"):
                            rows(d + 1, kidx, wv, b.add(ooff, b.mul(o, U.i64(out_st[d]))),
                                 b.add(ioff, b.mul(pos, U.i64(in_st[d]))))
                    return
                # innermost: outputs whose tap lands inside the input, no checks in the loop
                s = strides[d]
                a = b.sub(U.i64(0), shift)  # first o needs o*s >= -shift
                lo = b.select(b.icmp_signed("<=", a, U.i64(0)), U.i64(0), b.sdiv(b.add(a, U.i64(s - 1)), U.i64(s)))
                top = b.sub(U.i64(sp_in[d] - 1), shift)
                hi = b.select(b.icmp_signed("<", top, U.i64(0)), U.i64(0), b.add(b.sdiv(top, U.i64(s)), U.i64(1)))
                hi = b.select(b.icmp_signed(">", hi, U.i64(sp_out[d])), U.i64(sp_out[d]), hi, name="hi")
                with U.for_range(b, lo, hi, "ow") as o:
                    src = b.add(ioff, b.add(b.mul(o, U.i64(s)), shift))
                    xv = _to(b, U.load(b, xc, src, dt, name="xv"), t)
                    ap = b.gep(acc, [b.add(ooff, o)], inbounds=True)
                    b.store(b.fadd(b.load(ap), b.fmul(wv, xv), flags=("contract",)), ap)

            taps(0, [])
        obase = b.mul(pl, U.i64(plane_out), name="obase")
        with U.for_range(b, 0, plane_out, "epi") as o:
            v = b.load(b.gep(acc, [o], inbounds=True))
            if has_residual:
                v = b.fadd(v, _to(b, U.load(b, res, b.add(obase, o), dt), t))
            v = activations.emit(activations.ScalarMath(b, v.type), v, activation, activation_params)
            _store_out(b, out, b.add(obase, o), v, dt)
    b.ret_void()
    return fn, scratch


def generic_conv2d(module: ir.Module, name: str, *, x_shape, w: np.ndarray, bias: np.ndarray, strides, pads,
                   dilations, group, activation, activation_params, has_residual, vector_width) -> KernelInfo:
    """Same contract as kernels.conv.emit_conv2d (packed = [w, bias]); any spatial rank, any float type."""
    fn, scratch = emit_conv_generic(
        module, name, w.dtype, x_shape=tuple(x_shape), w_shape=w.shape, strides=strides, pads=pads,
        dilations=dilations, group=group, activation=activation, activation_params=activation_params,
        has_residual=has_residual)
    return KernelInfo(fn, [np.ascontiguousarray(w), np.ascontiguousarray(bias)], scratch)


def pack_generic_conv2d(*, w: np.ndarray, bias: np.ndarray, **_code_only) -> list[np.ndarray]:
    """generic_conv2d's packed arrays without its code (a step with the same configuration shares it)."""
    return [np.ascontiguousarray(w), np.ascontiguousarray(bias)]


def emit_conv_transpose(module: ir.Module, name: str, dtype: np.dtype, *, x_shape: tuple[int, ...],
                        w_shape: tuple[int, ...], out_shape: tuple[int, ...], strides, pads, dilations,
                        group: int) -> tuple[ir.Function, int]:
    """void name(out, x, w, bias, scratch, tid, nthreads): gather form of the transposed conv."""
    dt = np.dtype(dtype)
    at = acc_dtype(dt)
    t = U.compute_type(at)
    p = U.ptr_type(dt)
    params = [("out", p), ("x", p), ("w", p), ("bias", p), ("scratch", U.ptr_type(at)),
              ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, w, bias, acc, tid, nt = fn.args
    nsp = len(x_shape) - 2
    n_img, c_in = x_shape[0], x_shape[1]
    mg = w_shape[1]
    m_out = out_shape[1]
    cg = c_in // group
    ks = w_shape[2:]
    sp_in, sp_out = x_shape[2:], out_shape[2:]
    plane_in, plane_out = math.prod(sp_in), math.prod(sp_out)
    in_st, out_st, k_st = U.contiguous_strides(sp_in), U.contiguous_strides(sp_out), U.contiguous_strides(ks)
    ksize = math.prod(ks)
    scratch = plane_out * at.itemsize
    if n_img * m_out * plane_out == 0:
        b.ret_void()
        return fn, scratch
    with U.for_range(b, *U.thread_range(b, n_img * m_out, tid, nt, "planes"), "plane") as pl:
        m = b.srem(pl, U.i64(m_out), name="m")
        img = b.sdiv(pl, U.i64(m_out), name="n")
        g = b.sdiv(m, U.i64(mg), name="g")
        mm = b.srem(m, U.i64(mg), name="mm")
        bv = _to(b, U.load(b, bias, m, dt), t)
        with U.for_range(b, 0, plane_out, "init") as o:
            b.store(bv, b.gep(acc, [o], inbounds=True))
        with U.for_range(b, 0, cg, "c") as c:
            ch = b.add(b.mul(g, U.i64(cg)), c, name="ch")
            xc = b.gep(x, [b.mul(b.add(b.mul(img, U.i64(c_in)), ch), U.i64(plane_in))], inbounds=True)
            wbase = b.mul(b.add(b.mul(ch, U.i64(mg)), mm), U.i64(ksize), name="wbase")

            def taps(d: int, kidx: list[ir.Value]) -> None:
                if d < nsp:
                    with U.for_range(b, 0, ks[d], f"k{d}") as k:
                        taps(d + 1, kidx + [k])
                    return
                woff = wbase
                for dd in range(nsp):
                    woff = b.add(woff, b.mul(kidx[dd], U.i64(k_st[dd])))
                wv = _to(b, U.load(b, w, woff, dt), t)

                def elem(offs: list[ir.Value], oidx: list[ir.Value]) -> None:
                    ok = ir.Constant(U.I1, 1)
                    src = U.i64(0)
                    for d2 in range(nsp):
                        num = b.sub(b.add(oidx[d2], U.i64(pads[d2])), b.mul(kidx[d2], U.i64(dilations[d2])))
                        s = strides[d2]
                        q = b.sdiv(num, U.i64(s))
                        exact = b.icmp_signed("==", b.mul(q, U.i64(s)), num)
                        inside = b.and_(b.icmp_signed(">=", num, U.i64(0)), b.icmp_signed("<", q, U.i64(sp_in[d2])))
                        ok = b.and_(ok, b.and_(exact, inside))
                        src = b.add(src, b.mul(q, U.i64(in_st[d2])))
                    safe = b.select(ok, src, U.i64(0))
                    xv = _to(b, U.load(b, xc, safe, dt), t)
                    ap = b.gep(acc, [offs[0]], inbounds=True)
                    cur = b.load(ap)
                    b.store(b.select(ok, b.fadd(cur, b.fmul(wv, xv)), cur), ap)

                U.nest(b, list(sp_out), [out_st], [U.i64(0)], elem, name="o")

            taps(0, [])
        obase = b.mul(pl, U.i64(plane_out))
        with U.for_range(b, 0, plane_out, "epi") as o:
            _store_out(b, out, b.add(obase, o), b.load(b.gep(acc, [o], inbounds=True)), dt)
    b.ret_void()
    return fn, scratch


# --- matrix products -----------------------------------------------------------------------------


def emit_matmul_generic(module: ir.Module, name: str, dtype: np.dtype, *, M: int, N: int, K: int,
                        batch: Sequence[int] = (), a_batch_strides: Sequence[int] = (),
                        b_batch_strides: Sequence[int] = (), a_trans: bool = False, b_trans: bool = False,
                        alpha: float = 1.0, bias_kind: str = "none", activation: str = "none",
                        activation_params: Sequence[float] = ()) -> tuple[ir.Function, int]:
    """void name(out, a, b, scratch, bias_or_null, tid, nthreads):
    out[batch, m, n] = act(alpha * sum_k A[m, k] B[k, n] + bias), A stored (M, K) or (K, M) if a_trans,
    B (K, N) or (N, K) if b_trans; per-batch offsets from the given element strides (0 = broadcast);
    bias_kind none | col (N,) | full (M, N). Returns (function, scratch bytes per thread)."""
    dt = np.dtype(dtype)
    at = acc_dtype(dt)
    t = U.compute_type(at)
    p = U.ptr_type(dt)
    params = [("out", p), ("a", p), ("b", p), ("scratch", U.ptr_type(at)), ("bias", p),
              ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, a, bm, acc, bias, tid, nt = fn.args
    nb = math.prod(batch)
    scratch = N * at.itemsize
    if nb * M * N == 0:
        b.ret_void()
        return fn, scratch
    is_f = dt.kind == "f"
    zero = ir.Constant(t, 0.0) if is_f else ir.Constant(t, 0)
    bst = U.contiguous_strides(batch)

    def mul(x: ir.Value, y: ir.Value) -> ir.Value:
        return b.fmul(x, y) if is_f else b.mul(x, y)

    def add(x: ir.Value, y: ir.Value, reassoc: bool = False) -> ir.Value:
        if is_f:
            return b.fadd(x, y, flags=_REASSOC if reassoc else ("contract",))
        return b.add(x, y)

    def ld(ptr: ir.Value, idx: ir.Value) -> ir.Value:
        v = U.load(b, ptr, idx, dt)
        return _to(b, v, t) if is_f else v

    with U.for_range(b, *U.thread_range(b, nb * M, tid, nt, "rows"), "row") as r:
        bi = b.sdiv(r, U.i64(M), name="bi")
        m = b.srem(r, U.i64(M), name="m")
        a_off, b_off = U.i64(0), U.i64(0)
        rem = bi
        for d in range(len(batch)):
            idx = b.srem(b.sdiv(rem, U.i64(bst[d])), U.i64(batch[d]))
            a_off = b.add(a_off, b.mul(idx, U.i64(a_batch_strides[d])))
            b_off = b.add(b_off, b.mul(idx, U.i64(b_batch_strides[d])))
        if b_trans:
            # out[m, n] = dot(A[m, :], B[n, :]): both rows contiguous (when A is not transposed).
            slot = U.entry_alloca(b, t, "dot.slot")
            with U.for_range(b, 0, N, "n") as n:
                b.store(zero, slot)
                with U.for_range(b, 0, K, "k") as k:
                    ai = b.add(a_off, b.add(b.mul(k, U.i64(M)), m) if a_trans else b.add(b.mul(m, U.i64(K)), k))
                    bv = ld(bm, b.add(b_off, b.add(b.mul(n, U.i64(K)), k)))
                    b.store(add(b.load(slot), mul(ld(a, ai), bv), reassoc=True), slot)
                b.store(b.load(slot), b.gep(acc, [n], inbounds=True))
        else:
            with U.for_range(b, 0, N, "z") as n:
                b.store(zero, b.gep(acc, [n], inbounds=True))
            with U.for_range(b, 0, K, "k") as k:
                ai = b.add(a_off, b.add(b.mul(k, U.i64(M)), m) if a_trans else b.add(b.mul(m, U.i64(K)), k))
                av = ld(a, ai)
                brow = b.add(b_off, b.mul(k, U.i64(N)))
                with U.for_range(b, 0, N, "n") as n:
                    ap = b.gep(acc, [n], inbounds=True)
                    b.store(add(b.load(ap), mul(av, ld(bm, b.add(brow, n)))), ap)
        obase = b.mul(r, U.i64(N), name="obase")
        with U.for_range(b, 0, N, "epi") as n:
            v = b.load(b.gep(acc, [n], inbounds=True))
            if is_f and alpha != 1.0:
                v = b.fmul(v, ir.Constant(t, alpha))
            if bias_kind == "col":
                v = add(v, ld(bias, n))
            elif bias_kind == "full":
                v = add(v, ld(bias, b.add(b.mul(m, U.i64(N)), n)))
            if is_f:
                v = activations.emit(activations.ScalarMath(b, v.type), v, activation, activation_params)
            elif activation == "relu":
                v = b.select(b.icmp_signed("<", v, zero), zero, v) if dt.kind == "i" else v
            _store_out(b, out, b.add(obase, n), v, dt)
    b.ret_void()
    return fn, scratch


def generic_gemm(module: ir.Module, name: str, *, M: int, N: int, K: int, a_trans: bool, b: np.ndarray | None,
                 b_trans: bool, alpha: float, bias: np.ndarray | None, bias_kind: str, activation: str,
                 activation_params: Sequence[float], vector_width: int, dtype: np.dtype = np.float32
                 ) -> KernelInfo:
    """Same contract as kernels.gemm.emit_gemm: void name(out, a, b_or_null, scratch, packed..., tid, nt)
    with packed = [B (as K x N) if given] + [bias if bias_kind != none]."""
    dt = np.dtype(dtype)
    packed = pack_generic_gemm(b=b, b_trans=b_trans, bias=bias, bias_kind=bias_kind, dtype=dt)
    bt = b_trans and b is None
    inner, scratch = emit_matmul_generic(
        module, f"{name}.body", dt, M=M, N=N, K=K, a_trans=a_trans, b_trans=bt, alpha=alpha,
        bias_kind=bias_kind, activation=activation, activation_params=activation_params)
    p = U.ptr_type(dt)
    params = [("out", p), ("a", p), ("b", p), ("scratch", U.ptr_type(acc_dtype(dt)))]
    params += [(f"packed{i}", p) for i in range(len(packed))] + [("tid", U.I32), ("nthreads", U.I32)]
    fn, bld = U.new_function(module, name, params, internal=False)
    args = fn.args
    bptr = args[4] if b is not None else args[2]
    bias_ptr = args[4 + len(packed) - 1] if bias_kind != "none" else ir.Constant(p, None)
    bld.call(inner, [args[0], args[1], bptr, args[3], bias_ptr, args[-2], args[-1]])
    bld.ret_void()
    return KernelInfo(fn, packed, scratch)


def pack_generic_gemm(*, b: np.ndarray | None, b_trans: bool, bias: np.ndarray | None, bias_kind: str,
                      dtype: np.dtype = np.float32, **_code_only) -> list[np.ndarray]:
    """generic_gemm's packed arrays: B as (K, N) (contiguous rows) if constant, then the bias."""
    dt = np.dtype(dtype)
    packed: list[np.ndarray] = []
    if b is not None:
        packed.append(np.ascontiguousarray((b.T if b_trans else b).astype(dt)))
    if bias_kind != "none":
        packed.append(np.ascontiguousarray(np.asarray(bias, dtype=dt)))
    return packed


def emit_det(module: ir.Module, name: str, dtype: np.dtype, batch: int, n: int) -> tuple[ir.Function, int]:
    """void name(out, x, scratch, tid, nthreads): the determinant of each n x n matrix by Gaussian
    elimination with partial pivoting in float64 (a per-thread n x n scratch). Returns (function, scratch
    bytes per thread)."""
    dt = np.dtype(dtype)
    p = U.ptr_type(dt)
    fn, b = U.new_function(module, name, [("out", p), ("x", p), ("scratch", U.F64.as_pointer()), ("tid", U.I32),
                                          ("nthreads", U.I32)])
    out, x, a, tid, nt = fn.args
    scratch = max(n * n, 1) * 8
    if batch == 0:
        b.ret_void()
        return fn, scratch
    f64 = U.F64
    det = U.entry_alloca(b, f64, "det.slot")
    piv = U.entry_alloca(b, U.I64, "piv.slot")
    best = U.entry_alloca(b, f64, "best.slot")

    def at(r: ir.Value, c: ir.Value) -> ir.Value:
        return b.gep(a, [b.add(b.mul(r, U.i64(n)), c)], inbounds=True)

    def fabs(v: ir.Value) -> ir.Value:
        return U.intrinsic(b, "llvm.fabs", v)

    with U.for_range(b, *U.thread_range(b, batch, tid, nt, "mats"), "mat") as m:
        with U.for_range(b, 0, n * n, "cp") as e:
            v = U.load(b, x, b.add(b.mul(m, U.i64(n * n)), e), dt)
            b.store(b.fpext(v, f64) if v.type != f64 else v, b.gep(a, [e], inbounds=True))
        b.store(ir.Constant(f64, 1.0), det)
        with U.for_range(b, 0, n, "col") as c:
            b.store(c, piv)
            b.store(fabs(b.load(at(c, c))), best)
            with U.for_range(b, b.add(c, U.i64(1)), U.i64(n), "row") as r:
                v = fabs(b.load(at(r, c)))
                better = b.fcmp_ordered(">", v, b.load(best))
                b.store(b.select(better, v, b.load(best)), best)
                b.store(b.select(better, r, b.load(piv)), piv)
            pr = b.load(piv)
            with U.if_then(b, b.icmp_signed("!=", pr, c), "swap"):
                with U.for_range(b, 0, n, "sw") as j:
                    t1, t2 = b.load(at(c, j)), b.load(at(pr, j))
                    b.store(t2, at(c, j))
                    b.store(t1, at(pr, j))
                b.store(b.fneg(b.load(det)), det)
            d = b.load(at(c, c))
            b.store(b.fmul(b.load(det), d), det)
            with U.if_then(b, b.fcmp_ordered("!=", d, ir.Constant(f64, 0.0)), "elim"):
                with U.for_range(b, b.add(c, U.i64(1)), U.i64(n), "er") as r:
                    f = b.fdiv(b.load(at(r, c)), d)
                    with U.for_range(b, b.add(c, U.i64(1)), U.i64(n), "ej") as j:
                        b.store(b.fsub(b.load(at(r, j)), b.fmul(f, b.load(at(c, j)))), at(r, j))
        res = b.load(det)
        ct = U.compute_type(dt)
        U.store(b, out, m, b.fptrunc(res, ct) if ct != f64 else res, dt)
    b.ret_void()
    return fn, scratch
