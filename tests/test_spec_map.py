"""The speculation map's bench part (worker/tools/bench/spec_map.py): its configurations and report."""

from __future__ import annotations

import json

import pytest

from worker.config import load_settings
from worker.tools.bench.spec_map import config_env, controller_step_us, render


def test_a_configuration_names_drafter_k_synthetic_length_and_control() -> None:
    base = {"MODEL_NAME": "m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "2"}
    assert config_env(base, "none")["SPECULATIVE_METHOD"] == "none"
    env = config_env(base, "/models/d-1b:4:2.5:auto")
    spec = json.loads(env["SPECULATIVE_CONFIG"])
    assert spec == {
        "num_speculative_tokens": 4,
        "method": "draft_model",
        "model": "/models/d-1b",
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.5,
    }
    settings = load_settings(env)  # the base's knobs are dropped: no SPECULATIVE_CONFIG conflict
    assert settings.speculation_control == "auto"
    ngram = json.loads(config_env(base, "ngram:6:real:static")["SPECULATIVE_CONFIG"])
    assert ngram["method"] == "ngram" and "rejection_sample_method" not in ngram
    with pytest.raises(ValueError, match="DRAFTER:K:LENGTH:CONTROL"):
        config_env(base, "ngram:four:2.5:auto")


def test_the_report_reads_the_saved_map() -> None:
    row = {"runs": 1, "throughput_tok_s": 200.0, "itl_p50_ms": 5.0, "mean_acceptance_length": None}
    spec_row = {**row, "throughput_tok_s": 300.0, "mean_acceptance_length": 2.5, "mean_k_verified": 2.0}
    result = {
        "configs": ["none", "d:4:2.5:auto"],
        "concurrencies": [1],
        "table": {
            "none": {"1": {**row, "vs_none": 1.0}},
            "d:4:2.5:auto": {"1": {**spec_row, "num_steps_off": 3, "vs_none": 1.5}},
        },
    }
    text = render(result)
    assert "| `d:4:2.5:auto` | 300 (1.50x) |" in text
    assert "| `d:4:2.5:auto` | 2.50 / 2.00 / 3 |" in text


def test_the_controllers_cost_per_step_is_measured() -> None:
    assert 0 < controller_step_us(8, steps=200) < 10_000
