"""Control flow: If, Loop and Scan, each carrying its bodies as `Graph` attributes.

A body is a closed graph: every value it reads from the enclosing graph is one of its inputs, and
the node passes that outer value as an operand (a capture). So use lists, dead-code elimination
and verification need nothing special: an outer value read only inside a body is still an operand
of the control node. Operands and body inputs, in order:

- If:   [cond, *then_captures, *else_captures]; then_branch inputs = then_captures,
        else_branch inputs = else_captures; both branches give outputs of the same types.
- Loop: [M, cond, *carried, *captures]; body inputs [iteration, cond, *carried, *captures], body
        outputs [cond, *carried, *scan_outputs]. `trip_count` is the static number of iterations
        (-1: decided at run time); scan outputs need it (their first dim). `promised` (1): the trip
        count is the declared scan outputs' length, M or the condition decide at run time.
- Scan: [*states, *scan_inputs, *captures]; body inputs [*states, *scan_elements, *captures], body
        outputs [*states, *scan_output_elements]; directions and axes as in ONNX Scan-16.

`compute` runs a body with each node's reference semantics (the interpreter's oracle and
constant folding share it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from glowpy.errors import InternalError, MismatchingDatatype, MismatchingShape, UnsupportedShape
from glowpy.ir.ops.registry import REQUIRED, op
from glowpy.ir.types import ALL_TYPES, TensorType

if TYPE_CHECKING:
    from glowpy.ir.graph import Graph

CONTROL_OPS = frozenset({"If", "Loop", "Scan"})
BODY_ATTRS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
BOOL = np.dtype(np.bool_)
INT64 = np.dtype(np.int64)


def bodies(op_name: str, attrs: dict[str, Any]) -> list[tuple[str, Graph]]:
    """(attribute name, body) of a control node; [] for any other op."""
    return [(k, attrs[k]) for k in BODY_ATTRS.get(op_name, ())]


def run_body(body: Graph, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Evaluate `body` on `args` with each node's reference semantics."""
    env: dict[int, np.ndarray] = {id(v): np.asarray(a) for v, a in zip(body.inputs, args)}
    for v in body.constants.values():
        env[id(v)] = v.data
    for node in body.nodes:
        for out, res in zip(node.outputs, node.opdef.run(node.attrs, [env[id(v)] for v in node.inputs])):
            env[id(out)] = res
    return [env[id(v)] for v in body.outputs]


def _check_formals(what: str, body: Graph, types: Sequence[TensorType]) -> None:
    if len(body.inputs) != len(types):
        raise InternalError(f"{what} takes {len(body.inputs)} inputs, the node passes {len(types)}",
                            expected=len(body.inputs), found=len(types))
    for v, t in zip(body.inputs, types):
        if v.type != t:
            raise MismatchingShape(f"{what} input '{v.name}' has a different type from its operand",
                                   expected=str(v.type), found=str(t))


def _scalar(t: TensorType, dtype: np.dtype, what: str) -> None:
    if t.dtype != dtype or t.size != 1:
        raise MismatchingDatatype(f"{what} must be a single {dtype} element", expected=f"{dtype}[1]", found=str(t))


# --- If -------------------------------------------------------------------------------------------


def _if_infer(attrs: dict, cond: TensorType, *captures: TensorType) -> list[TensorType]:
    then, other = attrs["then_branch"], attrs["else_branch"]
    _scalar(cond, BOOL, "the If condition")
    n = len(then.inputs)
    _check_formals("then_branch", then, captures[:n])
    _check_formals("else_branch", other, captures[n:])
    if len(then.outputs) != len(other.outputs):
        raise MismatchingShape("the If branches give different numbers of outputs", op="If",
                               expected=len(then.outputs), found=len(other.outputs))
    for i, (a, b) in enumerate(zip(then.outputs, other.outputs)):
        if a.dtype != b.dtype:
            raise MismatchingDatatype(f"the If branches give output {i} different element types", op="If",
                                      expected=f"then_branch {a.type}", found=f"else_branch {b.type}")
        if a.shape != b.shape:
            raise UnsupportedShape(f"the If branches give output {i} different shapes (glowpy needs static "
                                   f"shapes)", op="If", expected=f"then_branch {list(a.shape)}",
                                   found=f"else_branch {list(b.shape)}")
    return [v.type for v in then.outputs]


@op("If", infer=_if_infer, inputs=(1, None), dtypes=frozenset({BOOL}),
    attrs={"then_branch": REQUIRED, "else_branch": REQUIRED},
    num_outputs=lambda attrs: len(attrs["then_branch"].outputs))
