"""The objects behind ONNXIFI handles: backend IDs, backends, events, graphs, and their registry.

Handles are integers handed out by one counter and never reused, so a released or foreign handle is
simply absent from its kind's table and the API answers INVALID_ID / _BACKEND / _GRAPH / _EVENT.
Each graph owns one worker thread: runs of a graph execute in order, runs of different graphs in
parallel (numpy and the JIT release the GIL while they compute).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from glowpy.errors import GlowpyError, InternalError, Status
from glowpy.onnxifi import constants as C
from glowpy.onnxifi.memory import wrap

log = logging.getLogger("glowpy.onnxifi")


class CallError(GlowpyError):
    """An ONNXIFI argument error that has no class in glowpy.errors (bad handle, NULL, tag...)."""

    def __init__(self, status: Status, message: str, **context: Any) -> None:
        self.status = status
        super().__init__(message, **context)


# Handles look like pointers (8-aligned, far from 0) and never repeat within a process.
_counter = itertools.count(0x6C0FF1F0000, 8)
_counter_lock = threading.Lock()


def new_handle() -> int:
    with _counter_lock:
        return next(_counter)


class Table:
    """One kind of handle: int -> object, thread-safe."""

    def __init__(self, kind: str, status: Status) -> None:
        self.kind = kind
        self.status = status
        self._lock = threading.Lock()
        self._objects: dict[int, Any] = {}

    def add(self, obj: Any) -> int:
        with self._lock:
            self._objects[obj.handle] = obj
        return obj.handle

    def get(self, h: int) -> Any:
        with self._lock:
            obj = self._objects.get(h)
        if obj is None:
            raise CallError(self.status, f"0x{h:x} is not a live {self.kind} of this library")
        return obj

    def pop(self, h: int) -> Any:
        with self._lock:
            obj = self._objects.pop(h, None)
        if obj is None:
            raise CallError(self.status, f"0x{h:x} is not a live {self.kind} of this library")
        return obj

    def values(self) -> list[Any]:
        with self._lock:
            return list(self._objects.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)


# --- backend IDs and backends ------------------------------------------------------------------


@dataclass
class BackendId:
    """One enumerable backend. The handle value is stable for the process; it is valid while the
    host holds at least one reference from onnxGetBackendIDs (onnxReleaseBackendID drops one)."""

    kind: str  # the glowpy.backends name it compiles with
    name: str  # ONNXIFI_BACKEND_NAME
    handle: int = field(default_factory=new_handle)
    refs: int = 0


class Backend:
    """An initialised backend. The glowpy backend object is created lazily; a backend that has not
    landed (its factory raises) runs on the interpreter and every graph reports FALLBACK."""

    def __init__(self, backend_id: BackendId, optimization: int | None, log_level: int) -> None:
        self.handle = new_handle()
        self.id = backend_id
        self.optimization = optimization
        self.log_level = log_level
        self._lock = threading.Lock()
        self._executor: Any = None
        self.emulated = False

    def executor(self) -> tuple[Any, bool]:
        """(glowpy Backend, emulated?). Emulated means the requested backend is missing and the
        interpreter stands in for it."""
        with self._lock:
            if self._executor is None:
                import glowpy.pipeline  # noqa: F401  (what every compile runs: load it with the backend)
                from glowpy.backends import get_backend

                try:
                    self._executor = get_backend(self.id.kind)
                except GlowpyError as e:
                    self.log(C.LOG_LEVEL_WARNING, f"backend '{self.id.kind}' unavailable ({e}); "
                             "graphs run on the interpreter and report FALLBACK")
                    self._executor = get_backend("interpreter")
                    self.emulated = True
            return self._executor, self.emulated

    def log(self, level: int, message: str) -> None:
        """Log honouring ONNXIFI_BACKEND_PROPERTY_LOG_LEVEL (a higher number is less verbose)."""
        if level >= self.log_level:
            py_level = {C.LOG_LEVEL_DEBUG: logging.DEBUG, C.LOG_LEVEL_INFO: logging.INFO,
                        C.LOG_LEVEL_WARNING: logging.WARNING}.get(level, logging.ERROR)
            log.log(py_level, message)


# --- events -------------------------------------------------------------------------------------


class Event:
    """A single-shot event: NONSIGNALLED until signalled once."""

    def __init__(self, backend: Backend) -> None:
        self.handle = new_handle()
        self.backend = backend
        self._flag = threading.Event()
        self._lock = threading.Lock()

    @property
    def state(self) -> int:
        return C.EVENT_STATE_SIGNALLED if self._flag.is_set() else C.EVENT_STATE_NONSIGNALLED

    def signal(self) -> None:
        with self._lock:
            if self._flag.is_set():
                raise CallError(Status.INVALID_STATE, f"event 0x{self.handle:x} is already signalled")
            self._flag.set()

    def set_quietly(self) -> None:
        """Signal from the backend side (the end of a run); never raises."""
        with self._lock:
            self._flag.set()

    def wait(self) -> None:
        self._flag.wait()


# --- graphs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Port:
    """A graph input or output as the model declares it: dims are ints, symbols or None."""

    name: str
    dtype: np.dtype | None
    dims: tuple[int | str | None, ...] | None

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        if self.dims is None or not all(isinstance(d, int) and d > 0 for d in self.dims):
            return None
        return tuple(int(d) for d in self.dims)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Compiled:
    """One compilation of a graph (one per binding of symbolic dims)."""

    executable: Any
    input_names: tuple[str, ...]  # the executable's input order
    input_types: tuple[tuple[np.dtype, tuple[int, ...]], ...]
    output_types: tuple[tuple[np.dtype, tuple[int, ...]], ...]  # in model output order
    model: Any = None  # the glowpy.CompiledModel (optimized graph, backend, executable)


@dataclass(frozen=True)
class Binding:
    """What SetGraphIO keeps: buffer addresses with the (copied) dtype and shape of each."""

    compiled: Compiled
    inputs: tuple[tuple[int, np.dtype, tuple[int, ...]], ...]  # executable input order
    outputs: tuple[tuple[int, np.dtype, tuple[int, ...]], ...]  # model output order


@dataclass
class Run:
    binding: Binding
    input_event: Event | None
    output_event: Event


_STOP = object()


class Graph:
    """A model initialised on a backend, with its weights copied in."""

    MAX_COMPILATIONS = 8  # bindings of symbolic dims kept compiled

    def __init__(self, backend: Backend, model: onnx.ModelProto, inputs: list[Port], outputs: list[Port],
                 compile_fn: Callable[[dict[str, tuple[int, ...]] | None], Compiled]) -> None:
        self.handle = new_handle()
        self.backend = backend
        self.model = model
        self.inputs = inputs  # runtime inputs (weights excluded), model order
        self.outputs = outputs
        self._compile_fn = compile_fn
        self._compiled: dict[tuple, Compiled] = {}
        self.binding: Binding | None = None
        self.lock = threading.Lock()  # SetGraphIO / RunGraph / SetIOAndRunGraph are atomic per graph
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self.closed = False  # set under `lock` by ReleaseGraph: no run may be submitted after it
        self.runs_done = 0
        self.runs_failed = 0

    @property
    def is_static(self) -> bool:
        return all(p.static_shape is not None for p in self.inputs)

    def compiled_for(self, shapes: dict[str, tuple[int, ...]]) -> Compiled:
        key = tuple(sorted(shapes.items())) if not self.is_static else ()
        hit = self._compiled.get(key)
        if hit is None:
            hit = self._compile_fn(None if self.is_static else shapes)
            if len(self._compiled) >= self.MAX_COMPILATIONS:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = hit
        return hit

    def precompile(self) -> None:
        """Static graphs compile at InitGraph, so model errors surface there."""
        self.compiled_for({})

    # runs -------------------------------------------------------------------------------------

    def submit(self, run: Run) -> None:
        if self.closed:
            raise CallError(Status.INVALID_GRAPH, f"graph 0x{self.handle:x} is being released")
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name=f"glowpy-onnxifi-graph-{self.handle:x}",
                                            daemon=True)
            self._worker.start()
        self._queue.put(run)

    def close(self) -> None:
        """Wait for every submitted run to finish, then stop the worker."""
        with self.lock:  # a RunGraph that found the handle before it was unregistered finishes first
            self.closed = True
        if self._worker is not None:
            self._queue.put(_STOP)
            self._worker.join()
            self._worker = None
        for compiled in self._compiled.values():  # the executables' threads end before ReleaseGraph returns
            if compiled.model is not None:
                compiled.model.close()

    def _work(self) -> None:
        while True:
            run = self._queue.get()
            if run is _STOP:
                return
            try:
                if run.input_event is not None:
                    run.input_event.wait()  # the input fence: buffers are not touched before it
                execute(run.binding)
                self.runs_done += 1
            except Exception as e:  # noqa: BLE001  (no status channel after RunGraph returned)
                self.runs_failed += 1
                self.backend.log(C.LOG_LEVEL_ERROR, f"graph 0x{self.handle:x}: run failed: {e}")
            finally:
                run.output_event.set_quietly()  # waiters never hang, even on failure


def execute(binding: Binding) -> None:
    """Run one binding: read the host's input buffers in place, write into its output buffers."""
    arrays = [wrap(addr, dtype, shape) for addr, dtype, shape in binding.inputs]
    results = binding.compiled.executable.run(arrays)
    if len(results) != len(binding.outputs):
        raise InternalError("executable returned the wrong number of outputs", expected=len(binding.outputs),
                            found=len(results))
    for res, (addr, dtype, shape) in zip(results, binding.outputs):
        res = np.asarray(res)
        if res.shape != shape or res.dtype != dtype:
            raise InternalError("output differs from its binding", expected=f"{dtype}{list(shape)}",
                                found=f"{res.dtype}{list(res.shape)}")
        wrap(addr, dtype, shape)[...] = res


