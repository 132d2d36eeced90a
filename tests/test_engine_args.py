import os
from pathlib import Path

import pytest

from tests.helpers import CACHE_DIR, engine_env, engine_kwargs
from worker.boot.engine_args import TINY_KV_CACHE_BYTES, TINY_MAX_MODEL_LEN, lora_slots
from worker.boot.models import cached_snapshot, resolver
from worker.boot.plan import BootPlan, build_plan
from worker.config import DeploymentMode, load_settings
from worker.tiny_models import TinyModels


def test_tiny_default() -> None:
    settings = load_settings({"MODEL_NAME": "tiny:target", "SPECULATIVE_MODEL": "tiny:noisy"})
    kwargs = engine_kwargs(settings, is_cpu=True)
    assert kwargs["model"] == "tiny:target"  # as named: the boot plan resolves it
    assert kwargs["max_model_len"] == TINY_MAX_MODEL_LEN
    assert kwargs["kv_cache_memory_bytes"] == TINY_KV_CACHE_BYTES
    assert kwargs["enforce_eager"] is True  # eager on the CPU build only: CUDA graphs on a GPU
    assert engine_kwargs(settings)["enforce_eager"] is False
    assert kwargs["speculative_config"]["model"] == "tiny:noisy"
    assert kwargs["per_request_spec_decode_metrics"] == "summary"


def test_the_default_model_gets_the_embedded_budget() -> None:
    """SmolLM2 (135M) boots on a CPU with the tiny models' KV cache and context: without a KV cache
    size vLLM's CPU build sizes it from the host's memory, which makes the boot several times longer."""
    kwargs = engine_kwargs(load_settings({}), is_cpu=True)
    assert kwargs["model"] == "smollm2:135m-instruct"  # as named: the boot plan converts and resolves it
    assert kwargs["max_model_len"] == TINY_MAX_MODEL_LEN
    assert kwargs["kv_cache_memory_bytes"] == TINY_KV_CACHE_BYTES
    assert kwargs["enforce_eager"] is True
    assert kwargs["speculative_config"]["method"] == "ngram"


def test_vllms_metrics_are_labelled_with_the_served_model_name() -> None:
    assert engine_kwargs(load_settings({}))["served_model_name"] == "smollm2:135m-instruct"
    settings = load_settings({"MODEL_NAME": "/models/m", "OPENAI_SERVED_MODEL_NAME_OVERRIDE": "my-model"})
    assert engine_kwargs(settings)["served_model_name"] == "my-model"


def test_tiny_vision_serves_without_speculation_on_the_tiny_budget() -> None:
    """The embedded drafts are text-only Llamas: tiny:vision has none, unless one is configured."""
    settings = load_settings({"MODEL_NAME": "tiny:vision"})
    assert settings.resolved_speculative_config is None and settings.served_model_name == "tiny:vision"
    kwargs = engine_kwargs(settings, is_cpu=True)
    assert kwargs["model"] == "tiny:vision"
    assert "speculative_config" not in kwargs and "per_request_spec_decode_metrics" not in kwargs
    assert kwargs["enforce_eager"] is True and kwargs["max_model_len"] == TINY_MAX_MODEL_LEN


def test_real_model_keeps_vllm_defaults_and_checkpoint_quantization() -> None:
    kwargs = engine_kwargs(load_settings({"MODEL_NAME": "org/m"}))
    assert kwargs["model"] == "org/m"
    for unset in ("quantization", "max_model_len", "kv_cache_memory_bytes", "max_num_seqs", "speculative_config"):
        assert unset not in kwargs
    assert kwargs["enforce_eager"] is False
    assert kwargs["enable_prefix_caching"] is True


def test_settings_are_mapped() -> None:
    kwargs = engine_kwargs(
        load_settings(
            {
                "MODEL_NAME": "org/m",
                "QUANTIZATION": "awq_marlin",
                "KV_CACHE_DTYPE": "fp8",
                "MAX_NUM_SEQS": "64",
                "TENSOR_PARALLEL_SIZE": "2",
                "ENABLE_PREFIX_CACHING": "false",
                "MAX_MODEL_LEN": "8192",
                "SPECULATIVE_METHOD": "ngram",
                "NUM_SPECULATIVE_TOKENS": "5",
            }
        ),
    )
    assert kwargs["quantization"] == "awq_marlin"
    assert kwargs["kv_cache_dtype"] == "fp8"
    assert kwargs["max_num_seqs"] == 64
    assert kwargs["tensor_parallel_size"] == 2
    assert kwargs["enable_prefix_caching"] is False
    assert kwargs["max_model_len"] == 8192
    assert kwargs["speculative_config"]["method"] == "ngram_gpu"  # n-gram on a GPU (V2): its async-scheduled name
    assert kwargs["speculative_config"]["num_speculative_tokens"] == 5


def test_stream_interval_is_vllms_default_unless_set() -> None:
    assert engine_kwargs(load_settings({}))["stream_interval"] == 1
    assert engine_kwargs(load_settings({"STREAM_INTERVAL": "8"}))["stream_interval"] == 8


