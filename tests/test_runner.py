"""The model runner and speculation control an engine gets (worker/speculation/decide.py): settings only."""

from __future__ import annotations

from worker.boot.plan import build_plan
from worker.config import DeploymentMode, load_settings
from worker.speculation.decide import speculation_control

REAL = {"MODEL_NAME": "org/model"}
NGRAM = {**REAL, "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
EAGLE = {**REAL, "SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 4}'}
# An EAGLE-3 head named as vLLM infers it (no method): the same.
EAGLE_BY_NAME = {**REAL, "SPECULATIVE_MODEL": "org/EAGLE3-LLaMA3.1-8B", "NUM_SPECULATIVE_TOKENS": "4"}
DRAFT = {**REAL, "SPECULATIVE_MODEL": "org/draft", "NUM_SPECULATIVE_TOKENS": "4"}


def control(mode: DeploymentMode, env: dict[str, str], *, is_cpu: bool = False, **more: str) -> str:
    return speculation_control(load_settings({**env, **more}), mode=mode, is_cpu=is_cpu)


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
            assert has_schedule == (plan.speculation_control == "auto"), (env, mode)
    pod = build_plan(load_settings(NGRAM), mode="pod", is_cpu=False)
    assert pod.speculation_control == "auto"
    assert pod.engine_kwargs["speculative_config"]["method"] == "ngram_gpu"
    assert pod.environment["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    serverless = build_plan(load_settings(NGRAM), mode="serverless", is_cpu=False)
    assert serverless.speculation_control == "static"
    assert "num_speculative_tokens_per_batch_size" not in serverless.engine_kwargs["speculative_config"]
    assert serverless.environment["VLLM_USE_V2_MODEL_RUNNER"] == "0"
