"""Winograd F(2x2, 3x3), F(2x4, 3x3) and F(4x4, 3x3) on the cpu backend against the interpreter and onnx's
reference evaluator: maps that are not multiples of the tile, asymmetric and no padding, C and M not multiples
of the vector width, batch 2, a fused residual Add + Relu, host ISA (1 and 3 threads) and isa="avx2" (2
threads); the selection per layer shape; each tile's float32 error against float64."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.backends.cpu.kernels import conv
from glowpy.backends.cpu.kernels.conv import _Geometry, winograd_tile
from glowpy.backends.cpu.target import isa_available
from tools.bench_kernels import JitKernel, _conv_ref64, forced_winograd

# id: (x shape, M, pads)
SHAPES = {
    "odd_13x13_C19_M37": ((1, 19, 13, 13), 37, (1, 1, 1, 1)),
    "rect_asym_pads": ((1, 24, 10, 7), 20, (0, 1, 2, 0)),
    "valid_14x11": ((1, 16, 14, 11), 18, (0, 0, 0, 0)),
    "batch2_9x9": ((2, 20, 9, 9), 24, (1, 1, 1, 1)),
    "many_tiles_26x21": ((1, 17, 26, 21), 33, (1, 1, 1, 1)),
    "resnet_28_C128": ((1, 128, 28, 28), 128, (1, 1, 1, 1)),
    "f2_5x5": ((1, 16, 5, 5), 16, (1, 1, 1, 1)),
    "resnet_14_C256": ((1, 256, 14, 14), 256, (1, 1, 1, 1)),
}
F22, F24, F44 = (2, 2), (2, 4), (4, 4)
# (shape, tile): every tile on maps that are not multiples of it (the smallest maps only fit F(2x2): larger
# tiles would leave most lanes of their one vector empty)
CASES = ([(s, F24) for s in ("odd_13x13_C19_M37", "batch2_9x9", "many_tiles_26x21", "resnet_28_C128",
                              "resnet_14_C256")]
         + [(s, F44) for s in ("odd_13x13_C19_M37", "many_tiles_26x21", "resnet_28_C128")]
         + [(s, F22) for s in ("rect_asym_pads", "valid_14x11", "f2_5x5")])


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


@pytest.mark.parametrize("isa", ["host", "avx2"])
@pytest.mark.parametrize("name,tile", CASES, ids=[f"{s}-F{t[0]}x{t[1]}" for s, t in CASES])
def test_winograd_against_interpreter(name: str, tile, isa: str, monkeypatch) -> None:
    """The selection restricted to one tile takes it on this layer (at both vector widths), and the kernel
    matches the interpreter. Every cpu compile here passes cache=False, so no kernel of another selection
    is reused."""
    if isa == "avx2" and not isa_available("avx2"):
        pytest.skip("host has no AVX2")
    x_shape, m, pads = SHAPES[name]
    monkeypatch.setattr(conv, "WINOGRAD_TILES", (tile,))
    for vw in (16, 8):
        assert winograd_tile(_geo(x_shape, m, pads), vw) == tile, f"vector width {vw}"
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


@pytest.mark.parametrize("name,tile", [("many_tiles_26x21", F24), ("resnet_28_C128", F24), ("batch2_9x9", F24),
                                       ("rect_asym_pads", F22), ("odd_13x13_C19_M37", F44)])
def test_by_product_in_chunks_against_interpreter(name: str, tile, monkeypatch) -> None:
    """A panel's transformed input past WINO_INPUT_BYTES runs product by product (weights packed for it), in
    channel chunks past WINO_PRODUCT_BYTES (the products carried across them in scratch): the same results
    as the interpreter at 1 and 3 threads."""
    x_shape, m, pads = SHAPES[name]
    monkeypatch.setattr(conv, "WINOGRAD_TILES", (tile,))
    monkeypatch.setattr(conv, "WINO_INPUT_BYTES", 1024)
    monkeypatch.setattr(conv, "WINO_PRODUCT_BYTES", 16 * 4 * 5)  # 5 channels of a 16-tile panel
    geo = _geo(x_shape, m, pads)
    assert conv._wino_by_product(geo, *tile, 16)
    cc = conv._wino_chunk(geo, conv._wino_panel(geo, *tile, 16))
    assert 1 <= cc < geo.Cg, cc
    model, feeds = _model(x_shape, m, pads)
    want = glowpy.compile(model, backend="interpreter").run(feeds)["out"]
    for threads in (1, 3):
        got = glowpy.compile(model, backend="cpu", threads=threads, cache=False).run(feeds)["out"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"threads={threads}")


def test_wide_panels_where_weights_stream(monkeypatch) -> None:
    """Streamed transformed weights: a panel takes every tile (up to WINO_WIDE_VECTORS vectors), so the
    weights are read once per map; cached ones keep choose_tile's width."""
    monkeypatch.setattr(conv, "WINOGRAD_TILES", (F24,))
    big = _geo((1, 2048, 28, 28), 512, (1, 1, 1, 1))  # fcn_resnet50's head: 98 tiles, 151 MB of weights
    assert not conv._wino_weights_cached(big, *F24)
    assert conv._wino_panel(big, *F24, 16) == 7 * 16 and conv._wino_by_product(big, *F24, 16)
    small = _geo((1, 128, 28, 28), 128, (1, 1, 1, 1))
    assert conv._wino_weights_cached(small, *F24) and conv._wino_panel(small, *F24, 16) == 2 * 16
    resnet14 = _geo((1, 256, 14, 14), 256, (1, 1, 1, 1))  # 28 tiles: one panel either way, by row block
    assert conv._wino_panel(resnet14, *F24, 16) == 2 * 16 and not conv._wino_by_product(resnet14, *F24, 16)


