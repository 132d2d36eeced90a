"""vLLM's OpenAI layer over the worker's engine, through the pod (official openai client) and the
handler's openai_route: tool calls, n, logprobs, the Responses API, LoRA, exact stats on stop strings.

One real CPU engine (tiny target, noisy-copy draft, a tiny LoRA adapter) serves both entrypoints:
the pod app is driven in-process through httpx's ASGI transport, the route through the handler.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import jsonschema
import openai
import pytest

from tests.helpers import LORA_ENV, assert_engine_empties, job_items, wait_for_spec_snapshot, worker_for
from worker.pod import create_app
from worker.runtime import EngineHolder
from worker.serverless import ServerlessWorker
from worker.speculation.stats.tracking import RequestEnd, RequestTracker

pytestmark = pytest.mark.slow  # every test here boots an engine or a server

MODEL = "tiny:target"
ADAPTER = "tiny-lora"
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True},
    }
]
ENTRYPOINTS = ["pod", "route"]


class Both:
    """The same OpenAI request through the pod app or the handler's openai_route."""

    def __init__(self, holder: EngineHolder) -> None:
        self.worker = ServerlessWorker(holder)
        app = create_app(holder, boot_on_startup=False)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pod", timeout=120)
        # Any: the tests send plain dicts, not the SDK's TypedDicts (and its httpx is its own package).
        self.client: Any = openai.AsyncOpenAI(
            base_url="http://pod/v1", api_key="none", http_client=cast(Any, self.http)
        )

    async def native(self, job_input: dict[str, Any]) -> dict[str, Any]:
        """The last item of a native job (its whole answer with ``stream: false``)."""
        items = await job_items(self.worker, {"id": "native", "input": job_input})
        return dict(items[-1])

    async def route(self, path: str, body: dict[str, Any] | None = None) -> list[Any]:
        job_input: dict[str, Any] = {"openai_route": path}
        if body is not None:
            job_input["openai_input"] = body
        return await job_items(self.worker, {"id": "openai-test", "input": job_input})

    async def ask(self, entry: str, path: str, body: dict[str, Any]) -> Any:
        """The response object, or with ``stream`` the list of event objects (``[DONE]`` dropped)."""
        if entry == "pod":
            if body.get("stream"):
                async with self.http.stream("POST", path, json=body) as response:
                    assert response.status_code == 200, await response.aread()
                    text = "".join([part async for part in response.aiter_text()])
            else:
                response = await self.http.post(path, json=body)
                assert response.status_code == 200, response.text
                return response.json()
        else:
            items = await self.route(path, body)
            assert not any(isinstance(item, dict) and "error" in item for item in items), items
            if not body.get("stream"):
                (only,) = items
                return only
            assert all(isinstance(item, str) and item.endswith("\n\n") for item in items), items
            text = "".join(items)
        # Chat and completions end with [DONE]; the Responses API names each event instead.
        data = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
        if data[-1] == "[DONE]":
            data.pop()
        return [json.loads(line) for line in data]


@pytest.fixture(scope="module")
async def both(default_engine: Any) -> AsyncIterator[Both]:
    """The session's engine (its LoRA adapter named ADAPTER) under vLLM's OpenAI layer."""
    worker = worker_for(default_engine, **LORA_ENV)
    await worker.holder.openai()
    yield Both(worker.holder)


def tool_arguments(message: dict[str, Any]) -> dict[str, Any]:
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, WEATHER_SCHEMA)
    return dict(arguments)


@pytest.mark.parametrize("entry", ENTRYPOINTS)
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_forced_tool_calls_are_parsed_and_follow_the_schema(both: Both, entry: str, tool_choice: Any) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": TOOLS,
        "tool_choice": tool_choice,
        "max_tokens": 100,
        "temperature": 0,
    }
    response = await both.ask(entry, "/v1/chat/completions", body)
    tool_arguments(response["choices"][0]["message"])

    events = await both.ask(entry, "/v1/chat/completions", {**body, "stream": True})
    # Streamed tool calls come as deltas: the name once, the arguments in pieces.
    pieces = [
        call["function"].get("arguments") or ""
        for event in events
        for choice in event["choices"]
        for call in choice["delta"].get("tool_calls") or []
    ]
    arguments = json.loads("".join(pieces))
    jsonschema.validate(arguments, WEATHER_SCHEMA)


async def test_tool_call_with_the_official_client(both: Both) -> None:
    response = await both.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Oslo for 3 days?"}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=100,
        temperature=0,
    )
    (call,) = response.choices[0].message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)


