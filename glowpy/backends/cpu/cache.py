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
and the source of glowpy) to the IR key. The index is only a shortcut: the entry it names
is used only if the program just built agrees with what the index recorded (steps, kernels, weight
table, arena size), otherwise the IR is printed and hashed as usual. Writes go to a temporary file in the same directory and are moved
into place with os.replace, so a reader sees either nothing or a complete file, and several
processes compiling the same model at once each write a complete file (the last rename wins). A
file whose header or digest does not check out (truncated, corrupt, another format) is ignored and
rebuilt: a corrupt object is never handed to LLVM.

Size cap: $GLOWPY_CACHE_MAX_BYTES (bytes; a K, M or G suffix multiplies by 2^10, 2^20, 2^30;
default 4G; 0 turns the cap off). When the directory may be over the cap, a process that stores an
entry evicts the least recently used entries (by modification time; a hit touches the files it reads)
until the directory holds at most 90% of the cap. Listing the directory costs a stat per entry, so a
process lists it again only once its own writes since the last listing could cross the cap, or after
EVICT_EVERY stores (other processes' writes): the cap holds within what processes wrote meanwhile.
Another process may be reading an entry that is evicted: a file already open or mapped stays readable
(POSIX unlink), one not yet opened is a miss, so eviction is safe under concurrent processes. `glowpy cache info|clear|path` reports, empties or locates the directory.

Faults never fail a compile: a directory that cannot be written (read-only, full disk, not a directory)
or an entry that cannot be read or does not check out makes the compile go on without that entry,
and logs one warning on the `glowpy.cache` logger per directory and kind of fault, for the life of the
process (a long-lived host compiling many graphs is told once, not per graph).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from glowpy.ir.ops.control import bodies

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
@functools.cache
def source_digest() -> str:
    """sha256 of every glowpy source file. The generated code depends on more than the backend's own
    modules (the IR ops' tables and semantics, the activation registry, the optimizer's rewrites), so any
    change to glowpy invalidates every kind of entry."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
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

    def walk(g: Any) -> None:
        for v in g.inputs:
            put("in", v.name, str(v.dtype), v.shape)
        for v in g.constants.values():
            small = np.asarray(v.data).tobytes() if v.type.size <= 16 else None
            put("const", v.name, str(v.dtype), v.shape, small)
        for n in g.nodes:
            subs = dict(bodies(n.op, n.attrs))
            put("node", n.op, n.name, sorted((k, repr(a)) for k, a in n.attrs.items() if k not in subs),
                [x.name for x in n.inputs], [(o.name, str(o.dtype), o.shape) for o in n.outputs])
            for key, body in subs.items():  # a Loop kept as a loop is compiled with its body
                put("body", key)
                walk(body)
                put("end", key)
        put("out", [v.name for v in g.outputs])

    put(__version__, fingerprint, source_digest(), sorted(options.items()))
    walk(graph)
    return h.hexdigest()


DEFAULT_MAX_BYTES = 4 << 30
_SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
STALE_TMP_SECONDS = 3600  # a temporary file older than this was left by a process that died mid-write


def max_bytes() -> int:
    """The size cap from $GLOWPY_CACHE_MAX_BYTES (0: no cap); a malformed value warns and means the default."""
    raw = os.environ.get("GLOWPY_CACHE_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    scale = _SUFFIX.get(raw[-1].upper(), 1)
    try:
        n = int(raw[:-1] if scale > 1 else raw) * scale
        if n < 0:
            raise ValueError
        return n
    except ValueError:
        warn_once(cache_dir(), "cap", f"GLOWPY_CACHE_MAX_BYTES={raw!r} is not a size (e.g. 2G); using "
                  f"{DEFAULT_MAX_BYTES >> 30}G")
        return DEFAULT_MAX_BYTES


def entries(directory: Path) -> list[tuple[Path, int, float]]:
    """(path, bytes, mtime) of every entry file, least recently used first."""
    out = []
    try:
        it = list(os.scandir(directory))
    except OSError:
        return []
    for e in it:
        if e.name.endswith((".o", ".w", ".tmp")):
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            out.append((Path(e.path), st.st_size, st.st_mtime))
    return sorted(out, key=lambda t: t[2])


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        warn_once(path.parent, "evict", f"cannot remove {path.name} ({e.strerror or e})")
        return False


EVICT_EVERY = 64


class _Listing:
    """What this process knows of a directory's size: its total at the last listing, and what this
    process stored since."""

    def __init__(self) -> None:
        self.total = 0
        self.written = 0
        self.puts = EVICT_EVERY  # unknown until listed once

    def due(self, cap: int) -> bool:
        return self.puts >= EVICT_EVERY or 0 < cap < self.total + self.written


_listings: dict[Path, _Listing] = {}
_listings_lock = threading.Lock()


def evict_if_due(directory: Path, stored: int) -> None:
    """Count `stored` bytes written to `directory`; evict when the cap may have been crossed."""
    cap = max_bytes()
    with _listings_lock:
        listing = _listings.setdefault(directory, _Listing())
        listing.written += stored
        listing.puts += 1
        if not listing.due(cap):
            return
        listing.written, listing.puts = 0, 0
    _, total = _evict(directory, cap)
    with _listings_lock:
        listing.total = total


def evict(directory: Path, cap: int | None = None) -> int:
    """Remove least recently used entries until the directory holds at most 90% of `cap` (default:
    max_bytes()); stale temporary files go first. Returns the bytes removed."""
    return _evict(directory, max_bytes() if cap is None else cap)[0]


def _evict(directory: Path, cap: int) -> tuple[int, int]:
    """evict(); (bytes removed, bytes left)."""
    found = entries(directory)
    now = time.time()
    freed = 0
    keep = []
    for path, size, mtime in found:
        if path.suffix == ".tmp" and now - mtime > STALE_TMP_SECONDS and _unlink(path):
            freed += size
        else:
            keep.append((path, size, mtime))
    total = sum(size for _, size, _ in keep)
    if cap <= 0 or total <= cap:
        return freed, total
    target = cap * 9 // 10
    for path, size, _ in keep:
        if total <= target:
            break
        if path.suffix == ".tmp":
            continue  # another process is writing it
        if _unlink(path):
            freed += size
        total -= size
    return freed, total


def clear(directory: Path) -> tuple[int, int]:
    """Remove every entry (not temporary files of writers in flight); (files, bytes) removed."""
    n = freed = 0
    for path, size, _ in entries(directory):
        if path.suffix != ".tmp" and _unlink(path):
            n, freed = n + 1, freed + size
    return n, freed


def touch(path: Path) -> None:
    """Mark an entry used (the eviction order); a read-only directory just keeps the old order."""
    try:
        os.utime(path)
    except OSError:
        pass


def atomic_write(directory: Path, prefix: str, dest: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write `dest` whole or not at all: `write` fills a temporary file in `directory` (opened for
    reading too), which os.replace then moves onto `dest`, so a reader sees nothing or a complete
    file. Raises OSError, and leaves no temporary file behind."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w+b") as f:
            write(f)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
        touch(path)
        return payload

    def get_index(self, signature: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self.get(f"idx-{signature}") or b"null")
        except ValueError:
            return None
        return entry if isinstance(entry, dict) and isinstance(entry.get("key"), str) else None

    def put_index(self, signature: str, entry: dict[str, Any]) -> bool:
        return self.put(f"idx-{signature}", json.dumps(entry, sort_keys=True).encode())

    def put(self, key: str, data: bytes, alongside: int = 0) -> bool:
        """Store atomically; False (one warning, no exception) if the directory cannot take it.
        `alongside`: bytes the caller wrote to the directory itself for this entry (counted for the cap)."""
        header = b" ".join([MAGIC, key.encode(), hashlib.sha256(data).hexdigest().encode()]) + b"\n"

        def write(f: BinaryIO) -> None:
            f.write(header)
            f.write(data)

        try:
            atomic_write(self.directory, f".{key[:16]}.", self.path(key), write)
        except OSError as e:
            self._write_failed(e)
            return False
        evict_if_due(self.directory, len(header) + len(data) + alongside)
        return True

    def _write_failed(self, e: OSError) -> None:
        warn_once(self.directory, "write", f"cannot store compiled code ({e.strerror or e}); compiling without "
                  "the cache")
