"""Data-movement ops (reshape, transpose, concat, split, slice, gather, expand, pad) and ArgMax (reductions: reduce.py).

All shape-like operands are attributes here: the importer resolves ONNX's shape/axes/pads inputs to
constants and normalizes negative axes, so every IR shape is static.
"""

from __future__ import annotations

import math

import numpy as np

from glowpy.errors import MismatchingDatatype, MismatchingShape, UnsupportedAttribute, UnsupportedDatatype
from glowpy.ir.ops.elementwise import broadcast_shapes
from glowpy.ir.ops.registry import FROM_ONNX, REQUIRED, op
from glowpy.ir.types import ANY_TYPES, FLOAT_TYPES, NUMERIC_TYPES, TensorType


def _axis(name: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise UnsupportedAttribute("axis out of range", op=name, expected=f"-{rank}..{rank - 1}", found=axis)
    return axis % rank


def _reshape_infer(attrs: dict, x: TensorType) -> TensorType:
    shape = tuple(attrs["shape"])
    if math.prod(shape) != x.size:
        raise MismatchingShape("reshape changes the element count", op="Reshape", expected=x.size,
                               found=f"{list(shape)} = {math.prod(shape)}")
    return TensorType(x.dtype, shape)


@op("Reshape", dtypes=ANY_TYPES, infer=_reshape_infer, attrs={"shape": REQUIRED})
def reshape(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Same elements, static target shape (no -1 or 0: the importer resolved them)."""
    return x.reshape(attrs["shape"])


def _transpose_infer(attrs: dict, x: TensorType) -> TensorType:
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise UnsupportedAttribute("perm is not a permutation of the dims", op="Transpose",
                                   expected=list(range(x.rank)), found=list(perm))
    return TensorType(x.dtype, tuple(x.shape[p] for p in perm))


@op("Transpose", dtypes=ANY_TYPES, infer=_transpose_infer, attrs={"perm": REQUIRED})
def transpose(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Permute dims by `perm`."""
    return np.require(np.transpose(x, attrs["perm"]), requirements="C")  # a scalar stays 0-d


def _concat_infer(attrs: dict, *xs: TensorType) -> TensorType:
    axis = _axis("Concat", attrs["axis"], xs[0].rank)
    for t in xs[1:]:
        if t.rank != xs[0].rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, xs[0].shape)) if i != axis):
            raise MismatchingShape("inputs differ outside the concat axis", op="Concat",
                                   expected=list(xs[0].shape), found=list(t.shape))
        if t.dtype != xs[0].dtype:
            raise MismatchingDatatype("inputs differ in element type", op="Concat", expected=str(xs[0].dtype),
                                      found=str(t.dtype))
    shape = list(xs[0].shape)
    shape[axis] = sum(t.shape[axis] for t in xs)
    return TensorType(xs[0].dtype, tuple(shape))


@op("Concat", dtypes=ANY_TYPES, infer=_concat_infer, inputs=(1, None), attrs={"axis": REQUIRED})
def concat(attrs: dict, *xs: np.ndarray) -> np.ndarray:
    """Join along `axis`."""
    return np.concatenate(xs, axis=attrs["axis"])


def _split_infer(attrs: dict, x: TensorType) -> list[TensorType]:
    axis = _axis("Split", attrs["axis"], x.rank)
    if sum(attrs["split"]) != x.shape[axis]:
        raise MismatchingShape("split sizes do not add up to the axis", op="Split", expected=x.shape[axis],
                               found=list(attrs["split"]))
    return [TensorType(x.dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in attrs["split"]]


@op("Split", dtypes=ANY_TYPES, infer=_split_infer, attrs={"axis": FROM_ONNX, "split": REQUIRED}, num_outputs=lambda a: len(a["split"]))
def split(attrs: dict, x: np.ndarray) -> list[np.ndarray]:
    """Cut along `axis` into pieces of the sizes in `split`."""
    return np.split(x, np.cumsum(attrs["split"])[:-1], axis=attrs["axis"])


def _slice_infer(attrs: dict, x: TensorType) -> TensorType:
    shape = list(x.shape)
    for s, e, a, st in zip(attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]):
        shape[_axis("Slice", a, x.rank)] = len(range(s, e, st))
    return TensorType(x.dtype, tuple(shape))


