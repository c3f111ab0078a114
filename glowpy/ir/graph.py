"""The node-level IR: values, nodes and graphs.

A `Graph` holds placeholders (`inputs`), weights (`constants`, numpy arrays kept by reference),
`nodes` in topological order (a `NodeList`: O(1) insertion and removal anywhere, O(1) amortised
order comparison) and `outputs`. Every `Value` has a static `TensorType`, knows the node
that produces it (None for placeholders and constants) and the nodes that use it. Passes rewrite a
graph through the small mutation API here (`add_node`, `replace_all_uses`, `remove_node`, ...),
which keeps use lists right; `verify()` re-derives everything and raises on any inconsistency.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from glowpy.errors import GlowpyError, InternalError, InvalidModel, MismatchingDatatype, MismatchingShape
from glowpy.ir.ops import OPS, get_op
from glowpy.ir.ops.control import bodies
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

    # _prev/_next/_key/_list: the node's place in its graph's NodeList (_list is None outside one).
    __slots__ = ("op", "name", "inputs", "outputs", "attrs", "_prev", "_next", "_key", "_list")

    def __init__(self, op: str, name: str, inputs: list[Value], outputs: list[Value], attrs: dict[str, Any]) -> None:
        self.op = op
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.attrs = attrs
        # None outside a list (not a ring of one: a self-cycle would leave a detached node, and
        # the weights it holds, to the cyclic collector, which passes pause)
        self._prev: Node | None = None
        self._next: Node | None = None
        self._key = 0
        self._list: NodeList | None = None

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
        _drop_use(old.users, self)
        self.inputs[index] = value
        value.users.append(self)

    def __repr__(self) -> str:
        return f"<Node {self.name}: {self.op}>"


# Space between the position keys of neighbours after a renumbering: that many halvings (inserts
# at one spot) fit before the keys around that spot run out and the list is renumbered.
_KEY_GAP = 1 << 40


class NodeList:
    """A graph's nodes in order: a doubly linked ring with a position key per node.

    Insertion before or after a node, append and removal are O(1). Iterating survives removing the
    current node or inserting around it (a removed node keeps its links, and iteration skips nodes
    no longer in the list; nodes inserted after the current one are visited). `comes_before` and
    `key` are O(1) amortised: a node inserted between two neighbours takes a key between theirs;
    when there is no room the keys are marked stale and renumbered, all at once, at the next order
    query. `index` and integer subscripts walk the list (O(n)): use them only outside passes.
    """

    __slots__ = ("_root", "_len", "_stale")

    def __init__(self, nodes: Iterable[Node] = ()) -> None:
        self._root = Node("<root>", "<root>", [], [], {})  # closes the ring: _next is the first node
        self._root._prev = self._root._next = self._root
        self._len = 0
        self._stale = False
        for n in nodes:
            self.append(n)

    # --- sequence ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __contains__(self, node: object) -> bool:
        return isinstance(node, Node) and node._list is self

    def __iter__(self) -> Iterator[Node]:
        return self._walk("_next")

    def __reversed__(self) -> Iterator[Node]:
        return self._walk("_prev")

    def _walk(self, link: str) -> Iterator[Node]:
        root = self._root
        cur = getattr(root, link)
        while cur is not root:
            if cur._list is self:  # skip nodes removed while the walk stood on them
                yield cur
            cur = getattr(cur, link)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return list(self)[i]
        if not -self._len <= i < self._len:
            raise IndexError(f"node index {i} out of range for {self._len} nodes")
        walk = iter(self) if i >= 0 else reversed(self)
        for _ in range(i if i >= 0 else -i - 1):
            next(walk)
        return next(walk)

    def __repr__(self) -> str:
        return f"NodeList({list(self)!r})"

    @property
    def first(self) -> Node | None:
        return None if self._root._next is self._root else self._root._next

    @property
    def last(self) -> Node | None:
        return None if self._root._prev is self._root else self._root._prev

    def after(self, node: Node) -> Node | None:
        """The node that follows `node`, None at the end."""
        self._check_member(node)
        nxt = node._next
        return None if nxt is self._root else nxt

    def before(self, node: Node) -> Node | None:
        """The node that precedes `node`, None at the start."""
        self._check_member(node)
        prv = node._prev
        return None if prv is self._root else prv

    # --- mutation ------------------------------------------------------------------------------

    def append(self, node: Node) -> None:
        self._link(node, self._root._prev, self._root)

    def insert_before(self, anchor: Node, node: Node) -> None:
        self._check_member(anchor)
        self._link(node, anchor._prev, anchor)

    def insert_after(self, anchor: Node, node: Node) -> None:
        self._check_member(anchor)
        self._link(node, anchor, anchor._next)

    def insert(self, index: int, node: Node) -> None:
        """Insert at position `index` (list.insert semantics; O(index))."""
        if index < 0:
            index = max(0, self._len + index)
        if index >= self._len:
            self.append(node)
        else:
            self.insert_before(self[index], node)

    def remove(self, node: Node) -> None:
        self._check_member(node)
        prv, nxt = node._prev, node._next
        prv._next = nxt
        nxt._prev = prv
        # node keeps _prev/_next so that an iterator standing on it can move on
        node._list = None
        self._len -= 1

    def reorder(self, nodes: Sequence[Node]) -> None:
        """Put the list's own nodes in the order of `nodes` (each exactly once)."""
        if len(nodes) != self._len or len({id(n) for n in nodes}) != self._len or any(n._list is not self for n in nodes):
            raise InternalError("reorder needs each node of the list exactly once", expected=self._len,
                                found=len(nodes))
        for n in nodes:
            n._list = None
        self._root._prev = self._root._next = self._root
        self._len = 0
        for n in nodes:
            self.append(n)

    # --- order ---------------------------------------------------------------------------------

    def key(self, node: Node) -> int:
        """A number that increases along the list (not a position: keys have gaps)."""
        self._check_member(node)
        if self._stale:
            self._renumber()
        return node._key

    def comes_before(self, a: Node, b: Node) -> bool:
        """Whether `a` stands before `b` (O(1) amortised)."""
        return self.key(a) < self.key(b)

    def index(self, node: Node) -> int:
        """The position of `node` (O(n): passes compare with `comes_before` instead)."""
        self._check_member(node)
        for i, n in enumerate(self):
            if n is node:
                return i
        raise InternalError("node list is inconsistent", node=node.name, op=node.op)  # unreachable

    def _link(self, node: Node, prv: Node, nxt: Node) -> None:
        if node._list is not None:
            raise InternalError("node is already in a graph", node=node.name, op=node.op)
        node._prev, node._next = prv, nxt
        prv._next = node
        nxt._prev = node
        node._list = self
        self._len += 1
        if not self._stale:
            root = self._root
            if prv is root and nxt is root:
                node._key = 0
                return
            lo = prv._key if prv is not root else nxt._key - 2 * _KEY_GAP
            hi = nxt._key if nxt is not root else prv._key + 2 * _KEY_GAP
            mid = (lo + hi) // 2
            if lo < mid < hi:
                node._key = mid
            else:
                self._stale = True

    def _renumber(self) -> None:
        for i, n in enumerate(self):
            n._key = i * _KEY_GAP
        self._stale = False

    def _check_member(self, node: Node) -> None:
        if node._list is not self:
            raise InternalError("node is not in this graph", node=node.name, op=node.op)


