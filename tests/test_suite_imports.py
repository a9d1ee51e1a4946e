"""The suite imports its shared helpers from ``tests/support``, never ``from conftest``: with more than one
``conftest.py`` in the tree, the module named ``conftest`` is whichever pytest loaded last, so such an import passes
in a targeted run and fails at collection in the full one (it did: CI, 2026-12-07)."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imports_conftest(path: pathlib.Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree)
            if (isinstance(node, ast.ImportFrom) and node.module == "conftest")
            or (isinstance(node, ast.Import) and any(a.name == "conftest" for a in node.names))]


def test_nothing_imports_a_conftest_by_name():
    files = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    assert len(files) > 50 and (ROOT / "tests" / "sglang_server" / "conftest.py") in files
    found = {str(f.relative_to(ROOT)): lines for f in files if (lines := _imports_conftest(f))}
    assert found == {}, f"import these from tests/support instead: {found}"
