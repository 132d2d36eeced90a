"""vLLM's model-class inspection run beside the main process's imports on an empty cache root
(worker/boot/modelinfo.py): which architectures it looks for, when it starts, and that vLLM reads
what it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.boot import modelinfo
from worker.boot.plan import BootPlan, build_plan
from worker.config import load_settings
from worker.tiny_models import TinyModels


def _model(directory: Path, config: object) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _plan(env: dict[str, str]) -> BootPlan:
    return build_plan(load_settings(env), mode="serverless")


def test_architectures_come_from_the_local_configs_of_target_and_draft(tmp_path: Path) -> None:
    target = _model(tmp_path / "t", {"architectures": ["LlamaForCausalLM"]})
    draft = _model(tmp_path / "d", {"architectures": ["LlamaForCausalLM", "EagleLlamaForCausalLM"]})
    plan = _plan({"MODEL_NAME": str(target), "SPECULATIVE_MODEL": str(draft), "NUM_SPECULATIVE_TOKENS": "3"})
    assert modelinfo.architectures(plan.local_paths) == ["LlamaForCausalLM", "EagleLlamaForCausalLM"]
    # A hub id (vLLM downloads it later) or a config without architectures: nothing to inspect.
    assert modelinfo.architectures(_plan({"MODEL_NAME": "org/not-here"}).local_paths) == []
    odd = _model(tmp_path / "odd", {"architectures": "LlamaForCausalLM"})
    assert modelinfo.architectures(_plan({"MODEL_NAME": str(odd)}).local_paths) == []


def test_only_architectures_without_an_answer_are_inspected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["LlamaForCausalLM", "Qwen2ForCausalLM"]
    assert modelinfo.missing(names, tmp_path / "absent") == names
    (tmp_path / "vllm-model_executor-models-llama-LlamaForCausalLM.json").write_text("{}")
    assert modelinfo.missing(names, tmp_path) == ["Qwen2ForCausalLM"]
    # An architecture answered under another class's name: found through what the subprocess recorded.
    alias, answer = "Ministral3ForCausalLM", "vllm-model_executor-models-mistral-MistralForCausalLM.json"
    (tmp_path / "worker-architectures.json").write_text(json.dumps({alias: answer}))
    assert modelinfo.missing([alias], tmp_path) == [alias], "recorded, but vLLM's file is gone"
    (tmp_path / answer).write_text("{}")
    assert modelinfo.missing([alias], tmp_path) == []
    (tmp_path / "worker-architectures.json").write_text("[not json")
    assert modelinfo.missing([alias], tmp_path) == [alias]
    # vLLM's cache root, as vLLM finds it: VLLM_CACHE_ROOT, else XDG_CACHE_HOME/vllm.
    assert _plan({"VLLM_CACHE_ROOT": str(tmp_path / "root")}).model_info_dir == tmp_path / "root" / "modelinfos"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert _plan({}).model_info_dir == tmp_path / "x" / "vllm" / "modelinfos"
    modelinfo.wait()  # nothing started: returns at once


@pytest.mark.slow
def test_an_empty_cache_root_gets_the_answer_vllm_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_models: TinyModels
) -> None:
    """The subprocess writes vLLM's own answer for the tiny model's class, checked by vLLM's own
    cache reader (its module hash); a second start finds it and starts nothing."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "root"))  # what the subprocess's vLLM reads
    plan = _plan({"MODEL_NAME": "tiny:target", "VLLM_CACHE_ROOT": str(tmp_path / "root")})
    assert modelinfo.architectures(plan.local_paths) == ["LlamaForCausalLM"]
    process = modelinfo.start(plan)
    assert process is not None
    modelinfo.wait()
    assert process.returncode == 0
    assert modelinfo.missing(["LlamaForCausalLM"], plan.model_info_dir) == []
    from vllm.model_executor.models.registry import ModelRegistry, _LazyRegisteredModel, _ModelInfo

    # What vLLM's reader checks (``_load_modelinfo_from_cache``), read here from this root: vLLM may
    # have cached its environment (another cache root) in this process already.
    model = ModelRegistry.models["LlamaForCausalLM"]
    assert isinstance(model, _LazyRegisteredModel)
    module_file = __import__(model.module_name, fromlist=["_"]).__file__
    assert module_file is not None
    saved = json.loads((plan.model_info_dir / model._get_cache_filename()).read_text())
    assert saved["hash"] == model._get_modelinfo_module_hash(Path(module_file))
    assert _ModelInfo(**saved["modelinfo"]).architecture == "LlamaForCausalLM"
    recorded = json.loads((plan.model_info_dir / "worker-architectures.json").read_text())
    assert recorded == {"LlamaForCausalLM": model._get_cache_filename()}
    assert modelinfo.start(plan) is None
