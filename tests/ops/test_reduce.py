"""Reductions: ReduceSum / ReduceMean / ReduceMax (axes as attribute, then as input: ReduceSum at 13,
ReduceMean and ReduceMax at 18), keepdims, noop_with_empty_axes, negative axes; ArgMax."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.errors import UnsupportedAttribute, UnsupportedDatatype, UnsupportedShape

from .util import Const, check, expect_error, randbool, randint, randn

# The opset where axes moved from attribute to input.
AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18}
REDUCE_OPS = list(AXES_INPUT_SINCE)

AXES = {
    "all": None,
    "0": (0,),
    "1": (1,),
    "last": (2,),
    "-1": (-1,),
    "0,2": (0, 2),
    "-3,-2": (-3, -2),
    "unsorted": (2, 0),
    "every": (0, 1, 2),
}


def _reduce(backend, op, x, axes, opset, **attrs):
    if opset >= AXES_INPUT_SINCE[op]:
        ins = [x] if axes is None else [x, Const(np.array(axes, dtype=np.int64))]
        return check(backend, op, ins, opset=opset, attrs=attrs)
    return check(backend, op, [x], opset=opset, attrs=attrs | ({} if axes is None else {"axes": list(axes)}))


def _opsets(op):
    since = AXES_INPUT_SINCE[op]
    return [11, since - 1, since] if since > 13 else [11, 13]


@pytest.mark.parametrize("keepdims", [None, 0], ids=["keep-default", "keep0"])  # (keepdims=1: test_reduce_opsets)
@pytest.mark.parametrize("axes", list(AXES))
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_latest(backend, op, axes, keepdims):
    attrs = {} if keepdims is None else {"keepdims": keepdims}
    _reduce(backend, op, randn(2, 3, 4), AXES[axes], 18, **attrs)


@pytest.mark.parametrize("keepdims", [0, 1], ids=["keep0", "keep1"])
@pytest.mark.parametrize("axes", ["all", "1", "-1", "0,2"])
@pytest.mark.parametrize("op_opset", [(op, o) for op in REDUCE_OPS for o in _opsets(op)],
                         ids=lambda p: f"{p[0]}-{p[1]}")
def test_reduce_opsets(backend, op_opset, axes, keepdims):
    op, opset = op_opset
    _reduce(backend, op, randn(3, 2, 4), AXES[axes], opset, keepdims=keepdims)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_opset7(backend, op):
    _reduce(backend, op, randn(3, 2, 4), (1,), 7)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(backend, op):
    opset = AXES_INPUT_SINCE[op]
    check(backend, op, [randn(2, 3)], opset=opset, attrs={"noop_with_empty_axes": 1})
    check(backend, op, [randn(2, 3), Const(np.array([], dtype=np.int64))], opset=opset,
          attrs={"noop_with_empty_axes": 1})
    check(backend, op, [randn(2, 3), Const(np.array([], dtype=np.int64))], opset=opset,
          attrs={"noop_with_empty_axes": 0})


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.float16], ids=["i32", "i64", "f64", "f16"])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_dtypes(backend, op, dtype):
    x = randint(3, 4, 5, low=-20, high=20).astype(dtype) if np.dtype(dtype).kind == "i" else randn(3, 4, 5, dtype=dtype)
    _reduce(backend, op, x, (1,), 18, keepdims=0)
    _reduce(backend, op, x, (0, 2), 18)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_size1_dims(backend, op):
    _reduce(backend, op, randn(1, 3, 1), (0, 2), 18, keepdims=0)
    _reduce(backend, op, randn(1, 3, 1), (1,), 18)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_runtime_axes_unsupported(op):
    expect_error(UnsupportedShape, op, [randn(2, 3), np.array([1], dtype=np.int64)], opset=18,
                 mentions=["compile time"], compat=False)  # see test_errors::test_compat_runtime_operands


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_axis_out_of_range(op):
    expect_error(UnsupportedAttribute, op, [randn(2, 3), Const(np.array([2], dtype=np.int64))], opset=18,
                 mentions=["axis"])


def test_reduce_bool_unsupported():
    expect_error(UnsupportedDatatype, "ReduceMax", [randbool(2, 3)], opset=20, mentions=["bool"])


# --- ArgMax ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("keepdims", [None, 0], ids=["keep-default", "keep0"])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_argmax(backend, axis, keepdims):
    attrs = ({} if axis is None else {"axis": axis}) | ({} if keepdims is None else {"keepdims": keepdims})
    check(backend, "ArgMax", [randn(3, 4, 5)], opset=13, attrs=attrs)


@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_argmax_ties(backend, axis, select_last_index):
    x = randint(4, 5, 3, low=0, high=3).astype(np.float32)  # many ties
    check(backend, "ArgMax", [x], opset=12, attrs={"axis": axis, "select_last_index": select_last_index})
    check(backend, "ArgMax", [x], opset=13, attrs={"axis": axis, "select_last_index": select_last_index,
                                                   "keepdims": 0})


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float64], ids=["i32", "i64", "u8", "f64"])
def test_argmax_dtypes(backend, dtype):
    x = randint(3, 6, low=0, high=50).astype(dtype)
    check(backend, "ArgMax", [x], opset=13, attrs={"axis": 1})


@pytest.mark.parametrize("opset", [7, 11])
def test_argmax_opsets(backend, opset):
    check(backend, "ArgMax", [randn(3, 4)], opset=opset, attrs={"axis": 1, "keepdims": 0})
