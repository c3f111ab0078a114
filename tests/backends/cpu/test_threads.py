"""Threads: threads=1 and threads=N agree, every kernel splits correctly, the option and the env var."""

from __future__ import annotations

import os
import re
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import glowpy
import glowpy.backends.cpu.lowering as lowering
from glowpy.backends.cpu import CpuBackend, codegen, host_target, memory, resolve_threads, threads
from glowpy.errors import UnsupportedAttribute
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

from .test_differential import RandomGraph
from .util import assert_close, run_both


def conv_net() -> tuple[Graph, list[np.ndarray]]:
    """Big enough that the convs, the pool and the elementwise group run split (the matrix product is too
    small to split: lowering.PARALLEL_MIN_WORK)."""
    rng = np.random.default_rng(0)
    g = Graph("convnet")
    x = g.add_input("x", TensorType(np.float32, (1, 8, 32, 32)))
    w1 = g.add_constant("w1", (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32))
    b1 = g.add_constant("b1", rng.standard_normal(16).astype(np.float32))
    c1 = g.add_node("Conv", [x, w1, b1], {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1),
                                          "activation": "relu"}, name="conv1").outputs[0]
    w2 = g.add_constant("w2", (rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32))
    b2 = g.add_constant("b2", rng.standard_normal(16).astype(np.float32))
    c2 = g.add_node("Conv", [c1, w2, b2, c1], {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)},
                    name="conv2").outputs[0]
    s = g.add_node("Sigmoid", [c2], name="sig").outputs[0]
    m = g.add_node("Mul", [s, c2], name="swish").outputs[0]
    p = g.add_node("MaxPool", [m], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1),
                                    "dilations": (1, 1), "ceil_mode": 1}, name="pool").outputs[0]
    flat = g.add_node("Reshape", [p], {"shape": (1, p.type.size)}, name="flat").outputs[0]
    wf = g.add_constant("wf", (rng.standard_normal((p.type.size, 32)) * 0.02).astype(np.float32))
    bf = g.add_constant("bf", rng.standard_normal(32).astype(np.float32))
    fc = g.add_node("Gemm", [flat, wf, bf], name="fc").outputs[0]
    sm = g.add_node("Softmax", [fc], {"axis": -1}, name="softmax").outputs[0]
    g.outputs = [sm, p]
    return g, [rng.standard_normal((1, 8, 32, 32)).astype(np.float32)]


def test_threads_agree_with_one_thread_and_the_interpreter() -> None:
    graph, feeds = conv_net()
    one = CpuBackend().compile(graph, threads=1)
    two = CpuBackend().compile(graph, threads=2)
    assert one.nthreads == 1 and two.nthreads == 2
    a, b = one.run(feeds), two.run(feeds)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    got, want = run_both(graph, feeds, threads=3)
    assert_close(got, want, "3 threads")


