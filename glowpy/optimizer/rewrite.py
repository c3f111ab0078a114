"""Small helpers every pass uses to read and rewrite the graph through the Graph API.

Rules kept here so each pass does not restate them:
- a graph output keeps its name (callers look outputs up by name), so a value that is a graph
  output can only be replaced by a node value that is not already an output, which then takes
  over the name;
- constants are never changed in place (they may be shared, or read-only views): a pass makes a
  new constant;
- a replacement node is inserted where the node it replaces stood, so the order stays topological.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from glowpy.ir.graph import Graph, Node, Value

# Producers that can carry a fused activation epilogue (see glowpy.ir.ops.nn).
ACTIVATION_CARRIERS = ("Conv", "Gemm", "MatMul", "FullyConnected")


def root_name(name: str) -> str:
    """`name` without the `.N` suffixes Graph.unique_name adds, so that a node or weight rewritten
    several times is called `conv1.57`, not `conv1.3.12.57`."""
    return re.sub(r"(\.\d+)+$", "", name) or name


def is_graph_output(graph: Graph, v: Value) -> bool:
    return any(o is v for o in graph.outputs)


def sole_user(graph: Graph, v: Value) -> Node | None:
    """The node that uses `v`, when that is its only use and `v` is not a graph output."""
    if len(v.users) == 1 and not is_graph_output(graph, v):
        return v.users[0]
    return None


def can_replace(graph: Graph, old: Value, new: Value) -> bool:
    """Whether every use of `old` may move to `new` (graph outputs keep their names and stay
    node values, so backends never see an output that is an input or a weight)."""
    if not is_graph_output(graph, old):
        return True
    return new.kind == "node" and not is_graph_output(graph, new)


def const_data(v: Value) -> np.ndarray | None:
    return v.data if v.is_constant else None


def index_of(graph: Graph, node: Node) -> int:
    """The position of `node` (O(n)); to order two nodes use `graph.nodes.comes_before` (O(1))."""
    return graph.nodes.index(node)


def replace_node(graph: Graph, node: Node, new_values: Sequence[Value], *, adopt_names: bool = False) -> None:
    """Point the uses of each output of `node` at the matching new value, then remove `node`.

    With `adopt_names` (the new values were just built for this), each new value takes the name of
    the value it replaces, so dumps stay readable; otherwise only graph outputs pass on their name.
    """
    renames: list[tuple[Value, str]] = []
    for old, new in zip(node.outputs, new_values):
        if adopt_names or is_graph_output(graph, old):
            renames.append((new, old.name))
        graph.replace_all_uses(old, new)
    graph.remove_node(node)
    for new, name in renames:
        graph.rename_value(new, name)


def bypass(graph: Graph, node: Node, value: Value) -> bool:
    """Remove a one-output node whose result equals `value`. False when a graph output forbids it."""
    if not can_replace(graph, node.outputs[0], value):
        return False
    replace_node(graph, node, [value])
    return True


def rebuild(
    graph: Graph,
    node: Node,
    *,
    op: str | None = None,
    inputs: Sequence[Value] | None = None,
    attrs: dict[str, Any] | None = None,
    replaces: Node | None = None,
) -> Node:
    """A copy of `node` (optionally with another op, inputs or attrs) inserted where `node` stands.

    The copy takes over the uses (and names) of `replaces`' outputs (default: `node` itself);
    `replaces` is removed, and `node` too when nothing uses it any more.
    """
    target = replaces or node
    old_weights = [v for n in (node, target) for v in n.inputs if v.is_constant]
    new = graph.add_node(op or node.op, list(node.inputs if inputs is None else inputs),
                         dict(node.attrs if attrs is None else attrs), name=root_name(node.name),
                         before=node)
    replace_node(graph, target, new.outputs, adopt_names=True)
    if target is not node and not any(o.users or is_graph_output(graph, o) for o in node.outputs):
        graph.remove_node(node)
    # Weights the copy replaced go now, not at the end of the pass: folding every BatchNorm of a
    # model would otherwise hold old and new weights at once (a second copy of the model at peak).
    graph.remove_unused_constants(among=old_weights)
    return new


def add_weight(graph: Graph, base: str, data: np.ndarray) -> Value:
    """A new constant named after `base` (made unique)."""
    return graph.add_constant(root_name(base), np.asarray(data), unique=True)


def is_uniform_view(a: np.ndarray) -> bool:
    """A broadcast view of one element (how the importer keeps ConstantOfShape weights)."""
    return a.size > 0 and all(s == 0 for s in a.strides)


def transposed(a: np.ndarray, perm: Sequence[int] | None = None) -> np.ndarray:
    """`a` transposed, contiguous; a uniform view stays a (cheap) uniform view."""
    t = np.transpose(a, perm)
    if is_uniform_view(a):
        return np.broadcast_to(a.reshape(-1)[:1].reshape(()), t.shape)
    return np.ascontiguousarray(t)


def channel_vector(c: np.ndarray, out_shape: tuple[int, ...], axis: int = 1) -> np.ndarray | None:
    """`c` as a vector over dim `axis` of `out_shape` when `c` broadcasts against that shape only
    along that dim (a per-channel constant, or a scalar); None otherwise."""
    rank = len(out_shape)
    if c.ndim > rank or axis >= rank:
        return None
    full = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(full) if i != axis) or full[axis] not in (1, out_shape[axis]):
        return None
    return np.broadcast_to(c.reshape(-1), (out_shape[axis],)) if c.size == 1 else c.reshape(-1)
