"""Panel-major activations between pixel-path convs (kernels/conv.py, PANEL LAYOUT): the kernel reading its
input, writing its output or reading its residual panel-major gives the float64 reference's result in that
layout, at 1, 2 and 3 threads, with edge panels, edge row blocks, reduction chunks and batches; and a conv
that cannot take the layout says so."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from kernel_harness import VW, conv_kernel, conv_ref, guarded, guards_intact
from test_conv_kernel import ATOL, RTOL, _data

from glowpy.backends.cpu.kernels import conv
from glowpy.errors import InternalError


def to_panels(a: np.ndarray, nr: int) -> np.ndarray:
    """NCHW -> panel-major, the same size: per image, per panel of nr pixels, its channel rows."""
    n, c = a.shape[:2]
    flat = a.reshape(n, c, -1)
    p = flat.shape[2]
    parts = [flat[:, :, b:b + nr].reshape(n, -1) for b in range(0, p, nr)]
    return np.concatenate(parts, axis=1).reshape(a.shape)


def from_panels(a: np.ndarray, nr: int) -> np.ndarray:
    n, c = a.shape[:2]
    p = math.prod(a.shape[2:])
    flat = a.reshape(n, -1)
    out = np.empty((n, c, p), a.dtype)
    at = 0
    for b in range(0, p, nr):
        w = min(nr, p - b)
        out[:, :, b:b + w] = flat[:, at:at + c * w].reshape(n, c, w)
        at += c * w
    return out.reshape(a.shape)


# id: (x_shape, w_shape): direct 1x1 convs on the pixel path. 56x56: ResNet's 6 x 4 tiles, a 4-row edge
# block; 13x13 and 19x19: edge panels narrower than a vector; batch 2; "chunked": several reduction chunks
# (partial sums through out) with a small panel budget
CASES = {
    "resnet_56": ((1, 64, 56, 56), (64, 64, 1, 1)),
    "edge_panel_13": ((1, 24, 13, 13), (40, 24, 1, 1)),
    "batch2_19": ((2, 48, 19, 19), (56, 48, 1, 1)),
    "chunked_17": ((1, 70, 17, 17), (24, 70, 1, 1)),
}
CHUNKED_PANEL_BYTES = 4096


def _width(x_shape, w_shape, vw: int) -> int:
    return conv.reads_panels(x_shape=x_shape, w_shape=w_shape, strides=(1, 1), pads=(0, 0, 0, 0),
                             dilations=(1, 1), group=1, vector_width=vw)


def test_layout_round_trip() -> None:
    a = np.arange(2 * 3 * 5 * 7, dtype=np.float32).reshape(2, 3, 5, 7)
    p = to_panels(a, 16)
    assert p[0].ravel()[:16].tolist() == a[0, 0].ravel()[:16].tolist()  # panel 0, channel 0
    assert p[0].ravel()[16:32].tolist() == a[0, 1].ravel()[:16].tolist()  # panel 0, channel 1
    np.testing.assert_array_equal(from_panels(p, 16), a)


@pytest.mark.parametrize("vw", sorted({VW, 8}))
@pytest.mark.parametrize("roles", [r for r in itertools.product([False, True], repeat=3) if any(r)])
@pytest.mark.parametrize("name", list(CASES))
def test_panel_major_operands(name: str, roles, vw: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A direct 1x1 conv with x, out and the residual each NCHW or panel-major in its own panel width."""
    x_shape, w_shape = CASES[name]
    nr = _width(x_shape, w_shape, vw)
    assert nr, "every case runs on the pixel path"
    if name == "chunked_17":
        monkeypatch.setattr(conv, "L1_PANEL_BYTES", CHUNKED_PANEL_BYTES)
        assert conv.chunk_channels(x_shape[1], 1, nr, w_shape[0]) < x_shape[1]
    _check(x_shape, w_shape, {}, tuple(nr if r else 0 for r in roles), vw)


def _check(x_shape, w_shape, attrs, widths, vw: int, threads=(1, 2, 3)) -> None:
    """The kernel with x, out and the residual in panels of `widths` (0: NCHW) against the reference."""
    x, w, b, res, out_shape = _data(x_shape, w_shape, attrs, residual=True)
    ref = conv_ref(x, w, b, attrs.get("strides", (1, 1)), attrs.get("pads", (0, 0, 0, 0)), (1, 1), 1, res,
                   "relu", ())
    kern = conv_kernel(x_shape, w, b, activation="relu", residual=True, vector_width=vw, panels=widths, **attrs)
    xw, ow, rw = widths
    x_in = to_panels(x, xw) if xw else x
    res_in = to_panels(res, rw) if rw else res
    for nt in threads:
        out, whole = guarded(out_shape)
        kern(out, x_in, res_in, nthreads=nt)
        assert guards_intact(whole), f"write outside the output at nthreads={nt}"
        got = from_panels(out, ow) if ow else out
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL, err_msg=f"nthreads={nt}")


