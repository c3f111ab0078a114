"""The rest of ONNX's elementwise ops against onnx.reference, on every backend: logic (And/Or/Xor/Not),
GreaterOrEqual/LessOrEqual, comparisons and Where over every element type, bitwise ops and BitShift,
Mod (both fmod modes), Sign, IsNaN/IsInf, Floor/Ceil/Round, trigonometric and hyperbolic functions, Mean,
PRelu and the activations Elu/Selu/Celu/ThresholdedRelu/Softsign/Shrink; NaN and infinities where they
matter, integer edge cases (zero divisors, INT_MIN, shifts by the bit width or more)."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.errors import MismatchingShape, UnsupportedAttribute, UnsupportedDatatype

from .util import check, expect_error, randbool, randint, randn

F32, F64, F16 = np.float32, np.float64, np.float16
INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
INT_IDS = [np.dtype(t).name for t in INTS]
NUMERIC = [F32, F64, *INTS]
NUMERIC_IDS = ["f32", "f64", *INT_IDS]
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0]


def _with_special(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1)
    k = min(len(SPECIAL), flat.size)
    flat[:k] = SPECIAL[:k]
    return x


def _values(dtype, *shape: int, seed: int = 0) -> np.ndarray:
    """Values spanning the type: the extremes, zero, small numbers of both signs."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return _with_special((randn(*shape, dtype=dtype, seed=seed) * 3).round(1))
    info = np.iinfo(dt)
    lo = 0 if dt.kind == "u" else -20
    x = randint(*shape, low=lo, high=20, dtype=dtype, seed=seed)
    flat = x.reshape(-1)
    flat[:3] = [info.min, info.max, 0]
    return x


# --- comparisons, logic ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMERIC, ids=NUMERIC_IDS)
@pytest.mark.parametrize("op", ["GreaterOrEqual", "LessOrEqual", "Greater", "Less", "Equal"])
def test_compare_every_type(backend, op, dtype):
    x = _values(dtype, 3, 4)
    y = _values(dtype, 4, seed=1)  # broadcast along the rows
    y[0] = x[0, 0]  # some equal pairs
    check(backend, op, [x, y], opset=16)


@pytest.mark.parametrize("op,opset", [("GreaterOrEqual", 12), ("LessOrEqual", 12), ("Equal", 11), ("Less", 13)])
def test_compare_opsets_nan(backend, op, opset):
    check(backend, op, [_values(F32, 2, 3), np.float32([np.nan, 0.0, -np.inf])], opset=opset)


@pytest.mark.parametrize("dtype", [np.bool_, np.uint16, np.int8, np.uint64, F64], ids=["bool", "u16", "i8", "u64", "f64"])
def test_equal_where_other_types(backend, dtype):
    make = randbool if dtype is np.bool_ else (lambda *s, seed=0: _values(dtype, *s, seed=seed))
    x, y = make(3, 4), make(3, 1, seed=1)
    if dtype is not np.bool_:
        check(backend, "Equal", [x, x[:, :1]], opset=19)
    else:
        check(backend, "Equal", [x, y], opset=19)
    check(backend, "Where", [randbool(4, seed=2), x, y], opset=16)


@pytest.mark.parametrize("opset", [7, 16])
@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(backend, op, opset):
    check(backend, op, [randbool(2, 3, 4), randbool(3, 1, seed=1)], opset=opset)


def test_not(backend):
    check(backend, "Not", [randbool(3, 5)], opset=7)


def test_logic_chain(backend):
    """A chain of bool ops fuses into one loop on the cpu (i1 values between them)."""
    from onnx import helper

    from .util import check_graph

    nodes = [helper.make_node("Greater", ["a", "b"], ["g"]), helper.make_node("Not", ["g"], ["n"]),
             helper.make_node("IsNaN", ["a"], ["nan"]), helper.make_node("Or", ["n", "nan"], ["o"]),
             helper.make_node("Where", ["o", "a", "b"], ["y"])]
    check_graph(backend, nodes, {"a": _values(F32, 4, 5), "b": _values(F32, 5, seed=1)}, ["y"], opset=13)


# --- bitwise ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_bitwise(backend, dtype):
    x, y = _values(dtype, 3, 4), _values(dtype, 4, seed=1)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check(backend, op, [x, y], opset=18)
    check(backend, "BitwiseNot", [x], opset=18)


def _shift_amounts(dtype, n: int) -> np.ndarray:
    bits = np.dtype(dtype).itemsize * 8
    amounts = np.arange(n) % (bits + 3)  # 0 .. bits + 2: the bit width and beyond shift every bit out
    return amounts.astype(dtype)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64], ids=["u8", "u16", "u32", "u64"])
