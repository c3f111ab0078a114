"""The persistent thread pool (backends/cpu/threads.py): started once per executable, parked between runs,
joined on release; bit-identical results at any thread count; the thread count honoured exactly."""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest

import glowpy.backends.cpu.lowering as lowering
from glowpy.backends.cpu import CpuBackend

from .test_differential import RandomGraph
from .test_threads import conv_net

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settle(want: int, timeout: float = 5.0) -> int:
    """The thread count once it reaches `want` (an exiting thread leaves /proc a moment after join)."""
    end = time.monotonic() + timeout
    while os_threads() != want and time.monotonic() < end:
        time.sleep(0.01)
    return os_threads()


def stable_threads(quiet: float = 0.1, timeout: float = 5.0) -> int:
    """The thread count once it has not changed for `quiet` seconds (the compile's helper threads exit
    a moment after it returns)."""
    end = time.monotonic() + timeout
    count, since = os_threads(), time.monotonic()
    while time.monotonic() < end and time.monotonic() - since < quiet:
        time.sleep(0.01)
        now = os_threads()
        if now != count:
            count, since = now, time.monotonic()
    return count


@pytest.mark.parametrize("model", ["convnet", "random7", "random11"])
def test_outputs_are_bit_identical_at_1_2_and_3_threads(monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    if model == "convnet":
        graph, feeds = conv_net()
    else:
        monkeypatch.setattr(lowering, "PARALLEL_MIN_WORK", 0)  # every step split, the pool always used
        graph, feeds = RandomGraph(int(model[6:])).build()
    runs = {}
    for n in (1, 2, 3):
        ex = CpuBackend().compile(graph, threads=n, cache=False)
        assert ex.nthreads == n
        runs[n] = [ex.run(feeds) for _ in range(3)]
        ex.close()
    for n in (1, 2, 3):
        for outs in runs[n]:
            for got, want in zip(outs, runs[1][0]):
                assert got.tobytes() == want.tobytes(), f"{model}: {n} threads differ from 1"


def test_pool_threads_live_with_the_executable_and_go_with_it() -> None:
    graph, feeds = conv_net()
    CpuBackend().compile(graph, threads=1, cache=False).run(feeds)
    base = stable_threads()  # a compile's helper threads may still be leaving
    ex = CpuBackend().compile(graph, threads=3, cache=False)
    assert settle(base) == base, "compiling starts no run-time thread"
    want = ex.run(feeds)
    assert os_threads() == base + 2, "threads=3: the caller and two pool threads"
    for _ in range(200):
        for got, ref in zip(ex.run(feeds), want):
            assert np.array_equal(got, ref)
    assert os_threads() == base + 2, "the same threads serve every run"
    time.sleep(0.05)  # long enough for the threads to park in the futex
    assert os_threads() == base + 2
    ex.close()
    assert settle(base) == base, "close joins the pool"
    for got, ref in zip(ex.run(feeds), want):  # a run after close starts a new pool
        assert np.array_equal(got, ref)
    assert os_threads() == base + 2
    del ex
    gc.collect()
    assert settle(base) == base, "collecting the executable joins the pool"


def test_one_thread_starts_none() -> None:
    graph, feeds = conv_net()
    CpuBackend().compile(graph, threads=1, cache=False).run(feeds)
    base = stable_threads()
    ex = CpuBackend().compile(graph, threads=1, cache=False)
    ex.run(feeds)
    assert ex.nthreads == 1 and settle(base) == base


def test_release_and_recreate_cycles_leave_no_thread() -> None:
    graph, feeds = conv_net()
    CpuBackend().compile(graph, threads=1, cache=True).run(feeds)
    base = stable_threads()  # a compile's helper threads may still be leaving
    want = None
    for k in range(12):
        ex = CpuBackend().compile(graph, threads=2)  # the object cache: the same code every time
        out = ex.run(feeds)
        want = want or out
        assert all(np.array_equal(a, b) for a, b in zip(out, want))
        if k % 2:
            ex.close()
        del ex
    gc.collect()
    assert settle(base) == base


def test_concurrent_runs_and_a_close_from_python_threads() -> None:
    """Runs take turns on the arena; a close between them joins the pool and the next run restarts it."""
    graph, feeds = conv_net()
    ex = CpuBackend().compile(graph, threads=2, cache=False)
    inputs = [[f * (1 + k) for f in feeds] for k in range(3)]
    wants = [ex.run(x) for x in inputs]
    errors: list[str] = []

    def work(k: int) -> None:
        for i in range(40):
            if k == 0 and i % 10 == 0:
                ex.close()
            for got, want in zip(ex.run(inputs[k]), wants[k]):
                if not np.array_equal(got, want):
                    errors.append(f"thread {k}, run {i}")

    ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_pool() -> None:
    """The child inherits the arena but not the threads: its first run starts a pool of its own."""
    graph, feeds = conv_net()
    ex = CpuBackend().compile(graph, threads=2, cache=False)
    want = ex.run(feeds)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 if its runs agree
        ok = all(np.array_equal(a, b) for _ in range(5) for a, b in zip(ex.run(feeds), want))
        ex.close()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert all(np.array_equal(a, b) for a, b in zip(ex.run(feeds), want))


def test_pool_ir_is_printable_and_runs_as_avx2_code() -> None:
    """The pool's functions are in the printed module; an AVX2 build (a Zen 3 host's) agrees bit for bit."""
    from glowpy.backends.cpu.target import isa_available

    graph, feeds = conv_net()
    text = CpuBackend().emit_llvm(graph, threads=2)
    for name in ('define void @"glowpy_release"(i8* %"arena")', '@"glowpy.thread"', '@"glowpy.park"',
                 '@"glowpy.pool.run"', '@"glowpy.claim"', '@"glowpy.wait"'):
        assert name in text
    assert "glowpy.pool.run" not in CpuBackend().emit_llvm(graph, threads=1)
    if not isa_available("avx2"):
        pytest.fail("this host cannot run AVX2 code")
    one = CpuBackend().compile(graph, threads=1, isa="avx2", cache=False).run(feeds)
    two = CpuBackend().compile(graph, threads=2, isa="avx2", cache=False).run(feeds)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(one, two))
