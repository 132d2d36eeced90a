import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import engine_settings, job_items
from worker.boot.draft_check import check_draft_compatible
from worker.config import Settings
from worker.errors import IncompatibleDraft
from worker.runtime import EngineHolder
from worker.serverless import ServerlessWorker


def test_same_tokenizer_is_compatible(tiny_models: Any) -> None:
    assert check_draft_compatible(target=str(tiny_models.target), draft=str(tiny_models.path("noisy"))) == []


def test_different_tokenizer_is_refused_naming_both_models(tiny_models: Any) -> None:
    with pytest.raises(IncompatibleDraft) as info:
        check_draft_compatible(
            target=str(tiny_models.target),
            draft=str(tiny_models.path("mismatch")),
            target_label="tiny:target",
            draft_label="tiny:mismatch",
        )
    message = info.value.message
    assert "'tiny:mismatch'" in message and "'tiny:target'" in message
    assert "vocabularies differ" in message


def test_other_model_family_is_a_warning(tiny_models: Any, tmp_path: Path) -> None:
    other = tmp_path / "other-family"
    shutil.copytree(tiny_models.path("noisy"), other)
    config = json.loads((other / "config.json").read_text())
    config.update(model_type="mistral", architectures=["MistralForCausalLM"])
    (other / "config.json").write_text(json.dumps(config))
    warnings = check_draft_compatible(target=str(tiny_models.target), draft=str(other))
    assert len(warnings) == 1 and "another model family" in warnings[0]


def test_missing_draft_is_refused(tiny_models: Any, tmp_path: Path) -> None:
    with pytest.raises(IncompatibleDraft, match="cannot compare draft"):
        check_draft_compatible(target=str(tiny_models.target), draft=str(tmp_path / "nope"))


async def test_incompatible_draft_fails_the_boot_and_the_job(tiny_models: Any) -> None:
    def settings() -> Settings:
        return engine_settings(MODEL_NAME="tiny:target", SPECULATIVE_MODEL="tiny:mismatch", NUM_SPECULATIVE_TOKENS=3)

    worker = ServerlessWorker(EngineHolder(settings_loader=settings))
    items = await job_items(worker, {"id": "j", "input": {"prompt": "hi"}})
    # The boot's check fails it; the job's error names the setting (worker.boot.preflight.explain_boot_failure).
    assert items[0]["error_type"] == "configuration_error"
    assert items[0]["error"].startswith("SPECULATIVE_MODEL: draft model 'tiny:mismatch' cannot draft for target")
    assert worker.runpod_config.get("refresh_worker") is True
