"""Resource limits: the memory budget that tensor sizes are checked against before they are allocated.

The budget is `GLOWPY_MAX_MEMORY` (bytes, or a number with a K/M/G/T suffix, powers of 1024) when set,
else a fraction of the memory available now (/proc/meminfo MemAvailable; physical memory where that
file is missing). Sizes are checked where they become known: every inferred output type
(`OpDef.infer_types`, so import-time and optimizer folding and the compatibility check are covered
without allocating), initializer dims at import, the CPU backend's arena plan and weights block.
A size over budget raises `MemoryLimitExceeded` (ONNXIFI NO_SYSTEM_MEMORY) naming what and where.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from glowpy.errors import ConfigurationError, MemoryLimitExceeded

ENV = "GLOWPY_MAX_MEMORY"
# Of MemAvailable: one tensor that large leaves room for the interpreter, the weights and the arena.
AVAILABLE_FRACTION = 0.75
_REFRESH_SECONDS = 1.0  # MemAvailable changes; a long-lived host (ONNXIFI) re-reads it this often
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)

_available: tuple[float, int] | None = None  # (monotonic time read, bytes)


def parse_size(text: str) -> int:
    """'1073741824', '4G', '512M', '1.5GiB' -> bytes; ConfigurationError otherwise."""
    m = _SIZE.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise ConfigurationError(f"{ENV}={text!r}: expected a positive size in bytes or with a unit, "
                                 "like 4G or 512M")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def human_bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def available_memory() -> int:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), re-read each second."""
    global _available
    now = time.monotonic()
    if _available is not None and now - _available[0] < _REFRESH_SECONDS:
        return _available[1]
    nbytes = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    nbytes = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        nbytes = None
    if nbytes is None:
        nbytes = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    _available = (now, nbytes)
    return nbytes


def memory_budget() -> tuple[int, str]:
    """(bytes, where the number comes from): the largest size one allocation may have."""
    env = os.environ.get(ENV)
    if env:
        return parse_size(env), ENV
    return int(available_memory() * AVAILABLE_FRACTION), (
        f"{AVAILABLE_FRACTION:.0%} of available memory; set {ENV} to change it")


def check_bytes(nbytes: int, what: str, *, node: str | None = None, op: str | None = None) -> None:
    """Raise MemoryLimitExceeded if `nbytes` (of `what`, at `node`) is over the budget."""
    budget, source = memory_budget()
    if nbytes > budget:
        raise MemoryLimitExceeded(f"{what} needs {human_bytes(nbytes)}, over the memory limit of "
                                  f"{human_bytes(budget)} ({source})", node=node, op=op)


def tensor_bytes(dtype: Any, dims: Iterable[int]) -> int:
    """Bytes of a dense tensor, in Python integers (no overflow for absurd dims)."""
    return math.prod(int(d) for d in dims) * np.dtype(dtype).itemsize


def check_tensor(name: str, dtype: Any, dims: Iterable[int], *, node: str | None = None,
                 op: str | None = None) -> None:
    """Check a tensor of `dims` (e.g. an initializer's declared dims) before reading or making it."""
    dims = [int(d) for d in dims]
    if any(d < 0 for d in dims):
        return  # symbolic or malformed: the importer's shape checks report it
    check_bytes(tensor_bytes(dtype, dims), f"tensor '{name}' ({np.dtype(dtype)}{dims})", node=node, op=op)
