"""The QDQ rewrite passes (glowpy/optimizer/quant.py): QDQ models from onnxruntime's quantizer become
integer ops that run as onnxruntime's own int8 kernels do, fused ReLU and bias included; Q/DQ pairs
around data movement vanish; patterns without an exact integer form stay float."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
import glowpy.importer.quant  # noqa: F401  (the quantization rows of the op table)
from tests.quant.test_quantize import CALIBRATION, HELD_OUT, conv_net, session

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


def ort_qdq(tmp_path, per_channel: bool, activation: str) -> onnx.ModelProto:
    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter({"x": x} for x in CALIBRATION["x"][:8])

        def get_next(self):
            return next(self.feeds, None)

    src, dst = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(conv_net(), src)
    quantization.quantize_static(str(src), str(dst), Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 per_channel=per_channel, activation_type=getattr(quantization.QuantType, activation),
                                 weight_type=quantization.QuantType.QInt8)
    return onnx.load(str(dst))


def ops_after(model: onnx.ModelProto) -> Counter:
    return Counter(n.op for n in glowpy.optimize(glowpy.load(model)).nodes)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
def test_onnxruntime_qdq_becomes_integer_ops(tmp_path, per_channel, activation):
    """Every Conv, Gemm, MatMul, Add and GlobalAveragePool of the quantized conv net becomes an integer
    op, the Flatten between Q/DQ pairs moves int8 data, and the interpreter then agrees with
    onnxruntime's int8 kernels (its optimized session, which makes the same rewrite) on every element."""
    qdq = ort_qdq(tmp_path, per_channel, activation)
    ops = ops_after(qdq)
    assert ops["QLinearConv"] == 3 and ops["QLinearMatMul"] == 2, ops
    assert ops["QLinearAdd"] == 1 and ops["QLinearGlobalAveragePool"] == 1, ops
    assert not {"Conv", "Gemm", "MatMul", "Add", "GlobalAveragePool"} & set(ops), ops
    compiled = glowpy.compile(qdq, backend="interpreter")
    reference = session(qdq)
    for x in HELD_OUT[:4]:
        np.testing.assert_array_equal(compiled.run({"x": x})["y"], reference.run(None, {"x": x})[0])


# --- hand-built patterns -----------------------------------------------------------------------------------

R = np.random.default_rng(7)
XS, XZ, YS, YZ = np.float32(0.05), np.uint8(120), np.float32(0.08), np.uint8(100)


