"""A short ONNXIFI soak through the C library (tools/soak.py): host threads cycling init/run/release,
runs finished three ways (waited here, waited from another thread, graph released in flight), and the
library closed and opened again between rounds; every output checked against onnxruntime."""

from __future__ import annotations

import shutil

import pytest

from tools.soak import soak


@pytest.fixture(scope="module")
def lib_path(tmp_path_factory: pytest.TempPathFactory):
    from glowpy.onnxifi.build import build

    return build(tmp_path_factory.mktemp("onnxifi-lib"))


@pytest.mark.parametrize("backend", ["CPU", "Interpreter"])
def test_short_soak(backend, lib_path, tmp_path, monkeypatch):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on this machine")
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(tmp_path / "cache"))
    r = soak(threads=3, cycles=6, rounds=2, model="tiny", backend=backend, report=3, library=lib_path,
             work_dir=tmp_path / "soak")
    assert r.returncode == 0 and r.failed == 0 and not r.failures, r.failures
    assert r.cycles == 3 * 6 * 2
    assert len(r.closed) == 2  # both rounds ended in dlclose, and the second began with a fresh dlopen
    assert [c for _, c, _ in r.rss][-1] == r.cycles
    assert r.growth <= 0.10, r.rss
