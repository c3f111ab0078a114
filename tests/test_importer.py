"""The full importer: model sources, opsets, shapes, external data, and every bad input a user can
hand it, each raising its GlowpyError subclass with a message naming the node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.errors import (
    GlowpyError,
    InvalidModel,
    InvalidName,
    InvalidProtobuf,
    MismatchingShape,
    Status,
    UnsupportedAttribute,
    UnsupportedDatatype,
    UnsupportedOperator,
    UnsupportedShape,
    UnsupportedVersion,
)
from glowpy.models import light_model_path


def conv_model(opset: int = 13, dims=(1, 3, 8, 8), with_weight: bool = True) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    node = helper.make_node("Conv", ["X", "W"], ["C"], name="conv1", pads=[1, 1, 1, 1])
    relu = helper.make_node("Relu", ["C"], ["Y"], name="relu1")
    graph = helper.make_graph(
        [node, relu], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [w] if with_weight else [],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_load_from_bytes_path_and_proto(tmp_path: Path) -> None:
    model = conv_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    texts = {str(glowpy.load(src)) for src in (model, model.SerializeToString(), path, str(path))}
    assert len(texts) == 1
    g = glowpy.load(model)
    assert [n.op for n in g.nodes] == ["Conv", "Relu"]
    assert g.outputs[0].type.shape == (1, 4, 8, 8)


@pytest.mark.parametrize("opset", [7, 9, 11, 13, 17, onnx.defs.onnx_opset_version()])
def test_every_opset_from_7_to_newest(opset: int) -> None:
    g = glowpy.load(conv_model(opset))
    assert len(g.nodes) == 2


def test_light_model_structure() -> None:
    g = glowpy.load(light_model_path("resnet50"))
    counts = g.count_ops()
    assert counts["Conv"] == 53 and counts["BatchNormalization"] == 53
    assert counts["Add"] == 16  # Sum of two inputs
    assert "ConstantOfShape" not in counts  # weights became constants
    assert g.inputs[0].name == "gpu_0/data_0"  # IR v3 inputs with initializers stay weights


def test_gemm_transposes_and_sum_lowering() -> None:
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [4, 3])
    nodes = [
        helper.make_node("Gemm", ["A", "B", "C"], ["G"], transA=1, alpha=2.0, beta=0.5),
        helper.make_node("Sum", ["G", "G", "G"], ["Y"]),
    ]
    inits = [numpy_helper.from_array(np.ones((4, 5), np.float32), "B"),
             numpy_helper.from_array(np.ones((5,), np.float32), "C")]
    model = helper.make_model(helper.make_graph(nodes, "g", [a], [helper.make_tensor_value_info("Y", 1, None)], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    g = glowpy.load(model)
    assert [n.op for n in g.nodes] == ["Gemm", "Add", "Add"]
    assert g.nodes[0].attrs["transA"] == 1 and g.nodes[0].attrs["alpha"] == 2.0
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    (y,) = glowpy.compile(model, backend="interpreter").run({"A": x}).values()
    np.testing.assert_allclose(y, 3 * (2 * x.T @ np.ones((4, 5)) + 0.5), rtol=1e-5)


def test_external_data_loads_relative_to_model(tmp_path: Path) -> None:
    model = conv_model()
    expected = numpy_helper.to_array(model.graph.initializer[0])
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    g = glowpy.load(tmp_path / "m.onnx")
    np.testing.assert_array_equal(g.constants["W"].data, expected)
    # From bytes, the file cannot be found: a clear error, not a crash.
    with pytest.raises(InvalidModel, match="initializer 'W' is stored in an external file"):
        glowpy.load((tmp_path / "m.onnx").read_bytes())
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(InvalidModel, match="initializer 'W' cannot be read"):
        glowpy.load(tmp_path / "m.onnx")


def _short_tensor(name: str, raw: bool) -> TensorProto:
    """A FLOAT [2, 3] tensor whose payload holds fewer values than its dims need."""
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[2, 3])
    if raw:
        t.raw_data = b"\0" * 10  # not a whole number of floats
    else:
        t.float_data.extend([1.0, 2.0])
    return t


@pytest.mark.parametrize("raw", [False, True], ids=["typed", "raw"])
@pytest.mark.parametrize("op", ["Constant", "ConstantOfShape"])
def test_broken_tensor_attribute_is_an_invalid_model(op: str, raw: bool) -> None:
    # The check and the full path agree: a payload that does not fit its dims is the model's fault.
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [2, 3])
    node = (helper.make_node("Constant", [], ["y"], value=_short_tensor("c", raw)) if op == "Constant" else
            helper.make_node("ConstantOfShape", ["s"], ["y"], value=_short_tensor("c", raw)))
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              initializer=[shape] if op == "ConstantOfShape" else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    what = "the value" if op == "Constant" else "the fill value"
    verdict = glowpy.check(model).nodes[0]
    assert verdict.status.name == "INVALID_MODEL" and f"{what} cannot be read" in verdict.reason
    with pytest.raises(InvalidModel, match=f"node 'y' \\({op}, opset 17\\): {what} cannot be read") as err:
        glowpy.compile(model, backend="interpreter")
    assert err.value.expected == "a FLOAT payload of shape [2, 3]"


def test_symbolic_dims_must_be_bound() -> None:
    model = conv_model(dims=["N", 3, 8, 8])
    with pytest.raises(UnsupportedShape, match="graph input 'X' has symbolic dim 'N'"):
        glowpy.load(model)
    assert glowpy.load(model, shapes={"X": (2, 3, 8, 8)}).inputs[0].shape == (2, 3, 8, 8)
    assert glowpy.load(model, shapes={"N": 5}).inputs[0].shape == (5, 3, 8, 8)


def test_shape_binding_errors() -> None:
    with pytest.raises(MismatchingShape, match="input 'X' has the wrong rank"):
        glowpy.load(conv_model(), shapes={"X": (1, 3, 8)})
    with pytest.raises(MismatchingShape, match="input 'X' disagrees with the model"):
        glowpy.load(conv_model(), shapes={"X": (1, 3, 9, 9)})
    with pytest.raises(InvalidName, match="'nope'"):
        glowpy.load(conv_model(), shapes={"nope": (1,)})


# --- bad input: the class and the message ----------------------------------------------------------


def test_truncated_protobuf() -> None:
    data = light_model_path("squeezenet").read_bytes()
    with pytest.raises(InvalidProtobuf, match="not an ONNX model") as e:
        glowpy.load(data[: len(data) // 3])
    assert e.value.status == Status.INVALID_PROTOBUF


@pytest.mark.parametrize("data", [b"", b"\x00\x01garbage\xff\xff", b"hello world"])
def test_garbage_bytes(data: bytes) -> None:
    with pytest.raises(InvalidProtobuf):
        glowpy.load(data)


def test_unknown_op_names_op_and_node() -> None:
    model = conv_model()
    model.graph.node[1].op_type = "FancyOp"
    with pytest.raises(UnsupportedOperator, match=r"node 'relu1' \(FancyOp\): operator FancyOp is not supported") as e:
        glowpy.load(model)
    assert e.value.status == Status.UNSUPPORTED_OPERATOR


def test_unknown_domain() -> None:
    model = conv_model()
    model.graph.node[1].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOperator, match="in domain 'com.example'"):
        glowpy.load(model)


def test_missing_initializer_names_node_and_weight() -> None:
    with pytest.raises(InvalidModel, match=r"node 'conv1' \(Conv, opset 13\): input 'W' is not defined"):
        glowpy.load(conv_model(with_weight=False))


def test_dangling_input_name() -> None:
    model = conv_model()
    model.graph.node[1].input[0] = "no_such_value"
    with pytest.raises(InvalidModel, match=r"node 'relu1' \(Relu, opset 13\): input 'no_such_value' is not defined"):
        glowpy.load(model)


def test_dangling_graph_output() -> None:
    model = conv_model()
    model.graph.output[0].name = "nowhere"
    with pytest.raises(InvalidModel, match="graph output 'nowhere' is not produced"):
        glowpy.load(model)


def test_cycle_names_a_node() -> None:
    model = conv_model()
    model.graph.node[0].input[0] = "Y"  # conv1 reads relu1's output, relu1 reads conv1's
    with pytest.raises(InvalidModel, match=r"node '(conv1|relu1)' \((Conv|Relu)\): the graph has a cycle"):
        glowpy.load(model)


def test_wrong_rank_input() -> None:
    with pytest.raises(MismatchingShape, match=r"node 'conv1' \(Conv, opset 13\): input rank does not match the "
                                               r"weight \(expected rank 4, found rank 3 \[1, 3, 8\]\)"):
        glowpy.load(conv_model(dims=(1, 3, 8)))


def test_wrong_channels_input() -> None:
    with pytest.raises(MismatchingShape, match=r"node 'conv1' \(Conv, opset 13\): input channels do not match"):
        glowpy.load(conv_model(dims=(1, 5, 8, 8)))


def test_bad_attribute_names_it() -> None:
    model = conv_model()
    model.graph.node[0].attribute.append(helper.make_attribute("auto_pad", "SIDEWAYS"))
    with pytest.raises(UnsupportedAttribute,
                       match=r"node 'conv1' \(Conv, opset 13\): attribute 'auto_pad' has an unsupported value"):
        glowpy.load(model)


def test_unknown_attribute_names_it() -> None:
    model = conv_model()
    model.graph.node[1].attribute.append(helper.make_attribute("alpha", 0.5))
    with pytest.raises(UnsupportedAttribute, match=r"node 'relu1' \(Relu, opset 13\): attribute 'alpha'"):
        glowpy.load(model)


def test_string_input_is_unsupported_datatype() -> None:
    model = conv_model()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.STRING
    with pytest.raises(UnsupportedDatatype, match="'X' has an unsupported element type"):
        glowpy.load(model)


@pytest.mark.parametrize("opset", [5, 99])
def test_unsupported_opset(opset: int) -> None:
    with pytest.raises(UnsupportedVersion, match="opset"):
        glowpy.load(conv_model(opset))


def test_errors_carry_statuses() -> None:
    assert issubclass(InvalidProtobuf, GlowpyError)
    codes = {cls.status for cls in (InvalidProtobuf, InvalidModel, UnsupportedOperator, UnsupportedAttribute,
                                    UnsupportedShape, UnsupportedDatatype, UnsupportedVersion)}
    assert len(codes) == 7
    e = UnsupportedAttribute("bad", node="n", op="Conv", opset=13, expected="x", found="y")
    assert str(e) == "node 'n' (Conv, opset 13): bad (expected x, found y)"


@pytest.mark.parametrize("op, inputs", [("Reshape", ["x"]), ("Expand", ["x"]), ("ConstantOfShape", [])])
def test_missing_required_operand_is_invalid_model(op: str, inputs: list[str]) -> None:
    node = helper.make_node(op, inputs, ["y"], name="n1")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(InvalidModel, match=rf"node 'n1' \({op}, opset 13\): required input \d is missing"):
        glowpy.load(model)


def test_error_message_survives_non_utf8_names() -> None:
    e = UnsupportedOperator("not supported", node=b"\xff\xfe", op=b"Re\xfflu")
    assert "Re\ufffdlu" in str(e)
