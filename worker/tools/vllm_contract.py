"""``python -m worker vllm-contract``: the seam's contract against a vLLM that is not installed (and,
with ``--stamp``, against the installed one, imported, for the image's stamp).

    python -m worker vllm-contract --wheel vllm==0.33.0   # downloads the wheel (no dependencies), cached
    python -m worker vllm-contract --source PATH          # a .whl file, or a folder holding vllm/
    python -m worker vllm-contract --installed            # the installed vLLM's sources, parsed the same way
    python -m worker vllm-contract --stamp                # the installed vLLM, imported, as the boot checks it

Each entry of :mod:`worker.vllm_internals.contract` for the sources' release (those of every
release, and the release's own ``0.34 only:`` ones; a release outside the window the seam spans is
checked against the newest release's entries, the question an upgrade asks) is looked up in vLLM's
sources with ``ast``,
without importing them (a wheel built for another torch, CUDA or Python parses all the same):
module-level definitions and the imports that re-export them (``from .x import Y``, vLLM's lazy
``MODULE_ATTRS``), classes and their bases within vLLM, method signatures, class attributes,
annotated fields and ``self.<name>`` assignments. A class's constructor is its ``__init__``, or for
a dataclass, msgspec or pydantic model, its annotated fields. Exit status 1 when an entry breaks;
docs/vllm-contract.md has the last report and what each break would take.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from worker.errors import UnsupportedVllm
from worker.vllm_internals.check import assigned_self_attributes
from worker.vllm_internals.contract import Internal, entries_for
from worker.vllm_internals.release import SUPPORTED, Release, release_of

__all__ = ["Sources", "check_sources", "fetch_wheel", "main", "release_to_check"]

WHEEL_CACHE = Path.home() / ".cache" / "runpod-vllm-worker" / "wheels"
# vLLM's Linux x86-64 wheels are abi3 (one per release); the platform tag only picks that file.
_PIP_TARGET = ["--platform", "manylinux_2_28_x86_64", "--python-version", "3.12", "--implementation", "cp"]
_MAX_HOPS = 12  # re-exports followed before a name counts as not found


class Sources:
    """vLLM's Python sources, read from a wheel (a zip) or a folder that holds the ``vllm`` package."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip = zipfile.ZipFile(path) if path.suffix == ".whl" else None

    def read(self, module: str) -> str | None:
        stem = module.replace(".", "/")
        for relative in (f"{stem}.py", f"{stem}/__init__.py"):
            if self._zip is not None:
                try:
                    return self._zip.read(relative).decode()
                except KeyError:
                    continue
            file = self.path / relative
            if file.is_file():
                return file.read_text()
        return None

    def is_package(self, module: str) -> bool:
        stem = module.replace(".", "/") + "/__init__.py"
        if self._zip is not None:
            return stem in self._zip.namelist()
        return (self.path / stem).is_file()

    def version(self) -> str:
        found = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)""", self.read("vllm._version") or "")
        return found.group(1) if found else "(unknown version)"


@dataclasses.dataclass(frozen=True)
class _Def:
    """A definition found: its node and the module it is in."""

    module: str
    node: ast.AST


class _Resolver:
    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    @functools.cache  # noqa: B019  (one resolver per check; the trees are what is cached)
    def tree(self, module: str) -> ast.Module | None:
        text = self.sources.read(module)
        return None if text is None else ast.parse(text)

    def find(self, module: str, name: str, hops: int = 0) -> _Def | None:
        """The definition of ``name`` at module level in ``module``, following re-exports."""
        tree = self.tree(module)
        if tree is None or hops > _MAX_HOPS:
            return None
        for node in _module_level(tree.body):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return _Def(module, node)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _targets(node):
                if name == "MODULE_ATTRS":
                    return _Def(module, node)
                value = node.value
                if isinstance(value, ast.Name) and value.id != name:  # an alias: Foo = Bar
                    return self.find(module, value.id, hops + 1) or _Def(module, node)
                return _Def(module, node)
        for node in _module_level(tree.body):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, node, is_package=self.sources.is_package(module))
                        found = self.find(source, alias.name, hops + 1)
                        if found is None and self.sources.read(f"{source}.{alias.name}") is not None:
                            return _Def(f"{source}.{alias.name}", ast.Module(body=[], type_ignores=[]))
                        return found
        lazy = self._lazy_attribute(tree, name)  # vLLM's top-level MODULE_ATTRS = {"Name": ".module:Name"}
        if lazy is not None:
            target, attribute = lazy
            source = _absolute(module, ast.ImportFrom(module=target.lstrip("."), names=[], level=_dots(target)), True)
            return self.find(source, attribute, hops + 1)
        return None

    def _lazy_attribute(self, tree: ast.Module, name: str) -> tuple[str, str] | None:
        for node in _module_level(tree.body):
            if isinstance(node, ast.Assign) and "MODULE_ATTRS" in _targets(node) and isinstance(node.value, ast.Dict):
                for key, value in zip(node.value.keys, node.value.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == name and isinstance(value, ast.Constant):
                        target, _, attribute = str(value.value).partition(":")
                        return target, attribute or name
        return None

    def bases(self, found: _Def) -> Iterator[_Def]:
        """The class and its bases that vLLM defines, depth first (a base from elsewhere is skipped)."""
        seen: set[tuple[str, str]] = set()
        stack = [found]
        while stack:
            current = stack.pop(0)
            node = current.node
            if not isinstance(node, ast.ClassDef) or (current.module, node.name) in seen:
                continue
            seen.add((current.module, node.name))
            yield current
            for base in node.bases:
                base_name = base.value if isinstance(base, ast.Subscript) else base  # Generic[T], Base[T]
                if isinstance(base_name, ast.Name):
                    resolved = self.find(current.module, base_name.id)
                    if resolved is not None:
                        stack.append(resolved)

    def member(self, found: _Def, name: str) -> _Def | None:
        """``name`` defined in the class body of ``found`` or a base's (methods, attributes, members)."""
        for klass in self.bases(found):
            assert isinstance(klass.node, ast.ClassDef)
            for node in klass.node.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                    return _Def(klass.module, node)
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _targets(node):
                    return _Def(klass.module, node)
        return None

    def has_attribute(self, found: _Def, name: str) -> bool:
        if self.member(found, name) is not None:
            return True
        for klass in self.bases(found):
            if name in assigned_self_attributes(klass.node) or name in _slots(klass.node):
                return True
        return False

    def parameters(self, found: _Def) -> set[str] | None:
        """The parameter names of a function, or of a class's constructor (None: none found)."""
        node = found.node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        if isinstance(node, ast.ClassDef):
            init = self.member(found, "__init__")
            if init is not None and isinstance(init.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return self.parameters(init)
            fields: set[str] = set()
            for klass in self.bases(found):  # a dataclass, msgspec or pydantic model: its fields
                assert isinstance(klass.node, ast.ClassDef)
                fields |= {t for n in klass.node.body if isinstance(n, ast.AnnAssign) for t in _targets(n)}
            return fields
        return None


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements at module level, including those under ``if`` / ``try`` (TYPE_CHECKING, fallbacks)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body)
            for handler in node.handlers:
                yield from _module_level(handler.body)
            yield from _module_level(node.orelse)


