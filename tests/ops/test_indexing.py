"""Indexing, scatter, tensor-construction ops and Det against onnx's ReferenceEvaluator, on every backend, at
each opset where the op changed: GatherElements, GatherND, ScatterND, ScatterElements, Scatter, Range,
Tile, OneHot, Trilu, CumSum, CumProd, EyeLike, Size, CastLike, TopK, ArgMin / ArgMax, Hardmax,
ReverseSequence, DepthToSpace, SpaceToDepth, Einsum, CenterCropPad; the refusal of ops whose output shape
depends on input values; and the bad-input contract (an out-of-range index known at compile time is
InvalidModel; at run time a gather yields zero there and a scatter drops that update, on every backend)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glowpy
from glowpy.errors import InvalidModel, UnsupportedAttribute, UnsupportedShape

from .util import Const, check, check_graph, expect_error, node_model, randbool, randint, randn

I64 = np.int64


def ints(*v: int) -> Const:
    return Const(np.array(v, dtype=I64))


def scalar(v, dtype=I64) -> Const:
    return Const(np.array(v, dtype=dtype))


DATA = {
    "f32": lambda *s: randn(*s),
    "i32": lambda *s: randint(*s, dtype=np.int32),
    "i64": lambda *s: randint(*s),
    "u8": lambda *s: randint(*s, low=0, high=200, dtype=np.uint8),
    "i8": lambda *s: randint(*s, dtype=np.int8),
    "bool": lambda *s: randbool(*s),
}


def idx(*shape: int, high: int, low: int | None = None, dtype=I64, seed: int = 1) -> np.ndarray:
    return randint(*shape, low=-high if low is None else low, high=high, dtype=dtype, seed=seed)


# --- GatherElements --------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(backend, opset, axis):
    x = randn(3, 4, 5)
    n = x.shape[axis]
    shape = list(x.shape)
    shape[axis] = 6  # longer than the dim along the axis: indices repeat
    # The reference evaluator mis-slices a negative axis (index.shape[:-1] + index.shape[0:]): onnxruntime there.
    check(backend, "GatherElements", [x, idx(*shape, high=n)], opset=opset, attrs={"axis": axis},
          oracle="onnxruntime" if axis < 0 else "reference")


@pytest.mark.parametrize("dtype", ["i32", "i64", "u8", "bool"])
def test_gather_elements_dtypes(backend, dtype):
    check(backend, "GatherElements", [DATA[dtype](4, 3), Const(idx(2, 3, high=4, dtype=np.int32))], opset=13)


# --- GatherND --------------------------------------------------------------------------------------

GATHER_ND = {
    "full-index": ((3, 4, 5), (2, 3), 0),
    "slice-rows": ((3, 4, 5), (2, 2, 1), 0),
    "batch1": ((3, 4, 5), (3, 2, 1), 1),
    "batch1-elements": ((3, 4, 5), (3, 2), 1),
    "batch2": ((2, 3, 4, 5), (2, 3, 2, 1), 2),
}


@pytest.mark.parametrize("case", list(GATHER_ND))
def test_gather_nd(backend, case):
    xs, ishape, b = GATHER_ND[case]
    dims = np.array(xs[b:b + ishape[-1]])
    i = (randint(*ishape, low=0, high=100, seed=2) % dims) - dims * randint(*ishape, low=0, high=2, seed=3)
    check(backend, "GatherND", [randn(*xs), i], opset=13, attrs={"batch_dims": b})


@pytest.mark.parametrize("opset", [11, 12])
def test_gather_nd_opsets(backend, opset):
    attrs = {"batch_dims": 1} if opset >= 12 else {}
    check(backend, "GatherND", [randn(2, 3, 4), Const(np.array([[1], [0]], dtype=I64))], opset=opset, attrs=attrs)


@pytest.mark.parametrize("dtype", ["i32", "i64", "i8", "bool"])
def test_gather_nd_dtypes(backend, dtype):
    check(backend, "GatherND", [DATA[dtype](4, 3, 2), np.array([[0, 2], [3, -1]], dtype=np.int32)], opset=13)


# --- ScatterND / ScatterElements / Scatter -----------------------------------------------------------


@pytest.mark.parametrize("opset,reduction", [(11, None), (13, None), (16, "add"), (16, "mul"), (18, "max"),
                                             (18, "min"), (18, "none")])
def test_scatter_nd(backend, opset, reduction):
    attrs = {"reduction": reduction} if reduction else {}
    # Repeated index rows: reductions combine them in order (none keeps the last).
    i = np.array([[[1, 0]], [[2, 3]], [[1, 0]]], dtype=I64)
    check(backend, "ScatterND", [randn(3, 4, 5), i, randn(3, 1, 5, seed=4)], opset=opset, attrs=attrs)


@pytest.mark.parametrize("dtype", ["i32", "i64", "u8", "bool"])
def test_scatter_nd_dtypes(backend, dtype):
    x = DATA[dtype](4, 3)
    check(backend, "ScatterND", [x, Const(np.array([[1], [-1]], dtype=I64)), DATA[dtype](2, 3)], opset=13)


def test_scatter_nd_int_add(backend):
    check(backend, "ScatterND", [DATA["i32"](4, 3), np.array([[1, 2], [1, 2]], dtype=I64), DATA["i32"](2)],
          opset=16, attrs={"reduction": "add"})


@pytest.mark.parametrize("opset,reduction,axis", [(11, None, 1), (13, None, -3), (16, "add", 1), (16, "mul", -3),
                                                  (18, "max", 1), (18, "min", -3)])
def test_scatter_elements(backend, opset, reduction, axis):
    attrs = {"axis": axis, **({"reduction": reduction} if reduction else {})}
    i = idx(3, 2, 4, high=4 if axis == 1 else 3, seed=5)
    check(backend, "ScatterElements", [randn(3, 4, 5), i, randn(3, 2, 4, seed=6)], opset=opset, attrs=attrs)


@pytest.mark.parametrize("dtype", ["i64", "u8", "bool"])
def test_scatter_elements_dtypes(backend, dtype):
    check(backend, "ScatterElements", [DATA[dtype](4, 3), Const(idx(2, 3, high=4, low=0, dtype=np.int32)),
                                       DATA[dtype](2, 3)], opset=13)


@pytest.mark.parametrize("opset", [9, 10])
def test_scatter_deprecated(backend, opset):
    # The reference evaluator has no Scatter.
    check(backend, "Scatter", [randn(3, 4), idx(3, 2, high=4, low=0), randn(3, 2, seed=2)], opset=opset,
          attrs={"axis": 1}, oracle="onnxruntime")


# --- Range, Size, EyeLike, CastLike -----------------------------------------------------------------


@pytest.mark.parametrize("start,limit,delta,dtype", [(1, 10, 3, I64), (10, -3, -4, np.int32),
                                                     (0.5, 3.0, 0.7, np.float32), (5, 5, 1, I64)])
def test_range(backend, start, limit, delta, dtype):
    out = check(backend, "Range", [scalar(start, dtype), scalar(limit, dtype), scalar(delta, dtype)], opset=11)
    assert out["out0"].dtype == dtype


def test_range_from_shape(backend):
    """Swin's form: Range(0, Shape(x)[i], 1) — computable at compile time from shapes."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
             helper.make_node("Squeeze", ["s", "zero"], ["n"]),
             helper.make_node("Range", ["start", "n", "one"], ["r"]),
             helper.make_node("Add", ["x", "r"], ["y"])]
    init = {"zero": np.array([0], I64), "start": np.array(0, I64), "one": np.array(1, I64)}
    check_graph(backend, nodes, {"x": randint(3, 7)}, ["y"], opset=15, initializers=init)


