"""ONNX → IR converters, one per ONNX op, each registered in the op table with its rules.

A converter reads its node through `NodeContext` and emits IR ops. Opset differences (an attribute
that became an input, changed defaults or semantics) are handled here and nowhere else.

One file for the core ops: each converter is a short function next to its table row, and the families
with more code of their own (rnn.py, quant.py) have files of their own.
"""

from __future__ import annotations

import math

import numpy as np

from glowpy.errors import InvalidModel, MismatchingShape, UnsupportedDatatype
from glowpy.importer.context import NodeContext, read_tensor
from glowpy.importer.table import (
    AUTO_PAD,
    BOOL_INT,
    FLOAT,
    IGNORED,
    INT,
    INTS,
    NON_NEGATIVE_INTS,
    POSITIVE,
    POSITIVE_INTS,
    TENSOR,
    Rule,
    equals,
    mirror,
    mirror_declared,
    one_of,
    onnx_op,
)
from glowpy.ir.graph import Value
from glowpy.ir.ops.elementwise import CAST_ROUND_MODES
from glowpy.ir.types import (
    ALL_TYPES,
    ANY_TYPES,
    NUMERIC_TYPES,
    dtype_from_onnx,
    is_supported_onnx_dtype,
    onnx_type_name,
)
from glowpy.limits import check_tensor

# --- elementwise ---------------------------------------------------------------------------------

# ONNX ops that IR ops mirror one to one (the IR op of the same name; see table.mirror).
for _name in ("Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Erf", "Neg", "Abs", "Reciprocal", "Softplus",
              "Identity", "LeakyRelu", "HardSigmoid", "Add", "Sub", "Mul", "Div", "Greater", "Less", "Equal", "Where",
              "GlobalAveragePool", "GlobalMaxPool", "MatMul"):
    mirror(_name)


@onnx_op("Gelu", attrs={"approximate": one_of("none", "tanh")}, since=20)
def gelu(ctx: NodeContext) -> list[Value]:
    return ctx.emit("Gelu", [ctx.input(0)], {"approximate": ctx.attr("approximate")})


