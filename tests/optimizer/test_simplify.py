"""Dead code, common subexpressions, equal weights, constant folding, no-op removal."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.optimizer import (
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
    merge_constants,
    remove_noops,
)

from .util import G, apply, ops


def test_dce_removes_unused_nodes_and_weights() -> None:
    g = G()
    x = g.input("x", 2, 3)
    w = g.weight(2, 3)
    g("Mul", g("Add", x, w), w)  # dead chain
    y = g("Relu", x)
    graph = g.ret(y)
    apply(eliminate_dead_code, graph)
    assert ops(graph) == ["Relu"] and not graph.constants
    apply(eliminate_dead_code, graph, expect=False)


def test_dce_keeps_multi_output_node_with_one_used_output() -> None:
    g = G()
    x = g.input("x", 4, 3)
    split = g.node("Split", x, axis=0, split=(2, 2))
    graph = g.ret(g("Relu", split.outputs[1]))
    apply(eliminate_dead_code, graph, expect=False)
    assert ops(graph) == ["Split", "Relu"]


def test_cse_merges_same_op_attrs_inputs() -> None:
    g = G()
    x = g.input("x", 2, 6)
    a, b = g("Transpose", x, perm=(1, 0)), g("Transpose", x, perm=(1, 0))
    c = g("Reshape", x, shape=(3, 4))
    d = g("Reshape", x, shape=(4, 3))  # different attrs: kept
    graph = g.ret(g("Add", g("Relu", a), g("Relu", b)), c, d)
    apply(eliminate_common_subexpressions, graph)
    # Both Transposes merged, then both Relus (their inputs are now the same value).
    assert ops(graph) == ["Transpose", "Reshape", "Reshape", "Relu", "Add"]
    add = graph.nodes[-1]
    assert add.inputs[0] is add.inputs[1]


def test_cse_keeps_graph_output_names() -> None:
    g = G()
    x = g.input("x", 2, 3)
    a = g("Relu", x, name="first")
    b = g("Relu", x, name="second")
    graph = g.ret(b, g("Neg", a))
    apply(eliminate_common_subexpressions, graph)
    assert [v.name for v in graph.outputs] == ["second", "neg"]
    assert ops(graph) == ["Relu", "Neg"]


def test_merge_constants_with_equal_data() -> None:
    g = G()
    x = g.input("x", 2, 3)
    w1, w2 = g.const(np.arange(6, dtype=np.float32).reshape(2, 3), "w1"), g.const(
        np.arange(6, dtype=np.float32).reshape(2, 3), "w2")
    w3 = g.const(np.broadcast_to(np.float32(2), (2, 3)), "fill_a")  # uniform views compare by element
    w4 = g.const(np.broadcast_to(np.float32(2), (2, 3)), "fill_b")
    w5 = g.const(np.full((2, 3), 3, np.float32), "other")
    graph = g.ret(g("Add", g("Mul", g("Add", g("Add", x, w1), w2), g("Add", w3, w4)), w5))
    apply(merge_constants, graph)
    assert sorted(graph.constants) == ["fill_a", "other", "w1"]
    apply(merge_constants, graph, expect=False)


def test_fold_constants_folds_weight_arithmetic_and_reshape() -> None:
    g = G()
    x = g.input("x", 1, 4, 2, 2)
    scale = g("Reshape", g("Mul", g.weight(4), g.weight(4)), shape=(4, 1, 1))
    cast = g("Cast", g.const(np.arange(4, dtype=np.int64)), to=np.dtype(np.float32))
    graph = g.ret(g("Add", g("Mul", x, scale), g("Reshape", cast, shape=(4, 1, 1))))
    apply(fold_constants, graph)
    assert ops(graph) == ["Mul", "Add"]
    assert all(v.is_constant for n in graph.nodes for v in n.inputs[1:])


def test_fold_constants_leaves_big_expansions() -> None:
    """Expand of a scalar to 1M elements stays a node: storing the result would cost 4 MB read at
    every run, where the node computes it from 4 bytes."""
    g = G()
    x = g.input("x", 1, 1000, 1000)
    big = g("Expand", g.const(np.float32(2.0).reshape(1)), shape=(1, 1000, 1000))
    small = g("Expand", g.const(np.float32(3.0).reshape(1)), shape=(1, 1, 1000))
    graph = g.ret(g("Add", g("Mul", x, big), small))
    apply(fold_constants, graph)
    assert ops(graph) == ["Expand", "Mul", "Add"]
    assert graph.nodes[0].outputs[0].shape == (1, 1000, 1000)


def test_fold_constants_keeps_graph_outputs_as_nodes() -> None:
    g = G()
    g.input("x", 2)
    graph = g.ret(g("Neg", g.weight(2)))
    apply(fold_constants, graph, expect=False)
    assert ops(graph) == ["Neg"]


NOOPS = [
    ("Identity", {}, (2, 3)),
    ("Dropout", {}, (2, 3)),
    ("Reshape", {"shape": (2, 3)}, (2, 3)),
    ("Transpose", {"perm": (0, 1)}, (2, 3)),
    ("Cast", {"to": np.dtype(np.float32)}, (2, 3)),
    ("Pad", {"pads": (0, 0, 0, 0)}, (2, 3)),
    ("Slice", {"starts": (0, 0), "ends": (2, 3), "axes": (0, 1), "steps": (1, 1)}, (2, 3)),
    ("Expand", {"shape": (1, 3)}, (2, 3)),
    ("Concat", {"axis": 0}, (2, 3)),
]


@pytest.mark.parametrize("op,attrs,shape", NOOPS, ids=[n[0] for n in NOOPS])
def test_remove_noops(op: str, attrs: dict, shape: tuple) -> None:
    g = G()
    x = g.input("x", *shape)
    graph = g.ret(g("Neg", g(op, g("Relu", x), **attrs)))
    apply(remove_noops, graph)
    assert ops(graph) == ["Relu", "Neg"]


@pytest.mark.parametrize("op,attrs", [
    ("Reshape", {"shape": (3, 2)}),
    ("Transpose", {"perm": (1, 0)}),
    ("Cast", {"to": np.dtype(np.float64)}),
    ("Pad", {"pads": (0, 1, 0, 0)}),
    ("Slice", {"starts": (2,), "ends": (-1,), "axes": (1,), "steps": (-1,)}),  # reverses: same shape
])
def test_remove_noops_keeps_real_work(op: str, attrs: dict) -> None:
    g = G()
    x = g.input("x", 2, 3)
    graph = g.ret(g("Neg", g(op, g("Relu", x), **attrs)))
    apply(remove_noops, graph, expect=False)


def test_remove_noops_arithmetic_identities() -> None:
    g = G()
    x = g.input("x", 2, 3)
    zeros, ones = g.const(np.zeros(3, np.float32), "z"), g.const(np.ones((1, 3), np.float32), "o")
    y = g("Div", g("Mul", g("Sub", g("Add", zeros, x), zeros), ones), ones)
    bigger = g("Add", y, g.const(np.zeros((4, 2, 3), np.float32), "z3"))  # broadcasts: not a no-op
    graph = g.ret(g("Relu", bigger))
    apply(remove_noops, graph)
    assert ops(graph) == ["Add", "Relu"]


def test_remove_noops_keeps_output_name() -> None:
    g = G()
    x = g.input("x", 2, 3)
    r = g("Relu", x, name="r")
    graph = g.ret(g("Identity", r, name="out"))
    apply(remove_noops, graph)
    assert ops(graph) == ["Relu"] and graph.outputs[0].name == "out"


def test_identity_of_input_as_output_stays() -> None:
    g = G()
    x = g.input("x", 2, 3)
    graph = g.ret(g("Identity", x, name="out"))
    apply(remove_noops, graph, expect=False)
    assert graph.outputs[0].name == "out"
