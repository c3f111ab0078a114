"""The memory plan: placement never overlaps live buffers, memory is reused, Reshape aliases, elementwise
runs in place, graph inputs/outputs are bound by pointer, and awkward output bindings still work."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.memory import ALIGN, Interval, align_up, check_plan, peak_live_bytes, plan_arena
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

from .util import assert_close, run_both

F32 = np.float32


@pytest.mark.parametrize("seed", range(20))
def test_random_intervals_never_overlap(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ivs = []
    for k in range(int(rng.integers(1, 60))):
        a = int(rng.integers(0, 40))
        ivs.append(Interval(k, int(rng.integers(0, 5000)), a, a + int(rng.integers(0, 10))))
    plan = plan_arena(ivs)
    check_plan(ivs, plan)
    assert plan.size >= plan.peak_live == peak_live_bytes(ivs)
    assert all(off % ALIGN == 0 for off in plan.offsets.values())


def test_disjoint_lifetimes_share_memory() -> None:
    ivs = [Interval("a", 1000, 0, 1), Interval("b", 1000, 2, 3), Interval("c", 500, 4, 5)]
    plan = plan_arena(ivs)
    assert plan.size == align_up(1000)
    assert plan.offsets["a"] == plan.offsets["b"] == plan.offsets["c"] == 0


def transpose_chain(n: int = 6) -> Graph:
    g = Graph("chain")
    v = g.add_input("x", TensorType(F32, (16, 32)))
    for i in range(n):
        v = g.add_node("Transpose", [v], {"perm": (1, 0)}, name=f"t{i}").outputs[0]
    g.outputs = [v]
    return g


def test_chain_needs_two_buffers() -> None:
    prog = CpuBackend().build(transpose_chain(), threads=1)
    assert prog.arena_size == 2 * align_up(16 * 32 * 4)  # ping-pong, whatever the chain length
    got, want = run_both(transpose_chain(), [np.random.default_rng(0).standard_normal((16, 32)).astype(F32)])
    assert_close(got, want)


def test_reshape_is_an_alias_and_elementwise_runs_in_place() -> None:
    g = Graph("alias")
    x = g.add_input("x", TensorType(F32, (4, 8)))
    t = g.add_node("Transpose", [x], {"perm": (1, 0)}, name="t").outputs[0]
    r = g.add_node("Reshape", [t], {"shape": (32,)}, name="r").outputs[0]
    c = g.add_constant("c", np.float32(2.0))
    e = g.add_node("Mul", [r, c], name="e").outputs[0]
    f = g.add_node("Neg", [e], name="f").outputs[0]
    s = g.add_node("Split", [f], {"axis": 0, "split": (16, 16)}, name="s").outputs
    g.outputs = [s[0], s[1]]
    prog = CpuBackend().build(g, threads=1)
    st = prog.storage
    assert st[id(t)] is st[id(r)]  # alias: same bytes
    assert st[id(r)] is st[id(f)]  # the fused Mul+Neg wrote over its dying operand
    assert prog.arena_size == align_up(32 * 4)
    assert [st[id(v)].kind for v in s] == ["output", "output"]
    got, want = run_both(g, [np.arange(32, dtype=F32).reshape(4, 8)])
    assert_close(got, want)


def test_inputs_are_never_overwritten() -> None:
    g = Graph("keep")
    x = g.add_input("x", TensorType(F32, (64,)))
    y = g.add_node("Relu", [x], name="relu").outputs[0]
    z = g.add_node("Add", [y, x], name="add").outputs[0]
    w = g.add_node("Transpose", [z], {"perm": (0,)}, name="t").outputs[0]
    g.outputs = [w]
    feed = np.random.default_rng(1).standard_normal(64).astype(F32)
    before = feed.copy()
    got, want = run_both(g, [feed])
    assert_close(got, want)
    np.testing.assert_array_equal(feed, before)


def test_awkward_output_bindings() -> None:
    """An input as an output, one value as two outputs, a constant as an output, a Reshape of an input
    as an output: all need copies, none may clobber the caller's input."""
    g = Graph("outputs")
    x = g.add_input("x", TensorType(F32, (2, 3)))
    c = g.add_constant("c", np.arange(6, dtype=F32).reshape(2, 3))
    y = g.add_node("Add", [x, c], name="add").outputs[0]
    r = g.add_node("Reshape", [x], {"shape": (3, 2)}, name="r").outputs[0]
    ry = g.add_node("Reshape", [y], {"shape": (6,)}, name="ry").outputs[0]
    g.outputs = [x, y, y, c, r, ry]
    feed = np.random.default_rng(2).standard_normal((2, 3)).astype(F32)
    got, want = run_both(g, [feed])
    assert_close(got, want)
    assert not np.shares_memory(got[1], got[2])


