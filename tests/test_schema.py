from typing import Any

import pytest

from worker.errors import InvalidRequest
from worker.schema import parse_request


def test_prompt_request_defaults() -> None:
    request = parse_request({"prompt": "hi"})
    assert request.stream is True
    assert request.sampling_params.max_tokens is None  # the engine fills a sensible default, never 16
    assert request.sampling_params.stop == []


def test_stop_string_becomes_a_list() -> None:
    assert parse_request({"prompt": "x", "sampling_params": {"stop": "END"}}).sampling_params.stop == ["END"]


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"prompt": "x", "temperature": 0}, "temperature: unknown field"),
        ({"prompt": "x", "sampling_params": {"max_token": 5}}, "sampling_params.max_token: unknown field"),
        ({"prompt": "x", "sampling_params": {"max_tokens": "many"}}, "sampling_params.max_tokens"),
        ({"prompt": "x", "sampling_params": {"max_tokens": 0}}, "sampling_params.max_tokens"),
        ({"prompt": "x", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        ({"prompt": "x", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
        ({"prompt": "x", "sampling_params": {"n": 2}}, "sampling_params.n"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({}, "exactly one of 'prompt' or 'messages'"),
        ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "exactly one of"),
        ({"messages": [{"role": "robot", "content": "y"}]}, "messages.0.role"),
        ({"messages": []}, "messages"),
        ({"prompt": "x", "stream": "yes please"}, "stream"),
        ({"prompt": "x", "sampling_params": {"structured_outputs": {}}}, "exactly one of json"),
        (
            {"prompt": "x", "sampling_params": {"structured_outputs": {"json": {"type": "nope"}}}},
            "not a valid JSON schema",
        ),
        ({"prompt": "x", "sampling_params": {"stop": [""]}}, "stop strings must not be empty"),
    ],
)
def test_bad_input_gets_an_error_naming_the_field(data: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(data)
    assert named in info.value.message


@pytest.mark.parametrize("data", [None, [], "prompt", 3])
def test_non_object_input_is_refused(data: object) -> None:
    with pytest.raises(InvalidRequest, match="must be a JSON object"):
        parse_request(data)


def test_error_messages_do_not_echo_input() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request({"prompt": "x", "sampling_params": {"max_tokens": "SECRET-VALUE"}})
    assert "SECRET-VALUE" not in info.value.message
