"""IR graph -> one LLVM module with a single native entry per graph:

    void glowpy_run(i8** weights, i8* arena, i8** inputs, i8** outputs)

It runs every kernel step in order. Buffers are bound here: graph inputs and outputs by the
caller's pointers (outputs are written in place, no copies), constants and the kernels' packed
arrays through the weights table (one pointer per read-only array, so no array is ever copied into
a second block: peak memory stays at one copy of the weights), activations at offsets in the arena from the
liveness plan (memory.py); Reshape-like steps alias their source, and elementwise steps write over
an operand that dies there.

Threads: with N > 1 threads and at least one kernel worth splitting, the entry hands each run to a
persistent pool of N-1 pthreads kept in the arena (threads.py: started by the first run, parked between
runs, joined by `glowpy_release(arena)`), and every thread runs `glowpy.worker(shared, tid)`, which
passes every step in order and claims its chunks (threads.py): a split kernel's nthreads chunks, each
run as (chunk, nthreads), or a serial kernel's one, run as (0, 1) by whichever thread takes it. Before
its chunks a step waits for the earlier steps whose memory overlaps its own (one writes what the other
reads or writes: buffers, a serial step's scratch; a split step's scratch is each thread's own block) and that no earlier wait covered, so independent steps (SqueezeNet's
two expand convs, BERT's Q, K and V projections) follow each other without one, and a late thread's
chunks are taken by the others instead of waited for; thread 0 ends the run by waiting for the steps
still pending (`Program.waits`). A thread that fails to start is simply not counted: work is split over
the threads that did start. A cooperative step's chunks share one scratch block and get the step's
words in the pool (Arg "sync"), through which they synchronize inside the kernel (threads.py).

Profile builds (profile "wall" or "cpu", PROFILE_CLOCKS; otherwise no timing code is emitted): a block of
i64 nanosecond stamps in the arena (`profile_layout`): the run's begin and end and the started thread count,
written by the entry, then one row per thread of (start, end) per step, written by each thread
around each kernel call it makes (clock_gettime: CLOCK_MONOTONIC is a vDSO call on Linux, the thread CPU
clock a system call, ~0.2 us).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.backends.cpu.lowering import Lowering, copy_function
from glowpy.backends.cpu.memory import Interval, Plan, align_up, plan_arena
from glowpy.backends.cpu.module_text import split_module_text
from glowpy.backends.cpu.steps import Arg, Step
from glowpy.backends.cpu.target import HostTarget
from glowpy.backends.cpu.threads import (
    EPOCH,
    NTHREADS,
    POOL_KEY,
    SHARED,
    WAIT_SLEEPERS,
    coop_block,
    counter,
    emit_no_pool,
    emit_pool,
    emit_sync,
    member,
    pool_bytes,
    pool_type,
)
from glowpy.errors import InternalError
from glowpy.ir.graph import Graph, Value
from glowpy.limits import check_bytes

ENTRY = "glowpy_run"
PROFILE_KEY = ("profile",)
THREAD_SCRATCH_KEY = ("scratch", "threads")  # the split steps' per-thread scratch blocks


@dataclass(eq=False)
class Storage:
    """A region of memory shared by one or more values (an alias class)."""

    kind: str  # input | output | const | arena
    nbytes: int
    index: int = -1  # input / output position
    offset: int = 0  # in the arena, or the index in the weights table
    first: int = 1 << 60
    last: int = -1
    values: list[Value] = field(default_factory=list)

    @property
    def fixed(self) -> bool:
        return self.kind != "arena"


@dataclass
class Program:
    """Everything the executable needs besides the compiled code."""

    module: ir.Module
    steps: list[Step]
    weights: list[np.ndarray]  # the weights table, in order (constants and packed arrays, read-only)
    weights_size: int  # bytes
    arena_size: int
    nthreads: int
    threaded: bool
    plan: Plan
    intervals: list[Interval]
    storage: dict[int, Storage]  # id(value) -> storage
    fast_kernels: list[str]
    profile_offset: int = -1  # arena offset of the per-step cycle stamps (profile builds only)
    # threaded programs: step k -> the steps it waits for before its chunks (key len(steps): the run's end)
    waits: dict[int, list[int]] = field(default_factory=dict)

    kernel_defs: dict[str, str] = field(default_factory=dict)
    kernel_decls: dict[str, str] = field(default_factory=dict)

    @property
    def ir_text(self) -> str:
        """The whole module: the entry's, with the kernels' printed definitions in place of their
        declarations, and the external declarations the kernels need."""
        out, have = [], set()
        for kind, name, text in _split_entry(str(self.module)):
            if kind == "declare" and name in self.kernel_defs:
                continue
            if kind == "declare":
                have.add(name)
            out.append(text)
        out += [t for n, t in self.kernel_decls.items() if n not in have and n not in self.kernel_defs]
        out += list(self.kernel_defs.values())
        return "\n\n".join(out) + "\n"


class Binder:
    """Alias classes, graph input/output binding, in-place reuse, live ranges, arena offsets."""

    def __init__(self, graph: Graph, steps: list[Step], module: ir.Module, prefix: str = "") -> None:
        self.graph = graph
        self.prefix = prefix  # of the copies' names (a Loop body's, loops.py)
        self.steps = steps
        self.module = module
        self.of: dict[int, Storage] = {}

    def storage(self, v: Value) -> Storage:
        st = self.of.get(id(v))
        if st is None:
            kind = "const" if v.is_constant else "arena"
            st = Storage(kind, v.type.nbytes, values=[v])
            self.of[id(v)] = st
        return st

    def merge(self, keep: Storage, gone: Storage) -> Storage:
        if keep is gone:
            return keep
        if keep.fixed and gone.fixed:
            raise InternalError("merging two bound buffers")
        if gone.fixed:
            keep, gone = gone, keep
        keep.nbytes = max(keep.nbytes, gone.nbytes)
        keep.first, keep.last = min(keep.first, gone.first), max(keep.last, gone.last)
        for v in gone.values:
            self.of[id(v)] = keep
            keep.values.append(v)
        return keep

    def bind(self) -> list[Step]:
        g = self.graph
        for i, v in enumerate(g.inputs):
            self.of[id(v)] = Storage("input", v.type.nbytes, index=i, values=[v])
        final_copies: list[Step] = []
        for j, v in enumerate(g.outputs):
            st = self.storage(v)
            if st.kind == "arena":
                st.kind, st.index = "output", j
            else:  # an input, a constant or an output listed twice: copy at the end
                fn = copy_function(self.module, f"{self.prefix}copy.output{j}", v)
                final_copies.append(Step(fn.name, fn, [Arg("output", index=j), Arg("value", v)], [], [],
                                         work=v.type.size, position=len(g.nodes)))
        steps = []
        for s in self.steps:
            if s.alias is not None:
                out, src = s.alias
                so, ss = self.storage(out), self.storage(src)
                if not (so.fixed and ss.fixed) and out.type.nbytes == src.type.nbytes:
                    self.merge(ss, so)
                    steps.append(s)
                    continue
                fn = copy_function(self.module, s.name + ".copy", out)
                s = Step(fn.name, fn, [Arg("value", out), Arg("value", src)], [out], s.nodes,
                         work=out.type.size, position=s.position)
            steps.append(s)
        steps += final_copies
        for k, s in enumerate(steps):
            s.parallel = s.parallel and s.fn is not None
            for v in s.writes:
                st = self.storage(v)
                st.first = min(st.first, k)
                st.last = max(st.last, k)
            for v in s.reads:
                st = self.storage(v)
                st.last = max(st.last, k)
        for k, s in enumerate(steps):
            for out, src in s.inplace:
                so, ss = self.storage(out), self.storage(src)
                # The operand must reach the kernel through exactly one argument: a conv whose input is
                # also its residual must not write over it while still reading it as the input.
                uses = sum(1 for a in s.args if a.kind == "value" and self.storage(a.value) is ss)
                guard = s.guard is not None and self.storage(s.guard[0]) is ss  # threads read it as they start
                if (so is not ss and so.kind == "arena" and ss.kind == "arena" and ss.last == k
                        and so.first == k and ss.nbytes >= so.nbytes and uses == 1 and not guard):
                    self.merge(ss, so)
        for k, s in enumerate(steps):  # a guard needs its condition computed by an earlier step
            if s.guard is not None:
                st = self.storage(s.guard[0])
                if st.kind != "input" and not st.first < k:
                    s.guard = None
        return steps


def _split_entry(text: str) -> list[tuple[str, str, str]]:
    """The entry module's header, then its top-level items (see module_text.split_module_text)."""
    lines = text.splitlines()
    k = 0
    while k < len(lines) and not lines[k].startswith(("define ", "declare ")):
        k += 1
    header = ("header", "", "\n".join(lines[:k]).rstrip())
    return [header] + split_module_text("\n".join(lines[k:]))


