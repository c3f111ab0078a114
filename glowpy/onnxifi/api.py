"""The ONNXIFI 1.0 functions in Python, under their spec names and with their C argument order.

Every function returns a `Status` and never raises: a `GlowpyError` becomes its `.status`,
MemoryError NO_SYSTEM_MEMORY, anything else INTERNAL_ERROR (logged with its traceback). The message
of the last failure on the calling thread is kept for `last_error()`.

Pointer arguments are addresses (ints, as the C library passes them) or ctypes objects, so the same
call works on this module and on the built `libonnxifi-glowpy.so` through ctypes. Out-parameters
follow the spec on failure: `*backend`, `*event`, `*graph`, `*function` become NULL and `*state`
becomes ONNXIFI_EVENT_STATE_INVALID.

Weights (onnxInitGraph) come from exactly one source, never mixed:
  * the model carries initializers with data: those are the weights, and `weightDescriptors` is not
    read at all (logged). This also keeps ONNX's own test driver working, which passes a count of
    initializers with a one-element descriptor array;
  * otherwise the descriptors are the weights. Each names a graph input (or a data-less initializer
    placeholder), is checked and copied during the call; the host may free it on return.
Initializers without data are placeholders that declare a weight by name; a placeholder nobody
fills is an error naming every unfilled weight (UNIDENTIFIED_NAME, logged). Graph inputs that are
not weights are the runtime inputs bound by onnxSetGraphIO.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import threading
from collections.abc import Callable
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from glowpy.compiled import SpecializingModel
from glowpy.errors import (
    GlowpyError,
    InternalError,
    InvalidDatatype,
    InvalidModel,
    InvalidName,
    InvalidShape,
    MismatchingDatatype,
    MismatchingShape,
    Status,
    UnidentifiedName,
    UnsupportedDatatype,
    UnsupportedShape,
)
from glowpy.onnxifi import constants as C
from glowpy.onnxifi import memory as M
from glowpy.onnxifi.objects import (
    BACKEND_IDS,
    BACKENDS,
    EVENTS,
    GRAPHS,
    IDS,
    Backend,
    Binding,
    CallError,
    Compiled,
    Event,
    Graph,
    Port,
    Run,
    hand_out_ids,
    live_counts,
    log,
    release_id,
)

if TYPE_CHECKING:
    from glowpy.importer import DeferredModel

MAX_RANK = 32  # guards against garbage `dimensions` fields (reading 4 billion dims would crash)
MAX_PROPERTIES = 256  # property lists longer than this have no terminator: garbage

_last = threading.local()


def last_error() -> str | None:
    """The message of the last failed ONNXIFI call on this thread (None after a success)."""
    return getattr(_last, "message", None)


def _entry(fn: Callable[..., Status]) -> Callable[..., Status]:
    """The exception barrier around each ONNXIFI function."""

    @functools.wraps(fn)
    def call(*args: Any) -> Status:
        try:
            status = Status(fn(*args))
            _last.message = None
            return status
        except GlowpyError as e:
            status = Status(e.status)
            _last.message = f"{fn.__name__}: {e}"
            log.debug("%s -> %s: %s", fn.__name__, status.name, e)
            return status
        except MemoryError:
            _last.message = f"{fn.__name__}: out of memory"
            log.error("%s: out of memory", fn.__name__)
            return Status.NO_SYSTEM_MEMORY
        except Exception as e:  # noqa: BLE001  (nothing may escape into a host)
            _last.message = f"{fn.__name__}: internal error: {type(e).__name__}: {e}"
            log.exception("%s: internal error", fn.__name__)
            return Status.INTERNAL_ERROR

    return call


def _require(addr: int, what: str) -> int:
    if not addr:
        raise CallError(Status.INVALID_POINTER, f"{what} is NULL")
    return addr


# --- backend IDs ---------------------------------------------------------------------------------


@_entry
def onnxGetBackendIDs(backendIDs: Any, numBackends: Any) -> Status:  # noqa: N802, N803
    num = _require(M.address(numBackends), "numBackends")
    ids_addr = M.address(backendIDs)
    count = len(BACKEND_IDS)
    if not ids_addr or M.read_size(num) < count:
        M.write_size(num, count)  # the number available, as hosts and ONNX's wrapper expect
        return Status.FALLBACK
    for i, h in enumerate(hand_out_ids()):
        M.write_pointer(ids_addr + i * ctypes.sizeof(ctypes.c_void_p), h)
    M.write_size(num, count)
    return Status.SUCCESS


@_entry
def onnxReleaseBackendID(backendID: Any) -> Status:  # noqa: N802, N803
    release_id(M.handle(backendID))
    return Status.SUCCESS


def _device_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _memory_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 32


def _info_value(kind: str, name: str, info: int) -> bytes | None:
    from glowpy import __version__
    from glowpy.importer.onnx_import import MIN_IR_VERSION
    from glowpy.importer.table import MAX_OPSET

    def text(s: str) -> bytes:
        return s.encode() + b"\0"  # sizes count the NUL (hosts read the buffer as a C string)

    def u64(v: int) -> bytes:
        return int(v).to_bytes(8, "little" if np.little_endian else "big")

    values: dict[int, Callable[[], bytes]] = {
        C.BACKEND_ONNXIFI_VERSION: lambda: u64(C.ONNXIFI_VERSION_1_0),
        C.BACKEND_NAME: lambda: text(name),
        C.BACKEND_VENDOR: lambda: text("glowpy"),
        C.BACKEND_VERSION: lambda: text(f"{__version__}-{kind}"),
        C.BACKEND_EXTENSIONS: lambda: text("onnx_extension_function"),
        C.BACKEND_DEVICE: lambda: text(_device_name()),
        C.BACKEND_DEVICE_TYPE: lambda: u64(C.DEVICE_TYPE_CPU),
        C.BACKEND_ONNX_IR_VERSION: lambda: text(" ".join(str(v) for v in range(MIN_IR_VERSION, onnx.IR_VERSION + 1))),
        C.BACKEND_OPSET_VERSION: lambda: text(f"ai.onnx:{MAX_OPSET}"),
        C.BACKEND_CAPABILITIES: lambda: u64(C.CAPABILITY_THREAD_SAFE | C.CAPABILITY_SYMBOLIC_BATCH_SIZE
                                            | C.CAPABILITY_SYMBOLIC_SIZE_TENSORS),
        C.BACKEND_INIT_PROPERTIES: lambda: u64(0),
        C.BACKEND_MEMORY_TYPES: lambda: u64(0),  # CPU (0) only, implied
        C.BACKEND_GRAPH_INIT_PROPERTIES: lambda: u64(0),
        C.BACKEND_SYNCHRONIZATION_TYPES: lambda: u64(0),  # EVENT (0) only, implied
        C.BACKEND_MEMORY_SIZE: lambda: u64(_memory_size()),
        C.BACKEND_MAX_GRAPH_SIZE: lambda: u64(_memory_size()),
        C.BACKEND_MAX_GRAPH_COUNT: lambda: u64(1 << 20),
    }
    get = values.get(info)
    return None if get is None else get()


@_entry
def onnxGetBackendInfo(backendID: Any, infoType: int, infoValue: Any, infoValueSize: Any) -> Status:  # noqa: N802, N803
    bid = IDS.get(M.handle(backendID))
    size_addr = _require(M.address(infoValueSize), "infoValueSize")
    value = _info_value(bid.kind, bid.name, int(infoType))
    if value is None:
        raise CallError(Status.UNSUPPORTED_ATTRIBUTE, f"info type {int(infoType)} is not supported")
    out = M.address(infoValue)
    if not out or M.read_size(size_addr) < len(value):
        M.write_size(size_addr, len(value))
        return Status.FALLBACK
    M.write_bytes(out, value)
    M.write_size(size_addr, len(value))
    return Status.SUCCESS


# --- compatibility -------------------------------------------------------------------------------


def compatibility(model_bytes: bytes, kind: str) -> Status:
    """The importer's walk in its types-only mode (`glowpy.check`): never weight values."""
    from glowpy.pipeline import check

    status = Status(check(model_bytes, backend=kind).status)
    if status in (Status.SUCCESS, Status.FALLBACK) and _backend_missing(kind):
        return Status.FALLBACK  # runs, but on the interpreter standing in for the missing backend
    return status


