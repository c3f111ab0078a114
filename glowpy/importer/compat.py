"""The cheap compatibility path: a verdict for every node, from declarations only.

A host asks "can you run this?" with a model whose weights may be absent (declared graph inputs,
or initializers whose payload is not wanted). This module answers without reading a single
initializer payload and without building a `Graph`:

1. model level: IR version, opset imports, duplicate names, cycles (INVALID_* / UNSUPPORTED_VERSION);
2. per node, the shared gate `table.check_node` (op, domain, opset, attributes, main dtype), the same
   the full importer calls;
3. per node whose operand types are known (declared, or inferred for earlier nodes), a *dry run* of
   the node's own converter from the op table against a context that holds types only: every IR op
   it emits goes through the op declaration's `make_attrs` and `infer_types`, exactly as
   `Graph.add_node` would do it, so shape and type rules are never restated here. Shape-like values
   (Shape outputs, Constant nodes, small folds of those) are computed, as the importer's folding
   does. A compile-time operand whose value is not visible (a weight) is handled as the op table row
   says (`value_inputs`, `output_shape_input`); otherwise the output types come from declarations
   and the verdict records what it assumed;
4. the declared types of graph outputs against the inferred ones (MISMATCHING_*), as the importer does;
5. the backend's `should_lower` (FALLBACK) and `is_op_supported` on the IR nodes the dry run made.

Every node gets a verdict; a failure never stops the others.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, ValueInfoProto, helper, numpy_helper

from glowpy.errors import (
    GlowpyError,
    InternalError,
    InvalidModel,
    MismatchingDatatype,
    MismatchingShape,
    Status,
    UnsupportedAttribute,
    UnsupportedDatatype,
    UnsupportedOperator,
)
from glowpy.importer import ops as _ops  # noqa: F401  (fills the op table)
from glowpy.importer.context import NodeContext
from glowpy.importer.onnx_import import declared_type, model_opsets, read_model
from glowpy.importer.table import OnnxOp, check_node, normalize_domain, require_const_operand
from glowpy.ir.graph import Node, Value
from glowpy.ir.ops import get_op
from glowpy.ir.types import TensorType, dtype_from_onnx, dtype_to_onnx

if TYPE_CHECKING:
    from glowpy.backends.base import Backend

ModelLike = bytes | bytearray | memoryview | str | os.PathLike | ModelProto

OK_STATUSES = frozenset({Status.SUCCESS, Status.FALLBACK})
FOLD_LIMIT = 4096  # elements: shape-like values are computed during the check; bigger ones stay types
CONSTANT_LIMIT = 4096  # elements: a bigger Constant node is a weight, typed from its dims only


# --- the report ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeVerdict:
    """The verdict on one node. `assumes` lists what the verdict could not see (operand values
    supplied at init); an accepted node with assumptions is accepted provided those values are valid."""

    index: int  # position in model.graph.node
    name: str
    op: str
    domain: str
    status: Status
    reason: str
    assumes: tuple[str, ...] = ()

    @property
    def supported(self) -> bool:
        return self.status in OK_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "op": self.op, "domain": self.domain,
                "status": self.status.name, "code": int(self.status), "reason": self.reason,
                "assumes": list(self.assumes)}


@dataclass(frozen=True)
class Issue:
    """A model-level finding that belongs to no single node (unreadable bytes, an unused bad
    initializer, a graph output nothing produces)."""

    status: Status
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.name, "code": int(self.status), "reason": self.reason}


@dataclass
class CompatReport:
    """What `glowpy.check` returns: one verdict per node (model order) plus model-level issues."""

    nodes: list[NodeVerdict]
    issues: list[Issue] = field(default_factory=list)
    backend: str = "cpu"
    backend_consulted: bool = False  # False: the backend is not available; the op table alone decided
    readable: bool = True  # False: the bytes/path did not give a ModelProto at all
    assumes: list[str] = field(default_factory=list)  # model-level assumptions (values no node reads)

    @property
    def supported(self) -> bool:
        return self.readable and not self.issues and all(n.supported for n in self.nodes)

    @property
    def status(self) -> Status:
        """The overall status: the first model issue, else the first rejected node's status, else
        FALLBACK if any node falls back, else SUCCESS."""
        if self.issues:
            return self.issues[0].status
        for n in self.nodes:
            if not n.supported:
                return n.status
        return Status.FALLBACK if any(n.status == Status.FALLBACK for n in self.nodes) else Status.SUCCESS

    @property
    def unsupported(self) -> list[NodeVerdict]:
        return [n for n in self.nodes if not n.supported]

    @property
    def reason(self) -> str:
        """One line: the first problem, or that everything is supported."""
        if self.issues:
            return self.issues[0].reason
        bad = self.unsupported
        if bad:
            more = f" (and {len(bad) - 1} more node(s))" if len(bad) > 1 else ""
            return bad[0].reason + more
        return self.summary()

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.status.name] = counts.get(n.status.name, 0) + 1
        ok = sum(1 for n in self.nodes if n.status == Status.SUCCESS)
        fb = counts.get("FALLBACK", 0)
        bad = len(self.nodes) - ok - fb
        detail = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()) if k not in ("SUCCESS", "FALLBACK"))
        text = (f"{len(self.nodes)} node(s): {ok} supported, {fb} fallback, {bad} unsupported"
                + (f" ({detail})" if detail else ""))
        if self.issues:
            text += f"; {len(self.issues)} model issue(s)"
        return text + f" -> {'supported' if self.supported else 'NOT supported'} ({self.status.name})"

    def to_dict(self) -> dict[str, Any]:
        return {"supported": self.supported, "status": self.status.name, "code": int(self.status),
                "reason": self.reason, "backend": self.backend, "backend_consulted": self.backend_consulted,
                "readable": self.readable, "summary": self.summary(), "assumes": list(self.assumes),
                "issues": [i.to_dict() for i in self.issues], "nodes": [n.to_dict() for n in self.nodes]}


# --- what is known about each value ------------------------------------------------------------------


@dataclass
class Slot:
    """What the check knows about one named value: its element type, its dims (ints, symbols or
    None per dim; None for unknown rank), a static IR `Value` when the shape is fully known, and
    `error` when the value itself makes its users unsupported (an unsupported element type...)."""

    dtype: np.dtype | None = None
    dims: tuple[Any, ...] | None = None
    value: Value | None = None
    error: GlowpyError | None = None
    weight: bool = False  # an initializer (or big Constant): data exists, but is not read here
    runtime_note: str = ""  # an assumption, made where a node reads the value at run time

    @property
    def type(self) -> TensorType | None:
        return self.value.type if self.value is not None else None


def _static(dims: Sequence[Any] | None) -> tuple[int, ...] | None:
    if dims is None or not all(isinstance(d, int) and d > 0 for d in dims):
        return None
    return tuple(dims)


def _fmt_dims(dims: Sequence[Any] | None) -> str:
    if dims is None:
        return "?"
    return "[" + ", ".join("?" if d is None or d == 0 else str(d) for d in dims) + "]"


def _rebuild(err: GlowpyError, *, node: str, op: str, opset: int | None = None) -> GlowpyError:
    """A copy of `err` naming this node (the original may belong to a value shared by many nodes)."""
    return type(err)(err.reason, node=node, op=op, opset=opset, expected=err.expected, found=err.found)


# --- the dry run --------------------------------------------------------------------------------------


class _Opaque(Exception):  # noqa: N818  (a control-flow signal, not an error)
    """A converter needs the value of an operand the check cannot see, and no stand-in exists."""

    def __init__(self, index: int, name: str) -> None:
        super().__init__(index, name)
        self.index = index
        self.name = name


class _Scope:
    """Plays the importer's part for one node's dry run: operand lookup and compile-time values."""

    graph = None  # the dry run never builds a graph
    base_dir = None

    def __init__(self, slots: dict[str, Slot]) -> None:
        self.slots = slots
        self.assumes: list[str] = []
        self.emitted: list[Node] = []

    def value_of(self, name: str, ctx: NodeContext) -> Value:
        slot = self.slots.get(name)
        if slot is None or slot.value is None:
            raise ctx.error(InvalidModel, f"input '{name}' is not defined (no initializer, graph input or "
                                          f"node output has that name)")
        return slot.value

    def evaluate(self, v: Value) -> np.ndarray | None:
        if v.data is None:
            self.note(f"assumes the value of '{v.name}' (not read) is valid")
        return v.data

    def note(self, text: str) -> None:
        if text not in self.assumes:
            self.assumes.append(text)


class _DryContext(NodeContext):
    """A NodeContext whose emits only infer types: the converter runs unchanged."""

    def __init__(self, scope: _Scope, node: NodeProto, entry: OnnxOp, opset: int, name: str,
                 declared_out: Slot | None) -> None:
        super().__init__(scope, node, entry, opset, name)  # type: ignore[arg-type]
        self.scope = scope
        self.declared_out = declared_out

    def const(self, i: int, default: Any = None) -> np.ndarray | None:
        if not self.has_input(i):
            return default
        require_const_operand(self.entry, i, node=self.name, opset=self.opset)
        v = self.input(i)
        if v.data is not None:
            return v.data
        if i in self.entry.value_inputs:
            self.scope.note(f"assumes operand {i} '{v.name}' (not read) has a supported value")
            return np.zeros(v.shape, dtype=v.dtype)
        if i == self.entry.output_shape_input:
            out = self.declared_out
            shape = _static(out.dims) if out is not None else None
            if shape is not None:
                self.scope.note(f"assumes operand {i} '{v.name}' (not read) is the declared output shape")
                return np.array(shape, dtype=np.int64)
        raise _Opaque(i, v.name)

    def emit(self, op: str, inputs: list[Value], attrs: dict[str, Any] | None = None) -> list[Value]:
        opdef = get_op(op)
        try:
            full = opdef.make_attrs(dict(attrs or {}), node=self.name)
            types = opdef.infer_types(full, [v.type for v in inputs], node=self.name)
        except GlowpyError as e:
            raise e.at(node=self.name, op=self.node.op_type, opset=self.opset)
        node = Node(op, self.name, list(inputs), [], full)
        node.outputs = [Value(f"{self.name}:{k}", t, "node", producer=node) for k, t in enumerate(types)]
        self.scope.emitted.append(node)
        # Fold small shape-like computations, as the importer's evaluate() would on demand.
        if (all(v.data is not None and v.data.size <= FOLD_LIMIT for v in inputs)
                and all(t.size <= FOLD_LIMIT for t in types)):
            for out, arr in zip(node.outputs, opdef.run(full, [v.data for v in inputs])):
                out.data = np.asarray(arr)
        return list(node.outputs)

    def constant(self, data: np.ndarray, suffix: str = "const") -> Value:
        data = np.asarray(data)
        return Value(f"{self.name}.{suffix}", TensorType.of(data), "constant", data=data)

    def output_constant(self, i: int, data: np.ndarray) -> Value:
        return self.constant(data, f"output{i}")


# --- the checker ---------------------------------------------------------------------------------------


def node_display_name(node: NodeProto, index: int) -> str:
    """The name reports use for a node: the importer's rule (name, else first output, else op_index)."""
    return node.name or (node.output[0] if node.output and node.output[0] else f"{node.op_type}_{index}")


