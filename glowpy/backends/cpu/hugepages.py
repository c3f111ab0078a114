"""The weights kernels read, on 2 MiB pages where the OS gives them.

Kernels stream their packed weights (ResNet-50: 136 MiB per run, from memory). On 4 KiB pages every page
is a TLB miss and a page walk, and numpy advises huge pages only for arrays of 4 MiB or more (and then
not for their unaligned ends), while most packed arrays are 64 KiB - 2 MiB. In blocks advised
MADV_HUGEPAGE ResNet-50's weight table takes about 70 TLB entries. Measured on a Xeon (AVX-512),
ResNet-50, compiles alternating in one process: 0.93-0.96x the time of numpy's arrays at 1 thread and 2,
and identical compiles no longer 2-3% apart; a cache hit reading its packed weights into such memory ran
0.98x and 1.00x (two runs) the time of one mapping the entry's file.

- `WeightBlock`: bump allocation in such blocks. While one is `active()` (kernels/sharing.py, around a
  kernel generator), `zeros` and `contiguous` allocate the packers' big arrays there, so a big weight
  is never held a third time (graph, packer, copy); `place(a)` copies a smaller array in.
- `read_ranges(fd, ranges)`: ranges of a file (a model cache entry's packed weights) read into such
  memory; a mapping of the file would put them on 4 KiB page-cache pages.
Elsewhere than Linux (no MADV_HUGEPAGE) the memory is plain anonymous memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Iterator
from contextvars import ContextVar

import numpy as np

HUGE = 2 << 20
ALIGN = 64
# Arrays this large go to a block; smaller ones would each take a share of a 2 MiB page for little TLB
# reach (a small model's weights would cost a whole huge page).
MIN_BYTES = 64 << 10
# numpy advises huge pages itself for arrays from this size on (then not for their unaligned ends).
NUMPY_BYTES = 4 << 20
# A block is at least this large: fewer, larger mappings; untouched pages cost no memory.
BLOCK_BYTES = 64 << 20
# Placing this much returns the heap's free memory to the OS: the originals (and a compile's released
# graph weights) are freed into malloc's heap, which the blocks, separate mappings, cannot reuse.
TRIM_BYTES = 16 << 20

_ACTIVE: ContextVar[WeightBlock | None] = ContextVar("glowpy_weight_block", default=None)


def return_free_heap() -> None:
    """Give freed malloc memory back to the OS (glibc keeps it otherwise); a no-op elsewhere."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def anonymous(nbytes: int) -> np.ndarray:
    """`nbytes` of zeroed memory (uint8) starting on a 2 MiB boundary, advised to use huge pages."""
    nbytes = max(int(nbytes), 1)
    mm = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            mm.madvise(advice)
        except OSError:  # a kernel without transparent huge pages: plain pages
            pass
    buf = np.frombuffer(mm, np.uint8)  # keeps the mapping alive as long as any view of it
    start = (-buf.ctypes.data) % HUGE
    return buf[start:start + nbytes]


class WeightBlock:
    """Bump allocator of packed weights in huge-page blocks (memory is never reused: a block lives as
    long as any array in it)."""

    def __init__(self) -> None:
        self._block: np.ndarray | None = None
        self._at = 0
        self._untrimmed = 0
        self._spans: list[tuple[int, int]] = []  # [start, end) addresses of the blocks

    def alloc(self, shape, dtype=np.float32) -> np.ndarray:
        """A zeroed array in a block."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        at = -(-self._at // ALIGN) * ALIGN
        if self._block is None or at + n > self._block.size:
            self._block, at = anonymous(max(n, BLOCK_BYTES)), 0
            start = self._block.ctypes.data
            self._spans.append((start, start + self._block.size))
        self._at = at + n
        self._untrimmed += n
        if self._untrimmed >= TRIM_BYTES:
            return_free_heap()
            self._untrimmed = 0
        return self._block[at:at + n].view(dt).reshape(shape)

    def place(self, a: np.ndarray) -> np.ndarray:
        """A contiguous copy of `a` (same dtype and shape) in a block."""
        dst = self.alloc(a.shape, a.dtype)
        np.copyto(dst, a, casting="no")
        return dst

    def owns(self, a: np.ndarray) -> bool:
        """Whether `a`'s memory lies in one of this allocator's blocks."""
        p = a.ctypes.data
        return any(lo <= p < hi for lo, hi in self._spans)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """`zeros` and `contiguous` allocate in this block meanwhile (in this thread / context)."""
        token = _ACTIVE.set(self)
        try:
            yield
        finally:
            _ACTIVE.reset(token)


@contextlib.contextmanager
def inactive() -> Iterator[None]:
    """`zeros` and `contiguous` are numpy's meanwhile (throwaway packings: probes)."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def zeros(shape, dtype=np.float32) -> np.ndarray:
    """np.zeros(shape, dtype), in the active weight block when there is one and the array is big enough."""
    block = _ACTIVE.get()
    if block is None or int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize < MIN_BYTES:
        return np.zeros(shape, dtype)
    return block.alloc(shape, dtype)


def contiguous(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `a` (np.ascontiguousarray for a packer's result), in the active weight block
    when there is one and the array is big enough."""
    block = _ACTIVE.get()
    if block is None or a.nbytes < MIN_BYTES:
        return np.ascontiguousarray(a)
    return block.place(a)


def read_ranges(fd: int, ranges: list[tuple[int, int]]) -> list[np.ndarray]:
    """The (offset, size) byte ranges of open file `fd`, read (not mapped) into one huge-page block (uint8
    arrays, 64-byte aligned). OSError if the file is shorter."""
    starts, total = [], 0
    for _, n in ranges:
        total = -(-total // ALIGN) * ALIGN
        starts.append(total)
        total += n
    block = anonymous(total)
    out = []
    for (offset, n), at in zip(ranges, starts):
        view, done = memoryview(block[at:at + n]), 0
        while done < n:
            got = os.preadv(fd, [view[done:]], offset + done)
            if not got:
                raise OSError(f"file ends {n - done} bytes short of a weight")
            done += got
        out.append(block[at:at + n])
    return out


__all__ = ["HUGE", "MIN_BYTES", "NUMPY_BYTES", "WeightBlock", "anonymous", "contiguous", "inactive", "read_ranges", "return_free_heap", "zeros"]