def if_(attrs: dict, cond: np.ndarray, *captures: np.ndarray) -> list[np.ndarray]:
    """Run then_branch when the condition is true, else else_branch."""
    n = len(attrs["then_branch"].inputs)
    if bool(np.asarray(cond).reshape(-1)[0]):
        return run_body(attrs["then_branch"], captures[:n])
    return run_body(attrs["else_branch"], captures[n:])


# --- Loop -----------------------------------------------------------------------------------------


def loop_counts(attrs: dict) -> tuple[int, int]:
    """(carried values, scan outputs) of a Loop."""
    n = attrs["num_carried"]
    return n, len(attrs["body"].outputs) - 1 - n


def _loop_infer(attrs: dict, m: TensorType, cond: TensorType, *rest: TensorType) -> list[TensorType]:
    body, trips = attrs["body"], attrs["trip_count"]
    n, k = loop_counts(attrs)
    _scalar(m, INT64, "the Loop trip count M")
    _scalar(cond, BOOL, "the Loop condition")
    _check_formals("the Loop body", body, [TensorType(INT64, ()), TensorType(BOOL, ()), *rest])
    outs = body.outputs
    _scalar(outs[0].type, BOOL, "the Loop body's condition output")
    for v, t in zip(outs[1:1 + n], rest[:n]):
        if v.type != t:
            raise UnsupportedShape("a loop-carried value changes type or shape in the body (glowpy needs static "
                                   "shapes)", op="Loop", expected=str(t), found=f"'{v.name}': {v.type}")
    if k and trips < 0:
        raise UnsupportedShape("Loop scan outputs need a trip count known at compile time and a condition that "
                               "cannot end the loop early", op="Loop", expected="a static trip count",
                               found="decided at run time")
    return [*rest[:n], *(TensorType(v.dtype, (trips, *v.shape)) for v in outs[1 + n:])]


@op("Loop", infer=_loop_infer, inputs=(2, None), dtypes=frozenset({INT64}),
    attrs={"body": REQUIRED, "num_carried": REQUIRED, "trip_count": -1, "promised": 0},
    num_outputs=lambda attrs: len(attrs["body"].outputs) - 1)
def loop(attrs: dict, m: np.ndarray, cond: np.ndarray, *rest: np.ndarray) -> list[np.ndarray]:
    """for i in range(M) while cond: cond, *carried, *scan = body(i, cond, *carried, *captures)."""
    body = attrs["body"]
    n, k = loop_counts(attrs)
    carried, captures = list(rest[:n]), list(rest[n:])
    scans: list[list[np.ndarray]] = [[] for _ in range(k)]
    go = bool(np.asarray(cond).reshape(-1)[0])
    i, limit = 0, int(np.asarray(m).reshape(-1)[0])
    while go and i < limit:
        res = run_body(body, [np.array(i, INT64), np.array(go), *carried, *captures])
        go = bool(np.asarray(res[0]).reshape(-1)[0])
        carried = res[1:1 + n]
        for s, r in zip(scans, res[1 + n:]):
            s.append(r)
        i += 1
    if k and i != attrs["trip_count"]:
        raise UnsupportedShape("the Loop ran a different number of iterations from its static trip count",
                               op="Loop", expected=attrs["trip_count"], found=i)
    return [*carried, *(np.stack(s) for s in scans)]


# --- Scan -----------------------------------------------------------------------------------------


def scan_counts(attrs: dict) -> tuple[int, int, int]:
    """(states, scan inputs, scan outputs) of a Scan."""
    m = attrs["num_scan_inputs"]
    n = len(attrs["body"].outputs) - len(attrs["scan_output_axes"])
    return n, m, len(attrs["scan_output_axes"])


def _scan_infer(attrs: dict, *xs: TensorType) -> list[TensorType]:
    body = attrs["body"]
    n, m, k = scan_counts(attrs)
    states, scans, captures = xs[:n], xs[n:n + m], xs[n + m:]
    elems, length = [], None
    for t, axis in zip(scans, attrs["scan_input_axes"]):
        if not 0 <= axis < t.rank:
            raise UnsupportedShape("scan_input_axes out of range", op="Scan", expected=f"0..{t.rank - 1}", found=axis)
        if length is not None and t.shape[axis] != length:
            raise MismatchingShape("the scan inputs differ in sequence length", op="Scan", expected=length,
                                   found=t.shape[axis])
        length = t.shape[axis]
        elems.append(TensorType(t.dtype, t.shape[:axis] + t.shape[axis + 1:]))
    _check_formals("the Scan body", body, [*states, *elems, *captures])
    for v, t in zip(body.outputs[:n], states):
        if v.type != t:
            raise UnsupportedShape("a Scan state changes type or shape in the body", op="Scan", expected=str(t),
                                   found=f"'{v.name}': {v.type}")
    outs = []
    for v, axis in zip(body.outputs[n:], attrs["scan_output_axes"]):
        if not 0 <= axis <= v.type.rank:
            raise UnsupportedShape("scan_output_axes out of range", op="Scan", expected=f"0..{v.type.rank}",
                                   found=axis)
        outs.append(TensorType(v.dtype, v.shape[:axis] + (length or 0,) + v.shape[axis:]))
    return [*states, *outs]


