"""ONNX function ops: the body a node without a table row expands to.

An op whose schema has a function body (or a context-dependent one, built for the node's attributes
and input types), or a model-local function (`model.functions`), imports by instantiating that body
for the node: formal inputs and outputs become the node's actual names, internal names are made
unique under the node's name, and attribute references (`ref_attr_name`) take the node's attribute or
the declared default. The walk then converts the body's nodes with the same converters, recursively.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx
from onnx import AttributeProto, FunctionProto, ModelProto, NodeProto, TypeProto

from glowpy.errors import UnsupportedAttribute
from glowpy.importer.table import normalize_domain

MAX_DEPTH = 16  # nested function bodies: deeper means a recursive definition


@dataclass
class Function:
    """The function a node expands to, with the attribute defaults and types that apply to it."""

    proto: FunctionProto
    defaults: dict[str, AttributeProto]
    types: dict[str, int]  # AttributeProto.AttributeType per declared attribute (schema functions)


@dataclass
class Body:
    """A function body instantiated for one node: its nodes, and the opsets they are read under."""

    nodes: list[NodeProto]
    opsets: dict[str, int]


def _schema(node: NodeProto, opsets: dict[str, int]) -> onnx.defs.OpSchema | None:
    if not isinstance(node.op_type, str) or not isinstance(node.domain, str):
        return None  # a name that is not UTF-8 (protobuf hands it over as bytes): no schema has it
    ver = opsets.get(normalize_domain(node.domain))
    if ver is None:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, ver, node.domain)
    except onnx.defs.SchemaError:
        return None


def _pick(versions: Sequence[int], opset: int) -> int | None:
    usable = [v for v in versions if v <= opset]
    return max(usable) if usable else None


def find_function(node: NodeProto, opsets: dict[str, int], model: ModelProto | None,
                  input_types: list[TypeProto] | None) -> Function | None:
    """The FunctionProto `node` expands to and the attribute defaults that apply, or None.
    `input_types` are the node's input types, for a context-dependent body (None: not known)."""
    if model is not None:
        for f in model.functions:
            if f.name == node.op_type and f.domain == node.domain:
                return Function(f, {a.name: a for a in f.attribute_proto}, {})
    schema = _schema(node, opsets)
    if schema is None:
        return None
    opset = opsets[normalize_domain(node.domain)]
    defaults = {k: a.default_value for k, a in schema.attributes.items() if a.default_value.type}
    types = {k: int(a.type) for k, a in schema.attributes.items()}
    if schema.has_function:
        ver = _pick(schema.function_opset_versions, opset)
        if ver is not None:
            return Function(FunctionProto.FromString(schema.get_function_with_opset_version(ver)), defaults, types)
    if schema.has_context_dependent_function:
        ver = _pick(schema.context_dependent_function_opset_versions, opset)
        if ver is not None and input_types is not None:
            data = schema.get_context_dependent_function_with_opset_version(
                ver, node.SerializeToString(), [t.SerializeToString() for t in input_types])
            if data:
                return Function(FunctionProto.FromString(data), defaults, types)
    return None


def needs_types(node: NodeProto, opsets: dict[str, int]) -> bool:
    """Whether the node's op has a context-dependent body (built only for known input types)."""
    schema = _schema(node, opsets)
    return schema is not None and schema.has_context_dependent_function


def check_attributes(node: NodeProto, fn: Function, opset: int, name: str) -> None:
    """A node's attributes must be ones its function declares, of the declared type."""
    known = set(fn.proto.attribute) | {a.name for a in fn.proto.attribute_proto} | set(fn.types)
    for a in node.attribute:
        if a.name not in known:
            raise UnsupportedAttribute(f"attribute '{a.name}' is not supported", node=name, op=node.op_type,
                                       opset=opset, expected=sorted(known) or "no attributes", found=a.name)
        want = fn.types.get(a.name)
        if want is not None and want != a.type:
            raise UnsupportedAttribute(f"attribute '{a.name}' has an unsupported value", node=name, op=node.op_type,
                                       opset=opset, expected=f"a {AttributeProto.AttributeType.Name(want)}",
                                       found=f"a {AttributeProto.AttributeType.Name(a.type)}")


def _rename_reads(g: onnx.GraphProto, rename: dict[str, str], local: set[str]) -> None:
    """Point the names a subgraph reads from the enclosing function body at their instantiated names."""
    local = local | {x.name for x in [*g.input, *g.initializer]} | {o for n in g.node for o in n.output}
    for n in g.node:
        for i, x in enumerate(n.input):
            if x and x not in local and x in rename:
                n.input[i] = rename[x]
        for a in n.attribute:
            for sub in ([a.g] if a.type == AttributeProto.GRAPH else a.graphs):
                _rename_reads(sub, rename, local)
    for o in g.output:
        if o.name not in local and o.name in rename:
            o.name = rename[o.name]


def instantiate(node: NodeProto, function: Function, model_opsets: dict[str, int], prefix: str,
                taken: Callable[[str], bool]) -> Body:
    """The function's nodes with the node's names and attributes substituted (see the module docstring)."""
    fn, defaults = function.proto, function.defaults
    given = {a.name: a for a in node.attribute}
    rename: dict[str, str] = {}
    for formal, actual in zip(fn.input, node.input):
        rename[formal] = actual
    for formal in fn.input[len(node.input):]:
        rename[formal] = ""  # an optional input the node leaves out
    for formal, actual in zip(fn.output, node.output):
        if actual:
            rename[formal] = actual

    def local(n: str) -> str:
        if not n:
            return ""
        if n not in rename:
            fresh, k = f"{prefix}/{n}", 1
            while taken(fresh):
                fresh, k = f"{prefix}/{n}.{k}", k + 1
            rename[n] = fresh
        return rename[n]

    nodes = []
    for k, b in enumerate(fn.node):
        out = NodeProto()
        out.CopyFrom(b)
        del out.input[:]
        del out.output[:]
        out.input.extend(local(x) for x in b.input)
        out.output.extend(local(x) for x in b.output)
        out.name = f"{prefix}/{b.name or f'{b.op_type}_{k}'}"
        del out.attribute[:]
        for a in b.attribute:
            if not a.ref_attr_name:
                out.attribute.append(a)
                for g in ([out.attribute[-1].g] if a.type == AttributeProto.GRAPH else out.attribute[-1].graphs):
                    _rename_reads(g, rename, set())  # a body reads the function's values by their new names
                continue
            src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
            if src is None:
                continue  # neither given nor defaulted: the body node's own default applies
            sub = AttributeProto()
            sub.CopyFrom(src)
            sub.name = a.name
            out.attribute.append(sub)
        nodes.append(out)
    opsets = dict(model_opsets)
    opsets.update({normalize_domain(o.domain): o.version for o in fn.opset_import})
    return Body(nodes, opsets)


__all__ = ["MAX_DEPTH", "Body", "Function", "check_attributes", "find_function", "instantiate", "needs_types"]
