"""Reductions: every Reduce* (axes as attribute, then as input: ReduceSum at 13, the others at 18),
keepdims, noop_with_empty_axes, negative axes, empty-set reductions, integer types; ArgMax."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.errors import UnsupportedAttribute, UnsupportedDatatype

from .util import Const, check, expect_error, randbool, randint, randn, randpos

# The opset where axes moved from attribute to input.
AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceProd": 18,
                    "ReduceL1": 18, "ReduceL2": 18, "ReduceSumSquare": 18, "ReduceLogSum": 18,
                    "ReduceLogSumExp": 18}
REDUCE_OPS = list(AXES_INPUT_SINCE)
FLOAT_ONLY = {"ReduceLogSum", "ReduceLogSumExp"}
# The ops glowpy had first run the full axes matrix; the rest a subset (the same converter and kernels).
FULL_MATRIX = {"ReduceSum", "ReduceMean", "ReduceMax"}

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


def _reduce(backend, op, x, axes, opset, oracle="reference", **attrs):
    if opset >= AXES_INPUT_SINCE[op]:
        ins = [x] if axes is None else [x, Const(np.array(axes, dtype=np.int64))]
        return check(backend, op, ins, opset=opset, attrs=attrs, oracle=oracle)
    return check(backend, op, [x], opset=opset, attrs=attrs | ({} if axes is None else {"axes": list(axes)}),
                 oracle=oracle)


def _opsets(op):
    since = AXES_INPUT_SINCE[op]
    return [11, since - 1, since] if since > 13 else [11, 13]


FULL_AXES = [a for a in AXES if a not in ("0", "last", "-3,-2")]


def _data(op, *shape, dtype=np.float32):
    # log of a sum needs a positive sum
    return randpos(*shape, dtype=dtype) if op == "ReduceLogSum" else randn(*shape, dtype=dtype)


@pytest.mark.parametrize("keepdims", [None, 0], ids=["keep-default", "keep0"])  # (keepdims=1: test_reduce_opsets)
@pytest.mark.parametrize("op_axes", [(op, a) for op in REDUCE_OPS
                                     for a in (FULL_AXES if op in FULL_MATRIX else ("all", "unsorted"))],
                         ids=lambda p: f"{p[0]}-{p[1]}")
def test_reduce_latest(backend, op_axes, keepdims):
    op, axes = op_axes
    attrs = {} if keepdims is None else {"keepdims": keepdims}
    _reduce(backend, op, _data(op, 2, 3, 4), AXES[axes], 18, **attrs)


@pytest.mark.parametrize("case", [(op, o, a, k) for op in REDUCE_OPS for o in _opsets(op)
                                  for a in ("all", "-1", "0,2") for k in (0, 1)
                                  if op in FULL_MATRIX or (o >= 17 and a == "0,2" and k == 1)],
                         ids=lambda p: f"{p[0]}-{p[1]}-{p[2]}-keep{p[3]}")
def test_reduce_opsets(backend, case):
    op, opset, axes, keepdims = case
    _reduce(backend, op, _data(op, 3, 2, 4), AXES[axes], opset, keepdims=keepdims)


@pytest.mark.parametrize("keepdims", [0, 1], ids=["keep0", "keep1"])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_empty_set(backend, op, keepdims):
    # a reduced axis of size 0: each op's identity (ReduceMean's 0 / 0 aside)
    if op == "ReduceMean":
        return
    # (a zero dim cannot be declared on a graph input: the data is an initializer, the node folds)
    _reduce(backend, op, Const(np.zeros((2, 0, 3), np.float32)), (1,), 18, keepdims=keepdims)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_opset7(backend, op):
    _reduce(backend, op, randn(3, 2, 4), (1,), 7)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(backend, op):
    opset = AXES_INPUT_SINCE[op]
    check(backend, op, [_data(op, 2, 3)], opset=opset, attrs={"noop_with_empty_axes": 1})
    check(backend, op, [_data(op, 2, 3), Const(np.array([], dtype=np.int64))], opset=opset,
          attrs={"noop_with_empty_axes": 1})
    check(backend, op, [_data(op, 2, 3), Const(np.array([], dtype=np.int64))], opset=opset,
          attrs={"noop_with_empty_axes": 0})


@pytest.mark.parametrize("op_dtype", [(op, d) for op in REDUCE_OPS for d in (np.int32, np.int64, np.float64, np.float16)
                                      if op in FULL_MATRIX or d in (np.int32, np.float16)],
                         ids=lambda p: f"{p[0]}-{np.dtype(p[1]).name}")
def test_reduce_dtypes(backend, op_dtype):
    op, dtype = op_dtype
    if op in FLOAT_ONLY and np.dtype(dtype).kind == "i":
        expect_error(UnsupportedDatatype, op, [randint(3, 4, dtype=dtype)], opset=18, mentions=["element type"])
        return
    x = randint(3, 4, 5, low=-20, high=20).astype(dtype) if np.dtype(dtype).kind == "i" else _data(op, 3, 4, 5, dtype=dtype)
    # onnx.reference's ReduceSumSquare of int32 returns int64 (numpy's sum promotes): onnxruntime there
    oracle = "onnxruntime" if op == "ReduceSumSquare" and dtype == np.int32 else "reference"
    _reduce(backend, op, x, (1,), 18, keepdims=0, oracle=oracle)
    _reduce(backend, op, x, (0, 2), 18, oracle=oracle)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_size1_dims(backend, op):
    _reduce(backend, op, _data(op, 1, 3, 1), (0, 2), 18, keepdims=0)
    _reduce(backend, op, _data(op, 1, 3, 1), (1,), 18)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_runtime_axes_specialize(op):
    """Axes fed as a graph input: the model compiles per value (glowpy.importer.specialize)."""
    check("cpu", op, [randn(2, 3), np.array([1], dtype=np.int64)], opset=18)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_axis_out_of_range(op):
    expect_error(UnsupportedAttribute, op, [randn(2, 3), Const(np.array([2], dtype=np.int64))], opset=18,
                 mentions=["axis"])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_bool(backend, op):
    x = randbool(3, 4, 5)
    x[0] = True
    x[1] = False
    check(backend, op, [x, Const(np.array([1, 2], dtype=np.int64))], opset=20, attrs={"keepdims": 0})
    check(backend, op, [x], opset=20)


def test_reduce_bool_unsupported():
    expect_error(UnsupportedDatatype, "ReduceSum", [randbool(2, 3)], opset=20, mentions=["bool"])


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