def _targets(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names: set[str] = set()
    for target in targets:
        elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        names |= {e.id for e in elements if isinstance(e, ast.Name)}
    return names


def _slots(node: ast.AST) -> set[str]:
    if not isinstance(node, ast.ClassDef):
        return set()
    for item in node.body:
        if isinstance(item, ast.Assign) and "__slots__" in _targets(item):
            if isinstance(item.value, (ast.Tuple, ast.List)):
                return {e.value for e in item.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _dots(target: str) -> int:
    return len(target) - len(target.lstrip("."))


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, node.module] if node.module else base)


def check_entry(resolver: _Resolver, entry: Internal) -> str | None:
    """Why ``entry`` does not hold in these sources, as a sentence (None: it holds)."""
    if resolver.tree(entry.module) is None:
        return entry.failure(f"module {entry.module} is not in this vLLM")
    head, *rest = entry.name.split(".")
    found = resolver.find(entry.module, head)
    if found is None:
        return entry.failure(f"{entry.module} has no {head!r}")
    for depth, part in enumerate(rest):
        member = resolver.member(found, part)
        if member is None:
            owner = ".".join([head, *rest[:depth]])
            return entry.failure(f"{entry.module}.{owner} has no {part!r}")
        found = member
    if entry.kind == "class":
        if not isinstance(found.node, ast.ClassDef):
            return entry.failure("not a class")
        missing = [name for name in entry.uses if not resolver.has_attribute(found, name)]
        if missing:
            return entry.failure(f"no attribute {', '.join(map(repr, missing))} (the seam reads or writes it)")
    elif entry.kind == "callable":
        parameters = resolver.parameters(found)
        if parameters is None:
            return entry.failure("not a function or class")
        missing = [name for name in entry.uses if name not in parameters]
        if missing:
            return entry.failure(f"no parameter {', '.join(map(repr, missing))} (the seam passes it)")
    return None


