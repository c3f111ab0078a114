"""Loop with a trip count or condition decided at run time: a native loop inside the one native call
(glowpy/backends/cpu/loops.py), against onnx.reference on the interpreter and the cpu backend."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import glowpy
from glowpy.backends.cpu.target import isa_available
from glowpy.errors import MismatchingShape, UnsupportedShape

F = T.FLOAT
# (backend, compile options): the interpreter, the cpu backend on the host ISA, 8-lane AVX2 code, 2 threads
ENGINES = [("interpreter", {}), ("cpu", {}), ("cpu", {"isa": "avx2"}), ("cpu", {"threads": 2})]
IDS = ["interpreter", "cpu", "cpu-avx2", "cpu-2threads"]


def vi(name: str, elem: int, shape: list[int] | None) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, shape)


def const(name: str, value) -> onnx.NodeProto:
    return h.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def compile_on(m: onnx.ModelProto, backend: str, options: dict):
    if options.get("isa") == "avx2" and not isa_available("avx2"):
        pytest.fail("the AVX2 variant needs an x86 host with AVX2")
    return glowpy.compile(m, backend=backend, **options)


def native_loop(exe) -> bool:
    """The compiled cpu model has a Loop step (a native loop, not an unrolled one)."""
    return any(s.op == "Loop" for s in exe.executable.layout.profile_steps)


def reference_outputs(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ReferenceEvaluator(m).run(None, feeds)


def onnxruntime_outputs(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime

    sess = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def agree(m: onnx.ModelProto, feeds_list: list[dict], backend: str, options: dict, native: bool = True,
          oracle=None) -> None:
    oracle = oracle or reference_outputs
    exe = compile_on(m, backend, options)
    if backend == "cpu" and native:
        assert native_loop(exe)
    for feeds in feeds_list:
        want = oracle(m, feeds)
        got = exe.run(feeds)
        for o, w in zip(m.graph.output, want):
            np.testing.assert_allclose(got[o.name], w, rtol=1e-6, atol=1e-6, err_msg=f"{o.name} {feeds}")


def while_model(with_m: bool = True, with_cond: bool = True) -> onnx.ModelProto:
    """x = x * 2 + c (c from the enclosing graph) and n = n + 1 while sum(x) < limit (and i < M); three
    carried values of different shapes and types: x [2, 3], n int64 [], t [4] (t = t + i)."""
    body = h.make_graph([
        const("two", np.float32(2)),
        h.make_node("Mul", ["x_in", "two"], ["x2"]),
        h.make_node("Add", ["x2", "c"], ["x_out"]),
        const("one", np.int64(1)),
        h.make_node("Add", ["n_in", "one"], ["n_out"]),
        h.make_node("Cast", ["i"], ["fi"], to=F),
        h.make_node("Add", ["t_in", "fi"], ["t_out"]),
        h.make_node("ReduceSum", ["x_out"], ["s"], keepdims=0),
        h.make_node("Less", ["s", "limit"], ["cond_out"]),
    ], "body", [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), vi("x_in", F, [2, 3]), vi("n_in", T.INT64, []),
                vi("t_in", F, [4])],
        [vi("cond_out", T.BOOL, []), vi("x_out", F, [2, 3]), vi("n_out", T.INT64, []), vi("t_out", F, [4])])
    inputs = [vi("x0", F, [2, 3]), vi("c0", F, [2, 3]), vi("limit", F, []), vi("n0", T.INT64, []), vi("t0", F, [4])]
    inputs += [vi("M", T.INT64, [])] if with_m else []
    inputs += [vi("cond", T.BOOL, [])] if with_cond else []
    loop = h.make_node("Loop", ["M" if with_m else "", "cond" if with_cond else "", "x0", "n0", "t0"],
                       ["x", "n", "t"], body=body, name="loop")
    relu = h.make_node("Relu", ["c0"], ["c"])  # a capture computed in the enclosing graph
    return model([relu, loop], inputs, [vi("x", F, [2, 3]), vi("n", T.INT64, []), vi("t", F, [4])])


def while_feeds(limit: float, m: int | None = None, cond: bool | None = None) -> dict:
    rng = np.random.default_rng(int(limit) & 0xFF)
    f = {"x0": rng.random((2, 3), np.float32), "c0": rng.standard_normal((2, 3)).astype(np.float32),
         "limit": np.array(limit, np.float32), "n0": np.array(5, np.int64), "t0": np.arange(4, dtype=np.float32)}
    if m is not None:
        f["M"] = np.array(m, np.int64)
    if cond is not None:
        f["cond"] = np.array(cond)
    return f


@pytest.mark.parametrize(("backend", "options"), ENGINES, ids=IDS)
def test_trip_count_and_condition_at_run_time(backend, options):
    feeds = [while_feeds(1e9, 7, True),  # M ends it
             while_feeds(60.0, 100, True),  # the condition ends it
             while_feeds(1e9, 0, True),  # M = 0: the initial values
             while_feeds(1e9, 5, False),  # false at entry: the initial values
             while_feeds(-1.0, 4, True)]  # one iteration, then the condition is false
    agree(while_model(), feeds, backend, options)


@pytest.mark.parametrize(("backend", "options"), ENGINES[:2], ids=IDS[:2])
def test_condition_only_and_trip_count_only(backend, options):
    agree(while_model(with_m=False), [while_feeds(80.0, cond=True), while_feeds(80.0, cond=False)], backend, options)
    # onnx.reference runs no iteration when cond is absent (ONNX: absent means true): onnxruntime is the oracle
    agree(while_model(with_cond=False), [while_feeds(1e9, m=3), while_feeds(1e9, m=0)], backend, options,
          oracle=onnxruntime_outputs)


def swap_model() -> onnx.ModelProto:
    """(a, b, k) -> (b, a + 1, k): carried values passed on permuted and unchanged; M at run time."""
    body = h.make_graph([const("one", np.float32(1)), h.make_node("Add", ["a_in", "one"], ["a1"])], "body",
                        [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("a_in", F, [3]), vi("b_in", F, [3]),
                         vi("k_in", F, [2])],
                        [vi("c", T.BOOL, []), vi("b_in", F, [3]), vi("a1", F, [3]), vi("k_in", F, [2])])
    loop = h.make_node("Loop", ["M", "", "a0", "b0", "k0"], ["a", "b", "k"], body=body)
    return model([loop], [vi("M", T.INT64, []), vi("a0", F, [3]), vi("b0", F, [3]), vi("k0", F, [2])],
                 [vi("a", F, [3]), vi("b", F, [3]), vi("k", F, [2])])


@pytest.mark.parametrize(("backend", "options"), ENGINES[:2], ids=IDS[:2])
def test_carried_values_permuted_and_passed_through(backend, options):
    base = {"a0": np.array([1, 2, 3], np.float32), "b0": np.array([-1, -2, -3], np.float32),
            "k0": np.array([7, 8], np.float32)}
    # onnx.reference runs no iteration when cond is absent (ONNX: absent means true): onnxruntime is the oracle
    agree(swap_model(), [{**base, "M": np.array(t, np.int64)} for t in (0, 1, 2, 5)], backend, options,
          oracle=onnxruntime_outputs)


def nested_model() -> onnx.ModelProto:
    """Outer loop (M at run time) over an If on the iteration's parity and an inner loop of i + 1
    iterations (a trip count computed in the body), which reads the outer body's value `d`."""
    inner = h.make_graph([h.make_node("Add", ["y_in", "d"], ["y_out"])], "inner",
                         [vi("j", T.INT64, []), vi("cj", T.BOOL, []), vi("y_in", F, [3])],
                         [vi("cj", T.BOOL, []), vi("y_out", F, [3])])
    then = h.make_graph([h.make_node("Mul", ["acc_in", "half"], ["h1"])], "then", [], [vi("h1", F, [3])])
    other = h.make_graph([h.make_node("Neg", ["acc_in"], ["h2"])], "else", [], [vi("h2", F, [3])])
    body = h.make_graph([
        const("two", np.int64(2)), const("zero", np.int64(0)), const("one", np.int64(1)),
        const("half", np.float32(0.5)), const("true", np.array(True)),
        h.make_node("Mod", ["i", "two"], ["r"]),
        h.make_node("Equal", ["r", "zero"], ["even"]),
        h.make_node("If", ["even"], ["d"], then_branch=then, else_branch=other),
        h.make_node("Add", ["i", "one"], ["m2"]),
        h.make_node("Loop", ["m2", "true", "acc_in"], ["acc_out"], body=inner),
    ], "body", [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("acc_in", F, [3])],
        [vi("c", T.BOOL, []), vi("acc_out", F, [3])])
    loop = h.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)
    return model([loop], [vi("M", T.INT64, []), vi("acc0", F, [3])], [vi("acc", F, [3])])


