"""GridSample: sample X (N, C, *spatial) at the normalized coordinates of grid (N, *out, nd).

onnx.reference's arithmetic, which the cpu kernel (backends/cpu/kernels/grid_sample.py) follows
step by step: coordinates are denormalized in float32 (align_corners maps -1 / 1 to the corner
pixels' centres, else to their outer edges); nearest rounds half to even; a coordinate outside the
border is clamped (border) or reflected (reflection) first; then every tap (2 per dim for linear, 4 for
cubic with a = -0.75, 1 for nearest) reads its pixel under the padding mode: 0 outside (zeros), the
clamped index (border), the reflected index (reflection).
"""

from __future__ import annotations

import numpy as np

from glowpy.errors import MismatchingShape, UnsupportedAttribute
from glowpy.ir.ops.registry import REQUIRED, op
from glowpy.ir.types import FLOAT_TYPES, TensorType

GS_MODES = ("nearest", "linear", "cubic")
GS_PADDING = ("zeros", "border", "reflection")
CUBIC_A = -0.75


def reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect by the nearer border until inside [lo, hi] (float64)."""
    x = np.asarray(x, dtype=np.float64)
    span = hi - lo
    below, above = lo - x, x - hi
    out = x.copy()
    for dx, near, far, sign in ((below, lo, hi, 1.0), (above, hi, lo, -1.0)):
        n = np.trunc(dx / span)
        r = dx - n * span
        even = np.fmod(n, 2) == 0
        out = np.where(dx > 0, np.where(even, near + sign * r, far - sign * r), out)
    return out


def cubic_coeffs(t: np.ndarray) -> np.ndarray:
    """Keys cubic weights of the taps at -1, 0, 1, 2 for a fraction t in [0, 1)."""
    A = CUBIC_A
    u, v, w = t + 1, 1 - t, 2 - t
    return np.stack([((A * u - 5 * A) * u + 8 * A) * u - 4 * A, ((A + 2) * t - (A + 3)) * t * t + 1,
                     ((A + 2) * v - (A + 3)) * v * v + 1, ((A * w - 5 * A) * w + 8 * A) * w - 4 * A], -1)


def _gs_infer(attrs: dict, x: TensorType, grid: TensorType) -> TensorType:
    nd = x.rank - 2
    if attrs["mode"] not in GS_MODES or attrs["padding_mode"] not in GS_PADDING:
        raise UnsupportedAttribute("unknown mode or padding_mode", op="GridSample",
                                   expected=f"{GS_MODES} / {GS_PADDING}", found=(attrs["mode"], attrs["padding_mode"]))
    if nd < 1 or grid.rank != x.rank or grid.shape[0] != x.shape[0] or grid.shape[-1] != nd:
        raise MismatchingShape("grid must be (N, *out, spatial rank) for X (N, C, *spatial)", op="GridSample",
                               expected=f"({x.shape[0]}, ..., {nd})", found=grid.shape)
    if grid.dtype != x.dtype:
        raise MismatchingShape("grid and X differ in element type", op="GridSample", expected=str(x.dtype),
                               found=str(grid.dtype))
    return TensorType(x.dtype, (*x.shape[:2], *grid.shape[1:-1]))


def source_coords(attrs: dict, grid: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """(N, *out, nd) float32 coordinates in X's dim order, after rounding (nearest) and the border step."""
    ac = attrs["align_corners"]
    g = grid.astype(np.float32)[..., ::-1]
    d = np.array(dims, dtype=np.float32)
    one, two = np.float32(1), np.float32(2)
    c = (g + one) / two * (d - one) if ac else ((g + one) * d - one) / two
    if attrs["mode"] == "nearest":
        c = np.rint(c)
    lo = np.zeros(len(dims)) if ac else np.full(len(dims), -0.5)
    hi = np.array(dims) - (1.0 if ac else 0.5)
    outside = (c < lo) | (c > hi)
    if attrs["padding_mode"] == "border":
        c = np.where(outside, np.clip(c, np.float32(0), d - one), c)
    elif attrs["padding_mode"] == "reflection":
        c = np.where(outside, reflect(c, lo, hi), c).astype(np.float32)
    return c.astype(np.float32)


