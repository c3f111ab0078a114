"""The cheap compatibility path: a verdict for every node, from declarations only.

A host asks "can you run this?" with a model whose weights may be absent (declared graph inputs,
or initializers whose payload is not wanted). This module answers without reading a single
initializer payload and without building a `Graph`:

it is the importer's own walk (`walk.Walk`: model checks, the shared gate `check_node`, the same
converters and function bodies, the declared-output check) with `Checker` as its host, which
records types instead of building a graph:

- every IR op a converter emits goes through the op declaration's `make_attrs` and `infer_types`,
  exactly as `Graph.add_node` would do it, so shape and type rules are never restated here;
  shape-like values (Shape outputs, Constant nodes, small folds of those) are computed;
- a compile-time operand whose value is not visible (a weight) is handled as the op table row says
  (`value_inputs`, `output_shape_input`); otherwise the converter stops with `OperandNotVisible`,
  the output types come from declarations and the verdict records what it assumed;
- the backend's `should_lower` (FALLBACK) and `is_op_supported` refine the verdict on the IR nodes
  the conversion emitted.

Every node gets a verdict; a failure never stops the others.

One file: the report types and the types-only host that fills them are read together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto, helper, numpy_helper

from glowpy.errors import (
    GlowpyError,
    InternalError,
    InvalidModel,
    Status,
    UnsupportedDatatype,
    UnsupportedOperator,
    UnsupportedShape,
)
from glowpy.importer.context import NodeContext, read_tensor
from glowpy.importer.onnx_import import ModelLike, read_model
from glowpy.importer.specialize import TYPE_ONLY_OPS, shape_operands
from glowpy.importer.table import OnnxOp, normalize_domain
from glowpy.importer.walk import (
    Body,
    Host,
    OperandNotVisible,
    Walk,
    declared_type,
    fmt_dims,
    node_display_name,
    static_dims,
    text,
    topo_order,
)
from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops import get_op
from glowpy.ir.types import TensorType, dtype_from_onnx, dtype_to_onnx

if TYPE_CHECKING:
    from glowpy.backends.base import Backend


OK_STATUSES = frozenset({Status.SUCCESS, Status.FALLBACK})
FOLD_LIMIT = 4096  # elements: shape-like values are computed during the check; bigger ones stay types
CONSTANT_LIMIT = 4096  # elements: a bigger Constant node is a weight, typed from its dims only
SHAPE_LIMIT = 64  # elements: an integer initializer this small is a shape, axes or indices, read as the full path does


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
    # A control node's body nodes (If / Loop / Scan), named '<node>/<attribute>/<body node>', nested alike.
    body: tuple[NodeVerdict, ...] = ()

    @property
    def supported(self) -> bool:
        return self.status in OK_STATUSES

    def walk(self) -> list[NodeVerdict]:
        """This verdict and those of its body nodes, depth first."""
        return [self, *(w for b in self.body for w in b.walk())]

    def to_dict(self) -> dict[str, Any]:
        out = {"index": self.index, "name": self.name, "op": self.op, "domain": self.domain,
               "status": self.status.name, "code": int(self.status), "reason": self.reason,
               "assumes": list(self.assumes)}
        if self.body:
            out["body"] = [b.to_dict() for b in self.body]
        return out


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
    runtime: bool = False  # computed from run-time inputs (what marks a slot without a static Value)

    @property
    def type(self) -> TensorType | None:
        return self.value.type if self.value is not None else None


def _rebuild(err: GlowpyError, *, node: str, op: str, opset: int | None = None) -> GlowpyError:
    """A copy of `err` naming this node (the original may belong to a value shared by many nodes)."""
    return type(err)(err.reason, node=node, op=op, opset=opset, expected=err.expected, found=err.found)


def _small_ints(t: TensorProto, dtype: np.dtype, dims: tuple[int, ...]) -> np.ndarray | None:
    """The value of a tiny integer (or bool: a mode flag) initializer stored in the model, else None (a
    weight, or a placeholder the host fills at init)."""
    if dtype.kind not in "iub" or math.prod(dims) > SHAPE_LIMIT or t.data_location == TensorProto.EXTERNAL:
        return None
    try:
        data = numpy_helper.to_array(t)
    except (ValueError, TypeError):
        return None
    return data if data.shape == dims else None


class Checker(Host):
    """The walk's types-only host: one run over a ModelProto (`run()` gives the report). It records
    what is known about every value in `slots` (the partitioner declares subgraph boundaries from it),
    never reads an initializer payload, and gives every node a verdict: a failure never stops the
    others. `order` is the walk's topological order."""

    def __init__(self, model: ModelProto, backend: Backend | None, backend_name: str,
                 shapes: Mapping[str, Sequence[int] | int] | None = None) -> None:
        self.model = model
        self.backend = backend
        self.backend_name = backend_name
        self.slots: dict[str, Slot] = {}
        self.issues: list[Issue] = []
        self.verdicts: dict[int, NodeVerdict] = {}
        self.assumes: list[str] = []
        self._unused_bad: dict[str, GlowpyError] = {}
        self.errors: dict[int, GlowpyError] = {}  # the error behind each rejected node's verdict
        self._declared: dict[str, ValueInfoProto] = {}
        # the node being converted: what its verdict assumes, the IR nodes it emitted
        self._notes: list[str] = []
        self._emitted: list[Node] = []
        # Values computed from run-time inputs (ids): no compile time knows them. Graph inputs that decide
        # shapes are not among them: they specialize the model (importer/specialize.py).
        self._runtime: set[int] = set()
        self._specialized: set[str] = set()
        self._body: dict[str, list[NodeVerdict]] = {}  # verdicts of the current node's body nodes, per body
        self._walk = Walk(model, self, shapes)

    def run(self) -> CompatReport:
        if not self.model.HasField("graph"):
            return self._report([Issue(Status.INVALID_MODEL, "the model has no graph")])
        g = self.model.graph
        self._declared = {vi.name: vi for vi in list(g.value_info) + list(g.output)}
        self._specialized = set(shape_operands(self.model))
        self._walk.run()
        used = {x for n in g.node for x in n.input}
        for name, err in self._unused_bad.items():
            if name not in used:
                self.issues.append(Issue(err.status, str(err)))
        self.assumes = [s.runtime_note for name, s in self.slots.items() if s.runtime_note and name not in used]
        return self._report(self.issues)

    @property
    def order(self) -> list[int]:
        """The walk's topological order of the nodes (those on a cycle left out)."""
        return self._walk.order

    def _report(self, issues: list[Issue]) -> CompatReport:
        verdicts = [self.verdicts[i] for i in range(len(self.model.graph.node))] if issues is self.issues else []
        return CompatReport(verdicts, list(issues), backend=self.backend_name,
                            backend_consulted=self.backend is not None, assumes=list(self.assumes))

    # --- declarations --------------------------------------------------------------------------------

    def model_error(self, err: GlowpyError, nodes: Sequence[NodeProto]) -> None:
        # Nothing can be imported under an unsupported IR version or default opset: say so per node.
        for i, n in enumerate(nodes):
            self.verdicts[i] = self._verdict(i, n, _rebuild(err, node=node_display_name(n, i), op=n.op_type,
                                                            opset=err.opset))
        self.issue(err)

    def issue(self, err: GlowpyError) -> None:
        self.issues.append(Issue(err.status, str(err)))

    def add_initializer(self, t: TensorProto, dtype: np.dtype) -> None:
        # Only dims and data_type for weights: even len(t.raw_data) would copy the payload. An empty
        # weight's value is known without reading anything; a tiny integer one (a shape, axes, indices:
        # what decides output shapes and sizes) is read, so shapes follow as on the full path.
        dims = tuple(int(d) for d in t.dims)
        data = np.zeros(dims, dtype) if 0 in dims else _small_ints(t, dtype, dims)
        self.slots[t.name] = Slot(dtype, dims, Value(t.name, TensorType(dtype, dims), "constant", data=data),
                                  weight=True)

    def add_input(self, info: ValueInfoProto, dtype: np.dtype, dims: list[Any] | None) -> None:
        if dims is not None and any(d == 0 for d in dims):
            # A zero extent is a zero-size tensor in ONNX: its value is known without data. glowpy
            # has no zero-size runtime buffers, so it must be a weight given at init.
            empty = None
            if all(isinstance(d, int) for d in dims):
                empty = Value(info.name, TensorType(dtype, dims), "input", data=np.zeros(dims, dtype))
            note = f"assumes '{info.name}' (zero-size) is a weight given at init, not a runtime input"
            self.slots[info.name] = Slot(dtype, tuple(dims), empty, runtime_note=note)
            return
        shape = static_dims(dims)
        value = Value(info.name, TensorType(dtype, shape), "input") if shape is not None else None
        if value is not None and info.name not in self._specialized:
            self._runtime.add(id(value))
        self.slots[info.name] = Slot(dtype, None if dims is None else tuple(dims), value,
                                     runtime=info.name not in self._specialized)

    def bad_value(self, name: str, err: GlowpyError, *, weight: bool) -> None:
        self.slots[name] = Slot(error=err, weight=weight)
        self._unused_bad[name] = err

    def _slot(self, name: str) -> Slot | None:
        return self.slots.get(name)

    def is_defined(self, name: str) -> bool:
        return self._slot(name) is not None

    def bound(self, name: str) -> Value | None:
        slot = self._slot(name)
        return slot.value if slot is not None else None

    def is_weight(self, name: str) -> bool:
        slot = self._slot(name)
        return slot is not None and slot.weight

    def dtype_of(self, name: str) -> np.dtype | None:
        slot = self._slot(name)
        return slot.dtype if slot is not None else None

    # --- per node --------------------------------------------------------------------------------------

    def node_error(self, index: int, node: NodeProto, err: GlowpyError) -> None:
        self._declare_outputs(node)
        self.verdicts[index] = self._verdict(index, node, err.at(node=node_display_name(node, index),
                                                                 op=node.op_type))

    def ready(self, index: int, node: NodeProto, entry: OnnxOp | None, opset: int, name: str) -> bool:
        self._notes, self._emitted = [], []
        slots = [(k, self._slot(x)) for k, x in enumerate(node.input) if x]
        for _, slot in slots:
            if slot.error is not None:
                raise _rebuild(slot.error, node=name, op=node.op_type, opset=opset)
        for k, slot in slots:
            if slot.runtime_note and (entry is None or k not in entry.const_inputs):
                self._note(slot.runtime_note)
        unknown = next((x for x in node.input if x and self._slot(x).value is None), None)
        if unknown is not None:
            self._declare_outputs(node)
            self.verdicts[index] = self._verdict(
                index, node, None, opset=opset, assumes=self._notes,
                note=f"supported by op, attributes and types; shapes not checked ('{unknown}' has no static "
                     f"shape: {fmt_dims(self._slot(unknown).dims)})")
            return False
        return True

    def not_followed(self, index: int, node: NodeProto, opset: int, signal: OperandNotVisible) -> None:
        self._declare_outputs(node)
        self._note(f"assumes operand {signal.index} '{signal.name}' (not read) is valid; output types as declared")
        self.verdicts[index] = self._verdict(index, node, None, opset=opset, assumes=self._notes)

    def bind(self, name: str, v: Value) -> None:
        self.slots[name] = Slot(v.dtype, v.shape, v, weight=v.kind == "constant" and v.data is None)

    def node_done(self, index: int, node: NodeProto, opset: int) -> None:
        self.verdicts[index] = self._refine(index, node, opset)

    def finish(self, outputs: list[Value]) -> None:
        pass

    # --- converter services: types, and values only where they cost nothing to know ----------------------

    def value(self, name: str, ctx: NodeContext) -> Value:
        slot = self._slot(name)
        if slot is None or slot.value is None:
            raise ctx.error(InvalidModel, f"input '{name}' is not defined (no initializer, graph input or "
                                          f"node output has that name)")
        return slot.value

    def compile_time_value(self, ctx: NodeContext, index: int, v: Value) -> np.ndarray | None:
        """A weight's value is not read: what the op table row allows stands in for it (see OnnxOp)."""
        if v.data is not None:
            return v.data
        if id(v) in self._runtime:
            return None  # computed from run-time inputs: the full path does not know it either
        if index in ctx.entry.value_inputs:
            self._note(f"assumes operand {index} '{v.name}' (not read) has a supported value")
            return np.zeros(v.shape, dtype=v.dtype)
        if index == ctx.entry.output_shape_input:
            out = self._declared_slot(ctx.node.output[0]) if ctx.node.output and ctx.node.output[0] else None
            shape = static_dims(out.dims) if out is not None else None
            if shape is not None:
                self._note(f"assumes operand {index} '{v.name}' (not read) is the declared output shape")
                return np.array(shape, dtype=np.int64)
        raise OperandNotVisible(index, v.name)

    def known_value(self, v: Value) -> np.ndarray | None:
        if v.data is None:
            self._note(f"assumes the value of '{v.name}' (not read) is valid")
        return v.data

    def emit(self, ctx: NodeContext, op: str, inputs: list[Value], attrs: dict[str, Any] | None) -> list[Value]:
        """Type inference exactly as Graph.add_node does it, without a graph."""
        opdef = get_op(op)
        full = opdef.make_attrs(dict(attrs or {}), node=ctx.name)
        types = opdef.infer_types(full, [v.type for v in inputs], node=ctx.name)
        node = Node(op, ctx.name, list(inputs), [], full)
        node.outputs = [Value(f"{ctx.name}:{k}", t, "node", producer=node) for k, t in enumerate(types)]
        self._emitted.append(node)
        if any(id(v) in self._runtime for v in inputs):
            self._runtime.update(id(v) for v in node.outputs)
        # Fold small shape-like computations, as the graph host's known_value() would on demand.
        if (all(v.data is not None and v.data.size <= FOLD_LIMIT for v in inputs)
                and all(t.size <= FOLD_LIMIT for t in types)):
            for out, arr in zip(node.outputs, opdef.run(full, [v.data for v in inputs])):
                out.data = np.asarray(arr)
        return list(node.outputs)

    def constant(self, ctx: NodeContext, data: np.ndarray, suffix: str) -> Value:
        return Value(f"{ctx.name}.{suffix}", TensorType.of(data), "constant", data=data)

    def output_constant(self, ctx: NodeContext, i: int, data: np.ndarray) -> Value:
        return self.constant(ctx, data, f"output{i}")

    def tensor_constant(self, ctx: NodeContext, i: int, tensor: TensorProto) -> Value:
        """A big (or external) tensor is a weight: typed from its dims, its payload not read."""
        if math.prod(tensor.dims) > CONSTANT_LIMIT or tensor.data_location == TensorProto.EXTERNAL:
            dims = tuple(int(d) for d in tensor.dims)
            return Value(ctx.node.output[i], TensorType(dtype_from_onnx(tensor.data_type), dims), "constant")
        return self.output_constant(ctx, i, read_tensor(tensor, what="the value"))

    # --- subgraph bodies: a child checker per body, its verdicts reported under the control node ---------

    def child(self, ctx: NodeContext, key: str, proto: GraphProto) -> Host:
        return BodyChecker(self, proto, f"{ctx.name}/{key}")

    def formal(self, name: str, t: TensorType, data: np.ndarray | None = None) -> None:
        raise InternalError("only a body checker has formal inputs", found=name)

    def close(self, ctx: NodeContext, key: str, outputs: list[Value | None]) -> Body:
        raise InternalError("only a body checker is closed", found=key)

    # --- helpers ----------------------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)

    def _declared_slot(self, name: str) -> Slot | None:
        info = self._declared.get(name)
        if info is None:
            return None
        try:
            dtype, dims = declared_type(info)
        except UnsupportedDatatype:
            return None
        shape = static_dims(dims)
        value = Value(name, TensorType(dtype, shape), "node") if dtype is not None and shape is not None else None
        return Slot(dtype, None if dims is None else tuple(dims), value)

    def _verdict(self, index: int, node: NodeProto, err: GlowpyError | None, *, status: Status = Status.SUCCESS,
                 note: str = "", assumes: Sequence[str] = (), opset: int | None = None) -> NodeVerdict:
        name = node_display_name(node, index)
        if err is not None:
            status, reason = err.status, str(err)
            self.errors[index] = err
        else:
            where = f"node '{name}' ({text(node.op_type)}" + (f", opset {opset})" if opset is not None else ")")
            reason = f"{where}: {note or 'supported'}"
            if assumes:
                reason += "; " + "; ".join(assumes)
        body, self._body = tuple(v for vs in self._body.values() for v in vs), {}
        return NodeVerdict(index, name, text(node.op_type), text(node.domain), status, reason, tuple(assumes),
                           body)

    def _declare_outputs(self, node: NodeProto) -> None:
        """Outputs of a node the check did not convert: what the model declares, else ONNX's inference,
        so the nodes after it are still checked."""
        schema: dict[str, Slot] | None = None
        ins = [self.slots.get(x) for x in node.input if x]
        # Outputs computed from the values of specialized inputs or weights are known at compile time,
        # whether or not the check knows their shapes.
        runtime = node.op_type not in TYPE_ONLY_OPS and any(
            x is None or x.runtime or id(x.value) in self._runtime for x in ins)
        for out in node.output:
            if out and out not in self.slots:
                slot = self._declared_slot(out)
                if slot is None:
                    schema = self._schema_slots(node) if schema is None else schema
                    slot = schema.get(out)
                self.slots[out] = slot = slot or Slot()
                if runtime:
                    slot.runtime = True
                    if slot.value is not None:
                        self._runtime.add(id(slot.value))

    def _schema_slots(self, node: NodeProto) -> dict[str, Slot]:
        """Output types of a node glowpy did not convert (rejected, or its output shape hangs on an
        unread operand), from ONNX's own inference over the input types, so the nodes after it are
        still checked. Best effort: {} when ONNX cannot tell."""
        types: dict[str, onnx.TypeProto] = {}
        data: dict[str, TensorProto] = {}
        for x in node.input:
            if not x:
                continue
            slot = self._slot(x)
            if slot is None or slot.dtype is None or slot.dims is None:
                return {}
            types[x] = helper.make_tensor_type_proto(dtype_to_onnx(slot.dtype), list(slot.dims))
            if slot.value is not None and slot.value.data is not None and slot.value.data.size <= FOLD_LIMIT:
                data[x] = numpy_helper.from_array(np.ascontiguousarray(slot.value.data), x)
        try:
            opset = self._walk.opsets.get(normalize_domain(node.domain), 1)
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
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
            shape = static_dims(dims)
            value = Value(name, TensorType(dtype, shape), "node") if dtype is not None and shape is not None else None
            out[name] = Slot(dtype, None if dims is None else tuple(dims), value)
        return out

    def _refine(self, index: int, node: NodeProto, opset: int) -> NodeVerdict:
        """The backend's word on the IR nodes the node's conversion emitted."""
        be = self.backend
        name = node_display_name(node, index)
        if be is None or not self._emitted:
            return self._verdict(index, node, None, opset=opset, assumes=self._notes)
        lowered = []
        for ir in self._emitted:
            try:
                check = getattr(be, "check_node", None)  # optional: the backend's own precise error
                if check is not None:
                    check(ir)
                if be.is_op_supported(ir):
                    continue
                # No native kernel, but the optimizer decomposes it for this backend (Glow's shouldLower):
                # supported through decomposition, which ONNXIFI reports as FALLBACK.
                if be.should_lower(ir):
                    lowered.append(ir.op)
                    continue
                types = ", ".join(str(v.type) for v in ir.inputs)
                return self._verdict(index, node, UnsupportedOperator(
                    f"backend '{be.name}' cannot execute IR op {ir.op}", node=name, op=node.op_type,
                    opset=opset, expected="an op and types the backend implements", found=f"{ir.op}({types})"))
            except GlowpyError as e:
                return self._verdict(index, node, _rebuild(e, node=name, op=node.op_type, opset=opset))
        if lowered:
            return self._verdict(index, node, None, status=Status.FALLBACK, opset=opset, assumes=self._notes,
                                 note=f"supported through decomposition: backend '{be.name}' lowers "
                                      f"{', '.join(sorted(set(lowered)))} into simpler ops")
        return self._verdict(index, node, None, opset=opset, assumes=self._notes)


