"""The node-level IR: values, nodes and graphs.

A `Graph` holds placeholders (`inputs`), weights (`constants`, numpy arrays kept by reference),
`nodes` in topological order and `outputs`. Every `Value` has a static `TensorType`, knows the node
that produces it (None for placeholders and constants) and the nodes that use it. Passes rewrite a
graph through the small mutation API here (`add_node`, `replace_all_uses`, `remove_node`, ...),
which keeps use lists right; `verify()` re-derives everything and raises on any inconsistency.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx
import numpy as np

from glowpy.errors import GlowpyError, InternalError, InvalidModel, MismatchingDatatype, MismatchingShape
from glowpy.ir.ops import OPS, get_op
from glowpy.ir.ops.registry import OpDef
from glowpy.ir.types import TensorType, dtype_name


class Value:
    """An SSA value: a placeholder, a constant, or the output of a node."""

    __slots__ = ("name", "type", "producer", "data", "users", "kind")

    def __init__(self, name: str, type: TensorType, kind: str, producer: Node | None = None,
                 data: np.ndarray | None = None) -> None:
        self.name = name
        self.type = type
        self.kind = kind  # "input" | "constant" | "node"
        self.producer = producer
        self.data = data
        self.users: list[Node] = []  # one entry per use, so a node using it twice appears twice

    @property
    def is_constant(self) -> bool:
        return self.kind == "constant"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> np.dtype:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Node:
    """One op application. `attrs` is complete (defaults filled in from the op declaration)."""

    __slots__ = ("op", "name", "inputs", "outputs", "attrs")

    def __init__(self, op: str, name: str, inputs: list[Value], outputs: list[Value], attrs: dict[str, Any]) -> None:
        self.op = op
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.attrs = attrs

    @property
    def opdef(self) -> OpDef:
        return get_op(self.op)

    @property
    def users(self) -> list[Node]:
        """Distinct nodes that consume any output of this node."""
        seen: dict[int, Node] = {}
        for out in self.outputs:
            for u in out.users:
                seen.setdefault(id(u), u)
        return list(seen.values())

    def set_input(self, index: int, value: Value) -> None:
        old = self.inputs[index]
        old.users.remove(self)
        self.inputs[index] = value
        value.users.append(self)

    def __repr__(self) -> str:
        return f"<Node {self.name}: {self.op}>"


def _fmt_attr(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_fmt_attr(x) for x in v) + "]"
    if isinstance(v, np.dtype):
        return dtype_name(v)
    if isinstance(v, str):
        return repr(v)
    return str(v)


class Graph:
    """A typed dataflow graph with static shapes."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.constants: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.outputs: list[Value] = []
        self._names: set[str] = set()  # value names
        self._node_names: set[str] = set()
        self._counter = 0

    # --- construction -------------------------------------------------------------------------

    def unique_name(self, base: str) -> str:
        """A name free in both the value and the node namespace."""
        base = base or "v"
        name = base
        while name in self._names or name in self._node_names:
            self._counter += 1
            name = f"{base}.{self._counter}"
        return name

    def has_name(self, name: str) -> bool:
        return name in self._names or name in self._node_names

    def rename_value(self, v: Value, new: str) -> None:
        self._names.discard(v.name)
        v.name = self._claim(new)

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise InvalidModel(f"duplicate name '{name}'", expected="unique value names", found=name)
        self._names.add(name)
        return name

    def add_input(self, name: str, type: TensorType) -> Value:
        v = Value(self._claim(name), type, "input")
        self.inputs.append(v)
        return v

    def add_constant(self, name: str, data: np.ndarray, *, unique: bool = False) -> Value:
        """A weight. The array is kept by reference (callers pass read-only views when sharing)."""
        data = np.asarray(data)
        v = Value(self._claim(self.unique_name(name) if unique else name), TensorType.of(data), "constant",
                  data=data)
        self.constants[v.name] = v
        return v

    def add_node(
        self,
        op: str,
        inputs: Sequence[Value],
        attrs: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        output_names: Sequence[str] | None = None,
        index: int | None = None,
    ) -> Node:
        """Create a node, infer its output types, and insert it (at the end, or at `index`)."""
        opdef = get_op(op)
        name = self.unique_name(name or op.lower())
        self._node_names.add(name)
        full = opdef.make_attrs(dict(attrs or {}), node=name)
        try:
            types = opdef.infer_types(full, [v.type for v in inputs], node=name)
        except GlowpyError as e:
            raise e.at(node=name, op=op)
        if output_names is None:
            output_names = [name] if len(types) == 1 else [f"{name}:{i}" for i in range(len(types))]
        if len(output_names) != len(types):
            raise InternalError("output name count differs from inferred outputs", node=name, op=op,
                                expected=len(types), found=len(output_names))
        node = Node(op, name, list(inputs), [], full)
        node.outputs = [Value(self._claim(n), t, "node", producer=node) for n, t in zip(output_names, types)]
        for v in inputs:
            v.users.append(node)
        if index is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(index, node)
        return node

    # --- rewriting ----------------------------------------------------------------------------

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Point every use of `old` (node inputs and graph outputs) at `new`."""
        if old is new:
            return
        for user in list(old.users):
            for i, v in enumerate(user.inputs):
                if v is old:
                    user.set_input(i, new)
        self.outputs = [new if v is old else v for v in self.outputs]

    def remove_node(self, node: Node) -> None:
        """Remove a node whose outputs are unused."""
        for out in node.outputs:
            if out.users or any(o is out for o in self.outputs):
                raise InternalError("removing a node whose output is still used", node=node.name, op=node.op)
        for v in node.inputs:
            v.users.remove(node)
        self.nodes.remove(node)
        for out in node.outputs:
            self._names.discard(out.name)
        self._node_names.discard(node.name)
        # Break the node <-> output cycle and drop the operand references, so a removed node frees
        # its weights at once instead of waiting for the cyclic collector (which a rewrite of every
        # layer would otherwise outpace: old and new weights of a whole model alive together).
        node.inputs = []
        for out in node.outputs:
            out.producer = None

    def remove_unused_constants(self, among: Iterable[Value] | None = None) -> int:
        """Drop constants nothing uses (all of them, or only those in `among`); returns how many."""
        candidates = self.constants.values() if among is None else [v for v in among if v.is_constant]
        dead = list(dict.fromkeys(v.name for v in candidates if not v.users and self.constants.get(v.name) is v
                                  and all(o is not v for o in self.outputs)))
        for n in dead:
            del self.constants[n]
            self._names.discard(n)
        return len(dead)

    # --- queries ------------------------------------------------------------------------------

    def values(self) -> Iterable[Value]:
        yield from self.inputs
        yield from self.constants.values()
        for n in self.nodes:
            yield from n.outputs

    def to_networkx(self) -> nx.MultiDiGraph:
        g = nx.MultiDiGraph()
        for n in self.nodes:
            g.add_node(n.name)
        for n in self.nodes:
            for v in n.inputs:
                if v.producer is not None:
                    g.add_edge(v.producer.name, n.name)
        return g

    def toposort(self) -> None:
        """Reorder `nodes` topologically (stable: keeps the current order where it is valid)."""
        order = {n.name: i for i, n in enumerate(self.nodes)}
        g = self.to_networkx()
        try:
            names = list(nx.lexicographical_topological_sort(g, key=lambda x: order[x]))
        except nx.NetworkXUnfeasible:
            cycle = [e[0] for e in nx.find_cycle(g)]
            raise InvalidModel("the graph has a cycle", node=cycle[0], expected="acyclic graph",
                               found=" -> ".join(cycle + cycle[:1])) from None
        by_name = {n.name: n for n in self.nodes}
        self.nodes = [by_name[x] for x in names]

    def count_ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def num_parameters(self) -> int:
        return sum(v.type.size for v in self.constants.values())

    # --- checking -----------------------------------------------------------------------------

    def verify(self) -> None:
        """Check use-def links, types, order, names. Raises InvalidModel/Mismatching*/InternalError."""
        defined: set[int] = {id(v) for v in self.inputs} | {id(v) for v in self.constants.values()}
        names: set[str] = set()
        uses: dict[int, int] = {}

        def claim(name: str, what: str, node: Node | None = None) -> None:
            if name in names:
                raise InvalidModel(f"duplicate {what} name '{name}'", node=node.name if node else None,
                                   op=node.op if node else None)
            names.add(name)

        for v in self.inputs:
            claim(v.name, "value")
            if v.kind != "input":
                raise InternalError(f"placeholder '{v.name}' has kind {v.kind}")
        for key, v in self.constants.items():
            claim(v.name, "value")
            if key != v.name or v.kind != "constant" or v.data is None:
                raise InternalError(f"constant '{key}' is malformed")
            if TensorType.of(v.data) != v.type:
                raise MismatchingShape(f"constant '{v.name}' data does not match its type", expected=str(v.type),
                                       found=str(TensorType.of(v.data)))
        node_names: set[str] = set()
        order = {id(n): i for i, n in enumerate(self.nodes)}
        for idx, node in enumerate(self.nodes):
            if node.name in node_names:
                raise InvalidModel(f"duplicate node name '{node.name}'", node=node.name, op=node.op)
            node_names.add(node.name)
            if node.op not in OPS:
                raise InternalError("unknown IR op", node=node.name, op=node.op)
            for v in node.inputs:
                if id(v) not in defined:
                    if v.producer is not None and id(v.producer) in order and order[id(v.producer)] >= idx:
                        self._raise_cycle_or_order(node, v)
                    raise InvalidModel(f"input '{v.name}' is not defined before use", node=node.name, op=node.op)
                uses[id(v)] = uses.get(id(v), 0) + 1
            opdef = node.opdef
            try:
                types = opdef.infer_types(node.attrs, [v.type for v in node.inputs], node=node.name)
            except GlowpyError as e:
                raise e.at(node=node.name, op=node.op)
            if len(types) != len(node.outputs):
                raise InternalError("output count differs from inference", node=node.name, op=node.op,
                                    expected=len(types), found=len(node.outputs))
            for t, out in zip(types, node.outputs):
                if out.producer is not node or out.kind != "node":
                    raise InternalError(f"output '{out.name}' does not point back to its node", node=node.name,
                                        op=node.op)
                if t.dtype != out.type.dtype:
                    raise MismatchingDatatype(f"output '{out.name}' type disagrees with inference", node=node.name,
                                              op=node.op, expected=str(t), found=str(out.type))
                if t.shape != out.type.shape:
                    raise MismatchingShape(f"output '{out.name}' shape disagrees with inference", node=node.name,
                                           op=node.op, expected=str(t), found=str(out.type))
                claim(out.name, "value", node)
                defined.add(id(out))
        for v in self.outputs:
            if id(v) not in defined:
                raise InvalidModel(f"graph output '{v.name}' is not defined")
        for v in self.values():
            if len(v.users) != uses.get(id(v), 0):
                raise InternalError(f"use list of '{v.name}' is stale", expected=uses.get(id(v), 0),
                                    found=len(v.users))

    def _raise_cycle_or_order(self, node: Node, v: Value) -> None:
        g = self.to_networkx()
        if not nx.is_directed_acyclic_graph(g):
            cycle = [e[0] for e in nx.find_cycle(g)]
            raise InvalidModel("the graph has a cycle", node=cycle[0], expected="acyclic graph",
                               found=" -> ".join(cycle + cycle[:1]))
        raise InvalidModel(f"input '{v.name}' is used before the node that produces it", node=node.name, op=node.op)

    # --- printing -----------------------------------------------------------------------------

    def __str__(self) -> str:
        lines = [f"graph {self.name}("]
        lines += [f"    %{v.name}: {v.type}," for v in self.inputs]
        lines.append(") {")
        for v in self.constants.values():
            lines.append(f"  %{v.name}: {v.type} = constant")
        for n in self.nodes:
            outs = ", ".join(f"%{o.name}: {o.type}" for o in n.outputs)
            args = ", ".join(f"%{v.name}" for v in n.inputs)
            attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in n.attrs.items()
                              if not (k in ("activation", "activation_params") and v in ("none", ())))
            attrs = f" {{{attrs}}}" if attrs else ""
            tag = f"  # {n.name}" if n.name != n.outputs[0].name else ""
            lines.append(f"  {outs} = {n.op}({args}){attrs}{tag}")
        lines.append("  return " + ", ".join(f"%{v.name}" for v in self.outputs))
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.constants)} constants, "
                f"{len(self.nodes)} nodes, {len(self.outputs)} outputs>")
