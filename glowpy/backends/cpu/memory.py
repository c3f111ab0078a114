"""Liveness-based placement of activation buffers in one arena.

Every buffer has a size and a live range [first, last] in step indices (inclusive: it is written
by step `first` and last read by step `last`). Two buffers may share bytes only if their live
ranges are disjoint. Placement is greedy by size (largest first, each at the lowest offset whose gap
between already-placed, time-overlapping buffers fits), the strategy of TFLite's and Glow's
allocators, which stays close to the peak of live bytes on CNNs.

In-place reuse and aliases (Reshape) are decided before this, by merging buffers (codegen.py);
here a buffer is just a size and a range.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from glowpy.errors import InternalError
from glowpy.limits import check_bytes

ALIGN = 64  # a cache line and an AVX-512 vector


def align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


@dataclass
class Interval:
    key: Hashable
    size: int  # bytes
    first: int
    last: int

    def overlaps(self, other: Interval) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass
class Plan:
    offsets: dict[Hashable, int]
    size: int  # arena bytes
    peak_live: int  # max over steps of the bytes live at once (a lower bound for `size`)


def peak_live_bytes(intervals: Sequence[Interval]) -> int:
    events: dict[int, int] = {}
    for iv in intervals:
        events[iv.first] = events.get(iv.first, 0) + align_up(iv.size)
        events[iv.last + 1] = events.get(iv.last + 1, 0) - align_up(iv.size)
    live = peak = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def plan_arena(intervals: Sequence[Interval], align: int = ALIGN) -> Plan:
    """Offsets (aligned) for every interval such that time-overlapping intervals never share bytes."""
    for iv in intervals:
        if iv.first > iv.last or iv.size < 0:
            raise InternalError("malformed buffer live range", found=(iv.key, iv.first, iv.last, iv.size))
    order = sorted(intervals, key=lambda iv: (-align_up(iv.size, align), iv.first, iv.last))
    placed: list[tuple[int, int, Interval]] = []  # (offset, end, interval)
    offsets: dict[Hashable, int] = {}
    total = 0
    for iv in order:
        size = align_up(iv.size, align)
        if size == 0:
            offsets[iv.key] = 0
            continue
        busy = sorted((o, e) for o, e, other in placed if other.overlaps(iv))
        best, best_gap = None, None
        cursor = 0
        for o, e in busy:
            gap = o - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, e)
        offset = best if best is not None else cursor
        placed.append((offset, offset + size, iv))
        offsets[iv.key] = offset
        total = max(total, offset + size)
    check_bytes(total, "the activation arena")  # before the arena is allocated
    return Plan(offsets, total, peak_live_bytes(intervals))


def check_plan(intervals: Sequence[Interval], plan: Plan) -> None:
    """Raise InternalError if two buffers live at the same time share bytes (used by tests)."""
    items = [(iv, plan.offsets[iv.key]) for iv in intervals if iv.size > 0]
    for i, (a, oa) in enumerate(items):
        if oa % ALIGN or oa + a.size > plan.size:
            raise InternalError("buffer misplaced", found=(a.key, oa, a.size, plan.size))
        for b, ob in items[i + 1:]:
            if a.overlaps(b) and oa < ob + b.size and ob < oa + a.size:
                raise InternalError("live buffers overlap in the arena", found=(a.key, b.key))
