"""Raw-memory access for the ONNXIFI layer: every pointer argument arrives as an address.

The C library (cffi) passes plain integers; Python callers may pass ints, None, ctypes pointers,
arrays, structures, `byref()` objects or bytes. `address()` reduces all of these to an int so the API
functions have one code path, and the readers/writers below touch memory only through ctypes.
"""

from __future__ import annotations

import ctypes
from math import prod
from typing import Any

import numpy as np

_SIZE_T = ctypes.c_size_t
_U64 = ctypes.c_uint64


def address(x: Any) -> int:
    """The address a pointer-like argument stands for (0 for NULL)."""
    if x is None:
        return 0
    if isinstance(x, bool):
        raise TypeError("a bool is not a pointer")
    if isinstance(x, int):
        return x
    if isinstance(x, bytes):
        return ctypes.cast(ctypes.c_char_p(x), ctypes.c_void_p).value or 0
    if isinstance(x, (bytearray, memoryview)):
        if len(x) == 0:
            return 0
        return ctypes.addressof((ctypes.c_char * len(x)).from_buffer(x))
    if isinstance(x, ctypes.c_void_p):  # a handle value held in a ctypes box
        return x.value or 0
    if isinstance(x, (ctypes._Pointer, ctypes.c_char_p)):
        return ctypes.cast(x, ctypes.c_void_p).value or 0
    if isinstance(x, (ctypes.Array, ctypes.Structure, ctypes.Union, ctypes._SimpleCData)):
        return ctypes.addressof(x)
    if type(x).__name__ == "CArgObject":  # ctypes.byref(...)
        return ctypes.cast(x, ctypes.c_void_p).value or 0
    raise TypeError(f"cannot use {type(x).__name__} as a pointer")


def handle(x: Any) -> int:
    """A handle argument (onnxBackendID, onnxBackend, onnxGraph, onnxEvent) as an int."""
    if x is None:
        return 0
    if isinstance(x, ctypes.c_void_p):
        return x.value or 0
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    raise TypeError(f"cannot use {type(x).__name__} as a handle")


def read_size(addr: int) -> int:
    return _SIZE_T.from_address(addr).value


def write_size(addr: int, value: int) -> None:
    _SIZE_T.from_address(addr).value = value


def write_pointer(addr: int, value: int) -> None:
    ctypes.c_void_p.from_address(addr).value = value or None


def write_int32(addr: int, value: int) -> None:
    ctypes.c_int32.from_address(addr).value = value


def read_bytes(addr: int, n: int) -> bytes:
    return ctypes.string_at(addr, n)


def view_bytes(addr: int, n: int) -> memoryview:
    """The n bytes at addr, in place (no copy): valid only while their owner keeps them."""
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B") if n else memoryview(b"")


def write_bytes(addr: int, data: bytes) -> None:
    ctypes.memmove(addr, data, len(data))


def read_u64_array(addr: int, n: int) -> list[int]:
    return list((_U64 * n).from_address(addr)) if n else []


def read_cstring(addr: int, limit: int = 1 << 16) -> bytes | None:
    """A NUL-terminated string, or None past `limit` bytes (garbage, not a name)."""
    if not addr:
        return None
    data = ctypes.string_at(addr)
    return data if len(data) <= limit else None


def wrap(addr: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A numpy view of host memory, no copy: the host's buffer is read and written in place."""
    nbytes = prod(shape) * dtype.itemsize
    return np.frombuffer((ctypes.c_char * nbytes).from_address(addr), dtype).reshape(shape)
