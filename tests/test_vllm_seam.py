"""The seam holds: outside ``worker/vllm_internals/`` the worker imports from vLLM only the public
surface in ``worker/vllm_internals/public.py`` (each offence named by file and line), and inside
it no ``getattr(obj, name, default)`` falls back in silence (tools, ``worker/tools/``, are not
serving code and may reach in)."""

from __future__ import annotations

import ast
from pathlib import Path

from worker.vllm_internals.public import PUBLIC_SURFACE

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "worker"
SEAM = WORKER / "vllm_internals"
# torch's private AMX hooks exist only in some torch builds: the plugin asks for them where present.
_GETATTR_ON_TORCH = {"torch", "cpu"}


def _is_vllm(module: str) -> bool:
    return module == "vllm" or module.startswith("vllm.")


def vllm_import_offences(paths: list[Path], *, surface: dict[str, frozenset[str]]) -> list[str]:
    """``file:line: what`` for each vLLM import in ``paths`` that is not on ``surface``."""
    found = []
    for path in paths:
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and _is_vllm(node.module) and node.level == 0:
                allowed = surface.get(node.module, frozenset())
                for alias in node.names:
                    if alias.name not in allowed:
                        found.append(f"{where}:{node.lineno}: from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                found += [f"{where}:{node.lineno}: import {a.name}" for a in node.names if _is_vllm(a.name)]
    return found


def _outside_the_seam() -> list[Path]:
    return [
        p for p in WORKER.rglob("*.py") if not p.is_relative_to(SEAM) and "tools" not in p.relative_to(WORKER).parts
    ]


def test_outside_the_seam_vllm_is_imported_only_from_the_allowlist() -> None:
    paths = _outside_the_seam()
    assert len(paths) >= 30 and WORKER / "engine.py" in paths  # the glob found the package
    offences = vllm_import_offences(paths, surface=PUBLIC_SURFACE)
    assert not offences, "vLLM imports outside worker/vllm_internals/ not on its allowlist (public.py):\n" + "\n".join(
        offences
    )


def test_the_allowlist_check_names_file_and_line(tmp_path: Path) -> None:
    module = tmp_path / "elsewhere.py"
    module.write_text("from vllm import SamplingParams\n\nfrom vllm.v1.request import Request\nimport vllm.envs\n")
    assert vllm_import_offences([module], surface=PUBLIC_SURFACE) == [
        f"{module}:3: from vllm.v1.request import Request",
        f"{module}:4: import vllm.envs",
    ]


def test_no_silent_getattr_fallback_in_the_seam() -> None:
    found = []
    for path in sorted(SEAM.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                if len(node.args) == 3 and ast.unparse(node.args[0]).split(".")[0] not in _GETATTR_ON_TORCH:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "getattr with a default falls back in silence where vLLM renames a name:\n" + "\n".join(found)
