"""Converters for indexing, scatter and tensor-construction ops.

Gathers and scatters map onto the IR ops of glowpy.ir.ops.indexing (an index known at compile time and
out of range is an invalid model). Ops whose result is a fact of shapes and constants (Range, EyeLike,
Size) become constants; the others are rewritten onto existing IR ops: Tile as Reshape + Expand,
Trilu as Where with a constant mask, DepthToSpace / SpaceToDepth as Reshape + Transpose, Hardmax as
ArgMax + OneHot, ArgMin as ArgMax of an order-reversing map, Einsum as Transpose / Reshape / MatMul /
ReduceSum, CenterCropPad as Slice + Pad.
"""

from __future__ import annotations

import math
import string

import numpy as np

from glowpy.errors import InvalidModel, MismatchingShape, UnsupportedDatatype, UnsupportedShape
from glowpy.importer.context import NodeContext
from glowpy.importer.ops import cast_attrs
from glowpy.importer.table import BOOL_INT, INT, INTS, POSITIVE, Rule, one_of, onnx_op
from glowpy.ir.graph import Value
from glowpy.ir.ops.elementwise import CAST_ROUND_MODES
from glowpy.ir.ops.indexing import REDUCTIONS
from glowpy.ir.types import (
    ALL_TYPES,
    ANY_TYPES,
    NUMERIC_TYPES,
    dtype_from_onnx,
    is_supported_onnx_dtype,
    onnx_type_name,
)

STRING = Rule(lambda v: isinstance(v, str), "a string")


def _check_indices(ctx: NodeContext, i: int, dims: tuple[int, ...] | int) -> None:
    """An index operand known now must be in range (per entry of its last dim when `dims` is a tuple)."""
    data = ctx.known(i)
    if data is None or data.size == 0:
        return
    data = np.asarray(data, dtype=np.int64)
    if isinstance(dims, int):
        bad = (data >= dims) | (data < -dims)
        lim = dims
    else:
        n = np.array(dims[:data.shape[-1]], dtype=np.int64)
        bad = (data >= n) | (data < -n)
        lim = list(n)
    if bad.any():
        raise ctx.error(InvalidModel, "index out of range", expected=f"-{lim}..{lim}-1 (per dim)" if not
                        isinstance(lim, int) else f"-{lim}..{lim - 1}", found=int(data[bad].reshape(-1)[0]))


# --- gathers and scatters --------------------------------------------------------------------------


@onnx_op("GatherElements", attrs={"axis": INT}, dtypes=ALL_TYPES, since=11)
def gather_elements(ctx: NodeContext) -> list[Value]:
    x, idx = ctx.input(0), ctx.input(1)
    axis = ctx.axis(ctx.attr("axis"), x.type.rank)
    _check_indices(ctx, 1, x.shape[axis])
    return ctx.emit("GatherElements", [x, idx], {"axis": axis})


@onnx_op("GatherND", attrs={"batch_dims": INT}, dtypes=ALL_TYPES, since=11)
def gather_nd(ctx: NodeContext) -> list[Value]:
    x, idx = ctx.input(0), ctx.input(1)
    b = ctx.attr("batch_dims", 0)
    if idx.type.rank >= 1:
        _check_indices(ctx, 1, x.shape[b:])
    return ctx.emit("GatherND", [x, idx], {"batch_dims": b})


def _reduction(ctx: NodeContext) -> str:
    r = ctx.attr("reduction", "none")
    if ctx.opset < 18 and r in ("max", "min"):
        raise ctx.unsupported(f"reduction '{r}' exists from opset 18", expected="none, add or mul", found=r)
    return r


@onnx_op("ScatterND", attrs={"reduction": one_of(*REDUCTIONS)}, dtypes=ALL_TYPES, since=11)
def scatter_nd(ctx: NodeContext) -> list[Value]:
    x, idx, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    if idx.type.rank >= 1:
        _check_indices(ctx, 1, x.shape)
    return ctx.emit("ScatterND", [x, idx, upd], {"reduction": _reduction(ctx)})


def _scatter_elements(ctx: NodeContext, reduction: str) -> list[Value]:
    x, idx, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    axis = ctx.axis(ctx.attr("axis", 0), x.type.rank)
    _check_indices(ctx, 1, x.shape[axis])
    return ctx.emit("ScatterElements", [x, idx, upd], {"axis": axis, "reduction": reduction})


@onnx_op("ScatterElements", attrs={"axis": INT, "reduction": one_of(*REDUCTIONS)}, dtypes=ALL_TYPES, since=11)
def scatter_elements(ctx: NodeContext) -> list[Value]:
    return _scatter_elements(ctx, _reduction(ctx))


