"""Specialization: a model whose input shapes or shape-deciding operands are known only at run time,
bound to one run's feeds so that the one normal pipeline can compile it.

Two things may be unknown when a model is compiled:

- symbolic (or unknown) input dims: `unbound_inputs` names the inputs whose dims `shapes=` leaves open;
- graph inputs that decide shapes: an operand the op table row lists in `const_inputs` (Reshape's
  shape, Slice's starts, Reduce* axes, ...) fed as a graph input, directly or through nodes that read
  its value. `shape_operands` finds them from the rows (`OnnxOp.specialized_inputs`: one fact per op).

`specialize(proto, feeds, operands)` is the model with those operands turned into initializers holding
the fed values; `feed_shapes` binds every other input's dims to its fed shape. `key` is what tells two
specializations apart: the input shapes and element types, and the bytes of the operand inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from glowpy.errors import GlowpyError, MismatchingDatatype, MismatchingShape, UnsupportedShape
from glowpy.importer.functions import MAX_DEPTH, find_function, instantiate, needs_types
from glowpy.importer.table import TABLE, OnnxOp, normalize_domain
from glowpy.importer.walk import ShapeMap, bind_dims, declared_type, fmt_dims, model_opsets

# Elements: a graph input that decides shapes is a shape, axes, bounds or a count (rank <= 1 and at
# most this many elements); a bigger one (data feeding a shape) is a run-time value and its node is refused.
OPERAND_LIMIT = 64

# Nodes that read only the type of an operand, never its value: a graph input reaching a shape operand
# through them decides nothing (BERT's Shape(input_ids) -> Gather -> Concat -> Reshape).
TYPE_ONLY_OPS = frozenset({"Shape", "Size"})


def graph_inputs(proto: ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds (IR v3 lists initializers among the inputs: those are weights)."""
    weights = {t.name for t in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in weights]


def unbound_inputs(proto: ModelProto, shapes: ShapeMap | None = None) -> list[str]:
    """Inputs with a dim that neither the model nor `shapes=` fixes."""
    out = []
    for info in graph_inputs(proto):
        try:
            _, dims = declared_type(info)
            dims = bind_dims(info.name, dims, shapes or {})
        except Exception:  # noqa: BLE001  (a bad declaration: the import reports it)
            continue
        if dims is None or not all(isinstance(d, int) for d in dims):  # (a zero extent is a static dim)
            out.append(info.name)
    return out


def _flat_nodes(proto: ModelProto) -> list[onnx.NodeProto]:
    """The model's nodes with every node that has no table row replaced by its function body (as the
    walk converts it), recursively. A body that needs input types to be built stays the node itself."""
    try:
        opsets = model_opsets(proto)
    except GlowpyError:
        return list(proto.graph.node)
    out: list[onnx.NodeProto] = []
    types: dict[str, onnx.TypeProto] | None = None

    def input_types(node: onnx.NodeProto) -> list[onnx.TypeProto] | None:
        nonlocal types
        if types is None:  # ONNX's inference, only when a context-dependent body asks for it
            try:
                inferred = onnx.shape_inference.infer_shapes(proto).graph
            except Exception:  # noqa: BLE001  (inference refuses: the body cannot be built here)
                inferred = proto.graph
            types = {v.name: v.type for v in list(inferred.input) + list(inferred.value_info)}
            types.update({t.name: helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in inferred.initializer})
        found = [types.get(x, onnx.TypeProto()) if x else onnx.TypeProto() for x in node.input]
        return None if any(x and x not in types for x in node.input) else found

    def visit(node: onnx.NodeProto, node_opsets: dict[str, int], prefix: str, depth: int) -> None:
        if TABLE.get((normalize_domain(node.domain), node.op_type)) is not None or depth >= MAX_DEPTH:
            out.append(node)
            return
        function = find_function(node, node_opsets, proto, None)
        if function is None and needs_types(node, node_opsets):
            function = find_function(node, node_opsets, proto, input_types(node))
        if function is None:
            out.append(node)
            return
        body = instantiate(node, function, node_opsets, prefix, lambda _: False)
        for k, b in enumerate(body.nodes):
            visit(b, body.opsets, f"{prefix}/{k}", depth + 1)

    for i, n in enumerate(proto.graph.node):
        visit(n, opsets, f"#specialize{i}", 0)
    return out


def pending_reason(proto: ModelProto, shapes: ShapeMap | None = None) -> str:
    """Why the model compiles only on first run, naming the first unbound dim or the operand inputs."""
    for info in graph_inputs(proto):
        if info.name in unbound_inputs(proto, shapes):
            dims = declared_type(info)[1]
            sym = next((d for d in dims or () if not (isinstance(d, int) and d > 0)), None)
            what = f"symbolic dim '{sym}'" if isinstance(sym, str) else "no static shape"
            return (f"graph input '{info.name}' has {what}: the model compiles on first run for each input shape "
                    f"(bind it with shapes= to compile now)")
    return f"inputs {shape_operands(proto)} decide shapes: the model compiles on first run for each of their values"


