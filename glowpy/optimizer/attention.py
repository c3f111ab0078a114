"""Transformer patterns: GELU written out as erf / tanh arithmetic becomes the Gelu activation, a
batched MatMul by a constant matrix plus a per-column bias becomes one FullyConnected (between Reshapes),
so the bias and the activation run in the matrix product's epilogue, and scaled, masked softmax
attention becomes one Attention op."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from glowpy.errors import GlowpyError
from glowpy.ir import activations
from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops.nn import FUSED
from glowpy.ir.ops.registry import get_op
from glowpy.ir.types import FLOAT_TYPES, TensorType
from glowpy.optimizer.fold import backend_keeps
from glowpy.optimizer.rewrite import (
    add_weight,
    channel_vector,
    const_data,
    is_graph_output,
    replace_node,
    root_name,
    sole_user,
)
from glowpy.optimizer.simplify import eliminate_dead_code

if TYPE_CHECKING:
    from glowpy.backends.base import Backend


def _scalar(v: Value) -> float | None:
    c = const_data(v)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _is(v: Value, want: float) -> bool:
    s = _scalar(v)
    return s is not None and math.isclose(s, want, rel_tol=1e-5)


def _other(node: Node, v: Value) -> Value | None:
    """The operand of binary `node` that is not `v` (None when `v` is not one of them)."""
    a, b = node.inputs
    return b if a is v else a if b is v else None


def _user(graph: Graph, v: Value, op: str) -> Node | None:
    u = sole_user(graph, v)
    return u if u is not None and u.op == op and len(u.inputs) == 2 else None


def _erf_arg(graph: Graph, erf: Node) -> Value | None:
    """x when erf reads x / sqrt(2) (Div by sqrt 2 or Mul by 1 / sqrt 2)."""
    u = erf.inputs[0].producer
    if u is None or sole_user(graph, erf.inputs[0]) is not erf:
        return None
    if u.op == "Div" and _is(u.inputs[1], math.sqrt(2.0)):
        return u.inputs[0]
    if u.op == "Mul":
        for x, c in (u.inputs, u.inputs[::-1]):
            if _is(c, 1.0 / math.sqrt(2.0)):
                return x
    return None


def _tanh_arg(graph: Graph, tanh: Node) -> Value | None:
    """x when tanh reads sqrt(2 / pi) * (x + 0.044715 * x^3), x^3 as Pow(x, 3) or x * x * x."""
    u = tanh.inputs[0].producer
    if u is None or u.op != "Mul" or sole_user(graph, tanh.inputs[0]) is not tanh:
        return None
    inner = next((x for x, c in (u.inputs, u.inputs[::-1]) if _is(c, math.sqrt(2.0 / math.pi))), None)
    add = inner.producer if inner is not None else None
    if add is None or add.op != "Add" or sole_user(graph, inner) is not u:
        return None
    for x, t in (add.inputs, add.inputs[::-1]):
        m = t.producer
        if m is None or m.op != "Mul":
            continue
        cube = next((y for y, c in (m.inputs, m.inputs[::-1]) if _is(c, 0.044715)), None)
        p = cube.producer if cube is not None else None
        if p is None:
            continue
        if p.op == "Pow" and p.inputs[0] is x and _is(p.inputs[1], 3.0):
            return x
        if p.op == "Mul":
            sq = _other(p, x)
            q = sq.producer if sq is not None else None
            if q is not None and q.op == "Mul" and q.inputs[0] is x and q.inputs[1] is x:
                return x
    return None


def _gelu_tail(graph: Graph, t: Value, x: Value) -> Node | None:
    """The node computing 0.5 * x * (1 + t) (the product in any association), or None."""
    s_node = _user(graph, t, "Add")
    if s_node is None or not _is(_other(s_node, t), 1.0):
        return None
    s = s_node.outputs[0]
    m1 = _user(graph, s, "Mul")
    if m1 is None:
        return None
    o = _other(m1, s)
    if _is(o, 0.5) or o is x:  # (0.5 * s) * x, or (x * s) * 0.5
        m2 = _user(graph, m1.outputs[0], "Mul")
        want_last = x if _is(o, 0.5) else None
        if m2 is None:
            return None
        last = _other(m2, m1.outputs[0])
        return m2 if (last is want_last if want_last is not None else _is(last, 0.5)) else None
    h = o.producer  # (0.5 * x) * s
    if h is not None and h.op == "Mul" and sole_user(graph, o) is m1 and x in h.inputs and _is(_other(h, x), 0.5):
        return m1
    return None


def fuse_gelu(graph: Graph, backend: Backend | None = None) -> bool:
    """0.5 * x * (1 + erf(x / sqrt 2)) -> Gelu(x), and 0.5 * x * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    -> Gelu(x, approximate="tanh"), for float x, where the backend runs Gelu."""
    changed = False
    for node in list(graph.nodes):
        if node.op not in ("Erf", "Tanh"):
            continue
        x = _erf_arg(graph, node) if node.op == "Erf" else _tanh_arg(graph, node)
        if x is None or x.dtype not in FLOAT_TYPES:
            continue
        tail = _gelu_tail(graph, node.outputs[0], x)
        if tail is None or tail.outputs[0].type != x.type:
            continue
        attrs = {"approximate": "none" if node.op == "Erf" else "tanh"}
        if not backend_keeps(backend, "Gelu", [x], attrs):
            continue
        gelu = graph.add_node("Gelu", [x], attrs, name=root_name(tail.name), before=tail)
        replace_node(graph, tail, gelu.outputs, adopt_names=True)
        changed = True
    if changed:  # the erf / tanh arithmetic left behind still reads x: gone before fusion asks for users
        eliminate_dead_code(graph)
    return changed


def matmul_nd_add_to_fully_connected(graph: Graph, backend: Backend | None = None) -> bool:
    """Add(MatMul(X[..., K], W), c) with X of rank 3 or more, W a constant (K, N) matrix and c a constant
    per-column vector -> Reshape(FullyConnected(Reshape(X, (-1, K)), W, c)): the bias becomes the
    product's epilogue (rank-2 X: matmul_add_to_fully_connected)."""
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
            if x.type.rank < 3 or const_data(w) is None or w.type.rank != 2 or c is None:
                continue
            if sole_user(graph, mm_out) is not add or add.outputs[0].shape != mm_out.shape \
                    or mm_out.dtype not in FLOAT_TYPES:
                continue
            vec = channel_vector(c, mm_out.shape, axis=mm_out.type.rank - 1)
            if vec is None:
                continue
            vec = np.ascontiguousarray(vec)
            rows = (math.prod(x.shape[:-1]), x.shape[-1])
            probe = Value("probe.x", TensorType(x.dtype, rows), "input")
            if not backend_keeps(backend, "FullyConnected", [probe, w, vec], {}):
                continue
            base = root_name(mm.name)
            x2 = graph.add_node("Reshape", [x], {"shape": list(rows)}, name=f"{base}.rows", before=mm)
            fc = graph.add_node("FullyConnected", [x2.outputs[0], w, add_weight(graph, c_val.name, vec)],
                                dict(FUSED), name=base, before=mm)
            back = graph.add_node("Reshape", [fc.outputs[0]], {"shape": list(mm_out.shape)}, name=f"{base}.out",
                                  before=mm)
            replace_node(graph, add, back.outputs, adopt_names=True)
            graph.remove_node(mm)
            changed = True
            break
    if changed:
        graph.remove_unused_constants()
    return changed