# Scatter (opsets 9 and 10, deprecated at 11) is ScatterElements without a reduction.
@onnx_op("Scatter", attrs={"axis": INT}, dtypes=ALL_TYPES, since=9)
def scatter(ctx: NodeContext) -> list[Value]:
    return _scatter_elements(ctx, "none")


# --- constants from shapes and operands ------------------------------------------------------------


@onnx_op("Range", dtypes=NUMERIC_TYPES, since=11, const_inputs=(0, 1, 2))
def range_(ctx: NodeContext) -> list[Value]:
    start, limit, delta = (np.asarray(ctx.const(i)) for i in range(3))
    if any(a.size != 1 for a in (start, limit, delta)):
        raise ctx.error(InvalidModel, "start, limit and delta must be scalars",
                        found=[list(a.shape) for a in (start, limit, delta)])
    dt = start.dtype
    s, lim, d = start.reshape(()).item(), limit.reshape(()).item(), delta.reshape(()).item()
    if d == 0:
        raise ctx.error(InvalidModel, "delta is 0", expected="a non-zero step", found=0)
    n = max(int(math.ceil((lim - s) / d)), 0)
    data = (np.asarray(s, dtype=dt) + np.arange(n, dtype=dt) * np.asarray(d, dtype=dt)).astype(dt)
    return [ctx.output_constant(0, data)]


@onnx_op("Size", dtypes=ALL_TYPES)
def size(ctx: NodeContext) -> list[Value]:
    return [ctx.output_constant(0, np.array(ctx.input(0).type.size, dtype=np.int64))]


