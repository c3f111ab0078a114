"""The ONNX op table: what glowpy accepts, declared once per ONNX op.

Each entry names the ONNX op, the opsets glowpy handles, a rule for every attribute it
understands, the element types it accepts for its main operand (by default those of the IR op of
the same name), which operands must be known at compile time, and the converter that emits IR.
An ONNX op an IR op mirrors one to one needs no converter: `mirror` makes its row from the IR op
(ops.py calls `mirror_declared` for every IR op declared with `onnx=`). The importer's walk reads these
entries with both of its hosts (`check_node` is the shared gate), so the graph builder and the
compatibility check cannot drift. An ONNX op with no entry imports through its function body, if
it has one (functions.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import AttributeProto, NodeProto

from glowpy.errors import (
    InternalError,
    InvalidModel,
    UnsupportedAttribute,
    UnsupportedDatatype,
    UnsupportedOperator,
    UnsupportedVersion,
)
from glowpy.ir.ops import OPS
from glowpy.ir.ops.registry import to_python
from glowpy.ir.types import ALL_TYPES, FLOAT_TYPES, NUMERIC_TYPES

if TYPE_CHECKING:
    from glowpy.importer.context import NodeContext
    from glowpy.ir.graph import Value

MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()
DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class Rule:
    """An attribute rule: `ok(value)` says whether glowpy supports the value; `what` says which."""

    ok: Callable[[Any], bool]
    what: str


ANY = Rule(lambda v: True, "any value")
IGNORED = Rule(lambda v: True, "any value (ignored at inference)")


def one_of(*values: Any) -> Rule:
    return Rule(lambda v: v in values, "one of " + ", ".join(map(repr, values)))


def equals(value: Any, why: str = "") -> Rule:
    return Rule(lambda v: v == value, f"{value!r}" + (f" ({why})" if why else ""))


INT = Rule(lambda v: isinstance(v, int), "an integer")
POSITIVE = Rule(lambda v: isinstance(v, int) and v > 0, "a positive integer")
NON_NEGATIVE = Rule(lambda v: isinstance(v, int) and v >= 0, "a non-negative integer")
FLOAT = Rule(lambda v: isinstance(v, float), "a float")
POSITIVE_FLOAT = Rule(lambda v: isinstance(v, float) and v > 0, "a positive float")
INTS = Rule(lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v), "a list of integers")
POSITIVE_INTS = Rule(lambda v: isinstance(v, list) and all(isinstance(x, int) and x > 0 for x in v),
                     "a list of positive integers")
NON_NEGATIVE_INTS = Rule(lambda v: isinstance(v, list) and all(isinstance(x, int) and x >= 0 for x in v),
                         "a list of non-negative integers")
BOOL_INT = one_of(0, 1)
TENSOR = Rule(lambda v: isinstance(v, onnx.TensorProto), "a tensor")
AUTO_PAD = one_of("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

Converter = Callable[["NodeContext"], "list[Value]"]


@dataclass(frozen=True)
class OnnxOp:
    """One row of the table."""

    op_type: str
    convert: Converter
    attrs: dict[str, Rule] = field(default_factory=dict)
    # Element types of the main operand; None: those of the IR op of the same name (else float types).
    dtypes: frozenset | None = None
    since: int = MIN_OPSET  # lowest opset (of the op's domain) glowpy handles
    domain: str = ""
    const_inputs: tuple[int, ...] = ()  # operands whose value is needed at compile time
    max_outputs: int = 1  # how many of the ONNX outputs glowpy can produce
    # What the cheap path may do when a const operand is declared without data (a weight the host
    # supplies at init). `value_inputs` only set element values or a mode whose supported setting is
    # the neutral one (Clip bounds, Pad's fill, Dropout's training flag): a zero stand-in decides
    # support. `output_shape_input` is the output shape itself (Reshape, Expand, ConstantOfShape): the
    # declared output shape stands in. Any other const operand leaves the output types to declarations.
    value_inputs: tuple[int, ...] = ()
    output_shape_input: int | None = None
    # Const operands the converter also takes as run-time values (Clip bounds): never specialized. The
    # others in `const_inputs`, fed as graph inputs, specialize the model per fed value (specialize.py).
    runtime_inputs: tuple[int, ...] = ()

    @property
    def specialized_inputs(self) -> tuple[int, ...]:
        return tuple(k for k in self.const_inputs if k not in self.runtime_inputs)

    def __post_init__(self) -> None:
        if self.dtypes is None:
            opdef = OPS.get(self.op_type)
            object.__setattr__(self, "dtypes", opdef.dtypes if opdef is not None else FLOAT_TYPES)
        roles = (set(self.value_inputs) | set(self.runtime_inputs)
                 | ({self.output_shape_input} if self.output_shape_input is not None else set()))
        if not roles <= set(self.const_inputs):
            raise InternalError(f"op table row {self.op_type}: value_inputs / runtime_inputs / output_shape_input must be listed in "
                                f"const_inputs", expected=list(self.const_inputs), found=sorted(roles))


TABLE: dict[tuple[str, str], OnnxOp] = {}

# ONNX ops whose output shape follows from the values of an input, not from shapes and constant
# operands: glowpy compiles static shapes, so both paths refuse them (UNSUPPORTED_SHAPE) before a row
# or a function body is looked at, and glowpy.partition leaves them to the host. What decides the shape:
DATA_DEPENDENT: dict[tuple[str, str], str] = {
    ("", "NonZero"): "the number of non-zero elements of X",
    ("", "NonMaxSuppression"): "how many boxes survive, from the box and score values",
    ("", "Unique"): "the number of distinct values of X",
    ("", "Compress"): "the number of true elements of condition",
}


def onnx_op(op_type: str, **kwargs: Any) -> Callable[[Converter], Converter]:
    """Register the decorated converter as the table entry for `op_type`."""

    def wrap(fn: Converter) -> Converter:
        entry = OnnxOp(op_type, fn, **kwargs)
        TABLE[(entry.domain, op_type)] = entry
        return fn

    return wrap


_PY_TYPES = {AttributeProto.FLOAT: Rule(lambda v: isinstance(v, float), "a float"),
             AttributeProto.INT: Rule(lambda v: isinstance(v, int), "an integer"),
             AttributeProto.STRING: Rule(lambda v: isinstance(v, str), "a string"),
             AttributeProto.FLOATS: Rule(lambda v: isinstance(v, list) and all(isinstance(x, float) for x in v),
                                         "a list of floats"),
             AttributeProto.INTS: Rule(lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v),
                                       "a list of integers")}


def mirror(ir_op: str, op_type: str | None = None) -> OnnxOp:
    """Register the row of an ONNX op that IR op `ir_op` mirrors one to one (`OpDef.onnx`, else its own
    name): operands and attributes pass straight through, element types are the IR op's, an attribute
    is accepted if the IR op declares it (its type from the ONNX schema, its value checked by the IR
    op), and the opsets are those from which on the schema's attributes are all the IR op's."""
    opdef = OPS[ir_op]
    op_type = op_type or opdef.onnx or ir_op
    schema = onnx.defs.get_schema(op_type, MAX_OPSET, "")
    attrs = {k: _PY_TYPES.get(a.type, ANY) for k, a in schema.attributes.items() if k in opdef.attrs}
    since, ver = schema.since_version, schema.since_version - 1
    while ver >= MIN_OPSET:
        try:
            older = onnx.defs.get_schema(op_type, ver, "")
        except onnx.defs.SchemaError:
            break
        if not set(older.attributes) <= set(opdef.attrs):
            break
        since, ver = older.since_version, older.since_version - 1

    lo, hi = opdef.inputs

    def convert(ctx: NodeContext) -> list[Value]:
        inputs = ctx.inputs()
        if len(inputs) < lo or (hi is not None and len(inputs) > hi):
            raise ctx.error(InvalidModel, "wrong number of inputs", expected=f"{lo}..{hi if hi is not None else 'n'}",
                            found=len(inputs))
        return ctx.emit(ir_op, inputs, {k: tuple(v) if isinstance(v, list) else v for k, v in ctx.attrs.items()})

    entry = OnnxOp(op_type, convert, attrs, opdef.dtypes, since=max(since, MIN_OPSET))
    TABLE[("", op_type)] = entry
    return entry


def mirror_declared() -> None:
    """Rows for every IR op declared with `onnx=` that has no row of its own."""
    for opdef in list(OPS.values()):
        if opdef.onnx is not None and ("", opdef.onnx) not in TABLE:
            mirror(opdef.name)


def require_const_operand(entry: OnnxOp, index: int, *, node: str | None = None, opset: int | None = None) -> None:
    """Converters may read an operand's value at compile time only if the table says so: the cheap
    path plans from `const_inputs`, so a converter that reads more would make the two paths drift."""
    if index not in entry.const_inputs:
        raise InternalError(f"the converter reads operand {index} at compile time, but the op table row does not "
                            f"list it in const_inputs", node=node, op=entry.op_type, opset=opset,
                            expected=list(entry.const_inputs), found=index)


def normalize_domain(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


def lookup(node: NodeProto, opsets: dict[str, int]) -> tuple[OnnxOp, int]:
    """The table entry for a node and the opset it is read under, or the Unsupported* error."""
    domain = normalize_domain(node.domain)
    name = node.name or None
    entry = TABLE.get((domain, node.op_type))
    if entry is None:
        where = f" in domain '{node.domain}'" if domain else ""
        raise UnsupportedOperator(f"operator {node.op_type}{where} is not supported", node=name, op=node.op_type)
    opset = opsets.get(domain)
    if opset is None:
        raise UnsupportedVersion(f"the model imports no opset for domain '{node.domain or 'ai.onnx'}'",
                                 node=name, op=node.op_type)
    if opset < entry.since or (domain == "" and opset > MAX_OPSET):
        raise UnsupportedVersion("opset not supported for this operator", node=name, op=node.op_type, opset=opset,
                                 expected=f"{entry.since}..{MAX_OPSET}", found=opset)
    return entry, opset


def attribute_values(node: NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH or a.type == AttributeProto.GRAPHS:
            out[a.name] = a  # subgraphs are never supported; keep the proto for the message
        else:
            v = onnx.helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [x.decode("utf-8", "replace") for x in v]
            out[a.name] = v
    return out


_SCHEMA_DEFAULTS: dict[tuple[str, str, int], dict[str, Any]] = {}


def schema_defaults(domain: str, op_type: str, opset: int) -> dict[str, Any]:
    """The attribute defaults of an ONNX op's schema at `opset` (empty when onnx knows no schema)."""
    key = (domain, op_type, opset)
    found = _SCHEMA_DEFAULTS.get(key)
    if found is None:
        try:
            schema = onnx.defs.get_schema(op_type, opset, normalize_domain(domain))
        except onnx.defs.SchemaError:
            found = {}
        else:
            found = {k: to_python(onnx.helper.get_attribute_value(a.default_value))
                     for k, a in schema.attributes.items() if a.default_value.type}
        _SCHEMA_DEFAULTS[key] = found
    return found


