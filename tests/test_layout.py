"""The layout holds: the serving package never imports a tool (worker/tools/)."""

from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parent.parent / "worker"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_serving_modules_never_import_a_tool() -> None:
    serving = [p for p in WORKER.glob("*.py") if p.name not in ("cli.py", "__main__.py")]
    assert len(serving) >= 10  # the glob found the package
    offenders = {p.name: sorted(m for m in _imports(p) if m.startswith("worker.tools")) for p in serving}
    assert not {name: mods for name, mods in offenders.items() if mods}
