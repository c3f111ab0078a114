"""Packed weights in huge-page blocks (backends/cpu/hugepages.py): the allocator, the packers' arrays of a
compile and a model cache hit's weights land in memory advised MADV_HUGEPAGE, with the same values."""

from __future__ import annotations

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


def test_read_ranges_reads_exactly_or_raises(tmp_path: Path) -> None:
    data = bytes(range(256)) * 1000
    (tmp_path / "f").write_bytes(data)
    with open(tmp_path / "f", "rb") as f:
        a, b, c = hugepages.read_ranges(f.fileno(), [(5, 1000), (0, 64), (100_000, 156_000)])
        assert a.tobytes() == data[5:1005] and b.tobytes() == data[:64] and c.tobytes() == data[100_000:]
        assert a.ctypes.data % HUGE == 0 and b.ctypes.data % hugepages.ALIGN == 0
        with pytest.raises(OSError, match="bytes short"):
            hugepages.read_ranges(f.fileno(), [(len(data) - 10, 20)])


def conv_model(path: Path) -> None:
    """Two 1x1 convs with 256 KiB weights each (packed: past MIN_BYTES), and a 256 KiB table a Gather reads
    in place (the graph's weight, not packed)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((256, 256, 1, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((256, 256, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "table"),
             numpy_helper.from_array(np.array([3, 7], np.int64), "rows")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"]), helper.make_node("Gather", ["table", "rows"], ["g"])]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 8, 8]),
                               helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 256])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@linux
def test_compiled_and_cached_weights_are_on_huge_page_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(tmp_path / "cache"))
    conv_model(tmp_path / "m.onnx")
    x = np.random.default_rng(4).standard_normal((1, 256, 8, 8)).astype(np.float32)
    model = onnx.load(str(tmp_path / "m.onnx"))
    w1, w2, table = (numpy_helper.to_array(t).reshape(256, 256) for t in model.graph.initializer[:3])
    want = np.einsum("oc,cp->op", w2, np.maximum(np.einsum("oc,cp->op", w1, x.reshape(256, 64)), 0)).reshape(x.shape)
    for cached in (False, True):
        m = glowpy.compile(tmp_path / "m.onnx", backend="cpu", threads=1)
        glowpy.backends.cpu.model_cache.flush()
        assert m.cached == cached
        big = [w for w in m.executable._weight_arrays if w.nbytes >= MIN_BYTES]
        packed = [w for w in big if not np.array_equal(w.reshape(-1), table.reshape(-1))]
        assert len(big) == 3 and len(packed) == 2
        assert all(advised_huge(w) for w in packed)
        if cached:
            assert not any(w.flags.writeable for w in big)  # as the cache entry's mapping was
            (kept,) = [w for w in big if w is not packed[0] and w is not packed[1]]
            assert not advised_huge(kept)  # the table a Gather reads in place stays mapped
        out = m.run({"x": x})
        np.testing.assert_allclose(out["y"], want, rtol=1e-4, atol=1e-3)
        np.testing.assert_array_equal(out["g"], table[[3, 7]])


@linux
def test_cache_hit_holds_packed_weights_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hit reads the packed arrays into huge-page memory: the entry's file must not also come into the
    RSS through its mapping (a digest sampled through it faults whole folios in)."""
    from tests.importer.test_model_file import MIB, _peak_above_now

    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(tmp_path / "cache"))
    w = np.random.default_rng(5).standard_normal((2048, 2048, 1, 1)).astype(np.float32)  # 16 MiB
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2048, 4, 4])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "big.onnx"))
    x = {"x": np.ones((1, 2048, 4, 4), np.float32)}
    glowpy.compile(tmp_path / "big.onnx", backend="cpu", threads=1).run(x)
    glowpy.backends.cpu.model_cache.flush()

    def hit():
        m = glowpy.compile(tmp_path / "big.onnx", backend="cpu", threads=1)
        assert m.cached
        m.run(x)
        return m

    hit()  # warm: modules and tables a hit builds once
    peak = _peak_above_now(hit)
    assert peak < 1.5 * w.nbytes, f"a cache hit peaked {peak / MIB:.0f} MiB above its start for {w.nbytes / MIB:.0f} MiB"