class BodyChecker(Checker):
    """The types-only host of a subgraph body: a name it does not define is the enclosing scope's
    (shared as it is: the check builds no graph). Its verdicts go to the control node's verdict."""

    def __init__(self, parent: Checker, proto: GraphProto, prefix: str) -> None:
        super().__init__(parent.model, parent.backend, parent.backend_name)
        self.parent = parent
        self.prefix = prefix
        self.proto = proto
        self._declared = {vi.name: vi for vi in list(proto.value_info) + list(proto.output)}
        self._walk.opsets = parent._walk.opsets  # for ONNX's inference of the outputs of rejected body nodes
        self.graph = Graph(prefix)

    def _slot(self, name: str) -> Slot | None:
        slot = self.slots.get(name)
        return slot if slot is not None else self.parent._slot(name)

    def formal(self, name: str, t: TensorType, data: np.ndarray | None = None) -> None:
        v = self.graph.add_input(name, t)
        if data is not None:
            v = Value(f"{name}.known", t, "constant", data=data)
        self.slots[name] = Slot(t.dtype, t.shape, v)

    def close(self, ctx: NodeContext, key: str, outputs: list[Value | None]) -> Body:
        verdicts = [replace(v, name=f"{self.prefix}/{v.name}") for _, v in sorted(self.verdicts.items())]
        self.parent._body[self.prefix] = verdicts  # a body imported again (specialized) replaces its verdicts
        bad = next((i for i, v in sorted(self.verdicts.items()) if not v.supported), None)
        if bad is not None:
            err = self.errors[bad]
            raise type(err)(f"in its {key}, {err}", node=ctx.name, op=ctx.node.op_type, opset=ctx.opset)
        missing = next((o.name for o, v in zip(self.proto.output, outputs) if v is None), None)
        if missing is not None:
            raise UnsupportedShape(f"in its {key}, output '{missing}' has no static shape", node=ctx.name,
                                   op=ctx.node.op_type, opset=ctx.opset, expected="a static shape",
                                   found=fmt_dims(self._slot(missing).dims if self._slot(missing) else None))
        self.graph.outputs = outputs
        return Body(self.graph, [], verdicts)


