"""The CPU backend's activation emitters: activation name (glowpy/ir/activations.py) -> code.

An emitter is written once against `Math`, the few operations it needs, and serves both the scalar
code (elementwise kernels, the plain conv / gemm kernels) through `ScalarMath` and the vector
epilogues of the tiled kernels through `VectorMath`. The fused epilogues the backend accepts
(CpuBackend.supports_fused_activation) and the activation ops its elementwise kernels generate are
the names in EMITTERS. Comparisons are ordered and selects keep x when it is NaN, as numpy does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from llvmlite import ir

from glowpy.backends.cpu import irutil as U
from glowpy.errors import UnsupportedAttribute
from glowpy.ir.activations import ACTIVATIONS, NONE


class Math(Protocol):
    def const(self, v: float) -> ir.Value: ...
    def bound(self, v: float) -> ir.Value: ...  # a constant x is compared with, in x's element type
    def add(self, a: ir.Value, b: ir.Value) -> ir.Value: ...
    def sub(self, a: ir.Value, b: ir.Value) -> ir.Value: ...
    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value: ...
    def div(self, a: ir.Value, b: ir.Value) -> ir.Value: ...
    def cmp(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value: ...
    def select(self, c: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value: ...
    def exp(self, x: ir.Value) -> ir.Value: ...
    def expm1(self, x: ir.Value) -> ir.Value: ...
    def tanh(self, x: ir.Value) -> ir.Value: ...
    def erf(self, x: ir.Value) -> ir.Value: ...


class ScalarMath:
    """Math on one float value (f32 or f64); exp and tanh from libm."""

    def __init__(self, b: ir.IRBuilder, t: ir.Type, storage: np.dtype | None = None) -> None:
        self.b, self.t = b, t
        self.storage = storage  # the element type when it is narrower than t (float16 computed in f32)

    def const(self, v: float) -> ir.Value:
        return ir.Constant(self.t, float(v))

    def bound(self, v: float) -> ir.Value:
        if self.storage is not None:  # numpy compares a float16 array with a float16 bound
            v = np.asarray(v).astype(self.storage)
        return ir.Constant(self.t, float(v))

    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)

    def cmp(self, op, a, b):
        return self.b.fcmp_ordered(op, a, b)

    def select(self, c, a, b):
        return self.b.select(c, a, b)

    def exp(self, x):
        return U.libm(self.b, "exp", x)

    def expm1(self, x):
        return U.libm(self.b, "expm1", x)

    def tanh(self, x):
        return U.libm(self.b, "tanh", x)

    def erf(self, x):
        return U.libm(self.b, "erf", x)


class VectorMath:
    """Math on float32 vectors of a VecIR (kernels/gemm.py): its polynomial exp, epilogue flags."""

    def __init__(self, vx: Any) -> None:
        self.vx = vx

    def const(self, v):
        return self.vx.fconst(v)

    def bound(self, v):
        return self.vx.fconst(v)

    def add(self, a, b):
        return self.vx.fadd(a, b)

    def sub(self, a, b):
        return self.vx.fsub(a, b)

    def mul(self, a, b):
        return self.vx.fmul(a, b)

    def div(self, a, b):
        return self.vx.fdiv(a, b)

    def cmp(self, op, a, b):
        return self.vx.b.fcmp_ordered(op, a, b)

    def select(self, c, a, b):
        return self.vx.b.select(c, a, b)

    def exp(self, x):
        return self.vx.exp(x)

    def expm1(self, x):
        # exp(x) - 1 loses relative precision only near 0, where the result is below 1e-7 in absolute error
        return self.sub(self.vx.exp(x), self.const(1.0))

    def tanh(self, x):
        # tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) <= 1, then the sign of x
        one = self.const(1.0)
        e = self.exp(self.mul(self.vx.fabs(x), self.const(-2.0)))
        t = self.div(self.sub(one, e), self.add(one, e))
        return self.select(self.cmp("<", x, self.const(0.0)), self.sub(self.const(0.0), t), t)

    def erf(self, x):
        # Abramowitz & Stegun 7.1.26 on |x| (absolute error below 1.5e-7), then the sign of x
        ax = self.vx.fabs(x)
        t = self.div(self.const(1.0), self.add(self.const(1.0), self.mul(ax, self.const(0.3275911))))
        p = self.const(1.061405429)
        for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
            p = self.add(self.mul(p, t), self.const(c))
        e = self.sub(self.const(1.0), self.mul(self.mul(p, t), self.exp(self.mul(ax, self.sub(self.const(0.0), ax)))))
        return self.select(self.cmp("<", x, self.const(0.0)), self.sub(self.const(0.0), e), e)


def _clamp(m: Math, x: ir.Value, lo: float, hi: float) -> ir.Value:
    y = m.select(m.cmp("<", x, m.const(lo)), m.const(lo), x)
    return m.select(m.cmp(">", y, m.const(hi)), m.const(hi), y)


def _sigmoid(m: Math, x: ir.Value) -> ir.Value:
    one = m.const(1.0)
    return m.div(one, m.add(one, m.exp(m.sub(m.const(0.0), x))))


def _elu(m: Math, x: ir.Value, alpha: float) -> ir.Value:
    return m.select(m.cmp(">", x, m.const(0.0)), x, m.mul(m.const(alpha), m.expm1(x)))


def _shrink(m: Math, x: ir.Value, bias: float, lambd: float) -> ir.Value:
    inner = m.select(m.cmp(">", x, m.bound(lambd)), m.sub(x, m.const(bias)), m.const(0.0))
    return m.select(m.cmp("<", x, m.bound(-lambd)), m.add(x, m.const(bias)), inner)


def _celu(m: Math, x: ir.Value, alpha: float) -> ir.Value:
    # max(0, x) + min(0, alpha * expm1(x / alpha)); the second select keeps a NaN
    zero = m.const(0.0)
    neg = m.mul(m.const(alpha), m.expm1(m.div(x, m.const(alpha))))
    return m.add(m.select(m.cmp(">", x, zero), x, zero), m.select(m.cmp(">", neg, zero), zero, neg))


def _gelu(m: Math, x: ir.Value, approximate: str) -> ir.Value:
    if approximate == "tanh":
        cube = m.mul(m.mul(x, x), x)
        inner = m.mul(m.const(math.sqrt(2.0 / math.pi)), m.add(x, m.mul(m.const(0.044715), cube)))
        t = m.tanh(inner)
    else:
        t = m.erf(m.mul(x, m.const(1.0 / math.sqrt(2.0))))
    return m.mul(m.mul(m.const(0.5), x), m.add(m.const(1.0), t))


def _abs(m: Math, x: ir.Value) -> ir.Value:
    return m.select(m.cmp("<", x, m.const(0.0)), m.sub(m.const(0.0), x), x)


Emitter = Callable[[Math, ir.Value, Sequence[Any]], ir.Value]

EMITTERS: dict[str, Emitter] = {
    "relu": lambda m, x, p: m.select(m.cmp("<", x, m.const(0.0)), m.const(0.0), x),
    "clip": lambda m, x, p: _clamp(m, x, p[0], p[1]),
    "leaky_relu": lambda m, x, p: m.select(m.cmp(">=", x, m.const(0.0)), x, m.mul(x, m.const(p[0]))),
    "sigmoid": lambda m, x, p: _sigmoid(m, x),
    "tanh": lambda m, x, p: m.tanh(x),
    "hard_sigmoid": lambda m, x, p: _clamp(m, m.add(m.mul(x, m.const(p[0])), m.const(p[1])), 0.0, 1.0),
    "hard_swish": lambda m, x, p: m.mul(x, _clamp(m, m.add(m.mul(x, m.const(1 / 6)), m.const(0.5)), 0.0, 1.0)),
    "swish": lambda m, x, p: m.mul(x, _sigmoid(m, m.mul(x, m.const(p[0])))),
    "elu": lambda m, x, p: _elu(m, x, p[0]),
    "selu": lambda m, x, p: m.mul(_elu(m, x, p[0]), m.const(p[1])),
    "celu": lambda m, x, p: _celu(m, x, p[0]),
    "thresholded_relu": lambda m, x, p: m.select(m.cmp(">", x, m.bound(p[0])), x, m.const(0.0)),
    "softsign": lambda m, x, p: m.div(x, m.add(m.const(1.0), _abs(m, x))),
    "shrink": lambda m, x, p: _shrink(m, x, p[0], p[1]),
    "gelu": lambda m, x, p: _gelu(m, x, p[0]),
}

# IR ops the elementwise kernels generate through an emitter (on float values).
EMITTED_OPS = {ACTIVATIONS[name].op: name for name in EMITTERS}


def check(name: str, params: Sequence[Any]) -> None:
    """Refuse an activation without an emitter, or with the wrong number of parameters."""
    if name == NONE:
        return
    if name not in EMITTERS:
        raise UnsupportedAttribute("no CPU code for this fused activation", expected=sorted(EMITTERS), found=name)
    need = len(ACTIVATIONS[name].params)
    if len(params or ()) != need:
        raise UnsupportedAttribute(f"activation '{name}' needs {need} parameters", expected=need,
                                   found=len(params or ()))


def emit(m: Math, x: ir.Value, name: str, params: Sequence[Any] = ()) -> ir.Value:
    """`name`'s activation of x (the identity for "none")."""
    if name == NONE:
        return x
    check(name, params)
    return EMITTERS[name](m, x, tuple(params))
