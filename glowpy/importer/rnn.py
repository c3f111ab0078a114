"""ONNX LSTM, GRU and RNN → the IR ops of the same names (glowpy/ir/ops/rnn.py).

The rows cover opset 7 on (7: the attribute output_sequence gone; 14: layout; 22: bfloat16 only, which
glowpy has no type for). A converter validates every attribute against the node, resolves the
activation list to one (name, alpha, beta) per gate function and direction, and materialises the
absent optional operands as constants, so the IR op always sees the same operands.

activation_alpha / activation_beta are "consumed in the order of activation functions" (spec): each
value goes to the next function that takes that parameter, as onnxruntime reads them.
"""

from __future__ import annotations

import numpy as np

from glowpy.errors import InvalidModel, MismatchingShape
from glowpy.importer.context import NodeContext
from glowpy.importer.table import BOOL_INT, INT, POSITIVE, POSITIVE_FLOAT, Rule, one_of, onnx_op
from glowpy.ir.graph import Value
from glowpy.ir.ops.registry import REQUIRED
from glowpy.ir.ops.rnn import CELLS, DIRECTIONS, RNN_ACTIVATIONS, Cell

LAYOUT_SINCE = 14

STRINGS = Rule(lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings")
FLOATS = Rule(lambda v: isinstance(v, list) and all(isinstance(x, float) for x in v), "a list of floats")

COMMON_ATTRS = {
    "direction": one_of(*DIRECTIONS),
    "hidden_size": POSITIVE,
    "activations": STRINGS,
    "activation_alpha": FLOATS,
    "activation_beta": FLOATS,
    "clip": POSITIVE_FLOAT,
    "layout": BOOL_INT,
}


def _activations(ctx: NodeContext, cell: Cell, dirs: int) -> tuple[tuple[str, float | None, float | None], ...]:
    k = len(cell.functions)
    names = ctx.attr("activations")
    if names is None:
        names = list(cell.defaults) * dirs
    elif cell.name == "RNN" and dirs == 1 and len(names) == 2 and names[0] == names[1]:
        names = names[:1]  # the schema's default, ["Tanh", "Tanh"], spelled out for one direction
    if len(names) != k * dirs:
        roles = ", ".join(cell.functions)
        raise ctx.unsupported(f"attribute 'activations' needs one function per gate function ({roles}) per "
                              f"direction", expected=f"{k * dirs} names", found=names)
    for n in names:
        if n not in RNN_ACTIVATIONS:
            raise ctx.unsupported("attribute 'activations' names an unknown function", expected=list(RNN_ACTIVATIONS),
                                  found=n)
    values = {"activation_alpha": list(ctx.attr("activation_alpha", [])),
              "activation_beta": list(ctx.attr("activation_beta", []))}
    out = []
    for n in names:
        _, *defaults = RNN_ACTIVATIONS[n]
        params: list[float | None] = []
        for key, default in zip(values, defaults):
            if default is None:
                params.append(None)
            elif values[key]:
                params.append(float(values[key].pop(0)))
            elif default is REQUIRED:
                raise ctx.unsupported(f"activation {n} needs a value in attribute '{key}' (ONNX defines no "
                                      f"default for it)", expected=f"a value for {n}", found="none left")
            else:
                params.append(float(default))
        out.append((n, *params))
    for key, rest in values.items():
        if rest:
            raise ctx.unsupported(f"attribute '{key}' has more values than the activations take", expected=
                                  f"{len(ctx.attr(key)) - len(rest)} value(s) for {names}", found=ctx.attr(key))
    return tuple(out)


def _convert(ctx: NodeContext, cell: Cell) -> list[Value]:
    if ctx.num_inputs > cell.num_inputs:
        raise ctx.error(InvalidModel, f"{cell.name} takes at most {cell.num_inputs} inputs",
                        expected=cell.num_inputs, found=ctx.num_inputs)
    if ctx.opset < LAYOUT_SINCE and ctx.attr("layout") is not None:
        raise ctx.unsupported(f"attribute 'layout' exists from opset {LAYOUT_SINCE}", expected="no layout",
                              found=ctx.attr("layout"))
    direction = ctx.attr("direction", "forward")
    dirs = DIRECTIONS[direction]
    layout = ctx.attr("layout", 0)
    x, w, r = ctx.input(0), ctx.input(1), ctx.input(2)
    if x.type.rank != 3 or w.type.rank != 3 or r.type.rank != 3:
        raise ctx.error(MismatchingShape, "X, W and R must be rank 3", expected="[., ., .] each",
                        found=f"{list(x.shape)}, {list(w.shape)}, {list(r.shape)}")
    hidden = ctx.attr("hidden_size", r.shape[-1])
    gh = cell.gates * hidden
    for what, v, want in (("W", w, (dirs, gh, x.shape[2])), ("R", r, (dirs, gh, hidden))):
        if tuple(v.shape) != want:
            raise ctx.error(MismatchingShape, f"{what} does not match hidden_size {hidden}, direction {direction} "
                            f"and the input size", expected=list(want), found=list(v.shape))
    steps, batch = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)

    def operand(i: int, default: np.ndarray) -> Value:
        return ctx.input(i) if ctx.has_input(i) else ctx.constant(default, f"input{i}")

    dtype = x.dtype
    inputs = [x, w, r, operand(3, np.zeros((dirs, 2 * gh), dtype)),
              operand(4, np.full(batch, steps, np.int32)), operand(5, np.zeros(state, dtype))]
    attrs = {"direction": direction, "hidden_size": hidden, "activations": _activations(ctx, cell, dirs),
             "clip": ctx.attr("clip"), "layout": layout}
    if cell.name == "LSTM":
        inputs += [operand(6, np.zeros(state, dtype)), operand(7, np.zeros((dirs, 3 * hidden), dtype))]
        attrs["input_forget"] = ctx.attr("input_forget", 0)
    if cell.name == "GRU":
        attrs["linear_before_reset"] = int(ctx.attr("linear_before_reset", 0) != 0)
    return ctx.emit(cell.name, inputs, attrs)


@onnx_op("LSTM", attrs={**COMMON_ATTRS, "input_forget": BOOL_INT}, max_outputs=3)
def lstm(ctx: NodeContext) -> list[Value]:
    return _convert(ctx, CELLS["LSTM"])


# linear_before_reset: the spec's equations test it against 0, so any integer is read that way.
@onnx_op("GRU", attrs={**COMMON_ATTRS, "linear_before_reset": INT}, max_outputs=2)
def gru(ctx: NodeContext) -> list[Value]:
    return _convert(ctx, CELLS["GRU"])


@onnx_op("RNN", attrs=COMMON_ATTRS, max_outputs=2)
def rnn(ctx: NodeContext) -> list[Value]:
    return _convert(ctx, CELLS["RNN"])