@op("Scan", infer=_scan_infer, inputs=(1, None), dtypes=ALL_TYPES,
    attrs={"body": REQUIRED, "num_scan_inputs": REQUIRED, "scan_input_directions": REQUIRED,
           "scan_output_directions": REQUIRED, "scan_input_axes": REQUIRED, "scan_output_axes": REQUIRED},
    num_outputs=lambda attrs: len(attrs["body"].outputs))
def scan(attrs: dict, *xs: np.ndarray) -> list[np.ndarray]:
    """States threaded through the body over slices of the scan inputs; per-slice outputs stacked."""
    n, m, k = scan_counts(attrs)
    states, scans, captures = list(xs[:n]), xs[n:n + m], list(xs[n + m:])
    in_axes = attrs["scan_input_axes"]
    length = scans[0].shape[in_axes[0]] if scans else 0
    outs: list[list[np.ndarray]] = [[] for _ in range(k)]
    for t in range(length):
        elems = [np.take(x, length - 1 - t if rev else t, axis=a)
                 for x, a, rev in zip(scans, in_axes, attrs["scan_input_directions"])]
        res = run_body(attrs["body"], [*states, *elems, *captures])
        states = res[:n]
        for o, r in zip(outs, res[n:]):
            o.append(r)
    stacked = []
    for o, a, rev in zip(outs, attrs["scan_output_axes"], attrs["scan_output_directions"]):
        stacked.append(np.stack(o[::-1] if rev else o, axis=a))
    return [*states, *stacked]


# --- what a backend without native control flow can take as straight-line code -------------------

MAX_UNROLLED_NODES = 20000  # body nodes times iterations: beyond this an unrolled loop is refused


def _size(body: Graph) -> int:
    return sum(max(1, _unrolled_size(n.op, n.attrs, n.inputs)) for n in body.nodes)


def _unrolled_size(op_name: str, attrs: dict, inputs: Sequence[Any]) -> int:
    if op_name == "If":
        return _size(attrs["then_branch"]) + _size(attrs["else_branch"])
    if op_name == "Loop":
        return max(0, _loop_steps(attrs, inputs)) * _size(attrs["body"])
    if op_name == "Scan":
        n, m, _ = scan_counts(attrs)
        x = inputs[n]
        return x.shape[attrs["scan_input_axes"][0]] * _size(attrs["body"])
    return 1


def static_iterations(node: Any) -> int | None:
    """The iterations every run of a Loop makes when the model fixes them (`trip_count`, unless it is
    only `promised` by the declared scan output shapes); None: decided at run time."""
    trips = node.attrs["trip_count"]
    return trips if trips >= 0 and not node.attrs["promised"] else None


def _loop_steps(attrs: dict, inputs: Sequence[Any]) -> int:
    """Iterations an unrolled Loop runs: a constant M (-1: unknown)."""
    m = inputs[0]
    if m.is_constant:
        steps = int(np.asarray(m.data).reshape(-1)[0])
        return steps if steps <= MAX_UNROLLED_NODES else MAX_UNROLLED_NODES + 1
    return -1


def unroll_refusal(node: Any) -> str | None:
    """Why a control node cannot become straight-line code (None: it can, with its nested bodies)."""
    if node.op == "Loop":
        steps = _loop_steps(node.attrs, node.inputs)
        if steps < 0:
            return ("the Loop's trip count is decided at run time (M is not a constant); only loops with a "
                    "trip count known at compile time are unrolled")
        if steps == 0 and loop_counts(node.attrs)[1]:
            return "the Loop runs no iteration, so its scan outputs would be empty"
        if loop_counts(node.attrs)[1] and static_iterations(node) is None:
            return "the Loop's scan outputs have a length decided at run time (its condition may end it early)"
    if node.op in CONTROL_OPS:
        size = _unrolled_size(node.op, node.attrs, node.inputs)
        if size > MAX_UNROLLED_NODES:
            return f"unrolled, the {node.op} would be {size} nodes (at most {MAX_UNROLLED_NODES})"
        for _, body in bodies(node.op, node.attrs):
            for inner in body.nodes:
                why = unroll_refusal(inner)
                if why is not None and inner.op != "Loop":  # such a Loop stays a Loop (a native loop)
                    return f"in its body, node '{inner.name}': {why}"
    return None