def topo_order(nodes: Sequence[NodeProto], known: set[str]) -> tuple[list[int], list[int]]:
    """Kahn's order over node indices (stable: model order among ready nodes), and the indices left
    over because they sit on or behind a cycle."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    users: dict[int, list[int]] = {}
    pending = []
    for i, n in enumerate(nodes):
        deps = {producer[x] for x in n.input if x and x not in known and x in producer}
        for j in deps:
            users.setdefault(j, []).append(i)
        pending.append(len(deps))
    ready = [i for i, c in enumerate(pending) if c == 0]
    order: list[int] = []
    head = 0
    while head < len(ready):
        i = ready[head]
        head += 1
        order.append(i)
        for u in users.get(i, ()):
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
    placed = set(order)
    return order, [i for i in range(len(nodes)) if i not in placed]


_BACKEND_CACHE: dict[str, Backend | None] = {}


def resolve_backend(name: str | Backend | None) -> Backend | None:
    """The backend to consult, or None when it is not available (then the op table alone decides).
    An unknown name raises UnsupportedAttribute, like `get_backend`."""
    from glowpy.backends import BACKENDS  # backends sit above the importer: asked for lazily
    from glowpy.backends.base import Backend

    if name is None:
        return None
    if isinstance(name, Backend):
        return name
    if name not in _BACKEND_CACHE:
        factory = BACKENDS.get(name)
        if factory is None:
            raise UnsupportedAttribute(f"unknown backend '{name}'", expected=sorted(BACKENDS), found=name)
        try:
            _BACKEND_CACHE[name] = factory()
        except GlowpyError:
            _BACKEND_CACHE[name] = None  # not landed / not buildable here: decide from the table
    return _BACKEND_CACHE[name]


class Checker:
    """One run of the cheap path over a ModelProto. `run()` gives the report; `slots` keeps what was
    learned about every value (the partitioner declares subgraph boundaries from it)."""

    def __init__(self, model: ModelProto, backend: Backend | None, backend_name: str,
                 shapes: Mapping[str, Sequence[int] | int] | None = None) -> None:
        self.model = model
        self.backend = backend
        self.backend_name = backend_name
        self.shapes = dict(shapes or {})
        self.slots: dict[str, Slot] = {}
        self.issues: list[Issue] = []
        self.verdicts: dict[int, NodeVerdict] = {}
        self.order: list[int] = []
        self.opsets: dict[str, int] = {}
        self._unused_bad: dict[str, GlowpyError] = {}
        self.assumes: list[str] = []

    # --- entry ----------------------------------------------------------------------------------

    def run(self) -> CompatReport:
        if not self.model.HasField("graph"):
            return self._report([], [Issue(Status.INVALID_MODEL, "the model has no graph")])
        g = self.model.graph
        nodes = list(g.node)
        try:
            self.opsets = model_opsets(self.model)
        except GlowpyError as e:
            # Nothing can be imported under an unsupported IR version or default opset: say so per node.
            for i, n in enumerate(nodes):
                name = node_display_name(n, i)
                self.verdicts[i] = self._verdict(i, n, _rebuild(e, node=name, op=n.op_type, opset=e.opset))
            self.issues.append(Issue(e.status, str(e)))
            return self._finish(nodes)
        self._declare_initializers(g.initializer)
        self._declare_inputs(g.input)
        self.declared = {vi.name: vi for vi in list(g.value_info) + list(g.output)}
        self.graph_outputs = {o.name: o for o in g.output}
        self.order, stuck = topo_order(nodes, set(self.slots))
        for i in self.order:
            self.verdicts[i] = self._judge(i, nodes[i])
        for i in stuck:
            n = nodes[i]
            err = InvalidModel("the node is on (or behind) a cycle", node=node_display_name(n, i), op=n.op_type,
                               expected="an acyclic graph",
                               found="cycle among " + ", ".join(repr(node_display_name(nodes[j], j)) for j in stuck[:6]))
            self.verdicts[i] = self._verdict(i, n, err)
        for info in g.output:
            if info.name not in self.slots and not any(info.name in nodes[i].output for i in stuck):
                self.issues.append(Issue(Status.INVALID_MODEL,
                                         f"graph output '{info.name}' is not produced by any node, input or "
                                         f"initializer"))
        used = {x for n in nodes for x in n.input}
        for name, err in self._unused_bad.items():
            if name not in used:
                self.issues.append(Issue(err.status, str(err)))
        self.assumes = [s.runtime_note for name, s in self.slots.items() if s.runtime_note and name not in used]
        return self._finish(nodes)

    def _finish(self, nodes: Sequence[NodeProto]) -> CompatReport:
        return self._report([self.verdicts[i] for i in range(len(nodes))], self.issues)

    def _report(self, verdicts: list[NodeVerdict], issues: list[Issue]) -> CompatReport:
        return CompatReport(verdicts, list(issues), backend=self.backend_name,
                            backend_consulted=self.backend is not None, assumes=list(self.assumes))

    # --- values from declarations ----------------------------------------------------------------

    def _declare_initializers(self, inits: Sequence[TensorProto]) -> None:
        for t in inits:
            if t.name in self.slots:
                self.issues.append(Issue(Status.INVALID_MODEL, f"initializer '{t.name}' is defined twice"))
                continue
            dims = tuple(int(d) for d in t.dims)
            try:
                dtype = dtype_from_onnx(t.data_type)
            except UnsupportedDatatype:
                err = UnsupportedDatatype(f"initializer '{t.name}' has an unsupported element type",
                                          expected="a numeric or bool tensor",
                                          found=TensorProto.DataType.Name(t.data_type)
                                          if t.data_type in TensorProto.DataType.values() else t.data_type)
                self.slots[t.name] = Slot(None, dims, error=err, weight=True)
                self._unused_bad[t.name] = err
                continue
            # Only dims and data_type: even len(t.raw_data) would copy the payload. An empty weight's
            # value is known without reading anything.
            empty = np.zeros(dims, dtype) if 0 in dims else None
            value = Value(t.name, TensorType(dtype, dims), "constant", data=empty)
            self.slots[t.name] = Slot(dtype, dims, value, weight=True)

    def _declare_inputs(self, inputs: Sequence[ValueInfoProto]) -> None:
        seen: set[str] = set()
        for info in inputs:
            if info.name in self.slots and self.slots[info.name].weight:
                continue  # IR v3 lists initializers among the inputs: they stay weights
            if info.name in seen:
                self.issues.append(Issue(Status.INVALID_MODEL, f"graph input '{info.name}' is declared twice"))
                continue
            seen.add(info.name)
            try:
                dtype, dims = declared_type(info)
            except UnsupportedDatatype as e:
                self.slots[info.name] = Slot(error=e)
                self._unused_bad[info.name] = e
                continue
            if dtype is None:
                err = UnsupportedDatatype(f"graph input '{info.name}' declares no element type")
                self.slots[info.name] = Slot(error=err)
                self._unused_bad[info.name] = err
                continue
            dims = self._bind(info.name, dims)
            if dims is not None and any(d == 0 for d in dims):
                # A zero extent is a zero-size tensor in ONNX: its value is known without data. glowpy
                # has no zero-size runtime buffers, so it must be a weight given at init.
                empty = None
                if all(isinstance(d, int) for d in dims):
                    empty = Value(info.name, TensorType(dtype, dims), "input", data=np.zeros(dims, dtype))
                note = f"assumes '{info.name}' (zero-size) is a weight given at init, not a runtime input"
                self.slots[info.name] = Slot(dtype, tuple(dims), empty, runtime_note=note)
                continue
            shape = _static(dims)
            value = Value(info.name, TensorType(dtype, shape), "input") if shape is not None else None
            self.slots[info.name] = Slot(dtype, None if dims is None else tuple(dims), value)

    def _bind(self, name: str, dims: list[Any] | None) -> list[Any] | None:
        """Apply shapes= bindings (a full shape by input name, or an int by dim_param symbol)."""
        given = self.shapes.get(name)
        if given is not None and not isinstance(given, int):
            return [int(d) for d in given]
        if dims is None:
            return None
        out = []
        for d in dims:
            val = self.shapes.get(d) if isinstance(d, str) else None
            if isinstance(val, (list, tuple)) and len(val) == 1:
                val = val[0]
            out.append(int(val) if isinstance(val, int) or (isinstance(val, np.integer)) else d)
        return out

    def _declared_slot(self, name: str) -> Slot | None:
        info = self.declared.get(name)
        if info is None:
            return None
        try:
            dtype, dims = declared_type(info)
        except UnsupportedDatatype:
            return None
        shape = _static(dims)
        value = Value(name, TensorType(dtype, shape), "node") if dtype is not None and shape is not None else None
        return Slot(dtype, None if dims is None else tuple(dims), value)

    # --- one node ----------------------------------------------------------------------------------

    def _verdict(self, index: int, node: NodeProto, err: GlowpyError | None, *, status: Status = Status.SUCCESS,
                 note: str = "", assumes: Sequence[str] = (), opset: int | None = None) -> NodeVerdict:
        name = node_display_name(node, index)
        if err is not None:
            status, reason = err.status, str(err)
        else:
            where = f"node '{name}' ({node.op_type}" + (f", opset {opset})" if opset is not None else ")")
            reason = f"{where}: {note or 'supported'}"
            if assumes:
                reason += "; " + "; ".join(assumes)
        return NodeVerdict(index, name, node.op_type, node.domain, status, reason, tuple(assumes))

    def _judge(self, index: int, node: NodeProto) -> NodeVerdict:
        name = node_display_name(node, index)
        op = node.op_type
        if not op:
            self._declare_outputs(node, {})
            return self._verdict(index, node, InvalidModel("the node has no op_type", node=name))
        for out in node.output:
            if out and out in self.slots:  # SSA: every value has one producer
                return self._verdict(index, node, InvalidModel(f"value '{out}' is produced twice", node=name, op=op))
        first = self.slots.get(node.input[0]) if node.input and node.input[0] else None
        try:
            entry, opset = check_node(node, self.opsets, [first.dtype if first is not None else None])
        except GlowpyError as e:
            self._declare_outputs(node, {})
            return self._verdict(index, node, e.at(node=name, op=op))
        inputs: list[Slot] = []
        notes: list[str] = []
        for k, x in enumerate(node.input):
            if not x:
                continue
            slot = self.slots.get(x)
            if slot is None:
                self._declare_outputs(node, {})
                return self._verdict(index, node, InvalidModel(
                    f"input '{x}' is not defined (no initializer, graph input or node output has that name)",
                    node=name, op=op, opset=opset))
            if slot.error is not None:
                self._declare_outputs(node, {})
                return self._verdict(index, node, _rebuild(slot.error, node=name, op=op, opset=opset))
            if slot.runtime_note and k not in entry.const_inputs:
                notes.append(slot.runtime_note)
            inputs.append(slot)
        if any(s.value is None for s in inputs):
            unknown = next(x for x in node.input if x and self.slots[x].value is None)
            self._declare_outputs(node, {})
            return self._verdict(index, node, None, opset=opset, assumes=notes,
                                 note=f"supported by op, attributes and types; shapes not checked ('{unknown}' "
                                      f"has no static shape: {_fmt_dims(self.slots[unknown].dims)})")
        if op == "Constant" and self._big_constant(node):
            return self._big_constant_verdict(index, node, name, opset)
        scope = _Scope(self.slots)
        for text in notes:
            scope.note(text)
        declared_out = self._declared_slot(node.output[0]) if node.output and node.output[0] else None
        ctx = _DryContext(scope, node, entry, opset, name, declared_out)
        try:
            results = entry.convert(ctx)
        except _Opaque as o:
            self._declare_outputs(node, {})
            scope.note(f"assumes operand {o.index} '{o.name}' (not read) is valid; output types as declared")
            return self._verdict(index, node, None, opset=opset, assumes=scope.assumes)
        except GlowpyError as e:
            self._declare_outputs(node, {})
            return self._verdict(index, node, e.at(node=name, op=op, opset=opset))
        except (ValueError, TypeError, IndexError, KeyError) as e:  # the importer's mapping of the same
            self._declare_outputs(node, {})
            return self._verdict(index, node, InternalError(f"conversion failed: {type(e).__name__}: {e}",
                                                            node=name, op=op, opset=opset))
        except AttributeError as e:  # the converter wants more of the importer than the dry run offers
            self._declare_outputs(node, {})
            return self._verdict(index, node, InternalError(f"the dry run cannot follow this converter: {e}",
                                                            node=name, op=op, opset=opset))
        outs = [o for o in node.output]
        if len([o for o in outs if o]) > len(results):
            self._declare_outputs(node, {})
            return self._verdict(index, node, InternalError(
                "converter produced fewer outputs than the node declares", node=name, op=op,
                expected=len(outs), found=len(results)))
        produced = {o: v for o, v in zip(outs, results) if o}
        err = self._declare_outputs(node, produced, name=name, opset=opset)
        if err is not None:
            return self._verdict(index, node, err)
        return self._refine(index, node, scope, opset)

    def _declare_outputs(self, node: NodeProto, produced: dict[str, Value], *, name: str = "",
                         opset: int | None = None) -> GlowpyError | None:
        """Record the node's outputs: inferred values where the dry run made them, else what the
        model declares. Returns the error for a duplicate or a disagreeing graph output."""
        for out in node.output:
            if not out:
                continue
            v = produced.get(out)
            if v is None:
                if out not in self.slots:
                    self.slots[out] = self._declared_slot(out) or self._schema_slots(node).get(out) or Slot()
                continue
            self.slots[out] = Slot(v.dtype, v.shape, v)
            info = self.graph_outputs.get(out)
            if info is not None:
                err = self._check_declared(info, v.type)
                if err is not None:
                    return err.at(node=name, op=node.op_type, opset=opset)
        return None

    def _schema_slots(self, node: NodeProto) -> dict[str, Slot]:
        """Output types of a node glowpy did not convert (rejected, or its output shape hangs on an
        unread operand), from ONNX's own inference over the input types, so the nodes after it are
        still checked. Best effort: {} when ONNX cannot tell."""
        types: dict[str, onnx.TypeProto] = {}
        data: dict[str, TensorProto] = {}
        for x in node.input:
            if not x:
                continue
            slot = self.slots.get(x)
            if slot is None or slot.dtype is None or slot.dims is None:
                return {}
            types[x] = helper.make_tensor_type_proto(dtype_to_onnx(slot.dtype), list(slot.dims))
            if slot.value is not None and slot.value.data is not None and slot.value.data.size <= FOLD_LIMIT:
                data[x] = numpy_helper.from_array(np.ascontiguousarray(slot.value.data), x)
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opsets.get(normalize_domain(node.domain), 1), node.domain)
            found = onnx.shape_inference.infer_node_outputs(schema, node, types, data, opset_imports=list(
                self.model.opset_import), ir_version=self.model.ir_version)
        except Exception:  # noqa: BLE001  (no schema, or ONNX's inference refuses: the types stay unknown)
            return {}
        out: dict[str, Slot] = {}
        for name, tp in found.items():
            info = helper.make_value_info(name, tp)
            try:
                dtype, dims = declared_type(info)
            except GlowpyError:
                continue
            shape = _static(dims)
            value = Value(name, TensorType(dtype, shape), "node") if dtype is not None and shape is not None else None
            out[name] = Slot(dtype, None if dims is None else tuple(dims), value)
        return out

    @staticmethod
    def _check_declared(info: ValueInfoProto, t: TensorType) -> GlowpyError | None:
        """The importer's graph-output rule: a declared element type or static dim must match inference."""
        try:
            dtype, dims = declared_type(info)
        except GlowpyError as e:
            return e
        if dtype is not None and dtype != t.dtype:
            return MismatchingDatatype(f"graph output '{info.name}' type disagrees with inference",
                                       expected=str(dtype), found=str(t.dtype))
        if dims is not None and (len(dims) != t.rank or any(isinstance(d, int) and d > 0 and d != s
                                                            for d, s in zip(dims, t.shape))):
            return MismatchingShape(f"graph output '{info.name}' shape disagrees with inference",
                                    expected=_fmt_dims(dims), found=list(t.shape))
        return None

    def _big_constant(self, node: NodeProto) -> bool:
        """A Constant whose tensor is a weight (large, or in an external file): typed, never read."""
        for a in node.attribute:
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                return math.prod(a.t.dims) > CONSTANT_LIMIT or a.t.data_location == TensorProto.EXTERNAL
        return False

    def _big_constant_verdict(self, index: int, node: NodeProto, name: str, opset: int) -> NodeVerdict:
        # A Constant holding a weight: typed from its dims and data_type, its payload is not read.
        t = next(a.t for a in node.attribute if a.name == "value")
        if len(node.attribute) != 1:
            self._declare_outputs(node, {})
            return self._verdict(index, node, UnsupportedAttribute(
                "Constant needs exactly one value attribute", node=name, op=node.op_type, opset=opset, expected=1,
                found=len(node.attribute)))
        try:
            dtype = dtype_from_onnx(t.data_type)
        except UnsupportedDatatype:
            self._declare_outputs(node, {})
            return self._verdict(index, node, UnsupportedDatatype(
                "constant element type not supported", node=name, op=node.op_type, opset=opset,
                found=TensorProto.DataType.Name(t.data_type)))
        dims = tuple(int(d) for d in t.dims)
        v = Value(node.output[0], TensorType(dtype, dims), "constant")
        err = self._declare_outputs(node, {node.output[0]: v}, name=name, opset=opset)
        if err is None:
            self.slots[node.output[0]].weight = True
        return self._verdict(index, node, err, opset=opset)

    def _refine(self, index: int, node: NodeProto, scope: _Scope, opset: int) -> NodeVerdict:
        """The backend's word on the IR nodes the dry run emitted."""
        be = self.backend
        name = node_display_name(node, index)
        if be is None or not scope.emitted:
            return self._verdict(index, node, None, opset=opset, assumes=scope.assumes)
        from glowpy.optimizer.lower import LOWERINGS

        lowered = []
        for ir in scope.emitted:
            try:
                # The optimizer lowers what the backend asks for and has a lowering for (Glow's shouldLower).
                if ir.op in LOWERINGS and be.should_lower(ir):
                    lowered.append(ir.op)
                    continue
                check = getattr(be, "check_node", None)  # optional: the backend's own precise error
                if check is not None:
                    check(ir)
                if not be.is_op_supported(ir):
                    types = ", ".join(str(v.type) for v in ir.inputs)
                    return self._verdict(index, node, UnsupportedOperator(
                        f"backend '{be.name}' cannot execute IR op {ir.op}", node=name, op=node.op_type,
                        opset=opset, expected="an op and types the backend implements", found=f"{ir.op}({types})"))
            except GlowpyError as e:
                return self._verdict(index, node, _rebuild(e, node=name, op=node.op_type, opset=opset))
        if lowered:
            return self._verdict(index, node, None, status=Status.FALLBACK, opset=opset, assumes=scope.assumes,
                                 note=f"supported through decomposition: backend '{be.name}' lowers "
                                      f"{', '.join(sorted(set(lowered)))} into simpler ops")
        return self._verdict(index, node, None, opset=opset, assumes=scope.assumes)


