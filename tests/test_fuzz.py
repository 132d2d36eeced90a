"""Property-based fuzzing of the handler input and of OpenAI request bodies (pod and openai_route).

Every generated case must get a typed error (a 4xx in pod mode) or a result; none may crash
the worker, and a valid request right after still succeeds. The native input's engine-free
parts use FakeEngine (named as such); the OpenAI bodies go to vLLM's own layer over the real
CPU engine, which no fake can stand in for, as does a sample of fuzzed native inputs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes import FakeEngine
from tests.helpers import job_items, worker_for
from worker.errors import InvalidRequest
from worker.pod import create_app
from worker.schema import parse_request
from worker.serverless import ServerlessWorker

NUM_CASES = 1000

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


def _cases_run(check: Any) -> int:
    """Run the Hypothesis test ``check`` (its own settings) and return how many examples it drew."""
    drawn = [0]
    inner = check.hypothesis.inner_test

    def counting(data: Any) -> None:
        drawn[0] += 1
        inner(data)

    check.hypothesis.inner_test = counting
    check()
    return drawn[0]


@settings(max_examples=NUM_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=handler_inputs)
def _validation_never_crashes(data: Any) -> None:
    try:
        request = parse_request(data)
    except InvalidRequest as exc:
        assert exc.message and "Traceback" not in exc.message and len(exc.message) < 4000
        return
    assert request.prompt is not None or request.messages is not None


def test_handler_input_validation_never_crashes() -> None:
    drawn = _cases_run(_validation_never_crashes)
    print(json.dumps({"fuzzed_cases": {"handler_validation": drawn}}))
    assert drawn >= NUM_CASES


def _fake_worker() -> ServerlessWorker:
    return worker_for(FakeEngine(words=3))


@settings(max_examples=NUM_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=handler_inputs)
def _jobs_end_with_a_result_or_a_typed_error(data: Any) -> None:
    worker = _fake_worker()

    async def run() -> list[Any]:
        return await job_items(worker, {"id": "fuzz", "input": data})

    items = asyncio.run(run())
    assert items
    last = items[-1]
    if isinstance(last, dict) and "error" in last:
        error = last["error"]
        message = error["message"] if isinstance(error, dict) else error
        assert isinstance(message, str) and "Traceback" not in message
    json.dumps(items)
    assert "refresh_worker" not in worker.runpod_config


def test_handler_jobs_end_with_a_result_or_a_typed_error() -> None:
    drawn = _cases_run(_jobs_end_with_a_result_or_a_typed_error)
    print(json.dumps({"fuzzed_cases": {"handler_jobs": drawn}}))
    assert drawn >= NUM_CASES


chat_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["tiny:target", "other"]) | json_values,
        "messages": messages | json_values,
        "prompt": st.text(max_size=100) | json_values,
        # Small or invalid: a valid body without a bound would generate to the end of the context.
        "max_tokens": st.integers(min_value=-2, max_value=8) | json_values.filter(lambda v: not isinstance(v, int)),
        "temperature": json_values,
        "stream": st.booleans() | json_values,
        "response_format": st.fixed_dictionaries(
            {"type": st.sampled_from(["json_schema", "json_object", "text", "x"]), "json_schema": json_values}
        )
        | json_values,
        "stream_options": json_values,
    },
)


NUM_OPENAI_CASES = 400  # each valid one runs the real engine on 2 CPU cores
openai_cases = st.tuples(
    st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses"]),
    chat_bodies.map(
        lambda b: json.dumps({"max_tokens": 4, "max_output_tokens": 4, "temperature": 0, **b}, allow_nan=True).encode()
    )
    | st.binary(max_size=300),
)


@pytest.fixture(scope="module")
async def pod_and_worker(default_engine: Any) -> AsyncIterator[tuple[httpx.AsyncClient, ServerlessWorker]]:
    worker = worker_for(default_engine, MAX_REQUEST_BYTES="65536", DEFAULT_MAX_TOKENS="8")
    await worker.holder.openai()
    app = create_app(worker.holder, boot_on_startup=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pod", timeout=120) as http:
        yield http, worker


@pytest.mark.slow
async def test_openai_bodies_get_4xx_never_5xx_through_pod_and_route(
    pod_and_worker: tuple[httpx.AsyncClient, ServerlessWorker], default_engine: Any
) -> None:
    http, worker = pod_and_worker
    for _ in range(NUM_OPENAI_CASES):
        route, body = openai_cases.example()
        response = await http.post(route, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code in (200, 400, 404, 413, 422), (route, body[:200], response.text[:300])
        if response.status_code != 200:
            assert "error" in response.json(), (route, body[:200], response.text[:300])
            error = response.json()["error"]
            assert error["message"] and "Traceback" not in error["message"]
        try:
            openai_input = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            continue
        job = {"id": "fuzz", "input": {"openai_route": route, "openai_input": openai_input}}
        items = await job_items(worker, job)
        assert items
        if isinstance(items[-1], dict) and "error" in items[-1]:
            assert isinstance(items[-1]["error"], str) and "Traceback" not in items[-1]["error"]
        json.dumps(items)
    assert default_engine.num_unfinished_requests == 0
    assert "refresh_worker" not in worker.runpod_config


@pytest.mark.slow
async def test_pod_extremes_and_recovery(pod_and_worker: tuple[httpx.AsyncClient, ServerlessWorker]) -> None:
    http, _ = pod_and_worker
    deep = b"[" * 100_000 + b"]" * 100_000
    huge = json.dumps({"model": "tiny:target", "prompt": "x" * 100_000}).encode()
    utf16_odd = b'p\x00."\x17Vq'  # read as UTF-16 (a NUL second byte), an odd length: found by the fuzz test above
    for body, status in [
        (deep, 413),
        (huge, 413),
        (b"\xff\xfe\x00bad", 400),
        (utf16_odd, 400),
        (b"[" * 5000 + b"]" * 5000, 400),
    ]:
        response = await http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == status, (status, response.text[:200])
        assert "error" in response.json(), response.text[:200]  # OpenAI's shape, not FastAPI's
    ok = await http.post(
        "/v1/completions", json={"model": "tiny:target", "prompt": "hi", "max_tokens": 3, "temperature": 0}
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


@pytest.mark.slow
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
        items = await job_items(worker, {"id": "fuzz", "input": case})
        assert items and ("error" in items[-1] or "finish_reason" in items[-1]), items[-1]
    ok_job = {
        "id": "ok",
        "input": {"prompt": "The", "sampling_params": {"max_tokens": 5, "ignore_eos": True, "temperature": 0}},
    }
    ok = await job_items(worker, ok_job)
    assert ok[-1]["usage"]["completion_tokens"] == 5
    assert default_engine.num_unfinished_requests == 0
    assert "refresh_worker" not in worker.runpod_config
