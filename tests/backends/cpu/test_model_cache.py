"""The model-level cache: a hit skips import, optimize and code generation and gives the same graph and
bit-identical outputs; anything that changes the result changes the key; damaged entries are rebuilt."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowpy
import glowpy.pipeline as pipeline
from glowpy.backends.cpu.model_cache import WRITER_NICE, flush, graph_state, restore_graph, write_behind


def conv_model(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    fc = numpy_helper.from_array(rng.standard_normal((10, 8 * 6 * 6)).astype(np.float32), "fc")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w, b, fc, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


FEED = {"x": np.random.default_rng(5).standard_normal((1, 3, 6, 6)).astype(np.float32)}


@pytest.fixture
def fresh_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(d))
    return d


def no_import(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("a model cache hit must not import the model")

    monkeypatch.setattr(pipeline, "load", refuse)


def test_hit_skips_import_and_gives_identical_results(fresh_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = conv_model()
    cold = glowpy.compile(data, threads=1)
    assert not cold.cached
    flush()
    assert list(fresh_dir.glob("model-*.w"))
    no_import(monkeypatch)
    hot = glowpy.compile(data, threads=1)
    assert hot.cached and hot.executable.model_cached
    assert str(hot.graph) == str(cold.graph)
    assert hot.input_types == cold.input_types and hot.output_types == cold.output_types
    assert hot.imported.nodes == cold.imported.nodes and hot.imported.parameters == cold.imported.parameters
    np.testing.assert_array_equal(hot.run(FEED)["y"], cold.run(FEED)["y"])
    assert hot.executable.code_key == cold.executable.code_key


def test_path_bytes_and_proto_hit(fresh_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file and its bytes share an entry; a ModelProto (digested field by field) has its own."""
    data = conv_model()
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    cold = glowpy.compile(str(path), threads=1)
    glowpy.compile(onnx.ModelProto.FromString(data), threads=1)
    no_import(monkeypatch)
    assert glowpy.compile(data, threads=1).executable.model_cached
    assert glowpy.compile(onnx.ModelProto.FromString(data), threads=1).executable.model_cached
    np.testing.assert_array_equal(glowpy.compile(path, threads=1).run(FEED)["y"], cold.run(FEED)["y"])


def test_proto_digest_sees_every_field() -> None:
    from glowpy.backends.cpu.model_cache import proto_digest

    base = proto_digest(onnx.ModelProto.FromString(conv_model()))
    assert proto_digest(onnx.ModelProto.FromString(conv_model())) == base
    for change in ("weight", "node", "producer", "input"):
        m = onnx.ModelProto.FromString(conv_model())
        if change == "weight":
            t = m.graph.initializer[0]
            t.raw_data = t.raw_data[:-1] + bytes([t.raw_data[-1] ^ 1])
        elif change == "node":
            m.graph.node[1].op_type = "Sigmoid"
        elif change == "producer":
            m.producer_version = "other"
        else:
            m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
        assert proto_digest(m) != base, change


