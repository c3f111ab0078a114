"""The quantization ops on the interpreter, bit-exact against onnx.reference.ReferenceEvaluator: every
granularity (per tensor, per axis, blocked), every integer type ONNX allows at each opset where the op
changed, ties (round half to even) and saturation. The cpu kernels of the (de)quantization ops are
tested in tests/backends/cpu/test_quant_kernels.py.

Where the reference evaluator is wrong, the test says how and checks glowpy against an equivalent
model the reference gets right.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import glowpy
import glowpy.importer.quant  # noqa: F401  (the quantization rows of the op table)
from tests.ops.util import Const, check, node_model, randn

I8, U8, I16, U16, I32 = np.int8, np.uint8, np.int16, np.uint16, np.int32
F16, F32 = np.float16, np.float32
INTERP = "interpreter"


def ties(*shape: int, scale: float, seed: int = 0) -> np.ndarray:
    """Floats that divide by `scale` to exact halves (ties for round half to even), whole numbers, and
    values far outside every integer type's range (saturation)."""
    r = np.random.default_rng(seed)
    halves = r.integers(-600, 600, shape) / 2.0
    wide = r.uniform(-1e5, 1e5, shape)
    x = np.where(r.random(shape) < 0.8, halves, wide) * scale
    return x.astype(F32)


def qrand(dtype, *shape: int, seed: int = 1) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, int(info.max) + 1, shape).astype(dtype)


def zp(dtype, *shape: int, seed: int = 2) -> np.ndarray:
    """Zero points away from the ends of the type's range."""
    info = np.iinfo(dtype)
    lo, hi = (info.min // 2, info.max // 2) if info.min < 0 else (0, info.max // 2)
    return np.random.default_rng(seed).integers(lo, int(hi) + 1, shape).astype(dtype)


def scales(*shape: int, seed: int = 3) -> np.ndarray:
    # powers of two: x / scale is exact, so ties stay ties
    return (2.0 ** np.random.default_rng(seed).integers(-6, 2, shape)).astype(F32)


# --- QuantizeLinear --------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23, 25])
@pytest.mark.parametrize("dtype", [I8, U8])
def test_quantize_per_tensor(opset, dtype):
    x = ties(3, 4, 5, scale=0.25)
    check(INTERP, "QuantizeLinear", [x, Const(np.float32(0.25)), Const(dtype(zp(dtype).item()))], opset=opset)


@pytest.mark.parametrize("dtype", [I8, U8, I16, U16])
def test_quantize_16_bit_opset21(dtype):
    check(INTERP, "QuantizeLinear", [ties(4, 6, scale=0.5), Const(np.float32(0.5)), Const(dtype(7))], opset=21)


@pytest.mark.parametrize("opset", [10, 19, 21])
def test_quantize_no_zero_point_is_uint8(opset):
    out = check(INTERP, "QuantizeLinear", [ties(2, 8, scale=0.125), Const(np.float32(0.125))], opset=opset)
    assert out["out0"].dtype == np.uint8


@pytest.mark.parametrize("dtype", [TensorProto.INT8, TensorProto.UINT16])
def test_quantize_output_dtype_without_zero_point(dtype):
    out = check(INTERP, "QuantizeLinear", [ties(2, 8, scale=0.125), Const(np.float32(0.125))], opset=21,
                attrs={"output_dtype": dtype})
    assert out["out0"].dtype == (np.int8 if dtype == TensorProto.INT8 else np.uint16)


@pytest.mark.parametrize("opset", [13, 19, 21])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_quantize_per_axis(opset, axis):
    x = ties(3, 4, 5, scale=0.25)
    n = x.shape[axis]
    check(INTERP, "QuantizeLinear", [x, Const(scales(n)), Const(zp(I8, n))], opset=opset, attrs={"axis": axis})


def test_quantize_per_axis_scale_given_at_runtime():
    x = ties(2, 3, 4, scale=0.25)
    check(INTERP, "QuantizeLinear", [x, scales(3), zp(U8, 3)], opset=13)


@pytest.mark.parametrize("block,axis,shape", [(2, 1, (3, 4, 2)), (3, 1, (3, 8, 2)), (4, 0, (9, 3)), (5, -1, (2, 5))])
@pytest.mark.parametrize("dtype", [I8, U8, I16])
def test_quantize_blocked(block, axis, shape, dtype):
    x = ties(*shape, scale=0.5)
    ax = axis % len(shape)
    pshape = tuple(-(-d // block) if i == ax else d for i, d in enumerate(shape))
    check(INTERP, "QuantizeLinear", [x, Const(scales(*pshape)), Const(zp(dtype, *pshape))], opset=21,
          attrs={"axis": axis, "block_size": block})


@pytest.mark.parametrize("opset", [19, 21])
def test_quantize_float16_input(opset):
    x = ties(4, 5, scale=0.5).astype(F16)
    check(INTERP, "QuantizeLinear", [x, Const(np.float16(0.5)), Const(np.int8(-3))], opset=opset)


def test_quantize_float16_input_float32_scale():
    # numpy promotes the division to float32, as onnx.reference does
    x = (ties(4, 5, scale=0.5) / 3).astype(F16)
    check(INTERP, "QuantizeLinear", [x, Const(np.float32(1 / 3)), Const(np.uint8(9))], opset=19)


def test_quantize_int32_input():
    x = np.random.default_rng(0).integers(-5000, 5000, (3, 7)).astype(I32)
    check(INTERP, "QuantizeLinear", [x, Const(np.float32(8.0)), Const(np.int8(1))], opset=13)


@pytest.mark.parametrize("precision", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_quantize_precision(precision):
    # x / scale does not divide exactly: the precision of the division decides the rounding
    x = randn(4, 16) * 20
    check(INTERP, "QuantizeLinear", [x, Const(np.float32(0.3)), Const(np.int8(0))], opset=23,
          attrs={"precision": precision})


@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_saturate_has_no_effect_on_integers(saturate):
    check(INTERP, "QuantizeLinear", [ties(30, scale=1.0), Const(np.float32(1.0)), Const(np.int8(0))], opset=19,
          attrs={"saturate": saturate})


def test_quantize_round_half_to_even_and_saturation_values():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, 1e9, -1e9, -128.5], np.float32)
    out = check(INTERP, "QuantizeLinear", [x, Const(np.float32(1.0)), Const(np.int8(0))], opset=13)["out0"]
    assert out.tolist() == [0, 2, 2, 0, -2, -2, 126, 127, 127, -128, -128]


# --- DequantizeLinear ------------------------------------------------------------------------------


def dq_oracle(opset: int) -> str:
    """onnx.reference implements DequantizeLinear from opset 19 only (it raises "No implementation" for
    10 and 13): onnxruntime is the oracle below that."""
    return "reference" if opset >= 19 else "onnxruntime"


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23])
@pytest.mark.parametrize("dtype", [I8, U8, I32])
def test_dequantize_per_tensor(opset, dtype):
    z = dtype(0) if dtype == I32 else dtype(zp(dtype).item())
    check(INTERP, "DequantizeLinear", [qrand(dtype, 3, 4), Const(np.float32(0.37)), Const(z)], opset=opset,
          oracle=dq_oracle(opset))


