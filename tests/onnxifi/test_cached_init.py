"""onnxInitGraph on the CPU JIT with the model cache: the host's weights are hashed where they lie; a hit
restores the compile without copying them, a change in any weight byte is a miss, and a write in flight
is kept when the host releases the graph (a host may exit without finalizing Python)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from glowpy.errors import InternalError, Status
from glowpy.importer.onnx_import import parse_model_bytes
from glowpy.onnxifi import api, objects

from .conftest import Tensors, backend_ids, fence


@pytest.fixture
def cpu(impl, tmp_path, monkeypatch):
    """A CPU JIT backend on `impl` over an empty cache; counts the copies of host weights."""
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(tmp_path / "cache"))
    copies = []
    real_copy = api.HostWeights.copy

    def counted(self):
        if self._open:
            copies.append([d.name for d in self.given])
        return real_copy(self)

    monkeypatch.setattr(api.HostWeights, "copy", counted)
    ids = backend_ids(impl)
    be = ctypes.c_void_p()
    assert impl.onnxInitBackend(ids[0], None, ctypes.byref(be)) == Status.SUCCESS
    yield {"lib": impl, "backend": be, "copies": copies, "copied_before": 0}
    impl.onnxReleaseBackend(be)
    for i in ids:
        impl.onnxReleaseBackendID(i)


def init_run_release(s, model: bytes, w: np.ndarray) -> tuple[np.ndarray, bool]:
    """InitGraph with `w` as a descriptor, scribble over `w`, run x = 1, release; (y, model-cache hit?)."""
    lib, g = s["lib"], ctypes.c_void_p()
    host_w = w.copy()
    weights = Tensors(w=host_w)
    assert lib.onnxInitGraph(s["backend"], None, len(model), model, 1, weights.array, ctypes.byref(g)) == Status.SUCCESS
    host_w[...] = np.nan  # the host frees its weights on return
    copies = len(s["copies"])
    x, y = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    ins, outs, f = Tensors(x=x), Tensors(y=y), fence()
    assert lib.onnxSetIOAndRunGraph(g, 1, ins.array, 1, outs.array, ctypes.byref(f)) == Status.SUCCESS
    assert lib.onnxWaitEvent(f.event) == Status.SUCCESS
    assert lib.onnxReleaseEvent(f.event) == Status.SUCCESS
    assert lib.onnxReleaseGraph(g) == Status.SUCCESS
    hit = copies == s["copied_before"]
    s["copied_before"] = copies
    return y, hit


def test_a_hit_never_copies_the_hosts_weights_and_a_changed_weight_misses(cpu, add_model):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    y, hit = init_run_release(cpu, add_model, w)
    assert not hit and cpu["copies"] == [["w"]]
    np.testing.assert_array_equal(y, w + 1)

    y, hit = init_run_release(cpu, add_model, w)  # the same bytes: restored, never read past the hash
    assert hit and cpu["copies"] == [["w"]]
    np.testing.assert_array_equal(y, w + 1)

    w2 = w.copy()
    w2[1, 2] = np.nextafter(w2[1, 2], np.float32(np.inf))  # one bit of one weight
    y, hit = init_run_release(cpu, add_model, w2)
    assert not hit and cpu["copies"] == [["w"], ["w"]]
    np.testing.assert_array_equal(y, w2 + 1)


def test_weights_are_not_read_after_init_returns(add_model):
    """A compile that would need the host's buffers after InitGraph returned is an error, not a read."""
    proto = parse_model_bytes(add_model)
    w = np.ones((2, 3), np.float32)
    held = Tensors(w=w)
    weights = api.HostWeights(proto, ctypes.addressof(held.array), 1, objects.Backend(None, None, 0))
    deferred = weights.model()
    weights.close()
    with pytest.raises(InternalError, match="after onnxInitGraph returned"):
        deferred.load()
