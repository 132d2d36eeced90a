from pathlib import Path
from typing import Any, get_args

import pytest

from worker.boot.plan import build_plan
from worker.config import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    VLLM_SPECULATIVE_METHODS,
    Settings,
    drafts_with_model,
    is_on_runpod,
    load_settings,
    local_run_environment,
    num_api_servers,
    sdk_environment,
)
from worker.config.parsing import format_tokens_by_batch, parse_tokens_by_batch
from worker.errors import ConfigError
from worker.schema import Served


def test_defaults_select_smollm2_with_ngram() -> None:
    settings = load_settings({})
    assert settings.target_ref == settings.served_model_name == "smollm2:135m-instruct"
    assert settings.is_tiny_default  # an embedded model: the small KV cache and context, eager
    assert settings.resolved_speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 1,
    }
    # Named, the default model speculates only when asked, as any named model.
    named = load_settings({"MODEL_NAME": "smollm2:135m-instruct"})
    assert named.is_tiny_default and named.resolved_speculative_config is None


def test_speculation_can_be_switched_off_for_the_default_model() -> None:
    assert load_settings({"SPECULATIVE_METHOD": "none"}).resolved_speculative_config is None


def test_explicit_model_has_no_speculation_unless_asked() -> None:
    assert load_settings({"MODEL_NAME": "org/model"}).resolved_speculative_config is None


def test_simple_knobs_build_the_speculative_config() -> None:
    spec = load_settings(
        {"MODEL_NAME": "m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    ).resolved_speculative_config
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    spec = load_settings(
        {"MODEL_NAME": "m", "SPECULATIVE_MODEL": "d", "NUM_SPECULATIVE_TOKENS": "2"}
    ).resolved_speculative_config
    assert spec == {"method": "draft_model", "model": "d", "num_speculative_tokens": 2}


def test_simple_knobs_default_to_three_speculative_tokens() -> None:
    # The README's default k; vLLM itself has none for a method without a draft config.
    spec = load_settings({"MODEL_NAME": "m", "SPECULATIVE_METHOD": "ngram"}).resolved_speculative_config
    assert spec is not None and spec["num_speculative_tokens"] == DEFAULT_NUM_SPECULATIVE_TOKENS == 3
    spec = load_settings({"NUM_SPECULATIVE_TOKENS": "5"}).resolved_speculative_config
    assert spec is not None and spec["num_speculative_tokens"] == 5  # the tiny default's draft, k as given


def test_an_unknown_speculative_method_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"MODEL_NAME": "m", "SPECULATIVE_METHOD": "bogus"})
    message = info.value.message
    assert "SPECULATIVE_METHOD='bogus'" in message and "ngram" in message and "eagle3" in message
    assert "\n" not in message and "NUM_SPECULATIVE_TOKENS" not in message


def test_speculative_methods_are_vllms_own() -> None:
    from vllm.config.speculative import SpeculativeMethod

    def flatten(literal: Any) -> set[str]:
        return {n for arg in get_args(literal) for n in (flatten(arg) if get_args(arg) else {arg})}

    assert flatten(SpeculativeMethod) == VLLM_SPECULATIVE_METHODS


def test_speculative_config_json_is_passed_through() -> None:
    settings = load_settings({"SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "x", "num_speculative_tokens": 3}'})
    assert settings.resolved_speculative_config == {"method": "eagle3", "model": "x", "num_speculative_tokens": 3}


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MAX_MODEL_LEN": "abc"}, "MAX_MODEL_LEN"),
        ({"GPU_MEMORY_UTILIZATION": "1.5"}, "GPU_MEMORY_UTILIZATION"),
        ({"SPECULATIVE_CONFIG": "{not json"}, "SPECULATIVE_CONFIG"),
        ({"SPECULATIVE_CONFIG": "[1, 2]"}, "SPECULATIVE_CONFIG"),
        ({"SPECULATIVE_METHOD": "draft_model", "NUM_SPECULATIVE_TOKENS": "3"}, "SPECULATIVE_MODEL"),
        ({"SPECULATIVE_CONFIG": "{}", "SPECULATIVE_MODEL": "d"}, "SPECULATIVE_CONFIG"),
        ({"NUM_SPECULATIVE_TOKENS": "0"}, "NUM_SPECULATIVE_TOKENS"),
        ({"ENABLE_PREFIX_CACHING": "maybe"}, "ENABLE_PREFIX_CACHING"),
    ],
)
def test_bad_configuration_names_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert named in info.value.message
    assert "Traceback" not in info.value.message