def _drop_use(users: list[Node], node: Node) -> None:
    """Remove one use by `node`. The last use is checked first: dead-code removal walks the graph
    backwards, so a value with thousands of users loses its latest one each time."""
    if users and users[-1] is node:
        users.pop()
    else:
        users.remove(node)


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
        self.nodes = NodeList()
        self.outputs: list[Value] = []
        self._names: set[str] = set()  # value names
        self._node_names: set[str] = set()
        self._reserved: set[str] = set()  # names kept free for a value that will be renamed to them
        self._counter = 0

    # --- construction -------------------------------------------------------------------------

    def unique_name(self, base: str) -> str:
        """A name free in both the value and the node namespace."""
        base = base or "v"
        name = base
        while name in self._names or name in self._node_names or name in self._reserved:
            self._counter += 1
            name = f"{base}.{self._counter}"
        return name

    def has_name(self, name: str) -> bool:
        return name in self._names or name in self._node_names

    def reserve(self, name: str) -> None:
        """Keep `name` out of `unique_name`'s choices until a value is renamed to it (an importer
        reserves a node's ONNX output names while it emits the node's intermediate values)."""
        if not self.has_name(name):
            self._reserved.add(name)

    def rename_value(self, v: Value, new: str) -> None:
        self._names.discard(v.name)
        self._reserved.discard(new)
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
        before: Node | None = None,
        after: Node | None = None,
        index: int | None = None,
    ) -> Node:
        """Create a node, infer its output types, and insert it: at the end, or just `before` or
        `after` a node of the graph (O(1)), or at position `index` (O(n) to find)."""
        if sum(x is not None for x in (before, after, index)) > 1:
            raise InternalError("add_node takes at most one of before, after and index", op=op,
                                expected="one place", found=f"before={before}, after={after}, index={index}")
        for anchor in (before, after):
            if anchor is not None and anchor not in self.nodes:
                raise InternalError("add_node anchor is not in this graph", node=anchor.name, op=anchor.op)
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
        if before is not None:
            self.nodes.insert_before(before, node)
        elif after is not None:
            self.nodes.insert_after(after, node)
        elif index is not None:
            self.nodes.insert(index, node)
        else:
            self.nodes.append(node)
        return node

    # --- rewriting ----------------------------------------------------------------------------

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Point every use of `old` (node inputs and graph outputs) at `new`."""
        if old is new:
            return
        # One entry per use: move them all at once (set_input per use would rescan the use list).
        for user in dict.fromkeys(old.users):
            for i, v in enumerate(user.inputs):
                if v is old:
                    user.inputs[i] = new
        new.users.extend(old.users)
        old.users = []
        self.outputs = [new if v is old else v for v in self.outputs]

    def remove_node(self, node: Node) -> None:
        """Remove a node whose outputs are unused."""
        for out in node.outputs:
            if out.users or any(o is out for o in self.outputs):
                raise InternalError("removing a node whose output is still used", node=node.name, op=node.op)
        for v in node.inputs:
            _drop_use(v.users, node)
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

    def toposort(self) -> None:
        """Reorder `nodes` topologically (stable: keeps the current order where it is valid)."""
        self.nodes.reorder(self._topological_order())

    def _topological_order(self) -> list[Node]:
        """Kahn's algorithm taking, of the ready nodes, the one that comes first now. A cycle
        raises InvalidModel naming it, in dataflow order (`a -> b`: b uses a)."""
        nodes = list(self.nodes)
        pos = {id(n): i for i, n in enumerate(nodes)}
        preds: list[list[int]] = [[pos[id(v.producer)] for v in n.inputs
                                   if v.producer is not None and id(v.producer) in pos] for n in nodes]
        succs: list[list[int]] = [[] for _ in nodes]
        waiting = [len(p) for p in preds]
        for i, p in enumerate(preds):
            for j in p:
                succs[j].append(i)
        ready = [i for i, w in enumerate(waiting) if w == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(nodes[i])
            for j in succs[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) < len(nodes):
            # Every node left waits on another node left: walking back along those from any of them
            # must come round to a node already seen, and the walk from there on is a cycle.
            walk, seen = [next(i for i, w in enumerate(waiting) if w > 0)], {}
            while walk[-1] not in seen:
                seen[walk[-1]] = len(walk) - 1
                walk.append(next(j for j in preds[walk[-1]] if waiting[j] > 0))
            cycle = [nodes[i].name for i in reversed(walk[seen[walk[-1]]:-1])]
            raise InvalidModel("the graph has a cycle", node=cycle[0], expected="acyclic graph",
                               found=" -> ".join(cycle + cycle[:1]))
        return order

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
        self._verify_node_list()
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
            for key, body in bodies(node.op, node.attrs):
                try:
                    body.verify()
                except GlowpyError as e:
                    raise type(e)(f"in its {key}: {e}", node=node.name, op=node.op) from None
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

    def _verify_node_list(self) -> None:
        """The ring's links agree in both directions, its length is right, its keys increase."""
        nl = self.nodes
        root, cur, count, last_key = nl._root, nl._root._next, 0, None
        while cur is not root:
            if cur._list is not nl or cur._next._prev is not cur:
                raise InternalError("node list links are broken", node=cur.name, op=cur.op)
            if not nl._stale and last_key is not None and cur._key <= last_key:
                raise InternalError("node list keys are out of order", node=cur.name, op=cur.op)
            last_key = cur._key
            count += 1
            cur = cur._next
        if count != len(nl):
            raise InternalError("node list length is stale", expected=count, found=len(nl))

    def _raise_cycle_or_order(self, node: Node, v: Value) -> None:
        self._topological_order()  # raises when the misordering is a cycle
        raise InvalidModel(f"input '{v.name}' is used before the node that produces it", node=node.name, op=node.op)

    # --- printing -----------------------------------------------------------------------------

    def __str__(self) -> str:
        return "\n".join(self._lines())

    def _lines(self) -> list[str]:
        """The graph's text; a control node's bodies follow it, indented under their attribute name."""
        lines = [f"graph {self.name}("]
        lines += [f"    %{v.name}: {v.type}," for v in self.inputs]
        lines.append(") {")
        for v in self.constants.values():
            lines.append(f"  %{v.name}: {v.type} = constant")
        for n in self.nodes:
            outs = ", ".join(f"%{o.name}: {o.type}" for o in n.outputs)
            args = ", ".join(f"%{v.name}" for v in n.inputs)
            subs = bodies(n.op, n.attrs)
            attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in n.attrs.items()
                              if not (k in ("activation", "activation_params") and v in ("none", ()))
                              and k not in dict(subs))
            attrs = f" {{{attrs}}}" if attrs else ""
            tag = f"  # {n.name}" if not n.outputs or n.name != n.outputs[0].name else ""
            lines.append(f"  {outs} = {n.op}({args}){attrs}{tag}")
            for key, body in subs:
                lines.append(f"    {key}:")
                lines += ["      " + line for line in body._lines()]
        lines.append("  return " + ", ".join(f"%{v.name}" for v in self.outputs))
        lines.append("}")
        return lines

    def __repr__(self) -> str:
        return (f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.constants)} constants, "
                f"{len(self.nodes)} nodes, {len(self.outputs)} outputs>")
