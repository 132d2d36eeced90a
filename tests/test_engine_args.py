import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import CACHE_DIR
from worker.boot.engine_args import (
    FULL_GRAPHS_CONFIG,
    TINY_KV_CACHE_BYTES,
    TINY_MAX_MODEL_LEN,
    build_engine_kwargs,
    engine_environment,
    lora_slots,
)
from worker.boot.models import cached_snapshot, resolver
from worker.boot.plan import BootPlan, build_plan
from worker.config import DeploymentMode, load_settings
from worker.errors import ConfigError
from worker.speculation.config import auto_schedule, is_graph_schedule
from worker.tiny_models import TinyModels
from worker.vllm_internals.plugin import FULL_GRAPHS_ENV


def test_tiny_default() -> None:
    kwargs = build_engine_kwargs(load_settings({}))
    assert kwargs["model"] == "tiny:target"  # as named: the boot plan resolves it
    assert kwargs["max_model_len"] == TINY_MAX_MODEL_LEN
    assert kwargs["kv_cache_memory_bytes"] == TINY_KV_CACHE_BYTES
    assert kwargs["enforce_eager"] is True
    assert kwargs["speculative_config"]["model"] == "tiny:noisy"
    assert kwargs["per_request_spec_decode_metrics"] == "summary"


def test_vllms_metrics_are_labelled_with_the_served_model_name() -> None:
    assert build_engine_kwargs(load_settings({}))["served_model_name"] == "tiny:target"
    settings = load_settings({"MODEL_NAME": "/models/m", "OPENAI_SERVED_MODEL_NAME_OVERRIDE": "my-model"})
    assert build_engine_kwargs(settings)["served_model_name"] == "my-model"


def test_tiny_vision_serves_without_speculation_on_the_tiny_budget() -> None:
    """The embedded drafts are text-only Llamas: tiny:vision has none, unless one is configured."""
    settings = load_settings({"MODEL_NAME": "tiny:vision"})
    assert settings.resolved_speculative_config is None and settings.served_model_name == "tiny:vision"
    kwargs = build_engine_kwargs(settings)
    assert kwargs["model"] == "tiny:vision"
    assert "speculative_config" not in kwargs and "per_request_spec_decode_metrics" not in kwargs
    assert kwargs["enforce_eager"] is True and kwargs["max_model_len"] == TINY_MAX_MODEL_LEN


def test_real_model_keeps_vllm_defaults_and_checkpoint_quantization() -> None:
    kwargs = build_engine_kwargs(load_settings({"MODEL_NAME": "org/m"}))
    assert kwargs["model"] == "org/m"
    for unset in ("quantization", "max_model_len", "kv_cache_memory_bytes", "max_num_seqs", "speculative_config"):
        assert unset not in kwargs
    assert kwargs["enforce_eager"] is False
    assert kwargs["enable_prefix_caching"] is True


