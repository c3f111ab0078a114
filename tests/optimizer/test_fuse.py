"""Activation and residual-add fusion into the producing Conv / matmul."""

from __future__ import annotations

import pytest

from glowpy.optimizer import fuse_activation, fuse_residual_add, optimize

from .util import G, apply, ops

ACTS = [
    ("Relu", {}, "relu", ()),
    ("Clip", {"min": -0.5, "max": 0.5}, "clip", (-0.5, 0.5)),
    ("LeakyRelu", {"alpha": 0.2}, "leaky_relu", (0.2,)),
    ("Sigmoid", {}, "sigmoid", ()),
    ("Tanh", {}, "tanh", ()),
]


def _producer(g: G, kind: str):
    if kind == "Conv":
        return g.conv(g.input("x", 1, 3, 5, 5), 4)
    x = g.input("x", 3, 4)
    if kind == "Gemm":
        return g("Gemm", x, g.weight(5, 4), g.weight(5), transB=1)
    if kind == "MatMul":
        return g("MatMul", x, g.input("w_in", 4, 5))
    return g("FullyConnected", x, g.weight(4, 5), g.weight(5))


@pytest.mark.parametrize("kind", ["Conv", "Gemm", "MatMul", "FullyConnected"])
@pytest.mark.parametrize("op,attrs,name,params", ACTS, ids=[a[0] for a in ACTS])
def test_fuse_activation(kind: str, op: str, attrs: dict, name: str, params: tuple) -> None:
    g = G()
    graph = g.ret(g(op, _producer(g, kind), name="out", **attrs))
    apply(fuse_activation, graph)
    (node,) = graph.nodes
    assert node.op == kind and node.attrs["activation"] == name
    assert tuple(node.attrs["activation_params"]) == params
    assert graph.outputs[0].name == "out"


def test_no_fusion_when_producer_output_is_shared_or_already_fused() -> None:
    g = G()
    x = g.input("x", 1, 3, 5, 5)
    c = g.conv(x, 4)
    fused = g.conv(x, 4, activation="relu")
    graph = g.ret(g("Relu", c), g("Neg", c), g("Sigmoid", fused))
    apply(fuse_activation, graph, expect=False)
    g2 = G()
    c = g2.conv(g2.input("x", 1, 3, 5, 5), 4)
    graph = g2.ret(g2("Relu", c), c)  # the Conv output is itself a graph output
    apply(fuse_activation, graph, expect=False)


@pytest.mark.parametrize("swap", [False, True])
def test_relu_of_residual_add_becomes_one_conv(swap: bool) -> None:
    g = G()
    x = g.input("x", 1, 4, 5, 5)
    y = g("Relu", x)  # ready before the conv
    c = g.conv(x, 4)
    graph = g.ret(g("Relu", g("Add", *((y, c) if swap else (c, y)))))
    apply(fuse_residual_add, graph)
    assert ops(graph) == ["Relu", "Conv", "Relu"]
    apply(fuse_activation, graph)
    assert ops(graph) == ["Relu", "Conv"]
    conv = graph.nodes[1]
    assert len(conv.inputs) == 4 and conv.inputs[3] is y.producer.outputs[0] and conv.attrs["activation"] == "relu"


def test_residual_picks_the_conv_whose_other_operand_is_ready() -> None:
    """ResNet's projection blocks add two convs: only the later one can take the other as residual."""
    g = G()
    x = g.input("x", 1, 4, 5, 5)
    first = g.conv(x, 4, name="first")
    second = g.conv(x, 4, name="second")
    graph = g.ret(g("Relu", g("Add", second, first)))
    graph = optimize(graph)
    assert ops(graph) == ["Conv", "Conv"]
    assert graph.nodes[1].inputs[3] is graph.nodes[0].outputs[0]


def test_residual_not_fused_when_operand_not_ready_or_broadcast() -> None:
    g = G()
    x = g.input("x", 1, 4, 5, 5)
    c = g.conv(x, 4)
    later = g("Relu", x)  # produced after the conv
    bias = g.weight(4, 1, 1)  # broadcasts: a per-channel bias, not a residual
    graph = g.ret(g("Add", c, later), g("Add", g.conv(x, 4), bias))
    apply(fuse_residual_add, graph, expect=False)