@pytest.mark.parametrize("dtype", [I16, U16])
def test_dequantize_16_bit(dtype):
    check(INTERP, "DequantizeLinear", [qrand(dtype, 5, 6), Const(np.float32(0.01)), Const(zp(dtype).reshape(()))],
          opset=21)


@pytest.mark.parametrize("opset", [10, 21])
def test_dequantize_no_zero_point(opset):
    check(INTERP, "DequantizeLinear", [qrand(I8, 4, 4), Const(np.float32(0.5))], opset=opset,
          oracle=dq_oracle(opset))


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_dequantize_per_axis(axis, opset):
    x = qrand(U8, 2, 3, 4)
    n = x.shape[axis]
    check(INTERP, "DequantizeLinear", [x, Const(scales(n) * 0.3), Const(zp(U8, n))], opset=opset,
          attrs={"axis": axis}, oracle=dq_oracle(opset))


@pytest.mark.parametrize("block,axis,shape", [(2, 1, (3, 4)), (3, 0, (7, 2)), (4, -1, (2, 3, 10))])
def test_dequantize_blocked(block, axis, shape):
    x = qrand(I8, *shape)
    ax = axis % len(shape)
    pshape = tuple(-(-d // block) if i == ax else d for i, d in enumerate(shape))
    check(INTERP, "DequantizeLinear", [x, Const(scales(*pshape) * 0.7), Const(zp(I8, *pshape))], opset=21,
          attrs={"axis": axis, "block_size": block})


def test_dequantize_float16_scale():
    check(INTERP, "DequantizeLinear", [qrand(I8, 3, 5), Const(np.float16(0.0137)), Const(np.int8(4))], opset=19)


@pytest.mark.parametrize("out", [TensorProto.FLOAT16, TensorProto.FLOAT])
def test_dequantize_output_dtype(out):
    got = check(INTERP, "DequantizeLinear", [qrand(U8, 3, 5), Const(np.float32(0.0137)), Const(np.uint8(4))],
                opset=23, attrs={"output_dtype": out})
    assert got["out0"].dtype == (np.float16 if out == TensorProto.FLOAT16 else np.float32)


# --- DynamicQuantizeLinear -------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: randn(3, 4) * 5,
    lambda: np.abs(randn(20)) + 1,  # all positive: the range is widened down to 0
    lambda: -np.abs(randn(2, 10)) - 3,  # all negative
    lambda: np.full((4,), 2.5, np.float32),
    lambda: np.zeros((3, 3), np.float32),  # max == min: scale 1 / 255
], ids=["mixed", "positive", "negative", "constant", "zeros"])
def test_dynamic_quantize(make):
    check(INTERP, "DynamicQuantizeLinear", [make().astype(F32)], opset=11, outputs=3)


