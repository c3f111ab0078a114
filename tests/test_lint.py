"""Static rules the library keeps: ruff clean, and no `assert` in glowpy/ (it vanishes under
python -O and would abort a host process instead of returning a status)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_assert_statements_in_library() -> None:
    offenders = []
    for path in sorted((ROOT / "glowpy").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        offenders += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    assert offenders == []


def test_ruff_clean() -> None:
    """ruff with the project's rules (pyproject.toml), S101 among them."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "glowpy", "tests", "tools"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
