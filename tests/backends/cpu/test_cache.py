"""The object-code cache: hits skip LLVM, corrupt entries are rebuilt, the directory is configurable,
concurrent compiles are safe."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import glowpy.backends.cpu as cpu_mod
from glowpy.backends.cpu import CpuBackend
from glowpy.backends.cpu.cache import ObjectCache, cache_dir
from glowpy.backends.interpreter import InterpreterBackend
from glowpy.ir.graph import Graph
from glowpy.ir.types import TensorType

ROOT = Path(__file__).resolve().parents[3]


def small_graph(scale: float = 2.0) -> tuple[Graph, list[np.ndarray]]:
    g = Graph("cached")
    x = g.add_input("x", TensorType(np.float32, (3, 5)))
    c = g.add_constant("c", np.full((5,), scale, np.float32))
    y = g.add_node("Mul", [x, c], name="mul").outputs[0]
    z = g.add_node("Tanh", [y], name="tanh").outputs[0]
    s = g.add_node("ReduceSum", [z], {"axes": (1,), "keepdims": 0}, name="sum").outputs[0]
    g.outputs = [s]
    return g, [np.arange(15, dtype=np.float32).reshape(3, 5) / 10]


def check(ex, graph, feeds) -> None:
    np.testing.assert_allclose(ex.run(feeds)[0], InterpreterBackend().compile(graph).run(feeds)[0], rtol=1e-5)


@pytest.fixture
def fresh_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(d))
    return d


def entries(d: Path) -> list[Path]:
    """Object entries (not the signature index files)."""
    return sorted(p for p in d.glob("*.o") if not p.name.startswith("idx-"))


def test_second_compile_hits_and_skips_llvm(fresh_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph, feeds = small_graph()
    first = CpuBackend().compile(graph, threads=1)
    assert not first.cached
    assert len(entries(fresh_dir)) == 1

    def no_llvm(*args, **kwargs):
        raise AssertionError("LLVM ran on a cache hit")

    monkeypatch.setattr(cpu_mod, "compile_object", no_llvm)
    second = CpuBackend().compile(graph, threads=1)
    assert second.cached
    check(second, graph, feeds)


def test_weights_are_not_part_of_the_key(fresh_dir: Path) -> None:
    """Non-scalar weights live in the weights block, so a model with other weights reuses the code."""
    g1, feeds = small_graph(2.0)
    g2, _ = small_graph(3.0)
    CpuBackend().compile(g1, threads=1)
    ex = CpuBackend().compile(g2, threads=1)
    assert ex.cached
    check(ex, g2, feeds)


def test_options_change_the_key(fresh_dir: Path) -> None:
    graph, _ = small_graph()
    CpuBackend().compile(graph, threads=1)
    assert not CpuBackend().compile(graph, threads=1, profile=True).cached


@pytest.mark.parametrize("damage", ["garbage", "truncate", "empty", "flip"])
def test_corrupt_entry_is_rebuilt(fresh_dir: Path, damage: str) -> None:
    graph, feeds = small_graph()
    CpuBackend().compile(graph, threads=1)
    (path,) = entries(fresh_dir)
    blob = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"\x7fELF" + b"\x00" * 64)
    elif damage == "truncate":
        path.write_bytes(blob[: len(blob) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]))
    ex = CpuBackend().compile(graph, threads=1)
    assert not ex.cached
    check(ex, graph, feeds)
    assert ObjectCache(fresh_dir).get(path.stem) is not None  # rewritten
    assert CpuBackend().compile(graph, threads=1).cached


def test_unreadable_entry_is_rebuilt(fresh_dir: Path) -> None:
    graph, feeds = small_graph()
    CpuBackend().compile(graph, threads=1)
    (path,) = entries(fresh_dir)
    path.unlink()
    path.mkdir()  # a directory where the file should be: reading fails, writing fails
    ex = CpuBackend().compile(graph, threads=1)
    assert not ex.cached
    check(ex, graph, feeds)


def test_unwritable_cache_dir_still_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(blocker / "cache"))
    graph, feeds = small_graph()
    ex = CpuBackend().compile(graph, threads=1)
    assert not ex.cached
    check(ex, graph, feeds)


def test_cache_false_writes_nothing(fresh_dir: Path) -> None:
    graph, _ = small_graph()
    CpuBackend().compile(graph, threads=1, cache=False)
    assert not entries(fresh_dir) if fresh_dir.exists() else True


def test_cache_directory_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("GLOWPY_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "glowpy"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "glowpy"


def test_glowpy_cache_dir_is_honoured(fresh_dir: Path) -> None:
    graph, _ = small_graph()
    CpuBackend().compile(graph, threads=1)
    assert len(entries(fresh_dir)) == 1
    assert not list(fresh_dir.glob("*.tmp"))  # no temporaries left behind


def test_two_processes_compiling_at_once(fresh_dir: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import numpy as np
        from tests.backends.cpu.test_cache import small_graph
        from glowpy.backends.cpu import CpuBackend
        graph, feeds = small_graph()
        out = CpuBackend().compile(graph, threads=1).run(feeds)[0]
        print(repr(out.tolist()))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, results):
        assert p.returncode == 0, err
    assert len({out for out, _ in results}) == 1
    (path,) = entries(fresh_dir)
    assert ObjectCache(fresh_dir).get(path.stem) is not None
    graph, _ = small_graph()
    assert CpuBackend().compile(graph, threads=1).cached


def test_signature_index_skips_printing_the_ir(fresh_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from glowpy.backends.cpu import codegen

    graph, feeds = small_graph()
    CpuBackend().compile(graph, threads=1)

    def no_text(self):
        raise AssertionError("IR printed although the signature index knew the key")

    monkeypatch.setattr(codegen.Program, "ir_text", property(no_text))
    ex = CpuBackend().compile(graph, threads=1)
    assert ex.cached
    check(ex, graph, feeds)


def test_stale_signature_index_is_not_trusted(fresh_dir: Path) -> None:
    """An index entry whose recorded program disagrees with the one just built is ignored."""
    import json

    graph, feeds = small_graph()
    CpuBackend().compile(graph, threads=1)
    store = ObjectCache(fresh_dir)
    (idx,) = fresh_dir.glob("idx-*.o")
    sig = idx.stem[len("idx-"):]
    entry = store.get_index(sig)
    store.put_index(sig, {**entry, "key": "0" * 64})  # points nowhere: falls back to hashing the IR
    assert CpuBackend().compile(graph, threads=1).cached
    store.put_index(sig, {**entry, "check": "different"})
    ex = CpuBackend().compile(graph, threads=1)
    assert ex.cached  # found through the IR hash instead
    check(ex, graph, feeds)
    assert json.loads(json.dumps(store.get_index(sig)))["check"] == entry["check"]  # repaired
