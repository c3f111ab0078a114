"""BatchNormalization and per-channel Mul / Add folded into weights; Gemm / MatMul + Add into
FullyConnected."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.optimizer import (
    fold_batchnorm,
    fold_channel_affine,
    gemm_to_fully_connected,
    matmul_add_to_fully_connected,
)

from .util import G, LoweringBackend, apply, feeds_for, ops, run


@pytest.mark.parametrize("group", [1, 2])
def test_fold_batchnorm_into_conv(group: int) -> None:
    g = G()
    x = g.input("x", 1, 4, 6, 6)
    graph = g.ret(g("Relu", g.bn(g.conv(x, 6, group=group), eps=1e-3)))
    apply(fold_batchnorm, graph)
    assert ops(graph) == ["Conv", "Relu"]
    apply(fold_batchnorm, graph, expect=False)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (1, 5), (3, 5)])
def test_fold_batchnorm_into_gemm(trans_b: int, c_shape: tuple | None) -> None:
    g = G()
    x = g.input("x", 3, 4)
    b = g.weight(*((5, 4) if trans_b else (4, 5)))
    args = [x, b] + ([g.weight(*c_shape)] if c_shape is not None else [])
    y = g("Gemm", *args, alpha=0.5, beta=2.0, transB=trans_b)
    graph = g.ret(g.bn(y))
    apply(fold_batchnorm, graph)
    assert ops(graph) == ["Gemm"]


def test_fold_batchnorm_into_fully_connected() -> None:
    g = G()
    x = g.input("x", 3, 4)
    graph = g.ret(g.bn(g("FullyConnected", x, g.weight(4, 5), g.weight(5))))
    apply(fold_batchnorm, graph)
    assert ops(graph) == ["FullyConnected"]


def test_batchnorm_stays_when_conv_output_is_shared_or_has_epilogue() -> None:
    g = G()
    x = g.input("x", 1, 4, 6, 6)
    c = g.conv(x, 4)
    shared = g.bn(c), g("Relu", c)
    fused = g.bn(g.conv(x, 4, activation="relu"))
    graph = g.ret(*shared, fused)
    apply(fold_batchnorm, graph, expect=False)
    assert ops(graph).count("BatchNormalization") == 2


def test_fold_batchnorm_keeps_output_name() -> None:
    g = G()
    x = g.input("x", 1, 4, 6, 6)
    graph = g.ret(g.bn(g.conv(x, 4)))
    name = graph.outputs[0].name
    apply(fold_batchnorm, graph)
    assert graph.outputs[0].name == name


@pytest.mark.parametrize("op", ["Mul", "Add", "Sub", "Div"])
@pytest.mark.parametrize("const_shape", [(4, 1, 1), (1, 4, 1, 1), (1,), ()])
def test_fold_channel_affine_into_conv(op: str, const_shape: tuple) -> None:
    g = G()
    x = g.input("x", 1, 3, 5, 5)
    c = g.const(np.random.default_rng(3).uniform(0.5, 2, const_shape).astype(np.float32))
    graph = g.ret(g("Relu", g(op, g.conv(x, 4), c)))
    apply(fold_channel_affine, graph)
    assert ops(graph) == ["Conv", "Relu"]


def test_fold_channel_affine_constant_first() -> None:
    g = G()
    x = g.input("x", 1, 3, 5, 5)
    s, t = g.weight(4, 1, 1), g.weight(4, 1, 1)
    graph = g.ret(g("Add", t, g("Mul", s, g.conv(x, 4))))
    apply(fold_channel_affine, graph)
    assert ops(graph) == ["Conv"]


def test_fold_channel_affine_into_batchnorm_and_gemm() -> None:
    g = G()
    x, z = g.input("x", 1, 4, 3, 3), g.input("z", 2, 4)
    bn = g("Add", g("Mul", g.bn(g("Relu", x)), g.weight(4, 1, 1)), g.weight(4, 1, 1))
    gemm = g("Add", g("Mul", g("Gemm", z, g.weight(5, 4), transB=1), g.weight(5)), g.weight(1, 5))
    graph = g.ret(bn, gemm)
    apply(fold_channel_affine, graph)
    assert ops(graph) == ["Relu", "BatchNormalization", "Gemm"]
    assert len(graph.nodes[-1].inputs) == 3  # the Add became Gemm's C


def test_fold_channel_affine_leaves_other_shapes_alone() -> None:
    g = G()
    x = g.input("x", 1, 3, 5, 5)
    per_pixel = g("Mul", g.conv(x, 4), g.weight(5, 5))
    per_row = g("Add", g.conv(x, 4), g.weight(4, 5, 1))
    runtime_scale = g("Mul", g.conv(x, 4), g.input("s", 1, 4, 1, 1))
    graph = g.ret(per_pixel, per_row, runtime_scale)
    apply(fold_channel_affine, graph, expect=False)


def test_conv_with_residual_takes_add_but_not_mul() -> None:
    g = G()
    x = g.input("x", 1, 4, 5, 5)
    c = g.conv(x, 4)
    w, b = c.producer.inputs[1:]
    res = g("Conv", x, w, b, x, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1))
    graph = g.ret(g("Mul", g("Add", res, g.weight(4, 1, 1)), g.weight(4, 1, 1)), c)
    apply(fold_channel_affine, graph)
    assert ops(graph) == ["Conv", "Conv", "Mul"]


def _bn_scale_model() -> onnx.ModelProto:
    """densenet121 / inception_v2 style: Conv -> BN -> Mul / Add by Unsqueezed per-channel params -> Relu."""
    rng = np.random.default_rng(0)

    def init(name: str, *shape: int, pos: bool = False) -> onnx.TensorProto:
        a = rng.uniform(0.5, 1.5, shape) if pos else rng.standard_normal(shape)
        return numpy_helper.from_array(a.astype(np.float32), name)

    inits = [init("w", 8, 3, 3, 3), init("s", 8, pos=True), init("b", 8), init("m", 8), init("v", 8, pos=True),
             init("ms", 8, pos=True), init("ab", 8), numpy_helper.from_array(np.array([1, 2], np.int64), "axes")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
        helper.make_node("Unsqueeze", ["ms", "axes"], ["ms3"]),
        helper.make_node("Unsqueeze", ["ab", "axes"], ["ab3"]),
        helper.make_node("Mul", ["bn", "ms3"], ["mul"]),
        helper.make_node("Add", ["mul", "ab3"], ["add"]),
        helper.make_node("Relu", ["add"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "bn_scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_bn_mul_add_relu_becomes_one_conv() -> None:
    graph = glowpy.load(_bn_scale_model())
    opt = glowpy.optimize(graph)
    assert ops(opt) == ["Conv"]
    assert opt.nodes[0].attrs["activation"] == "relu" and opt.outputs[0].name == "y"
    feeds = feeds_for(graph)
    np.testing.assert_allclose(run(opt, feeds)[0], run(graph, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (6,), (1, 6)])
def test_gemm_to_fully_connected(trans_b: int, c_shape: tuple | None) -> None:
    g = G()
    x = g.input("x", 2, 4)
    b = g.weight(*((6, 4) if trans_b else (4, 6)))
    args = [x, b] + ([g.weight(*c_shape)] if c_shape is not None else [])
    graph = g.ret(g("Gemm", *args, alpha=1.5, beta=0.5, transB=trans_b, activation="relu"))
    apply(gemm_to_fully_connected, graph)
    (fc,) = graph.nodes
    assert fc.op == "FullyConnected" and fc.attrs["activation"] == "relu"
    assert fc.inputs[1].shape == (4, 6) and fc.inputs[2].shape == (6,)


def test_gemm_stays_gemm_when_not_expressible_or_backend_declines() -> None:
    g = G()
    x, wx = g.input("x", 2, 4), g.input("wx", 4, 6)
    trans_a = g("Gemm", g.input("xt", 4, 2), g.weight(4, 6), transA=1)
    full_c = g("Gemm", x, g.weight(4, 6), g.weight(2, 6))
    runtime_b = g("Gemm", x, wx)
    graph = g.ret(trans_a, full_c, runtime_b)
    apply(gemm_to_fully_connected, graph, expect=False)
    g2 = G()
    x = g2.input("x", 2, 4)
    graph = g2.ret(g2("Gemm", x, g2.weight(4, 6)))
    apply(gemm_to_fully_connected, graph, backend=LoweringBackend(unsupported=["FullyConnected"]), expect=False)
    apply(gemm_to_fully_connected, graph, backend=LoweringBackend(lower=["FullyConnected"]), expect=False)
    apply(gemm_to_fully_connected, graph, backend=LoweringBackend())
    assert ops(graph) == ["FullyConnected"]


@pytest.mark.parametrize("swap", [False, True])
def test_matmul_add_to_fully_connected(swap: bool) -> None:
    g = G()
    x = g.input("x", 3, 4)
    mm, c = g("MatMul", x, g.weight(4, 5)), g.weight(1, 5)
    graph = g.ret(g("Relu", g("Add", *((c, mm) if swap else (mm, c)))))
    apply(matmul_add_to_fully_connected, graph)
    assert ops(graph) == ["FullyConnected", "Relu"]
    assert graph.nodes[0].inputs[2].shape == (5,)


def test_matmul_add_stays_when_not_a_dense_layer() -> None:
    g = G()
    x3, x = g.input("x3", 2, 3, 4), g.input("x", 3, 4)
    batched = g("Add", g("MatMul", x3, g.weight(4, 5)), g.weight(5))
    runtime_w = g("Add", g("MatMul", x, g.input("wx", 4, 5)), g.weight(5))
    per_row = g("Add", g("MatMul", x, g.weight(4, 5)), g.weight(3, 1))
    graph = g.ret(batched, runtime_w, per_row)
    apply(matmul_add_to_fully_connected, graph, expect=False)
    assert ops(graph).count("MatMul") == 3