def fake_cache(root: Path, ref: str, *, commits: list[str], main: str | None) -> Path:
    repo = root / ("models--" + ref.replace("/", "--"))
    for commit in commits:
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
    if main is not None:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(main + "\n")
    return repo / "snapshots"


def test_runpod_model_cache_lookup(tmp_path: Path) -> None:
    snapshots = fake_cache(tmp_path, "org/model", commits=["aaa", "bbb"], main="bbb")
    assert cached_snapshot("org/model", revision=None, cache_dir=tmp_path) == snapshots / "bbb"
    assert cached_snapshot("org/model", revision="aaa", cache_dir=tmp_path) == snapshots / "aaa"
    assert cached_snapshot("org/model", revision="ccc", cache_dir=tmp_path) is None  # not cached: download
    assert cached_snapshot("org/other", revision=None, cache_dir=tmp_path) is None
    assert cached_snapshot("/abs/path", revision=None, cache_dir=tmp_path) is None
    only = fake_cache(tmp_path, "org/single", commits=["ccc"], main=None)
    assert cached_snapshot("org/single", revision=None, cache_dir=tmp_path) == only / "ccc"
    (only / "ccc" / "config.json").unlink()  # an incomplete snapshot does not count
    assert cached_snapshot("org/single", revision=None, cache_dir=tmp_path) is None
    # Each reference at its own revision, as vLLM reads them: the target's, its tokenizer's (else the
    # target's), the draft's (the speculative config's field), from the settings or ENGINE_ARGS.
    env = {"RUNPOD_MODEL_CACHE_DIR": str(tmp_path), "MODEL_NAME": "org/model", "MODEL_REVISION": "aaa"}

    def plan(**more: str) -> BootPlan:
        return build_plan(load_settings({**env, **more}), mode="serverless", is_cpu=True)

    self_draft = plan(SPECULATIVE_CONFIG='{"model": "org/model", "revision": "bbb", "num_speculative_tokens": 2}')
    assert self_draft.target.path == str(snapshots / "aaa") and self_draft.target.revision == "aaa"
    assert self_draft.draft is not None and self_draft.draft.path == str(snapshots / "bbb")
    draft = fake_cache(tmp_path, "org/draft", commits=["ddd", "eee"], main="eee")
    other = plan(SPECULATIVE_CONFIG='{"model": "org/draft", "revision": "ddd", "num_speculative_tokens": 2}')
    assert other.engine_kwargs["speculative_config"]["model"] == str(draft / "ddd")
    assert other.draft is not None and (other.draft.label, other.draft.revision) == ("org/draft", "ddd")
    tokenizer = plan(TOKENIZER_NAME="org/model", TOKENIZER_REVISION="bbb").engine_kwargs
    assert (tokenizer["model"], tokenizer["tokenizer"]) == (str(snapshots / "aaa"), str(snapshots / "bbb"))
    assert plan(TOKENIZER_NAME="org/model").engine_kwargs["tokenizer"] == str(snapshots / "aaa")
    escape = plan(ENGINE_ARGS='{"revision": "bbb"}')
    assert escape.target.path == str(snapshots / "bbb") and escape.target.revision == "bbb"
    assert resolver(load_settings(env))("org/model", "ccc") == "org/model"  # not cached: vLLM downloads it


def test_engine_args_escape_hatch_is_applied_last_and_checked_against_vllm(tiny_models: TinyModels) -> None:
    from worker.boot import launch as boot
    from worker.errors import EngineBootError

    escape = '{"max_num_seqs": 3, "scheduling_policy": "priority"}'
    settings = load_settings({"MAX_NUM_SEQS": "8", "ENGINE_ARGS": escape})
    kwargs = engine_kwargs(settings)
    assert kwargs["max_num_seqs"] == 3 and kwargs["scheduling_policy"] == "priority"
    assert boot.build_args(build_plan(settings, mode="serverless")).max_num_seqs == 3
    with pytest.raises(EngineBootError, match="max_num_seqz: not a vLLM engine argument"):
        boot.build_args(build_plan(load_settings({"ENGINE_ARGS": '{"max_num_seqz": 3}'}), mode="serverless"))


def test_engine_environment_picks_the_awq_kernel_per_mode_and_keeps_the_users_list() -> None:
    def disabled(mode: DeploymentMode, **env: str) -> str | None:
        return engine_env(load_settings(env), mode=mode)["VLLM_DISABLED_KERNELS"]

    assert disabled("serverless") == "MacheteLinearKernel"  # Marlin for small batches
    assert disabled("pod") is None  # Machete, vLLM's own default on Hopper, for large batches
    assert disabled("pod", AWQ_KERNEL="marlin") == "MacheteLinearKernel"
    assert disabled("serverless", AWQ_KERNEL="machete") is None
    # The user's own list is kept, and Machete is removed from it or added to it as chosen.
    assert disabled("pod", VLLM_DISABLED_KERNELS="CutlassFP8ScaledMMLinearKernel,MacheteLinearKernel") == (
        "CutlassFP8ScaledMMLinearKernel"
    )
    assert disabled("serverless", VLLM_DISABLED_KERNELS="CutlassFP8ScaledMMLinearKernel") == (
        "CutlassFP8ScaledMMLinearKernel,MacheteLinearKernel"
    )


