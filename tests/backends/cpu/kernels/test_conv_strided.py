"""The pixel-GEMM conv path for strided and width-changing convs (panels packed from phase planes) against
a float64 convolution and the interpreter: strides 2 and 3, kernels 1 / 3 / 5 / 7, odd sizes, asymmetric
padding, groups, dilation with stride, batch 2, several reduction chunks, 1-3 threads, AVX-512 and AVX2
widths, NaN guards around the output."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from kernel_harness import VW, conv_kernel, conv_ref, guarded, guards_intact

import glowpy
from glowpy.backends.cpu.kernels import conv
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

# id: (x_shape, w_shape, strides, pads, dilations, group)
CASES = {
    "k7s2_odd": ((1, 3, 37, 41), (20, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),
    "k7s2_asym": ((1, 3, 36, 35), (24, 3, 7, 7), (2, 2), (2, 3, 3, 1), (1, 1), 1),
    "k5s2": ((1, 6, 35, 33), (17, 6, 5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 1),
    "k5s3_asym": ((1, 5, 53, 50), (12, 5, 5, 5), (3, 3), (1, 2, 0, 2), (1, 1), 1),
    "k3s2_nopad": ((1, 3, 41, 39), (40, 3, 3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "k3s3": ((1, 7, 52, 61), (9, 7, 3, 3), (3, 3), (1, 1, 1, 1), (1, 1), 1),
    "k1s2": ((1, 24, 35, 37), (40, 24, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "k1s3": ((1, 16, 50, 52), (20, 16, 1, 1), (3, 3), (0, 0, 0, 0), (1, 1), 1),
    "k3s2_groups": ((1, 18, 33, 35), (24, 6, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 3),
    "k5s2_groups_asym": ((1, 10, 31, 29), (12, 5, 5, 5), (2, 2), (2, 1, 1, 2), (1, 1), 2),
    "k3s2_dil2": ((1, 6, 37, 35), (10, 6, 3, 3), (2, 2), (2, 1, 2, 3), (2, 2), 1),
    "k5s3_dil2": ((1, 5, 61, 58), (7, 5, 5, 5), (3, 3), (3, 4, 2, 4), (2, 3), 1),
    "batch2_k3s2": ((2, 5, 31, 33), (36, 5, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "batch2_groups_k7s2": ((2, 6, 30, 31), (8, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 2),
    "stride_1x2": ((1, 5, 20, 41), (10, 5, 3, 3), (1, 2), (1, 1, 1, 1), (1, 1), 1),
    "stride_3x1": ((1, 5, 61, 19), (10, 5, 3, 3), (3, 1), (1, 0, 1, 0), (1, 1), 1),
    "s1_valid": ((1, 7, 25, 23), (11, 7, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "s1_5x5_asym_width": ((1, 6, 22, 21), (9, 6, 5, 5), (1, 1), (2, 0, 2, 1), (1, 1), 1),
}
NARROW = ["k7s2_asym", "k3s3", "k1s2", "k5s2_groups_asym", "k5s3_dil2", "batch2_groups_k7s2", "stride_1x2"]


def _geometry(name: str) -> conv._Geometry:
    x_shape, w_shape, strides, pads, dil, group = CASES[name]
    return conv._Geometry(x_shape, w_shape, strides, pads, dil, group)


def _data(name: str, seed: int = 0):
    x_shape, w_shape, *_ = CASES[name]
    geo = _geometry(name)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = (rng.standard_normal(w_shape[0]) * 0.1).astype(np.float32)
    res = rng.standard_normal((geo.N, geo.M, geo.OH, geo.OW)).astype(np.float32)
    return x, w, b, res


def _check(name: str, *, vw: int, threads=(1, 2, 3), residual: bool = True, activation: str = "relu",
           params=()) -> None:
    x_shape, w_shape, strides, pads, dil, group = CASES[name]
    geo = _geometry(name)
    # the cases must exercise the phase-plane packing, not another path
    assert conv._kind(geo, vw) == "pixel" and not geo.direct and not geo.shift, name
    x, w, b, res = _data(name)
    res = res if residual else None
    kern = conv_kernel(x_shape, w, b, strides=strides, pads=pads, dilations=dil, group=group,
                       activation=activation, params=params, residual=residual, vector_width=vw)
    ref = conv_ref(x, w, b, strides, pads, dil, group, res, activation, params)
    for nt in threads:
        out, whole = guarded(ref.shape)
        kern(out, x, res, nthreads=nt)
        assert guards_intact(whole), f"write outside the output at nthreads={nt}"
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=f"{name} vw={vw} nthreads={nt}")


@pytest.mark.parametrize("name", list(CASES))
def test_strided_conv_host_width(name: str) -> None:
    _check(name, vw=VW, residual=list(CASES).index(name) % 2 == 0)


@pytest.mark.parametrize("vw", [8, 4])
@pytest.mark.parametrize("name", NARROW)
def test_strided_conv_narrow_vectors(name: str, vw: int) -> None:
    _check(name, vw=vw, threads=(1, 3), activation="clip", params=(-0.5, 0.7))


@pytest.mark.parametrize("name", ["k3s2_groups", "batch2_groups_k7s2", "k5s2", "k1s3"])
def test_many_reduction_chunks(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny budgets: one channel per chunk, so every chunk rebuilds the planes and sums through out."""
    monkeypatch.setattr(conv, "PHASE_PLANE_BYTES", 64)
    monkeypatch.setattr(conv, "L2_WEIGHT_BYTES", 16384)
    _check(name, vw=VW, threads=(1, 2, 3), activation="tanh")


