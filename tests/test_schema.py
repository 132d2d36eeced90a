from typing import Any

import pytest

from tests.helpers import TINY_DEFAULT_SERVED
from worker.errors import InvalidRequest
from worker.schema import ChatMessage, Served, StreamChunk, parse_batch_sizes, parse_request
from worker.speculation.stats.acceptance import spec_stats_from_histogram


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
        ({"prompt": "x", "temperature": 0}, "temperature: unknown field (did you mean sampling_params.temperature?)"),
        (
            {"prompt": "x", "sampling_params": {"max_token": 5}},
            "sampling_params.max_token: unknown field (did you mean sampling_params.max_tokens?)",
        ),
        (
            {"prompt": "x", "sampling_params": {"maxTokens": 5}},
            "sampling_params.maxTokens: unknown field (did you mean sampling_params.max_tokens?)",
        ),
        ({"prompt": "x", "strem": False}, "strem: unknown field (did you mean stream?)"),
        ({"prompt": "x", "sampling_params": {"colour": 1}}, "sampling_params.colour: unknown field"),
        ({"prompt": "x", "sampling_params": {"max_tokens": "many"}}, "sampling_params.max_tokens"),
        ({"prompt": "x", "sampling_params": {"max_tokens": 0}}, "sampling_params.max_tokens"),
        ({"prompt": "x", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        ({"prompt": "x", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
        ({"prompt": "x", "sampling_params": {"n": 2}}, "sampling_params.n: a native job returns one completion"),
        ({"prompt": "x", "stream": "yes"}, "stream: Input should be a valid boolean"),
        ({"prompt": "x", "stream": 1}, "stream: Input should be a valid boolean"),
        (
            {"prompt": "x", "sampling_params": {"max_tokens": "3"}},
            "sampling_params.max_tokens: Input should be a valid",
        ),
        ({"prompt": "x", "sampling_params": {"seed": 1.5}}, "sampling_params.seed"),
        ({"prompt": "x", "sampling_params": {"ignore_eos": "true"}}, "sampling_params.ignore_eos"),
        ({"prompt": "x", "max_batch_size": "8"}, "max_batch_size"),
        ({"prompt": "x", "batch_size_growth_factor": 0.5}, "batch_size_growth_factor"),
        ({"prompt": "x", "use_openai_format": True}, "use_openai_format: worker-vllm's field; here an OpenAI-shaped"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({}, "exactly one of 'prompt' or 'messages'"),
        ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "exactly one of"),
        ({"messages": [{"role": "robot", "content": "y"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "y"}]}]},
            "messages.0.content: a native job's message content is text; content parts (images, ...) go through an "
            "openai_route job",
        ),
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


def test_numbers_keep_their_json_types() -> None:
    options = parse_request({"prompt": "x", "sampling_params": {"temperature": 0, "max_tokens": 3}}).sampling_params
    assert options.temperature == 0.0 and options.max_tokens == 3


def test_worker_vllms_job_fields_keep_their_meaning() -> None:
    request = parse_request(
        {
            "prompt": "Hi",
            "apply_chat_template": True,
            "max_batch_size": 8,
            "min_batch_size": 2,
            "batch_size_growth_factor": 2,
        }
    )
    assert request.chat == [ChatMessage(role="user", content="Hi")]
    assert (request.max_batch_size, request.min_batch_size, request.batch_size_growth_factor) == (8, 2, 2.0)
    assert parse_request({"prompt": "Hi"}).chat is None  # the prompt as it is
    messages = parse_request({"messages": [{"role": "user", "content": "Hi"}], "apply_chat_template": False})
    assert messages.chat == messages.messages  # messages always take the chat template, as in worker-vllm


def test_an_openai_jobs_coalescing_fields_are_checked_too() -> None:
    assert parse_batch_sizes({"max_batch_size": 4}).max_batch_size == 4
    with pytest.raises(InvalidRequest, match="min_batch_size"):
        parse_batch_sizes({"min_batch_size": 0})


def test_the_native_n_error_names_what_serves_several_completions() -> None:
    # openai_route takes n, but vLLM refuses n > 1 at temperature 0 ("n must be 1 when using greedy
    # sampling") and a speculating engine on vLLM's CPU build refuses temperature > 0: the pointer says both.
    with pytest.raises(InvalidRequest) as caught:
        parse_request({"prompt": "x", "sampling_params": {"n": 2}})
    message = caught.value.message
    assert "\n" not in message and message.startswith("sampling_params.n: a native job returns one completion")
    assert "openai_route job with n and temperature > 0" in message
    assert "on vLLM's CPU build that needs SPECULATIVE_METHOD=none" in message


def _final_spec_decode(**served: Any) -> Any:
    """The wire's ``spec_decode`` of a final item without stats, served as ``served`` says."""
    chunk = StreamChunk(text="", finish_reason="stop", served=Served(**{**TINY_DEFAULT_SERVED, **served}))
    return chunk.to_wire()["spec_decode"]


def test_spec_decode_tells_stats_off_from_no_speculation_and_from_stats() -> None:
    # Speculating without the worker's stats (PER_REQUEST_SPEC_DECODE_METRICS=none): "off".
    assert _final_spec_decode(spec_decode_available=False) == "off"
    # No speculation: null.
    no_spec = {"speculative_method": None, "num_speculative_tokens": None, "speculation_control": None}
    assert _final_spec_decode(**no_spec, spec_decode_available=False) is None
    # Stats: the block, whatever the served block says.
    stats = spec_stats_from_histogram([1, 0, 0, 0], num_draft_tokens=3, num_spec_tokens=3)
    chunk = StreamChunk(text="", finish_reason="stop", spec_decode=stats, served=Served(**TINY_DEFAULT_SERVED))
    assert chunk.to_wire()["spec_decode"]["mean_acceptance_length"] == 1.0