def test_engine_environment_spawns_the_pods_engine_core_unless_told() -> None:
    def method(mode: DeploymentMode, **env: str) -> str | None:
        return engine_env(load_settings(env), mode=mode)["VLLM_WORKER_MULTIPROC_METHOD"]

    assert method("pod") == "spawn"  # as vLLM's own server starts its engine core
    assert method("serverless") == "fork"  # no re-import at boot (vLLM's CPU platform would spawn)
    assert method("pod", VLLM_WORKER_MULTIPROC_METHOD="fork") == "fork"
    assert method("serverless", VLLM_WORKER_MULTIPROC_METHOD="spawn") == "spawn"


def test_engine_environment_turns_vllms_startup_plan_on_unless_told() -> None:
    def plan(**env: str) -> str | None:
        return engine_env(load_settings(env), mode="serverless")["VLLM_ENABLE_STARTUP_PLAN"]

    assert plan() == "1"
    assert plan(VLLM_ENABLE_STARTUP_PLAN="false") == plan(VLLM_ENABLE_STARTUP_PLAN="0") == "0"  # vLLM reads an int
    assert plan(VLLM_ENABLE_STARTUP_PLAN="1") == "1"


def test_engine_environment_keeps_tritons_cache_beside_vllms_compile_cache() -> None:
    def triton(**env: str) -> str | None:
        return engine_env(load_settings(env), mode="serverless")["TRITON_CACHE_DIR"]

    assert triton(VLLM_CACHE_ROOT="/runpod-volume/vllm-cache") == "/runpod-volume/vllm-cache/triton_cache"
    assert triton(VLLM_CACHE_ROOT="/v", TRITON_CACHE_DIR="/elsewhere") == "/elsewhere"
    assert triton() is None  # neither set: Triton's default, beside vLLM's default cache


def test_a_pod_takes_vllms_server_defaults_and_serverless_the_librarys(
    tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM's defaults by usage context as it sets them on an H100 / H200 (on CPU the two
    # contexts happen to agree, so they are what vLLM returns there, put in place here).
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    from worker.boot import launch as boot

    h200 = (
        {UsageContext.LLM_CLASS: 16384, UsageContext.OPENAI_API_SERVER: 8192},
        {UsageContext.LLM_CLASS: 1024, UsageContext.OPENAI_API_SERVER: 1024},
    )
    monkeypatch.setattr(EngineArgs, "get_batch_defaults", classmethod(lambda cls, world_size: h200))

    def scheduler(mode: DeploymentMode, **env: str) -> tuple[int, int]:
        settings = load_settings({"WORKER_CACHE_DIR": str(CACHE_DIR), **env})
        config = boot.build_config(build_plan(settings, mode=mode)).scheduler_config
        return config.max_num_batched_tokens, config.max_num_seqs

    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "unset by the test")
    assert scheduler("pod") == (8192, 1024)  # what `vllm serve` would run
    # vLLM's CPU platform sets spawn while it builds the config; the plan's own choice is put back.
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert scheduler("serverless") == (2048, 128)  # MAX_CONCURRENCY follows max_num_seqs
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert scheduler("pod", MAX_NUM_SEQS="16", MAX_NUM_BATCHED_TOKENS="4096") == (4096, 16)
    assert scheduler("serverless", VLLM_WORKER_MULTIPROC_METHOD="spawn") == (2048, 128)
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_a_value_vllms_config_refuses_names_the_variable_that_set_it() -> None:
    from worker.boot import launch as boot
    from worker.errors import EngineBootError

    settings = load_settings({"DTYPE": "float64x", "WORKER_CACHE_DIR": str(CACHE_DIR)})
    with pytest.raises(EngineBootError) as error:
        boot.create_engine(build_plan(settings, mode="serverless"))
    assert error.value.message.startswith("invalid engine configuration: DTYPE: Input should be 'auto'")
    assert "validation error" not in error.value.message and "\n" not in error.value.message


def test_lora_slots_keep_the_last_one_empty_on_cpu_only() -> None:
    """vLLM's CPU LoRA ops read slot -1 (the last) for tokens without an adapter."""
    one = load_settings({"ENABLE_LORA": "true", "LORA_MODULES": "a=tiny:lora"})
    three = load_settings({"ENABLE_LORA": "true", "LORA_MODULES": "a=x b=y c=z", "MAX_LORAS": "2"})
    assert lora_slots(one, is_cpu=False) is None and lora_slots(three, is_cpu=False) == 2
    assert lora_slots(one, is_cpu=True) == 2 and lora_slots(three, is_cpu=True) == 4
    assert lora_slots(load_settings({}), is_cpu=True) is None
    assert engine_kwargs(one, is_cpu=True)["max_loras"] == 2
