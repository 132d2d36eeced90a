"""Names in the environment that are not settings: worker-vllm's are accepted as aliases or refused
with a migration sentence, the worker's own misspelt get one warning naming the closest setting,
and everybody else's are left alone. Settings that have no effect under the others are refused."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from worker.config import Settings, load_settings
from worker.config.environment import ALIASES, OTHERS_PREFIXES, WORKER_PREFIXES, WORKER_VLLM, review
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
            assert name.lower() in engine_args, name
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
