"""Attention-path kernels on cpu against onnx's reference evaluator and the interpreter: the vectorized
last-axis Softmax (kernels/norm.py emit_softmax_rows): row lengths below, at and past a vector, masked
(-inf) scores, rows of NaN and of only -inf, 1 and 2 threads, host ISA and AVX2."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.backends.cpu.target import isa_available

F32 = np.float32
ISAS = ["host"] + (["avx2"] if isa_available("avx2") else [])


def _softmax_model(shape, axis=-1, opset=13):
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], "sm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _run(model, x, isa, threads):
    return glowpy.compile(model, backend="cpu", threads=threads, isa=isa, cache=False).run({"x": x})["y"]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 16), (1, 4, 7, 37), (2, 130)], ids=str)
def test_softmax_last_axis(shape, isa: str) -> None:
    x = (np.random.default_rng(0).standard_normal(shape) * 4).astype(F32)
    model = _softmax_model(shape)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    interp = glowpy.compile(model, backend="interpreter").run({"x": x})["y"]
    np.testing.assert_allclose(interp, want, rtol=1e-6, atol=1e-7)
    for threads in (1, 2):
        got = _run(model, x, isa, threads)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, err_msg=f"threads={threads}")
        np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_softmax_masked_and_special_rows(isa: str) -> None:
    """-inf scores (an attention mask) give exact zeros, and so do finite mask values (finfo.min, -1e4,
    -100: exp below the smallest normal float is 0, never a subnormal); a NaN row and an all -inf row
    give NaN, like the reference; large finite scores do not overflow."""
    x = np.random.default_rng(1).standard_normal((7, 21)).astype(F32)
    x[0, ::3] = -np.inf
    x[1, 5] = np.nan
    x[2, :] = -np.inf
    x[3, :] = np.finfo(F32).min
    x[4, 2] = 1e30
    x[5, 17:] = -np.inf
    x[6, 1:4], x[6, 9], x[6, 10] = np.finfo(F32).min, -1e4, -100.0
    model = _softmax_model(x.shape, opset=18)
    with np.errstate(invalid="ignore"):
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = _run(model, x, isa, 1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=2e-6, atol=1e-7)
    assert np.all(got[0, ::3] == 0) and np.all(got[5, 17:] == 0)
    assert np.all(got[6, [1, 2, 3, 9, 10]] == 0)
    tiny = got[np.isfinite(got) & (got != 0)]
    assert np.all(np.abs(tiny) >= np.finfo(F32).tiny), "subnormal probabilities"


def test_softmax_other_axis_keeps_the_generic_kernel() -> None:
    x = np.random.default_rng(2).standard_normal((2, 9, 5)).astype(F32)
    model = _softmax_model(x.shape, axis=1)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(_run(model, x, "host", 2), want, rtol=2e-6, atol=1e-7)