@pytest.fixture(scope="module")
async def plain(plain_engine: Any) -> AsyncIterator[Both]:
    """vLLM's OpenAI layer over the session's engine without speculation (it samples on any machine)."""
    worker = worker_for(plain_engine)
    await worker.holder.openai()
    yield Both(worker.holder)


@pytest.mark.parametrize("entry", ENTRYPOINTS)
async def test_n_choices_and_logprobs(plain: Both, both: Both, entry: str) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "n": 3, "temperature": 1.0, "seed": 7}
    response = await plain.ask(entry, "/v1/completions", body)
    assert sorted(choice["index"] for choice in response["choices"]) == [0, 1, 2]

    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    response = await both.ask(entry, "/v1/chat/completions", chat)
    content = response["choices"][0]["logprobs"]["content"]
    assert len(content) == response["usage"]["completion_tokens"]
    assert all(len(token["top_logprobs"]) == 2 for token in content)


@pytest.mark.parametrize("entry", ENTRYPOINTS)
async def test_responses_api(both: Both, entry: str) -> None:
    body = {"model": MODEL, "input": "Once upon a time", "max_output_tokens": 8, "temperature": 0}
    response = await both.ask(entry, "/v1/responses", body)
    assert response["object"] == "response" and response["status"] == "incomplete"
    text = response["output"][0]["content"][0]["text"]
    assert text and response["usage"]["output_tokens"] == 8

    events = await both.ask(entry, "/v1/responses", {**body, "stream": True})
    deltas = "".join(e.get("delta", "") for e in events if e.get("type") == "response.output_text.delta")
    assert deltas == text
    assert events[-1]["type"] in ("response.completed", "response.incomplete")


async def test_responses_with_the_official_client(both: Both) -> None:
    response = await both.client.responses.create(model=MODEL, input="The sun rose", max_output_tokens=8, temperature=0)
    assert response.output_text


async def test_lora_adapter_is_listed_selected_by_name_and_changes_the_output(both: Both) -> None:
    models = {model.id async for model in both.client.models.list()}
    assert models == {MODEL, ADAPTER}
    prompt = "Once upon a time"
    base = await both.client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    adapted = await both.client.completions.create(model=ADAPTER, prompt=prompt, max_tokens=12, temperature=0)
    assert adapted.choices[0].text != base.choices[0].text

    options = {"max_tokens": 12, "temperature": 0}
    native = await both.native({"prompt": prompt, "lora": ADAPTER, "stream": False, "sampling_params": options})
    assert native["text"] == adapted.choices[0].text

    with pytest.raises(openai.NotFoundError):
        await both.client.completions.create(model="no-such-adapter", prompt=prompt, max_tokens=2, temperature=0)
    unknown = await both.native({"prompt": prompt, "lora": "nope", "sampling_params": {"temperature": 0}})
    assert unknown["error_type"] == "invalid_request_error"
    assert "'nope'" in unknown["error"] and ADAPTER in unknown["error"]


async def test_base_model_requests_batched_with_adapter_requests_get_no_adapter(both: Both) -> None:
    """On vLLM's CPU build a token without an adapter reads the last adapter slot (an open vLLM
    bug; ``engine_args.lora_slots`` keeps that slot empty): found by the soak, where base-model
    answers came back as the adapter's whenever the two shared a batch."""
    prompt = "He counted one, two,"

    async def text(model: str) -> str:
        answer = await both.client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
        return str(answer.choices[0].text)

    base, adapted = await text(MODEL), await text(ADAPTER)
    assert base != adapted
    together = await asyncio.gather(*(text(model) for model in (ADAPTER, MODEL, ADAPTER, MODEL, MODEL)))
    assert together == [adapted, base, adapted, base, base]


@pytest.mark.parametrize("entry", ENTRYPOINTS)
async def test_stop_string_endings_carry_exact_stats(both: Both, entry: str) -> None:
    prompt = "He counted one, two,"
    options = {"temperature": 0, "max_tokens": 60, "stop": ["seven"]}
    native = await both.native({"prompt": prompt, "stream": False, "sampling_params": options})
    assert native["finish_reason"] == "stop" and native["stop_reason"] == "seven"
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 60, "stop": ["seven"]}
    response = await both.ask(entry, "/v1/completions", body)
    assert response["choices"][0]["stop_reason"] == "seven"
    stats = response["metrics"]["speculative_decoding"]
    # vLLM's own server returns none here; the worker's scheduler makes the final output carry them.
    ours = native["spec_decode"]
    assert stats["acceptance_histogram"] == ours["acceptance_histogram"] and stats["num_spec_steps"] > 0
    assert stats["num_draft_tokens"] == ours["num_draft_tokens"]
    assert stats["num_accepted_draft_tokens"] == ours["num_accepted_draft_tokens"]


