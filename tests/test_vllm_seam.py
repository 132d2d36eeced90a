"""The seam holds: outside ``worker/vllm_internals/`` the worker imports from vLLM only the public
surface in ``worker/vllm_internals/public.py``, reads no private attribute of another module's
objects, wraps no object to hand on its attributes (``__getattr__``), reads on vLLM's engine
(``AsyncLLM``) only what the contract declares for that module, and nowhere does a
``getattr(obj, name, default)`` fall back in silence on a vLLM object. Each offence is named by file
and line. The tools (``worker/tools/``: the bench) are held to the same rules: their hooks into
vLLM are the seam's probes (``worker/vllm_internals/probes.py``), under the contract.

The checks read the source, not the types: vLLM's engine is known where it is annotated
``AsyncLLM`` or held as ``llm`` / ``_llm`` (the worker's one name for it, which these tests hold)."""

from __future__ import annotations

import ast
from pathlib import Path

from worker.vllm_internals.contract import CONTRACT
from worker.vllm_internals.public import PUBLIC_SURFACE

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "worker"
SEAM = WORKER / "vllm_internals"
# torch's private AMX hooks exist only in some torch builds: the plugin asks for them where present.
_GETATTR_ON_TORCH = {"torch", "cpu"}
# Outside the seam, a getattr with a default reads only objects that are not vLLM's: (file, object) -> why.
_GETATTR_NOT_ON_VLLM = {
    ("worker/boot/draft_check.py", "tokenizer"): "transformers' tokenizer of a checkpoint, loaded without vLLM",
    ("worker/boot/draft_check.py", "target_config"): "transformers' config of a checkpoint, loaded without vLLM",
    ("worker/boot/draft_check.py", "draft_config"): "transformers' config of a checkpoint, loaded without vLLM",
}
# vLLM imports outside the seam still to move (file, statement) -> where their answer is in the seam.
_IMPORTS_TO_MOVE: dict[tuple[str, str], str] = {}
# Private names of the standard library the worker calls outside the seam: module -> names.
_STDLIB_PRIVATE = {"os": {"_exit"}}
# What holds vLLM's engine outside the seam: these names, and whatever is annotated with its class.
_ENGINE_NAMES = {"llm", "_llm"}
_ENGINE_CLASS = "AsyncLLM"


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
    return [p for p in WORKER.rglob("*.py") if not p.is_relative_to(SEAM)]


