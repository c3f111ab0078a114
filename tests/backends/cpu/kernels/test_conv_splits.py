"""How the direct conv paths split their work across threads, against the float64 reference at 1, 2 and 3
threads: the pixel path balanced by cost where the last pixel panel is narrower, or split by channels; the
channel path split by channel panels (balanced by cost) or by pixel blocks (each thread packing only its
blocks); depthwise convs split by planes or by bands of rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_harness import VW
from test_conv_kernel import _run_and_check

from glowpy.backends.cpu.kernels import conv


def _geometry(x_shape, w_shape, attrs):
    geo, _, _ = conv._prepare(x_shape, np.zeros(w_shape, np.float32), None, attrs.get("strides", (1, 1)),
                              attrs.get("pads", (0, 0, 0, 0)), (1, 1), attrs.get("group", 1))
    return geo


def _narrow_edge(geo, vw: int) -> bool:
    """Whether the pixel path's last panel has fewer vectors than the others (the cost-balanced split)."""
    _, nv = conv.choose_tile(geo.Mg, vw)
    edge = geo.P % (nv * vw)
    return geo.P > nv * vw and 0 < edge and math.ceil(edge / vw) < nv


# id: (x_shape, w_shape, attrs), all on the pixel path with a last panel narrower than the others at 16 lanes
# (13x13 = 169 = 5 x 32 + 9) or at 8 (9x9 = 81 = 5 x 16 + 1)
PIXEL_EDGE_CASES = {
    "squeeze_13x13_1x1": ((1, 40, 13, 13), (48, 40, 1, 1), {}),
    "groups_batch2_13x13": ((2, 24, 13, 13), (40, 12, 1, 1), dict(group=2)),
    "phase_planes_s2": ((1, 16, 27, 27), (24, 16, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    "shifted_1x7_9x9": ((1, 12, 9, 9), (20, 12, 1, 7), dict(pads=(0, 3, 0, 3))),
    "batch3_9x9": ((3, 20, 9, 9), (24, 20, 1, 1), {}),
}


@pytest.mark.parametrize("vw", sorted({VW, 8}))
def test_pixel_cases_have_narrow_edges(vw: int) -> None:
    """The cases below reach the cost-balanced split at both widths (else they would test nothing new)."""
    geos = [_geometry(*case) for case in PIXEL_EDGE_CASES.values()]
    assert all(conv._kind(g, vw) == "pixel" for g in geos)
    assert sum(_narrow_edge(g, vw) for g in geos) >= 2


@pytest.mark.parametrize("vw", sorted({VW, 8}))
@pytest.mark.parametrize("name", list(PIXEL_EDGE_CASES))
def test_pixel_split_by_cost(name: str, vw: int) -> None:
    x_shape, w_shape, attrs = PIXEL_EDGE_CASES[name]
    _run_and_check(x_shape, w_shape, attrs, residual=True, activation="relu", threads=(1, 2, 3), vector_width=vw)


def test_pixel_split_by_cost_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partial sums through out: a unit run by two threads, or by none, would show."""
    monkeypatch.setattr(conv, "L1_PANEL_BYTES", 512)
    x_shape, w_shape, attrs = PIXEL_EDGE_CASES["groups_batch2_13x13"]
    assert conv.chunk_channels(12, 1, 32, 48) < 12
    _run_and_check(x_shape, w_shape, attrs, residual=True, activation="tanh", threads=(1, 2, 3), vector_width=16)


def test_pixel_split_more_threads_than_panels() -> None:
    _run_and_check((1, 8, 5, 7), (10, 8, 1, 1), {}, threads=(2, 3, 7), vector_width=16)


# id: (x_shape, w_shape, attrs), forced onto the channel path with packed pixels
CHANNEL_PACKED = {
    "1x7_17x17_groups_batch2": ((2, 24, 17, 17), (96, 12, 1, 7), dict(group=2, pads=(0, 3, 0, 3))),
    "3x3s2_35x35": ((1, 16, 35, 35), (64, 16, 3, 3), dict(strides=(2, 2))),
    "7x1_8x8_batch3": ((3, 20, 8, 8), (48, 20, 7, 1), dict(pads=(3, 0, 3, 0))),
}


@pytest.mark.parametrize("vw", sorted({VW, 8}))
@pytest.mark.parametrize("by_pixels", [True, False])
@pytest.mark.parametrize("name", list(CHANNEL_PACKED))
def test_channel_split(name: str, by_pixels: bool, vw: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv, "WINOGRAD", False)
    monkeypatch.setattr(conv, "CHANNEL_WEIGHT_BYTES", 0)
    monkeypatch.setattr(conv, "PACK_COST", 1e9 if by_pixels else 0)
    x_shape, w_shape, attrs = CHANNEL_PACKED[name]
    geo = _geometry(x_shape, w_shape, attrs)
    assert conv._kind(geo, vw) == "channel"
    assert conv._split_by_pixels(geo, 1, 1) is by_pixels
    _run_and_check(x_shape, w_shape, attrs, residual=True, activation="relu", threads=(1, 2, 3), vector_width=vw)


@pytest.mark.parametrize("by_pixels", [True, False])
def test_channel_split_chunked(by_pixels: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reduction chunks: a thread's partials in scratch are indexed in its split's unit order."""
    monkeypatch.setattr(conv, "WINOGRAD", False)
    monkeypatch.setattr(conv, "CHANNEL_WEIGHT_BYTES", 0)
    monkeypatch.setattr(conv, "PACK_COST", 1e9 if by_pixels else 0)
    monkeypatch.setattr(conv, "L2_WEIGHT_BYTES", 65536)
    x_shape, w_shape, attrs = CHANNEL_PACKED["1x7_17x17_groups_batch2"]
    geo = _geometry(x_shape, w_shape, attrs)
    pr, nv = conv._channel_tile(geo, VW)
    assert conv._channel_chunk(geo, nv * VW, math.ceil(geo.P / pr) * 8) < geo.Cg
    _run_and_check(x_shape, w_shape, attrs, residual=True, activation="tanh", threads=(1, 2, 3))


@pytest.mark.parametrize("x_shape,w_shape,attrs,by_pixels", [
    # inception_v3's 17x17 1x7 / 7x1 (pixel blocks of 1.3 k-row floats against 192 weight floats) and its
    # stride-2 3x3 (gathers): split by pixels; its 8x8 3x3 (64 pixels, 384 channels): by channel panels
    ((1, 192, 17, 17), (192, 192, 1, 7), dict(pads=(0, 3, 0, 3)), True),
    ((1, 160, 17, 17), (160, 160, 7, 1), dict(pads=(3, 0, 3, 0)), True),
    ((1, 288, 35, 35), (384, 288, 3, 3), dict(strides=(2, 2)), True),
    ((1, 448, 8, 8), (384, 448, 3, 3), dict(pads=(1, 1, 1, 1)), False),
    ((1, 2048, 8, 8), (448, 2048, 1, 1), {}, False),  # direct 1x1: nothing packed
])
def test_channel_split_selection(x_shape, w_shape, attrs, by_pixels: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv, "WINOGRAD", False)  # the 8x8 3x3 goes to Winograd F(2x2) where that is on
    geo = _geometry(x_shape, w_shape, attrs)
    assert conv._kind(geo, 16) == "channel"
    pr, nv = conv._channel_tile(geo, 16)
    assert conv._split_by_pixels(geo, math.ceil(geo.P / pr) * 8, math.ceil(geo.Mg / (nv * 16)) * nv * 16) is by_pixels


# id: (x_shape, w_shape, attrs) of depthwise convs large enough to split by rows at both widths
DEPTHWISE_ROWS = {
    "3x3_s1_56x56_residual": ((1, 5, 56, 56), (5, 1, 3, 3), dict(group=5, pads=(1, 1, 1, 1))),
    "3x3_s2_57x57": ((2, 3, 113, 113), (3, 1, 3, 3), dict(group=3, strides=(2, 2), pads=(1, 1, 1, 1))),
    "5x5_s1_50x50_odd_pads": ((1, 4, 50, 50), (4, 1, 5, 5), dict(group=4, pads=(2, 1, 2, 3))),
    "3x3_dilated_52x52": ((1, 3, 52, 52), (3, 1, 3, 3), dict(group=3, pads=(2, 2, 2, 2), dilations=(2, 2))),
    "stem_3_to_16_s2": ((1, 3, 113, 113), (16, 3, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1))),
    "stem_groups_s1_residual": ((1, 4, 64, 64), (8, 2, 3, 3), dict(group=2, pads=(1, 1, 1, 1))),
}


@pytest.mark.parametrize("vw", sorted({VW, 8}))
@pytest.mark.parametrize("name", list(DEPTHWISE_ROWS))
def test_depthwise_split_by_rows(name: str, vw: int) -> None:
    """Each thread a band of row blocks of every plane, copying only the input rows it reads (for a stem,
    those of every input plane of the group): halo rows, padding and the shorter last block at 1, 2, 3 and
    7 threads (more threads than blocks: empty bands)."""
    x_shape, w_shape, attrs = DEPTHWISE_ROWS[name]
    geo = _geometry(x_shape, w_shape, attrs)
    assert conv.splits_rows(x_shape=x_shape, w_shape=w_shape, strides=attrs.get("strides", (1, 1)),
                            pads=attrs.get("pads", (0, 0, 0, 0)), dilations=attrs.get("dilations", (1, 1)),
                            group=geo.group, vector_width=vw, has_residual=True)
    _run_and_check(x_shape, w_shape, attrs, residual=name.endswith("residual"), activation="relu",
                   threads=(1, 2, 3, 7), vector_width=vw, split="pixels")


def test_depthwise_small_maps_split_by_planes() -> None:
    """Below ROW_SPLIT_MIN_PIXELS (and on the flat path) a depthwise conv splits planes even when asked for
    rows: a band of a small plane costs more than it keeps local."""
    for x_shape in ((1, 8, 14, 14), (1, 8, 7, 7)):
        assert not conv.splits_rows(x_shape=x_shape, w_shape=(8, 1, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                                    dilations=(1, 1), group=8, vector_width=16, has_residual=False)
        _run_and_check(x_shape, (8, 1, 3, 3), dict(group=8, pads=(1, 1, 1, 1)), threads=(1, 2), split="pixels")


@pytest.mark.parametrize("vw", sorted({VW, 8}))
@pytest.mark.parametrize("name", list(PIXEL_EDGE_CASES))
def test_pixel_split_by_channels(name: str, vw: int) -> None:
    """Each thread a range of row blocks of output channels over every pixel panel (the edge block, groups,
    batches, phase planes and reduction chunks through out)."""
    x_shape, w_shape, attrs = PIXEL_EDGE_CASES[name]
    _run_and_check(x_shape, w_shape, attrs, residual=True, activation="relu", threads=(1, 2, 3, 7),
                   vector_width=vw, split="channels")
