"""Content digests of models: the model caches' key ingredient (a file's bytes, a proto's parts, the
weights an ONNXIFI host hands over, read in place)."""

from __future__ import annotations

import hashlib
import mmap
import os

CHUNK = 8 << 20


def _combine(lengths: list[int], parts: list[bytes]) -> str:
    outer = hashlib.sha256()
    for n, part in zip(lengths, parts):
        outer.update(n.to_bytes(8, "little"))
        outer.update(part)
    return outer.hexdigest()


def _map(fn, items: list, parallel: bool) -> list:
    workers = min(len(items), os.cpu_count() or 1)
    if workers > 1 and parallel:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(fn, items))
    return [fn(x) for x in items]


def content_digest(*buffers: bytes | memoryview) -> str:
    """sha256 over the sha256 of each buffer's 8 MiB chunks, in order: the chunks are hashed on all
    cores (hashlib releases the GIL), so 100 MB of weights hash in a fraction of one sha256's time.
    Each chunk's length goes into the outer hash, so how the bytes are split into buffers counts."""
    chunks = []
    for data in buffers:
        view = memoryview(data).cast("B")
        chunks.extend(view[i:i + CHUNK] for i in range(0, max(len(view), 1), CHUNK))
    parts = _map(lambda c: hashlib.sha256(c).digest(), chunks, sum(len(c) for c in chunks) > CHUNK)
    return _combine([len(c) for c in chunks], parts)


def file_digest(fd: int, size: int, marker: bytes = b"") -> tuple[str, bool]:
    """content_digest of the `size` bytes of an open file, read a chunk per worker at a time (never
    the whole file in memory), and whether `marker` occurs in them."""
    over = max(len(marker) - 1, 0)

    def chunk(start: int) -> tuple[bytes, bool, int]:
        want = min(CHUNK, size - start) + over
        if not hasattr(os, "preadv") or want <= 0:
            data = os.pread(fd, want, start)
            n = min(CHUNK, len(data))
            return hashlib.sha256(memoryview(data)[:n]).digest(), bool(marker) and marker in data, n
        # Read into a mapping of its own, unmapped after: a bytes object this size would come from
        # malloc, whose heaps (one per hashing thread) keep such chunks resident after they are freed,
        # and would raise its mmap threshold, so the weights the import allocates next share a heap.
        with mmap.mmap(-1, want) as buf:
            got = os.preadv(fd, [buf], start)
            n = min(CHUNK, got)
            with memoryview(buf) as view, view[:n] as part:
                digest = hashlib.sha256(part).digest()
            return digest, bool(marker) and buf.find(marker, 0, got) >= 0, n

    results = _map(chunk, list(range(0, max(size, 1), CHUNK)), size > CHUNK)
    lengths = [n for _, _, n in results]
    if sum(lengths) != size:
        raise OSError(f"read {sum(lengths)} of {size} bytes")
    return _combine(lengths, [d for d, _, _ in results]), any(found for _, found, _ in results)