async def test_route_errors_are_readable_strings_and_the_worker_keeps_serving(both: Both) -> None:
    cases: list[tuple[str, dict[str, Any] | None, str]] = [
        ("/v1/chat/completions", {"model": MODEL}, "messages"),
        ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, "gpt-4"),
        ("/v1/no-such-route", {}, "no route"),
        ("/v1/chat/completions", None, "needs openai_input"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "structured_outputs": {"regex": "("}}, "Regex parsing"),
    ]
    for path, body, named in cases:
        (item,) = await both.route(path, body)
        assert isinstance(item["error"], str) and named in item["error"], item
        assert ".cc:" not in item["error"]  # xgrammar's own source path stays out
        assert item["error_type"] in ("invalid_request_error", "not_found_error")
    # A body vLLM's pydantic models refuse: a sentence naming the fields, vLLM's own object beside it.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "many", "n": []}
    (item,) = await both.route("/v1/chat/completions", body)
    assert item["error"].startswith("openai_input.max_tokens: input should be a valid integer"), item
    assert "openai_input.n: " in item["error"] and "{'type'" not in item["error"] and "\n" not in item["error"]
    assert item["status"] == 400 and "validation error" in item["openai_error"]["message"]
    (bad_input,) = await job_items(both.worker, {"id": "x", "input": {"openai_route": 7}})
    assert bad_input["error_type"] == "invalid_request_error" and "openai_route" in bad_input["error"]
    (models,) = await both.route("/v1/models")
    assert {m["id"] for m in models["data"]} == {MODEL, ADAPTER}


