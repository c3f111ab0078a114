"""Resize: nearest / linear / cubic interpolation, separable per axis.

The importer resolves ONNX's operands (scales or sizes, axes, keep_aspect_ratio_policy, roi) into
full-rank static attributes: `sizes` (the output shape), `scales` (the factor each axis maps
coordinates with), `roi` (begin..., end... per dim; () when unused). Every resized axis is one 1-D
resample y[o] = sum_t w[o, t] * x[idx[o, t]] (+ the extrapolation value for rows tf_crop_and_resize
puts outside the input), with tables from `axis_tables`: the numpy semantics here and the cpu kernel
(backends/cpu/kernels/resize.py) read the same tables, built at compile time.

The coordinate maps and coefficients are onnx.reference's. `nearest_mode="simple"` is the opset < 11
rule (Upsample, Resize-10; onnx.reference implements neither, onnxruntime does): floor when the axis
grows, ceil when it shrinks.
"""

from __future__ import annotations

import math

import numpy as np

from glowpy.errors import UnsupportedAttribute, UnsupportedShape
from glowpy.ir.ops.registry import FROM_ONNX, REQUIRED, op
from glowpy.ir.types import NUMERIC_TYPES, TensorType

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


def _source_coords(a: dict, y: np.ndarray, scale: float, n_in: int, n_out: int,
                   roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Input coordinate of each output index, and (tf_crop_and_resize) which fall outside the input."""
    mode = a["coordinate_transformation_mode"]
    width = scale * n_in
    if mode == "align_corners":
        return (np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "tf_crop_and_resize":
        lo, hi = np.float32(roi[0] if roi else 0.0), np.float32(roi[1] if roi else 1.0)
        # roi is float32 and its terms are rounded to float32, as onnx.reference computes them
        span = float(hi - lo)
        x = np.full(n_out, span * (n_in - 1) / 2) if width == 1 else y * span * (n_in - 1) / (width - 1)
        x = x + float(lo * np.float32(n_in - 1))
        return x, (x < 0) | (x > n_in - 1)
    if mode == "pytorch_half_pixel":
        return (np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5), None
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    # half_pixel_symmetric: the centre of the input maps to the centre of the output canvas
    offset = n_in / 2 * (1 - n_out / width)
    return offset + (y + 0.5) / scale - 0.5, None


def _coeffs(a: dict, ratio: np.ndarray, scale: float) -> np.ndarray:
    """(n_out, taps) coefficients for the taps starting left of each coordinate (ratio in (0, 1])."""
    mode, r = a["mode"], ratio[:, None]
    if mode == "nearest":
        nm = a["nearest_mode"]
        if nm == "simple":
            nm = "floor" if scale >= 1 else "ceil"
        right = {"round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5, "floor": np.zeros_like(r, bool),
                 "ceil": np.ones_like(r, bool)}[nm]
        right = right | (r == 1.0)  # an integer coordinate is the right tap itself
        return np.concatenate([~right, right], axis=1).astype(np.float64)
    s = min(scale, 1.0)
    if mode == "linear":
        if not a["antialias"]:
            return np.concatenate([1 - r, r], axis=1)
        start = int(np.floor(-1 / s) + 1)
        args = (np.arange(start, 2 - start)[None, :] - r) * s
        c = np.clip(1 - np.abs(args), 0, 1)
        return c / c.sum(axis=1, keepdims=True)
    A = a["cubic_coeff_a"]
    if not a["antialias"]:
        q = 1 - r
        return np.concatenate([((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A,
                               ((A + 2) * r - (A + 3)) * r * r + 1,
                               ((A + 2) * q - (A + 3)) * q * q + 1,
                               ((A * (q + 1) - 5 * A) * (q + 1) + 8 * A) * (q + 1) - 4 * A], axis=1)
    start = int(np.floor(-2 / s) + 1)
    x = np.abs(s * (np.arange(start, 2 - start)[None, :] - r))
    c = np.where(x <= 1, (A + 2) * x ** 3 - (A + 3) * x ** 2 + 1,
                 np.where(x < 2, A * x ** 3 - 5 * A * x ** 2 + 8 * A * x - 4 * A, 0.0))
    return c / c.sum(axis=1, keepdims=True)


def axis_tables(a: dict, n_in: int, n_out: int, scale: float, roi: tuple[float, float] | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The 1-D resample of one axis: input indices (n_out, taps) in [0, n_in), their weights (float64,
    taps with weight 0 in every row dropped, nonzero taps first), and the rows that take the
    extrapolation value (None if none)."""
    y = np.arange(n_out, dtype=np.float64)
    x, extrap = _source_coords(a, y, scale, n_in, n_out, roi)
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)
    w = _coeffs(a, ratio, scale)
    n = w.shape[1]
    # The n taps nearest x (ties to the smaller index), as onnx.reference picks them.
    pad = math.ceil(n / 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        start = p + np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        start = p + np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = start[:, None] + np.arange(n)[None, :] - pad
    if a["exclude_outside"]:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    idx = np.clip(idx, 0, n_in - 1)
    if extrap is not None:
        w = np.where(extrap[:, None], 0.0, w)
    # Nonzero taps first (stable), then drop the columns that are zero in every row.
    order = np.argsort(w == 0, axis=1, kind="stable")
    w, idx = np.take_along_axis(w, order, 1), np.take_along_axis(idx, order, 1)
    taps = max(1, int((w != 0).sum(axis=1).max(initial=0)))
    return idx[:, :taps], w[:, :taps], (extrap if extrap is not None and extrap.any() else None)


def resized_axes(attrs: dict, in_shape: tuple[int, ...]) -> list[int]:
    """The axes that change (an axis with scale 1, the same size and the full roi is left alone)."""
    r = len(in_shape)
    roi = attrs["roi"]
    out = []
    for d in range(r):
        same_roi = not roi or (math.isclose(roi[d], 0.0) and math.isclose(roi[d + r], 1.0))
        if not (math.isclose(attrs["scales"][d], 1.0) and attrs["sizes"][d] == in_shape[d] and same_roi):
            out.append(d)
    return out


def tables_for(attrs: dict, in_shape: tuple[int, ...]) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]:
    """(axis, idx, w, extrap) per resized axis, in order."""
    r = len(in_shape)
    roi = attrs["roi"]
    return [(d, *axis_tables(attrs, in_shape[d], attrs["sizes"][d], float(attrs["scales"][d]),
                             (roi[d], roi[d + r]) if roi else None))
            for d in resized_axes(attrs, in_shape)]


