"""Each importer fact in one place: 1:1 rows come from the IR op (`OpDef.onnx`), attribute defaults from
the ONNX schema (in converters through `ctx.attr`, in IR ops through `FROM_ONNX`)."""

from __future__ import annotations

import numpy as np
import pytest
from ops.util import NODE, check, expect_error, node_model, randn

import glowpy
from glowpy.errors import InvalidModel, Status, UnsupportedAttribute, UnsupportedVersion
from glowpy.importer import TABLE
from glowpy.importer.table import mirror_declared, schema_defaults
from glowpy.ir.ops import OPS, get_op
from glowpy.ir.ops.elementwise import same_as_first
from glowpy.ir.ops.registry import FROM_ONNX, OpDef
from glowpy.ir.types import FLOAT_TYPES


@pytest.fixture
def thresholded_relu(monkeypatch: pytest.MonkeyPatch) -> OpDef:
    """An IR op declared with onnx="ThresholdedRelu" and nothing else: no importer code at all."""
    opdef = OpDef("TestThresholdedRelu", infer=same_as_first, dtypes=FLOAT_TYPES, onnx="ThresholdedRelu",
                  attrs={"alpha": FROM_ONNX},
                  compute=lambda a, x: np.where(x > a["alpha"], x, 0).astype(x.dtype))
    monkeypatch.setitem(OPS, opdef.name, opdef)
    monkeypatch.delitem(OPS, "ThresholdedRelu", raising=False)  # the registry's own ThresholdedRelu activation
    monkeypatch.delitem(TABLE, ("", "ThresholdedRelu"), raising=False)
    mirror_declared()
    yield opdef
    TABLE.pop(("", "ThresholdedRelu"), None)


def test_an_ir_op_declared_with_onnx_imports_without_a_row(thresholded_relu: OpDef, backend: str) -> None:
    row = TABLE[("", "ThresholdedRelu")]
    assert row.dtypes == thresholded_relu.dtypes and set(row.attrs) == {"alpha"} and row.since == 10
    model, _ = node_model("ThresholdedRelu", [randn(3, 4)], opset=13, attrs={"alpha": 0.3})
    assert [n.op for n in glowpy.load(model).nodes] == ["TestThresholdedRelu"]  # the row, not the function body
    if backend == "interpreter":  # the cpu backend has no kernel for a test-only IR op
        check(backend, "ThresholdedRelu", [randn(3, 4)], opset=13, attrs={"alpha": 0.3})
        check(backend, "ThresholdedRelu", [randn(3, 4)], opset=13)  # alpha from the ONNX schema (1.0)


def test_a_mirrored_op_checks_attributes_types_and_opsets(thresholded_relu: OpDef) -> None:
    expect_error(UnsupportedAttribute, "ThresholdedRelu", [randn(3)], opset=13, attrs={"beta": 0.5},
                 mentions=["attribute 'beta' is not supported"])
    expect_error(UnsupportedAttribute, "ThresholdedRelu", [randn(3)], opset=13, attrs={"alpha": 1},
                 mentions=["attribute 'alpha' has an unsupported value", "a float"])
    expect_error(UnsupportedVersion, "ThresholdedRelu", [randn(3)], opset=9, mentions=["expected 10.."])


def test_mirrored_rows_take_their_element_types_from_the_ir_op() -> None:
    for op_type in ("Relu", "Add", "Where", "MatMul", "LeakyRelu", "GlobalMaxPool"):
        assert TABLE[("", op_type)].dtypes == get_op(op_type).dtypes, op_type
    assert TABLE[("", "Where")].since == 9  # Where is an opset 9 op: the schema says so


def test_absent_attributes_take_the_schema_default_at_the_node_opset() -> None:
    model, _ = node_model("LeakyRelu", [randn(3)], opset=16)
    (node,) = glowpy.load(model).nodes
    assert node.attrs["alpha"] == 0.01 == schema_defaults("", "LeakyRelu", 16)["alpha"]
    # Softmax's axis default changed at opset 13 (1 -> -1): each opset gets its own.
    assert schema_defaults("", "Softmax", 11)["axis"] == 1 and schema_defaults("", "Softmax", 13)["axis"] == -1
    model, _ = node_model("Softmax", [randn(2, 3, 4)], opset=11)
    assert [n.op for n in glowpy.load(model).nodes] == ["Reshape", "Softmax", "Reshape"]


def test_from_onnx_defaults_resolve_to_the_onnx_schema() -> None:
    assert get_op("BatchNormalization").attrs["epsilon"] is FROM_ONNX
    assert get_op("BatchNormalization").make_attrs({})["epsilon"] == 1e-05
    lrn = get_op("LRN").make_attrs({"size": 3})
    assert (lrn["alpha"], lrn["beta"], lrn["bias"]) == (0.0001, 0.75, 1.0)
    assert get_op("Gemm").make_attrs({})["transB"] == 0 and get_op("Pad").make_attrs({"pads": (0, 0)})["mode"] == \
        "constant"


def test_a_node_outside_any_row_or_function_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(TABLE, ("", "Cos"))  # Cos has no function body
    model, _ = node_model("Cos", [randn(3)], opset=13)
    with pytest.raises(glowpy.errors.UnsupportedOperator, match=rf"node '{NODE}' \(Cos\): operator Cos is not"):
        glowpy.load(model)


def test_a_mirrored_op_with_the_wrong_number_of_operands_is_an_invalid_model() -> None:
    model, _ = node_model("Relu", [randn(3), randn(3)], opset=13)
    with pytest.raises(InvalidModel, match=rf"node '{NODE}' \(Relu, opset 13\): wrong number of inputs "
                                           r"\(expected 1..1, found 2\)"):
        glowpy.load(model)
    assert glowpy.check(model).nodes[0].status == Status.INVALID_MODEL


def test_a_node_whose_op_type_is_not_utf8_is_unsupported() -> None:
    model, _ = node_model("Relu", [randn(3)], opset=13)
    data = model.SerializeToString().replace(b"\"\x04Relu", b"\"\x04R\xffl\xfe")  # field 4: op_type
    assert glowpy.check(data).status == Status.UNSUPPORTED_OPERATOR
    with pytest.raises(glowpy.errors.UnsupportedOperator):
        glowpy.load(data)
