"""vLLM's inspection of a model's class, run by the worker ahead of vLLM (``worker.boot.modelinfo``
says why): vLLM's model registry, through its private ``_LazyRegisteredModel`` and ``_ModelInfo``,
so that the file written is the one vLLM reads. Run as a subprocess:
``python -m worker.vllm_internals.modelinfo DIRECTORY ARCHITECTURE...``."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from worker.boot.modelinfo import NAMES_FILE, recorded

__all__ = ["fill"]


def fill(directory: Path, names: list[str]) -> int:
    """In the subprocess: vLLM's own inspection of each architecture, saved where vLLM reads it
    (``directory``: the plan's ``model_info_dir``, vLLM's own under the environment the subprocess
    inherits); the number of answers written."""
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
    if found:
        names_found = {**recorded(directory), **found}
        temporary = directory / f".{NAMES_FILE}.{os.getpid()}"
        temporary.write_text(json.dumps(names_found, indent=1, sort_keys=True))
        temporary.replace(directory / NAMES_FILE)  # atomic: a boot reading it sees all or nothing
    return written


if __name__ == "__main__":
    fill(Path(sys.argv[1]), sys.argv[2:])
