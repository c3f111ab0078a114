"""ReleaseGraph joins the cpu executable's thread pool: no thread of a released graph is left behind."""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from glowpy.backends.cpu.model_cache import flush
from glowpy.errors import Status
from glowpy.onnxifi import api

from .conftest import Tensors, backend_ids, fence, model, vi


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settle(want: int, timeout: float = 10.0) -> int:
    end = time.monotonic() + timeout
    while os_threads() != want and time.monotonic() < end:
        time.sleep(0.01)
    return os_threads()


def stable(quiet: float = 0.3, timeout: float = 10.0) -> int:
    """The thread count once it has not changed for `quiet` seconds."""
    end, n, since = time.monotonic() + timeout, os_threads(), time.monotonic()
    while time.monotonic() < end and time.monotonic() - since < quiet:
        time.sleep(0.02)
        if os_threads() != n:
            n, since = os_threads(), time.monotonic()
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_release_graph_joins_the_pool(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("GLOWPY_NUM_THREADS", "2")
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32), "w")
    data = model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["c"], ["y"])],
                 [vi("x", [1, 8, 32, 32], TensorProto.FLOAT)], [vi("y", [1, 16, 32, 32])], [w])
    ids = backend_ids(api)
    be = ctypes.c_void_p()
    assert api.onnxInitBackend(ids[0], None, ctypes.byref(be)) == Status.SUCCESS
    x = rng.standard_normal((1, 8, 32, 32)).astype(np.float32)
    base = 0
    for cycle in range(3):  # cycle 0 compiles (and its cache writers come and go): the count is taken after it
        g = ctypes.c_void_p()
        assert api.onnxInitGraph(be, None, len(data), data, 0, None, ctypes.byref(g)) == Status.SUCCESS
        y = np.zeros((1, 16, 32, 32), np.float32)
        ins, outs = Tensors(x=x), Tensors(y=y)
        for _ in range(3):
            f = fence()
            assert api.onnxSetIOAndRunGraph(g, 1, ins.array, 1, outs.array, ctypes.byref(f)) == Status.SUCCESS
            assert api.onnxWaitEvent(f.event) == Status.SUCCESS
            assert api.onnxReleaseEvent(f.event) == Status.SUCCESS
        assert y.max() > 0
        if cycle:
            assert os_threads() == base + 2, "the graph's run thread and one pool thread"
        assert api.onnxReleaseGraph(g) == Status.SUCCESS
        if cycle:
            assert settle(base) == base, f"cycle {cycle}: threads left after ReleaseGraph"
        else:
            flush()
            base = stable()
    assert api.onnxReleaseBackend(be) == Status.SUCCESS
    for i in ids:
        api.onnxReleaseBackendID(i)
