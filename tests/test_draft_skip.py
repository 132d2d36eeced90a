"""A draft model without its pass at k = 0 (worker/vllm_internals/draft_skip.py, GPU only): decided
once by the plan, carried to the engine core by one marker, priced by the cost model, its probes
spaced for their catch-up, and its catch-up packed within the engine's token budget. The skip
itself runs on vLLM 0.34's V2 runner, a GPU's; on the CPU build (0.32's V1 proposer, which keeps
its pass) the acceptance-after-a-pause bench runs as a harness check."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from worker.boot.plan import build_plan
from worker.config import load_settings
from worker.speculation.catch_up import pack_ranges
from worker.speculation.controller import PROBE_EVERY_MAX_STEPS, PROBE_EVERY_STEPS, SpeculationController
from worker.speculation.cost import STEP_COSTS, step_ms
from worker.speculation.decide import decide
from worker.vllm_internals.plugin import DRAFT_SKIP_ENV, apply_draft_skip

REAL = {"MODEL_NAME": "org/model"}
DRAFT = {**REAL, "SPECULATIVE_MODEL": "org/draft", "NUM_SPECULATIVE_TOKENS": "3"}
NGRAM = {**REAL, "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
EAGLE = {**REAL, "SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 4}'}


def test_the_plan_skips_a_draft_models_pass_on_a_gpu_only() -> None:
    for mode in ("pod", "serverless"):
        assert decide(load_settings(DRAFT), mode=mode, is_cpu=False).skips_draft_pass
        static = load_settings({**DRAFT, "SPECULATION_CONTROL": "static"})
        assert decide(static, mode=mode, is_cpu=False).skips_draft_pass
        # The CPU build's proposer keeps its pass; EAGLE heads need the target's hidden states to catch
        # up, which the target does not keep; n-gram has no pass; no speculation, nothing to skip.
        assert not decide(load_settings(DRAFT), mode=mode, is_cpu=True).skips_draft_pass
        for env in (EAGLE, NGRAM, REAL):
            assert not decide(load_settings(env), mode=mode, is_cpu=False).skips_draft_pass, env


def test_the_engine_core_is_told_by_one_marker() -> None:
    assert build_plan(load_settings(DRAFT), mode="pod", is_cpu=False).environment[DRAFT_SKIP_ENV] == "1"
    for env, is_cpu in ((DRAFT, True), (EAGLE, False), (NGRAM, False)):
        assert build_plan(load_settings(env), mode="pod", is_cpu=is_cpu).environment.get(DRAFT_SKIP_ENV) is None


def test_the_marker_changes_nothing_where_the_release_has_no_v2_draft_speculator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The CPU build (0.32 here) has no V2 draft speculator: the plugin's hook returns without one.
    from worker.vllm_internals.variants import draft_speculator_config

    monkeypatch.setenv(DRAFT_SKIP_ENV, "1")
    apply_draft_skip()
    assert draft_speculator_config() is None


def test_a_skipped_pass_costs_nothing_at_k0_and_the_same_as_the_kept_pass_when_drafting() -> None:
    kept, skipped = STEP_COSTS["draft_model"], STEP_COSTS["draft_model_skip"]
    for batch in (1, 64, 256):
        target_only = step_ms(STEP_COSTS["draft_model_skip"], batch_size=batch, k=0)
        assert step_ms(kept, batch_size=batch, k=0) > target_only  # the KV-sync pass
        assert target_only == pytest.approx(kept.base_ms + kept.per_seq_ms * (batch - 1))
        for k in (1, 2, 3):
            assert step_ms(skipped, batch_size=batch, k=k) == pytest.approx(step_ms(kept, batch_size=batch, k=k))
    assert skipped.catch_up_per_token_ms > 0 and kept.catch_up_per_token_ms == 0


def test_probes_are_spaced_so_their_catch_up_stays_within_budget() -> None:
    skipped = SpeculationController(num_spec_tokens=3, cost=STEP_COSTS["draft_model_skip"])
    kept = SpeculationController(num_spec_tokens=3, cost=STEP_COSTS["draft_model"])
    spacing = [skipped.probe_every_at(b) for b in (1, 8, 32, 64, 128, 256)]
    assert spacing[0] == PROBE_EVERY_STEPS  # one sequence: a probe's catch-up is a few tokens
    assert spacing == sorted(spacing) and PROBE_EVERY_STEPS < spacing[-1] <= PROBE_EVERY_MAX_STEPS
    assert all(kept.probe_every_at(b) == PROBE_EVERY_STEPS for b in (1, 8, 32, 64, 128, 256))


def test_off_at_256_streams_a_skipped_draft_probes_as_its_spacing_says() -> None:
    controller = SpeculationController(num_spec_tokens=3, cost=STEP_COSTS["draft_model_skip"], calibrate=False)
    # Nothing accepted: the controller turns drafting off, then probes.
    for _ in range(64):
        k = controller.choose(256)
        controller.observe({(k, 0): 64} if k else {})
    probes_before = controller.num_probes
    spacing = controller.probe_every_at(256)
    ks = [controller.choose(256) for _ in range(2 * spacing)]
    assert ks.count(0) >= 2 * spacing - 2 and controller.num_probes - probes_before == 2
    # Joins bring no probe forward where probes are spaced for their catch-up: half the batch is new.
    controller.observe({}, joined=200, step=(256, 0, 0, 256))
    assert controller.choose(256) == 0


def test_catch_up_ranges_are_packed_within_the_token_budget_in_order() -> None:
    assert pack_ranges([], 8) == []
    assert pack_ranges([(0, 0, 3), (1, 5, 9)], 16) == [[(0, 0, 3), (1, 5, 9)]]
    # A range past what a pass has left is split; its later piece in the next pass.
    assert pack_ranges([(0, 0, 5), (1, 10, 20)], 8) == [[(0, 0, 5), (1, 10, 13)], [(1, 13, 20)]]
    passes = pack_ranges([(2, 0, 100)], 32)
    assert [sum(hi - lo for _, lo, hi in p) for p in passes] == [32, 32, 32, 4]
    assert next(piece for p in passes for piece in p) == (2, 0, 32) and passes[-1] == [(2, 96, 100)]


@pytest.mark.slow
def test_the_pause_acceptance_bench_compares_paused_and_never_paused_engines() -> None:
    # On the CPU build nothing is skipped (V1 keeps its pass): the harness's check. The target as its
    # own draft accepts every draft, paused or not; the control engine (vLLM's pass kept) matches.
    from worker.tools.bench.pause_acceptance import bench_pause_acceptance

    result: dict[str, Any] = asyncio.run(
        bench_pause_acceptance({"MODEL_NAME": "tiny:target"}, drafts=["tiny:target"], k=3, pauses=[8], max_tokens=24)
    )
    rows = {row["case"]: row for row in result["rows"]}
    assert set(rows) == {"after_pause", "prefix_hit"}
    for row in rows.values():
        assert row["mean_acceptance_length"] == row["reference_mean_acceptance_length"] == 4.0
        assert row["keep_pass_ratio"] == 1.0 and row["within_tolerance"]
    assert result["all_within_tolerance"]


def test_a_layer_draft_keeps_the_first_layers_and_everything_else(tiny_models: Any, tmp_path: Any) -> None:
    import json

    from safetensors import safe_open

    from worker.tools.bench.layer_draft import make_layer_draft

    source = tiny_models.target
    total = json.loads((source / "config.json").read_text())["num_hidden_layers"]
    out = make_layer_draft(source, tmp_path / "draft", num_layers=1)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1 < total
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert any(n.startswith("model.layers.0.") for n in names)
    assert not any(n.startswith("model.layers.1.") for n in names)
    assert "model.embed_tokens.weight" in names and "model.norm.weight" in names
    with pytest.raises(ValueError, match="between 1 and"):
        make_layer_draft(source, tmp_path / "bad", num_layers=total)
