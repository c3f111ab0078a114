"""Compile-time operands computed by other nodes: the shape arithmetic exporters emit (Shape, Gather,
Unsqueeze, Concat feeding Reshape / Expand / Pad / Slice), and Constant nodes as axes, bounds and flags.
The importer must evaluate these at compile time and agree with the reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from .util import check_graph, randn

I64 = np.int64


def const(name: str, value: object) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


@pytest.mark.parametrize("opset", [11, 13])
def test_torch_flatten_pattern(backend, opset):
    """x.view(x.size(0), -1) as exported: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    unsq = (helper.make_node("Unsqueeze", ["n", "zero_axes"], ["n1"]) if opset >= 13
            else helper.make_node("Unsqueeze", ["n"], ["n1"], axes=[0]))
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        const("zero", np.array(0, dtype=I64)),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        *([const("zero_axes", np.array([0], dtype=I64))] if opset >= 13 else []),
        unsq,
        const("minus1", np.array([-1], dtype=I64)),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    check_graph(backend, nodes, {"x": randn(2, 3, 4)}, ["y"], opset=opset)


def test_expand_to_shape_of_other_input(backend):
    nodes = [helper.make_node("Shape", ["b"], ["s"]), helper.make_node("Expand", ["a", "s"], ["y"])]
    check_graph(backend, nodes, {"a": randn(3, 1), "b": randn(2, 3, 4, seed=1)}, ["y"], opset=13)


def test_pad_pads_from_concat(backend):
    nodes = [const("p0", np.array([1, 0], dtype=I64)), const("p1", np.array([0, 2], dtype=I64)),
             helper.make_node("Concat", ["p0", "p1"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["y"], mode="edge")]
    check_graph(backend, nodes, {"x": randn(3, 4)}, ["y"], opset=13)


def test_slice_ends_from_shape_arithmetic(backend):
    """x[:, : x.shape[1] - 1] with the end computed by Shape, Gather, Sub."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), const("one", np.array([1], dtype=I64)),
             helper.make_node("Gather", ["s", "one"], ["d"], axis=0),
             helper.make_node("Sub", ["d", "one"], ["end"]),
             const("start", np.array([0], dtype=I64)),
             helper.make_node("Slice", ["x", "start", "end", "one"], ["y"])]
    check_graph(backend, nodes, {"x": randn(3, 5)}, ["y"], opset=13)


def test_clip_bounds_from_constant_nodes(backend):
    nodes = [const("lo", np.float32(-0.2)), const("hi", np.float32(0.3)),
             helper.make_node("Clip", ["x", "lo", "hi"], ["y"])]
    check_graph(backend, nodes, {"x": randn(4, 5)}, ["y"], opset=13)


def test_squeeze_and_reduce_axes_from_constant_nodes(backend):
    nodes = [const("ax", np.array([-1], dtype=I64)),
             helper.make_node("ReduceSum", ["x", "ax"], ["r"], keepdims=1),
             helper.make_node("Squeeze", ["r", "ax"], ["y"])]
    check_graph(backend, nodes, {"x": randn(2, 3, 4)}, ["y"], opset=13)


def test_dropout_training_flag_from_constant_node(backend):
    nodes = [const("ratio", np.float32(0.5)), const("train", np.array(False)),
             helper.make_node("Dropout", ["x", "ratio", "train"], ["y", "mask"])]
    check_graph(backend, nodes, {"x": randn(2, 3)}, ["y", "mask"], opset=13)


def test_constant_output_between_nodes(backend):
    """A Constant feeding an op and also being a graph output keeps its name."""
    nodes = [const("c", randn(3, seed=4)), helper.make_node("Add", ["x", "c"], ["y"])]
    check_graph(backend, nodes, {"x": randn(2, 3)}, ["y", "c"], opset=13)


def test_initializer_operands(backend):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Gemm", ["r", "w", "b"], ["y"], transB=1)]
    check_graph(backend, nodes, {"x": randn(2, 3, 4)}, ["y"], opset=13,
                initializers={"shape": np.array([2, 12], dtype=I64), "w": randn(5, 12, seed=1),
                              "b": randn(5, seed=2)})
