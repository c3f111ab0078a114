"""Elementwise ONNX ops: unary math, activations, Clip, Dropout, Cast, binary arithmetic, comparisons,
variadic Sum/Max/Min, Pow, Where. Broadcasting covers size-1 dims, rank differences and scalars."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from glowpy.errors import UnsupportedAttribute, UnsupportedDatatype

from .util import Const, check, expect_error, randbool, randint, randn, randpos

F32, F64, F16 = np.float32, np.float64, np.float16

# --- unary -----------------------------------------------------------------------------------------

# op -> (input maker, opsets)
UNARY = {
    "Relu": (randn, (7, 14)),
    "Sigmoid": (randn, (7, 13)),
    "Tanh": (randn, (7, 13)),
    "Exp": (randn, (7, 13)),
    "Log": (randpos, (7, 13)),
    "Sqrt": (randpos, (7, 13)),
    "Erf": (randn, (9, 13)),
    "Neg": (randn, (7, 13)),
    "Abs": (randn, (7, 13)),
    "Reciprocal": (randpos, (7, 13)),
    "Softplus": (randn, (7, 22)),
    "Identity": (randn, (7, 16)),
}


@pytest.mark.parametrize("opset", [0, 1], ids=["old", "new"])
@pytest.mark.parametrize("dtype", [F32, F64, F16], ids=["f32", "f64", "f16"])
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float(backend, op, dtype, opset):
    make, opsets = UNARY[op]
    check(backend, op, [make(2, 3, 4, dtype=dtype)], opset=opsets[opset])


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64], ids=["i8", "i32", "i64"])
@pytest.mark.parametrize("op,opset", [("Relu", 14), ("Neg", 13), ("Abs", 13), ("Identity", 16)])
def test_unary_int(backend, op, opset, dtype):
    check(backend, op, [randint(3, 5, dtype=dtype)], opset=opset)


def test_identity_bool(backend):
    check(backend, "Identity", [randbool(4, 2)], opset=16)


def test_unary_size1(backend):
    check(backend, "Tanh", [randn(1, 1, 3)], opset=13)


def test_unary_scalar_feed(backend):
    check(backend, "Exp", [np.array(0.5, dtype=F32)], opset=13)


def test_unary_scalar_constant(backend):
    check(backend, "Mul", [randn(2, 3), Const(np.float32(0.5))], opset=13)


@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.3}, {"alpha": -1.5}], ids=["default", "alpha0.3", "alpha-1.5"])
@pytest.mark.parametrize("opset", [7, 16])
def test_leaky_relu(backend, opset, attrs):
    check(backend, "LeakyRelu", [randn(3, 4)], opset=opset, attrs=attrs)


@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.5}, {"beta": 0.1}, {"alpha": 0.3, "beta": 0.7}],
                         ids=["default", "alpha", "beta", "both"])
@pytest.mark.parametrize("opset", [7, 22])
def test_hard_sigmoid(backend, opset, attrs):
    check(backend, "HardSigmoid", [randn(3, 4, seed=1) * 3], opset=opset, attrs=attrs)


@pytest.mark.parametrize("approximate", [None, "none", "tanh"])
def test_gelu(backend, approximate):
    attrs = {} if approximate is None else {"approximate": approximate}
    check(backend, "Gelu", [randn(2, 5) * 2], opset=20, attrs=attrs)


def test_gelu_f64(backend):
    check(backend, "Gelu", [randn(7, dtype=F64)], opset=20, attrs={"approximate": "tanh"})


@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.7}], ids=["default", "alpha"])
def test_swish(backend, attrs):
    check(backend, "Swish", [randn(3, 5) * 3], opset=24, attrs=attrs)


# --- Clip ------------------------------------------------------------------------------------------

CLIP_ATTRS = {"none": {}, "min": {"min": -0.5}, "max": {"max": 0.25}, "both": {"min": -0.5, "max": 0.5}}


@pytest.mark.parametrize("case", sorted(CLIP_ATTRS))
@pytest.mark.parametrize("opset", [7, 10])
def test_clip_attributes(backend, opset, case):
    check(backend, "Clip", [randn(3, 4)], opset=opset, attrs=CLIP_ATTRS[case])


CLIP_INPUTS = {
    "none": [],
    "min": [Const(np.float32(-0.5))],
    "max": [None, Const(np.float32(0.25))],
    "both": [Const(np.float32(-0.5)), Const(np.float32(0.5))],
    "min>max": [Const(np.float32(0.5)), Const(np.float32(-0.5))],
}


@pytest.mark.parametrize("case", list(CLIP_INPUTS))
@pytest.mark.parametrize("opset", [11, 13])
def test_clip_inputs(backend, opset, case):
    check(backend, "Clip", [randn(3, 4), *CLIP_INPUTS[case]], opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8], ids=["i32", "i64", "u8"])
def test_clip_int(backend, dtype):
    lo, hi = (Const(np.array(1, dtype=dtype)), Const(np.array(4, dtype=dtype)))
    x = randint(3, 4, low=0, high=9, dtype=dtype)
    check(backend, "Clip", [x, lo, hi], opset=13)
    check(backend, "Clip", [x, None, hi], opset=13)


# --- Dropout ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [False, True], ids=["y", "y+mask"])
@pytest.mark.parametrize("opset,attrs", [(7, {}), (7, {"ratio": 0.3}), (10, {"ratio": 0.2})],
                         ids=["7", "7-ratio", "10-ratio"])
def test_dropout_attribute_forms(backend, opset, attrs, mask):
    check(backend, "Dropout", [randn(2, 3)], opset=opset, attrs=attrs, outputs=2 if mask else 1)


@pytest.mark.parametrize("mask", [False, True], ids=["y", "y+mask"])
@pytest.mark.parametrize("extra", ["none", "ratio", "ratio+training_false"])
@pytest.mark.parametrize("opset", [12, 13, 22])
def test_dropout_input_forms(backend, opset, extra, mask):
    ins = {"none": [], "ratio": [Const(np.float32(0.4))],
           "ratio+training_false": [Const(np.float32(0.4)), Const(np.array(False))]}[extra]
    check(backend, "Dropout", [randn(2, 3), *ins], opset=opset, attrs={"seed": 3} if extra != "none" else {},
          outputs=2 if mask else 1)


def test_dropout_training_mode_unsupported():
    expect_error(UnsupportedAttribute, "Dropout", [randn(2, 3), Const(np.float32(0.5)), Const(np.array(True))],
                 opset=13, mentions=["training"])


# --- Cast ------------------------------------------------------------------------------------------

CAST_CASES = {
    "f32->i32": (randn(3, 4) * 5, TensorProto.INT32),
    "f32->i64": (randn(3, 4) * 5, TensorProto.INT64),
    "f32->u8": (randpos(3, 4, high=200.0), TensorProto.UINT8),
    "f32->bool": (np.array([0.0, 1.5, -2.0, 0.0], dtype=F32), TensorProto.BOOL),
    "f32->f16": (randn(3, 4), TensorProto.FLOAT16),
    "f32->f64": (randn(3, 4), TensorProto.DOUBLE),
    "f64->f32": (randn(3, 4, dtype=F64), TensorProto.FLOAT),
    "i64->f32": (randint(3, 4), TensorProto.FLOAT),
    "i64->i32": (randint(3, 4, low=-1000, high=1000), TensorProto.INT32),
    "i32->i64": (randint(3, 4, dtype=np.int32), TensorProto.INT64),
    "i64->bool": (randint(3, 4, low=-1, high=2), TensorProto.BOOL),
    "bool->f32": (randbool(3, 4), TensorProto.FLOAT),
    "bool->i64": (randbool(3, 4), TensorProto.INT64),
    "bool->bool": (randbool(3, 4), TensorProto.BOOL),
    "f16->f32": (randn(3, 4, dtype=F16), TensorProto.FLOAT),
    "f32->f32": (randn(3, 4), TensorProto.FLOAT),
}


@pytest.mark.parametrize("opset", [7, 21])
@pytest.mark.parametrize("case", list(CAST_CASES))
def test_cast(backend, case, opset):
    x, to = CAST_CASES[case]
    check(backend, "Cast", [x], opset=opset, attrs={"to": to})


def test_cast_to_string_unsupported():
    expect_error(UnsupportedDatatype, "Cast", [randn(2)], opset=13, attrs={"to": TensorProto.STRING},
                 mentions=["STRING"])


# --- binary arithmetic with broadcasting -----------------------------------------------------------

SHAPES = {
    "same": ((2, 3, 4), (2, 3, 4)),
    "trailing": ((2, 3, 4), (4,)),
    "size1": ((2, 1, 4), (1, 3, 1)),
    "rank-diff": ((3, 1), (2, 1, 5)),
    "scalar-rhs": ((2, 3), ()),
    "scalar-lhs": ((), (2, 3)),
    "vector-col": ((4, 1), (1, 6)),
}
ARITH = ["Add", "Sub", "Mul", "Div"]


@pytest.mark.parametrize("shapes", list(SHAPES))
@pytest.mark.parametrize("op", ARITH)
def test_arith_broadcast_f32(backend, op, shapes):
    a, b = SHAPES[shapes]
    rhs = randpos(*b, seed=1) if op == "Div" else randn(*b, seed=1)
    check(backend, op, [randn(*a), rhs], opset=14)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, F64, F16],
                         ids=["i32", "i64", "u8", "f64", "f16"])
@pytest.mark.parametrize("op", ARITH)
def test_arith_dtypes(backend, op, dtype):
    if np.dtype(dtype).kind == "u":
        a, b = randint(3, 4, low=10, high=50, dtype=dtype), randint(4, low=1, high=9, seed=1, dtype=dtype)
    elif np.dtype(dtype).kind == "i":
        a, b = randint(3, 4, low=-50, high=50, dtype=dtype), randint(4, low=1, high=9, seed=1, dtype=dtype)
        b[::2] *= -1  # negative divisors: integer Div truncates toward zero
    else:
        a, b = randn(3, 4, dtype=dtype), randpos(4, seed=1, dtype=dtype)
    check(backend, op, [a, b], opset=14)


@pytest.mark.parametrize("opset", [7, 13])
@pytest.mark.parametrize("op", ARITH)
def test_arith_opsets(backend, op, opset):
    check(backend, op, [randn(2, 3), randpos(3, seed=2)], opset=opset)


def test_div_int64_exact(backend):
    """Integer Div truncates toward zero exactly, also beyond 2**53 (onnx.reference divides in float64,
    which rounds such quotients; onnxruntime divides integers)."""
    a = np.array([2**53 + 1, -(2**53 + 1), 2**62 + 3, -(2**62) - 1, -7, 7], dtype=np.int64)
    b = np.array([1, 2, 3, -5, 2, -2], dtype=np.int64)
    check(backend, "Div", [a, b], opset=14, oracle="onnxruntime")


def test_arith_constant_operand(backend):
    check(backend, "Mul", [randn(2, 3), Const(randn(1, 3, seed=5))], opset=13)
    check(backend, "Sub", [Const(randn(3, seed=5)), randn(2, 3)], opset=13)


# --- Pow -------------------------------------------------------------------------------------------

POW_CASES = {
    "f32^f32": (randpos(3, 4), randn(3, 4, seed=1), 13),
    "f32^f32-bcast": (randpos(2, 3, 4), randn(4, seed=1), 13),
    "f32^i64": (randn(3, 4), np.array([0, 1, 2, 3], dtype=np.int64), 13),
    "f32^i32-scalar": (randn(3, 4), np.array(3, dtype=np.int32), 15),
    "i64^i64": (randint(3, 4, low=-4, high=5), randint(4, low=0, high=4, seed=1), 13),
    "i32^i32": (randint(5, low=-3, high=4, dtype=np.int32), np.array(2, dtype=np.int32), 13),
    "i64^f32": (randint(3, 4, low=0, high=6), np.array([0.5, 1.5, 2.0, 2.5], dtype=F32), 13),
    "f64^f32": (randpos(3, dtype=F64), randn(3, seed=1), 15),
    "f32^f32-op7": (randpos(3, 4), randn(3, 4, seed=1), 7),
}


@pytest.mark.parametrize("case", list(POW_CASES))
def test_pow(backend, case):
    a, b, opset = POW_CASES[case]
    check(backend, "Pow", [a, b], opset=opset)


# --- comparisons -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shapes", ["same", "trailing", "size1", "scalar-rhs"])
@pytest.mark.parametrize("dtype", [F32, np.int32, np.int64], ids=["f32", "i32", "i64"])
@pytest.mark.parametrize("op", ["Greater", "Less", "Equal"])
def test_compare(backend, op, dtype, shapes):
    a, b = SHAPES[shapes]
    x, y = randint(*a, low=-2, high=3).astype(dtype), randint(*b, low=-2, high=3, seed=1).astype(dtype)
    check(backend, op, [x, y], opset=13)


def test_equal_bool(backend):
    check(backend, "Equal", [randbool(3, 4), randbool(4, seed=1)], opset=11)


@pytest.mark.parametrize("op,opset", [("Equal", 7), ("Greater", 7), ("Greater", 9), ("Less", 9), ("Equal", 19)])
def test_compare_opsets(backend, op, opset):
    dtype = np.int64 if op == "Equal" and opset < 11 else F32
    check(backend, op, [randint(2, 3, low=-1, high=2).astype(dtype), randint(3, low=-1, high=2, seed=1).astype(dtype)],
          opset=opset)


# --- variadic --------------------------------------------------------------------------------------

VARIADIC_SHAPES = {
    "one": [(3, 4)],
    "two-same": [(3, 4), (3, 4)],
    "two-bcast": [(3, 1), (1, 4)],
    "three-bcast": [(2, 3, 4), (4,), (3, 1)],
    "four": [(2, 3), (2, 3), (1, 3), ()],
}


@pytest.mark.parametrize("shapes", list(VARIADIC_SHAPES))
@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
def test_variadic(backend, op, shapes):
    xs = [randn(*s, seed=i) for i, s in enumerate(VARIADIC_SHAPES[shapes])]
    check(backend, op, xs, opset=13)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
def test_variadic_opset7_same_shape(backend, op):
    check(backend, op, [randn(3, 4), randn(3, 4, seed=1), randn(3, 4, seed=2)], opset=7)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8], ids=["i32", "i64", "u8"])
@pytest.mark.parametrize("op", ["Max", "Min", "Sum"])
def test_variadic_int(backend, op, dtype):
    lo = 0 if np.dtype(dtype).kind == "u" else -9
    check(backend, op, [randint(3, 4, low=lo, high=9, dtype=dtype), randint(4, low=lo, high=9, seed=1, dtype=dtype)],
          opset=13)


# --- Where -----------------------------------------------------------------------------------------

WHERE_SHAPES = {
    "same": ((3, 4), (3, 4), (3, 4)),
    "cond-bcast": ((4,), (3, 4), (3, 4)),
    "x-scalar": ((3, 4), (), (3, 4)),
    "all-bcast": ((3, 1), (1, 4), (2, 1, 1)),
    "y-size1": ((2, 3), (2, 3), (1, 1)),
}


@pytest.mark.parametrize("dtype", [F32, np.int64, np.bool_], ids=["f32", "i64", "bool"])
@pytest.mark.parametrize("shapes", list(WHERE_SHAPES))
def test_where(backend, shapes, dtype):
    c, a, b = WHERE_SHAPES[shapes]
    make = {F32: randn, np.int64: randint, np.bool_: randbool}[dtype]
    check(backend, "Where", [randbool(*c), make(*a, seed=1), make(*b, seed=2)], opset=16)


def test_where_opset9(backend):
    check(backend, "Where", [randbool(3, 4), randn(3, 4, seed=1), randn(4, seed=2)], opset=9)
