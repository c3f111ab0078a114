"""Reductions (ReduceSum / ReduceMean / ReduceMax / ReduceMin / ReduceProd, global pools) and ArgMax.

A reduction loops over the kept dims outside (threads split the outermost) and the reduced dims
inside, accumulating in a register: float16 and float32 sum in float32 with reassociation allowed
(so the inner loop vectorizes), float64 in float64, integers wrap like numpy's astype of the sum,
and an integer mean divides in float64 and truncates. An empty reduction stores the identity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.kernels.elementwise import _fmax, _fmin

_REASSOC = ("reassoc", "contract")


def emit_reduce(module: ir.Module, name: str, dtype: np.dtype, x_shape: tuple[int, ...], axes: Sequence[int],
                kind: str) -> ir.Function:
    """void name(out, x, tid, nthreads); kind in sum | mean | max | min | prod. The output holds the kept dims
    in order (keepdims only changes the shape, not the layout)."""
    dt = np.dtype(dtype)
    params = [("out", U.ptr_type(dt)), ("x", U.ptr_type(dt)), ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, tid, nt = fn.args
    rank = len(x_shape)
    axes = sorted({a % rank for a in axes}) if axes else list(range(rank))
    kept = [d for d in range(rank) if d not in axes]
    xs = U.contiguous_strides(x_shape)
    kept_dims = [x_shape[d] for d in kept]
    red_dims = [x_shape[d] for d in axes]
    n_out = math.prod(kept_dims)
    n_red = math.prod(red_dims)
    if n_out == 0:
        b.ret_void()
        return fn
    k_dims, (k_out, k_in) = U.merge_nest(kept_dims, [U.contiguous_strides(kept_dims), [xs[d] for d in kept]])
    r_dims, (r_in,) = U.merge_nest(red_dims, [[xs[d] for d in axes]])
    if not k_dims:
        k_dims, k_out, k_in = [1], [0], [0]

    if dt.kind == "f":
        acc_t = U.F64 if dt == np.float64 else U.F32
    else:
        acc_t = U.I64 if kind == "mean" else U.compute_type(dt)
    slot = U.entry_alloca(b, acc_t, "acc.slot")
    if kind == "max":
        init = U.lowest(dt)
    elif kind == "min":
        init = ir.Constant(acc_t, math.inf) if dt.kind == "f" else U.const(dt, np.iinfo(dt).max)
    else:
        one = 1 if kind == "prod" else 0
        init = ir.Constant(acc_t, float(one) if dt.kind == "f" else one)

    def per_output(offs: list[ir.Value], idx: list[ir.Value]) -> None:
        b.store(init, slot)

        def per_elem(roffs: list[ir.Value], ridx: list[ir.Value]) -> None:
            v = U.load(b, x, b.add(offs[1], roffs[0]), dt, name="x")
            acc = b.load(slot)
            if kind in ("max", "min"):
                b.store((_fmax if kind == "max" else _fmin)(b, acc, v, dt), slot)
            elif dt.kind == "f":
                if v.type != acc_t:
                    v = b.fpext(v, acc_t)
                b.store((b.fmul if kind == "prod" else b.fadd)(acc, v, flags=_REASSOC), slot)
            else:
                if v.type != acc_t:
                    v = b.sext(v, acc_t) if dt.kind == "i" else b.zext(v, acc_t)
                b.store((b.mul if kind == "prod" else b.add)(acc, v), slot)

        if n_red == 0:
            pass
        elif not r_dims:
            per_elem([U.i64(0)], [])
        else:
            U.nest(b, r_dims, [r_in], [U.i64(0)], per_elem, name="r")
        acc = b.load(slot)
        if kind == "mean":
            if dt.kind == "f":
                acc = b.fdiv(acc, ir.Constant(acc_t, float(n_red)))
            else:
                q = b.fdiv(b.sitofp(acc, U.F64), ir.Constant(U.F64, float(n_red)))
                acc = b.fptosi(q, U.compute_type(dt))
        ct = U.compute_type(dt)
        if dt.kind == "f" and acc.type != ct:
            acc = b.fptrunc(acc, ct)
        elif dt.kind != "f" and acc.type != ct:
            acc = b.trunc(acc, ct)
        U.store(b, out, offs[0], acc, dt)

    U.nest(b, k_dims, [k_out, k_in], [U.i64(0), U.i64(0)], per_output, split=(tid, nt), name="k")
    b.ret_void()
    return fn


def emit_argmax(module: ir.Module, name: str, dtype: np.dtype, x_shape: tuple[int, ...], axis: int,
                select_last: bool) -> ir.Function:
    """void name(i64* out, x, tid, nthreads): index of the max along `axis` (NaN wins, like numpy)."""
    dt = np.dtype(dtype)
    params = [("out", U.I64.as_pointer()), ("x", U.ptr_type(dt)), ("tid", U.I32), ("nthreads", U.I32)]
    fn, b = U.new_function(module, name, params)
    out, x, tid, nt = fn.args
    axis %= len(x_shape)
    outer = math.prod(x_shape[:axis])
    n = x_shape[axis]
    inner = math.prod(x_shape[axis + 1:])
    if outer * inner == 0 or n == 0:
        b.ret_void()
        return fn
    best_v = U.entry_alloca(b, U.compute_type(dt), "best.slot")
    best_i = U.entry_alloca(b, U.I64, "besti.slot")
    is_f = dt.kind == "f"

    def per_output(offs: list[ir.Value], idx: list[ir.Value]) -> None:
        o, i = idx
        base = b.add(b.mul(o, U.i64(n * inner)), i, name="base")
        b.store(U.load(b, x, base, dt), best_v)
        b.store(U.i64(0), best_i)
        with U.for_range(b, 1, n, "a") as a:
            v = U.load(b, x, b.add(base, b.mul(a, U.i64(inner))), dt, name="v")
            cur = b.load(best_v)
            if is_f:
                cur_nan = b.fcmp_unordered("uno", cur, cur)
                v_nan = b.fcmp_unordered("uno", v, v)
                better = b.fcmp_ordered(">=" if select_last else ">", v, cur)
                # The first NaN wins and stays (numpy's argmax); select_last takes the last NaN.
                take_nan = b.and_(v_nan, b.not_(cur_nan)) if not select_last else v_nan
                better = b.select(cur_nan, take_nan if select_last else ir.Constant(U.I1, 0),
                                  b.or_(better, take_nan))
            else:
                cmp = b.icmp_signed if dt.kind == "i" else b.icmp_unsigned
                better = cmp(">=" if select_last else ">", v, cur)
            b.store(b.select(better, v, cur), best_v)
            b.store(b.select(better, a, b.load(best_i)), best_i)
        b.store(b.load(best_i), b.gep(out, [b.add(b.mul(o, U.i64(inner)), i)], inbounds=True))

    U.nest(b, [outer, inner], [[0, 0]], [U.i64(0)], per_output, split=(tid, nt), name="am")
    b.ret_void()
    return fn