def check_node(node: NodeProto, opsets: dict[str, int], input_dtypes: list[np.dtype | None]) -> tuple[OnnxOp, int]:
    """The shared gate: op, domain, opset, every attribute, the main operand's element type.

    `input_dtypes` are the declared element types of the node's inputs (None where unknown).
    Raises the Unsupported* error a host would get; returns the entry and opset otherwise.
    """
    entry, opset = lookup(node, opsets)
    name = node.name or None
    for key, value in attribute_values(node).items():
        rule = entry.attrs.get(key)
        if rule is None:
            raise UnsupportedAttribute(f"attribute '{key}' is not supported", node=name, op=node.op_type,
                                       opset=opset, expected=sorted(entry.attrs) or "no attributes", found=key)
        if not rule.ok(value):
            shown = value if not isinstance(value, (onnx.TensorProto, AttributeProto)) else type(value).__name__
            raise UnsupportedAttribute(f"attribute '{key}' has an unsupported value", node=name, op=node.op_type,
                                       opset=opset, expected=rule.what, found=shown)
    if input_dtypes and input_dtypes[0] is not None and input_dtypes[0] not in entry.dtypes:
        raise UnsupportedDatatype("element type not supported", node=name, op=node.op_type, opset=opset,
                                  expected=sorted(str(d) for d in entry.dtypes), found=str(input_dtypes[0]))
    if len(node.output) > entry.max_outputs and any(node.output[entry.max_outputs:]):
        raise UnsupportedOperator(f"only the first {entry.max_outputs} output(s) can be produced", node=name,
                                  op=node.op_type, opset=opset, expected=entry.max_outputs, found=len(node.output))
    return entry, opset


__all__ = [
    "ALL_TYPES", "ANY", "AUTO_PAD", "BOOL_INT", "DATA_DEPENDENT", "FLOAT", "IGNORED", "INT", "INTS", "NON_NEGATIVE",
    "NON_NEGATIVE_INTS", "NUMERIC_TYPES", "POSITIVE", "POSITIVE_FLOAT", "POSITIVE_INTS", "TABLE", "TENSOR",
    "OnnxOp", "Rule", "check_node", "mirror", "mirror_declared", "schema_defaults", "equals", "lookup", "one_of", "onnx_op", "require_const_operand",
]