def test_settings_are_mapped() -> None:
    kwargs = build_engine_kwargs(
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
    assert kwargs["speculative_config"]["method"] == "ngram"
    assert kwargs["speculative_config"]["num_speculative_tokens"] == 5


def test_stream_interval_is_vllms_default_unless_set() -> None:
    assert build_engine_kwargs(load_settings({}))["stream_interval"] == 1
    assert build_engine_kwargs(load_settings({"STREAM_INTERVAL": "8"}))["stream_interval"] == 8


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
    kwargs = build_engine_kwargs(settings)
    assert kwargs["max_num_seqs"] == 3 and kwargs["scheduling_policy"] == "priority"
    assert boot.build_args(build_plan(settings, mode="serverless")).max_num_seqs == 3
    with pytest.raises(EngineBootError, match="max_num_seqz: not a vLLM engine argument"):
        boot.build_args(build_plan(load_settings({"ENGINE_ARGS": '{"max_num_seqz": 3}'}), mode="serverless"))


def test_engine_environment_picks_the_awq_kernel_per_mode_and_keeps_the_users_list() -> None:
    def disabled(mode: DeploymentMode, **env: str) -> str | None:
        return engine_environment(load_settings(env), mode=mode)["VLLM_DISABLED_KERNELS"]

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


def test_engine_environment_picks_the_model_runner_per_mode_and_speculation() -> None:
    def flag(mode: DeploymentMode, **env: str) -> str | None:
        return engine_environment(load_settings(env), mode=mode)["VLLM_USE_V2_MODEL_RUNNER"]

    real = {"MODEL_NAME": "org/model"}  # not the tiny default, which drafts with a noisy copy
    assert flag("serverless", **real) == "0"  # V1: a shorter boot, equal single-stream decode
    assert flag("pod", **real) is None  # vLLM's default (V2) for large batches
    draft = {**real, "SPECULATIVE_MODEL": "org/draft", "NUM_SPECULATIVE_TOKENS": "4"}
    assert flag("pod", **draft) == "0"  # V2 runs a draft model without CUDA graphs
    # The same draft through vLLM's JSON, with the method left for vLLM to infer.
    assert flag("pod", **real, SPECULATIVE_CONFIG='{"model": "org/draft", "num_speculative_tokens": 4}') == "0"
    eagle = {**real, "SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "o/h", "num_speculative_tokens": 3}'}
    ngram_static = {
        **real,
        "SPECULATIVE_METHOD": "ngram",
        "NUM_SPECULATIVE_TOKENS": "4",
        "SPECULATION_CONTROL": "static",
    }
    assert flag("pod", **eagle, SPECULATION_CONTROL="static") is None and flag("pod", **ngram_static) is None
    assert flag("serverless", **eagle) == "0" and flag("serverless", **ngram_static) == "0"
    assert flag("serverless", **real, MODEL_RUNNER="v2") == "1"
    assert flag("pod", **real, MODEL_RUNNER="v1") == "0"
    # Under auto, vLLM's own variable set by the user is kept; MODEL_RUNNER set explicitly wins.
    assert flag("serverless", **real, VLLM_USE_V2_MODEL_RUNNER="1") == "1"
    assert flag("pod", **real, VLLM_USE_V2_MODEL_RUNNER="0", MODEL_RUNNER="v2") == "1"
    # n-gram and EAGLE heads under SPECULATION_CONTROL=auto (a pod's default for n-gram): V2, which keeps the target's
    # full CUDA graphs under a batch-size schedule (V1 turns them piecewise); a draft model stays on V1 even so.
    ngram = {**real, "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4", "SPECULATION_CONTROL": "auto"}
    assert flag("serverless", **ngram) == "1" and flag("pod", **ngram) == "1"
    assert flag("serverless", **eagle, SPECULATION_CONTROL="auto") == "1" and flag("pod", **eagle) is None
    assert flag("pod", **real, SPECULATIVE_METHOD="ngram", NUM_SPECULATIVE_TOKENS="4") == "1"
    assert flag("serverless", **ngram, MODEL_RUNNER="v1") == "0"
    assert flag("serverless", **draft, SPECULATION_CONTROL="auto") == "0"
    # n-gram as vLLM infers it (no method, the model "ngram"), and its GPU variant: the same.
    for config in (
        '{"model": "ngram", "num_speculative_tokens": 4}',
        '{"method": "ngram_gpu", "num_speculative_tokens": 4}',
    ):
        assert flag("serverless", **real, SPECULATIVE_CONFIG=config, SPECULATION_CONTROL="auto") == "1"
    # Not on the CPU build (its V2 runner needs Triton), nor eager (no graphs to keep).
    on_cpu = engine_environment(load_settings(ngram), mode="serverless", is_cpu=True)["VLLM_USE_V2_MODEL_RUNNER"]
    assert on_cpu == "0"
    assert flag("serverless", **ngram, ENFORCE_EAGER="true") == "0"
    assert flag("serverless", **ngram, CUDAGRAPH_MODE="PIECEWISE") == "0"
    assert flag("serverless", **ngram, ENGINE_ARGS='{"enforce_eager": true}') == "0"
    tiny = {"SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4", "SPECULATION_CONTROL": "auto"}
    assert flag("serverless", **tiny) == "0"  # the tiny default runs eager


def test_engine_environment_spawns_the_pods_engine_core_unless_told() -> None:
    def method(mode: DeploymentMode, **env: str) -> str | None:
        return engine_environment(load_settings(env), mode=mode)["VLLM_WORKER_MULTIPROC_METHOD"]

    assert method("pod") == "spawn"  # as vLLM's own server starts its engine core
    assert method("serverless") == "fork"  # no re-import at boot (vLLM's CPU platform would spawn)
    assert method("pod", VLLM_WORKER_MULTIPROC_METHOD="fork") == "fork"
    assert method("serverless", VLLM_WORKER_MULTIPROC_METHOD="spawn") == "spawn"


def test_engine_environment_turns_vllms_startup_plan_on_unless_told() -> None:
    def plan(**env: str) -> str | None:
        return engine_environment(load_settings(env), mode="serverless")["VLLM_ENABLE_STARTUP_PLAN"]

    assert plan() == "1"
    assert plan(VLLM_ENABLE_STARTUP_PLAN="false") == plan(VLLM_ENABLE_STARTUP_PLAN="0") == "0"  # vLLM reads an int
    assert plan(VLLM_ENABLE_STARTUP_PLAN="1") == "1"


def test_engine_environment_keeps_tritons_cache_beside_vllms_compile_cache() -> None:
    def triton(**env: str) -> str | None:
        return engine_environment(load_settings(env), mode="serverless")["TRITON_CACHE_DIR"]

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
    assert build_engine_kwargs(one, is_cpu=True)["max_loras"] == 2


def test_auto_speculation_control_gives_vllm_a_schedule_to_answer() -> None:
    # vLLM changes k per step only with a batch-size schedule: auto adds one range (the configured
    # k, carried to every batch size) unless the user gave one; static leaves the config alone.
    def spec_for(**env: str) -> Any:
        return build_engine_kwargs(load_settings(env))["speculative_config"]

    assert spec_for(SPECULATION_CONTROL="auto")["num_speculative_tokens_per_batch_size"] == [[1, 1, 3]]
    # On the V2 runner the worker chose (n-gram under auto) graphs exist only for the schedule's k
    # values: every k from the configured one to 0, which the controller reads as a list, not a ceiling.
    ngram = {"MODEL_NAME": "org/m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    on_v2 = build_engine_kwargs(load_settings({**ngram, "SPECULATION_CONTROL": "auto"}), is_cpu=False)
    every_k = [[1, 1, 4], [2, 2, 3], [3, 3, 2], [4, 4, 1], [5, 5, 0]]
    assert on_v2["speculative_config"]["num_speculative_tokens_per_batch_size"] == every_k
    # V2 drafts both n-gram names on the GPU; vLLM keeps async scheduling for ngram_gpu only.
    assert on_v2["speculative_config"]["method"] == "ngram_gpu"
    assert is_graph_schedule(every_k, 4) and is_graph_schedule([tuple(e) for e in every_k], 4)
    assert not is_graph_schedule(every_k, 3) and not is_graph_schedule([[1, 4, 3], [5, 256, 1]], 3)
    on_cpu = build_engine_kwargs(load_settings({**ngram, "SPECULATION_CONTROL": "auto"}), is_cpu=True)
    assert on_cpu["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 4]]
    assert on_cpu["speculative_config"]["method"] == "ngram"  # V1: its CPU proposer, as asked
    # n-gram named by its model, V2 chosen by the user: ngram_gpu (the model key goes); not on a CPU.
    by_model = {"MODEL_NAME": "org/m", "SPECULATIVE_CONFIG": '{"model": "ngram", "num_speculative_tokens": 2}'}
    v2 = build_engine_kwargs(load_settings({**by_model, "MODEL_RUNNER": "v2"}), is_cpu=False)["speculative_config"]
    # (with V2 chosen, SPECULATION_CONTROL's default is auto: the schedule of every k)
    assert v2 == {
        "method": "ngram_gpu",
        "num_speculative_tokens": 2,
        "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 2, 1], [3, 3, 0]],
    }
    cpu = build_engine_kwargs(load_settings({**by_model, "MODEL_RUNNER": "v2"}), is_cpu=True)["speculative_config"]
    assert cpu == {"model": "ngram", "num_speculative_tokens": 2}
    # Without the worker's scheduler no controller reads the list of k values: one k, as vLLM would run it.
    for off in ({"PER_REQUEST_SPEC_DECODE_METRICS": "none"}, {"ENGINE_ARGS": '{"scheduler_cls": "my.Sched"}'}):
        uncontrolled = build_engine_kwargs(load_settings({**ngram, "SPECULATION_CONTROL": "auto", **off}), is_cpu=False)
        assert uncontrolled["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 4]]
    # An EAGLE head under auto runs on the V2 the worker chose, pod or serverless: every k, like n-gram.
    eagle = {
        "MODEL_NAME": "org/m",
        "SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "o/h", "num_speculative_tokens": 2}',
    }
    for mode in ("pod", "serverless"):
        head = build_engine_kwargs(load_settings({**eagle, "SPECULATION_CONTROL": "auto"}), mode=mode)[
            "speculative_config"
        ]
        assert head["num_speculative_tokens_per_batch_size"] == [[1, 1, 2], [2, 2, 1], [3, 3, 0]]
        assert head["method"] == "eagle3"
    # A runner the user gave V2 without the worker's controller keeps one k, as vLLM would run it.
    users_v2 = {
        **eagle,
        "SPECULATION_CONTROL": "auto",
        "VLLM_USE_V2_MODEL_RUNNER": "1",
        "PER_REQUEST_SPEC_DECODE_METRICS": "none",
    }
    assert build_engine_kwargs(load_settings(users_v2))["speculative_config"][
        "num_speculative_tokens_per_batch_size"
    ] == [[1, 1, 2]]
    assert auto_schedule(1, on_v2=True) == [[1, 1, 1], [2, 2, 0]] and auto_schedule(3, on_v2=False) == [[1, 1, 3]]
    assert "num_speculative_tokens_per_batch_size" not in spec_for(SPECULATION_CONTROL="static")
    given = spec_for(SPECULATION_CONTROL="auto", SPECULATIVE_TOKENS_BY_BATCH="1-4:3,5-256:1")
    assert given["num_speculative_tokens_per_batch_size"] == [[1, 4, 3], [5, 256, 1]]


def test_serverless_captures_only_the_cuda_graphs_its_traffic_runs() -> None:
    def graphs(mode: DeploymentMode, **env: str) -> dict[str, object] | None:
        settings = load_settings({"MODEL_NAME": "org/m", **env})
        return build_engine_kwargs(settings, mode=mode).get("compilation_config")

    # vLLM's own mode (FULL_AND_PIECEWISE) in both modes: FULL_DECODE_ONLY decoded slower.
    assert graphs("serverless") is None
    assert graphs("pod") is None  # vLLM's own sizes too (from max_num_seqs)
    # Under vLLM's mode the capture sizes (tokens) serve its piecewise graphs too: no cap from MAX_CONCURRENCY.
    assert graphs("serverless", MAX_CONCURRENCY="8") is None
    # Without piecewise graphs MAX_CONCURRENCY bounds the serverless decode batch; with speculation a
    # step is 1 + k tokens a sequence (vLLM's own sizes); pods keep vLLM's.
    decode_only = {"CUDAGRAPH_MODE": "FULL_DECODE_ONLY", "MAX_CONCURRENCY": "8"}
    capped = {"cudagraph_mode": "FULL_DECODE_ONLY", "max_cudagraph_capture_size": 8}
    assert graphs("serverless", **decode_only) == capped
    ngram = {"SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    assert graphs("serverless", **decode_only, **ngram) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert graphs("pod", **decode_only) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert graphs("serverless", CUDAGRAPH_MODE="FULL_DECODE_ONLY") == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    explicit = {"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 32}
    for mode in ("serverless", "pod"):
        assert graphs(mode, CUDAGRAPH_MODE="FULL_AND_PIECEWISE", MAX_CUDAGRAPH_CAPTURE_SIZE="32") == explicit
    # n-gram under auto on V2 (a pod's default for n-gram, or auto asked for): FULL, a full graph for
    # steps that carry prompts too, up to 1,024 tokens unless the user caps it.
    full = {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 1024}
    assert graphs("pod", **ngram) == full
    assert graphs("serverless", **ngram, SPECULATION_CONTROL="auto") == full
    assert graphs("pod", **ngram, MAX_CUDAGRAPH_CAPTURE_SIZE="512") == {**full, "max_cudagraph_capture_size": 512}
    # Not under static control, on V1, for an EAGLE head (its graphs under FULL not measured), or a mode
    # the user chose; serverless n-gram is static by default.
    assert graphs("serverless", **ngram) is None and graphs("pod", **ngram, SPECULATION_CONTROL="static") is None
    assert graphs("pod", **ngram, SPECULATION_CONTROL="auto", MODEL_RUNNER="v1") is None
    head = '{"method": "eagle3", "model": "o/h", "num_speculative_tokens": 3}'
    assert graphs("pod", SPECULATIVE_CONFIG=head, SPECULATION_CONTROL="auto") is None
    assert graphs("pod", **ngram, CUDAGRAPH_MODE="FULL_AND_PIECEWISE") == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    # V2 chosen by the user makes auto n-gram's default there too; without the worker's controller, vLLM's mode.
    assert graphs("serverless", **ngram, MODEL_RUNNER="v2") == full
    assert graphs("serverless", **ngram, VLLM_USE_V2_MODEL_RUNNER="1") == full
    for off in ({"PER_REQUEST_SPEC_DECODE_METRICS": "none"}, {"ENGINE_ARGS": '{"scheduler_cls": "my.Sched"}'}):
        assert graphs("pod", **ngram, SPECULATION_CONTROL="auto", **off) is None
    # The plan tells the worker's vLLM plugin that FULL is the worker's choice (worker/vllm_internals/plugin.py).
    marker: dict[DeploymentMode, str | None] = {"pod": "1", "serverless": None}
    for mode, value in marker.items():
        environment = engine_environment(load_settings({"MODEL_NAME": "org/m", **ngram}), mode=mode)
        assert environment[FULL_GRAPHS_ENV] == value
    on_cpu = engine_environment(load_settings({"MODEL_NAME": "org/m", **ngram}), mode="pod", is_cpu=True)
    assert on_cpu[FULL_GRAPHS_ENV] is None
    chosen = load_settings({"MODEL_NAME": "org/m", **ngram, "CUDAGRAPH_MODE": "FULL"})
    assert engine_environment(chosen, mode="pod")[FULL_GRAPHS_ENV] is None  # the user's FULL: vLLM's rules
    # ...and marks vLLM's config, whose hash keys the startup plan and the compile cache vLLM reuses.
    for mode, value in marker.items():
        kwargs = build_engine_kwargs(load_settings({"MODEL_NAME": "org/m", **ngram}), mode=mode)
        assert kwargs.get("additional_config") == (FULL_GRAPHS_CONFIG if value else None)
    assert "additional_config" not in build_engine_kwargs(chosen, mode="pod")
    on_cpu_kwargs = build_engine_kwargs(load_settings({"MODEL_NAME": "org/m", **ngram}), mode="pod", is_cpu=True)
    assert "additional_config" not in on_cpu_kwargs
    # Eager engines capture nothing; ENGINE_ARGS has the last word.
    assert graphs("serverless", ENFORCE_EAGER="true", CUDAGRAPH_MODE="FULL_DECODE_ONLY") is None
    assert graphs("pod", **ngram, ENFORCE_EAGER="true") is None
    assert build_engine_kwargs(load_settings({})).get("compilation_config") is None
    assert build_engine_kwargs(load_settings({"MODEL_NAME": "org/m"}), is_cpu=True).get("compilation_config") is None
    escape = '{"compilation_config": {"cudagraph_mode": "NONE"}}'
    assert graphs("serverless", ENGINE_ARGS=escape) == {"cudagraph_mode": "NONE"}
    with pytest.raises(ConfigError, match=r"^invalid configuration: CUDAGRAPH_MODE: Input should be 'auto'"):
        load_settings({"CUDAGRAPH_MODE": "FULL_DECODE"})


def test_the_cuda_graph_settings_reach_vllms_compilation_config() -> None:
    # GPU-only settings (the CPU build runs eager): vLLM's own engine arguments take what the
    # worker builds for a GPU and turn it into its CompilationConfig.
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CUDAGraphMode
    from vllm.engine.arg_utils import AsyncEngineArgs

    settings = load_settings({"MODEL_NAME": "org/m", "MAX_CONCURRENCY": "16", "CUDAGRAPH_MODE": "FULL_DECODE_ONLY"})
    kwargs = build_engine_kwargs(settings, mode="serverless")
    config = AsyncEngineArgs(**kwargs).compilation_config
    config = config if isinstance(config, CompilationConfig) else CompilationConfig(**config)
    assert config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert config.max_cudagraph_capture_size == 16
    ngram = {"MODEL_NAME": "org/m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    config = AsyncEngineArgs(**build_engine_kwargs(load_settings(ngram), mode="pod")).compilation_config
    config = config if isinstance(config, CompilationConfig) else CompilationConfig(**config)
    assert config.cudagraph_mode == CUDAGraphMode.FULL and config.max_cudagraph_capture_size == 1024
