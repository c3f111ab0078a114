"""Tensor types of the IR: an element type and a static shape."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np
from onnx import TensorProto

from glowpy.errors import UnsupportedDatatype

# The element types glowpy represents, keyed by the ONNX TensorProto enum (which ONNXIFI shares).
# The short names are what the text form of the IR prints.
_DTYPES: dict[int, tuple[str, np.dtype]] = {
    TensorProto.FLOAT: ("f32", np.dtype(np.float32)),
    TensorProto.DOUBLE: ("f64", np.dtype(np.float64)),
    TensorProto.FLOAT16: ("f16", np.dtype(np.float16)),
    TensorProto.INT8: ("i8", np.dtype(np.int8)),
    TensorProto.UINT8: ("u8", np.dtype(np.uint8)),
    TensorProto.INT16: ("i16", np.dtype(np.int16)),
    TensorProto.UINT16: ("u16", np.dtype(np.uint16)),
    TensorProto.INT32: ("i32", np.dtype(np.int32)),
    TensorProto.UINT32: ("u32", np.dtype(np.uint32)),
    TensorProto.INT64: ("i64", np.dtype(np.int64)),
    TensorProto.UINT64: ("u64", np.dtype(np.uint64)),
    TensorProto.BOOL: ("bool", np.dtype(np.bool_)),
}
_BY_NUMPY = {dt: code for code, (_, dt) in _DTYPES.items()}

FLOAT_TYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)})
INT_TYPES = frozenset(dt for _, dt in _DTYPES.values() if dt.kind in "iu")
NUMERIC_TYPES = FLOAT_TYPES | INT_TYPES
ALL_TYPES = frozenset(dt for _, dt in _DTYPES.values())


def onnx_type_name(elem_type: int) -> str:
    """The ONNX name of an element type code (FLOAT, INT4, ...), or the number when ONNX has none."""
    return TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)


def dtype_from_onnx(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX TensorProto element type; UnsupportedDatatype if glowpy has none."""
    entry = _DTYPES.get(elem_type)
    if entry is None:
        name = onnx_type_name(elem_type)
        raise UnsupportedDatatype(f"element type {name} is not supported")
    return entry[1]


def dtype_to_onnx(dtype: np.dtype) -> int:
    code = _BY_NUMPY.get(np.dtype(dtype))
    if code is None:
        raise UnsupportedDatatype(f"element type {dtype} is not supported")
    return code


def is_supported_onnx_dtype(elem_type: int) -> bool:
    return elem_type in _DTYPES


def dtype_name(dtype: np.dtype) -> str:
    return _DTYPES[_BY_NUMPY[np.dtype(dtype)]][0]


@dataclass(frozen=True)
class TensorType:
    """Element type plus static shape. Every IR value has one."""

    dtype: np.dtype
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{dtype_name(self.dtype)}[{', '.join(map(str, self.shape))}]"

    @staticmethod
    def of(array: np.ndarray) -> TensorType:
        return TensorType(array.dtype, array.shape)