def build(graph: Graph, target: HostTarget, *, nthreads: int = 1, fast_kernels: bool = True,
          profile: str = "", release_weights: bool = False) -> Program:
    """Lower, bind, plan memory and emit the entry: an unoptimized LLVM module plus its data."""
    module = ir.Module(name=f"glowpy.{graph.name}")
    module.triple = target.triple
    module.data_layout = target.data_layout
    low = Lowering(graph, module, nthreads=nthreads, vector_width=target.vector_width, fast_kernels=fast_kernels,
                   release_weights=release_weights)
    steps = low.run()
    binder = Binder(graph, steps, module)
    steps = binder.bind()

    # Arena: one interval per arena storage, plus each step's scratch (live only during that step).
    threaded = nthreads > 1 and any(s.parallel for s in steps)
    if not threaded:
        for s in steps:
            s.parallel = False
    intervals: list[Interval] = []
    seen: set[int] = set()
    for st in binder.of.values():
        if st.kind == "arena" and id(st) not in seen:
            seen.add(id(st))
            intervals.append(Interval(("buf", id(st)), st.nbytes, st.first, max(st.last, st.first)))
    # Scratch: a split step's per-thread blocks all live in one area of a block per thread, kept for the
    # whole run (a thread runs one chunk at a time, so its block is never shared and never makes one step
    # wait for another); any other step's scratch is its own interval, live during the step.
    scratch_key: dict[int, tuple] = {}
    thread_block = max((align_up(s.scratch) for s in steps if s.scratch_per_thread and s.scratch), default=0)
    for k, s in enumerate(steps):
        if s.scratch and any(a.kind == "scratch" for a in s.args):
            scratch_key[k] = THREAD_SCRATCH_KEY if s.scratch_per_thread else ("scratch", k)
            if not s.scratch_per_thread:
                intervals.append(Interval(("scratch", k), align_up(s.scratch), k, k))
    if THREAD_SCRATCH_KEY in scratch_key.values():
        intervals.append(Interval(THREAD_SCRATCH_KEY, thread_block * nthreads, 0, max(len(steps) - 1, 0)))
    if profile:  # the stamps, kept for the whole run
        intervals.append(Interval(PROFILE_KEY, profile_bytes(len(steps), nthreads), 0, max(len(steps) - 1, 0)))
    # cooperative steps' words in the pool, by step
    coop = {k: i for i, k in enumerate(k for k, s in enumerate(steps) if s.parallel and s.cooperative)}
    if threaded:  # the thread pool, kept across runs: nothing else is ever placed over it
        intervals.append(Interval(POOL_KEY, pool_bytes(nthreads, len(steps), len(coop), target.data_layout), 0,
                                  max(len(steps) - 1, 0)))
    plan = plan_arena(intervals)
    for st in binder.of.values():
        if st.kind == "arena":
            st.offset = plan.offsets[("buf", id(st))]

    # Weights table: constants the steps read, then the kernels' compile-time arrays.
    weights: list[np.ndarray] = []
    array_offset: dict[int, int] = {}
    placed: set[int] = set()
    for s in steps:
        for a in s.args:
            if a.kind == "value" and binder.storage(a.value).kind == "const":
                st = binder.storage(a.value)
                if id(st) not in placed:
                    placed.add(id(st))
                    st.offset = len(weights)
                    data = st.values[0].data  # a broadcast view until made contiguous: check first
                    check_bytes(sum(w.nbytes for w in weights) + data.nbytes + plan.size,
                                "the weights block and activation arena")
                    weights.append(np.ascontiguousarray(data))
            elif a.kind == "array" and a.index not in array_offset:
                array_offset[a.index] = len(weights)
                weights.append(low.arrays[a.index])
    size = sum(w.nbytes for w in weights)
    waits = _emit_entry(module, target, steps, binder, plan, array_offset, scratch_key, thread_block, coop, nthreads,
                        threaded, profile)
    return Program(module, steps, weights, size, plan.size, nthreads, threaded, plan, intervals, binder.of,
                   low.used_fast, plan.offsets.get(PROFILE_KEY, -1), waits, low.kernel_defs, low.kernel_decls)


