"""The object-code cache: hits skip LLVM, corrupt entries are rebuilt, the directory is configurable,
concurrent compiles are safe."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from glowpy.backends.cpu import CpuBackend, parallel
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
    """Whole-program object entries (not the signature index, per-kernel, model or path entries)."""
    return sorted(p for p in d.glob("*.o") if not p.name.startswith(("idx-", "k-", "model-", "path-")))


def test_second_compile_hits_and_skips_llvm(fresh_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph, feeds = small_graph()
    first = CpuBackend().compile(graph, threads=1)
    assert not first.cached
    assert len(entries(fresh_dir)) == 1

    def no_llvm(*args, **kwargs):
        raise AssertionError("LLVM ran on a cache hit")

    monkeypatch.setattr(parallel, "compile_unit", no_llvm)
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


# --- faults: each compile works (or goes on without the cache) with one warning, never a wrong result ---


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    from glowpy.backends.cpu import cache

    monkeypatch.setattr(cache, "_warned", set())


def cache_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "glowpy.cache"]


@pytest.fixture
def readonly_dir(tmp_path: Path):
    """A cache directory nobody can write: chmod for a normal user; root ignores modes, so for root a
    tmpfs remounted read-only. Yields (directory, make_read_only)."""
    import os

    d = tmp_path / "ro-cache"
    d.mkdir()
    mounted = False
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d)], capture_output=True).returncode:
            pytest.skip("running as root without mount: no way to make a directory read-only here")
        mounted = True

    def make_read_only() -> None:
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        else:
            d.chmod(0o555)

    try:
        yield d, make_read_only
    finally:
        if mounted:
            subprocess.run(["umount", str(d)], check=False)
        else:
            d.chmod(0o755)


def test_read_only_cache_dir(readonly_dir, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    d, make_read_only = readonly_dir
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(d))
    g_old, feeds = small_graph()
    CpuBackend().compile(g_old, threads=1)  # an entry made while it was writable
    make_read_only()
    with pytest.raises(OSError):
        (d / "probe").write_bytes(b"x")
    ex = CpuBackend().compile(g_old, threads=1)
    assert ex.cached  # reading still works
    check(ex, g_old, feeds)
    g_new = small_graph()[0]
    g_new.add_node("Relu", [g_new.outputs[0]], name="relu")
    g_new.outputs = [g_new.nodes[-1].outputs[0]]
    for _ in range(2):
        ex = CpuBackend().compile(g_new, threads=1)
        assert not ex.cached
        check(ex, g_new, feeds)
    (warning,) = cache_warnings(caplog)
    assert f"compile cache {d}: cannot store compiled code (Read-only file system" in warning or \
        "Permission denied" in warning


FULL_DISK = textwrap.dedent("""
    import resource, sys, logging
    sys.path.insert(0, {root!r})
    logging.basicConfig(format="%(levelname)s %(name)s %(message)s")
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))  # every file write past 64 bytes: EFBIG
    from tests.backends.cpu.test_cache import small_graph
    from glowpy.backends.cpu import CpuBackend
    from glowpy.backends.interpreter import InterpreterBackend
    graph, feeds = small_graph()
    want = InterpreterBackend().compile(graph).run(feeds)[0]
    for _ in range(2):
        ex = CpuBackend().compile(graph, threads=1)
        assert not ex.cached
        got = ex.run(feeds)[0]
        assert abs(got - want).max() <= 1e-5 * abs(want).max(), (got, want)
    print("ok")
