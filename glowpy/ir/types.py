"""Tensor types of the IR: an element type and a static shape."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import ml_dtypes
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
    # bfloat16 is a full element type, computed in float32 (numpy arrays through ml_dtypes).
    TensorProto.BFLOAT16: ("bf16", np.dtype(ml_dtypes.bfloat16)),
}
# Storage-only types (STORAGE_TYPES): converted (Cast, CastLike, QuantizeLinear / DequantizeLinear) and moved
# (Reshape, Transpose, Concat, Gather, ...), never computed on. Every one holds one element per byte
# (ml_dtypes' layout: a sub-byte integer in the low bits, not sign-extended); ONNX's packed initializers
# are unpacked at import (numpy_helper.to_array).
_STORAGE_DTYPES: dict[int, tuple[str, np.dtype]] = {
    TensorProto.FLOAT8E4M3FN: ("f8e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn)),
    TensorProto.FLOAT8E4M3FNUZ: ("f8e4m3fnuz", np.dtype(ml_dtypes.float8_e4m3fnuz)),
    TensorProto.FLOAT8E5M2: ("f8e5m2", np.dtype(ml_dtypes.float8_e5m2)),
    TensorProto.FLOAT8E5M2FNUZ: ("f8e5m2fnuz", np.dtype(ml_dtypes.float8_e5m2fnuz)),
    TensorProto.FLOAT8E8M0: ("f8e8m0", np.dtype(ml_dtypes.float8_e8m0fnu)),
    TensorProto.FLOAT4E2M1: ("f4e2m1", np.dtype(ml_dtypes.float4_e2m1fn)),
    TensorProto.INT4: ("i4", np.dtype(ml_dtypes.int4)),
    TensorProto.UINT4: ("u4", np.dtype(ml_dtypes.uint4)),
    TensorProto.INT2: ("i2", np.dtype(ml_dtypes.int2)),
    TensorProto.UINT2: ("u2", np.dtype(ml_dtypes.uint2)),
}
_DTYPES.update(_STORAGE_DTYPES)
_BY_NUMPY = {dt: code for code, (_, dt) in _DTYPES.items()}

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_TYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BFLOAT16})
INT_TYPES = frozenset(dt for _, dt in _DTYPES.values() if dt.kind in "iu")
NUMERIC_TYPES = FLOAT_TYPES | INT_TYPES
STORAGE_TYPES = frozenset(dt for _, dt in _STORAGE_DTYPES.values())
# The types ops compute on; ANY_TYPES adds the storage types (movement ops, Cast, graph inputs / outputs).
ALL_TYPES = frozenset(dt for _, dt in _DTYPES.values()) - STORAGE_TYPES
ANY_TYPES = ALL_TYPES | STORAGE_TYPES
LOWFLOAT_TYPES = frozenset(STORAGE_TYPES - {np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2,
                                                                 ml_dtypes.uint2)})
SUBBYTE_INT_TYPES = STORAGE_TYPES - LOWFLOAT_TYPES


def is_float_dtype(dtype: np.dtype) -> bool:
    """A float type ops compute on (float16/32/64, bfloat16); ml_dtypes' kinds are not reliable."""
    return np.dtype(dtype) in FLOAT_TYPES


def int_range(dtype: np.dtype) -> tuple[int, int]:
    """(min, max) of an integer type, the sub-byte ones included."""
    info = ml_dtypes.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


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
