"""The host side: offload ONNX subgraphs through ONNXIFI the way Caffe2's OnnxifiOp does.

A framework that splits its net into pieces a backend can run creates one `OnnxifiOp` per offloaded
piece. Ops that share a `model_id:net_pos` key share one backend graph, kept in a reference-counted,
thread-safe `GraphCache`:

* the first op with a key creates the backend and graph, pulling the weights named in the model's
  initializer list out of the workspace *inside that creation step only*, and hands them to
  onnxInitGraph as tensor descriptors (the backend copies them);
* later ops with the same key hit the cached graph and never look for weights again, so the host
  may delete them from its workspace once the first op exists;
* a weight missing from the workspace fails creation with an error naming every unfulfilled
  initializer;
* the graph (and its backend) is released when the last op holding it is closed or collected.

The ONNXIFI functions come from `lib`: the Python layer (`glowpy.onnxifi.api`, default) or the C
library loaded with `load_library()`; both take the same arguments.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np
import onnx

from glowpy.errors import GlowpyError, InvalidModel, Status, UnidentifiedName
from glowpy.onnxifi import api
from glowpy.onnxifi import constants as C
from glowpy.onnxifi.objects import CallError

OK = (Status.SUCCESS, Status.FALLBACK)


def load_library(path: str) -> ctypes.CDLL:
    """Load a built ONNXIFI library with the spec's ctypes signatures on every function."""
    lib = ctypes.CDLL(path)
    for name in C.ALL_FUNCTIONS:
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int32
        fn.argtypes = C.ARGTYPES[name]
    return lib


def _check(status: int, what: str) -> Status:
    status = Status(status)
    if status not in OK:
        detail = api.last_error()  # the same interpreter serves an in-process C library
        raise CallError(status, f"{what} failed with {status.name}" + (f": {detail}" if detail else ""))
    return status


def _descriptor(name: bytes, array: np.ndarray, keep: list) -> C.onnxTensorDescriptorV1:
    code = C.DATATYPE_OF_NUMPY.get(array.dtype)
    if code is None:
        raise CallError(Status.UNSUPPORTED_DATATYPE, f"'{name.decode()}' has element type {array.dtype}, "
                        "which ONNXIFI cannot carry")
    shape = (ctypes.c_uint64 * max(array.ndim, 1))(*array.shape)
    keep.append(shape)
    return C.onnxTensorDescriptorV1(C.TAG_TENSOR_DESCRIPTOR_V1, name, code, C.MEMORY_TYPE_CPU, array.ndim, shape,
                                    array.ctypes.data)


def _descriptors(arrays: Mapping[str, np.ndarray], keep: list) -> Any:
    arr_t = C.onnxTensorDescriptorV1 * max(len(arrays), 1)
    items = []
    for name, a in arrays.items():
        encoded = name.encode()
        keep.extend((encoded, a))
        items.append(_descriptor(encoded, a, keep))
    return arr_t(*items)


