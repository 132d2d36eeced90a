"""A draft model without its pass at k = 0 (worker/vllm_internals/draft_skip.py, GPU only): decided
once by the plan, carried to the engine core by one marker, priced by the cost model, its probes
spaced for their catch-up, and its catch-up packed within the engine's token budget. The skip
itself runs on vLLM 0.34's V2 runner, a GPU's; on the CPU build (0.32's V1 proposer, which keeps
its pass) the acceptance-after-a-pause bench runs as a harness check."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from worker.boot.plan import build_plan
from worker.config import load_settings
from worker.errors import ConfigError
from worker.speculation.controller import PROBE_EVERY_MAX_STEPS, PROBE_EVERY_STEPS, SpeculationController
from worker.speculation.cost import STEP_COSTS, step_ms
from worker.speculation.decide import decide
from worker.vllm_internals.draft_catch_up import pack_ranges
from worker.vllm_internals.plugin import DRAFT_SKIP_ENV, apply_draft_skip

REAL = {"MODEL_NAME": "org/model"}
DRAFT = {**REAL, "SPECULATIVE_MODEL": "org/draft", "NUM_SPECULATIVE_TOKENS": "3"}
NGRAM = {**REAL, "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
EAGLE = {**REAL, "SPECULATIVE_CONFIG": '{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 4}'}


def test_the_plan_skips_a_draft_models_pass_where_asked_on_a_gpu_only() -> None:
    skip = {**DRAFT, "SKIP_DRAFT_PASS": "true"}
    for mode in ("pod", "serverless"):
        # Off until measured on a GPU: vLLM's pass runs unless asked.
        assert not decide(load_settings(DRAFT), mode=mode, is_cpu=False).skips_draft_pass
        assert decide(load_settings(skip), mode=mode, is_cpu=False).skips_draft_pass
        static = load_settings({**skip, "SPECULATION_CONTROL": "static"})
        assert decide(static, mode=mode, is_cpu=False).skips_draft_pass
        # The CPU build's proposer keeps its pass.
        assert not decide(load_settings(skip), mode=mode, is_cpu=True).skips_draft_pass


def test_a_skip_without_a_draft_model_is_refused() -> None:
    # n-gram has no pass; an EAGLE head needs the target's hidden states to catch up, which the target
    # does not keep; no speculation, nothing to skip: a setting without effect is refused.
    for env in (EAGLE, NGRAM, REAL):
        with pytest.raises(ConfigError, match="SKIP_DRAFT_PASS=true needs a separate draft model"):
            load_settings({**env, "SKIP_DRAFT_PASS": "true"})


def test_the_engine_core_is_told_by_one_marker() -> None:
    skip = {**DRAFT, "SKIP_DRAFT_PASS": "true"}
    assert build_plan(load_settings(skip), mode="pod", is_cpu=False).environment[DRAFT_SKIP_ENV] == "1"
    for env, is_cpu in ((skip, True), (DRAFT, False)):
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


class StandInDraftSpeculator:
    """A stand-in (a fake) for vLLM 0.34's V2 draft-model speculator, a GPU-only class: its pass reads
    the draft KV of every position before the step's first and writes it as vLLM's does, the step's
    accepted tokens and the one-ahead correction token, ``[start, start + valid]``; its drafts
    write the positions after that with tokens a later pass overwrites. It records each read of a
    position whose draft KV is missing or holds another token."""

    def __init__(self, *, max_num_reqs: int, max_num_tokens: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.draft_tokens = torch.zeros(max_num_reqs, 3, dtype=torch.int64)
        self.kv: dict[int, dict[int, int]] = {}  # slot -> position -> token its draft KV holds
        self.bad_reads: list[tuple[int, int]] = []
        self.num_passes = 0

    def add_request(self, req_index: int) -> None:
        pass

    def read(self, slot: int, end: int) -> None:
        kv = self.kv.setdefault(slot, {})
        self.bad_reads += [(slot, p) for p in range(end) if kv.get(p) != token(p)]

    def propose(self, input_batch: Any, *, num_speculative_tokens: int | None = None, **_: Any) -> torch.Tensor:
        self.num_passes += 1
        for row in range(input_batch.num_reqs):
            slot, start, valid = int(input_batch.idx_mapping_np[row]), input_batch.starts[row], input_batch.valid[row]
            self.read(slot, start)
            kv = self.kv.setdefault(slot, {})
            kv.update({p: token(p) for p in range(start, start + valid + 1)})
            kv.update({p: -1 for p in range(start + valid + 1, start + valid + (num_speculative_tokens or 0))})
        return self.draft_tokens[: input_batch.num_reqs]


def token(position: int) -> int:
    return 1000 + position  # every request's token at a position: the check needs only one truth


def _skipping_stand_in(*, catches_up: bool, max_num_tokens: int = 64) -> Any:
    import types

    import numpy as np

    from worker.vllm_internals.draft_catch_up import SkipBookkeeping

    class SkippingStandIn(SkipBookkeeping, StandInDraftSpeculator):
        def _skips(self) -> bool:
            return True

        def _prefill_ranges(self, ranges: list[tuple[int, int, int]]) -> None:
            assert sum(hi - lo for _, lo, hi in ranges) <= self.max_num_tokens
            for slot, lo, hi in ranges:
                self.read(slot, lo)
                self.kv.setdefault(slot, {}).update({p: token(p) for p in range(lo, hi)})

    spec = SkippingStandIn(max_num_reqs=8, max_num_tokens=max_num_tokens)
    req_states = types.SimpleNamespace(num_computed_tokens_np=np.zeros(8, dtype=np.int32), index_to_req_id={})
    spec.init_bookkeeping(req_states=req_states, device="cpu", covers_hits=True, catches_up=catches_up)
    return spec


def _drive(spec: Any, *, seed: int, num_steps: int = 400) -> None:
    """Requests join (some on a prefix-cache hit, in prompt chunks), decode with random acceptance
    and end, under a k that pauses for stretches of 1 to 40 steps; vLLM's order of calls."""
    import random
    import types

    import numpy as np

    rng = random.Random(seed)
    live: dict[int, dict[str, int]] = {}  # slot -> computed, prompt, drafts (verified this step), left
    k = 3
    for _ in range(num_steps):
        for slot in [s for s in range(8) if s not in live and rng.random() < 0.15]:
            hit = rng.choice([0, 0, 16, 48])
            spec._req_states.num_computed_tokens_np[slot] = hit
            spec._req_states.index_to_req_id[slot] = f"r{slot}"
            if hit and not spec._has_skipped:  # blocks a real pass wrote: they hold the draft's KV
                spec.kv[slot] = {p: token(p) for p in range(hit + 1)}
            elif hit:  # blocks possibly written while the draft was off: none of the draft's KV
                spec.kv[slot] = {}
            else:
                spec.kv[slot] = {}
            spec.add_request(slot)
            live[slot] = {"computed": hit, "prompt": hit + rng.randint(1, 40), "drafts": 0, "left": rng.randint(5, 80)}
        if not live:
            continue
        slots, starts, valid, lens = [], [], [], []
        for slot, r in live.items():
            slots.append(slot)
            starts.append(r["computed"])
            if r["computed"] < r["prompt"]:  # a prompt chunk: up to 24 tokens a step
                n = min(24, r["prompt"] - r["computed"])
                lens.append(n)
                valid.append(n)
            else:
                lens.append(1 + r["drafts"])
                valid.append(1 + rng.randint(0, r["drafts"]))
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
        query_start_loc = np.zeros(len(slots) + 1, dtype=np.int32)
        np.cumsum(lens, out=query_start_loc[1:])
        batch = types.SimpleNamespace(
            num_reqs=len(slots),
            idx_mapping=torch.tensor(slots, dtype=torch.int64),
            idx_mapping_np=np.array(slots),
            positions=torch.from_numpy(positions),
            query_start_loc=torch.from_numpy(query_start_loc),
            starts=starts,
            valid=valid,
        )
        if rng.random() < 0.1:
            k = 0 if k else 3  # a pause starts or ends
        spec.propose(batch, num_speculative_tokens=k)
        for slot, n in zip(slots, valid, strict=True):
            r = live[slot]
            is_prompt = r["computed"] < r["prompt"]
            r["computed"] += n
            r["drafts"] = k if r["computed"] >= r["prompt"] else 0
            if not is_prompt:
                r["left"] -= n
            if r["left"] <= 0:  # ended: vLLM frees the slot
                del live[slot]
                spec._req_states.index_to_req_id.pop(slot, None)


@pytest.mark.parametrize("seed", range(6))
def test_after_a_pause_every_drafting_pass_reads_draft_kv_of_the_right_tokens(seed: int) -> None:
    spec = _skipping_stand_in(catches_up=True)
    _drive(spec, seed=seed)
    assert spec.num_skipped_steps > 20 and spec.num_catch_up_tokens > 0
    assert spec.bad_reads == []


def test_without_the_catch_up_a_drafting_pass_reads_missing_kv() -> None:
    # The negative control (the seam's no-catch-up hook): the same runs read KV that was never written.
    for seed in range(6):
        spec = _skipping_stand_in(catches_up=False)
        _drive(spec, seed=seed)
        assert spec.num_skipped_steps > 20 and spec.num_catch_up_tokens == 0
        assert spec.bad_reads, seed


def test_a_catch_up_longer_than_the_token_budget_is_split_across_passes() -> None:
    spec = _skipping_stand_in(catches_up=True, max_num_tokens=8)
    _drive(spec, seed=3)
    assert spec.bad_reads == [] and spec.num_catch_up_tokens > 8
