"""Reductions over a static set of axes: ReduceSum / ReduceMean / ReduceMax / ReduceMin / ReduceProd.

`axes` are normalized by the importer (non-negative, sorted; () means every axis); ReduceL1, ReduceL2,
ReduceSumSquare, ReduceLogSum and ReduceLogSumExp import as compositions of these and elementwise ops.
Over an empty set (a reduced axis of size 0) each gives its identity: 0, 1, the lowest value for max
and the highest for min (ONNX's definitions); the mean of nothing is NaN.
"""

from __future__ import annotations

import numpy as np

from glowpy.errors import UnsupportedAttribute
from glowpy.ir.ops.registry import FROM_ONNX, op
from glowpy.ir.types import NUMERIC_TYPES, TensorType


def _reduce_infer(name: str):
    def infer(attrs: dict, x: TensorType) -> TensorType:
        for a in attrs["axes"]:
            if not -x.rank <= a < x.rank:
                raise UnsupportedAttribute("axis out of range", op=name, expected=f"-{x.rank}..{x.rank - 1}", found=a)
        axes = {a % x.rank for a in attrs["axes"]} if attrs["axes"] else set(range(x.rank))
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return TensorType(x.dtype, shape)

    return infer


def _extreme(dtype: np.dtype, highest: bool):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.inf if highest else -np.inf
    info = np.iinfo(dt)
    return info.max if highest else info.min


_FNS = {
    "ReduceSum": lambda x, **k: np.sum(x, **k),
    "ReduceMean": lambda x, **k: np.mean(x, **k),
    "ReduceMax": lambda x, **k: np.max(x, initial=_extreme(x.dtype, False), **k),
    "ReduceMin": lambda x, **k: np.min(x, initial=_extreme(x.dtype, True), **k),
    "ReduceProd": lambda x, **k: np.prod(x, **k),
}


def _reduce(name: str) -> None:
    fn = _FNS[name]

    def compute(attrs: dict, x: np.ndarray) -> np.ndarray:
        axes = tuple(attrs["axes"]) if attrs["axes"] else None
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(fn(x, axis=axes, keepdims=bool(attrs["keepdims"]))).astype(x.dtype)

    compute.__doc__ = f"{name[6:]} over `axes` (every axis when empty); keepdims keeps them as size 1."
    op(name, infer=_reduce_infer(name), dtypes=NUMERIC_TYPES, attrs={"axes": (), "keepdims": FROM_ONNX})(compute)


for _name in _FNS:
    _reduce(_name)
