"""The environment, read into :class:`Settings` (:func:`load_settings`), and the names in it that are
not settings: RunPod worker-vllm's, and names that look like a setting misspelt. Part of the config
package, the only reader of the environment.

A blank value is the same as no value (a RunPod form's untouched field). worker-vllm's names
(``WORKER_VLLM``) are each decided once: an alias with the same meaning is accepted
(``CUSTOM_CHAT_TEMPLATE`` is ``CHAT_TEMPLATE``), anything else is refused at boot with one sentence
saying what to set instead, unless it holds worker-vllm's form default (``WORKER_VLLM_FORM``): an
endpoint moved from worker-vllm keeps those values, which change nothing here, so they are named in
one warning and ignored. A name the worker no longer reads because vLLM made it moot (``RETIRED``)
is refused in one sentence saying why, unless its value asks for what runs anyway. Any other name
that is not a setting gets one warning naming the closest setting when it is the worker's: it
starts with one of the worker's prefixes (``WORKER_PREFIXES``), or it is a setting's name nearly
(``MAX_NUM_SEQ``). Names in other programs' namespaces (``OTHERS_PREFIXES``: vLLM's ``VLLM_*``, the
RunPod SDK's ``RUNPOD_*``, Hugging Face's ``HF_*``, Triton's, PyTorch's (``TORCH_COMPILE`` is the
worker's own), the OpenAI client's) are never warned about, even where the worker reads a few of
them.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from worker.config.settings import Settings
from worker.errors import ConfigError, describe_validation_errors

__all__ = [
    "ALIASES",
    "OTHERS_PREFIXES",
    "RETIRED",
    "WORKER_PREFIXES",
    "WORKER_VLLM",
    "WORKER_VLLM_FORM",
    "Review",
    "load_settings",
    "review",
]

log = logging.getLogger(__name__)

# worker-vllm's names with the same meaning here, under this worker's name.
ALIASES = {
    "CUSTOM_CHAT_TEMPLATE": "CHAT_TEMPLATE",
    "OPENAI_RESPONSE_ROLE": "RESPONSE_ROLE",
    "TOKENIZER": "TOKENIZER_NAME",
    "GUIDED_DECODING_BACKEND": "STRUCTURED_OUTPUTS_BACKEND",
}

_ENGINE_ARG = "worker-vllm's name for vLLM's engine argument {arg}: set ENGINE_ARGS='{{\"{arg}\": <value>}}' instead"
_SPEC_KEY = 'set it inside SPECULATIVE_CONFIG instead (\'{{"method": ..., "{key}": <value>}}\', vLLM\'s names)'
_GONE = "vLLM 0.32 has no such setting: remove it"
_GRAPHS = "vLLM 0.32 has no such setting: MAX_CUDAGRAPH_CAPTURE_SIZE sets the largest CUDA graph"
_OPENAI_LAYER = "an option of worker-vllm's own OpenAI server, which this worker does not offer: remove it"

# worker-vllm's other names (its README's and its args builder's), and why each is refused. Engine
# arguments are vLLM 0.32's AsyncEngineArgs fields (tests/test_names.py checks them against vLLM).
WORKER_VLLM: dict[str, str] = {
    **{
        name: _ENGINE_ARG.format(arg=name.lower())
        for name in (
            "ASYNC_SCHEDULING ATTENTION_BACKEND BLOCK_SIZE CPU_OFFLOAD_GB DISABLE_CUSTOM_ALL_REDUCE "
            "DISABLE_LOG_STATS DISABLE_SLIDING_WINDOW DISTRIBUTED_EXECUTOR_BACKEND DOWNLOAD_DIR "
            "ENABLE_CHUNKED_PREFILL ENABLE_EXPERT_PARALLEL ENABLE_LOG_REQUESTS FULLY_SHARDED_LORAS LORA_DTYPE "
            "MAX_CPU_LORAS MAX_LOGPROBS MAX_PARALLEL_LOADING_WORKERS MODEL_LOADER_EXTRA_CONFIG "
            "NUM_GPU_BLOCKS_OVERRIDE PIPELINE_PARALLEL_SIZE SKIP_TOKENIZER_INIT TOKENIZER_MODE"
        ).split()
    },
    **{
        name: _GONE
        for name in (
            "DISABLE_LOG_REQUESTS DISABLE_LOGGING_REQUEST LONG_LORA_SCALING_FACTORS LORA_EXTRA_VOCAB_SIZE "
            "MAX_LOG_LEN NUM_LOOKAHEAD_SLOTS PREEMPTION_MODE PREEMPTION_CHECK_PERIOD PREEMPTION_CPU_CAPACITY "
            "QUANTIZATION_PARAM_PATH ROPE_SCALING ROPE_THETA SCHEDULER_DELAY_FACTOR SPEC_DECODING_ACCEPTANCE_METHOD "
            "SWAP_SPACE TOKENIZER_POOL_EXTRA_CONFIG TOKENIZER_POOL_SIZE TOKENIZER_POOL_TYPE "
            "TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_ALPHA TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_THRESHOLD "
            "USE_V2_BLOCK_MANAGER"
        ).split()
    },
    **{
        name: _OPENAI_LAYER
        for name in (
            "ENABLE_FORCE_INCLUDE_USAGE ENABLE_LOG_OUTPUTS ENABLE_PROMPT_TOKENS_DETAILS "
            "EXCLUDE_TOOLS_WHEN_TOOL_CHOICE_NONE LOG_ERROR_STACK RETURN_TOKENS_AS_TOKEN_IDS TRUST_REQUEST_CHAT_TEMPLATE"
        ).split()
    },
    **dict.fromkeys(("MAX_SEQ_LEN_TO_CAPTURE", "MAX_CONTEXT_LEN_TO_CAPTURE"), _GRAPHS),
    "SPECULATIVE_DISABLE_BY_BATCH_SIZE": "vLLM 0.32 has no such setting: SPECULATIVE_TOKENS_BY_BATCH gives k by batch "
    "size (1-N:k,N+1-1024:0 turns speculation off above N streams), or SPECULATION_CONTROL=auto chooses k each step",
    "SPECULATIVE_DRAFT_TENSOR_PARALLEL_SIZE": _SPEC_KEY.format(key="draft_tensor_parallel_size"),
    "SPECULATIVE_MAX_MODEL_LEN": _SPEC_KEY.format(key="max_model_len"),
    "NGRAM_PROMPT_LOOKUP_MAX": _SPEC_KEY.format(key="prompt_lookup_max"),
    "NGRAM_PROMPT_LOOKUP_MIN": _SPEC_KEY.format(key="prompt_lookup_min"),
    "BASE_PATH": "worker-vllm's cache root: set HF_HOME for downloads and VLLM_CACHE_ROOT for vLLM's compile cache "
    "(RunPod's cached models are found under RUNPOD_MODEL_CACHE_DIR)",
    "VLLM_EXTRA_ARGS": "worker-vllm's raw vllm serve flags: set ENGINE_ARGS (a JSON object of vLLM's engine arguments)",
    "VLLM_CONFIG_FILE": "worker-vllm's vllm serve config file: set ENGINE_ARGS (a JSON object of vLLM's engine "
    "arguments)",
    **dict.fromkeys(
        ("WORKER_USE_RAY", "RAY_WORKERS_USE_NSIGHT"),
        "worker-vllm's Ray switches: this worker runs vLLM's default executor; for Ray set "
        'ENGINE_ARGS=\'{"distributed_executor_backend": "ray"}\' (Ray is not in the image)',
    ),
    "DEVICE": "vLLM 0.32 takes the device from the build installed (CUDA in the image, CPU in .venv): remove it",
    "RAW_OPENAI_OUTPUT": "a streamed openai_route job yields strings of whole server-sent events here, always "
    "(worker-vllm's RAW_OPENAI_OUTPUT=1): remove it, and read each item's data: lines",
}
# What RAW_OPENAI_OUTPUT=1 asks is what the worker does: accepted, and nothing else is.
_ACCEPTED_VALUES = {"RAW_OPENAI_OUTPUT": {"1", "true"}}


def _asks_for_v2(value: str) -> bool:
    """``VLLM_USE_V2_MODEL_RUNNER`` as vLLM 0.32 reads it (an integer, non-zero: V2): the runner the
    worker runs on every GPU anyway (and writes itself where the installed vLLM reads the variable)."""
    try:
        return int(value) != 0
    except ValueError:
        return False


_ONLY_V2 = (
    "vLLM 0.34, the image's, has only its V2 model runner, which the worker runs on every GPU (the CPU "
    "build runs its CPU runner): remove it"
)
# The worker's settings and vLLM's variables that a newer vLLM made moot: the value each may keep
# (it asks for what runs anyway), else the sentence it is refused with.
RETIRED: dict[str, tuple[Callable[[str], bool], str]] = {
    "MODEL_RUNNER": (lambda value: value.strip().lower() == "auto", _ONLY_V2),
    "VLLM_USE_V2_MODEL_RUNNER": (_asks_for_v2, _ONLY_V2),
}

# worker-vllm's RunPod form (its .runpod/hub.json) and the default each of its names is given there.
# An endpoint moved to this image keeps them; these values change nothing here (vLLM 0.32's
# behaviour, or worker-vllm's own), so they are ignored with one warning naming them. The LoRA
# sizes are this worker's settings too, ignored only while ENABLE_LORA is off (else they count).
WORKER_VLLM_FORM: dict[str, str] = {
    "BASE_PATH": "/runpod-volume",
    "BLOCK_SIZE": "16",
    "DEVICE": "auto",
    "DISABLE_CUSTOM_ALL_REDUCE": "false",
    "DISABLE_LOG_REQUESTS": "true",
    "DISABLE_LOG_STATS": "false",
    "DISABLE_LOGGING_REQUEST": "false",
    "DISABLE_SLIDING_WINDOW": "false",
    "ENABLE_CHUNKED_PREFILL": "false",
    "FULLY_SHARDED_LORAS": "false",
    "GUIDED_DECODING_BACKEND": "outlines",
    "LORA_DTYPE": "auto",
    "LORA_EXTRA_VOCAB_SIZE": "256",
    "MAX_LOGPROBS": "20",
    "MAX_SEQ_LEN_TO_CAPTURE": "8192",
    "NUM_LOOKAHEAD_SLOTS": "0",
    "OPENAI_RESPONSE_ROLE": "assistant",
    "PIPELINE_PARALLEL_SIZE": "1",
    "PREEMPTION_CHECK_PERIOD": "1",
    "PREEMPTION_CPU_CAPACITY": "2",
    "RAW_OPENAI_OUTPUT": "true",
    "RAY_WORKERS_USE_NSIGHT": "false",
    "SCHEDULER_DELAY_FACTOR": "0",
    "SKIP_TOKENIZER_INIT": "false",
    "SPEC_DECODING_ACCEPTANCE_METHOD": "rejection_sampler",
    "SWAP_SPACE": "4",
    "TOKENIZER_MODE": "auto",
    "TOKENIZER_POOL_SIZE": "0",
    "TOKENIZER_POOL_TYPE": "ray",
    "USE_V2_BLOCK_MANAGER": "false",
    "WORKER_USE_RAY": "false",
}
_FORM_LORA_SIZES = {"MAX_LORAS": "1", "MAX_LORA_RANK": "16"}

# Names starting with these are the worker's: a name among them that is not a setting is a mistake.
WORKER_PREFIXES = tuple(
    (
        "ACCEPTANCE_ ALLOW_PRIVATE_ ALLOWED_MEDIA_ API_KEY API_SERVER AWQ_ CACHE_SEED CHAT_ CUDAGRAPH_ DEFAULT_ "
        "ENABLE_ ENFORCE_ ENGINE_ GPU_MEMORY_ KV_CACHE_ LOAD_FORMAT LOAD_PROGRESS LOG_LEVEL LORA_ MAX_CONCURRENCY "
        "MAX_CUDAGRAPH_ MAX_LORA MAX_MODEL_ MAX_NUM_ MAX_QUEUE_ MAX_REQUEST_ METRICS_ MODEL_ NUM_SPECULATIVE_ "
        "OPENAI_SERVED_ PER_REQUEST_ PREFETCH_ REASONING_ RESPONSE_ SHUTDOWN_ SKIP_DRAFT_ SPECULATION_ SPECULATIVE_ "
        "STREAM_ "
        "STRUCTURED_OUTPUTS_ TENSOR_PARALLEL_ TOKENIZER_ TOOL_CALL_ TRUST_REMOTE_ WARMUP_ WORKER_"
    ).split()
)
# Other programs' namespaces: the worker reads a few of their names, and never warns about the rest.
OTHERS_PREFIXES = tuple("VLLM_ RUNPOD_ HF_ HUGGING_FACE_ TRITON_ TORCH_ OPENAI_API_ OPENAI_BASE_ OPENAI_ORG".split())
_BOOL = TypeAdapter(bool)
# How alike a name outside the prefixes must be to a setting to be taken for it (MAX_NUM_SEQ: 0.98).
_NEAR = 0.9


@dataclass(frozen=True, slots=True)
class Review:
    """What the environment's foreign names come to: settings under their own names (aliases
    resolved), refusals (one sentence each) and warnings (one each)."""

    aliased: dict[str, str]
    refused: list[str]
    warnings: list[str]
    ignored: list[str]  # names whose value is dropped (worker-vllm's form defaults)


def _same(value: str, default: str) -> bool:
    """A form's value as the form's default: ``16`` is ``16.0``, ``True`` is ``true``."""
    value, default = value.strip().lower(), default.lower()
    try:
        return float(value) == float(default)
    except ValueError:
        return value == default


def _is_on(value: str | None) -> bool:
    """A boolean setting's value as the setting reads it (pydantic's parsing); unreadable is off,
    and the setting's own parse refuses it."""
    try:
        return value is not None and _BOOL.validate_python(value.strip())
    except ValidationError:
        return False


