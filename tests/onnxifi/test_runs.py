"""Behaviour of graphs and runs: weights copied, asynchronous runs honouring the input fence, failures
still signalled, parallel graphs, ReleaseGraph waiting, symbolic dims, the exception barrier."""

from __future__ import annotations

import ctypes
import logging
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

from glowpy.errors import Status
from glowpy.onnxifi import api, objects
from glowpy.onnxifi import constants as C

from .conftest import Tensors, backend_ids, fence, init_event, init_graph, model, vi


def set_io(s, g, inputs: Tensors, outputs: Tensors) -> int:
    return s["lib"].onnxSetGraphIO(g, inputs.count, inputs.array, outputs.count, outputs.array)


def run(s, g, in_event) -> ctypes.c_void_p:
    fin, fout = fence(in_event), fence()
    assert s["lib"].onnxRunGraph(g, ctypes.byref(fin), ctypes.byref(fout)) == Status.SUCCESS
    out = ctypes.c_void_p(fout.event)
    s["events"].append(out)
    return out


def state(s, ev) -> int:
    st = ctypes.c_int32()
    assert s["lib"].onnxGetEventState(ev, ctypes.byref(st)) == Status.SUCCESS
    return st.value


def test_weights_are_copied_at_init(session, add_model):
    """The host overwrites its weight buffer, name and shape right after InitGraph: no effect."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    weights = Tensors(w=w)
    status, g = init_graph(session, add_model, weights)
    assert status == Status.SUCCESS
    w[...] = -1000
    weights.array[0].shape[0] = 0
    ctypes.memset(weights.names["w"], ord("?"), 1)
    x = np.ones((2, 3), np.float32)
    y = np.zeros((2, 3), np.float32)
    assert set_io(session, g, Tensors(x=x), Tensors(y=y)) == Status.SUCCESS
    ev = init_event(session)
    out = run(session, g, ev)
    session["lib"].onnxSignalEvent(ev)
    session["lib"].onnxWaitEvent(out)
    np.testing.assert_array_equal(y, np.arange(6, dtype=np.float32).reshape(2, 3) + 1)


def test_run_is_asynchronous_and_honours_the_input_fence(session, relu_model):
    status, g = init_graph(session, relu_model)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    y = np.full((2, 3), 7, np.float32)
    ins, outs = Tensors(x=x), Tensors(y=y)
    assert set_io(session, g, ins, outs) == Status.SUCCESS
    ev = init_event(session)
    out = run(session, g, ev)  # returns although the input is not ready: a blocking call would deadlock here
    time.sleep(0.1)
    assert state(session, out) == C.EVENT_STATE_NONSIGNALLED
    assert (y == 7).all()  # nothing ran before the fence
    x[0, 0] = 10  # inputs may be written until the fence is signalled
    assert session["lib"].onnxSignalEvent(ev) == Status.SUCCESS
    assert session["lib"].onnxWaitEvent(out) == Status.SUCCESS
    assert state(session, out) == C.EVENT_STATE_SIGNALLED
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_set_graph_io_keeps_only_addresses(session, relu_model):
    """Descriptor structs, names and shape arrays may die after SetGraphIO; buffers must not."""
    status, g = init_graph(session, relu_model)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    y = np.zeros((2, 3), np.float32)
    ins, outs = Tensors(x=x), Tensors(y=y)
    assert set_io(session, g, ins, outs) == Status.SUCCESS
    ctypes.memset(ctypes.addressof(ins.array), 0, ctypes.sizeof(ins.array))
    ctypes.memset(ctypes.addressof(outs.array), 0, ctypes.sizeof(outs.array))
    for _ in range(3):  # one binding, many runs
        y[...] = 0
        ev = init_event(session)
        out = run(session, g, ev)
        session["lib"].onnxSignalEvent(ev)
        session["lib"].onnxWaitEvent(out)
        np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_failed_run_still_signals(session, relu_model, monkeypatch, caplog):
    status, g = init_graph(session, relu_model)
    x, y = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    assert set_io(session, g, Tensors(x=x), Tensors(y=y)) == Status.SUCCESS

    def boom(binding):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(objects, "execute", boom)
    ev = init_event(session)
    with caplog.at_level(logging.ERROR, logger="glowpy.onnxifi"):
        out = run(session, g, ev)
        session["lib"].onnxSignalEvent(ev)
        assert session["lib"].onnxWaitEvent(out) == Status.SUCCESS  # no hang
    assert state(session, out) == C.EVENT_STATE_SIGNALLED
    assert "kernel exploded" in caplog.text


def test_graphs_run_in_parallel(session, relu_model, monkeypatch):
    """Each graph has its own worker: one graph blocked on its fence does not hold up another, and
    two runs overlap in time (the work itself releases the GIL)."""
    spans: dict[int, tuple[float, float]] = {}
    real = objects.execute

    def slow(binding):
        t0 = time.perf_counter()
        time.sleep(0.3)  # stands in for native work that releases the GIL
        real(binding)
        spans[id(binding)] = (t0, time.perf_counter())

    monkeypatch.setattr(objects, "execute", slow)
    graphs = [init_graph(session, relu_model)[1] for _ in range(3)]
    bufs = [(np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)) for _ in graphs]
    keep = []
    for g, (x, y) in zip(graphs, bufs):
        keep.append((Tensors(x=x), Tensors(y=y)))
        assert set_io(session, g, *keep[-1]) == Status.SUCCESS
    blocked_ev = init_event(session)
    run(session, graphs[0], blocked_ev)  # never signalled during the test
    evs = [init_event(session) for _ in graphs[1:]]
    outs = [run(session, g, e) for g, e in zip(graphs[1:], evs)]
    for e in evs:
        session["lib"].onnxSignalEvent(e)
    for o in outs:
        assert session["lib"].onnxWaitEvent(o) == Status.SUCCESS
    (a0, a1), (b0, b1) = spans.values()
    assert a0 < b1 and b0 < a1, "runs of different graphs did not overlap"
    session["lib"].onnxSignalEvent(blocked_ev)  # let graph 0 finish before release


def test_release_graph_waits_for_runs_in_flight(session, relu_model):
    lib = session["lib"]
    status, g = init_graph(session, relu_model)
    session["graphs"].remove(g)
    x, y = np.array([[1, -1, 2], [3, -4, 5]], np.float32), np.zeros((2, 3), np.float32)
    assert set_io(session, g, Tensors(x=x), Tensors(y=y)) == Status.SUCCESS
    ev = init_event(session)
    run(session, g, ev)
    done = threading.Event()
    result = []
    threading.Thread(target=lambda: (result.append(lib.onnxReleaseGraph(g)), done.set()), daemon=True).start()
    assert not done.wait(0.3), "ReleaseGraph returned while a run was still pending"
    lib.onnxSignalEvent(ev)
    assert done.wait(10)
    assert result == [Status.SUCCESS]
    np.testing.assert_array_equal(y, np.maximum(x, 0))  # the run completed before the release


def test_symbolic_dims_compile_per_binding(session):
    data = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["N", 3])], [vi("y", ["N", 3])])
    status, g = init_graph(session, data)
    assert status == Status.SUCCESS
    for n in (4, 2, 4):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3) - 5
        y = np.zeros((n, 3), np.float32)
        assert set_io(session, g, Tensors(x=x), Tensors(y=y)) == Status.SUCCESS
        ev = init_event(session)
        out = run(session, g, ev)
        session["lib"].onnxSignalEvent(ev)
        session["lib"].onnxWaitEvent(out)
        np.testing.assert_array_equal(y, np.maximum(x, 0))
    x, y = np.zeros((4, 3), np.float32), np.zeros((5, 3), np.float32)
    assert set_io(session, g, Tensors(x=x), Tensors(y=y)) == Status.MISMATCHING_SHAPE  # output disagrees
    x = np.zeros((4, 2), np.float32)
    assert set_io(session, g, Tensors(x=x), Tensors(y=np.zeros((4, 2), np.float32))) == Status.MISMATCHING_SHAPE


def test_initializers_are_the_weights_when_the_model_has_them(session):
    """One source only: with initializers in the model, descriptors are not read (ONNX's test driver
    passes a count of initializers with a single descriptor)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], np.full(6, 10, np.float32))
    b = helper.make_tensor("b", TensorProto.FLOAT, [2, 3], np.full(6, 1, np.float32))
    data = model([helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
                 [vi("x", [2, 3])], [vi("y", [2, 3])], initializers=[w, b])
    wrong = Tensors(w=np.zeros((2, 3), np.float32))
    g = ctypes.c_void_p()
    lib = session["lib"]
    assert lib.onnxInitGraph(session["backend"], None, len(data), data, 2, wrong.array, ctypes.byref(g)) == 0
    session["graphs"].append(g)
    x, y = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    assert set_io(session, g, Tensors(x=x), Tensors(y=y)) == Status.SUCCESS
    ev = init_event(session)
    out = run(session, g, ev)
    lib.onnxSignalEvent(ev)
    lib.onnxWaitEvent(out)
    assert (y == 12).all()


def test_unfilled_weights_are_named(session, caplog):
    """Initializers without data declare weights by name; the ones nobody gives are all named."""
    def placeholder(name):
        return TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[2, 3])  # no data

    data = model([helper.make_node("Add", ["x", "w1"], ["t"]), helper.make_node("Add", ["t", "w2"], ["y"])],
                 [vi("x", [2, 3])], [vi("y", [2, 3])], initializers=[placeholder("w1"), placeholder("w2")])
    with caplog.at_level(logging.ERROR, logger="glowpy.onnxifi"):
        status, g = init_graph(session, data)
    assert status == Status.UNIDENTIFIED_NAME
    if session["lib"] is api:
        assert "w1" in api.last_error() and "w2" in api.last_error()
    assert "w1" in caplog.text and "w2" in caplog.text
    given = Tensors(w1=np.full((2, 3), 2, np.float32))
    status, g = init_graph(session, data, given)
    assert status == Status.UNIDENTIFIED_NAME
    assert "w2" in caplog.text
    both = Tensors(w1=np.full((2, 3), 2, np.float32), w2=np.full((2, 3), 3, np.float32))
    status, g = init_graph(session, data, both)
    assert status == Status.SUCCESS
    x, y = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    assert set_io(session, g, Tensors(x=x), Tensors(y=y)) == Status.SUCCESS
    ev = init_event(session)
    out = run(session, g, ev)
    session["lib"].onnxSignalEvent(ev)
    session["lib"].onnxWaitEvent(out)
    assert (y == 6).all()


