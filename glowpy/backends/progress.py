"""A compile's progress line on a terminal: stage (import, optimize, kernels n/m, link) and elapsed time.

`glowpy.compile(..., progress=None)` (the default) shows it on stderr when stderr is a TTY and the
compile has taken longer than DELAY seconds; True shows it on any stream after the delay (for tests
and hosts that want it), False never. A tqdm-style bar drawn by this module (no tqdm dependency): one
line rewritten in place with carriage returns, cleared when the compile ends. The pipeline opens it;
a backend reports its stages through `current()`, which is a silent reporter outside a compile.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

DELAY = 1.0
WIDTH = 24


class Progress:
    """One compile's progress line (silent unless enabled)."""

    def __init__(self, enabled: bool | None = None, name: str = "", stream: TextIO | None = None,
                 delay: float | None = None) -> None:
        self.stream = stream or sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.name = name
        self.delay = DELAY if delay is None else delay
        self.start = time.perf_counter()
        self.stage_name = ""
        self.done = self.total = 0
        self.shown = False
        self._width = 0
        self._lock = threading.Lock()

    def stage(self, name: str) -> None:
        self.stage_name, self.done, self.total = name, 0, 0
        self._draw()

    def kernels(self, done: int, total: int) -> None:
        self.stage_name, self.done, self.total = "kernels", done, total
        self._draw()

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        head = f"glowpy: compiling {self.name} " if self.name else "glowpy: compiling "
        if self.total:
            filled = WIDTH * self.done // self.total
            bar = "#" * filled + "." * (WIDTH - filled)
            return f"{head}[{bar}] kernels {self.done}/{self.total} {elapsed:.1f} s"
        return f"{head}{self.stage_name} {elapsed:.1f} s"

    def _draw(self) -> None:
        if not self.enabled or time.perf_counter() - self.start < self.delay:
            return
        with self._lock:
            text = self.line()
            pad = " " * max(0, self._width - len(text))
            try:
                self.stream.write("\r" + text + pad)
                self.stream.flush()
            except (OSError, ValueError):
                self.enabled = False  # a closed or broken stream: stop drawing, never fail the compile
                return
            self._width = len(text)
            self.shown = True

    def close(self) -> None:
        if self.shown:
            try:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self.shown = False


_SILENT = Progress(False)
_current: contextvars.ContextVar[Progress] = contextvars.ContextVar("glowpy_progress", default=_SILENT)


def current() -> Progress:
    """The progress line of the compile running in this context (a silent one outside a compile)."""
    return _current.get()


@contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    token = _current.set(progress)
    try:
        yield progress
    finally:
        _current.reset(token)
        progress.close()
