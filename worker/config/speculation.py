"""Speculation policy: which speculative config the settings ask for, what drafts under it
(:func:`drafter_of`), and the rules the speculation settings must satisfy (checked when Settings parse).

Speculative decoding is configured either by ``SPECULATIVE_CONFIG`` (vLLM's JSON) or by the simple
knobs ``SPECULATIVE_METHOD`` / ``SPECULATIVE_MODEL`` / ``NUM_SPECULATIVE_TOKENS``, never both. An
unset ``MODEL_NAME`` selects the default model (SmolLM2), which by default speculates by n-gram
matching: real acceptance on a prompt whose answer copies from it. Pure: reads only the settings
it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

__all__ = [
    "DEFAULT_NUM_SPECULATIVE_TOKENS",
    "EAGLE_METHODS",
    "MODELLESS_METHODS",
    "NGRAM_LOOKUP",
    "NGRAM_METHODS",
    "TINY_PREFIX",
    "VLLM_SPECULATIVE_METHODS",
    "Drafter",
    "SpeculationSettings",
    "check",
    "draft_ref",
    "drafter_of",
    "drafts_by_eagle",
    "drafts_by_ngram",
    "drafts_with_model",
    "ignored_drafter_setting",
    "speculative_config",
]

TINY_PREFIX = "tiny:"
# SPECULATIVE_METHOD's values: vLLM 0.32's ``SpeculativeMethod`` (vllm/config/speculative.py), written
# out because this module imports without vLLM (tests/test_config.py checks it against vLLM's own
# type), and "none". A typo fails at once here rather than after vLLM's import, well into the boot.
VLLM_SPECULATIVE_METHODS = frozenset(
    """ngram medusa mlp_speculator draft_model suffix custom_class eagle eagle3 extract_hidden_states
    deepseek_mtp dots3_note_mtp mimo_mtp mimo_v2_mtp glm4_moe_mtp glm4_moe_lite_mtp glm_ocr_mtp ernie_mtp
    nemotron_h_mtp exaone_moe_mtp exaone4_5_mtp qwen3_next_mtp qwen4_exp_mtp qwen3_5_mtp longcat_flash_mtp
    bailing_hybrid_v3_mtp minimax_m3_mtp bailing_hybrid_mtp mtp kimi_k3_mtp pangu_ultra_moe_mtp step3p5_mtp
    hy_v3_mtp hy_v4_mtp gemma4_mtp inkling_mtp glm5_next_mtp dflash ngram_gpu dspark""".split()
)
# NUM_SPECULATIVE_TOKENS when the simple knobs turn speculation on without it (the default model's k).
DEFAULT_NUM_SPECULATIVE_TOKENS = 3
# n-gram's lookup when SPECULATIVE_METHOD=ngram sets it up: the longest match first, down to one token.
NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 1}


class SpeculationSettings(Protocol):
    """The settings speculation policy reads (``Settings`` has them)."""

    @property
    def model_name(self) -> str | None: ...
    @property
    def speculative_config(self) -> dict[str, Any] | None: ...
    @property
    def speculative_method(self) -> str | None: ...
    @property
    def speculative_model(self) -> str | None: ...
    @property
    def num_speculative_tokens(self) -> int | None: ...
    @property
    def speculative_tokens_by_batch(self) -> list[tuple[int, int, int]] | None: ...


# Substrings of a draft's name from which vLLM 0.32 infers another method than a separate draft
# model, even under method "draft_model" (``SpeculativeConfig.__post_init__``).
_EAGLE_NAME_MARKS = ("eagle-", "eagle3")
_VLLM_NAME_INFERRED_METHODS = (*_EAGLE_NAME_MARKS, "dflash", "dspark")


def drafts_with_model(spec: Mapping[str, Any] | None) -> bool:
    """Whether vLLM runs this speculative config as a separate draft model (its method
    ``draft_model``): the one answer for the draft check, the control's default and validation.

    vLLM's own inference rule: no ``method`` and a ``model`` that is neither ``ngram`` nor a dotted
    proposer class path means ``draft_model``; a draft whose name marks an EAGLE, DFlash or DSpark
    head is run as that, whatever the method says. (vLLM also recognises MTP, Medusa and MLP
    speculator heads by their config's ``model_type``, which the draft check reads.)
    """
    if not spec:
        return False
    model, method = spec.get("model"), spec.get("method")
    if not isinstance(model, str) or not model:
        return False
    if method is None:
        if model in ("ngram", "[ngram]") or _is_class_path(model):
            return False
        method = "draft_model"
    return method == "draft_model" and not any(mark in model.lower() for mark in _VLLM_NAME_INFERRED_METHODS)


def _is_class_path(model: str) -> bool:
    """A dotted proposer class path (``my_module.MyProposer``), which vLLM runs as ``custom_class``."""
    return "." in model and "/" not in model and all(part.isidentifier() for part in model.split("."))


# vLLM's n-gram methods (its config's ``use_ngram``): matching on the CPU, or on the GPU.
NGRAM_METHODS = ("ngram", "ngram_gpu")
# vLLM's methods that draft from the text so far (n-gram matching, suffix trees), without weights of
# their own: under them vLLM drops a draft model, and the keys for its weights, without a word.
MODELLESS_METHODS = ("ngram", "ngram_gpu", "suffix")
# SPECULATIVE_CONFIG's keys for a draft's weights (vLLM's SpeculativeConfig fields).
_DRAFT_WEIGHT_KEYS = ("model", "revision", "code_revision", "quantization", "draft_tensor_parallel_size")
# SPECULATIVE_CONFIG's keys for n-gram matching, and the prefix of those for suffix decoding.
_NGRAM_KEYS = ("prompt_lookup_max", "prompt_lookup_min")
_SUFFIX_KEY_PREFIX = "suffix_decoding_"
# vLLM's EAGLE heads (its ``EagleProposer``): a small head that drafts from the target's hidden states.
EAGLE_METHODS = ("eagle", "eagle3")


def drafts_by_eagle(spec: Mapping[str, Any] | None) -> bool:
    """Whether vLLM runs this speculative config as an EAGLE or EAGLE-3 head: the method says so,
    or (vLLM's inference, :func:`drafts_with_model`) the draft's name marks one."""
    if not spec:
        return False
    method, model = spec.get("method"), spec.get("model")
    if method in EAGLE_METHODS:
        return True
    is_marked = isinstance(model, str) and any(mark in model.lower() for mark in _EAGLE_NAME_MARKS)
    return method in (None, "draft_model") and is_marked


def drafts_by_ngram(spec: Mapping[str, Any] | None) -> bool:
    """Whether vLLM runs this speculative config as n-gram matching: method ``ngram`` or
    ``ngram_gpu``, or (vLLM's inference) no method and the model ``ngram``."""
    if not spec:
        return False
    method = spec.get("method")
    if method is None:
        return spec.get("model") in ("ngram", "[ngram]")
    return method in NGRAM_METHODS


Drafter = Literal["ngram", "eagle", "draft_model", "other"]


def drafter_of(spec: Mapping[str, Any] | None) -> Drafter:
    """What drafts under this speculative config, as vLLM will run it (``other`` also without
    speculation): the one classification the plan's defaults and the bench's costs key on."""
    if drafts_by_ngram(spec):
        return "ngram"
    if drafts_by_eagle(spec):
        return "eagle"
    return "draft_model" if drafts_with_model(spec) else "other"


def check(settings: SpeculationSettings) -> None:
    """The rules across the speculation settings (raises ValueError: Settings' validation)."""
    knobs = settings.speculative_method or settings.speculative_model or settings.num_speculative_tokens
    if settings.speculative_config is not None and knobs:
        raise ValueError(
            "SPECULATIVE_CONFIG cannot be combined with SPECULATIVE_METHOD/SPECULATIVE_MODEL/"
            "NUM_SPECULATIVE_TOKENS; use one or the other"
        )
    if settings.speculative_method == "none":
        return
    if settings.speculative_method is not None and settings.speculative_method not in VLLM_SPECULATIVE_METHODS:
        raise ValueError(
            f"SPECULATIVE_METHOD={settings.speculative_method!r} is not one of vLLM's methods: none, "
            + ", ".join(sorted(VLLM_SPECULATIVE_METHODS))
        )
    if settings.speculative_method == "draft_model" and not settings.speculative_model:
        raise ValueError("SPECULATIVE_METHOD=draft_model needs SPECULATIVE_MODEL")
    schedule = settings.speculative_tokens_by_batch
    if schedule is not None:
        spec = speculative_config(settings)
        if spec is None:
            raise ValueError("SPECULATIVE_TOKENS_BY_BATCH needs speculative decoding to be configured")
        k, highest = spec.get("num_speculative_tokens"), max(entry[2] for entry in schedule)
        if isinstance(k, int) and highest > k:
            raise ValueError(f"SPECULATIVE_TOKENS_BY_BATCH asks for k={highest}, above NUM_SPECULATIVE_TOKENS={k}")
    if ignored := ignored_drafter_setting(settings):
        raise ValueError(ignored)


def ignored_drafter_setting(settings: SpeculationSettings) -> str | None:
    """The sentence refusing a drafter setting that the chosen method ignores (vLLM drops it without
    a word), naming both; None when every one given has its effect. ``SPECULATIVE_METHOD=none``
    beside the other knobs is refused where Settings checks its parts."""
    method, model = settings.speculative_method, settings.speculative_model
    if method in MODELLESS_METHODS and model:
        return (
            f"SPECULATIVE_MODEL={model} has no effect under SPECULATIVE_METHOD={method}, which drafts from the "
            "text so far, without a model: unset SPECULATIVE_MODEL, or choose a method that drafts with it "
            "(draft_model, eagle3, ...)"
        )
    config = settings.speculative_config
    if not config:
        return None
    method = _method_of(config)
    if method in MODELLESS_METHODS:
        named_itself = ("ngram", "[ngram]", method)  # vLLM's own way to name the method as the model
        for key in _DRAFT_WEIGHT_KEYS:
            if config.get(key) is not None and not (key == "model" and config[key] in named_itself):
                return (
                    f'SPECULATIVE_CONFIG: "{key}" has no effect under method "{method}", which drafts from the '
                    "text so far, without a model: remove it, or choose a method that drafts with one"
                )
    for key in config:
        if key in _NGRAM_KEYS and method not in NGRAM_METHODS:
            return f'SPECULATIVE_CONFIG: "{key}" sets n-gram matching, which method "{method}" does not run: remove it'
        if key.startswith(_SUFFIX_KEY_PREFIX) and method != "suffix":
            return f'SPECULATIVE_CONFIG: "{key}" sets suffix decoding, which method "{method}" does not run: remove it'
    return None


def _method_of(config: Mapping[str, Any]) -> str:
    """The method vLLM runs a speculative config with: its ``method``, else what vLLM infers from its
    ``model`` (n-gram, a proposer class path, else a draft model)."""
    method, model = config.get("method"), config.get("model")
    if method is not None:
        return str(method)
    if isinstance(model, str) and _is_class_path(model):
        return "custom_class"
    return "ngram" if drafts_by_ngram(config) else "draft_model"


def speculative_config(settings: SpeculationSettings) -> dict[str, Any] | None:
    """vLLM's speculative_config dict, from SPECULATIVE_CONFIG or the simple knobs, with
    SPECULATIVE_TOKENS_BY_BATCH as vLLM's ``num_speculative_tokens_per_batch_size``.

    Model references may use the ``tiny:<variant>`` form; the boot plan resolves them.
    """
    spec = _base_config(settings)
    if spec is not None and settings.speculative_tokens_by_batch is not None:
        spec["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in settings.speculative_tokens_by_batch]
    return spec


def _base_config(settings: SpeculationSettings) -> dict[str, Any] | None:
    if settings.speculative_method == "none":
        return None
    if settings.speculative_config is not None:
        return dict(settings.speculative_config)
    if settings.speculative_method or settings.speculative_model:
        method = settings.speculative_method or "draft_model"
        num_tokens = settings.num_speculative_tokens or DEFAULT_NUM_SPECULATIVE_TOKENS
        spec: dict[str, Any] = {"method": method, "num_speculative_tokens": num_tokens}
        if settings.speculative_model:
            spec["model"] = settings.speculative_model
        if method == "ngram":
            spec.update(NGRAM_LOOKUP)
        return spec
    if settings.model_name is None:
        # The default shows speculation on real text: n-gram drafts what the prompt holds (an
        # answer that quotes, extracts or edits it). A named model speculates only when configured.
        k = settings.num_speculative_tokens or DEFAULT_NUM_SPECULATIVE_TOKENS
        return {"method": "ngram", "num_speculative_tokens": k, **NGRAM_LOOKUP}
    return None


def draft_ref(settings: SpeculationSettings) -> str | None:
    """The draft model as the user named it (``SPECULATIVE_MODEL`` or the config's ``model``),
    when speculation drafts with a separate model (:func:`drafts_with_model`)."""
    spec = speculative_config(settings)
    return spec["model"] if spec is not None and drafts_with_model(spec) else None
