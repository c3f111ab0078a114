"""CPU backend tests: a private object-code cache for this package's tests (the user's cache is never
touched, and cache behaviour is under the tests' control)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from glowpy.backends.cpu import CpuBackend


@pytest.fixture(scope="package", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("glowpy-cache")
    old = os.environ.get("GLOWPY_CACHE_DIR")
    os.environ["GLOWPY_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("GLOWPY_CACHE_DIR", None)
    else:
        os.environ["GLOWPY_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def cpu() -> CpuBackend:
    return CpuBackend()
