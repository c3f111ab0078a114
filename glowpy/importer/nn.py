"""ONNX → IR converters for resizing, the normalizations that are compositions of IR ops, and reductions.

Resize / Upsample resolve scales or sizes, axes, keep_aspect_ratio_policy and roi into the IR
Resize's full-rank static attributes (glowpy/ir/ops/resize.py); opset differences live here.
"""

from __future__ import annotations

import numpy as np

from glowpy.errors import InvalidModel
from glowpy.importer.context import NodeContext
from glowpy.importer.table import (
    BOOL_INT,
    FLOAT,
    INT,
    INTS,
    NON_NEGATIVE_INTS,
    POSITIVE,
    POSITIVE_INTS,
    Rule,
    one_of,
    onnx_op,
)
from glowpy.ir.graph import Value
from glowpy.ir.ops.resize import COORDINATE_MODES
from glowpy.ir.types import FLOAT_TYPES, NUMERIC_TYPES

FLOATS = Rule(lambda v: isinstance(v, list) and all(isinstance(x, float) for x in v), "a list of floats")

# --- Resize / Upsample, GlobalLpPool, MaxUnpool -----------------------------------------------------


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



@onnx_op("GlobalLpPool", attrs={"p": POSITIVE})
def global_lp_pool(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    if x.type.rank < 3:
        raise ctx.unsupported("GlobalLpPool needs N x C x spatial input", expected="rank >= 3", found=x.type.rank)
    sp = x.shape[2:]
    return ctx.emit("LpPool", [x], {"kernel_shape": sp, "strides": (1,) * len(sp), "pads": (0,) * (2 * len(sp)),
                                    "dilations": (1,) * len(sp), "ceil_mode": 0, "p": ctx.attr("p")})


@onnx_op("MaxUnpool", attrs={"kernel_shape": POSITIVE_INTS, "pads": NON_NEGATIVE_INTS, "strides": POSITIVE_INTS},
         const_inputs=(2,), since=9)
def max_unpool(ctx: NodeContext) -> list[Value]:
    x, idx = ctx.input(0), ctx.input(1)
    n = x.type.rank - 2
    kernel = ctx.attr("kernel_shape")
    if kernel is None or n < 1 or len(kernel) != n:
        raise ctx.unsupported("'kernel_shape' is required, one value per spatial dim", expected=max(n, 1),
                              found=kernel)
    strides, pads = tuple(ctx.attr("strides", [1] * n)), tuple(ctx.attr("pads", [0] * (2 * n)))
    if len(strides) != n or len(pads) != 2 * n:
        raise ctx.unsupported("strides / pads need one value (pads two) per spatial dim", expected=n,
                              found=f"{list(strides)}, {list(pads)}")
    out = ctx.const_ints(2) if ctx.has_input(2) else ()
    return ctx.emit("MaxUnpool", [x, idx], {"kernel_shape": tuple(kernel), "strides": strides, "pads": pads,
                                            "output_shape": tuple(out)})


# --- normalizations composed of IR ops -----------------------------------------------------------


def _channel_affine(ctx: NodeContext, y: Value, scale: Value, bias: Value | None, rank: int) -> Value:
    """y * scale + bias with scale / bias (C,) broadcast over dim 1 of a rank-`rank` tensor."""
    shape = (scale.shape[0],) + (1,) * (rank - 2)
    y = ctx.emit1("Mul", [y, ctx.emit1("Reshape", [scale], {"shape": shape})])
    if bias is not None:
        y = ctx.emit1("Add", [y, ctx.emit1("Reshape", [bias], {"shape": shape})])
    return y


@onnx_op("InstanceNormalization", attrs={"epsilon": FLOAT})
def instance_norm(ctx: NodeContext) -> list[Value]:
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    r = x.type.rank
    if r < 3:
        raise ctx.unsupported("InstanceNormalization needs N x C x spatial input", expected="rank >= 3", found=r)
    c = x.shape[1]
    if scale.shape != (c,) or bias.shape != (c,):
        raise ctx.error(InvalidModel, "scale and B need one value per channel", expected=(c,),
                        found=f"{scale.shape}, {bias.shape}")
    # Normalize each (n, c) plane: a LayerNormalization over the spatial dims, then the channel affine.
    one = ctx.constant(np.ones(1, dtype=x.dtype), "one")
    y = ctx.emit1("LayerNormalization", [x, one], {"axis": 2, "epsilon": ctx.attr("epsilon")})
    return [_channel_affine(ctx, y, scale, bias, r)]


@onnx_op("GroupNormalization", attrs={"epsilon": FLOAT, "num_groups": INT,
                                      "stash_type": one_of(1)}, since=18)
def group_norm(ctx: NodeContext) -> list[Value]:
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    r = x.type.rank
    g = ctx.attr("num_groups")
    if g is None:
        raise ctx.error(InvalidModel, "'num_groups' is required")
    if r < 2 or g <= 0 or x.shape[1] % g:
        raise ctx.unsupported("num_groups must divide the channels", expected=f"a divisor of {x.shape[1:2]}",
                              found=g)
    n, c = x.shape[:2]
    # Opset 18 gives scale and bias per group, 21 per channel.
    per = g if ctx.opset < 21 else c
    if scale.shape != (per,) or bias.shape != (per,):
        raise ctx.error(InvalidModel, "scale and bias have the wrong length", expected=(per,),
                        found=f"{scale.shape}, {bias.shape}")
    one = ctx.constant(np.ones(1, dtype=x.dtype), "one")
    grouped = ctx.emit1("Reshape", [x], {"shape": (n, g, x.type.size // max(n * g, 1))})
    y = ctx.emit1("LayerNormalization", [grouped, one], {"axis": 2, "epsilon": ctx.attr("epsilon")})
    if per == g:  # per group: apply on the grouped view
        y = _channel_affine(ctx, y, scale, bias, 3)
        return ctx.emit("Reshape", [y], {"shape": x.shape})
    y = ctx.emit1("Reshape", [y], {"shape": x.shape})
    return [_channel_affine(ctx, y, scale, bias, r)]


@onnx_op("RMSNormalization", attrs={"axis": INT, "epsilon": FLOAT, "stash_type": one_of(1)}, since=23)
def rms_norm(ctx: NodeContext) -> list[Value]:
    x, scale = ctx.input(0), ctx.input(1)
    axis = ctx.axis(ctx.attr("axis"), x.type.rank)
    axes = tuple(range(axis, x.type.rank))
    ms = ctx.emit1("ReduceMean", [ctx.emit1("Mul", [x, x])], {"axes": axes, "keepdims": 1})
    eps = ctx.constant(np.array(ctx.attr("epsilon"), dtype=x.dtype), "epsilon")
    y = ctx.emit1("Div", [x, ctx.emit1("Sqrt", [ctx.emit1("Add", [ms, eps])])])
    return ctx.emit("Mul", [y, scale])


@onnx_op("LpNormalization", attrs={"axis": INT, "p": one_of(1, 2)})
def lp_norm(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    axis = ctx.axis(ctx.attr("axis"), x.type.rank)
    if ctx.attr("p") == 1:
        norm = ctx.emit1("ReduceSum", [ctx.emit1("Abs", [x])], {"axes": (axis,), "keepdims": 1})
    else:
        norm = ctx.emit1("Sqrt", [ctx.emit1("ReduceSum", [ctx.emit1("Mul", [x, x])], {"axes": (axis,), "keepdims": 1})])
    zero = ctx.constant(np.zeros((), dtype=x.dtype), "zero")
    # A zero norm gives 0, not 0 / 0 (onnx.reference, onnxruntime).
    return ctx.emit("Where", [ctx.emit1("Equal", [norm, zero]), zero, ctx.emit1("Div", [x, norm])])


# --- reductions ----------------------------------------------------------------------------------

# The opset from which axes are input 1 instead of an attribute.
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def _reduction(op_type: str, dtypes: frozenset, build) -> None:
    """A Reduce* row: `build(ctx, x, reduce)` emits the op, where reduce(v, ir_op, keep) reduces v over
    the node's axes (keepdims = keep, else the node's) or, for noop_with_empty_axes, returns v."""

    @onnx_op(op_type, attrs={"axes": INTS, "keepdims": BOOL_INT, "noop_with_empty_axes": BOOL_INT},
             const_inputs=(1,), dtypes=dtypes)
    def convert(ctx: NodeContext) -> list[Value]:
        x = ctx.input(0)
        r = x.type.rank
        if ctx.opset >= _AXES_INPUT_SINCE.get(op_type, 18):
            axes = ctx.const_ints(1)
        else:
            axes = tuple(ctx.attr("axes")) if ctx.attr("axes") is not None else None
        noop = not axes and ctx.attr("noop_with_empty_axes")
        axes = tuple(sorted({ctx.axis(a, r) for a in axes})) if axes else tuple(range(r))
        keepdims = ctx.attr("keepdims")

        def reduce(v: Value, ir_op: str, keep: int | None = None) -> Value:
            if noop:
                return v
            return ctx.emit1(ir_op, [v], {"axes": axes, "keepdims": keepdims if keep is None else keep})

        y = build(ctx, x, reduce, None if noop or keepdims else tuple(d for i, d in enumerate(x.shape) if i not in axes))
        return [ctx.emit1("Identity", [x]) if y is x else y]


def _square(ctx: NodeContext, x: Value) -> Value:
    return ctx.emit1("Mul", [x, x])


def _log_sum_exp(ctx: NodeContext, x: Value, reduce, dropped: tuple[int, ...] | None) -> Value:
    # max + log(sum(exp(x - max))): no overflow for large x
    m = reduce(x, "ReduceMax", 1)
    y = ctx.emit1("Add", [ctx.emit1("Log", [reduce(ctx.emit1("Exp", [ctx.emit1("Sub", [x, m])]), "ReduceSum", 1)]),
                          m])
    return y if dropped is None else ctx.emit1("Reshape", [y], {"shape": dropped})


def _l2(ctx: NodeContext, x: Value, reduce, _) -> Value:
    # integers: in float64, truncated back (onnx.reference's astype)
    xf = x if x.dtype.kind == "f" else ctx.emit1("Cast", [x], {"to": np.dtype(np.float64)})
    y = ctx.emit1("Sqrt", [reduce(_square(ctx, xf), "ReduceSum")])
    return y if xf is x else ctx.emit1("Cast", [y], {"to": x.dtype})


def _extreme(ir_op: str):
    def build(ctx: NodeContext, x: Value, reduce, _) -> Value:
        if x.dtype != np.bool_:
            return reduce(x, ir_op)
        # bool (opset 20): max is any, min is all, as uint8
        u8 = ctx.emit1("Cast", [x], {"to": np.dtype(np.uint8)})
        y = reduce(u8, ir_op)
        return x if y is u8 else ctx.emit1("Cast", [y], {"to": np.dtype(np.bool_)})

    return build


for _op in ("ReduceSum", "ReduceMean", "ReduceProd"):
    _reduction(_op, NUMERIC_TYPES, lambda ctx, x, reduce, _, ir_op=_op: reduce(x, ir_op))
for _op in ("ReduceMax", "ReduceMin"):
    _reduction(_op, NUMERIC_TYPES | {np.dtype(np.bool_)}, _extreme(_op))
_reduction("ReduceL1", NUMERIC_TYPES, lambda ctx, x, reduce, _: reduce(ctx.emit1("Abs", [x]), "ReduceSum"))
_reduction("ReduceSumSquare", NUMERIC_TYPES, lambda ctx, x, reduce, _: reduce(_square(ctx, x), "ReduceSum"))
_reduction("ReduceL2", NUMERIC_TYPES, _l2)
_reduction("ReduceLogSum", FLOAT_TYPES, lambda ctx, x, reduce, _: ctx.emit1("Log", [reduce(x, "ReduceSum")]))
_reduction("ReduceLogSumExp", FLOAT_TYPES, _log_sum_exp)