def test_range_zero_delta():
    expect_error(InvalidModel, "Range", [scalar(0), scalar(5), scalar(0)], opset=11, mentions=["delta"], compat=False)


@pytest.mark.parametrize("opset", [13, 21])
def test_size(backend, opset):
    check(backend, "Size", [randn(2, 3, 4)], opset=opset)


@pytest.mark.parametrize("opset,attrs", [(9, {}), (9, {"k": 2}), (22, {"k": -1, "dtype": TensorProto.INT32})])
def test_eye_like(backend, opset, attrs):
    check(backend, "EyeLike", [randn(3, 5)], opset=opset, attrs=attrs)


@pytest.mark.parametrize("opset", [15, 19])
@pytest.mark.parametrize("to", [np.int32, np.float16, np.bool_])
def test_cast_like(backend, opset, to):
    check(backend, "CastLike", [randn(3, 4) * 3, np.zeros(2, to)], opset=opset)


# --- Tile, Trilu, DepthToSpace, SpaceToDepth, CenterCropPad -----------------------------------------


@pytest.mark.parametrize("opset", [7, 13])  # (changed at 6; glowpy reads opset 7 on)
@pytest.mark.parametrize("dtype", ["f32", "i64", "bool"])
def test_tile(backend, opset, dtype):
    check(backend, "Tile", [DATA[dtype](2, 3, 2), ints(2, 1, 3)], opset=opset)


