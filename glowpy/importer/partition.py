"""The partitioner: which parts of a model a host can offload to glowpy.

`partition(model)` runs the cheap check, then grows maximal connected groups of supported nodes.
Nodes are visited in topological order; a node joins the group of a supported producer unless the
merge would make the group graph cyclic (a group that feeds a host node which feeds it back could
never run as one call). Each group becomes an ONNX ModelProto with its boundary inputs and
outputs declared (types from the check's inference, else from the model's declarations, else from
ONNX shape inference) and the initializers it uses; the unsupported nodes are left to the host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx
from onnx import ModelProto, NodeProto, TensorProto, ValueInfoProto, helper

from glowpy.errors import InternalError
from glowpy.importer.compat import (
    Checker,
    CompatReport,
    ModelLike,
    Slot,
    node_display_name,
)
from glowpy.importer.onnx_import import read_model
from glowpy.importer.walk import reads
from glowpy.ir.types import dtype_to_onnx, onnx_type_name

if TYPE_CHECKING:
    from glowpy.backends.base import Backend


@dataclass
class Partition:
    """`subgraphs`: the offloadable groups as ModelProtos, in an order a host can run them in
    (interleaved with host nodes as `plan` says); `host_nodes`: the nodes left to the host."""

    subgraphs: list[ModelProto]
    host_nodes: list[NodeProto]
    report: CompatReport
    subgraph_nodes: list[list[int]] = field(default_factory=list)  # node indices (model order) per subgraph
    plan: list[tuple[str, int]] = field(default_factory=list)  # ("subgraph", k) / ("host", node index)

    def describe(self) -> list[str]:
        """Human-readable lines, one block per step of the plan."""
        nodes = self._all_nodes
        lines = []
        for kind, k in self.plan:
            if kind == "subgraph":
                g = self.subgraphs[k].graph
                names = [node_display_name(nodes[i], i) for i in self.subgraph_nodes[k]]
                lines.append(f"subgraph {k}: {len(names)} node(s) [{_clip(', '.join(names))}]")
                lines.append(f"  inputs:  {_clip(', '.join(_fmt_info(v) for v in g.input)) or '-'}")
                lines.append(f"  outputs: {_clip(', '.join(_fmt_info(v) for v in g.output)) or '-'}")
            else:
                n = nodes[k]
                v = self.report.nodes[k]
                lines.append(f"host: node '{node_display_name(n, k)}' ({n.op_type}): {v.status.name}")
                lines += [f"  body node '{b.name}' ({b.op}): {b.status.name}" for b in v.walk()[1:] if not b.supported]
        return lines

    def to_dict(self) -> dict[str, Any]:
        nodes = self._all_nodes
        return {
            "plan": [{"kind": kind, "index": k} for kind, k in self.plan],
            "subgraphs": [{"nodes": [node_display_name(nodes[i], i) for i in idx],
                           "inputs": [_fmt_info(v) for v in m.graph.input],
                           "outputs": [_fmt_info(v) for v in m.graph.output]}
                          for m, idx in zip(self.subgraphs, self.subgraph_nodes)],
            "host_nodes": [{"name": self.report.nodes[k].name, "op": nodes[k].op_type,
                            "status": self.report.nodes[k].status.name,
                            **({"body": [{"name": b.name, "op": b.op, "status": b.status.name}
                                         for b in self.report.nodes[k].walk()[1:]]} if self.report.nodes[k].body else {})}
                           for kind, k in self.plan if kind == "host"],
        }

    _all_nodes: list[NodeProto] = field(default_factory=list, repr=False)


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt_info(v: ValueInfoProto) -> str:
    tt = v.type.tensor_type
    if not tt.elem_type:
        return f"{v.name}: ?"
    dt = onnx_type_name(tt.elem_type).lower()
    if not tt.HasField("shape"):
        return f"{v.name}: {dt}[?]"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    return f"{v.name}: {dt}[{', '.join(dims)}]"


# --- grouping ------------------------------------------------------------------------------------------


class _Groups:
    """Union of nodes into groups over a fixed DAG, refusing merges that would make the group graph
    cyclic. Host nodes stay singleton groups."""

    def __init__(self, n: int, succs: list[set[int]], pos: list[int]) -> None:
        self.group = list(range(n))
        self.members: dict[int, set[int]] = {i: {i} for i in range(n)}
        self.succs = succs
        self.pos = pos  # topological position of each node

    def _gsuccs(self, g: int) -> set[int]:
        return {self.group[s] for m in self.members[g] for s in self.succs[m]} - {g}

    def _reaches(self, start: int, target: int) -> bool:
        """Is there a path start -> X -> ... -> target through at least one other group?"""
        limit = max(self.pos[m] for m in self.members[target])
        stack = [g for g in self._gsuccs(start) if g != target]
        seen = set(stack)
        while stack:
            g = stack.pop()
            # A group whose every node comes after the target's last node cannot lead back to it.
            if min(self.pos[m] for m in self.members[g]) > limit:
                continue
            for h in self._gsuccs(g):
                if h == target:
                    return True
                if h not in seen and h != start:
                    seen.add(h)
                    stack.append(h)
        return False

    def try_merge(self, a: int, b: int) -> bool:
        if a == b:
            return True
        if self._reaches(a, b) or self._reaches(b, a):
            return False
        keep, drop = (a, b) if len(self.members[a]) >= len(self.members[b]) else (b, a)
        for m in self.members[drop]:
            self.group[m] = keep
        self.members[keep] |= self.members.pop(drop)
        return True


def _group_order(groups: _Groups, ids: list[int]) -> list[int]:
    """Topological order of the group graph (ties by first node position); raises on a cycle."""
    succ = {g: groups._gsuccs(g) for g in ids}
    indeg = dict.fromkeys(ids, 0)
    for g in ids:
        for h in succ[g]:
            indeg[h] += 1
    first = {g: min(groups.pos[m] for m in groups.members[g]) for g in ids}
    ready = sorted((g for g in ids if indeg[g] == 0), key=first.__getitem__)
    out = []
    while ready:
        g = ready.pop(0)
        out.append(g)
        for h in succ[g]:
            indeg[h] -= 1
            if indeg[h] == 0:
                ready.append(h)
        ready.sort(key=first.__getitem__)
    if len(out) != len(ids):
        raise InternalError("partition: the group graph has a cycle", expected="acyclic", found=len(ids) - len(out))
    return out


# --- subgraph models -------------------------------------------------------------------------------------


class _Types:
    """Declared types for boundary values: the check's knowledge first, then ONNX shape inference."""

    def __init__(self, model: ModelProto, slots: dict[str, Slot]) -> None:
        self.model = model
        self.slots = slots
        self._inferred: dict[str, ValueInfoProto] | None = None

    def info(self, name: str) -> ValueInfoProto:
        slot = self.slots.get(name)
        if slot is not None and slot.dtype is not None:
            dims = None if slot.dims is None else [d if isinstance(d, (int, str)) else None for d in slot.dims]
            return helper.make_tensor_value_info(name, dtype_to_onnx(slot.dtype), dims)
        found = self._from_inference().get(name)
        if found is not None:
            out = ValueInfoProto()
            out.CopyFrom(found)
            return out
        return helper.make_empty_tensor_value_info(name)

    def _from_inference(self) -> dict[str, ValueInfoProto]:
        if self._inferred is None:
            self._inferred = {}
            try:
                inferred = onnx.shape_inference.infer_shapes(self.model)
            except Exception:  # noqa: BLE001  (inference is a best effort for declarations only)
                return self._inferred
            g = inferred.graph
            self._inferred = {v.name: v for v in list(g.value_info) + list(g.output) + list(g.input)
                              if v.type.tensor_type.elem_type}
        return self._inferred