def _resize_infer(attrs: dict, x: TensorType) -> TensorType:
    r = x.rank
    for key, allowed in (("mode", MODES), ("coordinate_transformation_mode", COORDINATE_MODES),
                         ("nearest_mode", NEAREST_MODES)):
        if attrs[key] not in allowed:
            raise UnsupportedAttribute(f"unknown {key}", op="Resize", expected=list(allowed), found=attrs[key])
    if len(attrs["sizes"]) != r or len(attrs["scales"]) != r or len(attrs["roi"]) not in (0, 2 * r):
        raise UnsupportedAttribute("sizes / scales / roi need one entry per dim", op="Resize", expected=r,
                                   found=f"{len(attrs['sizes'])} / {len(attrs['scales'])} / {len(attrs['roi'])}")
    if any(s <= 0 for s in attrs["scales"]) or any(d < 0 for d in attrs["sizes"]):
        raise UnsupportedShape("scales must be positive and sizes non-negative", op="Resize",
                               expected="> 0", found=f"scales {list(attrs['scales'])}, sizes {list(attrs['sizes'])}")
    if attrs["antialias"] and attrs["mode"] == "nearest":
        raise UnsupportedAttribute("antialias needs linear or cubic mode", op="Resize", expected="linear, cubic",
                                   found="nearest")
    return TensorType(x.dtype, tuple(attrs["sizes"]))


@op("Resize", infer=_resize_infer, dtypes=NUMERIC_TYPES,
    attrs={"sizes": REQUIRED, "scales": REQUIRED, "roi": (), "mode": FROM_ONNX,
           "coordinate_transformation_mode": FROM_ONNX, "nearest_mode": FROM_ONNX, "cubic_coeff_a": FROM_ONNX,
           "exclude_outside": FROM_ONNX, "extrapolation_value": FROM_ONNX, "antialias": FROM_ONNX})
def resize(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Interpolate to `sizes`, one axis at a time (float64, rounded once at the end; integers round
    half to even and saturate)."""
    y = x.astype(np.float64)
    if 0 in attrs["sizes"]:
        return np.zeros(attrs["sizes"], dtype=x.dtype)
    for d, idx, w, extrap in tables_for(attrs, x.shape):
        g = np.take(y, idx, axis=d)  # (..., n_out, taps, ...)
        y = (g * w.reshape((1,) * d + w.shape + (1,) * (y.ndim - d - 1))).sum(axis=d + 1)
        if extrap is not None:
            y = np.where(extrap.reshape((1,) * d + (-1,) + (1,) * (y.ndim - d - 1)),
                         attrs["extrapolation_value"], y)
    if x.dtype.kind in "iu":  # round half to even and saturate (onnx.reference's saturate_cast)
        info = np.iinfo(x.dtype)
        return np.clip(np.round(y), info.min, info.max).astype(x.dtype)
    return y.astype(x.dtype)
