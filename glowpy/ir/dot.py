"""DOT export of a graph, for Graphviz: nodes coloured by op class, fused nodes labelled with what
they absorbed, edges labelled with the value type."""

from __future__ import annotations

from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops import OPS

# Op class -> fill colour, in legend order.
CLASS_COLOURS = {
    "conv/matmul": "#f4a582",
    "elementwise/activation": "#b8e186",
    "normalization": "#c2a5cf",
    "pooling": "#92c5de",
    "data movement/shape": "#e0e0e0",
    "reduction": "#fee08b",
    "other": "#ffffff",
}

# Ops whose class no registry fact gives (see op_class for the ones it does).
_NAMED_CLASSES = {
    "ConvTranspose": "conv/matmul",
    "BatchNormalization": "normalization", "LayerNormalization": "normalization", "LRN": "normalization",
    "Softmax": "elementwise/activation", "LogSoftmax": "elementwise/activation",
    "MaxPool": "pooling", "AveragePool": "pooling", "GlobalAveragePool": "pooling", "GlobalMaxPool": "pooling",
}


def op_class(op: str) -> str:
    """The class of an IR op, from its declaration where that says: `elementwise` ops; ops that carry
    a fused activation epilogue (Conv, Gemm, MatMul, FullyConnected) are conv/matmul; ops with
    `keepdims` are reductions; the other ops declared with the tensor ops (ir/ops/tensor.py) move
    data. The rest by name; unknown ops are "other"."""
    opdef = OPS.get(op)
    if opdef is None:
        return "other"
    if opdef.elementwise:
        return "elementwise/activation"
    if "activation" in opdef.attrs:
        return "conv/matmul"
    if "keepdims" in opdef.attrs:
        return "reduction"
    if op in _NAMED_CLASSES:
        return _NAMED_CLASSES[op]
    if opdef.compute.__module__ == "glowpy.ir.ops.tensor":
        return "data movement/shape"
    return "other"


def _fmt_param(p: object) -> str:
    return f"{p:g}" if isinstance(p, float) else str(p)


def _window(node: Node) -> str:
    """A conv's or pool's window, stride and groups ("Conv 3x3/2 g32"); other ops: the op name."""
    if node.op in ("Conv", "ConvTranspose"):
        kernel = node.inputs[1].type.shape[2:]
    elif "kernel_shape" in node.attrs:
        kernel = tuple(node.attrs["kernel_shape"])
    else:
        return node.op
    strides = tuple(node.attrs.get("strides") or ())
    text = f"{node.op} {'x'.join(map(str, kernel))}"
    if any(st != 1 for st in strides):
        text += "/" + ("x".join(map(str, strides)) if len(set(strides)) > 1 else str(strides[0]))
    if node.attrs.get("group", 1) != 1:
        text += f" g{node.attrs['group']}"
    return text


def absorbed(node: Node) -> list[str]:
    """What the optimizer fused into `node`, as label lines: the activation epilogue with its
    parameters ("+relu", "+clip(0, 6)") and a Conv's residual add (its 4th operand)."""
    lines = []
    if node.op == "Conv" and len(node.inputs) > 3:
        lines.append("+residual add")
    act = node.attrs.get("activation")
    if act and act != "none":
        params = node.attrs.get("activation_params") or ()
        lines.append(f"+{act}" + (f"({', '.join(_fmt_param(p) for p in params)})" if params else ""))
    return lines


def _q(s: str) -> str:
    # Backslashes pass through: labels use DOT's own "\\n" line-break escape.
    return '"' + s.replace('"', '\\"') + '"'


def _label(v: Value) -> str:
    return _q(f"{v.name}\\n{v.type}")


def _legend(classes: list[str]) -> str:
    """An HTML-like graph label: one coloured cell per op class the graph uses (not a node, so the
    picture's nodes are exactly the graph's)."""
    cells = "".join(f'<TD BGCOLOR="{CLASS_COLOURS[c]}">{c}</TD>' for c in CLASS_COLOURS if c in classes)
    return f'<<TABLE BORDER="0" CELLSPACING="2" CELLPADDING="3"><TR>{cells}</TR></TABLE>>'


def to_dot(graph: Graph, *, show_constants: bool = False) -> str:
    """Nodes as boxes filled by op class (`op_class`, CLASS_COLOURS; a legend below), placeholders
    and outputs as ellipses, edges labelled with the value type; a fused node lists what it absorbed
    (`absorbed`), and a residual operand's edge is dashed.

    Constants are left out unless `show_constants` (weights would swamp the picture); a node's
    label lists how many constant operands it has.
    """
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB; fontname=Helvetica; fontsize=10;",
             "  node [fontname=Helvetica, fontsize=10];",
             "  edge [fontname=Helvetica, fontsize=8];"]
    for v in graph.inputs:
        lines.append(f"  {_q('in:' + v.name)} [shape=ellipse, label={_label(v)}];")
    for v in graph.constants.values():
        if show_constants and v.users:
            lines.append(f"  {_q('const:' + v.name)} [shape=note, label={_label(v)}];")
    classes = []
    for n in graph.nodes:
        nconst = sum(1 for v in n.inputs if v.is_constant)
        label = [_window(n), *absorbed(n)]
        if nconst and not show_constants:
            label.append(f"+{nconst} weights")
        cls = op_class(n.op)
        classes.append(cls)
        text = "\\n".join(label)
        lines.append(f"  {_q('node:' + n.name)} [shape=box, style=\"rounded,filled\", "
                     f"fillcolor={_q(CLASS_COLOURS[cls])}, label={_q(text)}, tooltip={_q(f'{n.name} ({cls})')}];")
    for n in graph.nodes:
        for i, v in enumerate(n.inputs):
            if v.producer is not None:
                src = "node:" + v.producer.name
            elif v.kind == "input":
                src = "in:" + v.name
            elif show_constants:
                src = "const:" + v.name
            else:
                continue
            residual = n.op == "Conv" and i == 3
            label = f"residual {v.type}" if residual else str(v.type)
            lines.append(f"  {_q(src)} -> {_q('node:' + n.name)} [label={_q(label)}"
                         + (", style=dashed" if residual else "") + "];")
    for v in graph.outputs:
        lines.append(f"  {_q('out:' + v.name)} [shape=ellipse, style=bold, label={_label(v)}];")
        src = "node:" + v.producer.name if v.producer is not None else ("in:" + v.name)
        lines.append(f"  {_q(src)} -> {_q('out:' + v.name)};")
    if classes:
        lines.append(f"  labelloc=b; label={_legend(classes)};")
    lines.append("}")
    return "\n".join(lines) + "\n"
