"""crop_dead_conv_taps: kernel taps that only read padding are cut from a Conv (DeepLabV3's ASPP)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy

F32 = np.float32


def _model(hw, k, dil, pads, weight_fill=None):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((5, 4, k, k)) * 0.3).astype(F32)
    if weight_fill is not None:
        w[:, :, 0, 0] = weight_fill
    b = rng.standard_normal(5).astype(F32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], dilations=[dil, dil], pads=pads)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, *hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv(model):
    nodes = list(glowpy.optimize(glowpy.load(model), "cpu").nodes)
    assert [n.op for n in nodes] == ["Conv"]
    return nodes[0]


def _check(model) -> None:
    x = np.random.default_rng(1).standard_normal([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
                                                 ).astype(F32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for backend in ("interpreter", "cpu"):
        got = glowpy.compile(model, backend=backend).run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=backend)


@pytest.mark.parametrize("dil", [24, 36])
def test_aspp_dilation_beyond_the_map_becomes_1x1(dil: int) -> None:
    model = _model((14, 14), 3, dil, [dil] * 4)
    conv = _conv(model)
    assert conv.inputs[1].shape == (5, 4, 1, 1)
    assert tuple(conv.attrs["pads"]) == (0, 0, 0, 0) and tuple(conv.attrs["dilations"]) == (1, 1)
    _check(model)


def test_one_sided_crop_keeps_the_live_taps() -> None:
    model = _model((6, 6), 3, 5, [5, 5, 0, 0])  # one output row and column: tap 0 reads only padding
    conv = _conv(model)
    assert conv.inputs[1].shape == (5, 4, 2, 2) and tuple(conv.attrs["pads"]) == (0, 0, 0, 0)
    assert tuple(conv.attrs["dilations"]) == (5, 5)
    _check(model)


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")  # the NaNs are the point
def test_non_finite_dead_weights_stay() -> None:
    """0 * inf is NaN in the reference: a dead tap with an infinite weight is not dropped."""
    model = _model((14, 14), 3, 24, [24] * 4, weight_fill=np.inf)
    assert _conv(model).inputs[1].shape == (5, 4, 3, 3)
    _check(model)


def _ops(model) -> list[str]:
    return [n.op for n in glowpy.optimize(glowpy.load(model), "cpu").nodes]


def test_mostly_padding_conv_splits_into_blocks_of_live_taps() -> None:
    """Dilation 12 on 14x14 (ASPP): 3 x 3 output blocks, each a Conv with only its live taps."""
    model = _model((14, 14), 3, 12, [12] * 4)
    graph = glowpy.optimize(glowpy.load(model), "cpu")
    convs = [n for n in graph.nodes if n.op == "Conv"]
    assert len(convs) == 9 and sum(n.op == "Concat" for n in graph.nodes) == 4
    assert sorted(n.inputs[1].shape[2:] for n in convs) == [(1, 1)] + [(1, 2)] * 2 + [(2, 1)] * 2 + [(2, 2)] * 4
    assert all(tuple(n.attrs["pads"]) == (0, 0, 0, 0) for n in convs)
    _check(model)


@pytest.mark.parametrize("hw,k,dil,pads,strides", [((13, 11), 3, 8, [8, 8, 8, 8], [2, 2]),
                                                   ((9, 16), 5, 4, [8, 3, 8, 5], [1, 2])])
def test_split_irregular_maps_match_reference(hw, k, dil, pads, strides) -> None:
    model = _model(hw, k, dil, pads)
    model.graph.node[0].attribute.append(helper.make_attribute("strides", strides))
    assert "Concat" in _ops(model)
    _check(model)


def test_ordinary_convs_stay_whole() -> None:
    """A 3x3 with padding 1 reads the image at almost every tap: no split."""
    assert _ops(_model((14, 14), 3, 1, [1] * 4)) == ["Conv"]
