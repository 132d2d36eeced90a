"""Property-based fuzzing of the handler input and the pod server's request bodies.

Every generated case must get a typed error (a 4xx in pod mode) or a result; none may crash
the worker, and a valid request right after still succeeds. Engine-free parts use FakeEngine
(named as such); a sample of fuzzed inputs also goes through the real engine.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import engine_settings, worker_for
from worker.errors import InvalidRequest
from worker.pod import create_app
from worker.runtime import EngineHolder
from worker.schema import parse_request
from worker.serverless import ServerlessWorker
from worker.testing import FakeEngine

NUM_CASES = 1000
COUNTS: dict[str, int] = {}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=50),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=25,
)
SAMPLING_KEYS = [
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "n",
    "structured_outputs",
    "bogus",
]
roles = st.sampled_from(["system", "user", "assistant", "tool", "robot", "", None])
messages = st.lists(st.fixed_dictionaries({"role": roles, "content": st.text(max_size=40) | json_values}), max_size=4)
near_valid_inputs = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.text(max_size=200) | json_values,
        "messages": messages | json_values,
        "sampling_params": st.dictionaries(st.sampled_from(SAMPLING_KEYS), json_values, max_size=6) | json_values,
        "stream": st.booleans() | json_values,
        "unknown": json_values,
    },
)
handler_inputs = near_valid_inputs | json_values


@settings(max_examples=NUM_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=handler_inputs)
def test_handler_input_validation_never_crashes(data: Any) -> None:
    COUNTS["handler_validation"] = COUNTS.get("handler_validation", 0) + 1
    try:
        request = parse_request(data)
    except InvalidRequest as exc:
        assert exc.message and "Traceback" not in exc.message and len(exc.message) < 4000
        return
    assert request.prompt is not None or request.messages is not None


def _fake_worker() -> ServerlessWorker:
    return worker_for(FakeEngine(words=3))


@settings(max_examples=NUM_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=handler_inputs
    | st.fixed_dictionaries(
        {
            "openai_route": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/models", "/v2/x", 5]),
            "openai_input": json_values,
        }
    )
)
def test_handler_jobs_end_with_a_result_or_a_typed_error(data: Any) -> None:
    COUNTS["handler_jobs"] = COUNTS.get("handler_jobs", 0) + 1
    worker = _fake_worker()

    async def run() -> list[Any]:
        return [item async for item in worker.handle({"id": "fuzz", "input": data})]

    items = asyncio.run(run())
    assert items
    last = items[-1]
    if isinstance(last, dict) and "error" in last:
        error = last["error"]
        message = error["message"] if isinstance(error, dict) else error
        assert isinstance(message, str) and "Traceback" not in message
    json.dumps(items)
    assert "refresh_worker" not in worker.runpod_config


def _pod_client() -> TestClient:
    fake = FakeEngine(words=3)

    async def factory(settings: Any) -> FakeEngine:
        return fake

    holder = EngineHolder(settings_loader=lambda: engine_settings(MAX_REQUEST_BYTES="65536"), engine_factory=factory)
    return TestClient(create_app(holder))


chat_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["tiny:target", "other"]) | json_values,
        "messages": messages | json_values,
        "prompt": st.text(max_size=100) | json_values,
        "max_tokens": json_values,
        "temperature": json_values,
        "stream": st.booleans() | json_values,
        "response_format": st.fixed_dictionaries(
            {"type": st.sampled_from(["json_schema", "json_object", "text", "x"]), "json_schema": json_values}
        )
        | json_values,
        "stream_options": json_values,
    },
)


@settings(max_examples=NUM_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    body=chat_bodies.map(lambda b: json.dumps(b, allow_nan=True).encode()) | st.binary(max_size=300),
)
def test_pod_bodies_get_4xx_never_5xx(route: str, body: bytes) -> None:
    COUNTS["pod_bodies"] = COUNTS.get("pod_bodies", 0) + 1
    with _pod_client() as client:
        response = client.post(route, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code in (200, 400, 404, 413), response.text
        if response.status_code != 200:
            error = response.json()["error"]
            assert error["message"] and "Traceback" not in error["message"]


def test_pod_extremes_and_recovery() -> None:
    with _pod_client() as client:
        deep = b"[" * 100_000 + b"]" * 100_000
        huge = json.dumps({"model": "tiny:target", "prompt": "x" * 100_000}).encode()
        for body, status in [(deep, 413), (huge, 413), (b"\xff\xfe\x00bad", 400), (b"[" * 5000 + b"]" * 5000, 400)]:
            response = client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
            assert response.status_code == status, (status, response.text[:200])
        ok = client.post("/v1/completions", json={"model": "tiny:target", "prompt": "hi", "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "w0 w1 w2 "


def test_report_case_counts(capsys: Any) -> None:
    total = sum(COUNTS.values())
    print(json.dumps({"fuzzed_cases": COUNTS, "total": total}))
    assert all(count >= NUM_CASES for count in COUNTS.values())


async def test_fuzzed_inputs_through_the_real_engine(default_engine: Any) -> None:
    worker = worker_for(default_engine)
    cases: list[Any] = [handler_inputs.example() for _ in range(40)] + [
        {"prompt": "x" * 20_000},
        {"prompt": "hi", "sampling_params": {"max_tokens": 10**12}},
        {"prompt": "hi", "sampling_params": {"structured_outputs": {"json": {"type": "object", "properties": 5}}}},
        {"prompt": "hi", "sampling_params": {"structured_outputs": {"grammar": "not a grammar ::= ("}}},
        {"messages": [{"role": "user", "content": "\\ud800 \\x00 \\uffff"}], "sampling_params": {"max_tokens": 4}},
    ]
    for case in cases:
        items = [item async for item in worker.handle({"id": "fuzz", "input": case})]
        assert items and ("error" in items[-1] or "finish_reason" in items[-1]), items[-1]
    ok_job = {"id": "ok", "input": {"prompt": "The", "sampling_params": {"max_tokens": 5, "ignore_eos": True}}}
    ok = [item async for item in worker.handle(ok_job)]
    assert ok[-1]["usage"]["completion_tokens"] == 5
    assert default_engine.num_unfinished_requests == 0
    assert "refresh_worker" not in worker.runpod_config
