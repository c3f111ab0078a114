"""Importer rows for control flow: If, Loop, Scan. Each body is imported by the walk with a child host
(`NodeContext.body`); the IR node carries the body graphs and passes the outer values they read as
operands (see glowpy/ir/ops/control.py)."""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto

from glowpy.errors import UnsupportedAttribute, UnsupportedShape
from glowpy.importer.context import NodeContext
from glowpy.importer.table import INTS, POSITIVE, Rule, onnx_op
from glowpy.ir.graph import Value
from glowpy.ir.types import ALL_TYPES, TensorType

GRAPH = Rule(lambda v: isinstance(v, AttributeProto) and v.type == AttributeProto.GRAPH, "a graph")
DIRECTIONS = Rule(lambda v: isinstance(v, list) and all(x in (0, 1) for x in v), "a list of 0 (forward) / 1 (reverse)")
BOOL = np.dtype(np.bool_)
INT64 = np.dtype(np.int64)
MAX_IMPORT_UNROLL = 1024  # iterations a loop whose body needs its iteration number may be unrolled into
MANY = 1 << 20  # control nodes produce as many outputs as their bodies
UNBOUNDED = np.iinfo(np.int64).max  # the trip count of a Loop without M


@onnx_op("If", attrs={"then_branch": GRAPH, "else_branch": GRAPH}, dtypes=frozenset({BOOL}), max_outputs=MANY)
def convert_if(ctx: NodeContext) -> list[Value]:
    """Both branches become bodies of one IR If (the optimizer inlines a branch whose condition it knows)."""
    cond = ctx.input(0)
    then = ctx.body("then_branch", [])
    other = ctx.body("else_branch", [])
    return ctx.emit("If", [cond, *then.captures, *other.captures],
                    {"then_branch": then.graph, "else_branch": other.graph})


def _always_true(ctx: NodeContext, v: Value) -> bool:
    data = ctx.host.known_value(v) if v.is_constant or v.producer is not None else None
    return data is not None and bool(np.all(data))


def _source(v: Value) -> Value:
    """`v` seen through Identity nodes."""
    while v.producer is not None and v.producer.op == "Identity":
        v = v.producer.inputs[0]
    return v


def _known_int(ctx: NodeContext, v: Value) -> int | None:
    data = ctx.host.known_value(v) if v.is_constant or v.producer is not None else None
    return None if data is None else int(np.asarray(data).reshape(-1)[0])


@onnx_op("Loop", attrs={"body": GRAPH}, dtypes=frozenset({INT64}), max_outputs=MANY, const_inputs=(0, 1),
         runtime_inputs=(0, 1))
def convert_loop(ctx: NodeContext) -> list[Value]:
    """M and cond default to unbounded and true. The trip count is static when M is known and the loop
    cannot end early (the initial condition is true and the body passes it on, or gives a constant true).
    A body that needs its iteration number at compile time (a Slice at it) is imported once per
    iteration, specialized, when the trip count is static (`_unrolled`)."""
    m = ctx.input(0) if ctx.has_input(0) else ctx.constant(np.array(UNBOUNDED, INT64), "M")
    cond = ctx.input(1) if ctx.has_input(1) else ctx.constant(np.array(True), "cond")
    carried = [ctx.input(i) for i in range(2, ctx.num_inputs)]
    steps = _known_int(ctx, m)
    steps = steps if steps is not None and steps < UNBOUNDED and _always_true(ctx, cond) else None
    promised = _declared_trips(ctx, len(carried))
    try:
        body = ctx.body("body", [TensorType(INT64, ()), TensorType(BOOL, ()), *(v.type for v in carried)])
    except UnsupportedShape as e:
        trips = steps if steps is not None else promised
        if trips is None or trips > MAX_IMPORT_UNROLL:
            raise
        return _unrolled(ctx, m if steps is None else None, cond, carried, trips, e)
    g = body.graph
    passes_cond = _source(g.outputs[0]) is g.inputs[1] or _always_true(ctx, g.outputs[0])
    if steps is None and passes_cond and len(g.outputs) > 1 + len(carried):
        # M and cond decide the scan outputs' length: graph inputs feeding them specialize (their values
        # are compiled in), and the check, which does not see those values, stops here
        ctx.const_or_runtime(0)
        ctx.const_or_runtime(1)
    trips = steps if steps is not None and passes_cond else -1
    declared = trips < 0 and len(g.outputs) > 1 + len(carried) and promised is not None
    return ctx.emit("Loop", [m, cond, *carried, *body.captures],
                    {"body": g, "num_carried": len(carried), "trip_count": promised if declared else trips,
                     "promised": int(declared)})


