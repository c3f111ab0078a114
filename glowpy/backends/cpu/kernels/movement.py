"""Data movement kernels: strided copies (Transpose, Slice, Expand, Concat, Split, plain copies), Pad
and Gather. Reshape never gets here: it is an alias in the memory plan.

Every copy is `dst[dst_off + sum i_d * dst_stride_d] = src[src_off + sum i_d * src_stride_d]` over a
region shape; dims contiguous on both sides are merged, so a Concat along channels is a few long
contiguous runs per input and a Transpose is a nest whose inner loop reads with a stride.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U


@dataclass
class Copy:
    dst: int  # index into the function's pointer params
    src: int
    shape: tuple[int, ...]
    dst_strides: list[int]
    dst_offset: int
    src_strides: list[int]
    src_offset: int


def _params(dtype: np.dtype, names: Sequence[str]) -> list[tuple[str, ir.Type]]:
    return [(n, U.ptr_type(dtype)) for n in names] + [("tid", U.I32), ("nthreads", U.I32)]


def emit_copies(module: ir.Module, name: str, dtype: np.dtype, names: Sequence[str], copies: Sequence[Copy]) -> ir.Function:
    """A kernel doing each copy in turn (each one split across threads along its outer dim)."""
    fn, b = U.new_function(module, name, _params(dtype, names))
    ptrs = fn.args[:len(names)]
    tid, nt = fn.args[-2], fn.args[-1]
    for n, c in enumerate(copies):
        dims, (dst_s, src_s) = U.merge_nest(c.shape, [c.dst_strides, c.src_strides])
        if np.prod(c.shape, dtype=np.int64) == 0:
            continue
        if not dims:
            dims, dst_s, src_s = [1], [0], [0]

        def body(offs: list[ir.Value], idx: list[ir.Value], c: Copy = c) -> None:
            p = b.gep(ptrs[c.src], [offs[1]], inbounds=True)
            v = b.load(p)
            b.store(v, b.gep(ptrs[c.dst], [offs[0]], inbounds=True))

        U.nest(b, dims, [dst_s, src_s], [U.i64(c.dst_offset), U.i64(c.src_offset)], body, split=(tid, nt),
               name=f"c{n}.")
    b.ret_void()
    return fn


def transpose_copy(in_shape: tuple[int, ...], perm: Sequence[int]) -> Copy:
    src = U.contiguous_strides(in_shape)
    out_shape = tuple(in_shape[p] for p in perm)
    return Copy(0, 1, out_shape, U.contiguous_strides(out_shape), 0, [src[p] for p in perm], 0)


def slice_copy(in_shape: tuple[int, ...], out_shape: tuple[int, ...], starts, axes, steps) -> Copy:
    src = U.contiguous_strides(in_shape)
    strides = list(src)
    offset = 0
    for s, a, st in zip(starts, axes, steps):
        a = a % len(in_shape)
        if out_shape[a] == 0:
            continue
        # The importer clamps starts; clamp again so the first element read is always in range.
        s = min(max(s, 0), in_shape[a] - 1)
        offset += s * src[a]
        strides[a] = src[a] * st
    return Copy(0, 1, out_shape, U.contiguous_strides(out_shape), 0, strides, offset)


def expand_copy(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Copy:
    from glowpy.backends.cpu.kernels.elementwise import broadcast_strides

    return Copy(0, 1, out_shape, U.contiguous_strides(out_shape), 0, broadcast_strides(in_shape, out_shape), 0)


def concat_copies(in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...], axis: int) -> list[Copy]:
    dst = U.contiguous_strides(out_shape)
    copies, at = [], 0
    for k, s in enumerate(in_shapes):
        copies.append(Copy(0, 1 + k, tuple(s), dst, at * dst[axis], U.contiguous_strides(s), 0))
        at += s[axis]
    return copies


def split_copies(in_shape: tuple[int, ...], sizes: Sequence[int], axis: int) -> list[Copy]:
    src = U.contiguous_strides(in_shape)
    copies, at = [], 0
    for k, n in enumerate(sizes):
        shape = in_shape[:axis] + (n,) + in_shape[axis + 1:]
        copies.append(Copy(k, len(sizes), shape, U.contiguous_strides(shape), 0, src, at * src[axis]))
        at += n
    return copies


def plain_copy(shape: tuple[int, ...]) -> Copy:
    s = U.contiguous_strides(shape)
    return Copy(0, 1, shape, s, 0, s, 0)


# --- Pad -------------------------------------------------------------------------------------------


def emit_pad(module: ir.Module, name: str, dtype: np.dtype, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
             pads: Sequence[int], mode: str, value: float) -> ir.Function:
    """void name(out, x, tid, nthreads). Negative pads crop."""
    r = len(in_shape)
    fn, b = U.new_function(module, name, _params(dtype, ["out", "x"]))
    out, x, tid, nt = fn.args
    if np.prod(out_shape, dtype=np.int64) == 0:
        b.ret_void()
        return fn
    in_st = U.contiguous_strides(in_shape)
    out_st = U.contiguous_strides(out_shape)
    empty_in = np.prod(in_shape, dtype=np.int64) == 0
    fill = U.narrow(b, U.const(dtype, value), dtype)

    # Every output element computes its source index per dim (branch-free, so threads can split
    # the output with no ordering between a fill and a copy).
    def body(offs: list[ir.Value], idx: list[ir.Value]) -> None:
        if empty_in:
            b.store(fill, b.gep(out, [offs[0]], inbounds=True))
            return
        src = U.i64(0)
        ok = None
        for d in range(r):
            n = in_shape[d]
            j = b.sub(idx[d], U.i64(pads[d]))
            if mode == "constant":
                inside = b.and_(b.icmp_signed(">=", j, U.i64(0)), b.icmp_signed("<", j, U.i64(n)))
                ok = inside if ok is None else b.and_(ok, inside)
                j = b.select(inside, j, U.i64(0))
            elif mode == "edge":
                j = b.select(b.icmp_signed("<", j, U.i64(0)), U.i64(0), j)
                j = b.select(b.icmp_signed(">", j, U.i64(n - 1)), U.i64(n - 1), j)
            elif n == 1:  # reflect of a single element
                j = U.i64(0)
            else:  # reflect (numpy semantics, repeated reflection for wide pads)
                period = 2 * (n - 1)
                m = b.srem(j, U.i64(period))
                m = b.select(b.icmp_signed("<", m, U.i64(0)), b.add(m, U.i64(period)), m)
                j = b.select(b.icmp_signed(">=", m, U.i64(n)), b.sub(U.i64(period), m), m)
            src = b.add(src, b.mul(j, U.i64(in_st[d])))
        v = b.load(b.gep(x, [src], inbounds=True))
        if ok is not None:
            v = b.select(ok, v, fill)
        b.store(v, b.gep(out, [offs[0]], inbounds=True))

    U.nest(b, list(out_shape), [out_st], [U.i64(0)], body, split=(tid, nt))
    b.ret_void()
    return fn


# --- Gather ----------------------------------------------------------------------------------------


def emit_gather(module: ir.Module, name: str, dtype: np.dtype, idx_dtype: np.dtype, x_shape: tuple[int, ...],
                idx_size: int, axis: int) -> ir.Function:
    """void name(out, x, indices, tid, nthreads). Negative indices count from the end; an index out of
    range yields zeros (never a read outside x)."""
    params = [("out", U.ptr_type(dtype)), ("x", U.ptr_type(dtype)), ("indices", U.ptr_type(idx_dtype)),
              ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, indices, tid, nt = fn.args
    outer = int(np.prod(x_shape[:axis], dtype=np.int64))
    n = x_shape[axis]
    inner = int(np.prod(x_shape[axis + 1:], dtype=np.int64))
    if outer * idx_size * inner == 0:
        b.ret_void()
        return fn
    zero = U.narrow(b, U.const(dtype, 0), dtype)

    def body(offs: list[ir.Value], ix: list[ir.Value]) -> None:
        o, k = ix[0], ix[1]
        raw = b.load(b.gep(indices, [k], inbounds=True), name="index")
        j = b.sext(raw, U.I64) if raw.type.width < 64 else raw
        j = b.select(b.icmp_signed("<", j, U.i64(0)), b.add(j, U.i64(n)), j, name="j")
        ok = b.and_(b.icmp_signed(">=", j, U.i64(0)), b.icmp_signed("<", j, U.i64(n)), name="in_range")
        safe = b.select(ok, j, U.i64(0))
        src = b.add(b.mul(o, U.i64(n * inner)), b.mul(safe, U.i64(inner)), name="src")
        dst = b.mul(b.add(b.mul(o, U.i64(idx_size)), k), U.i64(inner), name="dst")
        with U.for_range(b, 0, inner, "e") as e:
            v = b.load(b.gep(x, [b.add(src, e)], inbounds=True))
            b.store(b.select(ok, v, zero), b.gep(out, [b.add(dst, e)], inbounds=True))

    U.nest(b, [outer, idx_size], [[0, 0]], [U.i64(0)], body, split=(tid, nt), name="g")
    b.ret_void()
    return fn