def _subgraph_model(model: ModelProto, nodes: list[NodeProto], members: list[int], used_outside: set[str],
                    types: _Types, name: str) -> ModelProto:
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    produced = {o for i in members for o in nodes[i].output if o}
    inputs: list[str] = []
    weights: list[TensorProto] = []
    seen: set[str] = set()
    outer = _outer_names(model)
    for i in members:
        for x in _outer_reads(nodes[i], outer):
            if not x or x in produced or x in seen:
                continue
            seen.add(x)
            if x in inits:
                weights.append(inits[x])
            else:
                inputs.append(x)
    outputs = [o for i in members for o in nodes[i].output if o and o in used_outside]
    graph = helper.make_graph(
        [nodes[i] for i in members], name,
        [types.info(x) for x in inputs] + ([types.info(t.name) for t in weights] if model.ir_version < 4 else []),
        [types.info(o) for o in outputs], initializer=weights,
    )
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name="glowpy.partition")
    sub.ir_version = model.ir_version
    return sub


def _outer_names(model: ModelProto) -> set[str]:
    g = model.graph
    return {x.name for x in [*g.input, *g.initializer]} | {o for n in g.node for o in n.output if o}


def _outer_reads(node: NodeProto, outer: set[str]) -> list[str]:
    """The graph-level names a node reads: its inputs and what its subgraph bodies read from this graph."""
    return list(dict.fromkeys(x for x in reads(node) if x and x in outer))


