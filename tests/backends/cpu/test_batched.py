"""Batched matrix products (kernels/batched.py) through the whole pipeline, against onnx's reference
evaluator and the interpreter: 2-D / 3-D / 4-D operands, constant and runtime B, broadcast batches,
edge tiles, K split into several reduction chunks, fused bias and activation, 1 and 2 threads, at the
host's vector width and at AVX2's."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.backends.cpu.kernels import batched
from glowpy.backends.cpu.target import host_target, isa_available

pytestmark = pytest.mark.heavy  # batched matrix products at many shapes: the suite's second step

F32 = np.float32
ISAS = ["host"] + (["avx2"] if isa_available("avx2") else [])


def _model(a_shape, b_shape, *, const_b: bool, bias: bool = False, relu: bool = False, seed: int = 0, opset=18):
    rng = np.random.default_rng(seed)
    k = a_shape[-1]
    b = (rng.standard_normal(b_shape) / np.sqrt(k)).astype(F32)
    inits, ins = [], [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
    if const_b:
        inits.append(numpy_helper.from_array(b, "b"))
    else:
        ins.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape))
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"])]
    last = "mm"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(b_shape[-1]).astype(F32), "c"))
        nodes.append(helper.make_node("Add", [last, "c"], ["biased"]))
        last = "biased"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["act"]))
        last = "act"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "bmm", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {"a": rng.standard_normal(a_shape).astype(F32)}
    if not const_b:
        feeds["b"] = b
    return model, feeds


def _check(model, feeds, isa: str, threads=(1, 2)) -> None:
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    interp = glowpy.compile(model, backend="interpreter").run(feeds)["y"]
    np.testing.assert_allclose(interp, want, rtol=1e-4, atol=1e-5)
    for nt in threads:
        got = glowpy.compile(model, backend="cpu", threads=nt, isa=isa, cache=False).run(feeds)["y"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, interp, rtol=1e-4, atol=1e-5, err_msg=f"isa={isa} threads={nt}")


CASES = [
    # (A shape, B shape): K below, at and past the chunk (one, two, and first + middle + last chunks)
    ((300,), (300, 17)),  # vector x matrix
    ((5, 300), (300,)),  # matrix x vector
    ((1, 7, 33), (33, 17)),
    ((2, 13, 512), (512, 40)),
    ((1, 9, 1000), (1000, 35)),
    ((21, 600), (600, 64)),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("const_b", [True, False], ids=["constB", "runtimeB"])
@pytest.mark.parametrize("a_shape,b_shape", CASES, ids=[f"{a}x{b}" for a, b in CASES])
def test_matmul_2d_weights(a_shape, b_shape, const_b: bool, isa: str) -> None:
    _check(*_model(a_shape, b_shape, const_b=const_b), isa)


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_bias_relu_epilogue(isa: str) -> None:
    """MatMul + per-column bias + Relu: bias and activation are the kernel's epilogue."""
    _check(*_model((1, 19, 300), (300, 50), const_b=True, bias=True, relu=True), isa)
    _check(*_model((19, 300), (300, 50), const_b=True, bias=True, relu=True), isa)


BATCHED = [
    ((1, 3, 20, 16), (1, 3, 16, 37)),  # Q K^T shaped
    ((2, 3, 17, 40), (2, 3, 40, 8)),  # P V shaped, N below one vector
    ((2, 3, 9, 300), (1, 3, 300, 33)),  # B broadcast over the leading batch dim, K in two chunks
    ((5, 4, 11), (5, 11, 6)),  # 3-D runtime operands
    ((3, 10, 64), (1, 64, 70)),  # B broadcast over A's batch
    ((1, 10, 64), (3, 64, 70)),  # A broadcast over B's batch
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("a_shape,b_shape", BATCHED, ids=[f"{a}x{b}" for a, b in BATCHED])
def test_matmul_batched_runtime(a_shape, b_shape, isa: str) -> None:
    _check(*_model(a_shape, b_shape, const_b=False), isa)


def test_reduction_is_chunked_for_precision() -> None:
    """K = 2048: chunked sums stay within 4e-6 of float64 here; one 2048-long fma chain was 9.6e-6."""
    model, feeds = _model((1, 128, 2048), (2048, 512), const_b=True, seed=3)
    got = glowpy.compile(model, backend="cpu", threads=1, cache=False).run(feeds)["y"]
    b = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    exact = feeds["a"].astype(np.float64) @ b
    assert np.abs(got - exact).max() < 4e-6
    assert batched.KC < 2048


def test_kernel_rejects_bad_shapes() -> None:
    from llvmlite import ir

    from glowpy.errors import InternalError, MismatchingShape

    mod = ir.Module("m")
    with pytest.raises(MismatchingShape, match="constant B does not match"):
        batched.emit_batched_gemm(mod, "k1", M=4, N=5, K=6, b=np.ones((5, 5), F32), vector_width=8)
    with pytest.raises(MismatchingShape, match="column bias"):
        batched.emit_batched_gemm(mod, "k2", M=4, N=5, K=6, bias=np.ones(4, F32), vector_width=8)
    with pytest.raises(InternalError, match="one batch stride"):
        batched.emit_batched_gemm(mod, "k3", M=4, N=5, K=6, batch=(2,), vector_width=8)


def test_row_bands_only_when_a_outgrows_the_cache() -> None:
    """Whisper's 1500 x 384 activations against 32-wide panels go in bands; ViT's 197 rows do not."""
    assert batched.row_bands(1500, 384, 1536, 8, 48) < 188
    assert batched.row_bands(197, 3072, 768, 8, 48) == 25
    assert batched.row_bands(197, 768, 3072, 8, 48) == 25


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("const_b,a_shape,b_shape", [
    (True, (1, 400, 300), (300, 600)),        # constant B, K in two chunks, a short last band
    (False, (2, 1, 300, 16), (2, 1, 16, 400)),  # runtime B per batch, bands within each batch
], ids=["constB", "runtimeB"])
def test_row_bands_give_the_same_bits(monkeypatch, const_b: bool, a_shape, b_shape, isa: str) -> None:
    """A walked in row bands (a small band budget forces several) gives the unbanded result bit for bit,
    on 1 to 3 threads (each model runs other feeds first, so an output a band misses cannot pass)."""
    model, feeds = _model(a_shape, b_shape, const_b=const_b, seed=5)
    plain = glowpy.compile(model, backend="cpu", threads=1, isa=isa, cache=False).run(feeds)["y"]
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    monkeypatch.setattr(batched, "A_BAND_BYTES", 4 * m * k // 3)
    vw = host_target(isa).vector_width
    mr, nv = batched.wide_tile(m, k, vw)
    assert batched.row_bands(m, n, k, mr, nv * vw) < -(-m // mr)
    other = {k: v + 1 for k, v in feeds.items()}
    for nt in (1, 2, 3):
        compiled = glowpy.compile(model, backend="cpu", threads=nt, isa=isa, cache=False)
        compiled.run(other)
        np.testing.assert_array_equal(compiled.run(feeds)["y"], plain, err_msg=f"threads={nt}")
