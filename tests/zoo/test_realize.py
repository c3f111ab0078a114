"""Skeletons and their realization: what a skeleton keeps, and that realize() gives a deterministic model
whose activations calibration keeps normalized."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.zoo.realize import DROPPED, INPUTS_KEY, SKELETON_DIR, dropped_tensors, make_inputs, realize
from tools.zoo.skeleton import skeletonize

SKELETON_BUDGET = 8 << 20  # bytes, all skeletons together


def _tiny_cnn() -> onnx.ModelProto:
    """Conv(bias) -> BatchNorm -> Relu -> Conv(bias) -> Reshape -> MatMul -> Clip, plus an embedding Gather,
    a big float Constant and an all-zeros fill: every kind of tensor a skeleton treats differently."""
    rng = np.random.default_rng(0)

    def init(name, array):
        return numpy_helper.from_array(np.asarray(array), name)

    inits = [
        init("w1", rng.normal(size=(24, 3, 3, 3)).astype(np.float32)), init("b1", rng.normal(size=24).astype(np.float32)),
        init("scale", rng.uniform(0.5, 1.5, 24).astype(np.float32)), init("bias", rng.normal(size=24).astype(np.float32)),
        init("mean", rng.normal(size=24).astype(np.float32)), init("var", rng.uniform(0.5, 1.5, 24).astype(np.float32)),
        init("w2", rng.normal(size=(32, 24, 3, 3)).astype(np.float32)), init("b2", rng.normal(size=32).astype(np.float32)),
        init("shape", np.array([1, 32 * 6 * 6], np.int64)),
        init("fc", rng.normal(size=(32 * 6 * 6, 10)).astype(np.float32)),
        init("lo", np.array(-3.0, np.float32)), init("hi", np.array(3.0, np.float32)),
        init("table", rng.normal(size=(100, 10)).astype(np.float32)), init("ids", np.array([[1, 5]], np.int64)),
        init("fill", np.zeros((2, 10), np.float32)),
    ]
    big_values = rng.normal(size=(2, 10)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
        helper.make_node("Reshape", ["c2", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc"], ["logits"]),
        helper.make_node("Constant", [], ["offset"], value=numpy_helper.from_array(big_values, "offset")),
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("Add", ["emb", "offset"], ["emb1"]),
        helper.make_node("Add", ["emb1", "fill"], ["emb2"]),
        helper.make_node("Clip", ["logits", "lo", "hi"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10]),
                               helper.make_tensor_value_info("emb2", TensorProto.FLOAT, [1, 2, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {INPUTS_KEY: json.dumps({"x": "normal"})})
    return model


def _data(t: TensorProto) -> bool:
    return any(len(getattr(t, f)) for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"))


def test_skeleton_drops_float_payloads_and_keeps_shapes_and_operands() -> None:
    model = _tiny_cnn()
    skeleton = skeletonize(model)
    tensors = {t.name: t for t in skeleton.graph.initializer}
    for name in ("w1", "b1", "scale", "bias", "mean", "var", "w2", "b2", "fc", "table"):
        assert tensors[name].doc_string == DROPPED and not _data(tensors[name]), name
    for name in ("shape", "ids", "lo", "hi", "fill"):  # a Reshape shape, Gather indices, Clip bounds, a fill
        assert tensors[name].doc_string != DROPPED and _data(tensors[name]), name
        assert numpy_helper.to_array(tensors[name]).tolist() == numpy_helper.to_array(
            next(t for t in model.graph.initializer if t.name == name)).tolist()
    original = {t.name: t for t in model.graph.initializer}
    for name, t in tensors.items():
        assert (t.data_type, list(t.dims)) == (original[name].data_type, list(original[name].dims)), name
    (constant,) = [n for n in skeleton.graph.node if n.op_type == "Constant"]
    assert constant.attribute[0].t.doc_string == DROPPED and list(constant.attribute[0].t.dims) == [2, 10]
    assert len(skeleton.SerializeToString()) < len(model.SerializeToString()) / 5
    # onnx reads a skeleton as it is, no data needed
    assert onnx.load_from_string(skeleton.SerializeToString()).graph.node[0].op_type == "Conv"


def test_realize_is_deterministic_for_a_seed() -> None:
    skeleton = skeletonize(_tiny_cnn())
    first, again, other = realize(skeleton, 3), realize(skeleton, 3), realize(skeleton, 4)
    assert first.SerializeToString() == again.SerializeToString()
    assert first.SerializeToString() != other.SerializeToString()
    assert not list(dropped_tensors(first))  # every dropped tensor was filled


def _run_with(model: onnx.ModelProto, names: list[str], feeds: dict) -> dict[str, np.ndarray]:
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds)))


def test_calibration_normalizes_batchnorm_and_biased_conv_outputs() -> None:
    skeleton = skeletonize(_tiny_cnn())
    model = realize(skeleton, 0)
    feeds = make_inputs(model, 1)[0]  # the input calibration uses for seed 0
    seen = _run_with(model, ["c1", "n1", "c2"], feeds)
    w = {t.name: numpy_helper.to_array(t).reshape(-1, 1, 1) for t in model.graph.initializer}
    # Both biased Convs leave every channel with mean 0 and variance 1; the BatchNorm between them
    # normalizes, then applies its (realized) scale and bias.
    seen["n1"] = (seen["n1"] - w["bias"]) / w["scale"]
    for name in ("c1", "n1", "c2"):
        per_channel = seen[name].transpose(1, 0, 2, 3).reshape(seen[name].shape[1], -1)
        np.testing.assert_allclose(per_channel.mean(axis=1), 0, atol=1e-4)
        np.testing.assert_allclose(per_channel.var(axis=1), 1, rtol=5e-3)
    uncalibrated = realize(skeleton, 0, calibrate_stats=False)
    raw = _run_with(uncalibrated, ["c2"], feeds)["c2"]
    assert abs(raw.var() - 1) > 0.5  # calibration changed something real


def test_realized_weights_follow_their_roles() -> None:
    model = realize(skeletonize(_tiny_cnn()), 0, calibrate_stats=False)
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert abs(w["fc"].std() - np.sqrt(1 / w["fc"].shape[0])) < 0.1 * np.sqrt(1 / w["fc"].shape[0])  # fan-in
    assert abs(w["w2"].std() - np.sqrt(2 / (24 * 9))) < 0.1 * np.sqrt(2 / (24 * 9))  # He, fan-in 24*3*3
    assert abs(w["scale"].mean() - 1) < 0.1 and abs(w["bias"].mean()) < 0.1
    assert w["table"].std() < 0.05  # embeddings small


def test_make_inputs_follows_the_rules_in_the_metadata() -> None:
    x = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])
    mask = helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 8])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    graph = helper.make_graph([helper.make_node("Identity", ["ids"], ["y"])], "g", [x, mask, flag],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 8])])
    model = helper.make_model(graph)
    helper.set_model_props(model, {INPUTS_KEY: json.dumps({"ids": "randint:0:5", "mask": "padmask:3", "flag": "flag"})})
    feeds = make_inputs(model, 0)
    assert [bool(f["flag"]) for f in feeds] == [True, False]
    assert feeds[0]["ids"].dtype == np.int64 and feeds[0]["ids"].min() >= 0 and feeds[0]["ids"].max() < 5
    assert feeds[0]["mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0, 0]]
    helper.set_model_props(model, {INPUTS_KEY: json.dumps({"ids": "poisson"})})
    with pytest.raises(ValueError, match="input 'ids': unknown feed rule 'poisson'"):
        make_inputs(model, 0)


def test_committed_skeletons_carry_no_weights_and_fit_the_budget() -> None:
    paths = sorted(SKELETON_DIR.glob("*.onnx"))
    assert paths
    assert sum(p.stat().st_size for p in paths) < SKELETON_BUDGET
    for path in paths:
        model = onnx.load(str(path))
        assert {p.key for p in model.metadata_props} >= {INPUTS_KEY}, path.name
        # nothing left that a skeleton drops
        assert skeletonize(model).SerializeToString() == model.SerializeToString(), path.name


def test_skeleton_tool_needs_no_torch() -> None:
    """tools/zoo/skeleton.py and realize run where torch is not installed (the test environment)."""
    code = ("import sys; import tools.zoo.skeleton, tests.zoo.realize; "
            "sys.exit(1 if any(m.split('.')[0] in ('torch', 'torchvision', 'transformers') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=SKELETON_DIR.parents[2]).returncode == 0
