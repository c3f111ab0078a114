"""DOT export of a graph, for Graphviz."""

from __future__ import annotations

from glowpy.ir.graph import Graph


def _q(s: str) -> str:
    # Backslashes pass through: labels use DOT's own "\\n" line-break escape.
    return '"' + s.replace('"', '\\"') + '"'


def _label(v) -> str:
    return _q(f"{v.name}\\n{v.type}")


def to_dot(graph: Graph, *, show_constants: bool = False) -> str:
    """Nodes as boxes, placeholders and outputs as ellipses, edges labelled with the value type.

    Constants are left out unless `show_constants` (weights would swamp the picture); a node's
    label lists how many constant operands it has.
    """
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB;", "  node [fontname=Helvetica, fontsize=10];"]
    for v in graph.inputs:
        lines.append(f"  {_q('in:' + v.name)} [shape=ellipse, label={_label(v)}];")
    for v in graph.constants.values():
        if show_constants and v.users:
            lines.append(f"  {_q('const:' + v.name)} [shape=note, label={_label(v)}];")
    for n in graph.nodes:
        nconst = sum(1 for v in n.inputs if v.is_constant)
        extra = f"\\n+{nconst} weights" if nconst and not show_constants else ""
        act = n.attrs.get("activation")
        if act and act != "none":
            extra += f"\\n+{act}"
        lines.append(f"  {_q('node:' + n.name)} [shape=box, style=rounded, label={_q(n.op + extra)}, "
                     f"tooltip={_q(n.name)}];")
    for n in graph.nodes:
        for v in n.inputs:
            if v.producer is not None:
                src = "node:" + v.producer.name
            elif v.kind == "input":
                src = "in:" + v.name
            elif show_constants:
                src = "const:" + v.name
            else:
                continue
            lines.append(f"  {_q(src)} -> {_q('node:' + n.name)} [label={_q(str(v.type))}];")
    for v in graph.outputs:
        lines.append(f"  {_q('out:' + v.name)} [shape=ellipse, style=bold, label={_label(v)}];")
        src = "node:" + v.producer.name if v.producer is not None else ("in:" + v.name)
        lines.append(f"  {_q(src)} -> {_q('out:' + v.name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"
