"""Shared types for the CPU backend's kernel generators."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir


@dataclass
class KernelInfo:
    """What a kernel generator hands back to codegen.

    ``function`` has the signature ``void name(float* out, float* x, float* residual_or_b, float* scratch,
    float* packed_0, ..., float* packed_k, i32 tid, i32 nthreads)`` and computes thread ``tid``'s share of
    ``out`` (bias, residual and activation included). ``packed`` are compile-time float32 arrays that go
    into the weights block, passed in this order. ``scratch_bytes_per_thread`` is the per-thread scratch
    region the caller provides (``scratch`` points at this thread's slice).
    """

    function: ir.Function
    packed: list[np.ndarray] = field(default_factory=list)
    scratch_bytes_per_thread: int = 0
