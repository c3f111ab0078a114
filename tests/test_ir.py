"""The IR itself: construction, use lists, the verifier, the text and DOT forms."""

from __future__ import annotations

import numpy as np
import pytest

from glowpy.errors import InternalError, InvalidModel, MismatchingShape, UnsupportedAttribute
from glowpy.ir import OPS, Graph, TensorType, to_dot

F32 = np.float32


def small_graph() -> Graph:
    g = Graph("small")
    x = g.add_input("x", TensorType(F32, (1, 3, 8, 8)))
    w = g.add_constant("w", np.ones((4, 3, 3, 3), F32))
    b = g.add_constant("b", np.zeros(4, F32))
    conv = g.add_node("Conv", [x, w, b], {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}, name="c")
    relu = g.add_node("Relu", conv.outputs, name="r")
    g.outputs = [relu.outputs[0]]
    return g


def test_every_op_is_declared_once_with_semantics() -> None:
    assert len(OPS) >= 50
    for name, opdef in OPS.items():
        assert opdef.name == name
        assert callable(opdef.infer) and callable(opdef.compute)


def test_types_and_users() -> None:
    g = small_graph()
    g.verify()
    conv, relu = g.nodes
    assert conv.outputs[0].type == TensorType(F32, (1, 4, 8, 8))
    assert conv.users == [relu]
    assert g.inputs[0].users == [conv]
    assert conv.attrs["group"] == 1 and conv.attrs["activation"] == "none"  # defaults filled in
    assert g.num_parameters == 4 * 3 * 3 * 3 + 4


def test_weights_are_not_copied() -> None:
    g = Graph()
    data = np.arange(6, dtype=F32)
    v = g.add_constant("w", data)
    assert v.data is data


def test_text_form_is_ssa() -> None:
    text = str(small_graph())
    assert "graph small(" in text
    assert "%c: f32[1, 4, 8, 8] = Conv(%x, %w, %b) {group=1, strides=[1, 1], pads=[1, 1, 1, 1]" in text
    assert "%r: f32[1, 4, 8, 8] = Relu(%c)" in text
    assert text.strip().endswith("return %r\n}".strip())


def test_dot_form() -> None:
    dot = to_dot(small_graph())
    assert dot.startswith('digraph "small" {')
    assert '"node:c" -> "node:r"' in dot
    assert '"in:x" -> "node:c"' in dot


def test_replace_all_uses_and_remove() -> None:
    g = small_graph()
    conv, relu = g.nodes
    g.replace_all_uses(relu.outputs[0], conv.outputs[0])
    g.remove_node(relu)
    g.verify()
    assert g.outputs == [conv.outputs[0]]
    assert conv.users == []


def test_remove_used_node_is_refused() -> None:
    g = small_graph()
    with pytest.raises(InternalError, match="still used"):
        g.remove_node(g.nodes[0])


def test_verify_catches_dangling_use() -> None:
    g = small_graph()
    other = Graph()
    stray = other.add_input("stray", TensorType(F32, (1, 4, 8, 8)))
    g.nodes[1].inputs[0] = stray  # bypass the API, as a buggy pass would
    with pytest.raises(InvalidModel, match="'stray' is not defined before use"):
        g.verify()


def test_verify_catches_type_mismatch() -> None:
    g = small_graph()
    g.nodes[1].outputs[0].type = TensorType(F32, (1, 4, 8, 9))
    with pytest.raises(MismatchingShape, match=r"node 'r' \(Relu\): output 'r' shape disagrees"):
        g.verify()


def test_verify_catches_cycle() -> None:
    g = small_graph()
    conv, relu = g.nodes
    # feed relu's output back into conv: conv <-> relu
    conv.inputs[0] = relu.outputs[0]
    with pytest.raises(InvalidModel, match="cycle"):
        g.verify()


def test_verify_catches_duplicate_names() -> None:
    g = small_graph()
    g.nodes[1].outputs[0].name = "c"
    with pytest.raises(InvalidModel, match="duplicate value name 'c'"):
        g.verify()


def test_duplicate_input_name_is_refused() -> None:
    g = Graph()
    g.add_input("x", TensorType(F32, (2,)))
    with pytest.raises(InvalidModel, match="duplicate name 'x'"):
        g.add_input("x", TensorType(F32, (2,)))


def test_stale_use_list_is_caught() -> None:
    g = small_graph()
    g.inputs[0].users.append(g.nodes[1])
    with pytest.raises(InternalError, match="use list of 'x' is stale"):
        g.verify()


def test_inference_errors_name_the_node() -> None:
    g = Graph()
    a = g.add_input("a", TensorType(F32, (2, 3)))
    b = g.add_input("b", TensorType(F32, (4, 5)))
    with pytest.raises(MismatchingShape, match=r"node 'mm' \(MatMul\): inner dimensions differ"):
        g.add_node("MatMul", [a, b], name="mm")


def test_unknown_attribute_is_refused() -> None:
    g = Graph()
    a = g.add_input("a", TensorType(F32, (2, 3)))
    with pytest.raises(UnsupportedAttribute, match="unknown attribute"):
        g.add_node("Relu", [a], {"alpha": 1.0})


def test_toposort_restores_order() -> None:
    g = small_graph()
    g.nodes.reorder(list(g.nodes)[::-1])
    g.toposort()
    assert [n.name for n in g.nodes] == ["c", "r"]
    g.verify()