def review(env: Mapping[str, str], settings: Collection[str]) -> Review:
    """The environment's names that are not in ``settings`` (upper-case setting names), judged."""
    aliased: dict[str, str] = {}
    refused: list[str] = []
    warnings: list[str] = []
    ignored: dict[str, str] = {}
    upper_env = {name.upper(): value for name, value in env.items()}
    for name in sorted(env):
        upper = name.upper()
        form_default = WORKER_VLLM_FORM.get(upper)
        if upper in _FORM_LORA_SIZES and not _is_on(upper_env.get("ENABLE_LORA")):
            form_default = _FORM_LORA_SIZES[upper]
        if form_default is not None and _same(env[name], form_default):
            ignored[upper] = env[name]
            continue
        if upper in settings:
            continue
        if upper in ALIASES:
            target = ALIASES[upper]
            if target in env and env[target] != env[name]:
                refused.append(f"{upper} is worker-vllm's name for {target}, which is set too: keep {target}")
            else:
                aliased[target] = env[name]
        elif upper in RETIRED:
            is_moot, why = RETIRED[upper]
            if not is_moot(env[name]):
                refused.append(f"{upper}={env[name].strip()}: {why}")
        elif upper in WORKER_VLLM:
            if env[name].strip().lower() not in _ACCEPTED_VALUES.get(upper, ()):
                refused.append(f"{upper}: {WORKER_VLLM[upper]}")
        elif not upper.startswith(OTHERS_PREFIXES):
            closest = difflib.get_close_matches(upper, settings, n=1, cutoff=0.0)
            is_ours = upper.startswith(WORKER_PREFIXES)
            if closest and (is_ours or difflib.SequenceMatcher(None, upper, closest[0]).ratio() >= _NEAR):
                warnings.append(f"{upper} is not a setting of this worker and is ignored: did you mean {closest[0]}?")
    if ignored:
        named = ", ".join(f"{key}={value}" for key, value in ignored.items())
        warnings.append(f"worker-vllm's form defaults change nothing here and are ignored: {named}")
    return Review(aliased=aliased, refused=refused, warnings=warnings, ignored=list(ignored))


