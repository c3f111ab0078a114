"""The compile progress line: stages and kernels n/m on a terminal, silent otherwise."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import glowpy
from glowpy.backends import progress
from glowpy.backends.progress import Progress
from tests.backends.cpu.test_model_cache import conv_model


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def fresh_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("GLOWPY_CACHE_DIR", str(d))
    return d


def test_a_cold_compile_draws_its_stages_then_clears(fresh_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(progress, "DELAY", 0.0)
    glowpy.compile(conv_model(), threads=1, progress=True)
    err = capsys.readouterr().err
    for stage in ("import", "optimize", "codegen", "kernels 1/", "link"):
        assert stage in err
    assert err.endswith("\r") and err.rstrip("\r").split("\r")[-1].strip() == ""  # the line is cleared


def test_silent_when_not_a_tty_or_off(fresh_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(progress, "DELAY", 0.0)
    glowpy.compile(conv_model(1), threads=1)  # auto: pytest's stderr is not a TTY
    glowpy.compile(conv_model(2), threads=1, progress=False)
    assert capsys.readouterr().err == ""


def test_auto_follows_the_stream_and_waits_for_the_delay() -> None:
    tty, pipe = Tty(), io.StringIO()
    assert Progress(None, stream=tty).enabled and not Progress(None, stream=pipe).enabled
    quick = Progress(None, "m.onnx", stream=tty, delay=60)
    quick.kernels(1, 4)
    quick.close()
    assert tty.getvalue() == ""  # a compile shorter than the delay shows nothing
    slow = Progress(True, "m.onnx", stream=tty, delay=0)
    slow.kernels(2, 4)
    assert "glowpy: compiling m.onnx [" + "#" * 12 + "." * 12 + "] kernels 2/4" in tty.getvalue()


def test_a_broken_stream_never_fails_a_compile() -> None:
    class Closed(Tty):
        def write(self, s: str) -> int:
            raise OSError("closed")

    p = Progress(True, stream=Closed(), delay=0)
    p.stage("import")
    p.kernels(1, 2)
    p.close()
    assert not p.enabled
