"""glowpy's quantizer writes models its integer kernels run (int32 biases, Q/DQ around op outputs,
residual Adds and pooling, ReLU6 taken into the requantization) and onnxruntime runs alike; the 'mse'
calibration of activations and weights, and the options' bad values."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.cli import main
from glowpy.errors import UnsupportedAttribute
from glowpy.pipeline import optimized_graph
from glowpy.quantize import Range, activation_params, profile, quantize, weight_params
from tests.quant.test_quantize import BOUND, CALIBRATION, HELD_OUT, INPUT, conv_net, relative_error, session

ort = pytest.importorskip("onnxruntime")


def residual_net(seed: int = 0) -> onnx.ModelProto:
    """Conv -> Clip(0, 6) = a; a -> Conv -> Relu -> Conv = b; Relu(Add(a, b)) -> GlobalAveragePool ->
    Flatten -> Gemm: a residual block with ReLU6, He-initialized, seeded."""
    r = np.random.default_rng(seed)

    def he(*shape: int) -> np.ndarray:
        return (r.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)

    inits = {"w1": he(8, 3, 3, 3), "b1": r.standard_normal(8).astype(np.float32) * 0.1, "w2": he(8, 8, 3, 3),
             "b2": np.zeros(8, np.float32), "w3": he(8, 8, 1, 1), "b3": r.standard_normal(8).astype(np.float32) * 0.1,
             "wg": he(10, 8), "bg": r.standard_normal(10).astype(np.float32) * 0.1,
             "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             n("Clip", ["c1", "lo", "hi"], ["a"]),
             n("Conv", ["a", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"), n("Relu", ["c2"], ["r2"]),
             n("Conv", ["r2", "w3", "b3"], ["b"], name="conv3"),
             n("Add", ["a", "b"], ["s"]), n("Relu", ["s"], ["r"]),
             n("GlobalAveragePool", ["r"], ["p"]), n("Flatten", ["p"], ["f"]),
             n("Gemm", ["f", "wg", "bg"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "resnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, INPUT)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def cpu_ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op for n in optimized_graph(model, "cpu").nodes)


def agree_with_onnxruntime(qdq: onnx.ModelProto) -> None:
    """glowpy's cpu backend and onnxruntime (its int8 kernels) on held-out inputs: as in
    test_quantize.py, all but 0.1% of the elements to 1e-5 (a float op summing in another order may
    cross a rounding boundary), all to 0.02."""
    compiled, reference = glowpy.compile(qdq, backend="cpu"), session(qdq)
    diffs = np.concatenate([np.abs(compiled.run({"x": x})["y"] - reference.run(None, {"x": x})[0]).ravel()
                            for x in HELD_OUT])
    assert np.mean(diffs <= 1e-5) >= 0.999 and diffs.max() <= 0.02, diffs.max()


@pytest.fixture(scope="module")
def res_ranges() -> dict[str, Range]:
    return profile(residual_net(), CALIBRATION)


def test_conv_net_runs_on_integer_kernels():
    """Every Conv, the pooling and both matrix products of the conv net become integer ops on cpu; only
    the last Add, whose output is the graph's, stays float."""
    qdq = quantize(conv_net(), CALIBRATION)
    ops = cpu_ops(qdq)
    assert ops["QLinearConv"] == 3 and ops["QLinearMatMul"] == 2 and ops["QLinearGlobalAveragePool"] == 1, ops
    assert not {"Conv", "FullyConnected", "MatMul", "Gemm", "GlobalAveragePool"} & set(ops), ops
    agree_with_onnxruntime(qdq)


def test_biases_are_int32_at_x_scale_times_w_scale():
    """conv1's bias, by hand: round(b / (x_scale * w_scale[c])) as int32 behind a per-channel
    DequantizeLinear with that scale and zero point 0; no float bias is left."""
    model = conv_net()
    qdq = quantize(model, CALIBRATION)
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    b = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "b1"))
    x_scale, _ = activation_params(profile(model, CALIBRATION)["x"], np.dtype(np.uint8))
    scale = (x_scale * inits["w1_scale"]).astype(np.float32)
    np.testing.assert_array_equal(inits["b1_scale"], scale)
    assert inits["b1_quantized"].dtype == np.int32 and not inits["b1_zero_point"].any()
    np.testing.assert_array_equal(inits["b1_quantized"], np.rint(b.astype(np.float64) / scale).astype(np.int32))
    dq = next(n for n in qdq.graph.node if n.output[0] == "b1_dequantized")
    assert [a.i for a in dq.attribute if a.name == "axis"] == [0]
    assert not {"b1", "b2", "b3", "bg"} & set(inits)


def test_residual_add_and_relu6_become_integer_ops(res_ranges):
    """The block's Adds and its ReLU6 (Clip(0, 6) before a QuantizeLinear whose range ends below 6) run
    as QLinearAdd / QLinearConv with the activation taken in; onnxruntime agrees."""
    assert res_ranges["a"].max <= 6.0
    qdq = quantize(residual_net(), ranges=res_ranges)
    ops = cpu_ops(qdq)
    assert ops["QLinearConv"] == 3 and ops["QLinearAdd"] == 1 and ops["QLinearGlobalAveragePool"] == 1, ops
    assert not {"Conv", "Add", "Clip", "GlobalAveragePool"} & set(ops), ops
    agree_with_onnxruntime(qdq)


def test_float_residual(res_ranges):
    """residual=False: the Add reads the float tensors; the convs producing its operands (conv1: a has
    a float user; conv3, which takes the Add in as its residual epilogue) stay float convolutions, conv2
    runs as QLinearConv."""
    model = residual_net()
    qdq = quantize(model, ranges=res_ranges, residual=False)
    add = next(n for n in qdq.graph.node if n.op_type == "Add")
    assert list(add.input) == ["a", "b"]
    ops = cpu_ops(qdq)
    assert ops["QLinearConv"] == 1 and ops["Conv"] == 2 and not ops["QLinearAdd"], ops
    agree_with_onnxruntime(qdq)
    assert relative_error(session(model), session(qdq), HELD_OUT[0]) < BOUND


