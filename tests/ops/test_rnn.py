"""Recurrent ONNX ops: LSTM, GRU, RNN on the interpreter, at opsets 7, 14 and 22 (where each changed).

Oracles. onnx.reference runs directions, both layouts, biases, initial states and peepholes, but it
ignores activations (LSTM, GRU; RNN knows only Tanh and Affine), clip, input_forget and
sequence_lens; so those cases use onnxruntime. onnxruntime's CPU kernels refuse layout 1, so layout-1
cases of those features compare with onnxruntime on the same model written in layout 0 (inputs and
outputs transposed).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import glowpy
from glowpy.errors import InvalidShape, MismatchingShape, UnsupportedAttribute
from tools.conformance import node_cases, run_case

from .util import NODE, Const, assert_same, check, expect_error, node_model, rng, run_oracle

BACKEND = "interpreter"  # the cpu kernels: test_cpu_against_oracles, tests/backends/cpu/test_rnn.py
OPS = ("LSTM", "GRU", "RNN")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
OUTPUTS = {"LSTM": ["Y", "Y_h", "Y_c"], "GRU": ["Y", "Y_h"], "RNN": ["Y", "Y_h"]}
DIRECTIONS = ("forward", "reverse", "bidirectional")
# The spec's activation list, which of them take alpha / beta, and the defaults of the ONNX ops.
ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
               "Elu", "Softsign", "Softplus")
TAKES_ALPHA = {"Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu"}
TAKES_BETA = {"Affine", "ScaledTanh", "HardSigmoid"}
SPEC_DEFAULTS = {"LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None), "HardSigmoid": (0.2, 0.5),
                 "Elu": (1.0, None)}


def inputs(op: str, *, steps: int = 5, batch: int = 3, size: int = 4, hidden: int = 3, direction: str = "forward",
           layout: int = 0, bias: bool = True, seq: list[int] | None = None, h0: bool = True, c0: bool = True,
           peep: bool = True, dtype=np.float32, seed: int = 0) -> list:
    """ONNX operands in order (None: absent). Weights are initializers; X, sequence_lens and the initial
    states are fed at run time."""
    r = rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gh = GATES[op] * hidden

    def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (scale * r.standard_normal(shape)).astype(dtype)

    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    ins = [randn(*((batch, steps, size) if layout else (steps, batch, size))),
           Const(randn(dirs, gh, size, scale=0.5)), Const(randn(dirs, gh, hidden, scale=0.5)),
           Const(randn(dirs, 2 * gh, scale=0.5)) if bias else None,
           np.array(seq, np.int32) if seq is not None else None,
           randn(*state) if h0 else None]
    if op == "LSTM":
        ins += [randn(*state) if c0 else None, Const(randn(dirs, 3 * hidden, scale=0.5)) if peep else None]
    while ins and ins[-1] is None:
        ins.pop()
    return ins


def attrs_for(hidden: int = 3, direction: str = "forward", **kw) -> dict:
    return {"hidden_size": hidden, "direction": direction, **kw}


def to_layout0(op: str, ins: list) -> list:
    """The layout-0 operands of a layout-1 operand list: X and the initial states swap their first axes."""
    out = list(ins)
    for i in (0, 5, 6) if op == "LSTM" else (0, 5):
        if i < len(out) and out[i] is not None:
            out[i] = np.ascontiguousarray(np.swapaxes(out[i], 0, 1))
    return out


def check_layout1_vs_ort(op: str, ins: list, attrs: dict, outputs: list[str], backend: str = BACKEND) -> None:
    """glowpy on the layout-1 model against onnxruntime on the same model in layout 0."""
    model, feeds = node_model(op, ins, opset=14, attrs={**attrs, "layout": 1}, outputs=outputs)
    got = glowpy.compile(model, backend=backend).run(feeds)
    ref_model, ref_feeds = node_model(op, to_layout0(op, ins), opset=14, attrs=attrs, outputs=outputs)
    want = run_oracle(ref_model, ref_feeds, "onnxruntime")
    named = [o for o in outputs if o]
    assert list(got) == named
    for name, w in zip(named, want):
        w = w.transpose(2, 0, 1, 3) if name == "Y" else w.swapaxes(0, 1)
        assert_same(f"{op} layout 1 output {name}", got[name], w)


# --- against onnx.reference: directions, layouts, opsets, optional operands and outputs -------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [7, 14, 22])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_directions(op, opset, direction):
    check(BACKEND, op, inputs(op, direction=direction), opset=opset, attrs=attrs_for(direction=direction),
          outputs=OUTPUTS[op])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [14, 22])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_layout1(op, opset, direction):
    check(BACKEND, op, inputs(op, direction=direction, layout=1), opset=opset,
          attrs=attrs_for(direction=direction, layout=1), outputs=OUTPUTS[op])


# Which optional operands are given: B, sequence_lens (full length), initial_h, initial_c, P.
OPTIONAL = {
    "none": {"bias": False, "h0": False, "c0": False, "peep": False},
    "bias": {"bias": True, "h0": False, "c0": False, "peep": False},
    "seq-full": {"bias": False, "seq": [5, 5, 5], "h0": False, "c0": False, "peep": False},
    "initial_h": {"bias": False, "h0": True, "c0": False, "peep": False},
    "initial_c": {"bias": True, "h0": False, "c0": True, "peep": False},
    "peepholes": {"bias": False, "h0": False, "c0": False, "peep": True},
    "all": {"bias": True, "seq": [5, 5, 5], "h0": True, "c0": True, "peep": True},
}


@pytest.mark.parametrize("op,given", [(op, g) for op in OPS for g in OPTIONAL
                                      if op == "LSTM" or g not in ("initial_c", "peepholes")])
@pytest.mark.parametrize("layout", [0, 1])
def test_optional_inputs(op, given, layout):
    ins = inputs(op, layout=layout, direction="bidirectional", **OPTIONAL[given])
    check(BACKEND, op, ins, opset=14, attrs=attrs_for(direction="bidirectional", layout=layout),
          outputs=OUTPUTS[op])


def _output_choices(op: str) -> list[list[str]]:
    names = OUTPUTS[op]
    choices = []
    for mask in range(1, 2 ** len(names)):
        chosen = [n if mask >> i & 1 else "" for i, n in enumerate(names)]
        while chosen[-1] == "":
            chosen.pop()
        choices.append(chosen)
    return choices


@pytest.mark.parametrize("op,outputs", [(op, o) for op in OPS for o in _output_choices(op)],
                         ids=lambda v: "-".join(x or "_" for x in v) if isinstance(v, list) else v)
def test_outputs(op, outputs):
    """Every subset of the optional outputs, omitted ones written as "" (or left off at the end)."""
    got = check(BACKEND, op, inputs(op, direction="reverse"), opset=14, attrs=attrs_for(direction="reverse"),
                outputs=outputs)
    assert list(got) == [o for o in outputs if o]


@pytest.mark.parametrize("op", OPS)
def test_batch1_and_long_sequence(op):
    check(BACKEND, op, inputs(op, steps=17, batch=1, size=6, hidden=5, direction="bidirectional"), opset=14,
          attrs=attrs_for(hidden=5, direction="bidirectional"), outputs=OUTPUTS[op])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_dtypes(op, dtype):
    check(BACKEND, op, inputs(op, direction="bidirectional", dtype=dtype), opset=14,
          attrs=attrs_for(direction="bidirectional"), outputs=OUTPUTS[op])


@pytest.mark.parametrize("op", OPS)
def test_hidden_size_from_r(op):
    """hidden_size is optional in the schema: R's last dim gives it."""
    check(BACKEND, op, inputs(op), opset=14, attrs={}, outputs=OUTPUTS[op])