# id: (x_shape, w_shape, attrs, widths at 16 lanes, widths at 8): convs that pack their input by gathers
# reading it panel-major in another conv's width (with edge panels: 28x28 in 32s, 14x14 in 48s and 32s), and
# writing or reading out and the residual in a width other than their own panels' (ResNet-50's stride-2
# 3x3 and 1x1 convs to 28x28: panels of 48 pixels, read by 1x1 convs of 32)
GATHERED = {
    "pixel_1x1s2_56": ((1, 32, 56, 56), (48, 32, 1, 1), dict(strides=(2, 2)), (64, 32, 32), (16, 24, 24)),
    "pixel_3x3s2_edge": ((1, 16, 28, 28), (24, 16, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1)),
                         (32, 16, 48), (24, 8, 40)),
    "channel_1x1s2_14": ((1, 40, 14, 14), (64, 40, 1, 1), dict(strides=(2, 2)), (48, 0, 0), (24, 0, 0)),
    "channel_3x3s2_14": ((1, 24, 14, 14), (48, 24, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1)),
                         (32, 0, 0), (40, 0, 0)),
}


@pytest.mark.parametrize("vw", sorted({VW, 8}))
@pytest.mark.parametrize("name", list(GATHERED))
def test_gathered_and_foreign_widths(name: str, vw: int) -> None:
    x_shape, w_shape, attrs, w16, w8 = GATHERED[name]
    geo = conv._Geometry(x_shape, w_shape, attrs.get("strides", (1, 1)), attrs.get("pads", (0, 0, 0, 0)),
                         (1, 1), 1)
    assert conv.reads_panels(x_shape=x_shape, w_shape=w_shape, strides=attrs.get("strides", (1, 1)),
                             pads=attrs.get("pads", (0, 0, 0, 0)), dilations=(1, 1), group=1, vector_width=vw) == -1
    widths = w16 if vw == 16 else w8
    if widths[1]:
        assert conv._kind(geo, vw) == "pixel" and conv._panel_width(geo, vw) != widths[1]
    elif vw == 16:  # at 8 lanes the smallest maps go to the pixel path
        assert conv._kind(geo, vw) == "channel"
    _check(x_shape, w_shape, attrs, widths, vw)


def test_in_place_residual_in_panels() -> None:
    """out over its residual, both panel-major: every residual element is read before it is overwritten."""
    x_shape, w_shape = CASES["edge_panel_13"]
    nr = _width(x_shape, w_shape, VW)
    x, w, b, res, out_shape = _data(x_shape, w_shape, {}, residual=True)
    ref = conv_ref(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1), 1, res, "relu", ())
    kern = conv_kernel(x_shape, w, b, activation="relu", residual=True, panels=(0, nr, nr))
    for nt in (1, 2):
        buf = to_panels(res, nr).copy()
        kern(buf, x, buf, nthreads=nt)
        np.testing.assert_allclose(from_panels(buf, nr), ref, rtol=RTOL, atol=ATOL, err_msg=f"nthreads={nt}")


@pytest.mark.parametrize("x_shape, w_shape, attrs, panels", [
    ((1, 16, 12, 12), (24, 16, 3, 3), dict(pads=(1, 1, 1, 1)), (32, 0, 0)),  # Winograd gathers its own way
    ((1, 16, 12, 12), (24, 8, 1, 1), dict(group=2), (0, 32, 0)),  # grouped
    ((1, 256, 7, 7), (256, 256, 1, 1), {}, (0, 16, 0)),  # the channel path writes NCHW
    ((1, 16, 12, 12), (24, 16, 1, 1), {}, (0, 0, 32)),  # a residual it does not have
    ((1, 16, 64, 64), (24, 16, 1, 1), {}, (32, 0, 0)),  # a 1x1 conv reads its own width in place
    ((1, 16, 64, 64), (24, 16, 1, 1), {}, (0, 20, 0)),  # not whole vectors
])
def test_refuses_what_it_cannot_read(x_shape, w_shape, attrs, panels) -> None:
    w = np.zeros(w_shape, np.float32)
    with pytest.raises(InternalError, match="panel-major operand"):
        conv_kernel(x_shape, w, np.zeros(w_shape[0], np.float32), residual=False, panels=panels, **attrs)
