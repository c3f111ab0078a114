"""Profile-guided quantization (`glowpy quantize`, `glowpy.quantize.quantize`) on a small conv net with
seeded weights and calibration data: the QDQ model it writes runs in onnxruntime (with its int8 kernels)
close to the float model, the glowpy interpreter runs it exactly as onnxruntime executes its Q/DQ ops,
weights are per output channel, the profile records the right tensors, and bad calibration data fails
with one line naming what is wrong."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
import glowpy.importer.quant  # noqa: F401  (the quantization rows of the op table)
from glowpy.cli import main
from glowpy.errors import InvalidModel, InvalidName, MismatchingDatatype, MismatchingShape, UnidentifiedName
from glowpy.quantize import Range, activation_params, load_profile, profile, quantize

ort = pytest.importorskip("onnxruntime")

INPUT = (1, 3, 16, 16)


def conv_net(seed: int = 0, opset: int = 13) -> onnx.ModelProto:
    """Conv 3x3 -> ReLU -> depthwise Conv 3x3 stride 2 -> ReLU -> Conv 1x1 -> ReLU -> GlobalAveragePool
    -> Flatten -> Gemm (transB) + MatMul -> Add; He-initialized, seeded."""
    r = np.random.default_rng(seed)

    def he(*shape: int) -> np.ndarray:
        return (r.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)

    def bias(n: int) -> np.ndarray:
        return (r.standard_normal(n) * 0.1).astype(np.float32)

    inits = {"w1": he(8, 3, 3, 3), "b1": bias(8), "w2": he(8, 1, 3, 3), "b2": bias(8), "w3": he(16, 8, 1, 1),
             "b3": bias(16), "wg": he(10, 16), "bg": bias(10), "wm": he(10, 16).T.copy()}
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"), n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], group=8, name="depthwise"),
        n("Relu", ["c2"], ["r2"]),
        n("Conv", ["r2", "w3", "b3"], ["c3"], name="pointwise"), n("Relu", ["c3"], ["r3"]),
        n("GlobalAveragePool", ["r3"], ["p"]), n("Flatten", ["p"], ["f"]),
        n("Gemm", ["f", "wg", "bg"], ["g"], transB=1, name="fc"),
        n("MatMul", ["f", "wm"], ["m"], name="mm"),
        n("Add", ["g", "m"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, INPUT)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def samples(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, *INPUT)).astype(np.float32)


CALIBRATION = {"x": samples(64, seed=1)}
HELD_OUT = samples(8, seed=2)


def session(model: onnx.ModelProto, *, optimize: bool = True, save_optimized: str | None = None):
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if save_optimized:
        so.optimized_model_filepath = save_optimized
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return conv_net()


@pytest.fixture(scope="module", params=["minmax", "percentile", "entropy"])
def qdq(request, model) -> onnx.ModelProto:
    return quantize(model, CALIBRATION, method=request.param, percentile=99.9)


def test_qdq_structure(qdq):
    ops = [n.op_type for n in qdq.graph.node]
    # one Q/DQ pair per activation: the op inputs x, r1, r2, f, the outputs r3 (GlobalAveragePool's
    # input), p (its output), g, m (the Add's operands; y, the graph output, stays float); one DQ per
    # weight (w1, w2, w3, wg, wm) and per bias (b1, b2, b3, bg)
    assert ops.count("QuantizeLinear") == 8
    assert ops.count("DequantizeLinear") == 8 + 5 + 4
    quantized = {n.input[0] for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    assert quantized == {"x", "r1", "r2", "r3", "p", "f", "g", "m"}
    for node in qdq.graph.node:
        if node.op_type in ("Conv", "Gemm", "MatMul", "Add", "GlobalAveragePool"):
            assert all(x.endswith("_dequantized") for x in node.input), node
    inits = {t.name: t for t in qdq.graph.initializer}
    assert not {"w1", "w2", "w3", "wg", "wm", "b1", "b2", "b3", "bg"} & set(inits), "float weights left in the model"
    assert inits["w1_quantized"].data_type == TensorProto.INT8
    assert inits["b1_quantized"].data_type == TensorProto.INT32
    assert inits["x_zero_point"].data_type == TensorProto.UINT8


BOUND = 0.05  # relative L2 error of the logits; why: see test_onnxruntime_runs_qdq_close_to_float


def relative_error(float_run, int8_run, x: np.ndarray) -> float:
    want = float_run.run(None, {"x": x})[0]
    return float(np.linalg.norm(int8_run.run(None, {"x": x})[0] - want) / np.linalg.norm(want))


def test_onnxruntime_runs_qdq_close_to_float(model, qdq, tmp_path):
    """The bound: relative L2 error of the logits below 5% on the calibration inputs. Each uint8
    activation adds rounding noise of about step / sqrt(12) = range / 880 per element and each int8
    per-channel weight about max|w| / 440; four quantized layers in series compound that to one or two
    percent (at most 1.4% measured here with minmax, 1.6% with entropy; 3.0% with the 99.9 percentile,
    which clips the tails on purpose), so 5% leaves a margin while a wrong scale, zero point or channel axis costs tens of
    percent."""
    optimized = tmp_path / "ort_optimized.onnx"
    float_run, int8_run = session(model), session(qdq, save_optimized=str(optimized))
    # onnxruntime fused the Q/DQ pairs into its int8 kernels: the int8 path is what ran
    assert "QLinearConv" in {n.op_type for n in onnx.load(str(optimized)).graph.node}
    errors = [relative_error(float_run, int8_run, x) for x in CALIBRATION["x"]]
    assert max(errors) < BOUND, np.round(errors, 4)


def test_held_out_inputs(model, qdq):
    """Inputs the profile never saw: where every quantized tensor stays inside its calibrated range the
    same 5% bound holds. One held-out input here drives the pooled features above their calibrated
    maximum (saturation, the usual way calibration fails); profiling it too restores the bound."""
    float_run, int8_run = session(model), session(qdq)
    calibrated = profile(model, CALIBRATION)
    inside, outside = [], []
    for x in HELD_OUT:
        seen = profile(model, {"x": x})
        fits = all(calibrated[n].min <= r.min and r.max <= calibrated[n].max for n, r in seen.items())
        (inside if fits else outside).append(x)
    assert len(inside) >= 6, "the held-out set is meant to be mostly in range"
    errors = [relative_error(float_run, int8_run, x) for x in inside]
    assert max(errors) < BOUND, np.round(errors, 4)
    for x in outside:
        widened = quantize(model, {"x": np.concatenate([CALIBRATION["x"], x[None]])})
        assert relative_error(float_run, session(widened), x) < BOUND


def test_glowpy_runs_qdq_as_onnxruntime_executes_it(qdq):
    """onnxruntime without graph optimizations runs each QuantizeLinear / DequantizeLinear as written, as
    glowpy's interpreter does. Float convolutions that sum in another order may move a value across a
    rounding boundary of the next QuantizeLinear (one step, at most a few thousandths at the logits):
    all but 0.1% of the elements must agree to 1e-5, all of them to 0.02."""
    reference = session(qdq, optimize=False)
    compiled = glowpy.compile(qdq, backend="interpreter")
    diffs = np.concatenate([np.abs(compiled.run({"x": x})["y"] - reference.run(None, {"x": x})[0]).ravel()
                            for x in HELD_OUT])
    assert np.mean(diffs <= 1e-5) >= 0.999 and diffs.max() <= 0.02, diffs.max()


def test_weights_are_per_output_channel(model, qdq):
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    float_w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    dq = {n.output[0]: n for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    # (weight, output-channel axis): Conv OIHW axis 0, Gemm with transB (N, K) axis 0, MatMul (K, N) axis 1
    for name, axis in (("w1", 0), ("w2", 0), ("w3", 0), ("wg", 0), ("wm", 1)):
        node = dq[f"{name}_dequantized"]
        assert {a.name: a.i for a in node.attribute}.get("axis", 1) == axis, name
        w = float_w[name]
        scale = inits[f"{name}_scale"]
        assert scale.shape == (w.shape[axis],), name
        amax = np.abs(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)).max(axis=1)
        np.testing.assert_allclose(scale, amax / 127, rtol=1e-6, err_msg=name)
        assert not inits[f"{name}_zero_point"].any()
        q = inits[f"{name}_quantized"]
        assert q.dtype == np.int8 and np.abs(q).max() == 127
        bshape = [-1 if i == axis else 1 for i in range(w.ndim)]
        assert np.abs(q * scale.reshape(bshape) - w).max() <= scale.max() / 2 + 1e-7, name


def test_per_tensor_weights_option(model):
    qdq = quantize(model, CALIBRATION, per_channel=False)
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    assert inits["w1_scale"].shape == ()


def test_profile_records_the_activation_ranges(model):
    """minmax ranges are the extremes onnxruntime computes for the same tensors on the same inputs. The
    Flatten output f takes the range of its input p, so it is not profiled."""
    ranges = profile(model, CALIBRATION)
    assert set(ranges) == {"x", "r1", "r2", "r3", "p", "g", "m"}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in sorted(set(ranges) - {"x"}))
    run = session(probe)
    seen = {n: [] for n in ranges}
    for x in CALIBRATION["x"]:
        outs = dict(zip([o.name for o in probe.graph.output], run.run(None, {"x": x})))
        for n in ranges:
            seen[n].append(x if n == "x" else outs[n])
    for n, r in ranges.items():
        values = np.stack(seen[n])
        assert r.min == pytest.approx(values.min(), abs=1e-5) and r.max == pytest.approx(values.max(), abs=1e-5), n


def test_profile_on_the_cpu_backend(model):
    """The cpu backend profiles the optimized graph: the tensors exposed as outputs keep their values."""
    want = profile(model, CALIBRATION)
    got = profile(model, CALIBRATION, backend="cpu")
    assert set(got) == set(want)
    for n in want:
        assert got[n].min == pytest.approx(want[n].min, abs=1e-4) and got[n].max == pytest.approx(want[n].max,
                                                                                                  rel=1e-4), n


def test_percentile_clips_the_tails(model):
    full = profile(model, CALIBRATION)
    clipped = profile(model, CALIBRATION, method="percentile", percentile=99.0)
    for n in full:
        assert full[n].min <= clipped[n].min <= clipped[n].max <= full[n].max, n
    x = CALIBRATION["x"]
    # about 1% of the values lie above the 99th percentile point (histogram bin resolution: 0.1%)
    assert 0.005 <= np.mean(x > clipped["x"].max) <= 0.015
    assert 0.005 <= np.mean(x < clipped["x"].min) <= 0.015


def test_entropy_clips_outliers_not_the_distribution():
    """A normal distribution plus a few far outliers: min / max spans the outliers, the entropy
    threshold keeps the bulk (beyond 3 sigma) and drops them (below 10 sigma)."""
    x = np.random.default_rng(0).standard_normal((256, *INPUT)).astype(np.float32)  # 196608 values
    x.reshape(-1)[[10, 50_000, 150_000]] = [60.0, -55.0, 48.0]
    full = profile(conv_net(), {"x": x}, tensors=["x"])["x"]
    assert full.max == 60.0 and full.min == -55.0
    clipped = profile(conv_net(), {"x": x}, method="entropy", tensors=["x"])["x"]
    assert 3.0 < clipped.max < 10.0 and -10.0 < clipped.min < -3.0, clipped


def test_activation_params_include_zero():
    scale, zp = activation_params(Range(0.5, 2.0), np.dtype(np.uint8))
    assert zp == 0 and scale == np.float32(2.0 / 255)
    scale, zp = activation_params(Range(-1.0, 3.0), np.dtype(np.int8))
    assert scale == np.float32(4.0 / 255) and zp == np.rint(-128 + 1.0 / scale)


def test_int8_activations(model):
    qdq = quantize(model, CALIBRATION, activations="int8")
    act_zps = {n.input[2] for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    zps = [numpy_helper.to_array(t) for t in qdq.graph.initializer if t.name in act_zps]
    assert len(zps) == 8 and all(z.dtype == np.int8 for z in zps)
    x = HELD_OUT[0]
    want, got = session(model).run(None, {"x": x})[0], session(qdq).run(None, {"x": x})[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.05


@pytest.mark.parametrize("ir3", [False, True], ids=["opset11", "opset9-ir3"])
def test_old_opset_is_upgraded_for_per_axis(model, ir3):
    """Per-axis DequantizeLinear needs opset 13: older models are converted. An IR version 3 model lists
    its initializers among the graph inputs; the upgraded model does not (onnxruntime would not treat
    them as constants, so it could not fuse the Q/DQ pairs into int8 kernels)."""
    old = conv_net(opset=9 if ir3 else 11)
    if ir3:
        old.ir_version = 3
        old.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                               for t in old.graph.initializer)
    qdq = quantize(old, CALIBRATION)
    assert qdq.opset_import[0].version == 13 and qdq.ir_version >= 7
    assert [i.name for i in qdq.graph.input] == ["x"]
    x = HELD_OUT[0]
    assert relative_error(session(model), session(qdq), x) < BOUND


# --- the command line --------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path, model):
    path = tmp_path / "net.onnx"
    onnx.save(model, path)
    cal = tmp_path / "cal.npz"
    np.savez(cal, **CALIBRATION)
    return path, cal, tmp_path


def test_cli_quantize(files, capsys):
    path, cal, tmp = files
    out = tmp / "net.int8.onnx"
    assert main(["quantize", str(path), "--calibrate", str(cal), "-o", str(out), "--method", "percentile"]) == 0
    text = capsys.readouterr().out
    assert "8 activations" in text and "5 weights" in text and "4 biases" in text and str(out) in text
    qdq = onnx.load(str(out))
    session(qdq).run(None, {"x": HELD_OUT[0]})


def _bad(tmp, kind: str):
    p = tmp / "bad.npz"
    if kind == "missing-input":
        np.savez(p, data=CALIBRATION["x"])
    elif kind == "wrong-shape":
        np.savez(p, x=np.zeros((4, 1, 3, 8, 8), np.float32))
    elif kind == "wrong-dtype":
        np.savez(p, x=CALIBRATION["x"].astype(np.float64))
    elif kind == "extra-name":
        np.savez(p, x=CALIBRATION["x"], y=CALIBRATION["x"])
    elif kind == "not-npz":
        p.write_bytes(b"this is not a zip archive")
    elif kind == "npy":
        p = tmp / "bad.npy"
        np.save(p, CALIBRATION["x"])
    elif kind == "no-file":
        p = tmp / "absent.npz"
    return p


BAD = {  # kind: (error class, words the one line must contain)
    "missing-input": (UnidentifiedName, ["'x'"]),
    "wrong-shape": (MismatchingShape, ["'x'", "[4, 1, 3, 8, 8]", "1, 3, 16, 16"]),
    "wrong-dtype": (MismatchingDatatype, ["'x'", "float64", "float32"]),
    "extra-name": (InvalidName, ["'y'"]),
    "not-npz": (InvalidModel, ["bad.npz", "not an .npz"]),
    "npy": (InvalidModel, ["bad.npy", "not an .npz"]),
    "no-file": (InvalidModel, ["absent.npz", "does not exist"]),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_calibration_api(files, kind):
    path, _, tmp = files
    cls, words = BAD[kind]
    with pytest.raises(cls) as info:
        quantize(str(path), _bad(tmp, kind))
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_calibration_cli(files, kind, capsys):
    path, _, tmp = files
    out = tmp / "never.onnx"
    assert main(["quantize", str(path), "--calibrate", str(_bad(tmp, kind)), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glowpy quantize: error: ") and err.count("\n") == 1, err
    for w in BAD[kind][1]:
        assert w in err, (w, err)
    assert not out.exists()


def test_cli_bad_model_path(tmp_path, capsys):
    cal = tmp_path / "cal.npz"
    np.savez(cal, **CALIBRATION)
    assert main(["quantize", str(tmp_path / "none.onnx"), "-c", str(cal), "-o", str(tmp_path / "o.onnx")]) == 2
    assert "none.onnx" in capsys.readouterr().err


# --- QDQ models from onnxruntime's own quantizer -------------------------------------------------------


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_glowpy_runs_onnxruntime_quantize_static_qdq(model, tmp_path, per_channel):
    """onnxruntime.quantization.quantize_static (QDQ format, uint8 activations, int8 weights, int32
    biases behind DequantizeLinear) writes the models the issue's acceptance uses; the interpreter runs
    them as onnxruntime does, unoptimized and with its int8 kernels (same tolerance as above)."""
    quantization = pytest.importorskip("onnxruntime.quantization")

    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter({"x": x} for x in CALIBRATION["x"][:8])

        def get_next(self):
            return next(self.feeds, None)

    src, dst = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(model, src)
    quantization.quantize_static(str(src), str(dst), Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 per_channel=per_channel, activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8)
    qdq = onnx.load(str(dst))
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in qdq.graph.node}
    compiled = glowpy.compile(qdq, backend="interpreter")
    for reference in (session(qdq, optimize=False), session(qdq)):
        diffs = np.concatenate([np.abs(compiled.run({"x": x})["y"] - reference.run(None, {"x": x})[0]).ravel()
                                for x in HELD_OUT])
        assert np.mean(diffs <= 1e-5) >= 0.999 and diffs.max() <= 0.02, diffs.max()


# --- profiles on disk ----------------------------------------------------------------------------------


def test_dump_and_load_profile(files, capsys):
    """Glow's two steps: --dump-profile, then --load-profile gives the same model as one step."""
    path, cal, tmp = files
    prof, one, two = tmp / "profile.json", tmp / "one.onnx", tmp / "two.onnx"
    assert main(["quantize", str(path), "-c", str(cal), "--dump-profile", str(prof)]) == 0
    assert main(["quantize", str(path), "--load-profile", str(prof), "-o", str(two)]) == 0
    assert main(["quantize", str(path), "-c", str(cal), "-o", str(one)]) == 0
    assert load_profile(prof) == profile(str(path), str(cal))
    assert onnx.load(str(one)).graph == onnx.load(str(two)).graph


@pytest.mark.parametrize("content,words", [
    ("{not json", ["not JSON"]),
    ('{"format": "other", "tensors": {}}', ["not a glowpy profile"]),
    ('{"format": "glowpy-profile-1", "tensors": {"x": {"min": 2, "max": 1}}}', ["'x'", "no valid range"]),
])
def test_bad_profile(files, content, words, capsys):
    path, _, tmp = files
    prof = tmp / "bad.json"
    prof.write_text(content)
    assert main(["quantize", str(path), "--load-profile", str(prof), "-o", str(tmp / "o.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(w in err for w in words), err


def test_profile_missing_a_tensor(files, tmp_path):
    path, _, _ = files
    with pytest.raises(UnidentifiedName, match="r1"):
        quantize(str(path), ranges={"x": Range(-1.0, 1.0)})