@pytest.mark.parametrize("vw", [16, 8])
def test_error_against_float64_bounds_the_selection(vw: int) -> None:
    """On a 128-channel layer (ReLU-like input, He-scaled weights), the tiles the selection may take stay
    within 2x the direct kernel's largest error against float64; F(4x4), left out, does not."""
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal((1, 128, 14, 14)), 0).astype(np.float32)
    w = (rng.standard_normal((64, 128, 3, 3)) * np.sqrt(2 / (9 * 128))).astype(np.float32)
    ref = _conv_ref64(x, w, (1, 1, 1, 1))
    errs = {}
    for tile in (None, F22, F24, F44):
        with forced_winograd(tile):
            k = JitKernel(lambda mod, name: conv.emit_conv2d(
                mod, name, x_shape=x.shape, w=w, bias=None, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1),
                group=1, activation="none", activation_params=(), has_residual=False, vector_width=vw))
        out = np.empty(ref.shape, np.float32)
        k(out, x)
        errs[tile] = np.abs(out - ref).max() / np.abs(ref).max()
    for tile in conv.WINOGRAD_TILES:
        assert errs[tile] < 2 * errs[None], (tile, errs)
    assert F44 not in conv.WINOGRAD_TILES and errs[F44] > 2 * errs[None], errs


# ResNet-50's 3x3 stride-1 layers (C = M, padding 1): F(2x4) on the 56, 28 and 14 maps (at 14x14 with 256
# channels its 28 tiles fit one panel, so its 6.3 MB of transformed weights are read once) and on small
# channel counts, F(2x2) at 7x7 with 512 channels (16 tiles in one panel: its 16.7 MB are read once);
# inception_v3's 147x147 stem: F(2x4); a 7x7 map with few channels: F(2x2) at AVX-512 width (F(2x4)'s 8
# tiles would fill half a vector).
LAYERS = [((64, 56), F24, F24), ((128, 28), F24, F24), ((256, 14), F24, F24), ((512, 7), F22, F22),
          ((64, 14), F24, F24), ((32, 147), F24, F24), ((96, 35), F24, F24), ((32, 7), F22, F24)]