@pytest.mark.parametrize("change", ["weights", "threads", "optimize", "profile", "cache off"])
def test_what_changes_the_result_changes_the_key(fresh_dir: Path, change: str) -> None:
    data = conv_model()
    first = glowpy.compile(data, threads=1)
    kwargs: dict = {"threads": 1}
    if change == "weights":
        data = conv_model(seed=1)
    elif change == "threads":
        kwargs["threads"] = 2
    elif change == "optimize":
        kwargs["optimize"] = False
    elif change == "profile":
        kwargs["profile"] = True
    else:
        kwargs["cache"] = False
    second = glowpy.compile(data, **kwargs)
    if change == "weights":  # same code (the object entry hits), other weights: the model entry must miss
        assert not np.array_equal(second.run(FEED)["y"], first.run(FEED)["y"])
        np.testing.assert_allclose(second.run(FEED)["y"],
                                   glowpy.compile(data, backend="interpreter").run(FEED)["y"], rtol=1e-4, atol=1e-4)
    assert first.executable.model_cached is False
    assert second.executable.model_cached is False


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove weights", "remove object", "garbage meta"])
def test_damaged_entry_is_rebuilt(fresh_dir: Path, damage: str) -> None:
    data = conv_model()
    want = glowpy.compile(data, threads=1).run(FEED)["y"]
    flush()
    (w,) = fresh_dir.glob("model-*.w")
    (meta,) = fresh_dir.glob("model-*.o")
    if damage == "truncate":
        w.write_bytes(w.read_bytes()[:-100])
    elif damage == "flip":
        blob = bytearray(w.read_bytes())
        blob[0] ^= 0xFF
        w.write_bytes(bytes(blob))
    elif damage == "remove weights":
        w.unlink()
    elif damage == "remove object":
        for p in fresh_dir.glob("*.o"):
            if not p.name.startswith(("model-", "idx-")):
                p.unlink()
    else:
        meta.write_bytes(b"GLOWPY-OBJ-1 nonsense\n123")
    again = glowpy.compile(data, threads=1)
    assert not again.executable.model_cached
    np.testing.assert_array_equal(again.run(FEED)["y"], want)
    assert glowpy.compile(data, threads=1).executable.model_cached  # rebuilt


def test_graph_state_round_trip() -> None:
    g = glowpy.optimize(glowpy.load(conv_model()), "cpu")
    back = restore_graph(graph_state(g))
    assert str(back) == str(g)



def test_a_file_rewritten_in_place_is_not_mistaken(fresh_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(conv_model(seed=0))
    os.utime(path, ns=(10**18, 10**18))  # settled long ago: its digest is remembered by stat
    first = glowpy.compile(path, threads=1).run(FEED)["y"]
    flush()
    assert list(fresh_dir.glob("path-*.o"))
    assert glowpy.compile(path, threads=1).executable.model_cached
    path.write_bytes(conv_model(seed=1))  # same size and (restored) mtime, other weights
    os.utime(path, ns=(10**18, 10**18))
    second = glowpy.compile(path, threads=1)
    assert not second.executable.model_cached
    assert not np.array_equal(second.run(FEED)["y"], first)


def test_external_data_models_skip_the_model_cache(fresh_dir: Path, tmp_path: Path) -> None:
    model = onnx.ModelProto.FromString(conv_model())
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.bin",
              size_threshold=0)
    want = glowpy.compile(path, threads=1).run(FEED)["y"]
    again = glowpy.compile(path, threads=1)
    flush()
    assert not again.executable.model_cached and not list(fresh_dir.glob("model-*"))
    np.testing.assert_array_equal(again.run(FEED)["y"], want)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is a Linux notion")
def test_the_background_write_runs_at_the_lowest_priority() -> None:
    """The write (and its hashing) runs beside the first inferences: it must not take their cores."""
    seen = []
    write_behind(lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    flush()
    assert seen == [WRITER_NICE]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != WRITER_NICE  # the caller keeps its own


def test_a_hit_over_the_memory_limit_is_refused_as_a_compile_is(fresh_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """GLOWPY_MAX_MEMORY holds for a cached model too: an entry whose weights and arena are over it is a
    miss, and the compile refuses the model naming the tensor, as without the cache."""
    from glowpy.errors import MemoryLimitExceeded

    data = conv_model()
    glowpy.compile(data, threads=1)
    flush()
    monkeypatch.setenv("GLOWPY_MAX_MEMORY", "8K")  # fc is 11.25 KiB
    with pytest.raises(MemoryLimitExceeded, match=r"tensor 'fc'.*needs 11\.2 KiB"):
        glowpy.compile(data, threads=1)
    monkeypatch.setenv("GLOWPY_MAX_MEMORY", "64M")
    assert glowpy.compile(data, threads=1).cached