# --- the entry and the worker ----------------------------------------------------------------------

PROFILE_HEADER = 8  # i64 slots before the rows: run begin, run end, threads started, spare
# profile clocks (Linux clock ids): wall time, or each thread's CPU time, which a loaded machine's other
# processes do not stretch (a split step's chunks then show their own cost, not their preemptions)
PROFILE_CLOCKS = {"wall": 1, "cpu": 3}  # CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID


def profile_bytes(nsteps: int, nthreads: int) -> int:
    return 8 * (PROFILE_HEADER + 2 * nsteps * nthreads)


def profile_layout(nsteps: int, nthreads: int) -> dict[str, int]:
    """Slot indices (i64) in the profile block: begin, end, threads, and row(tid) + 2k (+1) = step k's
    start (end) on thread tid; a slot left 0 means that thread did not run that step."""
    return {"begin": 0, "end": 1, "threads": 2, "rows": PROFILE_HEADER, "row_stride": 2 * nsteps,
            "slots": PROFILE_HEADER + 2 * nsteps * nthreads}


def _emit_now(module: ir.Module, clock: str) -> ir.Function:
    """i64 glowpy.now(): the profile clock (PROFILE_CLOCKS) in nanoseconds."""
    timespec = ir.LiteralStructType([U.I64, U.I64])  # struct timespec on LP64 Linux
    gettime = U.declare(module, "clock_gettime", U.I32, [U.I32, timespec.as_pointer()])
    fn = ir.Function(module, ir.FunctionType(U.I64, []), name="glowpy.now")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ts = b.alloca(timespec, name="ts")
    b.call(gettime, [U.i32(PROFILE_CLOCKS[clock]), ts])
    sec = b.load(b.gep(ts, [U.i32(0), U.i32(0)], inbounds=True), name="sec")
    nsec = b.load(b.gep(ts, [U.i32(0), U.i32(1)], inbounds=True), name="nsec")
    b.ret(b.add(b.mul(sec, U.i64(1_000_000_000)), nsec, name="ns"))
    return fn

