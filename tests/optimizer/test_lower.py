"""Lowerings, each checked against the interpreter on the original op."""

from __future__ import annotations

import numpy as np
import pytest

import glowpy
from glowpy.optimizer import LOWERINGS, lower_nodes

from .util import G, LoweringBackend, apply, feeds_for, ops, run

SIMPLE = {"Relu", "Add", "Sub", "Mul", "Div", "Exp", "Log", "Sqrt", "Erf", "Tanh", "Pow", "ReduceMean", "ReduceMax",
          "ReduceSum", "Reshape", "Transpose", "MatMul", "AveragePool", "Clip", "LeakyRelu", "Sigmoid", "Neg"}


def _lowered(graph, op: str, rtol: float = 1e-5, atol: float = 1e-5):
    apply(lower_nodes, graph, backend=LoweringBackend(lower=[op]), rtol=rtol, atol=atol)
    assert op not in ops(graph)
    assert set(ops(graph)) <= SIMPLE, ops(graph)
    return graph


@pytest.mark.parametrize("axis", [1, -1, 0])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_lower_softmax(op: str, axis: int) -> None:
    g = G()
    x = g.input("x", 3, 4, 5)
    _lowered(g.ret(g(op, x, axis=axis, name="y")), op)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("axis", [-1, 1])
def test_lower_layer_norm(axis: int, bias: bool) -> None:
    g = G()
    x = g.input("x", 2, 3, 4)
    shape = (3, 4) if axis == 1 else (4,)
    args = [x, g.weight(*shape)] + ([g.weight(*shape)] if bias else [])
    _lowered(g.ret(g("LayerNormalization", *args, axis=axis, epsilon=1e-3)), "LayerNormalization", rtol=1e-4,
             atol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_lower_gelu(approximate: str) -> None:
    g = G()
    x = g.input("x", 4, 7)
    _lowered(g.ret(g("Gelu", x, approximate=approximate)), "Gelu", rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(2, 7, 4, 3), (1, 6, 5)])
def test_lower_lrn(size: int, shape: tuple) -> None:
    g = G()
    x = g.input("x", *shape)
    _lowered(g.ret(g("LRN", x, size=size, alpha=0.05, beta=0.75, bias=2.0)), "LRN", rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rank", [2, 4])
def test_lower_batchnorm_with_constant_params(rank: int) -> None:
    g = G()
    x = g.input("x", *(2, 3, 4, 5)[:rank])
    graph = _lowered(g.ret(g.bn(g("Relu", x))), "BatchNormalization")
    assert ops(graph) == ["Relu", "Mul", "Add"]


def test_lower_batchnorm_with_runtime_params() -> None:
    g = G()
    x, var = g.input("x", 2, 3, 4), g.input("var", 3)
    graph = g.ret(g("BatchNormalization", x, g.weight(3), g.weight(3), g.weight(3), g("Exp", var)))
    _lowered(graph, "BatchNormalization")


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("const_b", [True, False])
@pytest.mark.parametrize("c", [None, "const", "input"])
def test_lower_gemm(trans_a: int, trans_b: int, const_b: bool, c: str | None) -> None:
    g = G()
    a = g.input("a", *((4, 3) if trans_a else (3, 4)))
    bshape = (5, 4) if trans_b else (4, 5)
    b = g.weight(*bshape) if const_b else g.input("b", *bshape)
    args = [a, b] + ([g.weight(5)] if c == "const" else [g.input("c", 3, 5)] if c == "input" else [])
    graph = g.ret(g("Gemm", *args, alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b, activation="clip",
                    activation_params=(-0.5, 0.5)))
    graph = _lowered(graph, "Gemm")
    assert ops(graph).count("Transpose") == trans_a + (trans_b and not const_b)
    assert "Clip" in ops(graph)


def test_every_lowering_is_tested() -> None:
    assert set(LOWERINGS) == {"Softmax", "LogSoftmax", "LayerNormalization", "Gelu", "LRN", "BatchNormalization",
                              "Gemm", "If", "Loop", "Scan"}  # control flow: tests/test_control_flow.py


def test_nothing_lowered_for_the_interpreter_or_without_backend() -> None:
    g = G()
    x = g.input("x", 2, 5)
    graph = g.ret(g("Softmax", x))
    apply(lower_nodes, graph, expect=False)
    from glowpy.backends.interpreter import InterpreterBackend

    apply(lower_nodes, graph, backend=InterpreterBackend(), expect=False)


def test_pipeline_lowers_what_the_backend_asks_for() -> None:
    """Through glowpy.optimize: a Gemm with constant B becomes FullyConnected before lowering is
    considered; with FullyConnected lowered too, it ends as MatMul + Add; unfoldable BN becomes
    Mul + Add whose constants are folded."""
    g = G()
    x, z = g.input("x", 2, 4), g.input("z", 1, 3, 4, 4)
    gemm = g("Gemm", x, g.weight(6, 4), g.weight(6), transB=1)
    bn = g.bn(g("Relu", z))
    graph = g.ret(g("Softmax", gemm), bn)
    feeds = feeds_for(graph)
    want = run(graph, feeds)
    keep_fc = glowpy.optimize(graph, LoweringBackend(lower=["Gemm", "Softmax", "BatchNormalization"]))
    assert sorted(ops(keep_fc)) == sorted(["FullyConnected", "ReduceMax", "Sub", "Exp", "ReduceSum", "Div", "Relu",
                                           "Mul", "Add"])
    no_fc = glowpy.optimize(graph, LoweringBackend(lower=["Gemm", "FullyConnected"]))
    assert sorted(ops(no_fc)) == sorted(["MatMul", "Add", "Softmax", "Relu", "BatchNormalization"])
    for opt in (keep_fc, no_fc):
        for got, exp in zip(run(opt, feeds), want):
            np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)
