"""The draft-step bench part (worker/tools/bench/draft_step.py): its configurations, and one run on
the CPU engine with the tiny target and an EAGLE-3 head for it (vLLM's own engine, in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.tiny_models import TinyModels
from worker.tools.bench.draft_step import main, parse_config
from worker.tools.bench.shapes import eagle3_head_config


def test_a_configuration_names_draft_k_length_and_settings() -> None:
    assert parse_config("none") == (None, {})
    spec, engine = parse_config("/d:4:2.5+enforce_eager=true+engine.max_num_seqs=8")
    assert spec == {
        "method": "draft_model",
        "model": "/d",
        "num_speculative_tokens": 4,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.5,
        "enforce_eager": True,
    }
    assert engine == {"max_num_seqs": 8}
    spec, _ = parse_config("/d:4:real+num_speculative_tokens_per_batch_size=[[1,1024,0]]")
    assert spec is not None and spec["num_speculative_tokens_per_batch_size"] == [[1, 1024, 0]]
    assert "rejection_sample_method" not in spec
    assert parse_config("ngram:2:real")[0] == {
        "method": "ngram",
        "num_speculative_tokens": 2,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 1,
    }
    with pytest.raises(ValueError, match="none or DRAFT:K:LENGTH"):
        parse_config("/d:four:2.5")
    with pytest.raises(ValueError, match="without speculation"):
        parse_config("none+enforce_eager=true")
    with pytest.raises(ValueError, match=r"\+key=value"):
        parse_config("none+engine.max_num_seqs")


@pytest.mark.slow
def test_the_drafters_passes_are_timed_on_the_cpu_engine(tmp_path: Path, tiny_models: TinyModels) -> None:
    # An EAGLE-3 head for the tiny target, on dummy weights like the GPU runs' 8B head: vLLM 0.32
    # loads it and drafts with it (the spec map's EAGLE-3 configuration rests on that).
    target = tiny_models.path("target")
    head = tmp_path / "eagle3"
    head.mkdir()
    config = eagle3_head_config(json.loads((target / "config.json").read_text()), draft_vocab_size=64)
    (head / "config.json").write_text(json.dumps(config))
    # One engine: k = 3 at one stream, held at k = 0 from two streams (vLLM's batch-size schedule).
    # Eager: compiled, a fresh machine spends ~40 s in inductor's C++ builds before the first pass
    # (58 s against 18 s for this test); the passes, their k and their dispatch are the same.
    schedule = "[[1,1,3],[2,64,0]]"
    main([
        "--model", str(target), "--out", str(tmp_path), "--concurrency", "1,2", "--max-tokens", "16",
        "--config",
        f"{head}:3:real+method=eagle3+num_speculative_tokens_per_batch_size={schedule}+engine.enforce_eager=true",
    ])  # fmt: skip
    (result,) = json.loads((tmp_path / "draft_step.json").read_text())
    assert result["engine_args"]["speculative_config"]["method"] == "eagle3"
    one, two = result["rows"]
    assert set(one["propose_ms"]) == {"3"} and set(two["propose_ms"]) == {"0"}
    # Held at k = 0 the drafter still runs one pass every step (its KV sync), prefill included.
    assert two["propose_ms"]["0"]["n"] == two["steps_hooked"] == 16
    assert one["propose_ms"]["3"]["n"] == one["steps_hooked"] <= 16 and one["tok_s"] > 0
    # Each drafting step dispatches twice: its first pass, and once for the k - 1 passes after it
    # (the CPU build: no CUDA graphs).
    assert sum(one["dispatch"].values()) == 2 * one["steps_hooked"]
    assert all(key.endswith("NONE") for key in one["dispatch"])
