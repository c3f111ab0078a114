"""ONNX → IR converters for resizing and the normalizations that are compositions of IR ops.

Resize / Upsample resolve scales or sizes, axes, keep_aspect_ratio_policy and roi into the IR
Resize's full-rank static attributes (glowpy/ir/ops/resize.py); opset differences live here.
"""

from __future__ import annotations

import numpy as np

from glowpy.errors import InvalidModel
from glowpy.importer.context import NodeContext
from glowpy.importer.table import BOOL_INT, FLOAT, INTS, Rule, one_of, onnx_op
from glowpy.ir.graph import Value
from glowpy.ir.ops.resize import COORDINATE_MODES

FLOATS = Rule(lambda v: isinstance(v, list) and all(isinstance(x, float) for x in v), "a list of floats")

# --- Resize / Upsample ----------------------------------------------------------------------------


def _const_floats(ctx: NodeContext, i: int) -> tuple[float, ...] | None:
    data = ctx.const(i)
    if data is None or np.asarray(data).size == 0:
        return None
    return tuple(float(v) for v in np.asarray(data, dtype=np.float32).reshape(-1))


def _emit_resize(ctx: NodeContext, x: Value, scales: tuple[float, ...] | None, sizes: tuple[int, ...] | None,
                 roi: tuple[float, ...] | None, axes: tuple[int, ...] | None, attrs: dict) -> list[Value]:
    r = x.type.rank
    axes = tuple(range(r)) if axes is None else tuple(ctx.axis(a, r) for a in axes)
    if len(set(axes)) != len(axes):
        raise ctx.unsupported("repeated axes", found=list(axes))
    if (scales is None) == (sizes is None):
        raise ctx.error(InvalidModel, "exactly one of scales and sizes must be given",
                        found=f"scales {scales}, sizes {sizes}")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise ctx.error(InvalidModel, "scales / sizes need one entry per axis", expected=len(axes), found=len(given))
    full_scales = [1.0] * r
    full_sizes = list(x.shape)
    if scales is not None:
        if any(s <= 0 for s in scales):
            raise ctx.unsupported("scales must be positive", found=list(scales))
        for a, s in zip(axes, scales):
            full_scales[a] = s
            full_sizes[a] = int(np.float64(s) * x.shape[a])
    else:
        if any(x.shape[a] == 0 for a in axes):
            raise ctx.unsupported("cannot resize an empty axis to a size", found=list(x.shape))
        for a, n in zip(axes, sizes):
            full_scales[a] = n / x.shape[a]
            full_sizes[a] = n
        policy = attrs.pop("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(full_scales[a] for a in axes)
            for a in axes:
                full_scales[a] = s
                full_sizes[a] = int(s * x.shape[a] + 0.5)
    attrs.pop("keep_aspect_ratio_policy", None)
    full_roi: tuple[float, ...] = ()
    if roi is not None and attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        if len(roi) != 2 * len(axes):
            raise ctx.error(InvalidModel, "roi needs begin and end per axis", expected=2 * len(axes), found=len(roi))
        lo, hi = [0.0] * r, [1.0] * r
        for i, a in enumerate(axes):
            lo[a], hi[a] = roi[i], roi[i + len(axes)]
        full_roi = tuple(lo + hi)
    return ctx.emit("Resize", [x], {"sizes": tuple(full_sizes), "scales": tuple(full_scales), "roi": full_roi,
                                    **attrs})


@onnx_op("Resize", since=10, const_inputs=(1, 2, 3),
         attrs={"mode": one_of("nearest", "linear", "cubic"), "coordinate_transformation_mode": one_of(*COORDINATE_MODES),
                "nearest_mode": one_of("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
                "cubic_coeff_a": FLOAT, "exclude_outside": BOOL_INT, "extrapolation_value": FLOAT,
                "antialias": BOOL_INT, "axes": INTS,
                "keep_aspect_ratio_policy": one_of("stretch", "not_larger", "not_smaller")})
def resize(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    mode = ctx.attr("mode")
    if ctx.opset < 11:
        if mode == "cubic":
            raise ctx.unsupported("cubic mode needs opset 11", expected="nearest, linear", found=mode)
        return _emit_resize(ctx, x, _const_floats(ctx, 1), None, None, None,
                            {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "simple"})
    attrs = {k: ctx.attr(k) for k in ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                                      "exclude_outside", "extrapolation_value")}
    if ctx.opset >= 18:
        attrs["antialias"] = ctx.attr("antialias")
        attrs["keep_aspect_ratio_policy"] = ctx.attr("keep_aspect_ratio_policy")
    sizes = ctx.const_ints(3) if ctx.has_input(3) else None
    if sizes is not None and not sizes:
        sizes = None
    axes = tuple(ctx.attr("axes")) if ctx.opset >= 18 and ctx.attr("axes") else None
    return _emit_resize(ctx, x, _const_floats(ctx, 2), sizes, _const_floats(ctx, 1), axes, attrs)


@onnx_op("Upsample", attrs={"mode": one_of("nearest", "linear"), "scales": FLOATS}, const_inputs=(1,))
def upsample(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    scales = tuple(ctx.attr("scales")) if ctx.opset < 9 else _const_floats(ctx, 1)
    if scales is None:
        raise ctx.error(InvalidModel, "Upsample needs scales")
    return _emit_resize(ctx, x, scales, None, None, None,
                        {"mode": ctx.attr("mode"), "coordinate_transformation_mode": "asymmetric",
                         "nearest_mode": "simple"})

