"""Every exception becomes a readable, typed error payload; nothing internal leaks."""

from __future__ import annotations

from worker.errors import EngineDead, InvalidRequest, one_line, to_error_payload, to_openai_error


def test_worker_errors_keep_their_message_type_and_param() -> None:
    error = InvalidRequest("sampling_params.max_tokens: must be >= 1", param="sampling_params.max_tokens")
    assert to_error_payload(error) == {
        "error": "sampling_params.max_tokens: must be >= 1",
        "error_type": error.error_type,
        "param": "sampling_params.max_tokens",
    }
    assert to_error_payload(EngineDead("the inference engine has died")) == {
        "error": "the inference engine has died",
        "error_type": "engine_dead",
    }


def test_unexpected_exceptions_get_a_generic_message_never_their_text() -> None:
    secret = "token hf_abc123 in /srv/secret/path"
    for exc in (RuntimeError(secret), KeyError(secret), ValueError(secret)):
        payload = to_error_payload(exc)
        assert payload["error"] == f"internal error ({type(exc).__name__})"
        assert isinstance(payload["error"], str) and secret not in str(payload)
        body = to_openai_error(exc)["error"]
        assert body["message"] == payload["error"] and body["code"] == 500 and secret not in str(body)


def test_a_native_librarys_source_location_stays_out_of_a_message() -> None:
    error = ValueError(
        "Failed to transform regex into a grammar: [18:26:21] /project/cpp/regex_converter.cc:83: "
        "Regex parsing error at position 2: Unclosed '['\n"
    )
    assert one_line(error) == (
        "Failed to transform regex into a grammar: Regex parsing error at position 2: Unclosed '['"
    )


def test_an_adapter_that_fails_to_load_is_named_in_the_workers_words_and_an_engine_death_is_not() -> None:
    """What ``load_adapters`` turns into a LORA_MODULES error: the model worker's reason out of
    vLLM's wrapper (its shape as vLLM 0.32 words it), any other message whole, and never an engine
    death, which is the engine's error and must not blame the setting."""
    from vllm.v1.engine.exceptions import EngineDeadError

    from worker.vllm_internals.async_llm import add_lora_failure

    wrapped = RuntimeError(
        "Call to add_lora method failed: Worker failed with error 'Loading lora bad failed: No adapter "
        "found for /nonexistent/path', please check the stack trace above for the root cause"
    )
    assert add_lora_failure(wrapped) == "Loading lora bad failed: No adapter found for /nonexistent/path"
    assert add_lora_failure(ValueError("rank 64 is over\nMAX_LORA_RANK")) == "rank 64 is over MAX_LORA_RANK"
    assert add_lora_failure(EngineDeadError()) is None