def release_to_check(version: str) -> tuple[Release, bool]:
    """The release whose entries a vLLM of ``version`` is checked against, and whether the version
    is in the window (outside it: the newest release's entries, what an upgrade from it would keep)."""
    try:
        return release_of(version), True
    except UnsupportedVllm:
        return SUPPORTED[-1], False


def check_sources(sources: Sources, entries: tuple[Internal, ...] | None = None) -> list[str]:
    """One sentence per entry that does not hold in ``sources`` (none: the contract holds); by
    default the entries of the sources' release (:func:`release_to_check`)."""
    if entries is None:
        entries = entries_for(release_to_check(sources.version())[0])
    resolver = _Resolver(sources)
    return [why for entry in entries if (why := check_entry(resolver, entry)) is not None]


def fetch_wheel(requirement: str, *, cache: Path = WHEEL_CACHE) -> Path:
    """vLLM's wheel for ``requirement`` (``vllm==X``): the image's, where ``scripts/setup.sh`` put it
    (the virtual environment's ``wheels/``), else from the cache or downloaded there by pip (no
    dependencies, Linux x86-64)."""
    version = requirement.partition("==")[2]
    if not version:
        raise SystemExit(f"--wheel {requirement!r}: name an exact version, e.g. vllm==0.33.0")
    cached = sorted((Path(sys.prefix) / "wheels").glob(f"vllm-{version}-*.whl")) or sorted(
        cache.glob(f"vllm-{version}-*.whl")
    )
    if cached:
        return cached[0]
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *_PIP_TARGET]
    subprocess.run([*command, "--dest", str(cache), requirement], check=True)
    cached = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not cached:
        raise SystemExit(f"pip downloaded no wheel of {requirement} into {cache}")
    return cached[0]


def _installed_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise SystemExit("vLLM is not installed here: use --wheel or --source")
    return Path(spec.origin).parent.parent


def _stamp() -> int:
    from worker.vllm_internals import check

    found = check.write_stamp()
    total = len(check.installed_entries())
    print(f"vLLM {check.installed_version()} (installed): {total - len(found)} of {total} contract entries hold")
    for problem in found:
        print(f"  BROKEN {problem}")
    if not found:
        print(f"stamp written: {check.STAMP}" if check.STAMP.exists() else "no stamp: none can vouch for this vLLM")
    return 1 if found else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker vllm-contract", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--wheel", metavar="vllm==X", help=f"download vLLM's wheel (cached in {WHEEL_CACHE})")
    where.add_argument("--source", type=Path, help="a .whl file, or a folder holding the vllm package")
    where.add_argument("--installed", action="store_true", help="the installed vLLM's sources")
    where.add_argument(
        "--stamp",
        action="store_true",
        help="check the installed vLLM as the boot does (importing it), and where every entry holds, write the "
        "stamp that spares the image's boots the check (worker.vllm_internals.check)",
    )
    parser.add_argument("--cache", type=Path, default=WHEEL_CACHE, help="where wheels are kept")
    args = parser.parse_args(argv)
    if args.stamp:
        return _stamp()
    path = fetch_wheel(args.wheel, cache=args.cache) if args.wheel else args.source or _installed_root()
    sources = Sources(path)
    version = sources.version()
    release, is_supported = release_to_check(version)
    entries = entries_for(release)
    problems = check_sources(sources, entries)
    total = len(entries)
    window = "" if is_supported else f", outside the window {' and '.join(SUPPORTED)}"
    print(
        f"vLLM {version} ({path.name}{window}): {total - len(problems)} of {total} contract entries for {release} hold"
    )
    for problem in problems:
        print(f"  BROKEN {problem}")
    return 1 if problems else 0