@pytest.mark.parametrize(("backend", "options"), ENGINES, ids=IDS)
def test_nested_if_and_loop_inside_loop(backend, options):
    acc0 = np.array([1.0, -2.0, 0.5], np.float32)
    # the outer cond is absent: onnxruntime is the oracle (see above)
    agree(nested_model(), [{"M": np.array(t, np.int64), "acc0": acc0} for t in (0, 1, 4)], backend, options,
          oracle=onnxruntime_outputs)


def scan_model(m: int) -> onnx.ModelProto:
    """A constant trip count too large to unroll, with a scan output: y = y + x each iteration."""
    body = h.make_graph([h.make_node("Add", ["y_in", "x"], ["y_out"]), h.make_node("Identity", ["y_out"], ["s"])],
                        "body", [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("y_in", F, [2])],
                        [vi("c", T.BOOL, []), vi("y_out", F, [2]), vi("s", F, [2])])
    loop = h.make_node("Loop", ["M", "", "y0"], ["y", "ys"], body=body)
    return model([loop], [vi("x", F, [2]), vi("y0", F, [2])], [vi("y", F, [2]), vi("ys", F, [m, 2])],
                 inits=[numpy_helper.from_array(np.array(m, np.int64), "M")])


def test_static_scan_outputs_of_a_loop_too_large_to_unroll():
    m = 20001  # one body node per iteration: past MAX_UNROLLED_NODES
    exe = glowpy.compile(scan_model(m), backend="cpu")
    assert native_loop(exe)
    x, y0 = np.array([0.5, -1.0], np.float32), np.array([1.0, 2.0], np.float32)
    out = exe.run({"x": x, "y0": y0})
    want = y0 + x * np.arange(1, m + 1, dtype=np.float32)[:, None]  # exact: multiples of 0.5 below 2^24
    np.testing.assert_array_equal(out["ys"], want)
    np.testing.assert_array_equal(out["y"], want[-1])