def test_tile_ones_and_zero(backend):
    check(backend, "Tile", [randn(2, 3), ints(1, 1)], opset=13)


def test_tile_bad_repeats():
    expect_error(UnsupportedShape, "Tile", [randn(2, 3), ints(2)], opset=13, mentions=["repeats"])


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 2, -1, -7])
def test_trilu(backend, upper, k):
    check(backend, "Trilu", [randn(2, 4, 5)] + ([] if k is None else [scalar(k)]), opset=14, attrs={"upper": upper})


def test_trilu_runtime_k(backend):
    check(backend, "Trilu", [randint(3, 4, dtype=np.int32), np.array(1, I64)], opset=14, attrs={"upper": 0})


@pytest.mark.parametrize("opset,mode", [(11, "DCR"), (11, "CRD"), (13, "CRD")])
def test_depth_to_space(backend, opset, mode):
    check(backend, "DepthToSpace", [randn(2, 8, 3, 2)], opset=opset, attrs={"blocksize": 2, "mode": mode})


@pytest.mark.parametrize("opset", [7, 13])
def test_space_to_depth(backend, opset):
    check(backend, "SpaceToDepth", [randn(1, 3, 4, 6)], opset=opset, attrs={"blocksize": 2})


@pytest.mark.parametrize("shape,axes", [((2, 3, 7), None), ((5, 2, 8), None), ((6,), [-1]), ((1, 9), [0, 2])])
def test_center_crop_pad(backend, shape, axes):
    check(backend, "CenterCropPad", [randn(3, 4, 5), ints(*shape)], opset=18,
          attrs={"axes": axes} if axes is not None else {})


# --- CumSum, CumProd -------------------------------------------------------------------------------


@pytest.mark.parametrize("op,opset", [("CumSum", 11), ("CumSum", 14), ("CumProd", 26)])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumulative(backend, op, opset, exclusive, reverse):
    x = randn(3, 4, 5) if op == "CumSum" else randpos_like(3, 4, 5)
    check(backend, op, [x, scalar(-2)], opset=opset, attrs={"exclusive": exclusive, "reverse": reverse})


def randpos_like(*shape: int) -> np.ndarray:
    return np.random.default_rng(3).uniform(0.5, 1.5, shape).astype(np.float32)


@pytest.mark.parametrize("op,opset", [("CumSum", 14), ("CumProd", 26)])
def test_cumulative_int(backend, op, opset):
    check(backend, op, [randint(4, 6, dtype=np.int32), scalar(1, np.int32)], opset=opset, attrs={"exclusive": 1})


# --- TopK, ArgMin / ArgMax, Hardmax ---------------------------------------------------------------


@pytest.mark.parametrize("opset,attrs", [(7, {"k": 2}), (10, {"axis": 0}), (11, {"largest": 0}),
                                         (11, {"axis": -2, "largest": 1}), (24, {"largest": 0, "sorted": 1})])
def test_topk(backend, opset, attrs):
    x = randn(4, 6)
    x[1, 2] = x[1, 4]  # a tie: the lower index comes first
    ins = [x] if opset < 10 else [x, ints(3)]
    check(backend, "TopK", ins, opset=opset, attrs=attrs, outputs=2)


@pytest.mark.parametrize("dtype", ["i32", "i64", "u8"])
def test_topk_ints(backend, dtype):
    check(backend, "TopK", [DATA[dtype](3, 7), ints(7)], opset=11, attrs={"largest": 0}, outputs=2)


@pytest.mark.parametrize("op", ["ArgMin", "ArgMax"])
@pytest.mark.parametrize("opset,attrs", [(11, {"axis": -1}), (12, {"select_last_index": 1}),
                                         (13, {"axis": 1, "keepdims": 0, "select_last_index": 1})])
@pytest.mark.parametrize("dtype", ["f32", "u8"])
def test_arg_min_max(backend, op, opset, attrs, dtype):
    x = DATA[dtype](3, 4) if dtype == "f32" else randint(3, 4, low=0, high=3, dtype=DATA[dtype](1).dtype)  # ties
    check(backend, op, [x], opset=opset, attrs=attrs)


