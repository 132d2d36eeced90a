"""A model's context limit as vLLM derives it: the largest ``max_model_len`` vLLM accepts for the
model, from its config, without importing vLLM.

Why not ask vLLM: its derivation (``vllm.config.model._get_and_verify_max_len`` over the model
architecture convertor's ``derive_max_model_len_and_key``) runs on vLLM's config objects, and any
import of vLLM loads the whole package, torch's compiler included: seconds that the process's start
(``worker.boot.preflight``) would spend before it takes a job, where the boot imports vLLM while it
reads the weights (``worker.boot.prefetch``). transformers' config, which vLLM reads a model's with,
loads in a fraction of that. So vLLM's rules are written out here (the same in the two releases the
seam spans), and ``tests/test_model_len.py`` checks the answer against vLLM's own helper on a config
of each rule; the contract lists the helper, so that a vLLM that moves it fails there first.

The rules, on the text config (a multimodal model's language part): the smallest of the length keys
(:data:`LENGTH_KEYS`), or ``model_max_length`` where set; times the RoPE scaling factor, unless the
RoPE type scales the length itself (:data:`PRESCALED_ROPE_TYPES`) or the model is a Gemma 3; and a
``model_max_length`` above that raises the limit to it. No answer (None) where vLLM's turns on
what is not read here: no length key (vLLM then takes the length it is given), a model type whose
convertor derives it otherwise (:data:`OWN_DERIVATION`), a config that needs remote code or that
transformers cannot read. What vLLM lowers the limit with and this does not (a pooling model's
tokenizer limit, a sliding window under ``disable_sliding_window``) is left to vLLM's own check at
boot: the answer here is never below vLLM's, so it refuses nothing that vLLM would serve.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "LENGTH_KEYS",
    "OWN_DERIVATION",
    "PRESCALED_ROPE_TYPES",
    "ContextLimit",
    "context_limit",
    "model_context_limit",
    "read_config",
]

log = logging.getLogger(__name__)

# vLLM's keys for a model's length, in its order: the first of the smallest names the limit.
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE types whose max_position_embeddings is already the scaled length: their factor is not applied.
PRESCALED_ROPE_TYPES = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})
# Model types whose vLLM convertor derives the length its own way (tests/test_model_len.py checks the
# set against vLLM's convertors).
OWN_DERIVATION = frozenset({"moss_audio"})
# Engine arguments that change the config vLLM reads: beside one, the config read here is not vLLM's.
_CONFIG_CHANGING_ARGS = frozenset({"hf_overrides", "hf_config_path"})


@dataclasses.dataclass(frozen=True, slots=True)
class ContextLimit:
    """The largest ``max_model_len`` vLLM accepts (``tokens``), and what in the config sets it
    (``source``, for a message: ``max_position_embeddings 2048``)."""

    tokens: int
    source: str


def model_context_limit(path: Path, *, engine_kwargs: Mapping[str, Any]) -> ContextLimit | None:
    """The context limit vLLM derives for the model whose files are in ``path``, served with
    ``engine_kwargs``; None where this cannot say (the module's docstring), and where vLLM reads more
    than the model's config: engine arguments that change it, a sentence-transformers model's own
    ``max_seq_length`` (its ``sentence_bert_config.json``)."""
    if engine_kwargs.keys() & _CONFIG_CHANGING_ARGS or (path / "sentence_bert_config.json").is_file():
        return None
    read = read_config(path)
    return None if read is None else context_limit(*read)


def read_config(path: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The model config in ``path`` as vLLM reads it (transformers' config class, its defaults
    filled in), and its text config, each as a dict; None where it needs remote code or
    transformers cannot read it (vLLM's boot says what is wrong)."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
        text = config.get_text_config()
    except Exception as exc:  # any failure to read is no answer here, not a verdict
        log.debug("no context limit read from %s: %s", path, exc)
        return None
    top: dict[str, Any] = config.to_dict()
    if "auto_map" in top:  # vLLM may read it with the model's own config class
        return None
    return top, text.to_dict()


def context_limit(config: Mapping[str, Any], text_config: Mapping[str, Any]) -> ContextLimit | None:
    """The context limit of a model whose config and text config (:func:`read_config`) are these,
    as vLLM derives it; None where this cannot say (the module's docstring)."""
    if config.get("model_type") in OWN_DERIVATION:
        return None
    lengths = {key: text_config[key] for key in LENGTH_KEYS if text_config.get(key) is not None}
    if not lengths:
        return None
    key = min(lengths, key=lengths.__getitem__)
    derived: float = lengths[key]
    if text_config.get("model_max_length"):
        key, derived = "model_max_length", text_config["model_max_length"]
    source = f"{key} {derived}"
    rope = list(_rope_parameters(text_config))
    if rope and "gemma3" not in str(text_config.get("model_type")):
        factor = 1.0
        for parameters in rope:
            if parameters.get("rope_type") not in PRESCALED_ROPE_TYPES:
                factor = parameters.get("factor", factor)
        factor = 1.0 if factor is None else factor
        if factor != 1.0:
            derived *= factor
            source += f" x {factor:g} (RoPE scaling)"
    allowed = text_config.get("model_max_length")
    if allowed is not None and allowed > derived:
        derived, source = allowed, f"model_max_length {allowed}"
    return ContextLimit(tokens=int(derived), source=source)


def _rope_parameters(text_config: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The RoPE parameters, one mapping per layer type where they are given by layer type."""
    rope = text_config.get("rope_parameters")
    if not isinstance(rope, dict) or not rope:
        return
    if all(isinstance(value, dict) or value is None for value in rope.values()):
        yield from (value for value in rope.values() if value)
    else:
        yield rope