# --- the registry --------------------------------------------------------------------------------

BACKEND_IDS: list[BackendId] = [
    BackendId("cpu", "Glowpy CPU JIT"),  # first: the one hosts should prefer
    BackendId("interpreter", "Glowpy Interpreter"),
]
IDS = Table("backend ID", Status.INVALID_ID)
BACKENDS = Table("backend", Status.INVALID_BACKEND)
EVENTS = Table("event", Status.INVALID_EVENT)
GRAPHS = Table("graph", Status.INVALID_GRAPH)
_id_lock = threading.Lock()


def hand_out_ids() -> list[int]:
    """Count one more host reference on every backend ID and return their handles."""
    with _id_lock:
        for bid in BACKEND_IDS:
            bid.refs += 1
            if bid.refs == 1:
                IDS.add(bid)
        return [bid.handle for bid in BACKEND_IDS]


def release_id(h: int) -> None:
    with _id_lock:
        bid = IDS.get(h)
        bid.refs -= 1
        if bid.refs == 0:
            IDS.pop(h)


def live_counts() -> dict[str, int]:
    """Live objects per kind (tests use it to check nothing leaks)."""
    return {"ids": len(IDS), "backends": len(BACKENDS), "graphs": len(GRAPHS), "events": len(EVENTS)}
