"""Data-movement and constant ONNX ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split,
Slice, Gather, Expand, Shape, Pad, Constant, ConstantOfShape. Attribute forms and input forms of every
opset where the op changed, negative axes, clamping."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from glowpy.errors import UnsupportedAttribute, UnsupportedDatatype

from .util import Const, check, expect_error, randbool, randint, randn

I64 = np.int64


def ints(*v: int) -> Const:
    return Const(np.array(v, dtype=I64))


DTYPE_MAKERS = {
    "f32": lambda *s: randn(*s),
    "i64": lambda *s: randint(*s),
    "i32": lambda *s: randint(*s, dtype=np.int32),
    "u8": lambda *s: randint(*s, low=0, high=200, dtype=np.uint8),
    "bool": lambda *s: randbool(*s),
    "f16": lambda *s: randn(*s, dtype=np.float16),
}

# --- Reshape ---------------------------------------------------------------------------------------

RESHAPE = {
    "plain": ((2, 3, 4), (4, 6)),
    "minus1": ((2, 3, 4), (-1, 4)),
    "minus1-mid": ((2, 3, 4), (2, -1, 2)),
    "zero-copies": ((2, 3, 4), (0, 12)),
    "zero-and-minus1": ((2, 3, 4), (0, 0, -1)),
    "flat": ((2, 3, 4), (-1,)),
    "grow-rank": ((6,), (1, 2, 1, 3)),
    "to-scalar-like": ((1, 1), (1,)),
}


@pytest.mark.parametrize("dtype", ["f32", "i64", "bool"])
@pytest.mark.parametrize("case", list(RESHAPE))
def test_reshape(backend, case, dtype):
    xs, shape = RESHAPE[case]
    check(backend, "Reshape", [DTYPE_MAKERS[dtype](*xs), ints(*shape)], opset=13)


@pytest.mark.parametrize("opset", [7, 14, 21])
def test_reshape_opsets(backend, opset):
    check(backend, "Reshape", [randn(2, 3, 4), ints(0, -1)], opset=opset)


def test_reshape_allowzero_without_zeros(backend):
    check(backend, "Reshape", [randn(2, 3, 4), ints(3, -1, 2)], opset=14, attrs={"allowzero": 1})


@pytest.mark.parametrize("xs,shape", [((0, 3), (3, 0)), ((2, 0), (0, 0, 5))], ids=["0x3->3x0", "2x0->0x0x5"])
def test_reshape_allowzero_keeps_zeros(backend, xs, shape):
    """allowzero=1: a 0 in the shape is a zero dim, not a copy (only possible for empty tensors, which
    can only be weights here: zero dims are rejected at the inputs)."""
    check(backend, "Reshape", [Const(np.zeros(xs, np.float32)), ints(*shape)], opset=14, attrs={"allowzero": 1})


def test_reshape_allowzero_zero_copies(backend):
    check(backend, "Reshape", [randn(2, 3, 4), ints(0, 4, 3)], opset=14, attrs={"allowzero": 0})


def test_reshape_runtime_shape_specializes():
    """A shape fed as a graph input: the model compiles per value (glowpy.importer.specialize)."""
    check("cpu", "Reshape", [randn(2, 3), np.array([3, 2], dtype=I64)], opset=13)


# --- Flatten ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [None, 0, 1, 2, 3, -1, -3, 4])
def test_flatten(backend, axis):
    attrs = {} if axis is None else {"axis": axis}
    check(backend, "Flatten", [randn(2, 3, 4, 5)], opset=13, attrs=attrs)


@pytest.mark.parametrize("opset", [7, 11, 21])
def test_flatten_opsets(backend, opset):
    check(backend, "Flatten", [randint(2, 3, 4)], opset=opset, attrs={"axis": 2})


def test_flatten_bad_axis():
    expect_error(UnsupportedAttribute, "Flatten", [randn(2, 3)], opset=13, attrs={"axis": 3}, mentions=["axis"])


# --- Squeeze / Unsqueeze ---------------------------------------------------------------------------

SQUEEZE = {
    "all": ((1, 3, 1, 4, 1), None),
    "one": ((1, 3, 1, 4), (0,)),
    "two": ((1, 3, 1, 4), (0, 2)),
    "negative": ((1, 3, 1, 4, 1), (-1, -3)),
    "to-scalar": ((1, 1), (0, 1)),
}


def _with_opsets(cases: dict, opsets: list[int], negative) -> list:
    """(case, opset) pairs, leaving out negative axes before the opset that allowed them (11)."""
    return [pytest.param(c, o, id=f"{c}-{o}") for c in cases for o in opsets if not (o < 11 and negative(cases[c]))]


@pytest.mark.parametrize("case,opset", _with_opsets(SQUEEZE, [7, 11, 13, 21], lambda v: v[1] and min(v[1]) < 0))
def test_squeeze(backend, case, opset):
    xs, axes = SQUEEZE[case]
    if axes is None:
        check(backend, "Squeeze", [randn(*xs)], opset=opset)
    elif opset < 13:
        check(backend, "Squeeze", [randn(*xs)], opset=opset, attrs={"axes": list(axes)})
    else:
        check(backend, "Squeeze", [randn(*xs), ints(*axes)], opset=opset)


def test_squeeze_bool(backend):
    check(backend, "Squeeze", [randbool(1, 3, 1), ints(-1)], opset=13)


UNSQUEEZE = {
    "front": ((3, 4), (0,)),
    "back": ((3, 4), (2,)),
    "middle": ((3, 4), (1,)),
    "several": ((3, 4), (0, 2, 4)),
    "unsorted": ((3, 4), (3, 0)),
    "negative": ((3, 4), (-1,)),
    "negative-several": ((3, 4), (-1, -4)),
    "from-scalar": ((), (0, 1)),
}


@pytest.mark.parametrize("case,opset", _with_opsets(UNSQUEEZE, [7, 11, 13, 21], lambda v: min(v[1]) < 0))
def test_unsqueeze(backend, case, opset):
    xs, axes = UNSQUEEZE[case]
    x = Const(randn(*xs)) if xs == () else randn(*xs)  # (a 0-d runtime feed: see test_elementwise)
    if opset < 13:
        # onnx.reference's Unsqueeze-1/11 inserts the axes in the given order, so unsorted axes fail there.
        check(backend, "Unsqueeze", [x], opset=opset, attrs={"axes": list(axes)},
              oracle="onnxruntime" if list(axes) != sorted(axes) else "reference")
    else:
        check(backend, "Unsqueeze", [x, ints(*axes)], opset=opset)


def test_unsqueeze_repeated_axes():
    expect_error(UnsupportedAttribute, "Unsqueeze", [randn(3), ints(0, 0)], opset=13, mentions=["axes"])


# --- Transpose -------------------------------------------------------------------------------------

TRANSPOSE = {
    "default-2d": ((3, 4), None),
    "default-4d": ((2, 3, 4, 5), None),
    "nchw-nhwc": ((2, 3, 4, 5), (0, 2, 3, 1)),
    "nhwc-nchw": ((2, 3, 4, 5), (0, 3, 1, 2)),
    "swap-last": ((2, 3, 4), (0, 2, 1)),
    "identity": ((2, 3, 4), (0, 1, 2)),
    "size1": ((1, 3, 1), (2, 0, 1)),
    "1d": ((5,), (0,)),
    "scalar": ((), None),  # default perm; stays 0-d (ascontiguousarray would make it 1-d)
}


@pytest.mark.parametrize("dtype", ["f32", "i64", "bool"])
@pytest.mark.parametrize("case", list(TRANSPOSE))
def test_transpose(backend, case, dtype):
    xs, perm = TRANSPOSE[case]
    check(backend, "Transpose", [DTYPE_MAKERS[dtype](*xs)], opset=13, attrs={} if perm is None else {"perm": list(perm)})


def test_transpose_opset7(backend):
    check(backend, "Transpose", [randn(2, 3, 4)], opset=7, attrs={"perm": [1, 0, 2]})


def test_transpose_bad_perm():
    expect_error(UnsupportedAttribute, "Transpose", [randn(2, 3, 4)], opset=13, attrs={"perm": [0, 0, 1]},
                 mentions=["perm"])


# --- Concat ----------------------------------------------------------------------------------------

CONCAT = {
    "axis0": ([(2, 3), (4, 3)], 0),
    "axis1": ([(2, 3), (2, 1), (2, 5)], 1),
    "axis-1": ([(2, 3, 4), (2, 3, 2)], -1),
    "axis-3": ([(2, 3, 4), (1, 3, 4)], -3),
    "single": ([(2, 3)], 1),
    "1d": ([(3,), (1,), (2,)], 0),
}


@pytest.mark.parametrize("dtype", ["f32", "i64", "bool"])
@pytest.mark.parametrize("case", list(CONCAT))
def test_concat(backend, case, dtype):
    shapes, axis = CONCAT[case]
    xs = [DTYPE_MAKERS[dtype](*s) for s in shapes]
    check(backend, "Concat", xs, opset=13, attrs={"axis": axis})


@pytest.mark.parametrize("opset", [7, 11])
def test_concat_opsets(backend, opset):
    check(backend, "Concat", [randn(2, 3), Const(randn(2, 2, seed=1))], opset=opset, attrs={"axis": 1})


def test_concat_without_axis():
    expect_error(UnsupportedAttribute, "Concat", [randn(2, 3), randn(2, 3)], opset=13, mentions=["axis"])


# --- Split -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis,opset", [(a, o) for a in (None, 1, -1) for o in (7, 11, 13, 18) if not (o < 11 and a == -1)])
def test_split_equal(backend, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    if opset >= 18:
        attrs["num_outputs"] = 3
    check(backend, "Split", [randn(6, 6, 3 if axis != 1 else 6)], opset=opset, attrs=attrs, outputs=3)


@pytest.mark.parametrize("opset", [7, 11, 13, 18])
@pytest.mark.parametrize("sizes", [(1, 4, 1), (2, 4), (6,)], ids=["1-4-1", "2-4", "whole"])
def test_split_sizes(backend, opset, sizes):
    """Explicit sizes: the `split` attribute before opset 13, the `split` input from 13."""
    x = randn(3, 6)
    if opset < 13:
        check(backend, "Split", [x], opset=opset, attrs={"axis": 1, "split": list(sizes)}, outputs=len(sizes))
    else:
        check(backend, "Split", [x, ints(*sizes)], opset=opset, attrs={"axis": -1}, outputs=len(sizes))


@pytest.mark.parametrize("dim,parts", [(7, 3), (5, 2), (10, 4), (4, 4), (3, 2), (5, 4), (2, 3)])
def test_split_num_outputs_uneven(backend, dim, parts):
    """Opset 18: num_outputs with a dim it does not divide; the last chunk is smaller."""
    check(backend, "Split", [randn(2, dim)], opset=18, attrs={"axis": 1, "num_outputs": parts}, outputs=parts)


def test_split_int_and_bool(backend):
    check(backend, "Split", [randint(4, 2), ints(1, 3)], opset=13, outputs=2)
    check(backend, "Split", [randbool(4, 2)], opset=18, attrs={"num_outputs": 2}, outputs=2)


def test_split_bad_sizes():
    expect_error(UnsupportedAttribute, "Split", [randn(3, 6), ints(2, 2)], opset=13, attrs={"axis": 1}, outputs=2,
                 mentions=["split"])


# --- Slice -----------------------------------------------------------------------------------------

# name -> (x shape, starts, ends, axes, steps)
SLICE = {
    "basic": ((5, 6), (1, 2), (4, 5), None, None),
    "axes": ((5, 6, 7), (1,), (3,), (2,), None),
    "negative-axes": ((5, 6, 7), (1, 0), (3, 2), (-1, -3), None),
    "negative-starts-ends": ((5, 6), (-3, -5), (-1, -2), None, None),
    "clamped-ends": ((5, 6), (1, 0), (1000, 2**62), None, None),
    "clamped-starts": ((5, 6), (-1000, 2), (3, 1000), None, None),
    "int-max-end": ((5, 6), (2,), (2**63 - 1,), (1,), None),
    "steps": ((8, 9), (0, 1), (8, 9), None, (2, 3)),
    "negative-step": ((8, 9), (6,), (1,), (0,), (-2,)),
    "negative-step-to-start": ((8, 9), (-1,), (-1000,), (1,), (-1,)),
    "reverse-int-min": ((8, 9), (-1,), (-(2**63),), (0,), (-1,)),
    "negative-step-clamped-start": ((8, 9), (100,), (2,), (1,), (-3,)),
    "empty": ((5, 6), (3,), (3,), (0,), None),
    "mixed": ((4, 5, 6), (0, -1, 1), (4, 0, 6), (0, 1, 2), (3, -2, 2)),
}


@pytest.mark.parametrize("case", list(SLICE))
def test_slice_inputs(backend, case):
    xs, starts, ends, axes, steps = SLICE[case]
    ins = [randn(*xs), ints(*starts), ints(*ends)]
    if axes is not None or steps is not None:
        ins.append(ints(*axes) if axes is not None else None)
    if steps is not None:
        ins.append(ints(*steps))
    check(backend, "Slice", ins, opset=13)


# Stepping backward from a start below -dim: the spec clamps the start to element 0 (so one element when
# the end is before 0); onnx.reference slices like python (nothing), onnxruntime follows the spec.
SLICE_BACKWARD_FROM_BELOW = {
    "to-int-min": (-100, -(2**63), -1),
    "to-below-dim": (-100, -6, -1),
    "stride-2": (-100, -100, -2),
    "to-0": (-7, 0, -1),
}


@pytest.mark.parametrize("case", list(SLICE_BACKWARD_FROM_BELOW))
def test_slice_backward_from_below_dim(backend, case):
    start, end, step = SLICE_BACKWARD_FROM_BELOW[case]
    check(backend, "Slice", [randn(5, 3), ints(start), ints(end), ints(0), ints(step)], opset=13,
          oracle="onnxruntime")


@pytest.mark.parametrize("case", [c for c in SLICE if SLICE[c][4] is None and c != "negative-axes"])
def test_slice_attributes(backend, case):
    """Opset < 10: starts/ends/axes are attributes, step 1 (and no negative axes)."""
    xs, starts, ends, axes, _ = SLICE[case]
    attrs = {"starts": list(starts), "ends": list(ends)} | ({} if axes is None else {"axes": list(axes)})
    check(backend, "Slice", [randn(*xs)], opset=7, attrs=attrs)


@pytest.mark.parametrize("opset", [10, 11])
def test_slice_opset10_11(backend, opset):
    check(backend, "Slice", [randint(6, 4), ints(5, 1), ints(0, 4), ints(0, 1), ints(-2, 2)], opset=opset)


def test_slice_int32_indices(backend):
    c = lambda *v: Const(np.array(v, dtype=np.int32))  # noqa: E731
    check(backend, "Slice", [randn(6, 4), c(1), c(-1), c(0)], opset=13)


def test_slice_bool(backend):
    check(backend, "Slice", [randbool(6, 4), ints(1), ints(5), ints(0), ints(2)], opset=13)


def test_slice_step_zero():
    expect_error(UnsupportedAttribute, "Slice", [randn(6, 4), ints(0), ints(3), ints(0), ints(0)], opset=13,
                 mentions=["step"])


# --- Gather ----------------------------------------------------------------------------------------

GATHER = {
    "axis0": ((5, 4), 0, [0, 2, 4]),
    "axis1": ((3, 5), 1, [[1, 0], [4, 4]]),
    "axis-1": ((2, 3, 5), -1, [3, 1]),
    "negative-indices": ((5, 4), 0, [-1, -5, 2]),
    "negative-indices-axis1": ((3, 5), 1, [[-2], [0]]),
    "scalar-index": ((5, 4), 0, 3),
    "scalar-negative-index": ((2, 5, 4), 1, -2),
}


# (0-d index feeds are left out: see test_elementwise::test_unary_scalar_feed)
@pytest.mark.parametrize("case,where", [(c, w) for c in GATHER for w in ("const", "runtime")
                                        if not (w == "runtime" and np.ndim(GATHER[c][2]) == 0)])
def test_gather(backend, case, where):
    xs, axis, idx = GATHER[case]
    idx = np.array(idx, dtype=I64)
    check(backend, "Gather", [randn(*xs), Const(idx) if where == "const" else idx], opset=13, attrs={"axis": axis})


@pytest.mark.parametrize("dtype", ["i64", "bool", "f16"])
def test_gather_dtypes(backend, dtype):
    check(backend, "Gather", [DTYPE_MAKERS[dtype](4, 3), Const(np.array([3, -4], dtype=np.int32))], opset=13)


@pytest.mark.parametrize("opset", [7, 11])
def test_gather_opsets(backend, opset):
    idx = np.array([[0, 1], [2, 0]], dtype=I64) - (3 if opset >= 11 else 0)  # negative indices since 11
    check(backend, "Gather", [randn(3, 4), Const(idx)], opset=opset)


def test_gather_from_constant_data(backend):
    check(backend, "Gather", [Const(randn(6, 3)), np.array([5, 0, -1], dtype=I64)], opset=13)


def test_gather_index_out_of_range():
    from glowpy.errors import InvalidModel

    expect_error(InvalidModel, "Gather", [randn(3, 4), Const(np.array([3], dtype=I64))], opset=13,
                 mentions=["range"])


# --- Expand ----------------------------------------------------------------------------------------

EXPAND = {
    "same-rank": ((3, 1), (3, 4)),
    "rank-growth": ((3, 1), (2, 3, 4)),
    "rank-growth-2": ((4,), (2, 3, 4)),
    "shape-has-ones": ((2, 3), (1, 3)),
    "shape-lower-rank": ((2, 1, 3), (4, 1)),
    "scalar": ((), (2, 3)),
    "no-op": ((2, 3), (2, 3)),
    "ones-everywhere": ((1, 1), (1, 1, 5, 1)),
}


@pytest.mark.parametrize("dtype", ["f32", "i64", "bool"])
@pytest.mark.parametrize("case", list(EXPAND))
def test_expand(backend, case, dtype):
    xs, shape = EXPAND[case]
    x = DTYPE_MAKERS[dtype](*xs)
    check(backend, "Expand", [Const(x) if xs == () else x, ints(*shape)], opset=13)


def test_expand_opset8(backend):
    check(backend, "Expand", [randn(3, 1), ints(2, 3, 5)], opset=8)


# --- Shape -----------------------------------------------------------------------------------------

SHAPE_ATTRS = {
    "none": {},
    "start1": {"start": 1},
    "start-neg": {"start": -2},
    "end2": {"end": 2},
    "end-neg": {"end": -1},
    "both": {"start": 1, "end": 3},
    "clamped": {"start": -10, "end": 10},
}


@pytest.mark.parametrize("case", list(SHAPE_ATTRS))
def test_shape(backend, case):
    check(backend, "Shape", [randn(2, 3, 4, 5)], opset=15, attrs=SHAPE_ATTRS[case])


@pytest.mark.parametrize("opset", [7, 13, 21])
def test_shape_opsets(backend, opset):
    check(backend, "Shape", [randbool(2, 3)], opset=opset)


def test_shape_empty_slice(backend):
    check(backend, "Shape", [randn(2, 3)], opset=15, attrs={"start": 2})


# --- Pad -------------------------------------------------------------------------------------------

PAD = {
    "zero": ((3, 4), (0, 0, 0, 0)),
    "begin": ((3, 4), (1, 2, 0, 0)),
    "end": ((3, 4), (0, 0, 2, 1)),
    "both": ((2, 3, 4), (0, 1, 2, 1, 0, 3)),
    "negative": ((4, 5), (-1, 1, 0, -2)),
}


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("case", list(PAD))
def test_pad(backend, case, mode):
    xs, pads = PAD[case]
    # onnx.reference's Pad is np.pad, which refuses negative pads (crops); onnxruntime implements them.
    check(backend, "Pad", [randn(*xs), ints(*pads)], opset=13, attrs={"mode": mode},
          oracle="onnxruntime" if min(pads) < 0 else "reference")


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("case", ["begin", "both"])
def test_pad_attributes(backend, case, mode):
    """Opset < 11: pads and value are attributes."""
    xs, pads = PAD[case]
    check(backend, "Pad", [randn(*xs)], opset=7, attrs={"mode": mode, "pads": list(pads), "value": 1.5})


@pytest.mark.parametrize("value", [None, "default", 2.5, -3.0])
def test_pad_constant_value(backend, value):
    ins = [randn(2, 3), ints(1, 0, 0, 2)]
    if value is not None:
        ins.append(None if value == "default" else Const(np.float32(value)))
    check(backend, "Pad", ins, opset=13)


@pytest.mark.parametrize("dtype", ["i64", "i32", "u8"])
def test_pad_int(backend, dtype):
    x = DTYPE_MAKERS[dtype](3, 4)
    fill = Const(np.array(7, dtype=x.dtype))
    check(backend, "Pad", [x, ints(1, 0, 2, 1), fill], opset=13)
    check(backend, "Pad", [x, ints(1, 1, 1, 1)], opset=13, attrs={"mode": "reflect"})
    check(backend, "Pad", [x, ints(0, 2, 1, 1)], opset=13, attrs={"mode": "edge"})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("axes", [(1,), (-1, 0), (0, 2)], ids=["1", "-1,0", "0,2"])
def test_pad_axes(backend, axes, mode):
    """Opset 18: pads for the listed axes only."""
    pads = [1] * len(axes) + [2] * len(axes)
    check(backend, "Pad", [randn(3, 4, 5), ints(*pads), None, ints(*axes)], opset=18, attrs={"mode": mode})


def test_pad_reflect_wide(backend):
    """Reflect pads as wide as the dim allows (dim - 1)."""
    check(backend, "Pad", [randn(3, 4), ints(2, 3, 2, 3)], opset=13, attrs={"mode": "reflect"})


def test_pad_wrap_unsupported():
    expect_error(UnsupportedAttribute, "Pad", [randn(3, 4), ints(1, 1, 1, 1)], opset=19, attrs={"mode": "wrap"},
                 mentions=["mode"])


def test_pad_runtime_pads_specialize():
    """Pads fed as a graph input: the model compiles per value."""
    check("cpu", "Pad", [randn(3, 4), np.array([1, 1, 1, 1], dtype=I64)], opset=13)


# --- Constant --------------------------------------------------------------------------------------

CONSTANT = {
    "value-f32": {"value": numpy_helper.from_array(randn(2, 3), "v")},
    "value-i64": {"value": numpy_helper.from_array(randint(4), "v")},
    "value-bool": {"value": numpy_helper.from_array(randbool(2, 2), "v")},
    "value-f16": {"value": numpy_helper.from_array(randn(3, dtype=np.float16), "v")},
    "value-scalar": {"value": numpy_helper.from_array(np.array(2.5, dtype=np.float32), "v")},
    "value_float": {"value_float": 1.25},
    "value_floats": {"value_floats": [1.0, -2.5, 3.0]},
    "value_int": {"value_int": 7},
    "value_ints": {"value_ints": [3, -1, 4]},
}


@pytest.mark.parametrize("case", list(CONSTANT))
def test_constant(backend, case):
    attrs = CONSTANT[case]
    opset = 9 if case.startswith("value-") else 13
    check(backend, "Constant", [], opset=opset, attrs=attrs)


def test_constant_string_unsupported():
    expect_error(UnsupportedAttribute, "Constant", [], opset=13, attrs={"value_string": "hello"},
                 mentions=["value_string"])


def test_constant_string_tensor_unsupported():
    t = helper.make_tensor("v", TensorProto.STRING, [1], [b"x"])
    expect_error(UnsupportedDatatype, "Constant", [], opset=13, attrs={"value": t}, mentions=["STRING"])


# --- ConstantOfShape -------------------------------------------------------------------------------

FILL = {
    "default": None,
    "f32": np.array([1.5], dtype=np.float32),
    "f64": np.array([-2.0], dtype=np.float64),
    "f16": np.array([0.5], dtype=np.float16),
    "i64": np.array([7], dtype=I64),
    "i32": np.array([-3], dtype=np.int32),
    "u8": np.array([200], dtype=np.uint8),
    "bool": np.array([True]),
}


@pytest.mark.parametrize("shape", [(2, 3), (4,), (1, 2, 1)], ids=["2x3", "4", "1x2x1"])
@pytest.mark.parametrize("fill", list(FILL))
def test_constant_of_shape(backend, fill, shape):
    value = FILL[fill]
    attrs = {} if value is None else {"value": numpy_helper.from_array(value, "value")}
    check(backend, "ConstantOfShape", [ints(*shape)], opset=9, attrs=attrs)


@pytest.mark.parametrize("opset", [9, 20, 21])
def test_constant_of_shape_opsets(backend, opset):
    check(backend, "ConstantOfShape", [ints(3, 2)], opset=opset,
          attrs={"value": numpy_helper.from_array(np.array([4], dtype=np.int32), "value")})


def test_constant_of_shape_from_shape(backend):
    """The usual pattern: ConstantOfShape(Shape(x)) folds to a constant the size of x."""
    from onnx.reference import ReferenceEvaluator

    import glowpy

    x = randn(2, 3)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["c"],
                              value=numpy_helper.from_array(np.array([2.0], dtype=np.float32))),
             helper.make_node("Add", ["x", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    got = glowpy.compile(model, backend=backend).run({"x": x})["y"]
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-6)


# --- Loop (one node: its shapes checked from the body, not taken as declared) ------------------------


def _doubling_body() -> onnx.GraphProto:
    """(i, cond, x) -> (cond, x * 2): a loop-carried value, no scan output."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    return helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Mul", ["x_in", "two"], ["x_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [2, 3])], initializer=[two])


@pytest.mark.parametrize("trip", [0, 3])
def test_loop_carried_value_with_a_run_time_trip_count(backend, trip):
    check(backend, "Loop", [np.array(trip, np.int64), np.array(True), randn(2, 3)], opset=16,
          attrs={"body": _doubling_body()})