def test_resnet50_arena_within_twice_the_largest_layer(random_model) -> None:
    """Acceptance: the activation arena is at most 2x the largest layer's input plus output."""
    import glowpy
    from glowpy.optimizer import optimize

    graph = glowpy.load(random_model("resnet50"))
    backend = CpuBackend()
    for g in (graph, optimize(graph, backend)):
        prog = backend.build(g, threads=2)
        largest = max(sum(v.type.nbytes for v in n.inputs if not v.is_constant) +
                      sum(v.type.nbytes for v in n.outputs) for n in g.nodes)
        assert prog.arena_size <= 2 * largest, (prog.arena_size, largest)
        check_plan(prog.intervals, prog.plan)


def test_release_weights_drops_packed_constants_only() -> None:
    """release_weights: the graph's copies of weights packed into kernels are dropped; constants read at
    run time (here, in an unoptimized graph, the BatchNormalization parameters and the Add operand that the
    elementwise kernel reads) stay with the executable; results are unchanged."""
    from .test_codegen import block_graph

    feeds = [np.random.default_rng(3).standard_normal((1, 4, 6, 6)).astype(F32)]
    want = CpuBackend().compile(block_graph(), threads=1).run(feeds)
    g = block_graph()
    g.add_node("Add", [g.outputs[0], g.add_constant("big", np.arange(144, dtype=F32).reshape(4, 6, 6))],
               name="late_add")
    g.outputs = [g.nodes[-1].outputs[0]]
    want = [w + np.arange(144, dtype=F32).reshape(4, 6, 6) for w in want]
    ex = CpuBackend().compile(g, threads=1, release_weights=True)
    released = {n for n, v in g.constants.items() if v.data is None}
    assert {"w", "b"} <= released
    assert not released & {"big", "s", "bn0", "bn1", "bn2", "bn3"}
    assert_close(ex.run(feeds), want)


def test_build_drops_each_kernel_module_once_sealed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile pauses the cyclic collector, yet a kernel's llvmlite module (cyclic garbage once its
    text is sealed) does not outlive the next kernels: the sharing table keeps declarations, and the
    build collects the young garbage as it goes. Two convs of one configuration share a kernel."""
    import gc
    import weakref

    from glowpy.backends.cpu import lowering
    from glowpy.backends.cpu.module_text import KernelTexts

    made: list[weakref.ref] = []
    kmod = KernelTexts.kmod

    def tracked(self):
        m = kmod(self)
        made.append(weakref.ref(m))
        return m

    monkeypatch.setattr(KernelTexts, "kmod", tracked)
    monkeypatch.setattr(lowering, "COLLECT_OBJECTS", 0)
    rng = np.random.default_rng(0)
    g = Graph("chain")
    y = g.add_input("x", TensorType(F32, (1, 16, 8, 8)))
    for i in range(4):
        w = g.add_constant(f"w{i}", rng.standard_normal((16, 16, 3, 3)).astype(F32) * 0.1)
        b = g.add_constant(f"b{i}", rng.standard_normal(16).astype(F32))
        y = g.add_node("Conv", [y, w, b], {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)},
                       name=f"conv{i}").outputs[0]
        y = g.add_node("Sigmoid", [y], name=f"sig{i}").outputs[0]
    g.outputs = [y]
    enabled = gc.isenabled()
    gc.disable()
    try:
        program = CpuBackend().build(g, threads=1)
        alive = [r for r in made if r() is not None]
    finally:
        if enabled:
            gc.enable()
    assert len(made) >= 5 and len(alive) <= 1, (len(made), len(alive))
    assert len(program.kernel_defs) >= 5
