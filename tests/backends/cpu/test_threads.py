"""Threads: threads=1 and threads=N agree, every kernel splits correctly, the option and the env var."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import glowpy
import glowpy.backends.cpu.lowering as lowering
from glowpy.backends.cpu import CpuBackend, resolve_threads
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
