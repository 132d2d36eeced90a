"""Names in the environment that are not settings: worker-vllm's are accepted as aliases or refused
with a migration sentence, the worker's own misspelt get one warning naming the closest setting,
and everybody else's are left alone. Settings that have no effect under the others are refused."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest

from worker.config import Settings, load_settings
from worker.config.environment import (
    ALIASES,
    OTHERS_PREFIXES,
    WORKER_PREFIXES,
    WORKER_VLLM,
    WORKER_VLLM_FORM,
    review,
)
from worker.errors import ConfigError

SETTINGS = {name.upper() for name in Settings.model_fields}
README = Path(__file__).resolve().parent.parent / "README.md"

# What a container, a RunPod worker, vLLM, CUDA, Python and the tools around them set.
ORDINARY = """PATH HOME HOSTNAME LANG LC_ALL PWD OLDPWD SHELL SHLVL TERM USER LOGNAME TZ LD_LIBRARY_PATH
PYTHONPATH PYTHONUNBUFFERED PYTHONDONTWRITEBYTECODE VIRTUAL_ENV XDG_CACHE_HOME CUDA_VISIBLE_DEVICES CUDA_HOME
CUDA_VERSION NVIDIA_VISIBLE_DEVICES NVIDIA_DRIVER_CAPABILITIES NVIDIA_REQUIRE_CUDA NCCL_DEBUG NCCL_P2P_DISABLE
OMP_NUM_THREADS MKL_NUM_THREADS TOKENIZERS_PARALLELISM TORCH_CUDA_ARCH_LIST PYTORCH_CUDA_ALLOC_CONF MAX_JOBS
HF_HOME HF_HUB_OFFLINE HF_HUB_ENABLE_HF_TRANSFER HUGGING_FACE_HUB_TOKEN TRANSFORMERS_CACHE TRITON_PTXAS_PATH
VLLM_LOGGING_LEVEL VLLM_CPU_KVCACHE_SPACE VLLM_ATTENTION_BACKEND VLLM_PORT VLLM_HOST_IP VLLM_USE_DEEP_GEMM
RUNPOD_POD_ID RUNPOD_API_KEY RUNPOD_ENDPOINT_ID RUNPOD_WEBHOOK_GET_JOB RUNPOD_WEBHOOK_PING RUNPOD_GPU_COUNT
RUNPOD_DEBUG_LEVEL RUNPOD_POD_HOSTNAME RUNPOD_PUBLIC_IP RUNPOD_TCP_PORT_22 RUNPOD_VOLUME_ID OPENAI_API_KEY
OPENAI_BASE_URL KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT PIP_INDEX_URL PIP_NO_CACHE_DIR DEBIAN_FRONTEND
JUPYTER_PASSWORD PUBLIC_KEY""".split()


def test_the_deployers_names_are_warned_refused_or_taken(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="worker.config"):
        settings = load_settings({"MAX_NUM_SEQ": "4", "CUSTOM_CHAT_TEMPLATE": "{{ x }}", "RAW_OPENAI_OUTPUT": "1"})
    assert settings.max_num_seqs is None and settings.chat_template == "{{ x }}"
    assert [r.getMessage() for r in caplog.records] == [
        "MAX_NUM_SEQ is not a setting of this worker and is ignored: did you mean MAX_NUM_SEQS?"
    ]
    with pytest.raises(ConfigError) as info:
        load_settings({"SPECULATIVE_DISABLE_BY_BATCH_SIZE": "8", "RAW_OPENAI_OUTPUT": "0"})
    message = info.value.message
    assert "RAW_OPENAI_OUTPUT: " in message and "server-sent events" in message
    assert "SPECULATIVE_DISABLE_BY_BATCH_SIZE: " in message and "SPECULATIVE_TOKENS_BY_BATCH" in message
    assert "\n" not in message


def test_ordinary_variables_are_never_warned_about() -> None:
    assert review(dict.fromkeys(ORDINARY, "1"), SETTINGS).warnings == []


def test_a_misspelt_setting_outside_the_prefixes_is_caught_by_its_likeness() -> None:
    warnings = review({"SPECULATVE_METHOD": "ngram", "QUANTISATION": "awq"}, SETTINGS).warnings
    assert warnings == [
        "QUANTISATION is not a setting of this worker and is ignored: did you mean QUANTIZATION?",
        "SPECULATVE_METHOD is not a setting of this worker and is ignored: did you mean SPECULATIVE_METHOD?",
    ]


def test_the_prefixes_cover_every_setting_of_more_than_one_word() -> None:
    uncovered = [name for name in SETTINGS if "_" in name and not name.startswith(WORKER_PREFIXES + OTHERS_PREFIXES)]
    assert uncovered == []
    assert not [name for name in ORDINARY if name.startswith(WORKER_PREFIXES)]


def test_worker_vllms_names_are_not_settings_and_each_is_decided_once() -> None:
    assert not (set(WORKER_VLLM) | set(ALIASES)) & SETTINGS
    assert not set(WORKER_VLLM) & set(ALIASES)
    assert set(ALIASES.values()) <= SETTINGS


def test_the_migration_sentences_name_vllms_own_arguments() -> None:
    from vllm.config.speculative import SpeculativeConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    engine_args = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    spec_keys = {field.name for field in dataclasses.fields(SpeculativeConfig)}
    for name, sentence in WORKER_VLLM.items():
        if "ENGINE_ARGS='" in sentence:
            argument = re.search(r"ENGINE_ARGS='\{\"(\w+)\"", sentence)
            assert argument and argument.group(1) in engine_args, name
        elif "has no such setting" in sentence:
            assert name.lower() not in engine_args, name
        if "inside SPECULATIVE_CONFIG" in sentence:
            key = sentence.split('"')[-2]
            assert key in spec_keys, name


def test_an_alias_beside_its_setting_must_agree() -> None:
    assert load_settings({"OPENAI_RESPONSE_ROLE": "bot", "RESPONSE_ROLE": "bot"}).response_role == "bot"
    with pytest.raises(ConfigError, match="OPENAI_RESPONSE_ROLE is worker-vllm's name for RESPONSE_ROLE"):
        load_settings({"OPENAI_RESPONSE_ROLE": "bot", "RESPONSE_ROLE": "assistant"})


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        (
            {"SPECULATIVE_METHOD": "none", "SPECULATIVE_TOKENS_BY_BATCH": "1-8:2"},
            "SPECULATIVE_METHOD=none turns speculation off: unset SPECULATIVE_TOKENS_BY_BATCH",
        ),
        (
            {"SPECULATIVE_METHOD": "none", "NUM_SPECULATIVE_TOKENS": "3", "SPECULATIVE_MODEL": "d"},
            "unset SPECULATIVE_MODEL, NUM_SPECULATIVE_TOKENS",
        ),
        ({"MODEL_NAME": "m", "NUM_SPECULATIVE_TOKENS": "3"}, "NUM_SPECULATIVE_TOKENS needs SPECULATIVE_METHOD"),
        ({"MODEL_NAME": "m", "SPECULATION_CONTROL": "auto"}, "SPECULATION_CONTROL needs speculative decoding"),
        ({"MAX_LORAS": "2", "MAX_LORA_RANK": "8"}, "MAX_LORAS, MAX_LORA_RANK needs ENABLE_LORA=true"),
    ],
)
def test_a_setting_without_effect_is_refused_naming_it(env: dict[str, str], sentence: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert sentence in info.value.message


def test_the_readme_maps_worker_vllms_names() -> None:
    readme = README.read_text()
    section = readme[readme.index("## Coming from worker-vllm") :]
    section = section[: section.index("\n## ", 1)]
    named = ["SPECULATIVE_DISABLE_BY_BATCH_SIZE", "RAW_OPENAI_OUTPUT", "ENGINE_ARGS", *ALIASES]
    assert [name for name in named if name not in section] == []


# worker-vllm's RunPod form as an endpoint moved to this image keeps it: every field with a default
# at that default (its own names, WORKER_VLLM_FORM, and the names it shares with this worker), and
# every field without one left blank.
WORKER_VLLM_ENDPOINT = {
    **WORKER_VLLM_FORM,
    **dict.fromkeys(("ENABLE_LORA", "ENABLE_PREFIX_CACHING", "ENFORCE_EAGER", "TRUST_REMOTE_CODE"), "false"),
    **dict.fromkeys(("DTYPE", "KV_CACHE_DTYPE", "LOAD_FORMAT"), "auto"),
    **{"MAX_LORAS": "1", "MAX_LORA_RANK": "16", "MAX_NUM_SEQS": "256", "MAX_CONCURRENCY": "300", "SEED": "0"},
    **{"GPU_MEMORY_UTILIZATION": "0.95", "TENSOR_PARALLEL_SIZE": "1", "ENABLE_AUTO_TOOL_CHOICE": "false"},
    **{"DEFAULT_BATCH_SIZE": "50", "DEFAULT_MIN_BATCH_SIZE": "1", "DEFAULT_BATCH_SIZE_GROWTH_FACTOR": "3"},
    **dict.fromkeys(
        "TOKENIZER TOKENIZER_NAME TOKENIZER_REVISION DOWNLOAD_DIR QUANTIZATION_PARAM_PATH MAX_MODEL_LEN "
        "DISTRIBUTED_EXECUTOR_BACKEND MAX_PARALLEL_LOADING_WORKERS NUM_GPU_BLOCKS_OVERRIDE MAX_NUM_BATCHED_TOKENS "
        "QUANTIZATION ROPE_SCALING ROPE_THETA TOKENIZER_POOL_EXTRA_CONFIG LONG_LORA_SCALING_FACTORS MAX_CPU_LORAS "
        "SPECULATIVE_MODEL NUM_SPECULATIVE_TOKENS SPECULATIVE_DRAFT_TENSOR_PARALLEL_SIZE SPECULATIVE_MAX_MODEL_LEN "
        "SPECULATIVE_DISABLE_BY_BATCH_SIZE NGRAM_PROMPT_LOOKUP_MAX NGRAM_PROMPT_LOOKUP_MIN MODEL_LOADER_EXTRA_CONFIG "
        "PREEMPTION_MODE MAX_LOG_LEN CUSTOM_CHAT_TEMPLATE OPENAI_SERVED_MODEL_NAME_OVERRIDE MODEL_REVISION HF_TOKEN "
        "TOOL_CALL_PARSER TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_THRESHOLD "
        "TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_ALPHA".split(),
        "",
    ),
    "MODEL_NAME": "meta-llama/Llama-3.1-8B-Instruct",
}


def test_an_endpoint_moved_from_worker_vllm_boots_with_its_form_named_in_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """worker-vllm's form fills about 50 variables; the ones this worker does not have held their
    defaults, which change nothing here: one warning names them, and none is refused. What the two
    workers share keeps its meaning (MAX_NUM_SEQS=256 is 256 here too)."""
    with caplog.at_level(logging.WARNING, logger="worker.config"):
        settings = load_settings(WORKER_VLLM_ENDPOINT)
    assert (settings.max_num_seqs, settings.max_concurrency, settings.enable_prefix_caching) == (256, 300, False)
    assert settings.max_loras is None and settings.structured_outputs_backend == "xgrammar"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert messages[0].startswith("worker-vllm's form defaults change nothing here and are ignored: BASE_PATH=")
    assert all(f"{name}=" in messages[0] for name in ("BASE_PATH", "SWAP_SPACE", "WORKER_USE_RAY", "MAX_LORA_RANK"))


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        ({"SWAP_SPACE": "16"}, "SWAP_SPACE: vLLM 0.32 has no such setting"),
        ({"WORKER_USE_RAY": "true"}, "WORKER_USE_RAY: worker-vllm's Ray switches"),
        ({"TOKENIZER_POOL_SIZE": "4"}, "TOKENIZER_POOL_SIZE: vLLM 0.32 has no such setting"),
        ({"DEVICE": "cuda"}, "DEVICE: vLLM 0.32 takes the device from the build installed"),
        ({"MAX_LORAS": "4"}, "MAX_LORAS needs ENABLE_LORA=true"),
    ],
)
def test_a_worker_vllm_value_away_from_its_form_default_is_still_refused(env: dict[str, str], sentence: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert sentence in info.value.message


def test_the_lora_sizes_count_once_lora_is_on() -> None:
    settings = load_settings({"ENABLE_LORA": "true", "MAX_LORAS": "1", "MAX_LORA_RANK": "16"})
    assert (settings.max_loras, settings.max_lora_rank) == (1, 16)
    # "on" as the setting itself reads it: pydantic's words, not a list of the worker's own
    settings = load_settings({"ENABLE_LORA": "t", "MAX_LORAS": "1"})
    assert settings.enable_lora and settings.max_loras == 1


def test_guided_decoding_backend_is_the_structured_outputs_backend() -> None:
    """Another backend alone turns the compact-JSON default off; set beside it, it is refused."""
    settings = load_settings({"GUIDED_DECODING_BACKEND": "lm-format-enforcer"})
    assert settings.structured_outputs_backend == "lm-format-enforcer"
    assert settings.structured_outputs_disable_any_whitespace is False
    with pytest.raises(ConfigError, match="STRUCTURED_OUTPUTS_DISABLE_ANY_WHITESPACE needs"):
        load_settings({"STRUCTURED_OUTPUTS_BACKEND": "outlines", "STRUCTURED_OUTPUTS_DISABLE_ANY_WHITESPACE": "true"})


def test_a_blank_value_is_no_value() -> None:
    """A RunPod form's untouched field arrives blank; so does an image's baked draft an endpoint
    blanks out to turn speculation off."""
    settings = load_settings({"MAX_NUM_SEQS": "", "TOKENIZER": " ", "BASE_PATH": "", "MAX_MODEL_LEN": ""})
    assert settings.max_num_seqs is None and settings.tokenizer_name is None and settings.max_model_len is None
    off = load_settings({"SPECULATIVE_METHOD": "none", "SPECULATIVE_MODEL": "", "MODEL_NAME": "tiny:target"})
    assert off.resolved_speculative_config is None
    with pytest.raises(ConfigError, match="or set it empty, as over an image's baked draft"):
        load_settings({"SPECULATIVE_METHOD": "none", "SPECULATIVE_MODEL": "/models/draft"})
