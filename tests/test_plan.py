"""The boot plan: every decision of a boot made once from the settings (worker/boot/plan.py)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import CACHE_DIR, TINY_DEFAULT_SERVED, tiny_default
from worker.boot.models import resolver
from worker.boot.plan import BootPlan, build_plan, served_line
from worker.config import DeploymentMode, Settings, load_settings
from worker.tiny_models import TinyModels


def _plan(mode: DeploymentMode = "serverless", **env: str) -> BootPlan:
    return build_plan(load_settings(tiny_default({"WORKER_CACHE_DIR": str(CACHE_DIR), **env})), mode=mode, is_cpu=True)


def test_the_default_plan_resolves_target_draft_and_adapters_once(
    tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: collections.Counter[str] = collections.Counter()

    def counting(settings: Settings) -> Callable[[str, str | None], str]:
        resolve = resolver(settings)

        def ask(ref: str, revision: str | None) -> str:
            asked[ref] += 1
            return resolve(ref, revision)

        return ask

    monkeypatch.setattr("worker.boot.models.resolver", counting)
    plan = _plan(ENABLE_LORA="true", LORA_MODULES="tiny-lora=tiny:lora", TOKENIZER_NAME="tiny:target")
    assert plan.target.label == "tiny:target" and Path(plan.target.path) == tiny_models.path("target")
    assert plan.draft is not None and plan.draft.label == "tiny:noisy"
    assert plan.engine_kwargs["speculative_config"]["model"] == plan.draft.path == str(tiny_models.path("noisy"))
    assert plan.lora_paths == {"tiny-lora": str(tiny_models.path("lora"))}
    assert plan.local_paths == [tiny_models.path("target"), tiny_models.path("noisy")]
    # The target named twice (model and tokenizer) is still resolved once; so is every other reference.
    assert asked == {"tiny:target": 1, "tiny:noisy": 1, "tiny:lora": 1}


def test_exact_stats_are_decided_in_one_place() -> None:
    assert _plan().speculation.is_exact_stats
    assert not _plan(PER_REQUEST_SPEC_DECODE_METRICS="none").speculation.is_exact_stats
    assert not _plan(SPECULATIVE_METHOD="none").speculation.is_exact_stats
    # A scheduler of the user's (ENGINE_ARGS) cannot answer the frontend: exact stats are off.
    assert not _plan(ENGINE_ARGS='{"scheduler_cls": "my.Scheduler"}').speculation.is_exact_stats
    # Speculation through the escape hatch alone counts too.
    spec = '{"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}'
    assert _plan(MODEL_NAME="tiny:target", SPECULATIVE_METHOD="none", ENGINE_ARGS=spec).speculation.is_exact_stats


def test_the_served_block_and_the_boot_line_show_the_resolved_plan() -> None:
    served = _plan().served(quantization=None, speculative_method="draft_model", num_speculative_tokens=3)
    assert served.model_dump() == TINY_DEFAULT_SERVED  # the README's served block: the tiny default on the CPU
    assert served_line(served) == (
        "serving: model=tiny:target, quantization=None, speculative_method=draft_model, num_speculative_tokens=3, "
        "speculation_control=static, model_runner=cpu, cudagraph_mode=NONE, torch_compile=False, "
        "speculative_tokens_by_batch=None, spec_decode_available=True"
    )
    # n-gram on a GPU pod: auto, on V2, compiled, FULL graphs, every k down to 0 (worker/speculation/decide.py).
    env = {"MODEL_NAME": "org/m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "2"}
    pod = build_plan(load_settings(env), mode="pod", is_cpu=False)
    shown = pod.served(quantization="awq_marlin", speculative_method="ngram_gpu", num_speculative_tokens=2)
    assert shown.model_dump() == {
        "model": "org/m",
        "quantization": "awq_marlin",
        "speculative_method": "ngram_gpu",
        "num_speculative_tokens": 2,
        "speculation_control": "auto",
        "model_runner": "v2",
        "cudagraph_mode": "FULL",
        "torch_compile": True,
        "speculative_tokens_by_batch": "1-1:2,2-2:1,3-3:0",  # SPECULATIVE_TOKENS_BY_BATCH's form
        "spec_decode_available": True,
    }
    # No speculation: no control to show; V2, and vLLM's own graph mode under torch.compile on a pod (null).
    plain = build_plan(load_settings({"MODEL_NAME": "org/m"}), mode="pod", is_cpu=False)
    none = plain.served(quantization=None, speculative_method=None, num_speculative_tokens=None).model_dump()
    keys = ("speculation_control", "model_runner", "cudagraph_mode", "torch_compile")
    assert {key: none[key] for key in keys} == {
        "speculation_control": None,
        "model_runner": "v2",
        "cudagraph_mode": None,
        "torch_compile": True,
    }
    # Serverless on a GPU: compile-free FULL graphs, shown as such.
    serverless = build_plan(load_settings({"MODEL_NAME": "org/m"}), mode="serverless", is_cpu=False)
    shown_serverless = serverless.served(quantization=None, speculative_method=None, num_speculative_tokens=None)
    assert (shown_serverless.cudagraph_mode, shown_serverless.torch_compile) == ("FULL", False)
    assert "cudagraph_mode=FULL, torch_compile=False" in served_line(shown_serverless)
    assert none["spec_decode_available"] is False


def test_the_start_method_is_decided_once_and_written_by_the_plan() -> None:
    modes: list[tuple[DeploymentMode, str]] = [("pod", "spawn"), ("serverless", "fork")]
    for mode, method in modes:
        plan = _plan(mode)
        assert plan.start_method == method == plan.environment["VLLM_WORKER_MULTIPROC_METHOD"]
    assert _plan("serverless", VLLM_WORKER_MULTIPROC_METHOD="spawn").start_method == "spawn"
    environ = {"VLLM_MEDIA_CONNECTOR": "left over", "OTHER": "kept"}
    plan = _plan(ALLOW_PRIVATE_MEDIA_URLS="true")
    plan.apply_environment(environ)
    assert "VLLM_MEDIA_CONNECTOR" not in environ and environ["OTHER"] == "kept"
    assert environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_references_given_through_engine_args_are_resolved_too(tiny_models: TinyModels) -> None:
    plan = _plan(ENGINE_ARGS='{"tokenizer": "tiny:target"}')
    assert plan.engine_kwargs["tokenizer"] == str(tiny_models.path("target")) == plan.engine_kwargs["model"]