def partition(model: ModelLike, backend: Backend | None = None,
              shapes: Mapping[str, Sequence[int] | int] | None = None, *, backend_name: str | None = None
              ) -> Partition:
    """Split `model` into offloadable subgraphs (maximal connected groups of nodes `glowpy.check`
    accepts, never forming a cycle with the host nodes between them) and the nodes left to the host.
    An unreadable model raises its GlowpyError (INVALID_PROTOBUF / INVALID_MODEL). `backend` is an
    object, as for `compat.check` (`glowpy.partition` finds it by name)."""
    proto, _ = read_model(model)
    checker = Checker(proto, backend, backend_name or (backend.name if backend is not None else "none"), shapes)
    report = checker.run()
    nodes = list(proto.graph.node)
    n = len(nodes)
    order = list(checker.order) + sorted(set(range(n)) - set(checker.order))
    pos = [0] * n
    for p, i in enumerate(order):
        pos[i] = p
    producer = {o: i for i, nd in enumerate(nodes) for o in nd.output if o}
    outer = _outer_names(proto)
    preds = [{producer[x] for x in _outer_reads(nd, outer) if x in producer} - {i} for i, nd in enumerate(nodes)]
    succs: list[set[int]] = [set() for _ in range(n)]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].add(i)
    placed = set(checker.order)  # nodes on a cycle stay with the host
    ok = [i < len(report.nodes) and report.nodes[i].supported and i in placed for i in range(n)]
    groups = _Groups(n, succs, pos)
    for i in order:
        if not ok[i]:
            continue
        for p in sorted(preds[i], key=pos.__getitem__, reverse=True):  # nearest producer first
            if ok[p]:
                groups.try_merge(groups.group[i], groups.group[p])
    ids = sorted(set(groups.group), key=lambda g: min(pos[m] for m in groups.members[g]))
    graph_outputs = {o.name for o in proto.graph.output}
    types = _Types(proto, checker.slots)
    subgraphs: list[ModelProto] = []
    sub_nodes: list[list[int]] = []
    plan: list[tuple[str, int]] = []
    for g in _group_order(groups, ids):
        members = sorted(groups.members[g], key=pos.__getitem__)
        if not ok[members[0]]:
            plan.append(("host", members[0]))
            continue
        inside = set(members)
        used_outside = set(graph_outputs)
        for i in range(n):
            if i not in inside:
                used_outside.update(x for x in _outer_reads(nodes[i], outer) if x)
        k = len(subgraphs)
        subgraphs.append(_subgraph_model(proto, nodes, members, used_outside, types,
                                         f"{proto.graph.name or 'model'}_glowpy_{k}"))
        sub_nodes.append(sorted(members))
        plan.append(("subgraph", k))
    host = [nodes[k] for kind, k in plan if kind == "host"]
    return Partition(subgraphs, host, report, sub_nodes, plan, _all_nodes=nodes)


__all__ = ["Partition", "partition"]
