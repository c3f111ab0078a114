"""The importer's one walk over a model, and the host interface it drives.

`Walk` visits a ModelProto once: opsets, initializers, graph inputs (with `shapes=` bindings), the
nodes in one topological order, each through the shared gate `check_node`, its converter from the op
table (or the function body it expands to) and the declared-output check. What happens to the values
is the host's business:

- `GraphHost` (onnx_import.py) builds the IR graph; any error stops the walk (`import_model`);
- `TypesHost` (compat.py) records types and one verdict per node, never reads an initializer payload,
  and carries on after an error (`glowpy.check`, `glowpy.partition`, ONNXIFI compatibility).

A converter sees only `NodeContext`, which talks to the host through `Host`. The one signal that means
"the check cannot follow this converter" is `OperandNotVisible` (raised by the types-only host when a
converter needs an operand value it does not read); any other non-GlowpyError exception out of a
converter is a bug and becomes InternalError in both modes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    TypeProto,
    ValueInfoProto,
    helper,
)

from glowpy.errors import (
    GlowpyError,
    InternalError,
    InvalidModel,
    InvalidName,
    InvalidShape,
    MismatchingDatatype,
    MismatchingShape,
    UnsupportedDatatype,
    UnsupportedOperator,
    UnsupportedShape,
    UnsupportedVersion,
)
from glowpy.importer import attention, control, indexing, nn, ops, quant, rnn, spectral  # noqa: F401  (the rows: each module registers its converters in the table)
from glowpy.importer.context import NodeContext
from glowpy.importer.functions import (
    MAX_DEPTH,
    Function,
    check_attributes,
    find_function,
    instantiate,
    needs_types,
)
from glowpy.importer.table import DATA_DEPENDENT, MAX_OPSET, MIN_OPSET, TABLE, check_node, normalize_domain
from glowpy.ir.types import TensorType, dtype_from_onnx, dtype_to_onnx, onnx_type_name
from glowpy.limits import check_tensor

if TYPE_CHECKING:
    from glowpy.importer.table import OnnxOp
    from glowpy.ir.graph import Graph, Value

ShapeMap = Mapping[str, Sequence[int] | int]

MIN_IR_VERSION = 3


class OperandNotVisible(Exception):  # noqa: N818  (a control-flow signal of the types-only host, not an error)
    """A converter needs the value of operand `index` ('name'), which the types-only host does not read."""

    def __init__(self, index: int, name: str) -> None:
        super().__init__(index, name)
        self.index = index
        self.name = name


# --- facts the walk shares with nobody else -------------------------------------------------------------


def model_opsets(model: ModelProto) -> dict[str, int]:
    opsets = {normalize_domain(o.domain): o.version for o in model.opset_import}
    if model.ir_version < MIN_IR_VERSION or model.ir_version > onnx.IR_VERSION:
        raise UnsupportedVersion("ONNX IR version not supported", expected=f"{MIN_IR_VERSION}..{onnx.IR_VERSION}",
                                 found=model.ir_version)
    ver = opsets.get("")
    if ver is not None and not MIN_OPSET <= ver <= MAX_OPSET:
        raise UnsupportedVersion("default-domain opset not supported", opset=ver,
                                 expected=f"{MIN_OPSET}..{MAX_OPSET}", found=ver)
    return opsets



def text(s: str | bytes) -> str:
    """A protobuf string field as text: protobuf hands back bytes when a field is not valid UTF-8."""
    return s.decode("utf-8", "replace") if isinstance(s, bytes) else s


def node_display_name(node: NodeProto, index: int) -> str:
    """The name errors and reports use for a node: its name, else its first output, else op_index."""
    return text(node.name or (node.output[0] if node.output and node.output[0] else f"{text(node.op_type)}_{index}"))


def reads(node: NodeProto) -> list[str]:
    """The names a node reads: its inputs, and those the nodes of its subgraph bodies read (an If's
    branch may use a value of the enclosing graph without naming it as an input)."""
    out = list(node.input)
    for a in node.attribute:
        for g in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)):
            for n in g.node:
                out += reads(n)
    return out


def topo_order(nodes: Sequence[NodeProto], known: set[str]) -> tuple[list[int], list[int]]:
    """Kahn's order over node indices (stable: model order among ready nodes), and the indices left
    over because they sit on or behind a cycle."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    users: dict[int, list[int]] = {}
    pending = []
    for i, n in enumerate(nodes):
        deps = {producer[x] for x in reads(n) if x and x not in known and x in producer} - {i}
        for j in deps:
            users.setdefault(j, []).append(i)
        pending.append(len(deps))
    ready = [i for i, c in enumerate(pending) if c == 0]
    head = 0
    while head < len(ready):
        i = ready[head]
        head += 1
        for u in users.get(i, ()):
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
    placed = set(ready)
    return ready, [i for i in range(len(nodes)) if i not in placed]


