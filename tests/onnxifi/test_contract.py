"""Every error of the ONNXIFI contract returns the spec's status, on the Python layer and on the built
C library through ctypes (the `impl` fixture runs each test on both)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from onnx import TensorProto, helper

from glowpy.errors import Status
from glowpy.onnxifi import constants as C

from .conftest import Tensors, backend_ids, backend_name, fence, init_event, init_graph, model, vi

BAD = 0xDEADBEEF0
GARBAGE = bytes((0xA5 ^ (i * 37)) & 0xFF for i in range(64))


def test_enumeration_two_call_pattern(impl):
    n = ctypes.c_size_t(0)
    assert impl.onnxGetBackendIDs(None, ctypes.byref(n)) == Status.FALLBACK
    assert n.value == 2
    small = (ctypes.c_void_p * 1)()
    one = ctypes.c_size_t(1)
    assert impl.onnxGetBackendIDs(small, ctypes.byref(one)) == Status.FALLBACK  # too small: count, no IDs
    assert one.value == 2 and small[0] is None
    ids = backend_ids(impl)
    assert [backend_name(impl, i) for i in ids] == ["Glowpy CPU JIT", "Glowpy Interpreter"]
    assert backend_ids(impl) == ids  # stable values
    for i in ids * 2:
        assert impl.onnxReleaseBackendID(i) == Status.SUCCESS
    assert impl.onnxReleaseBackendID(ids[0]) == Status.INVALID_ID  # every reference given back
    assert impl.onnxGetBackendIDs(None, None) == Status.INVALID_POINTER
    assert impl.onnxReleaseBackendID(BAD) == Status.INVALID_ID


REQUIRED_INFO = {
    C.BACKEND_ONNXIFI_VERSION: 8, C.BACKEND_NAME: None, C.BACKEND_VENDOR: None, C.BACKEND_VERSION: None,
    C.BACKEND_EXTENSIONS: None, C.BACKEND_DEVICE: None, C.BACKEND_DEVICE_TYPE: 8, C.BACKEND_ONNX_IR_VERSION: None,
    C.BACKEND_OPSET_VERSION: None, C.BACKEND_CAPABILITIES: 8, C.BACKEND_INIT_PROPERTIES: 8,
    C.BACKEND_MEMORY_TYPES: 8, C.BACKEND_GRAPH_INIT_PROPERTIES: 8, C.BACKEND_SYNCHRONIZATION_TYPES: 8,
    C.BACKEND_MEMORY_SIZE: 8, C.BACKEND_MAX_GRAPH_SIZE: 8, C.BACKEND_MAX_GRAPH_COUNT: 8,
}


def test_backend_info(session):
    lib, bid = session["lib"], session["id"]
    values = {}
    for info, fixed in REQUIRED_INFO.items():
        size = ctypes.c_size_t(0)
        assert lib.onnxGetBackendInfo(bid, info, None, ctypes.byref(size)) == Status.FALLBACK, info
        if fixed:
            assert size.value == fixed
        buf = ctypes.create_string_buffer(size.value)
        assert lib.onnxGetBackendInfo(bid, info, buf, ctypes.byref(size)) == Status.SUCCESS, info
        values[info] = buf.raw
    u64 = {k: int.from_bytes(v, "little") for k, v in values.items() if REQUIRED_INFO[k]}
    text = {k: v.rstrip(b"\0").decode() for k, v in values.items() if not REQUIRED_INFO[k]}
    assert u64[C.BACKEND_ONNXIFI_VERSION] == 0x0000000100000000
    assert u64[C.BACKEND_DEVICE_TYPE] == C.DEVICE_TYPE_CPU
    assert u64[C.BACKEND_CAPABILITIES] & C.CAPABILITY_THREAD_SAFE
    assert len(values[C.BACKEND_NAME]) < 50 and values[C.BACKEND_NAME].endswith(b"\0")
    assert "onnx_extension_function" in text[C.BACKEND_EXTENSIONS].split()
    assert "3" in text[C.BACKEND_ONNX_IR_VERSION].split()
    assert text[C.BACKEND_OPSET_VERSION].startswith("ai.onnx:")
    size = ctypes.c_size_t(64)
    buf = ctypes.create_string_buffer(64)
    for unsupported in (9, C.BACKEND_MACS_FP32, C.BACKEND_CUDA_INDEX, 12345):
        assert lib.onnxGetBackendInfo(bid, unsupported, buf, ctypes.byref(size)) == Status.UNSUPPORTED_ATTRIBUTE
    assert lib.onnxGetBackendInfo(BAD, C.BACKEND_NAME, buf, ctypes.byref(size)) == Status.INVALID_ID
    assert lib.onnxGetBackendInfo(bid, C.BACKEND_NAME, buf, None) == Status.INVALID_POINTER
    size = ctypes.c_size_t(4)  # too small for an 8-byte value: the size comes back, nothing is written
    assert lib.onnxGetBackendInfo(bid, C.BACKEND_MEMORY_SIZE, buf, ctypes.byref(size)) == Status.FALLBACK
    assert size.value == 8


def test_compatibility(session, relu_model, unknown_op_model, add_model):
    lib, bid = session["lib"], session["id"]
    assert lib.onnxGetBackendCompatibility(bid, len(relu_model), relu_model) == Status.SUCCESS
    assert lib.onnxGetBackendCompatibility(bid, len(add_model), add_model) == Status.SUCCESS
    assert lib.onnxGetBackendCompatibility(bid, len(unknown_op_model), unknown_op_model) == Status.UNSUPPORTED_OPERATOR
    old = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])],
                opset=[helper.make_opsetid("", 1)])
    assert lib.onnxGetBackendCompatibility(bid, len(old), old) == Status.UNSUPPORTED_VERSION
    assert lib.onnxGetBackendCompatibility(BAD, len(relu_model), relu_model) == Status.INVALID_ID
    assert lib.onnxGetBackendCompatibility(bid, len(relu_model), None) == Status.INVALID_POINTER
    assert lib.onnxGetBackendCompatibility(bid, 0, relu_model) == Status.INVALID_SIZE
    assert lib.onnxGetBackendCompatibility(bid, len(GARBAGE), GARBAGE) == Status.INVALID_PROTOBUF
    cpu = session["ids"][0]  # the CPU JIT: SUCCESS once it is there, FALLBACK (interpreter) before
    assert lib.onnxGetBackendCompatibility(cpu, len(relu_model), relu_model) in (Status.SUCCESS, Status.FALLBACK)


def test_init_backend(impl):
    ids = backend_ids(impl)
    be = ctypes.c_void_p(1)
    assert impl.onnxInitBackend(BAD, None, ctypes.byref(be)) == Status.INVALID_ID
    assert be.value is None
    assert impl.onnxInitBackend(ids[1], None, None) == Status.INVALID_POINTER
    for props, want in [([99, 1, 0], Status.UNSUPPORTED_PROPERTY), ([C.BACKEND_CUDA_STREAM, 1, 0],
                        Status.UNSUPPORTED_PROPERTY), ([C.BACKEND_PROPERTY_LOG_LEVEL, 77, 0], Status.INVALID_PROPERTY),
                        ([C.BACKEND_PROPERTY_OPTIMIZATION, 9, 0], Status.INVALID_PROPERTY)]:
        arr = (ctypes.c_uint64 * len(props))(*props)
        be = ctypes.c_void_p(1)
        assert impl.onnxInitBackend(ids[1], arr, ctypes.byref(be)) == want
        assert be.value is None
    for props in ([0], [C.BACKEND_PROPERTY_OPTIMIZATION, C.OPTIMIZATION_LOW_LATENCY, C.BACKEND_PROPERTY_LOG_LEVEL,
                        C.LOG_LEVEL_ERROR, 0]):
        arr = (ctypes.c_uint64 * len(props))(*props)
        assert impl.onnxInitBackend(ids[1], arr, ctypes.byref(be)) == Status.SUCCESS
        assert impl.onnxReleaseBackend(be) == Status.SUCCESS
        assert impl.onnxReleaseBackend(be) == Status.INVALID_BACKEND
    for i in ids:
        impl.onnxReleaseBackendID(i)


def test_events(session):
    lib = session["lib"]
    ev = ctypes.c_void_p(1)
    assert lib.onnxInitEvent(BAD, ctypes.byref(ev)) == Status.INVALID_BACKEND
    assert ev.value is None
    assert lib.onnxInitEvent(session["backend"], None) == Status.INVALID_POINTER
    ev = init_event(session)
    state = ctypes.c_int32(0)
    assert lib.onnxGetEventState(ev, ctypes.byref(state)) == Status.SUCCESS
    assert state.value == C.EVENT_STATE_NONSIGNALLED
    assert lib.onnxSignalEvent(ev) == Status.SUCCESS
    assert lib.onnxSignalEvent(ev) == Status.INVALID_STATE  # single-shot
    assert lib.onnxGetEventState(ev, ctypes.byref(state)) == Status.SUCCESS
    assert state.value == C.EVENT_STATE_SIGNALLED
    assert lib.onnxWaitEvent(ev) == Status.SUCCESS
    assert lib.onnxGetEventState(ev, None) == Status.INVALID_POINTER
    assert lib.onnxReleaseEvent(ev) == Status.SUCCESS
    session["events"].remove(ev)
    assert lib.onnxReleaseEvent(ev) == Status.INVALID_EVENT
    state = ctypes.c_int32(5)
    assert lib.onnxGetEventState(ev, ctypes.byref(state)) == Status.INVALID_EVENT
    assert state.value == C.EVENT_STATE_INVALID
    for bad in (ev, None, BAD, session["backend"]):  # released, NULL, foreign, another kind of handle
        assert lib.onnxWaitEvent(bad) == Status.INVALID_EVENT
        assert lib.onnxSignalEvent(bad) == Status.INVALID_EVENT


def test_init_graph_arguments(session, relu_model, add_model):
    lib, be = session["lib"], session["backend"]
    g = ctypes.c_void_p(1)
    assert lib.onnxInitGraph(BAD, None, len(relu_model), relu_model, 0, None, ctypes.byref(g)) == Status.INVALID_BACKEND
    assert g.value is None
    assert lib.onnxInitGraph(be, None, len(relu_model), None, 0, None, ctypes.byref(g)) == Status.INVALID_POINTER
    assert lib.onnxInitGraph(be, None, len(relu_model), relu_model, 0, None, None) == Status.INVALID_POINTER
    assert lib.onnxInitGraph(be, None, len(add_model), add_model, 1, None, ctypes.byref(g)) == Status.INVALID_POINTER
    assert lib.onnxInitGraph(be, None, 0, relu_model, 0, None, ctypes.byref(g)) == Status.INVALID_SIZE
    assert lib.onnxInitGraph(be, None, len(GARBAGE), GARBAGE, 0, None, ctypes.byref(g)) == Status.INVALID_PROTOBUF
    props = (ctypes.c_uint64 * 3)(5, 5, 0)
    assert lib.onnxInitGraph(be, props, len(relu_model), relu_model, 0, None, ctypes.byref(g)) \
        == Status.UNSUPPORTED_PROPERTY
    none = (ctypes.c_uint64 * 1)(0)
    status, g = init_graph(session, relu_model)
    assert status == Status.SUCCESS and g.value
    assert lib.onnxInitGraph(be, none, len(relu_model), relu_model, 0, None, ctypes.byref(g)) == Status.SUCCESS
    session["graphs"].append(g)


def _weight_cases():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensors(w=w)
    good = t.describe("w", w)
    cases = []

    def case(case_id, status, **change):
        d = C.onnxTensorDescriptorV1.from_buffer_copy(good)
        for k, v in change.items():
            setattr(d, k, v)
        cases.append(pytest.param(d, status, id=case_id))

    case("wrong-tag", Status.UNSUPPORTED_TAG, tag=0x1234)
    case("unknown-name", Status.INVALID_NAME, name=b"nope")
    case("zero-dim", Status.INVALID_SHAPE, shape=(ctypes.c_uint64 * 2)(2, 0))
    case("unknown-dtype", Status.INVALID_DATATYPE, dataType=99)
    case("bool-is-not-onnxifi", Status.INVALID_DATATYPE, dataType=9)
    case("bfloat16", Status.UNSUPPORTED_DATATYPE, dataType=C.DATATYPE_BFLOAT16)
    case("null-buffer", Status.INVALID_MEMORY_LOCATION, buffer=0)
    case("unknown-memory-type", Status.INVALID_MEMORY_TYPE, memoryType=3)
    case("cuda-memory", Status.UNSUPPORTED_MEMORY_TYPE, memoryType=C.MEMORY_TYPE_CUDA_BUFFER)
    case("wrong-shape", Status.MISMATCHING_SHAPE, shape=(ctypes.c_uint64 * 2)(3, 2))
    case("wrong-rank", Status.MISMATCHING_SHAPE, dimensions=1)
    case("wrong-dtype", Status.MISMATCHING_DATATYPE, dataType=C.DATATYPE_INT32)
    case("null-shape", Status.INVALID_POINTER, shape=None)
    return cases, (t, w)


WEIGHT_CASES, _KEEP = _weight_cases()


@pytest.mark.parametrize("desc, status", WEIGHT_CASES)
def test_weight_descriptor_errors(session, add_model, desc, status):
    lib = session["lib"]
    arr = (C.onnxTensorDescriptorV1 * 1)(desc)
    g = ctypes.c_void_p(1)
    assert lib.onnxInitGraph(session["backend"], None, len(add_model), add_model, 1, arr, ctypes.byref(g)) == status
    assert g.value is None


def test_weight_repeated_name(session, add_model):
    w = np.ones((2, 3), np.float32)
    t = Tensors(w=w)
    arr = (C.onnxTensorDescriptorV1 * 2)(t[0], t[0])
    g = ctypes.c_void_p()
    assert session["lib"].onnxInitGraph(session["backend"], None, len(add_model), add_model, 2, arr,
                                        ctypes.byref(g)) == Status.INVALID_NAME


@pytest.fixture
def relu_graph(session, relu_model):
    status, g = init_graph(session, relu_model)
    assert status == Status.SUCCESS
    return g


def test_set_graph_io_errors(session, relu_graph):
    lib, g = session["lib"], relu_graph
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    y = np.zeros((2, 3), np.float32)
    t = Tensors(x=x, y=y)
    xin, yout = t[0], t[1]

    def set_io(ins, outs, n_in=None, n_out=None):
        ia = (C.onnxTensorDescriptorV1 * max(len(ins), 1))(*ins) if ins is not None else None
        oa = (C.onnxTensorDescriptorV1 * max(len(outs), 1))(*outs) if outs is not None else None
        return lib.onnxSetGraphIO(g, len(ins or []) if n_in is None else n_in, ia,
                                  len(outs or []) if n_out is None else n_out, oa)

    def changed(d, **kw):
        d = C.onnxTensorDescriptorV1.from_buffer_copy(d)
        for k, v in kw.items():
            setattr(d, k, v)
        return d

    yi = np.zeros((2, 3), np.int32)
    assert lib.onnxSetGraphIO(BAD, 1, t.array, 1, t.array) == Status.INVALID_GRAPH
    assert set_io([xin], None, n_out=1) == Status.INVALID_POINTER
    assert set_io(None, [yout], n_in=1) == Status.INVALID_POINTER
    assert set_io([changed(xin, tag=0)], [yout]) == Status.UNSUPPORTED_TAG
    assert set_io([xin], [changed(yout, tag=-1)]) == Status.UNSUPPORTED_TAG
    assert set_io([changed(xin, name=b"z")], [yout]) == Status.INVALID_NAME
    assert set_io([changed(xin, name=None)], [yout]) == Status.INVALID_NAME
    assert set_io([changed(xin, name=b"y")], [yout]) == Status.INVALID_NAME  # an output is not an input
    assert set_io([xin, xin], [yout]) == Status.INVALID_NAME
    assert set_io([xin], [yout, yout]) == Status.INVALID_NAME
    assert set_io([changed(xin, shape=(ctypes.c_uint64 * 2)(2, 0))], [yout]) == Status.INVALID_SHAPE
    assert set_io([changed(xin, dataType=8)], [yout]) == Status.INVALID_DATATYPE
    assert set_io([changed(xin, memoryType=77)], [yout]) == Status.INVALID_MEMORY_TYPE
    assert set_io([changed(xin, memoryType=C.MEMORY_TYPE_OPENCL_BUFFER)], [yout]) == Status.UNSUPPORTED_MEMORY_TYPE
    assert set_io([changed(xin, buffer=0)], [yout]) == Status.INVALID_MEMORY_LOCATION
    assert set_io([], [yout]) == Status.UNIDENTIFIED_NAME
    assert set_io([xin], []) == Status.UNIDENTIFIED_NAME
    assert set_io([changed(xin, shape=(ctypes.c_uint64 * 2)(3, 2))], [yout]) == Status.MISMATCHING_SHAPE
    assert set_io([changed(xin, dimensions=3, shape=(ctypes.c_uint64 * 3)(2, 3, 1))], [yout]) \
        == Status.MISMATCHING_SHAPE
    assert set_io([xin], [changed(yout, dataType=C.DATATYPE_INT32, buffer=yi.ctypes.data)]) \
        == Status.MISMATCHING_DATATYPE
    # a failed SetGraphIO drops the binding: runs are refused until one succeeds
    ev = init_event(session)
    fin, fout = fence(ev), fence()
    assert lib.onnxRunGraph(g, ctypes.byref(fin), ctypes.byref(fout)) == Status.UNIDENTIFIED_NAME
    assert set_io([xin], [yout]) == Status.SUCCESS
    assert set_io([xin], [changed(yout, name=b"q")]) == Status.INVALID_NAME
    assert lib.onnxRunGraph(g, ctypes.byref(fin), ctypes.byref(fout)) == Status.UNIDENTIFIED_NAME


def test_run_graph_errors(session, relu_graph):
    lib, g = session["lib"], relu_graph
    x = np.ones((2, 3), np.float32)
    y = np.zeros((2, 3), np.float32)
    t = Tensors(x=x, y=y)
    assert lib.onnxSetGraphIO(g, 1, ctypes.byref(t[0]), 1, ctypes.byref(t[1])) == Status.SUCCESS
    ev = init_event(session)
    fin, fout = fence(ev), fence()

    def run(i, o, graph=g):
        return lib.onnxRunGraph(graph, ctypes.byref(i) if i is not None else None,
                                ctypes.byref(o) if o is not None else None)

    def changed(f, **kw):
        f = C.onnxMemoryFenceV1.from_buffer_copy(f)
        for k, v in kw.items():
            setattr(f, k, v)
        return f

    assert run(fin, fout, graph=BAD) == Status.INVALID_GRAPH
    assert run(fin, fout, graph=None) == Status.INVALID_GRAPH
    assert run(None, fout) == Status.INVALID_POINTER
    assert run(fin, None) == Status.INVALID_POINTER
    assert run(changed(fin, tag=1), fout) == Status.UNSUPPORTED_TAG
    assert run(fin, changed(fout, tag=1)) == Status.UNSUPPORTED_TAG
    assert run(changed(fin, type=C.SYNCHRONIZATION_IMPLICIT), fout) == Status.UNSUPPORTED_FENCE_TYPE
    assert run(fin, changed(fout, type=C.SYNCHRONIZATION_IMPLICIT)) == Status.UNSUPPORTED_FENCE_TYPE
    assert run(changed(fin, type=1), fout) == Status.INVALID_FENCE_TYPE
    assert run(changed(fin, event=None), fout) == Status.INVALID_EVENT
    assert run(changed(fin, event=BAD), fout) == Status.INVALID_EVENT
    assert fout.event is None  # nothing was scheduled
    preset = init_event(session)  # ONNX's test driver pre-creates the output event: it gets overwritten
    fout.event = preset.value
    assert run(fin, fout) == Status.SUCCESS
    assert fout.event and fout.event != preset.value
    session["events"].append(ctypes.c_void_p(fout.event))
    assert lib.onnxSignalEvent(ev) == Status.SUCCESS
    assert lib.onnxWaitEvent(fout.event) == Status.SUCCESS
    assert (y == 1).all()


def test_release_graph_twice(session, relu_model):
    lib = session["lib"]
    status, g = init_graph(session, relu_model)
    assert lib.onnxReleaseGraph(g) == Status.SUCCESS
    assert lib.onnxReleaseGraph(g) == Status.INVALID_GRAPH
    assert lib.onnxReleaseGraph(None) == Status.INVALID_GRAPH
    assert lib.onnxReleaseGraph(session["backend"]) == Status.INVALID_GRAPH  # a backend is not a graph
    session["graphs"].remove(g)


def test_extension_functions(session, relu_graph):
    lib, bid = session["lib"], session["id"]
    fn = ctypes.c_void_p(1)
    assert lib.onnxGetExtensionFunctionAddress(bid, b"onnxNope", ctypes.byref(fn)) == Status.UNIDENTIFIED_NAME
    assert fn.value is None
    assert lib.onnxGetExtensionFunctionAddress(bid, None, ctypes.byref(fn)) == Status.INVALID_POINTER
    assert lib.onnxGetExtensionFunctionAddress(bid, b"onnxSetIOAndRunGraph", None) == Status.INVALID_POINTER
    assert lib.onnxGetExtensionFunctionAddress(BAD, b"onnxSetIOAndRunGraph", ctypes.byref(fn)) == Status.INVALID_ID
    assert lib.onnxGetExtensionFunctionAddress(bid, b"onnxGetExtensionFunctionAddress", ctypes.byref(fn)) == 0
    assert fn.value
    assert lib.onnxGetExtensionFunctionAddress(bid, b"onnxSetIOAndRunGraph", ctypes.byref(fn)) == Status.SUCCESS
    set_and_run = ctypes.CFUNCTYPE(ctypes.c_int32, *C.ARGTYPES["onnxSetIOAndRunGraph"])(fn.value)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    y = np.zeros((2, 3), np.float32)
    t = Tensors(x=x, y=y)
    f = fence()
    assert set_and_run(relu_graph, 1, ctypes.byref(t[0]), 1, ctypes.byref(t[1]), None) == Status.INVALID_POINTER
    bad_fence = C.onnxMemoryFenceV1(7, 0, None)
    assert set_and_run(relu_graph, 1, ctypes.byref(t[0]), 1, ctypes.byref(t[1]), ctypes.byref(bad_fence)) \
        == Status.UNSUPPORTED_TAG
    assert set_and_run(BAD, 1, ctypes.byref(t[0]), 1, ctypes.byref(t[1]), ctypes.byref(f)) == Status.INVALID_GRAPH
    assert set_and_run(relu_graph, 1, ctypes.byref(t[0]), 1, ctypes.byref(t[1]), ctypes.byref(f)) == Status.SUCCESS
    assert lib.onnxWaitEvent(f.event) == Status.SUCCESS
    assert lib.onnxReleaseEvent(f.event) == Status.SUCCESS
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_ir3_model_with_initializer_inputs(session):
    """IR v3: initializers also listed as graph inputs; they stay weights, only 'x' is bound."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], np.full(6, 10, np.float32))
    data = model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [2, 3]), vi("w", [2, 3])], [vi("y", [2, 3])],
                 initializers=[w], ir_version=3)
    status, g = init_graph(session, data)
    assert status == Status.SUCCESS
    x = np.ones((2, 3), np.float32)
    y = np.zeros((2, 3), np.float32)
    t = Tensors(x=x, y=y, w=x)
    lib = session["lib"]
    assert lib.onnxSetGraphIO(g, 2, (C.onnxTensorDescriptorV1 * 2)(t[0], t[2]), 1, ctypes.byref(t[1])) \
        == Status.INVALID_NAME  # a weight is not a runtime input
    assert lib.onnxSetGraphIO(g, 1, ctypes.byref(t[0]), 1, ctypes.byref(t[1])) == Status.SUCCESS
