"""The speculation map's configurations (:mod:`.spec_map`'s docstring gives their grammar): each name
made into the worker's environment for its engine, and the check that the acceptance mix can serve
them (:mod:`.acceptance_mix`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.config.speculation import NGRAM_METHODS

__all__ = ["baseline", "check_mix", "config_env", "speculative_config"]


def _draft_method(drafter: str) -> str:
    """``eagle3`` for a checkpoint whose architecture is an EAGLE-3 head, else ``draft_model``."""
    config = Path(drafter) / "config.json"
    if config.is_file() and any("Eagle3" in arch for arch in json.loads(config.read_text()).get("architectures", [])):
        return "eagle3"
    return "draft_model"


def speculative_config(drafter: str, k: int, length: str) -> dict[str, Any]:
    """vLLM's speculative config for ``DRAFTER``, ``K`` and ``LENGTH`` (module docstring)."""
    spec: dict[str, Any] = {"num_speculative_tokens": k}
    if drafter in NGRAM_METHODS:
        spec.update(method=drafter, prompt_lookup_max=4, prompt_lookup_min=1)
    else:
        spec.update(method=_draft_method(drafter), model=drafter)
    if length != "real":
        spec.update(rejection_sample_method="synthetic", synthetic_acceptance_length=float(length))
    return spec


def baseline(configs: list[str]) -> str | None:
    """The configuration without speculation the others are compared with: ``none``, else the
    first ``none+KEY=VALUE`` (``none+TORCH_COMPILE=on`` beside compiled engines)."""
    if "none" in configs:
        return "none"
    return next((name for name in configs if name.startswith("none+")), None)


def check_mix(base: dict[str, str], configs: list[str]) -> None:
    """Raises ValueError, in one line, for a configuration the acceptance mix cannot serve
    (:mod:`.acceptance_mix`): one whose synthetic length is short of full acceptance (``K + 1``) or
    the standard sampler's, or an engine core started by spawn."""
    for name in configs:
        env = config_env(base, name)
        if env.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn":
            raise ValueError(f"{name}: a spawned engine core does not get the acceptance mix's hook (it is forked in)")
        if "SPECULATIVE_CONFIG" not in env:
            continue  # no speculation
        spec = json.loads(env["SPECULATIVE_CONFIG"])
        full = spec["num_speculative_tokens"] + 1
        if spec.get("synthetic_acceptance_length") != full:
            raise ValueError(f"{name}: the acceptance mix needs full synthetic acceptance, LENGTH = K + 1 = {full}")


def config_env(base: dict[str, str], name: str) -> dict[str, str]:
    """The worker's environment for configuration ``name`` (module docstring)."""
    env = {key: value for key, value in base.items() if "SPECULATI" not in key}
    name, *extra = name.split("+")
    for pair in extra:
        key, sep, value = pair.partition("=")
        if not (key and sep):
            raise ValueError(f"{pair!r}: more settings are +KEY=VALUE pairs")
        env[key] = value
    if name == "none":
        return {**env, "SPECULATIVE_METHOD": "none"}
    try:
        drafter, k_text, length, control = name.rsplit(":", 3)
        k = int(k_text)
        if control not in ("static", "auto", "stock"):
            raise ValueError(control)
    except ValueError:
        raise ValueError(f"{name!r} is not none or DRAFTER:K:LENGTH:CONTROL") from None
    spec = speculative_config(drafter, k, length)
    if control == "stock":
        return {**env, "SPECULATIVE_CONFIG": json.dumps(spec), "PER_REQUEST_SPEC_DECODE_METRICS": "none"}
    return {**env, "SPECULATIVE_CONFIG": json.dumps(spec), "SPECULATION_CONTROL": control}
