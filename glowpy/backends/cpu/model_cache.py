"""Model-level cache entries: a cache hit skips import, optimize, code generation and weight packing.

Key (`model_key`): sha256 over the model's bytes, the input shapes bound, whether the optimizer ran,
the compile options that change code (threads, fast_kernels, profile, isa), the host target
fingerprint (triple, CPU, features, llvmlite and LLVM versions), the glowpy version and the sha256 of
every glowpy source file (an importer or optimizer change invalidates too). A model given by path
whose bytes name external data files is not cached at this level (their bytes are not in the key).

An entry is two files in the cache directory:
- `model-<key>.o`: an ObjectCache entry (digest-checked) holding a pickle of the optimized graph
  without its weights, the executable's layout, the import summary, the object-code key and the
  layout of the weights file;
- `model-<key>.w`: the executable's weights table exactly as the kernels read it (constants and the
  packed arrays), each array at a 64-byte aligned offset. A hit maps it read-only, and reads the packed
  arrays the kernels stream into huge-page memory (hugepages.py: on the mapping's 4 KiB page-cache pages
  ResNet-50 ran 0-2% slower in two runs); the rest (weights read in place, e.g. an embedding table)
  stays mapped, its pages coming in on first use. Its size and a digest of 64 sampled 4 KiB pages are checked (a truncated
  or replaced file is refused); hashing all of it would cost more than the rest of a hit.
The weights file is written first and both go through a temporary file and os.replace, so a reader
never sees a half-written entry. The write runs on a background thread (write_behind; flush() waits). A hit whose object code was evicted is a miss.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import pickle
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from glowpy.backends.cpu.cache import ObjectCache, atomic_write, source_digest, touch, warn_once
from glowpy.backends.cpu.hugepages import MIN_BYTES, read_ranges
from glowpy.importer import DeferredModel
from glowpy.importer.digest import content_digest, file_digest
from glowpy.ir.graph import Graph, Node, Value

FORMAT = 3
ALIGN = 64
PAGE = 4096
SAMPLES = 64
WRITER_NICE = 19  # the write runs beside the first inferences: hashing 100s of MB must not take their cores
SETTLED_NS = 2_000_000_000  # a file modified this recently may change again within its timestamp tick


def model_digest(model: Any, store: ObjectCache) -> str | None:
    """The digest of the serialized model, or None when its bytes do not determine it (a file naming
    external data files). A file's digest is remembered by its path, size, mtime, ctime and inode
    (a small entry), so a cached compile of a file does not read it; a file modified in the last
    two seconds is hashed every time (its mtime may not show a second change in the same tick; a
    rewrite that puts the mtime back changes the ctime)."""
    if isinstance(model, DeferredModel):
        return model.digest
    if isinstance(model, (bytes, bytearray, memoryview)):
        return content_digest(model)
    if isinstance(model, (str, os.PathLike)):
        try:
            path = Path(model).resolve()
            st = path.stat()
        except OSError:
            return None  # the importer reports it
        ident = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}|{st.st_dev}"
                               .encode()).hexdigest()
        known = store.get(f"path-{ident}")
        if known is not None:
            return None if known == b"-" else known.decode()
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                digest, external = file_digest(f.fileno(), size, b"location")
        except OSError:
            return None
        digest = "-" if external else digest  # "-": external data, not cacheable
        now = time.time_ns()
        if size == st.st_size and now - st.st_mtime_ns > SETTLED_NS:
            store.put(f"path-{ident}", digest.encode())
        return None if digest == "-" else digest
    if hasattr(model, "SerializeToString") and hasattr(model, "graph"):
        return proto_digest(model)
    return None


def _repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 5; `label` before
    return bool(flag) if flag is not None else field.label == field.LABEL_REPEATED


def proto_digest(model: Any) -> str:
    """A digest of a ModelProto without serializing it whole (a copy of every weight at once): every
    field but the graph's initializers, serialized, then each initializer serialized on its own."""
    h = hashlib.sha256(b"onnx-model-proto\0")

    def put(tag: str, data: bytes) -> None:
        h.update(f"{tag}:{len(data)}:".encode())
        h.update(data)

    for field, value in model.ListFields():
        if field.name != "graph":
            put(field.name, repr(value).encode() if field.type != field.TYPE_MESSAGE else
                b"".join(v.SerializeToString() for v in (value if _repeated(field) else [value])))
            continue
        for gfield, gvalue in value.ListFields():
            items = gvalue if _repeated(gfield) else [gvalue]
            for item in items:
                put("graph." + gfield.name, item.SerializeToString() if gfield.type == gfield.TYPE_MESSAGE
                    else repr(item).encode())
    return h.hexdigest()


