"""Content digests of models: the model caches' key ingredient (a file's bytes, a proto's parts, the
weights an ONNXIFI host hands over, read in place)."""

from __future__ import annotations

import hashlib
import os

CHUNK = 8 << 20


def content_digest(*buffers: bytes | memoryview) -> str:
    """sha256 over the sha256 of each buffer's 8 MiB chunks, in order: the chunks are hashed on all
    cores (hashlib releases the GIL), so 100 MB of weights hash in a fraction of one sha256's time.
    Each chunk's length goes into the outer hash, so how the bytes are split into buffers counts."""
    chunks = []
    for data in buffers:
        view = memoryview(data).cast("B")
        chunks.extend(view[i:i + CHUNK] for i in range(0, max(len(view), 1), CHUNK))
    workers = min(len(chunks), os.cpu_count() or 1)
    if workers > 1 and sum(len(c) for c in chunks) > CHUNK:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(lambda c: hashlib.sha256(c).digest(), chunks))
    else:
        parts = [hashlib.sha256(c).digest() for c in chunks]
    outer = hashlib.sha256()
    for chunk, part in zip(chunks, parts):
        outer.update(len(chunk).to_bytes(8, "little"))
        outer.update(part)
    return outer.hexdigest()