@pytest.mark.parametrize("seed", range(200, 216))
def test_every_kernel_splits_across_threads(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """With no work threshold every step runs split over 3 threads (more than some dims)."""
    monkeypatch.setattr(lowering, "PARALLEL_MIN_WORK", 0)
    graph, feeds = RandomGraph(seed).build()
    got, want = run_both(graph, feeds, threads=3)
    assert_close(got, want, f"seed {seed}")


def test_small_graphs_do_not_start_threads() -> None:
    graph, feeds = RandomGraph(3).build()
    assert CpuBackend().compile(graph, threads=4).nthreads == 1


def test_env_var_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWPY_NUM_THREADS", "3")
    assert resolve_threads() == 3
    assert resolve_threads(2) == 2  # the option wins
    graph, _ = conv_net()
    assert CpuBackend().compile(graph).nthreads == 3
    monkeypatch.delenv("GLOWPY_NUM_THREADS")
    assert resolve_threads() == (os.cpu_count() or 1)


@pytest.mark.parametrize("bad", [0, -1, "two", 1.5, 10_000])
def test_bad_thread_counts_are_rejected(bad) -> None:
    graph, _ = RandomGraph(1).build()
    with pytest.raises(UnsupportedAttribute, match="threads"):
        CpuBackend().compile(graph, threads=bad)


def test_bad_env_var_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWPY_NUM_THREADS", "lots")
    with pytest.raises(UnsupportedAttribute, match="GLOWPY_NUM_THREADS"):
        resolve_threads()


def test_unknown_option_is_rejected() -> None:
    graph, _ = RandomGraph(1).build()
    with pytest.raises(UnsupportedAttribute, match="thread_count") as info:
        glowpy.compile(graph, backend="cpu", thread_count=2)
    assert "threads" in str(info.value)


def test_concurrent_runs_from_python_threads() -> None:
    """Runs of one executable take turns on its arena; the GIL is released during native calls."""
    graph, feeds = conv_net()
    ex = CpuBackend().compile(graph, threads=2)
    want = ex.run(feeds)
    errors: list[str] = []

    def worker(k: int) -> None:
        x = [f * (1 + k) for f in feeds]
        ref = ex.run(x)
        for _ in range(5):
            for r, o in zip(ref, ex.run(x)):
                if not np.array_equal(r, o):
                    errors.append(f"thread {k} saw different results")

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for r, o in zip(want, ex.run(feeds)):
        np.testing.assert_array_equal(r, o)


def _conv(g: Graph, x, cout: int, k: int, name: str, rng: np.random.Generator):
    cin = x.type.shape[1]
    w = g.add_constant(f"{name}.w", (rng.standard_normal((cout, cin, k, k)) * 0.2).astype(np.float32))
    b = g.add_constant(f"{name}.b", rng.standard_normal(cout).astype(np.float32))
    p = k // 2
    return g.add_node("Conv", [x, w, b], {"strides": (1, 1), "pads": (p, p, p, p), "dilations": (1, 1),
                                          "activation": "relu"}, name=name).outputs[0]


def fire_net() -> tuple[Graph, list[np.ndarray]]:
    """SqueezeNet's fire module: two expand convs read the squeeze conv's output, a Concat joins them."""
    rng = np.random.default_rng(1)
    g = Graph("fire")
    x = g.add_input("x", TensorType(np.float32, (1, 16, 32, 32)))
    s = _conv(g, x, 32, 1, "squeeze", rng)
    e1 = _conv(g, s, 32, 1, "expand1", rng)
    e3 = _conv(g, s, 32, 3, "expand3", rng)
    g.outputs = [g.add_node("Concat", [e1, e3], {"axis": 1}, name="cat").outputs[0]]
    return g, [rng.standard_normal((1, 16, 32, 32)).astype(np.float32)]


def schedule(graph: Graph, nthreads: int) -> tuple[list, codegen.Program]:
    """The worker's calls in order: step indices, and ("wait", step) for each wait, read from the IR."""
    prog = codegen.build(graph, host_target(), nthreads=nthreads)
    text = str(prog.module)
    worker = text[text.index('define internal void @"glowpy.worker"'):]
    worker = worker[:worker.index("\n}\n")]
    called = iter(k for k, s in enumerate(prog.steps) if s.fn is not None)
    order: list = []
    for line in worker.splitlines():
        done = re.search(r'%"step(\d+)\.done(\.\d+)?" = getelementptr', line)
        call = re.search(r'call void @"([^"]+)"', line)
        if done:
            last_done = int(done.group(1))
        elif call and call.group(1) == "glowpy.wait":
            order.append(("wait", last_done))
        elif call and call.group(1) != "glowpy.finish":
            order.append(next(called))
    return order, prog


def test_independent_steps_follow_each_other_without_a_barrier() -> None:
    graph, feeds = fire_net()
    order, prog = schedule(graph, 2)
    names = [s.nodes[0].name for s in prog.steps]
    squeeze, e1, e3, cat = (names.index(n) for n in ("squeeze", "expand1", "expand3", "cat"))
    assert all(s.parallel for s in prog.steps)
    assert order == [squeeze, ("wait", squeeze), e1, e3, ("wait", e1), ("wait", e3), cat, ("wait", cat)]
    assert prog.waits == {e1: [squeeze], cat: [e1, e3], len(prog.steps): [cat]}
    want = CpuBackend().compile(graph, threads=1, cache=False).run(feeds)
    for n in (2, 3, 4):
        ex = CpuBackend().compile(graph, threads=n, cache=False)
        assert ex.nthreads == n
        for _ in range(20):
            for got, ref in zip(ex.run(feeds), want):
                assert got.tobytes() == ref.tobytes(), f"{n} threads differ from 1"
        ex.close()
    got, ref = run_both(graph, feeds, threads=4)
    assert_close(got, ref, "fire module, 4 threads")
    avx2 = [CpuBackend().compile(graph, threads=n, isa="avx2", cache=False).run(feeds) for n in (1, 3)]
    for got, ref in zip(*avx2):
        assert got.tobytes() == ref.tobytes(), "avx2: 3 threads differ from 1"


def test_split_steps_scratch_is_each_threads_own_block() -> None:
    """Split steps take their scratch from one area of a block per thread, live for the whole run: no
    buffer is ever placed over it, and no step waits for another because of it (a thread runs one chunk
    at a time, so its block is only ever its own)."""
    rng = np.random.default_rng(2)
    g = Graph("reuse")
    x = g.add_input("x", TensorType(np.float32, (1, 8, 32, 32)))
    c2 = _conv(g, _conv(g, x, 16, 3, "c1", rng), 16, 3, "c2", rng)
    c3 = _conv(g, x, 16, 3, "c3", rng)
    g.outputs = [g.add_node("Add", [c2, c3], name="add").outputs[0]]
    prog = codegen.build(g, host_target(), nthreads=2)
    split = [s for s in prog.steps if s.parallel and s.scratch]
    assert len(split) >= 3, "the test needs split steps with scratch"
    block = max(memory.align_up(s.scratch) for s in split)
    area = next(iv for iv in prog.intervals if iv.key == codegen.THREAD_SCRATCH_KEY)
    at = prog.plan.offsets[area.key]
    assert area.size == 2 * block and (area.first, area.last) == (0, len(prog.steps) - 1)
    for iv in prog.intervals:
        if iv.key != area.key:
            o = prog.plan.offsets[iv.key]
            assert o + iv.size <= at or at + area.size <= o, f"{iv.key} placed over the threads' scratch"
    binder = SimpleNamespace(storage=lambda v: prog.storage[id(v)])
    for k, s in enumerate(split):
        _, writes = codegen.step_regions(s, k, binder, prog.plan, {k: codegen.THREAD_SCRATCH_KEY})
        assert all(w[3] <= at or at + area.size <= w[2] for w in writes if w[0] == "arena")
    feeds = [rng.standard_normal((1, 8, 32, 32)).astype(np.float32)]
    got, want = run_both(g, feeds, threads=2)
    assert_close(got, want, "per-thread scratch, 2 threads")


def counters_at(prog: codegen.Program) -> slice:
    """Where the pool's step counters are in the arena (bytes)."""
    at = prog.plan.offsets[threads.POOL_KEY] + threads.counters_offset(prog.nthreads, len(prog.steps),
                                                                       host_target().data_layout)
    return slice(at, at + 4 * (prog.nthreads + 1) * len(prog.steps))


def check_counters(ex, prog: codegen.Program, runs: int) -> None:
    """After `runs` runs of a fresh pool: each step's done count is runs x its chunks (nthreads if split,
    1 if serial), and each of its chunks' flags holds the last epoch, `runs`."""
    c = ex._arena[counters_at(prog)].view(np.int32).reshape(len(prog.steps), prog.nthreads + 1)
    for k, s in enumerate(prog.steps):
        chunks = 0 if s.fn is None else prog.nthreads if s.parallel else 1
        assert c[k, 0] == runs * chunks, f"step {k}: done {c[k, 0]}, want {runs * chunks}"
        assert list(c[k, 1:]) == [runs] * chunks + [0] * (prog.nthreads - chunks), f"step {k}: flags {c[k, 1:]}"


def test_every_chunk_runs_once_per_run_and_the_pool_restarts_clean() -> None:
    """Each run claims and finishes each split step's nthreads chunks and each serial step's one chunk
    exactly once, whichever thread takes them; a release and a new pool (whose counters start from
    garbage, as a bundle's unzeroed arena would) do the same with the same bits."""
    graph, feeds = conv_net()
    prog = codegen.build(graph, host_target(), nthreads=3)
    assert any(s.parallel for s in prog.steps) and not all(s.parallel for s in prog.steps if s.fn is not None)
    ex = CpuBackend().compile(graph, threads=3, cache=False)
    want = CpuBackend().compile(graph, threads=1, cache=False).run(feeds)
    for runs in range(1, 8):
        for got, ref in zip(ex.run(feeds), want):
            assert got.tobytes() == ref.tobytes()
        check_counters(ex, prog, runs)
    ex.close()
    ex._arena[counters_at(prog)] = 0xA5
    for _ in range(3):
        for got, ref in zip(ex.run(feeds), want):
            assert got.tobytes() == ref.tobytes()
    check_counters(ex, prog, 3)
    ex.close()


def test_runs_complete_while_the_pool_threads_are_starved() -> None:
    """More busy Python threads than cores run their own threaded executables at once: every run ends
    (no thread waits for one that has not arrived) and every result is right."""
    graph, feeds = fire_net()
    want = CpuBackend().compile(graph, threads=1).run(feeds)
    exes = [CpuBackend().compile(graph, threads=2) for _ in range(4)]
    assert len({ex._arena_ptr for ex in exes}) == 4
    errors: list[str] = []

    def hammer(ex) -> None:
        for _ in range(20):
            for got, ref in zip(ex.run(feeds), want):
                if got.tobytes() != ref.tobytes():
                    errors.append("a starved run differs from 1 thread")

    ts = [threading.Thread(target=hammer, args=(ex,)) for ex in exes]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts), "a run did not finish"
    assert not errors
    for ex in exes:
        ex.close()
