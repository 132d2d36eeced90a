"""The serverless handler path against the real vLLM engine (tiny model, noisy-copy draft)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.helpers import (
    assert_engine_empties,
    boot_engine,
    engine_settings,
    job_items,
    wait_for_spec_snapshot,
    worker_for,
)
from worker.boot.launch import WARMUP_SAMPLING_FEATURES, warm_up
from worker.runtime import EngineHolder
from worker.schema import parse_request
from worker.serverless import ServerlessWorker
from worker.speculation.stats.tracking import RequestEnd

pytestmark = pytest.mark.slow  # every test here boots an engine or a server


@pytest.fixture
def worker(default_engine: Any) -> ServerlessWorker:
    return worker_for(default_engine)


async def run_job(worker: ServerlessWorker, job_input: Any, job_id: str = "job") -> list[dict[str, Any]]:
    return await job_items(worker, {"id": job_id, "input": job_input})


async def test_streaming_and_non_streaming_give_the_same_text(worker: ServerlessWorker) -> None:
    # 200 tokens: vLLM merges the outputs a consumer has not read yet, and 40 tokens (~0.1 s on this
    # CPU) once arrived as one merged output on a loaded 2-core machine: one streamed item.
    job = {"prompt": "Once upon a time", "sampling_params": {"temperature": 0, "max_tokens": 200, "ignore_eos": True}}
    streamed = await run_job(worker, {**job, "stream": True})
    whole = await run_job(worker, {**job, "stream": False})
    assert len(whole) == 1 and len(streamed) > 1
    assert "".join(item["text"] for item in streamed) == whole[0]["text"]
    final = streamed[-1]
    for block in ("finish_reason", "usage", "timings", "spec_decode", "served"):
        assert block in final and block in whole[0]
    assert all(set(item) == {"text"} for item in streamed[:-1])
    assert final["usage"]["completion_tokens"] == whole[0]["usage"]["completion_tokens"] == 200
    assert final["served"]["speculative_method"] == "draft_model"
    # The boot plan's resolved choices (worker.speculation.decide) ride along: static k = 3 on V1, eager.
    keys = ("speculation_control", "model_runner", "cudagraph_mode", "torch_compile")
    plan = {key: final["served"][key] for key in keys}
    assert plan == {
        "speculation_control": "static",
        "model_runner": "cpu",
        "cudagraph_mode": "NONE",
        "torch_compile": False,
    }
    assert final["served"]["num_speculative_tokens"] == 3 and final["served"]["speculative_tokens_by_batch"] is None
    assert final["spec_decode"]["num_draft_tokens"] > 0
    timings = final["timings"]
    assert timings["time_to_first_token_ms"] > 0 and timings["end_to_end_ms"] >= timings["time_to_first_token_ms"]
    assert timings["decode_tokens_per_s"] > 0
    json.dumps(final)  # every item is plain JSON


async def test_long_generation_is_coalesced(worker: ServerlessWorker) -> None:
    items = await run_job(
        worker, {"prompt": "The", "sampling_params": {"temperature": 0, "max_tokens": 200, "ignore_eos": True}}
    )
    # Batches of 1, 3, 9, 27, 50, 50... tokens: far fewer items than tokens.
    assert items[-1]["usage"]["completion_tokens"] == 200
    assert len(items) <= 12


async def test_worker_vllms_job_fields_set_this_jobs_coalescing_and_chat(worker: ServerlessWorker) -> None:
    job = {"prompt": "The", "sampling_params": {"temperature": 0, "max_tokens": 60, "ignore_eos": True}}
    # Every item one token (up to vLLM merging outputs the handler has not read yet), or 60 tokens at most.
    small = await run_job(worker, {**job, "max_batch_size": 1})
    large = await run_job(worker, {**job, "min_batch_size": 60, "max_batch_size": 60})
    assert len(small) > len(large) and len(large) <= 3
    assert "".join(i["text"] for i in small) == "".join(i["text"] for i in large)
    chat = {"sampling_params": {"temperature": 0, "max_tokens": 20}, "stream": False}
    as_message = await run_job(worker, {**chat, "prompt": "Tell me a story.", "apply_chat_template": True})
    as_messages = await run_job(worker, {**chat, "messages": [{"role": "user", "content": "Tell me a story."}]})
    assert as_message[0]["text"] == as_messages[0]["text"]
    assert as_message[0]["usage"]["prompt_tokens"] == as_messages[0]["usage"]["prompt_tokens"]


async def test_chat_messages_use_the_chat_template(worker: ServerlessWorker) -> None:
    items = await run_job(
        worker, {"messages": [{"role": "user", "content": "Tell me a story."}], "sampling_params": {"temperature": 0}}
    )
    text = "".join(item["text"] for item in items)
    assert "Once upon a time" in text
    assert items[-1]["finish_reason"] == "stop"


async def test_json_schema_output_is_valid_json(worker: ServerlessWorker) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 12}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    items = await run_job(
        worker,
        {
            "messages": [{"role": "user", "content": "Reply in JSON."}],
            "stream": False,
            "sampling_params": {"temperature": 0, "max_tokens": 64, "structured_outputs": {"json": schema}},
        },
    )
    assert "error" not in items[0], items[0]
    value = json.loads(items[0]["text"])
    assert set(value) == {"answer"} and isinstance(value["answer"], str)


async def test_sixteen_concurrent_jobs_all_finish(worker: ServerlessWorker) -> None:
    prompts = [f"Job {i}: once upon a time" for i in range(16)]
    results = await asyncio.gather(
        *(
            run_job(
                worker,
                {"prompt": p, "sampling_params": {"temperature": 0, "max_tokens": 24, "ignore_eos": True}},
                job_id=f"j{i}",
            )
            for i, p in enumerate(prompts)
        )
    )
    for items in results:
        assert "error" not in items[-1]
        assert items[-1]["usage"]["completion_tokens"] == 24
        assert items[-1]["spec_decode"] is not None


async def test_cancelled_job_aborts_its_engine_request(worker: ServerlessWorker, default_engine: Any) -> None:
    ended: list[RequestEnd] = []
    default_engine.observers.append(ended.append)
    seen = asyncio.Event()

    async def consume() -> None:
        async for _ in worker.handle(
            {
                "id": "cancel-me",
                "input": {
                    "prompt": "The",
                    "sampling_params": {"max_tokens": 1000, "ignore_eos": True, "temperature": 0},
                },
            }
        ):
            seen.set()

    try:
        task = asyncio.create_task(consume())
        await asyncio.wait_for(seen.wait(), 60)
        await wait_for_spec_snapshot(default_engine)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await assert_engine_empties(default_engine)
    finally:
        default_engine.observers.remove(ended.append)
    cancelled = [end for end in ended if end.request_id.startswith("cancel-me")]
    assert len(cancelled) == 1 and cancelled[0].outcome == "cancelled"
    stats = cancelled[0].spec_decode
    assert stats is not None and stats.partial and stats.num_spec_steps > 0
    assert stats.num_accepted_draft_tokens <= stats.num_draft_tokens


async def test_closing_the_stream_early_aborts_its_engine_request_at_once(
    worker: ServerlessWorker, default_engine: Any
) -> None:
    ended: list[RequestEnd] = []
    default_engine.observers.append(ended.append)
    job = {
        "id": "close-me",
        "input": {"prompt": "The", "sampling_params": {"max_tokens": 1000, "ignore_eos": True, "temperature": 0}},
    }
    try:
        stream = worker.handle(job)
        first = await asyncio.wait_for(anext(stream), 60)
        assert "text" in first and "finish_reason" not in first
        await stream.aclose()  # what a consumer that stops reading does; no garbage collection needed
        # The engine request is aborted during aclose(), not whenever the generator is collected.
        closed = [end for end in ended if end.request_id.startswith("close-me")]
        assert len(closed) == 1 and closed[0].outcome == "cancelled"
        await assert_engine_empties(default_engine)
    finally:
        default_engine.observers.remove(ended.append)


@pytest.mark.parametrize(
    ("job_input", "named"),
    [
        ({"prompt": "x", "sampling_params": {"temperature": "hot"}}, "sampling_params.temperature"),
        ({"prompt": "x", "sampling_params": {"bogus": 1}}, "sampling_params.bogus: unknown field"),
        ({"prompt": "x", "extra": True}, "extra: unknown field"),
        ("just a string", "input must be a JSON object"),
        (None, "input must be a JSON object"),
        ({"prompt": "word " * 3000}, "context"),
        ({"prompt": "x", "sampling_params": {"max_tokens": 5000}}, "sampling_params.max_tokens"),
        ({"prompt": "x", "sampling_params": {"structured_outputs": {"regex": "("}}}, "Regex parsing error"),
    ],
)
async def test_bad_input_gets_a_named_error_and_the_next_job_succeeds(
    worker: ServerlessWorker, job_input: Any, named: str
) -> None:
    items = await run_job(worker, job_input)
    assert len(items) == 1 and "error" in items[0], items
    assert named in items[0]["error"]
    assert "Traceback" not in items[0]["error"] and ".cc:" not in items[0]["error"]  # no xgrammar source path
    assert items[0]["error_type"] == "invalid_request_error"
    assert "refresh_worker" not in worker.runpod_config
    ok = await run_job(
        worker, {"prompt": "The sun", "sampling_params": {"max_tokens": 4, "ignore_eos": True, "temperature": 0}}
    )
    assert ok[-1]["usage"]["completion_tokens"] == 4


async def test_missing_max_tokens_gets_the_default_not_16(worker: ServerlessWorker) -> None:
    items = await run_job(
        worker, {"prompt": "The", "stream": False, "sampling_params": {"ignore_eos": True, "temperature": 0}}
    )
    assert items[0]["usage"]["completion_tokens"] == 512


async def test_concurrency_follows_max_num_seqs(worker: ServerlessWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    await run_job(worker, {"prompt": "a", "sampling_params": {"max_tokens": 1, "temperature": 0}})
    assert worker.concurrency_modifier(0) == 16  # MAX_NUM_SEQS of the test engine
    override = ServerlessWorker(EngineHolder(settings_loader=lambda: engine_settings(MAX_CONCURRENCY=3)))
    assert override.concurrency_modifier(0) == 3


async def test_without_speculation_spec_decode_is_null(plain_engine: Any) -> None:
    worker = worker_for(plain_engine)
    items = await run_job(worker, {"prompt": "Once", "sampling_params": {"max_tokens": 8}})
    assert items[-1]["spec_decode"] is None
    assert items[-1]["served"]["speculative_method"] is None


async def test_a_request_without_a_drafting_step_says_so_not_zero_percent(worker: ServerlessWorker) -> None:
    # One token: the prompt's step yields it, and no verify step runs.
    items = await run_job(worker, {"prompt": "Once", "sampling_params": {"max_tokens": 1, "temperature": 0}})
    spec = items[-1]["spec_decode"]
    assert items[-1]["usage"]["completion_tokens"] == 1
    assert spec["num_spec_steps"] == 0 and spec["num_accepted_draft_tokens"] == 0, spec
    assert spec["mean_acceptance_length"] is None and spec["draft_acceptance_rate"] is None, spec


async def test_with_stats_turned_off_spec_decode_says_off(tiny_models: Any) -> None:
    # The configuration is the subject: the noisy-copy draft speculates, its per-request stats off.
    engine = await boot_engine(tiny_models, PER_REQUEST_SPEC_DECODE_METRICS="none")
    try:
        items = await run_job(worker_for(engine), {"prompt": "Once", "sampling_params": {"max_tokens": 8}})
        assert items[-1]["spec_decode"] == "off"
        served = items[-1]["served"]
        assert served["speculative_method"] == "draft_model" and served["spec_decode_available"] is False
    finally:
        engine.shutdown()


async def test_with_a_stream_interval_token_counts_and_stats_survive_merged_outputs(tiny_models: Any) -> None:
    engine = await boot_engine(tiny_models, STREAM_INTERVAL=8)  # the embedded default: noisy-copy draft, k=3
    try:
        worker = worker_for(engine)
        sampling = {"temperature": 0, "max_tokens": 40, "ignore_eos": True}
        request = parse_request({"prompt": "The", "sampling_params": sampling})
        chunks = [chunk async for chunk in engine.generate(request)]
        sizes = [chunk.num_tokens for chunk in chunks]
        # The first token at once, then an engine output per 8 or more tokens (a speculative step
        # can add several), then the rest with the final output.
        assert sizes[0] == 1 and all(size >= 8 for size in sizes[1:-1]) and sum(sizes) == 40
        final = chunks[-1]
        assert final.usage is not None and final.usage.completion_tokens == 40
        spec = final.spec_decode
        assert spec is not None and spec.num_draft_tokens > 0
        items = await run_job(worker, {"prompt": "The", "sampling_params": sampling})
        assert "".join(item["text"] for item in items) == "".join(chunk.text for chunk in chunks)
        assert items[-1]["spec_decode"]["num_draft_tokens"] == spec.num_draft_tokens
    finally:
        engine.shutdown()


async def _featured_warm_up_requests(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The sampling parameters (and tokens generated) of each request ``engine.warm_up`` sends."""
    sent: list[dict[str, Any]] = []
    generate = engine.generate

    async def recording(request: Any, **kwargs: Any) -> Any:
        params = request.sampling_params.model_dump()
        sent.append(params)
        tokens = 0
        async for chunk in generate(request, **kwargs):
            tokens += chunk.num_tokens
            yield chunk
        sent[-1] = {**params, "tokens": tokens}

    monkeypatch.setattr(engine, "generate", recording)
    await warm_up(engine)
    return sent


