"""ONNX DFT (opsets 17 and 20) → one MatMul by a constant DFT matrix.

Shapes are static, so the transform along the axis is a matrix: the axis is moved next to the
trailing real / imaginary dim, the two are flattened into one (length n * C), and a product with the
(n * C, K * C_out) matrix built here gives the K output bins as (real, imaginary) pairs (or the real
signal for an inverse one-sided transform). dft_length zero-pads or truncates (rows for input
positions past it are zero or absent); onesided keeps bins 0 .. L/2; an inverse one-sided transform
rebuilds the Hermitian half (numpy's irfft).
"""

from __future__ import annotations

import numpy as np

from glowpy.errors import InvalidModel
from glowpy.importer.context import NodeContext
from glowpy.importer.table import BOOL_INT, INT, onnx_op
from glowpy.ir.graph import Value
from glowpy.ir.types import FLOAT_TYPES

AXIS_INPUT_SINCE = 20


def dft_matrix(n_in: int, c_in: int, length: int, inverse: bool, onesided: bool) -> np.ndarray:
    """(n_in * c_in, bins * c_out) float64: input position j, part c (real, imaginary) → output bin k, part."""
    j = np.arange(n_in)[:, None]
    used = (j < length).astype(np.float64)  # input past dft_length is truncated
    if inverse and onesided:  # Hermitian half → real signal of length `length`
        half = length // 2 + 1
        k = np.arange(length)[None, :]
        w = np.where((j == 0) | ((length % 2 == 0) & (j == length // 2)), 1.0, 2.0) * (j < half) * used
        ang = 2 * np.pi * j * k / length
        m = np.zeros((n_in, c_in, length, 1))
        m[:, 0, :, 0] = w * np.cos(ang) / length
        if c_in == 2:
            m[:, 1, :, 0] = -w * np.sin(ang) / length
        return m.reshape(n_in * c_in, length)
    bins = length // 2 + 1 if onesided else length
    k = np.arange(bins)[None, :]
    sign, scale = (1.0, 1.0 / length) if inverse else (-1.0, 1.0)
    ang = sign * 2 * np.pi * j * k / length
    c, s = np.cos(ang) * used * scale, np.sin(ang) * used * scale
    m = np.zeros((n_in, c_in, bins, 2))
    m[:, 0, :, 0], m[:, 0, :, 1] = c, s
    if c_in == 2:
        m[:, 1, :, 0], m[:, 1, :, 1] = -s, c
    return m.reshape(n_in * c_in, bins * 2)


@onnx_op("DFT", attrs={"inverse": BOOL_INT, "onesided": BOOL_INT, "axis": INT}, since=17, const_inputs=(1, 2),
         dtypes=FLOAT_TYPES)
def dft(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    r = x.type.rank
    if r < 2 or x.shape[-1] not in (1, 2):
        raise ctx.error(InvalidModel, "DFT input needs a last dim of 1 (real) or 2 (real, imaginary)",
                        expected="[..., n, 1 or 2]", found=x.shape)
    if ctx.opset < AXIS_INPUT_SINCE:
        axis = ctx.attr("axis", 1)
    else:
        given = ctx.const(2)
        axis = -2 if given is None else int(np.asarray(given).reshape(()))
    if not -r <= axis < r or axis % r == r - 1:
        raise ctx.unsupported("DFT axis must be a signal axis (not the last, complex one)",
                              expected=f"in [{-r}, {r - 2}] but not -1", found=axis)
    axis %= r
    inverse, onesided = bool(ctx.attr("inverse")), bool(ctx.attr("onesided"))
    n_in, c_in = x.shape[axis], x.shape[-1]
    given = ctx.const(1)
    if given is not None and np.asarray(given).size:
        length = int(np.asarray(given).reshape(()))
    else:
        length = 2 * (n_in - 1) if inverse and onesided else n_in
    if length < 1:
        raise ctx.unsupported("dft_length must be positive", found=length)
    m = dft_matrix(n_in, c_in, length, inverse, onesided)
    others = [d for d in range(r - 1) if d != axis]
    perm = (*others, axis, r - 1)
    y = x if perm == tuple(range(r)) else ctx.emit1("Transpose", [x], {"perm": perm})
    lead = tuple(x.shape[d] for d in others)
    y = ctx.emit1("Reshape", [y], {"shape": (*lead, n_in * c_in)})
    y = ctx.emit1("MatMul", [y, ctx.constant(m.astype(x.dtype), "dft_matrix")])
    c_out = 1 if inverse and onesided else 2
    y = ctx.emit1("Reshape", [y], {"shape": (*lead, m.shape[1] // c_out, c_out)})
    back = tuple(int(np.argsort(perm)[d]) for d in range(r))
    return [y] if back == tuple(range(r)) else ctx.emit("Transpose", [y], {"perm": back})


@onnx_op("STFT", attrs={"onesided": BOOL_INT}, since=17, const_inputs=(1, 3), dtypes=FLOAT_TYPES)
def stft(ctx: NodeContext) -> list[Value]:
    """Frames of the signal (a Gather by a constant index table), times the window, then each frame's
    DFT as one MatMul: output [batch, frames, bins, 2]."""
    x = ctx.input(0)
    if x.type.rank != 3 or x.shape[-1] not in (1, 2):
        raise ctx.error(InvalidModel, "STFT signal must be [batch, length, 1 or 2]", expected="rank 3",
                        found=x.shape)
    batch, n, c_in = x.shape
    step = ctx.const(1)
    if step is None:
        raise ctx.unsupported("frame_step must be a constant", found="a run-time input")
    step = int(np.asarray(step).reshape(()))
    window = ctx.input(2) if ctx.has_input(2) else None
    if window is not None and window.type.rank != 1:
        raise ctx.error(InvalidModel, "window must be 1-D", found=window.shape)
    given = ctx.const(3)
    if given is not None and np.asarray(given).size:
        frame = int(np.asarray(given).reshape(()))
    else:
        frame = window.shape[0] if window is not None else n
    if window is not None and window.shape[0] != frame:
        raise ctx.error(InvalidModel, "window length must equal frame_length", expected=frame, found=window.shape[0])
    if step < 1 or not 1 <= frame <= n:
        raise ctx.unsupported("frame_step must be positive and frame_length within the signal",
                              expected=f"step >= 1, 1 <= frame_length <= {n}", found=f"step {step}, frame {frame}")
    frames = (n - frame) // step + 1
    index = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]
    y = ctx.emit1("Gather", [x, ctx.constant(index.astype(np.int64), "frames")], {"axis": 1})
    if window is not None:
        w = ctx.emit1("Reshape", [window], {"shape": (frame, 1)})
        if w.dtype != x.dtype:
            w = ctx.emit1("Cast", [w], {"to": x.dtype})
        y = ctx.emit1("Mul", [y, w])
    m = dft_matrix(frame, c_in, frame, False, bool(ctx.attr("onesided")))
    y = ctx.emit1("Reshape", [y], {"shape": (batch, frames, frame * c_in)})
    y = ctx.emit1("MatMul", [y, ctx.constant(m.astype(x.dtype), "dft_matrix")])
    return ctx.emit("Reshape", [y], {"shape": (batch, frames, m.shape[1] // 2, 2)})

