"""Indexing kernels: GatherElements, GatherND, ScatterElements, ScatterND, CumSum / CumProd, TopK, OneHot,
ReverseSequence (the IR ops of glowpy.ir.ops.indexing, with their semantics).

An index is read, sign-extended, shifted by the dim when negative and checked: out of range, a gather
writes zeros and a scatter drops the update, so no kernel touches memory outside its tensors. GatherND
and ScatterND move whole contiguous slices with llvm.memcpy / llvm.memset (the transformer hot path);
scatters run on thread 0 (updates apply in order) after one copy of the data.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U


def _fn(module: ir.Module, name: str, params: list[tuple[str, np.dtype]]) -> tuple[ir.Function, ir.IRBuilder]:
    return U.new_function(module, name, [(n, U.ptr_type(dt)) for n, dt in params] + [("tid", U.I32),
                                                                                    ("nthreads", U.I32)])


def _index(b: ir.IRBuilder, ptr: ir.Value, at: ir.Value, n: int) -> tuple[ir.Value, ir.Value]:
    """(safe index, in range) of the raw index at ptr[at] into a dim of size n."""
    raw = b.load(b.gep(ptr, [at], inbounds=True), name="index")
    j = b.sext(raw, U.I64) if raw.type.width < 64 else raw
    j = b.select(b.icmp_signed("<", j, U.i64(0)), b.add(j, U.i64(n)), j, name="j")
    ok = b.and_(b.icmp_signed(">=", j, U.i64(0)), b.icmp_signed("<", j, U.i64(n)), name="in_range")
    return b.select(ok, j, U.i64(0)), ok


def _bytes_ptr(b: ir.IRBuilder, ptr: ir.Value, at: ir.Value) -> ir.Value:
    return b.bitcast(b.gep(ptr, [at], inbounds=True), U.I8P)


def _memcpy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, nbytes: ir.Value) -> None:
    fn = U.declare(b.module, "llvm.memcpy.p0i8.p0i8.i64", U.VOID, [U.I8P, U.I8P, U.I64, U.I1])
    b.call(fn, [dst, src, nbytes, ir.Constant(U.I1, 0)])


def _memset0(b: ir.IRBuilder, dst: ir.Value, nbytes: ir.Value) -> None:
    fn = U.declare(b.module, "llvm.memset.p0i8.i64", U.VOID, [U.I8P, U.I8, U.I64, U.I1])
    b.call(fn, [dst, ir.Constant(U.I8, 0), nbytes, ir.Constant(U.I1, 0)])


def _thread0(b: ir.IRBuilder, tid: ir.Value) -> ir.Value:
    return b.icmp_signed("==", tid, U.i32(0), name="thread0")


def _combine(b: ir.IRBuilder, reduction: str, dt: np.dtype, old: ir.Value, new: ir.Value) -> ir.Value:
    """old (op) new in the compute type, rounded back like numpy would (float16 through half)."""
    is_f = dt.kind == "f"
    if reduction == "add":
        v = b.fadd(old, new) if is_f else b.add(old, new)
    elif reduction == "mul":
        v = b.fmul(old, new) if is_f else b.mul(old, new)
    elif reduction in ("max", "min"):
        if is_f:
            v = (U.fmax_nan if reduction == "max" else U.fmin_nan)(b, old, new)
        else:
            cmp = b.icmp_signed if dt.kind == "i" else b.icmp_unsigned
            v = b.select(cmp(">" if reduction == "max" else "<", new, old), new, old)
    else:
        return new
    return U.round_half(b, v, dt)


def _copy_all(b: ir.IRBuilder, out: ir.Value, x: ir.Value, dt: np.dtype, n: int) -> None:
    if n:
        _memcpy(b, _bytes_ptr(b, out, U.i64(0)), _bytes_ptr(b, x, U.i64(0)), U.i64(n * dt.itemsize))


# --- gathers -------------------------------------------------------------------------------------------


def emit_gather_elements(module: ir.Module, name: str, dtype: np.dtype, idx_dtype: np.dtype,
                         x_shape: tuple[int, ...], idx_shape: tuple[int, ...], axis: int) -> ir.Function:
    """void name(out, x, indices, tid, nthreads): out[p] = x[p with p[axis] = indices[p]]."""
    dt = np.dtype(dtype)
    fn, b = _fn(module, name, [("out", dt), ("x", dt), ("indices", idx_dtype)])
    out, x, indices, tid, nt = fn.args
    if math.prod(idx_shape) == 0:
        b.ret_void()
        return fn
    xs = U.contiguous_strides(x_shape)
    base = [0 if d == axis else s for d, s in enumerate(xs)]
    zero = U.narrow(b, U.const(dt, 0), dt)

    def body(offs: list[ir.Value], _: list[ir.Value]) -> None:
        j, ok = _index(b, indices, offs[0], x_shape[axis])
        v = b.load(b.gep(x, [b.add(offs[1], b.mul(j, U.i64(xs[axis])))], inbounds=True))
        b.store(b.select(ok, v, zero), b.gep(out, [offs[0]], inbounds=True))

    U.nest(b, list(idx_shape), [U.contiguous_strides(idx_shape), base], [U.i64(0), U.i64(0)], body,
           split=(tid, nt), name="ge")
    b.ret_void()
    return fn


def _nd_rows(idx_shape: tuple[int, ...], batch_dims: int) -> tuple[int, int, int]:
    nb = math.prod(idx_shape[:batch_dims])
    return nb, math.prod(idx_shape[batch_dims:-1]), idx_shape[-1]


def _nd_offset(b: ir.IRBuilder, indices: ir.Value, row: ir.Value, k: int, dims: tuple[int, ...],
               strides: list[int]) -> tuple[ir.Value, ir.Value]:
    """The element offset an index row addresses (k coordinates into `dims`), and whether all are in range."""
    off, ok = U.i64(0), None
    for d in range(k):
        j, in_d = _index(b, indices, b.add(b.mul(row, U.i64(k)), U.i64(d)), dims[d])
        off = b.add(off, b.mul(j, U.i64(strides[d])))
        ok = in_d if ok is None else b.and_(ok, in_d)
    return off, ok


def emit_gather_nd(module: ir.Module, name: str, dtype: np.dtype, idx_dtype: np.dtype, x_shape: tuple[int, ...],
                   idx_shape: tuple[int, ...], batch_dims: int) -> ir.Function:
    """void name(out, x, indices, tid, nthreads): each index row copies one contiguous slice of x."""
    dt = np.dtype(dtype)
    fn, b = _fn(module, name, [("out", dt), ("x", dt), ("indices", idx_dtype)])
    out, x, indices, tid, nt = fn.args
    nb, rows, k = _nd_rows(idx_shape, batch_dims)
    inner = math.prod(x_shape[batch_dims + k:])
    if nb * rows * inner == 0:
        b.ret_void()
        return fn
    xs = U.contiguous_strides(x_shape)
    batch_stride = math.prod(x_shape[batch_dims:])
    nbytes = U.i64(inner * dt.itemsize)

    def body(_: list[ir.Value], ix: list[ir.Value]) -> None:
        row = ix[0]
        g = b.udiv(row, U.i64(rows), name="g")
        off, ok = _nd_offset(b, indices, row, k, x_shape[batch_dims:], xs[batch_dims:])
        src = b.add(b.mul(g, U.i64(batch_stride)), off, name="src")
        dst = _bytes_ptr(b, out, b.mul(row, U.i64(inner)))
        with b.if_else(ok) as (then, otherwise):
            with then:
                _memcpy(b, dst, _bytes_ptr(b, x, src), nbytes)
            with otherwise:
                _memset0(b, dst, nbytes)

    U.nest(b, [nb * rows], [[0]], [U.i64(0)], body, split=(tid, nt), name="gnd")
    b.ret_void()
    return fn


# --- scatters ------------------------------------------------------------------------------------------


def emit_scatter_nd(module: ir.Module, name: str, dtype: np.dtype, idx_dtype: np.dtype, x_shape: tuple[int, ...],
                    idx_shape: tuple[int, ...], reduction: str) -> ir.Function:
    """void name(out, x, indices, updates, tid, nthreads); thread 0 only."""
    dt = np.dtype(dtype)
    fn, b = _fn(module, name, [("out", dt), ("x", dt), ("indices", idx_dtype), ("updates", dt)])
    out, x, indices, upd, tid, _ = fn.args
    k = idx_shape[-1]
    rows = math.prod(idx_shape[:-1])
    inner = math.prod(x_shape[k:])
    xs = U.contiguous_strides(x_shape)
    with U.if_then(b, _thread0(b, tid), "t0"):
        _copy_all(b, out, x, dt, math.prod(x_shape))
        if rows * inner:
            with U.for_range(b, 0, rows, "r") as r:
                dst, ok = _nd_offset(b, indices, r, k, x_shape, xs)
                src = b.mul(r, U.i64(inner))
                with U.if_then(b, ok, "ok"):
                    if reduction == "none":
                        _memcpy(b, _bytes_ptr(b, out, dst), _bytes_ptr(b, upd, src), U.i64(inner * dt.itemsize))
                    else:
                        with U.for_range(b, 0, inner, "e") as e:
                            at = b.add(dst, e)
                            v = _combine(b, reduction, dt, U.load(b, out, at, dt), U.load(b, upd, b.add(src, e), dt))
                            U.store(b, out, at, v, dt)
    b.ret_void()
    return fn


def emit_scatter_elements(module: ir.Module, name: str, dtype: np.dtype, idx_dtype: np.dtype,
                          x_shape: tuple[int, ...], idx_shape: tuple[int, ...], axis: int,
                          reduction: str) -> ir.Function:
    """void name(out, x, indices, updates, tid, nthreads); thread 0 only, updates in row-major order."""
    dt = np.dtype(dtype)
    fn, b = _fn(module, name, [("out", dt), ("x", dt), ("indices", idx_dtype), ("updates", dt)])
    out, x, indices, upd, tid, _ = fn.args
    xs = U.contiguous_strides(x_shape)
    base = [0 if d == axis else s for d, s in enumerate(xs)]
    with U.if_then(b, _thread0(b, tid), "t0"):
        _copy_all(b, out, x, dt, math.prod(x_shape))

        def body(offs: list[ir.Value], _: list[ir.Value]) -> None:
            j, ok = _index(b, indices, offs[0], x_shape[axis])
            at = b.add(offs[1], b.mul(j, U.i64(xs[axis])))
            with U.if_then(b, ok, "ok"):
                new = U.load(b, upd, offs[0], dt)
                if reduction != "none":
                    new = _combine(b, reduction, dt, U.load(b, out, at, dt), new)
                U.store(b, out, at, new, dt)

        U.nest(b, list(idx_shape), [U.contiguous_strides(idx_shape), base], [U.i64(0), U.i64(0)], body, name="se")
    b.ret_void()
    return fn


# --- scans and selections ------------------------------------------------------------------------------


def _outer_inner(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def emit_cumulative(module: ir.Module, name: str, dtype: np.dtype, shape: tuple[int, ...], axis: int, kind: str,
                    exclusive: bool, reverse: bool) -> ir.Function:
    """void name(out, x, tid, nthreads): running sum (kind "sum") or product along `axis`, in the element
    type (float16 rounds each step, integers wrap, as numpy's cumsum / cumprod)."""
    dt = np.dtype(dtype)
    fn, b = _fn(module, name, [("out", dt), ("x", dt)])
    out, x, tid, nt = fn.args
    outer, n, inner = _outer_inner(shape, axis)
    if outer * n * inner == 0:
        b.ret_void()
        return fn
    acc = U.entry_alloca(b, U.compute_type(dt), "acc.slot")
    unit = U.const(dt, 0 if kind == "sum" else 1)

    def body(_: list[ir.Value], ix: list[ir.Value]) -> None:
        o, i = ix
        base = b.add(b.mul(o, U.i64(n * inner)), i)
        b.store(unit, acc)
        with U.for_range(b, 0, n, "a") as a:
            t = b.sub(U.i64(n - 1), a) if reverse else a
            at = b.add(base, b.mul(t, U.i64(inner)))
            v = U.load(b, x, at, dt)
            cur = b.load(acc)
            nxt = _combine(b, "add" if kind == "sum" else "mul", dt, cur, v)
            U.store(b, out, at, cur if exclusive else nxt, dt)
            b.store(nxt, acc)

    U.nest(b, [outer, inner], [[0, 0]], [U.i64(0)], body, split=(tid, nt), name="cum")
    b.ret_void()
    return fn


def _better(b: ir.IRBuilder, dt: np.dtype, largest: bool, v: ir.Value, w: ir.Value) -> ir.Value:
    """v strictly ahead of w (NaN counts as the largest value)."""
    if dt.kind == "f":
        v_nan, w_nan = b.fcmp_unordered("uno", v, v), b.fcmp_unordered("uno", w, w)
        if largest:
            return b.or_(b.fcmp_ordered(">", v, w), b.and_(v_nan, b.not_(w_nan)))
        return b.or_(b.fcmp_ordered("<", v, w), b.and_(w_nan, b.not_(v_nan)))
    cmp = b.icmp_signed if dt.kind == "i" else b.icmp_unsigned
    return cmp(">" if largest else "<", v, w)


def emit_topk(module: ir.Module, name: str, dtype: np.dtype, shape: tuple[int, ...], axis: int, k: int,
              largest: bool) -> ir.Function:
    """void name(values, i64* indices, x, tid, nthreads): per line along `axis`, an insertion into the
    sorted outputs (ties keep the lower index first)."""
    dt = np.dtype(dtype)
    fn, b = U.new_function(module, name, [("values", U.ptr_type(dt)), ("indices", U.I64.as_pointer()),
                                          ("x", U.ptr_type(dt)), ("tid", U.I32), ("nthreads", U.I32)])
    vals, idxs, x, tid, nt = fn.args
    outer, n, inner = _outer_inner(shape, axis)
    if outer * inner * k == 0:
        b.ret_void()
        return fn
    count = U.entry_alloca(b, U.I64, "count.slot")
    pos = U.entry_alloca(b, U.I64, "pos.slot")

    def body(_: list[ir.Value], ix: list[ir.Value]) -> None:
        o, i = ix
        xb = b.add(b.mul(o, U.i64(n * inner)), i, name="xb")
        ob = b.add(b.mul(o, U.i64(k * inner)), i, name="ob")
        b.store(U.i64(0), count)
        with U.for_range(b, 0, n, "a") as a:
            v = U.load(b, x, b.add(xb, b.mul(a, U.i64(inner))), dt, name="v")
            c = b.load(count)
            full = b.icmp_signed("==", c, U.i64(k))
            last = b.add(ob, b.mul(U.i64(k - 1), U.i64(inner)))
            enter = b.or_(b.not_(full), _better(b, dt, largest, v, U.load(b, vals, last, dt)))
            with U.if_then(b, enter, "enter"):
                b.store(b.select(full, U.i64(k - 1), c), pos)
                # Shift worse entries down one place until v's place is found.
                head = b.function.append_basic_block("shift.head")
                step = b.function.append_basic_block("shift.step")
                done = b.function.append_basic_block("shift.done")
                b.branch(head)
                b.position_at_end(head)
                p = b.load(pos)
                prev = b.add(ob, b.mul(b.sub(p, U.i64(1)), U.i64(inner)))
                more = b.icmp_signed(">", p, U.i64(0))
                safe_prev = b.select(more, prev, ob)
                go = b.and_(more, _better(b, dt, largest, v, U.load(b, vals, safe_prev, dt)))
                b.cbranch(go, step, done)
                b.position_at_end(step)
                here = b.add(ob, b.mul(p, U.i64(inner)))
                b.store(b.load(b.gep(vals, [prev], inbounds=True)), b.gep(vals, [here], inbounds=True))
                b.store(b.load(b.gep(idxs, [prev], inbounds=True)), b.gep(idxs, [here], inbounds=True))
                b.store(b.sub(p, U.i64(1)), pos)
                b.branch(head)
                b.position_at_end(done)
                at = b.add(ob, b.mul(b.load(pos), U.i64(inner)))
                U.store(b, vals, at, v, dt)
                b.store(a, b.gep(idxs, [at], inbounds=True))
                b.store(b.select(full, c, b.add(c, U.i64(1))), count)

    U.nest(b, [outer, inner], [[0, 0]], [U.i64(0)], body, split=(tid, nt), name="tk")
    b.ret_void()
    return fn


def emit_onehot(module: ir.Module, name: str, dtype: np.dtype, idx_dtype: np.dtype, idx_shape: tuple[int, ...],
                depth: int, axis: int) -> ir.Function:
    """void name(out, indices, values, tid, nthreads): values[1] where the axis coordinate is the index."""
    dt = np.dtype(dtype)
    it = np.dtype(idx_dtype)
    fn, b = _fn(module, name, [("out", dt), ("indices", it), ("values", dt)])
    out, indices, values, tid, nt = fn.args
    outer, inner = math.prod(idx_shape[:axis]), math.prod(idx_shape[axis:])
    if outer * depth * inner == 0:
        b.ret_void()
        return fn
    off = b.load(b.gep(values, [U.i64(0)], inbounds=True), name="off")
    on = b.load(b.gep(values, [U.i64(1)], inbounds=True), name="on")

    def body(offs: list[ir.Value], ix: list[ir.Value]) -> None:
        _, d, _ = ix
        raw = U.load(b, indices, offs[1], it, name="raw")
        if it.kind == "f":
            j = b.fptosi(raw, U.I64)
        elif it.kind == "b" or raw.type.width < 64:
            j = b.zext(raw, U.I64) if it.kind in "ub" else b.sext(raw, U.I64)
        else:
            j = raw
        j = b.select(b.icmp_signed("<", j, U.i64(0)), b.add(j, U.i64(depth)), j)
        b.store(b.select(b.icmp_signed("==", j, d), on, off), b.gep(out, [offs[0]], inbounds=True))

    U.nest(b, [outer, depth, inner], [[depth * inner, inner, 1], [inner, 0, 1]], [U.i64(0), U.i64(0)], body,
           split=(tid, nt), name="oh")
    b.ret_void()
    return fn


def emit_reverse_sequence(module: ir.Module, name: str, dtype: np.dtype, len_dtype: np.dtype,
                          shape: tuple[int, ...], batch_axis: int, time_axis: int) -> ir.Function:
    """void name(out, x, lens, tid, nthreads): out[.., t, ..] = x[.., len - 1 - t, ..] for t < len; the
    rest of each line (and each inner slice) is copied as is."""
    dt = np.dtype(dtype)
    fn, b = _fn(module, name, [("out", dt), ("x", dt), ("lens", len_dtype)])
    out, x, lens, tid, nt = fn.args
    if math.prod(shape) == 0:
        b.ret_void()
        return fn
    steps = shape[time_axis]
    inner = math.prod(shape[2:])
    st = U.contiguous_strides(shape)

    def body(_: list[ir.Value], ix: list[ir.Value]) -> None:
        bi, t = (ix[0], ix[1]) if batch_axis == 0 else (ix[1], ix[0])
        raw = b.load(b.gep(lens, [bi], inbounds=True))
        n = b.sext(raw, U.I64) if raw.type.width < 64 else raw
        n = b.select(b.icmp_signed("<", n, U.i64(0)), U.i64(0), n)
        n = b.select(b.icmp_signed(">", n, U.i64(steps)), U.i64(steps), n)
        src_t = b.select(b.icmp_signed("<", t, n), b.sub(b.sub(n, U.i64(1)), t), t)
        row = b.add(b.mul(ix[0], U.i64(st[0])), b.mul(ix[1], U.i64(st[1])))
        src_row = b.add(b.mul(bi, U.i64(st[batch_axis])), b.mul(src_t, U.i64(st[time_axis])))
        _memcpy(b, _bytes_ptr(b, out, row), _bytes_ptr(b, x, src_row), U.i64(inner * dt.itemsize))

    U.nest(b, [shape[0], shape[1]], [[0, 0]], [U.i64(0)], body, split=(tid, nt), name="rs")
    b.ret_void()
    return fn
