"""vLLM's inspection of a model's class, run by the worker ahead of vLLM (``worker.boot.modelinfo``
says why, and runs this in its subprocess): vLLM's model registry, through its private
``_LazyRegisteredModel`` and ``_ModelInfo``, so that the file written is the one vLLM reads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["inspect_classes"]


def inspect_classes(names: list[str]) -> tuple[int, dict[str, str]]:
    """vLLM's own inspection of each architecture, saved where vLLM reads it (its cache directory,
    under the environment the process inherits): how many answers were written, and for each
    architecture vLLM's registry knows, the name of vLLM's file for it."""
    from vllm.model_executor.models.registry import ModelRegistry, _LazyRegisteredModel, _ModelInfo

    written = 0
    found: dict[str, str] = {}
    for name in names:
        model = ModelRegistry.models.get(name)
        if not isinstance(model, _LazyRegisteredModel):
            continue  # unknown to vLLM, or already imported (no inspection subprocess either)
        spec = importlib.util.find_spec(model.module_name)
        if spec is None or not spec.origin:
            continue
        module_hash = model._get_modelinfo_module_hash(Path(spec.origin))
        if model._load_modelinfo_from_cache(module_hash) is None:
            model._save_modelinfo_to_cache(_ModelInfo.from_model_cls(model.load_model_cls()), module_hash)
            written += 1
        found[name] = model._get_cache_filename()
    return written, found