def fmt_dims(dims: Sequence[Any] | None) -> str:
    if dims is None:
        return "?"
    return "[" + ", ".join("?" if d is None or d == 0 else str(d) for d in dims) + "]"


def static_dims(dims: Sequence[Any] | None) -> tuple[int, ...] | None:
    if dims is None or not all(isinstance(d, int) and d > 0 for d in dims):
        return None
    return tuple(dims)


def declared_type(info: ValueInfoProto) -> tuple[np.dtype | None, list[int | str | None] | None]:
    """Element type and dims (int, symbol, or None for unknown) of a ValueInfoProto, without raising
    for unknown parts; raises UnsupportedDatatype for non-tensor or unsupported element types."""
    t = info.type
    if t.WhichOneof("value") not in (None, "tensor_type"):
        raise UnsupportedDatatype(f"'{info.name}' is a {t.WhichOneof('value')}, not a tensor",
                                  expected="tensor", found=t.WhichOneof("value"))
    tt = t.tensor_type
    dtype = None
    if tt.elem_type:
        try:
            dtype = dtype_from_onnx(tt.elem_type)
        except UnsupportedDatatype as e:
            raise UnsupportedDatatype(f"'{info.name}' has an unsupported element type",
                                      expected="a numeric or bool tensor",
                                      found=onnx_type_name(tt.elem_type)) from e
    if not tt.HasField("shape"):
        return dtype, None
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        kind = d.WhichOneof("value")
        dims.append(d.dim_value if kind == "dim_value" else d.dim_param if kind == "dim_param" else None)
    return dtype, dims


def initializer_dtype(t: TensorProto) -> np.dtype:
    """An initializer's element type (from data_type only: the payload is not touched)."""
    try:
        return dtype_from_onnx(t.data_type)
    except UnsupportedDatatype:
        found = onnx_type_name(t.data_type)
        raise UnsupportedDatatype(f"initializer '{t.name}' has an unsupported element type",
                                  expected="a numeric or bool tensor", found=found) from None


def bind_dims(name: str, dims: list[Any] | None, shapes: ShapeMap) -> list[Any] | None:
    """A graph input's dims with `shapes=` applied: a full shape by input name, or an int (or a
    one-element sequence) by dim_param symbol. Unbound symbols stay strings."""
    given = shapes.get(name)
    if given is not None:
        if isinstance(given, int):
            raise InvalidName(f"shapes['{name}'] must be a full shape, not an int", found=given)
        given = [int(d) for d in given]
        if any(d <= 0 for d in given):
            raise InvalidShape(f"shape given for input '{name}' has a non-positive dim", found=given)
        if dims is not None:
            if len(dims) != len(given):
                raise MismatchingShape(f"shape given for input '{name}' has the wrong rank",
                                       expected=f"rank {len(dims)} {fmt_dims(dims)}", found=given)
            if any(isinstance(d, int) and d > 0 and d != g for d, g in zip(dims, given)):
                raise MismatchingShape(f"shape given for input '{name}' disagrees with the model",
                                       expected=fmt_dims(dims), found=given)
        return given
    if dims is None:
        return None
    out: list[Any] = []
    for d in dims:
        val = shapes.get(d) if isinstance(d, str) else None
        if isinstance(val, (list, tuple)) and len(val) == 1:
            val = val[0]
        out.append(int(val) if isinstance(val, (int, np.integer)) else d)
    return out


