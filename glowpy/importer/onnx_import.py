"""The full importer: an ONNX ModelProto in, a verified IR Graph out."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import GraphProto, ModelProto, NodeProto, ValueInfoProto

from glowpy.errors import GlowpyError, InternalError, InvalidModel, InvalidProtobuf, UnsupportedShape
from glowpy.importer.context import NodeContext, read_tensor
from glowpy.importer.model_file import NotWireFormat, without_payloads
from glowpy.importer.table import OnnxOp
from glowpy.importer.walk import (
    MIN_IR_VERSION,
    Body,
    Host,
    OperandNotVisible,
    Walk,
    declared_type,
    fmt_dims,
    model_opsets,
)
from glowpy.ir.graph import Graph, Value
from glowpy.ir.ops import get_op
from glowpy.ir.types import TensorType


@dataclass(frozen=True)
class DeferredModel:
    """A model known by its content digest before its bytes are assembled: `load()` builds the proto
    and is called only when a compile needs it, so a model-cache hit never pays for it (ONNXIFI's
    weights, hashed where the host keeps them and copied only on a miss). `digest` must determine
    everything `load()` returns."""

    digest: str
    load: Callable[[], ModelProto]


ModelLike = bytes | bytearray | memoryview | str | os.PathLike | ModelProto | DeferredModel
ShapeMap = Mapping[str, Sequence[int] | int]


def read_model(model: ModelLike, *, lean: bool = False) -> tuple[ModelProto, str | None]:
    """Parse bytes, a path or a ModelProto; return the proto and the directory for external data.
    `lean`: a file's big initializer payloads stay in the file, as external data the import reads one
    at a time (model_file.py); only for a proto nobody but the importer sees."""
    if isinstance(model, DeferredModel):
        model = model.load()
    if isinstance(model, ModelProto):
        return model, None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise InvalidModel(f"cannot read model file '{path}': no such file")
        real = path.resolve()  # external data lives beside the file itself, not beside a link to it
        if lean:
            try:
                data = without_payloads(str(real))
            except (OSError, NotWireFormat):
                data = None  # the whole read below reports what is wrong
            if data is not None:
                return parse_model_bytes(data, origin=str(path)), str(real.parent)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise InvalidModel(f"cannot read model file '{path}': {e.strerror}") from None
        proto = parse_model_bytes(data, origin=str(path))
        del data  # the proto has its own copy; do not hold two during import
        return proto, str(real.parent)
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


class GraphHost(Host):
    """The walk's host that builds the IR graph: every error stops the import."""

    def __init__(self, model: ModelProto, base_dir: str | None, *, owns_proto: bool = False) -> None:
        self.model = model
        self.owns_proto = owns_proto  # parsed here from bytes or a file: free to consume
        self.base_dir = base_dir
        self.graph = Graph(model.graph.name or "model")
        self.values: dict[str, Value] = {}
        self._folded: dict[int, np.ndarray | None] = {}

    # --- declarations -------------------------------------------------------------------------------

    def model_error(self, err: GlowpyError, nodes: Sequence[NodeProto]) -> None:
        raise err

    def issue(self, err: GlowpyError) -> None:
        raise err

    def bad_value(self, name: str, err: GlowpyError, *, weight: bool) -> None:
        raise err

    def add_initializer(self, t: onnx.TensorProto, dtype: np.dtype) -> None:
        if t.data_location == onnx.TensorProto.EXTERNAL and self.base_dir is None:
            raise InvalidModel(f"initializer '{t.name}' is stored in an external file; load the model from "
                               f"its path so the file can be found")
        arr = read_tensor(t, self.base_dir or "", f"initializer '{t.name}'")
        arr.flags.writeable = False
        if self.owns_proto:
            # The array holds the data now: drop the proto's copy so import does not peak at 2x.
            t.ClearField("raw_data")
        self.values[t.name] = self.graph.add_constant(t.name, arr)

    def add_input(self, info: ValueInfoProto, dtype: np.dtype, dims: list[Any] | None) -> None:
        if dims is None:
            raise UnsupportedShape(f"graph input '{info.name}' has no declared shape; give it with shapes=",
                                   expected="a static shape", found="unknown rank")
        for d in dims:
            if not (isinstance(d, int) and d > 0):
                sym = f"'{d}'" if isinstance(d, str) else "an unknown dim"
                raise UnsupportedShape(
                    f"graph input '{info.name}' has symbolic dim {sym}; bind it with shapes="
                    f"{{'{info.name}': [...]}}" + (f" or shapes={{'{d}': N}}" if isinstance(d, str) else ""),
                    expected="static dims", found=fmt_dims(declared_type(info)[1]))
        self.values[info.name] = self.graph.add_input(info.name, TensorType(dtype, tuple(dims)))

    def _lookup(self, name: str) -> Value | None:
        return self.values.get(name)

    def is_defined(self, name: str) -> bool:
        return self._lookup(name) is not None

    def bound(self, name: str) -> Value | None:
        return self._lookup(name)

    def is_weight(self, name: str) -> bool:
        return name in self.graph.constants

    def dtype_of(self, name: str) -> np.dtype | None:
        v = self._lookup(name)
        return v.dtype if v is not None else None

    # --- per node -----------------------------------------------------------------------------------

    def node_error(self, index: int, node: NodeProto, err: GlowpyError) -> None:
        raise err

    def ready(self, index: int, node: NodeProto, entry: OnnxOp | None, opset: int, name: str) -> bool:
        for out in node.output:  # intermediate values the conversion emits must not take these names
            if out:
                self.graph.reserve(out)
        return True

    def not_followed(self, index: int, node: NodeProto, opset: int, signal: OperandNotVisible) -> None:
        raise InternalError("the graph-building host never hides an operand", node=node.name, op=node.op_type,
                            found=signal.name)

    def bind(self, name: str, v: Value) -> None:
        if v.producer is not None and v.name != name and not self.graph.has_name(name) and \
                not any(x is v for x in self.values.values()):
            self.graph.rename_value(v, name)  # keep ONNX names, unless already bound under one
        self.values[name] = v

    def node_done(self, index: int, node: NodeProto, opset: int) -> None:
        pass

    def release(self) -> None:
        """Forget the walk's name table and folded values. The host sits in reference cycles: they would
        keep every weight the optimizer replaces (BatchNorm folding) alive until the cyclic collector
        runs, which the passes pause: two copies of a model's weights at the peak."""
        self.values.clear()
        self._folded.clear()

    def finish(self, outputs: list[Value]) -> None:
        self.graph.outputs = outputs
        # Weights consumed at import (shape operands, ConstantOfShape sizes) are no longer referenced.
        self.graph.remove_unused_constants()
        self.graph.verify()

    # --- converter services -------------------------------------------------------------------------

    def value(self, name: str, ctx: NodeContext) -> Value:
        v = self._lookup(name)
        if v is None:
            raise ctx.error(InvalidModel, f"input '{name}' is not defined (no initializer, graph input or "
                                          f"node output has that name)")
        return v

    def compile_time_value(self, ctx: NodeContext, index: int, v: Value) -> np.ndarray | None:
        return self.known_value(v)

    def known_value(self, v: Value) -> np.ndarray | None:
        """A weight, or a node computed from weights (memoized), else None."""
        if v.data is not None:
            return v.data
        if v.producer is None:
            return None
        key = id(v)
        if key not in self._folded:
            node = v.producer
            args = [self.known_value(x) for x in node.inputs]
            results = None if any(a is None for a in args) else get_op(node.op).run(node.attrs, args)
            for out, res in zip(node.outputs, results or [None] * len(node.outputs)):
                self._folded[id(out)] = res
        return self._folded[key]

    def emit(self, ctx: NodeContext, op: str, inputs: list[Value], attrs: dict[str, Any] | None) -> list[Value]:
        return list(self.graph.add_node(op, inputs, attrs, name=ctx.name).outputs)

    def constant(self, ctx: NodeContext, data: np.ndarray, suffix: str) -> Value:
        return self.graph.add_constant(f"{ctx.name}.{suffix}", data, unique=True)

    def output_constant(self, ctx: NodeContext, i: int, data: np.ndarray) -> Value:
        out = ctx.node.output[i] if i < len(ctx.node.output) else ""
        if out and not self.graph.has_name(out):
            return self.graph.add_constant(out, data)
        return self.constant(ctx, data, f"output{i}")

    def tensor_constant(self, ctx: NodeContext, i: int, tensor: onnx.TensorProto) -> Value:
        return self.output_constant(ctx, i, read_tensor(tensor, self.base_dir or "", "the value"))

    # --- subgraph bodies ------------------------------------------------------------------------------

    def child(self, ctx: NodeContext, key: str, proto: GraphProto) -> Host:
        return BodyHost(self, proto.name or f"{ctx.name}.{key}")

    def formal(self, name: str, t: TensorType, data: np.ndarray | None = None) -> None:
        raise InternalError("only a body host has formal inputs", found=name)

    def close(self, ctx: NodeContext, key: str, outputs: list[Value | None]) -> Body:
        raise InternalError("only a body host is closed", found=key)