def test_cpu_backend_id(impl, relu_model):
    """The CPU JIT ID always enumerates; before the backend lands its graphs run on the interpreter
    and report FALLBACK."""
    from glowpy.backends import get_backend

    try:
        get_backend("cpu")
        want = Status.SUCCESS
    except Exception:  # noqa: BLE001
        want = Status.FALLBACK
    ids = backend_ids(impl)
    be, g = ctypes.c_void_p(), ctypes.c_void_p()
    assert impl.onnxInitBackend(ids[0], None, ctypes.byref(be)) == Status.SUCCESS
    assert impl.onnxInitGraph(be, None, len(relu_model), relu_model, 0, None, ctypes.byref(g)) == want
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    y = np.zeros((2, 3), np.float32)
    ins, outs = Tensors(x=x), Tensors(y=y)
    f = fence()
    assert impl.onnxSetIOAndRunGraph(g, 1, ins.array, 1, outs.array, ctypes.byref(f)) == Status.SUCCESS
    assert impl.onnxWaitEvent(f.event) == Status.SUCCESS
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    for release, h in ((impl.onnxReleaseEvent, f.event), (impl.onnxReleaseGraph, g), (impl.onnxReleaseBackend, be)):
        assert release(h) == Status.SUCCESS
    for i in ids:
        impl.onnxReleaseBackendID(i)