def _declared_trips(ctx: NodeContext, n: int) -> int | None:
    """The iteration count the model declares through a scan output's static first dim, else None. A
    Loop typed with it must run exactly that many iterations (the interpreter checks; see ops/control.py)."""
    for out in ctx.node.output[n:]:
        info = ctx.declared.get(out) if out else None
        if info is not None and info.type.tensor_type.shape.dim:
            d = info.type.tensor_type.shape.dim[0]
            if d.WhichOneof("value") == "dim_value" and d.dim_value > 0:
                return int(d.dim_value)
    return None


def _unrolled(ctx: NodeContext, m: Value | None, cond: Value, carried: list[Value], steps: int,
              err: UnsupportedShape) -> list[Value]:
    """One single-iteration Loop per iteration, its body specialized for the iteration number (and a true
    condition), each running once (M = min(M - i, 1) when M is a run-time value); their scan outputs
    concatenated. `err`: why the general body could not be imported."""
    n = len(carried)
    one = ctx.constant(np.array(1, INT64), "one")
    scans: list[list[Value]] = []
    for i in range(steps):
        body = ctx.body("body", [np.array(i, INT64), np.array(True), *(v.type for v in carried)])
        if not _always_true(ctx, body.graph.outputs[0]):
            raise err
        m_i = one if m is None else ctx.emit1("Min", [ctx.emit1("Sub", [m, ctx.constant(np.array(i, INT64), f"i{i}")]),
                                                       one])
        outs = ctx.emit("Loop", [m_i, cond, *carried, *body.captures],
                        {"body": body.graph, "num_carried": n, "trip_count": 1,
                         "promised": int(m is not None or not _always_true(ctx, cond))})
        carried = outs[:n]
        scans.append(outs[n:])
    if not scans:
        raise err
    stacked = [parts[0] if len(parts) == 1 else ctx.emit1("Concat", list(parts), {"axis": 0}) for parts in zip(*scans)]
    return [*carried, *stacked]


@onnx_op("Scan", since=8, dtypes=ALL_TYPES, max_outputs=MANY,
         attrs={"body": GRAPH, "num_scan_inputs": POSITIVE, "scan_input_directions": DIRECTIONS,
                "scan_output_directions": DIRECTIONS, "scan_input_axes": INTS, "scan_output_axes": INTS,
                "directions": DIRECTIONS})
