"""glowpy.partition: offloadable subgraphs, host nodes, no cycles, stitched results match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.errors import Status
from glowpy.importer.walk import reads

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
SUPPORTED = ("Relu", "Sigmoid", "Tanh", "Neg")  # unary ops glowpy runs
HOST_DOMAIN = "ai.onnx.ml"  # glowpy has no op of this domain; onnxruntime runs its Binarizer
OPSETS = [helper.make_opsetid("", 13), helper.make_opsetid(HOST_DOMAIN, 1)]


def host_node(inputs: list[str], outputs: list[str], name: str) -> onnx.NodeProto:
    """A node only the host (onnxruntime) runs: float -> float of the same shape."""
    return helper.make_node("Binarizer", inputs, outputs, name=name, domain=HOST_DOMAIN, threshold=0.1)


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, {k: v for k, v in feeds.items() if k in {i.name for i in s.get_inputs()}})))


def host_node_model(model: onnx.ModelProto, node: onnx.NodeProto, env: dict[str, np.ndarray]) -> onnx.ModelProto:
    """`node` alone as a model: what it reads (its inputs and the outer values its bodies capture) as
    inputs when computed, as initializers when they are the model's."""
    weights = {t.name: t for t in model.graph.initializer}
    names = list(dict.fromkeys(x for x in reads(node) if x and (x in env or x in weights)))
    ins = [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(env[x].dtype), env[x].shape)
           for x in names if x in env]
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], "host", ins, outs, [weights[x] for x in names if x not in env])
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def run_stitched(model: onnx.ModelProto, feeds: dict[str, np.ndarray], backend: str = "interpreter"
                 ) -> dict[str, np.ndarray]:
    """Follow the partition's plan: subgraphs through glowpy, host nodes through onnxruntime."""
    part = glowpy.partition(model, backend=backend)
    env = dict(feeds)
    for kind, k in part.plan:
        if kind == "subgraph":
            sub = part.subgraphs[k]
            for i in sub.graph.input:
                assert i.name in env, f"subgraph {k} needs '{i.name}' before it is produced"
            compiled = glowpy.compile(sub, backend=backend)
            env.update(compiled.run({i.name: env[i.name] for i in sub.graph.input}))
        else:
            node = model.graph.node[k]
            for x in node.input:
                assert not x or x in env, f"host node {node.name} needs '{x}' before it is produced"
            env.update(ort_run(host_node_model(model, node, env), env))
    return {o.name: env[o.name] for o in model.graph.output}