def load_settings(env: Mapping[str, str] | None = None, *, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Parse settings from ``env`` (default: the process environment), then ``overrides`` (CLI flags);
    the names that are not settings are judged by :func:`review`: warnings logged, aliases taken,
    refusals raised with the settings' own errors.

    Raises :class:`ConfigError` naming the offending variable.
    """
    source: dict[str, Any] = {**(os.environ if env is None else env), **(overrides or {})}
    # A blank value is no value: a RunPod form's untouched field arrives as NAME=, and so does an
    # image's baked setting that an endpoint blanks out.
    source = {key: value for key, value in source.items() if not (isinstance(value, str) and not value.strip())}
    fields = {name.upper() for name in Settings.model_fields}
    foreign = review({key: str(value) for key, value in source.items()}, fields)
    for warning in foreign.warnings:
        log.warning(warning)
    dropped = set(foreign.ignored)
    values: dict[str, Any] = {
        key.lower(): value for key, value in source.items() if key.upper() in fields and key.upper() not in dropped
    }
    values.update({key.lower(): value for key, value in foreign.aliased.items()})
    try:
        settings = Settings(**values)
    except ValidationError as exc:
        # A rule across fields (an empty loc) names its variables in its own message.
        problems = describe_validation_errors(
            exc.errors(include_url=False, include_input=False), place=lambda loc: ".".join(map(str, loc)).upper()
        )
        raise ConfigError("invalid configuration: " + "; ".join([*foreign.refused, problems])) from None
    if foreign.refused:
        raise ConfigError("invalid configuration: " + "; ".join(foreign.refused))
    return settings
