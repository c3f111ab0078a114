"""Data-movement passes: merge consecutive reshapes, cancel and sink transposes."""

from __future__ import annotations

from glowpy.ir.graph import Graph, Node
from glowpy.optimizer.rewrite import (
    add_weight,
    rebuild,
    replace_node,
    root_name,
    sole_user,
    transposed,
)


def is_identity_perm(perm: tuple[int, ...]) -> bool:
    return tuple(perm) == tuple(range(len(perm)))


def inverse_perm(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _drop_if_unused(graph: Graph, node: Node) -> None:
    if not node.outputs[0].users and all(o is not node.outputs[0] for o in graph.outputs):
        graph.remove_node(node)


def merge_reshapes(graph: Graph) -> bool:
    """Reshape(Reshape(x)) -> Reshape(x): the outer reshape reads x directly; the inner one goes when
    nothing else uses it (a reshape to x's own shape is then removed by remove_noops)."""
    changed = False
    for node in list(graph.nodes):
        inner = node.inputs[0].producer if node.op == "Reshape" else None
        if inner is not None and inner.op == "Reshape":
            rebuild(graph, node, inputs=[inner.inputs[0]])
            _drop_if_unused(graph, inner)
            changed = True
    return changed


def cancel_transposes(graph: Graph) -> bool:
    """Transpose(Transpose(x, p), q) -> Transpose(x, p∘q); when p∘q is the identity the pair
    cancels (remove_noops drops the identity transpose)."""
    changed = False
    for node in list(graph.nodes):
        inner = node.inputs[0].producer if node.op == "Transpose" else None
        if inner is not None and inner.op == "Transpose":
            p, q = tuple(inner.attrs["perm"]), tuple(node.attrs["perm"])
            rebuild(graph, node, inputs=[inner.inputs[0]], attrs={"perm": tuple(p[i] for i in q)})
            _drop_if_unused(graph, inner)
            changed = True
    return changed


def _sink_one(graph: Graph, t: Node) -> bool:
    """Move Transpose `t` below its only user when that user is elementwise. The user's other
    operands must be the same transpose of something (read untransposed) or constants (transposed
    back at compile time)."""
    user = sole_user(graph, t.outputs[0])
    if user is None or not user.opdef.elementwise or len(user.outputs) != 1:
        return False
    perm = tuple(t.attrs["perm"])
    out_shape = user.outputs[0].shape
    if t.outputs[0].shape != out_shape:
        return False
    new_inputs = []
    moved = [t]
    for v in user.inputs:
        if v is t.outputs[0]:
            new_inputs.append(t.inputs[0])
        elif v.producer is not None and v.producer.op == "Transpose" and tuple(v.producer.attrs["perm"]) == perm \
                and v.shape == out_shape:
            new_inputs.append(v.producer.inputs[0])
            moved.append(v.producer)
        elif v.is_constant:
            full = v.data.reshape((1,) * (len(perm) - v.data.ndim) + v.data.shape)
            new_inputs.append(add_weight(graph, v.name, transposed(full, inverse_perm(perm))))
        else:
            return False
    inner = graph.add_node(user.op, new_inputs, dict(user.attrs), name=root_name(user.name), before=user)
    outer = graph.add_node("Transpose", inner.outputs, {"perm": perm}, name=root_name(t.name), after=inner)
    replace_node(graph, user, outer.outputs, adopt_names=True)
    for old in moved:  # gone now, unless another node still reads them (a paired transpose may)
        if old in graph.nodes:
            _drop_if_unused(graph, old)
    return True


def sink_transposes(graph: Graph) -> bool:
    """Move each Transpose below the elementwise op that is its only user (unary ops, binary ops
    whose other operand is the same transpose or a constant), so that it meets the next transpose
    or reshape; cancel_transposes then merges them. Transposes only move down, so this ends."""
    changed = False
    moved = True
    while moved:  # a moved transpose is a new node further down: sweep again until none moves
        moved = False
        for node in list(graph.nodes):
            if node.op == "Transpose" and node in graph.nodes and _sink_one(graph, node):
                moved = changed = True
    if changed:
        graph.remove_unused_constants()
    return changed


__all__ = ["cancel_transposes", "inverse_perm", "is_identity_perm", "merge_reshapes", "sink_transposes"]