def scan_with_run_time_m(declared: int | None, early_exit: bool = False) -> onnx.ModelProto:
    nodes = [h.make_node("Add", ["y_in", "x"], ["y_out"]), h.make_node("Identity", ["y_out"], ["s"])]
    if early_exit:
        nodes += [h.make_node("ReduceSum", ["y_out"], ["tot"], keepdims=0), const("lim", np.float32(10)),
                  h.make_node("Less", ["tot", "lim"], ["c_out"])]
    else:
        nodes.append(h.make_node("Identity", ["c"], ["c_out"]))
    body = h.make_graph(nodes, "body", [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("y_in", F, [2])],
                        [vi("c_out", T.BOOL, []), vi("y_out", F, [2]), vi("s", F, [2])])
    loop = h.make_node("Loop", ["M", "c0", "y0"], ["y", "ys"], body=body, name="loop")
    return model([loop], [vi("M", T.INT64, []), vi("x", F, [2]), vi("y0", F, [2])],
                 [vi("y", F, [2]), vi("ys", F, [declared if declared else "n", 2])],
                 inits=[numpy_helper.from_array(np.array(True), "c0")])


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_scan_output_length_from_a_fed_trip_count_specializes(backend):
    """M decides the scan output's length: each fed value compiles its own specialization; a value that
    contradicts the declared length fails cleanly (never a read or write out of bounds)."""
    x, y0 = np.array([1.0, 2.0], np.float32), np.array([0.0, 1.0], np.float32)
    m = scan_with_run_time_m(None)
    exe = glowpy.compile(m, backend=backend)
    ref = ReferenceEvaluator(m)
    for t in (3, 5):
        feeds = {"M": np.array(t, np.int64), "x": x, "y0": y0}
        got = exe.run(feeds)
        np.testing.assert_array_equal(got["ys"], ref.run(None, feeds)[1])
    assert exe.compilations == 2
    declared = glowpy.compile(scan_with_run_time_m(4), backend=backend)
    assert declared.run({"M": np.array(4, np.int64), "x": x, "y0": y0})["ys"].shape == (4, 2)
    with pytest.raises(MismatchingShape, match=r"graph output 'ys' shape disagrees.*expected \[4, 2\], found \[6, 2\]"):
        declared.run({"M": np.array(6, np.int64), "x": x, "y0": y0})