# --- integer products ------------------------------------------------------------------------------


@pytest.mark.parametrize("xt,wt", [(U8, U8), (U8, I8), (I8, I8), (I8, U8)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(xt, wt, per_channel):
    x, w = qrand(xt, 1, 4, 7, 6), qrand(wt, 6, 4, 3, 3, seed=5)
    m = 6
    ws = scales(m) * 0.01 if per_channel else np.float32(0.004)
    wz = zp(wt, m) if per_channel else wt(zp(wt).item())
    bias = np.random.default_rng(9).integers(-5000, 5000, m).astype(I32)
    check(INTERP, "QLinearConv", [x, Const(np.float32(0.05)), Const(xt(zp(xt).item())), Const(w), Const(ws),
                                  Const(wz), Const(np.float32(0.3)), Const(U8(100)), Const(bias)],
          opset=10, attrs={"pads": [1, 0, 1, 2], "strides": [1, 2]})


@pytest.mark.parametrize("attrs", [
    {"group": 2, "dilations": [2, 1]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"group": 4, "kernel_shape": [3, 3]},  # depthwise
], ids=["grouped-dilated", "same-upper", "depthwise"])
def test_qlinear_conv_attributes(attrs):
    g = attrs.get("group", 1)
    x, w = qrand(U8, 2, 4, 8, 8), qrand(I8, 4, 4 // g, 3, 3, seed=5)
    check(INTERP, "QLinearConv", [x, Const(np.float32(0.05)), Const(U8(128)), Const(w), Const(scales(4) * 0.01),
                                  Const(np.zeros(4, I8)), Const(np.float32(0.2)), Const(I8(-3))],
          opset=10, attrs=attrs)


def test_qlinear_conv_1d():
    x, w = qrand(I8, 1, 3, 10), qrand(I8, 2, 3, 4, seed=5)
    check(INTERP, "QLinearConv", [x, Const(np.float32(0.1)), Const(I8(0)), Const(w), Const(np.float32(0.02)),
                                  Const(I8(0)), Const(np.float32(0.5)), Const(I8(0))], opset=10)


@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("xt,wt", [(U8, U8), (I8, U8), (U8, I8)])
def test_conv_integer(with_zp, xt, wt):
    x, w = qrand(xt, 1, 3, 6, 5), qrand(wt, 4, 3, 2, 2, seed=5)
    zps = [Const(xt(zp(xt).item())), Const(wt(zp(wt).item()))] if with_zp else []
    check(INTERP, "ConvInteger", [x, Const(w), *zps], opset=10, attrs={"pads": [1, 1, 0, 0]})


def test_conv_integer_per_channel_zero_point():
    x, w = qrand(U8, 1, 3, 5, 5), qrand(U8, 4, 3, 3, 3, seed=5)
    check(INTERP, "ConvInteger", [x, Const(w), Const(U8(7)), Const(zp(U8, 4))], opset=10)


@pytest.mark.parametrize("shapes", [((3, 5), (5, 4)), ((2, 3, 5), (5, 4)), ((2, 3, 5), (2, 5, 4)), ((5,), (5, 4)),
                                    ((3, 5), (5,))], ids=str)
@pytest.mark.parametrize("at,bt", [(U8, U8), (I8, I8), (U8, I8)])
def test_matmul_integer(shapes, at, bt):
    a, b = qrand(at, *shapes[0]), qrand(bt, *shapes[1], seed=5)
    check(INTERP, "MatMulInteger", [a, Const(b), Const(at(zp(at).item())), Const(bt(zp(bt).item()))], opset=10)


def test_matmul_integer_no_zero_points():
    check(INTERP, "MatMulInteger", [qrand(I8, 4, 6), qrand(I8, 6, 3, seed=5)], opset=10)


def test_matmul_integer_per_column_zero_point():
    a, b = qrand(U8, 3, 5), qrand(U8, 5, 4, seed=5)
    check(INTERP, "MatMulInteger", [a, Const(b), Const(U8(3)), Const(zp(U8, 4))], opset=10)


def test_matmul_integer_per_row_zero_point():
    """ONNX writes a per-row zero point of a 2-D A as an M-vector; onnx.reference subtracts it along the
    last axis instead (per column of A, wrong: shown with M != K, where it even fails to broadcast).
    glowpy's M-vector result equals the reference's on the (M, 1) form, which it gets right."""
    a, b = qrand(U8, 3, 5), qrand(U8, 5, 4, seed=5)
    rows = zp(U8, 3)
    want = check(INTERP, "MatMulInteger", [a, Const(b), Const(rows.reshape(3, 1)), Const(U8(0))], opset=10)
    model, feeds = node_model("MatMulInteger", [a, Const(b), Const(rows), Const(U8(0))], opset=10)
    got = glowpy.compile(model, backend=INTERP).run(feeds)
    np.testing.assert_array_equal(got["out0"], want["out0"])
    expected = (a.astype(np.int32) - rows.reshape(3, 1).astype(np.int32)) @ b.astype(np.int32)
    np.testing.assert_array_equal(got["out0"], expected)


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize("shapes", [((2, 4), (4, 3)), ((2, 2, 4), (2, 4, 3)), ((2, 2, 4), (4, 3))], ids=str)
@pytest.mark.parametrize("at,bt,yt", [(U8, U8, U8), (I8, I8, I8), (U8, I8, U8)])
def test_qlinear_matmul(opset, shapes, at, bt, yt):
    a, b = qrand(at, *shapes[0]), qrand(bt, *shapes[1], seed=5)
    check(INTERP, "QLinearMatMul", [a, Const(np.float32(0.02)), Const(at(zp(at).item())), Const(b),
                                    Const(np.float32(0.01)), Const(bt(zp(bt).item())), Const(np.float32(0.15)),
                                    Const(yt(zp(yt).item()))], opset=opset)


def test_qlinear_matmul_float16_scales():
    a, b = qrand(U8, 3, 4), qrand(I8, 4, 5, seed=5)
    check(INTERP, "QLinearMatMul", [a, Const(np.float16(0.02)), Const(U8(120)), Const(b), Const(np.float16(0.01)),
                                    Const(I8(0)), Const(np.float16(0.1)), Const(U8(128))], opset=21)


def test_qlinear_matmul_per_column_b():
    a, b = qrand(U8, 3, 4), qrand(I8, 4, 5, seed=5)
    check(INTERP, "QLinearMatMul", [a, Const(np.float32(0.02)), Const(U8(120)), Const(b), Const(scales(5) * 0.01),
                                    Const(np.zeros(5, I8)), Const(np.float32(0.1)), Const(U8(128))], opset=10)


def test_qlinear_matmul_per_row_a():
    """Per-row A as (M, 1) against the reference; the M-vector form (the reference mis-broadcasts it, as
    for MatMulInteger) gives the same result in glowpy."""
    a, b = qrand(U8, 3, 4), qrand(U8, 4, 5, seed=5)
    a_s, a_z = scales(3) * 0.01, zp(U8, 3)

    def operands(s, z):
        return [a, Const(s), Const(z), Const(b), Const(np.float32(0.02)), Const(U8(9)), Const(np.float32(0.1)),
                Const(U8(128))]

    want = check(INTERP, "QLinearMatMul", operands(a_s.reshape(3, 1), a_z.reshape(3, 1)), opset=10)
    model, feeds = node_model("QLinearMatMul", operands(a_s, a_z), opset=10)
    got = glowpy.compile(model, backend=INTERP).run(feeds)
    np.testing.assert_array_equal(got["out0"], want["out0"])


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
def test_per_tensor_scale_of_shape_1_with_scalar_zero_point(op):
    # onnxruntime's quantizer writes bias parameters this way
    x = ties(3, 4, scale=0.5) if op == "QuantizeLinear" else qrand(I8, 3, 4)
    check(INTERP, op, [x, Const(np.array([0.5], np.float32)), Const(np.int8(3))], opset=19)