async def test_a_failure_inside_vllms_generate_is_answered_as_itself_and_logged(
    both: Both, default_engine: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's ``generate`` wraps what it did not expect in an ``EngineGenerateError`` with no message
    (a named tool call on vLLM 0.34 got a 500 with an empty message and no log line). A fake: the
    engine's ``add_request`` fails as a bug inside vLLM would, which a real engine does not do on
    demand. The pod (streamed or not), the route and a native job each name the failure's type, and
    the log has its traceback once a request; a ``ValueError`` (vLLM's request checks) is the
    client's 400 with its message, logged as no error; the worker keeps serving."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    job = {"prompt": "Hi", "sampling_params": {"max_tokens": 4, "temperature": 0}}
    for failure, status in ((RuntimeError("a fake failure inside vLLM"), 500), (ValueError("a fake check"), 400)):

        async def failing_add_request(*args: Any, failure: Exception = failure, **kwargs: Any) -> Any:
            raise failure

        with monkeypatch.context() as patch:
            patch.setattr(default_engine.llm, "add_request", failing_add_request)
            caplog.clear()
            response = await both.http.post("/v1/chat/completions", json=body)
            async with both.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as streamed:
                events = [line async for line in streamed.aiter_lines() if line.startswith("data: {")]
            (item,) = await both.route("/v1/chat/completions", body)
            native = await both.native(job)
        expected = "internal error (RuntimeError)" if status == 500 else "a fake check"
        assert response.status_code == status and response.json()["error"]["message"] == expected, response.text
        (event,) = events
        assert json.loads(event.removeprefix("data: "))["error"]["message"] == expected, events
        assert item["status"] == status and item["error"] == expected, item
        assert native["error"] == expected, native
        assert native["error_type"] == ("server_error" if status == 500 else "invalid_request_error"), native
        logged = [r for r in caplog.records if r.exc_info and r.exc_info[1] is failure]
        # Once each: the pod, its stream, the route and the native job; a client's error never.
        assert len(logged) == (4 if status == 500 else 0), [(r.name, r.getMessage()) for r in logged]
        assert all(r.levelname == "ERROR" for r in logged)
    ok = await both.ask("pod", "/v1/chat/completions", body)
    assert ok["usage"]["completion_tokens"] == 4


async def test_route_stream_closed_early_aborts_the_engine_request(both: Both) -> None:
    engine = both.worker.holder.engine
    assert engine is not None
    ended: list[RequestEnd] = []
    engine.observers.append(ended.append)
    body = {"model": MODEL, "prompt": "The", "max_tokens": 900, "ignore_eos": True, "stream": True, "temperature": 0}
    job = {"id": "close-me", "input": {"openai_route": "/v1/completions", "openai_input": body}}
    try:
        items: AsyncGenerator[Any, None] = both.worker.handle(job)
        first = await anext(items)
        assert first.startswith("data: ") and engine.num_unfinished_requests == 1
        await anext(items)
        await wait_for_spec_snapshot(engine)
        await items.aclose()  # what RunPod's SDK does with a cancelled job's generator
        await assert_engine_empties(engine)
    finally:
        engine.observers.remove(ended.append)
    assert [end.outcome for end in ended] == ["cancelled"]
    assert ended[0].spec_decode is not None and ended[0].spec_decode.partial


async def test_route_stream_items_hold_whole_events_on_the_readme_schedule(both: Both) -> None:
    """What the README promises of an openai_route stream: each item one or more whole events, the
    first exactly one, then up to 1, 3, 9, ... events, the last ending with [DONE]; joined, the
    event stream itself."""
    body = {"model": MODEL, "prompt": "The", "max_tokens": 80, "ignore_eos": True, "temperature": 0, "stream": True}
    items = await both.route("/v1/completions", body)
    events = [[e + "\n\n" for e in item.split("\n\n") if e] for item in items]
    assert all(isinstance(item, str) and item == "".join(group) for item, group in zip(items, events, strict=True))
    assert all(e.startswith("data: ") for group in events for e in group)
    sizes = [len(group) for group in events]
    assert sizes[0] == 1 and all(size <= limit for size, limit in zip(sizes[1:-1], [1, 3, 9, 27, 50], strict=False))
    # 80 tokens, about 30 events (a speculative step's event carries several; on a loaded machine
    # vLLM merges outputs the stream has not yet taken: 30 tokens once came as only 13 events), then [DONE].
    assert items[-1].endswith("data: [DONE]\n\n") and sizes[1:4] == [1, 3, 9]
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "**one or more whole server-sent events**, coalesced as the native stream is" in readme


async def test_sampling_with_speculation_on_cpu_is_a_400_naming_the_cause_on_pod_and_route(both: Both) -> None:
    """The CPU build's lossy sampler (engine.unsupported_sampling), refused through vLLM's layer too:
    the pod answers 400 (OpenAI's error object), the route an error item. (Leaving the temperature
    out is served: the tiny model's generation config makes it 0.)"""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    response = await both.http.post("/v1/chat/completions", json={**body, "temperature": 1})
    assert response.status_code == 400, response.text
    assert "SPECULATIVE_METHOD=none" in response.json()["error"]["message"]
    (item,) = await both.route("/v1/chat/completions", {**body, "temperature": 0.9})
    assert item["status"] == 400 and "temperature 0.9" in item["error"] and "SPECULATIVE_METHOD=none" in item["error"]
    ok = await both.ask("route", "/v1/chat/completions", {**body, "temperature": 0})
    assert ok["usage"]["completion_tokens"] == 4


async def test_media_urls_reach_the_workers_guarded_connector_on_pod_and_route(both: Both) -> None:
    """vLLM's layer loads the connector ``VLLM_MEDIA_CONNECTOR`` names in this process: the worker's
    (tests/test_media.py: it refuses inside addresses). With this text-only model an image part is
    a 400 on both paths, before any fetch."""
    import vllm.envs as envs
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    from worker.vllm_internals.media import PublicMediaConnector

    assert isinstance(MEDIA_CONNECTOR_REGISTRY.load(envs.VLLM_MEDIA_CONNECTOR), PublicMediaConnector)
    content = [
        {"type": "text", "text": "What is in it?"},
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}},
    ]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    response = await both.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    (item,) = await both.route("/v1/chat/completions", body)
    assert item["status"] == 400 and isinstance(item["error"], str), item


@pytest.mark.parametrize("entry", ENTRYPOINTS)
async def test_unstreamed_requests_report_the_engines_time_to_first_token(
    both: Both, entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request vLLM's layer does not stream gets one engine output, at its end: its time to first
    token (worker_time_to_first_token_seconds) is vLLM's measure, not the time of that output."""
    engine = both.worker.holder.engine
    assert engine is not None
    ended: list[RequestEnd] = []
    vllms: list[float] = []  # vLLM's own time to first token, as the request's final output carries it
    finish = RequestTracker.finish

    def finish_noting_vllms(tracker: RequestTracker, completion: Any, *, stats: Any = None) -> Any:
        vllms.append(stats.first_token_latency)
        return finish(tracker, completion, stats=stats)

    monkeypatch.setattr(RequestTracker, "finish", finish_noting_vllms)
    engine.observers.append(ended.append)
    body = {"model": MODEL, "prompt": "The", "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    try:
        response = await both.ask(entry, "/v1/completions", body)
    finally:
        engine.observers.remove(ended.append)
    assert response["usage"]["completion_tokens"] == 300
    (end,), (vllms_ttft,) = ended, vllms
    assert end.outcome == "finished" and vllms_ttft > 0
    # vLLM's measure itself (old: the time the one output came, at the request's end).
    assert end.time_to_first_token_s == vllms_ttft
