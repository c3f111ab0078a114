"""Ops whose output shape depends on data values (NonZero, Compress, Unique, NonMaxSuppression) and
shape operands computed from run-time data: the check refuses them with UNSUPPORTED_SHAPE and a reason,
the full import refuses them the same way, and glowpy.partition leaves exactly those nodes to the host
(the subgraphs after them take the host's data-dependent shapes as symbolic dims)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.errors import Status, UnsupportedShape

from .test_partition import run_stitched

ort = pytest.importorskip("onnxruntime")

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def detector_like() -> onnx.ModelProto:
    n = helper.make_node
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "T"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "flat")]
    nodes = [n("Relu", ["X"], ["r"], name="relu"),
             n("Greater", ["r", "T"], ["cond"], name="greater"),
             n("NonZero", ["cond"], ["idx"], name="nonzero"),
             n("Cast", ["idx"], ["fi"], name="cast", to=F),
             n("Mul", ["fi", "two"], ["Y1"], name="mul"),
             n("Reshape", ["r", "flat"], ["rf"], name="rflat"),
             n("Reshape", ["cond", "flat"], ["cf"], name="cflat"),
             n("Compress", ["rf", "cf"], ["kept"], name="compress", axis=0),
             n("Neg", ["kept"], ["Y2"], name="neg"),
             n("Unique", ["rf"], ["u"], name="unique", sorted=1),
             n("Sigmoid", ["u"], ["Y3"], name="sigmoid")]
    g = helper.make_graph(nodes, "detector_like", [helper.make_tensor_value_info("X", F, [2, 5])],
                          [helper.make_tensor_value_info("Y1", F, None), helper.make_tensor_value_info("Y2", F, None),
                           helper.make_tensor_value_info("Y3", F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


DATA_DEPENDENT = {"nonzero", "compress", "unique"}


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_the_check_refuses_exactly_the_data_dependent_nodes(backend):
    report = glowpy.check(detector_like(), backend=backend)
    refused = {v.name: v for v in report.nodes if not v.supported}
    assert set(refused) == DATA_DEPENDENT
    for v in refused.values():
        assert v.status == Status.UNSUPPORTED_SHAPE
        assert "depends on input values" in v.reason and "the host runs this node" in v.reason
    assert "the number of true elements of condition" in refused["compress"].reason
    with pytest.raises(UnsupportedShape, match=r"node 'nonzero' \(NonZero.*depends on input values"):
        glowpy.compile(detector_like(), backend=backend)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_partition_leaves_them_to_the_host_and_stitches_to_onnxruntime(backend):
    model = detector_like()
    part = glowpy.partition(model, backend=backend)
    assert sorted(n.name for n in part.host_nodes) == sorted(DATA_DEPENDENT)
    x = np.array([[0.1, 0.9, -1.0, 0.7, 0.6], [2.0, 0.2, 0.9, -0.3, 0.55]], np.float32)
    ort_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    shapes = []
    for feed in (x, -x):  # other counts: the subgraphs after the host nodes specialize again
        expected = dict(zip(["Y1", "Y2", "Y3"], ort_session.run(None, {"X": feed})))
        got = run_stitched(model, {"X": feed}, backend)
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-6)
        shapes.append(got["Y1"].shape)
    assert shapes == [(2, 6), (2, 1)]


def reshape_by(shape_input: onnx.ValueInfoProto, via: str) -> onnx.ModelProto:
    nodes = [helper.make_node(via, ["S"], ["s0"]),
             helper.make_node("Reshape", ["D", "s1" if via == "Squeeze" else "s0"], ["Y"], name="reshape")]
    if via == "Squeeze":
        nodes.insert(1, helper.make_node("Abs", ["s0"], ["s1"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("D", F, [2, 6]), shape_input],
                          [helper.make_tensor_value_info("Y", F, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_a_shape_operand_computed_from_data_is_refused_by_both_paths():
    """A rank-2 data input reaching Reshape's shape is a run-time value (it does not look like an operand,
    so it does not specialize): refused alike. A 1-D operand input through Abs specializes: accepted alike."""
    data = reshape_by(helper.make_tensor_value_info("S", I64, [1, 2]), "Squeeze")
    report = glowpy.check(data, backend="interpreter")
    assert report.status == Status.UNSUPPORTED_SHAPE and "must be known at compile time" in report.reason
    with pytest.raises(UnsupportedShape, match="must be known at compile time"):
        glowpy.compile(data, backend="interpreter")
    operand = reshape_by(helper.make_tensor_value_info("S", I64, [2]), "Abs")
    assert glowpy.check(operand, backend="interpreter").status == Status.SUCCESS
    compiled = glowpy.compile(operand, backend="interpreter")
    d = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(compiled.run({"D": d, "S": np.array([-3, 4], np.int64)})["Y"], d.reshape(3, 4))


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_a_scalar_shape_operand_fed_at_run_time_stays_a_scalar(backend):
    """The detector's pattern after a host node: Gather(Shape(x), i) with i a scalar graph input, then
    Unsqueeze and Concat into a Reshape target. The operand specializes as a 0-d weight (a 1-d one would
    make the Gather 1-d and the Concat refuse its [1, 1] operand)."""
    n = helper.make_node
    inits = [numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "rest")]
    nodes = [n("Shape", ["X"], ["s"]), n("Gather", ["s", "i"], ["d"], axis=0), n("Unsqueeze", ["d", "axes"], ["u"]),
             n("Concat", ["u", "rest"], ["target"], axis=0), n("Reshape", ["X", "target"], ["Y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", F, ["n", 2, 3]),
                                       helper.make_tensor_value_info("i", I64, [])],
                          [helper.make_tensor_value_info("Y", F, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert glowpy.check(model, backend=backend).status == Status.SUCCESS
    compiled = glowpy.compile(model, backend=backend)
    x = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    for i, shape in ((0, (4, 6)), (2, (3, 8))):
        got = compiled.run({"X": x, "i": np.array(i, np.int64)})["Y"]
        np.testing.assert_array_equal(got, x.reshape(shape))
