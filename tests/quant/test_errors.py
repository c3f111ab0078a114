"""Bad quantization nodes: every bad attribute raises UnsupportedAttribute naming the node and the
attribute, a scale / zero point of the wrong shape MismatchingShape naming the node, and element types
glowpy has no representation for UnsupportedDatatype saying which and why. `glowpy.check` agrees."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glowpy
import glowpy.importer.quant  # noqa: F401  (the quantization rows of the op table)
from glowpy.errors import MismatchingDatatype, MismatchingShape, UnsupportedAttribute, UnsupportedDatatype
from tests.ops.util import Const, expect_error, node_model, randn

I8, U8 = np.int8, np.uint8
S = Const(np.float32(0.1))


def q8(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, shape).astype(U8)


@pytest.mark.parametrize("attr,value,opset", [
    ("axis", 0, 10),  # no axis before 13
    ("saturate", 1, 13),  # no saturate before 19
    ("block_size", 2, 19),
    ("output_dtype", TensorProto.INT8, 19),
    ("precision", TensorProto.FLOAT, 21),
])
def test_quantize_attribute_before_its_opset(attr, value, opset):
    expect_error(UnsupportedAttribute, "QuantizeLinear", [randn(2, 4), S], opset=opset, attrs={attr: value},
                 mentions=[f"'{attr}'", f"opset {opset}"])


@pytest.mark.parametrize("attrs,mentions", [
    ({"axis": 3}, ["axis"]),
    ({"axis": -4}, ["axis"]),
    ({"saturate": 2}, ["'saturate'"]),
    ({"block_size": -1}, ["'block_size'"]),
    ({"precision": TensorProto.INT8}, ["precision"]),
    ({"not_an_attribute": 1}, ["'not_an_attribute'"]),
])
def test_quantize_bad_attribute_values(attrs, mentions):
    expect_error(UnsupportedAttribute, "QuantizeLinear", [randn(2, 4, 3), Const(np.ones(4, np.float32)),
                                                          Const(np.zeros(4, U8))],
                 opset=23, attrs=attrs, mentions=mentions)


def test_quantize_output_dtype_disagrees_with_zero_point():
    expect_error(UnsupportedAttribute, "QuantizeLinear", [randn(2, 4), S, Const(np.uint8(0))], opset=21,
                 attrs={"output_dtype": TensorProto.INT8}, mentions=["'output_dtype'", "uint8", "int8"])


@pytest.mark.parametrize("code,name", [(TensorProto.FLOAT8E8M0, "FLOAT8E8M0"), (TensorProto.FLOAT6E2M3,
                                       "FLOAT6E2M3"), (TensorProto.INT32, "int32")])
def test_quantize_unrepresented_output_types(code, name):
    expect_error(UnsupportedDatatype, "QuantizeLinear", [randn(2, 4), S], opset=21,
                 attrs={"output_dtype": code}, mentions=["output_dtype", name])


def test_int4_zero_point_of_int8_input_is_refused():
    stand_in = Const(np.zeros(4, np.int8))  # replaced by an INT4 initializer below
    model, _ = node_model("DequantizeLinear", [q8(4), Const(np.ones(4, np.float32)), stand_in], opset=21,
                          attrs={"axis": 0})
    model.graph.initializer[1].CopyFrom(helper.make_tensor("in2", TensorProto.INT4, [4], [0, 1, 2, 3]))
    with pytest.raises(MismatchingDatatype, match="zero point"):
        glowpy.compile(model, backend="interpreter")


def test_sixteen_bit_needs_opset_21():
    expect_error(UnsupportedDatatype, "QuantizeLinear", [randn(2, 4), S, Const(np.int16(0))], opset=19,
                 mentions=["opset 21", "int16"])


@pytest.mark.parametrize("scale,zero,attrs,opset", [
    (np.ones(3, np.float32), np.zeros(3, U8), {"axis": 1}, 13),  # per axis, wrong length
    (np.ones(4, np.float32), np.zeros(3, U8), {"axis": 1}, 13),  # scale and zero point differ
    (np.ones((2, 2), np.float32), np.zeros((2, 2), U8), {}, 19),  # rank 2 before blocking existed
    (np.ones((2, 3), np.float32), np.zeros((2, 3), U8), {"axis": 1, "block_size": 2}, 21),  # wrong block count
    (np.ones((2, 2), np.float32), np.zeros((2, 2), U8), {"axis": 1, "block_size": 1}, 21),
    (np.ones(2, np.float32), np.zeros(2, U8), {"axis": 1, "block_size": 2}, 21),  # blocked needs full rank
], ids=["axis-length", "zp-differs", "rank2-old", "blocks", "block-size-1", "block-rank"])
def test_quantize_parameter_shapes(scale, zero, attrs, opset):
    expect_error(MismatchingShape, "QuantizeLinear", [randn(2, 4), Const(scale), Const(zero)], opset=opset,
                 attrs=attrs)


def test_dequantize_zero_point_type_differs():
    expect_error(MismatchingDatatype, "DequantizeLinear", [q8(2, 4), S, Const(np.int8(0))], opset=13,
                 mentions=["zero point", "uint8", "int8"])


def test_dequantize_parameter_shape():
    expect_error(MismatchingShape, "DequantizeLinear", [q8(2, 4), Const(np.ones(3, np.float32)),
                                                        Const(np.zeros(3, U8))], opset=13, attrs={"axis": -1})


def test_dequantize_output_dtype_before_23():
    expect_error(UnsupportedAttribute, "DequantizeLinear", [q8(2, 4), S], opset=21,
                 attrs={"output_dtype": TensorProto.FLOAT16}, mentions=["'output_dtype'", "opset 23"])


def _qconv(x_scale=S, w_scale=S, w_zero=None, bias=None):
    x = q8(1, 2, 5, 5)
    w = Const(np.ones((3, 2, 3, 3), I8))
    w_zero = Const(I8(0)) if w_zero is None else w_zero
    return [x, x_scale, Const(U8(0)), w, w_scale, w_zero, S, Const(U8(0))] + ([bias] if bias is not None else [])


@pytest.mark.parametrize("operands,mentions", [
    (_qconv(x_scale=Const(np.ones(2, np.float32))), ["x_scale"]),
    (_qconv(w_scale=Const(np.ones(2, np.float32))), ["w_scale"]),
    (_qconv(w_zero=Const(np.zeros(4, I8))), ["w_zero_point"]),
    (_qconv(bias=Const(np.zeros(2, np.int32))), ["bias"]),
], ids=["x_scale", "w_scale", "w_zero_point", "bias"])
def test_qlinear_conv_parameter_shapes(operands, mentions):
    expect_error(MismatchingShape, "QLinearConv", operands, opset=10, mentions=mentions)


@pytest.mark.parametrize("attrs,mentions", [
    ({"kernel_shape": [2, 2]}, ["'kernel_shape'"]),
    ({"auto_pad": "BOGUS"}, ["'auto_pad'"]),
    ({"strides": [1]}, ["'strides'"]),
    ({"group": 0}, ["'group'"]),
])
def test_qlinear_conv_bad_attributes(attrs, mentions):
    expect_error(UnsupportedAttribute, "QLinearConv", _qconv(), opset=10, attrs=attrs, mentions=mentions)


def test_conv_integer_per_channel_x_zero_point():
    expect_error(MismatchingShape, "ConvInteger", [q8(1, 2, 4, 4), Const(np.ones((3, 2, 2, 2), U8)),
                                                   Const(np.zeros(2, U8))], opset=10, mentions=["x_zero_point"])


def test_matmul_integer_zero_point_per_column_of_a():
    expect_error(MismatchingShape, "MatMulInteger", [q8(3, 4), Const(np.ones((4, 2), U8)),
                                                     Const(np.zeros((1, 4), U8))], opset=10,
                 mentions=["a_zero_point", "row"])


def test_matmul_integer_zero_point_per_row_of_b():
    expect_error(MismatchingShape, "MatMulInteger", [q8(3, 4), Const(np.ones((4, 2), U8)), Const(U8(0)),
                                                     Const(np.zeros((4, 1), U8))], opset=10,
                 mentions=["b_zero_point", "column"])


def test_qlinear_matmul_scale_and_zero_point_shapes_differ():
    expect_error(MismatchingShape, "QLinearMatMul", [q8(3, 4), S, Const(U8(0)), Const(np.ones((4, 2), U8)),
                                                     Const(np.ones(2, np.float32)), Const(U8(0)), S, Const(U8(0))],
                 opset=10, mentions=["b_scale", "b_zero_point"])


def test_qlinear_matmul_float16_scales_need_opset_21():
    h = Const(np.float16(0.1))
    expect_error(UnsupportedDatatype, "QLinearMatMul", [q8(3, 4), h, Const(U8(0)), Const(np.ones((4, 2), U8)), h,
                                                        Const(U8(0)), h, Const(U8(0))], opset=10,
                 mentions=["a_scale", "float16"])