Region = tuple[str, int, int, int]  # (kind: arena | input | output, index, first byte, end byte)


def step_regions(s: Step, k: int, binder: Binder, plan: Plan, scratch_key: dict[int, tuple]
                 ) -> tuple[list[Region], list[Region]]:
    """The memory step k reads and writes (its scratch counts as written, unless it is the running thread's
    own block; weights are never written)."""
    reads: list[Region] = []
    writes: list[Region] = []
    for a in s.args:
        if a.kind == "output":
            writes.append(("output", a.index, 0, 1))
        elif a.kind == "scratch" and k in scratch_key and scratch_key[k] != THREAD_SCRATCH_KEY:
            at = plan.offsets[scratch_key[k]]  # a thread's own block conflicts with no other thread's step
            writes.append(("arena", 0, at, at + align_up(s.scratch)))
    for v, into in [(a.value, writes if a.value in s.writes else reads) for a in s.args if a.kind == "value"] + (
            [(s.guard[0], reads)] if s.guard else []):
        st = binder.storage(v)
        if st.kind == "arena":
            into.append(("arena", 0, st.offset, st.offset + st.nbytes))
        elif st.kind != "const":
            into.append((st.kind, st.index, 0, 1))
    return reads, writes


def _overlap(xs: list[Region], ys: list[Region]) -> bool:
    return any(x[:2] == y[:2] and x[2] < y[3] and y[2] < x[3] for x in xs for y in ys)


