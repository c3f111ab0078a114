"""A Loop the optimizer could not unroll (its trip count or condition is decided at run time) as one
kernel step: a basic-block loop around the body's own kernel steps, inside the one native call.

The body is lowered and bound like a graph of its own (a `Lowering` with a name prefix, then
codegen's `Binder`): its inputs and outputs are pointers the loop hands it each iteration, its
constants come in as the loop kernel's arguments, its activations live in the loop step's scratch.
Per iteration:

    inputs  = [iteration (i64 slot), cond (byte slot), *current carried, *captures]
    outputs = [cond (byte slot), *next carried, *scan output rows at the iteration]

The carried values are double-buffered in the scratch (current / next swap after each iteration, so a
body that permutes them reads no half-written value); the initial values are copied in before the
first iteration and the final ones copied out after the last. The loop runs while i < M and the
condition holds (M is read as an int64, the condition as a byte; with M = 0 or a false condition
at entry the outputs are the initial values). Scan outputs need a static trip count (`trip_count`
from the importer): at most that many iterations write rows, so no run writes out of bounds.

The loop step runs on one thread (whichever claims it), its body steps single-threaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.memory import Interval, align_up, plan_arena
from glowpy.backends.cpu.steps import SCRATCH, Arg, Step
from glowpy.errors import InternalError, UnsupportedShape
from glowpy.ir.graph import Node
from glowpy.ir.ops.control import loop_counts, static_iterations

if TYPE_CHECKING:
    from glowpy.backends.cpu.lowering import Lowering

MEMCPY = "llvm.memcpy.p0i8.p0i8.i64"


def _memcpy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, nbytes: int) -> None:
    if nbytes:
        fn = U.declare(b.module, MEMCPY, U.VOID, [U.I8P, U.I8P, U.I64, U.I1])
        b.call(fn, [dst, src, U.i64(nbytes), ir.Constant(U.I1, 0)])


def _at(b: ir.IRBuilder, base: ir.Value, offset: int | ir.Value, name: str = "") -> ir.Value:
    off = U.i64(offset) if isinstance(offset, int) else offset
    return b.gep(base, [off], inbounds=True, name=name)


def check_loop(node: Node) -> None:
    """Refuse a Loop whose scan outputs have a length only a run decides (M fed at run time, or a
    condition the body computes): their shape is data-dependent."""
    n, k = loop_counts(node.attrs)
    if k and static_iterations(node) is None:
        out = node.outputs[n]
        raise UnsupportedShape(f"the Loop's scan output '{out.name}' has a length decided at run time (the "
                               f"iterations depend on M or on the condition), so its shape is data-dependent",
                               node=node.name, op="Loop", expected="M a constant and a condition the body passes on",
                               found=f"declared {list(out.shape)}" if node.attrs["trip_count"] >= 0
                               else "no static length")


def emit_loop(low: Lowering, node: Node) -> None:
    """The Loop node as one step (see the module docstring)."""
    # codegen (the binding) is built on lowering, which reaches this through KERNELS: import it here.
    from glowpy.backends.cpu.codegen import Binder

    check_loop(node)
    body = node.attrs["body"]
    n, k = loop_counts(node.attrs)
    trips = node.attrs["trip_count"]
    name = low.fname([node])
    kmod = low.kmod()
    sub = low.child(body, kmod, f"{name}.")
    binder = Binder(body, sub.run(), kmod, prefix=f"{name}.")
    steps = binder.bind()
    storage = binder.of
    for key, text in sub.kernel_defs.items():
        if low.kernel_defs.setdefault(key, text) != text:
            raise InternalError(f"two kernels define different functions named '{key}'")
    for key, text in sub.kernel_decls.items():
        low.kernel_decls.setdefault(key, text)
    low.used_fast += sub.used_fast

    # Scratch: the body's arena (live ranges as for a graph), the carried buffers twice, the slots.
    intervals, seen = [], set()
    for st in storage.values():
        if st.kind == "arena" and id(st) not in seen:
            seen.add(id(st))
            intervals.append(Interval(("buf", id(st)), st.nbytes, st.first, max(st.last, st.first)))
    for j, s in enumerate(steps):
        if s.scratch and any(a.kind == "scratch" for a in s.args):
            intervals.append(Interval(("scratch", j), align_up(s.scratch), j, j))
    plan = plan_arena(intervals)
    carried = node.outputs[:n]
    offset = align_up(plan.size)
    cur_off, nxt_off = [], []
    for v in carried:
        cur_off.append(offset)
        offset += align_up(v.type.nbytes)
    for v in carried:
        nxt_off.append(offset)
        offset += align_up(v.type.nbytes)
    iter_off, cin_off, cout_off = offset, offset + 8, offset + 16
    scratch = offset + 64

    # Arguments: M, cond, initial carried, captures, the body's constants and arrays, outputs, scratch.
    consts = list({id(st): st for st in storage.values() if st.kind == "const"}.values())
    arrays = sorted({a.index for s in steps for a in s.args if a.kind == "array"})
    args = [Arg("value", v) for v in node.inputs] + [Arg("value", st.values[0]) for st in consts]
    args += [Arg("array", index=i) for i in arrays] + [Arg("value", v) for v in node.outputs] + [SCRATCH]
    fn, b = U.new_function(kmod, name, [(f"p{i}", U.I8P) for i in range(len(args))]
                           + [("tid", U.I32), ("nthreads", U.I32)])
    p = list(fn.args)
    m_ptr, cond_ptr = p[0], p[1]
    init, captures = p[2:2 + n], p[2 + n:len(node.inputs)]
    q = len(node.inputs)
    const_ptr = {id(st): p[q + i] for i, st in enumerate(consts)}
    q += len(consts)
    array_ptr = {idx: p[q + i] for i, idx in enumerate(arrays)}
    q += len(arrays)
    finals, scans = p[q:q + n], p[q + n:q + n + k]
    base = p[-3]

    for j, v in enumerate(carried):
        _memcpy(b, _at(b, base, cur_off[j]), init[j], v.type.nbytes)
    m = b.load(b.bitcast(m_ptr, U.I64.as_pointer()), name="M")
    bound = m if trips < 0 else b.select(b.icmp_signed("<", m, U.i64(trips)), m, U.i64(trips), name="bound")
    go0 = b.icmp_unsigned("!=", b.load(cond_ptr, name="cond.entry"), ir.Constant(U.I8, 0), name="go.entry")
    it_slot = b.bitcast(_at(b, base, iter_off), U.I64.as_pointer(), name="iteration.slot")
    cin, cout = _at(b, base, cin_off, "cond.in"), _at(b, base, cout_off, "cond.out")

    pre = b.block
    head = fn.append_basic_block("loop.head")
    run = fn.append_basic_block("loop.body")
    done = fn.append_basic_block("loop.done")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(U.I64, name="i")
    go = b.phi(U.I1, name="go")
    phase = b.phi(U.I1, name="phase")  # false: current carried at cur_off; true: at nxt_off
    i.add_incoming(U.i64(0), pre)
    go.add_incoming(go0, pre)
    phase.add_incoming(ir.Constant(U.I1, 0), pre)
    b.cbranch(b.and_(go, b.icmp_signed("<", i, bound)), run, done)

    b.position_at_end(run)
    b.store(i, it_slot)
    b.store(b.zext(go, U.I8), cin)
    cur = [b.select(phase, _at(b, base, nxt_off[j]), _at(b, base, cur_off[j]), name=f"cur{j}") for j in range(n)]
    nxt = [b.select(phase, _at(b, base, cur_off[j]), _at(b, base, nxt_off[j]), name=f"next{j}") for j in range(n)]
    rows = [_at(b, scans[j], b.mul(i, U.i64(v.type.nbytes)), f"row{j}") for j, v in enumerate(body.outputs[1 + n:])]
    ins = [b.bitcast(it_slot, U.I8P), cin, *cur, *captures]
    outs = [cout, *nxt, *rows]

    def pointer(a: Arg, j: int) -> ir.Value:
        if a.kind in ("null", "sync"):  # the body runs on one thread: no step of it cooperates
            return ir.Constant(U.I8P, None)
        if a.kind == "output":
            return outs[a.index]
        if a.kind == "array":
            return array_ptr[a.index]
        if a.kind == "scratch":
            key = ("scratch", j)
            return _at(b, base, plan.offsets[key]) if key in plan.offsets else ir.Constant(U.I8P, None)
        st = storage[id(a.value)]
        if st.kind == "input":
            return ins[st.index]
        if st.kind == "output":
            return outs[st.index]
        if st.kind == "const":
            return const_ptr[id(st)]
        return _at(b, base, plan.offsets[("buf", id(st))])

    for j, s in enumerate(steps):
        if s.fn is None:
            continue
        params = s.fn.function_type.args
        call_args = [pointer(a, j) for a in s.args]
        if len(call_args) + 2 != len(params):
            raise InternalError(f"step {s.name}: argument count differs from its kernel", expected=len(params),
                                found=len(call_args) + 2)
        call_args = [b.bitcast(x, t) if x.type != t else x for x, t in zip(call_args, params)]
        call_args += [U.i32(0), U.i32(1)]
        if s.guard is None:
            b.call(s.fn, call_args)
            continue
        cond, when = s.guard
        byte = b.load(pointer(Arg("value", cond), j), name=f"guard{j}.byte")
        with U.if_then(b, b.icmp_unsigned("!=" if when else "==", byte, ir.Constant(U.I8, 0)), f"guard{j}"):
            b.call(s.fn, call_args)
    go_next = b.icmp_unsigned("!=", b.load(cout, name="cond.next"), ir.Constant(U.I8, 0), name="go.next")
    i.add_incoming(b.add(i, U.i64(1), name="i.next"), b.block)
    go.add_incoming(go_next, b.block)
    phase.add_incoming(b.not_(phase, name="phase.next"), b.block)
    b.branch(head)

    b.position_at_end(done)
    for j, v in enumerate(carried):
        src = b.select(phase, _at(b, base, nxt_off[j]), _at(b, base, cur_off[j]))
        _memcpy(b, finals[j], src, v.type.nbytes)
    b.ret_void()

    work = sum(s.work for s in steps)
    low.add(Step(name, fn, args, list(node.outputs), [node], work=work, scratch=scratch))
    low.steps[-1].parallel = False  # the body's steps are called from one thread only