def test_bitshift_unsigned(backend, dtype, direction):
    n = np.dtype(dtype).itemsize * 8 + 3
    x = np.full((2, n), np.iinfo(dtype).max, dtype=dtype)
    x[1] = 5
    check(backend, "BitShift", [x, _shift_amounts(dtype, n)], opset=11, attrs={"direction": direction})


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.int8, np.int64], ids=["i8", "i64"])
def test_bitshift_signed(backend, dtype, direction):
    """Signed operands (opset 28): arithmetic right shifts; negative or too-large amounts shift all bits out."""
    n = np.dtype(dtype).itemsize * 8 + 3
    x = np.stack([np.full(n, -5, dtype=dtype), np.full(n, 77, dtype=dtype), np.full(n, np.iinfo(dtype).min, dtype)])
    b = _shift_amounts(dtype, n)
    b[-1] = -1
    check(backend, "BitShift", [x, b], opset=28, attrs={"direction": direction})


def test_bitshift_scalar_amount(backend):
    check(backend, "BitShift", [randint(3, 4, low=0, high=200, dtype=np.uint8), np.array(3, np.uint8)], opset=11,
          attrs={"direction": "RIGHT"})


# --- Mod -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_mod_int(backend, dtype, fmod):
    """Both signs, zero divisors (0 rather than a trap) and INT_MIN % -1 (0, not a trap)."""
    x = _values(dtype, 3, 7)
    y = _values(dtype, 7, seed=1)
    y[:3] = [0, 7, 1]
    if np.dtype(dtype).kind == "i":
        y[3:5] = [-1, -7]
        x[0, 3] = np.iinfo(dtype).min
    check(backend, "Mod", [x, y], opset=13, attrs={"fmod": fmod})


@pytest.mark.parametrize("opset", [10, 13])
@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_mod_float(backend, dtype, fmod, opset):
    """fmod=1 is C's fmod (the dividend's sign), fmod=0 numpy's mod (the divisor's sign, as onnx.reference)."""
    x = (randn(4, 6, dtype=dtype) * 10).round(1)
    y = np.array([3.0, -3.0, 2.5, -0.7, 0.0, np.inf], dtype=dtype)
    x[0, :3] = [6.0, -6.0, np.nan]
    check(backend, "Mod", [x, y], opset=opset, attrs={"fmod": fmod})


def test_mod_broadcast_size1(backend):
    check(backend, "Mod", [randint(2, 1, 5, dtype=np.int32), np.array([[3], [-4]], np.int32)], opset=13)


# --- unary math ------------------------------------------------------------------------------------

# op -> (low, high) of the inputs: the function's domain and a little beyond (NaN there, in both)
UNARY = {
    "Sin": (-7, 7), "Cos": (-7, 7), "Tan": (-1.5, 1.5), "Asin": (-1.1, 1.1), "Acos": (-1.1, 1.1), "Atan": (-9, 9),
    "Sinh": (-5, 5), "Cosh": (-5, 5), "Asinh": (-9, 9), "Acosh": (0.9, 9), "Atanh": (-1.1, 1.1),
    "Floor": (-5, 5), "Ceil": (-5, 5), "Round": (-5, 5),
}
OPSETS = {"Sinh": 9, "Cosh": 9, "Asinh": 9, "Acosh": 9, "Atanh": 9, "Round": 11}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_math(backend, op, dtype):
    lo, hi = UNARY[op]
    x = np.random.default_rng(0).uniform(lo, hi, (4, 9)).astype(dtype)
    x[0, :5] = SPECIAL
    x[1, :6] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5]  # Round: half to even
    opset = OPSETS.get(op, 7) if dtype == F64 else 22
    check(backend, op, [x], opset=opset)


@pytest.mark.parametrize("dtype", NUMERIC, ids=NUMERIC_IDS)
def test_sign(backend, dtype):
    check(backend, "Sign", [_values(dtype, 3, 5)], opset=13)


def test_sign_opset9(backend):
    check(backend, "Sign", [_values(F32, 7)], opset=9)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64], ids=["i8", "i16", "i32", "i64"])
def test_neg_abs_int(backend, dtype):
    x = _values(dtype, 3, 5)
    check(backend, "Neg", [x], opset=13)
    check(backend, "Abs", [x], opset=13)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64], ids=["u8", "u32", "u64"])
def test_abs_unsigned(backend, dtype):
    check(backend, "Abs", [_values(dtype, 3, 5)], opset=13)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_reciprocal_special(backend, dtype):
    check(backend, "Reciprocal", [_values(dtype, 2, 5)], opset=13)


@pytest.mark.parametrize("opset", [9, 20])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_isnan(backend, dtype, opset):
    check(backend, "IsNaN", [_values(dtype, 3, 4)], opset=opset)


@pytest.mark.parametrize("attrs", [{}, {"detect_negative": 0}, {"detect_positive": 0},
                                   {"detect_negative": 0, "detect_positive": 0}],
                         ids=["both", "positive", "negative", "neither"])
@pytest.mark.parametrize("opset", [10, 20])
def test_isinf(backend, attrs, opset):
    check(backend, "IsInf", [_values(F32, 3, 4)], opset=opset, attrs=attrs)


