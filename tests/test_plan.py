"""The boot plan: every decision of a boot made once from the settings (worker/boot/plan.py)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import CACHE_DIR
from worker.boot.models import resolver
from worker.boot.plan import BootPlan, build_plan
from worker.config import DeploymentMode, Settings, load_settings
from worker.tiny_models import TinyModels


def _plan(mode: DeploymentMode = "serverless", **env: str) -> BootPlan:
    return build_plan(load_settings({"WORKER_CACHE_DIR": str(CACHE_DIR), **env}), mode=mode, is_cpu=True)


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
    assert _plan().is_exact_stats
    assert not _plan(PER_REQUEST_SPEC_DECODE_METRICS="none").is_exact_stats
    assert not _plan(SPECULATIVE_METHOD="none").is_exact_stats
    # A scheduler of the user's (ENGINE_ARGS) cannot answer the frontend: exact stats are off.
    assert not _plan(ENGINE_ARGS='{"scheduler_cls": "my.Scheduler"}').is_exact_stats
    # Speculation through the escape hatch alone counts too.
    spec = '{"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}'
    assert _plan(MODEL_NAME="tiny:target", SPECULATIVE_METHOD="none", ENGINE_ARGS=spec).is_exact_stats


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