def _backend_missing(kind: str) -> bool:
    from glowpy.backends import get_backend

    try:
        get_backend(kind)
    except GlowpyError:
        return True
    return False


@_entry
def onnxGetBackendCompatibility(backendID: Any, onnxModelSize: int, onnxModel: Any) -> Status:  # noqa: N802, N803
    bid = IDS.get(M.handle(backendID))
    addr = _require(M.address(onnxModel), "onnxModel")
    if not onnxModelSize:
        raise CallError(Status.INVALID_SIZE, "onnxModelSize is 0")
    return compatibility(M.read_bytes(addr, int(onnxModelSize)), bid.kind)


# --- backends --------------------------------------------------------------------------------------


def _properties(addr: int) -> list[tuple[int, int]]:
    """(id, value) pairs of an aux property list ending with 0; NULL or {0} is empty."""
    pairs: list[tuple[int, int]] = []
    if not addr:
        return pairs
    i = 0
    while True:
        key = ctypes.c_uint64.from_address(addr + 8 * i).value
        if key == C.BACKEND_PROPERTY_NONE:
            return pairs
        if len(pairs) >= MAX_PROPERTIES:
            raise CallError(Status.INVALID_PROPERTY, "property list has no terminating 0")
        pairs.append((key, ctypes.c_uint64.from_address(addr + 8 * (i + 1)).value))
        i += 2


