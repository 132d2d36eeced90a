"""Writes bytecode for every package of the Python that runs it, then checks that the imports a
cold start pays for have theirs.

The image's packages come from ``vllm/vllm-openai``, installed by uv, which writes no bytecode
unless asked, and RunPod starts every worker in a fresh container: without ``.pyc`` files each cold
start compiles torch, vLLM and transformers again before the engine can boot (the measured cost is
in docs/gpu-results/HISTORY.md, "The levers, and what each did"). ``compileall`` skips files already compiled.

    python3 scripts/compile_bytecode.py [DIR ...]    # every site directory, and each DIR

Exits 1 naming the modules still without bytecode. Stdlib only: it runs before anything else.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import site
import sys
from collections.abc import Iterable
from pathlib import Path

# The packages a cold start imports first, and the largest: each must end with its bytecode.
COLD_START_PACKAGES = ("torch", "vllm", "transformers", "numpy", "sympy", "triton", "worker")


def site_directories() -> list[str]:
    """This Python's site directories (``dist-packages`` on Debian's Python) that exist."""
    return [path for path in site.getsitepackages() if os.path.isdir(path)]


def compile_directories(directories: Iterable[str]) -> None:
    """Compiles every ``.py`` under ``directories``, on every CPU. A file this Python cannot parse
    (a package's test data in another version's syntax) is skipped, as pip's own compile step skips
    it: it is never imported."""
    for directory in directories:
        compileall.compile_dir(directory, quiet=2, workers=0)


def missing_bytecode(packages: Iterable[str], first: Iterable[str] = ()) -> list[str]:
    """The installed ``packages`` whose ``__init__`` has no bytecode for this Python (one not
    installed is not missing), each found as a process started in ``first`` finds it: the image's
    ``python3 handler.py`` in /app imports /app/worker, not the copy pip put in site-packages."""
    missing = []
    saved = sys.path[:]
    sys.path[:0] = [os.path.abspath(directory) for directory in first]
    try:
        for name in packages:
            spec = importlib.util.find_spec(name)  # finds the package without importing it
            if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
                continue
            if not Path(importlib.util.cache_from_source(spec.origin)).exists():
                missing.append(name)
    finally:
        sys.path[:] = saved
    return missing


def main(argv: list[str]) -> int:
    compile_directories([*site_directories(), *argv])
    missing = missing_bytecode(COLD_START_PACKAGES, first=argv)
    if missing:
        print(f"compile_bytecode: no bytecode written for {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
