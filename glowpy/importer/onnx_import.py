"""The full importer: an ONNX ModelProto in, a verified IR Graph out."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, NodeProto, ValueInfoProto, numpy_helper

from glowpy.errors import (
    GlowpyError,
    InternalError,
    InvalidModel,
    InvalidName,
    InvalidProtobuf,
    InvalidShape,
    MismatchingDatatype,
    MismatchingShape,
    UnsupportedDatatype,
    UnsupportedShape,
    UnsupportedVersion,
)
from glowpy.importer.context import NodeContext
from glowpy.importer.table import MAX_OPSET, MIN_OPSET, check_node, normalize_domain
from glowpy.ir.graph import Graph, Value
from glowpy.ir.ops import get_op
from glowpy.ir.types import TensorType, dtype_from_onnx

ModelLike = bytes | bytearray | memoryview | str | os.PathLike | ModelProto
ShapeMap = Mapping[str, Sequence[int] | int]

MIN_IR_VERSION = 3


def read_model(model: ModelLike) -> tuple[ModelProto, str | None]:
    """Parse bytes, a path or a ModelProto; return the proto and the directory for external data."""
    if isinstance(model, ModelProto):
        return model, None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise InvalidModel(f"cannot read model file '{path}': no such file")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise InvalidModel(f"cannot read model file '{path}': {e.strerror}") from None
        proto = parse_model_bytes(data, origin=str(path))
        del data  # the proto has its own copy; do not hold two during import
        return proto, str(path.resolve().parent)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return parse_model_bytes(bytes(model)), None
    raise InvalidModel(f"cannot load a model from {type(model).__name__}",
                       expected="bytes, a path or an onnx.ModelProto", found=type(model).__name__)


def parse_model_bytes(data: bytes, origin: str = "model bytes") -> ModelProto:
    if not data:
        raise InvalidProtobuf(f"{origin}: empty input", expected="a serialized ModelProto", found="0 bytes")
    proto = ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidProtobuf(f"{origin}: not an ONNX model ({e})", expected="a serialized ModelProto",
                              found=f"{len(data)} bytes that do not parse") from None
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise InvalidProtobuf(f"{origin}: not an ONNX model (no graph or IR version)",
                              expected="a serialized ModelProto", found=f"{len(data)} bytes")
    return proto


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
                                      found=onnx.TensorProto.DataType.Name(tt.elem_type)) from e
    if not tt.HasField("shape"):
        return dtype, None
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        kind = d.WhichOneof("value")
        dims.append(d.dim_value if kind == "dim_value" else d.dim_param if kind == "dim_param" else None)
    return dtype, dims


def toposort_nodes(nodes: Sequence[NodeProto], known: set[str]) -> list[NodeProto]:
    """Kahn's order over ONNX nodes (models are meant to be sorted; not all are). A cycle raises."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{producer[x] for x in n.input if x and x not in known and x in producer} for n in nodes]
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    pending = [len(d) for d in deps]
    ready = [i for i, c in enumerate(pending) if c == 0]
    order: list[int] = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for u in users.get(i, []):
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
    if len(order) != len(nodes):
        stuck = [nodes[i] for i, c in enumerate(pending) if c > 0]
        first = stuck[0]
        raise InvalidModel("the graph has a cycle", node=first.name or first.output[0], op=first.op_type,
                           expected="acyclic graph", found="cycle through " + ", ".join(
                               repr(n.name or n.output[0]) for n in stuck[:6]))
    return [nodes[i] for i in order]