# --- the public entry ------------------------------------------------------------------------------------


def unreadable_report(err: GlowpyError, backend: str) -> CompatReport:
    return CompatReport([], [Issue(err.status, str(err))], backend=backend, readable=False)


def check(model: ModelLike, backend: Backend | None = None,
          shapes: Mapping[str, Sequence[int] | int] | None = None, *, backend_name: str | None = None
          ) -> CompatReport:
    """Can `backend` run `model`? One verdict per node, from op types, attributes and declared types
    only: weights may be absent and are never read. Never raises for problems of the model itself
    (unreadable bytes give a report with `readable` False and INVALID_PROTOBUF / INVALID_MODEL).

    `backend` (an object; `glowpy.check` finds it by name) refines the verdicts (`is_op_supported`,
    `should_lower` -> FALLBACK); None: the op table alone decides and `report.backend_consulted` is
    False. `shapes` binds symbolic dims, as in `glowpy.load`.
    """
    be_name = backend_name or (backend.name if backend is not None else "none")
    try:
        proto, _ = read_model(model)
    except GlowpyError as e:
        return unreadable_report(e, be_name)
    return Checker(proto, backend, be_name, shapes).run()


__all__ = ["BodyChecker", "CompatReport", "Checker", "Issue", "NodeVerdict", "Slot", "check", "node_display_name",
           "topo_order"]