def test_scan_output_with_a_condition_that_ends_early_is_refused_in_check_and_compile():
    m = scan_with_run_time_m(4, early_exit=True)
    match = r"node 'loop' \(Loop.*scan output 'loop:1' has a length decided at run time"
    x, y0 = np.array([1.0, 2.0], np.float32), np.array([0.0, 0.0], np.float32)
    feeds = {"M": np.array(4, np.int64), "x": x, "y0": y0}
    with pytest.raises(UnsupportedShape, match=match):
        glowpy.compile(m, backend="cpu").run(feeds)
    v = glowpy.check(m, "cpu").nodes[0]
    assert v.status.name == "UNSUPPORTED_SHAPE" and "has a length decided at run time" in v.reason
    # the interpreter runs it and checks the promise at run time
    out = glowpy.compile(m, backend="interpreter").run(feeds)
    assert out["ys"].shape == (4, 2)


def test_unknown_scan_length_is_refused_by_import():
    m = scan_with_run_time_m(None, early_exit=True)
    with pytest.raises(UnsupportedShape, match="scan outputs need a trip count known at compile time"):
        glowpy.compile(m, backend="cpu").run({"M": np.array(3, np.int64), "x": np.zeros(2, np.float32),
                                              "y0": np.zeros(2, np.float32)})


def scaled_model(scale: float) -> onnx.ModelProto:
    """x = x * scale while i < M: models that differ only inside the body."""
    body = h.make_graph([const("k", np.float32(scale)), h.make_node("Mul", ["x_in", "k"], ["x_out"])], "body",
                        [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("x_in", F, [3])],
                        [vi("c", T.BOOL, []), vi("x_out", F, [3])])
    loop = h.make_node("Loop", ["M", "", "x0"], ["x"], body=body)
    return model([loop], [vi("M", T.INT64, []), vi("x0", F, [3])], [vi("x", F, [3])])


def test_object_and_model_caches_tell_loop_bodies_apart():
    feeds = {"M": np.array(3, np.int64), "x0": np.array([1.0, 2.0, -1.0], np.float32)}
    for scale in (2.0, 3.0):
        first = glowpy.compile(scaled_model(scale), backend="cpu")
        again = glowpy.compile(scaled_model(scale), backend="cpu")
        assert again.cached and native_loop(again)
        for exe in (first, again):
            np.testing.assert_array_equal(exe.run(feeds)["x"], feeds["x0"] * np.float32(scale) ** 3)


