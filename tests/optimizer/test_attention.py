"""Transformer patterns (glowpy/optimizer/attention.py): GELU arithmetic -> Gelu, batched MatMul + bias ->
FullyConnected with the bias (and the GELU) in its epilogue. Each rewritten model runs on the
interpreter and the cpu backend (host ISA and AVX2) against onnx's reference evaluator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.backends.cpu.target import isa_available
from glowpy.pipeline import optimized_graph

F32 = np.float32
ISAS = ["host"] + (["avx2"] if isa_available("avx2") else [])


class _M:
    """A tiny ONNX graph builder: named nodes, scalar constants, one input x."""

    def __init__(self, x_shape):
        self.nodes, self.inits, self.x_shape, self.n = [], [], x_shape, 0

    def c(self, value, shape=()):
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.full(shape, value, F32), name))
        return name

    def __call__(self, op, *ins, **attrs):
        self.n += 1
        out = f"{op.lower()}{self.n}"
        self.nodes.append(helper.make_node(op, list(ins), [out], **attrs))
        return out

    def model(self, out):
        self.nodes.append(helper.make_node("Identity", [out], ["y"]))
        g = helper.make_graph(self.nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, self.x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _linear(m: _M, x: str, k: int, n: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    w = f"w{len(m.inits)}"
    m.inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) / math.sqrt(k)).astype(F32), w))
    b = f"b{len(m.inits)}"
    m.inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(F32), b))
    return m("Add", m("MatMul", x, w), b)


def _erf_gelu(m: _M, x: str, form: int) -> str:
    arg = m("Div", x, m.c(math.sqrt(2.0))) if form % 2 == 0 else m("Mul", m.c(1 / math.sqrt(2.0)), x)
    s = m("Add", m("Erf", arg), m.c(1.0))
    if form == 0:  # x * (0.5 * s): torch.onnx dynamo
        return m("Mul", x, m("Mul", m.c(0.5), s))
    if form == 1:  # (0.5 * x) * s
        return m("Mul", m("Mul", x, m.c(0.5)), s)
    return m("Mul", m("Mul", x, s), m.c(0.5))  # (x * s) * 0.5


def _tanh_gelu(m: _M, x: str, cube_as_pow: bool) -> str:
    cube = m("Pow", x, m.c(3.0)) if cube_as_pow else m("Mul", m("Mul", x, x), x)
    inner = m("Mul", m.c(math.sqrt(2.0 / math.pi)), m("Add", x, m("Mul", m.c(0.044715), cube)))
    s = m("Add", m.c(1.0), m("Tanh", inner))
    return m("Mul", m("Mul", m.c(0.5), x), s)


def _check(model, feeds, isa="host") -> None:
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    interp = glowpy.compile(model, backend="interpreter").run(feeds)["y"]
    np.testing.assert_allclose(interp, want, rtol=1e-5, atol=1e-5)
    got = glowpy.compile(model, backend="cpu", threads=2, isa=isa, cache=False).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5, err_msg=f"isa={isa}")


def _ops(graph) -> list[str]:
    return [n.op for n in graph.nodes if n.op not in ("Reshape", "Identity")]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("form", [0, 1, 2], ids=["x*(0.5*s)", "(0.5*x)*s", "(x*s)*0.5"])
def test_erf_gelu_of_linear_is_one_fully_connected(form: int, isa: str) -> None:
    m = _M([1, 9, 40])
    model = m.model(_erf_gelu(m, _linear(m, "x", 40, 70), form))
    g = optimized_graph(model, "cpu")
    assert _ops(g) == ["FullyConnected"]
    (fc,) = [n for n in g.nodes if n.op == "FullyConnected"]
    assert fc.attrs["activation"] == "gelu" and tuple(fc.attrs["activation_params"]) == ("none",)
    feeds = {"x": (np.random.default_rng(1).standard_normal((1, 9, 40)) * 2).astype(F32)}
    _check(model, feeds, isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cube_as_pow", [True, False], ids=["pow", "mul"])
def test_tanh_gelu_of_linear(cube_as_pow: bool, isa: str) -> None:
    m = _M([2, 5, 33])
    model = m.model(_tanh_gelu(m, _linear(m, "x", 33, 20), cube_as_pow))
    g = optimized_graph(model, "cpu")
    assert _ops(g) == ["FullyConnected"]
    assert [tuple(n.attrs["activation_params"]) for n in g.nodes if n.op == "FullyConnected"] == [("tanh",)]
    _check(model, {"x": np.random.default_rng(2).standard_normal((2, 5, 33)).astype(F32)}, isa)


def test_gelu_of_an_input_becomes_gelu_and_bias_only_matmul_stays() -> None:
    """No producer to fuse into: the pattern still becomes one Gelu node (the vector emitter, not libm erf)."""
    m = _M([3, 4, 8])
    model = m.model(_erf_gelu(m, "x", 0))
    assert _ops(optimized_graph(model, "cpu")) == ["Gelu"]
    _check(model, {"x": np.random.default_rng(3).standard_normal((3, 4, 8)).astype(F32)})


def test_near_miss_patterns_are_left_alone() -> None:
    """0.4 instead of 0.5, or a shared intermediate: not GELU."""
    m = _M([2, 8])
    arg = m("Div", "x", m.c(math.sqrt(2.0)))
    s = m("Add", m("Erf", arg), m.c(1.0))
    model = m.model(m("Mul", "x", m("Mul", m.c(0.4), s)))
    assert "Gelu" not in _ops(optimized_graph(model, "cpu"))
    m2 = _M([2, 8])
    arg = m2("Div", "x", m2.c(math.sqrt(2.0)))
    erf = m2("Erf", arg)
    s = m2("Add", erf, m2.c(1.0))
    model2 = m2.model(m2("Add", m2("Mul", "x", m2("Mul", m2.c(0.5), s)), erf))
    assert "Gelu" not in _ops(optimized_graph(model2, "cpu"))
    _check(model2, {"x": np.random.default_rng(4).standard_normal((2, 8)).astype(F32)})


@pytest.mark.parametrize("isa", ISAS)
def test_batched_matmul_bias_is_fully_connected(isa: str) -> None:
    """[B, S, K] x [K, N] + bias[N] (and a bias of shape [1, 1, N]) -> one FullyConnected between Reshapes."""
    m = _M([2, 7, 300])
    h = _linear(m, "x", 300, 24)
    w = numpy_helper.from_array(np.random.default_rng(5).standard_normal((24, 16)).astype(F32), "w2")
    m.inits.append(w)
    h2 = m("Add", m.c(0.25, (1, 1, 16)), m("MatMul", h, "w2"))
    model = m.model(m("Relu", h2))
    g = optimized_graph(model, "cpu")
    assert _ops(g) == ["FullyConnected", "FullyConnected"]
    assert [n.attrs["activation"] for n in g.nodes if n.op == "FullyConnected"] == ["none", "relu"]
    _check(model, {"x": np.random.default_rng(6).standard_normal((2, 7, 300)).astype(F32)}, isa)


def test_bias_along_another_axis_is_not_folded() -> None:
    m = _M([2, 3, 4])
    m.inits.append(numpy_helper.from_array(np.ones((4, 5), F32), "w"))
    model = m.model(m("Add", m("MatMul", "x", "w"), m.c(1.0, (1, 3, 1))))
    assert _ops(optimized_graph(model, "cpu")) == ["MatMul", "Add"]
    _check(model, {"x": np.random.default_rng(7).standard_normal((2, 3, 4)).astype(F32)})
