"""Every activation of the registry (glowpy/ir/activations.py) with a CPU emitter: the optimizer fuses it
into Conv and matrix-product epilogues, the fused kernels (tiled and plain) and the standalone
elementwise kernel agree with the interpreter, and the ONNX op imports and matches onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.activations import EMITTERS
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.activations import ACTIVATIONS
from glowpy.ir.graph import Graph
from glowpy.ir.ops import OPS
from glowpy.ir.types import TensorType

pytestmark = pytest.mark.heavy  # one compile per activation and host: the suite's second step

F32 = np.float32
NAMES = sorted(EMITTERS)
# Non-default parameters where an activation has any (defaults are covered by the ONNX test).
PARAMS = {"clip": {"min": -0.5, "max": 0.7}, "leaky_relu": {"alpha": 0.3},
          "hard_sigmoid": {"alpha": 0.3, "beta": 0.4}, "elu": {"alpha": 0.7}, "selu": {"alpha": 1.5, "gamma": 0.8},
          "celu": {"alpha": 2.0}, "thresholded_relu": {"alpha": 0.5}, "shrink": {"bias": 0.2, "lambd": 0.7},
          "gelu": {"approximate": "tanh"}, "swish": {"alpha": 0.7}}
# Values around every activation's kinks (0, +-3 for HardSwish, the clip bounds) and far out.
SPECIAL = np.array([0.0, -0.0, 3.0, -3.0, 0.5, -0.5, 0.7, 20.0, -20.0, 90.0, -90.0], F32)


def _feeds(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(F32)
    flat = x.reshape(-1)
    flat[:SPECIAL.size] = SPECIAL[:flat.size]
    return x


def _conv_graph(name: str, group: int = 1, k: int = 3) -> Graph:
    rng = np.random.default_rng(1)
    g = Graph(f"conv_{name}")
    x = g.add_input("x", TensorType(F32, (1, 8, 9, 9)))
    w = g.add_constant("w", (rng.standard_normal((16, 8 // group, k, k)) * 0.3).astype(F32))
    b = g.add_constant("b", rng.standard_normal(16).astype(F32))
    c = g.add_node("Conv", [x, w, b], {"strides": (1, 1), "pads": (k // 2,) * 4, "dilations": (1, 1),
                                       "group": group}, name="conv").outputs[0]
    act = ACTIVATIONS[name]
    g.outputs = [g.add_node(act.op, [c], PARAMS.get(name, {}), name="act").outputs[0]]
    return g


def _gemm_graph(name: str) -> Graph:
    rng = np.random.default_rng(2)
    g = Graph(f"gemm_{name}")
    x = g.add_input("x", TensorType(F32, (5, 24)))
    w = g.add_constant("w", (rng.standard_normal((24, 19)) * 0.3).astype(F32))
    c = g.add_constant("c", rng.standard_normal(19).astype(F32))
    y = g.add_node("Gemm", [x, w, c], {}, name="gemm").outputs[0]
    act = ACTIVATIONS[name]
    g.outputs = [g.add_node(act.op, [y], PARAMS.get(name, {}), name="act").outputs[0]]
    return g


def _check_fused_and_equal(graph: Graph, producer: str, name: str, shape: tuple[int, ...]) -> None:
    opt = glowpy.optimize(graph, "cpu")
    (node,) = opt.nodes
    assert node.op == producer and node.attrs["activation"] == name
    assert tuple(node.attrs["activation_params"]) == ACTIVATIONS[name].params_of(PARAMS.get(name, {}))
    x = _feeds(shape)
    want = InterpreterBackend().compile(graph).run([x])[0]
    for fast in (True, False):  # the tiled float32 kernels' vector epilogue, and the plain kernels' scalar one
        got = CpuBackend().compile(opt, threads=1, fast_kernels=fast, cache=False).run([x])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"fast_kernels={fast}")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("group,k", [(1, 3), (1, 1), (8, 3)], ids=["3x3", "1x1", "depthwise"])
def test_fused_into_conv(name: str, group: int, k: int) -> None:
    _check_fused_and_equal(_conv_graph(name, group, k), "Conv", name, (1, 8, 9, 9))


@pytest.mark.parametrize("name", NAMES)
def test_fused_into_fully_connected(name: str) -> None:
    _check_fused_and_equal(_gemm_graph(name), "FullyConnected", name, (5, 24))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("name", NAMES)
def test_standalone_elementwise(name: str, dtype) -> None:
    """The same emitter in the elementwise kernel (scalar code), NaN and infinities included."""
    act = ACTIVATIONS[name]
    g = Graph(f"ew_{name}")
    x = g.add_input("x", TensorType(np.dtype(dtype), (67,)))
    g.outputs = [g.add_node(act.op, [x], PARAMS.get(name, {}), name="act").outputs[0]]
    data = _feeds((67,)).astype(dtype)
    data[-3:] = [np.nan, np.inf, -np.inf]
    got = CpuBackend().compile(g, threads=1, cache=False).run([data])[0]
    want = InterpreterBackend().compile(g).run([data])[0]
    tol = 3e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol / 10)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_registry_declares_the_ir_op(name: str) -> None:
    act = ACTIVATIONS[name]
    opdef = OPS[act.op]
    assert opdef.elementwise and opdef.onnx == act.onnx and opdef.attrs == act.params
    x = _feeds((40,))
    np.testing.assert_array_equal(opdef.run(opdef.make_attrs({}), [x])[0], act.reference(x, act.params_of(opdef.make_attrs({}))))


def _onnx_conv_act(op: str, opset: int) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((6, 4, 3, 3)) * 0.5).astype(F32), "w")
    b = numpy_helper.from_array(rng.standard_normal(6).astype(F32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 7, 7])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check_onnx(op: str, opset: int) -> None:
    model = _onnx_conv_act(op, opset)
    x = _feeds((1, 4, 7, 7), seed=4)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    compiled = glowpy.compile(model, backend="cpu", threads=1, cache=False)
    got = compiled.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", sorted(a.onnx for a in ACTIVATIONS.values() if a.onnx and a.name in EMITTERS))
def test_onnx_conv_then_activation_matches_reference(op: str) -> None:
    _check_onnx(op, max(14, onnx.defs.get_schema(op).since_version))


def test_hard_swish_from_onnx_opset_14_is_a_conv_epilogue() -> None:
    """ONNX HardSwish (opset 14) imports 1:1 (OpDef.onnx) and ends up fused into the Conv's kernel."""
    model = _onnx_conv_act("HardSwish", 14)
    graph = glowpy.optimize(glowpy.load(model), "cpu")
    assert [(n.op, n.attrs["activation"]) for n in graph.nodes] == [("Conv", "hard_swish")]
    _check_onnx("HardSwish", 14)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_from_onnx_opset_20_is_a_conv_epilogue(approximate: str) -> None:
    """ONNX Gelu (opset 20) imports through its row and ends up fused into the Conv's vector epilogue
    (erf as a polynomial there), matching onnx.reference."""
    model = _onnx_conv_act("Gelu", 20)
    model.graph.node[1].attribute.append(helper.make_attribute("approximate", approximate))
    graph = glowpy.optimize(glowpy.load(model), "cpu")
    assert [(n.op, n.attrs["activation"], n.attrs["activation_params"]) for n in graph.nodes] == [
        ("Conv", "gelu", (approximate,))]
    x = _feeds((1, 4, 7, 7), seed=4)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for isa in (None, "avx2"):
        got = glowpy.compile(model, backend="cpu", threads=1, cache=False, **({"isa": isa} if isa else {})).run(
            {"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"isa {isa}")
