"""Reshape merging, transpose cancellation and sinking."""

from __future__ import annotations

import numpy as np

from glowpy.optimizer import cancel_transposes, merge_reshapes, optimize, remove_noops, sink_transposes

from .util import G, apply, ops


def test_merge_reshapes() -> None:
    g = G()
    x = g.input("x", 2, 3, 4)
    graph = g.ret(g("Relu", g("Reshape", g("Reshape", x, shape=(6, 4)), shape=(4, 6))))
    apply(merge_reshapes, graph)
    assert ops(graph) == ["Reshape", "Relu"]
    assert graph.nodes[0].inputs[0].name == "x" and graph.nodes[0].attrs["shape"] == (4, 6)


def test_merge_reshapes_keeps_shared_inner_reshape() -> None:
    g = G()
    x = g.input("x", 2, 3, 4)
    inner = g("Reshape", x, shape=(6, 4))
    graph = g.ret(g("Reshape", inner, shape=(24,)), g("Relu", inner))
    apply(merge_reshapes, graph)
    assert ops(graph) == ["Reshape", "Reshape", "Relu"]
    assert all(n.inputs[0].name == "x" for n in graph.nodes if n.op == "Reshape")


def test_reshape_round_trip_disappears() -> None:
    g = G()
    x = g.input("x", 2, 3, 4)
    graph = g.ret(g("Relu", g("Reshape", g("Reshape", x, shape=(6, 4)), shape=(2, 3, 4))))
    apply(merge_reshapes, graph)
    apply(remove_noops, graph)
    assert ops(graph) == ["Relu"]


def test_cancel_transposes_composes_perms() -> None:
    g = G()
    x = g.input("x", 2, 3, 4)
    graph = g.ret(g("Relu", g("Transpose", g("Transpose", x, perm=(1, 2, 0)), perm=(0, 2, 1))))
    apply(cancel_transposes, graph)
    assert ops(graph) == ["Transpose", "Relu"]
    assert graph.nodes[0].attrs["perm"] == (1, 0, 2)


def test_inverse_transposes_cancel() -> None:
    g = G()
    x = g.input("x", 1, 3, 4, 5)
    nhwc = g("Transpose", x, perm=(0, 2, 3, 1))
    graph = g.ret(g("Relu", g("Transpose", nhwc, perm=(0, 3, 1, 2))))
    apply(cancel_transposes, graph)
    apply(remove_noops, graph)
    assert ops(graph) == ["Relu"]


def test_sink_transpose_through_unary_ops_then_cancel() -> None:
    g = G()
    x = g.input("x", 1, 3, 4, 5)
    t = g("Transpose", x, perm=(0, 2, 3, 1))
    y = g("Transpose", g("Sigmoid", g("Relu", t)), perm=(0, 3, 1, 2))
    graph = g.ret(g("Neg", y))
    apply(sink_transposes, graph)  # both sink as far as they go: to the end
    assert ops(graph) == ["Relu", "Sigmoid", "Neg", "Transpose", "Transpose"]
    graph = optimize(graph)
    assert ops(graph) == ["Relu", "Sigmoid", "Neg"]


def test_sink_transpose_through_binary_with_constant_and_twin_transpose() -> None:
    g = G()
    x, z = g.input("x", 1, 3, 4, 5), g.input("z", 1, 3, 4, 5)
    perm = (0, 2, 3, 1)
    tx, tz = g("Transpose", x, perm=perm), g("Transpose", z, perm=perm)
    per_channel = g.weight(3)  # broadcasts over the last (channel) dim of the NHWC view
    s = g("Add", g("Mul", tx, per_channel), tz)
    graph = g.ret(g("Transpose", s, perm=(0, 3, 1, 2)))
    apply(sink_transposes, graph)
    assert ops(graph).count("Transpose") == 2
    graph = optimize(graph)
    assert ops(graph) == ["Mul", "Add"]
    assert graph.nodes[0].inputs[1].shape == (1, 3, 1, 1)


def test_sink_stops_at_shared_transpose_and_non_elementwise() -> None:
    g = G()
    x = g.input("x", 2, 3)
    t = g("Transpose", x, perm=(1, 0))
    shared = g("Relu", t), g("Neg", t)
    t2 = g("Transpose", x, perm=(1, 0), name="t2")
    graph = g.ret(*shared, g("Softmax", t2, axis=0))
    apply(sink_transposes, graph, expect=False)


def test_sink_transpose_keeps_output_name() -> None:
    g = G()
    x = g.input("x", 2, 3)
    graph = g.ret(g("Relu", g("Transpose", x, perm=(1, 0)), name="out"))
    apply(sink_transposes, graph)
    assert ops(graph) == ["Relu", "Transpose"]
    assert graph.outputs[0].name == "out" and np.dtype(graph.outputs[0].dtype) == np.float32