@pytest.mark.parametrize("layer,tile16,tile8", LAYERS, ids=[f"C{c}_{hw}" for (c, hw), *_ in LAYERS])
def test_layer_choice(layer, tile16, tile8) -> None:
    c, hw = layer
    for vw, tile in ((16, tile16), (8, tile8)):
        assert winograd_tile(_geo((1, c, hw, hw), c, (1, 1, 1, 1)), vw) == tile, f"vector width {vw}"


def test_uncached_weights_need_one_panel_of_enough_tiles(monkeypatch) -> None:
    """Transformed weights past WINO_CACHED_WEIGHTS (F(2x2) at 288 -> 288: 5.3 MB) on a map of fewer than
    WINO_MIN_TILE_VECTORS vectors of tiles: Winograd where WINO_STREAM_TILES or more tiles fit one panel (the
    weights are read once), not below that count, nor where the tiles spill into a second panel."""
    monkeypatch.setattr(conv, "WINOGRAD_TILES", (F22,))
    assert 16 * 288 * 288 * 4 > conv.WINO_CACHED_WEIGHTS and conv.WINO_STREAM_TILES == 16
    assert winograd_tile(_geo((1, 288, 8, 8), 288, (1, 1, 1, 1)), 16) == F22  # 16 tiles, one panel of 32
    assert winograd_tile(_geo((1, 288, 6, 8), 288, (1, 1, 1, 1)), 16) is None  # 12 tiles
    assert winograd_tile(_geo((1, 288, 10, 14), 288, (1, 1, 1, 1)), 16) is None  # 35 tiles, two panels
    assert winograd_tile(_geo((1, 64, 6, 8), 64, (1, 1, 1, 1)), 16) == F22  # 12 tiles, cached weights


def test_f2_stays_off_the_largest_maps(monkeypatch) -> None:
    """A map past WINO_F2_MAX_PIXELS takes no F(2x2) (F(2x4) still qualifies there)."""
    geo = _geo((1, 32, 147, 147), 64, (1, 1, 1, 1))
    assert geo.P > conv.WINO_F2_MAX_PIXELS
    assert winograd_tile(geo, 16) == F24
    monkeypatch.setattr(conv, "WINOGRAD_TILES", (F22,))
    assert winograd_tile(geo, 16) is None
    assert winograd_tile(_geo((1, 32, 74, 74), 64, (1, 1, 1, 1)), 16) == F22


def test_no_winograd_for_strides_groups_or_few_channels() -> None:
    assert winograd_tile(_Geometry((1, 64, 28, 28), (64, 64, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1), 16) is None
    assert winograd_tile(_Geometry((1, 64, 28, 28), (64, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2), 16) is None
    assert winograd_tile(_Geometry((1, 8, 28, 28), (64, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 16) is None
    assert winograd_tile(_Geometry((1, 64, 28, 28), (64, 64, 3, 3), (1, 1), (2, 2, 2, 2), (2, 1), 1), 16) is None


def test_dilated_winograd_only_where_the_sub_maps_fill_tiles() -> None:
    # fcn_resnet50: d = 2 and 4 on 28x28 (sub-maps 14x14, 7x7); deeplabv3's ASPP: d = 12 on 14x14 (2x2)
    assert winograd_tile(_Geometry((1, 256, 28, 28), (256, 256, 3, 3), (1, 1), (2,) * 4, (2, 2), 1), 16) == (2, 4)
    assert winograd_tile(_Geometry((1, 512, 28, 28), (512, 512, 3, 3), (1, 1), (4,) * 4, (4, 4), 1), 16) == (2, 4)
    assert winograd_tile(_Geometry((1, 960, 14, 14), (256, 960, 3, 3), (1, 1), (12,) * 4, (12, 12), 1), 16) is None