async def test_warm_up_runs_the_samplers_optional_kernels_once(
    plain_engine: Any, default_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Boot's warm-up sends a request with every optional sampling feature (penalties, top-k/p,
    min-p, seed) the engine accepts, so the first user who asks for them does not pay their lazy
    kernels; with speculation (the default engine drafts) what vLLM refuses is left out."""

    # With speculation: no min_p (vLLM refuses it), and on this CPU greedy only (engine.unsupported_sampling).
    speculating = {k: v for k, v in WARMUP_SAMPLING_FEATURES.items() if k not in ("min_p", "top_k", "top_p", "seed")}
    speculating["temperature"] = 0
    for engine, expected in ((plain_engine, WARMUP_SAMPLING_FEATURES), (default_engine, speculating)):
        sent = await _featured_warm_up_requests(engine, monkeypatch)
        featured = [p for p in sent if all(p.get(k) == v for k, v in expected.items())]
        assert len(featured) == 1 and featured[0]["tokens"] == 8, sent


@pytest.mark.parametrize("sampling", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 20}])
async def test_sampling_with_speculation_on_cpu_is_refused_and_the_engine_keeps_serving(
    worker: ServerlessWorker, default_engine: Any, sampling: dict[str, Any]
) -> None:
    """vLLM's CPU build samples wrongly with speculation (engine.unsupported_sampling says how):
    every entrypoint refuses a request that sets temperature > 0 with an error naming the cause and
    the fix, and the engine serves the next, greedy job."""
    params = {**sampling, "max_tokens": 4, "ignore_eos": True}
    (native,) = await run_job(worker, {"prompt": "The sun", "sampling_params": params})
    assert native["error_type"] == "invalid_request_error" and native["param"] == "sampling_params.temperature"
    assert "SPECULATIVE_METHOD=none" in native["error"] and "temperature 0" in native["error"]
    body = {"model": "tiny:target", "prompt": "The sun", **params}
    routed = await run_job(worker, {"openai_route": "/v1/completions", "openai_input": body})
    assert isinstance(routed[-1]["error"], str) and "SPECULATIVE_METHOD=none" in routed[-1]["error"], routed
    assert not default_engine.is_dead
    ok = await run_job(worker, {"prompt": "The sun", "sampling_params": {**params, "temperature": 0, "top_k": 0}})
    assert ok[-1]["usage"]["completion_tokens"] == 4


async def test_a_job_that_sets_no_temperature_takes_the_models_greedy_default(
    worker: ServerlessWorker, default_engine: Any
) -> None:
    """The tiny models' generation config sets temperature 0 (tiny_models.GENERATION_DEFAULTS); the
    native path applies the model's defaults to what a job leaves unset, as vLLM's OpenAI layer
    does: on the speculating CPU engine a job without a temperature is served greedily (vLLM's own
    default, 1, would be refused), on both paths, and equals the job that asks for temperature 0."""
    assert default_engine.default_sampling == {"temperature": 0.0}
    params = {"max_tokens": 12, "ignore_eos": True}
    unset = await run_job(worker, {"prompt": "The sun", "stream": False, "sampling_params": params})
    greedy = await run_job(
        worker, {"prompt": "The sun", "stream": False, "sampling_params": {**params, "temperature": 0}}
    )
    assert "error" not in unset[0], unset
    assert unset[0]["text"] == greedy[0]["text"] and unset[0]["usage"]["completion_tokens"] == 12
    body = {"model": "tiny:target", "prompt": "The sun", **params}
    (routed,) = await run_job(worker, {"openai_route": "/v1/completions", "openai_input": body})
    assert routed["choices"][0]["text"] == greedy[0]["text"], routed
