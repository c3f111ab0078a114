"""Squeeze-excite blocks (MobileNetV3, EfficientNet, RegNetY) into one SqueezeExcite op."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops.nn import SE_GATES
from glowpy.optimizer.rewrite import add_weight, is_graph_output, replace_node, root_name, sole_user

if TYPE_CHECKING:
    from glowpy.backends.base import Backend


def _fc_1x1(graph: Graph, v: Value) -> Node | None:
    """The producer of `v` when it is a plain 1x1 Conv (group 1, no padding, stride and dilation 1, no
    residual, constant weight and bias) of a (N, C, 1, 1) value, used only by one node."""
    p = v.producer
    if p is None or p.op != "Conv" or len(p.inputs) != 3 or sole_user(graph, v) is None:
        return None
    a, w, bias = p.attrs, p.inputs[1], p.inputs[2]
    if not (w.is_constant and bias.is_constant and w.type.rank == 4 and tuple(w.shape[2:]) == (1, 1)):
        return None
    if a["group"] != 1 or any(a["pads"]) or tuple(a["strides"]) != (1, 1) or tuple(a["dilations"]) != (1, 1):
        return None
    return p if tuple(p.inputs[0].shape[2:]) == (1, 1) else None


def _channel_mean(graph: Graph, v: Value) -> Node | None:
    """The producer of `v` when it is GlobalAveragePool or ReduceMean over axes (2, 3) with kept dims of
    a rank-4 value, used only by one node."""
    p = v.producer
    if p is None or sole_user(graph, v) is None or p.inputs[0].type.rank != 4:
        return None
    if p.op == "GlobalAveragePool":
        return p
    if p.op == "ReduceMean" and len(p.inputs) == 1 and p.attrs["keepdims"]:
        return p if sorted(a % 4 for a in p.attrs["axes"]) == [2, 3] else None
    return None


def _match(graph: Graph, mul: Node) -> tuple[Value, Node, Node, Node] | None:
    """(x, pool, fc1, fc2) when `mul` is Mul(x, fc2(fc1(mean(x)))) in either operand order."""
    for s, x in (mul.inputs, mul.inputs[::-1]):
        fc2 = _fc_1x1(graph, s)
        if fc2 is None or fc2.attrs["activation"] not in SE_GATES or sole_user(graph, s) is not mul:
            continue
        fc1 = _fc_1x1(graph, fc2.inputs[0])
        pool = None if fc1 is None else _channel_mean(graph, fc1.inputs[0])
        if pool is not None and pool.inputs[0] is x and mul.outputs[0].type == x.type:
            return x, pool, fc1, fc2
    return None


def fuse_squeeze_excite(graph: Graph, backend: Backend | None = None) -> bool:
    """Mul(x, gate(Conv1x1(act(Conv1x1(GlobalAveragePool(x)))))) -> SqueezeExcite(x, W1, b1, W2, b2), the
    activations (any fused one; the gate Sigmoid or HardSigmoid) taken from the two Convs' epilogues;
    GlobalAveragePool may be ReduceMean over axes (2, 3). Runs after fuse_activation (the Convs carry
    their activations by then) where the backend supports it (supports_squeeze_excite)."""
    changed = False
    for mul in list(graph.nodes):
        if mul.op != "Mul" or len(mul.inputs) != 2:
            continue
        found = _match(graph, mul)
        if found is None:
            continue
        x, pool, fc1, fc2 = found
        if is_graph_output(graph, fc2.inputs[0]) or is_graph_output(graph, fc1.inputs[0]):
            continue
        if backend is not None and not backend.supports_squeeze_excite(x, fc1.attrs["activation"],
                                                                       fc2.attrs["activation"]):
            continue
        w1, b1, w2, b2 = fc1.inputs[1], fc1.inputs[2], fc2.inputs[1], fc2.inputs[2]
        weights = [add_weight(graph, w1.name, np.asarray(w1.data).reshape(w1.shape[:2])), b1,
                   add_weight(graph, w2.name, np.asarray(w2.data).reshape(w2.shape[:2])), b2]
        attrs = {"activation": fc1.attrs["activation"], "activation_params": tuple(fc1.attrs["activation_params"]),
                 "gate": fc2.attrs["activation"], "gate_params": tuple(fc2.attrs["activation_params"])}
        se = graph.add_node("SqueezeExcite", [x, *weights], attrs, name=root_name(mul.name), before=mul)
        replace_node(graph, mul, se.outputs, adopt_names=True)
        for n in (fc2, fc1, pool):
            graph.remove_node(n)
        graph.remove_unused_constants(among=[w1, w2])
        changed = True
    return changed
