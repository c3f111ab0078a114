"""Control-flow rewrites: an If whose condition is known becomes its branch (every backend), and, for a
backend that asks (`should_lower`), If / Loop / Scan become straight-line code: both branches and a
select, loops unrolled (`glowpy.ir.ops.control.unroll_refusal` says which ones can be).

Bodies are closed graphs (see glowpy/ir/ops/control.py): inlining one binds its inputs to the node's
operands and copies its nodes in front of the node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops.control import CONTROL_OPS, loop_counts, scan_counts, static_iterations, unroll_refusal
from glowpy.optimizer.lower import Builder, lowering
from glowpy.optimizer.rewrite import add_weight, replace_node, root_name

INT64 = np.dtype(np.int64)


def inline_body(graph: Graph, at: Node, body: Graph, args: Sequence[Value], prefix: str, *,
                expand: bool = False) -> list[Value]:
    """Copy `body`'s nodes just before `at`, its inputs bound to `args`; the values of its outputs.
    With `expand`, control nodes among the copies are expanded in turn (nested bodies)."""
    env: dict[int, Value] = {id(v): a for v, a in zip(body.inputs, args)}
    for v in body.constants.values():
        env[id(v)] = add_weight(graph, f"{prefix}.{v.name}", v.data)
    for n in body.nodes:
        copy = graph.add_node(n.op, [env[id(x)] for x in n.inputs], dict(n.attrs),
                              name=f"{prefix}.{root_name(n.name)}", before=at)
        outs = copy.outputs
        if expand and copy.op in CONTROL_OPS and unroll_refusal(copy) is None:
            outs = EXPANSIONS[copy.op](Builder(graph, copy), copy)
            replace_node(graph, copy, outs, adopt_names=True)
        for a, b in zip(n.outputs, outs):
            env[id(a)] = b
    return [env[id(v)] for v in body.outputs]


def fresh(b: Builder, node: Node, values: Sequence[Value]) -> list[Value]:
    """`values` as new node values, each once, so they can take over the node's output names: an operand
    passed through, a weight or a repeated value gets an Identity (an alias for the cpu backend)."""
    out: list[Value] = []
    for v in values:
        if v.producer is None or any(v is x for x in node.inputs) or any(v is o for o in out):
            v = b("Identity", v)
        out.append(v)
    return out


def inline_known_branches(graph: Graph) -> bool:
    """If with a constant condition -> the nodes of the branch it selects."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "If" or not node.inputs[0].is_constant:
            continue
        then = node.attrs["then_branch"]
        n = len(then.inputs)
        if bool(np.asarray(node.inputs[0].data).reshape(-1)[0]):
            values = inline_body(graph, node, then, node.inputs[1:1 + n], root_name(node.name))
        else:
            values = inline_body(graph, node, node.attrs["else_branch"], node.inputs[1 + n:], root_name(node.name))
        replace_node(graph, node, fresh(Builder(graph, node), node, values), adopt_names=True)
        changed = True
    if changed:
        graph.remove_unused_constants()
    return changed


# --- straight-line expansions (registered as lowerings: a backend asks for them with should_lower) ------


def _scalar(b: Builder, v: Value) -> Value:
    return v if v.shape == () else b("Reshape", v, shape=())


@lowering("If")
def expand_if(b: Builder, node: Node) -> list[Value]:
    """Both branches, then Where(cond, then, else) per output: the branch is chosen inside the run."""
    g, name = b.graph, root_name(node.name)
    then, other = node.attrs["then_branch"], node.attrs["else_branch"]
    n = len(then.inputs)
    t = inline_body(g, node, then, node.inputs[1:1 + n], f"{name}.then", expand=True)
    e = inline_body(g, node, other, node.inputs[1 + n:], f"{name}.else", expand=True)
    cond = _scalar(b, node.inputs[0])
    return fresh(b, node, [x if x is y else b("Where", cond, x, y) for x, y in zip(t, e)])


def _stack(b: Builder, parts: list[Value], axis: int) -> Value:
    """Concat of the parts, each given a dim of 1 at `axis`."""
    ups = [b("Reshape", p, shape=p.shape[:axis] + (1,) + p.shape[axis:]) for p in parts]
    return ups[0] if len(ups) == 1 else b("Concat", *ups, axis=axis)


@lowering("Loop")
def expand_loop(b: Builder, node: Node) -> list[Value]:
    """The body once per iteration. With a static trip count the iterations chain directly; otherwise
    (M known, the condition decided at run time) each carried value is kept by a Where once the
    condition has gone false."""
    g, name, body = b.graph, root_name(node.name), node.attrs["body"]
    n, _ = loop_counts(node.attrs)
    m, cond, rest = node.inputs[0], node.inputs[1], node.inputs[2:]
    carried, captures = list(rest[:n]), list(rest[n:])
    static = static_iterations(node) is not None
    steps = int(np.asarray(m.data).reshape(-1)[0])
    active = _scalar(b, cond)
    scans: list[list[Value]] = []
    false = add_weight(g, f"{name}.false", np.array(False))
    for i in range(steps):
        it = add_weight(g, f"{name}.i{i}", np.array(i, INT64))
        res = inline_body(g, node, body, [it, active, *carried, *captures], f"{name}.{i}", expand=True)
        if static:
            carried = res[1:1 + n]
            active = _scalar(b, res[0])
        else:
            carried = [new if new is old else b("Where", active, new, old) for new, old in zip(res[1:1 + n], carried)]
            active = b("Where", active, _scalar(b, res[0]), false)
        for k, v in enumerate(res[1 + n:]):
            if i == 0:
                scans.append([])
            scans[k].append(v)
    return fresh(b, node, [*carried, *(_stack(b, parts, 0) for parts in scans)])


@lowering("Scan")
def expand_scan(b: Builder, node: Node) -> list[Value]:
    """The body once per sequence element: Slice + Reshape take the element, the per-step outputs are
    stacked along their axes in their directions."""
    g, name, a = b.graph, root_name(node.name), node.attrs
    n, m, k = scan_counts(a)
    states, xs, captures = list(node.inputs[:n]), node.inputs[n:n + m], list(node.inputs[n + m:])
    length = xs[0].shape[a["scan_input_axes"][0]]
    outs: list[list[Value]] = [[] for _ in range(k)]
    for t in range(length):
        elems = []
        for x, axis, rev in zip(xs, a["scan_input_axes"], a["scan_input_directions"]):
            j = length - 1 - t if rev else t
            s = b("Slice", x, starts=(j,), ends=(j + 1,), axes=(axis,), steps=(1,))
            elems.append(b("Reshape", s, shape=x.shape[:axis] + x.shape[axis + 1:]))
        res = inline_body(g, node, a["body"], [*states, *elems, *captures], f"{name}.{t}", expand=True)
        states = res[:n]
        for o, r in zip(outs, res[n:]):
            o.append(r)
    stacked = [_stack(b, o[::-1] if rev else o, axis)
               for o, axis, rev in zip(outs, a["scan_output_axes"], a["scan_output_directions"])]
    return fresh(b, node, [*states, *stacked])


EXPANSIONS = {"If": expand_if, "Loop": expand_loop, "Scan": expand_scan}
