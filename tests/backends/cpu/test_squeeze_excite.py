"""Squeeze-excite: the optimizer pass (optimizer/squeeze_excite.py) fires on the blocks MobileNetV3,
EfficientNet and RegNetY export and not on near misses, and the fused cpu kernel matches the
interpreter and onnx.reference (host ISA and AVX2, 1 and 3 threads, odd sizes, batches)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.errors import MismatchingShape, UnsupportedOperator
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

F32 = np.float32


def _se_model(shape=(1, 24, 9, 11), r=6, act="Relu", gate="Sigmoid", pool="GlobalAveragePool", order="sx",
              miss: str | None = None, opset: int = 17):
    """x -> [pool -> Conv1x1 -> act -> Conv1x1 -> gate] -> Mul(gate, x); `miss` makes a near miss."""
    rng = np.random.default_rng(0)
    n, c, h, w = shape
    inits = [numpy_helper.from_array((rng.standard_normal((r, c, 1, 1)) * 0.3).astype(F32), "w1"),
             numpy_helper.from_array(rng.standard_normal(r).astype(F32), "b1"),
             numpy_helper.from_array((rng.standard_normal((c, r, 1, 1)) * 0.3).astype(F32), "w2"),
             numpy_helper.from_array(rng.standard_normal(c).astype(F32), "b2")]
    nodes = []
    if pool == "GlobalAveragePool":
        nodes.append(helper.make_node("GlobalAveragePool", ["x"], ["m"]))
    else:
        axes = [2] if miss == "axes" else [2, 3]
        if opset >= 18:  # axes became an input
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
            nodes.append(helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1))
        else:
            nodes.append(helper.make_node("ReduceMean", ["x"], ["m"], axes=axes, keepdims=1))
    nodes.append(helper.make_node("Conv", ["m", "w1", "b1"], ["h0"]))
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["h0"], ["hs"]), helper.make_node("Mul", ["h0", "hs"], ["h"])]
    else:
        nodes.append(helper.make_node(act, ["h0"], ["h"]))
    nodes.append(helper.make_node("Conv", ["h", "w2", "b2"], ["g0"]))
    nodes.append(helper.make_node(gate, ["g0"], ["g"]))
    other = "x2" if miss == "other_x" else "x"
    nodes.append(helper.make_node("Mul", ["g", other] if order == "sx" else [other, "g"], ["y"]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    if miss == "other_x":
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, list(shape)))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))]
    if miss == "gate_used":  # the gate has a second user
        outs.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [n, c, 1, 1]))
    graph = helper.make_graph(nodes, "se", inputs, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(model, seed=1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]) * 2).astype(F32)
            for i in model.graph.input}


def _check(model, isa=None, threads=1) -> None:
    feeds = _feeds(model)
    want = ReferenceEvaluator(model).run(None, feeds)
    opts = {"isa": isa} if isa else {}
    got = glowpy.compile(model, backend="cpu", threads=threads, cache=False, **opts).run(feeds)
    interp = glowpy.compile(model, backend="interpreter").run(feeds)
    for o, w in zip(model.graph.output, want):
        np.testing.assert_allclose(got[o.name], w, rtol=1e-4, atol=1e-5, err_msg=f"cpu {isa} {threads}")
        np.testing.assert_allclose(interp[o.name], w, rtol=1e-5, atol=1e-6, err_msg="interpreter")


# (exporter pattern id): MobileNetV3 (ReLU, HardSigmoid), EfficientNet (SiLU, Sigmoid, ReduceMean from
# dynamo), RegNetY (ReLU, Sigmoid)
PATTERNS = {
    "mobilenet_v3": dict(act="Relu", gate="HardSigmoid"),
    "efficientnet_dynamo": dict(act="SiLU", gate="Sigmoid", pool="ReduceMean", opset=18),
    "efficientnet_ts": dict(act="SiLU", gate="Sigmoid", order="xs"),
    "regnet_y": dict(act="Relu", gate="Sigmoid", shape=(2, 40, 7, 7), r=10),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pass_fires_on_exported_blocks(name: str) -> None:
    model = _se_model(**PATTERNS[name])
    graph = glowpy.optimize(glowpy.load(model), "cpu")
    assert [n.op for n in graph.nodes] == ["SqueezeExcite"]
    _check(model)


@pytest.mark.parametrize("miss", ["axes", "other_x", "gate_used"])
def test_near_misses_stay_unfused(miss: str) -> None:
    model = _se_model(pool="ReduceMean" if miss == "axes" else "GlobalAveragePool", miss=miss, opset=17)
    graph = glowpy.optimize(glowpy.load(model), "cpu")
    assert all(n.op != "SqueezeExcite" for n in graph.nodes)
    _check(model)


def test_tanh_gate_is_not_a_squeeze_excite() -> None:
    model = _se_model(gate="Tanh")
    assert all(n.op != "SqueezeExcite" for n in glowpy.optimize(glowpy.load(model), "cpu").nodes)


@pytest.mark.parametrize("isa", [None, "avx2"])
@pytest.mark.parametrize("shape,r", [((1, 24, 9, 11), 6), ((3, 70, 5, 3), 17), ((1, 16, 1, 1), 4),
                                     ((1, 37, 23, 23), 9)])
def test_kernel_matches_reference(shape, r, isa) -> None:
    model = _se_model(shape=shape, r=r, act="SiLU", gate="HardSigmoid")
    assert [n.op for n in glowpy.optimize(glowpy.load(model), "cpu").nodes] == ["SqueezeExcite"]
    for threads in (1, 3):
        _check(model, isa, threads)


def test_ir_op_refuses_mismatched_weights() -> None:
    g = Graph("bad")
    x = g.add_input("x", TensorType(F32, (1, 8, 4, 4)))
    ws = [g.add_constant(k, np.zeros(s, F32)) for k, s in (("w1", (2, 7)), ("b1", (2,)), ("w2", (8, 2)),
                                                            ("b2", (8,)))]
    with pytest.raises(MismatchingShape, match="SqueezeExcite needs"):
        g.add_node("SqueezeExcite", [x, *ws], {}, name="se")


def test_cpu_refuses_run_time_weights() -> None:
    g = Graph("se_inputs")
    x = g.add_input("x", TensorType(F32, (1, 8, 4, 4)))
    ws = [g.add_input(k, TensorType(F32, s)) for k, s in (("w1", (2, 8)), ("b1", (2,)), ("w2", (8, 2)), ("b2", (8,)))]
    g.outputs = [g.add_node("SqueezeExcite", [x, *ws], {}, name="se").outputs[0]]
    with pytest.raises(UnsupportedOperator, match="constant weights"):
        glowpy.compile(g, backend="cpu", optimize=False, cache=False)


def test_means_are_their_own_step_on_several_threads() -> None:
    """On one thread the kernel computes the channel means itself; on several an earlier reduction step
    (split by planes, like the scaling) computes them, so no thread reads all of x."""
    model = _se_model(shape=(2, 48, 14, 14), r=12, act="Relu", gate="Sigmoid")
    for threads, ops in ((1, ["SqueezeExcite"]), (2, ["SqueezeExcite", "SqueezeExcite"])):
        exe = glowpy.compile(model, backend="cpu", threads=threads, cache=False).executable
        assert [s.op for s in exe.layout.profile_steps] == ops
        assert all(s.parallel for s in exe.layout.profile_steps) is (threads > 1)
    _check(model, threads=2)