def sink_reshape_below_activation(graph: Graph, backend: Backend | None = None) -> bool:
    """Act(Reshape(y)) -> Reshape(Act(y)) for an activation node (ir/activations.py) that is the
    Reshape's only user and y a matrix product's output that only feeds the Reshape, so the activation
    can join the product's epilogue (fuse_activation)."""
    changed = False
    for act in list(graph.nodes):
        if activations.of_node(act.op, act.attrs) is None or len(act.inputs) != 1:
            continue
        r = act.inputs[0].producer
        if r is None or r.op != "Reshape" or sole_user(graph, r.outputs[0]) is not act:
            continue
        y = r.inputs[0]
        p = y.producer
        if p is None or p.op not in ("FullyConnected", "MatMul", "Gemm") or sole_user(graph, y) is not r:
            continue
        if p.attrs["activation"] != activations.NONE:
            continue
        moved = graph.add_node(act.op, [y], dict(act.attrs), name=root_name(act.name), before=r)
        back = graph.add_node("Reshape", [moved.outputs[0]], dict(r.attrs), name=root_name(r.name), before=act)
        replace_node(graph, act, back.outputs, adopt_names=True)
        graph.remove_node(r)
        changed = True
    return changed


def _nan_guard(graph: Graph, p: Value) -> Node | None:
    """The Where(IsNaN(p), 0, p) that exporters put after a masked softmax, when p has no other user."""
    if len(p.users) != 2 or is_graph_output(graph, p):
        return None
    isnan = next((u for u in p.users if u.op == "IsNaN"), None)
    where = next((u for u in p.users if u.op == "Where"), None)
    if isnan is None or where is None or sole_user(graph, isnan.outputs[0]) is not where:
        return None
    cond, zero, same = where.inputs
    if cond is not isnan.outputs[0] or same is not p or not _is(zero, 0.0) or where.outputs[0].type != p.type:
        return None
    return where