def tap_index(attrs: dict, i: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(index clamped into the dim, whether the tap reads a pixel) for integer tap positions i."""
    pad = attrs["padding_mode"]
    if pad == "zeros":
        return np.clip(i, 0, dim - 1), (i >= 0) & (i < dim)
    if pad == "border":
        return np.clip(i, 0, dim - 1), np.ones(i.shape, bool)
    lo, hi = (0.0, dim - 1.0) if attrs["align_corners"] else (-0.5, dim - 0.5)
    j = np.trunc(reflect(i, lo, hi)).astype(np.int64)
    return np.clip(j, 0, dim - 1), np.ones(i.shape, bool)


@op("GridSample", infer=_gs_infer, inputs=(2, 2), dtypes=FLOAT_TYPES,
    attrs={"mode": REQUIRED, "padding_mode": REQUIRED, "align_corners": REQUIRED})
def grid_sample(attrs: dict, x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Interpolate X at each grid point (see the module docstring)."""
    dims = x.shape[2:]
    nd = len(dims)
    c = source_coords(attrs, grid, dims)  # (N, *out, nd)
    per_dim = []  # per dim: (taps index (N, *out, T), valid, weight)
    for d in range(nd):
        cd = c[..., d].astype(np.float64)
        if attrs["mode"] == "nearest":
            pos, w = cd.astype(np.int64)[..., None], np.ones(cd.shape + (1,))
        else:
            base = np.floor(cd)
            t = cd - base
            if attrs["mode"] == "linear":
                pos, w = base[..., None] + np.arange(2), np.stack([1 - t, t], -1)
            else:
                pos, w = base[..., None] + np.arange(-1, 3), cubic_coeffs(t)
            pos = pos.astype(np.int64)
        per_dim.append((*tap_index(attrs, pos, dims[d]), w))
    n, ch = x.shape[:2]
    out_sp = grid.shape[1:-1]
    xf = x.reshape(n, ch, -1).astype(np.float64)
    y = np.zeros((n, ch, *out_sp))
    strides = [int(np.prod(dims[d + 1:])) for d in range(nd)]
    taps = [range(p[0].shape[-1]) for p in per_dim]
    batch = np.arange(n).reshape(n, *([1] * len(out_sp)))
    for combo in np.ndindex(*[len(t) for t in taps]):
        flat = sum(per_dim[d][0][..., combo[d]] * strides[d] for d in range(nd))
        weight = np.prod([per_dim[d][2][..., combo[d]] * per_dim[d][1][..., combo[d]] for d in range(nd)], axis=0)
        vals = xf[batch, :, flat]  # (N, *out, C)
        y += np.moveaxis(vals * weight[..., None], -1, 1)
    return y.astype(x.dtype)


# --- RoiAlign --------------------------------------------------------------------------------


def _roi_axis(start: float, bin_size: float, pooled: int, grid: int, size: int):
    """Sample positions along one axis of a roi: (low, high, weight of low, weight of high, outside),
    each (pooled, grid), as onnx.reference's pre-calculation."""
    f = np.float32
    v = (start + np.arange(pooled, dtype=f)[:, None] * bin_size
         + (np.arange(grid, dtype=f)[None, :] + f(0.5)) * bin_size / f(grid))
    outside = (v < -1.0) | (v > size)
    v = np.maximum(v, f(0))
    low = v.astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    frac = np.where(edge, f(0), v - low.astype(f))
    return low, high, f(1) - frac, frac, outside


def _roi_infer(attrs: dict, x: TensorType, rois: TensorType, idx: TensorType) -> TensorType:
    if x.rank != 4 or rois.rank != 2 or rois.shape[1] != 4 or idx.shape != (rois.shape[0],):
        raise MismatchingShape("RoiAlign needs X (N, C, H, W), rois (R, 4), batch_indices (R,)", op="RoiAlign",
                               expected="(N, C, H, W) (R, 4) (R,)", found=f"{x.shape} {rois.shape} {idx.shape}")
    if attrs["mode"] not in ("avg", "max"):
        raise UnsupportedAttribute("unknown mode", op="RoiAlign", expected="avg, max", found=attrs["mode"])
    return TensorType(x.dtype, (rois.shape[0], x.shape[1], attrs["output_height"], attrs["output_width"]))


@op("RoiAlign", infer=_roi_infer, inputs=(3, 3), dtypes=FLOAT_TYPES,
    attrs={"mode": REQUIRED, "output_height": REQUIRED, "output_width": REQUIRED, "sampling_ratio": REQUIRED,
           "spatial_scale": REQUIRED, "half_pixel": REQUIRED})
def roi_align(attrs: dict, x: np.ndarray, rois: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Bilinear samples on a grid per output bin of each roi, averaged or maxed (onnx.reference's
    arithmetic: a sample outside the image adds 0; max takes the largest weighted corner)."""
    ph, pw = attrs["output_height"], attrs["output_width"]
    n, ch, hgt, wid = x.shape
    y = np.zeros((rois.shape[0], ch, ph, pw))
    f = np.float32  # coordinates and weights in float32, as onnx.reference computes them
    off = f(0.5 if attrs["half_pixel"] else 0.0)
    for r, (box, b) in enumerate(zip(rois.astype(f), np.clip(idx, 0, n - 1))):
        sw, sh, ew, eh = box * f(attrs["spatial_scale"]) - off
        rw, rh = ew - sw, eh - sh
        if not attrs["half_pixel"]:
            rw, rh = max(rw, f(1)), max(rh, f(1))
        sr = attrs["sampling_ratio"]
        gh = sr if sr > 0 else int(np.ceil(rh / f(ph)))
        gw = sr if sr > 0 else int(np.ceil(rw / f(pw)))
        count = max(gh * gw, 1)
        if gh <= 0 or gw <= 0:
            continue
        yl, yh, wyl, wyh, oy = _roi_axis(sh, rh / f(ph), ph, gh, hgt)
        xl, xh, wxl, wxh, ox = _roi_axis(sw, rw / f(pw), pw, gw, wid)
        keep = ~(oy[:, :, None, None] | ox[None, None, :, :])  # (ph, gh, pw, gw)
        img = x[b].astype(np.float64)
        corners = [img[:, yy[:, :, None, None], xx[None, None, :, :]]
                   * (wy[:, :, None, None] * wx[None, None] * keep).astype(np.float64)
                   for yy, wy in ((yl, wyl), (yh, wyh)) for xx, wx in ((xl, wxl), (xh, wxh))]
        if attrs["mode"] == "avg":
            y[r] = sum(corners).sum(axis=(2, 4)) / count
        else:
            y[r] = np.max(np.maximum.reduce(corners), axis=(2, 4))
    return y.astype(x.dtype)