def test_isinf_f64(backend):
    check(backend, "IsInf", [_values(F64, 8)], opset=20, attrs={"detect_positive": 0})


# --- Mean ------------------------------------------------------------------------------------------

MEAN_SHAPES = {
    "one": [(3, 4)],
    "two-same": [(3, 4), (3, 4)],
    "three-bcast": [(2, 3, 4), (4,), (3, 1)],
    "four-scalar": [(2, 3), (2, 3), (1, 3), ()],
}


@pytest.mark.parametrize("shapes", list(MEAN_SHAPES))
def test_mean(backend, shapes):
    xs = [randn(*s, seed=i) for i, s in enumerate(MEAN_SHAPES[shapes])]
    check(backend, "Mean", xs, opset=13)


@pytest.mark.parametrize("opset", [7, 8])
def test_mean_opsets_f64(backend, opset):
    xs = [randn(2, 3, dtype=F64, seed=i) for i in range(3)]
    check(backend, "Mean", xs, opset=opset)


# --- PRelu, activations ---------------------------------------------------------------------------


@pytest.mark.parametrize("slope", ["per-channel", "scalar", "full", "trailing"])
@pytest.mark.parametrize("opset", [7, 9, 16])
def test_prelu(backend, opset, slope):
    x = _with_special(randn(2, 3, 4, 5))
    shapes = {"per-channel": (3, 1, 1), "scalar": (1,), "full": (2, 3, 4, 5), "trailing": (5,)}
    check(backend, "PRelu", [x, randn(*shapes[slope], seed=1)], opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, F64], ids=["i32", "i64", "u32", "f64"])
def test_prelu_types(backend, dtype):
    x = _values(dtype, 3, 4)
    slope = _values(dtype, 4, seed=1) if np.dtype(dtype).kind == "f" else np.array([2, 3, 0, 1], dtype)
    check(backend, "PRelu", [x, slope], opset=16)


ACTIVATIONS = {
    "Elu": [(7, {}), (22, {"alpha": 0.4})],
    "Selu": [(7, {}), (22, {"alpha": 1.2, "gamma": 0.7})],
    "Celu": [(12, {}), (12, {"alpha": 2.5})],
    "ThresholdedRelu": [(10, {}), (22, {"alpha": 0.3})],
    "Softsign": [(7, {}), (22, {})],
    "Shrink": [(9, {}), (9, {"lambd": 1.2, "bias": 0.3})],
}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("op,case", [(op, i) for op in ACTIVATIONS for i in range(2)])
def test_activation(backend, op, case, dtype):
    opset, attrs = ACTIVATIONS[op][case]
    x = _values(dtype, 3, 7)
    x[2, :3] = [1.2, -1.2, 0.3]  # the Shrink / ThresholdedRelu bounds
    check(backend, op, [x], opset=opset, attrs=attrs)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64], ids=["i8", "u8", "i32", "i64"])
def test_shrink_int(backend, dtype):
    """Integer Shrink: compared and shifted in double, truncated back (as onnx.reference)."""
    x = randint(3, 7, low=0 if np.dtype(dtype).kind == "u" else -6, high=7, dtype=dtype)
    check(backend, "Shrink", [x], opset=9, attrs={"lambd": 1.5, "bias": 1.0})


def test_mish_imports_through_its_body(backend):
    check(backend, "Mish", [_values(F32, 3, 5)], opset=18)


# --- errors ----------------------------------------------------------------------------------------


def test_bitshift_bad_direction():
    expect_error(UnsupportedAttribute, "BitShift", [randint(3, low=0, dtype=np.uint8)] * 2, opset=11,
                 attrs={"direction": "UP"}, mentions=["direction", "UP"])


def test_bitshift_bad_direction_cpu():
    expect_error(UnsupportedAttribute, "BitShift", [randint(3, low=0, dtype=np.uint8)] * 2, opset=11,
                 attrs={"direction": "UP"}, mentions=["direction"], backend="cpu")


def test_mod_bad_fmod():
    expect_error(UnsupportedAttribute, "Mod", [randint(3), randint(3, seed=1)], opset=13, attrs={"fmod": 2},
                 mentions=["fmod"])


@pytest.mark.parametrize("op,x", [("And", randn(3)), ("Not", randint(3)), ("BitwiseAnd", randn(3)),
                                  ("IsNaN", randint(3)), ("Sin", randint(3)), ("Mean", randint(3))])
def test_wrong_element_type(op, x):
    inputs = [x] if op in ("Not", "IsNaN", "Sin", "Mean") else [x, x]
    opset = 18 if op == "BitwiseAnd" else 13
    expect_error(UnsupportedDatatype, op, inputs, opset=opset, mentions=[str(x.dtype)])


def test_prelu_slope_does_not_broadcast():
    expect_error(MismatchingShape, "PRelu", [randn(2, 3), randn(4, seed=1)], opset=16, mentions=["[2, 3]"])
