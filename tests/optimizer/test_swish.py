"""fuse_swish: Mul(x, Sigmoid(x)) after a Conv / matrix product becomes that producer's 'swish' epilogue."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy

F32 = np.float32


def _model(order: str = "xs", extra_user: str | None = None, opset: int = 17):
    """Conv -> Sigmoid -> Mul (SiLU as the exporters write it); `extra_user` adds a near miss."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((6, 4, 3, 3)) * 0.5).astype(F32), "w")
    b = numpy_helper.from_array(rng.standard_normal(6).astype(F32), "b")
    mul_in = ["c", "s"] if order == "xs" else ["s", "c"]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", mul_in, ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 7, 7])]
    if extra_user == "x":  # the conv output has a third user
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        outs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 6, 7, 7]))
    elif extra_user == "sigmoid":  # the sigmoid has a second user
        nodes.append(helper.make_node("Relu", ["s"], ["r"]))
        outs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 6, 7, 7]))
    elif extra_user == "other":  # the Mul multiplies by a sigmoid of another value
        nodes[1] = helper.make_node("Sigmoid", ["x2"], ["s"])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])]
    if extra_user == "other":
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, 6, 7, 7]))
    graph = helper.make_graph(nodes, "g", inputs, outs, [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]) * 3).astype(F32)
            for i in model.graph.input}


@pytest.mark.parametrize("order", ["xs", "sx"])
def test_silu_after_conv_becomes_its_epilogue(order: str) -> None:
    model = _model(order)
    graph = glowpy.optimize(glowpy.load(model), "cpu")
    assert [(n.op, n.attrs["activation"], n.attrs["activation_params"]) for n in graph.nodes] == [
        ("Conv", "swish", (1.0,))]
    feeds = _feeds(model)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    for backend, isa in (("interpreter", None), ("cpu", None), ("cpu", "avx2")):
        opts = {"threads": 1, "cache": False, **({"isa": isa} if isa else {})} if backend == "cpu" else {}
        got = glowpy.compile(model, backend=backend, **opts).run(feeds)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{backend} {isa}")


@pytest.mark.parametrize("near_miss", ["x", "sigmoid", "other"])
def test_near_misses_stay_unfused(near_miss: str) -> None:
    model = _model(extra_user=near_miss)
    graph = glowpy.optimize(glowpy.load(model), "cpu")
    assert all(n.attrs.get("activation") != "swish" for n in graph.nodes)
    assert any(n.op == "Sigmoid" or n.attrs.get("activation") == "sigmoid" for n in graph.nodes)
    feeds = _feeds(model)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = glowpy.compile(model, backend="cpu", threads=1, cache=False).run(feeds)
    for o, w in zip(model.graph.output, want):
        np.testing.assert_allclose(got[o.name], w, rtol=1e-5, atol=1e-5)


def test_onnx_swish_opset_24_imports_one_to_one() -> None:
    """ONNX Swish (opset 24, alpha) is the same IR op and fuses into the Conv too."""
    model = _model()
    del model.graph.node[1:]
    model.graph.node.append(helper.make_node("Swish", ["c"], ["y"], alpha=0.6))
    model.opset_import[0].version = 24
    graph = glowpy.optimize(glowpy.load(model), "cpu")
    assert [(n.op, n.attrs["activation"]) for n in graph.nodes] == [("Conv", "swish")]
    assert graph.nodes[0].attrs["activation_params"] == pytest.approx((0.6,))
    feeds = _feeds(model)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = glowpy.compile(model, backend="cpu", threads=1, cache=False).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
