"""Cache management: the size cap evicts least recently used entries, `glowpy cache info|clear|path`,
and concurrent processes sharing a capped cache directory all get right results."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import glowpy
from glowpy.backends.cpu import cache
from glowpy.backends.cpu.model_cache import flush
from glowpy.cli import main
from tests.backends.cpu.test_model_cache import FEED, conv_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(d))
    monkeypatch.delenv("GLOWPY_CACHE_MAX_BYTES", raising=False)
    return d


@pytest.mark.parametrize(("raw", "want"), [("", cache.DEFAULT_MAX_BYTES), ("0", 0), ("1000", 1000), ("3K", 3 << 10),
                                           ("2m", 2 << 20), ("1G", 1 << 30)])
def test_cap_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str, want: int) -> None:
    monkeypatch.setenv("GLOWPY_CACHE_MAX_BYTES", raw)
    assert cache.max_bytes() == want


def test_malformed_cap_warns_and_uses_the_default(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    monkeypatch.setenv("GLOWPY_CACHE_MAX_BYTES", "lots")
    assert cache.max_bytes() == cache.DEFAULT_MAX_BYTES
    assert "GLOWPY_CACHE_MAX_BYTES='lots' is not a size" in caplog.text or cache._warned


def test_eviction_removes_least_recently_used_first(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    for i, name in enumerate(["old.o", "mid.w", "new.o", ".writing.tmp"]):
        p = d / name
        p.write_bytes(b"x" * 1000)
        os.utime(p, (1000 + i, 1000 + i) if name != ".writing.tmp" else None)
    (d / "onnxifi").mkdir()
    (d / "onnxifi" / "lib.so").write_bytes(b"y" * 5000)
    assert cache.evict(d, cap=2500) == 2000  # 90% of 2500: old and mid go; new stays; a fresh .tmp is a writer's
    assert sorted(p.name for p in d.iterdir()) == [".writing.tmp", "new.o", "onnxifi"]
    os.utime(d / ".writing.tmp", (1000, 1000))  # a writer that died an hour ago
    assert cache.evict(d, cap=0) == 1000
    assert (d / "onnxifi" / "lib.so").exists()


def test_stores_list_the_directory_only_when_the_cap_may_be_crossed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    listings = []
    real = cache.entries
    monkeypatch.setattr(cache, "entries", lambda d: listings.append(d) or real(d))
    monkeypatch.setenv("GLOWPY_CACHE_MAX_BYTES", "1M")
    store = cache.ObjectCache(tmp_path / "c")
    for i in range(2 * cache.EVICT_EVERY):  # 128 small entries: far under the cap
        assert store.put(f"k{i}", b"x" * 100)
    assert len(listings) == 2  # the first store, and one after EVICT_EVERY more (other processes' writes)
    del listings[:]
    for i in range(12):  # 100 KB each: the cap is crossed after ten, and the store that crosses it evicts
        assert store.put(f"big{i}", b"y" * 100_000)
    assert len(listings) == 2
    assert sum(size for _, size, _ in real(tmp_path / "c")) <= 1 << 20
    assert store.get("big11") == b"y" * 100_000 and store.get("big0") is None  # least recently used went


def test_a_hit_refreshes_an_entry(fresh_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    glowpy.compile(conv_model(0), threads=1)
    flush()
    (w,) = fresh_dir.glob("model-*.w")
    os.utime(w, (1000, 1000))
    assert glowpy.compile(conv_model(0), threads=1).executable.model_cached
    assert w.stat().st_mtime > time.time() - 60


def test_cap_keeps_the_directory_small_and_results_right(fresh_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWPY_CACHE_MAX_BYTES", "200K")
    want = {}
    for seed in range(4):
        want[seed] = glowpy.compile(conv_model(seed), threads=1).run(FEED)["y"]
        flush()
        total = sum(size for _, size, _ in cache.entries(fresh_dir))
        assert total <= 200 << 10
    for seed in range(4):  # evicted or not, every compile is right
        np.testing.assert_array_equal(glowpy.compile(conv_model(seed), threads=1).run(FEED)["y"], want[seed])


def test_cli_path_info_clear(fresh_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["cache", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(fresh_dir)
    glowpy.compile(conv_model(0), threads=1)
    flush()
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"directory {fresh_dir}" in out and "model     2 files" in out and "code      1 files" in out
    assert "kernels   " in out and "kernels   0 files" not in out
    assert "of 4.0 GiB cap" in out
    assert main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    assert not cache.entries(fresh_dir)
    assert not glowpy.compile(conv_model(0), threads=1).cached
    flush()


def test_cli_cache_needs_an_action(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["cache"])
    assert e.value.code == 2
    assert "ACTION" in capsys.readouterr().err


def test_processes_sharing_a_capped_cache(fresh_dir: Path, tmp_path: Path) -> None:
    """Four processes compile two models over and over on a cache too small for both: entries are
    evicted under each other's feet, and every result is still right."""
    models = []
    for seed in (0, 1):
        p = tmp_path / f"m{seed}.onnx"
        p.write_bytes(conv_model(seed))
        models.append(str(p))
    want = [glowpy.compile(m, backend="interpreter").run(FEED)["y"] for m in models]
    np.save(tmp_path / "x.npy", FEED["x"])
    script = textwrap.dedent(f"""
        import sys, numpy as np, glowpy
        x = np.load({str(tmp_path / "x.npy")!r})
        for i in range(6):
            m = sys.argv[1 + (i + int(sys.argv[3])) % 2]
            y = glowpy.compile(m, threads=1).run({{"x": x}})["y"]
            np.save(m + f".{{sys.argv[3]}}.{{i}}.npy", y)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOWPY_CACHE_DIR": str(fresh_dir),
           "GLOWPY_CACHE_MAX_BYTES": "150K"}
    procs = [subprocess.Popen([sys.executable, "-c", script, *models, str(k)], env=env, stderr=subprocess.PIPE,
                              text=True) for k in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    for k in range(4):
        for i in range(6):
            j = (i + k) % 2
            np.testing.assert_allclose(np.load(models[j] + f".{k}.{i}.npy"), want[j], rtol=1e-4, atol=1e-4)