@pytest.mark.parametrize("name", ["k7s2_odd", "k3s2_dil2", "batch2_k3s2", "stride_3x1"])
def test_bands_of_output_rows(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget of a few band rows: the planes are rebuilt as the panels move down the image."""
    monkeypatch.setattr(conv, "PHASE_PLANE_BYTES", 20000)
    geo = _geometry(name)
    mr, nv = conv.choose_tile(geo.Mg, VW)
    ph, _ = conv._PhasePlanes.for_panels(geo, nv * VW, -(-geo.Mg // mr) * mr)  # as the emitter asks
    assert ph.band < geo.OH, (ph.band, geo.OH)
    _check(name, vw=VW, threads=(1, 2, 3))


def test_in_place_residual_with_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv, "PHASE_PLANE_BYTES", 64)
    name = "batch2_k3s2"
    x_shape, w_shape, strides, pads, dil, group = CASES[name]
    x, w, b, res = _data(name, seed=2)
    kern = conv_kernel(x_shape, w, b, strides=strides, pads=pads, dilations=dil, group=group, activation="relu",
                       residual=True)
    ref = conv_ref(x, w, b, strides, pads, dil, group, res, "relu")
    for nt in (1, 2):
        buf = res.copy()
        kern(buf, x, buf, nthreads=nt)
        np.testing.assert_allclose(buf, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kh,kw,sh,sw,dh,dw", [(7, 7, 2, 2, 1, 1), (3, 5, 3, 2, 2, 1), (1, 1, 2, 3, 1, 1),
                                               (5, 3, 1, 2, 3, 2), (4, 2, 3, 3, 1, 2)])
def test_phase_plane_layout(kh: int, kw: int, sh: int, sw: int, dh: int, dw: int) -> None:
    """Planes filled by their definition for a band of output rows hold every tap of every pixel of the
    band at tap(kh, kw) + p - b0 * OW, padding as zeros, for many paddings, sizes and bands (the layout
    alone, no code generated)."""
    rng = np.random.default_rng(7)
    for h, w_, pt, pl, pb, pr in itertools.product((9, 14), (10, 13), (0, 2), (0, 3), (0, 1), (0, 2)):
        geo = conv._Geometry((1, 1, h, w_), (1, 1, kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw), 1)
        if geo.OH < 1 or geo.OW < 1:
            continue
        x = rng.standard_normal((h, w_))
        xp = np.zeros((h + pt + pb + kh * dh, w_ + pl + pr + kw * dw))
        xp[pt:pt + h, pl:pl + w_] = x
        for band in sorted({1, max(1, geo.OH // 2), geo.OH}):
            ph = conv._PhasePlanes(geo, band)
            for b0 in sorted({0, geo.OH - band}):
                planes = np.full(ph.channel, np.nan)
                for j in range(kw):
                    for py, qmin, rows, at in ph.segments:
                        for r in range(rows):
                            iy = (b0 + r + qmin) * sh + py
                            for ow in range(geo.OW):
                                ix = ow * sw + j * dw - pl
                                inside = 0 <= iy < h and 0 <= ix < w_
                                planes[j * ph.column + at + r * geo.OW + ow] = x[iy, ix] if inside else 0.0
                rows_ = slice(b0 * sh, (b0 + band) * sh, sh)
                for i in range(kh):
                    for j in range(kw):
                        want = xp[i * dh:, j * dw:][rows_, :sw * geo.OW:sw].ravel()
                        start = ph.tap(i, j)
                        np.testing.assert_array_equal(planes[start:start + band * geo.OW], want)


@pytest.mark.parametrize("budget", [64, 20000, 512 * 1024])
def test_bands_cover_a_panel_and_fit_the_budget(budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A band holds every row one panel touches; a chunk's planes fit PHASE_PLANE_BYTES unless even one
    channel's smallest band does not."""
    monkeypatch.setattr(conv, "PHASE_PLANE_BYTES", budget)
    for name in CASES:
        geo = _geometry(name)
        for nr in (16, 32, 48, 64):
            ph, cc = conv._PhasePlanes.for_panels(geo, nr, 64)
            span = min(geo.OH, (nr - 1) // geo.OW + 2)
            assert span <= ph.band <= geo.OH and 1 <= cc <= geo.Cg
            assert cc * ph.channel * 4 <= budget or (cc == 1 and ph.band == span), (name, nr)


def _graph(name: str) -> tuple[Graph, dict]:
    x_shape, w_shape, strides, pads, dil, group = CASES[name]
    x, w, b, res = _data(name, seed=5)
    g = Graph("strided")
    xi = g.add_input("x", TensorType(np.float32, x_shape))
    ri = g.add_input("r", TensorType(np.float32, res.shape))
    attrs = {"strides": strides, "pads": pads, "dilations": dil, "group": group, "activation": "relu",
             "activation_params": ()}
    y = g.add_node("Conv", [xi, g.add_constant("w", w), g.add_constant("b", b), ri], attrs, name="conv").outputs[0]
    g.outputs = [y]
    return g, {"x": x, "r": res}


@pytest.mark.parametrize("isa", [None, "avx2"])
@pytest.mark.parametrize("name", ["k7s2_odd", "batch2_groups_k7s2", "k5s3_dil2"])
def test_fused_conv_matches_interpreter(name: str, isa) -> None:
    g, feeds = _graph(name)
    opts = {"isa": isa} if isa else {}
    got = glowpy.compile(g, backend="cpu", threads=2, cache=False, optimize=False, **opts).run(feeds)
    want = glowpy.compile(g, backend="interpreter", optimize=False).run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=f"{name} {isa}")

