"""QLinearAdd (what a QDQ Add becomes) against onnxruntime's int8 kernel, bit for bit: the residual Add
of zoo ResNet-50 quantized by onnxruntime departed from it where its value lands on a half exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
import glowpy.importer.quant  # noqa: F401  (the quantization rows of the op table)

ort = pytest.importorskip("onnxruntime")

# ResNet-50's layer1.1 residual Add: A = 191, B = 10 gives exactly 85.5 in float32 before rounding.
RESNET_ADD = {"as": np.float32(0.047391646), "az": np.uint8(125), "bs": np.float32(0.03277591), "bz": np.uint8(0),
              "ys": np.float32(0.040416464), "yz": np.uint8(0)}


def qdq_add(params: dict, a_shape: list, b_shape: list, dtype=TensorProto.UINT8) -> onnx.ModelProto:
    """y = DQ(Q(DQ(a) + DQ(b))) on integer inputs a, b (ONNX 'DQ -> Add -> Q', onnxruntime's QLinearAdd)."""
    n = helper.make_node
    nodes = [n("DequantizeLinear", ["a", "as", "az"], ["ad"]), n("DequantizeLinear", ["b", "bs", "bz"], ["bd"]),
             n("Add", ["ad", "bd"], ["s"]), n("QuantizeLinear", ["s", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "qdq_add", [helper.make_tensor_value_info("a", dtype, a_shape),
                                                 helper.make_tensor_value_info("b", dtype, b_shape)],
                              [helper.make_tensor_value_info("y", dtype, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def run_both(model: onnx.ModelProto, feeds: dict) -> tuple[np.ndarray, np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    compiled = glowpy.compile(model, backend="interpreter")
    assert [n.op for n in compiled.graph.nodes] == ["QLinearAdd"]
    return compiled.run(feeds)["y"], want


def test_resnet50_residual_add_every_operand_pair():
    """Every (A, B) pair of uint8 values with ResNet-50's scales: equal to onnxruntime everywhere,
    the exact half at (191, 10) included (round half to even of the exact sum would give 86)."""
    a, b = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8), indexing="ij")
    got, want = run_both(qdq_add(RESNET_ADD, [256, 256], [256, 256]), {"a": a, "b": b})
    assert want[191, 10] == 85
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [TensorProto.UINT8, TensorProto.INT8], ids=["uint8", "int8"])
@pytest.mark.parametrize("scalar", ["a", "b"])
def test_one_element_operand(dtype, scalar):
    """An operand of one element is folded into the kernel's constant (a product and a sum, no fma)."""
    rng = np.random.default_rng(5)
    npt = helper.tensor_dtype_to_np_dtype(dtype).type
    info = np.iinfo(npt)
    params = {"as": np.float32(0.0371), "az": npt(info.min + 77), "bs": np.float32(0.0529), "bz": npt(info.min + 131),
              "ys": np.float32(0.0613), "yz": npt(info.min + 100)}
    shapes = {"a": [1] if scalar == "a" else [4, 64], "b": [1] if scalar == "b" else [4, 64]}
    feeds = {k: rng.integers(info.min, info.max + 1, s).astype(npt) for k, s in shapes.items()}
    model = qdq_add(params, shapes["a"], shapes["b"], dtype)
    for value in range(info.min, info.max + 1, 17):
        feeds[scalar] = np.full([1], value, npt)
        got, want = run_both(model, feeds)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("yz,fused", [(0, True), (3, False)], ids=["zp-min", "zp-3"])
def test_relu_before_q_at_the_type_minimum(yz, fused):
    """DQ + DQ -> Add -> Relu -> Q: with the output zero point at uint8's minimum the Relu is a no-op and
    the Add becomes QLinearAdd (onnxruntime drops that Relu and fuses the rest); with another zero point
    it stays float. Either way equal to onnxruntime on every operand pair."""
    params = {**RESNET_ADD, "yz": np.uint8(yz)}
    model = qdq_add(params, [256, 256], [256, 256])
    g = model.graph
    add = next(nd for nd in g.node if nd.op_type == "Add")
    add.output[0] = "pre"
    g.node.insert(3, helper.make_node("Relu", ["pre"], ["s"]))
    a, b = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8), indexing="ij")
    b = (255 - b).astype(np.uint8)  # negative sums too: A - 125 spans both signs
    compiled = glowpy.compile(model, backend="interpreter")
    ops = [n.op for n in compiled.graph.nodes]
    assert ("QLinearAdd" in ops and "Add" not in ops) if fused else ("Add" in ops and "Relu" in ops), ops
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"a": a, "b": b})[0]
    np.testing.assert_array_equal(compiled.run({"a": a, "b": b})["y"], want)