def _scores(graph: Graph, x: Value) -> tuple[Node, float, Value | None, list[Node]] | None:
    """(MatMul(Q, KT), scale, mask, the nodes between) when the softmax input x is
    MatMul(Q, KT) [* c or / c] [+ mask], each step the only user of the one before."""
    between: list[Node] = []
    mask = None
    p = x.producer
    if p is not None and p.op == "Add" and len(p.inputs) == 2:
        for s_val, m_val in (p.inputs, p.inputs[::-1]):
            q = s_val.producer
            if q is not None and q.op in ("MatMul", "Mul", "Div") and sole_user(graph, s_val) is p \
                    and s_val.shape == x.shape and m_val.dtype == x.dtype:
                between.append(p)
                mask, x, p = m_val, s_val, q
                break
        else:
            return None
    scale = 1.0
    if p is not None and p.op in ("Mul", "Div") and len(p.inputs) == 2:
        pairs = [p.inputs] if p.op == "Div" else [p.inputs, p.inputs[::-1]]
        found = next(((s_val, c) for s_val, c in pairs if _scalar(c) is not None and s_val.producer is not None
                      and s_val.producer.op == "MatMul" and sole_user(graph, s_val) is p
                      and s_val.shape == x.shape), None)
        if found is None:
            return None
        c = _scalar(found[1])
        if c == 0.0:
            return None
        scale = 1.0 / c if p.op == "Div" else c
        between.append(p)
        x, p = found[0], found[0].producer
    if p is None or p.op != "MatMul" or p.attrs["activation"] != activations.NONE:
        return None
    return p, scale, mask, between


def fuse_attention(graph: Graph, backend: Backend | None = None) -> bool:
    """MatMul(Softmax(MatMul(Q, KT) [* or / scalar] [+ mask], last axis) [-> Where(IsNaN(p), 0, p)], V)
    -> Attention(Q, KT, V [, mask]), float32, where the backend keeps Attention: the scores and
    probabilities are not materialized (the exporters' Transpose / Reshape forms of K end in KT, which
    the fused op reads as it is). A divisor c becomes the scale 1 / c. Every intermediate must have the
    chain's next node as its only user."""
    changed = False
    for sm in list(graph.nodes):
        if sm.op != "Softmax" or sm.inputs[0].dtype != np.float32 or sm.inputs[0].type.rank < 2:
            continue
        x = sm.inputs[0]
        if sm.attrs["axis"] % x.type.rank != x.type.rank - 1 or sole_user(graph, x) is not sm:
            continue
        p = sm.outputs[0]
        guard = _nan_guard(graph, p)
        probs = guard.outputs[0] if guard is not None else p
        pv = sole_user(graph, probs) if guard is not None or len(p.users) == 1 else None
        if pv is None or pv.op != "MatMul" or pv.inputs[0] is not probs or pv.inputs[1] is probs \
                or pv.attrs["activation"] != activations.NONE:
            continue
        found = _scores(graph, x)
        if found is None:
            continue
        qk, scale, mask, between = found
        q, kt = qk.inputs
        v = pv.inputs[1]
        if min(q.type.rank, kt.type.rank, v.type.rank) < 2 or sole_user(graph, qk.outputs[0]) is None:
            continue
        ins = [q, kt, v] + ([mask] if mask is not None else [])
        attrs = {"scale": scale, "nan_to_zero": int(guard is not None)}
        opdef = get_op("Attention")
        try:
            fused = opdef.infer_types(opdef.make_attrs(attrs), [t.type for t in ins])[0]
            keeps = backend_keeps(backend, "Attention", ins, attrs)
        except GlowpyError:  # operands the op does not take (shapes or types)
            continue
        if not keeps or fused != pv.outputs[0].type:
            continue
        att = graph.add_node("Attention", ins, attrs, name=root_name(pv.name), before=pv)
        replace_node(graph, pv, att.outputs, adopt_names=True)
        guards = [guard, guard.inputs[0].producer] if guard is not None else []
        for n in [*guards, sm, *between, qk]:
            graph.remove_node(n)
        changed = True
    if changed:
        graph.remove_unused_constants()
    return changed
