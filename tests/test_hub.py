"""RunPod Hub metadata (``.runpod/hub.json``, ``.runpod/tests.json``) against RunPod's publishing
guide and against the worker's own settings and request schema: every variable named is one the
worker reads, and every value offered loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.config import Settings, load_settings
from worker.schema import parse_request

RUNPOD = Path(__file__).resolve().parent.parent / ".runpod"
SETTINGS = {name.upper() for name in Settings.model_fields}
INPUT_TYPES = {"string", "number", "boolean", "huggingface"}
CATEGORIES = {"audio", "embedding", "language", "video", "image"}
# What a value needs beside it to load (a draft model method names its draft).
COMPANIONS = {"SPECULATIVE_METHOD": {"SPECULATIVE_MODEL": "org/draft"}}


def _load(name: str) -> dict[str, Any]:
    data = json.loads((RUNPOD / name).read_text())
    assert isinstance(data, dict)
    return data


def _as_env(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


HUB = _load("hub.json")
ENV = HUB["config"]["env"]


def test_hub_json_has_the_fields_runpod_requires() -> None:
    assert {"title", "description", "type", "category", "config"} <= set(HUB)
    assert HUB["type"] == "serverless" and HUB["category"] in CATEGORIES
    config = HUB["config"]
    assert config["runsOn"] == "GPU"
    assert isinstance(config["containerDiskInGb"], int) and isinstance(config["gpuCount"], int)
    assert isinstance(config["gpuIds"], str) and config["gpuIds"]


@pytest.mark.parametrize("entry", ENV, ids=[entry["key"] for entry in ENV])
def test_every_hub_variable_is_a_setting_and_every_value_offered_loads(entry: dict[str, Any]) -> None:
    key = entry["key"]
    assert key in SETTINGS, f"{key} is not a variable the worker reads"
    spec = entry.get("input")
    if spec is None:
        load_settings({key: _as_env(entry["value"])})
        return
    assert spec["type"] in INPUT_TYPES and spec["name"] and spec["description"]
    values = [option["value"] for option in spec.get("options", [])]
    values += [spec[name] for name in ("default", "min", "max", "trueValue", "falseValue") if name in spec]
    for value in values:
        load_settings({**COMPANIONS.get(key, {}), key: _as_env(value)})  # raises ConfigError naming the variable
    if spec["type"] == "boolean":
        field = key.lower()
        assert getattr(load_settings({key: spec["trueValue"]}), field) is True
        assert getattr(load_settings({key: spec["falseValue"]}), field) is False
    if "default" in spec and key.lower() in Settings.model_fields:
        default = Settings.model_fields[key.lower()].default
        if default is not None:  # the Hub shows the worker's own default
            assert getattr(load_settings({key: _as_env(spec["default"])}), key.lower()) == default


@pytest.mark.parametrize("preset", HUB["config"]["presets"], ids=[p["name"] for p in HUB["config"]["presets"]])
def test_every_hub_preset_loads(preset: dict[str, Any]) -> None:
    keys = {entry["key"] for entry in ENV}
    assert set(preset["defaults"]) <= keys
    load_settings({key: _as_env(value) for key, value in preset["defaults"].items()})


def test_hub_tests_name_settings_and_send_inputs_the_worker_accepts() -> None:
    tests = _load("tests.json")
    config = tests["config"]
    assert isinstance(config["gpuTypeId"], str) and isinstance(config["gpuCount"], int)
    env = {entry["key"]: entry["value"] for entry in config.get("env", [])}
    assert set(env) <= SETTINGS
    settings = load_settings(env)
    assert tests["tests"]
    for test in tests["tests"]:
        assert test["name"] and isinstance(test["timeout"], int)
        job_input = test["input"]
        if "openai_route" in job_input:
            assert job_input["openai_route"].startswith("/v1/")
            assert job_input["openai_input"]["model"] == settings.served_model_name
        else:
            parse_request(job_input)
        # The Hub tests on a GPU, where sampling with speculation works; greedy keeps them deterministic.
        sampling = job_input.get("sampling_params") or job_input.get("openai_input") or {}
        assert sampling.get("temperature") == 0
