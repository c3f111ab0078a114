"""The Caffe2-OnnxifiOp-style adapter: weights pulled from the workspace once per key, a shared,
reference-counted graph cache, release on the last reference, thread safety."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from glowpy.errors import GlowpyError, Status
from glowpy.onnxifi import api
from glowpy.onnxifi.host import GraphCache, OnnxifiOp

from .conftest import model, vi


def weight_stub(name: str, shape) -> TensorProto:
    """An initializer that only names a weight: the workspace holds its value."""
    return TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))


@pytest.fixture
def fc_model() -> bytes:
    """y = relu(x @ w + b), w and b named in the initializer list."""
    return model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
                  helper.make_node("Relu", ["a"], ["y"])],
                 [vi("x", [2, 4])], [vi("y", [2, 3])], initializers=[weight_stub("w", [4, 3]), weight_stub("b", [3])])


def workspace() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}


def reference(ws, x):
    return np.maximum(x @ ws["w"] + ws["b"], 0)


@pytest.fixture(params=["python", "clib"])
def lib(request):
    return api if request.param == "python" else request.getfixturevalue("clib")


def test_weights_consumed_once(fc_model, lib):
    cache = GraphCache()
    ws = workspace()
    expected_ws = dict(ws)
    before = api.live_counts()
    op1 = OnnxifiOp(fc_model, "net", 0, ws, backend="interpreter", lib=lib, cache=cache)
    assert op1.graph.init_status == Status.SUCCESS
    ws.pop("w")  # the host may drop weights once the graph exists
    ws.pop("b")
    op2 = OnnxifiOp(fc_model, "net", 0, ws, backend="interpreter", lib=lib, cache=cache)  # cache hit, no lookup
    assert op2.graph is op1.graph and cache.refs("net:0") == 2
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(op2.run({"x": x})["y"], reference(expected_ws, x), rtol=1e-5, atol=1e-6)
    ws["x"] = x
    op1.run()  # Caffe2 style: inputs from the workspace, outputs back into it
    np.testing.assert_allclose(ws["y"], reference(expected_ws, x), rtol=1e-5, atol=1e-6)
    with pytest.raises(GlowpyError) as err:  # another position is another graph: it needs the weights
        OnnxifiOp(fc_model, "net", 1, ws, backend="interpreter", lib=lib, cache=cache)
    assert err.value.status == Status.UNIDENTIFIED_NAME
    op1.close()
    assert "net:0" in cache and api.live_counts()["graphs"] == before["graphs"] + 1
    op2.close()
    op2.close()  # idempotent
    assert "net:0" not in cache and len(cache) == 0
    assert api.live_counts() == before


def test_unfulfilled_initializers_are_listed(lib):
    data = model([helper.make_node("Add", ["x", "w1"], ["t"]), helper.make_node("Add", ["t", "w2"], ["u"]),
                  helper.make_node("Add", ["u", "w3"], ["y"])],
                 [vi("x", [3])], [vi("y", [3])],
                 initializers=[weight_stub("w1", [3]), weight_stub("w2", [3]), weight_stub("w3", [3])])
    cache = GraphCache()
    before = api.live_counts()
    with pytest.raises(GlowpyError) as err:
        OnnxifiOp(data, "m", 7, {"w2": np.ones(3, np.float32)}, lib=lib, cache=cache)
    message = str(err.value)
    assert "w1" in message and "w3" in message and "unfulfilled" in message
    assert "m:7" not in cache and api.live_counts() == before


def test_release_on_last_reference_by_garbage_collection(fc_model):
    cache = GraphCache()
    before = api.live_counts()
    ops = [OnnxifiOp(fc_model, "gc", 3, workspace(), backend="interpreter", cache=cache) for _ in range(3)]
    assert cache.refs("gc:3") == 3
    del ops[0]
    gc.collect()
    assert cache.refs("gc:3") == 2
    ops.clear()
    gc.collect()
    assert "gc:3" not in cache
    assert api.live_counts() == before


def test_context_manager_and_closed_op(fc_model):
    cache = GraphCache()
    with OnnxifiOp(fc_model, "ctx", 0, workspace(), cache=cache) as op:
        assert op.input_names == ["x"] and op.output_names == ["y"]
        assert op.graph.init_status in (Status.SUCCESS, Status.FALLBACK)  # backend 0: the CPU JIT
    assert len(cache) == 0
    with pytest.raises(GlowpyError) as err:
        op.run({"x": np.zeros((2, 4), np.float32)})
    assert err.value.status == Status.INVALID_GRAPH


def test_errors_from_runs_carry_the_status(fc_model):
    with OnnxifiOp(fc_model, "err", 0, workspace(), backend="interpreter", cache=GraphCache()) as op:
        with pytest.raises(GlowpyError) as err:
            op.run({"x": np.zeros((2, 4), np.float64)})
        assert err.value.status == Status.MISMATCHING_DATATYPE
        with pytest.raises(GlowpyError) as err:
            op.run({})
        assert err.value.status == Status.UNIDENTIFIED_NAME


def test_symbolic_batch_outputs_are_inferred():
    data = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", ["N", 4])], [vi("y", ["N", 2])],
                 initializers=[weight_stub("w", [4, 2])])
    ws = {"w": np.arange(8, dtype=np.float32).reshape(4, 2)}
    with OnnxifiOp(data, "sym", 0, ws, backend="interpreter", cache=GraphCache()) as op:
        for n in (1, 5):
            x = np.ones((n, 4), np.float32)
            np.testing.assert_array_equal(op.run({"x": x})["y"], x @ ws["w"])


@pytest.mark.parametrize("use_clib", [False, True], ids=["python", "clib"])
def test_eight_threads_same_key(fc_model, use_clib, request):
    """8 threads create and run ops on one key: one graph is created, all agree, nothing leaks."""
    lib = request.getfixturevalue("clib") if use_clib else api
    cache = GraphCache()
    ws = workspace()
    expected_ws = dict(ws)
    before = api.live_counts()
    created = []
    real_create = OnnxifiOp._create

    def counting_create(self):
        created.append(threading.get_ident())
        return real_create(self)

    start, all_made = threading.Barrier(8), threading.Barrier(8)
    results: dict[int, list] = {}
    errors = []

    def worker(i):
        try:
            rng = np.random.default_rng(i)
            start.wait()
            op = OnnxifiOp(fc_model, "shared", 0, ws, backend="interpreter", lib=lib, cache=cache)
            all_made.wait()  # every op holds a reference before any lets go
            out = []
            for _ in range(5):
                x = rng.standard_normal((2, 4)).astype(np.float32)
                out.append((x, op.run({"x": x})["y"]))
            results[i] = out
            op.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    OnnxifiOp._create = counting_create
    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        OnnxifiOp._create = real_create
    assert not errors, errors
    assert len(created) == 1  # one creation, every other op hit the cache
    for out in results.values():
        for x, y in out:
            np.testing.assert_allclose(y, reference(expected_ws, x), rtol=1e-5, atol=1e-6)
    assert len(cache) == 0
    assert api.live_counts() == before