def loop_in_if_model() -> onnx.ModelProto:
    """If (a run-time flag) whose then branch is a loop of M (run-time) iterations of
    x = softmax(x @ w) + x; a body with a matrix product with packed weights and an op the optimizer lowers."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    body = h.make_graph([h.make_node("MatMul", ["x_in", "w"], ["xw"]), h.make_node("Softmax", ["xw"], ["sm"], axis=-1),
                         h.make_node("Add", ["sm", "x_in"], ["x_out"])], "body",
                        [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("x_in", F, [2, 4])],
                        [vi("c", T.BOOL, []), vi("x_out", F, [2, 4])])
    then = h.make_graph([h.make_node("Loop", ["M", "", "x0"], ["looped"], body=body)], "then", [],
                        [vi("looped", F, [2, 4])])
    other = h.make_graph([h.make_node("Neg", ["x0"], ["neg"])], "else", [], [vi("neg", F, [2, 4])])
    node = h.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)
    return model([node], [vi("flag", T.BOOL, []), vi("M", T.INT64, []), vi("x0", F, [2, 4])], [vi("y", F, [2, 4])],
                 inits=[w])


@pytest.mark.parametrize(("backend", "options"), ENGINES, ids=IDS)
def test_loop_inside_a_run_time_if_branch(backend, options):
    x0 = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    feeds = [{"flag": np.array(f), "M": np.array(t, np.int64), "x0": x0} for f, t in ((True, 3), (True, 0), (False, 2))]
    # the Loop's cond is absent: onnxruntime is the oracle (see above)
    agree(loop_in_if_model(), feeds, backend, options, oracle=onnxruntime_outputs)


def test_the_loop_module_prints_and_parses(cpu):
    """The entry calls one Loop kernel; the body's kernels are its callees; the whole text is valid IR."""
    import llvmlite.binding as llvm

    from glowpy.pipeline import optimized_graph

    text = cpu.emit_llvm(optimized_graph(nested_model(), "cpu"), threads=1)
    llvm.parse_assembly(text).verify()
    assert "loop.head" in text and "Loop" in text


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_no_iteration_gives_empty_scan_outputs_and_the_initial_values(backend):
    x, y0 = np.array([0.5, -1.0], np.float32), np.array([1.0, 2.0], np.float32)
    out = glowpy.compile(scan_model(0), backend=backend).run({"x": x, "y0": y0})
    np.testing.assert_array_equal(out["y"], y0)
    assert out["ys"].shape == (0, 2)


def test_a_carried_value_that_changes_shape_is_refused():
    body = h.make_graph([h.make_node("Concat", ["x_in", "x_in"], ["x_out"], axis=0)], "body",
                        [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("x_in", F, [2])],
                        [vi("c", T.BOOL, []), vi("x_out", F, [4])])
    m = model([h.make_node("Loop", ["M", "", "x0"], ["x"], body=body, name="grow")],
              [vi("M", T.INT64, []), vi("x0", F, [2])], [vi("x", F, None)])
    with pytest.raises(UnsupportedShape, match=r"node 'grow' \(Loop.*a loop-carried value changes type or shape"):
        glowpy.compile(m, backend="cpu")
    assert glowpy.check(m, "cpu").nodes[0].status.name == "UNSUPPORTED_SHAPE"


@pytest.mark.parametrize(("backend", "options"), ENGINES, ids=IDS)
def test_lstm_inside_a_run_time_loop(backend, options):
    """A recurrent op in a native loop's body: the body runs on one thread, so its recurrent step is the
    serial kernel, with no words in the thread pool, even when the model is compiled for 2 threads."""
    rng = np.random.default_rng(3)
    hidden = 32
    w = numpy_helper.from_array((0.3 * rng.standard_normal((1, 4 * hidden, hidden))).astype(np.float32), "w")
    r = numpy_helper.from_array((0.3 * rng.standard_normal((1, 4 * hidden, hidden))).astype(np.float32), "r")
    body = h.make_graph([
        h.make_node("LSTM", ["x_in", "w", "r"], ["y"], hidden_size=hidden),
        const("axis", np.array([1], np.int64)),
        h.make_node("Squeeze", ["y", "axis"], ["x_out"]),
        h.make_node("Identity", ["cond_in"], ["cond_out"]),
    ], "body", [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), vi("x_in", F, [1, 1, hidden])],
        [vi("cond_out", T.BOOL, []), vi("x_out", F, [1, 1, hidden])])
    loop = h.make_node("Loop", ["M", "", "x0"], ["x"], body=body, name="loop")
    m = model([loop], [vi("x0", F, [1, 1, hidden]), vi("M", T.INT64, [])], [vi("x", F, [1, 1, hidden])], [w, r])
    feeds = [{"x0": rng.standard_normal((1, 1, hidden)).astype(np.float32), "M": np.array(n, np.int64)}
             for n in (0, 1, 5)]
    agree(m, feeds, backend, options, oracle=onnxruntime_outputs)  # onnx.reference skips this loop's body
