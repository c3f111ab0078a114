"""Bad input per op family: unsupported attribute values, element types, operators and opsets raise the
matching glowpy error, and the message names the node, the op and what is wrong. Plus a guard that
every ONNX op the importer accepts is exercised by these op tests."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import glowpy
from glowpy.errors import (
    InvalidModel,
    MismatchingDatatype,
    MismatchingShape,
    UnsupportedAttribute,
    UnsupportedDatatype,
    UnsupportedOperator,
    UnsupportedShape,
    UnsupportedVersion,
)
from glowpy.importer import TABLE

from .util import Const, expect_error, node_model, randbool, randint, randn

# --- unsupported attribute values, one or more per family -------------------------------------------

BAD_ATTRS = {
    # op: (inputs, opset, attrs, attribute the message must name)
    "Gelu-approximate": ("Gelu", [randn(3)], 20, {"approximate": "fast"}, "approximate"),
    "LeakyRelu-alpha-int": ("LeakyRelu", [randn(3)], 16, {"alpha": 1}, "alpha"),
    "Cast-round_mode": ("Cast", [randn(3)], 25, {"to": TensorProto.FLOAT16, "round_mode": "sideways"}, "round_mode"),
    "Conv-auto_pad": ("Conv", [randn(1, 2, 4, 4), Const(randn(3, 2, 3, 3))], 11, {"auto_pad": "FOO"}, "auto_pad"),
    "Conv-pads-negative": ("Conv", [randn(1, 2, 4, 4), Const(randn(3, 2, 3, 3))], 11, {"pads": [-1, 0, 0, 0]},
                           "pads"),
    "ConvTranspose-output_padding": ("ConvTranspose", [randn(1, 2, 3, 3), Const(randn(2, 2, 3, 3))], 11,
                                     {"output_padding": [-1, 0]}, "output_padding"),
    "MaxPool-storage_order": ("MaxPool", [randn(1, 2, 4, 4)], 12, {"kernel_shape": [2, 2], "storage_order": 2},
                              "storage_order"),
    "AveragePool-ceil_mode": ("AveragePool", [randn(1, 2, 4, 4)], 12, {"kernel_shape": [2, 2], "ceil_mode": 2},
                              "ceil_mode"),
    "AveragePool-count_include_pad": ("AveragePool", [randn(1, 2, 4, 4)], 12,
                                      {"kernel_shape": [2, 2], "count_include_pad": 3}, "count_include_pad"),
    "BatchNormalization-training_mode": (
        "BatchNormalization", [randn(2, 3), *(Const(np.ones(3, np.float32)) for _ in range(4))], 15,
        {"training_mode": 1}, "training_mode"),
    "LRN-size-0": ("LRN", [randn(1, 3, 2, 2)], 13, {"size": 0}, "size"),
    "LayerNormalization-stash_type": ("LayerNormalization", [randn(2, 3), Const(randn(3))], 17, {"stash_type": 0},
                                      "stash_type"),
    "Gemm-transA": ("Gemm", [randn(2, 3), Const(randn(3, 2))], 13, {"transA": 2}, "transA"),
    "Reshape-allowzero": ("Reshape", [randn(2, 3), Const(np.array([6], np.int64))], 14, {"allowzero": 2}, "allowzero"),
    "Split-num_outputs": ("Split", [randn(4)], 18, {"num_outputs": 0}, "num_outputs"),
    "Pad-mode": ("Pad", [randn(3, 4), Const(np.array([1, 1, 1, 1], np.int64))], 13, {"mode": "symmetric"}, "mode"),
    "ReduceSum-keepdims": ("ReduceSum", [randn(2, 3)], 13, {"keepdims": 2}, "keepdims"),
    "ArgMax-select_last_index": ("ArgMax", [randn(2, 3)], 13, {"select_last_index": 5}, "select_last_index"),
    "Constant-sparse_value": ("Constant", [], 13, {"sparse_value": helper.make_sparse_tensor(
        helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]), helper.make_tensor("i", TensorProto.INT64, [1], [0]),
        [3])}, "sparse_value"),
    "Relu-unknown-attribute": ("Relu", [randn(3)], 14, {"alpha": 0.5}, "alpha"),
}


@pytest.mark.parametrize("case", list(BAD_ATTRS))
def test_unsupported_attribute(case):
    op, ins, opset, attrs, name = BAD_ATTRS[case]
    err = expect_error(UnsupportedAttribute, op, ins, opset=opset, attrs=attrs, mentions=[f"'{name}'"])
    assert err.opset == opset


# --- unsupported element types ---------------------------------------------------------------------

BAD_DTYPES = {
    "Relu-bool": ("Relu", [randbool(3)], 14, {}),
    "Sqrt-int": ("Sqrt", [randint(3, dtype=np.int32)], 13, {}),
    "Exp-int64": ("Exp", [randint(3)], 13, {}),
    "Conv-int": ("Conv", [randint(1, 2, 4, 4, dtype=np.int32), Const(randint(3, 2, 3, 3, dtype=np.int32))], 11, {}),
    "AveragePool-int": ("AveragePool", [randint(1, 2, 4, 4, dtype=np.int32)], 11, {"kernel_shape": [2, 2]}),
    "Softmax-int": ("Softmax", [randint(2, 3)], 13, {}),
    "Add-bool": ("Add", [randbool(3), randbool(3)], 14, {}),
    "Greater-bool": ("Greater", [randbool(3), randbool(3)], 13, {}),
    "Where-float-condition": ("Where", [randn(3), randn(3), randn(3)], 16, {}),
    "ReduceSum-bool": ("ReduceSum", [randbool(3)], 13, {}),
    "Pad-bool": ("Pad", [randbool(3), Const(np.array([1, 1], np.int64))], 13, {}),
    "Cast-to-string": ("Cast", [randn(3)], 13, {"to": TensorProto.STRING}),
}


@pytest.mark.parametrize("case", list(BAD_DTYPES))
def test_unsupported_datatype(case):
    op, ins, opset, attrs = BAD_DTYPES[case]
    expect_error(UnsupportedDatatype, op, ins, opset=opset, attrs=attrs)


def test_string_input_unsupported():
    """A string tensor cannot even be declared as an input: the error names the input."""
    info = helper.make_tensor_value_info("s", TensorProto.STRING, [3])
    model_inputs = [info]

    model, _ = node_model("Relu", [], opset=14, input_infos=model_inputs)
    model.graph.node[0].input.append("s")

    with pytest.raises(UnsupportedDatatype, match="'s'.*STRING|STRING.*'s'"):
        glowpy.compile(model, backend="interpreter")


# --- operands that do not fit the op ----------------------------------------------------------------


def _ints(*v: int) -> Const:
    return Const(np.array(v, dtype=np.int64))


BAD_OPERANDS = {
    # case: (error class, op, inputs, opset, attrs, words the message must contain)
    "Concat-axis": (UnsupportedAttribute, "Concat", [randn(2, 3), randn(2, 3)], 13, {"axis": 2}, ["axis", "found 2"]),
    "Concat-negative-axis": (UnsupportedAttribute, "Concat", [randn(2, 3), randn(2, 3)], 13, {"axis": -3},
                             ["axis", "found -3"]),
    "Concat-dtypes": (MismatchingDatatype, "Concat", [randn(2, 3), randint(2, 3)], 13, {"axis": 0}, ["int64"]),
    "Concat-shapes": (MismatchingShape, "Concat", [randn(2, 3), randn(2, 4)], 13, {"axis": 0}, ["concat axis"]),
    "Gather-axis": (UnsupportedAttribute, "Gather", [randn(2, 3), Const(np.array([0]))], 13, {"axis": 2}, ["axis"]),
    "Gather-float-indices": (UnsupportedDatatype, "Gather", [randn(3), Const(np.array([1.0], np.float32))], 13, {},
                             ["indices"]),
    "ArgMax-axis": (UnsupportedAttribute, "ArgMax", [randn(2, 3)], 13, {"axis": -3}, ["axis"]),
    "LogSoftmax-axis": (UnsupportedAttribute, "LogSoftmax", [randn(2, 3)], 13, {"axis": -3}, ["axis"]),
    "Split-axis": (UnsupportedAttribute, "Split", [randn(2, 4)], 18, {"axis": 2, "num_outputs": 2}, ["axis"]),
    "Squeeze-axis": (UnsupportedAttribute, "Squeeze", [randn(2, 3), _ints(2)], 13, {}, ["axis"]),
    "Squeeze-non-1": (InvalidModel, "Squeeze", [randn(2, 3), _ints(0)], 13, {}, ["size 1"]),
    "Unsqueeze-axis": (UnsupportedAttribute, "Unsqueeze", [randn(2, 3), _ints(3)], 13, {}, ["axis"]),
    "ReduceSum-axis": (UnsupportedAttribute, "ReduceSum", [randn(2, 3), _ints(-3)], 13, {}, ["axis"]),
    "Slice-axis": (UnsupportedAttribute, "Slice", [randn(2, 3), _ints(0), _ints(1), _ints(2)], 13, {}, ["axis"]),
    "Pad-axis": (UnsupportedAttribute, "Pad", [randn(2, 3), _ints(1, 1), None, _ints(2)], 18, {}, ["axis"]),
    "Pad-pads-length": (UnsupportedAttribute, "Pad", [randn(2, 3), _ints(1, 1)], 13, {}, ["pads"]),
    "LayerNormalization-axis": (UnsupportedAttribute, "LayerNormalization", [randn(2, 3), Const(randn(3))], 17,
                                {"axis": 2}, ["axis"]),
    "Expand-shape": (MismatchingShape, "Expand", [randn(2, 3), _ints(4)], 13, {}, ["broadcast"]),
    "Reshape-count": (InvalidModel, "Reshape", [randn(2, 3), _ints(4, -1)], 13, {}, ["element count"]),
    "Reshape-two-minus1": (UnsupportedAttribute, "Reshape", [randn(2, 3), _ints(-1, -1)], 13, {}, ["-1"]),
    "Gemm-inner": (MismatchingShape, "Gemm", [randn(2, 3), Const(randn(4, 2))], 13, {}, ["inner"]),
    "MatMul-inner": (MismatchingShape, "MatMul", [randn(2, 3), randn(4, 2)], 13, {}, ["inner"]),
    "Add-broadcast": (MismatchingShape, "Add", [randn(2, 3), randn(4)], 13, {}, ["broadcast"]),
    "Add-dtypes": (MismatchingDatatype, "Add", [randn(3), randint(3)], 13, {}, ["int64"]),
    "Where-dtypes": (MismatchingDatatype, "Where", [randbool(2), randn(2), randint(2)], 16, {}, ["int64"]),
    "Conv-channels": (MismatchingShape, "Conv", [randn(1, 2, 4, 4), Const(randn(3, 3, 3, 3))], 11, {}, ["channels"]),
    "Conv-kernel_shape": (InvalidModel, "Conv", [randn(1, 2, 4, 4), Const(randn(3, 2, 3, 3))], 11,
                          {"kernel_shape": [2, 2]}, ["kernel_shape"]),
    "Conv-strides-length": (UnsupportedAttribute, "Conv", [randn(1, 2, 4, 4), Const(randn(3, 2, 3, 3))], 11,
                            {"strides": [1]}, ["strides"]),
    "Conv-kernel-too-big": (UnsupportedShape, "Conv", [randn(1, 2, 2, 2), Const(randn(3, 2, 3, 3))], 11, {},
                            ["kernel"]),
    "MaxPool-kernel-length": (UnsupportedAttribute, "MaxPool", [randn(1, 2, 4, 4)], 11, {"kernel_shape": [2]},
                              ["kernel_shape"]),
    "MaxPool-rank": (UnsupportedAttribute, "MaxPool", [randn(2, 4)], 11, {"kernel_shape": [2]}, ["spatial"]),
    "BatchNormalization-channels": (MismatchingShape, "BatchNormalization",
                                    [randn(2, 3), *(Const(randn(4)) for _ in range(4))], 15, {}, ["channel"]),
    "ConstantOfShape-negative": (UnsupportedAttribute, "ConstantOfShape", [_ints(-1, 2)], 9, {}, ["negative"]),
    "Cast-unknown-type": (UnsupportedDatatype, "Cast", [randn(3)], 13, {"to": 100}, ["100"]),
}


@pytest.mark.parametrize("case", list(BAD_OPERANDS))
def test_bad_operands(case):
    cls, op, ins, opset, attrs, words = BAD_OPERANDS[case]
    expect_error(cls, op, ins, opset=opset, attrs=attrs, mentions=words)


# --- unsupported operators and opsets --------------------------------------------------------------


@pytest.mark.parametrize("op", ["NoSuchOp", "TfIdfVectorizer", "ImageDecoder"])
def test_unknown_operator(op):
    err = expect_error(UnsupportedOperator, op, [randn(3)], opset=13, mentions=[f"operator {op}"])
    assert err.op == op


def test_unknown_domain_operator():
    err = expect_error(UnsupportedOperator, "Relu", [randn(3)], opset=13, domain="com.example",
                       mentions=["com.example"])
    assert err.node == "the_node"


@pytest.mark.parametrize("op,opset,ins", [
    ("Gelu", 19, [randn(3)]),
    ("LayerNormalization", 16, [randn(2, 3), Const(randn(3))]),
    ("ConstantOfShape", 8, [Const(np.array([2], np.int64))]),
    ("Expand", 7, [randn(3), Const(np.array([2, 3], np.int64))]),
], ids=["Gelu-19", "LayerNormalization-16", "ConstantOfShape-8", "Expand-7"])
def test_operator_before_its_opset(op, opset, ins):
    err = expect_error(UnsupportedVersion, op, ins, opset=opset)
    assert err.opset == opset


def test_extra_outputs_unsupported():
    expect_error(UnsupportedOperator, "ArgMax", [randn(2, 3)], opset=13, outputs=2, mentions=["output"])


# --- every importer op is covered ------------------------------------------------------------------


def test_every_table_op_has_a_reference_test():
    """Each ONNX op in the importer table appears as a checked op in tests/ops, tests/quant or the
    activation registry's tests (a new op needs tests)."""
    here = Path(__file__).parent
    files = [*here.glob("test_*.py"), *(here.parent / "quant").glob("test_*.py"),
             here.parent / "backends" / "cpu" / "test_activations.py", here.parent / "test_control_flow.py"]
    text = "\n".join(p.read_text() for p in files if p.name != "test_errors.py")
    quoted = set(re.findall(r'"([A-Z][A-Za-z0-9]+)"', text))
    missing = sorted(op for (domain, op) in TABLE if op not in quoted)
    assert not missing, f"ops without per-op tests: {missing}"
