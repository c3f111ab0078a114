"""Passes that fold per-channel arithmetic into the weights of the op that produced it, and turn
matrix products with constant weights into FullyConnected."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops.nn import FUSED, batchnorm_scale_shift
from glowpy.ir.ops.registry import get_op
from glowpy.ir.types import FLOAT_TYPES, TensorType
from glowpy.optimizer.rewrite import (
    add_weight,
    channel_vector,
    const_data,
    rebuild,
    sole_user,
    transposed,
)

if TYPE_CHECKING:
    from glowpy.backends.base import Backend

# Producers whose output channels (dim 1) can absorb y * s + t into their own parameters.
AFFINE_TARGETS = ("Conv", "Gemm", "FullyConnected", "BatchNormalization")


def backend_keeps(backend: Backend | None, op: str, inputs: Sequence[Value | np.ndarray],
                  attrs: dict[str, Any]) -> bool:
    """Whether `backend` runs `op` as is (supported, not lowered). Asked with a detached probe node
    (arrays stand for would-be constants), so the graph is not touched; no backend keeps all."""
    if backend is None:
        return True
    vals = [v if isinstance(v, Value) else Value("probe.w", TensorType.of(v), "constant", data=v) for v in inputs]
    opdef = get_op(op)
    full = opdef.make_attrs(dict(attrs))
    types = opdef.infer_types(full, [v.type for v in vals])
    probe = Node(op, f"probe.{op}", vals, [Value("probe.out", t, "node") for t in types], full)
    return backend.is_op_supported(probe) and not backend.should_lower(probe)


def _is_one(s: np.ndarray) -> bool:
    return bool(np.all(s == 1))


def _is_zero(t: np.ndarray) -> bool:
    return bool(np.all(t == 0))


def _scaled_inputs(graph: Graph, p: Node, s: np.ndarray, t: np.ndarray) -> list[Value] | None:
    """New inputs for producer `p` so that it computes p(x) * s + t, with s and t vectors over its
    output channels (dim 1); None when `p` cannot absorb them."""
    if p.attrs.get("activation", "none") != "none":
        return None
    ins = list(p.inputs)
    dt = p.outputs[0].dtype

    def scaled(v: Value, shape: tuple[int, ...]) -> Value:
        if _is_one(s):
            return v
        return add_weight(graph, v.name, (v.data.astype(np.float64) * s.reshape(shape)).astype(dt))

    if p.op == "Conv":
        w, b = const_data(ins[1]), const_data(ins[2])
        if w is None or b is None or (len(ins) > 3 and not _is_one(s)):
            return None  # a residual operand would be scaled too
        ins[1] = scaled(ins[1], (-1,) + (1,) * (w.ndim - 1))
        ins[2] = add_weight(graph, ins[2].name, (b * s + t).astype(dt))
        return ins
    if p.op == "FullyConnected":
        if const_data(ins[1]) is None or const_data(ins[2]) is None:
            return None
        ins[1] = scaled(ins[1], (1, -1))
        ins[2] = add_weight(graph, ins[2].name, (ins[2].data * s + t).astype(dt))
        return ins
    if p.op == "BatchNormalization":
        if const_data(ins[1]) is None or const_data(ins[2]) is None:
            return None
        ins[1] = scaled(ins[1], (-1,))
        ins[2] = add_weight(graph, ins[2].name, (ins[2].data * s + t).astype(dt))
        return ins
    if p.op == "Gemm":
        if const_data(ins[1]) is None or (len(ins) > 2 and const_data(ins[2]) is None):
            return None
        ins[1] = scaled(ins[1], (-1, 1) if p.attrs["transB"] else (1, -1))
        if len(ins) > 2:
            c = p.attrs["beta"] * ins[2].data.astype(np.float64) * s + t
            ins[2] = add_weight(graph, ins[2].name, c.astype(dt))
        elif not _is_zero(t):
            ins.append(add_weight(graph, p.name + ".bias", t.astype(dt)))
        return ins
    return None


def _fold_affine(graph: Graph, p: Node, s: np.ndarray, t: np.ndarray, replaces: Node) -> bool:
    ins = _scaled_inputs(graph, p, s, t)
    if ins is None:
        return False
    attrs = dict(p.attrs)
    if p.op == "Gemm":
        attrs["beta"] = 1.0
    rebuild(graph, p, inputs=ins, attrs=attrs, replaces=replaces)
    return True


def _bn_scale_shift(bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    params = [const_data(v) for v in bn.inputs[1:]]
    if any(p is None for p in params):
        return None
    return batchnorm_scale_shift(*params, bn.attrs["epsilon"])


def fold_batchnorm(graph: Graph) -> bool:
    """BatchNormalization(P(x)) -> P'(x) for P a Conv, Gemm or FullyConnected that only feeds the
    normalization: the per-channel scale s = gamma / sqrt(var + eps) multiplies P's weights along
    its output channels and the bias becomes (b - mean) * s + beta."""
    changed = False
    for bn in list(graph.nodes):
        if bn.op != "BatchNormalization":
            continue
        p = bn.inputs[0].producer
        if p is None or p.op not in AFFINE_TARGETS or sole_user(graph, p.outputs[0]) is not bn:
            continue
        st = _bn_scale_shift(bn)
        if st is not None and _fold_affine(graph, p, st[0], st[1], bn):
            changed = True
    if changed:
        graph.remove_unused_constants()
    return changed


def _channel_affine(node: Node) -> tuple[Value, np.ndarray, np.ndarray] | None:
    """(x, s, t) when `node` computes x * s + t with s, t per-channel constants over dim 1."""
    if node.op not in ("Mul", "Add", "Sub", "Div") or node.outputs[0].dtype not in FLOAT_TYPES:
        return None
    a, b = node.inputs
    if const_data(b) is None and node.op in ("Mul", "Add"):
        a, b = b, a
    c = const_data(b)
    if c is None or a.is_constant or a.shape != node.outputs[0].shape:
        return None
    vec = channel_vector(c, a.shape, axis=1)
    if vec is None:
        return None
    vec = vec.astype(np.float64)
    ones, zeros = np.ones_like(vec), np.zeros_like(vec)
    if node.op == "Mul":
        return a, vec, zeros
    if node.op == "Add":
        return a, ones, vec
    if node.op == "Sub":
        return a, ones, -vec
    if np.any(vec == 0):
        return None
    return a, 1.0 / vec, zeros


def fold_channel_affine(graph: Graph) -> bool:
    """Mul / Add / Sub / Div of a Conv, Gemm, FullyConnected or BatchNormalization output by a
    per-channel constant (densenet and inception_v2 scale and shift after BN with unsqueezed
    parameters) -> the producer with scaled weights and shifted bias."""
    changed = False
    for node in list(graph.nodes):
        found = _channel_affine(node)
        if found is None:
            continue
        x, s, t = found
        p = x.producer
        if p is None or p.op not in AFFINE_TARGETS or sole_user(graph, x) is not node:
            continue
        if _fold_affine(graph, p, s, t, node):
            changed = True
    if changed:
        graph.remove_unused_constants()
    return changed


def _fused_attrs(node: Node) -> dict[str, Any]:
    return {k: node.attrs[k] for k in FUSED}


def gemm_to_fully_connected(graph: Graph, backend: Backend | None = None) -> bool:
    """Gemm(A, B, C) with constant B and a per-column constant C (or none), not transposing A ->
    FullyConnected(A, alpha * op(B), beta * C), where the backend keeps FullyConnected."""
    changed = False
    for g in list(graph.nodes):
        if g.op != "Gemm" or g.attrs["transA"] or const_data(g.inputs[1]) is None:
            continue
        out = g.outputs[0]
        n = out.shape[1]
        if len(g.inputs) > 2:
            c = const_data(g.inputs[2])
            vec = channel_vector(c, out.shape, axis=1) if c is not None else None
            if vec is None:
                continue
            bias = (g.attrs["beta"] * vec.astype(np.float64)).astype(out.dtype)
        else:
            bias = np.zeros(n, out.dtype)
        b = g.inputs[1].data
        w = transposed(b) if g.attrs["transB"] else b
        if g.attrs["alpha"] != 1.0:
            w = (w.astype(np.float64) * g.attrs["alpha"]).astype(out.dtype)
        if not backend_keeps(backend, "FullyConnected", [g.inputs[0], w, bias], _fused_attrs(g)):
            continue
        w_val = g.inputs[1] if w is b else add_weight(graph, g.inputs[1].name, w)
        ins = [g.inputs[0], w_val, add_weight(graph, g.name + ".bias", bias)]
        rebuild(graph, g, op="FullyConnected", inputs=ins, attrs=_fused_attrs(g))
        changed = True
    if changed:
        graph.remove_unused_constants()
    return changed


def matmul_add_to_fully_connected(graph: Graph, backend: Backend | None = None) -> bool:
    """Add(MatMul(X, W), c) with X a matrix, W a constant matrix and c a per-column constant ->
    FullyConnected(X, W, c), where the backend keeps FullyConnected."""
    changed = False
    for add in list(graph.nodes):
        if add.op != "Add":
            continue
        for mm_out, c_val in (add.inputs, add.inputs[::-1]):
            mm = mm_out.producer
            if mm is None or mm.op != "MatMul" or mm.attrs["activation"] != "none":
                continue
            x, w = mm.inputs
            c = const_data(c_val)
            if x.type.rank != 2 or const_data(w) is None or w.type.rank != 2 or c is None:
                continue
            if sole_user(graph, mm_out) is not add or add.outputs[0].shape != mm_out.shape \
                    or mm_out.dtype not in FLOAT_TYPES:
                continue
            vec = channel_vector(c, mm_out.shape, axis=1)
            if vec is None:
                continue
            vec = np.ascontiguousarray(vec)
            if not backend_keeps(backend, "FullyConnected", [x, w, vec], {}):
                continue
            ins = [x, w, add_weight(graph, c_val.name, vec)]
            rebuild(graph, mm, op="FullyConnected", inputs=ins, attrs=dict(FUSED), replaces=add)
            changed = True
            break
    if changed:
        graph.remove_unused_constants()
    return changed
