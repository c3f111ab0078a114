"""On-disk cache of compiled object code.

Key: sha256 over the generated LLVM IR text, the host target (triple, CPU name, feature string),
and the glowpy and llvmlite/LLVM versions. Weights are not part of the code (they live in the
weights block), so two models that differ only in weight values share an entry.

Directory: $GLOWPY_CACHE_DIR, else $XDG_CACHE_HOME/glowpy, else ~/.cache/glowpy.

An entry is one file `<key>.o`: a header line with a magic word, the key and the sha256 of the
payload, then the object code. Writes go to a temporary file in the same directory and are moved
into place with os.replace, so a reader sees either nothing or a complete file, and several
processes compiling the same model at once each write a complete file (the last rename wins). A
file whose header or digest does not check out (truncated, corrupt, another format) is ignored and
rebuilt: a corrupt object is never handed to LLVM.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

MAGIC = b"GLOWPY-OBJ-1"


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


class ObjectCache:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else cache_dir()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.o"

    def get(self, key: str) -> bytes | None:
        """The cached object for `key`, or None (missing, unreadable or corrupt)."""
        try:
            blob = self.path(key).read_bytes()
        except OSError:
            return None
        head, sep, payload = blob.partition(b"\n")
        if not sep:
            return None
        parts = head.split(b" ")
        if len(parts) != 3 or parts[0] != MAGIC or parts[1].decode(errors="replace") != key:
            return None
        if hashlib.sha256(payload).hexdigest().encode() != parts[2] or not payload:
            return None
        return payload

    def put(self, key: str, data: bytes) -> bool:
        """Store atomically; False (and no exception) if the directory is not writable."""
        header = b" ".join([MAGIC, key.encode(), hashlib.sha256(data).hexdigest().encode()]) + b"\n"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.directory)
        except OSError:
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(data)
            os.replace(tmp, self.path(key))
            return True
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
