"""Every optimizer test verifies the graph after every pass (glowpy.optimize reads GLOWPY_VERIFY)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _verify_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWPY_VERIFY", "1")