def convert_scan(ctx: NodeContext) -> list[Value]:
    """Scan-9/11/16 with negative axes resolved; Scan-8 (a batch dim) as one Scan per batch entry."""
    if ctx.opset < 9:
        return _scan8(ctx)
    m = ctx.attr("num_scan_inputs")
    xs = ctx.inputs()
    n = len(xs) - m
    if n < 0:
        raise ctx.unsupported("num_scan_inputs exceeds the inputs", expected=f"at most {len(xs)}", found=m)
    states, scans = xs[:n], xs[n:]
    in_axes = [ctx.axis(a, x.type.rank) for a, x in zip(ctx.attr("scan_input_axes") or [0] * m, scans)]
    in_dirs = ctx.attr("scan_input_directions") or [0] * m
    if len(in_axes) != m or len(in_dirs) != m:
        raise ctx.unsupported("scan_input_axes / scan_input_directions need one entry per scan input",
                              expected=m, found=f"{len(in_axes)} / {len(in_dirs)}")
    elems = [TensorType(x.dtype, x.shape[:a] + x.shape[a + 1:]) for x, a in zip(scans, in_axes)]
    body = ctx.body("body", [*(v.type for v in states), *elems])
    k = len(body.graph.outputs) - n
    out_axes = ctx.attr("scan_output_axes") or [0] * k
    out_dirs = ctx.attr("scan_output_directions") or [0] * k
    if len(out_axes) != k or len(out_dirs) != k:
        raise ctx.unsupported("scan_output_axes / scan_output_directions need one entry per scan output",
                              expected=k, found=f"{len(out_axes)} / {len(out_dirs)}")
    ranks = [v.type.rank + 1 for v in body.graph.outputs[n:]]
    for a, r in zip(out_axes, ranks):
        if not -r <= a < r:
            raise ctx.error(UnsupportedAttribute, "scan_output_axes out of range", expected=f"-{r}..{r - 1}", found=a)
    return ctx.emit("Scan", [*xs, *body.captures], {
        "body": body.graph, "num_scan_inputs": m, "scan_input_directions": tuple(in_dirs),
        "scan_output_directions": tuple(out_dirs), "scan_input_axes": tuple(in_axes),
        "scan_output_axes": tuple(a % r for a, r in zip(out_axes, ranks))})


def _take(ctx: NodeContext, x: Value, b: int) -> Value:
    """Entry b of x's first (batch) dim, without that dim."""
    s = ctx.emit1("Slice", [x], {"starts": (b,), "ends": (b + 1,), "axes": (0,), "steps": (1,)})
    return ctx.emit1("Reshape", [s], {"shape": x.shape[1:]})


def _scan8(ctx: NodeContext) -> list[Value]:
    """Scan-8: states (batch, ...) and scan inputs (batch, sequence, ...); sequence_lens, when given, must
    be the full length (shorter sequences would give outputs of ragged length)."""
    m = ctx.attr("num_scan_inputs")
    xs = [ctx.input(i) for i in range(1, ctx.num_inputs)]
    n = len(xs) - m
    if n < 0 or m < 1:
        raise ctx.unsupported("num_scan_inputs exceeds the inputs", expected=f"at most {len(xs)}", found=m)
    states, scans = xs[:n], xs[n:]
    dirs = tuple(ctx.attr("directions") or [0] * m)
    if len(dirs) != m:
        raise ctx.unsupported("directions needs one entry per scan input", expected=m, found=len(dirs))
    batch, length = scans[0].shape[0], scans[0].shape[1]
    if ctx.has_input(0):
        lens = ctx.known(0)
        if lens is None or not np.all(np.asarray(lens) == length):
            raise ctx.error(UnsupportedShape, "Scan-8 sequence_lens must be known and equal to the full sequence "
                                              "length (outputs of ragged length have no static shape)",
                            expected=f"all {length}", found="a run-time value" if lens is None else list(lens))
    elems = [TensorType(x.dtype, x.shape[2:]) for x in scans]
    body = ctx.body("body", [*(TensorType(v.dtype, v.shape[1:]) for v in states), *elems])
    k = len(body.graph.outputs) - n
    attrs = {"body": body.graph, "num_scan_inputs": m, "scan_input_directions": dirs,
             "scan_output_directions": (0,) * k, "scan_input_axes": (0,) * m, "scan_output_axes": (0,) * k}
    per_batch = [ctx.emit("Scan", [*(_take(ctx, x, b) for x in xs), *body.captures], attrs) for b in range(batch)]
    out = []
    for parts in zip(*per_batch):
        ups = [ctx.emit1("Reshape", [p], {"shape": (1, *p.shape)}) for p in parts]
        out.append(ups[0] if len(ups) == 1 else ctx.emit1("Concat", ups, {"axis": 0}))
    return out
