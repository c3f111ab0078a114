"""Resize (opsets 10, 11, 13, 18, 19) and Upsample (7, 9) against onnx.reference, on every backend:
each mode, coordinate transformation and nearest mode; scales or sizes; axes; antialias;
keep_aspect_ratio_policy; exclude_outside; cubic_coeff_a; tf_crop_and_resize with extrapolation.
Resize-10 and Upsample are checked against onnxruntime: onnx.reference implements neither (it raises)."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy import pipeline
from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.target import isa_available
from glowpy.errors import InvalidModel, UnsupportedAttribute

from .util import Const, assert_same, check, expect_error, node_model, randn, rng, run_oracle

EMPTY = Const(np.zeros(0, dtype=np.float32))


def f32(*v):
    return Const(np.array(v, dtype=np.float32))


def i64(*v):
    return Const(np.array(v, dtype=np.int64))


X = randn(1, 2, 5, 6)

CASES = {
    # name: (opset, inputs after X, attrs)
    "nearest-up2": (19, [EMPTY, f32(1, 1, 2, 2)], {"mode": "nearest"}),
    "nearest-up-frac-floor": (13, [None, f32(1, 1, 1.7, 2.3)], {"mode": "nearest", "nearest_mode": "floor"}),
    "nearest-ceil-asym": (13, [None, f32(1, 1, 1.5, 0.6)], {"mode": "nearest", "nearest_mode": "ceil",
                                                            "coordinate_transformation_mode": "asymmetric"}),
    "nearest-prefer-ceil-align": (11, [EMPTY, f32(1, 1, 2.5, 1.5)], {
        "mode": "nearest", "nearest_mode": "round_prefer_ceil", "coordinate_transformation_mode": "align_corners"}),
    "nearest-down-sizes": (13, [None, None, i64(1, 2, 3, 4)], {"mode": "nearest"}),
    "linear-half-pixel-up": (19, [EMPTY, f32(1, 1, 2, 2)], {"mode": "linear"}),
    "linear-align-corners": (13, [None, None, i64(1, 2, 9, 13)], {
        "mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    "linear-pytorch-down": (13, [None, None, i64(1, 2, 3, 1)], {
        "mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}),
    "linear-asymmetric": (11, [EMPTY, f32(1, 1, 0.7, 1.8)], {
        "mode": "linear", "coordinate_transformation_mode": "asymmetric"}),
    "linear-symmetric": (19, [None, None, i64(1, 2, 7, 11)], {
        "mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}),
    "linear-antialias-down": (18, [None, f32(1, 1, 0.5, 0.4)], {"mode": "linear", "antialias": 1}),
    "cubic-up": (13, [None, f32(1, 1, 1.6, 2)], {"mode": "cubic"}),
    "cubic-a-exclude": (11, [EMPTY, f32(1, 1, 0.8, 1.4)], {"mode": "cubic", "cubic_coeff_a": -0.5,
                                                           "exclude_outside": 1}),
    "cubic-antialias-down": (18, [None, None, i64(1, 2, 2, 3)], {"mode": "cubic", "antialias": 1}),
    "crop-and-resize": (13, [f32(0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2), None, i64(1, 2, 4, 5)], {
        "mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 7.5}),
    "axes-scales": (18, [None, f32(3, 0.5)], {"mode": "linear", "axes": [3, 2]}),
    "axes-sizes-not-larger": (18, [None, None, i64(7, 7)], {
        "mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}),
    "sizes-not-smaller": (18, [None, None, i64(1, 2, 8, 8)], {"mode": "cubic",
                                                               "keep_aspect_ratio_policy": "not_smaller"}),
    "crop-axes": (18, [f32(0.3, 0.8), None, i64(6)], {
        "mode": "nearest", "axes": [3], "coordinate_transformation_mode": "tf_crop_and_resize"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_resize(backend, case):
    opset, rest, attrs = CASES[case]
    check(backend, "Resize", [X, *rest], opset=opset, attrs=attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_resize_dtypes(backend, dtype):
    check(backend, "Resize", [randn(1, 3, 4, 4, dtype=dtype), None, f32(1, 1, 2, 1.5)], opset=13,
          attrs={"mode": "linear"})


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32])
def test_resize_int_dtypes(backend, dtype):
    info = np.iinfo(dtype)
    x = rng(3).integers(max(info.min, -1000), min(info.max, 1000), (1, 2, 5, 6)).astype(dtype)
    check(backend, "Resize", [x, None, f32(1, 1, 1.5, 2.2)], opset=13, attrs={"mode": "linear"})
    if dtype == np.uint8:
        # cubic overshoots: the result saturates at 0 and 255. (onnx.reference computes cubic coefficients
        # in float32, so a wider type's values near .5 may round the other way: uint8 only.)
        check(backend, "Resize", [x, None, f32(1, 1, 2, 1.7)], opset=13, attrs={"mode": "cubic"})
    check(backend, "Resize", [x, None, f32(1, 1, 2, 3)], opset=13, attrs={"mode": "nearest"})


def test_resize_3d_and_batch_axis(backend):
    check(backend, "Resize", [randn(2, 3, 5), None, f32(1.5, 1, 2)], opset=13, attrs={"mode": "linear"})


def test_resize_big_bilinear(backend):
    # the segmenters' shape: a 1/8 map upsampled to the input, align_corners=False (half_pixel)
    check(backend, "Resize", [randn(1, 21, 17, 23), None, None, i64(1, 21, 130, 181)], opset=13,
          attrs={"mode": "linear"})


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(1, 1, 2, 3), (1, 1, 0.6, 0.5), (1, 1, 1.5, 2.5)])
def test_resize10_and_upsample(backend, mode, scales):
    # onnx.reference implements neither Resize-10 nor Upsample (it raises): onnxruntime is the oracle.
    s = f32(*scales)
    check(backend, "Resize", [X, s], opset=10, attrs={"mode": mode}, oracle="onnxruntime")
    if min(scales) >= 1:
        check(backend, "Upsample", [X, s], opset=9, attrs={"mode": mode}, oracle="onnxruntime")
        check(backend, "Upsample", [X], opset=7, attrs={"mode": mode, "scales": [float(v) for v in scales]},
              oracle="onnxruntime")


def test_resize_errors():
    expect_error(InvalidModel, "Resize", [X, None, f32(1, 1, 2, 2), i64(1, 2, 3, 3)], opset=13,
                 mentions=["exactly one of scales and sizes"])
    expect_error(InvalidModel, "Resize", [X, None, f32(2, 2)], opset=13, mentions=["one entry per axis"])
    expect_error(UnsupportedAttribute, "Resize", [X, None, f32(1, 1, 2, 2)], opset=13,
                 attrs={"mode": "area"}, mentions=["mode"])
    expect_error(UnsupportedAttribute, "Resize", [X, None, f32(1, 1, -2, 2)], opset=13, mentions=["positive"])


@pytest.mark.parametrize("isa", ["host", "avx2"])
def test_resize_vector_paths(isa):
    """Both kernel shapes (the H pass over contiguous rows, the W pass through the index table) with
    whole vectors and a masked tail, at both vector widths and on two threads, against the reference."""
    if isa == "avx2" and not isa_available("avx2"):
        pytest.skip("host without AVX2")  # the AVX-512 / host case above still runs
    for scales, attrs in (((1, 1, 2, 2), {"mode": "nearest"}), ((1, 1, 2.5, 3.3), {"mode": "linear"}),
                          ((1, 1, 1.7, 0.6), {"mode": "cubic", "coordinate_transformation_mode": "align_corners"})):
        model, feeds = node_model("Resize", [randn(2, 3, 9, 21), None, f32(*scales)], opset=13, attrs=attrs)
        want = run_oracle(model, feeds)[0]
        cm = CpuBackend().compile(pipeline.load(model), threads=2, isa=isa, cache=False)
        assert_same(f"Resize {attrs} on {isa}", cm.run([feeds["in0"]])[0], want)
