"""Pod mode against the real CPU engine: the official openai client, /health, /metrics, parity."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import TINY_DEFAULT_SERVED, free_port, tiny_default, wait_until_ready, worker_for

pytestmark = pytest.mark.slow  # every test here boots an engine or a server

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "test-key-0123456789"
MODEL = "tiny:target"
# vLLM's per-request timings in an answer's metrics block (--enable-per-request-metrics).
TIMING_FIELDS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second"}


class PodServer:
    def __init__(self, base: str, statuses: list[int]) -> None:
        self.base = base
        self.statuses_while_starting = statuses

    def client(self, *, api_key: str = API_KEY) -> Any:  # Any: the tests send plain dicts, not the SDK's TypedDicts
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, timeout=120)

    def async_client(self) -> Any:
        return openai.AsyncOpenAI(base_url=self.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.base + "/metrics", timeout=30).text
        return {
            sample.name + json.dumps(sample.labels, sort_keys=True): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


@pytest.fixture(scope="module")
def pod(subprocess_env: dict[str, str]) -> Iterator[PodServer]:
    port = free_port()
    env = tiny_default({**subprocess_env, "API_KEY": API_KEY, "MAX_NUM_SEQS": "16"})
    del env["VLLM_WORKER_MULTIPROC_METHOD"]  # the pod's own default (spawn), which the other pods skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        yield PodServer(base, wait_until_ready(base, proc, timeout_s=240))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_health_is_503_while_booting_then_200(pod: PodServer) -> None:
    assert pod.statuses_while_starting[0] == 503
    assert pod.statuses_while_starting[-1] == 200
    assert httpx.get(pod.base + "/ping", timeout=5).status_code == 200


def test_models(pod: PodServer) -> None:
    assert [m.id for m in pod.client().models.list().data] == [MODEL]


def test_plan_shows_what_the_boot_resolved(pod: PodServer) -> None:
    """The job's served block, at /plan: the tiny default's draft model, static, on V1, eager."""
    answer = httpx.get(pod.base + "/plan", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
    assert answer.json() == {**TINY_DEFAULT_SERVED, "model": MODEL}


def test_chat_completion_with_usage_and_stats(pod: PodServer) -> None:
    response = pod.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}], temperature=0, max_tokens=48
    )
    assert response.object == "chat.completion"
    assert response.choices[0].message.content.startswith("Once upon a time")
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens > 0
    assert response.usage.prompt_tokens_details.cached_tokens >= 0
    metrics = response.model_extra["metrics"]
    assert TIMING_FIELDS <= {name for name, value in metrics.items() if value is not None}
    spec = metrics["speculative_decoding"]
    assert spec["num_draft_tokens"] >= spec["num_accepted_draft_tokens"] > 0
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"]
    )


def test_prefix_cache_hits_show_as_cached_tokens(pod: PodServer) -> None:
    messages = [
        {"role": "system", "content": "You are a storyteller. " * 12},
        {"role": "user", "content": "Tell me a story."},
    ]
    client = pod.client()
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16


def test_chat_stream_with_include_usage(pod: PodServer) -> None:
    stream = pod.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to ten."}],
        temperature=0,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("He counted one, two, three")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens > 0
    # The same metrics block as a whole answer's, on OpenAI's usage chunk (no choices).
    metrics = usage_chunk.model_extra["metrics"]
    assert TIMING_FIELDS <= {name for name, value in metrics.items() if value is not None}
    assert metrics["speculative_decoding"]["num_spec_steps"] > 0


async def test_async_completions_stream_and_not(pod: PodServer) -> None:
    client = pod.async_client()
    options: dict[str, Any] = {"temperature": 0, "max_tokens": 20, "extra_body": {"ignore_eos": True}}
    whole = await client.completions.create(model=MODEL, prompt="Once upon a time", **options)
    assert whole.object == "text_completion" and whole.usage.completion_tokens == 20
    stream = await client.completions.create(model=MODEL, prompt="Once upon a time", stream=True, **options)
    text = "".join([c.choices[0].text async for c in stream])
    assert text == whole.choices[0].text
    await client.close()


@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
def test_response_format_gives_valid_json(pod: PodServer, kind: str) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 10}, "ok": {"type": "boolean"}},
        "required": ["answer", "ok"],
        "additionalProperties": False,
    }
    fmt: dict[str, Any] = (
        {"type": "json_object"}
        if kind == "json_object"
        else {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    )
    response = pod.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Reply in JSON."}],
        response_format=fmt,
        max_tokens=200,
        temperature=0,
    )
    value = json.loads(response.choices[0].message.content)
    assert isinstance(value, dict)
    if kind == "json_schema":
        assert set(value) == {"answer", "ok"} and isinstance(value["ok"], bool)


def test_api_key_is_required(pod: PodServer) -> None:
    with pytest.raises(openai.AuthenticationError):
        pod.client(api_key="wrong").models.list()
    assert httpx.get(pod.base + "/v1/models", timeout=5).status_code == 401
    assert httpx.get(pod.base + "/plan", timeout=5).status_code == 401  # it names the model, as /v1/models does
    for probe in ("/health", "/ping", "/metrics"):  # load balancers and scrapers send no key
        assert httpx.get(pod.base + probe, timeout=5).status_code == 200, probe


@pytest.mark.parametrize(
    ("body", "status", "named"),
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 9}, 400, "temperature"),
        ({"model": MODEL, "messages": [], "max_tokens": 3}, 400, "message"),
        ({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 404, "`gpt-4` does not exist"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x " * 3000}]}, 400, "context"),
    ],
)
def test_bad_requests_get_openai_errors(pod: PodServer, body: dict[str, Any], status: int, named: str) -> None:
    response = httpx.post(
        pod.base + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert named in error["message"] and "Traceback" not in error["message"]
    assert pod.client().models.list().data  # still serving


def test_invalid_json_body_is_a_400(pod: PodServer) -> None:
    response = httpx.post(
        pod.base + "/v1/completions",
        content=b"{not json",
        timeout=30,
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]


def test_metrics_histograms_move_with_speculated_requests(pod: PodServer) -> None:
    before = pod.metrics()
    for _ in range(3):
        pod.client().completions.create(model=MODEL, prompt="The worker", max_tokens=16, temperature=0)
    after = pod.metrics()
    key = "worker_request_acceptance_length_count{}"
    assert after[key] == before.get(key, 0) + 3
    assert (
        after["worker_request_acceptance_rate_count{}"] == before.get("worker_request_acceptance_rate_count{}", 0) + 3
    )
    assert any(name.startswith("vllm:spec_decode_num_draft_tokens") for name in after)
    # vLLM's metrics name the served model, as vLLM's server labels them, not the resolved path.
    labels = [json.loads(name[name.index("{") :]) for name in after if name.startswith("vllm:")]
    assert {label["model_name"] for label in labels if "model_name" in label} == {MODEL}
    assert any(name.startswith("vllm:kv_cache_usage_perc") for name in after)
    assert after['worker_requests_total{"outcome": "finished"}'] >= 3


def test_client_disconnect_mid_stream_aborts_the_engine_request(pod: PodServer) -> None:
    body = {"model": MODEL, "prompt": "The", "max_tokens": 900, "ignore_eos": True, "stream": True, "temperature": 0}
    with httpx.stream(
        "POST", pod.base + "/v1/completions", json=body, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert pod.metrics()["worker_requests_in_engine{}"] == 1
    deadline = time.time() + 20
    while time.time() < deadline and pod.metrics()["worker_requests_in_engine{}"] != 0:
        time.sleep(0.2)
    assert pod.metrics()["worker_requests_in_engine{}"] == 0
    assert pod.metrics()['worker_requests_total{"outcome": "cancelled"}'] >= 1


async def test_parity_native_handler_openai_route_and_pod(pod: PodServer, default_engine: Any) -> None:
    worker = worker_for(default_engine)
    messages = [{"role": "user", "content": "Why is decode slow?"}]

    async def run(job_input: dict[str, Any]) -> list[Any]:
        return [item async for item in worker.handle({"id": "parity", "input": job_input})]

    sampling = {"temperature": 0, "max_tokens": 40}
    (native,) = await run({"messages": messages, "stream": False, "sampling_params": sampling})
    openai_input = {"model": MODEL, "messages": messages, **sampling}
    (route,) = await run({"openai_route": "/v1/chat/completions", "openai_input": openai_input})
    streamed_lines = await run(
        {
            "openai_route": "/v1/chat/completions",
            "openai_input": {**openai_input, "stream": True, "stream_options": {"include_usage": True}},
        }
    )
    pod_response = pod.client().chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40)

    assert route["object"] == "chat.completion"
    texts = {native["text"], route["choices"][0]["message"]["content"], pod_response.choices[0].message.content}
    assert len(texts) == 1
    counts = {
        native["usage"]["completion_tokens"],
        route["usage"]["completion_tokens"],
        pod_response.usage.completion_tokens,
    }
    prompts = {native["usage"]["prompt_tokens"], route["usage"]["prompt_tokens"], pod_response.usage.prompt_tokens}
    assert len(counts) == 1 and len(prompts) == 1

    # Events coalesced into items as the native stream's tokens are; joined, a valid event stream.
    assert len(streamed_lines) > 1 and all(item.endswith("\n\n") for item in streamed_lines)
    data = [line.removeprefix("data: ") for line in "".join(streamed_lines).splitlines() if line]
    assert data[-1] == "[DONE]"
    events = [json.loads(line) for line in data[:-1]]
    streamed_text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert streamed_text == native["text"]
    assert events[-1]["usage"]["completion_tokens"] == native["usage"]["completion_tokens"]

    models = await run({"openai_route": "/v1/models"})
    assert models[0]["data"][0]["id"] == MODEL
    bad = await run({"openai_route": "/v1/chat/completions", "openai_input": {"model": MODEL}})
    assert bad[0]["error_type"] == "invalid_request_error" and "messages" in bad[0]["error"]
