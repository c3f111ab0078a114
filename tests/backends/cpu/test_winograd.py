"""Winograd F(4x4, 3x3) and F(2x2, 3x3) on the cpu backend against the interpreter and onnx's reference
evaluator: maps that are not multiples of the tile, asymmetric and no padding, C and M not multiples of the
vector width, batch 2, a fused residual Add + Relu, host ISA (1 and 3 threads) and isa="avx2" (2 threads)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.backends.cpu.kernels import conv
from glowpy.backends.cpu.kernels.conv import _Geometry, winograd_tile
from glowpy.backends.cpu.target import isa_available

# id: (x shape, M, pads, output tile the layer takes at vector widths 16 and 8)
SHAPES = {
    "odd_13x13_C19_M37": ((1, 19, 13, 13), 37, (1, 1, 1, 1), 4),
    "rect_asym_pads": ((1, 24, 10, 7), 20, (0, 1, 2, 0), 4),
    "valid_14x11": ((1, 16, 14, 11), 18, (0, 0, 0, 0), 4),
    "batch2_9x9": ((2, 20, 9, 9), 24, (1, 1, 1, 1), 4),
    "many_tiles_26x21": ((1, 17, 26, 21), 33, (1, 1, 1, 1), 4),
    "resnet_28_C128": ((1, 128, 28, 28), 128, (1, 1, 1, 1), 4),
    "f2_5x5": ((1, 16, 5, 5), 16, (1, 1, 1, 1), 2),
}


DEFAULT_TILES = conv.WINOGRAD_TILES  # before any test widens it


@pytest.fixture(autouse=True)
def f4_allowed(monkeypatch):
    """F(4x4) is out of the default selection (conv.WINOGRAD_TILES); these tests choose and run it.
    Every cpu compile here passes cache=False, so no kernel of the other selection is reused."""
    monkeypatch.setattr(conv, "WINOGRAD_TILES", (4, 2))


def test_the_default_selection_leaves_f4_out() -> None:
    assert DEFAULT_TILES == (2,)


def _geo(x_shape, m, pads) -> _Geometry:
    return _Geometry(x_shape, (m, x_shape[1], 3, 3), (1, 1), pads, (1, 1), 1)


def _model(x_shape, m: int, pads, seed: int = 0):
    """Conv 3x3 (+ bias) + residual Add + Relu: the block the optimizer fuses into one conv kernel."""
    rng = np.random.default_rng(seed)
    c = x_shape[1]
    w = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = (rng.standard_normal(m) * 0.1).astype(np.float32)
    oh = x_shape[2] + pads[0] + pads[2] - 2
    ow = x_shape[3] + pads[1] + pads[3] - 2
    out_shape = (x_shape[0], m, oh, ow)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=list(pads)),
             helper.make_node("Add", ["y", "r"], ["s"]), helper.make_node("Relu", ["s"], ["out"])]
    graph = helper.make_graph(
        nodes, "wino", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
                        helper.make_tensor_value_info("r", TensorProto.FLOAT, out_shape)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "r": rng.standard_normal(out_shape).astype(np.float32)}
    return model, feeds


@pytest.mark.parametrize("name", list(SHAPES))
def test_shapes_take_the_intended_tile(name: str) -> None:
    x_shape, m, pads, tile = SHAPES[name]
    for vw in (16, 8):
        assert winograd_tile(_geo(x_shape, m, pads), vw) == tile, f"vector width {vw}"


@pytest.mark.parametrize("isa", ["host", "avx2"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_winograd_against_interpreter(name: str, isa: str) -> None:
    if isa == "avx2" and not isa_available("avx2"):
        pytest.skip("host has no AVX2")
    x_shape, m, pads, _ = SHAPES[name]
    model, feeds = _model(x_shape, m, pads)
    want = glowpy.compile(model, backend="interpreter").run(feeds)["out"]
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(want, ref, rtol=1e-4, atol=1e-5)
    opts, thread_counts = ({}, (1, 3)) if isa == "host" else ({"isa": "avx2"}, (2,))
    for threads in thread_counts:
        got = glowpy.compile(model, backend="cpu", threads=threads, cache=False, **opts).run(feeds)["out"]
        # the conv kernel tests' tolerance: F(4x4)'s transforms leave ~2e-5 absolute error at C=128 on
        # unit-scale outputs (the direct kernel ~5e-6), more than the 1e-5 of the other cpu tests
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"threads={threads}")
        assert np.sqrt(np.mean((got - want) ** 2)) < 1e-5


# ResNet-50's 3x3 stride-1 layers: F(4x4) on the 56 and 28 maps, F(2x2) at 14 (F(4x4)'s 16 tiles fill one
# panel and its 9.4 MB of transformed weights are re-read from memory), none at 7x7 with 512 channels
# (F(2x2)'s 16.7 MB of weights cost more than the direct kernel's multiplies).
RESNET = [((64, 56), 4), ((128, 28), 4), ((256, 14), 2), ((512, 7), 0), ((64, 14), 4)]


@pytest.mark.parametrize("vw", [16, 8])
@pytest.mark.parametrize("layer,tile", RESNET, ids=[f"C{c}_{hw}" for (c, hw), _ in RESNET])
def test_resnet_layer_choice(layer, tile: int, vw: int) -> None:
    c, hw = layer
    assert winograd_tile(_geo((1, c, hw, hw), c, (1, 1, 1, 1)), vw) == tile


def test_no_winograd_for_strides_groups_or_few_channels() -> None:
    assert winograd_tile(_Geometry((1, 64, 28, 28), (64, 64, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1), 16) == 0
    assert winograd_tile(_Geometry((1, 64, 28, 28), (64, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2), 16) == 0
    assert winograd_tile(_Geometry((1, 8, 28, 28), (64, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 16) == 0
    assert winograd_tile(_Geometry((1, 64, 28, 28), (64, 64, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1), 16) == 0
