"""GridSample (opsets 16, 20, 22), AffineGrid (20) and RoiAlign (10, 16, 22) against onnx.reference on every backend: each mode, padding mode and
align_corners, grids reaching past the borders, 1-D to 3-D spatial input (opset 20), dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.errors import InvalidModel, MismatchingShape, UnsupportedAttribute

from .util import Const, check, expect_error, randn, rng


def grid(*shape, spread=1.3, dtype=np.float32, seed=1):
    return rng(seed).uniform(-spread, spread, shape).astype(dtype)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_grid_sample(backend, mode, padding, align_corners):
    check(backend, "GridSample", [randn(2, 3, 5, 6), grid(2, 4, 7, 2)], opset=20,
          attrs={"mode": mode, "padding_mode": padding, "align_corners": align_corners})


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_opset16(backend, mode):
    # onnx.reference knows only the opset-20 mode names (it raises on bilinear / bicubic): onnxruntime
    check(backend, "GridSample", [randn(1, 2, 4, 5), grid(1, 3, 3, 2, spread=2.5)], opset=16,
          attrs={"mode": mode, "padding_mode": "reflection"}, oracle="onnxruntime")


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("rank", [3, 5])
def test_grid_sample_nd(backend, rank, mode):
    sp = (7,) if rank == 3 else (3, 4, 5)
    out = (5,) if rank == 3 else (2, 3, 2)
    check(backend, "GridSample", [randn(2, 2, *sp), grid(2, *out, rank - 2)], opset=22,
          attrs={"mode": mode, "padding_mode": "border" if mode == "cubic" else "zeros", "align_corners": 1})


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_grid_sample_dtypes(backend, dtype):
    check(backend, "GridSample", [randn(1, 2, 4, 4, dtype=dtype), grid(1, 3, 3, 2, dtype=dtype)], opset=20,
          attrs={"mode": "linear"})


def test_grid_sample_errors():
    expect_error(MismatchingShape, "GridSample", [randn(1, 2, 4, 4), grid(1, 3, 3, 3)], opset=20, mentions=["grid"])
    expect_error(UnsupportedAttribute, "GridSample", [randn(1, 2, 4, 4), grid(1, 3, 3, 2)], opset=16,
                 attrs={"mode": "linear"}, mentions=["mode"])


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (1, 2, 3, 4, 2)])
def test_affine_grid(backend, size, align_corners):
    nd = len(size) - 2
    check(backend, "AffineGrid", [randn(size[0], nd, nd + 1), Const(np.array(size, np.int64))], opset=20,
          attrs={"align_corners": align_corners})


def test_affine_grid_bad_theta():
    expect_error(InvalidModel, "AffineGrid", [randn(1, 2, 2), Const(np.array([1, 1, 4, 4], np.int64))], opset=20,
                 mentions=["theta"])


# --- RoiAlign --------------------------------------------------------------------------------------

ROIS = np.array([[0.5, 0.5, 7.2, 6.1], [2.0, 1.0, 4.0, 9.5], [-3.0, -2.0, 3.0, 3.5], [6.0, 0.0, 11.0, 7.0]],
                np.float32)


@pytest.mark.parametrize("case", [
    (16, {"mode": "avg"}), (16, {"mode": "max", "sampling_ratio": 2}),
    (16, {"mode": "avg", "coordinate_transformation_mode": "output_half_pixel", "spatial_scale": 0.5}),
    (10, {"mode": "avg", "output_height": 3, "output_width": 2}), (10, {"mode": "max"}),
    (22, {"mode": "avg", "sampling_ratio": 3, "spatial_scale": 0.8, "output_height": 2, "output_width": 4}),
], ids=["avg", "max-sr2", "output-half-pixel", "opset10", "opset10-max", "opset22-sr3"])
def test_roi_align(backend, case):
    opset, attrs = case
    idx = np.array([0, 1, 1, 0], np.int64)
    # onnx.reference applies the half-pixel offset at opset 10 too; opset 10 has none (it is opset 16's
    # output_half_pixel, what onnxruntime does): onnxruntime there
    check(backend, "RoiAlign", [randn(2, 3, 8, 10), ROIS, idx], opset=opset, attrs=attrs,
          oracle="onnxruntime" if opset == 10 else "reference")


def test_roi_align_bad_rois():
    expect_error(MismatchingShape, "RoiAlign", [randn(1, 2, 4, 4), randn(3, 5), np.zeros(3, np.int64)], opset=16,
                 mentions=["rois"])
