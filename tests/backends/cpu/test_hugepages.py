"""Packed weights in huge-page blocks (backends/cpu/hugepages.py): the allocator, the packers' arrays of a
compile and a model cache hit's weights land in memory advised MADV_HUGEPAGE, with the same values."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.backends.cpu import hugepages
from glowpy.backends.cpu.hugepages import HUGE, MIN_BYTES, WeightBlock

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmFlags are read from Linux's /proc")


def advised_huge(a: np.ndarray) -> bool:
    """Whether `a`'s first byte lies in a mapping advised MADV_HUGEPAGE (smaps VmFlags 'hg')."""
    p = a.ctypes.data
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= p < hi
            elif inside and head == "VmFlags:":
                return "hg" in line.split()
    return False


def test_block_allocates_aligned_zeroed_arrays_and_copies_exactly() -> None:
    blk = WeightBlock()
    a = blk.alloc((3, 5), np.float32)
    assert a.shape == (3, 5) and a.dtype == np.float32 and not a.any()
    src = np.arange(1000, dtype=np.int8).reshape(10, 100)[:, ::3]  # not contiguous, another dtype
    b = blk.place(src)
    assert b.flags.c_contiguous and b.dtype == np.int8 and np.array_equal(b, src)
    assert b.ctypes.data % hugepages.ALIGN == 0 and blk.owns(a) and blk.owns(b)
    assert not blk.owns(np.zeros(4))
    big = blk.alloc((hugepages.BLOCK_BYTES // 4 + 1,), np.float32)  # past a block: a block of its own
    assert big.ctypes.data % HUGE == 0 and blk.owns(big) and not big.any()
    assert a.ctypes.data % HUGE == 0  # the first array starts its block


def test_zeros_and_contiguous_use_the_active_block_for_big_arrays_only() -> None:
    blk = WeightBlock()
    n = MIN_BYTES // 4
    assert not blk.owns(hugepages.zeros((n,)))  # no block active: numpy's
    with blk.active():
        z = hugepages.zeros((2, n))
        small = hugepages.zeros((8,))
        t = np.arange(2 * n, dtype=np.float32).reshape(2, n)
        c = hugepages.contiguous(t.T)
        with hugepages.inactive():
            probe = hugepages.contiguous(t.T)
    assert blk.owns(z) and not z.any() and not blk.owns(small)
    assert blk.owns(c) and np.array_equal(c, t.T) and c.flags.c_contiguous
    assert not blk.owns(probe) and np.array_equal(probe, t.T)
    assert not blk.owns(hugepages.zeros((2, n)))  # the block is active only inside the with


def test_read_file_reads_all_bytes_or_raises() -> None:
    data = bytes(range(256)) * 1000
    buf = hugepages.read_file(io.BytesIO(data), len(data))
    assert buf.tobytes() == data and buf.ctypes.data % HUGE == 0
    with pytest.raises(OSError, match="bytes short"):
        hugepages.read_file(io.BytesIO(data[:100]), 200)


def conv_model(path: Path) -> None:
    """Two 1x1 convs with 256 KiB weights each (packed: past MIN_BYTES)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((256, 256, 1, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((256, 256, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@linux
def test_compiled_and_cached_weights_are_on_huge_page_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(tmp_path / "cache"))
    conv_model(tmp_path / "m.onnx")
    x = np.random.default_rng(4).standard_normal((1, 256, 8, 8)).astype(np.float32)
    model = onnx.load(str(tmp_path / "m.onnx"))
    w1, w2 = (numpy_helper.to_array(t).reshape(256, 256) for t in model.graph.initializer)
    want = np.einsum("oc,cp->op", w2, np.maximum(np.einsum("oc,cp->op", w1, x.reshape(256, 64)), 0)).reshape(x.shape)
    for cached in (False, True):
        m = glowpy.compile(tmp_path / "m.onnx", backend="cpu", threads=1)
        glowpy.backends.cpu.model_cache.flush()
        assert m.cached == cached
        big = [w for w in m.executable._weight_arrays if w.nbytes >= MIN_BYTES]
        assert len(big) == 2
        assert all(advised_huge(w) for w in big)
        if cached:
            assert not any(w.flags.writeable for w in big)  # as the cache entry's mapping was
        np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-3)