def model_key(digest: str, shapes: Any, optimize: bool, options: dict[str, Any], fingerprint: str) -> str:
    from glowpy import __version__

    shape_part = sorted((str(k), repr(v)) for k, v in (shapes or {}).items())
    h = hashlib.sha256()
    for part in (f"glowpy-model {FORMAT} {__version__}", source_digest(), fingerprint,
                 repr(shape_part), repr(bool(optimize)), repr(sorted(options.items())), digest):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


# --- the graph without its weights ------------------------------------------------------------------


def graph_state(graph: Graph) -> tuple:
    """A flat, picklable description of `graph` (constant data kept only for small arrays)."""
    consts = [(v.name, v.type, v.data if v.data is not None and v.type.nbytes <= 256 else None)
              for v in graph.constants.values()]
    nodes = [(n.op, n.name, [x.name for x in n.inputs], [(o.name, o.type) for o in n.outputs], n.attrs)
             for n in graph.nodes]
    return (graph.name, [(v.name, v.type) for v in graph.inputs], consts, nodes, [v.name for v in graph.outputs])


def restore_graph(state: tuple) -> Graph:
    name, inputs, consts, nodes, outputs = state
    g = Graph(name)
    values: dict[str, Value] = {}
    for n, t in inputs:
        values[n] = g.add_input(n, t)
    for n, t, data in consts:
        v = values[n] = Value(g._claim(n), t, "constant", data=data)
        g.constants[n] = v
    for op, nname, ins, outs, attrs in nodes:
        node = Node(op, nname, [values[x] for x in ins], [], attrs)
        g._node_names.add(nname)
        node.outputs = [Value(g._claim(o), t, "node", producer=node) for o, t in outs]
        for o in node.outputs:
            values[o.name] = o
        for x in node.inputs:
            x.users.append(node)
        g.nodes.append(node)
    g.outputs = [values[n] for n in outputs]
    return g


# --- writing behind ----------------------------------------------------------------------------------

_writers: list[threading.Thread] = []
_writers_lock = threading.Lock()


def write_behind(put: Any, *args: Any) -> None:
    """Run a cache write on a thread of its own, so the compile returns first. The thread is not a
    daemon: the interpreter waits for it at exit (a process killed meanwhile leaves a temporary file,
    never a half entry: the weights file is moved into place before the entry naming it is written)."""
    def run() -> None:
        if sys.platform == "linux":  # nice is per thread there (and inherited by the hashing threads)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        try:
            put(*args)
        except Exception as e:  # noqa: BLE001  (a cache fault never reaches the caller)
            warn_once(Path(tempfile.gettempdir()), "write", f"model entry not stored ({type(e).__name__}: {e})")

    t = threading.Thread(target=run, name="glowpy-cache-write")
    with _writers_lock:  # started before it is listed: another thread's flush() joins only started writers
        t.start()
        _writers[:] = [w for w in _writers if w.is_alive()]
        _writers.append(t)


def flush() -> None:
    """Wait for this process's pending model cache writes."""
    with _writers_lock:
        pending = list(_writers)
    for t in pending:
        t.join()


# --- entries ------------------------------------------------------------------------------------------


@dataclass
class ModelEntry:
    meta: dict[str, Any]
    weights: list[np.ndarray]


