"""The generated Conv2D kernel against a float64 numpy convolution, on every layer shape family the light
models use (and the edges around them), at 1, 2 and 3 threads, with NaN guards around the output."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import VW, conv_kernel, conv_out_dim, conv_ref, guarded, guards_intact

from glowpy.errors import GlowpyError

RTOL = ATOL = 1e-4

# id: (x_shape, w_shape, attrs). Spatial sizes are cut down from the real layers where the code path does
# not depend on them; the paths (1x1 direct, shifted loads, gathers, depthwise, chunked reduction,
# partial row blocks and partial pixel panels) all appear.
CONFIGS = {
    # ResNet-50
    "resnet_conv1_7x7s2": ((1, 3, 38, 38), (64, 3, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3))),
    "resnet_1x1_56": ((1, 64, 56, 56), (64, 64, 1, 1), {}),
    "resnet_3x3_28": ((1, 64, 28, 28), (64, 64, 3, 3), dict(pads=(1, 1, 1, 1))),
    "resnet_3x3s2": ((1, 32, 28, 28), (48, 32, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    "resnet_1x1s2_down": ((1, 64, 14, 14), (128, 64, 1, 1), dict(strides=(2, 2))),
    "resnet_1x1_7x7_bigK": ((1, 512, 7, 7), (256, 512, 1, 1), {}),
    "resnet_3x3_7x7": ((1, 96, 7, 7), (96, 96, 3, 3), dict(pads=(1, 1, 1, 1))),
    # SqueezeNet: 3x3 s2 without padding, odd 13x13 and 55-wide maps, M and C not multiples of 16
    "squeeze_conv1_3x3s2p0": ((1, 3, 33, 33), (20, 3, 3, 3), dict(strides=(2, 2))),
    "squeeze_1x1_13": ((1, 24, 13, 13), (37, 24, 1, 1), {}),
    "squeeze_3x3_13": ((1, 19, 13, 13), (37, 19, 3, 3), dict(pads=(1, 1, 1, 1))),
    "squeeze_1x1_M1000": ((1, 40, 13, 13), (1000, 40, 1, 1), {}),
    # ShuffleNet: groups 4 with 34 channels per group, depthwise 3x3 stride 1 and 2
    "shuffle_g4": ((1, 136, 14, 14), (136, 34, 1, 1), dict(group=4)),
    "shuffle_dw": ((1, 40, 14, 14), (40, 1, 3, 3), dict(group=40, pads=(1, 1, 1, 1))),
    "shuffle_dw_s2": ((1, 24, 15, 15), (24, 1, 3, 3), dict(group=24, strides=(2, 2), pads=(1, 1, 1, 1))),
    "dw_7x7_map": ((1, 20, 7, 7), (20, 1, 3, 3), dict(group=20, pads=(1, 1, 1, 1))),
    "dw_multiplier2": ((1, 6, 9, 9), (12, 1, 3, 3), dict(group=6, pads=(1, 1, 1, 1))),
    # DenseNet: 3x3 into 32 channels, 1x1 into 128
    "dense_3x3_to32": ((1, 128, 14, 14), (32, 128, 3, 3), dict(pads=(1, 1, 1, 1))),
    # Inception: 5x5 pad 2, 1x1 on a 6x6 map, 7x7 s2
    "incep_5x5": ((1, 24, 13, 13), (64, 24, 5, 5), dict(pads=(2, 2, 2, 2))),
    "incep_1x1_6x6": ((1, 83, 6, 6), (40, 83, 1, 1), {}),
    # AlexNet / ZFNet: 11x11 stride 4, groups 2, 5x5 s2
    "alex_11x11s4": ((1, 3, 47, 47), (24, 3, 11, 11), dict(strides=(4, 4))),
    "alex_g2_5x5": ((1, 16, 13, 13), (24, 8, 5, 5), dict(group=2, pads=(2, 2, 2, 2))),
    "zf_7x7s2p1": ((1, 3, 29, 29), (16, 3, 7, 7), dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    # VGG: 3x3 same on a wide map
    "vgg_3x3": ((1, 8, 40, 40), (16, 8, 3, 3), dict(pads=(1, 1, 1, 1))),
    # edges
    "groups3": ((1, 12, 10, 10), (9, 4, 3, 3), dict(group=3, pads=(1, 1, 1, 1))),
    "asym_pads": ((1, 5, 11, 9), (7, 5, 3, 3), dict(pads=(0, 1, 2, 1))),
    "asym_pads_wide": ((1, 5, 10, 10), (7, 5, 3, 2), dict(pads=(1, 0, 0, 1))),
    "dilation2": ((1, 6, 12, 12), (10, 6, 3, 3), dict(dilations=(2, 2), pads=(2, 2, 2, 2))),
    "dilation2_s2": ((1, 6, 13, 13), (10, 6, 3, 3), dict(dilations=(2, 2), strides=(2, 2), pads=(1, 2, 1, 0))),
    "valid_3x3_s1": ((1, 7, 9, 12), (11, 7, 3, 3), {}),
    "stride_2x1": ((1, 4, 10, 10), (6, 4, 3, 3), dict(strides=(2, 1), pads=(1, 1, 1, 1))),
    "tiny_1x1_map": ((1, 64, 1, 1), (100, 64, 1, 1), {}),
    "tiny_3x3_on_1x1": ((1, 8, 1, 1), (5, 8, 3, 3), dict(pads=(1, 1, 1, 1))),
    "single_output_channel": ((1, 3, 5, 5), (1, 3, 3, 3), dict(pads=(1, 1, 1, 1))),
    "batch2_3x3": ((2, 5, 9, 9), (6, 5, 3, 3), dict(pads=(1, 1, 1, 1))),
    "batch2_dw": ((2, 5, 9, 9), (5, 1, 3, 3), dict(group=5, pads=(1, 1, 1, 1))),
    # small maps vectorized over output channels, with reduction chunks through the scratch partials
    "chanvec_chunked_batch2": ((2, 640, 5, 5), (600, 640, 1, 1), {}),
    "chanvec_3x3_groups_chunked": ((1, 80, 6, 6), (1200, 40, 3, 3), dict(group=2, pads=(1, 1, 1, 1))),
    "batch2_wino": ((2, 16, 9, 9), (20, 16, 3, 3), dict(pads=(1, 1, 1, 1))),
    "chanvec_3x3s2_asym": ((1, 24, 9, 9), (48, 24, 3, 3), dict(strides=(2, 2), pads=(1, 0, 1, 2))),
    "direct_chunked": ((1, 400, 9, 9), (40, 400, 1, 1), {}),
    "direct_copied_edge": ((1, 72, 19, 19), (24, 72, 1, 1), {}),
    # a large map: 6 x 4 tiles at 16 lanes (3420 pixels: a 28-pixel edge panel; 28 rows: a 4-row edge block)
    "wide_3x3s2_edges": ((1, 5, 120, 114), (28, 5, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1))),
}


def _data(x_shape, w_shape, attrs, residual: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    fan_in = int(np.prod(w_shape[1:]))
    w = (rng.standard_normal(w_shape) / np.sqrt(fan_in)).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) * 0.1
    s, p, d = attrs.get("strides", (1, 1)), attrs.get("pads", (0, 0, 0, 0)), attrs.get("dilations", (1, 1))
    out_shape = (x_shape[0], w_shape[0], conv_out_dim(x_shape[2], w_shape[2], s[0], p[0] + p[2], d[0]),
                 conv_out_dim(x_shape[3], w_shape[3], s[1], p[1] + p[3], d[1]))
    res = rng.standard_normal(out_shape).astype(np.float32) if residual else None
    return x, w, b, res, out_shape


def _run_and_check(x_shape, w_shape, attrs, *, activation="relu", params=(), residual=False,
                   threads=(1, 2, 3), vector_width=VW, misalign=False, split="") -> None:
    x, w, b, res, out_shape = _data(x_shape, w_shape, attrs, residual)
    kern = conv_kernel(x_shape, w, b, activation=activation, params=params, residual=residual,
                       vector_width=vector_width, misalign=misalign, split=split, **attrs)
    ref = conv_ref(x, w, b, attrs.get("strides", (1, 1)), attrs.get("pads", (0, 0, 0, 0)),
                   attrs.get("dilations", (1, 1)), attrs.get("group", 1), res, activation, params)
    for nt in threads:
        out, whole = guarded(out_shape)
        kern(out, x, res, nthreads=nt)
        assert guards_intact(whole), f"write outside the output at nthreads={nt}"
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=f"nthreads={nt}")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_conv_configs(name: str) -> None:
    x_shape, w_shape, attrs = CONFIGS[name]
    _run_and_check(x_shape, w_shape, attrs, residual=name.endswith(("_56", "_7x7", "dw", "g4", "2_3x3", "chunked", "batch2", "asym",
                                                                    "edges")))


@pytest.mark.parametrize("name", ["resnet_3x3_28", "resnet_conv1_7x7s2", "squeeze_1x1_M1000", "direct_chunked",
                                  "resnet_3x3_7x7", "chanvec_chunked_batch2", "chanvec_3x3_groups_chunked",
                                  "alex_g2_5x5"])
def test_chunked_reduction(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny cache budgets force many reduction chunks (partial sums through out / scratch)."""
    from glowpy.backends.cpu.kernels import conv

    monkeypatch.setattr(conv, "L1_PANEL_BYTES", 2048)
    monkeypatch.setattr(conv, "L2_WEIGHT_BYTES", 16384)
    x_shape, w_shape, attrs = CONFIGS[name]
    _run_and_check(x_shape, w_shape, attrs, residual=True, activation="tanh", threads=(1, 3))