@_entry
def onnxInitBackend(backendID: Any, auxPropertiesList: Any, backend: Any) -> Status:  # noqa: N802, N803
    out = _require(M.address(backend), "backend")
    M.write_pointer(out, 0)
    bid = IDS.get(M.handle(backendID))
    optimization, log_level = None, C.LOG_LEVEL_WARNING
    for key, value in _properties(M.address(auxPropertiesList)):
        if key == C.BACKEND_PROPERTY_OPTIMIZATION:
            if value not in (C.OPTIMIZATION_HIGH_THROUGHPUT, C.OPTIMIZATION_LOW_LATENCY, C.OPTIMIZATION_LOW_POWER,
                             C.OPTIMIZATION_LOW_DELAY):
                raise CallError(Status.INVALID_PROPERTY, f"optimization target {value} is not defined")
            optimization = value
        elif key == C.BACKEND_PROPERTY_LOG_LEVEL:
            if value not in (C.LOG_LEVEL_DEBUG, C.LOG_LEVEL_INFO, C.LOG_LEVEL_WARNING, C.LOG_LEVEL_ERROR):
                raise CallError(Status.INVALID_PROPERTY, f"log level {value} is not defined")
            log_level = value
        else:  # CUDA stream / OpenCL context included: a CPU backend has no use for them
            raise CallError(Status.UNSUPPORTED_PROPERTY, f"backend property {key} is not supported")
    obj = Backend(bid, optimization, log_level)
    obj.executor()  # the compiler loads here, once per backend, so onnxInitGraph pays for its graph only
    BACKENDS.add(obj)
    M.write_pointer(out, obj.handle)
    return Status.SUCCESS


@_entry
def onnxReleaseBackend(backend: Any) -> Status:  # noqa: N802
    obj = BACKENDS.pop(M.handle(backend))
    live = [g for g in GRAPHS.values() if g.backend is obj]
    if live:
        obj.log(C.LOG_LEVEL_WARNING, f"backend released with {len(live)} graph(s) still alive")
    return Status.SUCCESS


# --- events ----------------------------------------------------------------------------------------


@_entry
def onnxInitEvent(backend: Any, event: Any) -> Status:  # noqa: N802
    out = _require(M.address(event), "event")
    M.write_pointer(out, 0)
    obj = Event(BACKENDS.get(M.handle(backend)))
    EVENTS.add(obj)
    M.write_pointer(out, obj.handle)
    return Status.SUCCESS


@_entry
def onnxSignalEvent(event: Any) -> Status:  # noqa: N802
    EVENTS.get(M.handle(event)).signal()
    return Status.SUCCESS


@_entry
def onnxGetEventState(event: Any, state: Any) -> Status:  # noqa: N802
    out = _require(M.address(state), "state")
    M.write_int32(out, C.EVENT_STATE_INVALID)
    M.write_int32(out, EVENTS.get(M.handle(event)).state)
    return Status.SUCCESS


