"""The depthwise Conv2D kernel (backends/cpu/kernels/depthwise.py) against a float64 convolution and the
interpreter: 3x3 / 5x5 / 7x7, strides 1, 2 and 3, dilation, asymmetric and zero padding, odd sizes,
maps smaller than a vector, batches, fused bias / residual / activation, at 1 and 3 threads, host ISA
and AVX2 (8 lanes), with NaN guards around the output."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import glowpy
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

sys.path.insert(0, str(Path(__file__).parent / "kernels"))
from kernel_harness import VW, conv_kernel, conv_out_dim, conv_ref, guarded, guards_intact  # noqa: E402

F32 = np.float32

# id: (x_shape, k, strides, pads, dilations)
CASES = {
    "3x3s1_112": ((1, 5, 112, 112), 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    "3x3s2_112": ((1, 6, 112, 112), 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    "3x3s2_odd": ((1, 7, 29, 31), 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    "3x3s1_7": ((2, 9, 7, 7), 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    "3x3s1_nopad": ((1, 4, 13, 19), 3, (1, 1), (0, 0, 0, 0), (1, 1)),
    "3x3s2_asym": ((1, 4, 16, 16), 3, (2, 2), (0, 0, 1, 1), (1, 1)),  # TF-style SAME
    "5x5s1_28": ((1, 6, 28, 28), 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    "5x5s2_27": ((1, 5, 27, 27), 5, (2, 2), (2, 2, 2, 2), (1, 1)),
    "5x5s1_14": ((1, 8, 14, 14), 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    "7x7s1_56": ((1, 3, 56, 56), 7, (1, 1), (3, 3, 3, 3), (1, 1)),
    "7x7s1_7": ((1, 10, 7, 7), 7, (1, 1), (3, 3, 3, 3), (1, 1)),
    "5x5s1_7_flat": ((2, 9, 7, 7), 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    "3x3s1_6x5_flat": ((1, 5, 6, 5), 3, (1, 1), (1, 0, 1, 2), (1, 1)),
    "3x3s1_dil2_flat": ((1, 5, 8, 8), 3, (1, 1), (2, 2, 2, 2), (2, 2)),
    "7x7s2_33": ((1, 3, 33, 33), 7, (2, 2), (3, 3, 3, 3), (1, 1)),
    "3x3s1_dil2": ((1, 4, 21, 23), 3, (1, 1), (2, 2, 2, 2), (2, 2)),
    "3x3s2_dil2": ((1, 3, 21, 23), 3, (2, 2), (2, 2, 2, 2), (2, 2)),
    "3x3s3": ((1, 3, 20, 26), 3, (3, 3), (1, 1, 1, 1), (1, 1)),
    "3x3_rect_s21": ((1, 3, 17, 18), 3, (2, 1), (1, 1, 1, 1), (1, 1)),
    "3x3s1_w1": ((1, 4, 9, 1), 3, (1, 1), (1, 1, 1, 1), (1, 1)),
}


def _data(x_shape, k, strides, pads, dilations, seed=0):
    rng = np.random.default_rng(seed)
    c = x_shape[1]
    x = rng.standard_normal(x_shape).astype(F32)
    w = (rng.standard_normal((c, 1, k, k)) / k).astype(F32)
    b = (rng.standard_normal(c) * 0.1).astype(F32)
    out_shape = (x_shape[0], c, conv_out_dim(x_shape[2], k, strides[0], pads[0] + pads[2], dilations[0]),
                 conv_out_dim(x_shape[3], k, strides[1], pads[1] + pads[3], dilations[1]))
    res = rng.standard_normal(out_shape).astype(F32)
    return x, w, b, res, out_shape


@pytest.mark.parametrize("vw", sorted({VW, 8}))
@pytest.mark.parametrize("name", list(CASES))
def test_kernel_against_float64_reference(name: str, vw: int) -> None:
    x_shape, k, strides, pads, dil = CASES[name]
    x, w, b, res, out_shape = _data(x_shape, k, strides, pads, dil)
    residual = list(CASES).index(name) % 2 == 0
    act, params = ("clip", (-0.5, 0.8)) if residual else ("relu", ())
    kern = conv_kernel(x_shape, w, b, strides=strides, pads=pads, dilations=dil, group=x_shape[1], activation=act,
                       params=params, residual=residual, vector_width=vw)
    ref = conv_ref(x, w, b, strides, pads, dil, x_shape[1], res if residual else None, act, params)
    for nt in (1, 3):
        out, whole = guarded(out_shape)
        kern(out, x, res if residual else None, nthreads=nt)
        assert guards_intact(whole), f"write outside the output at nthreads={nt}"
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=f"nthreads={nt}")


def test_residual_in_place() -> None:
    """out may be the residual buffer itself (the in-place residual add)."""
    x_shape, k, strides, pads, dil = CASES["3x3s2_odd"]
    x, w, b, res, out_shape = _data(x_shape, k, strides, pads, dil, seed=3)
    kern = conv_kernel(x_shape, w, b, strides=strides, pads=pads, dilations=dil, group=x_shape[1],
                       activation="none", residual=True)
    ref = conv_ref(x, w, b, strides, pads, dil, x_shape[1], res)
    buf = res.copy()
    kern(buf, x, buf, nthreads=2)
    np.testing.assert_allclose(buf, ref, rtol=1e-4, atol=1e-4)


def _graph(x_shape, k, strides, pads, dil, activation: str, params=()) -> tuple[Graph, list[np.ndarray]]:
    x, w, b, res, out_shape = _data(x_shape, k, strides, pads, dil, seed=5)
    g = Graph("dw")
    xi = g.add_input("x", TensorType(F32, x_shape))
    ri = g.add_input("r", TensorType(F32, out_shape))
    attrs = {"strides": strides, "pads": pads, "dilations": dil, "group": x_shape[1], "activation": activation,
             "activation_params": params}
    y = g.add_node("Conv", [xi, g.add_constant("w", w), g.add_constant("b", b), ri], attrs, name="dw").outputs[0]
    g.outputs = [y]
    return g, [x, res]


@pytest.mark.parametrize("isa", [None, "avx2"])
@pytest.mark.parametrize("name,activation,params", [("5x5s2_27", "swish", (1.0,)), ("3x3s1_7", "hard_swish", ()),
                                                    ("7x7s1_56", "sigmoid", ())])
def test_fused_conv_matches_interpreter(name: str, activation: str, params, isa) -> None:
    """The whole backend (the fused Conv node with a residual and an activation) against the interpreter."""
    g, feeds = _graph(*CASES[name], activation, params)
    opts = {"isa": isa} if isa else {}
    got = glowpy.compile(g, backend="cpu", threads=2, cache=False, optimize=False, **opts).run(
        dict(zip(("x", "r"), feeds)))
    want = glowpy.compile(g, backend="interpreter", optimize=False).run(dict(zip(("x", "r"), feeds)))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=f"{name} {activation} {isa}")


def test_small_maps_take_the_flat_path() -> None:
    """The cases above cover both paths: 7x7 maps without residual at 16 lanes run flat, others by rows."""
    from glowpy.backends.cpu.kernels.conv import _Geometry
    from glowpy.backends.cpu.kernels.depthwise import _Plan

    def plan(name: str, vw: int, residual: bool) -> _Plan:
        x_shape, k, strides, pads, dil = CASES[name]
        geo = _Geometry(x_shape, (x_shape[1], 1, k, k), strides, pads, dil, x_shape[1])
        return _Plan(geo, vw, residual)

    assert plan("5x5s1_7_flat", 16, False).flat and plan("3x3s1_dil2_flat", 16, False).flat
    assert not plan("5x5s1_7_flat", 8, False).flat and not plan("5x5s1_7_flat", 16, True).flat
    assert not plan("3x3s1_112", 16, False).flat


# Stems: 3x3 convs over <= 4 input channels per group take the same direct kernel (x_shape, M, group,
# strides, pads); group 2 has 3 output planes per group, so thread ranges start inside a group.
STEMS = {
    "stem_s2": ((1, 3, 40, 37), 8, 1, (2, 2), (1, 1, 1, 1)),
    "stem_s1_batch": ((2, 3, 19, 33), 5, 1, (1, 1), (1, 1, 1, 1)),
    "grouped_cg2": ((1, 4, 21, 35), 6, 2, (2, 2), (0, 1, 1, 0)),
}


@pytest.mark.parametrize("vw", sorted({VW, 8}))
@pytest.mark.parametrize("name", list(STEMS))
def test_small_channel_convs_against_float64_reference(name: str, vw: int) -> None:
    from glowpy.backends.cpu.kernels.conv import _Geometry, _kind

    x_shape, m, group, strides, pads = STEMS[name]
    rng = np.random.default_rng(7)
    x = rng.standard_normal(x_shape).astype(F32)
    w = (rng.standard_normal((m, x_shape[1] // group, 3, 3)) / 3).astype(F32)
    b = (rng.standard_normal(m) * 0.1).astype(F32)
    geo = _Geometry(x_shape, w.shape, strides, pads, (1, 1), group)
    assert _kind(geo, vw) == "depthwise"
    kern = conv_kernel(x_shape, w, b, strides=strides, pads=pads, group=group, activation="swish", params=(1.0,),
                       vector_width=vw)
    ref = conv_ref(x, w, b, strides, pads, (1, 1), group)
    ref = ref / (1 + np.exp(-ref))
    for nt in (1, 2, 4):
        out, whole = guarded((x_shape[0], m, geo.OH, geo.OW))
        kern(out, x, None, nthreads=nt)
        assert guards_intact(whole), f"write outside the output at nthreads={nt}"
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=f"nthreads={nt}")


def test_wide_stems_stay_on_the_gemm() -> None:
    """3 -> 64 (SqueezeNet's stem) rereads the scratch too often: the GEMM path keeps it."""
    from glowpy.backends.cpu.kernels.conv import _Geometry, _kind

    assert _kind(_Geometry((1, 3, 224, 224), (64, 3, 3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1), 16) != "depthwise"
    assert _kind(_Geometry((1, 3, 224, 224), (32, 3, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1), 16) == "depthwise"


def _inverted_residual(hw: int, c: int = 8, expand: int = 6) -> tuple[Graph, dict]:
    """MobileNet-v2's block: 1x1 expansion (pixel path) -> depthwise 3x3 -> 1x1 projection."""
    rng = np.random.default_rng(7)
    g = Graph("ir")
    x = g.add_input("x", TensorType(F32, (1, c, hw, hw)))

    def conv(name, inp, cout, cin, k, group):
        w = g.add_constant(f"{name}.w", (rng.standard_normal((cout, cin // group, k, k)) / k).astype(F32))
        b = g.add_constant(f"{name}.b", (rng.standard_normal(cout) * 0.1).astype(F32))
        attrs = {"strides": (1, 1), "pads": (k // 2,) * 4, "dilations": (1, 1), "group": group,
                 "activation": "relu", "activation_params": ()}
        return g.add_node("Conv", [inp, w, b], attrs, name=name).outputs[0]

    e = conv("expand", x, c * expand, c, 1, 1)
    d = conv("dw", e, c * expand, c * expand, 3, c * expand)
    g.outputs = [conv("project", d, c, c * expand, 1, 1)]
    return g, {"x": rng.standard_normal((1, c, hw, hw)).astype(F32)}


@pytest.mark.parametrize("hw,expand_split,dw_split", [(56, "", "pixels"), (14, "channels", "")])
def test_neighbours_split_alike(hw: int, expand_split: str, dw_split: str) -> None:
    """At 2 threads the depthwise conv after a pixel-path conv splits its rows on large maps (each band read
    where it was written), and on small ones the pixel-path conv before it splits by channels (the
    depthwise conv's planes); at 1 thread neither changes. Both against the interpreter."""
    from glowpy.backends.cpu import select

    g, feeds = _inverted_residual(hw)
    expand, dw = g.nodes[0], g.nodes[1]

    class Low:
        nthreads, fast_kernels, vector_width = 2, True, VW

    def split(node, nthreads=2):
        Low.nthreads = nthreads
        return select._split_like_neighbours(Low, node, node.inputs[0], select.Epilogue.of(node))

    assert conv_kind(expand) == "pixel"
    assert (split(expand), split(dw)) == (expand_split, dw_split)
    assert (split(expand, 1), split(dw, 1)) == ("", "")
    want = glowpy.compile(g, backend="interpreter", optimize=False).run(feeds)
    for nt in (1, 2, 3):
        got = glowpy.compile(g, backend="cpu", threads=nt, cache=False, optimize=False).run(feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4, err_msg=f"{hw}x{hw} threads={nt}")


def conv_kind(node) -> str:
    from glowpy.backends.cpu.kernels import conv

    a = node.attrs
    geo = conv._Geometry(node.inputs[0].shape, node.inputs[1].shape, a["strides"], a["pads"], a["dilations"],
                         a["group"])
    return conv._kind(geo, VW)