@pytest.mark.parametrize("op", OPS)
def test_runtime_weights(op):
    """W, R and B fed at run time rather than as initializers."""
    ins = [x.array if isinstance(x, Const) else x for x in inputs(op, direction="bidirectional")]
    check(BACKEND, op, ins, opset=14, attrs=attrs_for(direction="bidirectional"), outputs=OUTPUTS[op])


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("layout", [0, 1])
def test_gru_linear_before_reset(lbr, layout):
    check(BACKEND, "GRU", inputs("GRU", direction="bidirectional", layout=layout), opset=14,
          attrs=attrs_for(direction="bidirectional", layout=layout, linear_before_reset=lbr), outputs=["Y", "Y_h"])


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_rnn_affine_on_reference(direction):
    """RNN's Affine is the one non-default activation onnx.reference implements (one direction only: it
    applies the first direction's function to both)."""
    check(BACKEND, "RNN", inputs("RNN", direction=direction), opset=14,
          attrs=attrs_for(direction=direction, activations=["Affine"], activation_alpha=[0.8],
                          activation_beta=[-0.2]), outputs=["Y", "Y_h"])


# --- against onnxruntime: activations, clip, input_forget, sequence_lens ---------------------------------


def _activation_case(op: str, name: str, slot: int) -> dict:
    """Bidirectional attributes: `name` in gate-function `slot` of the forward direction and a parameterised
    function elsewhere in the reverse one, with alpha / beta lists that are not the defaults."""
    k = len(DEFAULTS[op])
    fwd = list(DEFAULTS[op])
    fwd[slot % k] = name
    rev = list(DEFAULTS[op])
    rev[(slot + 1) % k] = "HardSigmoid" if name != "HardSigmoid" else "LeakyRelu"
    acts = fwd + rev
    alpha = [0.6 + 0.05 * i for i, a in enumerate(acts) if a in TAKES_ALPHA]
    beta = [0.3 - 0.1 * i for i, a in enumerate(acts) if a in TAKES_BETA]
    out = attrs_for(direction="bidirectional", activations=acts)
    if alpha:
        out["activation_alpha"] = alpha
    if beta:
        out["activation_beta"] = beta
    return out


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activations(op, name):
    """Three steps: unbounded functions as gates grow the state fast, and onnxruntime's Softplus overflows
    to inf past x = 88 (log(1 + exp(x))) where glowpy's stays finite."""
    for slot in range(len(DEFAULTS[op])):
        check(BACKEND, op, inputs(op, steps=3, direction="bidirectional"), opset=14,
              attrs=_activation_case(op, name, slot),
              outputs=OUTPUTS[op], oracle="onnxruntime")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["Affine", "ScaledTanh", "Elu"])
