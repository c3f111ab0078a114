"""Panel-major activations in a model (select.panel_major, kernels/conv.py PANEL LAYOUT): a ResNet-style
chain of pixel-path convs (1x1 convs, a Winograd 3x3, a stride-2 3x3 and a stride-2 1x1 downsample,
residuals) plans its block outputs panel-major, and gives exactly the results of the all-NCHW program
at 1, 2 and 3 threads, and the interpreter's within float32 rounding."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from llvmlite import ir
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy import pipeline
from glowpy.backends.cpu import select
from glowpy.backends.cpu.lowering import Lowering

from .util import assert_close

C, H = 32, 28


def _bottleneck_model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits, nodes = [], []

    def conv(x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True,
             residual: str | None = None) -> str:
        w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")])
        pad = k // 2
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.y"], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[pad] * 4))
        y = f"{name}.y"
        if residual is not None:
            nodes.append(helper.make_node("Add", [y, residual], [f"{name}.sum"]))
            y = f"{name}.sum"
        if relu:
            nodes.append(helper.make_node("Relu", [y], [f"{name}.act"]))
            y = f"{name}.act"
        return y

    x = "x"
    for i in range(2):  # identity blocks
        h = conv(x, f"b{i}.c1", C, C // 2, 1)
        h = conv(h, f"b{i}.c2", C // 2, C // 2, 3)
        x = conv(h, f"b{i}.c3", C // 2, C, 1, relu=True, residual=x)
    h = conv(x, "d.c1", C, C // 2, 1)  # a downsampling block
    h = conv(h, "d.c2", C // 2, C // 2, 3, stride=2)
    ds = conv(x, "d.ds", C, 2 * C, 1, stride=2, relu=False)
    y = conv(h, "d.c3", C // 2, 2 * C, 1, residual=ds)
    nodes.append(helper.make_node("GlobalAveragePool", [y], ["pooled"]))
    graph = helper.make_graph(nodes, "bottlenecks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, H])],
                              [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 2 * C, 1, 1]),
                               helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 2 * C, H // 2, H // 2])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_block_outputs_are_planned_panel_major() -> None:
    graph = pipeline.optimized_graph(_bottleneck_model(), "cpu")
    low = Lowering(graph, ir.Module(), nthreads=2, vector_width=16)
    plan = select.panel_major(low)
    planned = {n.name for n in graph.nodes if id(n.outputs[0]) in plan}
    assert len(planned) >= 3, planned  # the identity blocks' outputs at least
    assert all(id(v) not in plan for v in graph.outputs)  # graph outputs stay NCHW


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_panel_major_program_matches_nchw(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _bottleneck_model()
    x = np.random.default_rng(3).standard_normal((1, C, H, H)).astype(np.float32)
    got = glowpy.compile(model, threads=threads, cache=False).run({"x": x})
    monkeypatch.setattr(select, "PANEL_LAYOUT", False)
    want = glowpy.compile(model, threads=threads, cache=False).run({"x": x})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    oracle = glowpy.compile(model, backend="interpreter").run({"x": x})
    for name in oracle:
        assert_close(got[name], oracle[name])