def test_argmin_int_extremes(backend):
    """The order reversal of integers wraps at the type's minimum: ~x, not -x."""
    x = np.array([[np.iinfo(np.int32).min, 0, np.iinfo(np.int32).max, -1]], np.int32)
    check(backend, "ArgMin", [x], opset=13, attrs={"axis": 1})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_hardmax(backend, axis):
    check(backend, "Hardmax", [randn(3, 4, 5)], opset=13, attrs={"axis": axis})


@pytest.mark.parametrize("opset", [7, 11])
def test_hardmax_coerced(backend, opset):
    # The reference evaluator applies opset 13's per-axis rule at every opset; before 13 Hardmax works on
    # the input coerced to 2-D at `axis` (onnxruntime does).
    check(backend, "Hardmax", [randn(3, 4, 5)], opset=opset, attrs={"axis": 1}, oracle="onnxruntime")


# --- OneHot, ReverseSequence ----------------------------------------------------------------------


@pytest.mark.parametrize("opset,axis", [(9, -1), (11, 0), (11, 1)])
def test_onehot(backend, opset, axis):
    i = np.array([[0, 3], [4, 2]], I64) - (5 if opset >= 11 else 0) * np.array([[0, 1], [0, 0]], I64)
    check(backend, "OneHot", [i, scalar(5), np.array([-1.0, 2.5], np.float32)], opset=opset, attrs={"axis": axis})


def test_onehot_float_indices_int_values(backend):
    check(backend, "OneHot", [np.array([0.0, 2.0, -1.0, 9.0], np.float32), scalar(3, np.float32),
                              np.array([0, 7], np.int32)], opset=11)


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
@pytest.mark.parametrize("dtype", ["f32", "i64"])
def test_reverse_sequence(backend, batch_axis, time_axis, dtype):
    x = DATA[dtype](4, 3, 2) if batch_axis == 1 else DATA[dtype](3, 4, 2)
    lens = np.array([4, 1, 3], I64)
    check(backend, "ReverseSequence", [x, lens], opset=10, attrs={"batch_axis": batch_axis, "time_axis": time_axis})


# --- Einsum ----------------------------------------------------------------------------------------

EINSUM = {
    "matmul": ("ij,jk->ik", [(3, 4), (4, 5)]),
    "batch-matmul": ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    "bert-attn": ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    "transpose": ("ij->ji", [(3, 4)]),
    "sum-all": ("ij->", [(3, 4)]),
    "implicit": ("ij,jk", [(3, 4), (4, 2)]),
    "diag": ("ii->i", [(4, 4)]),
    "trace": ("ii", [(4, 4)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "dot": ("i,i->", [(5,), (5,)]),
    "ellipsis": ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    "three": ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    "broadcast-batch": ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]),
}


@pytest.mark.parametrize("case", list(EINSUM))
def test_einsum(backend, case):
    eq, shapes = EINSUM[case]
    check(backend, "Einsum", [randn(*s, seed=i) for i, s in enumerate(shapes)], opset=12, attrs={"equation": eq},
          rtol=1e-4, atol=1e-4)


def test_einsum_int(backend):
    check(backend, "Einsum", [DATA["i32"](3, 4), DATA["i32"](4, 2)], opset=12, attrs={"equation": "ij,jk->ik"})


def test_einsum_bad_equation():
    expect_error(InvalidModel, "Einsum", [randn(3, 4)], opset=12, attrs={"equation": "ijk->i"}, mentions=["rank"])


# --- operands fed at run time: the model specializes on their values (glowpy.importer.specialize) ------

RUNTIME_OPERANDS = {
    "Range": ([np.array(0, I64), np.array(5, I64), np.array(1, I64)], 11, {}, 1),
    "CumSum": ([randn(3, 4), np.array(1, I64)], 14, {}, 1),
    "TopK": ([randn(3, 4), np.array([2], I64)], 11, {}, 2),
    "OneHot": ([np.array([1, 0, 2], I64), np.array(3, I64), np.array([0, 1], np.float32)], 11, {}, 1),
}


@pytest.mark.parametrize("op", list(RUNTIME_OPERANDS))
def test_runtime_operand_specializes(backend, op):
    """Range's bounds, CumSum's axis, TopK's K, OneHot's depth as graph inputs: compiled per value."""
    ins, opset, attrs, outs = RUNTIME_OPERANDS[op]
    check(backend, op, ins, opset=opset, attrs=attrs, outputs=outs)


# --- refusals ------------------------------------------------------------------------------------

VALUE_SHAPED = {
    "NonZero": ([randn(3, 4)], 9, 1),
    "Unique": ([randn(6)], 11, 1),
    "Compress": ([randn(3, 4), np.array([True, False, True])], 11, 1),
    "NonMaxSuppression": ([randn(1, 4, 4), randn(1, 1, 4)], 11, 1),
}