@_entry
def onnxWaitEvent(event: Any) -> Status:  # noqa: N802
    EVENTS.get(M.handle(event)).wait()
    return Status.SUCCESS


@_entry
def onnxReleaseEvent(event: Any) -> Status:  # noqa: N802
    EVENTS.pop(M.handle(event))
    return Status.SUCCESS


# --- tensor descriptors ------------------------------------------------------------------------------


class Descriptor:
    """The parts of an onnxTensorDescriptorV1 glowpy keeps, copied out of host memory."""

    __slots__ = ("name", "code", "dtype", "shape", "buffer")

    def __init__(self, name: str, code: int, dtype: np.dtype, shape: tuple[int, ...], buffer: int) -> None:
        self.name, self.code, self.dtype, self.shape, self.buffer = name, code, dtype, shape, buffer

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize


def read_descriptors(addr: int, count: int, role: str, allowed: set[str]) -> list[Descriptor]:
    """Check descriptors one by one, in the order of onnxifi-spec §6.10: tag, name, repeat, data type,
    memory type, location, shape. `allowed` are the names this role may bind."""
    out: list[Descriptor] = []
    seen: set[str] = set()
    for i in range(count):
        base = addr + i * C.DESCRIPTOR_SIZE
        tag = ctypes.c_int32.from_address(base).value  # the tag first, before any other field
        if tag != C.TAG_TENSOR_DESCRIPTOR_V1:
            raise CallError(Status.UNSUPPORTED_TAG, f"{role} descriptor {i} has tag 0x{tag & 0xFFFFFFFF:08x}",
                            expected=f"0x{C.TAG_TENSOR_DESCRIPTOR_V1:08x}", found=f"0x{tag & 0xFFFFFFFF:08x}")
        d = C.onnxTensorDescriptorV1.from_address(base)
        raw = M.read_cstring(ctypes.c_void_p.from_address(base + C.onnxTensorDescriptorV1.name.offset).value or 0)
        try:
            name = raw.decode("utf-8") if raw is not None else None
        except UnicodeDecodeError:
            name = None
        if name is None or name not in allowed:
            shown = name if name is not None else "NULL or not UTF-8"
            raise InvalidName(f"{role} descriptor {i} names no {role} of the graph", expected=sorted(allowed)[:20],
                              found=shown)
        if name in seen:
            raise InvalidName(f"{role} '{name}' is given twice", found=name)
        seen.add(name)
        code = int(d.dataType)
        if code not in C.KNOWN_DATATYPES:
            raise InvalidDatatype(f"{role} '{name}' has data type {code}, unknown to ONNXIFI", found=code)
        dtype = C.NUMPY_DTYPES.get(code)
        if dtype is None:
            raise UnsupportedDatatype(f"{role} '{name}' has data type {code}, which glowpy does not compute with",
                                      found=code)
        mem = int(d.memoryType)
        if mem not in C.KNOWN_MEMORY_TYPES:
            raise CallError(Status.INVALID_MEMORY_TYPE, f"{role} '{name}' has memory type {mem}, unknown to ONNXIFI")
        if mem != C.MEMORY_TYPE_CPU:
            raise CallError(Status.UNSUPPORTED_MEMORY_TYPE, f"{role} '{name}' is not in CPU memory", found=mem)
        if not d.buffer:
            raise CallError(Status.INVALID_MEMORY_LOCATION, f"{role} '{name}' has a NULL buffer")
        rank = int(d.dimensions)
        if rank > MAX_RANK:
            raise UnsupportedShape(f"{role} '{name}' has rank {rank}", expected=f"at most {MAX_RANK}", found=rank)
        shape_addr = ctypes.cast(d.shape, ctypes.c_void_p).value or 0
        if rank and not shape_addr:
            raise CallError(Status.INVALID_POINTER, f"{role} '{name}' has rank {rank} and a NULL shape")
        shape = tuple(M.read_u64_array(shape_addr, rank))
        if any(s == 0 for s in shape):
            raise InvalidShape(f"{role} '{name}' has a zero dim", found=list(shape))
        out.append(Descriptor(name, code, dtype, shape, int(d.buffer)))
    return out


