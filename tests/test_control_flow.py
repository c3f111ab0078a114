"""If / Loop / Scan: import, IR (printing, verification), optimizer, interpreter and cpu against
onnx.reference.ReferenceEvaluator, and the compatibility check's body verdicts."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.errors import GlowpyError, InvalidModel, UnsupportedOperator, UnsupportedShape
from glowpy.importer.onnx_import import import_model
from glowpy.optimizer import eliminate_dead_code
from glowpy.pipeline import optimized_graph

BACKENDS = ("interpreter", "cpu")
F = T.FLOAT


def vi(name: str, elem: int, shape: list[int] | None) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, opset: int = 17, inits=()) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def onnxruntime_outputs(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime

    return onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def agree(m: onnx.ModelProto, feeds: dict[str, np.ndarray], backend: str, oracle=None) -> None:
    expected = ReferenceEvaluator(m).run(None, feeds) if oracle is None else oracle(m, feeds)
    got = glowpy.compile(m, backend=backend).run(feeds)
    for out, want in zip(m.graph.output, expected):
        np.testing.assert_allclose(got[out.name], want, rtol=1e-5, atol=1e-6, err_msg=out.name)
        assert got[out.name].shape == want.shape


def if_model(cond_init: bool | None = None, else_shape=(2, 3)) -> onnx.ModelProto:
    """y = cond ? x + w : x * x, both branches reading outer values (x, w) they do not name as inputs."""
    then = h.make_graph([h.make_node("Add", ["x", "w"], ["t"])], "then", [], [vi("t", F, [2, 3])])
    if else_shape == (2, 3):
        other = h.make_graph([h.make_node("Mul", ["x", "x"], ["e"])], "else", [], [vi("e", F, [2, 3])])
    else:
        other = h.make_graph([h.make_node("ReduceMax", ["x"], ["e"], axes=[0], keepdims=1)], "else", [],
                             [vi("e", F, list(else_shape))])
    w = h.make_node("Relu", ["x"], ["w"])  # used only inside then_branch
    node = h.make_node("If", ["c"], ["y"], name="choose", then_branch=then, else_branch=other)
    inputs = [vi("x", F, [2, 3])]
    inits = []
    if cond_init is None:
        inputs.append(vi("c", T.BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(cond_init), "c"))
    return model([w, node], inputs, [vi("y", F, [2, 3])], inits=inits)


X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_if_condition_at_run_time(backend):
    m = if_model()
    for c in (True, False):
        agree(m, {"x": X, "c": np.array(c)}, backend)


def test_if_runtime_condition_compiles_both_branches_into_one_native_call():
    g = optimized_graph(if_model(), "cpu")
    ops = g.count_ops()
    assert "If" not in ops and ops.get("Where") == 1 and ops.get("Add") == 1 and ops.get("Mul") == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cond", [True, False])
def test_if_known_condition_inlines_its_branch(backend, cond):
    m = if_model(cond_init=cond)
    g = optimized_graph(m, backend)
    assert "If" not in g.count_ops() and "Where" not in g.count_ops()
    assert ("Add" if cond else "Mul") in g.count_ops()
    agree(m, {"x": X}, backend)


def test_if_graph_prints_bodies_indented_and_verifies_them():
    g = import_model(if_model())
    text = str(g)
    assert "= If(%c, %x, %w, %x)" in text
    assert "\n    then_branch:\n      graph then(\n" in text and "\n        %t: f32[2, 3] = Add(%x, %w)" in text
    g.verify()
    body = g.nodes.last.attrs["else_branch"]
    body.outputs = [g.inputs[0]]  # a value of the enclosing graph: not defined in the closed body
    with pytest.raises(InvalidModel, match="in its else_branch: graph output 'x' is not defined"):
        g.verify()


def test_dead_code_elimination_keeps_values_read_only_inside_a_body():
    g = import_model(if_model())
    eliminate_dead_code(g)
    assert "Relu" in g.count_ops()  # w feeds only then_branch
    g.verify()
    out = glowpy.compile(g, backend="interpreter").run({"x": X, "c": np.array(True)})
    np.testing.assert_allclose(out["y"], X + np.maximum(X, 0))


def test_if_branches_of_different_shapes_are_refused_precisely():
    m = if_model(else_shape=(1, 3))
    m.graph.output[0].type.tensor_type.ClearField("shape")
    with pytest.raises(UnsupportedShape, match=r"node 'choose' \(If.*different shapes.*then_branch \[2, 3\].*"
                                               r"else_branch \[1, 3\]"):
        import_model(m)
    v = glowpy.check(m, "cpu").nodes[1]
    assert v.status.name == "UNSUPPORTED_SHAPE" and "choose" in v.reason and "[1, 3]" in v.reason


def test_check_reports_body_nodes_by_path():
    m = if_model()
    next(a for a in m.graph.node[1].attribute if a.name == "else_branch").g.node[0].op_type = "NoSuchOp"
    report = glowpy.check(m, "cpu")
    v = report.nodes[1]
    assert not v.supported and "in its else_branch" in v.reason and "NoSuchOp" in v.reason
    names = {b.name: b for b in v.body}
    assert names["choose/then_branch/t"].supported and not names["choose/else_branch/e"].supported
    assert [w.name for w in v.walk()] == ["choose", "choose/then_branch/t", "choose/else_branch/e"]
    assert report.to_dict()["nodes"][1]["body"][1]["op"] == "NoSuchOp"
    with pytest.raises(UnsupportedOperator, match="NoSuchOp"):
        import_model(m)


# --- Loop -----------------------------------------------------------------------------------------


def loop_model(m_value: int | None, *, early_exit: bool = False, opset: int = 16, scan: bool = True,
               inner_if: bool = False) -> onnx.ModelProto:
    """y = y + x * i each iteration (x from the enclosing graph), scan output y; with early_exit the
    body stops when sum(y) exceeds 20; with inner_if the step is x * i only in the first two iterations."""
    nodes = [h.make_node("Cast", ["i"], ["fi"], to=F)]
    if inner_if:
        two = h.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2, np.int64)))
        nodes += [two, h.make_node("Less", ["i", "two"], ["even"])]
        then = h.make_graph([h.make_node("Mul", ["x", "fi"], ["s1"])], "then", [], [vi("s1", F, [3])])
        other = h.make_graph([h.make_node("Sub", ["x", "x"], ["s2"])], "else", [], [vi("s2", F, [3])])
        nodes.append(h.make_node("If", ["even"], ["step"], then_branch=then, else_branch=other))
    else:
        nodes.append(h.make_node("Mul", ["x", "fi"], ["step"]))
    nodes.append(h.make_node("Add", ["y_in", "step"], ["y_out"]))
    if early_exit:
        lim = h.make_node("Constant", [], ["lim"], value=numpy_helper.from_array(np.array(20, np.float32)))
        nodes += [lim, h.make_node("ReduceSum", ["y_out"], ["tot"], keepdims=0),
                  h.make_node("Less", ["tot", "lim"], ["c_out"])]
    else:
        nodes.append(h.make_node("Identity", ["c_in"], ["c_out"]))
    outs = [vi("c_out", T.BOOL, []), vi("y_out", F, [3])]
    if scan:
        nodes.append(h.make_node("Identity", ["y_out"], ["scan"]))
        outs.append(vi("scan", F, [3]))
    body = h.make_graph(nodes, "body", [vi("i", T.INT64, []), vi("c_in", T.BOOL, []), vi("y_in", F, [3])], outs)
    inputs, inits = [vi("x", F, [3]), vi("y0", F, [3])], [numpy_helper.from_array(np.array(True), "c0")]
    if m_value is None:
        inputs.append(vi("M", T.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(m_value, np.int64), "M"))
    graph_outs = [vi("y", F, [3])] + ([vi("ys", F, [m_value or 4, 3])] if scan else [])
    loop = h.make_node("Loop", ["M", "c0", "y0"], ["y", "ys"][:len(graph_outs)], name="loop", body=body)
    return model([loop], inputs, graph_outs, opset=opset, inits=inits)


XL = np.array([1.0, -2.0, 0.5], np.float32)
Y0 = np.array([0.25, 1.0, -1.0], np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opset", [11, 16])
def test_loop_static_trip_count_with_scan_output(backend, opset):
    agree(loop_model(4, opset=opset), {"x": XL, "y0": Y0}, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_loop_condition_decided_at_run_time(backend):
    m = loop_model(10, early_exit=True, scan=False)
    agree(m, {"x": np.array([3.0, 1.0, 2.0], np.float32), "y0": Y0}, backend)  # stops after 3 iterations
    agree(m, {"x": np.array([0.0, 0.1, 0.0], np.float32), "y0": Y0}, backend)  # runs all 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_loop_trip_count_at_run_time(backend):
    """The cpu backend runs it as a native loop (tests/backends/cpu/test_loop_native.py has the rest)."""
    m = loop_model(None, scan=False)
    for trips in (0, 3, 7):
        agree(m, {"x": XL, "y0": Y0, "M": np.array(trips, np.int64)}, backend)
    assert glowpy.check(m, "cpu").nodes[0].status.name == "SUCCESS"


def test_loop_scan_output_length_must_be_static():
    m = loop_model(None)
    m.graph.output[1].type.tensor_type.ClearField("shape")
    with pytest.raises(UnsupportedShape, match="scan outputs need a trip count known at compile time"):
        import_model(m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_if_inside_loop(backend):
    agree(loop_model(5, inner_if=True), {"x": XL, "y0": Y0}, backend)
    text = str(import_model(loop_model(5, inner_if=True)))
    assert "    body:\n" in text and "          then_branch:\n" in text


# --- Scan -----------------------------------------------------------------------------------------


def scan_model(opset: int, in_axis: int = 0, in_dir: int = 0, out_axis: int = 0, out_dir: int = 0):
    """A running sum over the scan axis of x (3 x 4); the body also reads b from the enclosing graph."""
    body = h.make_graph([h.make_node("Add", ["s_in", "xe"], ["s_out"]), h.make_node("Mul", ["s_out", "b"], ["o"])],
                        "body", [vi("s_in", F, [3 if in_axis == 1 else 4]), vi("xe", F, [3 if in_axis == 1 else 4])],
                        [vi("s_out", F, None), vi("o", F, None)])
    attrs = {"num_scan_inputs": 1, "scan_input_directions": [in_dir], "scan_output_directions": [out_dir]}
    if opset >= 11:
        attrs |= {"scan_input_axes": [in_axis - 2 if in_axis else 0], "scan_output_axes": [out_axis]}
    node = h.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, **attrs)
    n = 3 if in_axis == 1 else 4
    return model([node], [vi("s0", F, [n]), vi("x", F, [3, 4]), vi("b", F, [n])], [vi("s", F, [n]), vi("ys", F, None)],
                 opset=opset)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("opset", "in_axis", "in_dir", "out_axis", "out_dir"),
                         [(9, 0, 1, 0, 1), (11, 1, 0, 1, 0), (16, 1, 1, -1, 1)])
def test_scan(backend, opset, in_axis, in_dir, out_axis, out_dir):
    m = scan_model(opset, in_axis, in_dir, out_axis, out_dir)
    n = 3 if in_axis == 1 else 4
    feeds = {"s0": np.linspace(-1, 1, n).astype(np.float32), "x": np.arange(12, dtype=np.float32).reshape(3, 4),
             "b": np.linspace(0.5, 2, n).astype(np.float32)}
    # onnx's reference Scan implements only forward directions and axis 0: onnxruntime is the oracle here
    agree(m, feeds, backend, oracle=onnxruntime_outputs)


# --- LSTM in a branch (interpreter: the cpu LSTM kernel is not part of this work) ---------------------


def test_lstm_inside_if_branch():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 16, 3)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.standard_normal((1, 16, 4)).astype(np.float32), "R")
    then = h.make_graph([h.make_node("LSTM", ["x", "W", "R"], ["", "hy"], hidden_size=4)], "then", [],
                        [vi("hy", F, [1, 2, 4])])
    other = h.make_graph([h.make_node("ReduceMean", ["x"], ["mean"], axes=[0, 2], keepdims=1),
                          h.make_node("Expand", ["mean", "shape"], ["e"])], "else", [], [vi("e", F, [1, 2, 4])])
    shape = numpy_helper.from_array(np.array([1, 2, 4], np.int64), "shape")
    m = model([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [vi("x", F, [5, 2, 3]), vi("c", T.BOOL, [])], [vi("y", F, [1, 2, 4])], inits=[w, r, shape], opset=17)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    for c in (True, False):
        agree(m, {"x": x, "c": np.array(c)}, "interpreter")
    v = glowpy.check(m, "interpreter").nodes[0]
    assert [b.op for b in v.body] == ["LSTM", "ReduceMean", "Expand"] and v.supported


def test_body_output_of_sequence_type_is_refused_with_reason():
    then = h.make_graph([h.make_node("SequenceConstruct", ["x"], ["s"])], "then", [],
                        [h.make_tensor_sequence_value_info("s", F, [2, 3])])
    other = h.make_graph([h.make_node("SequenceConstruct", ["x"], ["s2"])], "else", [],
                         [h.make_tensor_sequence_value_info("s2", F, [2, 3])])
    m = model([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [vi("x", F, [2, 3]), vi("c", T.BOOL, [])], [h.make_tensor_sequence_value_info("y", F, [2, 3])])
    with pytest.raises(GlowpyError, match="SequenceConstruct"):
        import_model(m)
    assert "SequenceConstruct" in glowpy.check(m, "cpu").reason


def test_partition_sees_body_reads_and_reports_body_nodes():
    m = if_model()
    m.graph.node.append(h.make_node("Neg", ["x"], ["unused"]))
    next(a for a in m.graph.node[1].attribute if a.name == "else_branch").g.node[0].op_type = "NoSuchOp"
    p = glowpy.partition(m, "cpu")
    assert [n.op_type for n in p.host_nodes] == ["If"]
    host = p.to_dict()["host_nodes"][0]
    assert {"name": "choose/else_branch/e", "op": "NoSuchOp", "status": "UNSUPPORTED_OPERATOR"} in host["body"]
    assert any("body node 'choose/else_branch/e' (NoSuchOp)" in line for line in p.describe())
    # w (Relu) is read by the If's then_branch only: its subgraph must export it
    relu = next(s for s in p.subgraphs if any(n.op_type == "Relu" for n in s.graph.node))
    assert "w" in [o.name for o in relu.graph.output]

    m = if_model()  # all supported: one subgraph holds the Relu and the If that reads w
    p = glowpy.partition(m, "cpu")
    assert len(p.subgraphs) == 1 and not p.host_nodes
    assert sorted(i.name for i in p.subgraphs[0].graph.input) == ["c", "x"]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_zoo_conv_lstm_if_runs_on_the_interpreter(exporter):
    """The zoo model with a conv front end, an LSTM and an If on an input flag matches onnxruntime (on cpu
    it also needs an LSTM kernel: tests/zoo/expected.json records where it stops)."""
    from tests.zoo.harness import mismatches, realized

    m = realized(f"conv_lstm_if.{exporter}")
    assert mismatches(m, glowpy.compile(m, backend="interpreter")) == []
    assert any(n.op_type == "If" for n in m.graph.node)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("build", [lambda: loop_model(None, scan=False), lambda: loop_model(4, inner_if=True),
                                   lambda: scan_model(16, 1, 1, -1, 1), lambda: if_model(else_shape=(1, 3))])
def test_check_agrees_with_compile(backend, build):
    m = build()
    try:
        glowpy.compile(m, backend=backend)
        compiled = True
    except GlowpyError:
        compiled = False
    assert glowpy.check(m, backend).supported == compiled


def heavy_if_model() -> onnx.ModelProto:
    """then: two MatMuls and a Relu; else: a Sigmoid (fused with the select)."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32) / 8, "W")
    then = h.make_graph([h.make_node("MatMul", ["x", "W"], ["a"]), h.make_node("MatMul", ["a", "W"], ["b"]),
                         h.make_node("Relu", ["b"], ["t"])], "then", [], [vi("t", F, [32, 32])])
    other = h.make_graph([h.make_node("Sigmoid", ["x"], ["e"])], "else", [], [vi("e", F, [32, 32])])
    return model([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                 [vi("x", F, [32, 32]), vi("c", T.BOOL, [])], [vi("y", F, [32, 32])], inits=[w])


def test_cpu_skips_the_branch_not_taken_inside_the_native_call():
    from glowpy.backends.cpu import codegen
    from glowpy.backends.cpu.target import host_target

    m = heavy_if_model()
    program = codegen.build(optimized_graph(m, "cpu"), host_target(), nthreads=2)
    guarded = {s.name.split(".")[1]: s.guard for s in program.steps if s.fn is not None}
    assert guarded["MatMul"] is not None and guarded["MatMul"][0].name == "c" and guarded["MatMul"][1] is True
    assert guarded["Sigmoid"] is None  # fused with the Where: runs either way
    assert "guard0.then:" in program.ir_text
    x = np.random.default_rng(2).standard_normal((32, 32)).astype(np.float32)
    for threads in (1, 2):
        compiled = glowpy.compile(m, backend="cpu", threads=threads)
        for c in (True, False, True):
            want = ReferenceEvaluator(m).run(None, {"x": x, "c": np.array(c)})[0]
            np.testing.assert_allclose(compiled.run({"x": x, "c": np.array(c)})["y"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan8_batches_and_directions(backend):
    body = h.make_graph([h.make_node("Add", ["s_in", "xe"], ["s_out"]), h.make_node("Identity", ["s_out"], ["o"])],
                        "body", [vi("s_in", F, [2]), vi("xe", F, [2])], [vi("s_out", F, [2]), vi("o", F, [2])])
    node = h.make_node("Scan", ["", "s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, directions=[1])
    m = model([node], [vi("s0", F, [3, 2]), vi("x", F, [3, 4, 2])], [vi("s", F, [3, 2]), vi("ys", F, [3, 4, 2])],
              opset=8)
    feeds = {"s0": np.arange(6, dtype=np.float32).reshape(3, 2), "x": np.arange(24, dtype=np.float32).reshape(3, 4, 2)}
    agree(m, feeds, backend, oracle=onnxruntime_outputs)  # the reference has no Scan-8 directions
    node.input[0] = "lens"
    m = model([node], [vi("lens", T.INT64, [3]), vi("s0", F, [3, 2]), vi("x", F, [3, 4, 2])],
              [vi("s", F, [3, 2]), vi("ys", F, [3, 4, 2])], opset=8)
    with pytest.raises(UnsupportedShape, match="sequence_lens must be known and equal to the full sequence length"):
        glowpy.compile(m, backend=backend)