@op("Slice", dtypes=ANY_TYPES, infer=_slice_infer, attrs={"starts": REQUIRED, "ends": REQUIRED, "axes": REQUIRED, "steps": REQUIRED})
def slice_(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Strided slice; starts/ends are already clamped by the importer (an end of -1 means "before 0")."""
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]):
        idx[a] = slice(s, e if e >= 0 else None, st)
    return np.ascontiguousarray(x[tuple(idx)])


def _gather_infer(attrs: dict, x: TensorType, idx: TensorType) -> TensorType:
    axis = _axis("Gather", attrs["axis"], x.rank)
    if idx.dtype.kind not in "iu":
        raise UnsupportedDatatype("indices must be integers", op="Gather", expected="int32/int64",
                                  found=str(idx.dtype))
    return TensorType(x.dtype, x.shape[:axis] + idx.shape + x.shape[axis + 1:])


@op("Gather", dtypes=ANY_TYPES, infer=_gather_infer, inputs=(2, 2), attrs={"axis": FROM_ONNX})
def gather(attrs: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Take entries along `axis`; negative indices count from the end."""
    axis = attrs["axis"]
    return np.take(x, np.where(idx < 0, idx + x.shape[axis], idx), axis=axis)


def _expand_infer(attrs: dict, x: TensorType) -> TensorType:
    return TensorType(x.dtype, broadcast_shapes(x.shape, tuple(attrs["shape"]), op="Expand"))


@op("Expand", dtypes=ANY_TYPES, infer=_expand_infer, attrs={"shape": REQUIRED})
def expand(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Broadcast to `shape` (numpy rules, so the result may be larger than `shape`)."""
    return np.array(np.broadcast_to(x, _expand_infer(attrs, TensorType.of(x)).shape))


PAD_MODES = ("constant", "reflect", "edge")


def _pad_infer(attrs: dict, x: TensorType) -> TensorType:
    pads = attrs["pads"]
    if len(pads) != 2 * x.rank:
        raise UnsupportedAttribute("pads needs begin and end per dim", op="Pad", expected=2 * x.rank, found=len(pads))
    if attrs["mode"] not in PAD_MODES:
        raise UnsupportedAttribute("unknown pad mode", op="Pad", expected=list(PAD_MODES), found=attrs["mode"])
    shape = tuple(d + pads[i] + pads[i + x.rank] for i, d in enumerate(x.shape))
    if any(d < 0 for d in shape):
        raise MismatchingShape("negative pads remove more than the dim", op="Pad", expected="dims >= 0", found=shape)
    return TensorType(x.dtype, shape)


@op("Pad", infer=_pad_infer, attrs={"pads": REQUIRED, "mode": FROM_ONNX, "value": 0.0})
def pad(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Pad (or crop, for negative pads) each dim; mode constant / reflect / edge."""
    r = x.ndim
    pads = attrs["pads"]
    crop = tuple(slice(max(0, -pads[i]), x.shape[i] - max(0, -pads[i + r])) for i in range(r))
    x = x[crop]
    widths = [(max(0, pads[i]), max(0, pads[i + r])) for i in range(r)]
    if attrs["mode"] == "constant":
        return np.pad(x, widths, mode="constant", constant_values=np.array(attrs["value"]).astype(x.dtype))
    return np.pad(x, widths, mode=attrs["mode"])


def _argmax_infer(attrs: dict, x: TensorType) -> TensorType:
    axis = _axis("ArgMax", attrs["axis"], x.rank)
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape)) if attrs["keepdims"] else \
        x.shape[:axis] + x.shape[axis + 1:]
    return TensorType(np.int64, shape)


@op("ArgMax", infer=_argmax_infer, dtypes=NUMERIC_TYPES, attrs={"axis": FROM_ONNX, "keepdims": FROM_ONNX,
    "select_last_index": FROM_ONNX})
def argmax(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Index of the maximum along `axis` (first or last occurrence)."""
    axis = attrs["axis"]
    if attrs["select_last_index"]:
        flipped = np.flip(x, axis=axis)
        idx = x.shape[axis] - 1 - np.argmax(flipped, axis=axis)
    else:
        idx = np.argmax(x, axis=axis)
    if attrs["keepdims"]:
        idx = np.expand_dims(idx, axis)
    return idx.astype(np.int64)



def _det_infer(attrs: dict, x: TensorType) -> TensorType:
    if x.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise MismatchingShape("Det takes square matrices in the last two dims", op="Det", expected="[..., n, n]",
                               found=list(x.shape))
    return TensorType(x.dtype, x.shape[:-2])


@op("Det", infer=_det_infer, dtypes=FLOAT_TYPES, onnx="Det")
def det(attrs: dict, x: np.ndarray) -> np.ndarray:
    """Determinant of each matrix in the last two dims (LU with partial pivoting, in float64)."""
    return np.linalg.det(x.astype(np.float64)).astype(x.dtype)