def _check_declared(desc: Descriptor, dtype: np.dtype | None, dims: tuple | None, role: str) -> None:
    if dtype is not None and desc.dtype != dtype:
        raise MismatchingDatatype(f"{role} '{desc.name}' has the wrong element type", expected=str(dtype),
                                  found=str(desc.dtype))
    if dims is not None:
        if len(dims) != len(desc.shape) or any(isinstance(m, int) and m > 0 and m != s
                                               for m, s in zip(dims, desc.shape)):
            raise MismatchingShape(f"{role} '{desc.name}' has the wrong shape",
                                   expected=[d if isinstance(d, int) and d > 0 else "?" for d in dims],
                                   found=list(desc.shape))


# --- graphs ------------------------------------------------------------------------------------------

_PAYLOAD_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def is_placeholder(t: onnx.TensorProto) -> bool:
    """An initializer that declares a weight by name but carries no data."""
    if t.data_location == onnx.TensorProto.EXTERNAL or t.HasField("raw_data"):
        return False
    if any(len(getattr(t, f)) for f in _PAYLOAD_FIELDS):
        return False
    return prod(t.dims) != 0  # a tensor with a zero dim legitimately has no data


def _port(info: onnx.ValueInfoProto) -> Port:
    from glowpy.importer.onnx_import import declared_type

    dtype, dims = declared_type(info)
    return Port(info.name, dtype, tuple(dims) if dims is not None else None)


class HostWeights:
    """The weights of one onnxInitGraph under the one-source rule (module docstring). Descriptor
    weights are read where the host keeps them, which is valid only until InitGraph returns: they are
    hashed in place for the model-cache key, and copied into the model as initializers only when a
    compile needs them (`model()` on a cache miss, or `copy()`), so nothing of the host's memory is kept."""

    def __init__(self, proto: onnx.ModelProto, addr: int, count: int, backend: Backend) -> None:
        g = proto.graph
        real = [t for t in g.initializer if not is_placeholder(t)]
        placeholders = {t.name: t for t in g.initializer if is_placeholder(t)}
        self.proto = proto
        self.given: list[Descriptor] = []
        if real:
            if count:
                backend.log(C.LOG_LEVEL_WARNING, f"model carries {len(real)} initializer(s): using them, ignoring "
                            f"{count} weight descriptor(s) (weights never come from both)")
        else:
            declared = {i.name: i for i in g.input}
            for d in read_descriptors(addr, count, "weight", set(declared) | set(placeholders)):
                if d.name in declared:
                    p = _port(declared[d.name])
                    _check_declared(d, p.dtype, p.dims, "weight")
                else:
                    ph = placeholders[d.name]
                    _check_declared(d, C.NUMPY_DTYPES.get(ph.data_type) if ph.data_type else None,
                                    tuple(ph.dims) if len(ph.dims) else None, "weight")
                self.given.append(d)
        missing = [n for n in placeholders if n not in {d.name for d in self.given}]
        if missing:
            msg = f"weight(s) declared by the model but given by nobody: {', '.join(missing)}"
            backend.log(C.LOG_LEVEL_ERROR, msg)
            raise UnidentifiedName(msg, expected=missing, found=sorted(d.name for d in self.given))
        if placeholders:
            keep = [t for t in g.initializer if not is_placeholder(t)]
            del g.initializer[:]
            g.initializer.extend(keep)
        self.names = {t.name for t in g.initializer} | {d.name for d in self.given}
        self._open = bool(self.given)  # host buffers not yet copied
        self._gone = False  # closed before they were copied

    def model(self) -> onnx.ModelProto | DeferredModel:
        """What the compile gets: the proto itself once nothing is pending, else a DeferredModel."""
        if not self._open:
            return self.copy()
        from glowpy.importer import DeferredModel
        from glowpy.importer.digest import content_digest

        parts: list[bytes | memoryview] = [b"onnxifi-model", self.proto.SerializeToString()]
        for d in self.given:
            parts += [f"{d.name}\0{d.code}\0{d.shape}".encode(), M.view_bytes(d.buffer, d.nbytes)]
        # hashed in place: the host's buffers are read, not copied
        return DeferredModel(content_digest(*parts), self.copy)

    def copy(self) -> onnx.ModelProto:
        """Copy the descriptor weights into the proto (once); afterwards the host may free them."""
        if self._gone:
            raise InternalError("the host's weights were needed after onnxInitGraph returned",
                                expected="a compile during onnxInitGraph", found="a compile after it")
        if self._open:
            init = self.proto.graph.initializer
            for d in self.given:
                t = init.add(name=d.name, data_type=d.code, dims=list(d.shape))
                t.raw_data = M.read_bytes(d.buffer, d.nbytes)
            self._open = False
        return self.proto

    def close(self) -> None:
        """InitGraph returns: the host's buffers are no longer ours to read."""
        self._gone = self._open
        self._open = False