def check_declared(info: ValueInfoProto, t: TensorType) -> GlowpyError | None:
    """A graph output's declared element type and static dims must match inference."""
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
                                expected=fmt_dims(dims), found=list(t.shape))
    return None


@dataclass
class Body:
    """An imported subgraph: `graph` takes the formal inputs, then one input per value it reads from the
    enclosing scope (`captures`, the outer values, in the same order). A types-only host may leave
    outer values unbound in the body (then `captures` is empty and `graph` holds only the formals and
    outputs). `verdicts`: what the host says of the body's nodes (the check's report)."""

    graph: Graph
    captures: list[Value] = field(default_factory=list)
    verdicts: list[Any] = field(default_factory=list)


# --- the host interface ---------------------------------------------------------------------------------


class Host(ABC):
    """What the walk and NodeContext need from the consumer of the walk."""

    # model-level declarations
    @abstractmethod
    def model_error(self, err: GlowpyError, nodes: Sequence[NodeProto]) -> None:
        """The model cannot be walked at all (IR version, default opset)."""

    @abstractmethod
    def issue(self, err: GlowpyError) -> None:
        """A model-level problem that belongs to no node."""

    @abstractmethod
    def add_initializer(self, t: TensorProto, dtype: np.dtype) -> None: ...

    @abstractmethod
    def add_input(self, info: ValueInfoProto, dtype: np.dtype, dims: list[Any] | None) -> None: ...

    @abstractmethod
    def bad_value(self, name: str, err: GlowpyError, *, weight: bool) -> None:
        """A graph input or initializer glowpy cannot hold (its users are unsupported)."""

    @abstractmethod
    def is_defined(self, name: str) -> bool: ...

    @abstractmethod
    def bound(self, name: str) -> Value | None:
        """The value bound to `name` when its type is fully known, else None."""

    @abstractmethod
    def is_weight(self, name: str) -> bool: ...

    @abstractmethod
    def dtype_of(self, name: str) -> np.dtype | None:
        """The element type of a named value, None when unknown or undefined."""

    # per node
    @abstractmethod
    def node_error(self, index: int, node: NodeProto, err: GlowpyError) -> None:
        """The node cannot be imported; `err` names it."""

    @abstractmethod
    def ready(self, index: int, node: NodeProto, entry: OnnxOp | None, opset: int, name: str) -> bool:
        """Whether the node's converter can run (False: the host gave the node its verdict)."""

    @abstractmethod
    def not_followed(self, index: int, node: NodeProto, opset: int, signal: OperandNotVisible) -> None:
        """The converter needed an operand value the host does not read."""

    @abstractmethod
    def bind(self, name: str, v: Value) -> None:
        """The ONNX value `name` is `v`."""

    @abstractmethod
    def node_done(self, index: int, node: NodeProto, opset: int) -> None: ...

    @abstractmethod
    def finish(self, outputs: list[Value]) -> None: ...

    # what converters reach through NodeContext
    @abstractmethod
    def value(self, name: str, ctx: NodeContext) -> Value:
        """The value bound to `name`; raises InvalidModel naming the node when there is none."""

    @abstractmethod
    def compile_time_value(self, ctx: NodeContext, index: int, v: Value) -> np.ndarray | None:
        """The value of a const operand (None: a run-time value). The types-only host may raise
        OperandNotVisible or give a stand-in, as the op table row allows."""

    @abstractmethod
    def known_value(self, v: Value) -> np.ndarray | None:
        """The value of `v` when it is known without reading a weight (best effort)."""

    @abstractmethod
    def emit(self, ctx: NodeContext, op: str, inputs: list[Value], attrs: dict[str, Any] | None) -> list[Value]: ...

    @abstractmethod
    def constant(self, ctx: NodeContext, data: np.ndarray, suffix: str) -> Value: ...

    @abstractmethod
    def output_constant(self, ctx: NodeContext, i: int, data: np.ndarray) -> Value: ...

    @abstractmethod
    def tensor_constant(self, ctx: NodeContext, i: int, tensor: TensorProto) -> Value:
        """Output i of the node holds the tensor of an attribute (a Constant's value)."""

    # subgraph bodies (If / Loop / Scan): the walk recurses with a child host
    @abstractmethod
    def child(self, ctx: NodeContext, key: str, proto: GraphProto) -> Host:
        """A host for the body in attribute `key` of the node: it sees this host's values (outer scope)."""

    @abstractmethod
    def formal(self, name: str, t: TensorType, data: np.ndarray | None = None) -> None:
        """(A child host) bind the body's formal input `name`; `data`: its value, known at compile time
        (a body specialized for it, as a loop unrolled at import is for each iteration number)."""

    @abstractmethod
    def close(self, ctx: NodeContext, key: str, outputs: list[Value | None]) -> Body:
        """(A child host) the body, its outputs `outputs`; raises the error that keeps it from being built."""


