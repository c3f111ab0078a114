"""What a converter sees of the node it converts: attributes, operands, and a way to emit IR."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, numpy_helper

from glowpy.errors import GlowpyError, InternalError, InvalidModel, UnsupportedAttribute, UnsupportedShape
from glowpy.importer.table import OnnxOp, attribute_values, require_const_operand, schema_defaults
from glowpy.ir.graph import Value

if TYPE_CHECKING:
    from glowpy.importer.walk import Body, Host
    from glowpy.ir.types import TensorType


def read_tensor(t: TensorProto, base_dir: str = "", what: str = "") -> np.ndarray:
    """The payload of an ONNX tensor (an initializer, a Constant's value). A payload that does not fit
    its dims or type is a broken model: InvalidModel, naming `what` (else the tensor)."""
    try:
        return numpy_helper.to_array(t, base_dir)
    except (OSError, ValueError, TypeError, onnx.checker.ValidationError) as e:
        raise InvalidModel(f"{what or f'tensor {t.name!r}'} cannot be read",
                           expected=f"a {TensorProto.DataType.Name(t.data_type)} payload of shape {list(t.dims)}",
                           found=str(e)) from None


class NodeContext:
    """One ONNX node being lowered onto IR ops, through the walk's host (which builds a graph, or
    only records types)."""

    def __init__(self, host: Host, node: NodeProto, entry: OnnxOp, opset: int, name: str) -> None:
        self.host = host
        self.node = node
        self.entry = entry
        self.opset = opset
        self.name = name
        self.attrs = attribute_values(node)
        self.declared: dict[str, Any] = {}  # ValueInfoProtos of the walked graph by name (set by the walk)
        self.walk_body: Callable[[str, Sequence[TensorType | np.ndarray]], Body] | None = None  # set by the walk

    def body(self, key: str, formals: Sequence[TensorType | np.ndarray]) -> Body:
        """Import the subgraph in attribute `key`, its formal inputs typed `formals` (an array: the formal's
        value, known at compile time); the walk recurses."""
        if self.walk_body is None:
            raise self.error(InvalidModel, "subgraphs are imported only inside the walk")
        return self.walk_body(key, formals)

    # --- errors with this node's context ------------------------------------------------------

    def error(self, cls: type[GlowpyError], message: str, **kw: Any) -> GlowpyError:
        return cls(message, node=self.name, op=self.node.op_type, opset=self.opset, **kw)

    def unsupported(self, message: str, **kw: Any) -> GlowpyError:
        return self.error(UnsupportedAttribute, message, **kw)

    # --- attributes and operands --------------------------------------------------------------

    def attr(self, key: str, default: Any = None) -> Any:
        """The attribute's value; when absent, `default` if given, else the ONNX schema's default at this
        node's opset (None when the schema has none)."""
        if key in self.attrs:
            return self.attrs[key]
        if default is not None:
            return default
        return schema_defaults(self.node.domain, self.node.op_type, self.opset).get(key)

    @property
    def num_inputs(self) -> int:
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def input(self, i: int) -> Value:
        if not self.has_input(i):
            raise self.error(InvalidModel, f"required input {i} is missing")
        return self.host.value(self.node.input[i], self)

    def inputs(self) -> list[Value]:
        return [self.input(i) for i in range(len(self.node.input)) if self.has_input(i)]

    def const(self, i: int, default: Any = None) -> np.ndarray | None:
        """The compile-time value of operand i (a weight, or computable from weights and shapes)."""
        if not self.has_input(i):
            return default
        require_const_operand(self.entry, i, node=self.name, opset=self.opset)
        v = self.input(i)
        data = self.host.compile_time_value(self, i, v)
        if data is None:
            raise self.error(UnsupportedShape, f"input {i} ('{v.name}') must be known at compile time",
                             expected="a constant or a value computed from constants", found="a runtime value")
        return data

    def const_or_runtime(self, i: int) -> np.ndarray | None:
        """Operand i's compile-time value, or None when it is a run-time value (the row lists i in
        `runtime_inputs`: the converter computes with it). Also None when the operand is absent."""
        if not self.has_input(i):
            return None
        if i not in self.entry.runtime_inputs:
            raise InternalError(f"the converter takes operand {i} at run time, but the op table row does not list "
                                f"it in runtime_inputs", node=self.name, op=self.entry.op_type, opset=self.opset,
                                expected=list(self.entry.runtime_inputs), found=i)
        require_const_operand(self.entry, i, node=self.name, opset=self.opset)
        return self.host.compile_time_value(self, i, self.input(i))

    def const_ints(self, i: int, default: Any = None) -> tuple[int, ...] | None:
        data = self.const(i)
        return default if data is None else tuple(int(x) for x in np.asarray(data).reshape(-1))

    def required_ints(self, i: int) -> tuple[int, ...]:
        """const_ints of an operand the op cannot do without (a missing one is an invalid model)."""
        self.input(i)
        return self.const_ints(i)

    def known(self, i: int) -> np.ndarray | None:
        """Operand i's value where it is known without reading a weight (for checks only: a converter
        must not depend on it to decide what it emits)."""
        return self.host.known_value(self.input(i)) if self.has_input(i) else None

    # --- emitting -----------------------------------------------------------------------------

    def emit(self, op: str, inputs: list[Value], attrs: dict[str, Any] | None = None) -> list[Value]:
        """Append an IR node (named after this ONNX node) and return its outputs. An attribute whose
        value is None is left out: the IR op's default applies (an ONNX attribute the node's opset lacks)."""
        if attrs:
            attrs = {k: v for k, v in attrs.items() if v is not None}
        try:
            return self.host.emit(self, op, inputs, attrs)
        except GlowpyError as e:
            raise e.at(node=self.name, op=self.node.op_type, opset=self.opset)

    def emit1(self, op: str, inputs: list[Value], attrs: dict[str, Any] | None = None) -> Value:
        return self.emit(op, inputs, attrs)[0]

    def constant(self, data: np.ndarray, suffix: str = "const") -> Value:
        return self.host.constant(self, np.asarray(data), suffix)

    def output_constant(self, i: int, data: np.ndarray) -> Value:
        """A constant that is this node's ONNX output i, named after that output when the name is free
        (so a graph output produced by Constant / Shape / ConstantOfShape keeps its ONNX name)."""
        return self.host.output_constant(self, i, np.asarray(data))

    def tensor_constant(self, i: int, tensor: TensorProto) -> Value:
        """Output i holding an attribute's tensor (the host decides whether to read its payload)."""
        return self.host.tensor_constant(self, i, tensor)

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < rank:
            raise self.unsupported("axis out of range", expected=f"-{rank}..{rank - 1}", found=axis)
        return axis % rank