@onnx_op("EyeLike", attrs={"dtype": INT, "k": INT}, dtypes=ALL_TYPES, since=9)
def eye_like(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    if x.type.rank != 2:
        raise ctx.error(UnsupportedShape, "EyeLike takes a 2-D input", expected="rank 2", found=list(x.shape))
    to = ctx.attr("dtype")
    dt = x.dtype
    if to is not None:
        if not is_supported_onnx_dtype(to):
            raise ctx.error(UnsupportedDatatype, "attribute 'dtype' names an unsupported type",
                            expected="a glowpy element type", found=onnx_type_name(to))
        dt = dtype_from_onnx(to)
    return [ctx.output_constant(0, np.eye(*x.shape, k=ctx.attr("k", 0), dtype=dt))]


@onnx_op("CastLike", attrs={"saturate": BOOL_INT, "round_mode": one_of(*CAST_ROUND_MODES)}, dtypes=ANY_TYPES,
         since=15)
def cast_like(ctx: NodeContext) -> list[Value]:
    return ctx.emit("Cast", [ctx.input(0)], cast_attrs(ctx, ctx.input(1).dtype))


# --- rewrites onto movement ops --------------------------------------------------------------------


@onnx_op("Tile", dtypes=ALL_TYPES, const_inputs=(1,), since=6)
def tile(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    reps = ctx.required_ints(1)
    if len(reps) != x.type.rank or any(r < 0 for r in reps):
        raise ctx.error(UnsupportedShape, "repeats needs one non-negative count per dim", expected=x.type.rank,
                        found=list(reps))
    if all(r == 1 for r in reps):
        return ctx.emit("Identity", [x])
    inter = tuple(v for d in x.shape for v in (1, d))
    wide = tuple(v for r, d in zip(reps, x.shape) for v in (r, d))
    y = ctx.emit1("Reshape", [x], {"shape": inter})
    y = ctx.emit1("Expand", [y], {"shape": wide})
    return ctx.emit("Reshape", [y], {"shape": tuple(r * d for r, d in zip(reps, x.shape))})


@onnx_op("Trilu", attrs={"upper": BOOL_INT}, dtypes=ALL_TYPES, since=14)
def trilu(ctx: NodeContext) -> list[Value]:
    """Where(j - i beyond k, 0, x): k may be a run-time value (it changes values, not the shape)."""
    x = ctx.input(0)
    if x.type.rank < 2:
        raise ctx.error(UnsupportedShape, "Trilu takes a tensor of rank >= 2", expected="rank >= 2",
                        found=list(x.shape))
    n, m = x.shape[-2:]
    diag = ctx.constant(np.arange(m, dtype=np.int64)[None, :] - np.arange(n, dtype=np.int64)[:, None], "diag")
    k = ctx.input(1) if ctx.has_input(1) else ctx.constant(np.zeros((), np.int64), "k")
    if k.type.size != 1 or k.dtype != np.int64:
        raise ctx.error(InvalidModel, "k must be an int64 scalar", expected="int64[]", found=str(k.type))
    if k.type.rank:
        k = ctx.emit1("Reshape", [k], {"shape": ()})
    drop = ctx.emit1("Less" if ctx.attr("upper", 1) else "Greater", [diag, k])
    return ctx.emit("Where", [drop, ctx.constant(np.zeros((), x.dtype), "zero"), x])


def _blocks(ctx: NodeContext) -> tuple[Value, int, str]:
    x = ctx.input(0)
    b = ctx.attr("blocksize")
    mode = ctx.attr("mode", "DCR")
    if x.type.rank != 4:
        raise ctx.error(UnsupportedShape, f"{ctx.node.op_type} takes NCHW input", expected="rank 4",
                        found=list(x.shape))
    return x, b, mode


@onnx_op("DepthToSpace", attrs={"blocksize": POSITIVE, "mode": one_of("DCR", "CRD")}, dtypes=ALL_TYPES)
def depth_to_space(ctx: NodeContext) -> list[Value]:
    x, b, mode = _blocks(ctx)
    n, c, h, w = x.shape
    if c % (b * b):
        raise ctx.error(MismatchingShape, "channels are not a multiple of blocksize squared", expected=f"k * {b * b}",
                        found=c)
    if mode == "DCR":
        y = ctx.emit1("Reshape", [x], {"shape": (n, b, b, c // (b * b), h, w)})
        perm = (0, 3, 4, 1, 5, 2)
    else:
        y = ctx.emit1("Reshape", [x], {"shape": (n, c // (b * b), b, b, h, w)})
        perm = (0, 1, 4, 2, 5, 3)
    y = ctx.emit1("Transpose", [y], {"perm": perm})
    return ctx.emit("Reshape", [y], {"shape": (n, c // (b * b), h * b, w * b)})


@onnx_op("SpaceToDepth", attrs={"blocksize": POSITIVE, "mode": one_of("DCR", "CRD")}, dtypes=ALL_TYPES)
def space_to_depth(ctx: NodeContext) -> list[Value]:
    x, b, mode = _blocks(ctx)
    n, c, h, w = x.shape
    if h % b or w % b:
        raise ctx.error(MismatchingShape, "height and width are not multiples of blocksize",
                        expected=f"multiples of {b}", found=[h, w])
    y = ctx.emit1("Reshape", [x], {"shape": (n, c, h // b, b, w // b, b)})
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = ctx.emit1("Transpose", [y], {"perm": perm})
    return ctx.emit("Reshape", [y], {"shape": (n, c * b * b, h // b, w // b)})


@onnx_op("CenterCropPad", attrs={"axes": INTS}, dtypes=ALL_TYPES, const_inputs=(1,), since=18)
def center_crop_pad(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    r = x.type.rank
    shape = ctx.required_ints(1)
    axes = [ctx.axis(a, r) for a in ctx.attr("axes", list(range(r)))]
    if len(shape) != len(axes) or any(s < 0 for s in shape):
        raise ctx.error(UnsupportedShape, "shape needs one non-negative size per axis", expected=len(axes),
                        found=list(shape))
    starts, ends, sl_axes, pads = [], [], [], [0] * (2 * r)
    for a, want in zip(axes, shape):
        have = x.shape[a]
        if want < have:  # crop: the extra element goes to the end (onnx's reference)
            s = (have - want) // 2
            starts.append(s)
            ends.append(s + want)
            sl_axes.append(a)
        elif want > have:  # pad: the extra element goes to the end
            pads[a] = (want - have) // 2
            pads[a + r] = want - have - pads[a]
    y = x
    if sl_axes:
        y = ctx.emit1("Slice", [y], {"starts": tuple(starts), "ends": tuple(ends), "axes": tuple(sl_axes),
                                      "steps": (1,) * len(sl_axes)})
    if any(pads):
        y = ctx.emit1("Pad", [y], {"pads": tuple(pads), "mode": "constant", "value": 0.0})
    return [y] if y is not x else ctx.emit("Identity", [x])


# --- scans, selections -----------------------------------------------------------------------------


def _scan(op: str):
    @onnx_op(op, attrs={"exclusive": BOOL_INT, "reverse": BOOL_INT}, dtypes=NUMERIC_TYPES, const_inputs=(1,),
             since=26 if op == "CumProd" else 11)
    def convert(ctx: NodeContext) -> list[Value]:
        x = ctx.input(0)
        axis = ctx.required_ints(1)
        if len(axis) != 1:
            raise ctx.error(InvalidModel, "axis must be a scalar", found=list(axis))
        return ctx.emit(op, [x], {"axis": ctx.axis(axis[0], x.type.rank), "exclusive": ctx.attr("exclusive", 0),
                                  "reverse": ctx.attr("reverse", 0)})


_scan("CumSum")
_scan("CumProd")


@onnx_op("TopK", attrs={"axis": INT, "k": INT, "largest": BOOL_INT, "sorted": BOOL_INT}, dtypes=NUMERIC_TYPES,
         const_inputs=(1,), max_outputs=2)
def topk(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    if ctx.opset < 10:
        k = ctx.attr("k")
    else:
        if not ctx.has_input(1):
            raise ctx.error(InvalidModel, "input K is missing")
        if ctx.host.compile_time_value(ctx, 1, ctx.input(1)) is None:
            raise ctx.error(UnsupportedShape, "a TopK whose K is known only at run time has an output shape that "
                            "depends on input values", expected="K a constant", found="a runtime value")
        ks = ctx.required_ints(1)
        if len(ks) != 1:
            raise ctx.error(InvalidModel, "K must hold one value", found=list(ks))
        k = ks[0]
    axis = ctx.axis(ctx.attr("axis", -1), x.type.rank)
    return ctx.emit("TopK", [x], {"k": k, "axis": axis, "largest": ctx.attr("largest", 1),
                                  "sorted": ctx.attr("sorted", 1)})


def _int_flip(ctx: NodeContext, x: Value) -> Value:
    """An order-reversing map: -x for floats, ~x (= -x - 1, wrapping) for integers."""
    y = ctx.emit1("Neg", [x])
    if x.dtype.kind == "f":
        return y
    return ctx.emit1("Sub", [y, ctx.constant(np.ones((), x.dtype), "one")])


@onnx_op("ArgMin", attrs={"axis": INT, "keepdims": BOOL_INT, "select_last_index": BOOL_INT}, dtypes=NUMERIC_TYPES)
def argmin(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    return ctx.emit("ArgMax", [_int_flip(ctx, x)], {"axis": ctx.axis(ctx.attr("axis"), x.type.rank),
                                                    "keepdims": ctx.attr("keepdims"),
                                                    "select_last_index": ctx.attr("select_last_index")})


@onnx_op("OneHot", attrs={"axis": INT}, dtypes=NUMERIC_TYPES, const_inputs=(1,), since=9)
def onehot(ctx: NodeContext) -> list[Value]:
    idx, values = ctx.input(0), ctx.input(2)
    depth = np.asarray(ctx.const(1)).reshape(-1)
    if depth.size != 1:
        raise ctx.error(InvalidModel, "depth must hold one value", found=list(depth))
    return ctx.emit("OneHot", [idx, values], {"depth": int(depth[0]), "axis": ctx.attr("axis", -1)})


@onnx_op("Hardmax", attrs={"axis": INT}, dtypes=NUMERIC_TYPES)
def hardmax(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    r = x.type.rank
    axis = ctx.axis(ctx.attr("axis", -1 if ctx.opset >= 13 else 1), r)
    y = x
    if ctx.opset < 13:  # coerced to 2-D at `axis`
        y = ctx.emit1("Reshape", [x], {"shape": (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))})
        axis = 1
    idx = ctx.emit1("ArgMax", [y], {"axis": axis, "keepdims": 0, "select_last_index": 0})
    values = ctx.constant(np.array([0, 1], dtype=x.dtype), "values")
    out = ctx.emit1("OneHot", [idx, values], {"depth": y.shape[axis], "axis": axis})
    return ctx.emit("Reshape", [out], {"shape": x.shape}) if y is not x else [out]


# --- Einsum ----------------------------------------------------------------------------------------


@onnx_op("Einsum", attrs={"equation": STRING}, dtypes=NUMERIC_TYPES, since=12)
def einsum(ctx: NodeContext) -> list[Value]:
    return _Einsum(ctx).lower()


class _Einsum:
    """Einsum as Transpose / Reshape / ReduceSum / Mul / MatMul: operands are contracted left to right;
    labels seen in only one operand and not in the output are summed first, a pair contracts with one
    batched MatMul over its shared labels."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.xs = ctx.inputs()
        eq = ctx.attr("equation").replace(" ", "")
        lhs, arrow, rhs = eq.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(self.xs):
            raise ctx.error(InvalidModel, "the equation's operand count differs from the inputs",
                            expected=len(self.xs), found=len(terms))
        # An ellipsis stands for the same leading/trailing dims in every term: give them labels of their own.
        spare = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in eq]
        ell_rank = max((x.type.rank - len(t.replace("...", "")) for t, x in zip(terms, self.xs) if "..." in t),
                       default=0)
        ell = "".join(spare[:ell_rank])
        self.terms = []
        for t, x in zip(terms, self.xs):
            if "..." in t:
                k = x.type.rank - len(t.replace("...", ""))
                t = t.replace("...", ell[ell_rank - k:])
            if len(t) != x.type.rank or not all(c.isalpha() for c in t):
                raise ctx.error(InvalidModel, "an equation term does not match its operand's rank",
                                expected=x.type.rank, found=t)
            self.terms.append(t)
        if arrow:
            out = rhs.replace("...", ell)
        else:
            counts = {c: sum(t.count(c) for t in self.terms) for c in set("".join(self.terms))}
            out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
        self.out = out

    def emit(self, op: str, xs: list[Value], attrs: dict | None = None) -> Value:
        return self.ctx.emit1(op, xs, attrs)

    def diagonal(self, x: Value, t: str) -> tuple[Value, str]:
        """A label repeated in one term takes the diagonal (as a mask multiply and a sum)."""
        while len(set(t)) < len(t):
            c = next(c for c in t if t.count(c) > 1)
            i, j = t.index(c), t.index(c, t.index(c) + 1)
            n = x.shape[i]
            shape = [1] * len(t)
            shape[i] = shape[j] = n
            eye = np.eye(n, dtype=x.dtype).reshape(shape)
            x = self.emit("Mul", [x, self.ctx.constant(eye, "eye")])
            x = self.emit("ReduceSum", [x], {"axes": (j,), "keepdims": 0})
            t = t[:j] + t[j + 1:]
        return x, t

    def sum_out(self, x: Value, t: str, keep: set[str]) -> tuple[Value, str]:
        axes = tuple(i for i, c in enumerate(t) if c not in keep)
        if not axes:
            return x, t
        x = self.emit("ReduceSum", [x], {"axes": axes, "keepdims": 0})
        return x, "".join(c for c in t if c in keep)

    def permute(self, x: Value, t: str, want: str) -> Value:
        if t == want:
            return x
        return self.emit("Transpose", [x], {"perm": tuple(t.index(c) for c in want)})

    def pair(self, a: Value, ta: str, b: Value, tb: str, keep: set[str]) -> tuple[Value, str]:
        """Contract two operands with one batched MatMul: batch labels (in both, kept), contracted (in
        both, not kept), free labels of each side (in one only)."""
        batch = [c for c in ta if c in tb and c in keep]
        red = [c for c in ta if c in tb and c not in keep]
        fa = [c for c in ta if c not in tb]
        fb = [c for c in tb if c not in ta]
        da, db = dict(zip(ta, a.shape)), dict(zip(tb, b.shape))
        if any(da[c] != db[c] for c in red):
            raise self.ctx.error(UnsupportedShape, "a contracted label has two sizes (broadcast on one side)",
                                 expected=[da[c] for c in red], found=[db[c] for c in red])
        a = self.permute(a, ta, "".join(batch + fa + red))
        b = self.permute(b, tb, "".join(batch + red + fb))
        m, k, n = math.prod(da[c] for c in fa), math.prod(da[c] for c in red), math.prod(db[c] for c in fb)
        a = self.emit("Reshape", [a], {"shape": (*(da[c] for c in batch), m, k)})
        b = self.emit("Reshape", [b], {"shape": (*(db[c] for c in batch), k, n)})
        y = self.emit("MatMul", [a, b])
        shape = (*(max(da[c], db[c]) for c in batch), *(da[c] for c in fa), *(db[c] for c in fb))
        return self.emit("Reshape", [y], {"shape": shape}), "".join(batch + fa + fb)

    def lower(self) -> list[Value]:
        ops = []
        for x, t in zip(self.xs, self.terms):
            x, t = self.diagonal(x, t)
            ops.append((x, t))
        x, t = ops[0]
        for i in range(1, len(ops)):
            rest = set(self.out) | {c for _, u in ops[i + 1:] for c in u}
            x, t = self.sum_out(x, t, rest | set(ops[i][1]))
            y, u = self.sum_out(*ops[i], rest | set(t))
            x, t = self.pair(x, t, y, u, rest)
        x, t = self.sum_out(x, t, set(self.out))
        if sorted(t) != sorted(self.out):
            raise self.ctx.error(InvalidModel, "the output names a label no operand has", expected=t, found=self.out)
        y = self.permute(x, t, self.out)
        if y is x:
            return self.ctx.emit("Identity", [x])
        return [y]


# --- refused: the output shape depends on input values ---------------------------------------------
# (table.VALUE_SHAPED: NonZero, Unique, Compress, NonMaxSuppression refuse at the shared gate)