def inputs_reaching(nodes: Sequence[onnx.NodeProto], operands: Callable[[OnnxOp, onnx.NodeProto], Iterable[int]],
                    available: set[str], stop_at: Iterable[str] = ()) -> set[str]:
    """The names in `available` whose values reach an operand that `operands(row, node)` lists for a node,
    backwards through the nodes that produce it (not through an op in `stop_at`)."""
    producer = {o: n for n in nodes for o in n.output if o}
    stop = set(stop_at)
    stack: list[str] = []
    for n in nodes:
        entry = TABLE.get((normalize_domain(n.domain), n.op_type))
        if entry is not None:
            stack.extend(n.input[k] for k in operands(entry, n) if k < len(n.input) and n.input[k])
    found: set[str] = set()
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in available:
            found.add(name)
            continue
        node = producer.get(name)
        if node is not None and node.op_type not in stop:
            stack.extend(x for x in node.input if x)
    return found


def _specialized(row: OnnxOp, node: onnx.NodeProto) -> tuple[int, ...]:
    """The operands of `node` that decide shapes: the row's, and a Loop's M and cond when it has scan
    outputs (they decide their length)."""
    if node.op_type == "Loop" and len(node.output) > len(node.input) - 2:
        return (*row.specialized_inputs, 0, 1)
    return tuple(row.specialized_inputs)


def shape_operands(proto: ModelProto) -> list[str]:
    """Graph inputs whose values decide shapes: those that reach an operand a row lists as specialized
    through nodes that read values (not through Shape / Size), function bodies included, and that look
    like an operand (rank <= 1, at most OPERAND_LIMIT elements). Model input order."""
    fed = {i.name for i in graph_inputs(proto)}
    found = inputs_reaching(_flat_nodes(proto), _specialized, fed, TYPE_ONLY_OPS)
    return [i.name for i in graph_inputs(proto) if i.name in found and _operand_like(i)]


def _operand_like(info: onnx.ValueInfoProto) -> bool:
    try:
        _, dims = declared_type(info)
    except GlowpyError:
        return False
    if dims is None or len(dims) > 1:
        return False
    return not dims or not isinstance(dims[0], int) or dims[0] <= 0 or dims[0] <= OPERAND_LIMIT


def needs_specialization(proto: ModelProto, shapes: ShapeMap | None = None) -> bool:
    """Whether the model can only be compiled once its feeds are seen: unbound dims (when `shapes=` is
    not given: explicit shapes keep the eager compile) or shape-deciding graph inputs."""
    return bool(shape_operands(proto)) or (shapes is None and bool(unbound_inputs(proto)))


def key(feeds: Mapping[str, np.ndarray], operands: Sequence[str]) -> tuple[Any, ...]:
    """What distinguishes one specialization: every input's element type and shape, and the bytes of
    the shape-deciding operands."""
    types = tuple((n, a.dtype.str, a.shape) for n, a in sorted(feeds.items()))
    return types + tuple(np.ascontiguousarray(feeds[n]).tobytes() for n in operands)


def check_operand(info: onnx.ValueInfoProto, array: np.ndarray) -> None:
    """A fed operand becomes a weight: its element type and shape must be the declared ones."""
    dtype, dims = declared_type(info)
    if dtype is not None and array.dtype != dtype:
        raise MismatchingDatatype(f"input '{info.name}' has the wrong element type", expected=str(dtype),
                                  found=str(array.dtype))
    if dims is not None and (len(dims) != array.ndim or any(isinstance(d, int) and d > 0 and d != n
                                                            for d, n in zip(dims, array.shape))):
        raise MismatchingShape(f"input '{info.name}' has the wrong shape", expected=fmt_dims(dims),
                               found=list(array.shape))


def specialize(proto: ModelProto, feeds: Mapping[str, np.ndarray], operands: Sequence[str]) -> ModelProto:
    """A copy of `proto` whose `operands` are initializers holding their fed values (and no longer inputs)."""
    out = ModelProto()
    out.CopyFrom(proto)
    if not operands:
        return out
    infos = {i.name: i for i in out.graph.input}
    for name in operands:
        check_operand(infos[name], feeds[name])
        if feeds[name].size > OPERAND_LIMIT:
            raise UnsupportedShape(f"input '{name}' decides shapes, so its value is compiled in: it may have at most "
                                   f"{OPERAND_LIMIT} elements", expected=f"<= {OPERAND_LIMIT}", found=feeds[name].size)
    keep = [i for i in out.graph.input if i.name not in set(operands)]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    # np.array keeps a 0-d feed 0-d (ascontiguousarray would make it 1-d)
    out.graph.initializer.extend(numpy_helper.from_array(np.array(feeds[n], order="C"), n) for n in operands)
    return out


def feed_shapes(feeds: Mapping[str, np.ndarray], operands: Sequence[str],
                shapes: ShapeMap | None = None) -> dict[str, Any]:
    """`shapes=` for one specialization: each fed input bound to its shape (`shapes=` entries kept,
    so a symbol the caller bound is still checked against the feed)."""
    out: dict[str, Any] = {k: v for k, v in (shapes or {}).items() if k not in operands}
    out.update({n: tuple(a.shape) for n, a in feeds.items() if n not in operands})
    return out


__all__ = ["OPERAND_LIMIT", "TYPE_ONLY_OPS", "feed_shapes", "graph_inputs", "key", "needs_specialization", "pending_reason", "shape_operands",
           "specialize", "unbound_inputs"]
