"""Fixtures for the ONNXIFI tests: the built C library, both implementations, small models."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from glowpy.onnxifi import api
from glowpy.onnxifi import constants as C
from glowpy.onnxifi.build import build
from glowpy.onnxifi.host import load_library

OPSET = [helper.make_opsetid("", 13)]


@pytest.fixture(scope="session")
def lib_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libonnxifi-glowpy.so built into a temp dir (one per test process; about a second)."""
    return build(tmp_path_factory.mktemp("onnxifi-lib"))


@pytest.fixture(scope="session")
def clib(lib_path: Path) -> ctypes.CDLL:
    """The C library loaded into this interpreter (it serves calls with this same interpreter)."""
    return load_library(str(lib_path))


@pytest.fixture(params=["python", "clib"])
def impl(request: pytest.FixtureRequest) -> object:
    """The same ONNXIFI calls on the Python layer and on the C library through ctypes."""
    return api if request.param == "python" else request.getfixturevalue("clib")


# --- models ------------------------------------------------------------------------------------------


def model(nodes, inputs, outputs, initializers=(), opset=OPSET, ir_version=8) -> bytes:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(initializers)), opset_imports=opset)
    m.ir_version = ir_version
    return m.SerializeToString()


def vi(name: str, shape, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


@pytest.fixture(scope="session")
def relu_model() -> bytes:
    return model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])


@pytest.fixture(scope="session")
def add_model() -> bytes:
    """y = x + w, with w a weight given by descriptor (a graph input, no initializer)."""
    return model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [2, 3]), vi("w", [2, 3])], [vi("y", [2, 3])])


@pytest.fixture(scope="session")
def unknown_op_model() -> bytes:
    return model([helper.make_node("FrobnicateX", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])


# --- C structs ---------------------------------------------------------------------------------------


class Tensors:
    """Descriptor arrays that keep their names, shapes and buffers alive."""

    def __init__(self, **arrays: np.ndarray) -> None:
        self.arrays = {k: np.require(v, requirements='C') for k, v in arrays.items()}  # (0-d stays 0-d)
        self._keep: list = []
        self.names: dict[str, ctypes.Array] = {}  # the name buffers, writable
        items = []
        for name, a in self.arrays.items():
            items.append(self.describe(name, a))
        self.array = (C.onnxTensorDescriptorV1 * max(len(items), 1))(*items)
        self.count = len(items)

    def describe(self, name: str, a: np.ndarray, dtype: int | None = None, shape=None) -> C.onnxTensorDescriptorV1:
        shape = a.shape if shape is None else shape
        dims = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
        # a private, writable copy of the name (tests scribble over it; bytes objects are shared)
        encoded = ctypes.create_string_buffer(name.encode())
        self._keep += [dims, encoded, a]
        self.names.setdefault(name, encoded)
        code = C.DATATYPE_OF_NUMPY[a.dtype] if dtype is None else dtype
        return C.onnxTensorDescriptorV1(C.TAG_TENSOR_DESCRIPTOR_V1, ctypes.cast(encoded, ctypes.c_char_p), code,
                                        C.MEMORY_TYPE_CPU, len(shape), dims, a.ctypes.data)

    def __getitem__(self, i: int) -> C.onnxTensorDescriptorV1:
        return self.array[i]


def fence(event=None) -> C.onnxMemoryFenceV1:
    return C.onnxMemoryFenceV1(C.TAG_MEMORY_FENCE_V1, C.SYNCHRONIZATION_EVENT, event)


def backend_ids(lib) -> list[int]:
    n = ctypes.c_size_t(0)
    assert lib.onnxGetBackendIDs(None, ctypes.byref(n)) == 1
    ids = (ctypes.c_void_p * n.value)()
    assert lib.onnxGetBackendIDs(ids, ctypes.byref(n)) == 0
    return [int(i) for i in ids]


def backend_name(lib, bid) -> str:
    size = ctypes.c_size_t(0)
    assert lib.onnxGetBackendInfo(bid, C.BACKEND_NAME, None, ctypes.byref(size)) == 1
    buf = ctypes.create_string_buffer(size.value)
    assert lib.onnxGetBackendInfo(bid, C.BACKEND_NAME, buf, ctypes.byref(size)) == 0
    return buf.value.decode()


@pytest.fixture
def session(impl) -> Iterator[dict]:
    """An interpreter backend on `impl`; everything it made is released afterwards."""
    ids = backend_ids(impl)
    interp = ids[1]
    be = ctypes.c_void_p()
    assert impl.onnxInitBackend(interp, None, ctypes.byref(be)) == 0
    made: dict = {"lib": impl, "id": interp, "ids": ids, "backend": be, "graphs": [], "events": []}
    yield made
    for g in made["graphs"]:
        impl.onnxReleaseGraph(g)
    for e in made["events"]:
        impl.onnxReleaseEvent(e)
    impl.onnxReleaseBackend(be)
    for i in ids:
        impl.onnxReleaseBackendID(i)


def init_graph(s: dict, data: bytes, weights: Tensors | None = None) -> tuple[int, ctypes.c_void_p]:
    g = ctypes.c_void_p()
    status = s["lib"].onnxInitGraph(s["backend"], None, len(data), data, weights.count if weights else 0,
                                    weights.array if weights else None, ctypes.byref(g))
    if g.value:
        s["graphs"].append(g)
    return status, g


def init_event(s: dict) -> ctypes.c_void_p:
    e = ctypes.c_void_p()
    assert s["lib"].onnxInitEvent(s["backend"], ctypes.byref(e)) == 0
    s["events"].append(e)
    return e