class _Dispatch:
    """The executable face of a SpecializingModel: operands that decide shapes (and unbound dims) are
    read from the host's buffers at RunGraph, and each distinct key compiles once (cached, bounded)."""

    arena_size = 0

    def __init__(self, model: SpecializingModel) -> None:
        self.model = model

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = self.model.run(dict(zip(self.model.input_names, arrays)))
        return [out[n] for n in self.model.output_names]


def _make_compiler(backend: Backend, weights: HostWeights, inputs: list[Port],
                   outputs: list[Port]) -> Callable[[dict[str, tuple[int, ...]] | None], Compiled]:
    def compile_for(shapes: dict[str, tuple[int, ...]] | None) -> Compiled:
        from glowpy.pipeline import compile_model

        executor, _ = backend.executor()
        model = compile_model(weights.model(), executor, shapes)  # the pipeline glowpy.compile runs
        if isinstance(model, SpecializingModel):
            # Shape-deciding operands are run-time inputs: their values come with RunGraph (the
            # pipeline's check has refused what no value could make work).
            given = shapes or {}
            return Compiled(_Dispatch(model), tuple(p.name for p in inputs),
                            tuple((p.dtype, tuple(given[p.name]) if p.name in given else p.dims) for p in inputs),
                            tuple((p.dtype, p.dims) for p in outputs), model)
        ir = model.graph
        if len(ir.outputs) != len(outputs):
            raise InvalidModel("the compiled graph has a different number of outputs", expected=len(outputs),
                               found=len(ir.outputs))
        return Compiled(model.executable, tuple(v.name for v in ir.inputs),
                        tuple((v.dtype, tuple(v.shape)) for v in ir.inputs),
                        tuple((v.dtype, tuple(v.shape)) for v in ir.outputs), model)

    return compile_for


@_entry
def onnxInitGraph(backend: Any, auxPropertiesList: Any, onnxModelSize: int, onnxModel: Any,  # noqa: N802, N803
                  weightsCount: int, weightDescriptors: Any, graph: Any) -> Status:  # noqa: N803
    out = _require(M.address(graph), "graph")
    M.write_pointer(out, 0)
    be = BACKENDS.get(M.handle(backend))
    model_addr = _require(M.address(onnxModel), "onnxModel")
    weights_addr = M.address(weightDescriptors)
    if weightsCount and not weights_addr:
        raise CallError(Status.INVALID_POINTER, f"weightDescriptors is NULL with weightsCount {weightsCount}")
    if not onnxModelSize:
        raise CallError(Status.INVALID_SIZE, "onnxModelSize is 0")
    for key, _ in _properties(M.address(auxPropertiesList)):
        raise CallError(Status.UNSUPPORTED_PROPERTY, f"graph property {key} is not supported")

    from glowpy.importer.onnx_import import model_opsets, parse_model_bytes

    proto = parse_model_bytes(M.read_bytes(model_addr, int(onnxModelSize)))  # the model bytes die on return
    model_opsets(proto)
    weights = HostWeights(proto, weights_addr, int(weightsCount), be)
    inputs = [_port(i) for i in proto.graph.input if i.name not in weights.names]
    outputs = [_port(o) for o in proto.graph.output]
    if not outputs:
        raise InvalidModel("the model has no outputs")
    names = [p.name for p in inputs + outputs]
    if len(set(names)) != len(names):
        raise InvalidModel("a graph input or output name is repeated")
    for p in inputs:
        if p.dtype is None:
            raise UnsupportedDatatype(f"graph input '{p.name}' declares no element type")
    g = Graph(be, proto, inputs, outputs, _make_compiler(be, weights, inputs, outputs))
    _, emulated = be.executor()
    try:
        if g.is_static:
            g.precompile()  # a model-cache hit never copies the host's weights
        else:  # symbolic dims: compiled per binding at SetGraphIO; check the ops now
            weights.copy()
            _gate_nodes_of(proto)
    finally:
        weights.close()
    be.log(C.LOG_LEVEL_DEBUG, f"graph: {len(inputs)} input(s), {len(outputs)} output(s), {len(weights.names)} weight(s)"
           + ("" if g.is_static else ", symbolic dims"))
    GRAPHS.add(g)
    M.write_pointer(out, g.handle)
    return Status.FALLBACK if emulated else Status.SUCCESS