class SharedGraph:
    """One backend graph, shared by every op with the same key."""

    def __init__(self, lib: Any, key: str, model: onnx.ModelProto, weights: dict[str, np.ndarray],
                 backend: int | str) -> None:
        self.lib = lib
        self.key = key
        self._run_lock = threading.Lock()
        self._shape_cache: dict[tuple, list[tuple[str, np.dtype, tuple[int, ...]]]] = {}
        self.backend_id = self._pick_backend(backend)
        try:
            self.backend = ctypes.c_void_p()
            _check(lib.onnxInitBackend(self.backend_id, None, ctypes.byref(self.backend)), "onnxInitBackend")
            try:
                data = model.SerializeToString()
                keep: list = []
                descs = _descriptors(weights, keep)
                self.graph = ctypes.c_void_p()
                self.init_status = _check(lib.onnxInitGraph(self.backend, None, len(data), data, len(weights), descs,
                                                            ctypes.byref(self.graph)), f"onnxInitGraph ({key})")
            except BaseException:
                lib.onnxReleaseBackend(self.backend)
                raise
        except BaseException:
            lib.onnxReleaseBackendID(self.backend_id)
            raise
        g = model.graph
        self.input_names = [i.name for i in g.input if i.name not in weights]
        self.model = model  # weight-free: used for output shapes only
        self.output_names = [o.name for o in g.output]

    def _pick_backend(self, backend: int | str) -> ctypes.c_void_p:
        n = ctypes.c_size_t(0)
        self.lib.onnxGetBackendIDs(None, ctypes.byref(n))
        ids = (ctypes.c_void_p * n.value)()
        _check(self.lib.onnxGetBackendIDs(ids, ctypes.byref(n)), "onnxGetBackendIDs")
        chosen = None
        for i, bid in enumerate(ids):
            if isinstance(backend, int):
                match = i == backend
            else:
                size = ctypes.c_size_t(256)
                buf = ctypes.create_string_buffer(256)
                self.lib.onnxGetBackendInfo(bid, C.BACKEND_NAME, buf, ctypes.byref(size))
                match = backend.lower() in buf.value.decode("utf-8", "replace").lower()
            if match and chosen is None:
                chosen = ctypes.c_void_p(bid)
            else:
                self.lib.onnxReleaseBackendID(bid)
        if chosen is None:
            raise CallError(Status.INVALID_ID, f"no ONNXIFI backend matches {backend!r}")
        return chosen

    def output_types(self, inputs: Mapping[str, np.ndarray]) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """Output names, dtypes and shapes for these input shapes (declared, or inferred by onnx)."""
        key = tuple((n, inputs[n].shape) for n in self.input_names)
        hit = self._shape_cache.get(key)
        if hit is not None:
            return hit
        model = self.model
        declared = [_static(o) for o in model.graph.output]
        if any(d is None for d in declared):
            m = onnx.ModelProto()
            m.CopyFrom(model)
            for i in m.graph.input:
                if i.name in inputs:
                    dims = i.type.tensor_type.shape.dim
                    del dims[:]
                    for s in inputs[i.name].shape:
                        dims.add().dim_value = int(s)
            del m.graph.value_info[:]
            for o in m.graph.output:
                o.type.tensor_type.ClearField("shape")
            m = onnx.shape_inference.infer_shapes(m)
            declared = [_static(o) for o in m.graph.output]
        if any(d is None for d in declared):
            raise CallError(Status.UNSUPPORTED_SHAPE, f"{self.key}: output shapes cannot be inferred")
        result = [(o.name, dt, shape) for o, (dt, shape) in zip(model.graph.output, declared)]  # type: ignore[misc]
        self._shape_cache[key] = result
        return result

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise UnidentifiedName(f"{self.key}: no value for input(s) {missing}")
        feeds = {n: np.require(inputs[n], requirements="C") for n in self.input_names}  # 0-d stays 0-d
        outputs = {name: np.empty(shape, dtype) for name, dtype, shape in self.output_types(feeds)}
        keep: list = []
        ins = _descriptors(feeds, keep)
        outs = _descriptors(outputs, keep)
        fence = C.onnxMemoryFenceV1(C.TAG_MEMORY_FENCE_V1, C.SYNCHRONIZATION_EVENT, None)
        # One atomic set-and-run per call, so ops on other threads cannot rebind in between.
        _check(self.lib.onnxSetIOAndRunGraph(self.graph, len(feeds), ins, len(outputs), outs, ctypes.byref(fence)),
               f"onnxSetIOAndRunGraph ({self.key})")
        try:
            _check(self.lib.onnxWaitEvent(fence.event), "onnxWaitEvent")
        finally:
            self.lib.onnxReleaseEvent(fence.event)
        return outputs

    def destroy(self) -> None:
        self.lib.onnxReleaseGraph(self.graph)  # waits for runs in flight
        self.lib.onnxReleaseBackend(self.backend)
        self.lib.onnxReleaseBackendID(self.backend_id)


def _static(info: onnx.ValueInfoProto) -> tuple[np.dtype, tuple[int, ...]] | None:
    t = info.type.tensor_type
    if not t.elem_type or not t.HasField("shape"):
        return None
    dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else 0 for d in t.shape.dim]
    if any(d <= 0 for d in dims):
        return None
    dt = C.NUMPY_DTYPES.get(t.elem_type)
    return None if dt is None else (dt, tuple(dims))


class _Entry:
    __slots__ = ("refs", "graph", "create_lock")

    def __init__(self) -> None:
        self.refs = 0
        self.graph: SharedGraph | None = None
        self.create_lock = threading.Lock()


