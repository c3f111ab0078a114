"""Lowering: high-level ops a backend does not implement directly become simpler IR ops.

A backend says which nodes to lower with `Backend.should_lower(node)` (Glow's shouldLower); the
interpreter keeps everything. Each lowering below emits its replacement just before the node, in
the node's element type, and the last value takes over the node's output name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from glowpy.ir import activations
from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops.nn import batchnorm_scale_shift
from glowpy.ir.types import BFLOAT16
from glowpy.optimizer.rewrite import add_weight, const_data, replace_node, root_name, transposed

if TYPE_CHECKING:
    from glowpy.backends.base import Backend


class Builder:
    """Emits nodes one after another just before `at`, named after it."""

    def __init__(self, graph: Graph, at: Node) -> None:
        self.graph = graph
        self.at = at
        self.dtype = at.outputs[0].dtype

    def __call__(self, op: str, *inputs: Value, **attrs: Any) -> Value:
        node = self.graph.add_node(op, list(inputs), attrs, name=f"{root_name(self.at.name)}.{op.lower()}", before=self.at)
        return node.outputs[0]

    def const(self, data: Any, what: str) -> Value:
        return add_weight(self.graph, f"{root_name(self.at.name)}.{what}", np.asarray(data, dtype=self.dtype))


Lowering = Callable[[Builder, Node], "Sequence[Value] | None"]
LOWERINGS: dict[str, Lowering] = {}


def lowering(op: str) -> Callable[[Lowering], Lowering]:
    def register(fn: Lowering) -> Lowering:
        LOWERINGS[op] = fn
        return fn

    return register


def emit_activation(b: Builder, y: Value, name: str, params: Sequence[Any]) -> Value:
    """A fused epilogue (an entry of glowpy/ir/activations.py) as a standalone node."""
    if name == activations.NONE:
        return y
    act = activations.ACTIVATIONS[name]
    return b(act.op, y, **act.attrs_of(tuple(params)))


@lowering("Softmax")
def lower_softmax(b: Builder, node: Node) -> list[Value]:
    """exp(x - max(x)) / sum(exp(x - max(x))) over the axis."""
    (x,), axis = node.inputs, node.attrs["axis"] % node.inputs[0].type.rank
    e = b("Exp", b("Sub", x, b("ReduceMax", x, axes=(axis,), keepdims=1)))
    return [b("Div", e, b("ReduceSum", e, axes=(axis,), keepdims=1))]


@lowering("LogSoftmax")
def lower_log_softmax(b: Builder, node: Node) -> list[Value]:
    """s - log(sum(exp(s))) with s = x - max(x) over the axis."""
    (x,), axis = node.inputs, node.attrs["axis"] % node.inputs[0].type.rank
    s = b("Sub", x, b("ReduceMax", x, axes=(axis,), keepdims=1))
    return [b("Sub", s, b("Log", b("ReduceSum", b("Exp", s), axes=(axis,), keepdims=1)))]


@lowering("LayerNormalization")
def lower_layer_norm(b: Builder, node: Node) -> list[Value]:
    """(x - mean) / sqrt(var + eps) * scale (+ bias), mean and var over dims axis..end."""
    x, scale, *bias = node.inputs
    rank = x.type.rank
    axes = tuple(range(node.attrs["axis"] % rank, rank))
    d = b("Sub", x, b("ReduceMean", x, axes=axes, keepdims=1))
    var = b("ReduceMean", b("Mul", d, d), axes=axes, keepdims=1)
    y = b("Mul", b("Div", d, b("Sqrt", b("Add", var, b.const(node.attrs["epsilon"], "eps")))), scale)
    return [b("Add", y, bias[0]) if bias else y]


@lowering("Gelu")
def lower_gelu(b: Builder, node: Node) -> list[Value]:
    """0.5 x (1 + erf(x / sqrt 2)), or with tanh(sqrt(2/pi) (x + 0.044715 x^3)) when approximate."""
    (x,) = node.inputs
    if node.attrs["approximate"] == "tanh":
        cube = b("Mul", b("Mul", x, x), x)
        inner = b("Mul", b("Add", x, b("Mul", cube, b.const(0.044715, "c"))), b.const(math.sqrt(2 / math.pi), "k"))
        t = b("Tanh", inner)
    else:
        t = b("Erf", b("Mul", x, b.const(1 / math.sqrt(2), "rsqrt2")))
    return [b("Mul", b("Mul", x, b("Add", t, b.const(1.0, "one"))), b.const(0.5, "half"))]


@lowering("LRN")
def lower_lrn(b: Builder, node: Node) -> list[Value] | None:
    """x / (bias + alpha * mean of x^2 over `size` neighbouring channels)^beta. The window sum is an
    AveragePool over the channel dim of x^2 viewed as (N, 1, C, pixels), counting the zero padding
    so that the divisor is always `size` (ONNX divides alpha by size)."""
    (x,), a = node.inputs, node.attrs
    n, c = x.shape[:2]
    size = a["size"]
    pixels = math.prod(x.shape[2:])
    sq = b("Reshape", b("Mul", x, x), shape=(n, 1, c, pixels))
    lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
    mean = b("AveragePool", sq, kernel_shape=(size, 1), strides=(1, 1), pads=(lo, 0, hi, 0), count_include_pad=1)
    mean = b("Reshape", mean, shape=x.shape)
    base = b("Add", b("Mul", mean, b.const(a["alpha"], "alpha")), b.const(a["bias"], "bias"))
    return [b("Div", x, b("Pow", base, b.const(a["beta"], "beta")))]


@lowering("BatchNormalization")
def lower_batchnorm(b: Builder, node: Node) -> list[Value] | None:
    """x * s + t per channel, s = scale / sqrt(var + eps) and t = bias - mean * s (folded here when
    the parameters are constants, as ops otherwise)."""
    x, scale, bias, mean, var = node.inputs
    if x.type.rank < 2:
        return None
    shape = (x.shape[1],) + (1,) * (x.type.rank - 2)
    params = [const_data(v) for v in (scale, bias, mean, var)]
    if all(p is not None for p in params):
        s, t = batchnorm_scale_shift(*params, node.attrs["epsilon"])
        return [b("Add", b("Mul", x, b.const(s.reshape(shape), "scale")), b.const(t.reshape(shape), "shift"))]
    s = b("Div", scale, b("Sqrt", b("Add", var, b.const(node.attrs["epsilon"], "eps"))))
    t = b("Sub", bias, b("Mul", mean, s))
    return [b("Add", b("Mul", x, b("Reshape", s, shape=shape)), b("Reshape", t, shape=shape))]


@lowering("Gemm")
def lower_gemm(b: Builder, node: Node) -> list[Value]:
    """alpha * op(A) @ op(B) + beta * C -> Transpose (folded for constant B) + MatMul (+ Mul) + Add,
    then the fused activation as its own node. MatMul + Add becomes FullyConnected later when B is
    constant and C per-column, if the backend keeps that."""
    a_, b_, *c = node.inputs
    at = node.attrs
    if at["transA"]:
        a_ = b("Transpose", a_, perm=(1, 0))
    bd = const_data(b_)
    alpha = at["alpha"]
    if bd is not None and (at["transB"] or alpha != 1.0):
        w = transposed(bd) if at["transB"] else bd
        if alpha != 1.0:
            w, alpha = (w.astype(np.float64) * alpha).astype(bd.dtype), 1.0
        b_ = b.const(w, "weight")
    elif at["transB"]:
        b_ = b("Transpose", b_, perm=(1, 0))
    y = b("MatMul", a_, b_)
    if alpha != 1.0:
        y = b("Mul", y, b.const(alpha, "alpha"))
    if c:
        cv, cd = c[0], const_data(c[0])
        if at["beta"] != 1.0:
            cv = b.const(cd.astype(np.float64) * at["beta"], "c") if cd is not None else \
                b("Mul", cv, b.const(at["beta"], "beta"))
        y = b("Add", y, cv)
    return [emit_activation(b, y, at["activation"], at["activation_params"])]


def touches_bfloat16(node: Node) -> bool:
    return any(v.dtype == BFLOAT16 for v in (*node.inputs, *node.outputs))


def compute_in_float32(b: Builder, node: Node) -> list[Value]:
    """A node on bfloat16 values as the same node on float32 ones between Casts (the interpreter's
    bfloat16 semantics: OpDef.bfloat16_in_float32)."""
    f32 = np.dtype(np.float32)
    ins = [b("Cast", v, to=f32) if v.dtype == BFLOAT16 else v for v in node.inputs]
    wide = b.graph.add_node(node.op, ins, dict(node.attrs), name=f"{root_name(node.name)}.f32", before=node)
    return [b("Cast", w, to=BFLOAT16) if old.dtype == BFLOAT16 and w.dtype == f32 else w
            for w, old in zip(wide.outputs, node.outputs)]


def lower_nodes(graph: Graph, backend: Backend | None = None) -> bool:
    """Replace each node the backend asks to lower (`backend.should_lower(node)`) and that has a
    lowering here (LayerNormalization, Softmax, LogSoftmax, Gelu, LRN, BatchNormalization, Gemm;
    any op but Cast on bfloat16 values: `compute_in_float32`) with simpler ops. Without a backend
    nothing is lowered."""
    if backend is None:
        return False
    changed = False
    work = list(graph.nodes)
    while work:
        node = work.pop(0)
        widen = node.op != "Cast" and touches_bfloat16(node)
        fn = compute_in_float32 if widen else LOWERINGS.get(node.op)
        if fn is None or not backend.should_lower(node):
            continue
        before = set(map(id, graph.nodes))
        values = fn(Builder(graph, node), node)
        if values is None:
            continue
        replace_node(graph, node, values, adopt_names=True)
        if widen:  # the float32 node may have a lowering of its own
            work[:0] = [n for n in graph.nodes if id(n) not in before and n.op != "Cast"]
        changed = True
    return changed
