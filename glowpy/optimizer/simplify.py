"""Graph-cleaning passes: dead code, common subexpressions, constant folding, no-op removal."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from glowpy.errors import InternalError
from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.types import TensorType
from glowpy.optimizer.rewrite import (
    bypass,
    can_replace,
    const_data,
    is_graph_output,
    is_uniform_view,
    replace_node,
)


def eliminate_dead_code(graph: Graph) -> bool:
    """Remove nodes none of whose outputs is used or returned, and weights nothing uses."""
    changed = False
    for node in reversed(list(graph.nodes)):
        if not any(o.users or is_graph_output(graph, o) for o in node.outputs):
            graph.remove_node(node)
            changed = True
    return graph.remove_unused_constants() > 0 or changed


# --- common subexpressions -------------------------------------------------------------------------


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    return v


def _constant_key(a: np.ndarray) -> tuple:
    """Equal keys mean equal data (same dtype, shape and bytes). Uniform views compare by their one
    element, so the importer's filled weights never get materialized here."""
    if is_uniform_view(a):
        return (a.dtype.str, a.shape, "fill", a.reshape(-1)[:1].tobytes())
    digest = hashlib.blake2b(np.ascontiguousarray(a).view(np.uint8).reshape(-1), digest_size=20).digest()
    return (a.dtype.str, a.shape, "bytes", digest)


def merge_constants(graph: Graph) -> bool:
    """Constants with equal data (same type and bytes) become one; its users share it."""
    changed = False
    by_type: dict[object, list[Value]] = {}
    for v in graph.constants.values():
        by_type.setdefault(v.type, []).append(v)
    for group in by_type.values():
        if len(group) < 2:
            continue  # only constants of the same type can be equal: hash nothing else
        seen: dict[tuple, Value] = {}
        for v in group:
            first = seen.setdefault(_constant_key(v.data), v)
            if first is not v and v.users and not is_graph_output(graph, v):
                graph.replace_all_uses(v, first)
                changed = True
    if changed:
        graph.remove_unused_constants()
    return changed


def eliminate_common_subexpressions(graph: Graph) -> bool:
    """Nodes with the same op, attributes and inputs compute the same values: the later one's uses
    move to the earlier one (which comes first in topological order, so it dominates them)."""
    changed = False
    seen: dict[tuple, Node] = {}
    for node in list(graph.nodes):
        key = (node.op, _hashable(node.attrs), tuple(id(v) for v in node.inputs))
        first = seen.setdefault(key, node)
        if first is node:
            continue
        if all(can_replace(graph, o, f) for o, f in zip(node.outputs, first.outputs)):
            replace_node(graph, node, first.outputs)
            changed = True
    return changed


# --- constant folding ------------------------------------------------------------------------------

# A folded result may always be this big; beyond it, only as big as the operands together.
FOLD_ALWAYS_ELEMENTS = 1 << 16


def _fold_allowed(node: Node) -> bool:
    out = sum(o.type.size for o in node.outputs)
    return out <= max(FOLD_ALWAYS_ELEMENTS, sum(v.type.size for v in node.inputs))


def fold_constants(graph: Graph) -> bool:
    """Evaluate nodes whose inputs are all constants with the op's reference semantics and use the
    result as a new constant (Reshape/Transpose/Cast of weights, arithmetic on weights, ...).

    A node is not folded when its result would be much bigger than its operands (Expand of a
    scalar, Pad, Tile-like broadcasts): the weight would be stored and read from memory at every
    run, where the node computes it from a few bytes; results up to FOLD_ALWAYS_ELEMENTS are folded
    regardless. Graph outputs are not folded (an output stays a node value for backends).
    """
    changed = False
    for node in list(graph.nodes):
        if not node.inputs or not all(v.is_constant for v in node.inputs):
            continue
        if any(is_graph_output(graph, o) for o in node.outputs) or not _fold_allowed(node):
            continue
        results = node.opdef.run(node.attrs, [v.data for v in node.inputs])
        values = []
        for out, res in zip(node.outputs, results):
            res = np.asarray(res)
            if TensorType.of(res) != out.type:
                raise InternalError("reference semantics disagree with type inference", node=node.name,
                                    op=node.op, expected=str(out.type), found=str(TensorType.of(res)))
            values.append(graph.add_constant(out.name + ".folded", res, unique=True))
        replace_node(graph, node, values)
        changed = True
    if changed:
        graph.remove_unused_constants()
    return changed


# --- no-op removal ---------------------------------------------------------------------------------


def _is_constant_fill(v: Value, fill: float) -> bool:
    a = const_data(v)
    if a is None or a.size == 0:
        return False
    if is_uniform_view(a):
        return bool(a.reshape(-1)[0] == fill)
    return bool(np.all(a == fill))


def _noop_input(graph: Graph, node: Node) -> Value | None:
    """The input `node` passes through unchanged, if it is a no-op."""
    x = node.inputs[0] if node.inputs else None
    out = node.outputs[0] if len(node.outputs) == 1 else None
    if x is None or out is None:
        return None
    same_type = x.type == out.type
    op, a = node.op, node.attrs
    if op in ("Identity", "Dropout"):
        return x
    if op in ("Reshape", "Expand") and same_type:
        return x
    if op == "Transpose" and tuple(a["perm"]) == tuple(range(x.type.rank)):
        return x
    if op == "Cast" and same_type:
        return x
    if op == "Pad" and not any(a["pads"]):
        return x
    if op == "Slice" and same_type and all(s == 1 for s in a["steps"]):
        return x  # step-1 slices keep the length only when they start at 0 and end at the dim
    if op == "Concat" and len(node.inputs) == 1:
        return x
    if op in ("Add", "Sub", "Mul", "Div") and x.type == out.type:
        unit = 0.0 if op in ("Add", "Sub") else 1.0
        if _is_constant_fill(node.inputs[1], unit):
            return x
    if op in ("Add", "Mul") and node.inputs[1].type == out.type:
        unit = 0.0 if op == "Add" else 1.0
        if _is_constant_fill(node.inputs[0], unit):
            return node.inputs[1]
    return None


def remove_noops(graph: Graph) -> bool:
    """Remove nodes that return their input unchanged: Identity, inference Dropout, Reshape /
    Expand to the same shape, identity-perm Transpose, Cast to the same type, Pad by zeros, Slice
    of everything, one-input Concat, x + 0, x - 0, x * 1, x / 1."""
    changed = False
    for node in list(graph.nodes):
        x = _noop_input(graph, node)
        if x is not None and bypass(graph, node, x):
            changed = True
    return changed
