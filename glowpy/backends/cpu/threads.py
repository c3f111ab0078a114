"""The persistent thread pool of a threaded program, as LLVM IR in the entry's module.

The pool lives in a block of the program's arena (`pool_bytes`, planned live for the whole run, so no
buffer ever overlaps it), so each arena (each executable, each bundle model) has its own pool and
nothing is global:

    { shared, live, pid, stop, sleepers, started, handles[N-1], contexts[N-1], counters[steps][1 + N]
      [, pad to 64 bytes, coop[cooperative steps][coop_words(N)]] }

`shared` is what every thread's `glowpy.worker(shared, tid)` reads: the run's weights, arena, inputs
and outputs, the thread count, the epoch (runs since the pool started), `run` (the wake-up word) and
the threads parked in a wait.

- **start**: the first run of an arena (or the first after a release, or the first in a forked child:
  `pid` differs) zeroes the epoch and the counters and creates N-1 pthreads; a thread that fails to start
  is not counted, and the work is split over the threads that did start (`shared.nthreads`).
- **a run**: the caller publishes the pointers, bumps the epoch and `run` and wakes sleepers (FUTEX_WAKE,
  only when a thread is parked), then runs as thread 0.
- **steps are claimed, not assigned**: each step has a done counter and one flag per chunk (the last
  epoch that claimed it). A split step has `nthreads` chunks, a serial one a single chunk; a thread takes
  a chunk of the current epoch with a compare-and-swap on its flag (`glowpy.claim`: its own chunk `tid`
  first, so a thread keeps the rows it wrote in the step before in its cache, then the others), runs the
  kernel on it as (chunk, chunks), and counts it done (`glowpy.finish`). Chunk c always covers the same range, so results do not depend on which thread ran
  it. A step that reads or overwrites another's memory first waits until that step's chunks of this
  epoch are all done (`glowpy.wait`). So a thread that is late (descheduled on a busy host) costs no
  one a wait: the others take its chunks; and a thread never waits for one that merely has not arrived.
  Every thread passes every step in order and claims what is left, so when thread 0 has waited for the
  steps still pending at the end, every chunk of the run is done.
- **cooperative steps** (`Step.cooperative`: the recurrent kernel): a split step whose chunks
  synchronize among themselves inside the kernel, through a block of words of their own in the pool
  (`coop_block`: a line of counters, a line per flag; zero at pool start, and zeroed again by the last
  chunk to leave each run), with the same claim / wait / finish (`emit_sync` under another prefix). Such
  a kernel never needs a given chunk to be run by another thread (every chunk claims its work), so a
  late thread costs no deadlock, only its share.
- **between runs**: a thread spins on `run` for SPIN_BEFORE_PARK pauses, yielding every PAUSES_PER_YIELD
  (back-to-back runs never sleep), then parks in FUTEX_WAIT on it (the `sleepers` count and the kernel's recheck of `run` make a wake-up
  impossible to miss: both sides use sequentially consistent operations).
- **waits**: spin with `pause`, calling `sched_yield` every PAUSES_PER_YIELD pauses, and after
  YIELDS_BEFORE_PARK yields park on the step's done counter (woken by the thread that finishes a chunk
  while someone is parked).
- **release** (`glowpy_release(arena)`, exported): sets `stop`, wakes and joins every thread. The host
  calls it before it frees the arena or the code (CpuExecutable's finalizer, a bundle's free); a later
  run starts a new pool. No run may be in flight on that arena meanwhile (hosts serialize runs per arena).

Where there is no futex (not Linux on x86-64 / AArch64), parking is a `sched_yield` loop.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir

from glowpy.backends.cpu import irutil as U

RELEASE = "glowpy_release"
POOL_KEY = ("pool",)
# wait: pauses (~25 ns each on Zen 5) between sched_yields. Short on purpose: spinning ~50 us (2000)
# before any yield made MobileNet-v3-small at 2 threads 2.2x slower (median) on an oversubscribed
# 2-core host: the waiter holds a core its partner needs. Many yields before parking: on an idle host a
# yield returns at once, and waking a parked thread costs tens of us (a halted vCPU)
PAUSES_PER_YIELD = 64
YIELDS_BEFORE_PARK = 64  # wait: sched_yields before the futex wait
SPIN_BEFORE_PARK = 4000  # between runs: pauses (~0.1-0.2 ms) before the futex wait
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}

# weights, arena, inputs, outputs, nthreads, epoch, run generation, threads parked in a wait
SHARED = ir.LiteralStructType([U.I8P.as_pointer(), U.I8P, U.I8P.as_pointer(), U.I8P.as_pointer()] + [U.I32] * 4)
THREAD_CTX = ir.LiteralStructType([SHARED.as_pointer(), U.I32])
NTHREADS, EPOCH, RUN, WAIT_SLEEPERS = 4, 5, 6, 7  # SHARED fields
LIVE, PID, STOP, SLEEPERS, STARTED, HANDLES, CONTEXTS, COUNTERS, COOP = 1, 2, 3, 4, 5, 7, 8, 9, 11  # POOL fields


# A cooperative step's words (kernels that synchronize their own chunks, e.g. kernels/rnn.py): a cache line
# of counters, then one line per chunk flag, all zero between runs (the last chunk to leave zeroes them).
COOP_LINE = 16  # i32 words
COOP_DONE, COOP_LEFT, COOP_SLEEPERS = 0, 1, 2  # words of the first line; flag f is word COOP_LINE * (1 + f)


def coop_words(nthreads: int) -> int:
    """i32 words of one cooperative step's block: the counters' line and a line per flag (at least 2)."""
    return COOP_LINE * (1 + max(nthreads, 2))


def pool_type(nthreads: int, nsteps: int, ncoop: int = 0, data_layout: str = "") -> ir.LiteralStructType:
    """The pool block's type; with cooperative steps (ncoop) the data layout places their words."""
    extra = max(nthreads - 1, 1)
    fields = [SHARED] + [U.I32] * 6 + [ir.ArrayType(U.I64, extra), ir.ArrayType(THREAD_CTX, extra),
                                       ir.ArrayType(U.I32, (nthreads + 1) * max(nsteps, 1))]
    if ncoop:  # padded to a cache line boundary (the pool block itself is 64-byte aligned in the arena)
        head = ir.LiteralStructType(fields).get_abi_size(llvm.create_target_data(data_layout))
        fields += [ir.ArrayType(U.I8, -head % 64), ir.ArrayType(U.I32, coop_words(nthreads) * ncoop)]
    return ir.LiteralStructType(fields)