def test_activations_layout1(op, name):
    check_layout1_vs_ort(op, inputs(op, direction="bidirectional", layout=1), _activation_case(op, name, 0),
                         OUTPUTS[op])


def test_alpha_consumed_in_order():
    """activation_alpha [0.5] goes to the first function that takes an alpha (LeakyRelu, in second place),
    not to the first position (Sigmoid, which would ignore it and leave LeakyRelu at its default 0.01)."""
    attrs = attrs_for(activations=["Sigmoid", "LeakyRelu", "Tanh"], activation_alpha=[0.5])
    got = check(BACKEND, "LSTM", inputs("LSTM"), opset=14, attrs=attrs, outputs=["Y"], oracle="onnxruntime")
    positional = attrs_for(activations=["Sigmoid", "LeakyRelu", "Tanh"], activation_alpha=[0.01])
    model, feeds = node_model("LSTM", inputs("LSTM"), opset=14, attrs=positional, outputs=["Y"])
    other = glowpy.compile(model, backend=BACKEND).run(feeds)
    assert not np.allclose(got["Y"], other["Y"]), "the alpha made no difference: the test shows nothing"


@pytest.mark.parametrize("name", sorted(SPEC_DEFAULTS))
def test_activation_defaults(name):
    """Without activation_alpha / beta a function takes the default of the ONNX op of its name (the spec's
    rule). onnxruntime leaves ThresholdedRelu's alpha at 0 instead of the op's 1.0, so the oracle runs
    the model with the defaults written out."""
    acts = ["Tanh", name]
    alpha, beta = SPEC_DEFAULTS[name]
    model, feeds = node_model("RNN", inputs("RNN", direction="bidirectional"), opset=14,
                              attrs=attrs_for(direction="bidirectional", activations=acts), outputs=["Y", "Y_h"])
    explicit = attrs_for(direction="bidirectional", activations=acts, activation_alpha=[alpha],
                         **({"activation_beta": [beta]} if beta is not None else {}))
    ref_model, _ = node_model("RNN", inputs("RNN", direction="bidirectional"), opset=14, attrs=explicit,
                              outputs=["Y", "Y_h"])
    got = glowpy.compile(model, backend=BACKEND).run(feeds)
    for name_, want in zip(["Y", "Y_h"], run_oracle(ref_model, feeds, "onnxruntime")):
        assert_same(f"RNN {name} default output {name_}", got[name_], want)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("bound", [0.05, 0.7])
