"""Element types: bfloat16 (computed in float32) and the storage types (float8, float4, float8e8m0, int4,
uint4, int2, uint2) through Cast / CastLike and the movement ops, bit for bit against the reference
evaluator (ml_dtypes), with NaN, infinities, overflow and subnormals among the values."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.errors import UnsupportedAttribute
from tools.conformance import cast_defined

from .util import Const, assert_compat_agrees, expect_error, node_model, run_oracle

TP = TensorProto
LOWFLOAT = ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT4E2M1")
SUBBYTE = ("INT4", "UINT4", "INT2", "UINT2")
STORAGE = (*LOWFLOAT, "FLOAT8E8M0", *SUBBYTE)
BF16 = np.dtype(ml_dtypes.bfloat16)


def np_type(name: str) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(getattr(TP, name)))


def bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def edge_values(dtype=np.float32) -> np.ndarray:
    """Specials, ties, overflow and subnormal magnitudes of every target format, and random bit patterns."""
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.5, 0.5, 448.0, 464.0, 480.0, 57344.0, 61440.0,
               6.0, 5.0, 7.0, -9.0, 100.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -17, 2.0 ** -127, 1e30,
               2.0 ** 31 + 5, -2.0 ** 31, 0.25, 0.75, 1.0625, 1.125 + 2.0 ** -5, 3.5, 2.5, -2.5, 1e-45]
    rnd = np.random.default_rng(0).integers(0, 2 ** 32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    near = (np.random.default_rng(1).standard_normal(1000) * 40).astype(np.float32)
    x = np.concatenate([np.array(special, np.float64).astype(np.float32), rnd, near])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return x.astype(dtype)


def all_codes(name: str) -> np.ndarray:
    dt = np_type(name)
    if name in SUBBYTE:
        info = ml_dtypes.iinfo(dt)
        return np.arange(int(info.min), int(info.max) + 1).astype(dt)
    n = 16 if name == "FLOAT4E2M1" else 256
    return np.arange(n, dtype=np.uint8).view(dt)




def defined_for(x: np.ndarray, to: str) -> np.ndarray:
    """The elements of `x` whose cast to `to` ONNX defines (tools.conformance.cast_defined)."""
    mask = cast_defined(x, np_type(to))
    return x if mask is None else x[mask]


def check_bits(backend: str, op: str, inputs, *, opset: int, attrs: dict | None = None) -> None:
    """One node on glowpy and the reference: same dtype, shape and bits; the check agrees it compiles."""
    model, feeds = node_model(op, inputs, opset=opset, attrs=attrs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = run_oracle(model, feeds)[0]
    assert_compat_agrees(model, backend, None)
    got = glowpy.compile(model, backend=backend).run(feeds)["out0"]
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = np.flatnonzero(bits(got).ravel() != bits(want).ravel())
    src = np.asarray(inputs[0].array if isinstance(inputs[0], Const) else inputs[0]).ravel()
    assert bad.size == 0, f"{op} {attrs}: {bad.size} differ, e.g. {src[bad[:4]]} -> {got.ravel()[bad[:4]]}, " \
                          f"reference {want.ravel()[bad[:4]]}"


# --- Cast to the storage types -------------------------------------------------------------------


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("to", [*LOWFLOAT, *SUBBYTE, "BFLOAT16"])
def test_cast_float_to(backend, to, saturate):
    check_bits(backend, "Cast", [defined_for(edge_values(), to)], opset=25,
               attrs={"to": getattr(TP, to), "saturate": saturate})


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_e8m0(backend, saturate, round_mode):
    check_bits(backend, "Cast", [edge_values()], opset=25,
               attrs={"to": TP.FLOAT8E8M0, "saturate": saturate, "round_mode": round_mode})


@pytest.mark.parametrize("src", ["DOUBLE", "FLOAT16", "BFLOAT16", "INT32", "INT8", "UINT8", "BOOL"])
@pytest.mark.parametrize("to", ["FLOAT8E4M3FN", "FLOAT8E5M2FNUZ", "FLOAT4E2M1", "INT4", "UINT2"])
def test_cast_other_sources(backend, src, to):
    x = edge_values(np.float64)
    if src in ("INT32", "INT8", "UINT8"):
        x = np.nan_to_num(x, nan=0, posinf=0, neginf=0).clip(-1e6, 1e6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = x.astype(np_type(src))
    check_bits(backend, "Cast", [defined_for(x, to)], opset=21, attrs={"to": getattr(TP, to)})


# --- Cast from the storage types ------------------------------------------------------------------


def _convertible(src: str, to: str) -> bool:
    """ml_dtypes (the reference) converts between the pair: not between two sub-byte integers, nor
    from float8e8m0 to one."""
    try:
        np.zeros(1, np_type(src)).astype(np_type(to))
    except TypeError:
        return False
    return src != to


FROM_PAIRS = [(s, t) for s in STORAGE for t in ("FLOAT", "DOUBLE", "FLOAT16", "BFLOAT16", "INT32", "INT8", "UINT8",
                                                 "BOOL", "FLOAT8E5M2", "INT4") if _convertible(s, t)]


@pytest.mark.parametrize("src,to", FROM_PAIRS)
def test_cast_from(backend, src, to):
    check_bits(backend, "Cast", [defined_for(all_codes(src), to)], opset=25, attrs={"to": getattr(TP, to)})


def test_castlike(backend):
    target = np.zeros(1, ml_dtypes.float8_e4m3fn)
    check_bits(backend, "CastLike", [edge_values(), target], opset=19, attrs={"saturate": 0})
    check_bits(backend, "CastLike", [all_codes("FLOAT8E5M2"), np.zeros(1, np.float32)], opset=21)


def test_cast_bad_round_mode():
    expect_error(UnsupportedAttribute, "Cast", [np.ones(3, np.float32)], opset=25,
                 attrs={"to": TP.FLOAT8E8M0, "round_mode": "sideways"}, mentions=["round_mode"])


# --- movement of storage types -------------------------------------------------------------------

MOVES = {
    "Transpose": ([], {"perm": [1, 0]}),
    "Identity": ([], {}),
    "Flatten": ([], {"axis": 0}),
    "Concat": (["x"], {"axis": 1}),
    "Reshape": ([Const(np.array([4, 4], np.int64))], {}),
    "Unsqueeze": ([Const(np.array([0], np.int64))], {}),
    "Slice": ([Const(np.array([1], np.int64)), Const(np.array([7], np.int64)), Const(np.array([1], np.int64)),
               Const(np.array([2], np.int64))], {}),
    "Gather": ([Const(np.array([3, 0, 1], np.int64))], {"axis": 1}),
}


@pytest.mark.parametrize("op", sorted(MOVES))
@pytest.mark.parametrize("dtype", ["FLOAT8E4M3FN", "FLOAT8E5M2", "INT4", "FLOAT4E2M1", "BFLOAT16"])
def test_movement(backend, op, dtype):
    x = edge_values()[:16].reshape(2, 8) if dtype == "BFLOAT16" else all_codes(dtype)[:16]
    x = np.resize(x, 16).reshape(2, 8).astype(np_type(dtype)) if dtype != "BFLOAT16" else x.astype(BF16)
    extra, attrs = MOVES[op]
    inputs = [x, *[x if e == "x" else e for e in extra]]
    check_bits(backend, op, inputs, opset=21, attrs=attrs)


def test_squeeze_storage(backend):
    check_bits(backend, "Squeeze", [all_codes("UINT4").reshape(1, 16), Const(np.array([0], np.int64))], opset=21)


def test_packed_int4_initializer(backend):
    """ONNX packs int4 initializers two per byte; glowpy holds one per byte after import."""
    vals = np.array([-8, -1, 0, 3, 7], ml_dtypes.int4)
    t = helper.make_tensor("w", TP.INT4, [5], vals.astype(np.int8).tolist())
    node = helper.make_node("Cast", ["w"], ["y"], to=TP.FLOAT)
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TP.FLOAT, [5])], initializer=[t])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    assert len(t.raw_data or t.int32_data) < 5 or numpy_helper.to_array(t).size == 5
    got = glowpy.compile(model, backend=backend).run({})["y"]
    np.testing.assert_array_equal(got, [-8, -1, 0, 3, 7])


# --- bfloat16 and float16 computed in float32 ----------------------------------------------------

COMPUTE = {
    "Add": 2, "Mul": 2, "Relu": 1, "Exp": 1, "Tanh": 1, "Greater": 2, "MatMul": 2, "Softmax": 1, "ReduceMax": 1,
    "Sqrt": 1,
}


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bf16", "f16"])
@pytest.mark.parametrize("op", sorted(COMPUTE))
def test_compute(backend, op, dtype):
    """One op rounds once: the float32 result rounded to the type, as the reference (ml_dtypes) rounds
    each elementwise op; exact except where the reference accumulates in the narrow type."""
    rng = np.random.default_rng(3)
    x = np.abs(rng.standard_normal((4, 4))) if op == "Sqrt" else rng.standard_normal((4, 4))
    inputs = [x.astype(np.float32).astype(dtype) for _ in range(COMPUTE[op])]
    model, feeds = node_model(op, inputs, opset=18)
    want = run_oracle(model, feeds)[0]
    assert_compat_agrees(model, backend, None)
    got = glowpy.compile(model, backend=backend).run(feeds)["out0"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
    if op in ("Add", "Mul", "Relu", "Greater", "ReduceMax"):
        np.testing.assert_array_equal(bits(got), bits(want))


def test_bfloat16_conv_weights(backend):
    """bfloat16 weights and input: the convolution runs in float32 between Casts."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32).astype(BF16)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32).astype(BF16)
    model, feeds = node_model("Conv", [x, Const(w)], opset=22, attrs={"pads": [1, 1, 1, 1]})
    want = run_oracle(model, feeds)[0]
    got = glowpy.compile(model, backend=backend).run(feeds)["out0"]
    assert got.dtype == BF16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=5e-2)