def test_secrets_stay_out_of_repr() -> None:
    settings = load_settings({"HF_TOKEN": "hf_secret_value"})
    assert "hf_secret_value" not in repr(settings)


def test_environment_is_read_from_the_given_mapping_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_NAME", "from-process-env")
    assert load_settings({}).model_name is None
    assert load_settings().model_name == "from-process-env"


def test_is_on_runpod() -> None:
    assert is_on_runpod({"RUNPOD_WEBHOOK_GET_JOB": "https://api.runpod.ai/v2/x/job-take/$ID"})
    assert not is_on_runpod({})


@pytest.mark.parametrize(
    ("env", "is_draft"),
    [
        ({}, False),  # the default model: n-gram drafts
        ({"MODEL_NAME": "tiny:target", "SPECULATIVE_MODEL": "tiny:noisy"}, True),  # the tiny models' noisy copy
        ({"SPECULATIVE_METHOD": "none"}, False),
        ({"MODEL_NAME": "m", "SPECULATIVE_MODEL": "org/d", "NUM_SPECULATIVE_TOKENS": "2"}, True),
        (
            {
                "MODEL_NAME": "m",
                "SPECULATIVE_METHOD": "draft_model",
                "SPECULATIVE_MODEL": "org/d",
                "NUM_SPECULATIVE_TOKENS": "2",
            },
            True,
        ),
        ({"MODEL_NAME": "m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}, False),
        (
            {
                "MODEL_NAME": "m",
                "SPECULATIVE_METHOD": "eagle3",
                "SPECULATIVE_MODEL": "org/h",
                "NUM_SPECULATIVE_TOKENS": "3",
            },
            False,
        ),
        # vLLM infers draft_model from a model without a method ...
        ({"MODEL_NAME": "m", "SPECULATIVE_CONFIG": '{"model": "org/draft", "num_speculative_tokens": 4}'}, True),
        ({"MODEL_NAME": "m", "SPECULATIVE_CONFIG": '{"model": "tiny:noisy", "num_speculative_tokens": 3}'}, True),
        # ... except ngram, a proposer class path, or a name that marks an EAGLE head (even under draft_model)
        ({"MODEL_NAME": "m", "SPECULATIVE_CONFIG": '{"model": "ngram", "num_speculative_tokens": 4}'}, False),
        ({"MODEL_NAME": "m", "SPECULATIVE_CONFIG": '{"model": "pkg.MyProposer", "num_speculative_tokens": 4}'}, False),
        ({"MODEL_NAME": "m", "SPECULATIVE_CONFIG": '{"model": "org/EAGLE3-x", "num_speculative_tokens": 3}'}, False),
        (
            {
                "MODEL_NAME": "m",
                "SPECULATIVE_CONFIG": '{"method": "draft_model", "model": "y/EAGLE-LLaMA3", "num_speculative_tokens": 1}',  # noqa: E501
            },
            False,
        ),
        ({"MODEL_NAME": "m", "SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 4}'}, False),
        ({"MODEL_NAME": "m", "SPECULATIVE_CONFIG": '{"method": "mtp", "num_speculative_tokens": 1}'}, False),
    ],
)
def test_one_answer_to_is_this_a_draft_model(env: dict[str, str], is_draft: bool) -> None:
    settings = load_settings(env)
    assert drafts_with_model(settings.resolved_speculative_config) is is_draft
    assert (settings.draft_ref is not None) is is_draft


@pytest.mark.parametrize(
    ("env", "drafter"),
    [
        ({"MODEL_NAME": "m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "3"}, "ngram"),
        ({"MODEL_NAME": "m", "SPECULATIVE_METHOD": "eagle3", "SPECULATIVE_MODEL": "y/head"}, "eagle"),
        ({"MODEL_NAME": "m", "SPECULATIVE_MODEL": "y/EAGLE3-LLaMA3.1"}, "eagle"),
        ({"MODEL_NAME": "m", "SPECULATIVE_MODEL": "y/small"}, "draft_model"),
        ({"MODEL_NAME": "m", "SPECULATIVE_CONFIG": '{"method": "mtp", "num_speculative_tokens": 1}'}, "other"),
        ({"MODEL_NAME": "m"}, "other"),
        ({}, "ngram"),  # the default model speculates by n-gram
    ],
)
def test_the_settings_say_what_drafts(env: dict[str, str], drafter: str) -> None:
    assert load_settings(env).drafter == drafter


def test_the_drafts_revision_is_the_one_vllm_reads() -> None:
    spec = '{"model": "org/draft", "revision": "abc123", "num_speculative_tokens": 4}'
    settings = load_settings({"MODEL_NAME": "m", "MODEL_REVISION": "main", "SPECULATIVE_CONFIG": spec})
    draft = build_plan(settings, mode="serverless", is_cpu=True).draft
    assert settings.draft_ref == "org/draft" and draft is not None
    assert (draft.label, draft.revision) == ("org/draft", "abc123")


def test_a_rule_across_variables_is_stated_once() -> None:
    with pytest.raises(ConfigError) as error:
        load_settings({"SPECULATIVE_CONFIG": "{}", "SPECULATIVE_METHOD": "ngram"})
    assert error.value.message.startswith("invalid configuration: SPECULATIVE_CONFIG cannot be combined")
    assert "configuration: configuration" not in error.value.message


def test_the_sdk_logs_at_info_unless_told_otherwise() -> None:
    """At its default (DEBUG) the RunPod SDK prints every item a job yields: users' text in the logs."""
    assert sdk_environment({}) == {"RUNPOD_LOG_LEVEL": "INFO"}
    assert sdk_environment({"RUNPOD_LOG_LEVEL": "DEBUG"}) == {}
    assert sdk_environment({"RUNPOD_DEBUG_LEVEL": "WARN"}) == {}


def test_api_server_count_is_a_number_or_auto_from_the_host() -> None:
    auto = load_settings({})
    assert auto.api_server_count == "auto"
    assert num_api_servers(auto, num_cpus=16, has_gpu=True) == 2  # an H200 host: 16 cores
    assert num_api_servers(auto, num_cpus=4, has_gpu=True) == 1  # no cores to spare
    assert num_api_servers(auto, num_cpus=64, has_gpu=False) == 1  # a CPU engine needs the cores itself
    assert num_api_servers(load_settings({"API_SERVER_COUNT": "4"}), num_cpus=2, has_gpu=False) == 4
    for bad in ("0", "many", "65"):
        with pytest.raises(ConfigError) as info:
            load_settings({"API_SERVER_COUNT": bad})
        assert "API_SERVER_COUNT" in info.value.message


def test_every_setting_is_in_the_readmes_configuration_table_or_the_rest() -> None:
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    start = readme.index("## Configuration")
    tables = readme[start : readme.index("\n## ", start)] + (root / "docs" / "configuration.md").read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in tables]
    assert not missing, f"not in the README's configuration table nor docs/configuration.md: {missing}"


def test_speculative_tokens_by_batch_passes_vllms_schedule_through() -> None:
    env = {"MODEL_NAME": "m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    settings = load_settings({**env, "SPECULATIVE_TOKENS_BY_BATCH": "1-8:4, 9-64:2,65-256:0"})
    assert settings.speculative_tokens_by_batch == [(1, 8, 4), (9, 64, 2), (65, 256, 0)]
    spec = settings.resolved_speculative_config
    assert spec is not None
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 2], [65, 256, 0]]
    assert load_settings({**env, "SPECULATIVE_TOKENS_BY_BATCH": "1:2"}).speculative_tokens_by_batch == [(1, 1, 2)]
    assert load_settings({**env, "SPECULATIVE_TOKENS_BY_BATCH": " "}).speculative_tokens_by_batch is None


def test_a_schedule_is_shown_in_the_form_users_type() -> None:
    # The served block, /plan and the boot's line show SPECULATIVE_TOKENS_BY_BATCH's form, not vLLM's lists.
    for text in ("1-1:3", "1-8:4,9-64:2,65-256:0"):
        parsed = parse_tokens_by_batch(text)
        assert format_tokens_by_batch(parsed) == text
        assert format_tokens_by_batch([list(entry) for entry in parsed or []]) == text
    served = Served(
        model="m",
        quantization=None,
        speculative_method="ngram",
        num_speculative_tokens=3,
        speculation_control="auto",
        model_runner="v2",
        cudagraph_mode="FULL",
        torch_compile=False,
        speculative_tokens_by_batch=[[1, 1, 3], [2, 2, 0]],
        spec_decode_available=True,
    )
    assert served.model_dump(mode="json")["speculative_tokens_by_batch"] == "1-1:3,2-2:0"


@pytest.mark.parametrize(
    "schedule",
    ["1-8", "1-8:x", "a-b:1", "2-8:3", "8-1:2", "1-8:-1", "0-8:1", "1-8:2,5-9:1", "9-16:1,1-8:2", "1-8:5", ":"],
)
def test_a_bad_schedule_is_refused_in_one_sentence_naming_the_variable(schedule: str) -> None:
    env = {"MODEL_NAME": "m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    with pytest.raises(ConfigError) as info:
        load_settings({**env, "SPECULATIVE_TOKENS_BY_BATCH": schedule})
    message = info.value.message
    assert "SPECULATIVE_TOKENS_BY_BATCH" in message
    assert "\n" not in message and "Traceback" not in message


def test_a_schedule_needs_speculation() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"MODEL_NAME": "m", "SPECULATIVE_TOKENS_BY_BATCH": "1-8:2"})
    assert "SPECULATIVE_TOKENS_BY_BATCH needs speculative decoding" in info.value.message


def test_speculation_control_is_auto_or_static() -> None:
    assert load_settings({}).speculation_control is None  # unset: the boot picks (worker.speculation.decide)
    assert load_settings({"SPECULATION_CONTROL": "auto"}).speculation_control == "auto"
    with pytest.raises(ConfigError) as info:
        load_settings({"SPECULATION_CONTROL": "sometimes"})
    assert "SPECULATION_CONTROL" in info.value.message


def test_the_local_run_sends_vllms_logs_to_stderr_at_warning() -> None:
    # stdout carries the job's items; vLLM logs to stdout by default.
    assert local_run_environment({}, is_verbose=False) == {
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
        "TORCH_CPP_LOG_LEVEL": "ERROR",  # worker/quiet.py: torch's C++ warning of the CPU build
        "LOAD_PROGRESS": "false",  # vLLM's progress bar for the weights
    }
    assert local_run_environment({}, is_verbose=True) == {"VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    assert local_run_environment({"VLLM_LOGGING_STREAM": "ext://sys.stdout"}, is_verbose=True) == {}


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        ({"SPECULATIVE_METHOD": "eagle3"}, "SPECULATIVE_METHOD=eagle3 needs SPECULATIVE_MODEL"),
        ({"SPECULATIVE_CONFIG": '{"method": "eagle3", "num_speculative_tokens": 3}'}, 'method "eagle3" needs "model"'),
        ({"SPECULATIVE_CONFIG": '{"method": "ngram"}'}, 'n-gram needs "num_speculative_tokens"'),
    ],
)
def test_a_method_missing_its_part_is_named_before_vllm_talks_of_a_draft_model(
    env: dict[str, str], sentence: str
) -> None:
    # vLLM's own errors: "num_speculative_tokens was provided but without speculative model" (eagle3,
    # where the user set no k) and "... must be provided with speculative model" (n-gram, which has none).
    with pytest.raises(ConfigError) as info:
        load_settings({"MODEL_NAME": "m", **env})
    assert sentence in info.value.message and "speculative model" not in info.value.message


def test_an_unknown_tiny_model_is_a_configuration_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"MODEL_NAME": "tiny:nope"})
    assert "MODEL_NAME=tiny:nope is not an embedded tiny model; they are tiny:target" in info.value.message
    from worker.boot.models import resolver

    with pytest.raises(ConfigError, match="tiny:nope is not an embedded tiny model"):  # a LoRA module's path
        resolver(load_settings({}))("tiny:nope", None)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MODEL_RUNNER", "v1"),
        ("MODEL_RUNNER", "v2"),
        ("VLLM_USE_V2_MODEL_RUNNER", "0"),
        ("VLLM_USE_V2_MODEL_RUNNER", "x"),
    ],
)
def test_a_runner_choice_is_refused_in_one_sentence_saying_why(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({name: value})
    assert info.value.message == (
        f"invalid configuration: {name}={value}: vLLM 0.34, the image's, has only its V2 model runner, which the "
        "worker runs on every GPU (the CPU build runs its CPU runner): remove it"
    )


def test_a_runner_choice_that_asks_for_what_runs_is_accepted() -> None:
    # MODEL_RUNNER=auto, and vLLM 0.32's variable asking for V2 (which the boot plan itself writes
    # into the process environment where that vLLM runs on a GPU, and a second load must accept).
    for env in ({"MODEL_RUNNER": "auto"}, {"MODEL_RUNNER": "AUTO"}, {"VLLM_USE_V2_MODEL_RUNNER": "1"}):
        assert load_settings(env).torch_compile == "auto"
    assert "model_runner" not in Settings.model_fields and "vllm_use_v2_model_runner" not in Settings.model_fields
