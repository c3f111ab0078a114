"""A model file read lean (importer/model_file.py): big initializer payloads stay in the file until the
import reads them one by one. The graph is the same as from the model's bytes, and the peak memory of
an import or a compile holds the weights no more often than the stage needs (RSS high-water marks)."""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
from glowpy.errors import InvalidProtobuf
from glowpy.importer import import_model, read_model
from glowpy.importer.model_file import MIN_PAYLOAD, without_payloads

MIB = 1 << 20


def mixed_model() -> onnx.ModelProto:
    """Big float32 / float16 / int64 weights, small ones, a typed-data tensor and a Constant node."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 96)).astype(np.float32)  # 24 KiB: made external
    b = rng.standard_normal(96).astype(np.float32)  # 384 bytes: stays inline
    h = rng.standard_normal((64, 96)).astype(np.float16)
    idx = np.arange(4096, dtype=np.int64) % 96
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [96], rng.standard_normal(96).tolist())  # float_data
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y0"]),
        helper.make_node("Add", ["y0", "b"], ["y1"]),
        helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "hf"], ["y2"]),
        helper.make_node("Add", ["y1", "y2"], ["y3"]),
        helper.make_node("Add", ["y3", "typed"], ["y4"]),
        helper.make_node("Gather", ["y4", "idx"], ["y"], axis=1),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(h, "h"),
             numpy_helper.from_array(idx, "idx"), typed]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4096])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="test")


def test_lean_read_is_the_same_model(tmp_path: Path) -> None:
    model = mixed_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    lean, base_dir = read_model(path, lean=True)
    assert base_dir == str(tmp_path.resolve())
    external = {t.name for t in lean.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert external == {"w", "h", "idx"}  # payloads of MIN_PAYLOAD bytes and more; typed data stays
    for plain, t in zip(model.graph.initializer, lean.graph.initializer):
        assert (plain.name, list(plain.dims), plain.data_type) == (t.name, list(t.dims), t.data_type)
        a, b = numpy_helper.to_array(plain), numpy_helper.to_array(t, base_dir)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    # everything but the initializers is byte for byte what the file holds
    for m in (model, lean):
        del m.graph.initializer[:]
    assert lean.SerializeToString() == model.SerializeToString()


def test_lean_import_and_compile_match_the_bytes(tmp_path: Path) -> None:
    model = mixed_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    from_path, from_bytes = import_model(path), import_model(model.SerializeToString())
    assert sorted(from_path.constants) == sorted(from_bytes.constants)
    for name, v in from_bytes.constants.items():
        assert from_path.constants[name].data.tobytes() == v.data.tobytes()
    x = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    got = glowpy.compile(path, backend="cpu", threads=1, cache=False).run(x)
    want = glowpy.compile(model.SerializeToString(), backend="cpu", threads=1, cache=False).run(x)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)


def test_lean_read_through_a_link_and_of_small_or_broken_files(tmp_path: Path) -> None:
    model = mixed_model()
    real = tmp_path / "real"
    real.mkdir()
    onnx.save(model, str(real / "m.onnx"))
    (tmp_path / "link.onnx").symlink_to(real / "m.onnx")
    g = import_model(tmp_path / "link.onnx")  # the payloads are read from the file the link names
    assert g.constants["w"].data.tobytes() == numpy_helper.to_array(model.graph.initializer[0]).tobytes()
    small = mixed_model()
    del small.graph.initializer[:]
    small.graph.initializer.append(numpy_helper.from_array(np.ones(MIN_PAYLOAD // 8, np.float32), "w"))
    onnx.save(small, str(tmp_path / "small.onnx"))
    assert without_payloads(str(tmp_path / "small.onnx")) is None  # nothing to leave in the file
    (tmp_path / "bad.onnx").write_bytes(b"\x0f" + bytes(100))  # wire type 7: not protobuf
    with pytest.raises(InvalidProtobuf, match="not an ONNX model"):
        import_model(tmp_path / "bad.onnx")


# --- peak memory -----------------------------------------------------------------------------------


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def _peak_above_now(run) -> int:
    """How far this process's RSS rose above its current level while `run()` ran (Linux: the
    high-water mark is reset through /proc/self/clear_refs first)."""
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS")
    keep = run()
    peak = _status("VmHWM") - base
    del keep
    return peak


def big_weight_model(path: Path, mib: int = 48) -> int:
    """A MatMul by a `mib` MiB constant (the weight every stage would copy), saved at `path`."""
    n = 1024
    k = mib * MIB // (4 * n)
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return w.nbytes


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.access("/proc/self/clear_refs", os.W_OK),
                                reason="RSS high-water marks are read from Linux's /proc")


@linux_only
def test_import_holds_the_weights_once(tmp_path: Path) -> None:
    nbytes = big_weight_model(tmp_path / "big.onnx")
    import_model(tmp_path / "big.onnx")  # warm: modules and tables the import builds once
    peak = _peak_above_now(lambda: import_model(tmp_path / "big.onnx"))
    # the file's bytes or the parsed proto beside the arrays would be a second copy
    assert peak < 1.25 * nbytes, f"import peaked {peak / MIB:.0f} MiB above its start for {nbytes / MIB:.0f} MiB of weights"


@linux_only
def test_cold_compile_holds_weights_at_most_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weight and its packed copy meet while the kernel is built; nothing else may hold a third
    (the proto kept alive, the cache writer mapping the weights file it wrote)."""
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(tmp_path / "cache"))
    nbytes = big_weight_model(tmp_path / "big.onnx")
    small = tmp_path / "small.onnx"
    big_weight_model(small, mib=1)
    glowpy.compile(small, backend="cpu", threads=1)  # warm: LLVM's code pages, the cache directory

    def compile_and_store():
        m = glowpy.compile(tmp_path / "big.onnx", backend="cpu", threads=1)
        glowpy.backends.cpu.model_cache.flush()  # the write-behind of the weights file counts too
        return m

    peak = _peak_above_now(compile_and_store)
    assert not any((tmp_path / "cache").glob("*.tmp"))
    assert len(list((tmp_path / "cache").glob("model-*.w"))) == 2
    assert peak < 2.4 * nbytes, f"compile peaked {peak / MIB:.0f} MiB above its start for {nbytes / MIB:.0f} MiB of weights"