def _conflict(reads: list[Region], writes: list[Region], p_reads: list[Region], p_writes: list[Region]) -> bool:
    """Does a step (reads, writes) depend on, or overwrite what is used by, an earlier one?"""
    return _overlap(reads, p_writes) or _overlap(writes, p_writes) or _overlap(writes, p_reads)


@contextmanager
def _guarded(b: ir.IRBuilder, s: Step, k: int, pointer: Callable[[Arg, int, Step], ir.Value]) -> Iterator[None]:
    """The step's call under its branch guard (the condition's byte), if it has one."""
    if s.guard is None:
        yield
        return
    cond, when = s.guard
    byte = b.load(b.bitcast(pointer(Arg("value", cond), k, s), U.I8.as_pointer()), name=f"guard{k}.byte")
    with U.if_then(b, b.icmp_unsigned("!=" if when else "==", byte, ir.Constant(U.I8, 0)), f"guard{k}"):
        yield


def _emit_entry(module: ir.Module, target: HostTarget, steps: list[Step], binder: Binder, plan: Plan,
                array_offset: dict[int, int], scratch_key: dict[int, tuple], thread_block: int, coop: dict[int, int],
                nthreads: int, threaded: bool, profile: str = "") -> dict[int, list[int]]:
    """Emits the worker and the entry; returns the waits of a threaded program (Program.waits).
    `thread_block`: bytes of each thread's scratch block; `coop`: the cooperative steps' indices among
    the pool's blocks of their words."""
    pool_ty = pool_type(nthreads, len(steps), len(coop), target.data_layout) if threaded else None
    worker = ir.Function(module, ir.FunctionType(U.VOID, [SHARED.as_pointer(), U.I32]), name="glowpy.worker")
    worker.linkage = "internal"
    sh, tid = worker.args
    sh.name, tid.name = "shared", "tid"
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    # the epoch first: the pointers are read after it, so they are at least this epoch's
    epoch = b.load_atomic(member(b, sh, EPOCH, name="epoch.addr"), "acquire", 4, name="epoch") if threaded else None
    weights = b.load(member(b, sh, 0, name="weights.addr"), name="weights")
    arena = b.load(member(b, sh, 1, name="arena.addr"), name="arena")
    inputs = b.load(member(b, sh, 2, name="inputs.addr"), name="inputs")
    outputs = b.load(member(b, sh, 3, name="outputs.addr"), name="outputs")
    nt = b.load(member(b, sh, NTHREADS, name="nthreads.addr"), name="nthreads")
    asleep = member(b, sh, WAIT_SLEEPERS, name="wait.sleepers")
    is_main = b.icmp_signed("==", tid, U.i32(0), name="is_main")
    ptr_cache: dict[tuple, ir.Value] = {}

    def io_ptr(base: ir.Value, index: int, name: str) -> ir.Value:
        key = (name, index)
        if key not in ptr_cache:
            ptr_cache[key] = b.load(b.gep(base, [U.i64(index)], inbounds=True), name=f"{name}{index}")
        return ptr_cache[key]

    def weight_ptr(index: int) -> ir.Value:
        # loaded where used: a load cached from inside one step's branch would not dominate the next
        return b.load(b.gep(weights, [U.i64(index)], inbounds=True), name=f"weight{index}")

    def pointer(a: Arg, k: int, step: Step) -> ir.Value:
        if a.kind == "null":
            return ir.Constant(U.I8P, None)
        if a.kind == "output":
            return io_ptr(outputs, a.index, "output")
        if a.kind == "array":
            return weight_ptr(array_offset[a.index])
        if a.kind == "scratch":
            if k not in scratch_key:  # the kernel asked for no scratch
                return ir.Constant(U.I8P, None)
            off = b.gep(arena, [U.i64(plan.offsets[scratch_key[k]])], inbounds=True)
            if scratch_key[k] == THREAD_SCRATCH_KEY:
                off = b.gep(off, [b.mul(b.sext(tid, U.I64), U.i64(thread_block))], inbounds=True)
            return off
        if a.kind == "sync":
            if k not in coop:  # unthreaded: the kernel runs as one chunk and never synchronizes
                return ir.Constant(U.I8P, None)
            return coop_block(b, sh, pool_ty, nthreads, coop[k])
        st = binder.storage(a.value)
        if st.kind == "input":
            return io_ptr(inputs, st.index, "input")
        if st.kind == "output":
            return io_ptr(outputs, st.index, "output")
        if st.kind == "const":
            return weight_ptr(st.offset)
        return b.gep(arena, [U.i64(st.offset)], inbounds=True)

    # Inputs and outputs are loaded once, up front.
    for v in binder.graph.inputs:
        io_ptr(inputs, binder.storage(v).index, "input")
    for j in range(len(binder.graph.outputs)):
        io_ptr(outputs, j, "output")

    row = now = None
    layout = profile_layout(len(steps), nthreads)
    if profile:
        now = _emit_now(module, profile)
        stamps = b.bitcast(b.gep(arena, [U.i64(plan.offsets[PROFILE_KEY])], inbounds=True), U.I64.as_pointer(),
                           name="stamps")
        first = b.add(U.i64(layout["rows"]), b.mul(b.sext(tid, U.I64), U.i64(layout["row_stride"])), name="row.first")
        row = b.gep(stamps, [first], inbounds=True, name="row")

    def stamp(k: int, end: int) -> None:
        """This thread's start (end=0: of its first chunk) or end (end=1: of its last chunk) of step k."""
        if row is None:
            return
        slot = b.gep(row, [U.i64(2 * k + end)], inbounds=True)
        if end:
            b.store(b.call(now, []), slot)
            return
        with U.if_then(b, b.icmp_signed("==", b.load(slot), U.i64(0)), f"stamp{k}"):
            b.store(b.call(now, []), slot)

    def call(k: int, s: Step, call_args: list[ir.Value], split: tuple[ir.Value, ir.Value]) -> None:
        with _guarded(b, s, k, pointer):
            stamp(k, 0)
            b.call(s.fn, call_args + list(split))
            stamp(k, 1)

    nsteps = len(steps)
    waits: dict[int, list[int]] = {}
    if threaded:
        claim, wait, finish = emit_sync(module)
        chunk_ends = {True: b.mul(epoch, nt, name="epoch.split"), False: epoch}  # a step's done counter at the end

        def wait_for(k: int, on: list[int]) -> None:
            waits[k] = on
            for j in on:
                b.call(wait, [counter(b, sh, nthreads, nsteps, j, True), chunk_ends[steps[j].parallel], asleep])

    pending: list[tuple[int, list[Region], list[Region]]] = []  # steps no wait has covered yet: reads, writes
    for k, s in enumerate(steps):
        if s.fn is None:
            continue
        params = s.fn.function_type.args
        ptr_args = [pointer(a, k, s) for a in s.args]
        if len(ptr_args) + 2 != len(params):
            raise InternalError(f"step {s.name}: argument count differs from its kernel", expected=len(params),
                                found=len(ptr_args) + 2)
        call_args = [b.bitcast(p, t) if p.type != t else p for p, t in zip(ptr_args, params)]
        if not threaded:
            call(k, s, call_args, (U.i32(0), U.i32(1)))
            continue
        reads, writes = step_regions(s, k, binder, plan, scratch_key)
        on = [j for j, pr, pw in pending if _conflict(reads, writes, pr, pw)]
        if on:
            wait_for(k, on)
            pending = [p for p in pending if p[0] not in on]
        pending.append((k, reads, writes))
        chunks = nt if s.parallel else U.i32(1)
        head, body, tail = (worker.append_basic_block(f"step{k}.{x}") for x in ("claim", "run", "next"))
        b.branch(head)
        b.position_at_end(head)
        chunk = b.call(claim, [counter(b, sh, nthreads, nsteps, k, False), epoch, chunks, tid], name=f"chunk{k}")
        b.cbranch(b.icmp_signed(">=", chunk, U.i32(0)), body, tail)
        b.position_at_end(body)
        call(k, s, call_args, (chunk, nt) if s.parallel else (U.i32(0), U.i32(1)))
        b.call(finish, [counter(b, sh, nthreads, nsteps, k, True), asleep])
        b.branch(head)
        b.position_at_end(tail)
    if threaded and pending:  # thread 0 returns when every chunk of the run is done
        with U.if_then(b, is_main, "end"):
            wait_for(nsteps, [j for j, _, _ in pending])
    b.ret_void()

    # The entry.
    i8pp = U.I8P.as_pointer()
    entry = ir.Function(module, ir.FunctionType(U.VOID, [i8pp, U.I8P, i8pp, i8pp]), name=ENTRY)
    for arg, name in zip(entry.args, ("weights", "arena", "inputs", "outputs")):
        arg.name = name
    eb = ir.IRBuilder(entry.append_basic_block("entry"))
    run_stamp = None
    if profile:
        run_stamps = eb.bitcast(eb.gep(entry.args[1], [U.i64(plan.offsets[PROFILE_KEY])], inbounds=True),
                                U.I64.as_pointer(), name="run.stamps")

        def run_stamp(slot: str, value: ir.Value | None = None) -> None:
            value = eb.call(now, []) if value is None else value
            eb.store(value, eb.gep(run_stamps, [U.i64(layout[slot])], inbounds=True))

        run_stamp("begin")
    if threaded:  # the pool (threads.py) holds this run's shared state in the arena
        pool_run = emit_pool(module, worker, pool_ty, nthreads, nsteps, plan.offsets[POOL_KEY])
        nt_run = eb.call(pool_run, list(entry.args), name="nthreads")
        shared = eb.bitcast(eb.gep(entry.args[1], [U.i64(plan.offsets[POOL_KEY])], inbounds=True),
                            SHARED.as_pointer(), name="shared")
    else:
        emit_no_pool(module)
        nt_run = U.i32(1)
        shared = eb.alloca(SHARED, name="shared")
        for i, a in enumerate(entry.args):
            eb.store(a, member(eb, shared, i, name=f"{a.name}.slot"))
        eb.store(nt_run, member(eb, shared, NTHREADS, name="nthreads.slot"))
    eb.call(worker, [shared, U.i32(0)])
    if run_stamp is not None:
        run_stamp("end")
        run_stamp("threads", eb.sext(nt_run, U.I64))
    eb.ret_void()
    return waits


def arena_report(program: Program) -> dict[str, int]:
    """Arena size against the bytes live at the busiest step (for tests and `glowpy run`)."""
    return {"arena": program.arena_size, "peak_live": program.plan.peak_live,
            "weights": program.weights_size, "steps": len(program.steps)}


def total_work(program: Program) -> float:
    return math.fsum(s.work for s in program.steps)