@pytest.mark.parametrize("op", list(VALUE_SHAPED))
def test_value_shaped_ops_refused(op):
    """The full import and the check both refuse, saying why."""
    ins, opset, outs = VALUE_SHAPED[op]
    err = expect_error(UnsupportedShape, op, ins, opset=opset, outputs=outs,
                       mentions=[f"the output shape of {op} depends on input values"])
    model, _ = node_model(op, ins, opset=opset, outputs=outs)
    assert "depends on input values" in glowpy.check(model, backend="cpu").reason
    assert err.op == op


# --- bad input -----------------------------------------------------------------------------------

OUT_OF_RANGE = {
    "GatherElements": ([randn(3, 4), Const(np.array([[0, 4]], I64))], {"axis": 1}),
    "GatherND": ([randn(3, 4), Const(np.array([[2, -5]], I64))], {}),
    "ScatterND": ([randn(3, 4), Const(np.array([[3]], I64)), randn(1, 4)], {}),
    "ScatterElements": ([randn(3, 4), Const(np.array([[-4]], I64)), randn(1, 1)], {}),
}


@pytest.mark.parametrize("op", list(OUT_OF_RANGE))
def test_constant_index_out_of_range(op):
    ins, attrs = OUT_OF_RANGE[op]
    expect_error(InvalidModel, op, ins, opset=13, attrs=attrs, mentions=["index out of range"])


def test_runtime_index_out_of_range_gathers_zero(backend):
    x = randn(3, 4)
    model, _ = node_model("GatherElements", [x, np.zeros((3, 2), I64)], opset=13, attrs={"axis": 1})
    i = np.array([[0, 4], [-5, 3], [-1, 99]], I64)
    got = glowpy.compile(model, backend=backend).run({"in0": x, "in1": i})["out0"]
    want = np.array([[x[0, 0], 0], [0, x[1, 3]], [x[2, 3], 0]], np.float32)
    np.testing.assert_array_equal(got, want)
    model, _ = node_model("GatherND", [x, np.zeros((2, 1), I64)], opset=13)
    got = glowpy.compile(model, backend=backend).run({"in0": x, "in1": np.array([[1], [3]], I64)})["out0"]
    np.testing.assert_array_equal(got, np.stack([x[1], np.zeros(4, np.float32)]))


def test_runtime_index_out_of_range_scatter_dropped(backend):
    x, u = randn(3, 4), randn(2, 4, seed=1)
    model, _ = node_model("ScatterND", [x, np.zeros((2, 1), I64), u], opset=13)
    got = glowpy.compile(model, backend=backend).run({"in0": x, "in1": np.array([[7], [1]], I64), "in2": u})["out0"]
    want = x.copy()
    want[1] = u[1]
    np.testing.assert_array_equal(got, want)
    model, _ = node_model("ScatterElements", [x, np.zeros((1, 2), I64), u[:1, :2]], opset=13, attrs={"axis": 1})
    feeds = {"in0": x, "in1": np.array([[-9, 2]], I64), "in2": u[:1, :2]}
    got = glowpy.compile(model, backend=backend).run(feeds)["out0"]
    want = x.copy()
    want[0, 2] = u[0, 1]
    np.testing.assert_array_equal(got, want)


def test_bad_reduction():
    expect_error(UnsupportedAttribute, "ScatterND", [randn(3, 4), Const(np.array([[1]], I64)), randn(1, 4)],
                 opset=18, attrs={"reduction": "avg"}, mentions=["reduction"])


def test_reduction_before_its_opset():
    expect_error(UnsupportedAttribute, "ScatterElements", [randn(3, 4), Const(np.array([[1]], I64)), randn(1, 1)],
                 opset=16, attrs={"reduction": "max"}, mentions=["reduction", "18"])


def test_bad_batch_dims():
    expect_error(UnsupportedAttribute, "GatherND", [randn(3, 4), Const(np.array([[1]], I64))], opset=13,
                 attrs={"batch_dims": 2}, mentions=["batch_dims"])


def test_bad_axis():
    expect_error(UnsupportedAttribute, "GatherElements", [randn(3, 4), Const(np.array([[1]], I64))], opset=13,
                 attrs={"axis": 2}, mentions=["axis"])


def test_unknown_attribute():
    expect_error(UnsupportedAttribute, "GatherND", [randn(3, 4), Const(np.array([[1]], I64))], opset=13,
                 attrs={"mode": 1}, mentions=["'mode'"])