def pool_bytes(nthreads: int, nsteps: int, ncoop: int, data_layout: str) -> int:
    return pool_type(nthreads, nsteps, ncoop, data_layout).get_abi_size(llvm.create_target_data(data_layout))


def counters_offset(nthreads: int, nsteps: int, data_layout: str) -> int:
    """Byte offset of the step counters (per step, i32: done, then nthreads chunk flags) in the pool block."""
    return pool_type(nthreads, nsteps).get_element_offset(llvm.create_target_data(data_layout), COUNTERS)


def coop_block(b: ir.IRBuilder, shared: ir.Value, pool_ty: ir.Type, nthreads: int, index: int) -> ir.Value:
    """i32* to cooperative step `index`'s words, from the worker's `shared` pointer."""
    pool = b.bitcast(shared, pool_ty.as_pointer())
    return member(b, pool, COOP, coop_words(nthreads) * index, name=f"coop{index}")


def counter(b: ir.IRBuilder, shared: ir.Value, nthreads: int, nsteps: int, step: int, done: bool) -> ir.Value:
    """i32* to step `step`'s done counter, or (done=False) to its first chunk flag, from the worker's
    `shared` pointer."""
    pool = b.bitcast(shared, pool_type(nthreads, nsteps).as_pointer())
    return member(b, pool, COUNTERS, (nthreads + 1) * step + int(not done),
                  name=f"step{step}.{'done' if done else 'flags'}")