@pytest.mark.parametrize("preadv", [True, False])
def test_file_digest_is_the_bytes_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preadv: bool) -> None:
    """A file's digest, read a chunk at a time into buffers of its own (or with pread), is its bytes'
    digest, and a marker split between two chunks is found."""
    from glowpy.importer import digest

    monkeypatch.setattr(digest, "CHUNK", 4096)
    if not preadv:
        monkeypatch.delattr(os, "preadv", raising=False)
    data = bytearray(np.random.default_rng(0).integers(0, 256, 3 * 4096 + 100, dtype=np.uint8).tobytes())
    data[4096 - 3:4096 + 5] = b"location"
    for content, marked in ((bytes(data), True), (bytes(data).replace(b"location", b"xxxxxxxx"), False)):
        (tmp_path / "m.onnx").write_bytes(content)
        with open(tmp_path / "m.onnx", "rb") as f:
            assert digest.file_digest(f.fileno(), len(content), b"location") == (digest.content_digest(content), marked)
    with open(tmp_path / "m.onnx", "rb") as f:
        with pytest.raises(OSError, match="read"):
            digest.file_digest(f.fileno(), len(data) + 10)


def test_weights_the_optimizer_replaces_die_with_the_import_host(tmp_path: Path) -> None:
    """The import's host is cyclic garbage once the walk is done; its name table must not keep the
    weights BatchNorm folding replaces alive through the passes (which pause the cyclic collector):
    a cold compile of an unfused ResNet-50 would hold the old and the new weights at once."""
    import weakref

    from glowpy.backends import get_backend
    from glowpy.optimizer import optimize

    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    bn = [np.abs(rng.standard_normal(8)).astype(np.float32) + 0.5 for _ in range(4)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for a, n in zip([w, *bn], "wsbmv")]
    graph = helper.make_graph(nodes, "convbn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], inits)
    path = tmp_path / "convbn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    gc.collect()
    gc.disable()
    try:
        g = import_model(path)
        old = weakref.ref(g.constants["w"].data)
        optimize(g, get_backend("cpu"), in_place=True)
        assert "w" not in g.constants and [n.op for n in g.nodes] == ["Conv"]
        assert old() is None, "the folded conv's original weights are still referenced"
    finally:
        gc.enable()
