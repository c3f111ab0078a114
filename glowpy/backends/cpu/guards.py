"""Branch guards: the steps a run may skip because only one side of a select needs them.

An If with a run-time condition reaches the cpu backend as both branches and a `Where(cond, then,
else)` per output (glowpy/optimizer/control.py). A node whose results feed, through any path, only
the `then` operands of Wheres on one single-element condition is needed only when that condition
is true (likewise `else` and false). `branch_guards` finds those nodes; the entry (codegen.py)
wraps their steps in a conditional branch on the condition's byte, so the branch not taken costs
nothing. A guard is an optimization only: a step run without it computes a value nobody selects.
"""

from __future__ import annotations

from glowpy.ir.graph import Graph, Node, Value

TRUE, FALSE, ALWAYS = 1, 2, 3  # when a node's results are needed (bit set), per condition


def _needs(graph: Graph, cond: Value) -> dict[int, int]:
    """When each node is needed with respect to `cond` (reverse dataflow over the node order)."""
    need: dict[int, int] = {}
    outputs = {id(v) for v in graph.outputs}
    for node in reversed(graph.nodes):
        mask = 0
        for out in node.outputs:
            if id(out) in outputs:
                mask = ALWAYS
            for user in out.users:
                when = need.get(id(user), 0)
                if user.op == "Where" and user.inputs[0] is cond and out is not cond:
                    side = (TRUE if user.inputs[1] is out else 0) | (FALSE if user.inputs[2] is out else 0)
                    when &= side
                mask |= when
        need[id(node)] = mask
    return need


def branch_guards(graph: Graph) -> dict[int, tuple[Value, bool]]:
    """id(node) -> (condition, value it must have for the node to run), for nodes only one side of a
    run-time select needs."""
    conds = list(dict.fromkeys(n.inputs[0] for n in graph.nodes if n.op == "Where"
                               and n.inputs[0].type.size == 1 and not n.inputs[0].is_constant))
    guards: dict[int, tuple[Value, bool]] = {}
    for cond in conds:
        for key, mask in _needs(graph, cond).items():
            if mask in (TRUE, FALSE) and key not in guards:
                guards[key] = (cond, mask == TRUE)
    return guards


def step_guard(nodes: list[Node], guards: dict[int, tuple[Value, bool]]) -> tuple[Value, bool] | None:
    """The guard every node of a step shares, else None."""
    found = {(id(g[0]), g[1]): g for g in (guards.get(id(n)) for n in nodes) if g is not None}
    if len(found) != 1 or any(id(n) not in guards for n in nodes):
        return None
    return next(iter(found.values()))
