"""The worker's vLLM general plugin (entry point ``vllm.general_plugins`` in pyproject.toml): vLLM
calls ``register`` in every process it runs, the engine core and each model worker included, and
spawned ones too.

What it does: asks Linux for the AMX tile registers before vLLM's CPU kernels use them. vLLM's CPU
attention picks its AMX kernel whenever the CPU reports AMX (``_get_attn_isa`` in
``vllm/v1/attention/backends/cpu_attn.py``) but never requests the permission Linux requires for it
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``), so on a Sapphire Rapids or newer Xeon the
first bf16 forward pass dies with "Illegal instruction" (seen on 2026-12-03: the tiny model's first
job). The permission is per process, kept across fork and dropped by exec, hence a plugin that
runs in each process rather than one call at the worker's start. PyTorch's ``torch.cpu._init_amx``
makes that request (it is what its own oneDNN path calls); nothing public does, so it is called
here, where present, and only on a CPU that reports AMX tiles. vLLM loads every installed plugin
unless ``VLLM_PLUGINS`` names some: a list without ``runpod_worker`` leaves this one out.
"""

from __future__ import annotations

import logging

__all__ = ["register"]

log = logging.getLogger(__name__)


def register() -> None:
    import torch

    cpu = getattr(torch, "cpu", None)
    is_supported = getattr(cpu, "_is_amx_tile_supported", None)
    init = getattr(cpu, "_init_amx", None)
    if is_supported is None or init is None or not is_supported():
        return
    if not init():
        # vLLM will still choose its AMX kernel: say why the process is about to die.
        log.error("this CPU reports AMX tiles but Linux refused them to this process: vLLM's AMX kernels will fail")