def test_clip(op, direction, bound):
    check(BACKEND, op, inputs(op, direction=direction), opset=14, attrs=attrs_for(direction=direction, clip=bound),
          outputs=OUTPUTS[op], oracle="onnxruntime")


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("peep", [False, True])
def test_lstm_input_forget(direction, peep):
    check(BACKEND, "LSTM", inputs("LSTM", direction=direction, peep=peep), opset=14,
          attrs=attrs_for(direction=direction, input_forget=1), outputs=OUTPUTS["LSTM"], oracle="onnxruntime")


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset_clip_ort(lbr):
    check(BACKEND, "GRU", inputs("GRU", direction="bidirectional"), opset=14,
          attrs=attrs_for(direction="bidirectional", linear_before_reset=lbr, clip=0.4), outputs=OUTPUTS["GRU"],
          oracle="onnxruntime")


# Ragged lengths: a full one, shorter ones, one of length 1 and one of 0.
RAGGED = [5, 3, 1, 0]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("opset", [7, 14])
def test_sequence_lens(op, direction, opset):
    """Steps past an entry's length give zeros in Y and leave its state alone; reverse runs each entry from
    its own last step; an entry of length 0 gets zero Y_h / Y_c (onnxruntime's answer; the spec says
    nothing and onnx.reference ignores sequence_lens altogether)."""
    got = check(BACKEND, op, inputs(op, direction=direction, batch=4, seq=RAGGED), opset=opset,
                attrs=attrs_for(direction=direction), outputs=OUTPUTS[op], oracle="onnxruntime")
    y = got["Y"]
    for n, length in enumerate(RAGGED):
        assert not y[length:, :, n].any()
        assert y[:length, :, n].all()
    assert not got["Y_h"][:, 3].any()


@pytest.mark.parametrize("op", OPS)
def test_sequence_lens_layout1(op):
    ins = inputs(op, direction="bidirectional", batch=4, seq=RAGGED, layout=1)
    check_layout1_vs_ort(op, ins, attrs_for(direction="bidirectional", clip=0.9), OUTPUTS[op])


def test_everything_at_once():
    """LSTM with every option together: ragged lengths, initial states, peepholes, clip, input_forget,
    non-default activations with parameters, bidirectional, batch 4."""
    attrs = attrs_for(direction="bidirectional", clip=1.5, input_forget=1,
                      activations=["HardSigmoid", "Softsign", "ScaledTanh", "Sigmoid", "Elu", "Tanh"],
                      activation_alpha=[0.3, 0.9, 0.8], activation_beta=[0.45, 1.1])
    check(BACKEND, "LSTM", inputs("LSTM", direction="bidirectional", batch=4, seq=RAGGED), opset=14, attrs=attrs,
          outputs=OUTPUTS["LSTM"], oracle="onnxruntime")


