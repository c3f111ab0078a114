"""Epilogue fusion: a residual Add and an activation become part of the producing Conv / matmul."""

from __future__ import annotations

from typing import Any

from glowpy.ir.graph import Graph, Node
from glowpy.optimizer.rewrite import ACTIVATION_CARRIERS, rebuild, sole_user


def _activation_of(node: Node) -> tuple[str, tuple[Any, ...]] | None:
    """The fused-activation form (name, params) of an activation node (see elementwise.ACTIVATIONS)."""
    a = node.attrs
    return {
        "Relu": ("relu", ()),
        "Clip": ("clip", (a.get("min"), a.get("max"))),
        "LeakyRelu": ("leaky_relu", (a.get("alpha"),)),
        "Sigmoid": ("sigmoid", ()),
        "Tanh": ("tanh", ()),
    }.get(node.op)


def fuse_activation(graph: Graph) -> bool:
    """Relu / Clip / LeakyRelu / Sigmoid / Tanh of a Conv, Gemm, MatMul or FullyConnected that only
    feeds it -> the producer with `activation` / `activation_params` set (a backend epilogue)."""
    changed = False
    for act in list(graph.nodes):
        fused = _activation_of(act)
        p = act.inputs[0].producer if fused else None
        if p is None or p.op not in ACTIVATION_CARRIERS or p.attrs["activation"] != "none":
            continue
        if sole_user(graph, p.outputs[0]) is not act:
            continue
        rebuild(graph, p, attrs={**p.attrs, "activation": fused[0], "activation_params": fused[1]}, replaces=act)
        changed = True
    return changed


def fuse_residual_add(graph: Graph) -> bool:
    """Add(Conv(x), y) -> Conv(x, ..., residual=y), added before the activation, when the Conv only
    feeds the Add, has no activation or residual yet, y has the output's type, and y is ready when
    the Conv runs (an input, a weight, or produced earlier in topological order). ONNX Sum of two
    operands (ResNet-50) arrives here as Add."""
    changed = False
    for add in list(graph.nodes):
        if add.op != "Add":
            continue
        for conv_out, y in (add.inputs, add.inputs[::-1]):
            conv = conv_out.producer
            if conv is None or conv.op != "Conv" or len(conv.inputs) > 3 or conv.attrs["activation"] != "none":
                continue
            if sole_user(graph, conv_out) is not add or y.type != conv_out.type or y.type != add.outputs[0].type:
                continue
            if y.producer is not None and graph.nodes.comes_before(conv, y.producer):
                continue
            rebuild(graph, conv, inputs=[*conv.inputs, y], replaces=add)
            changed = True
            break
    return changed