def test_threads_share_one_backend(clib, relu_model):
    """Host threads call into the C library at the same time: 4 threads, each its own graph."""
    ids = backend_ids(clib)
    be = ctypes.c_void_p()
    assert clib.onnxInitBackend(ids[1], None, ctypes.byref(be)) == 0
    errors = []

    def worker(seed):
        try:
            g = ctypes.c_void_p()
            assert clib.onnxInitGraph(be, None, len(relu_model), relu_model, 0, None, ctypes.byref(g)) == 0
            rng = np.random.default_rng(seed)
            for _ in range(10):
                x = rng.standard_normal((2, 3)).astype(np.float32)
                y = np.zeros((2, 3), np.float32)
                ins, outs = Tensors(x=x), Tensors(y=y)
                f = fence()
                assert clib.onnxSetIOAndRunGraph(g, 1, ins.array, 1, outs.array, ctypes.byref(f)) == 0
                assert clib.onnxWaitEvent(f.event) == 0
                assert clib.onnxReleaseEvent(f.event) == 0
                np.testing.assert_array_equal(y, np.maximum(x, 0))
            assert clib.onnxReleaseGraph(g) == 0
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert clib.onnxReleaseBackend(be) == 0
    for i in ids:
        clib.onnxReleaseBackendID(i)


@pytest.mark.parametrize("exc, status", [(RuntimeError("bug"), Status.INTERNAL_ERROR),
                                         (MemoryError(), Status.NO_SYSTEM_MEMORY),
                                         (KeyError("x"), Status.INTERNAL_ERROR)])
def test_no_exception_escapes(impl, relu_model, monkeypatch, exc, status):
    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(api, "compatibility", broken)
    ids = backend_ids(impl)
    assert impl.onnxGetBackendCompatibility(ids[1], len(relu_model), relu_model) == status
    for i in ids:
        impl.onnxReleaseBackendID(i)


def test_header_matches_python_constants():
    """include/onnxifi.h and constants.py / Status carry the same numbers."""
    import re

    from glowpy.onnxifi.build import HEADER

    defines = dict(re.findall(r"#define (ONNXIFI_\w+)\s+(0x[0-9A-Fa-f]+|\d+)\b", HEADER.read_text()))
    defines.pop("ONNXIFI_H")
    for name, value in defines.items():
        short = name[len("ONNXIFI_"):]
        if short.startswith("STATUS_"):
            assert Status[short[len("STATUS_"):]] == int(value, 0), name
        else:
            assert getattr(C, short) == int(value, 0), name
    assert len([n for n in defines if n.startswith("ONNXIFI_STATUS_")]) == len(Status)
    assert ctypes.sizeof(C.onnxTensorDescriptorV1) == 56 and ctypes.sizeof(C.onnxMemoryFenceV1) == 24
