"""Recurrent ops: LSTM, GRU and RNN, with ONNX semantics and every operand explicit.

Operands, in order (the importer materialises ONNX's absent optional ones as constants: zero bias,
zero initial states, full-length sequence_lens, zero peepholes), with D directions, G gates, H the
hidden size, T steps, N the batch:

    X              [T, N, I]      (layout 1: [N, T, I])
    W              [D, G*H, I]    input weights, gates in ONNX order (LSTM i o f c, GRU z r h, RNN i)
    R              [D, G*H, H]    recurrent weights
    B              [D, 2*G*H]     input bias Wb, then recurrent bias Rb
    sequence_lens  [N] int32      steps of each batch entry, 0..T
    initial_h      [D, N, H]      (layout 1: [N, D, H])
    initial_c      [D, N, H]      LSTM only
    P              [D, 3*H]       LSTM only: peepholes i o f

Outputs: Y [T, D, N, H] (layout 1: [N, T, D, H]), Y_h [D, N, H] (layout 1: [N, D, H]), and for LSTM
Y_c like Y_h. Every output always exists; one the model does not name is simply unused.

Attributes: `direction` (forward / reverse / bidirectional), `hidden_size`, `activations` (one
(name, alpha, beta) triple per gate function per direction, forward first; alpha / beta are None
for a function without that parameter; () means the op's defaults), `clip` (None, or the bound of
the pre-activations), `layout`, `input_forget` (LSTM), `linear_before_reset` (GRU).

Ragged sequences follow onnxruntime: entry n runs sequence_lens[n] steps (reverse: from step
len - 1 down to 0); Y is zero at the steps past its length and Y_h / Y_c keep the state after its
last step (zeros for a length of 0).

The reference is written the way a backend lowers it: per direction one GEMM projects the input of
every step at once (X · Wᵀ + Wb), then each step is the recurrent GEMM (H · Rᵀ + Rb) plus the gates.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from glowpy.errors import InvalidShape, MismatchingDatatype, MismatchingShape, UnsupportedAttribute
from glowpy.ir.ops.elementwise import ACTIVATIONS
from glowpy.ir.ops.registry import REQUIRED, op
from glowpy.ir.types import FLOAT_TYPES, TensorType

DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _elu(x: np.ndarray, a: float) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0)))


# The activations ONNX allows in a recurrent op: name -> (f(x, alpha, beta), default alpha, default beta).
# A default of None: the function has no such parameter; REQUIRED: the model must give it (Affine and
# ScaledTanh are no longer ONNX ops, so "the default of the ONNX op" defines nothing for them); otherwise
# the default of the ONNX op of the same name, as the spec says. ThresholdedRelu is x > alpha, as the op
# and onnxruntime have it (the recurrent ops' doc writes x >= alpha).
RNN_ACTIVATIONS: dict[str, tuple[Callable[[np.ndarray, float, float], np.ndarray], object, object]] = {
    "Relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "Tanh": (lambda x, a, b: np.tanh(x), None, None),
    "Sigmoid": (lambda x, a, b: ACTIVATIONS["sigmoid"](x, ()), None, None),
    "Affine": (lambda x, a, b: a * x + b, REQUIRED, REQUIRED),
    "LeakyRelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "ThresholdedRelu": (lambda x, a, b: np.where(x > a, x, 0), 1.0, None),
    "ScaledTanh": (lambda x, a, b: a * np.tanh(b * x), REQUIRED, REQUIRED),
    "HardSigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "Elu": (lambda x, a, b: _elu(x, a), 1.0, None),
    "Softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "Softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}


class Cell:
    """What distinguishes the three ops: gate count, gate functions and their defaults, extra operands."""

    def __init__(self, name: str, gates: int, functions: tuple[str, ...], defaults: tuple[str, ...],
                 extra: tuple[str, ...] = ()) -> None:
        self.name = name
        self.gates = gates
        self.functions = functions  # the roles of the activations, as the ONNX spec names them
        self.defaults = defaults
        self.extra = extra  # operands after initial_h

    @property
    def num_inputs(self) -> int:
        return 6 + len(self.extra)

    @property
    def num_outputs(self) -> int:
        return 3 if self.name == "LSTM" else 2


CELLS = {
    "LSTM": Cell("LSTM", 4, ("f", "g", "h"), ("Sigmoid", "Tanh", "Tanh"), ("initial_c", "P")),
    "GRU": Cell("GRU", 3, ("f", "g"), ("Sigmoid", "Tanh")),
    "RNN": Cell("RNN", 1, ("f",), ("Tanh",)),
}


def activations_of(cell: Cell, attrs: dict) -> list[tuple[tuple[str, float | None, float | None], ...]]:
    """The (name, alpha, beta) of each gate function, one tuple per direction; raises for a bad list."""
    dirs = _num_directions(cell, attrs)
    acts = tuple(attrs["activations"]) or tuple((n, None, None) for n in cell.defaults) * dirs
    k = len(cell.functions)
    if len(acts) != k * dirs:
        raise UnsupportedAttribute(f"'activations' needs {k} function(s) per direction", op=cell.name,
                                   expected=k * dirs, found=len(acts))
    for a in acts:
        spec = RNN_ACTIVATIONS.get(a[0]) if isinstance(a, (tuple, list)) and len(a) == 3 else None
        if spec is None or any((p is None) != (d is None) for p, d in zip(a[1:], spec[1:])):
            raise UnsupportedAttribute("activation must be (name, alpha, beta), a parameter given exactly where "
                                       "the function takes one", op=cell.name, expected=sorted(RNN_ACTIVATIONS),
                                       found=a)
    return [acts[d * k:(d + 1) * k] for d in range(dirs)]


def _num_directions(cell: Cell, attrs: dict) -> int:
    dirs = DIRECTIONS.get(attrs["direction"])
    if dirs is None:
        raise UnsupportedAttribute("unknown direction", op=cell.name, expected=sorted(DIRECTIONS),
                                   found=attrs["direction"])
    return dirs


def _expect(cell: Cell, what: str, t: TensorType, shape: tuple[int, ...]) -> None:
    if t.shape != shape:
        raise MismatchingShape(f"{what} has the wrong shape", op=cell.name, expected=shape, found=t.shape)


def _infer(cell: Cell):
    def infer(attrs: dict, x: TensorType, w: TensorType, r: TensorType, b: TensorType, seq: TensorType,
              h0: TensorType, *extra: TensorType) -> list[TensorType]:
        dirs = _num_directions(cell, attrs)
        activations_of(cell, attrs)
        if attrs["layout"] not in (0, 1):
            raise UnsupportedAttribute("layout must be 0 or 1", op=cell.name, expected="0 or 1",
                                       found=attrs["layout"])
        if attrs["clip"] is not None and not attrs["clip"] > 0:
            raise UnsupportedAttribute("clip must be positive", op=cell.name, expected="> 0", found=attrs["clip"])
        if x.rank != 3:
            raise MismatchingShape("X must be rank 3", op=cell.name, expected="[seq, batch, input]" if not
                                   attrs["layout"] else "[batch, seq, input]", found=x.shape)
        steps, batch = (x.shape[1], x.shape[0]) if attrs["layout"] else x.shape[:2]
        size, hidden, gh = x.shape[2], attrs["hidden_size"], cell.gates * attrs["hidden_size"]
        _expect(cell, "W", w, (dirs, gh, size))
        _expect(cell, "R", r, (dirs, gh, hidden))
        _expect(cell, "B", b, (dirs, 2 * gh))
        _expect(cell, "sequence_lens", seq, (batch,))
        if seq.dtype != np.int32:
            raise MismatchingDatatype("sequence_lens must be int32", op=cell.name, expected="int32",
                                      found=str(seq.dtype))
        state = (batch, dirs, hidden) if attrs["layout"] else (dirs, batch, hidden)
        _expect(cell, "initial_h", h0, state)
        states = [h0]
        if cell.name == "LSTM":
            _expect(cell, "initial_c", extra[0], state)
            _expect(cell, "P", extra[1], (dirs, 3 * hidden))
            states.append(extra[0])
        for t in (w, r, b, *states, *extra):
            if t.dtype != x.dtype:
                raise MismatchingDatatype("operands differ in element type", op=cell.name, expected=str(x.dtype),
                                          found=str(t.dtype))
        y = (batch, steps, dirs, hidden) if attrs["layout"] else (steps, dirs, batch, hidden)
        return [TensorType(x.dtype, y)] + [TensorType(x.dtype, state)] * len(states)

    return infer


# --- one step of each cell: `xg` is this step's slice of the input projection (bias Wb included) ----


def _clipped(attrs: dict) -> Callable[[np.ndarray], np.ndarray]:
    bound = attrs["clip"]
    return (lambda v: v) if bound is None else (lambda v: np.clip(v, -bound, bound))


def _fn(act: tuple[str, float | None, float | None]) -> Callable[[np.ndarray], np.ndarray]:
    f, _, _ = RNN_ACTIVATIONS[act[0]]
    return lambda v: f(v, act[1], act[2])


def _lstm_step(attrs, acts, xg, h, c, r, rb, p):
    f, g, hf = (_fn(a) for a in acts)
    clip = _clipped(attrs)
    gates = xg + h @ r.T + rb
    i, o, fg, cand = np.split(gates, 4, axis=-1)
    pi, po, pf = np.split(p, 3)
    i = f(clip(i + pi * c))
    fg = 1 - i if attrs["input_forget"] else f(clip(fg + pf * c))
    c_new = fg * c + i * g(clip(cand))
    o = f(clip(o + po * c_new))
    return o * hf(c_new), c_new


def _gru_step(attrs, acts, xg, h, c, r, rb, p):
    f, g = (_fn(a) for a in acts)
    clip = _clipped(attrs)
    hidden = h.shape[-1]
    xz, xr, xh = np.split(xg, 3, axis=-1)
    if attrs["linear_before_reset"]:
        rz, rr, rh = np.split(h @ r.T + rb, 3, axis=-1)  # one recurrent GEMM for all three gates
        z, reset = f(clip(xz + rz)), f(clip(xr + rr))
        cand = g(clip(xh + reset * rh))
    else:
        rz, rr = np.split(h @ r[:2 * hidden].T + rb[:2 * hidden], 2, axis=-1)
        z, reset = f(clip(xz + rz)), f(clip(xr + rr))
        cand = g(clip(xh + (reset * h) @ r[2 * hidden:].T + rb[2 * hidden:]))
    return (1 - z) * cand + z * h, None


def _rnn_step(attrs, acts, xg, h, c, r, rb, p):
    return _fn(acts[0])(_clipped(attrs)(xg + h @ r.T + rb)), None


_STEPS = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN": _rnn_step}


def _compute(cell: Cell):
    def compute(attrs: dict, x, w, r, b, seq, h0, *extra):
        layout, dirs = attrs["layout"], _num_directions(cell, attrs)
        acts = activations_of(cell, attrs)
        lstm = cell.name == "LSTM"
        c0, p = extra if lstm else (None, None)
        if layout:
            x, h0 = x.swapaxes(0, 1), h0.swapaxes(0, 1)
            c0 = c0.swapaxes(0, 1) if lstm else None
        steps, batch, size = x.shape
        if np.any(seq < 0) or np.any(seq > steps):
            raise InvalidShape("sequence_lens out of range", op=cell.name, expected=f"0..{steps}",
                               found=seq.tolist())
        dtype = np.promote_types(x.dtype, np.float32)  # float16 computes in float32
        gh = w.shape[1]
        lens = seq.astype(np.int64)
        rows = np.arange(batch)
        y = np.zeros((steps, dirs, batch, h0.shape[-1]), dtype)
        y_h = np.empty(h0.shape, dtype)
        y_c = np.empty(h0.shape, dtype) if lstm else None
        step = _STEPS[cell.name]
        for d in range(dirs):
            backward = attrs["direction"] == "reverse" or d == 1
            wd, rd = w[d].astype(dtype), r[d].astype(dtype)
            wb, rb = b[d, :gh].astype(dtype), b[d, gh:].astype(dtype)
            # The input projection of every step in one GEMM.
            xw = (x.reshape(steps * batch, size).astype(dtype) @ wd.T + wb).reshape(steps, batch, gh)
            h = h0[d].astype(dtype)
            c = c0[d].astype(dtype) if lstm else None
            pd = p[d].astype(dtype) if lstm else None
            for s in range(steps):
                active = s < lens
                if not active.any():
                    break
                t = np.where(active, lens - 1 - s, 0) if backward else np.full(batch, s)
                h_new, c_new = step(attrs, acts[d], xw[t, rows], h, c, rd, rb, pd)
                keep = active[:, None]
                h = np.where(keep, h_new, h)
                if lstm:
                    c = np.where(keep, c_new, c)
                y[t[active], d, rows[active]] = h_new[active]
            # An entry of length 0 has no last step: onnxruntime gives zeros, not the initial state.
            ran = (lens > 0)[:, None]
            y_h[d] = np.where(ran, h, 0)
            if lstm:
                y_c[d] = np.where(ran, c, 0)
        outs = [y, y_h] + ([y_c] if lstm else [])
        if layout:
            outs = [y.transpose(2, 0, 1, 3)] + [o.swapaxes(0, 1) for o in outs[1:]]
        return [o.astype(x.dtype) for o in outs]

    return compute


def _declare(cell: Cell, extra_attrs: dict) -> None:
    attrs = {"direction": "forward", "hidden_size": REQUIRED, "activations": (), "clip": None, "layout": 0,
             **extra_attrs}
    compute = _compute(cell)
    compute.__doc__ = f"ONNX {cell.name}: gate functions {', '.join(cell.functions)} (defaults " \
                      f"{', '.join(cell.defaults)}); see the module doc for operands and outputs."
    op(cell.name, infer=_infer(cell), inputs=(cell.num_inputs, cell.num_inputs), num_outputs=cell.num_outputs,
       dtypes=FLOAT_TYPES, attrs=attrs)(compute)


_declare(CELLS["LSTM"], {"input_forget": 0})
_declare(CELLS["GRU"], {"linear_before_reset": 0})
_declare(CELLS["RNN"], {})