@onnx_op("Clip", attrs={"min": FLOAT, "max": FLOAT}, const_inputs=(1, 2), value_inputs=(1, 2), runtime_inputs=(1, 2))
def clip(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    if ctx.opset < 11:
        return ctx.emit("Clip", [x], {"min": ctx.attr("min", -math.inf), "max": ctx.attr("max", math.inf)})
    # A bound known only at run time is a broadcast Max / Min operand: min(max(x, lo), hi).
    lo, hi = ctx.const_or_runtime(1), ctx.const_or_runtime(2)
    run_lo, run_hi = ctx.has_input(1) and lo is None, ctx.has_input(2) and hi is None
    if run_lo:
        x = ctx.emit1("Max", [x, ctx.input(1)])
    if lo is not None or hi is not None or not (run_lo or run_hi):
        x = ctx.emit1("Clip", [x], {"min": -math.inf if lo is None else lo.item(),
                                    "max": math.inf if hi is None else hi.item()})
    if run_hi:
        x = ctx.emit1("Min", [x, ctx.input(2)])
    return [x]


@onnx_op("Dropout", attrs={"ratio": FLOAT, "is_test": IGNORED, "seed": IGNORED}, const_inputs=(2,), max_outputs=2,
         value_inputs=(2,))
def dropout(ctx: NodeContext) -> list[Value]:
    training = ctx.const(2)
    if training is not None and bool(training):
        raise ctx.unsupported("training-mode Dropout is not supported", expected="training_mode false",
                              found="true")
    x = ctx.input(0)
    out = ctx.emit("Dropout", [x])
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        out.append(ctx.output_constant(1, np.ones(x.shape, dtype=np.bool_)))
    return out


def _cast_target(ctx: NodeContext, to: int) -> np.dtype:
    if not is_supported_onnx_dtype(to):
        name = onnx_type_name(to)
        raise ctx.error(UnsupportedDatatype, "cast target type not supported", expected="a numeric or bool type",
                        found=name)
    return dtype_from_onnx(to)


def cast_attrs(ctx: NodeContext, to: np.dtype) -> dict:
    """The IR Cast's attributes for Cast / CastLike (`saturate` from opset 19, `round_mode` from 24)."""
    return {"to": to, "saturate": bool(ctx.attr("saturate", 1)), "round_mode": ctx.attr("round_mode", "up")}


@onnx_op("Cast", attrs={"to": INT, "saturate": BOOL_INT, "round_mode": one_of(*CAST_ROUND_MODES)})
def cast(ctx: NodeContext) -> list[Value]:
    return ctx.emit("Cast", [ctx.input(0)], cast_attrs(ctx, _cast_target(ctx, ctx.attr("to"))))


@onnx_op("Pow")
def pow_(ctx: NodeContext) -> list[Value]:
    base, exp = ctx.input(0), ctx.input(1)
    if exp.dtype == base.dtype:
        return ctx.emit("Pow", [base, exp])
    # Pow(T, T1): the exponent may have its own type. An integer exponent is exact in any float type;
    # an integer base with a float exponent is computed in double and truncated back (2 ** 1.5 -> 2).
    if base.dtype.kind == "f":
        return ctx.emit("Pow", [base, ctx.emit1("Cast", [exp], {"to": base.dtype})])
    if exp.dtype.kind == "f":
        f64 = np.dtype(np.float64)
        y = ctx.emit1("Pow", [ctx.emit1("Cast", [base], {"to": f64}), ctx.emit1("Cast", [exp], {"to": f64})])
        return ctx.emit("Cast", [y], {"to": base.dtype})
    return ctx.emit("Pow", [base, ctx.emit1("Cast", [exp], {"to": base.dtype})])


def _variadic(op_type: str, ir_op: str) -> None:
    @onnx_op(op_type, dtypes=NUMERIC_TYPES)
    def convert(ctx: NodeContext) -> list[Value]:
        xs = ctx.inputs()
        if not xs:
            raise ctx.error(InvalidModel, f"{op_type} needs at least one input")
        if len(xs) == 1:
            return ctx.emit("Identity", xs)
        acc = xs[0]
        for x in xs[1:]:
            acc = ctx.emit1(ir_op, [acc, x])
        return [acc]


_variadic("Sum", "Add")
_variadic("Max", "Max")
_variadic("Min", "Min")


# --- constants -----------------------------------------------------------------------------------


@onnx_op(
    "Constant",
    attrs={"value": TENSOR, "value_float": FLOAT, "value_floats": Rule(lambda v: isinstance(v, list), "floats"),
           "value_int": INT, "value_ints": INTS},
    dtypes=ANY_TYPES,
)
def constant(ctx: NodeContext) -> list[Value]:
    if len(ctx.attrs) != 1:
        raise ctx.unsupported("Constant needs exactly one value attribute", expected=1, found=len(ctx.attrs))
    key, val = next(iter(ctx.attrs.items()))
    if key == "value":
        if not is_supported_onnx_dtype(val.data_type):
            raise ctx.error(UnsupportedDatatype, "constant element type not supported",
                            found=onnx_type_name(val.data_type))
        return [ctx.tensor_constant(0, val)]
    else:
        dtype = np.float32 if "float" in key else np.int64
        data = np.array(val, dtype=dtype)
    return [ctx.output_constant(0, data)]


@onnx_op("ConstantOfShape", attrs={"value": TENSOR}, dtypes=frozenset({np.dtype(np.int64)}), const_inputs=(0,),
         since=9, output_shape_input=0)
def constant_of_shape(ctx: NodeContext) -> list[Value]:
    shape = ctx.required_ints(0)
    value = ctx.attr("value")
    if value is None:
        fill = np.zeros(1, dtype=np.float32)
    else:
        if not is_supported_onnx_dtype(value.data_type):
            raise ctx.error(UnsupportedDatatype, "fill element type not supported",
                            found=onnx_type_name(value.data_type))
        fill = read_tensor(value, what="the fill value").reshape(-1)
    if any(d < 0 for d in shape):
        raise ctx.unsupported("shape has negative dims", found=list(shape))
    check_tensor(ctx.node.output[0], fill.dtype, shape, node=ctx.name, op=ctx.node.op_type)
    # broadcast_to gives a read-only view: the weight costs one element until a backend packs it.
    return [ctx.output_constant(0, np.broadcast_to(fill[:1].reshape(()), shape))]


# --- convolution and pooling ---------------------------------------------------------------------

_CONV_ATTRS = {"auto_pad": AUTO_PAD, "dilations": POSITIVE_INTS, "group": POSITIVE, "kernel_shape": POSITIVE_INTS,
               "pads": NON_NEGATIVE_INTS, "strides": POSITIVE_INTS}


def spatial_pads(ctx: NodeContext, in_sp: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
                 dilations: tuple[int, ...], *, transposed: bool = False,
                 output_padding: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Explicit (begins..., ends...) pads, with auto_pad resolved."""
    n = len(in_sp)
    auto = ctx.attr("auto_pad")
    if auto in ("NOTSET", ""):
        pads = tuple(ctx.attr("pads", [0] * (2 * n)))
        if len(pads) != 2 * n:
            raise ctx.unsupported("'pads' needs begin and end per spatial dim", expected=2 * n, found=len(pads))
        return pads
    if auto == "VALID":
        return (0,) * (2 * n)
    begins, ends = [], []
    out_pad = output_padding or (0,) * n
    for size, k, s, d, op in zip(in_sp, kernel, strides, dilations, out_pad):
        eff = (k - 1) * d + 1
        if transposed:  # the output is input * stride; pads crop the full transposed output to it
            total = max(0, s * (size - 1) + op + eff - size * s)
        else:
            out = -(-size // s)
            total = max(0, (out - 1) * s + eff - size)
        small, big = total // 2, total - total // 2
        # SAME_UPPER puts the odd pixel at the end, SAME_LOWER at the beginning.
        upper = auto == "SAME_UPPER"
        begins.append(small if upper else big)
        ends.append(big if upper else small)
    return tuple(begins + ends)


def _spatial_attrs(ctx: NodeContext, x: Value, kernel: tuple[int, ...]) -> tuple[tuple, tuple]:
    n = x.type.rank - 2
    if n < 1:
        raise ctx.unsupported("needs an N x C x spatial input", expected="rank >= 3", found=x.type.rank)
    strides = tuple(ctx.attr("strides", [1] * n))
    dilations = tuple(ctx.attr("dilations", [1] * n))
    for key, val in (("strides", strides), ("dilations", dilations), ("kernel_shape", kernel)):
        if len(val) != n:
            raise ctx.unsupported(f"'{key}' needs one value per spatial dim", expected=n, found=len(val))
    return strides, dilations


@onnx_op("Conv", attrs=_CONV_ATTRS, const_inputs=())
def conv(ctx: NodeContext) -> list[Value]:
    x, w = ctx.input(0), ctx.input(1)
    if x.type.rank != w.type.rank:
        raise ctx.error(MismatchingShape, "input rank does not match the weight", expected=f"rank {w.type.rank}",
                        found=f"rank {x.type.rank} {list(x.shape)}")
    kernel = tuple(ctx.attr("kernel_shape", w.shape[2:]))
    if kernel != tuple(w.shape[2:]):
        raise ctx.error(InvalidModel, "kernel_shape disagrees with the weight", expected=list(w.shape[2:]),
                        found=list(kernel))
    strides, dilations = _spatial_attrs(ctx, x, kernel)
    pads = spatial_pads(ctx, x.shape[2:], kernel, strides, dilations)
    b = ctx.input(2) if ctx.has_input(2) else ctx.constant(np.zeros(w.shape[0], dtype=x.dtype), "bias")
    return ctx.emit("Conv", [x, w, b], {"group": ctx.attr("group"), "strides": strides, "pads": pads,
                                        "dilations": dilations})


@onnx_op("ConvTranspose", attrs={**_CONV_ATTRS, "output_padding": NON_NEGATIVE_INTS, "output_shape": POSITIVE_INTS})
def conv_transpose(ctx: NodeContext) -> list[Value]:
    x, w = ctx.input(0), ctx.input(1)
    g = ctx.attr("group")
    kernel = tuple(ctx.attr("kernel_shape", w.shape[2:]))
    strides, dilations = _spatial_attrs(ctx, x, kernel)
    n = len(kernel)
    out_pad = tuple(ctx.attr("output_padding", [0] * n))
    in_sp = x.shape[2:]
    auto = ctx.attr("auto_pad")
    m = w.shape[1] * g
    b = ctx.input(2) if ctx.has_input(2) else None
    attrs = {"group": g, "strides": strides, "dilations": dilations, "output_padding": out_pad}
    if ctx.attr("output_shape") is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        # The output size is given (output_shape, or input * stride for SAME): pads are what crops the
        # full transposed output to it. SAME_UPPER puts total // 2 at the beginning; NOTSET and SAME_LOWER
        # put total - total // 2 there (the spec's equations; onnx.reference and onnxruntime agree).
        # A negative total (an output larger than the full one) extends it: at the end for an explicit
        # output_shape (onnx.reference and onnxruntime), split by the same equations for SAME (reference).
        given = ctx.attr("output_shape") is not None
        if given:
            target = tuple(ctx.attr("output_shape"))[-n:]
        else:
            target = tuple(i * s for i, s in zip(in_sp, strides))
        totals = [s * (i - 1) + op + (k - 1) * d + 1 - t
                  for s, i, op, k, d, t in zip(strides, in_sp, out_pad, kernel, dilations, target)]
        begins = [0 if given and t < 0 else t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in totals]
        pads = tuple(begins + [t - bg for t, bg in zip(totals, begins)])
    else:
        pads = spatial_pads(ctx, in_sp, kernel, strides, dilations, transposed=True, output_padding=out_pad)
    if all(p >= 0 for p in pads):
        if b is None:
            b = ctx.constant(np.zeros(m, dtype=x.dtype), "bias")
        return ctx.emit("ConvTranspose", [x, w, b], {**attrs, "pads": pads})
    # The requested output is larger than the full transposed output (a kernel smaller than the stride):
    # negative pads extend it, and the extension holds just the bias.
    zero = ctx.constant(np.zeros(m, dtype=x.dtype), "bias")
    y = ctx.emit1("ConvTranspose", [x, w, zero], {**attrs, "pads": tuple(max(0, p) for p in pads)})
    grow = [max(0, -p) for p in pads]
    y = ctx.emit1("Pad", [y], {"pads": (0, 0, *grow[:n], 0, 0, *grow[n:]), "mode": "constant", "value": 0.0})
    if b is not None:
        y = ctx.emit1("Add", [y, ctx.emit1("Reshape", [b], {"shape": (m, *([1] * n))})])
    return [y]


def _pool(op_type: str, extra: dict[str, Rule]) -> None:
    attrs = {"auto_pad": AUTO_PAD, "kernel_shape": POSITIVE_INTS, "pads": NON_NEGATIVE_INTS, "strides": POSITIVE_INTS,
             "ceil_mode": BOOL_INT, **extra}

    @onnx_op(op_type, attrs=attrs, max_outputs=2 if op_type == "MaxPool" else 1)
    def convert(ctx: NodeContext) -> list[Value]:
        x = ctx.input(0)
        if "kernel_shape" not in ctx.attrs:
            raise ctx.unsupported("'kernel_shape' is required")
        kernel = tuple(ctx.attr("kernel_shape"))
        strides, dilations = _spatial_attrs(ctx, x, kernel)
        pads = spatial_pads(ctx, x.shape[2:], kernel, strides, dilations)
        attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "ceil_mode": ctx.attr("ceil_mode"),
                 "dilations": dilations}
        if op_type == "AveragePool":
            attrs["count_include_pad"] = ctx.attr("count_include_pad")
        elif op_type == "LpPool":
            attrs["p"] = ctx.attr("p")
        elif len(ctx.node.output) > 1 and ctx.node.output[1]:
            attrs.update(indices=1, storage_order=ctx.attr("storage_order"))
        return ctx.emit(op_type, [x], attrs)


_pool("MaxPool", {"dilations": POSITIVE_INTS, "storage_order": BOOL_INT})
_pool("AveragePool", {"count_include_pad": BOOL_INT, "dilations": POSITIVE_INTS})
_pool("LpPool", {"p": POSITIVE, "dilations": POSITIVE_INTS})


# --- normalization -------------------------------------------------------------------------------


@onnx_op("BatchNormalization", attrs={"epsilon": FLOAT, "momentum": IGNORED, "spatial": equals(1, "per channel"),
                                      "training_mode": equals(0, "inference"), "is_test": IGNORED})
def batch_norm(ctx: NodeContext) -> list[Value]:
    if len([o for o in ctx.node.output if o]) > 1:
        raise ctx.unsupported("training outputs (running mean/var) are not supported", expected="1 output",
                              found=len(ctx.node.output))
    return ctx.emit("BatchNormalization", [ctx.input(i) for i in range(5)], {"epsilon": ctx.attr("epsilon")})


@onnx_op("LRN", attrs={"size": POSITIVE, "alpha": FLOAT, "beta": FLOAT, "bias": FLOAT})
def lrn(ctx: NodeContext) -> list[Value]:
    if "size" not in ctx.attrs:
        raise ctx.unsupported("'size' is required")
    return ctx.emit("LRN", [ctx.input(0)], {"size": ctx.attr("size"), "alpha": ctx.attr("alpha"),
                                            "beta": ctx.attr("beta"), "bias": ctx.attr("bias")})


@onnx_op("LayerNormalization", attrs={"axis": INT, "epsilon": FLOAT, "stash_type": equals(1, "float32 stash")},
         since=17, max_outputs=3)
def layer_norm(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    axis = ctx.axis(ctx.attr("axis"), x.type.rank)
    ins = [x, ctx.input(1)] + ([ctx.input(2)] if ctx.has_input(2) else [])
    y = ctx.emit("LayerNormalization", ins, {"axis": axis, "epsilon": ctx.attr("epsilon")})
    if not any(ctx.node.output[1:]):
        return y
    # Mean and InvStdDev (float32, the stash type), over the normalized dims kept as size 1.
    axes = tuple(range(axis, x.type.rank))
    xs = x if x.dtype == np.float32 else ctx.emit1("Cast", [x], {"to": np.dtype(np.float32)})
    mean = ctx.emit1("ReduceMean", [xs], {"axes": axes, "keepdims": 1})
    d = ctx.emit1("Sub", [xs, mean])
    var = ctx.emit1("ReduceMean", [ctx.emit1("Mul", [d, d])], {"axes": axes, "keepdims": 1})
    eps = ctx.constant(np.array(ctx.attr("epsilon"), dtype=np.float32), "epsilon")
    inv = ctx.emit1("Reciprocal", [ctx.emit1("Sqrt", [ctx.emit1("Add", [var, eps])])])
    return [*y, mean, inv]


def _softmax(op_type: str) -> None:
    @onnx_op(op_type, attrs={"axis": INT})
    def convert(ctx: NodeContext) -> list[Value]:
        x = ctx.input(0)
        r = x.type.rank
        if ctx.opset >= 13:
            return ctx.emit(op_type, [x], {"axis": ctx.axis(ctx.attr("axis"), r)})
        # Before opset 13 the input is coerced to 2-D at `axis` and normalized over the second dim.
        axis = ctx.axis(ctx.attr("axis"), r)
        if axis == r - 1:
            return ctx.emit(op_type, [x], {"axis": axis})
        rows = math.prod(x.shape[:axis])
        flat = ctx.emit1("Reshape", [x], {"shape": (rows, x.type.size // rows)})
        y = ctx.emit1(op_type, [flat], {"axis": 1})
        return ctx.emit("Reshape", [y], {"shape": x.shape})


_softmax("Softmax")
_softmax("LogSoftmax")


# --- matrix products -----------------------------------------------------------------------------


@onnx_op("Gemm", attrs={"alpha": FLOAT, "beta": FLOAT, "transA": BOOL_INT, "transB": BOOL_INT,
                        "broadcast": IGNORED})
def gemm(ctx: NodeContext) -> list[Value]:
    ins = [ctx.input(0), ctx.input(1)] + ([ctx.input(2)] if ctx.has_input(2) else [])
    return ctx.emit("Gemm", ins, {"alpha": ctx.attr("alpha"), "beta": ctx.attr("beta"),
                                  "transA": ctx.attr("transA"), "transB": ctx.attr("transB")})


# --- shapes and data movement ---------------------------------------------------------------------


def reshape_target(ctx: NodeContext, x: Value, spec: tuple[int, ...], allowzero: int = 0) -> tuple[int, ...]:
    """Resolve ONNX reshape rules: 0 copies the input dim (unless allowzero), one -1 is inferred."""
    out = [x.shape[i] if d == 0 and not allowzero and i < x.type.rank else d for i, d in enumerate(spec)]
    if out.count(-1) > 1:
        raise ctx.unsupported("more than one -1 in the target shape", found=list(spec))
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or x.type.size % known:
            raise ctx.error(InvalidModel, "target shape does not divide the element count", expected=x.type.size,
                            found=list(spec))
        out[out.index(-1)] = x.type.size // known
    return tuple(out)


@onnx_op("Reshape", attrs={"allowzero": BOOL_INT}, const_inputs=(1,), output_shape_input=1)
def reshape(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    shape = reshape_target(ctx, x, ctx.required_ints(1), ctx.attr("allowzero"))
    return ctx.emit("Reshape", [x], {"shape": shape})


@onnx_op("Flatten", attrs={"axis": INT}, dtypes=ANY_TYPES)
def flatten(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    r = x.type.rank
    axis = ctx.attr("axis")
    if not -r <= axis <= r:
        raise ctx.unsupported("axis out of range", expected=f"-{r}..{r}", found=axis)
    axis = axis + r if axis < 0 else axis
    rows = math.prod(x.shape[:axis])
    return ctx.emit("Reshape", [x], {"shape": (rows, x.type.size // rows if rows else 0)})


def _axes_operand(ctx: NodeContext, since_input: int) -> tuple[int, ...] | None:
    """Axes given as attribute (older opsets) or as input 1 (from `since_input`)."""
    if ctx.opset >= since_input:
        return ctx.const_ints(1)
    axes = ctx.attr("axes")
    return None if axes is None else tuple(axes)


@onnx_op("Squeeze", attrs={"axes": INTS}, dtypes=ANY_TYPES, const_inputs=(1,))
def squeeze(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    axes = _axes_operand(ctx, 13)
    r = x.type.rank
    if axes is None:
        drop = {i for i, d in enumerate(x.shape) if d == 1}
    else:
        drop = {ctx.axis(a, r) for a in axes}
        bad = [a for a in drop if x.shape[a] != 1]
        if bad:
            raise ctx.error(InvalidModel, "squeezed dims must have size 1", expected=1,
                            found={a: x.shape[a] for a in bad})
    return ctx.emit("Reshape", [x], {"shape": tuple(d for i, d in enumerate(x.shape) if i not in drop)})


@onnx_op("Unsqueeze", attrs={"axes": INTS}, dtypes=ANY_TYPES, const_inputs=(1,))
def unsqueeze(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    axes = _axes_operand(ctx, 13)
    if axes is None:
        raise ctx.unsupported("Unsqueeze needs axes")
    r = x.type.rank + len(axes)
    ins = sorted(ctx.axis(a, r) for a in axes)
    if len(set(ins)) != len(ins):
        raise ctx.unsupported("repeated axes", found=list(axes))
    shape = list(x.shape)
    for a in ins:
        shape.insert(a, 1)
    return ctx.emit("Reshape", [x], {"shape": tuple(shape)})


@onnx_op("Transpose", attrs={"perm": INTS})
def transpose(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    perm = tuple(ctx.attr("perm", list(range(x.type.rank))[::-1]))
    return ctx.emit("Transpose", [x], {"perm": tuple(p % x.type.rank if x.type.rank else p for p in perm)})


@onnx_op("Concat", attrs={"axis": INT})
def concat(ctx: NodeContext) -> list[Value]:
    xs = ctx.inputs()
    if "axis" not in ctx.attrs:
        raise ctx.unsupported("'axis' is required")
    return ctx.emit("Concat", xs, {"axis": ctx.axis(ctx.attr("axis"), xs[0].type.rank)})


@onnx_op("Split", attrs={"axis": INT, "split": POSITIVE_INTS, "num_outputs": POSITIVE},
         const_inputs=(1,), max_outputs=1 << 16)
def split(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    axis = ctx.axis(ctx.attr("axis"), x.type.rank)
    dim = x.shape[axis]
    sizes = ctx.const_ints(1) if ctx.opset >= 13 else (tuple(ctx.attr("split")) if ctx.attr("split") else None)
    n = len(ctx.node.output)
    if sizes is None:
        parts = ctx.attr("num_outputs", n)
        chunk = -(-dim // parts)
        sizes = tuple(max(0, min(chunk, dim - i * chunk)) for i in range(parts))  # 5 in 4: 2, 2, 1, 0
    if len(sizes) != n or sum(sizes) != dim or any(s < 0 for s in sizes):
        raise ctx.unsupported("split sizes do not match outputs and axis", expected=f"{n} sizes summing to {dim}",
                              found=list(sizes))
    return ctx.emit("Split", [x], {"axis": axis, "split": tuple(sizes)})


@onnx_op("Slice", attrs={"starts": INTS, "ends": INTS, "axes": INTS}, const_inputs=(1, 2, 3, 4))
def slice_(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    r = x.type.rank
    if ctx.opset < 10:
        starts, ends = ctx.attr("starts"), ctx.attr("ends")
        axes, steps = ctx.attr("axes"), None
    else:
        starts, ends, axes, steps = ctx.const_ints(1), ctx.const_ints(2), ctx.const_ints(3), ctx.const_ints(4)
    if starts is None or ends is None:
        raise ctx.unsupported("Slice needs starts and ends")
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.unsupported("starts, ends, axes and steps differ in length",
                              found=[len(starts), len(ends), len(axes), len(steps)])
    out_s, out_e, out_a, out_st = [], [], [], []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = ctx.axis(a, r)
        if st == 0:
            raise ctx.unsupported("slice step 0")
        # Clamp like the ONNX spec: negative indices count from the end, then starts go to [0, dim] and
        # ends to [0, dim] stepping forward, [0, dim - 1] and [-1, dim - 1] stepping backward (an end of
        # -1 is "before 0"). Not python's slice.indices(): it maps a start below -dim to "nothing" when
        # stepping backward, where ONNX clamps it to element 0.
        dim = x.shape[a]
        s, e = s + dim if s < 0 else s, e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        out_s.append(s)
        out_e.append(e)
        out_a.append(a)
        out_st.append(st)
    if len(set(out_a)) != len(out_a):
        raise ctx.unsupported("repeated axes", found=list(axes))
    return ctx.emit("Slice", [x], {"starts": tuple(out_s), "ends": tuple(out_e), "axes": tuple(out_a),
                                   "steps": tuple(out_st)})


@onnx_op("Gather", attrs={"axis": INT})
def gather(ctx: NodeContext) -> list[Value]:
    x, idx = ctx.input(0), ctx.input(1)
    axis = ctx.axis(ctx.attr("axis"), x.type.rank)
    data = ctx.known(1)
    if data is not None and ((data >= x.shape[axis]) | (data < -x.shape[axis])).any():
        raise ctx.error(InvalidModel, "gather index out of range", expected=f"-{x.shape[axis]}..{x.shape[axis] - 1}",
                        found=int(data.max()))
    return ctx.emit("Gather", [x, idx], {"axis": axis})


@onnx_op("Expand", const_inputs=(1,), since=8, output_shape_input=1)
def expand(ctx: NodeContext) -> list[Value]:
    return ctx.emit("Expand", [ctx.input(0)], {"shape": ctx.required_ints(1)})


@onnx_op("Shape", attrs={"start": INT, "end": INT}, dtypes=ALL_TYPES)
def shape(ctx: NodeContext) -> list[Value]:
    # Shapes are static: the result is a fact of the input type, a constant from the start.
    dims = ctx.input(0).shape
    start, end = ctx.attr("start"), ctx.attr("end", len(dims))
    return [ctx.output_constant(0, np.array(dims[slice(start, end)], dtype=np.int64))]


@onnx_op("Pad", attrs={"mode": one_of("constant", "reflect", "edge"), "pads": INTS, "value": FLOAT},
         dtypes=NUMERIC_TYPES, const_inputs=(1, 2, 3), value_inputs=(2,))
def pad(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    r = x.type.rank
    if ctx.opset < 11:
        pads, value, axes = ctx.attr("pads"), ctx.attr("value"), None
    else:
        pads = ctx.const_ints(1)
        cv = ctx.const(2)
        value = 0.0 if cv is None or cv.size == 0 else cv.reshape(-1)[0].item()
        axes = ctx.const_ints(3)
    if pads is None:
        raise ctx.unsupported("Pad needs pads")
    pads = list(pads)
    if axes is not None:
        axes = [ctx.axis(a, r) for a in axes]
        if len(pads) != 2 * len(axes):
            raise ctx.unsupported("pads needs begin and end per axis", expected=2 * len(axes), found=len(pads))
        full = [0] * (2 * r)
        for i, a in enumerate(axes):
            full[a], full[a + r] = pads[i], pads[i + len(axes)]
        pads = full
    if len(pads) != 2 * r:
        raise ctx.unsupported("pads needs begin and end per dim", expected=2 * r, found=len(pads))
    return ctx.emit("Pad", [x], {"pads": tuple(pads), "mode": ctx.attr("mode"), "value": float(value)})


# --- reductions: importer/nn.py -------------------------------------------------------------------


@onnx_op("ArgMax", attrs={"axis": INT, "keepdims": BOOL_INT, "select_last_index": BOOL_INT})
def argmax(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    return ctx.emit("ArgMax", [x], {"axis": ctx.axis(ctx.attr("axis"), x.type.rank),
                                    "keepdims": ctx.attr("keepdims"),
                                    "select_last_index": ctx.attr("select_last_index")})


mirror_declared()  # after every explicit row: a dedicated row wins