def _layout(weights: list[np.ndarray]) -> tuple[list[tuple[int, tuple[int, ...], str]], int]:
    out, offset = [], 0
    for w in weights:
        offset = -(-offset // ALIGN) * ALIGN
        # ml_dtypes' types (bfloat16, float8, int4, ...) have a void .str; their names round-trip.
        out.append((offset, tuple(w.shape), w.dtype.str if w.dtype.isbuiltin == 1 else w.dtype.name))
        offset += w.nbytes
    return out, offset


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _sample_digest(read: Callable[[int, int], bytes], size: int) -> str:
    """A digest of 64 sampled pages; `read(start, n)` gives n bytes at start."""
    h = hashlib.sha256(str(size).encode())
    if size:
        step = max(PAGE, size // SAMPLES)
        for start in range(0, size, step):
            h.update(read(start, min(PAGE, size - start)))
        h.update(read(max(0, size - PAGE), min(PAGE, size)))
    return h.hexdigest()


class ModelCache:
    """Model entries next to the object code (same directory, same fault rules)."""

    def __init__(self, store: ObjectCache) -> None:
        self.store = store
        self.directory = store.directory

    def weights_path(self, key: str) -> Path:
        return self.directory / f"model-{key}.w"

    def put(self, key: str, meta: dict[str, Any], weights: list[np.ndarray]) -> bool:
        layout, size = _layout(weights)
        digest = ""

        def write(f: BinaryIO) -> None:
            nonlocal digest
            at = 0
            for (offset, _, _), w in zip(layout, weights):
                f.write(b"\0" * (offset - at))
                f.write(np.ascontiguousarray(w).reshape(-1).view(np.uint8).data)
                at = offset + w.nbytes
            f.flush()
            # Read back with pread, not through a mapping: the kernel maps whole folios around each
            # sampled page, which put most of the file in this process's RSS on top of the weights.
            fd = f.fileno()
            digest = _sample_digest(lambda start, n: os.pread(fd, n, start), size)

        try:
            atomic_write(self.directory, f".w{key[:16]}.", self.weights_path(key), write)
        except OSError as e:
            self.store._write_failed(e)
            return False
        # The kernels' own arrays (packed: writable) are read into huge-page memory on a hit, the rest
        # (the graph's weights a kernel reads in place, e.g. an embedding table gathered a few rows at a
        # time) stays mapped, its pages read only where used.
        streamed = [i for i, w in enumerate(weights) if w.flags.writeable and w.nbytes >= MIN_BYTES]
        meta = {**meta, "weights_layout": layout, "weights_bytes": size, "weights_digest": digest,
                "weights_streamed": streamed}
        try:
            blob = pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, RecursionError, TypeError, AttributeError):
            return False  # something in the graph (an attribute) does not pickle: no model entry
        return self.store.put(f"model-{key}", blob, alongside=size)

    def get(self, key: str) -> ModelEntry | None:
        blob = self.store.get(f"model-{key}")
        if blob is None:
            return None
        try:
            meta = pickle.loads(blob)  # noqa: S301  (our own digest-checked entry, as trusted as the object code)
        except Exception:  # noqa: BLE001  (an entry from another glowpy: a miss)
            return None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            return None
        path = self.weights_path(key)
        size = meta["weights_bytes"]
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size != size:
                    warn_once(self.directory, "corrupt", f"ignored {path.name}: wrong size (rebuilt)")
                    return None
                # Sampled with pread, not through the mapping: a fault maps the whole folio around the
                # page (up to 2 MiB), which put 89 of ResNet-50's 136 MiB in this process's RSS beside the
                # copies of the packed arrays.
                fd = f.fileno()
                if _sample_digest(lambda start, n: os.pread(fd, n, start), size) != meta["weights_digest"]:
                    warn_once(self.directory, "corrupt", f"ignored {path.name}: damaged (rebuilt)")
                    return None
                buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
                layout = meta["weights_layout"]
                streamed = meta["weights_streamed"]
                copies = dict(zip(streamed, read_ranges(fd, [(layout[i][0], _nbytes(*layout[i][1:]))
                                                             for i in streamed])))
        except FileNotFoundError:
            return None
        except OSError as e:
            warn_once(self.directory, "read", f"cannot read {path.name} ({e.strerror or e}); compiling without it")
            return None
        touch(path)
        weights = []
        for i, (offset, shape, dtype) in enumerate(layout):
            dt = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            if i in copies:
                a = copies[i].view(dt)
                a.flags.writeable = False  # as the mapped ones
            else:
                a = np.frombuffer(buf, dt, count, offset) if count else np.zeros(shape, dt)
            weights.append(a.reshape(shape))
        return ModelEntry(meta, weights)
