"""The layout holds: the serving package never imports a tool (worker/tools/); booting, exact stats
and vLLM's internals each live in a package of their own, and speculation's logic imports no vLLM
(its hooks into vLLM are the seam's, worker/vllm_internals/). A module's size is no test: past ~300
lines it is a prompt to look at its concerns, not a number to squeeze under."""

from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parent.parent / "worker"
# Not serving code: the command line, and the tiny models' offline builder.
NOT_SERVING = {"cli.py", "__main__.py"}
NOT_SERVING_PACKAGES = {"tools", "tiny_models"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _serving() -> list[Path]:
    paths = [p.relative_to(WORKER) for p in WORKER.rglob("*.py")]
    return [WORKER / p for p in paths if not NOT_SERVING_PACKAGES & set(p.parts) and p.as_posix() not in NOT_SERVING]


def test_serving_modules_never_import_a_tool() -> None:
    serving = _serving()
    assert len(serving) >= 20  # the glob found the package
    offenders = {p.name: sorted(m for m in _imports(p) if m.startswith("worker.tools")) for p in serving}
    assert not {name: mods for name, mods in offenders.items() if mods}


def test_booting_exact_stats_and_vllms_internals_are_packages() -> None:
    assert {p.name for p in (WORKER / "boot").glob("*.py")} >= {"plan.py", "launch.py", "models.py", "prefetch.py"}
    assert {p.name for p in (WORKER / "speculation" / "stats").glob("*.py")} >= {
        "acceptance.py",
        "answers.py",
        "tracking.py",
    }
    assert {p.name for p in (WORKER / "vllm_internals").glob("*.py")} >= {
        "scheduler.py",
        "scheduler_control.py",
        "frontend.py",
        "plugin.py",
        "contract.py",
        "check.py",
        "public.py",
    }
    assert not (WORKER / "vllm_plugin.py").exists()


def test_speculation_imports_no_vllm() -> None:
    """The decision, the controller, its cost model and measurement, and the stats' arithmetic and
    books: vLLM is reached only through the seam (``worker/vllm_internals/``)."""
    modules = list((WORKER / "speculation").rglob("*.py"))
    assert len(modules) >= 8
    offenders = {p.name: sorted(m for m in _imports(p) if m.split(".")[0] == "vllm") for p in modules}
    assert not {name: mods for name, mods in offenders.items() if mods}