def test_rnn_default_activations_spelled_out():
    """The schema's default for RNN is ["Tanh", "Tanh"]; written out on a one-direction RNN it means Tanh."""
    check(BACKEND, "RNN", inputs("RNN"), opset=14, attrs=attrs_for(activations=["Tanh", "Tanh"]),
          outputs=OUTPUTS["RNN"], oracle="onnxruntime")


# --- onnx's node test cases ----------------------------------------------------------------------------


def test_onnx_node_cases():
    cases = node_cases(r"^test_(lstm|gru|simple_rnn|rnn)_")
    assert len(cases) >= 18
    results = {c.name: run_case(c, BACKEND) for c in cases}
    failed = {n: r for n, r in results.items() if r[0] != "pass"}
    assert not failed, failed


def test_cpu_against_oracles():
    """The cpu kernels on the oracles directly (the differential tests against the interpreter are in
    tests/backends/cpu/test_rnn.py): onnx's node cases, every LSTM option at once, GRU clip and
    linear_before_reset, ragged lengths in layout 1."""
    results = {c.name: run_case(c, "cpu") for c in node_cases(r"^test_(lstm|gru|simple_rnn|rnn)_")}
    assert len(results) >= 18 and all(r[0] == "pass" for r in results.values()), results
    attrs = attrs_for(direction="bidirectional", clip=1.5, input_forget=1,
                      activations=["HardSigmoid", "Softsign", "ScaledTanh", "Sigmoid", "Elu", "Tanh"],
                      activation_alpha=[0.3, 0.9, 0.8], activation_beta=[0.45, 1.1])
    check("cpu", "LSTM", inputs("LSTM", direction="bidirectional", batch=4, seq=RAGGED), opset=14, attrs=attrs,
          outputs=OUTPUTS["LSTM"], oracle="onnxruntime")
    check("cpu", "GRU", inputs("GRU", direction="bidirectional", hidden=10), opset=14,
          attrs=attrs_for(hidden=10, direction="bidirectional", clip=0.8, linear_before_reset=1),
          outputs=OUTPUTS["GRU"], oracle="onnxruntime")
    check_layout1_vs_ort("RNN", inputs("RNN", direction="bidirectional", batch=4, seq=RAGGED, layout=1),
                         attrs_for(direction="bidirectional", clip=0.9), OUTPUTS["RNN"], backend="cpu")


# --- refused attributes and shapes --------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_bad_direction(op):
    expect_error(UnsupportedAttribute, op, inputs(op), opset=14, attrs=attrs_for(direction="sideways"),
                 mentions=["direction", "sideways", "bidirectional"])


@pytest.mark.parametrize("op", OPS)
def test_activation_list_wrong_length(op):
    """A bidirectional op given one direction's functions."""
    acts = DEFAULTS[op]
    expect_error(UnsupportedAttribute, op, inputs(op, direction="bidirectional"), opset=14,
                 attrs=attrs_for(direction="bidirectional", activations=acts), mentions=["activations",
                 f"{2 * len(DEFAULTS[op])} names"])


def test_rnn_two_different_activations_one_direction():
    expect_error(UnsupportedAttribute, "RNN", inputs("RNN"), opset=14, attrs=attrs_for(activations=["Tanh", "Relu"]),
                 mentions=["activations", "1 names"])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", ["Gelu", "tanh", ""])
def test_unknown_activation(op, bad):
    acts = list(DEFAULTS[op])
    acts[-1] = bad
    expect_error(UnsupportedAttribute, op, inputs(op), opset=14, attrs=attrs_for(activations=acts),
                 mentions=["activations", "unknown function", f"found {bad}"])