def test_outside_the_seam_vllm_is_imported_only_from_the_allowlist() -> None:
    paths = _outside_the_seam()
    assert len(paths) >= 30 and WORKER / "engine.py" in paths  # the glob found the package
    assert WORKER / "tools" / "bench" / "draft_step.py" in paths  # and the tools
    offences = [
        offence
        for offence in vllm_import_offences(paths, surface=PUBLIC_SURFACE)
        if (offence.split(":")[0], offence.split(": ", 1)[1]) not in _IMPORTS_TO_MOVE
    ]
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


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _own_names(tree: ast.AST) -> set[str]:
    """Names a class of this file defines or assigns as ``self.<name>``: its own, which the file may read."""
    assigned = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    defined = {
        member.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for member in node.body
        if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    return assigned | defined


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reads(paths: list[Path]) -> list[str]:
    """``file:line: what`` for each private attribute read on another module's object (not ``self``,
    ``cls``, nor a name a class of the same file assigns on ``self``)."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        own = _own_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _is_private(node.attr) or node.attr in own:
                continue
            base = ast.unparse(node.value)
            if base in ("self", "cls") or node.attr in _STDLIB_PRIVATE.get(base, set()):
                continue
            found.append(f"{_where(path)}:{node.lineno}: {ast.unparse(node)}")
    return found


def fallback_getattrs(paths: list[Path]) -> list[str]:
    """``file:line: call`` for each ``getattr(obj, name, default)`` not on the list of non-vLLM objects."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                if len(node.args) == 3 and (_where(path), ast.unparse(node.args[0])) not in _GETATTR_NOT_ON_VLLM:
                    found.append(f"{_where(path)}:{node.lineno}: {ast.unparse(node)}")
    return found


def attribute_forwarders(paths: list[Path]) -> list[str]:
    """``file:line: Class`` for each class that defines ``__getattr__``: it hands on whatever is read."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                if any(isinstance(f, ast.FunctionDef) and f.name == "__getattr__" for f in node.body):
                    found.append(f"{_where(path)}:{node.lineno}: {node.name}.__getattr__")
    return found


def _engine_holders(tree: ast.AST) -> set[str]:
    """The names annotated with vLLM's engine class in ``tree``, beside the worker's own names for it."""
    names = set(_ENGINE_NAMES)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            if ast.unparse(node.annotation).strip("'\"") == _ENGINE_CLASS:
                names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if ast.unparse(node.annotation).strip("'\"") == _ENGINE_CLASS:
                names.add(node.target.id)
    return names


def engine_reads(path: Path) -> list[tuple[int, str]]:
    """(line, attribute) for each attribute read on vLLM's engine in ``path``: on a name that holds it
    (``llm``, ``self._llm``, ``engine.llm``), and on its class (``AsyncLLM.from_vllm_config``)."""
    tree = ast.parse(path.read_text(), str(path))
    holders = _engine_holders(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        held = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else None
        if held in holders or (isinstance(base, ast.Name) and base.id == _ENGINE_CLASS):
            found.append((node.lineno, node.attr))
    return found


def _declared_engine_attributes(module: str) -> set[str]:
    """What the contract declares ``module`` uses of ``AsyncLLM``: its attributes and methods."""
    declared: set[str] = set()
    for entry in CONTRACT:
        if entry.needed_by == module and entry.module == "vllm.v1.engine.async_llm":
            head, _, member = entry.name.partition(".")
            if head == _ENGINE_CLASS:
                declared |= {member} if member else set(entry.uses)
    return declared


def undeclared_engine_reads(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        declared = _declared_engine_attributes(_where(path))
        found += [f"{_where(path)}:{line}: {name}" for line, name in engine_reads(path) if name not in declared]
    return found


def test_outside_the_seam_no_private_attribute_of_another_module_is_read() -> None:
    offences = private_reads(_outside_the_seam())
    assert not offences, "private attributes read outside worker/vllm_internals/:\n" + "\n".join(offences)


def test_outside_the_seam_no_getattr_falls_back_on_a_vllm_object() -> None:
    offences = fallback_getattrs(_outside_the_seam())
    assert not offences, "getattr with a default outside the seam (a renamed vLLM name would pass):\n" + "\n".join(
        offences
    )


def test_outside_the_seam_no_object_hands_on_its_attributes() -> None:
    offences = attribute_forwarders(_outside_the_seam())
    assert not offences, "__getattr__ outside the seam (vLLM's attributes read unchecked):\n" + "\n".join(offences)


def test_outside_the_seam_the_engine_is_read_only_as_the_contract_declares() -> None:
    paths = _outside_the_seam()
    reads = {(path.name, name) for path in paths for _, name in engine_reads(path)}
    # The convention is in use: the worker's modules read the engine under these names.
    assert {("engine.py", "generate"), ("openai.py", "get_supported_tasks"), ("launch.py", "add_lora")} <= reads
    offences = undeclared_engine_reads(paths)
    assert not offences, (
        "attributes of vLLM's AsyncLLM read outside the seam that the contract does not declare for the module"
        " (worker/vllm_internals/contract.py; vLLM's internals go through the seam):\n" + "\n".join(offences)
    )


def test_the_attribute_checks_name_file_and_line(tmp_path: Path) -> None:
    module = tmp_path / "elsewhere.py"
    module.write_text(
        "from vllm.v1.engine.async_llm import AsyncLLM\n"
        "\n"
        "\n"
        "class Wrap:\n"
        "    def __init__(self, engine: AsyncLLM) -> None:\n"
        "        self._own = engine.output_processor._requests\n"
        "\n"
        "    def __getattr__(self, name: str) -> object:\n"
        "        return getattr(self._own, name, None)\n"
        "\n"
        "\n"
        "def tokens(llm: AsyncLLM) -> object:\n"
        "    return llm.renderer, llm.generate\n"
    )
    where = str(module)
    assert private_reads([module]) == [f"{where}:6: engine.output_processor._requests"]
    assert fallback_getattrs([module]) == [f"{where}:9: getattr(self._own, name, None)"]
    assert attribute_forwarders([module]) == [f"{where}:4: Wrap.__getattr__"]
    assert sorted(undeclared_engine_reads([module])) == [
        f"{where}:13: generate",
        f"{where}:13: renderer",
        f"{where}:6: output_processor",
    ]
