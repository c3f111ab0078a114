"""Indexing ops: gathers and scatters by index tensors, and the per-axis scans and selections (CumSum,
CumProd, TopK, OneHot, ReverseSequence).

Indices may be negative (they count from the end). An index out of range at run time never reads or
writes outside a tensor: a gather yields zero there and a scatter drops that update, on every backend
(the importer refuses an out-of-range index it can see at compile time as InvalidModel).
"""

from __future__ import annotations

import numpy as np

from glowpy.errors import MismatchingShape, UnsupportedAttribute, UnsupportedDatatype
from glowpy.ir.ops.registry import FROM_ONNX, REQUIRED, op
from glowpy.ir.types import NUMERIC_TYPES, TensorType

REDUCTIONS = ("none", "add", "mul", "max", "min")
INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _axis(name: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise UnsupportedAttribute("axis out of range", op=name, expected=f"-{rank}..{rank - 1}", found=axis)
    return axis % rank


def _index_type(name: str, t: TensorType, what: str = "indices") -> None:
    if t.dtype not in INDEX_TYPES:
        raise UnsupportedDatatype(f"{what} must be int32 or int64", op=name, expected="int32/int64", found=str(t.dtype))


def _reduction(name: str, attrs: dict, x: TensorType) -> None:
    r = attrs["reduction"]
    if r not in REDUCTIONS:
        raise UnsupportedAttribute("unknown reduction", op=name, expected=list(REDUCTIONS), found=r)
    if r != "none" and x.dtype not in NUMERIC_TYPES:
        raise UnsupportedDatatype(f"reduction '{r}' needs numbers", op=name, expected="a numeric type",
                                  found=str(x.dtype))


def normalize(idx: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(index in 0..n-1 or 0, in-range mask) for raw indices that may count from the end."""
    j = np.where(idx < 0, idx.astype(np.int64) + n, idx.astype(np.int64))
    ok = (j >= 0) & (j < n)
    return np.where(ok, j, 0), ok


_AT = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(out: np.ndarray, where: tuple[np.ndarray, ...], values: np.ndarray, reduction: str) -> None:
    """out[where] (op)= values, entry by entry in order: a repeated position keeps the last value
    (reduction none) or combines them all."""
    if reduction == "none":
        # numpy does not promise an order for repeated positions: keep each position's last entry.
        flat = np.ravel_multi_index(where, out.shape[:len(where)]) if where and where[0].size else np.zeros(0, int)
        _, first_from_end = np.unique(flat[::-1], return_index=True)
        keep = flat.size - 1 - first_from_end
        out[tuple(w[keep] for w in where)] = values[keep]
    else:
        _AT[reduction].at(out, where, values)


# --- GatherElements / ScatterElements ------------------------------------------------------------


def _gather_elements_infer(attrs: dict, x: TensorType, idx: TensorType) -> TensorType:
    _axis("GatherElements", attrs["axis"], x.rank)
    _index_type("GatherElements", idx)
    if idx.rank != x.rank:
        raise MismatchingShape("indices must have the rank of data", op="GatherElements", expected=x.rank,
                               found=idx.rank)
    return TensorType(x.dtype, idx.shape)


@op("GatherElements", infer=_gather_elements_infer, inputs=(2, 2), attrs={"axis": FROM_ONNX}, onnx="GatherElements")
def gather_elements(attrs: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """out[i..] = x[i.. with the axis coordinate replaced by idx[i..]]."""
    axis = attrs["axis"] % x.ndim
    j, ok = normalize(idx, x.shape[axis])
    # Index dims other than the axis may be shorter than x's: take the leading part.
    sub = x[tuple(slice(0, d) if a != axis else slice(None) for a, d in enumerate(idx.shape))]
    got = np.take_along_axis(sub, j, axis=axis)
    return np.where(ok, got, np.zeros((), x.dtype))


def _scatter_elements_infer(attrs: dict, x: TensorType, idx: TensorType, upd: TensorType) -> TensorType:
    _axis("ScatterElements", attrs["axis"], x.rank)
    _index_type("ScatterElements", idx)
    _reduction("ScatterElements", attrs, x)
    if idx.shape != upd.shape or idx.rank != x.rank:
        raise MismatchingShape("indices and updates must have one shape, of the rank of data", op="ScatterElements",
                               expected=f"rank {x.rank}, {list(idx.shape)}", found=list(upd.shape))
    if any(i > d for a, (i, d) in enumerate(zip(idx.shape, x.shape)) if a != attrs["axis"] % x.rank):
        raise MismatchingShape("indices are larger than data outside the axis", op="ScatterElements",
                               expected=list(x.shape), found=list(idx.shape))
    if upd.dtype != x.dtype:
        raise UnsupportedDatatype("updates must have the type of data", op="ScatterElements", expected=str(x.dtype),
                                  found=str(upd.dtype))
    return x


@op("ScatterElements", infer=_scatter_elements_infer, inputs=(3, 3), attrs={"axis": FROM_ONNX,
    "reduction": FROM_ONNX}, onnx="ScatterElements")
def scatter_elements(attrs: dict, x: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> np.ndarray:
    """A copy of x where each update goes to its element's position with the axis coordinate from idx,
    in row-major order of the updates (so with reduction none a repeated index keeps the last)."""
    axis = attrs["axis"] % x.ndim
    out = x.copy()
    j, ok = normalize(idx, x.shape[axis])
    where = [np.broadcast_to(np.arange(d).reshape([-1 if a == b else 1 for b in range(idx.ndim)]), idx.shape)
             for a, d in enumerate(idx.shape)]
    where[axis] = j
    _scatter(out, tuple(w[ok] for w in where), upd[ok], attrs["reduction"])
    return out


# --- GatherND / ScatterND --------------------------------------------------------------------------


def _gather_nd_infer(attrs: dict, x: TensorType, idx: TensorType) -> TensorType:
    _index_type("GatherND", idx)
    b = attrs["batch_dims"]
    if idx.rank < 1 or not 0 <= b < min(x.rank, idx.rank):
        raise UnsupportedAttribute("batch_dims must be below the ranks of data and indices", op="GatherND",
                                   expected=f"0..{min(x.rank, idx.rank) - 1}", found=b)
    k = idx.shape[-1]
    if x.shape[:b] != idx.shape[:b] or not 1 <= k <= x.rank - b:
        raise MismatchingShape("indices do not fit data (batch dims equal, last dim 1..rank - batch_dims)",
                               op="GatherND", expected=f"{list(x.shape[:b])} + [., 1..{x.rank - b}]",
                               found=list(idx.shape))
    return TensorType(x.dtype, idx.shape[:-1] + x.shape[b + k:])


@op("GatherND", infer=_gather_nd_infer, inputs=(2, 2), attrs={"batch_dims": FROM_ONNX}, onnx="GatherND")
def gather_nd(attrs: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Each index row (the last dim of idx) picks a slice of x below the batch dims."""
    b = attrs["batch_dims"]
    k = idx.shape[-1]
    nb = int(np.prod(x.shape[:b], dtype=np.int64))
    xs = x.reshape((nb,) + x.shape[b:])
    rows = idx.reshape(nb, -1, k)
    coords, oks = zip(*(normalize(rows[..., d], x.shape[b + d]) for d in range(k)))
    ok = np.logical_and.reduce(oks)
    got = xs[(np.arange(nb)[:, None], *coords)]
    got[~ok] = 0
    return got.reshape(idx.shape[:-1] + x.shape[b + k:])


def _scatter_nd_infer(attrs: dict, x: TensorType, idx: TensorType, upd: TensorType) -> TensorType:
    _index_type("ScatterND", idx)
    _reduction("ScatterND", attrs, x)
    k = idx.shape[-1] if idx.rank else 0
    want = idx.shape[:-1] + x.shape[k:]
    if idx.rank < 1 or not 1 <= k <= x.rank or upd.shape != want:
        raise MismatchingShape("updates must have shape indices.shape[:-1] + data.shape[k:] (k = indices' last dim)",
                               op="ScatterND", expected=list(want), found=list(upd.shape))
    if upd.dtype != x.dtype:
        raise UnsupportedDatatype("updates must have the type of data", op="ScatterND", expected=str(x.dtype),
                                  found=str(upd.dtype))
    return x


@op("ScatterND", infer=_scatter_nd_infer, inputs=(3, 3), attrs={"reduction": FROM_ONNX}, onnx="ScatterND")
def scatter_nd(attrs: dict, x: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> np.ndarray:
    """A copy of x where each index row's slice is replaced by (or combined with) its update, in order."""
    out = x.copy()
    k = idx.shape[-1]
    rows = idx.reshape(-1, k)
    u = upd.reshape((rows.shape[0],) + x.shape[k:])
    coords, oks = zip(*(normalize(rows[:, d], x.shape[d]) for d in range(k)))
    ok = np.logical_and.reduce(oks)
    _scatter(out, tuple(c[ok] for c in coords), u[ok], attrs["reduction"])
    return out


# --- scans and selections --------------------------------------------------------------------------


def _cum_infer(name: str):
    def infer(attrs: dict, x: TensorType) -> TensorType:
        _axis(name, attrs["axis"], x.rank)
        return x

    return infer


def _cum(name: str, fn, unit: int) -> None:
    def compute(attrs: dict, x: np.ndarray) -> np.ndarray:
        axis = attrs["axis"] % x.ndim
        y = np.flip(x, axis) if attrs["reverse"] else x
        if attrs["exclusive"]:
            head = np.full(y.shape[:axis] + (1,) + y.shape[axis + 1:], unit, x.dtype)
            y = np.concatenate([head, np.take(y, range(y.shape[axis] - 1), axis=axis)], axis=axis)
        y = fn(y, axis=axis, dtype=x.dtype)
        return np.ascontiguousarray(np.flip(y, axis) if attrs["reverse"] else y)

    compute.__doc__ = f"Running {'sum' if unit == 0 else 'product'} along `axis` (exclusive: shifted by one; reverse: from the end)."
    op(name, infer=_cum_infer(name), dtypes=NUMERIC_TYPES,
       attrs={"axis": REQUIRED, "exclusive": 0, "reverse": 0})(compute)


_cum("CumSum", np.cumsum, 0)
_cum("CumProd", np.cumprod, 1)


def _topk_infer(attrs: dict, x: TensorType) -> list[TensorType]:
    axis = _axis("TopK", attrs["axis"], x.rank)
    k = attrs["k"]
    if not 0 <= k <= x.shape[axis]:
        raise UnsupportedAttribute("k must be within the axis", op="TopK", expected=f"0..{x.shape[axis]}", found=k)
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorType(x.dtype, shape), TensorType(np.int64, shape)]


@op("TopK", infer=_topk_infer, dtypes=NUMERIC_TYPES, num_outputs=2,
    attrs={"k": REQUIRED, "axis": -1, "largest": 1, "sorted": 1})
def topk(attrs: dict, x: np.ndarray) -> list[np.ndarray]:
    """The k largest (or smallest) along `axis` and their indices, best first; ties go to the lower
    index (a stable order, so `sorted` 0 returns the same)."""
    axis = attrs["axis"] % x.ndim
    key = -x if attrs["largest"] and x.dtype.kind != "u" else x
    if attrs["largest"] and x.dtype.kind == "u":
        key = np.iinfo(x.dtype).max - x
    if x.dtype.kind == "f" and attrs["largest"]:
        key = np.where(np.isnan(x), -np.inf, key)  # NaN is the largest (as onnxruntime orders it)
    order = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(order, range(attrs["k"]), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


def _onehot_infer(attrs: dict, idx: TensorType, values: TensorType) -> TensorType:
    if idx.dtype.kind not in "iuf":
        raise UnsupportedDatatype("indices must be numbers", op="OneHot", expected="int or float", found=str(idx.dtype))
    if values.size != 2 or values.rank != 1:
        raise MismatchingShape("values must be [off_value, on_value]", op="OneHot", expected=[2],
                               found=list(values.shape))
    axis = _axis("OneHot", attrs["axis"], idx.rank + 1)
    if attrs["depth"] < 1:
        raise UnsupportedAttribute("depth must be positive", op="OneHot", expected=">= 1", found=attrs["depth"])
    return TensorType(values.dtype, idx.shape[:axis] + (attrs["depth"],) + idx.shape[axis:])


@op("OneHot", infer=_onehot_infer, inputs=(2, 2), dtypes=NUMERIC_TYPES, attrs={"depth": REQUIRED, "axis": -1})
def onehot(attrs: dict, idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """on_value where the new `axis` coordinate equals the index (negative ones count from depth), else
    off_value; an index outside -depth..depth-1 gives an all-off row."""
    depth = attrs["depth"]
    axis = attrs["axis"] % (idx.ndim + 1)
    i = idx.astype(np.int64)
    i = np.where(i < 0, i + depth, i)
    shape = [1] * (idx.ndim + 1)
    shape[axis] = depth
    hit = np.expand_dims(i, axis) == np.arange(depth).reshape(shape)
    return np.where(hit, values[1], values[0]).astype(values.dtype)


def _reverse_sequence_infer(attrs: dict, x: TensorType, lens: TensorType) -> TensorType:
    _index_type("ReverseSequence", lens, "sequence_lens")
    b, t = attrs["batch_axis"], attrs["time_axis"]
    if x.rank < 2 or sorted((b, t)) != [0, 1]:
        raise UnsupportedAttribute("batch_axis and time_axis must be 0 and 1 in some order", op="ReverseSequence",
                                   expected="{0, 1}", found=[b, t])
    if lens.shape != (x.shape[b],):
        raise MismatchingShape("sequence_lens needs one length per batch entry", op="ReverseSequence",
                               expected=[x.shape[b]], found=list(lens.shape))
    return x


@op("ReverseSequence", infer=_reverse_sequence_infer, inputs=(2, 2), attrs={"batch_axis": FROM_ONNX,
    "time_axis": FROM_ONNX}, onnx="ReverseSequence")
def reverse_sequence(attrs: dict, x: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Per batch entry, the first seq_len steps along the time axis in reverse order (lengths are
    clamped to 0..time)."""
    b, t = attrs["batch_axis"], attrs["time_axis"]
    out = x.copy()
    for i in range(x.shape[b]):
        n = int(min(max(lens[i], 0), x.shape[t]))
        src = [slice(None)] * x.ndim
        src[b] = i
        src[t] = slice(0, n)
        out[tuple(src)] = np.flip(x[tuple(src)], axis=t - (1 if b < t else 0))
    return out


__all__ = ["INDEX_TYPES", "REDUCTIONS", "normalize"]