# --- the public entry ------------------------------------------------------------------------------------


def unreadable_report(err: GlowpyError, backend: str) -> CompatReport:
    return CompatReport([], [Issue(err.status, str(err))], backend=backend, readable=False)


def check(model: ModelLike, backend: str | Backend | None = "cpu",
          shapes: Mapping[str, Sequence[int] | int] | None = None) -> CompatReport:
    """Can `backend` run `model`? One verdict per node, from op types, attributes and declared types
    only: weights may be absent and are never read. Never raises for problems of the model itself
    (unreadable bytes give a report with `readable` False and INVALID_PROTOBUF / INVALID_MODEL).

    `backend` is consulted (`should_lower` -> FALLBACK, `is_op_supported`) when it is available; when
    it is not (yet), the op table alone decides and `report.backend_consulted` is False. `shapes`
    binds symbolic dims, as in `glowpy.load`.
    """
    be = resolve_backend(backend)
    be_name = backend if isinstance(backend, str) else (be.name if be is not None else "none")
    try:
        proto, _ = read_model(model)
    except GlowpyError as e:
        return unreadable_report(e, be_name)
    return Checker(proto, be, be_name, shapes).run()


__all__ = ["CompatReport", "Checker", "Issue", "NodeVerdict", "Slot", "check", "node_display_name",
           "resolve_backend", "topo_order"]