class BodyHost(GraphHost):
    """The graph-building host of a subgraph body. A name the body does not define resolves in the
    enclosing host: a weight is shared (a constant of the body, so shape operands stay known), any
    other value becomes a body input (a capture, passed by the control node as an operand)."""

    def __init__(self, parent: GraphHost, name: str) -> None:
        super().__init__(parent.model, parent.base_dir)
        self.parent = parent
        self.graph = Graph(name)
        self.captures: list[Value] = []

    def _lookup(self, name: str) -> Value | None:
        v = self.values.get(name)
        if v is None:
            outer = self.parent._lookup(name)
            if outer is None:
                return None
            outer_data = outer.data if outer.is_constant else self.parent.known_value(outer)
            if outer_data is not None:
                v = self.graph.add_constant(self.graph.unique_name(name), outer_data)
            else:
                v = self.graph.add_input(self.graph.unique_name(name), outer.type)  # after the formals
                self.captures.append(outer)
            self.values[name] = v
        return v

    def formal(self, name: str, t: TensorType, data: np.ndarray | None = None) -> None:
        self.values[name] = self.graph.add_input(name, t)
        if data is not None:  # the body still takes the input; its nodes read the known value
            self.values[name] = self.graph.add_constant(self.graph.unique_name(f"{name}.known"), data)

    def close(self, ctx: NodeContext, key: str, outputs: list[Value | None]) -> Body:
        g = self.graph
        missing = next((o.name for o, v in zip(ctx.attrs[key].g.output, outputs) if v is None), None)
        if missing is not None:
            raise InvalidModel(f"in its {key}, output '{missing}' is not defined", node=ctx.name,
                               op=ctx.node.op_type, opset=ctx.opset)
        g.outputs = outputs
        g.remove_unused_constants()
        g.verify()
        return Body(g, list(self.captures))


def import_model(model: ModelLike, shapes: ShapeMap | None = None, *, base_dir: str | None = None,
                 owned: bool = False) -> Graph:
    """Parse and import `model` (bytes, path or ModelProto). `shapes` binds symbolic input dims:
    by input name (a full shape) or by dim_param symbol (an int). A ModelProto the caller parsed itself
    may say where its external data lives (`base_dir`) and that the import may consume it (`owned`)."""
    proto, found_dir = read_model(model, lean=True)
    host = GraphHost(proto, base_dir or found_dir, owns_proto=owned or proto is not model)
    Walk(proto, host, shapes).run()
    host.release()
    return host.graph



__all__ = ["MIN_IR_VERSION", "BodyHost", "GraphHost", "ModelLike", "ShapeMap", "declared_type", "import_model", "model_opsets", "parse_model_bytes",
           "read_model"]