# --- the walk -------------------------------------------------------------------------------------------


class Walk:
    """One pass over `model` driving `host`. `order` is the topological order of the nodes."""

    def __init__(self, model: ModelProto, host: Host, shapes: ShapeMap | None = None) -> None:
        self.model = model
        self.host = host
        self.shapes = dict(shapes or {})
        self.opsets: dict[str, int] = {}
        self.order: list[int] = []
        self.graph_outputs: dict[str, ValueInfoProto] = {}
        self.declared: dict[str, ValueInfoProto] = {}  # value_info and outputs of the graph being walked

    def run(self) -> None:
        host = self.host
        g = self.model.graph
        nodes = list(g.node)
        try:
            self.opsets = model_opsets(self.model)
        except GlowpyError as e:
            host.model_error(e, nodes)
            return
        self._initializers(g.initializer)
        self._inputs(g.input)
        self.graph_outputs = {o.name: o for o in g.output}
        self.declared = {o.name: o for o in [*g.value_info, *g.output]}
        self.order, stuck = topo_order(nodes, {x.name for x in g.initializer} | {x.name for x in g.input})
        for i in self.order:
            self.convert(i, nodes[i])
        for i in stuck:
            n = nodes[i]
            host.node_error(i, n, InvalidModel(
                "the graph has a cycle", node=node_display_name(n, i), op=n.op_type, expected="an acyclic graph",
                found="cycle through " + ", ".join(repr(node_display_name(nodes[j], j)) for j in stuck[:6])))
        outs: list[Value] = []
        node_outs = {o for n in nodes for o in n.output}
        for info in g.output:
            if not host.is_defined(info.name):
                if info.name not in node_outs:
                    host.issue(InvalidModel(f"graph output '{info.name}' is not produced by any node, input or "
                                            f"initializer"))
                continue
            v = host.bound(info.name)
            if v is None:
                continue
            if info.name not in node_outs:  # an input or weight passed through (node outputs: checked at bind)
                err = check_declared(info, v.type)
                if err is not None:
                    host.issue(err)
            outs.append(v)
        host.finish(outs)

    def _initializers(self, inits: Sequence[TensorProto]) -> None:
        for t in inits:
            if self.host.is_defined(t.name):
                self.host.issue(InvalidModel(f"initializer '{t.name}' is defined twice"))
                continue
            try:
                dtype = initializer_dtype(t)
                check_tensor(t.name, dtype, t.dims)  # from its dims, before a byte is read
            except GlowpyError as e:
                self.host.bad_value(t.name, e, weight=True)
                continue
            self.host.add_initializer(t, dtype)

    def _inputs(self, inputs: Sequence[ValueInfoProto]) -> None:
        seen: set[str] = set()
        for info in inputs:
            if self.host.is_weight(info.name):
                continue  # IR v3 lists initializers among the inputs: they stay weights
            if info.name in seen:
                self.host.issue(InvalidModel(f"graph input '{info.name}' is declared twice"))
                continue
            seen.add(info.name)
            try:
                dtype, dims = declared_type(info)
                if dtype is None:
                    raise UnsupportedDatatype(f"graph input '{info.name}' declares no element type")
                dims = bind_dims(info.name, dims, self.shapes)
            except GlowpyError as e:
                self.host.bad_value(info.name, e, weight=False)
                continue
            self.host.add_input(info, dtype, dims)
        symbols = {d.dim_param for i in inputs for d in i.type.tensor_type.shape.dim if d.dim_param}
        unknown = set(self.shapes) - {i.name for i in inputs} - symbols
        if unknown:
            self.host.issue(InvalidName(f"shapes= names no graph input: {sorted(unknown)}",
                                        expected=sorted(i.name for i in inputs if not self.host.is_weight(i.name)),
                                        found=sorted(unknown)))

    # --- one node ----------------------------------------------------------------------------------------

    def convert(self, index: int, node: NodeProto) -> None:
        """Convert model node `index`; whatever goes wrong becomes its verdict (or its error)."""
        opset = self.opsets.get(normalize_domain(node.domain))
        try:
            if self._node(index, node, self.opsets, 0) and opset is not None:
                self.host.node_done(index, node, opset)
        except OperandNotVisible as o:
            self.host.not_followed(index, node, opset or 0, o)
        except GlowpyError as e:
            self.host.node_error(index, node, e)

    def _node(self, index: int, node: NodeProto, opsets: dict[str, int], depth: int) -> bool:
        """Gate, convert and bind one node (a model node at depth 0, else a function body's node).
        Raises the node's error; False when the host already gave the model node its verdict."""
        host = self.host
        name = node_display_name(node, index)
        if not node.op_type:
            raise InvalidModel("the node has no op_type", node=name)
        for out in node.output:
            if out and host.is_defined(out):  # SSA: every value has one producer
                raise InvalidModel(f"value '{out}' is produced twice", node=name, op=node.op_type)
        decides = DATA_DEPENDENT.get((normalize_domain(node.domain), node.op_type))
        if decides is not None:
            raise UnsupportedShape(f"the output shape of {node.op_type} depends on input values ({decides}): glowpy "
                                   f"compiles static shapes, the host runs this node", node=name, op=node.op_type,
                                   expected="an output shape that follows from input shapes and constant operands",
                                   found="a data-dependent output shape")
        if TABLE.get((normalize_domain(node.domain), node.op_type)) is None:
            types = self._input_types(node)
            function = find_function(node, opsets, self.model, types)
            if function is not None:
                return self._function(index, node, name, function, opsets, depth)
            if types is None and depth == 0 and needs_types(node, opsets) and \
                    not host.ready(index, node, None, opsets[normalize_domain(node.domain)], name):
                return False  # a body may exist for known types: the host says what it could check
        first = node.input[0] if node.input and node.input[0] else None
        try:
            entry, opset = check_node(node, opsets, [host.dtype_of(first) if first else None])
        except GlowpyError as e:
            raise e.at(node=name, op=node.op_type) from None
        self._inputs_defined(node, name, opset)
        if depth == 0 and not host.ready(index, node, entry, opset, name):
            return False
        ctx = NodeContext(host, node, entry, opset, name)
        ctx.walk_body = lambda key, formals: self.body(ctx, key, formals, opsets)
        ctx.declared = self.declared
        try:
            results = entry.convert(ctx)
        except (OperandNotVisible, GlowpyError) as e:
            if isinstance(e, GlowpyError):
                e.at(node=name, op=node.op_type, opset=opset)
            raise
        except Exception as e:  # noqa: BLE001  (a converter bug, whatever its class)
            raise InternalError(f"conversion failed: {type(e).__name__}: {e}", node=name, op=node.op_type,
                                opset=opset) from e
        outs = list(node.output)
        if len([o for o in outs if o]) > len(results):
            raise InternalError("converter produced fewer outputs than the node declares", node=name,
                                op=node.op_type, expected=len(outs), found=len(results))
        for out, v in zip(outs, results):
            if not out:
                continue
            host.bind(out, v)
            info = self.graph_outputs.get(out)
            if info is not None:
                err = check_declared(info, v.type)
                if err is not None:
                    raise err.at(node=name, op=node.op_type, opset=opset)
        return True

    def _function(self, index: int, node: NodeProto, name: str, function: Function, opsets: dict[str, int],
                  depth: int) -> bool:
        """Convert a node with no table row through its function body; errors name the node and the body
        node they come from."""
        opset = opsets[normalize_domain(node.domain)]
        if depth >= MAX_DEPTH:
            raise UnsupportedOperator("function bodies nest too deep (a recursive function?)", node=name,
                                      op=node.op_type, opset=opset, expected=f"at most {MAX_DEPTH} levels",
                                      found=depth)
        check_attributes(node, function, opset, name)
        self._inputs_defined(node, name, opset)
        if depth == 0 and not self.host.ready(index, node, None, opset, name):
            return False
        body = instantiate(node, function, opsets, name, self.host.is_defined)
        for b in body.nodes:
            try:
                if not self._node(index, b, body.opsets, depth + 1):
                    return False
            except GlowpyError as e:
                raise type(e)(f"in its function body, {e.args[0] if e.args else e.reason}", node=name,
                              op=node.op_type, opset=opset) from None
        return True

    # --- subgraph bodies ---------------------------------------------------------------------------------

    def body(self, ctx: NodeContext, key: str, formals: Sequence[TensorType | np.ndarray],
             opsets: dict[str, int]) -> Body:
        """Walk the subgraph in attribute `key` of the node in `ctx` with a child host (recursion: a body's
        nodes may carry bodies), its formal inputs typed `formals` (an array: a formal of known value)."""
        attr = ctx.attrs.get(key)
        if attr is None or not attr.HasField("g"):
            raise ctx.error(InvalidModel, f"attribute '{key}' (a graph) is missing")
        proto = attr.g
        if len(proto.input) != len(formals):
            raise ctx.error(InvalidModel, f"{key} declares {len(proto.input)} inputs", expected=len(formals),
                            found=len(proto.input))
        child = self.host.child(ctx, key, proto)
        for info, f in zip(proto.input, formals):
            data = f if isinstance(f, np.ndarray) else None
            t = TensorType.of(f) if data is not None else f
            dtype, _ = declared_type(info)
            if dtype is not None and dtype != t.dtype:
                raise ctx.error(MismatchingDatatype, f"{key} input '{info.name}' is declared {dtype}",
                                expected=str(t.dtype), found=str(dtype))
            child.formal(info.name, t, data)
        walk = Walk(self.model, child)
        walk.opsets = opsets
        return child.close(ctx, key, walk.run_body(proto))

    def run_body(self, g: GraphProto) -> list[Value | None]:
        """Walk a body's initializers and nodes (its formal inputs are bound); its output values (None:
        not produced with a static type; the host's `close` says why)."""
        host = self.host
        nodes = list(g.node)
        self._initializers(g.initializer)
        self.graph_outputs = {o.name: o for o in g.output}
        self.declared = {o.name: o for o in [*g.value_info, *g.output]}
        self.order, stuck = topo_order(nodes, set())
        for i in self.order:
            self.convert(i, nodes[i])
        for i in stuck:
            host.node_error(i, nodes[i], InvalidModel("the body has a cycle", node=node_display_name(nodes[i], i),
                                                      op=nodes[i].op_type))
        return [host.bound(info.name) if host.is_defined(info.name) else None for info in g.output]

    def _inputs_defined(self, node: NodeProto, name: str, opset: int) -> None:
        for x in node.input:
            if x and not self.host.is_defined(x):
                raise InvalidModel(f"input '{x}' is not defined (no initializer, graph input or node output has "
                                   f"that name)", node=name, op=node.op_type, opset=opset)

    def _input_types(self, node: NodeProto) -> list[TypeProto] | None:
        """The node's input types as ONNX TypeProtos (for a context-dependent function body), None
        when one is not fully known (onnx's body builders do not all survive a partial type)."""
        out = []
        for x in node.input:
            v = self.host.bound(x) if x else None
            if x and v is None:
                return None
            out.append(TypeProto() if v is None else helper.make_tensor_type_proto(dtype_to_onnx(v.dtype),
                                                                                   list(v.shape)))
        return out


__all__ = ["Body", "Host", "OperandNotVisible", "Walk", "bind_dims", "check_declared", "declared_type", "fmt_dims",
           "initializer_dtype", "model_opsets", "node_display_name", "static_dims", "topo_order"]
