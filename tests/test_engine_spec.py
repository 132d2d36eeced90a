"""Per-request acceptance stats from the real vLLM engine on CPU, for each kind of draft."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.helpers import boot_engine
from worker.schema import SpecDecodeStats, StreamChunk, parse_request

PROMPTS = [
    "Once upon a time",
    "The worker streams",
    "A GPU reads every weight",
    # Repeats itself: the n-gram proposer finds its continuation in the prompt.
    "He counted one, two, three, four, five, six, seven, eight, nine, ten. He counted one, two, three,",
]
DRAFTS: dict[str, dict[str, str]] = {
    "self": {"SPECULATIVE_MODEL": "tiny:target"},
    "noisy": {"SPECULATIVE_MODEL": "tiny:noisy"},
    "unrelated": {"SPECULATIVE_MODEL": "tiny:unrelated"},
    "ngram": {"SPECULATIVE_METHOD": "ngram"},
}
# The draft-acceptance rate each draft must land in, at temperature 0.
EXPECTED_RATE = {"self": (0.99, 1.0), "noisy": (0.15, 0.9), "unrelated": (0.0, 0.1), "ngram": (0.05, 1.0)}


@pytest.fixture(scope="module", params=list(DRAFTS))
async def spec_engine(
    request: pytest.FixtureRequest, tiny_models: Any, default_engine: Any
) -> AsyncIterator[tuple[str, Any]]:
    if request.param == "noisy":  # the embedded default's configuration: the session's shared engine
        yield request.param, default_engine
        return
    engine = await boot_engine(tiny_models, MODEL_NAME="tiny:target", NUM_SPECULATIVE_TOKENS=3, **DRAFTS[request.param])
    yield request.param, engine
    engine.shutdown()


async def run(engine: Any, data: dict[str, Any]) -> list[StreamChunk]:
    return [chunk async for chunk in engine.generate(parse_request(data))]


def check_invariants(stats: SpecDecodeStats) -> None:
    assert stats.num_accepted_draft_tokens <= stats.num_draft_tokens
    assert stats.num_draft_tokens <= stats.num_spec_steps * stats.num_spec_tokens
    assert len(stats.acceptance_histogram) == stats.num_spec_tokens + 1
    assert sum(stats.acceptance_histogram) == stats.num_spec_steps
    if stats.num_draft_tokens:
        assert stats.draft_acceptance_rate == pytest.approx(stats.num_accepted_draft_tokens / stats.num_draft_tokens)
    if stats.num_spec_steps:
        assert stats.mean_acceptance_length == pytest.approx(1 + stats.num_accepted_draft_tokens / stats.num_spec_steps)


@pytest.mark.slow
async def test_acceptance_matches_the_draft(spec_engine: tuple[str, Any]) -> None:
    name, engine = spec_engine
    assert engine.served.speculative_method == ("ngram" if name == "ngram" else "draft_model")
    drafted = accepted = 0
    for prompt in PROMPTS:
        chunks = await run(engine, {"prompt": prompt, "sampling_params": {"temperature": 0, "max_tokens": 48}})
        final = chunks[-1]
        assert final.is_final and all(not c.is_final for c in chunks[:-1])
        stats = final.spec_decode
        assert stats is not None and not stats.partial
        check_invariants(stats)
        assert final.usage is not None
        # A draft model drafts at every step after the prefill, and each verify step yields
        # 1 + accepted tokens, the last step's surplus beyond max_tokens being dropped.
        # (The n-gram proposer skips steps where it finds no match.)
        if final.finish_reason == "length" and name != "ngram":
            produced = stats.num_spec_steps + stats.num_accepted_draft_tokens
            expected = final.usage.completion_tokens - 1
            assert expected <= produced <= expected + stats.num_spec_tokens
        drafted += stats.num_draft_tokens
        accepted += stats.num_accepted_draft_tokens
    low, high = EXPECTED_RATE[name]
    assert drafted > 0
    rate = accepted / drafted if drafted else 0.0
    assert low <= rate <= high, f"{name}: acceptance {rate:.3f} outside [{low}, {high}]"


@pytest.mark.slow
async def test_stop_string_request_still_has_exact_stats(spec_engine: tuple[str, Any]) -> None:
    _, engine = spec_engine
    params = {"temperature": 0, "max_tokens": 60, "stop": ["seven"]}
    chunks = await run(engine, {"prompt": PROMPTS[-1], "sampling_params": params})
    final = chunks[-1]
    assert final.finish_reason == "stop" and final.stop_reason == "seven"
    assert "seven" not in "".join(c.text for c in chunks)
    assert final.spec_decode is not None, "vLLM returns no metrics for stop strings; the worker must"
    assert final.spec_decode.num_spec_steps > 0
    check_invariants(final.spec_decode)


@pytest.mark.slow
async def test_eos_and_length_endings_have_stats(spec_engine: tuple[str, Any]) -> None:
    _, engine = spec_engine
    by_eos = await run(
        engine,
        {
            "messages": [{"role": "user", "content": "Count to ten."}],
            "sampling_params": {"temperature": 0, "max_tokens": 200},
        },
    )
    by_length = await run(engine, {"prompt": "The sun rose", "sampling_params": {"temperature": 0, "max_tokens": 5}})
    # The chat turn ends on the model's end-of-turn token: a stop with a token id, no string.
    assert by_eos[-1].finish_reason == "stop"
    assert by_eos[-1].stop_reason is None or isinstance(by_eos[-1].stop_reason, int)
    assert by_length[-1].finish_reason == "length"
    assert by_length[-1].usage is not None and by_length[-1].usage.completion_tokens == 5
    for chunks in (by_eos, by_length):
        assert chunks[-1].spec_decode is not None
        check_invariants(chunks[-1].spec_decode)


def test_the_hook_snapshots_stop_string_requests_every_step_and_the_others_every_eighth() -> None:
    # vLLM's scheduler reduced to what the hook reads and returns (a stand-in: the engine tests
    # above run the hook inside the real engine core); vLLM's own request, output and metrics types.
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    from worker.spec_scheduler import SNAPSHOT_EVERY_STEPS, SpecMetricsSnapshots

    class Core:
        def __init__(self) -> None:
            self.requests: dict[str, Any] = {}

        def add_request(self, request: Any) -> None:
            self.requests[request.request_id] = request

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            return {0: EngineCoreOutputs(outputs=[EngineCoreOutput(rid, [1]) for rid in self.requests])}

    class Hooked(SpecMetricsSnapshots, Core):
        pass

    scheduler = Hooked()
    for rid, stop in (("stop", ["x"]), ("plain", None)):
        metrics = RequestSpecDecodeMetrics.new(3)
        scheduler.add_request(
            SimpleNamespace(request_id=rid, spec_decode_metrics=metrics, sampling_params=SamplingParams(stop=stop))
        )
    snapshot_steps: dict[str, list[int]] = {"stop": [], "plain": []}
    for step in range(1, 2 * SNAPSHOT_EVERY_STEPS + 1):
        for request in scheduler.requests.values():
            request.spec_decode_metrics.observe(num_draft_tokens=3, num_accepted=step % 4)
        if step == SNAPSHOT_EVERY_STEPS + 1:
            del scheduler.requests["stop"]  # finished: pruned at the next snapshot step
        for output in scheduler.update_from_output(None, None)[0].outputs:
            live = scheduler.requests[output.request_id].spec_decode_metrics
            if output.spec_decode_metrics is not None:
                snapshot_steps[output.request_id].append(step)
                assert output.spec_decode_metrics == live and output.spec_decode_metrics is not live
    assert snapshot_steps["stop"] == list(range(1, SNAPSHOT_EVERY_STEPS + 1))
    assert snapshot_steps["plain"] == [SNAPSHOT_EVERY_STEPS, 2 * SNAPSHOT_EVERY_STEPS]
    assert scheduler._stop_ids == set()
