"""On-disk cache of compiled object code.

Key: sha256 over the generated LLVM IR text, the host target (triple, CPU name, feature string),
and the glowpy and llvmlite/LLVM versions. Weights are not part of the code (they live in the
weights block), so two models that differ only in weight values share an entry.

Directory: $GLOWPY_CACHE_DIR, else $XDG_CACHE_HOME/glowpy, else ~/.cache/glowpy.

An entry is one file `<key>.o`: a header line with a magic word, the key and the sha256 of the
payload, then the object code.

Printing the LLVM IR of a large model to hash it costs a noticeable part of a cached compile, so
a small index `<signature>.idx` maps a signature of everything the IR is made from (the graph's
ops, names, types and attributes, small constants that are inlined, the compile options, the target,
and the source of the CPU backend) to the IR key. The index is only a shortcut: the entry it names
is used only if the program just built agrees with what the index recorded (steps, kernels, weight
table, arena size), otherwise the IR is printed and hashed as usual. Writes go to a temporary file in the same directory and are moved
into place with os.replace, so a reader sees either nothing or a complete file, and several
processes compiling the same model at once each write a complete file (the last rename wins). A
file whose header or digest does not check out (truncated, corrupt, another format) is ignored and
rebuilt: a corrupt object is never handed to LLVM.

Faults never fail a compile: a directory that cannot be written (read-only, full disk, not a directory)
or an entry that cannot be read or does not check out makes the compile go on without that entry,
and logs one warning on the `glowpy.cache` logger per directory and kind of fault, for the life of the
process (a long-lived host compiling many graphs is told once, not per graph).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GLOWPY-OBJ-1"

log = logging.getLogger("glowpy.cache")
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_once(directory: Path, kind: str, message: str) -> None:
    """Log `message` as a warning unless this kind of fault was already reported for `directory`."""
    with _warned_lock:
        if (str(directory), kind) in _warned:
            return
        _warned.add((str(directory), kind))
    log.warning("glowpy: compile cache %s: %s", directory, message)


def cache_dir() -> Path:
    env = os.environ.get("GLOWPY_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "glowpy"


def cache_key(ir_text: str, fingerprint: str) -> str:
    from glowpy import __version__

    h = hashlib.sha256()
    for part in (f"glowpy {__version__}", fingerprint, ir_text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def source_digest() -> str:
    """sha256 of the CPU backend's own source (kernel generators included): code changes invalidate."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def graph_signature(graph: Any, options: dict[str, Any], fingerprint: str) -> str:
    """A digest of everything the generated IR depends on (weights only where inlined: size <= 16)."""
    from glowpy import __version__

    h = hashlib.sha256()

    def put(*parts: Any) -> None:
        for p in parts:
            h.update(repr(p).encode())
            h.update(b"\0")

    put(__version__, fingerprint, source_digest(), sorted(options.items()))
    for v in graph.inputs:
        put("in", v.name, str(v.dtype), v.shape)
    for v in graph.constants.values():
        small = np.asarray(v.data).tobytes() if v.type.size <= 16 else None
        put("const", v.name, str(v.dtype), v.shape, small)
    for n in graph.nodes:
        put("node", n.op, n.name, sorted((k, repr(a)) for k, a in n.attrs.items()),
            [x.name for x in n.inputs], [(o.name, str(o.dtype), o.shape) for o in n.outputs])
    put("out", [v.name for v in graph.outputs])
    return h.hexdigest()


class ObjectCache:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else cache_dir()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.o"

    def get(self, key: str) -> bytes | None:
        """The cached object for `key`, or None (missing, unreadable or corrupt)."""
        path = self.path(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            warn_once(self.directory, "read", f"cannot read {path.name} ({e.strerror or e}); compiling without it")
            return None
        head, sep, payload = blob.partition(b"\n")
        parts = head.split(b" ")
        if (not sep or len(parts) != 3 or parts[0] != MAGIC or parts[1].decode(errors="replace") != key
                or hashlib.sha256(payload).hexdigest().encode() != parts[2] or not payload):
            warn_once(self.directory, "corrupt", f"ignored {path.name}: truncated, damaged or not a glowpy entry "
                      "(rebuilt)")
            return None
        return payload

    def get_index(self, signature: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self.get(f"idx-{signature}") or b"null")
        except ValueError:
            return None
        return entry if isinstance(entry, dict) and isinstance(entry.get("key"), str) else None

    def put_index(self, signature: str, entry: dict[str, Any]) -> bool:
        return self.put(f"idx-{signature}", json.dumps(entry, sort_keys=True).encode())

    def put(self, key: str, data: bytes) -> bool:
        """Store atomically; False (one warning, no exception) if the directory cannot take it."""
        header = b" ".join([MAGIC, key.encode(), hashlib.sha256(data).hexdigest().encode()]) + b"\n"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.directory)
        except OSError as e:
            self._write_failed(e)
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(data)
            os.replace(tmp, self.path(key))
            return True
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self._write_failed(e)
            return False

    def _write_failed(self, e: OSError) -> None:
        warn_once(self.directory, "write", f"cannot store compiled code ({e.strerror or e}); compiling without "
                  "the cache")