class GraphCache:
    """Graphs by `model_id:net_pos`, reference counted; creation happens once per key even when many
    threads ask at the same time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def acquire(self, key: str, create: Any) -> SharedGraph:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.refs += 1
        try:
            with entry.create_lock:
                if entry.graph is None:
                    entry.graph = create()
        except BaseException:
            self.release(key)
            raise
        return entry.graph

    def release(self, key: str) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.refs -= 1
            if entry.refs > 0:
                return
            del self._entries[key]
        if entry.graph is not None:
            entry.graph.destroy()

    def refs(self, key: str) -> int:
        with self._lock:
            entry = self._entries.get(key)
            return entry.refs if entry is not None else 0

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


DEFAULT_CACHE = GraphCache()


def _weightless(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The model without initializers, every weight declared as a graph input (descriptors feed them)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    del g.initializer[:]
    declared = {i.name for i in g.input}
    for name, a in weights.items():
        if name not in declared:
            code = C.DATATYPE_OF_NUMPY.get(a.dtype)
            if code is None:
                raise CallError(Status.UNSUPPORTED_DATATYPE, f"weight '{name}' has element type {a.dtype}")
            g.input.append(onnx.helper.make_tensor_value_info(name, code, list(a.shape)))
    return m


class OnnxifiOp:
    """One offloaded subgraph in a host net.

    `model` is the ONNX (sub)model (bytes, path or ModelProto) whose initializer list names its
    weights (their payloads, if any, are ignored: the workspace holds the values); `workspace` maps
    blob names to arrays. Ops with equal `model_id` and `net_pos` share one backend graph.
    """

    def __init__(self, model: bytes | str | onnx.ModelProto, model_id: str, net_pos: int | str,
                 workspace: MutableMapping[str, Any], *, backend: int | str = 0, lib: Any = None,
                 cache: GraphCache | None = None) -> None:
        self.key = f"{model_id}:{net_pos}"
        self.workspace = workspace
        self.cache = cache if cache is not None else DEFAULT_CACHE
        self._lib = lib if lib is not None else api
        self._model = model
        self._backend = backend
        self._closed = True
        self.graph = self.cache.acquire(self.key, self._create)
        self._closed = False
        # Release on garbage collection too, without keeping the op alive.
        self._finalizer = weakref.finalize(self, self.cache.release, self.key)

    def _create(self) -> SharedGraph:
        """Runs once per key (under the cache's creation lock): the only place weights are read."""
        proto = _parse(self._model)
        names = [t.name for t in proto.graph.initializer]
        missing = [n for n in names if n not in self.workspace]
        if missing:
            raise UnidentifiedName(f"{self.key}: unfulfilled initializer(s): {', '.join(missing)} "
                                   "(not in the workspace)", expected=names, found=sorted(set(names) - set(missing)))
        weights = {n: np.require(self.workspace[n], requirements="C") for n in names}
        return SharedGraph(self._lib, self.key, _weightless(proto, weights), weights, self._backend)

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.input_names)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.output_names)

    def run(self, inputs: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Run on `inputs`; without them, read the inputs from the workspace and write the outputs
        back to it (Caffe2's way)."""
        if self._closed:
            raise CallError(Status.INVALID_GRAPH, f"{self.key}: the op is closed")
        if inputs is not None:
            return self.graph.run(inputs)
        feeds = {}
        for n in self.graph.input_names:
            if n not in self.workspace:
                raise UnidentifiedName(f"{self.key}: input '{n}' is not in the workspace")
            feeds[n] = self.workspace[n]
        outputs = self.graph.run(feeds)
        self.workspace.update(outputs)
        return outputs

    def close(self) -> None:
        """Drop this op's reference; the last one releases the graph and its backend."""
        if not self._closed:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> OnnxifiOp:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _parse(model: bytes | str | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as e:  # noqa: BLE001  (protobuf raises several types)
            raise InvalidModel(f"model bytes do not parse: {e}") from None
        return proto
    try:
        return onnx.load(model, load_external_data=False)
    except (OSError, GlowpyError) as e:
        raise InvalidModel(f"cannot read model '{model}': {e}") from None


__all__ = ["DEFAULT_CACHE", "GraphCache", "OnnxifiOp", "SharedGraph", "load_library"]
