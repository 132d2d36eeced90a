"""What speculation and CUDA graphs an engine gets, decided once (worker/speculation/decide.py): the
control, the model runner, the graph mode and capture size, vLLM's speculative config; settings only."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helpers import ROOT, engine_env, engine_kwargs
from worker.boot.engine_args import FULL_GRAPHS_CONFIG
from worker.boot.plan import build_plan
from worker.config import DeploymentMode, load_settings
from worker.errors import ConfigError
from worker.speculation.decide import auto_schedule, decide, is_graph_schedule
from worker.vllm_internals.plugin import FULL_GRAPHS_ENV

DOCS = ROOT / "docs" / "speculation.md"
REAL = {"MODEL_NAME": "org/model"}
NGRAM = {**REAL, "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
EAGLE = {**REAL, "SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 4}'}
# An EAGLE-3 head named as vLLM infers it (no method): the same.
EAGLE_BY_NAME = {**REAL, "SPECULATIVE_MODEL": "org/EAGLE3-LLaMA3.1-8B", "NUM_SPECULATIVE_TOKENS": "4"}
DRAFT = {**REAL, "SPECULATIVE_MODEL": "org/draft", "NUM_SPECULATIVE_TOKENS": "4"}


def control(mode: DeploymentMode, env: dict[str, str], *, is_cpu: bool = False, **more: str) -> str:
    return decide(load_settings({**env, **more}), mode=mode, is_cpu=is_cpu).control


def test_unset_speculation_control_is_auto_where_the_map_measured_it_to_pay() -> None:
    # Pods run V2 anyway: auto for n-gram.
    assert control("pod", NGRAM) == "auto"
    # Serverless: auto would move n-gram to V2, whose boots pay the kernel warm-up.
    assert control("serverless", NGRAM) == "static"
    assert control("serverless", NGRAM, MODEL_RUNNER="v2") == "auto"  # V2 chosen: no boot to save
    assert control("serverless", NGRAM, VLLM_USE_V2_MODEL_RUNNER="1") == "auto"
    assert control("pod", NGRAM, MODEL_RUNNER="v1") == "static"  # auto on V1 ran below static
    assert control("pod", NGRAM, CUDAGRAPH_MODE="PIECEWISE") == "static"  # not measured without full graphs
    # An EAGLE head: static everywhere (its V2 engine under auto died once at 256 streams); opt-in.
    for env in (EAGLE, EAGLE_BY_NAME):
        for mode in ("pod", "serverless"):
            assert control(mode, env) == "static" and control(mode, env, MODEL_RUNNER="v2") == "static"
            assert control(mode, env, SPECULATION_CONTROL="auto") == "auto"
    # A separate draft model (V1 either way): static, since auto ran 0.90-0.99x static at 1-64 streams.
    assert control("serverless", DRAFT) == "static" and control("pod", DRAFT) == "static"
    # Methods the map has not measured, and the tiny default (the figures are an 8B's): static.
    for method in ("mtp", "suffix"):
        assert control("pod", REAL, SPECULATIVE_METHOD=method, NUM_SPECULATIVE_TOKENS="2") == "static"
    assert control("pod", {}) == "static"
    # No controller without the worker's scheduler: static, so no schedule costs V1 its full graphs.
    for off in ({"PER_REQUEST_SPEC_DECODE_METRICS": "none"}, {"ENGINE_ARGS": '{"scheduler_cls": "my.Sched"}'}):
        assert control("pod", {**NGRAM, **off}) == "static"
        assert control("serverless", {**NGRAM, **off}, MODEL_RUNNER="v2") == "static"
    # The CPU build, and no speculation: static.
    assert control("pod", NGRAM, is_cpu=True) == "static" and control("serverless", DRAFT, is_cpu=True) == "static"
    assert control("pod", REAL) == "static"
    # A value the user set is kept, whatever the case.
    assert control("serverless", NGRAM, SPECULATION_CONTROL="auto") == "auto"
    assert control("pod", DRAFT, SPECULATION_CONTROL="static") == "static"


def test_the_boot_plan_carries_the_resolved_control_and_the_engine_args_follow_it() -> None:
    # Schedule and controller agree: a schedule exactly where the plan says auto.
    for env in (DRAFT, NGRAM, EAGLE, {**NGRAM, "PER_REQUEST_SPEC_DECODE_METRICS": "none"}):
        for mode in ("pod", "serverless"):
            plan = build_plan(load_settings(env), mode=mode, is_cpu=False)
            has_schedule = "num_speculative_tokens_per_batch_size" in plan.engine_kwargs["speculative_config"]
            assert has_schedule == (plan.speculation.control == "auto"), (env, mode)
    pod = build_plan(load_settings(NGRAM), mode="pod", is_cpu=False)
    assert pod.speculation.control == "auto"
    assert pod.engine_kwargs["speculative_config"]["method"] == "ngram_gpu"
    assert pod.environment["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    serverless = build_plan(load_settings(NGRAM), mode="serverless", is_cpu=False)
    assert serverless.speculation.control == "static"
    assert "num_speculative_tokens_per_batch_size" not in serverless.engine_kwargs["speculative_config"]
    assert serverless.environment["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def test_engine_environment_picks_the_model_runner_per_mode_and_speculation() -> None:
    def flag(mode: DeploymentMode, **env: str) -> str | None:
        return engine_env(load_settings(env), mode=mode)["VLLM_USE_V2_MODEL_RUNNER"]

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
    on_cpu = engine_env(load_settings(ngram), mode="serverless", is_cpu=True)["VLLM_USE_V2_MODEL_RUNNER"]
    assert on_cpu == "0"
    assert flag("serverless", **ngram, ENFORCE_EAGER="true") == "0"
    assert flag("serverless", **ngram, CUDAGRAPH_MODE="PIECEWISE") == "0"
    assert flag("serverless", **ngram, ENGINE_ARGS='{"enforce_eager": true}') == "0"
    tiny = {"SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4", "SPECULATION_CONTROL": "auto"}
    assert flag("serverless", **tiny) == "0"  # the tiny default runs eager


def test_auto_speculation_control_gives_vllm_a_schedule_to_answer() -> None:
    # vLLM changes k per step only with a batch-size schedule: auto adds one range (the configured
    # k, carried to every batch size) unless the user gave one; static leaves the config alone.
    def spec_for(**env: str) -> Any:
        return engine_kwargs(load_settings(env))["speculative_config"]

    assert spec_for(SPECULATION_CONTROL="auto")["num_speculative_tokens_per_batch_size"] == [[1, 1, 3]]
    # On the V2 runner the worker chose (n-gram under auto) graphs exist only for the schedule's k
    # values: every k from the configured one to 0, which the controller reads as a list, not a ceiling.
    ngram = {"MODEL_NAME": "org/m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    on_v2 = engine_kwargs(load_settings({**ngram, "SPECULATION_CONTROL": "auto"}), is_cpu=False)
    every_k = [[1, 1, 4], [2, 2, 3], [3, 3, 2], [4, 4, 1], [5, 5, 0]]
    assert on_v2["speculative_config"]["num_speculative_tokens_per_batch_size"] == every_k
    # V2 drafts both n-gram names on the GPU; vLLM keeps async scheduling for ngram_gpu only.
    assert on_v2["speculative_config"]["method"] == "ngram_gpu"
    assert is_graph_schedule(every_k, 4) and is_graph_schedule([tuple(e) for e in every_k], 4)
    assert not is_graph_schedule(every_k, 3) and not is_graph_schedule([[1, 4, 3], [5, 256, 1]], 3)
    on_cpu = engine_kwargs(load_settings({**ngram, "SPECULATION_CONTROL": "auto"}), is_cpu=True)
    assert on_cpu["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 4]]
    assert on_cpu["speculative_config"]["method"] == "ngram"  # V1: its CPU proposer, as asked
    # n-gram named by its model, V2 chosen by the user: ngram_gpu (the model key goes); not on a CPU.
    by_model = {"MODEL_NAME": "org/m", "SPECULATIVE_CONFIG": '{"model": "ngram", "num_speculative_tokens": 2}'}
    v2 = engine_kwargs(load_settings({**by_model, "MODEL_RUNNER": "v2"}), is_cpu=False)["speculative_config"]
    # (with V2 chosen, SPECULATION_CONTROL's default is auto: the schedule of every k)
    assert v2 == {
        "method": "ngram_gpu",
        "num_speculative_tokens": 2,
        "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 2, 1], [3, 3, 0]],
    }
    cpu = engine_kwargs(load_settings({**by_model, "MODEL_RUNNER": "v2"}), is_cpu=True)["speculative_config"]
    assert cpu == {"model": "ngram", "num_speculative_tokens": 2}
    # Without the worker's scheduler no controller reads the list of k values: one k, as vLLM would run it.
    for off in ({"PER_REQUEST_SPEC_DECODE_METRICS": "none"}, {"ENGINE_ARGS": '{"scheduler_cls": "my.Sched"}'}):
        uncontrolled = engine_kwargs(load_settings({**ngram, "SPECULATION_CONTROL": "auto", **off}), is_cpu=False)
        assert uncontrolled["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 4]]
    # An EAGLE head under auto runs on the V2 the worker chose, pod or serverless: every k, like n-gram.
    eagle = {
        "MODEL_NAME": "org/m",
        "SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "o/h", "num_speculative_tokens": 2}',
    }
    for mode in ("pod", "serverless"):
        head = engine_kwargs(load_settings({**eagle, "SPECULATION_CONTROL": "auto"}), mode=mode)["speculative_config"]
        assert head["num_speculative_tokens_per_batch_size"] == [[1, 1, 2], [2, 2, 1], [3, 3, 0]]
        assert head["method"] == "eagle3"
    # A runner the user gave V2 without the worker's controller keeps one k, as vLLM would run it.
    users_v2 = {
        **eagle,
        "SPECULATION_CONTROL": "auto",
        "VLLM_USE_V2_MODEL_RUNNER": "1",
        "PER_REQUEST_SPEC_DECODE_METRICS": "none",
    }
    assert engine_kwargs(load_settings(users_v2))["speculative_config"]["num_speculative_tokens_per_batch_size"] == [
        [1, 1, 2]
    ]
    assert auto_schedule(1, on_v2=True) == [[1, 1, 1], [2, 2, 0]] and auto_schedule(3, on_v2=False) == [[1, 1, 3]]
    assert "num_speculative_tokens_per_batch_size" not in spec_for(SPECULATION_CONTROL="static")
    given = spec_for(SPECULATION_CONTROL="auto", SPECULATIVE_TOKENS_BY_BATCH="1-4:3,5-256:1")
    assert given["num_speculative_tokens_per_batch_size"] == [[1, 4, 3], [5, 256, 1]]


def test_serverless_captures_only_the_cuda_graphs_its_traffic_runs() -> None:
    def graphs(mode: DeploymentMode, **env: str) -> dict[str, object] | None:
        settings = load_settings({"MODEL_NAME": "org/m", **env})
        return engine_kwargs(settings, mode=mode).get("compilation_config")

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
        environment = engine_env(load_settings({"MODEL_NAME": "org/m", **ngram}), mode=mode)
        assert environment[FULL_GRAPHS_ENV] == value
    on_cpu = engine_env(load_settings({"MODEL_NAME": "org/m", **ngram}), mode="pod", is_cpu=True)
    assert on_cpu[FULL_GRAPHS_ENV] is None
    chosen = load_settings({"MODEL_NAME": "org/m", **ngram, "CUDAGRAPH_MODE": "FULL"})
    assert engine_env(chosen, mode="pod")[FULL_GRAPHS_ENV] is None  # the user's FULL: vLLM's rules
    # ...and marks vLLM's config, whose hash keys the startup plan and the compile cache vLLM reuses.
    for mode, value in marker.items():
        kwargs = engine_kwargs(load_settings({"MODEL_NAME": "org/m", **ngram}), mode=mode)
        assert kwargs.get("additional_config") == (FULL_GRAPHS_CONFIG if value else None)
    assert "additional_config" not in engine_kwargs(chosen, mode="pod")
    on_cpu_kwargs = engine_kwargs(load_settings({"MODEL_NAME": "org/m", **ngram}), mode="pod", is_cpu=True)
    assert "additional_config" not in on_cpu_kwargs
    # Eager engines capture nothing; ENGINE_ARGS has the last word.
    assert graphs("serverless", ENFORCE_EAGER="true", CUDAGRAPH_MODE="FULL_DECODE_ONLY") is None
    assert graphs("pod", **ngram, ENFORCE_EAGER="true") is None
    assert engine_kwargs(load_settings({})).get("compilation_config") is None
    assert engine_kwargs(load_settings({"MODEL_NAME": "org/m"}), is_cpu=True).get("compilation_config") is None
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
    kwargs = engine_kwargs(settings, mode="serverless")
    config = AsyncEngineArgs(**kwargs).compilation_config
    config = config if isinstance(config, CompilationConfig) else CompilationConfig(**config)
    assert config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert config.max_cudagraph_capture_size == 16
    ngram = {"MODEL_NAME": "org/m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    config = AsyncEngineArgs(**engine_kwargs(load_settings(ngram), mode="pod")).compilation_config
    config = config if isinstance(config, CompilationConfig) else CompilationConfig(**config)
    assert config.cudagraph_mode == CUDAGraphMode.FULL and config.max_cudagraph_capture_size == 1024


def _table_rows() -> list[list[str]]:
    """The cells of docs/speculation.md's decision table, a list a row."""
    text = DOCS.read_text()
    table = text[text.index("<!-- decision-table -->") : text.index("<!-- /decision-table -->")]
    lines = [line for line in table.splitlines() if line.startswith("| ")][1:]  # the header goes
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def test_the_docs_decision_table_is_what_decide_answers() -> None:
    """Each row of docs/speculation.md's table, walked through decide: its settings, mode and device
    in; control, runner, graph mode, capture size and schedule out, as the served block shows them."""
    rows = _table_rows()
    assert len(rows) >= 20
    for settings, mode_cell, device, *shown, _why in rows:
        mode: DeploymentMode = "pod" if mode_cell == "pod" else "serverless"
        env = {} if "tiny default" in settings else dict(REAL)
        env |= dict(re.findall(r"`([A-Z0-9_]+)=([^`]*)`", settings))
        assert mode_cell in ("pod", "serverless") and device in ("GPU", "CPU"), settings
        plan = decide(load_settings(env), mode=mode, is_cpu=device == "CPU")
        answer = plan.shown()
        capture = plan.max_cudagraph_capture_size
        schedule = answer["speculative_tokens_by_batch"]
        got = [
            answer["speculation_control"] or "—",
            answer["model_runner"] or "vLLM's",
            answer["cudagraph_mode"] or "vLLM's",
            "—" if not plan.has_cuda_graphs else str(capture or "vLLM's"),
            "—" if schedule is None else "`" + ",".join(f"{a}-{b}:{k}" for a, b, k in schedule) + "`",
        ]
        assert got == shown, f"docs/speculation.md: the row {settings} ({mode}, {device}): decide answers {got}"


def test_the_runner_is_shown_as_vllm_reads_its_variable() -> None:
    def shown(value: str) -> object:
        settings = load_settings({**REAL, "VLLM_USE_V2_MODEL_RUNNER": value})
        return decide(settings, mode="pod", is_cpu=False).shown()["model_runner"]

    assert (shown("1"), shown("0")) == ("v2", "v1")
    assert shown("yes") is None  # vLLM refuses it at boot (it reads an integer)