@pytest.mark.parametrize("name", ["Affine", "ScaledTanh"])
def test_activation_without_default_needs_values(name):
    """Affine and ScaledTanh are not ONNX ops, so 'the default of the ONNX op' gives them nothing."""
    expect_error(UnsupportedAttribute, "RNN", inputs("RNN"), opset=14, attrs=attrs_for(activations=[name]),
                 mentions=[name, "activation_alpha"])
    expect_error(UnsupportedAttribute, "RNN", inputs("RNN"), opset=14,
                 attrs=attrs_for(activations=[name], activation_alpha=[0.5]), mentions=[name, "activation_beta"])


def test_too_many_alphas():
    expect_error(UnsupportedAttribute, "GRU", inputs("GRU"), opset=14,
                 attrs=attrs_for(activations=["LeakyRelu", "Tanh"], activation_alpha=[0.1, 0.2]),
                 mentions=["activation_alpha", "more values"])


@pytest.mark.parametrize("key,value", [("clip", -1.0), ("clip", 0.0), ("layout", 2), ("input_forget", 2),
                                       ("hidden_size", 0), ("activations", [1, 2, 3])])
def test_bad_attribute_values(key, value):
    expect_error(UnsupportedAttribute, "LSTM", inputs("LSTM"), opset=14, attrs=attrs_for(**{key: value}),
                 mentions=[f"'{key}'", "unsupported value"])


@pytest.mark.parametrize("op", OPS)
def test_layout_before_opset14(op):
    expect_error(UnsupportedAttribute, op, inputs(op), opset=7, attrs=attrs_for(layout=0),
                 mentions=["'layout'", "opset 14"])


def test_output_sequence_attribute_refused():
    """output_sequence left the schema at opset 7, the first glowpy reads."""
    expect_error(UnsupportedAttribute, "RNN", inputs("RNN"), opset=7, attrs=attrs_for(output_sequence=1),
                 mentions=["'output_sequence'"])


@pytest.mark.parametrize("op", OPS)
def test_hidden_size_disagrees_with_weights(op):
    expect_error(MismatchingShape, op, inputs(op, hidden=3), opset=14, attrs=attrs_for(hidden=4),
                 mentions=["hidden_size 4", f"[1, {GATES[op] * 4}, 4]", f"[1, {GATES[op] * 3}, 4]"])


@pytest.mark.parametrize("op", OPS)
def test_bidirectional_needs_two_weight_sets(op):
    expect_error(MismatchingShape, op, inputs(op, direction="forward"), opset=14,
                 attrs=attrs_for(direction="bidirectional"), mentions=["W", "bidirectional"])


@pytest.mark.parametrize("index,what", [(3, "B"), (5, "initial_h"), (6, "initial_c"), (7, "P")])
def test_operand_wrong_shape(index, what):
    ins = inputs("LSTM")
    bad = np.zeros((1, 2), np.float32)
    ins[index] = Const(bad) if isinstance(ins[index], Const) else bad
    expect_error(MismatchingShape, "LSTM", ins, opset=14, attrs=attrs_for(), mentions=[what, "wrong shape"])


@pytest.mark.parametrize("op", OPS)
def test_sequence_lens_out_of_range(op):
    model, feeds = node_model(op, inputs(op, seq=[5, 6, 1]), opset=14, attrs=attrs_for(), outputs=OUTPUTS[op])
    compiled = glowpy.compile(model, backend=BACKEND)
    with pytest.raises(InvalidShape) as info:
        compiled.run(feeds)
    text = str(info.value)
    assert f"'{NODE}'" in text and "sequence_lens" in text and "0..5" in text, text


def test_too_many_inputs():
    names = ["X", "W", "R", "", "", "", "extra"]
    x = np.zeros((2, 1, 2), np.float32)
    graph = helper.make_graph(
        [helper.make_node("RNN", names, ["Y"], name=NODE, hidden_size=1)], "g",
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s)
         for n, s in (("X", x.shape), ("W", (1, 1, 2)), ("R", (1, 1, 1)), ("extra", (1,)))],
        [helper.make_empty_tensor_value_info("Y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    with pytest.raises(glowpy.errors.InvalidModel, match="at most 6 inputs"):
        glowpy.compile(model, backend=BACKEND)