def qdq_conv_model(*, relu: bool, bias_scale_factor: float = 1.0, pool: bool = False) -> onnx.ModelProto:
    """Q(x) -> DQ -> Conv(DQ(w int8 per channel), DQ(b int32)) [-> Relu] -> Q [-> DQ -> MaxPool -> Q]
    -> DQ -> y, with y_zero_point 100 so that a fused ReLU changes the result."""
    w = R.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    ws = (R.random(4) * 0.02 + 0.005).astype(np.float32)
    b = R.integers(-3000, 3000, 4).astype(np.int32)
    inits = {"xs": XS, "xz": XZ, "w": w, "ws": ws, "wz": np.zeros(4, np.int8), "b": b,
             "bs": (XS * ws * np.float32(bias_scale_factor)).astype(np.float32), "bz": np.zeros(4, np.int32),
             "ys": YS, "yz": YZ}
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), n("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             n("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             n("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=0),
             n("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1], strides=[2, 1], name="conv")]
    last = "c"
    if relu:
        nodes.append(n("Relu", ["c"], ["r"]))
        last = "r"
    nodes.append(n("QuantizeLinear", [last, "ys", "yz"], ["yq"]))
    if pool:
        nodes += [n("DequantizeLinear", ["yq", "ys", "yz"], ["pd"]),
                  n("MaxPool", ["pd"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                  n("QuantizeLinear", ["p", "ys", "yz"], ["pq"])]
    nodes.append(n("DequantizeLinear", ["pq" if pool else "yq", "ys", "yz"], ["y"]))
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def feeds(count: int = 4) -> list[dict]:
    return [{"x": (R.standard_normal((1, 3, 8, 8)) * 3).astype(np.float32)} for _ in range(count)]


@pytest.mark.parametrize("relu", [True, False], ids=["relu", "no-relu"])
@pytest.mark.parametrize("pool", [True, False], ids=["maxpool", "no-pool"])
def test_conv_pattern(relu, pool):
    """The Conv pattern with an int32 bias and per-channel weights becomes one QLinearConv (the Relu
    fused, the MaxPool on uint8 data); the result equals onnxruntime's int8 execution exactly, and the
    float QDQ graph (onnx.reference) to one quantization step."""
    model = qdq_conv_model(relu=relu, pool=pool)
    ops = ops_after(model)
    assert ops["QLinearConv"] == 1 and "Conv" not in ops and "Relu" not in ops, ops
    assert ops["QuantizeLinear"] == 1 and ops["DequantizeLinear"] == 1, ops  # the model's input and output
    conv = next(n for n in glowpy.optimize(glowpy.load(model)).nodes if n.op == "QLinearConv")
    assert conv.attrs["relu"] is relu
    compiled, ref, run = glowpy.compile(model, backend="interpreter"), ReferenceEvaluator(model), session(model)
    for f in feeds():
        got = compiled.run(f)["y"]
        np.testing.assert_array_equal(got, run.run(None, f)[0])
        assert np.abs(got - ref.run(None, f)[0]).max() <= YS * 1.0001
        if relu:
            assert got.min() >= 0


def test_relu_is_a_floor_at_the_zero_point():
    """QLinearConv's `relu` is exactly quantize(relu(v)): the plain QLinearConv result (onnx.reference)
    raised to y_zero_point."""
    model = qdq_conv_model(relu=True)
    g = glowpy.optimize(glowpy.load(model))
    conv = next(n for n in g.nodes if n.op == "QLinearConv")
    op = glowpy.ir.ops.registry.get_op("QLinearConv")
    xq = R.integers(0, 256, (1, 3, 8, 8)).astype(np.uint8)
    args = [xq, *(v.data for v in conv.inputs[1:])]
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"]
    node = helper.make_node("QLinearConv", names, ["y"], pads=[1, 1, 1, 1], strides=[2, 1])
    plain = ReferenceEvaluator(node).run(None, dict(zip(names, args)))[0]
    assert conv.attrs["float32"]  # onnxruntime's requantization; onnx.reference's is float64
    attrs = {**conv.attrs, "float32": False}
    np.testing.assert_array_equal(op.compute(attrs, *args), np.maximum(plain, YZ))
    np.testing.assert_array_equal(op.compute({**attrs, "relu": False}, *args), plain)


def test_bias_with_another_scale_stays_float():
    """A bias dequantized with a scale other than x_scale * w_scale has no exact int32 form: the
    pattern is left as it is and the graph still computes the float QDQ result."""
    model = qdq_conv_model(relu=False, bias_scale_factor=2.0)
    ops = ops_after(model)
    assert "QLinearConv" not in ops and ops["Conv"] == 1, ops


def test_data_movement_keeps_qdq_with_other_parameters():
    """Q(MaxPool(DQ(x))) with a different scale on the Q requantizes: not folded."""
    model = qdq_conv_model(relu=False, pool=True)
    q = next(n for n in model.graph.node if n.output == ["pq"])
    q.input[1] = "xs"
    ops = ops_after(model)
    assert ops["MaxPool"] == 1 and ops["QuantizeLinear"] == 2, ops


def test_matmul_add_relu_pattern():
    """DQ(a) -> MatMul(DQ(w int8 per column)) -> Add(DQ(int32 bias)) -> Relu -> Q becomes one
    QLinearMatMul with bias and relu, equal to onnxruntime's int8 execution."""
    w = R.integers(-127, 128, (16, 6)).astype(np.int8)
    ws = (R.random(6) * 0.02 + 0.005).astype(np.float32)
    inits = {"xs": XS, "xz": XZ, "w": w, "ws": ws, "wz": np.zeros(6, np.int8),
             "b": R.integers(-2000, 2000, 6).astype(np.int32), "bs": (XS * ws).astype(np.float32),
             "bz": np.zeros(6, np.int32), "ys": YS, "yz": YZ}
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), n("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             n("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
             n("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=0),
             n("MatMul", ["xd", "wd"], ["m"]), n("Add", ["m", "bd"], ["a"]), n("Relu", ["a"], ["r"]),
             n("QuantizeLinear", ["r", "ys", "yz"], ["yq"]), n("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    ops = ops_after(model)
    assert ops["QLinearMatMul"] == 1 and not {"MatMul", "Add", "Relu"} & set(ops), ops
    compiled, run = glowpy.compile(model, backend="interpreter"), session(model)
    for _ in range(4):
        f = {"x": (R.standard_normal((5, 16)) * 3).astype(np.float32)}
        np.testing.assert_array_equal(compiled.run(f)["y"], run.run(None, f)[0])


@pytest.mark.parametrize("relu", [False, True], ids=["add", "add-relu"])
def test_add_pattern_broadcasting(relu):
    """DQ(a) + DQ(b) (b broadcast) -> Q becomes QLinearAdd; with a Relu before the Q it stays float, as
    onnxruntime runs it. Either way the result equals onnxruntime's execution."""
    inits = {"as": np.float32(0.03), "az": np.uint8(128), "bs": np.float32(0.07), "bz": np.uint8(90),
             "ys": YS, "yz": YZ}
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["a", "as", "az"], ["aq"]), n("DequantizeLinear", ["aq", "as", "az"], ["ad"]),
             n("QuantizeLinear", ["b", "bs", "bz"], ["bq"]), n("DequantizeLinear", ["bq", "bs", "bz"], ["bd"]),
             n("Add", ["ad", "bd"], ["s"]), *([n("Relu", ["s"], ["r"])] if relu else []),
             n("QuantizeLinear", ["r" if relu else "s", "ys", "yz"], ["yq"]),
             n("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4, 5]),
                                             helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 1, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    ops = ops_after(model)
    assert (ops["QLinearAdd"] == 0 and ops["Add"] == 1) if relu else (ops["QLinearAdd"] == 1 and "Add" not in ops), ops
    compiled, run = glowpy.compile(model, backend="interpreter"), session(model)
    for _ in range(4):
        f = {"a": (R.standard_normal((2, 3, 4, 5)) * 3).astype(np.float32),
             "b": (R.standard_normal((3, 1, 5)) * 5).astype(np.float32)}
        np.testing.assert_array_equal(compiled.run(f)["y"], run.run(None, f)[0])
