"""What a converter sees of the node it converts: attributes, operands, and a way to emit IR."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import NodeProto

from glowpy.errors import GlowpyError, InvalidModel, UnsupportedAttribute, UnsupportedShape
from glowpy.importer.table import OnnxOp, attribute_values, require_const_operand
from glowpy.ir.graph import Value

if TYPE_CHECKING:
    from glowpy.importer.onnx_import import Importer


class NodeContext:
    """One ONNX node being lowered onto IR ops."""

    def __init__(self, importer: Importer, node: NodeProto, entry: OnnxOp, opset: int, name: str) -> None:
        self.importer = importer
        self.graph = importer.graph
        self.node = node
        self.entry = entry
        self.opset = opset
        self.name = name
        self.attrs = attribute_values(node)

    # --- errors with this node's context ------------------------------------------------------

    def error(self, cls: type[GlowpyError], message: str, **kw: Any) -> GlowpyError:
        return cls(message, node=self.name, op=self.node.op_type, opset=self.opset, **kw)

    def unsupported(self, message: str, **kw: Any) -> GlowpyError:
        return self.error(UnsupportedAttribute, message, **kw)

    # --- attributes and operands --------------------------------------------------------------

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    @property
    def num_inputs(self) -> int:
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def input(self, i: int) -> Value:
        if not self.has_input(i):
            raise self.error(InvalidModel, f"required input {i} is missing")
        return self.importer.value_of(self.node.input[i], self)

    def inputs(self) -> list[Value]:
        return [self.input(i) for i in range(len(self.node.input)) if self.has_input(i)]

    def const(self, i: int, default: Any = None) -> np.ndarray | None:
        """The compile-time value of operand i (a weight, or computable from weights and shapes)."""
        if not self.has_input(i):
            return default
        require_const_operand(self.entry, i, node=self.name, opset=self.opset)
        v = self.input(i)
        data = self.importer.evaluate(v)
        if data is None:
            raise self.error(UnsupportedShape, f"input {i} ('{v.name}') must be known at compile time",
                             expected="a constant or a value computed from constants", found="a runtime value")
        return data

    def const_ints(self, i: int, default: Any = None) -> tuple[int, ...] | None:
        data = self.const(i)
        return default if data is None else tuple(int(x) for x in np.asarray(data).reshape(-1))

    def required_ints(self, i: int) -> tuple[int, ...]:
        """const_ints of an operand the op cannot do without (a missing one is an invalid model)."""
        self.input(i)
        return self.const_ints(i)

    # --- emitting -----------------------------------------------------------------------------

    def emit(self, op: str, inputs: list[Value], attrs: dict[str, Any] | None = None) -> list[Value]:
        """Append an IR node (named after this ONNX node) and return its outputs."""
        try:
            node = self.graph.add_node(op, inputs, attrs, name=self.name)
        except GlowpyError as e:
            raise e.at(node=self.name, op=self.node.op_type, opset=self.opset)
        return list(node.outputs)

    def emit1(self, op: str, inputs: list[Value], attrs: dict[str, Any] | None = None) -> Value:
        return self.emit(op, inputs, attrs)[0]

    def constant(self, data: np.ndarray, suffix: str = "const") -> Value:
        return self.graph.add_constant(f"{self.name}.{suffix}", np.asarray(data), unique=True)

    def output_constant(self, i: int, data: np.ndarray) -> Value:
        """A constant that is this node's ONNX output i, named after that output when the name is free
        (so a graph output produced by Constant / Shape / ConstantOfShape keeps its ONNX name)."""
        out = self.node.output[i] if i < len(self.node.output) else ""
        if out and not self.graph.has_name(out):
            return self.graph.add_constant(out, np.asarray(data))
        return self.constant(data, f"output{i}")

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < rank:
            raise self.unsupported("axis out of range", expected=f"-{rank}..{rank - 1}", found=axis)
        return axis % rank
