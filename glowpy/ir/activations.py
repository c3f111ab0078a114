"""The activation registry: every activation a Conv / Gemm / MatMul / FullyConnected can carry as a
fused epilogue is declared here once, and its IR op is declared from the same entry.

An entry gives the fused name (the producer's `activation` attribute), the IR op it is, the op's
attributes that travel as the producer's `activation_params` (in order, with their defaults), the
element types the op takes, the ONNX op it mirrors one to one, and its reference semantics in
numpy. The optimizer fuses and unfuses by these entries, the interpreter and constant folding run
`reference`, and a backend needs only an emitter per name (the CPU's: backends/cpu/activations.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from glowpy.errors import UnsupportedAttribute
from glowpy.ir.ops.registry import FROM_ONNX, OpDef, register
from glowpy.ir.types import FLOAT_TYPES, NUMERIC_TYPES, TensorType

NONE = "none"  # the `activation` of a producer without a fused epilogue

Reference = Callable[[np.ndarray, tuple[Any, ...]], np.ndarray]


@dataclass(frozen=True)
class Activation:
    name: str
    op: str
    reference: Reference  # f(x, params) -> y, same dtype
    params: dict[str, Any] = field(default_factory=dict)  # op attribute -> default (FROM_ONNX: the schema's), in order
    dtypes: frozenset = FLOAT_TYPES
    onnx: str | None = None
    doc: str = ""

    def params_of(self, attrs: dict[str, Any]) -> tuple[Any, ...]:
        """The op node's attributes (complete, as `OpDef.make_attrs` gives them) as the fused
        `activation_params` tuple."""
        return tuple(attrs[k] for k in self.params)

    def attrs_of(self, params: tuple[Any, ...]) -> dict[str, Any]:
        """A fused `activation_params` tuple as the op's attributes."""
        return dict(zip(self.params, params))


ACTIVATIONS: dict[str, Activation] = {}
BY_OP: dict[str, Activation] = {}


def _same_as_input(attrs: dict, x: TensorType) -> TensorType:
    return x


def activation(act: Activation) -> Activation:
    """Register `act` and declare its IR op (unary, elementwise, computing `act.reference`)."""
    ACTIVATIONS[act.name] = act
    BY_OP[act.op] = act

    def compute(attrs: dict, x: np.ndarray) -> np.ndarray:
        return act.reference(x, act.params_of(attrs))

    register(OpDef(act.op, infer=_same_as_input, compute=compute, attrs=dict(act.params), dtypes=act.dtypes,
                   elementwise=True, onnx=act.onnx, doc=act.doc))
    return act


def of_node(op: str, attrs: dict[str, Any]) -> tuple[str, tuple[Any, ...]] | None:
    """(name, params) when an `op` node with `attrs` is a registered activation."""
    act = BY_OP.get(op)
    return None if act is None else (act.name, act.params_of(attrs))


def check_fused(op: str, attrs: dict[str, Any]) -> None:
    """Refuse a producer whose `activation` is not registered or has the wrong parameter count."""
    name = attrs["activation"]
    if name == NONE:
        return
    act = ACTIVATIONS.get(name)
    if act is None:
        raise UnsupportedAttribute("unknown fused activation", op=op, expected=sorted([NONE, *ACTIVATIONS]),
                                   found=name)
    if len(attrs["activation_params"]) != len(act.params):
        raise UnsupportedAttribute(f"fused activation '{name}' takes parameters {list(act.params)}", op=op,
                                   expected=len(act.params), found=len(attrs["activation_params"]))


def apply_activation(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """A producer's fused epilogue (its `activation` / `activation_params` attributes) on its result."""
    name = attrs.get("activation", NONE)
    return x if name == NONE else ACTIVATIONS[name].reference(x, tuple(attrs.get("activation_params", ())))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)


activation(Activation("relu", "Relu", lambda x, p: np.maximum(x, 0).astype(x.dtype), dtypes=NUMERIC_TYPES,
                      onnx="Relu", doc="max(x, 0)"))
# ONNX Clip takes its bounds as inputs since opset 11: the importer has a row that reads them.
activation(Activation("clip", "Clip", lambda x, p: np.clip(x, p[0], p[1]).astype(x.dtype),
                      {"min": -np.inf, "max": np.inf}, NUMERIC_TYPES, doc="min(max(x, min), max)"))
activation(Activation("leaky_relu", "LeakyRelu", lambda x, p: np.where(x >= 0, x, x * p[0]).astype(x.dtype),
                      {"alpha": FROM_ONNX}, onnx="LeakyRelu", doc="x if x >= 0 else alpha * x"))
