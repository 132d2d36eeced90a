"""Per-request acceptance stats from the real vLLM engine on CPU, for each kind of draft."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.helpers import assert_engine_empties, boot_engine
from worker.schema import SpecDecodeStats, StreamChunk, parse_request
from worker.speculation.stats.tracking import Release, RequestEnd

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
async def test_a_stop_string_request_reports_exactly_the_counts_of_the_steps_it_kept(
    spec_engine: tuple[str, Any],
) -> None:
    # The request ended by a stop string must report the counts of every step up to the one that
    # completed it, and of none after (the core answers the frontend's abort, a step or more on).
    _, engine = spec_engine
    assert await _ended_by_stop_as_by_length(engine, [(stop, 60) for stop in ["seven", ",", " five", "ix", "t"]]) >= 3


async def _ended_by_stop_as_by_length(engine: Any, cases: list[tuple[str, int]]) -> int:
    """Per (stop string, max_tokens): the greedy request ended by the stop string against the same
    request cut by max_tokens at that step's last kept token, which ends in the core with vLLM's
    own counts of the same steps: equal. How many ended on their stop string."""
    checked = 0
    for stop, max_tokens in cases:
        params = {"temperature": 0, "max_tokens": max_tokens, "stop": [stop]}
        by_stop = (await run(engine, {"prompt": PROMPTS[-1], "sampling_params": params}))[-1]
        if by_stop.finish_reason != "stop" or by_stop.stop_reason != stop:
            continue
        assert by_stop.usage is not None and by_stop.spec_decode is not None
        params = {"temperature": 0, "max_tokens": by_stop.usage.completion_tokens}
        by_length = (await run(engine, {"prompt": PROMPTS[-1], "sampling_params": params}))[-1]
        assert by_length.finish_reason == "length" and by_length.spec_decode is not None
        assert by_stop.spec_decode.model_dump() == by_length.spec_decode.model_dump(), stop
        checked += 1
    return checked


# How long a held-back abort may wait for the core's outputs: past it the engine has hung.
ABORT_DEADLINE_S = 60.0


def _aborts(engine: Any, monkeypatch: pytest.MonkeyPatch, *, after_outputs: int | None) -> list[list[str]]:
    """Hold back the frontend's aborts of requests it ended on a stop string until the engine core
    has sent ``after_outputs`` more outputs of each (it runs on past the stop string meanwhile) or
    ended it itself (max_tokens, EOS); None: never send them. The abort is sent from a task of its
    own: vLLM's output handler awaits the call, and must go on reading. Returns the aborts that
    waited ``ABORT_DEADLINE_S`` for that (the test fails on any)."""
    core = engine.llm.engine_core
    processor = engine.exact_stop_stats
    send = core.abort_requests_async
    process = processor.process_outputs
    ended: set[str] = set()
    stuck: list[list[str]] = []

    def process_noting_ends(outputs: Any, *args: Any, **kwargs: Any) -> Any:
        ended.update(o.request_id for o in outputs if o.finish_reason is not None)
        return process(outputs, *args, **kwargs)

    def caught_up(request_ids: list[str], count: int) -> bool:
        held = processor.outputs_after_stop()
        return all(rid not in held or rid in ended or held[rid] >= count for rid in request_ids)

    async def later(request_ids: list[str], count: int) -> None:
        deadline = time.monotonic() + ABORT_DEADLINE_S
        while not caught_up(request_ids, count):
            if time.monotonic() > deadline:
                stuck.append(request_ids)
                break
            await asyncio.sleep(0.002)
        await send(request_ids)

    async def held_back(request_ids: list[str]) -> None:
        if after_outputs is not None:
            tasks.add(task := asyncio.get_running_loop().create_task(later(list(request_ids), after_outputs)))
            task.add_done_callback(tasks.discard)

    tasks: set[asyncio.Task[None]] = set()
    monkeypatch.setattr(core, "abort_requests_async", held_back)
    monkeypatch.setattr(processor, "process_outputs", process_noting_ends)
    # This engine is shared: what a test switches off or counts here goes back to what it was.
    for name in ("is_holding", "holding_off_reason", "num_unanswered", "wait_s"):
        monkeypatch.setattr(processor, name, getattr(processor, name))
    return stuck


def _releases(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[Release]:
    """How the frontend releases each stop string's final output from now on (the records its
    requests' ends carry to the engine's observers)."""
    found: list[Release] = []

    def observe(end: RequestEnd) -> None:
        if end.release is not None:
            found.append(end.release)

    monkeypatch.setattr(engine, "observers", [*engine.observers, observe])
    return found


@pytest.mark.slow
async def test_steps_the_core_ran_past_a_stop_string_are_taken_off(
    spec_engine: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The abort lands only once the core has sent two more outputs of the request (it ran two
    # steps past the stop string, or ended the request on max_tokens: the last two lengths), and
    # its answer must lead to the same counts.
    _, engine = spec_engine
    releases = _releases(engine, monkeypatch)
    stuck = _aborts(engine, monkeypatch, after_outputs=2)
    cases = [("seven", 200), (",", 200), (" five", 200), ("ix", 24), ("t", 20)]
    assert await _ended_by_stop_as_by_length(engine, cases) >= 3
    assert not stuck
    # A stop string found in the core's own final output needs no abort: not held.
    assert sum(r.is_exact for r in releases) >= 3 and all(r.is_exact for r in releases), releases
    assert sum(r.num_outputs_taken_off for r in releases) >= len(releases), releases


@pytest.mark.slow
async def test_without_the_core_s_answer_a_stop_string_ends_with_partial_counts(
    default_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The abort never reaches the core, so no answer comes: the final output is released after
    # the wait with the last periodic snapshot (if any), marked partial, and the request ends.
    processor = default_engine.exact_stop_stats
    releases = _releases(default_engine, monkeypatch)
    _aborts(default_engine, monkeypatch, after_outputs=None)
    processor.wait_s = 0.3
    params = {"temperature": 0, "max_tokens": 40, "stop": ["seven"]}
    final = (await run(default_engine, {"prompt": PROMPTS[-1], "sampling_params": params}))[-1]
    assert final.finish_reason == "stop" and final.stop_reason == "seven"
    assert final.spec_decode is not None and final.spec_decode.partial
    assert [(r.outcome, r.reason) for r in releases] == [("partial", "no_answer")]
    assert not processor.outputs_after_stop()
    assert processor.is_holding  # one unanswered stop string does not switch holding off
    await assert_engine_empties(default_engine)  # the core ends the request itself (max_tokens)


@pytest.mark.slow
async def test_a_core_that_never_answers_switches_holding_off(
    default_engine: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The boot's check passed on this engine; made again on a core whose answers never come (the
    # aborts are swallowed: what a vLLM upgrade that broke the answer looks like from the
    # frontend), it switches holding off for the engine's life, loudly. From then on no stop
    # string waits: its final output goes out at once, its counts marked partial, and Prometheus
    # counts each release by outcome and reason.
    from worker.boot.launch import check_exact_stop_stats
    from worker.metrics import WorkerMetrics

    processor = default_engine.exact_stop_stats
    assert processor is not None and processor.is_holding
    _aborts(default_engine, monkeypatch, after_outputs=None)
    with caplog.at_level(logging.ERROR, logger="worker.vllm_internals.frontend"):
        assert not await check_exact_stop_stats(default_engine, wait_s=0.3)
    assert not processor.is_holding
    assert "exact spec-decode stats for stop strings are off" in caplog.text and "no_answer" in caplog.text
    metrics = WorkerMetrics(num_spec_tokens=3, threshold=1.5, window=50)
    releases = _releases(default_engine, monkeypatch)
    default_engine.observers.append(metrics.observe)
    processor.wait_s = 3600.0  # a stop string that waited would hang the test (and fail it on its timeout)
    params = {"temperature": 0, "max_tokens": 40, "stop": ["seven"]}
    jobs = [run(default_engine, {"prompt": PROMPTS[-1], "sampling_params": params}) for _ in range(3)]
    finals = [chunks[-1] for chunks in await asyncio.gather(*jobs)]
    assert all(f.finish_reason == "stop" and f.spec_decode is not None and f.spec_decode.partial for f in finals)
    assert [(r.reason, r.held_s) for r in releases] == [("holding_off", 0.0)] * 3 and not processor.outputs_after_stop()
    counted = metrics.registry.get_sample_value(
        "worker_spec_decode_releases_total", {"outcome": "partial", "reason": "holding_off"}
    )
    assert counted == 3
    await assert_engine_empties(default_engine)


@pytest.mark.slow
async def test_a_held_final_output_is_released_when_the_engine_fails(
    default_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stop string's final output waits for the core's answer; the engine failing meanwhile (vLLM
    # propagates the error to every request it still tracks, which no longer includes this one)
    # releases it at once: its text is complete, its counts partial.
    from vllm.v1.engine.exceptions import EngineDeadError

    processor = default_engine.exact_stop_stats
    releases = _releases(default_engine, monkeypatch)
    _aborts(default_engine, monkeypatch, after_outputs=None)
    processor.wait_s = 3600.0
    params = {"temperature": 0, "max_tokens": 40, "stop": ["seven"]}
    task = asyncio.create_task(run(default_engine, {"prompt": PROMPTS[-1], "sampling_params": params}))
    deadline = time.monotonic() + ABORT_DEADLINE_S
    while not processor.outputs_after_stop() and not task.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)  # polled: vLLM's output handler holds it on its own turn
    assert processor.outputs_after_stop() and not task.done()
    processor.propagate_error(EngineDeadError())
    final = (await asyncio.wait_for(task, ABORT_DEADLINE_S))[-1]
    assert final.finish_reason == "stop" and final.stop_reason == "seven"
    assert final.spec_decode is not None and final.spec_decode.partial
    assert [r.reason for r in releases] == ["engine_error"] and not processor.outputs_after_stop()
    await assert_engine_empties(default_engine)


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