def _gate_nodes_of(proto: onnx.ModelProto) -> None:
    from glowpy.importer.onnx_import import model_opsets
    from glowpy.importer.table import check_node

    opsets = model_opsets(proto)
    for node in proto.graph.node:
        check_node(node, opsets, [])


def _bind(g: Graph, in_count: int, in_addr: int, out_count: int, out_addr: int) -> Binding:
    if not out_addr:
        raise CallError(Status.INVALID_POINTER, "outputDescriptors is NULL")
    if in_count and not in_addr:
        raise CallError(Status.INVALID_POINTER, f"inputDescriptors is NULL with inputsCount {in_count}")
    ins = read_descriptors(in_addr, in_count, "input", {p.name for p in g.inputs})
    outs = read_descriptors(out_addr, out_count, "output", {p.name for p in g.outputs})
    by_in = {d.name: d for d in ins}
    by_out = {d.name: d for d in outs}
    for role, ports, given in (("input", g.inputs, by_in), ("output", g.outputs, by_out)):
        missing = [p.name for p in ports if p.name not in given]
        if missing:
            raise UnidentifiedName(f"graph {role}(s) without a descriptor: {missing}", expected=[p.name for p in ports],
                                   found=sorted(given))
    for p in g.inputs:
        _check_declared(by_in[p.name], p.dtype, p.dims, "input")
    for p in g.outputs:
        _check_declared(by_out[p.name], p.dtype, p.dims, "output")
    compiled = g.compiled_for({p.name: by_in[p.name].shape for p in g.inputs})
    for name, (dtype, shape) in zip(compiled.input_names, compiled.input_types):
        d = by_in.get(name)
        if d is None:
            raise UnidentifiedName(f"compiled graph input '{name}' has no descriptor")
        _check_declared(d, dtype, shape, "input")
    for p, (dtype, shape) in zip(g.outputs, compiled.output_types):
        _check_declared(by_out[p.name], dtype, shape, "output")
    return Binding(compiled,
                   tuple((by_in[n].buffer, by_in[n].dtype, by_in[n].shape) for n in compiled.input_names),
                   tuple((by_out[p.name].buffer, by_out[p.name].dtype, by_out[p.name].shape) for p in g.outputs))


def _set_io(g: Graph, in_count: int, in_addr: Any, out_count: int, out_addr: Any) -> None:
    g.binding = None  # a failed SetGraphIO leaves the graph unbound
    g.binding = _bind(g, int(in_count), M.address(in_addr), int(out_count), M.address(out_addr))


@_entry
def onnxSetGraphIO(graph: Any, inputsCount: int, inputDescriptors: Any, outputsCount: int,  # noqa: N802, N803
                   outputDescriptors: Any) -> Status:  # noqa: N803
    g = GRAPHS.get(M.handle(graph))
    with g.lock:
        _set_io(g, inputsCount, inputDescriptors, outputsCount, outputDescriptors)
    return Status.SUCCESS


def _fence(addr: int, role: str) -> C.onnxMemoryFenceV1:
    tag = ctypes.c_int32.from_address(addr).value
    if tag != C.TAG_MEMORY_FENCE_V1:
        raise CallError(Status.UNSUPPORTED_TAG, f"{role} fence has tag 0x{tag & 0xFFFFFFFF:08x}",
                        expected=f"0x{C.TAG_MEMORY_FENCE_V1:08x}", found=f"0x{tag & 0xFFFFFFFF:08x}")
    fence = C.onnxMemoryFenceV1.from_address(addr)
    if fence.type not in C.KNOWN_FENCE_TYPES:
        raise CallError(Status.INVALID_FENCE_TYPE, f"{role} fence type {fence.type} is not defined")
    if fence.type != C.SYNCHRONIZATION_EVENT:
        raise CallError(Status.UNSUPPORTED_FENCE_TYPE, f"{role} fence type {fence.type} is not supported")
    return fence