def middle_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "B"),
             numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "S")]
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             host_node(["r"], ["s"], name="sin"),
             helper.make_node("Mul", ["s", "S"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "r"], ["a"], name="add"),
             helper.make_node("Sigmoid", ["a"], ["Y"], name="sigmoid")]
    g = helper.make_graph(nodes, "middle", [helper.make_tensor_value_info("X", F, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("Y", F, [1, 4, 8, 8])], initializer=inits)
    return helper.make_model(g, opset_imports=OPSETS)


def test_unsupported_op_in_the_middle_splits_in_two(backend: str) -> None:
    m = middle_model()
    part = glowpy.partition(m, backend=backend)
    assert len(part.subgraphs) == 2
    assert [n.name for n in part.host_nodes] == ["sin"]
    assert [k for k, _ in part.plan] == ["subgraph", "host", "subgraph"]
    first, second = part.subgraphs
    assert [n.name for n in first.graph.node] == ["conv", "relu"]
    assert [n.name for n in second.graph.node] == ["mul", "add", "sigmoid"]
    # Boundaries are declared with types and shapes; the initializers each part uses travel with it.
    assert {i.name for i in first.graph.initializer} == {"W", "B"}
    assert {i.name for i in second.graph.initializer} == {"S"}
    assert [o.name for o in first.graph.output] == ["r"]
    assert sorted(i.name for i in second.graph.input) == ["r", "s"]
    for sub in part.subgraphs:
        onnx.checker.check_model(sub)
        for v in list(sub.graph.input) + list(sub.graph.output):
            dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
            assert v.type.tensor_type.elem_type == F and dims == [1, 4, 8, 8] or v.name == "X"
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = run_stitched(m, {"X": x}, backend)
    want = ort_run(m, {"X": x})
    np.testing.assert_allclose(got["Y"], want["Y"], rtol=1e-5, atol=1e-5)


def test_no_cycle_through_a_host_node() -> None:
    # a -> sin -> b and a -> b: putting a and b in one subgraph would need sin's output before it runs.
    nodes = [helper.make_node("Relu", ["X"], ["a"], name="a"),
             host_node(["a"], ["h"], name="host"),
             helper.make_node("Add", ["a", "h"], ["Y"], name="b")]
    m = helper.make_model(helper.make_graph(nodes, "diamond", [helper.make_tensor_value_info("X", F, [3])],
                                            [helper.make_tensor_value_info("Y", F, [3])]),
                          opset_imports=OPSETS)
    part = glowpy.partition(m, backend="interpreter")
    assert part.subgraph_nodes == [[0], [2]]
    assert part.plan == [("subgraph", 0), ("host", 1), ("subgraph", 1)]
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    np.testing.assert_allclose(run_stitched(m, {"X": x})["Y"], ort_run(m, {"X": x})["Y"], rtol=1e-6)


def test_independent_host_branch_does_not_split() -> None:
    # X -> r1 -> r2 -> Y1 and X -> sin -> Y2: the supported chain stays one subgraph.
    nodes = [helper.make_node("Relu", ["X"], ["a"], name="r1"), helper.make_node("Tanh", ["a"], ["Y1"], name="r2"),
             host_node(["X"], ["Y2"], name="host")]
    m = helper.make_model(helper.make_graph(nodes, "branch", [helper.make_tensor_value_info("X", F, [3])],
                                            [helper.make_tensor_value_info("Y1", F, [3]),
                                             helper.make_tensor_value_info("Y2", F, [3])]),
                          opset_imports=OPSETS)
    part = glowpy.partition(m, backend="interpreter")
    assert part.subgraph_nodes == [[0, 1]] and [n.name for n in part.host_nodes] == ["host"]


def test_group_graph_cycle_avoided() -> None:
    # a1 -> h1 -> b1 -> b3 <- b2 <- h2?  No: b2 -> h2 -> a2, a1 -> a2. Grouping {a1, a2} and {b1, b2, b3}
    # would make the groups depend on each other through h1 and h2 (each group fine on its own).
    nodes = [helper.make_node("Relu", ["X"], ["a1"], name="a1"),
             host_node(["a1"], ["h1"], name="h1"),
             helper.make_node("Relu", ["h1"], ["b1"], name="b1"),
             helper.make_node("Neg", ["X"], ["b2"], name="b2"),
             helper.make_node("Add", ["b1", "b2"], ["b3"], name="b3"),
             host_node(["b2"], ["h2"], name="h2"),
             helper.make_node("Add", ["a1", "h2"], ["a2"], name="a2")]
    m = helper.make_model(helper.make_graph(nodes, "cross", [helper.make_tensor_value_info("X", F, [3])],
                                            [helper.make_tensor_value_info("a2", F, [3]),
                                             helper.make_tensor_value_info("b3", F, [3])]),
                          opset_imports=OPSETS)
    part = glowpy.partition(m, backend="interpreter")
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    got, want = run_stitched(m, {"X": x}), ort_run(m, {"X": x})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6)
    assert sorted(i for idx in part.subgraph_nodes for i in idx) == [0, 2, 3, 4, 6]


def random_model(seed: int) -> onnx.ModelProto:
    """A random DAG of unary and binary ops over [2, 3] tensors, some of them host-only."""
    rng = np.random.default_rng(seed)
    values, nodes = ["X"], []
    for i in range(int(rng.integers(3, 14))):
        host = rng.random() < 0.3
        if not host and rng.random() < 0.4 and len(values) > 1:
            a, b = rng.choice(values, 2, replace=False)
            nodes.append(helper.make_node(str(rng.choice(["Add", "Mul"])), [a, b], [f"v{i}"], name=f"n{i}"))
        else:
            src = [str(rng.choice(values))]
            nodes.append(host_node(src, [f"v{i}"], f"n{i}") if host
                         else helper.make_node(str(rng.choice(SUPPORTED)), src, [f"v{i}"], name=f"n{i}"))
        values.append(f"v{i}")
    used = {x for n in nodes for x in n.input}
    outs = [v for v in values[1:] if v not in used] or [values[-1]]
    g = helper.make_graph(nodes, f"random{seed}", [helper.make_tensor_value_info("X", F, [2, 3])],
                          [helper.make_tensor_value_info(o, F, [2, 3]) for o in outs])
    return helper.make_model(g, opset_imports=OPSETS)


@pytest.mark.parametrize("seed", range(40))
def test_random_dags_partition_and_stitch(seed: int) -> None:
    m = random_model(seed)
    part = glowpy.partition(m, backend="interpreter")
    report = part.report
    supported = {v.index for v in report.nodes if v.status in (Status.SUCCESS, Status.FALLBACK)}
    placed = [i for idx in part.subgraph_nodes for i in idx]
    assert sorted(placed) == sorted(supported)  # every supported node in exactly one subgraph
    assert sorted(k for kind, k in part.plan if kind == "host") == sorted(set(range(len(m.graph.node))) - supported)
    x = np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32)
    got, want = run_stitched(m, {"X": x}), ort_run(m, {"X": x})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_partition_of_unreadable_bytes_raises() -> None:
    with pytest.raises(glowpy.GlowpyError) as info:
        glowpy.partition(b"\x00garbage")
    assert info.value.status == Status.INVALID_PROTOBUF
