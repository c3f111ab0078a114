"""glowpy.check: statuses and reasons per node, the report API, weights never read, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.backends.base import Backend
from glowpy.errors import Status
from glowpy.importer import compat
from glowpy.ir.graph import Node

F = TensorProto.FLOAT
ROOT = Path(__file__).resolve().parents[2]


def vi(name: str, dims: list | None, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, dims)


ML = "ai.onnx.ml"  # glowpy has no op of this domain; onnx infers and onnxruntime runs its Binarizer


def unsupported(inputs: list[str], outputs: list[str], name: str) -> onnx.NodeProto:
    """A node glowpy refuses as an unsupported operator (float -> float of the same shape)."""
    return helper.make_node("Binarizer", inputs, outputs, name=name, domain=ML)


def model(nodes: list, inputs: list, outputs: list, *, opset: int = 13, inits: list = (), extra_opsets: dict = None,
          ir_version: int | None = None) -> onnx.ModelProto:
    extra = dict(extra_opsets or {})
    if any(n.domain == ML for n in nodes):
        extra.setdefault(ML, 1)
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra.items()]
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits)), opset_imports=ops)
    m.ir_version = ir_version if ir_version is not None else min(m.ir_version, onnx.IR_VERSION)
    return m


def conv_model(weight_as_initializer: bool = False, out_dims: list | None = None, x_channels: int = 3) -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    inputs = [vi("X", [1, x_channels, 8, 8])]
    inits = []
    if weight_as_initializer:
        inits.append(numpy_helper.from_array(w, "W"))
    else:
        inputs.append(vi("W", [4, 3, 3, 3]))
    node = helper.make_node("Conv", ["X", "W"], ["Y"], name="conv", pads=[1, 1, 1, 1])
    return model([node], inputs, [vi("Y", out_dims if out_dims is not None else [1, 4, 8, 8])], inits=inits)


def only(report: compat.CompatReport) -> compat.NodeVerdict:
    assert len(report.nodes) == 1, report.nodes
    return report.nodes[0]


# --- one status per kind of problem, each naming the node -------------------------------------------


def test_supported_conv_without_weights() -> None:
    r = glowpy.check(conv_model())
    assert r.supported and r.status == Status.SUCCESS
    v = only(r)
    assert (v.name, v.op, v.status) == ("conv", "Conv", Status.SUCCESS)
    assert "'conv'" in v.reason and not v.assumes


def test_unknown_op() -> None:
    m = model([helper.make_node("FancyOp", ["X"], ["Y"], name="fancy")], [vi("X", [2])], [vi("Y", [2])])
    v = only(glowpy.check(m))
    assert v.status == Status.UNSUPPORTED_OPERATOR
    assert "'fancy'" in v.reason and "FancyOp" in v.reason


def test_unknown_domain() -> None:
    node = helper.make_node("Relu", ["X"], ["Y"], name="custom_relu", domain="com.example")
    m = model([node], [vi("X", [2])], [vi("Y", [2])], extra_opsets={"com.example": 1})
    v = only(glowpy.check(m))
    assert v.status == Status.UNSUPPORTED_OPERATOR
    assert "'custom_relu'" in v.reason and "com.example" in v.reason


def test_string_dtype() -> None:
    m = model([helper.make_node("Identity", ["X"], ["Y"], name="ident")], [vi("X", [2], TensorProto.STRING)],
              [vi("Y", [2], TensorProto.STRING)])
    v = only(glowpy.check(m))
    assert v.status == Status.UNSUPPORTED_DATATYPE
    assert "'ident'" in v.reason and "STRING" in v.reason


def test_cast_to_string() -> None:
    m = model([helper.make_node("Cast", ["X"], ["Y"], name="to_str", to=TensorProto.STRING)], [vi("X", [2])],
              [vi("Y", [2], TensorProto.STRING)])
    v = only(glowpy.check(m))
    assert v.status == Status.UNSUPPORTED_DATATYPE and "'to_str'" in v.reason


def test_dtype_not_accepted_by_op() -> None:
    m = model([helper.make_node("Sigmoid", ["X"], ["Y"], name="sig")], [vi("X", [2], TensorProto.INT32)],
              [vi("Y", [2], TensorProto.INT32)])
    v = only(glowpy.check(m))
    assert v.status == Status.UNSUPPORTED_DATATYPE and "'sig'" in v.reason and "int32" in v.reason


@pytest.mark.parametrize("attrs,word", [({"auto_pad": "FOO"}, "auto_pad"), ({"bogus": 1}, "bogus"),
                                        ({"group": 0}, "group")])
def test_bad_attribute(attrs: dict, word: str) -> None:
    node = helper.make_node("Conv", ["X", "W"], ["Y"], name="conv", **attrs)
    m = model([node], [vi("X", [1, 3, 8, 8]), vi("W", [4, 3, 3, 3])], [vi("Y", None)])
    v = only(glowpy.check(m))
    assert v.status == Status.UNSUPPORTED_ATTRIBUTE
    assert "'conv'" in v.reason and word in v.reason


def test_attribute_checked_against_shapes() -> None:
    # Found only by running the converter against the declared types: strides for 2 spatial dims.
    node = helper.make_node("Conv", ["X", "W"], ["Y"], name="conv", strides=[1, 1, 1])
    m = model([node], [vi("X", [1, 3, 8, 8]), vi("W", [4, 3, 3, 3])], [vi("Y", None)])
    v = only(glowpy.check(m))
    assert v.status == Status.UNSUPPORTED_ATTRIBUTE and "strides" in v.reason


def test_opset_below_the_op() -> None:
    m = model([helper.make_node("Gelu", ["X"], ["Y"], name="gelu")], [vi("X", [2])], [vi("Y", [2])], opset=18)
    v = only(glowpy.check(m))
    assert v.status == Status.UNSUPPORTED_VERSION
    assert "'gelu'" in v.reason and "opset 18" in v.reason


def test_unsupported_default_opset_reports_every_node() -> None:
    nodes = [helper.make_node("Relu", ["X"], ["A"], name="r1"), helper.make_node("Relu", ["A"], ["Y"], name="r2")]
    m = model(nodes, [vi("X", [2])], [vi("Y", [2])], opset=5)
    r = glowpy.check(m)
    assert r.status == Status.UNSUPPORTED_VERSION and not r.supported
    assert [v.status for v in r.nodes] == [Status.UNSUPPORTED_VERSION] * 2
    assert "'r1'" in r.nodes[0].reason and "'r2'" in r.nodes[1].reason


def test_unsupported_ir_version() -> None:
    m = model([helper.make_node("Relu", ["X"], ["Y"], name="r")], [vi("X", [2])], [vi("Y", [2])],
              ir_version=onnx.IR_VERSION + 1)
    v = only(glowpy.check(m))
    assert v.status == Status.UNSUPPORTED_VERSION and "'r'" in v.reason


@pytest.mark.parametrize("data", [b"", b"\x08\x07garbage\xff\xff", b"not a model at all"])
def test_malformed_protobuf(data: bytes) -> None:
    r = glowpy.check(data)
    assert not r.readable and not r.supported
    assert r.status == Status.INVALID_PROTOBUF and r.nodes == []
    assert r.reason


def test_truncated_model_bytes() -> None:
    data = conv_model(weight_as_initializer=True).SerializeToString()
    r = glowpy.check(data[: len(data) // 2])
    assert r.status == Status.INVALID_PROTOBUF and not r.readable


def test_missing_file(tmp_path: Path) -> None:
    r = glowpy.check(tmp_path / "absent.onnx")
    assert not r.readable and r.status == Status.INVALID_MODEL


def test_two_unsupported_nodes_both_reported() -> None:
    nodes = [helper.make_node("Relu", ["X"], ["A"], name="ok1"),
             unsupported(["A"], ["B"], name="bad1"),
             helper.make_node("Relu", ["B"], ["C"], name="ok2"),
             unsupported(["C"], ["Y"], name="bad2")]
    r = glowpy.check(model(nodes, [vi("X", [2, 3])], [vi("Y", [2, 3])]))
    assert [v.name for v in r.nodes] == ["ok1", "bad1", "ok2", "bad2"]
    assert [v.status for v in r.nodes] == [Status.SUCCESS, Status.UNSUPPORTED_OPERATOR, Status.SUCCESS,
                                           Status.UNSUPPORTED_OPERATOR]
    assert [v.name for v in r.unsupported] == ["bad1", "bad2"]
    assert "'bad1'" in r.nodes[1].reason and "'bad2'" in r.nodes[3].reason
    assert r.status == Status.UNSUPPORTED_OPERATOR and "1 more" in r.reason


def test_downstream_of_a_rejected_node_uses_declared_types() -> None:
    nodes = [unsupported(["X"], ["A"], name="bad"),
             helper.make_node("Conv", ["A", "W"], ["Y"], name="conv")]
    m = model(nodes, [vi("X", [1, 2, 8, 8]), vi("W", [4, 3, 3, 3])], [vi("Y", None)])
    m.graph.value_info.append(vi("A", [1, 2, 8, 8]))
    r = glowpy.check(m)
    assert r.nodes[0].status == Status.UNSUPPORTED_OPERATOR
    assert r.nodes[1].status == Status.MISMATCHING_SHAPE and "'conv'" in r.nodes[1].reason  # 2 vs 3 channels


def test_downstream_of_a_rejected_node_uses_onnx_inference() -> None:
    # No value_info for A: ONNX's own inference for Binarizer gives its type, so the Conv is still checked.
    nodes = [unsupported(["X"], ["A"], name="bad"),
             helper.make_node("Conv", ["A", "W"], ["Y"], name="conv")]
    r = glowpy.check(model(nodes, [vi("X", [1, 2, 8, 8]), vi("W", [4, 3, 3, 3])], [vi("Y", None)]))
    assert [v.status for v in r.nodes] == [Status.UNSUPPORTED_OPERATOR, Status.MISMATCHING_SHAPE]


# --- shapes and types from declarations ------------------------------------------------------------------


def test_channel_mismatch() -> None:
    v = only(glowpy.check(conv_model(x_channels=5)))
    assert v.status == Status.MISMATCHING_SHAPE and "'conv'" in v.reason


def test_declared_output_shape_disagrees() -> None:
    v = only(glowpy.check(conv_model(out_dims=[1, 4, 6, 6])))
    assert v.status == Status.MISMATCHING_SHAPE and "'Y'" in v.reason


def test_declared_output_dtype_disagrees() -> None:
    m = model([helper.make_node("Relu", ["X"], ["Y"], name="r")], [vi("X", [2])], [vi("Y", [2], TensorProto.DOUBLE)])
    v = only(glowpy.check(m))
    assert v.status == Status.MISMATCHING_DATATYPE and "'r'" in v.reason


def test_operands_disagree_in_dtype() -> None:
    m = model([helper.make_node("Add", ["A", "B"], ["Y"], name="add")],
              [vi("A", [2]), vi("B", [2], TensorProto.DOUBLE)], [vi("Y", None)])
    v = only(glowpy.check(m))
    assert v.status == Status.MISMATCHING_DATATYPE and "'add'" in v.reason


def test_symbolic_dims_are_bound_at_init() -> None:
    m = model([helper.make_node("Relu", ["X"], ["Y"], name="r")], [vi("X", ["N", 3])], [vi("Y", ["N", 3])])
    v = only(glowpy.check(m))
    assert v.status == Status.SUCCESS and "shapes not checked" in v.reason
    bound = only(glowpy.check(m, shapes={"N": 2}))
    assert bound.status == Status.SUCCESS and "shapes not checked" not in bound.reason


def test_zero_size_input_must_be_a_weight() -> None:
    # glowpy has no zero-size runtime buffers; a zero-size declared input is accepted as a weight.
    m = model([helper.make_node("Relu", ["X"], ["Y"], name="r")], [vi("X", [0, 3])], [vi("Y", [0, 3])])
    v = only(glowpy.check(m))
    assert v.status == Status.SUCCESS and "'X' (zero-size) is a weight" in v.reason
    with pytest.raises(glowpy.GlowpyError):
        glowpy.compile(m)  # as a runtime input it is refused


def test_empty_axes_operand_is_known_without_data() -> None:
    node = helper.make_node("ReduceSum", ["X", "axes"], ["Y"], name="sum", keepdims=0)
    m = model([node], [vi("X", [2, 3]), vi("axes", [0], TensorProto.INT64)], [vi("Y", [])])
    v = only(glowpy.check(m))
    assert v.status == Status.SUCCESS and not v.assumes, v.reason


def reshape_model(out_dims: list | None) -> onnx.ModelProto:
    node = helper.make_node("Reshape", ["X", "shape"], ["Y"], name="reshape")
    return model([node], [vi("X", [2, 3, 4]), vi("shape", [2], TensorProto.INT64)], [vi("Y", out_dims)])


def test_shape_operand_without_data_decided_from_declared_output() -> None:
    v = only(glowpy.check(reshape_model([6, 4])))
    assert v.status == Status.SUCCESS and v.assumes and "declared output shape" in v.reason
    bad = only(glowpy.check(reshape_model([5, 4])))
    assert bad.status == Status.MISMATCHING_SHAPE and "'reshape'" in bad.reason


def test_shape_operand_without_data_or_declared_output() -> None:
    v = only(glowpy.check(reshape_model(None)))
    assert v.status == Status.SUCCESS and "'shape'" in v.reason and v.assumes


def test_shape_computation_is_followed() -> None:
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the shape operand is computed from declared dims.
    nodes = [
        helper.make_node("Shape", ["X"], ["s"], name="shape"),
        helper.make_node("Constant", [], ["i0"], name="c0", value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Gather", ["s", "i0"], ["n"], name="gather"),
        helper.make_node("Constant", [], ["ax"], name="c1", value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"], name="unsq"),
        helper.make_node("Constant", [], ["m1"], name="c2", value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Concat", ["n1", "m1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["X", "target"], ["Y"], name="flatten"),
    ]
    m = model(nodes, [vi("X", [2, 3, 4])], [vi("Y", [2, 12])])
    r = glowpy.check(m)
    assert r.supported and not any(v.assumes for v in r.nodes), [v.reason for v in r.nodes]
    m.graph.output[0].CopyFrom(vi("Y", [3, 8]))
    assert glowpy.check(m).nodes[-1].status == Status.MISMATCHING_SHAPE


def test_dangling_input() -> None:
    m = model([helper.make_node("Relu", ["nowhere"], ["Y"], name="r")], [], [vi("Y", None)])
    v = only(glowpy.check(m))
    assert v.status == Status.INVALID_MODEL and "'nowhere'" in v.reason and "'r'" in v.reason


def test_value_produced_twice_and_missing_op_type() -> None:
    nodes = [helper.make_node("Relu", ["X"], ["A"], name="r1"), helper.make_node("Neg", ["X"], ["A"], name="r2"),
             helper.make_node("", ["A"], ["Y"], name="blank")]
    r = glowpy.check(model(nodes, [vi("X", [2])], [vi("Y", [2])]))
    assert [v.status for v in r.nodes] == [Status.SUCCESS, Status.INVALID_MODEL, Status.INVALID_MODEL]
    assert "'A'" in r.nodes[1].reason and "'r2'" in r.nodes[1].reason and "'blank'" in r.nodes[2].reason


def test_cycle() -> None:
    nodes = [helper.make_node("Relu", ["B"], ["A"], name="r1"), helper.make_node("Relu", ["A"], ["B"], name="r2")]
    r = glowpy.check(model(nodes, [], [vi("B", [2])]))
    assert [v.status for v in r.nodes] == [Status.INVALID_MODEL] * 2
    assert "cycle" in r.nodes[0].reason


def test_bad_initializer_unused_is_a_model_issue() -> None:
    bad = helper.make_tensor("s", TensorProto.STRING, [1], [b"x"])
    m = model([helper.make_node("Relu", ["X"], ["Y"], name="r")], [vi("X", [2])], [vi("Y", [2])], inits=[bad])
    r = glowpy.check(m)
    assert r.nodes[0].status == Status.SUCCESS
    assert not r.supported and r.status == Status.UNSUPPORTED_DATATYPE and r.issues


# --- weights: never read, never needed --------------------------------------------------------------------


def test_initializer_payloads_are_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("the cheap path converted an initializer")

    monkeypatch.setattr(numpy_helper, "to_array", refuse)
    monkeypatch.setattr(onnx.numpy_helper, "to_array", refuse)
    r = glowpy.check(conv_model(weight_as_initializer=True))
    assert r.supported


def test_weights_in_a_missing_external_file() -> None:
    m = conv_model(weight_as_initializer=True)
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="does-not-exist.bin")
    assert glowpy.check(m.SerializeToString()).supported
    with pytest.raises(glowpy.GlowpyError):
        glowpy.compile(m)  # the full path needs the data


def test_bytes_path_and_proto_give_the_same_report(tmp_path: Path) -> None:
    m = conv_model(x_channels=5)
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    reports = [glowpy.check(x) for x in (m, m.SerializeToString(), path, str(path))]
    assert len({json.dumps(r.to_dict(), sort_keys=True) for r in reports}) == 1


def test_report_to_dict_is_json() -> None:
    r = glowpy.check(conv_model())
    d = json.loads(json.dumps(r.to_dict()))
    assert d["supported"] is True and d["status"] == "SUCCESS" and d["nodes"][0]["name"] == "conv"


# --- the backend's word ------------------------------------------------------------------------------------


class PickyBackend(Backend):
    """Has no Gemm kernel but lowers it (FALLBACK), cannot run Sigmoid."""

    name = "picky"

    def should_lower(self, node: Node) -> bool:
        return node.op == "Gemm"

    def is_op_supported(self, node: Node) -> bool:
        return node.op not in ("Sigmoid", "Gemm")

    def compile(self, graph, **options):  # pragma: no cover - never compiled here
        raise NotImplementedError


def test_backend_refines_the_verdict() -> None:
    nodes = [helper.make_node("Gemm", ["A", "B"], ["C"], name="gemm"),
             helper.make_node("Sigmoid", ["C"], ["D"], name="sig"),
             helper.make_node("Relu", ["D"], ["Y"], name="relu")]
    m = model(nodes, [vi("A", [2, 3]), vi("B", [3, 4])], [vi("Y", [2, 4])])
    r = glowpy.check(m, backend=PickyBackend())
    assert [v.status for v in r.nodes] == [Status.FALLBACK, Status.UNSUPPORTED_OPERATOR, Status.SUCCESS]
    assert "picky" in r.nodes[0].reason and "'sig'" in r.nodes[1].reason
    assert r.backend_consulted and r.backend == "picky"
    only_fallback = glowpy.check(model(nodes[:1], [vi("A", [2, 3]), vi("B", [3, 4])], [vi("C", [2, 4])]),
                                 backend=PickyBackend())
    assert only_fallback.supported and only_fallback.status == Status.FALLBACK


def test_unavailable_backend_falls_back_to_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import glowpy.backends as backends
    from glowpy.errors import UnsupportedAttribute

    def absent():
        raise UnsupportedAttribute("cannot be created on this machine")

    monkeypatch.setitem(backends.BACKENDS, "ghost", absent)
    monkeypatch.setattr(backends, "_FOUND", {})
    r = glowpy.check(conv_model(), backend="ghost")
    assert r.supported and not r.backend_consulted and r.backend == "ghost"


def test_unknown_backend_name_raises() -> None:
    with pytest.raises(glowpy.GlowpyError):
        glowpy.check(conv_model(), backend="no-such-backend")


# --- the CLI --------------------------------------------------------------------------------------------------


class Ran:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture):
    from glowpy.cli import main

    def run(*args: str) -> Ran:
        code = main(["check", *args])
        out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    return run


def test_cli_entry_point_exit_code(tmp_path: Path) -> None:
    path = tmp_path / "bad.onnx"
    onnx.save(model([unsupported(["X"], ["Y"], name="s")], [vi("X", [2])], [vi("Y", [2])]), str(path))
    p = subprocess.run([sys.executable, "-m", "glowpy.cli", "check", str(path), "--backend", "interpreter"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 1 and "UNSUPPORTED_OPERATOR" in p.stdout


def test_cli(tmp_path: Path, run_cli) -> None:
    good, bad, garbage = tmp_path / "good.onnx", tmp_path / "bad.onnx", tmp_path / "garbage.onnx"
    onnx.save(conv_model(), str(good))
    nodes = [helper.make_node("Relu", ["X"], ["A"], name="ok1"), unsupported(["A"], ["B"], name="bad1"),
             helper.make_node("Relu", ["B"], ["Y"], name="ok2")]
    onnx.save(model(nodes, [vi("X", [2, 3])], [vi("Y", [2, 3])]), str(bad))
    garbage.write_bytes(b"\x00garbage")

    p = run_cli(str(good), "--backend", "interpreter")
    assert p.returncode == 0, p.stderr
    assert "conv" in p.stdout and "SUCCESS" in p.stdout and "summary:" in p.stdout

    p = run_cli(str(bad), "--backend", "interpreter", "--partition")
    assert p.returncode == 1, p.stderr
    assert "bad1" in p.stdout and "UNSUPPORTED_OPERATOR" in p.stdout
    assert "subgraph 0" in p.stdout and "subgraph 1" in p.stdout and "host: node 'bad1'" in p.stdout

    p = run_cli(str(bad), "--json", "--partition", "--backend", "interpreter")
    assert p.returncode == 1
    d = json.loads(p.stdout)
    assert d["supported"] is False and [n["status"] for n in d["nodes"]].count("UNSUPPORTED_OPERATOR") == 1
    assert len(d["partition"]["subgraphs"]) == 2

    p = run_cli(str(garbage))
    assert p.returncode == 2 and "INVALID_PROTOBUF" not in p.stdout and p.stderr
    p = run_cli(str(tmp_path / "absent.onnx"), "--json")
    assert p.returncode == 2 and json.loads(p.stdout)["readable"] is False


def test_big_constant_node_is_typed_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    w = np.ones((64, 3, 5, 5), np.float32)  # over the size a shape-like constant has
    nodes = [helper.make_node("Constant", [], ["W"], name="weight", value=numpy_helper.from_array(w)),
             helper.make_node("Conv", ["X", "W"], ["Y"], name="conv")]
    m = model(nodes, [vi("X", [1, 3, 8, 8])], [vi("Y", [1, 64, 4, 4])])

    def refuse(*a, **k):
        raise AssertionError("the cheap path converted a weight")

    monkeypatch.setattr(numpy_helper, "to_array", refuse)
    r = glowpy.check(m)
    assert r.supported and [v.status for v in r.nodes] == [Status.SUCCESS] * 2
    assert "shapes not checked" not in r.nodes[1].reason
