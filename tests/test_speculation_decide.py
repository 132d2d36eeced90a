"""What speculation, compilation and CUDA graphs an engine gets, decided once (worker/speculation/decide.py):
the control, the model runner, torch.compile, the graph mode and capture size, vLLM's speculative config;
settings only."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helpers import ROOT, engine_env, engine_kwargs
from worker.boot.engine_args import FULL_GRAPHS_CONFIG
from worker.boot.plan import build_plan
from worker.config import DeploymentMode, load_settings
from worker.errors import ConfigError
from worker.speculation.decide import (
    AUTO_BY_DEFAULT,
    JOIN_CAPTURE_TOKENS,
    LATENCY_BOUND_MAX_NUM_SEQS,
    auto_schedule,
    decide,
    is_graph_schedule,
)
from worker.vllm_internals.plugin import FULL_GRAPHS_ENV
from worker.vllm_internals.runner import V2_RUNNER_ENV, runner_environment

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
    # n-gram: auto in both modes (V2 runs every GPU engine: no boot left to save by staying static).
    assert control("pod", NGRAM) == "auto" and control("serverless", NGRAM) == "auto"
    assert control("pod", NGRAM, CUDAGRAPH_MODE="PIECEWISE") == "static"  # not measured without full graphs
    assert control("pod", NGRAM, TORCH_COMPILE="off") == "auto"  # compile-free FULL graphs keep the target's
    # A separate draft model: auto in both modes (vLLM 0.34's map: at or above static k at every load).
    assert control("pod", DRAFT) == "auto" and control("serverless", DRAFT) == "auto"
    assert control("pod", DRAFT, SPECULATION_CONTROL="static") == "static"
    # ... where the controller can run: not on the CPU build, without full graphs, or without the worker's scheduler.
    assert (
        control("pod", DRAFT, is_cpu=True) == "static" and control("pod", DRAFT, CUDAGRAPH_MODE="PIECEWISE") == "static"
    )
    assert control("pod", DRAFT, PER_REQUEST_SPEC_DECODE_METRICS="none") == "static"
    # EAGLE heads, however named: auto in both modes too (vLLM 0.34's map, auto beside static k = 3).
    for env in (EAGLE, EAGLE_BY_NAME):
        for mode in ("pod", "serverless"):
            assert control(mode, env) == "auto"
            assert control(mode, env, SPECULATION_CONTROL="static") == "static"
    # Methods the map has not measured, and the tiny default (the figures are an 8B's): static.
    for method in ("mtp", "suffix"):
        assert control("pod", REAL, SPECULATIVE_METHOD=method, NUM_SPECULATIVE_TOKENS="2") == "static"
    assert control("pod", {}) == "static"
    # No controller without the worker's scheduler: static.
    for off in ({"PER_REQUEST_SPEC_DECODE_METRICS": "none"}, {"ENGINE_ARGS": '{"scheduler_cls": "my.Sched"}'}):
        assert control("pod", {**NGRAM, **off}) == "static" and control("serverless", {**NGRAM, **off}) == "static"
    # The CPU build, an eager engine, and no speculation: static.
    assert control("pod", NGRAM, is_cpu=True) == "static" and control("serverless", DRAFT, is_cpu=True) == "static"
    assert control("pod", NGRAM, ENFORCE_EAGER="true") == "static"
    assert control("pod", REAL) == "static"
    # A value the user set is kept, whatever the case.
    assert control("serverless", NGRAM, SPECULATION_CONTROL="static") == "static"
    assert control("pod", DRAFT, SPECULATION_CONTROL="static") == "static"


def test_a_measured_default_is_flipped_in_one_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # Once a drafter's map shows auto pays, its row of AUTO_BY_DEFAULT is the one change: the control,
    # the schedule and the worker's FULL graphs follow from it.
    assert control("pod", EAGLE) == "auto"
    monkeypatch.setitem(AUTO_BY_DEFAULT, "eagle", False)
    plan = build_plan(load_settings(EAGLE), mode="pod", is_cpu=False)
    assert plan.speculation.control == "static" and plan.speculation.cudagraph_mode is None
    assert "num_speculative_tokens_per_batch_size" not in plan.engine_kwargs["speculative_config"]
    monkeypatch.setitem(AUTO_BY_DEFAULT, "eagle", True)
    plan = build_plan(load_settings(EAGLE), mode="pod", is_cpu=False)
    assert plan.speculation.control == "auto" and plan.speculation.cudagraph_mode == "FULL"
    assert plan.engine_kwargs["speculative_config"]["num_speculative_tokens_per_batch_size"] == auto_schedule(
        4, on_v2=True
    )
    assert control("pod", EAGLE, is_cpu=True) == "static"
    assert set(AUTO_BY_DEFAULT) == {"ngram", "eagle", "draft_model", "other"}


MODES: tuple[DeploymentMode, ...] = ("pod", "serverless")


def test_the_boot_plan_carries_the_resolved_control_and_the_engine_args_follow_it() -> None:
    # Schedule and controller agree: a schedule exactly where the plan says auto.
    for env in (DRAFT, NGRAM, EAGLE, {**NGRAM, "PER_REQUEST_SPEC_DECODE_METRICS": "none"}):
        for mode in MODES:
            plan = build_plan(load_settings(env), mode=mode, is_cpu=False)
            has_schedule = "num_speculative_tokens_per_batch_size" in plan.engine_kwargs["speculative_config"]
            assert has_schedule == (plan.speculation.control == "auto"), (env, mode)
    for mode in MODES:
        plan = build_plan(load_settings(NGRAM), mode=mode, is_cpu=False)
        assert plan.speculation.control == "auto" and plan.speculation.model_runner == "v2"
        assert plan.engine_kwargs["speculative_config"]["method"] == "ngram_gpu"
    static = build_plan(load_settings({**NGRAM, "SPECULATION_CONTROL": "static"}), mode="pod", is_cpu=False)
    assert "num_speculative_tokens_per_batch_size" not in static.engine_kwargs["speculative_config"]


def test_every_gpu_engine_runs_v2_told_as_the_installed_vllm_reads_it() -> None:
    # vLLM 0.32 picks V1 where V2 lacks a feature unless told; 0.34 has V2 only, and no variable.
    assert runner_environment(is_cpu=False, release="0.32") == {V2_RUNNER_ENV: "1"}
    assert runner_environment(is_cpu=False, release="0.34") == {}
    # The CPU build runs its CPU runner: the variable unset, whatever the environment held.
    assert runner_environment(is_cpu=True, release="0.32") == {V2_RUNNER_ENV: None}
    for env in (REAL, NGRAM, EAGLE, DRAFT, {**NGRAM, "ENFORCE_EAGER": "true"}, {}):
        for mode in ("pod", "serverless"):
            on_gpu = build_plan(load_settings(env), mode=mode, is_cpu=False)
            assert on_gpu.speculation.model_runner == "v2"
            expected = runner_environment(is_cpu=False)
            assert {key: on_gpu.environment[key] for key in expected} == expected
            on_cpu = build_plan(load_settings(env), mode=mode, is_cpu=True)
            assert on_cpu.speculation.model_runner == "cpu"
            assert on_cpu.environment.get(V2_RUNNER_ENV) is None


def test_auto_speculation_control_gives_vllm_a_schedule_to_answer() -> None:
    # vLLM changes k per step only with a batch-size schedule: auto adds one unless the user gave one
    # (on the CPU build one range, the configured k for every batch size); static leaves the config alone.
    def spec_for(**env: str) -> Any:  # the tiny default on the CPU build
        return engine_kwargs(load_settings(env), is_cpu=True)["speculative_config"]

    assert spec_for(SPECULATION_CONTROL="auto")["num_speculative_tokens_per_batch_size"] == [[1, 1, 3]]
    # On the V2 runner (every GPU) graphs exist only for the schedule's k values: every k from the
    # configured one to 0, which the controller reads as a list, not a ceiling.
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
    assert on_cpu["speculative_config"]["method"] == "ngram"  # the CPU runner: its CPU proposer, as asked
    # n-gram named by its model on a GPU: ngram_gpu (the model key goes), auto by default; not on a CPU.
    by_model = {"MODEL_NAME": "org/m", "SPECULATIVE_CONFIG": '{"model": "ngram", "num_speculative_tokens": 2}'}
    v2 = engine_kwargs(load_settings(by_model), is_cpu=False)["speculative_config"]
    assert v2 == {
        "method": "ngram_gpu",
        "num_speculative_tokens": 2,
        "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 2, 1], [3, 3, 0]],
    }
    cpu = engine_kwargs(load_settings(by_model), is_cpu=True)["speculative_config"]
    assert cpu == {"model": "ngram", "num_speculative_tokens": 2}
    # Without the worker's scheduler no controller reads the list of k values: one k, as vLLM would run it.
    for off in ({"PER_REQUEST_SPEC_DECODE_METRICS": "none"}, {"ENGINE_ARGS": '{"scheduler_cls": "my.Sched"}'}):
        uncontrolled = engine_kwargs(load_settings({**ngram, "SPECULATION_CONTROL": "auto", **off}), is_cpu=False)
        assert uncontrolled["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 4]]
    # An EAGLE head or a draft model under auto, pod or serverless: every k, like n-gram.
    eagle = {
        "MODEL_NAME": "org/m",
        "SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "o/h", "num_speculative_tokens": 2}',
    }
    draft = {"MODEL_NAME": "org/m", "SPECULATIVE_MODEL": "org/draft", "NUM_SPECULATIVE_TOKENS": "2"}
    for env in (eagle, draft):
        for mode in ("pod", "serverless"):
            drafted = engine_kwargs(load_settings({**env, "SPECULATION_CONTROL": "auto"}), mode=mode)
            assert drafted["speculative_config"]["num_speculative_tokens_per_batch_size"] == [
                [1, 1, 2],
                [2, 2, 1],
                [3, 3, 0],
            ]
    assert engine_kwargs(load_settings({**eagle, "SPECULATION_CONTROL": "auto"}))["speculative_config"]["method"] == (
        "eagle3"
    )
    # Without the worker's controller V2 keeps one k, as vLLM would run it.
    uncontrolled_head = {**eagle, "SPECULATION_CONTROL": "auto", "PER_REQUEST_SPEC_DECODE_METRICS": "none"}
    assert engine_kwargs(load_settings(uncontrolled_head))["speculative_config"][
        "num_speculative_tokens_per_batch_size"
    ] == [[1, 1, 2]]
    assert auto_schedule(1, on_v2=True) == [[1, 1, 1], [2, 2, 0]] and auto_schedule(3, on_v2=False) == [[1, 1, 3]]
    assert "num_speculative_tokens_per_batch_size" not in spec_for(SPECULATION_CONTROL="static")
    given = spec_for(SPECULATION_CONTROL="auto", SPECULATIVE_TOKENS_BY_BATCH="1-4:3,5-256:1")
    assert given["num_speculative_tokens_per_batch_size"] == [[1, 4, 3], [5, 256, 1]]


def graphs(mode: DeploymentMode, **env: str) -> dict[str, object] | None:
    """vLLM's compilation_config for a model of the user's on a GPU."""
    return engine_kwargs(load_settings({**REAL, **env}), mode=mode).get("compilation_config")


def test_latency_bound_engines_run_full_graphs_without_torch_compile() -> None:
    compile_free = {"mode": 0, "cudagraph_mode": "FULL"}
    # Serverless: compile-free FULL graphs, up to the tokens a decode step of the worker runs.
    assert graphs("serverless") == compile_free  # no bound given: vLLM's sizes for its MAX_NUM_SEQS
    assert graphs("serverless", MAX_CONCURRENCY="16") == {**compile_free, "max_cudagraph_capture_size": 16}
    assert graphs("serverless", MAX_CONCURRENCY="16", MAX_NUM_SEQS="8") == {
        **compile_free,
        "max_cudagraph_capture_size": 8,  # the engine runs no more than MAX_NUM_SEQS
    }
    # With speculation a step is 1 + k tokens a sequence.
    ngram = {"SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    assert graphs("serverless", MAX_CONCURRENCY="16", **ngram) == {**compile_free, "max_cudagraph_capture_size": 80}
    draft = {"SPECULATIVE_MODEL": "org/draft", "NUM_SPECULATIVE_TOKENS": "3"}
    assert graphs("serverless", MAX_CONCURRENCY="4", **draft) == {**compile_free, "max_cudagraph_capture_size": 16}
    # A pod: compiled (vLLM's default mode and graphs) unless its batches are small.
    assert graphs("pod") is None and graphs("pod", MAX_NUM_SEQS=str(LATENCY_BOUND_MAX_NUM_SEQS + 1)) is None
    small = str(LATENCY_BOUND_MAX_NUM_SEQS)
    assert graphs("pod", MAX_NUM_SEQS=small) == {**compile_free, "max_cudagraph_capture_size": 32}
    assert graphs("pod", MAX_NUM_SEQS="16", MAX_CONCURRENCY="4") == {**compile_free, "max_cudagraph_capture_size": 16}
    # TORCH_COMPILE overrides either way; a capture size set by hand is kept.
    assert graphs("serverless", TORCH_COMPILE="on") is None
    assert graphs("pod", TORCH_COMPILE="off") == compile_free
    assert graphs("serverless", MAX_CUDAGRAPH_CAPTURE_SIZE="64", MAX_CONCURRENCY="8") == {
        **compile_free,
        "max_cudagraph_capture_size": 64,
    }
    # A mode without piecewise graphs set by hand is kept; piecewise graphs need torch.compile.
    assert graphs("serverless", CUDAGRAPH_MODE="FULL_DECODE_ONLY", MAX_CONCURRENCY="8") == {
        "mode": 0,
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "max_cudagraph_capture_size": 8,
    }
    assert graphs("serverless", CUDAGRAPH_MODE="NONE", MAX_CONCURRENCY="8") == {"mode": 0, "cudagraph_mode": "NONE"}
    for piecewise in ("PIECEWISE", "FULL_AND_PIECEWISE"):
        assert graphs("serverless", CUDAGRAPH_MODE=piecewise) == {"cudagraph_mode": piecewise}
        with pytest.raises(ConfigError, match=rf"^invalid configuration: CUDAGRAPH_MODE={piecewise} needs torch"):
            load_settings({**REAL, "CUDAGRAPH_MODE": piecewise, "TORCH_COMPILE": "off"})
    with pytest.raises(ConfigError, match="TORCH_COMPILE=on has no effect under ENFORCE_EAGER=true"):
        load_settings({**REAL, "TORCH_COMPILE": "on", "ENFORCE_EAGER": "true"})
    with pytest.raises(ConfigError, match=r"^invalid configuration: TORCH_COMPILE: Input should be 'auto', 'on'"):
        load_settings({"TORCH_COMPILE": "yes"})

    # The plan stores the answer once; the served block shows it.
    def compiled(mode: DeploymentMode, *, is_cpu: bool = False, **env: str) -> object:
        return decide(load_settings({**REAL, **env}), mode=mode, is_cpu=is_cpu).shown()["torch_compile"]

    assert (compiled("serverless"), compiled("pod"), compiled("pod", MAX_NUM_SEQS="8")) == (False, True, False)
    assert compiled("pod", ENFORCE_EAGER="true") is False  # eager runs uncompiled
    assert compiled("pod", ENGINE_ARGS='{"enforce_eager": true}') is False
    assert compiled("pod", is_cpu=True) is None  # the CPU build's own choice, as before
    assert decide(load_settings({}), mode="serverless", is_cpu=True).shown()["torch_compile"] is False  # eager


def test_engine_args_compilation_config_wins_key_by_key() -> None:
    # ENGINE_ARGS' keys win over the plan's; the plan's others stay.
    capture = '{"compilation_config": {"max_cudagraph_capture_size": 64}}'
    assert graphs("serverless", ENGINE_ARGS=capture, MAX_CONCURRENCY="8") == {
        "mode": 0,
        "cudagraph_mode": "FULL",
        "max_cudagraph_capture_size": 64,
    }
    assert graphs("pod", ENGINE_ARGS=capture) == {"max_cudagraph_capture_size": 64}
    # Its mode is the user's answer to torch.compile, and the plan decides the graphs from it.
    compiled = '{"compilation_config": {"mode": 3}}'
    assert graphs("serverless", ENGINE_ARGS=compiled) == {"mode": 3}
    assert decide(load_settings({**REAL, "ENGINE_ARGS": compiled}), mode="serverless", is_cpu=False).is_torch_compiled
    uncompiled = '{"compilation_config": {"mode": 0}}'
    assert graphs("pod", ENGINE_ARGS=uncompiled) == {"mode": 0, "cudagraph_mode": "FULL"}
    # A piecewise graph mode given there keeps torch.compile (vLLM compiles those graphs).
    piecewise = '{"compilation_config": {"cudagraph_mode": "PIECEWISE"}}'
    assert graphs("serverless", ENGINE_ARGS=piecewise) == {"cudagraph_mode": "PIECEWISE"}
    escape = '{"compilation_config": {"cudagraph_mode": "NONE"}}'
    assert graphs("pod", ENGINE_ARGS=escape) == {"cudagraph_mode": "NONE"}
    # Eager engines, and the CPU build, get no compilation_config of the worker's: the embedded
    # model runs eager there, and on a GPU gets the serverless graphs of any model.
    assert engine_kwargs(load_settings({}), is_cpu=True).get("compilation_config") is None
    assert engine_kwargs(load_settings({}), is_cpu=True)["enforce_eager"] is True
    assert engine_kwargs(load_settings({}))["enforce_eager"] is False
    assert engine_kwargs(load_settings({})).get("compilation_config") == graphs("serverless")
    assert engine_kwargs(load_settings(REAL), is_cpu=True).get("compilation_config") is None
    assert graphs("serverless", ENFORCE_EAGER="true") is None


def test_drafters_under_auto_run_the_workers_full_graphs() -> None:
    ngram = {"SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
    head = {"SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "o/h", "num_speculative_tokens": 3}'}
    draft = {"SPECULATIVE_MODEL": "org/draft", "NUM_SPECULATIVE_TOKENS": "3"}
    # Compiled (a pod): FULL for a drafter under auto, a full graph for steps that carry prompts too,
    # up to 1,024 tokens unless the user caps it.
    full = {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": JOIN_CAPTURE_TOKENS}
    assert graphs("pod", **ngram) == full
    assert graphs("pod", **draft) == full  # auto by default
    assert graphs("pod", **draft, SPECULATION_CONTROL="static") is None  # static: vLLM's mode
    assert graphs("pod", **head) == full  # auto by default
    assert graphs("pod", **head, SPECULATION_CONTROL="static") is None
    assert graphs("pod", **ngram, MAX_CUDAGRAPH_CAPTURE_SIZE="512") == {**full, "max_cudagraph_capture_size": 512}
    assert graphs("pod", **ngram, SPECULATION_CONTROL="static") is None
    assert graphs("pod", **ngram, CUDAGRAPH_MODE="FULL_AND_PIECEWISE") == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert graphs("serverless", **ngram, TORCH_COMPILE="on") == full
    for off in ({"PER_REQUEST_SPEC_DECODE_METRICS": "none"}, {"ENGINE_ARGS": '{"scheduler_cls": "my.Sched"}'}):
        assert graphs("pod", **ngram, SPECULATION_CONTROL="auto", **off) is None
    mtp = {"SPECULATIVE_METHOD": "mtp", "NUM_SPECULATIVE_TOKENS": "2", "SPECULATION_CONTROL": "auto"}
    assert graphs("pod", **mtp) is None  # not measured under the worker's FULL
    # The plan tells the worker's vLLM plugin that FULL is the worker's choice (worker/vllm_internals/plugin.py),
    # and marks vLLM's config, whose hash keys the startup plan and the compile cache vLLM reuses.
    chosen: list[tuple[DeploymentMode, dict[str, str], bool]] = [
        ("pod", ngram, True),
        ("pod", {**ngram, "SPECULATION_CONTROL": "static"}, False),
        ("pod", {**draft, "SPECULATION_CONTROL": "auto"}, True),
        ("pod", {}, False),
        ("serverless", {}, True),  # compile-free: FULL
        ("serverless", {"CUDAGRAPH_MODE": "FULL"}, False),  # the user's FULL: vLLM's rules
    ]
    for mode, env, is_chosen in chosen:
        settings = load_settings({**REAL, **env})
        assert engine_env(settings, mode=mode)[FULL_GRAPHS_ENV] == ("1" if is_chosen else None), (mode, env)
        assert engine_kwargs(settings, mode=mode).get("additional_config") == (
            FULL_GRAPHS_CONFIG if is_chosen else None
        )
        on_cpu = load_settings({**REAL, **env})
        assert engine_env(on_cpu, mode=mode, is_cpu=True)[FULL_GRAPHS_ENV] is None
        assert "additional_config" not in engine_kwargs(on_cpu, mode=mode, is_cpu=True)
    assert graphs("pod", **ngram, ENFORCE_EAGER="true") is None
    with pytest.raises(ConfigError, match=r"^invalid configuration: CUDAGRAPH_MODE: Input should be 'auto'"):
        load_settings({"CUDAGRAPH_MODE": "FULL_DECODE"})


def test_the_compilation_choices_reach_vllms_compilation_config() -> None:
    # GPU-only settings (the CPU build runs eager): vLLM's own engine arguments take what the
    # worker builds for a GPU and turn it into its CompilationConfig.
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode, CUDAGraphMode
    from vllm.engine.arg_utils import AsyncEngineArgs

    def config(mode: DeploymentMode, **env: str) -> CompilationConfig:
        built = AsyncEngineArgs(**engine_kwargs(load_settings({**REAL, **env}), mode=mode)).compilation_config
        return built if isinstance(built, CompilationConfig) else CompilationConfig(**built)

    serverless = config("serverless", MAX_CONCURRENCY="16")
    assert serverless.mode == CompilationMode.NONE and serverless.cudagraph_mode == CUDAGraphMode.FULL
    assert serverless.max_cudagraph_capture_size == 16
    decode_only = config("serverless", MAX_CONCURRENCY="16", CUDAGRAPH_MODE="FULL_DECODE_ONLY", TORCH_COMPILE="on")
    assert decode_only.mode != CompilationMode.NONE and decode_only.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert decode_only.max_cudagraph_capture_size == 16
    pod = config("pod", SPECULATIVE_METHOD="ngram", NUM_SPECULATIVE_TOKENS="4")
    assert pod.cudagraph_mode == CUDAGraphMode.FULL and pod.max_cudagraph_capture_size == JOIN_CAPTURE_TOKENS


def _table_rows() -> list[list[str]]:
    """The cells of docs/speculation.md's decision table, a list a row."""
    text = DOCS.read_text()
    table = text[text.index("<!-- decision-table -->") : text.index("<!-- /decision-table -->")]
    lines = [line for line in table.splitlines() if line.startswith("| ")][1:]  # the header goes
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def test_the_docs_decision_table_is_what_decide_answers() -> None:
    """Each row of docs/speculation.md's table, walked through decide: its settings, mode and device
    in; control, runner, compile, graph mode, capture size and schedule out, as the served block shows them."""
    rows = _table_rows()
    assert len(rows) >= 20
    compiled = {True: "on", False: "off", None: "vLLM's"}
    for settings, mode_cell, device, *shown, _why in rows:
        mode: DeploymentMode = "pod" if mode_cell == "pod" else "serverless"
        env = {} if "no `MODEL_NAME`" in settings else dict(REAL)
        env |= dict(re.findall(r"`([A-Z0-9_]+)=([^`]*)`", settings))
        assert mode_cell in ("pod", "serverless") and device in ("GPU", "CPU"), settings
        plan = decide(load_settings(env), mode=mode, is_cpu=device == "CPU")
        answer = plan.shown()
        capture = plan.max_cudagraph_capture_size
        schedule = answer["speculative_tokens_by_batch"]
        got = [
            answer["speculation_control"] or "—",
            answer["model_runner"],
            compiled[answer["torch_compile"]],
            answer["cudagraph_mode"] or "vLLM's",
            "—" if not plan.has_cuda_graphs else str(capture or "vLLM's"),
            "—" if schedule is None else "`" + ",".join(f"{a}-{b}:{k}" for a, b, k in schedule) + "`",
        ]
        assert got == shown, f"docs/speculation.md: the row {settings} ({mode}, {device}): decide answers {got}"