activation(Activation("sigmoid", "Sigmoid", lambda x, p: _sigmoid(x), onnx="Sigmoid", doc="1 / (1 + exp(-x))"))
activation(Activation("tanh", "Tanh", lambda x, p: np.tanh(x), onnx="Tanh", doc="tanh(x)"))
activation(Activation("hard_sigmoid", "HardSigmoid",
                      lambda x, p: np.clip(x * p[0] + p[1], 0, 1).astype(x.dtype),
                      {"alpha": FROM_ONNX, "beta": FROM_ONNX}, onnx="HardSigmoid", doc="max(0, min(1, alpha * x + beta))"))


def _hard_swish(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # -inf * 0 is NaN, as in ONNX's reference
        return (x * np.clip(x * (1 / 6) + 0.5, 0, 1)).astype(x.dtype)


activation(Activation("hard_swish", "HardSwish", lambda x, p: _hard_swish(x), onnx="HardSwish",
                      doc="x * max(0, min(1, x / 6 + 0.5))"))


def _swish(x: np.ndarray, alpha: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # -inf * 0 is NaN, as in ONNX's reference
        return (x * _sigmoid(x * x.dtype.type(alpha))).astype(x.dtype)


# SiLU is Swish with alpha 1 (exporters write it as Mul(x, Sigmoid(x)): optimizer/swish.py).
activation(Activation("swish", "Swish", lambda x, p: _swish(x, p[0]), {"alpha": FROM_ONNX}, onnx="Swish",
                      doc="x / (1 + exp(-alpha * x))"))


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(x > 0, x, alpha * np.expm1(x)).astype(x.dtype)


def _celu(x: np.ndarray, alpha: float) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.maximum(0, x) + np.minimum(0, alpha * np.expm1(x / alpha))).astype(x.dtype)


def _shrink(x: np.ndarray, bias: float, lambd: float) -> np.ndarray:
    # Integers compute in double and truncate back, as ONNX's reference does.
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)).astype(x.dtype)


activation(Activation("elu", "Elu", lambda x, p: _elu(x, p[0]), {"alpha": FROM_ONNX}, onnx="Elu",
                      doc="x if x > 0 else alpha * (exp(x) - 1)"))
activation(Activation("selu", "Selu", lambda x, p: (_elu(x, p[0]) * x.dtype.type(p[1])).astype(x.dtype),
                      {"alpha": FROM_ONNX, "gamma": FROM_ONNX}, onnx="Selu",
                      doc="gamma * (x if x > 0 else alpha * (exp(x) - 1))"))
activation(Activation("celu", "Celu", lambda x, p: _celu(x, p[0]), {"alpha": FROM_ONNX}, onnx="Celu",
                      doc="max(0, x) + min(0, alpha * (exp(x / alpha) - 1))"))
activation(Activation("thresholded_relu", "ThresholdedRelu", lambda x, p: np.where(x > p[0], x, 0).astype(x.dtype),
                      {"alpha": FROM_ONNX}, onnx="ThresholdedRelu", doc="x if x > alpha else 0"))
activation(Activation("softsign", "Softsign", lambda x, p: (x / (1 + np.abs(x))).astype(x.dtype), onnx="Softsign",
                      doc="x / (1 + |x|)"))
activation(Activation("shrink", "Shrink", lambda x, p: _shrink(x, p[0], p[1]), {"bias": FROM_ONNX, "lambd": FROM_ONNX},
                      NUMERIC_TYPES, onnx="Shrink", doc="x + bias if x < -lambd, x - bias if x > lambd, else 0"))


def erf(x: np.ndarray) -> np.ndarray:
    """erf elementwise (numpy has none; math.erf vectorised keeps the oracle exact to double precision)."""
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    v = x.astype(np.promote_types(x.dtype, np.float32))  # float16 computes in float32, as the CPU code does
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "tanh":
            inner = math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)
            return (0.5 * v * (1.0 + np.tanh(inner))).astype(x.dtype)
        return (0.5 * v * (1.0 + erf(v * (1.0 / math.sqrt(2.0))))).astype(x.dtype)


# ONNX Gelu (opset 20) has its importer row (approximate checked there); `approximate` travels as a string.
activation(Activation("gelu", "Gelu", lambda x, p: _gelu(x, p[0]), {"approximate": "none"},
                      doc="0.5 x (1 + erf(x / sqrt 2)), or with tanh(sqrt(2 / pi) (x + 0.044715 x^3)) for 'tanh'"))
