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


# The package's layers, bottom first: a module may import its own layer and the ones below it, never
# one above, not even inside a function. Imports under `if TYPE_CHECKING:` are annotations only.
LAYERS = (
    ("errors", "limits", "models"),
    ("ir",),
    ("importer",),
    ("optimizer",),
    ("backends",),
    ("compiled",),
    ("pipeline",),
    ("onnxifi", "backend", "bench", "quantize", "profile", "bundle"),
    ("cli",),
)
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}


def _runtime_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "glowpy":
                found.extend((node.lineno, f"glowpy.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_dependencies_point_down() -> None:
    offenders = []
    for path in sorted((ROOT / "glowpy").rglob("*.py")):
        parts = path.relative_to(ROOT / "glowpy").with_suffix("").parts
        if parts == ("__init__",):
            continue  # the package's face: lazy names over every layer
        own = LEVEL.get(parts[0])
        if own is None:
            offenders.append(f"{path.relative_to(ROOT)}: not in a layer of LAYERS")
            continue
        for line, module in _runtime_imports(ast.parse(path.read_text())):
            names = module.split(".")
            if names[0] != "glowpy" or len(names) < 2:
                continue
            target = LEVEL.get(names[1])
            if target is not None and target > own:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module} (a higher layer)")
    assert offenders == []