""")


def test_full_disk_rlimit_fsize(fresh_dir: Path) -> None:
    """RLIMIT_FSIZE makes every write past the limit fail with EFBIG (Python ignores SIGXFSZ)."""
    import os

    proc = subprocess.run([sys.executable, "-c", FULL_DISK.format(root=str(ROOT))], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "GLOWPY_CACHE_DIR": str(fresh_dir)})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    warnings = [x for x in proc.stderr.splitlines() if "glowpy.cache" in x]
    assert warnings == [f"WARNING glowpy.cache glowpy: compile cache {fresh_dir}: cannot store compiled code "
                        "(File too large); compiling without the cache"], proc.stderr
    assert not list(fresh_dir.glob("*.tmp")) and not list(fresh_dir.glob(".*.tmp"))  # partial files removed
    assert not entries(fresh_dir)


def test_full_disk_small_tmpfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    import os

    d = tmp_path / "tiny"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(d)],
                                           capture_output=True).returncode:
        pytest.skip("needs root with mount for a tmpfs (test_full_disk_rlimit_fsize covers the fault anyway)")
    try:
        with open(d / "filler", "wb", buffering=0) as f:  # fill the disk
            try:
                while True:
                    f.write(b"\0" * 1024)
            except OSError:
                pass
        monkeypatch.setenv("GLOWPY_CACHE_DIR", str(d))
        graph, feeds = small_graph()
        for _ in range(2):
            ex = CpuBackend().compile(graph, threads=1)
            assert not ex.cached
            check(ex, graph, feeds)
        (warning,) = cache_warnings(caplog)
        assert "cannot store compiled code (No space left on device)" in warning
        assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]
    finally:
        subprocess.run(["umount", str(d)], check=False)


@pytest.mark.parametrize("damage", ["truncate", "flip", "header"])
def test_corrupt_entry_warns_once(fresh_dir: Path, damage: str, caplog) -> None:
    graph, feeds = small_graph()
    CpuBackend().compile(graph, threads=1)
    (path,) = entries(fresh_dir)
    for idx in fresh_dir.glob("idx-*.o"):
        idx.unlink()  # the corrupt object must be met through its IR key too
    blob = path.read_bytes()
    damaged = {"truncate": blob[: len(blob) - 100], "flip": blob[:-1] + bytes([blob[-1] ^ 1]),
               "header": b"GLOWPY-OBJ-0" + blob[12:]}[damage]
    path.write_bytes(damaged)
    ex = CpuBackend().compile(graph, threads=1)
    assert not ex.cached
    check(ex, graph, feeds)
    (warning,) = cache_warnings(caplog)
    assert f"ignored {path.name}: truncated, damaged or not a glowpy entry (rebuilt)" in warning
    assert CpuBackend().compile(graph, threads=1).cached
    assert len(cache_warnings(caplog)) == 1


@pytest.mark.parametrize("what", ["glowpy", "llvmlite", "llvm", "cpu", "features"])
def test_entries_from_another_build_or_cpu_are_not_used(fresh_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                       what: str, caplog) -> None:
    """The key covers the glowpy, llvmlite and LLVM versions and the CPU name and features: an entry
    written under any other value is never loaded."""
    import dataclasses

    import llvmlite

    import glowpy
    from glowpy.backends.cpu import target as target_mod

    graph, feeds = small_graph()
    backend = CpuBackend()
    with monkeypatch.context() as m:
        if what == "glowpy":
            m.setattr(glowpy, "__version__", "0.0.0-other")
        elif what == "llvmlite":
            m.setattr(llvmlite, "__version__", "0.0.0-other")
        elif what == "llvm":
            m.setattr(target_mod.llvm, "llvm_version_info", (1, 2, 3))
        elif what == "cpu":
            m.setattr(backend, "target", dataclasses.replace(backend.target, cpu="some-other-cpu"))
        else:
            m.setattr(backend, "target", dataclasses.replace(backend.target, features="-avx512f,+sse2"))
        backend.compile(graph, threads=1)
    assert len(entries(fresh_dir)) == 1
    ex = CpuBackend().compile(graph, threads=1)
    assert not ex.cached
    check(ex, graph, feeds)
    assert len(entries(fresh_dir)) == 2 and not cache_warnings(caplog)


def test_many_processes_compiling_at_once_agree(fresh_dir: Path) -> None:
    """Six processes race to compile and store the same model: every result is right, one complete
    entry remains, nothing is warned, no temporary is left."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.backends.cpu.test_cache import small_graph
        from glowpy.backends.cpu import CpuBackend
        from glowpy.backends.interpreter import InterpreterBackend
        graph, feeds = small_graph()
        got = CpuBackend().compile(graph, threads=1).run(feeds)[0]
        want = InterpreterBackend().compile(graph).run(feeds)[0]
        print(float(abs(got - want).max()))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    results = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0 and float(out) <= 1e-5, err
        assert "glowpy.cache" not in err and "compile cache" not in err, err
    (path,) = entries(fresh_dir)
    assert ObjectCache(fresh_dir).get(path.stem) is not None
    assert not [p for p in fresh_dir.iterdir() if p.name.endswith(".tmp")]
