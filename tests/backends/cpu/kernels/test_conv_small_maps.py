"""Small maps (P = OH*OW <= 300) on the channel-vector conv path: which layers take it, and its tiles,
edges, reduction chunks and epilogues against the float64 reference (AVX-512 and 8-lane widths)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import VW
from test_conv_kernel import _run_and_check

from glowpy.backends.cpu.kernels import conv


def _geometry(x_shape, w_shape, attrs):
    w = np.zeros(w_shape, np.float32)
    geo, _, _ = conv._prepare(x_shape, w, None, attrs.get("strides", (1, 1)), attrs.get("pads", (0, 0, 0, 0)),
                              attrs.get("dilations", (1, 1)), attrs.get("group", 1))
    return geo


@pytest.mark.parametrize("x_shape,w_shape,kind", [
    ((1, 1280, 8, 8), (320, 1280, 1, 1), "channel"),  # inception_v3 Mixed_7: weights far past L2
    ((1, 768, 17, 17), (192, 768, 1, 1), "channel"),  # Mixed_6 at 17x17: 289 pixels, 590 KB of weights
    ((1, 768, 17, 17), (128, 768, 1, 1), "pixel"),  # 393 KB of weights stay cached between pixel panels
    ((1, 96, 14, 14), (576, 96, 1, 1), "pixel"),  # short reduction: the scatters would cost more
    ((1, 512, 7, 7), (2048, 512, 1, 1), "channel"),
    ((1, 1024, 19, 19), (512, 1024, 1, 1), "pixel"),  # past CHANNEL_MAX_PIXELS
    ((1, 512, 7, 7), (4, 512, 1, 1), "pixel"),  # 4 channels would fill a half or quarter vector
])
@pytest.mark.parametrize("vw", [16, 8])
def test_small_map_selection(x_shape, w_shape, kind: str, vw: int) -> None:
    assert conv._kind(_geometry(x_shape, w_shape, {}), vw) == kind


def test_channel_tile_by_width() -> None:
    """AVX-512 direct 1x1 convs into 256+ channels take 6 pixels x 4 vectors, or 7 x 3 where 7-pixel blocks
    pad fewer pixels; packed pixels (strided) into 3+ vectors of channels 7 x 3, into fewer choose_tile's;
    AVX2 stays in 16 registers."""
    geo = _geometry((1, 512, 7, 7), (2048, 512, 1, 1), {})
    assert conv._channel_tile(geo, 16) == (7, 3)
    assert conv._channel_tile(_geometry((1, 512, 10, 10), (2048, 512, 1, 1), {}), 16) == (6, 4)
    pr, nv = conv._channel_tile(geo, 8)
    assert pr * nv + nv + 1 <= 16
    strided = _geometry((1, 512, 14, 14), (2048, 512, 1, 1), dict(strides=(2, 2)))
    assert conv._channel_tile(strided, 16) == (7, 3)
    narrow = _geometry((1, 512, 14, 14), (32, 512, 1, 1), dict(strides=(2, 2)))
    assert conv._channel_tile(narrow, 16) == conv.choose_tile(49, 16)
    assert conv._channel_tile(strided, 8) == conv.choose_tile(49, 8)


# id: (x_shape, w_shape, attrs); every one runs on the channel path (asserted)
CHANNEL_CASES = {
    # 7x3 tile: 49 pixels = 7 blocks, 300 channels = 6 panels + a 12-channel masked edge
    "direct_7x3_edges": ((1, 64, 7, 7), (300, 64, 1, 1), {}),
    # 6x4 tile: 100 pixels = 16 blocks + a 4-pixel edge, 300 channels = 4 panels + a 44-channel masked edge
    # (weights past CHANNEL_WEIGHT_BYTES: the channel path at 8 lanes too)
    "direct_6x4_edges": ((1, 448, 10, 10), (300, 448, 1, 1), {}),
    "direct_6x4_batch2": ((2, 40, 5, 5), (260, 40, 1, 1), {}),
    # packed pixels of every block: 3x3 on 6x6, groups and batch (the buffer is repacked per image and group)
    "packed_3x3_groups_batch2": ((2, 32, 6, 6), (280, 16, 3, 3), dict(group=2, pads=(1, 1, 1, 1))),
    "packed_1x1_stride2": ((1, 48, 13, 13), (272, 48, 1, 1), dict(strides=(2, 2))),
    # 17x17 with a 1x7 kernel (chosen with the weight budget lowered)
    "packed_1x7_17x17": ((1, 24, 17, 17), (200, 24, 1, 7), dict(pads=(0, 3, 0, 3))),
}


def _force_channel(monkeypatch: pytest.MonkeyPatch, name: str, vw: int) -> None:
    monkeypatch.setattr(conv, "WINOGRAD", False)
    monkeypatch.setattr(conv, "CHANNEL_WEIGHT_BYTES", 0)
    x_shape, w_shape, attrs = CHANNEL_CASES[name]
    assert conv._kind(_geometry(x_shape, w_shape, attrs), vw) == "channel"


@pytest.mark.parametrize("vw", sorted({VW, 8}))
@pytest.mark.parametrize("name", list(CHANNEL_CASES))
def test_channel_path(name: str, vw: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _force_channel(monkeypatch, name, vw)
    x_shape, w_shape, attrs = CHANNEL_CASES[name]
    _run_and_check(x_shape, w_shape, attrs, residual=True, activation="relu", threads=(1, 2, 3), vector_width=vw)


@pytest.mark.parametrize("name", ["direct_6x4_edges", "packed_3x3_groups_batch2", "packed_1x7_17x17"])
def test_channel_path_chunked(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny budget splits the reduction: partials in scratch, the pixel buffer repacked per chunk."""
    _force_channel(monkeypatch, name, VW)
    monkeypatch.setattr(conv, "L2_WEIGHT_BYTES", 65536)
    x_shape, w_shape, attrs = CHANNEL_CASES[name]
    geo = _geometry(x_shape, w_shape, attrs)
    pr, nv = conv._channel_tile(geo, VW)
    pblocks = -(-geo.P // pr)
    assert conv._channel_chunk(geo, nv * VW, geo.P if geo.direct else pblocks * 8) < geo.Cg
    _run_and_check(x_shape, w_shape, attrs, residual=True, activation="tanh", threads=(1, 3))
