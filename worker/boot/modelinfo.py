"""vLLM's inspection of the model's class on a cold cache root, run while the main process imports vLLM.

Before it builds the engine config vLLM inspects the model's class (what it supports: pooling,
multimodal input, ...) and keeps the answer under ``VLLM_CACHE_ROOT/modelinfos``. On a miss, which
is every boot on an empty cache root (an endpoint's first worker, and every cold start of an
endpoint without a network volume), it runs the inspection in a subprocess that imports vLLM
again, after the main process has imported it (what that costs a boot: docs/gpu-results/HISTORY.md, "The
model-class inspection on an empty cache root"). ``start(plan)`` runs the same inspection in a
subprocess started before the main process imports vLLM, so that the two imports overlap; the boot
waits for it (``wait``) just before vLLM builds the config, which then reads the answer from its
cache.

Written here because vLLM has no switch for it. The subprocess (``python -m worker.boot.modelinfo
DIRECTORY ARCHITECTURE...``) calls vLLM's own registry (:mod:`worker.vllm_internals.modelinfo`, in
the seam: its private names are in the contract, which the boot checks), so the file it writes is
the one vLLM reads and checks against the model module's hash; what else can go wrong there (an
architecture vLLM does not know, a timeout) leaves vLLM to inspect as it does today.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.boot.plan import BootPlan

__all__ = ["NAMES_FILE", "architectures", "fill", "missing", "recorded", "start", "wait"]

log = logging.getLogger(__name__)

# The longest the boot waits for the inspection (it takes about as long as vLLM's import): past
# this vLLM inspects on its own, as without this module.
WAIT_S = 120.0

_pending: subprocess.Popen[bytes] | None = None


def architectures(directories: list[Path]) -> list[str]:
    """The architectures named by the local ``config.json`` in ``directories`` (the target's and a
    separate draft's; none for a model vLLM will download: its config is not here yet)."""
    found: list[str] = []
    for directory in directories:
        try:
            config = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError):  # not a local model, or no readable config: vLLM will say why
            continue
        names = config.get("architectures") if isinstance(config, dict) else None
        for name in names if isinstance(names, list) else []:
            if isinstance(name, str) and name not in found:
                found.append(name)
    return found


# Beside vLLM's answers: architecture -> the name of vLLM's file for it, as the subprocess found
# it. vLLM names a file after the model's module and class
# (``vllm-model_executor-models-llama-LlamaForCausalLM.json``), which only vLLM's registry knows;
# the class is the architecture's own name for most, not all (``Ministral3ForCausalLM`` is
# answered by ``...-mistral-MistralForCausalLM.json``).
NAMES_FILE = "worker-architectures.json"


def missing(names: list[str], directory: Path) -> list[str]:
    """The architectures with no answer in ``directory``: no file named after the architecture and
    none the subprocess recorded for it. One found stale by its hash (another vLLM) is vLLM's to
    redo, as without this module."""
    try:
        files = set(os.listdir(directory))
    except OSError:
        return list(names)
    names_found = recorded(directory)
    return [
        name
        for name in names
        if names_found.get(name) not in files and not any(f.endswith(f"-{name}.json") for f in files)
    ]


def recorded(directory: Path) -> dict[str, str]:
    """What the subprocess recorded in ``directory`` (nothing where it is missing or unreadable)."""
    try:
        recorded = json.loads((directory / NAMES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def start(plan: BootPlan) -> subprocess.Popen[bytes] | None:
    """Start the inspection of the local model's architectures that vLLM's cache lacks (None: nothing to do)."""
    global _pending
    names = missing(architectures(plan.local_paths), plan.model_info_dir)
    if not names:
        return None
    log.info("inspecting %s for vLLM's model-class cache while vLLM loads", ", ".join(names))
    # The directory holding the worker package first on the path, wherever the process was started
    # from (not the package itself: its openai.py would shadow the openai library).
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    _pending = subprocess.Popen(
        [sys.executable, "-m", "worker.boot.modelinfo", str(plan.model_info_dir), *names],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _pending


def wait(timeout_s: float = WAIT_S) -> None:
    """Wait for an inspection ``start`` began (no-op otherwise); past ``timeout_s`` stop it."""
    global _pending
    process, _pending = _pending, None
    if process is None:
        return
    started = time.perf_counter()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        log.warning("model-class inspection still running after %.0f s: stopped, vLLM inspects on its own", timeout_s)
        return
    log.info("model-class inspection waited for %.2f s (exit %d)", time.perf_counter() - started, process.returncode)


def fill(directory: Path, names: list[str]) -> int:
    """In the subprocess: vLLM's own inspection of each architecture (the seam's), saved where vLLM
    reads it (``directory``: the plan's ``model_info_dir``, vLLM's own under the environment the
    subprocess inherits), and the names of vLLM's files recorded beside them; the number of answers
    written."""
    from worker.vllm_internals.modelinfo import inspect_classes

    written, found = inspect_classes(names)
    if found:
        names_found = {**recorded(directory), **found}
        temporary = directory / f".{NAMES_FILE}.{os.getpid()}"
        temporary.write_text(json.dumps(names_found, indent=1, sort_keys=True))
        temporary.replace(directory / NAMES_FILE)  # atomic: a boot reading it sees all or nothing
    return written


if __name__ == "__main__":
    fill(Path(sys.argv[1]), sys.argv[2:])