def member(b: ir.IRBuilder, ptr: ir.Value, *path: int, name: str = "") -> ir.Value:
    return b.gep(ptr, [U.i32(0)] + [U.i32(i) for i in path], inbounds=True, name=name)


def _pause(b: ir.IRBuilder) -> None:
    if b.module.triple.startswith(("x86_64", "i686", "i386")):
        b.call(U.declare(b.module, "llvm.x86.sse2.pause", U.VOID, []), [])


def _internal(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    fn = ir.Function(module, ir.FunctionType(ret, args), name=name)
    fn.linkage = "internal"
    return fn


def _futex(module: ir.Module, prefix: str = "glowpy") -> tuple[ir.Function, ir.Function]:
    """(PREFIX.park(i32* word, i32 seen): sleep while *word == seen; PREFIX.wake(i32* word): wake all)."""
    if f"{prefix}.park" in module.globals:
        return module.globals[f"{prefix}.park"], module.globals[f"{prefix}.wake"]
    park = _internal(module, f"{prefix}.park", U.VOID, [U.I32.as_pointer(), U.I32])
    wake = _internal(module, f"{prefix}.wake", U.VOID, [U.I32.as_pointer()])
    triple = module.triple
    number = SYS_FUTEX.get(triple.split("-")[0]) if "linux" in triple else None
    pb, wb = ir.IRBuilder(park.append_basic_block("entry")), ir.IRBuilder(wake.append_basic_block("entry"))
    if number is None:
        pb.call(U.declare(module, "sched_yield", U.I32, []), [])
    else:
        syscall = module.globals.get("syscall") or ir.Function(
            module, ir.FunctionType(U.I64, [U.I64], var_arg=True), name="syscall")
        for b, fn, op, value in ((pb, park, FUTEX_WAIT_PRIVATE, None), (wb, wake, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF)):
            word = b.bitcast(fn.args[0], U.I8P)
            val = b.zext(fn.args[1], U.I64) if value is None else U.i64(value)
            b.call(syscall, [U.i64(number), word, U.i64(op), val, ir.Constant(U.I8P, None)])
    pb.ret_void()
    wb.ret_void()
    return park, wake


def _ahead(b: ir.IRBuilder, value: ir.Value, target: ir.Value, name: str) -> ir.Value:
    """value >= target on a wrapping i32 counter."""
    return b.icmp_signed(">=", b.sub(value, target), U.i32(0), name=name)


def emit_sync(module: ir.Module, prefix: str = "glowpy", flag_stride: int = 1
              ) -> tuple[ir.Function, ir.Function, ir.Function]:
    """(claim, wait, finish), named PREFIX.claim and so on (a kernel module that synchronizes its own
    chunks takes a prefix of its own: its helpers are spliced beside the entry's):

    - i32 glowpy.claim(i32* flags, i32 epoch, i32 chunks, i32 first): a chunk c (0 <= c < chunks) no one
      claimed this epoch, trying first, first + 1, ... (mod chunks), or -1 when all are taken (chunk c's
      flag is word c * flag_stride);
    - void glowpy.wait(i32* done, i32 target, i32* sleepers): until *done reaches target, spinning with
      `pause`, then `sched_yield`, then parked on the counter (an overloaded host gives the core to the
      thread that is waited for);
    - void glowpy.finish(i32* done, i32* sleepers): count a chunk done, waking parked waiters."""
    names = [f"{prefix}.{x}" for x in ("claim", "wait", "finish")]
    if names[0] in module.globals:
        return tuple(module.globals[n] for n in names)
    park, wake = _futex(module, prefix)

    claim = _internal(module, names[0], U.I32, [U.I32.as_pointer(), U.I32, U.I32, U.I32])
    flags, epoch, chunks, first = claim.args
    flags.name, epoch.name, chunks.name, first.name = "flags", "epoch", "chunks", "first"
    entry, loop, look, swap, got, nxt, none = (
        claim.append_basic_block(x) for x in ("entry", "loop", "look", "swap", "got", "next", "none"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(U.I32, name="i")
    i.add_incoming(U.i32(0), entry)
    b.cbranch(b.icmp_signed("<", i, chunks), look, none)
    b.position_at_end(look)
    c = b.urem(b.add(first, i), chunks, name="c")
    word = b.zext(c, U.I64)
    flag = b.gep(flags, [word if flag_stride == 1 else b.mul(word, U.i64(flag_stride))], inbounds=True, name="flag")
    f = b.load_atomic(flag, "monotonic", 4, name="f")
    b.cbranch(_ahead(b, f, epoch, "taken"), nxt, swap)  # a flag at or past this epoch: taken
    b.position_at_end(swap)
    pair = b.cmpxchg(flag, f, epoch, "acq_rel", "monotonic", name="pair")
    b.cbranch(b.extract_value(pair, 1, name="won"), got, nxt)
    b.position_at_end(got)
    b.ret(c)
    b.position_at_end(nxt)
    i.add_incoming(b.add(i, U.i32(1), name="i.next"), nxt)
    b.branch(loop)
    b.position_at_end(none)
    b.ret(U.i32(-1))

    wait = _internal(module, names[1], U.VOID, [U.I32.as_pointer(), U.I32, U.I32.as_pointer()])
    done, goal, sleepers = wait.args
    done.name, goal.name, sleepers.name = "done", "target", "sleepers"
    blocks = ("entry", "check", "relax", "pause", "backoff", "yield", "park", "out")
    entry, check, relax, pause_bb, backoff, yield_bb, park_bb, out = (wait.append_basic_block(x) for x in blocks)
    b = ir.IRBuilder(entry)
    b.branch(check)
    b.position_at_end(check)
    spins = b.phi(U.I32, name="spins")  # pauses since the last yield
    yields = b.phi(U.I32, name="yields")
    spins.add_incoming(U.i32(0), entry)
    yields.add_incoming(U.i32(0), entry)
    d = b.load_atomic(done, "acquire", 4, name="d")
    b.cbranch(_ahead(b, d, goal, "reached"), out, relax)
    b.position_at_end(relax)
    b.cbranch(b.icmp_unsigned("<", spins, U.i32(PAUSES_PER_YIELD)), pause_bb, backoff)
    b.position_at_end(pause_bb)
    _pause(b)
    spins.add_incoming(b.add(spins, U.i32(1), name="spins.next"), pause_bb)
    yields.add_incoming(yields, pause_bb)
    b.branch(check)
    b.position_at_end(backoff)
    b.cbranch(b.icmp_unsigned("<", yields, U.i32(YIELDS_BEFORE_PARK)), yield_bb, park_bb)
    b.position_at_end(yield_bb)
    b.call(U.declare(module, "sched_yield", U.I32, []), [])
    spins.add_incoming(U.i32(0), yield_bb)
    yields.add_incoming(b.add(yields, U.i32(1), name="yields.next"), yield_bb)
    b.branch(check)
    b.position_at_end(park_bb)
    b.atomic_rmw("add", sleepers, U.i32(1), "seq_cst")
    b.call(park, [done, d])
    b.atomic_rmw("sub", sleepers, U.i32(1), "seq_cst")
    spins.add_incoming(spins, park_bb)
    yields.add_incoming(yields, park_bb)
    b.branch(check)
    b.position_at_end(out)
    b.ret_void()

    finish = _internal(module, names[2], U.VOID, [U.I32.as_pointer(), U.I32.as_pointer()])
    done, sleepers = finish.args
    done.name, sleepers.name = "done", "sleepers"
    entry, wake_bb, out = (finish.append_basic_block(x) for x in ("entry", "wake", "out"))
    b = ir.IRBuilder(entry)
    b.atomic_rmw("add", done, U.i32(1), "seq_cst")
    asleep = b.load_atomic(sleepers, "seq_cst", 4, name="asleep")
    b.cbranch(b.icmp_unsigned("!=", asleep, U.i32(0)), wake_bb, out)
    b.position_at_end(wake_bb)
    b.call(wake, [done])
    b.branch(out)
    b.position_at_end(out)
    b.ret_void()
    return claim, wait, finish


def _emit_thread(module: ir.Module, worker: ir.Function, park: ir.Function, pool_ty: ir.Type) -> ir.Function:
    """i8* glowpy.thread(ctx): wait for the next run (spin, then park), run the worker; exit on stop."""
    fn = _internal(module, "glowpy.thread", U.I8P, [U.I8P])
    entry, loop, wait, relax, pause_bb, yield_bb, park_bb, got, work, leave = (
        fn.append_basic_block(x) for x in ("entry", "loop", "wait", "relax", "pause", "yield", "park", "got", "work",
                                           "exit"))
    b = ir.IRBuilder(entry)
    ctx = b.bitcast(fn.args[0], THREAD_CTX.as_pointer(), name="ctx")
    shared = b.load(member(b, ctx, 0), name="shared")
    tid = b.load(member(b, ctx, 1), name="tid")
    pool = b.bitcast(shared, pool_ty.as_pointer(), name="pool")
    run = member(b, shared, RUN, name="run.addr")
    sleepers = member(b, pool, SLEEPERS, name="sleepers.addr")
    b.branch(loop)
    b.position_at_end(loop)
    seen = b.phi(U.I32, name="seen")
    seen.add_incoming(U.i32(0), entry)
    b.branch(wait)
    b.position_at_end(wait)
    spins = b.phi(U.I32, name="spins")
    spins.add_incoming(U.i32(0), loop)
    now = b.load_atomic(run, "acquire", 4, name="run")
    b.cbranch(b.icmp_unsigned("!=", now, seen), got, relax)
    b.position_at_end(relax)
    b.cbranch(b.icmp_unsigned("<", spins, U.i32(SPIN_BEFORE_PARK)), pause_bb, park_bb)
    b.position_at_end(pause_bb)  # a yield every PAUSES_PER_YIELD pauses: thread 0 may need this core
    _pause(b)
    spun = b.add(spins, U.i32(1), name="spins.next")
    spins.add_incoming(spun, pause_bb)
    b.cbranch(b.icmp_unsigned("==", b.urem(spun, U.i32(PAUSES_PER_YIELD)), U.i32(0)), yield_bb, wait)
    b.position_at_end(yield_bb)
    b.call(U.declare(module, "sched_yield", U.I32, []), [])
    spins.add_incoming(spun, yield_bb)
    b.branch(wait)
    b.position_at_end(park_bb)
    b.atomic_rmw("add", sleepers, U.i32(1), "seq_cst")
    b.call(park, [run, seen])
    b.atomic_rmw("sub", sleepers, U.i32(1), "seq_cst")
    spins.add_incoming(spins, park_bb)
    b.branch(wait)
    b.position_at_end(got)
    stop = b.load_atomic(member(b, pool, STOP), "acquire", 4, name="stop")
    b.cbranch(b.icmp_unsigned("!=", stop, U.i32(0)), leave, work)
    b.position_at_end(work)
    b.call(worker, [shared, tid])
    seen.add_incoming(now, work)
    b.branch(loop)
    b.position_at_end(leave)
    b.ret(ir.Constant(U.I8P, None))
    return fn


def emit_pool(module: ir.Module, worker: ir.Function, pool_ty: ir.LiteralStructType, nthreads: int, nsteps: int,
              offset: int) -> ir.Function:
    """The pool's functions; returns i32 glowpy.pool.run(i8** weights, i8* arena, i8** inputs,
    i8** outputs): starts the pool if needed, publishes the run and wakes the threads; returns the
    thread count (the caller then runs the worker as thread 0). Also defines the exported
    `glowpy_release(i8* arena)`. `pool_ty` is pool_type(nthreads, nsteps, ...)."""
    extra = nthreads - 1
    park, wake = _futex(module)
    thread = _emit_thread(module, worker, park, pool_ty)
    getpid = U.declare(module, "getpid", U.I32, [])
    i8pp = U.I8P.as_pointer()

    def pool_of(b: ir.IRBuilder, arena: ir.Value) -> ir.Value:
        return b.bitcast(b.gep(arena, [U.i64(offset)], inbounds=True), pool_ty.as_pointer(), name="pool")

    def ours(b: ir.IRBuilder, pool: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(this process's pool is running, getpid())"""
        pid = b.call(getpid, [], name="pid")
        live = b.icmp_unsigned("!=", b.load(member(b, pool, LIVE), name="live"), U.i32(0))
        same = b.icmp_signed("==", b.load(member(b, pool, PID), name="owner"), pid)
        return b.and_(live, same, name="ours"), pid

    fn = _internal(module, "glowpy.pool.run", U.I32, [i8pp, U.I8P, i8pp, i8pp])
    for a, name in zip(fn.args, ("weights", "arena", "inputs", "outputs")):
        a.name = name
    entry, create, zero, spawn, spawned, created, publish, wake_bb, done = (
        fn.append_basic_block(x) for x in ("entry", "create", "zero", "spawn", "spawned", "created", "publish",
                                           "wake", "done"))
    b = ir.IRBuilder(entry)
    pool = pool_of(b, fn.args[1])
    shared = member(b, pool, 0, name="shared")
    running, pid = ours(b, pool)
    b.cbranch(running, publish, create)

    b.position_at_end(create)  # a fresh pool: no thread of this arena is alive in this process
    for i in (EPOCH, RUN, WAIT_SLEEPERS):
        b.store(U.i32(0), member(b, shared, i))
    for i in (STOP, SLEEPERS, STARTED):
        b.store(U.i32(0), member(b, pool, i))
    pcreate = U.declare(module, "pthread_create", U.I32, [U.I64.as_pointer(), U.I8P, U.I8P, U.I8P])
    if len(pool_ty.elements) > COOP:  # the cooperative steps' words
        words = pool_ty.elements[COOP].count
        memset = U.declare(module, "llvm.memset.p0.i64", U.VOID, [U.I8P, U.I8, U.I64, U.I1])
        b.call(memset, [b.bitcast(member(b, pool, COOP, 0), U.I8P), ir.Constant(U.I8, 0), U.i64(4 * words),
                        ir.Constant(U.I1, 0)])
    b.branch(zero)
    b.position_at_end(zero)  # the step counters (a bundle's arena is not zeroed)
    z = b.phi(U.I32, name="z")
    z.add_incoming(U.i32(0), create)
    b.store(U.i32(0), b.gep(member(b, pool, COUNTERS, 0), [b.zext(z, U.I64)], inbounds=True))
    z1 = b.add(z, U.i32(1), name="z.next")
    z.add_incoming(z1, zero)
    b.cbranch(b.icmp_signed("<", z1, U.i32((nthreads + 1) * max(nsteps, 1))), zero, spawn)
    b.position_at_end(spawn)
    t = b.phi(U.I32, name="t")
    t.add_incoming(U.i32(0), zero)
    ctx = member(b, pool, CONTEXTS, 0, name="ctx0")
    ctx = b.gep(ctx, [b.zext(t, U.I64)], inbounds=True, name="ctx")
    b.store(shared, member(b, ctx, 0))
    b.store(b.add(t, U.i32(1)), member(b, ctx, 1))
    handle = b.gep(member(b, pool, HANDLES, 0), [b.zext(t, U.I64)], inbounds=True, name="handle")
    rc = b.call(pcreate, [handle, ir.Constant(U.I8P, None), b.bitcast(thread, U.I8P), b.bitcast(ctx, U.I8P)],
                name="rc")
    b.cbranch(b.icmp_signed("==", rc, U.i32(0)), spawned, created)
    b.position_at_end(spawned)
    t1 = b.add(t, U.i32(1), name="t.next")
    t.add_incoming(t1, spawned)
    b.store(t1, member(b, pool, STARTED))
    b.cbranch(b.icmp_signed("<", t1, U.i32(extra)), spawn, created)
    b.position_at_end(created)
    started = b.load(member(b, pool, STARTED), name="started")
    b.store(b.add(started, U.i32(1)), member(b, shared, NTHREADS))
    b.store(pid, member(b, pool, PID))
    b.store(U.i32(1), member(b, pool, LIVE))
    b.branch(publish)

    b.position_at_end(publish)
    for i, a in enumerate(fn.args):
        b.store(a, member(b, shared, i))
    epoch = member(b, shared, EPOCH, name="epoch.addr")  # only thread 0 writes it
    b.store_atomic(b.add(b.load(epoch, name="epoch"), U.i32(1)), epoch, "release", 4)
    b.atomic_rmw("add", member(b, shared, RUN), U.i32(1), "seq_cst")
    asleep = b.load_atomic(member(b, pool, SLEEPERS), "seq_cst", 4, name="asleep")
    b.cbranch(b.icmp_unsigned("!=", asleep, U.i32(0)), wake_bb, done)
    b.position_at_end(wake_bb)
    b.call(wake, [member(b, shared, RUN)])
    b.branch(done)
    b.position_at_end(done)
    b.ret(b.load(member(b, shared, NTHREADS), name="nthreads"))

    release = ir.Function(module, ir.FunctionType(U.VOID, [U.I8P]), name=RELEASE)
    release.args[0].name = "arena"
    entry, stop, join, joined, out = (release.append_basic_block(x) for x in ("entry", "stop", "join", "joined", "out"))
    b = ir.IRBuilder(entry)
    pool = pool_of(b, release.args[0])
    shared = member(b, pool, 0, name="shared")
    running, _ = ours(b, pool)
    b.cbranch(running, stop, out)
    b.position_at_end(stop)
    b.store_atomic(U.i32(1), member(b, pool, STOP), "release", 4)
    b.atomic_rmw("add", member(b, shared, RUN), U.i32(1), "seq_cst")
    b.call(wake, [member(b, shared, RUN)])
    started = b.load(member(b, pool, STARTED), name="started")
    pjoin = U.declare(module, "pthread_join", U.I32, [U.I64, U.I8P.as_pointer()])
    b.cbranch(b.icmp_signed(">", started, U.i32(0)), join, joined)
    b.position_at_end(join)
    t = b.phi(U.I32, name="t")
    t.add_incoming(U.i32(0), stop)
    h = b.load(b.gep(member(b, pool, HANDLES, 0), [b.zext(t, U.I64)], inbounds=True), name="handle")
    b.call(pjoin, [h, ir.Constant(U.I8P.as_pointer(), None)])
    t1 = b.add(t, U.i32(1), name="t.next")
    t.add_incoming(t1, join)
    b.cbranch(b.icmp_signed("<", t1, started), join, joined)
    b.position_at_end(joined)
    b.store(U.i32(0), member(b, pool, LIVE))
    b.branch(out)
    b.position_at_end(out)
    b.ret_void()
    return fn


def emit_no_pool(module: ir.Module) -> None:
    """`glowpy_release` of a program that starts no threads: nothing to do."""
    fn = ir.Function(module, ir.FunctionType(U.VOID, [U.I8P]), name=RELEASE)
    fn.args[0].name = "arena"
    ir.IRBuilder(fn.append_basic_block("entry")).ret_void()