def test_relu6_beyond_the_range_stays_float(res_ranges):
    """When the quantized range of the Clip's output reaches past 6, the Clip binds inside it: it is not
    a ReLU there, so conv1 stays a float Conv + Clip, and the model still runs as onnxruntime runs it."""
    ranges = {**res_ranges, "a": Range(0.0, 12.0)}
    qdq = quantize(residual_net(), ranges=ranges)
    ops = cpu_ops(qdq)
    assert ops["QLinearConv"] == 2 and ops["Conv"] + ops["Clip"] >= 1, ops
    agree_with_onnxruntime(qdq)


# --- the 'mse' ranges ----------------------------------------------------------------------------------


def sample_mse(x: np.ndarray, r: Range) -> float:
    """The squared error of quantizing the samples themselves to uint8 with the range's parameters."""
    scale, zp = activation_params(r, np.dtype(np.uint8))
    q = np.clip(np.rint(x / scale) + int(zp), 0, 255)
    return float(np.mean(((q - int(zp)) * scale - x) ** 2))


def test_mse_range_minimizes_the_quantization_error():
    """Heavy-tailed (Laplace) data: the 'mse' range clips the tails; its error on the samples is below
    min / max's and within 2% of the best of the candidate ranges (k / 128 of the observed range),
    computed on the samples rather than the histogram."""
    x = np.random.default_rng(3).laplace(size=(16, *INPUT)).astype(np.float32)
    full = profile(conv_net(), {"x": x}, tensors=["x"])["x"]
    got = profile(conv_net(), {"x": x}, method="mse", tensors=["x"])["x"]
    assert full.min < got.min < 0 < got.max < full.max, (full, got)
    best = min(sample_mse(x, Range(full.min * k / 128, full.max * k / 128)) for k in range(1, 129))
    assert sample_mse(x, got) <= 1.02 * best
    assert sample_mse(x, got) < sample_mse(x, full)


def test_mse_keeps_uniform_data_and_ignores_exact_zeros():
    """Uniform data on [0, 1], nine tenths of it exact zeros (a ReLU output): clipping costs more than it
    saves, and the zeros, exact at any range, do not pull the range in: 'mse' gives min / max."""
    r = np.random.default_rng(4)
    x = np.where(r.random((16, *INPUT)) < 0.9, 0.0, r.random((16, *INPUT))).astype(np.float32)
    full = profile(conv_net(), {"x": x}, tensors=["x"])["x"]
    assert profile(conv_net(), {"x": x}, method="mse", tensors=["x"])["x"] == full


def test_mse_weights():
    """Per channel, the 'mse' scale's squared error is at most max |w|'s; Laplace-distributed and
    outlier channels are clipped below their max; the quantized model stays within the bound in
    onnxruntime and glowpy agrees with it."""
    r = np.random.default_rng(5)
    w = r.standard_normal((4, 16384)).astype(np.float32)
    w[2] = r.laplace(size=16384)
    w[3, :3] = [30.0, -25.0, 20.0]

    def error(q, scale):
        return ((q * scale[:, None] - w) ** 2).sum(axis=1)

    qm, sm, _ = weight_params(w, 0)
    qe, se, _ = weight_params(w, 0, "mse")
    assert np.all(error(qe, se) <= error(qm, sm)) and np.all(se <= sm)
    assert se[2] < 0.97 * sm[2] and se[3] < 0.97 * sm[3], se / sm
    model = conv_net()
    qdq = quantize(model, CALIBRATION, method="mse", weight_range="mse")
    assert relative_error(session(model), session(qdq), HELD_OUT[0]) < BOUND
    agree_with_onnxruntime(qdq)


@pytest.mark.parametrize("option,value,words", [
    ("weight_range", "minmax", ["unknown weight range", "'max'", "'mse'", "minmax"]),
    ("method", "l2", ["unknown calibration method", "'mse'", "l2"]),
    ("activations", "uint4", ["unknown activation type", "uint4"]),
])
def test_bad_option(option, value, words):
    with pytest.raises(UnsupportedAttribute) as info:
        quantize(conv_net(), CALIBRATION, **{option: value})
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_bad_weight_range_in_weight_params():
    with pytest.raises(UnsupportedAttribute, match="unknown weight range"):
        weight_params(np.ones((2, 2), np.float32), 0, "percentile")


def test_cli_options(tmp_path, capsys):
    path, cal, out = tmp_path / "net.onnx", tmp_path / "cal.npz", tmp_path / "net.int8.onnx"
    onnx.save(residual_net(), path)
    np.savez(cal, **CALIBRATION)
    assert main(["quantize", str(path), "-c", str(cal), "-o", str(out), "--method", "mse", "--weight-range", "mse",
                 "--float-residual"]) == 0
    text = capsys.readouterr().out
    assert "4 weights (int8, per channel), 4 biases (int32)" in text, text
    qdq = onnx.load(str(out))
    assert "Add" in {n.op_type for n in qdq.graph.node}
    assert list(next(n for n in qdq.graph.node if n.op_type == "Add").input) == ["a", "b"]
    session(qdq).run(None, {"x": HELD_OUT[0]})
    with pytest.raises(SystemExit) as info:
        main(["quantize", str(path), "-c", str(cal), "-o", str(out), "--weight-range", "l1"])
    assert info.value.code == 2 and "invalid choice: 'l1'" in capsys.readouterr().err
