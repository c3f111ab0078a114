"""The CPU backend: the graph becomes one LLVM module (llvmlite), optimized for the host CPU and
JIT-loaded; a run is one native call (ctypes, which releases the GIL) over a table of read-only weight
arrays, a planned activation arena and the caller's input/output arrays.

    lowering.py  the driver: graph -> kernel steps              kernels/  the kernel generators
    select.py    op -> kernel emitter table (KERNELS)           fusion.py  elementwise loop grouping
    sharing.py   shared kernels and weight packing              module_text.py  kernel modules as text
    steps.py     Step / Arg / Epilogue                          activations.py  activation emitters
    memory.py    liveness-based arena placement                 codegen.py binding + the entry + threads
    target.py    host target machine and the O3 pipeline        cache.py   object-code cache on disk

Compile options: `threads` (default $GLOWPY_NUM_THREADS, else the machine's CPU count), `cache`
(default True: reuse and store object code in the on-disk cache), `fast_kernels` (default True:
use the tiled float32 Conv / Gemm generators when present; False forces the plain kernels), `profile`
(default False: time every kernel call on every thread; `executable.profile()` after a run; True or
"wall" for wall time, "cpu" for each thread's CPU time),
`release_weights` (default False: for a caller that owns the graph and will not run it elsewhere, e.g.
the optimizer's private copy; constants the kernels packed get `Value.data = None` as soon as they are
packed, so the process never holds a model's weights twice), `isa` (default "host": all the host's
vector features; "avx2": 8-lane code without AVX-512, what an AMD Zen 3 host gets).
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from glowpy.backends import progress
from glowpy.backends.base import Backend, Executable
from glowpy.backends.cpu import codegen, parallel
from glowpy.backends.cpu.activations import EMITTERS
from glowpy.backends.cpu.cache import ObjectCache, cache_key, graph_signature
from glowpy.backends.cpu.hugepages import return_free_heap
from glowpy.backends.cpu.irutil import supported_dtype
from glowpy.backends.cpu.loops import check_loop
from glowpy.backends.cpu.lowering import ALIAS_OPS, ELEMENTWISE_OPS, KERNELS
from glowpy.backends.cpu.model_cache import FORMAT as MODEL_FORMAT
from glowpy.backends.cpu.model_cache import (
    ModelCache,
    graph_state,
    model_digest,
    model_key,
    restore_graph,
    write_behind,
)
from glowpy.backends.cpu.model_cache import flush as flush_model_writes
from glowpy.backends.cpu.target import HostTarget, host_target, isa_available, new_machine
from glowpy.backends.cpu.threads import RELEASE
from glowpy.errors import (
    InternalError,
    InvalidDatatype,
    InvalidShape,
    MismatchingDatatype,
    MismatchingShape,
    UnsupportedAttribute,
    UnsupportedDatatype,
    UnsupportedOperator,
)
from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops import OPS
from glowpy.ir.ops.control import CONTROL_OPS, unroll_refusal
from glowpy.ir.types import BFLOAT16
from glowpy.limits import memory_budget

OPTIONS = ("threads", "cache", "fast_kernels", "profile", "release_weights", "isa")
MAX_THREADS = 256
COLLECT_MIN_WEIGHT_BYTES = 16 << 20  # below this a dropped graph's weights are not worth a full collection
# Outputs come from np.empty (16-byte aligned at least); kernels assume element alignment only.
_ENTRY_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_RELEASE_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


# Every op with a kernel: the selection table, the elementwise groups' ops, the aliases.
SUPPORTED_OPS = frozenset(op for op in (*KERNELS, *ELEMENTWISE_OPS, *ALIAS_OPS) if op in OPS)
# Ops whose kernels take any element type as stored (Cast converts; the others move elements).
BFLOAT16_NATIVE_OPS = frozenset({"Cast", "Identity", "Reshape", "Transpose", "Concat", "Split", "Slice", "Gather",
                                 "Expand"}) & SUPPORTED_OPS


def resolve_threads(threads: Any = None) -> int:
    """threads=N, else $GLOWPY_NUM_THREADS, else os.cpu_count()."""
    source = "threads"
    if threads is None:
        env = os.environ.get("GLOWPY_NUM_THREADS")
        if env:
            threads, source = env, "GLOWPY_NUM_THREADS"
        else:
            return max(1, min(os.cpu_count() or 1, MAX_THREADS))
    try:
        n = int(threads)
        if isinstance(threads, float) and n != threads:
            raise ValueError
    except (TypeError, ValueError):
        raise UnsupportedAttribute(f"{source} must be a positive integer", expected="1..256", found=threads) from None
    if not 1 <= n <= MAX_THREADS:
        raise UnsupportedAttribute(f"{source} must be between 1 and {MAX_THREADS}", expected="1..256", found=n)
    return n


_char, _addressof = ctypes.c_char, ctypes.addressof


def _address(a: np.ndarray) -> int:
    """Data address of an array (from_buffer is 3x faster than .ctypes.data, but needs a writable one
    of a numpy built-in type: ml_dtypes' types cannot go through the buffer protocol)."""
    if a.flags.writeable and a.size and a.dtype.isbuiltin == 1:
        return _addressof(_char.from_buffer(a))
    return a.ctypes.data


def _aligned_zeros(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.zeros(max(nbytes, 1) + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + max(nbytes, 1)]


def _program_check(program: codegen.Program) -> str:
    """What a cached object must agree with: the kernels, their order and arguments, the weight
    table and the arena (a signature index entry is trusted only if this matches)."""
    import hashlib

    parts = [program.arena_size, program.nthreads, program.threaded, program.profile_offset]
    parts += [(s.name, s.fn.name if s.fn is not None else None, s.parallel,
               [(a.kind, a.index) for a in s.args]) for s in program.steps]
    parts += [(w.shape, str(w.dtype)) for w in program.weights]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def load_object(obj: bytes, target: HostTarget) -> llvm.ExecutionEngine:
    """An MCJIT engine holding the object code (symbols of libc / libm / pthreads resolve in-process)."""
    empty = llvm.parse_assembly("")
    empty.triple = target.triple
    engine = llvm.create_mcjit_compiler(empty, new_machine(target))
    for part in parallel.unpack(obj):  # MCJIT links the kernels' objects to the entry's
        engine.add_object_file(llvm.ObjectFileRef.from_data(part))
    engine.finalize_object()
    return engine


@dataclass
class Layout:
    """What an executable needs besides its code: the weights table and the arena, from a build or
    from a model cache entry."""

    arena_size: int
    weights_size: int
    nthreads: int  # threads a run uses (1 when no step is parallel)
    steps: int  # kernel calls per run
    fast_kernels: list[str]
    profile_offset: int
    profile_layout: dict[str, int]  # slots of the profile block (codegen.profile_layout)
    profile_steps: list[StepInfo]  # the kernel steps as profiles name them
    weights: list[np.ndarray]
    const_index: dict[str, int]  # constant name -> its position in the weights table

    @classmethod
    def of(cls, program: codegen.Program) -> Layout:
        const_index = {v.name: st.offset for st in program.storage.values() if st.kind == "const"
                       for v in st.values if 0 <= st.offset < len(program.weights)}
        return cls(program.arena_size, program.weights_size, program.nthreads if program.threaded else 1,
                   len([s for s in program.steps if s.fn is not None]), list(program.fast_kernels),
                   program.profile_offset, codegen.profile_layout(len(program.steps), program.nthreads),
                   [StepInfo(k, s.name, s.describe(), s.nodes[0].op if s.nodes else "", s.parallel, s.work)
                    for k, s in enumerate(program.steps) if s.fn is not None],
                   list(program.weights), const_index)

    def meta(self) -> dict[str, Any]:
        """Everything but the weights (a model cache entry stores those apart)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "weights"}


class CpuExecutable(Executable):
    """A compiled graph: the native entry, its weights block and its arena."""

    def __init__(self, graph: Graph, program: codegen.Program | Layout, engine: llvm.ExecutionEngine, *,
                 cached: bool, compile_seconds: float = 0.0) -> None:
        layout = program if isinstance(program, Layout) else Layout.of(program)
        self.layout = layout
        self.cached = cached  # the object code came from the cache
        self.model_cached = False  # the whole compile came from a model cache entry
        self.arena_size = layout.arena_size
        self.weights_size = layout.weights_size
        self.nthreads = layout.nthreads
        self.compile_seconds = compile_seconds
        self.steps = layout.steps
        self.fast_kernels = list(layout.fast_kernels)
        self._engine = engine
        address = engine.get_function_address(codegen.ENTRY)
        if not address:
            raise InternalError("the compiled object has no entry function", expected=codegen.ENTRY)
        self._entry = _ENTRY_TYPE(address)
        release = engine.get_function_address(RELEASE)
        if not release:
            raise InternalError("the compiled object has no pool release function", expected=RELEASE)
        # The weights table points at the arrays where they are (graph constants, packed arrays in
        # huge-page blocks, or a cache entry's: its packed arrays read into such a block, the rest of its
        # file mapped): nothing is copied here, so the process holds each weight once.
        self._weight_arrays = list(layout.weights)
        self._weights = (ctypes.c_void_p * max(1, len(self._weight_arrays)))(
            *[a.ctypes.data for a in self._weight_arrays])
        self._arena = _aligned_zeros(layout.arena_size)
        self._in_types = [(v.dtype, v.shape) for v in graph.inputs]
        self._out_types = [(v.dtype, v.shape) for v in graph.outputs]
        # fresh np.empty outputs of a built-in type are writable buffers: their address needs no checks
        self._out_buffer = [np.dtype(d).isbuiltin == 1 and 0 not in s for d, s in self._out_types]
        self._in_ptrs = (ctypes.c_void_p * max(1, len(self._in_types)))()
        self._out_ptrs = (ctypes.c_void_p * max(1, len(self._out_types)))()
        self._lock = threading.Lock()  # one arena: runs of one executable take turns
        self._weights_ptr, self._arena_ptr = ctypes.addressof(self._weights), self._arena.ctypes.data
        self._in_addr, self._out_addr = ctypes.addressof(self._in_ptrs), ctypes.addressof(self._out_ptrs)
        self._profile_offset = layout.profile_offset
        self._profile_layout = layout.profile_layout
        self._profile_steps = list(layout.profile_steps)
        self._last_wall = 0.0
        # The pool's threads run this engine's code in this arena: they are joined before either goes
        # (a finalizer, not __del__: it holds both, so a garbage cycle cannot free them first).
        self._release = _RELEASE_TYPE(release)
        self._finalizer = weakref.finalize(self, _release_pool, self._release, self._arena_ptr, self._lock,
                                           engine, self._arena)

    def close(self) -> None:
        """Join the thread pool's threads now (a later run starts them again); the finalizer does it
        when the executable is collected."""
        _release_pool(self._release, self._arena_ptr, self._lock)

    def _coerce(self, i: int, a: Any) -> np.ndarray:
        """The slow path of an input check: raise for anything a kernel could overrun, else fix layout."""
        dtype, shape = self._in_types[i]
        # The last line of defence before native code (CompiledModel.validate normally ran first).
        if not isinstance(a, np.ndarray):
            raise InvalidDatatype(f"input {i} is not an ndarray", found=type(a).__name__)
        if a.dtype != dtype:
            raise MismatchingDatatype(f"input {i} has the wrong element type", expected=str(dtype),
                                      found=str(a.dtype))
        if a.shape != shape:
            raise (InvalidShape if 0 in a.shape else MismatchingShape)(
                f"input {i} has the wrong shape", expected=list(shape), found=list(a.shape))
        return np.require(a, requirements="C")

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != len(self._in_types):
            raise InternalError("wrong number of inputs", expected=len(self._in_types), found=len(inputs))
        keep = list(inputs)
        for i, (dtype, shape) in enumerate(self._in_types):
            a = keep[i]
            if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
                keep[i] = self._coerce(i, a)
        outs = [np.empty(shape, dtype) for dtype, shape in self._out_types]
        with self._lock:
            for i, a in enumerate(keep):
                self._in_ptrs[i] = _address(a)
            for j, o in enumerate(outs):
                self._out_ptrs[j] = _addressof(_char.from_buffer(o)) if self._out_buffer[j] else o.ctypes.data
            if self._profile_offset >= 0:
                lay = self._profile_layout
                self._arena[self._profile_offset:self._profile_offset + 8 * lay["slots"]] = 0
                t = time.perf_counter()
                self._entry(self._weights_ptr, self._arena_ptr, self._in_addr, self._out_addr)
                self._last_wall = time.perf_counter() - t
            else:
                self._entry(self._weights_ptr, self._arena_ptr, self._in_addr, self._out_addr)
        return outs

    def profile(self) -> RunProfile:
        """The kernel timings of the last run; needs compile(..., profile=True)."""
        if self._profile_offset < 0:
            raise InternalError("compile with profile=True to profile kernels")
        lay = self._profile_layout
        stamps = self._arena[self._profile_offset:self._profile_offset + 8 * lay["slots"]].view(np.int64).copy()
        threads = int(stamps[lay["threads"]])
        spans: list[tuple[int, int, int, int]] = []
        for info in self._profile_steps:
            for tid in range(threads):
                start, end = stamps[lay["rows"] + tid * lay["row_stride"] + 2 * info.index:][:2]
                if start and end:
                    spans.append((info.index, tid, int(start), int(end)))
        return RunProfile(int(stamps[lay["begin"]]), int(stamps[lay["end"]]), self._last_wall, threads,
                          list(self._profile_steps), spans)


def _release_pool(release: Any, arena: int, lock: threading.Lock, *keep: Any) -> None:
    """Join an arena's pool threads (RELEASE); `keep` holds the code and the arena until then."""
    with lock:
        release(arena)


@dataclass(frozen=True)
class StepInfo:
    """A kernel step as profiles name it: its kernel, the nodes it runs, whether threads share it, and
    its FLOPs when it is a matrix product or a convolution (else the elements it touches)."""

    index: int
    kernel: str
    nodes: str
    op: str
    parallel: bool
    work: float


@dataclass
class RunProfile:
    """One profiled run: native begin and end (the profile clock's ns: CLOCK_MONOTONIC, or thread 0's CPU
    time with profile="cpu"), the caller's wall time of the native call (s), the threads that ran, and
    (step index, tid, start ns, end ns) per kernel call."""

    begin: int
    end: int
    wall: float
    threads: int
    steps: list[StepInfo]
    spans: list[tuple[int, int, int, int]]


class CpuBackend(Backend):
    """llvmlite JIT for the host CPU."""

    name = "cpu"
    options = OPTIONS

    def __init__(self) -> None:
        self.target = host_target()

    # --- what runs here -----------------------------------------------------------------------

    def _dtype_ok(self, dtype: np.dtype) -> bool:
        if not supported_dtype(dtype):
            return False
        # half <-> float conversions need F16C (otherwise LLVM calls compiler-rt helpers we cannot rely on)
        return np.dtype(dtype) != np.float16 or self.target.has("f16c") or not self.target.triple.startswith("x86")

    def is_op_supported(self, node: Node) -> bool:
        if node.op not in SUPPORTED_OPS or self._widens_bfloat16(node):
            return False
        return all(self._dtype_ok(v.dtype) for v in (*node.inputs, *node.outputs))

    @staticmethod
    def _widens_bfloat16(node: Node) -> bool:
        """bfloat16 values are stored as such; only Cast and the movement kernels read them as stored,
        every other op runs on float32 between Casts (optimizer: compute_in_float32)."""
        return node.op not in BFLOAT16_NATIVE_OPS and any(v.dtype == BFLOAT16 for v in (*node.inputs, *node.outputs))

    def supports_fused_activation(self, node: Node, activation: str) -> bool:
        """Float Conv / Gemm / MatMul / FullyConnected kernels apply any activation with an emitter."""
        return activation in EMITTERS and node.outputs[0].dtype.kind == "f"

    def supports_fused_residual(self, node: Node) -> bool:
        return node.op == "Conv" and node.outputs[0].dtype.kind == "f"

    def supports_squeeze_excite(self, x: Value, activation: str, gate: str) -> bool:
        """The fused kernel (kernels/squeeze_excite.py) is float32, with activations that have emitters."""
        return x.dtype == np.float32 and activation in ("none", *EMITTERS) and gate in EMITTERS

    def should_lower(self, node: Node) -> bool:
        """A BatchNormalization the optimizer could not fold (after a Concat, or of a value with other
        users) becomes a per-channel Mul and Add: the elementwise fuser then merges it with its
        neighbours, and the scale and shift are computed once, at compile time. If / Loop / Scan become
        straight-line code (both branches and a select; loops unrolled) when `unroll_refusal` allows."""
        if node.op in CONTROL_OPS:
            return unroll_refusal(node) is None
        if self._widens_bfloat16(node):
            return True
        return node.op == "BatchNormalization" and node.inputs[0].type.rank >= 2

    def check_node(self, node: Node) -> None:
        """The precise refusal of a control node the backend cannot take as straight-line code (a Loop
        that cannot be unrolled runs as a native loop: loops.py)."""
        if node.op == "Loop":
            check_loop(node)
        why = unroll_refusal(node) if node.op in CONTROL_OPS and node.op != "Loop" else None
        if why is not None:
            raise UnsupportedOperator(f"the CPU backend runs {node.op} only as straight-line code: {why}",
                                      node=node.name, op=node.op, expected="a compile-time trip count",
                                      found=why)

    def check(self, graph: Graph) -> None:
        for node in graph.nodes:
            self.check_node(node)
            if node.op not in SUPPORTED_OPS:
                raise UnsupportedOperator("the CPU backend has no kernel for this op", node=node.name, op=node.op)
            for v in (*node.inputs, *node.outputs):
                if not self._dtype_ok(v.dtype):
                    raise UnsupportedDatatype("the CPU backend cannot generate code for this element type",
                                              node=node.name, op=node.op, expected="a supported dtype",
                                              found=str(v.dtype))
        for v in (*graph.inputs, *graph.outputs):
            if not self._dtype_ok(v.dtype):
                raise UnsupportedDatatype(f"graph value '{v.name}' has an element type the CPU backend cannot handle",
                                          found=str(v.dtype))

    # --- compiling ----------------------------------------------------------------------------

    @staticmethod
    def _options(options: dict[str, Any]) -> tuple[int, bool, bool, str]:
        """(threads, cache, fast_kernels, profile clock or ""); release_weights is read by build()."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise UnsupportedAttribute(f"unknown compile option(s) {unknown} for the cpu backend",
                                       expected=list(OPTIONS), found=unknown)
        profile = options.get("profile", False)
        clock = "wall" if profile is True else profile or ""
        if clock not in ("", *codegen.PROFILE_CLOCKS):
            raise UnsupportedAttribute("unknown profile clock", expected=[False, True, *codegen.PROFILE_CLOCKS],
                                       found=profile)
        return (resolve_threads(options.get("threads")), bool(options.get("cache", True)),
                bool(options.get("fast_kernels", True)), clock)

    def target_for(self, options: dict[str, Any]) -> HostTarget:
        """The target the `isa` option names (the host's by default)."""
        isa = options.get("isa", "host")
        if isa == "host":
            return self.target
        target = host_target(isa)
        if not isa_available(isa):
            raise UnsupportedAttribute(f"this host cannot run {isa} code", expected="host", found=isa)
        return target

    def build(self, graph: Graph, **options: Any) -> codegen.Program:
        nthreads, _, fast, profile = self._options(options)
        self.check(graph)
        return codegen.build(graph, self.target_for(options), nthreads=nthreads, fast_kernels=fast, profile=profile,
                             release_weights=bool(options.get("release_weights", False)))

    def emit_llvm(self, graph: Graph, **options: Any) -> str:
        """The generated LLVM IR (before optimization), readable: named kernels, values and blocks."""
        return self.build(graph, **options).ir_text

    def emit_assembly(self, graph: Graph, **options: Any) -> str:
        from glowpy.backends.cpu.target import assembly

        return assembly(self.emit_llvm(graph, **options), self.target_for(options))

    # --- the model-level cache (glowpy.pipeline asks before importing) --------------------------

    def model_cache_key(self, model: Any, shapes: Any, optimize: bool, options: dict[str, Any]) -> str | None:
        """The model cache key of compiling `model` with `options`, or None (cache off, or a model
        whose bytes do not determine it). Raises for bad options, as compile would."""
        nthreads, use_cache, fast, profile = self._options(options)
        if not use_cache:
            return None
        target = self.target_for(options)
        digest = model_digest(model, ObjectCache())
        if digest is None:
            return None
        code_options = {"threads": nthreads, "fast_kernels": fast, "profile": profile,
                        "isa": options.get("isa", "host")}
        return model_key(digest, shapes, optimize, code_options, target.fingerprint())

    def load_compiled(self, key: str, options: dict[str, Any]) -> tuple[Graph, CpuExecutable, Any] | None:
        """(optimized graph, executable, the stored import summary) from the model cache, or None."""
        start = time.perf_counter()
        flush_model_writes()  # this process's own pending write of the same model is a hit, not a recompile
        store = ObjectCache()
        entry = ModelCache(store).get(key)
        if entry is None:
            return None
        meta = entry.meta
        if meta["weights_bytes"] + meta["layout"]["arena_size"] > memory_budget()[0]:
            return None  # over GLOWPY_MAX_MEMORY: the compile refuses it, naming the tensor
        obj = store.get(meta["code_key"])
        if obj is None:
            return None
        try:
            engine = load_object(obj, self.target_for(options))
        except Exception:  # noqa: BLE001  (an entry LLVM cannot load is a miss, never fatal)
            return None
        graph = restore_graph(meta["graph"])
        layout = Layout(weights=entry.weights, **meta["layout"])
        for name, index in layout.const_index.items():
            v = graph.constants.get(name)
            if v is not None and v.data is None:
                v.data = entry.weights[index]
        executable = CpuExecutable(graph, layout, engine, cached=True, compile_seconds=time.perf_counter() - start)
        executable.code_key = meta["code_key"]
        executable.model_cached = True
        return graph, executable, meta["imported"]

    def flush_compiled(self) -> None:
        flush_model_writes()

    def store_compiled(self, key: str, graph: Graph, executable: CpuExecutable, imported: Any) -> bool:
        """Record a compile under `key`, on a background thread (writing a model's weights costs about
        as much as its import; model_cache.flush() waits). False when there is nothing to record."""
        if not isinstance(executable, CpuExecutable) or getattr(executable, "code_key", None) is None:
            return False
        meta = {"format": MODEL_FORMAT, "code_key": executable.code_key, "graph": graph_state(graph),
                "layout": executable.layout.meta(), "imported": imported}
        write_behind(ModelCache(ObjectCache()).put, key, meta, list(executable.layout.weights))
        return True

    def compile(self, graph: Graph, **options: Any) -> CpuExecutable:
        # Building LLVM IR in llvmlite allocates ~10^5 small objects and no cycles worth collecting
        # meanwhile; the cyclic collector's passes over them cost a quarter of a cached compile.
        # Collect first, though, when the weights are big: the caller's unoptimized graph (nodes and
        # values point at each other) is usually cyclic garbage by now, holding a model's worth of
        # them. A full collection costs time in proportion to the process's live objects (40 ms in a
        # test process), too much to pay for a small graph's garbage.
        if sum(v.type.nbytes for v in graph.constants.values()) >= COLLECT_MIN_WEIGHT_BYTES:
            gc.collect()
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._compile(graph, **options)
        finally:
            if enabled:
                gc.enable()

    def _compile(self, graph: Graph, **options: Any) -> CpuExecutable:
        start = time.perf_counter()
        nthreads, use_cache, fast, profile = self._options(options)
        target = self.target_for(options)
        store = ObjectCache() if use_cache else None
        fingerprint = target.fingerprint()
        # before building: with release_weights the build drops the packed constants' data
        signature = graph_signature(graph, {"threads": nthreads, "fast_kernels": fast, "profile": profile},
                                    fingerprint) if store is not None else ""
        progress.current().stage("codegen")
        program = self.build(graph, **options)
        key = obj = None
        if store is not None:
            check = _program_check(program)
            index = store.get_index(signature)
            if index is not None and index.get("check") == check:
                key = index["key"]
                obj = store.get(key)
        if obj is None:
            key = cache_key(program.ir_text, fingerprint)
            obj = store.get(key) if store is not None else None
        cached = obj is not None
        engine = None
        if obj is not None:
            try:
                engine = load_object(obj, target)
            except Exception:  # noqa: BLE001  (an entry LLVM cannot load is rebuilt, never fatal)
                engine, cached = None, False
        if engine is None:
            obj = self._compile_object(graph, program, target, store)
            if store is not None:
                store.put(key, obj)
            engine = load_object(obj, target)
        if store is not None:
            store.put_index(signature, {"key": key, "check": check})
        executable = CpuExecutable(graph, program, engine, cached=cached, compile_seconds=time.perf_counter() - start)
        executable.code_key = key  # names the generated code: equal keys, equal code
        return executable

    def _compile_object(self, graph: Graph, program: codegen.Program, target: HostTarget,
                        store: ObjectCache | None) -> bytes:
        """The program's object code: its kernels compiled in parallel, each once (parallel.py)."""
        bar = progress.current()
        if program.weights_size >= COLLECT_MIN_WEIGHT_BYTES:
            # The IR objects the build made are cyclic garbage the paused collector kept (30 MiB for
            # ResNet-50), all in the youngest generation: freed before LLVM's peak, not after it.
            gc.collect(0)
        return_free_heap()  # LLVM's transient peak then starts from what is live, not from freed import buffers
        obj = parallel.compile_program(str(program.module), program.kernel_defs, program.kernel_decls, target,
                                       store, bar.kernels)
        return_free_heap()  # what LLVM freed, mostly in its threads' malloc arenas, before the arena and the run
        bar.stage("link")
        return obj



__all__ = ["CpuBackend", "CpuExecutable", "RunProfile", "SUPPORTED_OPS", "StepInfo", "resolve_threads"]