WINO_3X3 = ["resnet_3x3_28", "resnet_3x3_7x7", "squeeze_3x3_13", "dense_3x3_to32", "batch2_wino"]


@pytest.mark.parametrize("name", WINO_3X3)
def test_3x3_without_winograd(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct (shifted-load / channel-vector) paths that Winograd otherwise takes over."""
    from glowpy.backends.cpu.kernels import conv

    monkeypatch.setattr(conv, "WINOGRAD", False)
    x_shape, w_shape, attrs = CONFIGS[name]
    _run_and_check(x_shape, w_shape, attrs, residual=True, threads=(1, 2))


# Winograd F(2x2, 3x3): odd output sizes (partial tiles), asymmetric and no padding, M not a multiple of
# the row block, tile counts around the panel width, batch 2
WINO = {
    "odd_13x13_M37": ((1, 19, 13, 13), (37, 19, 3, 3), dict(pads=(1, 1, 1, 1))),
    "valid_no_pad": ((1, 16, 12, 11), (24, 16, 3, 3), {}),
    "asym_pads": ((1, 17, 9, 10), (20, 17, 3, 3), dict(pads=(0, 2, 1, 0))),
    "tiles_exactly_32": ((1, 16, 16, 8), (16, 16, 3, 3), dict(pads=(1, 1, 1, 1))),
    "tiles_33": ((1, 16, 11, 12), (17, 16, 3, 3), dict(pads=(1, 1, 1, 1))),
    "tiny_2x2_out": ((1, 32, 4, 4), (16, 32, 3, 3), {}),
    "batch2": ((2, 20, 7, 7), (40, 20, 3, 3), dict(pads=(1, 1, 1, 1))),
    # dilated: d x d interleaved sub-maps of unequal sizes (13 = 7 + 6 rows at d = 2), padding d or none
    "dilated2_odd": ((1, 16, 13, 14), (20, 16, 3, 3), dict(pads=(2, 2, 2, 2), dilations=(2, 2))),
    "dilated3_valid": ((1, 18, 17, 16), (16, 18, 3, 3), dict(dilations=(3, 3))),
    "dilated4_batch2": ((2, 16, 12, 12), (24, 16, 3, 3), dict(pads=(4, 4, 4, 4), dilations=(4, 4))),
}


@pytest.mark.parametrize("name", list(WINO))
def test_winograd_shapes(name: str) -> None:
    from glowpy.backends.cpu.kernels.conv import _Geometry, use_winograd

    x_shape, w_shape, attrs = WINO[name]
    geo = _Geometry(x_shape, w_shape, (1, 1), attrs.get("pads", (0, 0, 0, 0)), attrs.get("dilations", (1, 1)), 1)
    assert use_winograd(geo)
    _run_and_check(x_shape, w_shape, attrs, residual=True, activation="leaky_relu", params=(0.2,))


@pytest.mark.parametrize("activation,params", [("none", ()), ("clip", (-0.5, 0.5)), ("sigmoid", ()), ("tanh", ())],
                         ids=["none", "clip", "sigmoid", "tanh"])
def test_winograd_activations(activation: str, params) -> None:
    _run_and_check(*WINO["odd_13x13_M37"][:2], WINO["odd_13x13_M37"][2], activation=activation, params=params,
                   residual=activation != "none", threads=(1, 2))


@pytest.mark.parametrize("vector_width", [8, 4])
@pytest.mark.parametrize("name", ["tiles_33", "dilated2_odd"])
def test_winograd_narrow_vectors(name: str, vector_width: int) -> None:
    _run_and_check(*WINO[name][:2], WINO[name][2], residual=True, threads=(1, 3), vector_width=vector_width)


ACTS = [("none", ()), ("relu", ()), ("clip", (-0.5, 0.7)), ("leaky_relu", (0.1,)), ("sigmoid", ()), ("tanh", ())]


@pytest.mark.parametrize("residual", [False, True], ids=["nores", "res"])
@pytest.mark.parametrize("activation,params", ACTS, ids=[a for a, _ in ACTS])
def test_conv_activations(activation: str, params, residual: bool) -> None:
    _run_and_check((1, 9, 11, 11), (20, 9, 3, 3), dict(pads=(1, 1, 1, 1)), activation=activation, params=params,
                   residual=residual, threads=(1, 2))


@pytest.mark.parametrize("activation,params", [("tanh", ()), ("clip", (0.0, 6.0))], ids=["tanh", "clip"])
def test_depthwise_activations(activation: str, params) -> None:
    _run_and_check((1, 10, 9, 9), (10, 1, 3, 3), dict(group=10, pads=(1, 1, 1, 1)), activation=activation,
                   params=params, residual=True, threads=(1, 2))


def test_extreme_inputs_saturate_sigmoid_tanh() -> None:
    """exp's range reduction clamps: huge pre-activations give exactly 0/1 and -1/1, never NaN."""
    x = np.array([-200, -90, -20, -1e-3, 0, 1e-6, 20, 90, 200], np.float32).reshape(1, 1, 1, 9)
    w = np.ones((1, 1, 1, 1), np.float32)
    b = np.zeros(1, np.float32)
    for act, fn in (("sigmoid", lambda v: 1 / (1 + np.exp(-v.astype(np.float64)))), ("tanh", np.tanh)):
        kern = conv_kernel(x.shape, w, b, activation=act)
        out = np.empty_like(x)
        kern(out, x)
        np.testing.assert_allclose(out, fn(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vector_width", [8, 4])
@pytest.mark.parametrize("name", ["resnet_3x3s2", "squeeze_3x3_13", "shuffle_dw", "asym_pads", "incep_1x1_6x6",
                                  "chanvec_3x3s2_asym"])
def test_narrow_vectors(name: str, vector_width: int) -> None:
    x_shape, w_shape, attrs = CONFIGS[name]
    _run_and_check(x_shape, w_shape, attrs, residual=True, threads=(1, 3), vector_width=vector_width)


@pytest.mark.parametrize("name", ["resnet_3x3_28", "resnet_conv1_7x7s2", "shuffle_dw", "resnet_1x1_56"])
def test_misaligned_buffers(name: str) -> None:
    """Packed weights and scratch 4 bytes off a cache line: the kernel assumes no alignment."""
    x_shape, w_shape, attrs = CONFIGS[name]
    _run_and_check(x_shape, w_shape, attrs, threads=(1, 2), misalign=True)


def test_more_threads_than_work() -> None:
    _run_and_check((1, 4, 3, 3), (5, 4, 1, 1), {}, threads=(1, 7, 16))


@pytest.mark.parametrize("name,chunked", [("resnet_3x3_28", False), ("asym_pads", True), ("shuffle_dw", False),
                                          ("chanvec_chunked_batch2", True), ("resnet_1x1_56", True)])
def test_in_place_residual(name: str, chunked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """out may be the residual buffer itself (a memory plan's in-place add), chunked reductions included."""
    from glowpy.backends.cpu.kernels import conv

    if chunked:
        monkeypatch.setattr(conv, "L1_PANEL_BYTES", 2048)
        monkeypatch.setattr(conv, "L2_WEIGHT_BYTES", 16384)
    x_shape, w_shape, attrs = CONFIGS[name]
    x, w, b, res, out_shape = _data(x_shape, w_shape, attrs, residual=True)
    kern = conv_kernel(x_shape, w, b, activation="relu", residual=True, **attrs)
    ref = conv_ref(x, w, b, attrs.get("strides", (1, 1)), attrs.get("pads", (0, 0, 0, 0)), (1, 1),
                   attrs.get("group", 1), res, "relu")
    for nt in (1, 2):
        buf = res.copy()
        kern(buf, x, buf, nthreads=nt)
        np.testing.assert_allclose(buf, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["resnet_3x3_28", "resnet_conv1_7x7s2", "resnet_1x1_7x7_bigK", "shuffle_dw",
                                  "alex_g2_5x5"])
def test_pack_conv2d_matches_the_generator(name: str) -> None:
    """pack_conv2d gives exactly the packed arrays of emit_conv2d (Winograd, channel, pixel, depthwise)."""
    from llvmlite import ir

    from glowpy.backends.cpu.kernels.conv import emit_conv2d, pack_conv2d

    x_shape, w_shape, attrs = CONFIGS[name]
    x, w, b, _, _ = _data(x_shape, w_shape, attrs, residual=False)
    kw = dict(x_shape=x_shape, w=w, bias=b, strides=attrs.get("strides", (1, 1)),
              pads=attrs.get("pads", (0, 0, 0, 0)), dilations=attrs.get("dilations", (1, 1)),
              group=attrs.get("group", 1), activation="relu", activation_params=(), has_residual=True,
              vector_width=VW)
    info = emit_conv2d(ir.Module(), "k", **kw)
    packed = pack_conv2d(**kw)
    assert len(packed) == len(info.packed)
    for a, b_ in zip(packed, info.packed):
        assert np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b_).view(np.uint32))


def test_rejects_bad_shapes() -> None:
    w = np.ones((4, 3, 3, 3), np.float32)
    with pytest.raises(GlowpyError):
        conv_kernel((1, 5, 8, 8), w, np.zeros(4, np.float32))  # C != Cg * group
    with pytest.raises(GlowpyError):
        conv_kernel((1, 3, 8, 8), w, np.zeros(5, np.float32))  # bias length
    with pytest.raises(GlowpyError):
        conv_kernel((1, 3, 2, 2), w, np.zeros(4, np.float32))  # kernel larger than the input
    with pytest.raises(GlowpyError):
        conv_kernel((1, 3, 8, 8), w, np.zeros(4, np.float32), activation="gelu")