class Importer:
    """Lowers one ModelProto onto a Graph. Use `import_model`."""

    def __init__(self, model: ModelProto, shapes: ShapeMap | None, base_dir: str | None, *,
                 owns_proto: bool = False) -> None:
        self.model = model
        self.owns_proto = owns_proto  # parsed here from bytes or a file: free to consume
        self.base_dir = base_dir
        self.shapes = dict(shapes or {})
        self.opsets = model_opsets(model)
        self.graph = Graph(model.graph.name or "model")
        self.values: dict[str, Value] = {}
        self._folded: dict[int, np.ndarray | None] = {}

    # --- operand access used by converters ----------------------------------------------------

    def value_of(self, name: str, ctx: NodeContext) -> Value:
        v = self.values.get(name)
        if v is None:
            raise ctx.error(InvalidModel, f"input '{name}' is not defined (no initializer, graph input or "
                                          f"node output has that name)")
        return v

    def evaluate(self, v: Value) -> np.ndarray | None:
        """Compile-time value of `v`: a weight, or a node computed from weights (memoized), else None."""
        if v.data is not None:
            return v.data
        if v.producer is None:
            return None
        key = id(v)
        if key not in self._folded:
            node = v.producer
            args = [self.evaluate(x) for x in node.inputs]
            results = None if any(a is None for a in args) else get_op(node.op).run(node.attrs, args)
            for out, res in zip(node.outputs, results or [None] * len(node.outputs)):
                self._folded[id(out)] = res
        return self._folded[key]

    # --- the import -----------------------------------------------------------------------------

    def run(self) -> Graph:
        g = self.model.graph
        self._import_initializers(g.initializer)
        self._import_inputs(g.input)
        unknown = set(self.shapes) - {i.name for i in g.input} - self._symbols(g.input)
        if unknown:
            raise InvalidName(f"shapes= names no graph input: {sorted(unknown)}",
                              expected=sorted(i.name for i in g.input if i.name not in self.graph.constants),
                              found=sorted(unknown))
        for i, node in enumerate(toposort_nodes(g.node, set(self.values))):
            self._convert(node, i)
        outs = []
        for info in g.output:
            v = self.values.get(info.name)
            if v is None:
                raise InvalidModel(f"graph output '{info.name}' is not produced by any node, input or initializer")
            self._check_declared(info, v)
            outs.append(v)
        self.graph.outputs = outs
        # Weights consumed at import (shape operands, ConstantOfShape sizes) are no longer referenced.
        self.graph.remove_unused_constants()
        self.graph.verify()
        return self.graph

    def _symbols(self, inputs: Sequence[ValueInfoProto]) -> set[str]:
        return {d.dim_param for i in inputs for d in i.type.tensor_type.shape.dim if d.dim_param}

    def _import_initializers(self, inits: Sequence[onnx.TensorProto]) -> None:
        for t in inits:
            if t.name in self.values:
                raise InvalidModel(f"initializer '{t.name}' is defined twice")
            try:
                dtype_from_onnx(t.data_type)
            except UnsupportedDatatype:
                raise UnsupportedDatatype(f"initializer '{t.name}' has an unsupported element type",
                                          expected="a numeric or bool tensor",
                                          found=onnx.TensorProto.DataType.Name(t.data_type)) from None
            if t.data_location == onnx.TensorProto.EXTERNAL and self.base_dir is None:
                raise InvalidModel(f"initializer '{t.name}' is stored in an external file; load the model from "
                                   f"its path so the file can be found")
            try:
                arr = numpy_helper.to_array(t, self.base_dir or "")
            except (OSError, ValueError, onnx.checker.ValidationError) as e:
                raise InvalidModel(f"initializer '{t.name}' cannot be read: {e}") from None
            arr.flags.writeable = False
            if self.owns_proto:
                # The array holds the data now: drop the proto's copy so import does not peak at 2x.
                t.ClearField("raw_data")
            self.values[t.name] = self.graph.add_constant(t.name, arr)

    def _import_inputs(self, inputs: Sequence[ValueInfoProto]) -> None:
        for info in inputs:
            if info.name in self.graph.constants:
                continue  # IR v3 lists initializers among the inputs: they stay weights
            if info.name in self.values:
                raise InvalidModel(f"graph input '{info.name}' is declared twice")
            self.values[info.name] = self.graph.add_input(info.name, self._input_type(info))

    def _input_type(self, info: ValueInfoProto) -> TensorType:
        dtype, dims = declared_type(info)
        if dtype is None:
            raise UnsupportedDatatype(f"graph input '{info.name}' declares no element type")
        given = self.shapes.get(info.name)
        if given is not None:
            if isinstance(given, int):
                raise InvalidName(f"shapes['{info.name}'] must be a full shape, not an int", found=given)
            given = tuple(int(d) for d in given)
            if any(d <= 0 for d in given):
                raise InvalidShape(f"shape given for input '{info.name}' has a non-positive dim", found=list(given))
            if dims is not None:
                if len(dims) != len(given):
                    raise MismatchingShape(f"shape given for input '{info.name}' has the wrong rank",
                                           expected=f"rank {len(dims)} {self._fmt(dims)}", found=list(given))
                for d, g in zip(dims, given):
                    if isinstance(d, int) and d > 0 and d != g:
                        raise MismatchingShape(f"shape given for input '{info.name}' disagrees with the model",
                                               expected=self._fmt(dims), found=list(given))
            return TensorType(dtype, given)
        if dims is None:
            raise UnsupportedShape(f"graph input '{info.name}' has no declared shape; give it with shapes=",
                                   expected="a static shape", found="unknown rank")
        shape = []
        for d in dims:
            if isinstance(d, int) and d > 0:
                shape.append(d)
            elif isinstance(d, str) and self._symbol(d) is not None:
                shape.append(self._symbol(d))
            else:
                sym = f"'{d}'" if isinstance(d, str) else "an unknown dim"
                raise UnsupportedShape(
                    f"graph input '{info.name}' has symbolic dim {sym}; bind it with shapes="
                    f"{{'{info.name}': [...]}}" + (f" or shapes={{'{d}': N}}" if isinstance(d, str) else ""),
                    expected="static dims", found=self._fmt(dims))
        return TensorType(dtype, tuple(shape))

    def _symbol(self, sym: str) -> int | None:
        """A symbolic dim bound by shapes={sym: N} (an int or a one-element sequence)."""
        val = self.shapes.get(sym)
        if isinstance(val, int):
            return val
        if isinstance(val, (tuple, list)) and len(val) == 1:
            return int(val[0])
        return None

    @staticmethod
    def _fmt(dims: Sequence[Any]) -> str:
        return "[" + ", ".join("?" if d is None or d == 0 else str(d) for d in dims) + "]"

    def _node_name(self, node: NodeProto, index: int) -> str:
        return node.name or (node.output[0] if node.output and node.output[0] else f"{node.op_type}_{index}")

    def _convert(self, node: NodeProto, index: int) -> None:
        name = self._node_name(node, index)
        dtypes = [self.values[x].dtype if x in self.values else None for x in node.input[:1]]
        try:
            entry, opset = check_node(node, self.opsets, dtypes)
        except GlowpyError as e:
            raise e.at(node=name, op=node.op_type)
        ctx = NodeContext(self, node, entry, opset, name)
        for x in node.input:
            if x:
                self.value_of(x, ctx)  # dangling names fail here, naming the node
        try:
            results = entry.convert(ctx)
        except GlowpyError as e:
            raise e.at(node=name, op=node.op_type, opset=opset)
        except (ValueError, TypeError, IndexError, KeyError) as e:
            raise InternalError(f"conversion failed: {type(e).__name__}: {e}", node=name, op=node.op_type,
                                opset=opset) from e
        outs = [o for o in node.output]
        for out_name, v in zip(outs, results):
            if not out_name:
                continue
            if out_name in self.values:
                raise InvalidModel(f"value '{out_name}' is produced twice", node=name, op=node.op_type)
            if v.producer is not None and v.name != out_name and not self.graph.has_name(out_name):
                self._rename(v, out_name)
            self.values[out_name] = v
        if len([o for o in outs if o]) > len(results):
            raise InternalError("converter produced fewer outputs than the node declares", node=name,
                                op=node.op_type, expected=len(outs), found=len(results))

    def _rename(self, v: Value, new: str) -> None:
        if any(x is v for x in self.values.values()):
            return  # already bound under an ONNX name; keep it
        self.graph.rename_value(v, new)

    def _check_declared(self, info: ValueInfoProto, v: Value) -> None:
        dtype, dims = declared_type(info)
        if dtype is not None and dtype != v.dtype:
            raise MismatchingDatatype(f"graph output '{info.name}' type disagrees with inference",
                                      expected=str(dtype), found=str(v.dtype))
        if dims is not None:
            if len(dims) != v.type.rank or any(isinstance(d, int) and d > 0 and d != s for d, s in zip(dims, v.shape)):
                raise MismatchingShape(f"graph output '{info.name}' shape disagrees with inference",
                                       expected=self._fmt(dims), found=list(v.shape))


def import_model(model: ModelLike, shapes: ShapeMap | None = None) -> Graph:
    """Parse and import `model` (bytes, path or ModelProto). `shapes` binds symbolic input dims:
    by input name (a full shape) or by dim_param symbol (an int)."""
    from glowpy.importer import ops  # noqa: F401  (fills the op table)

    proto, base_dir = read_model(model)
    return Importer(proto, shapes, base_dir, owns_proto=proto is not model).run()

