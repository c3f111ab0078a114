"""The importer's one walk: function ops import through their ONNX bodies, on both hosts (the graph
builder and the types-only compatibility check), and a converter bug is an InternalError on both."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from ops.util import NODE, check, expect_error, node_model, randn

import glowpy
from glowpy.errors import InternalError, Status, UnsupportedAttribute, UnsupportedOperator
from glowpy.importer import TABLE
from glowpy.importer.table import OnnxOp


def test_mish_imports_through_its_function_body(backend: str) -> None:
    # Mish has no row in the op table: its body (Softplus, Tanh, Mul) is walked with their converters.
    assert ("", "Mish") not in TABLE
    check(backend, "Mish", [randn(2, 3, 4)], opset=18)


def test_attribute_references_take_the_node_attributes_and_the_defaults(backend: str) -> None:
    # Selu's body reads alpha and gamma through ref_attr_name: given ones and the schema default.
    check(backend, "Selu", [randn(3, 5)], opset=22, attrs={"alpha": 1.5, "gamma": 1.2})
    check(backend, "Selu", [randn(3, 5)], opset=22, attrs={"alpha": 0.5})


def test_context_dependent_function_body(backend: str) -> None:
    # GroupNormalization-18's body is built by onnx for the node's attributes and input types.
    x = randn(2, 4, 3)
    check(backend, "GroupNormalization", [x, np.full(2, 1.5, np.float32), np.full(2, 0.1, np.float32)], opset=18,
          attrs={"num_groups": 2, "epsilon": 1e-3})


def test_function_body_inside_a_function_body(backend: str) -> None:
    # A model-local function whose body uses a schema function op (Mish): expansion recurses.
    fn = helper.make_function("local", "MishTwice", ["x"], ["y"],
                              [helper.make_node("Mish", ["x"], ["t"]), helper.make_node("Mish", ["t"], ["y"])],
                              [helper.make_opsetid("", 18)])
    x = randn(2, 6)
    graph = helper.make_graph([helper.make_node("MishTwice", ["X"], ["Y"], name=NODE, domain="local")], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, x.shape)])
    model = helper.make_model(graph, functions=[fn],
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)])
    model.ir_version = min(model.ir_version, onnx.IR_VERSION)
    want = x * np.tanh(np.log1p(np.exp(x)))
    want = want * np.tanh(np.log1p(np.exp(want)))
    got = glowpy.compile(model, backend=backend).run({"X": x})["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert glowpy.check(model, backend=backend).supported


def test_function_op_with_an_unknown_attribute_names_the_node() -> None:
    expect_error(UnsupportedAttribute, "Mish", [randn(2, 3)], opset=18, attrs={"alpha": 1.0},
                 mentions=["attribute 'alpha' is not supported"])


def test_function_op_with_a_mistyped_attribute_names_the_node() -> None:
    expect_error(UnsupportedAttribute, "SwiGLU", [randn(2, 4)], opset=28, attrs={"alpha": 2},
                 mentions=["attribute 'alpha' has an unsupported value", "a FLOAT", "found a INT"])


def test_error_in_a_function_body_names_the_node_and_the_body_node() -> None:
    # A body op glowpy lacks: the error names the model node and the body node it comes from.
    model, _ = node_model("Mish", [randn(2, 3)], opset=18)
    saved = TABLE.pop(("", "Tanh"))
    try:
        with pytest.raises(UnsupportedOperator) as info:
            glowpy.load(model)
        report = glowpy.check(model)
    finally:
        TABLE[("", "Tanh")] = saved
    text = str(info.value)
    assert f"node '{NODE}' (Mish, opset 18): in its function body, node '{NODE}/" in text
    assert "(Tanh): operator Tanh is not supported" in text
    assert report.nodes[0].status == Status.UNSUPPORTED_OPERATOR and "in its function body" in report.nodes[0].reason


def test_a_dedicated_row_wins_over_the_function_body() -> None:
    # LayerNormalization has a function body and a row: the row's single IR op is what is emitted.
    x = randn(2, 4)
    model, _ = node_model("LayerNormalization", [x, np.ones(4, np.float32)], opset=17)
    assert [n.op for n in glowpy.load(model).nodes] == ["LayerNormalization"]


def test_converter_bug_is_an_internal_error_on_both_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx):
        return ctx.no_such_method()  # an AttributeError: a bug, not an assumption

    row = TABLE[("", "Relu")]
    monkeypatch.setitem(TABLE, ("", "Relu"), OnnxOp(row.op_type, broken, row.attrs, row.dtypes))
    model, _ = node_model("Relu", [randn(2, 3)], opset=13)
    with pytest.raises(InternalError, match=rf"node '{NODE}' \(Relu, opset 13\): conversion failed: AttributeError"):
        glowpy.load(model)
    verdict = glowpy.check(model).nodes[0]
    assert verdict.status == Status.INTERNAL_ERROR
    assert "conversion failed: AttributeError" in verdict.reason and f"'{NODE}'" in verdict.reason


def test_only_an_unread_operand_means_cannot_follow() -> None:
    # Reshape's shape as a weight, no declared output: the check cannot follow it and says what it assumed.
    model, _ = node_model("Reshape", [randn(2, 6), np.array([3, 4], np.int64)], opset=13)
    model.graph.input[1].CopyFrom(helper.make_tensor_value_info("in1", TensorProto.INT64, [2]))
    verdict = glowpy.check(model).nodes[0]
    assert verdict.status == Status.SUCCESS
    assert verdict.assumes == ("assumes operand 1 'in1' (not read) is valid; output types as declared",)
