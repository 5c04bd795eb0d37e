"""The layer rules: engine/ never imports Qt or app/ (it must run headless); app/ never does
numerics with Numba. Checked on the source and on a real import."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
PKG = ROOT / "src" / "merlin"


def imported_modules(folder: Path):
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield path, node.module


def test_engine_never_imports_qt_or_app():
    bad = [
        (str(p), m)
        for p, m in imported_modules(PKG / "engine")
        if m.split(".")[0] in ("PySide6", "shiboken6", "PyQt5", "PyQt6")
        or m.startswith("merlin.app")
    ]
    assert not bad


def test_app_does_no_numerics():
    bad = [
        (str(p), m)
        for p, m in imported_modules(PKG / "app")
        if m.split(".")[0] in ("numba", "llvmlite")
    ]
    assert not bad


def test_engine_imports_without_qt_loaded():
    code = (
        "import sys, merlin.engine.cli, merlin.engine.generate, merlin.engine.model, "
        "merlin.engine.demo; "
        "print(any(m.startswith(('PySide6', 'merlin.app')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