def test_malformed_updates_shape():
    from glowpy.errors import MismatchingShape

    expect_error(MismatchingShape, "ScatterND", [randn(3, 4), Const(np.array([[1]], I64)), randn(1, 3)], opset=13,
                 mentions=["updates"])


def test_gather_nd_avx2_build():
    """The memcpy'd slices build for an AVX2 target too, with the same results."""
    from glowpy.backends.cpu.target import isa_available

    if not isa_available("avx2"):
        pytest.skip("host has no AVX2")
    x = randn(4, 3, 16)
    model, feeds = node_model("GatherND", [x, np.array([[3, 1], [0, 2], [-1, 0]], I64)], opset=13)
    got = glowpy.compile(model, backend="cpu", isa="avx2", cache=False).run(feeds)["out0"]
    np.testing.assert_array_equal(got, np.stack([x[3, 1], x[0, 2], x[3, 0]]))


# Big enough that the cpu backend splits the kernels across threads (lowering.PARALLEL_MIN_WORK).
THREADED = {
    "GatherElements": ([randn(64, 1100), idx(64, 1100, high=1100, seed=7)], {"axis": 1}, 13),
    "GatherND": ([randn(300, 256), idx(400, 1, high=300, seed=8)], {}, 13),
    "CumSum": ([randn(70, 1000), scalar(0)], {"reverse": 1}, 14),
    "TopK": ([randn(300, 240), ints(5)], {}, 11),
    "OneHot": ([idx(300, high=250, seed=9), scalar(250), np.array([0.0, 1.0], np.float32)], {}, 11),
    "ReverseSequence": ([randn(50, 8, 200), randint(8, low=0, high=51, seed=10)], {}, 10),
    "ScatterElements": ([randn(300, 250), idx(300, 2, high=250, seed=11), randn(300, 2)], {"axis": 1}, 13),
}


@pytest.mark.parametrize("op", list(THREADED))
def test_threaded_cpu(op):
    """The split across threads covers every line once (two threads; the interpreter is the oracle)."""
    ins, attrs, opset = THREADED[op]
    model, feeds = node_model(op, ins, opset=opset, attrs=attrs, outputs=2 if op == "TopK" else 1)
    want = glowpy.compile(model, backend="interpreter").run(feeds)
    got = glowpy.compile(model, backend="cpu", threads=2).run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-4, err_msg=f"{op} {name}")


# --- Det -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 22])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (1, 1)])
def test_det(backend, opset, shape):
    check(backend, "Det", [randn(*shape)], opset=opset, rtol=1e-4, atol=1e-5)


def test_det_singular(backend):
    x = np.array([[[1, 2, 3], [2, 4, 6], [0, 1, 1]], [[0, 1, 0], [1, 0, 0], [0, 0, 2]]], np.float32)
    check(backend, "Det", [x], opset=22)


def test_gather_nd_rows_too_long():
    from glowpy.errors import MismatchingShape

    expect_error(MismatchingShape, "GatherND", [randn(3, 4), Const(np.array([[1, 2, 0]], I64))], opset=13,
                 mentions=["indices"])


NEWEST = {
    "OneHot": ([np.array([[1, -2]], I64), scalar(4), np.array([0.0, 1.0], np.float32)], {"axis": 1}, 28),
    "ReverseSequence": ([randn(4, 3, 2), np.array([2, 4, 1], I64)], {}, 28),
    "DepthToSpace": ([randn(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, 28),
    "SpaceToDepth-DCR": ([randn(1, 3, 4, 6)], {"blocksize": 2, "mode": "DCR"}, 28),
    "SpaceToDepth-CRD": ([randn(1, 3, 4, 6)], {"blocksize": 2, "mode": "CRD"}, 28),
    "Einsum": ([randn(2, 3, 4), randn(2, 4, 5)], {"equation": "bij,bjk->bik"}, 28),
    "Range": ([scalar(2.0, np.float32), scalar(-1.0, np.float32), scalar(-0.5, np.float32)], {}, 27),
    "TopK": ([randn(3, 5), ints(2)], {"largest": 0}, 24),
}


@pytest.mark.parametrize("case", list(NEWEST))
def test_newest_opsets(backend, case):
    ins, attrs, opset = NEWEST[case]
    op = case.split("-")[0]
    check(backend, op, ins, opset=opset, attrs=attrs, outputs=2 if op == "TopK" else 1, rtol=1e-4, atol=1e-4)