def _schedule(g: Graph, input_event: Event | None, out_fence_addr: int) -> None:
    if g.closed:
        raise CallError(Status.INVALID_GRAPH, f"graph 0x{g.handle:x} is being released")
    if g.binding is None:
        raise UnidentifiedName("the graph has no valid I/O binding (call onnxSetGraphIO first)")
    done = Event(g.backend)
    EVENTS.add(done)
    ctypes.c_void_p.from_address(out_fence_addr + 16).value = done.handle  # overwrite whatever was there
    g.submit(Run(g.binding, input_event, done))


@_entry
def onnxRunGraph(graph: Any, inputFence: Any, outputFence: Any) -> Status:  # noqa: N802, N803
    g = GRAPHS.get(M.handle(graph))
    in_addr = _require(M.address(inputFence), "inputFence")
    out_addr = _require(M.address(outputFence), "outputFence")
    fin = _fence(in_addr, "input")
    _fence(out_addr, "output")
    ev = EVENTS.get(fin.event or 0) if fin.event else None
    if ev is None:
        raise CallError(Status.INVALID_EVENT, "input fence has a NULL event")
    with g.lock:
        _schedule(g, ev, out_addr)
    return Status.SUCCESS


@_entry
def onnxReleaseGraph(graph: Any) -> Status:  # noqa: N802
    g = GRAPHS.pop(M.handle(graph))
    g.close()  # blocks until the runs in flight finish
    # An embedding host may exit without finalizing Python, which would drop a cache write in flight.
    g.backend.executor()[0].flush_compiled()
    return Status.SUCCESS


# --- extensions --------------------------------------------------------------------------------------


@_entry
def onnxSetIOAndRunGraph(graph: Any, inputsCount: int, inputDescriptors: Any, outputsCount: int,  # noqa: N802, N803
                         outputDescriptors: Any, outputFence: Any) -> Status:  # noqa: N803
    g = GRAPHS.get(M.handle(graph))
    out_addr = _require(M.address(outputFence), "outputFence")
    _fence(out_addr, "output")
    with g.lock:  # one atomic step: no other SetGraphIO or run can slip in between
        _set_io(g, inputsCount, inputDescriptors, outputsCount, outputDescriptors)
        _schedule(g, None, out_addr)  # inputs are ready when the call is made
    return Status.SUCCESS


# Address of each extension function by name. The C library installs the addresses of its own
# exports; used alone, the Python layer hands out ctypes thunks over the functions here.
EXTENSION_ADDRESSES: dict[str, int] = {}
_thunks: dict[str, Any] = {}


def _python_extension_address(name: str) -> int:
    thunk = _thunks.get(name)
    if thunk is None:
        proto = ctypes.CFUNCTYPE(ctypes.c_int32, *C.ARGTYPES[name])
        thunk = _thunks[name] = proto(globals()[name])
    return ctypes.cast(thunk, ctypes.c_void_p).value or 0


@_entry
def onnxGetExtensionFunctionAddress(backendID: Any, name: Any, function: Any) -> Status:  # noqa: N802, N803
    out = _require(M.address(function), "function")
    M.write_pointer(out, 0)
    IDS.get(M.handle(backendID))
    if isinstance(name, str):
        name = name.encode()
    raw = M.read_cstring(_require(M.address(name), "name"))
    text = raw.decode("utf-8", "replace") if raw is not None else ""
    if text not in C.EXTENSION_FUNCTIONS:
        raise UnidentifiedName(f"no extension function named '{text[:80]}'", expected=list(C.EXTENSION_FUNCTIONS),
                               found=text[:80])
    addr = EXTENSION_ADDRESSES.get(text) or _python_extension_address(text)
    M.write_pointer(out, addr)
    return Status.SUCCESS


__all__ = list(C.ALL_FUNCTIONS) + ["Descriptor", "compatibility", "is_placeholder", "last_error", "live_counts",
                                   "read_descriptors"]
