"""ONNX → IR converters for the transformer cache ops composed of IR ops.

TensorScatter (opset 24, the KV-cache update) is a ScatterElements along the sequence axis: the write
index of each batch row plus 0..sequence_length-1 (modulo max_sequence_length in circular mode),
broadcast over the other axes. write_indices may be a run-time input.
"""

from __future__ import annotations

import numpy as np

from glowpy.errors import InvalidModel, MismatchingShape
from glowpy.importer.context import NodeContext
from glowpy.importer.table import INT, one_of, onnx_op
from glowpy.ir.graph import Value
from glowpy.ir.types import ALL_TYPES

I64 = np.dtype(np.int64)


@onnx_op("TensorScatter", attrs={"axis": INT, "mode": one_of("linear", "circular")}, since=24, dtypes=ALL_TYPES)
def tensor_scatter(ctx: NodeContext) -> list[Value]:
    past, update = ctx.input(0), ctx.input(1)
    r = past.type.rank
    if r < 2:
        raise ctx.unsupported("past_cache needs a batch axis and a sequence axis", expected="rank >= 2", found=r)
    axis = ctx.axis(ctx.attr("axis"), r)
    if axis == 0:
        raise ctx.unsupported("the sequence axis cannot be the batch axis", expected="axis != 0", found=ctx.attr("axis"))
    if update.type.rank != r or update.dtype != past.dtype or any(
            u != p for k, (u, p) in enumerate(zip(update.shape, past.shape)) if k != axis):
        raise ctx.error(MismatchingShape, "update must match past_cache outside the sequence axis",
                        expected=f"{past.dtype} {past.shape} with any length on axis {axis}",
                        found=f"{update.dtype} {update.shape}")
    batch, length, max_len = past.shape[0], update.shape[axis], past.shape[axis]
    if length > max_len:
        raise ctx.error(InvalidModel, "update is longer than the cache on the sequence axis", expected=f"<= {max_len}",
                        found=length)
    steps = np.arange(length, dtype=I64).reshape([length if k == axis else 1 for k in range(r)])
    idx = ctx.constant(steps, "steps")
    if ctx.has_input(2):
        w = ctx.input(2)
        if w.shape != (batch,):
            raise ctx.error(MismatchingShape, "write_indices needs one index per batch row", expected=(batch,),
                            found=w.shape)
        if w.dtype != I64:
            w = ctx.emit1("Cast", [w], {"to": I64})
        w = ctx.emit1("Reshape", [w], {"shape": (batch,) + (1,) * (r - 1)})
        idx = ctx.emit1("Add", [w, idx])
    if ctx.attr("mode") == "circular":
        idx = ctx.emit1("Mod", [idx, ctx.constant(np.array(max_len, dtype=I64), "max_len")], {"fmod": 0})
    idx = ctx.emit1("Expand", [idx], {"shape": update.shape})
    return ctx.emit("ScatterElements", [past, idx, update], {"axis": axis, "reduction": "none"})
