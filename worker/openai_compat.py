"""OpenAI wire format, shared by the pod server and the handler's ``openai_route``.

Requests (``/v1/chat/completions``, ``/v1/completions``) are validated into OpenAI-shaped
models and converted to :class:`GenerateRequest`; engine chunks are formatted back into
OpenAI response objects or server-sent-event lines. Per-request acceptance stats ride as
``metrics.speculative_decoding`` (vLLM's own server's field), on the response or, when
streaming, on the final usage chunk; cached prompt tokens as
``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from worker.errors import InvalidRequest, WorkerError
from worker.schema import (
    ChatMessage,
    GenerateRequest,
    SamplingOptions,
    StreamChunk,
    StructuredOutputs,
    validation_message,
)
from worker.streaming import collect_final

__all__ = [
    "ROUTES",
    "ChatCompletionRequest",
    "CompletionRequest",
    "OpenAICall",
    "error_body",
    "models_response",
    "parse_openai_call",
    "sse",
]

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models")
DONE = "data: [DONE]\n\n"


class _OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JsonSchemaFormat(_OpenAIModel):
    name: str = Field("response", max_length=64)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None
    description: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ResponseFormat(_OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format.type 'json_schema' needs response_format.json_schema")
        return self


class StreamOptions(_OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class TextPart(_OpenAIModel):
    type: Literal["text"]
    text: str


class OpenAIMessage(_OpenAIModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def to_chat_message(self) -> ChatMessage:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return ChatMessage(role="system" if self.role == "developer" else self.role, content=text)


class _SamplingFields(_OpenAIModel):
    """The OpenAI sampling fields both endpoints share, plus vLLM's common extensions."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: Literal[1] = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None

    def sampling(self, *, max_tokens: int | None, structured: StructuredOutputs | None) -> SamplingOptions:
        values = {
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": self.stop,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
            "stop_token_ids": self.stop_token_ids,
            "structured_outputs": structured,
        }
        return SamplingOptions.model_validate({k: v for k, v in values.items() if v is not None})


class ChatCompletionRequest(_SamplingFields):
    messages: list[OpenAIMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    response_format: ResponseFormat | None = None

    def to_generate(self) -> GenerateRequest:
        structured = None
        if self.response_format is not None and self.response_format.type != "text":
            if self.response_format.type == "json_object":
                structured = StructuredOutputs(json_object=True)
            else:
                assert self.response_format.json_schema is not None
                structured = StructuredOutputs.model_validate({"json": self.response_format.json_schema.schema_})
        return GenerateRequest(
            messages=[m.to_chat_message() for m in self.messages],
            sampling_params=self.sampling(
                max_tokens=self.max_completion_tokens or self.max_tokens, structured=structured
            ),
            stream=self.stream,
        )


class CompletionRequest(_SamplingFields):
    prompt: str | list[str]
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None
    best_of: Literal[1] | None = None

    def to_generate(self) -> GenerateRequest:
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidRequest("prompt: give one prompt per request (batch by sending requests concurrently)")
            prompt = prompt[0]
        return GenerateRequest(
            prompt=prompt,
            sampling_params=self.sampling(max_tokens=self.max_tokens, structured=None),
            stream=self.stream,
        )


OpenAIRequest = ChatCompletionRequest | CompletionRequest


def parse_openai_call(route: str, body: Any) -> tuple[OpenAIRequest, GenerateRequest]:
    """Validate a body for ``route`` into its OpenAI request and the engine request."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {type(body).__name__}")
    model_cls: type[OpenAIRequest]
    if route == "/v1/chat/completions":
        model_cls = ChatCompletionRequest
    elif route == "/v1/completions":
        model_cls = CompletionRequest
    else:
        raise InvalidRequest(f"unknown route {route!r}; known: {', '.join(ROUTES)}", param="openai_route")
    try:
        request = model_cls.model_validate(body)
        return request, request.to_generate()
    except ValidationError as exc:
        raise InvalidRequest(validation_message(exc)) from None


# ---------------------------------------------------------------------------- responses
def models_response(model: str, *, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "runpod-vllm-worker"}],
    }


def error_body(error: WorkerError | Exception) -> dict[str, Any]:
    """OpenAI's error shape."""
    if isinstance(error, WorkerError):
        return {
            "error": {"message": error.message, "type": error.error_type, "param": error.param, "code": error.status}
        }
    return {
        "error": {
            "message": f"internal error ({type(error).__name__})",
            "type": "server_error",
            "param": None,
            "code": 500,
        }
    }


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _usage(chunk: StreamChunk) -> dict[str, Any] | None:
    if chunk.usage is None:
        return None
    return {
        "prompt_tokens": chunk.usage.prompt_tokens,
        "completion_tokens": chunk.usage.completion_tokens,
        "total_tokens": chunk.usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": chunk.usage.cached_prompt_tokens},
    }


def _metrics(chunk: StreamChunk) -> dict[str, Any] | None:
    if chunk.spec_decode is None:
        return None
    return {"speculative_decoding": chunk.spec_decode.model_dump(mode="json", exclude_none=True)}


class OpenAICall:
    """Formats one request's engine chunks as OpenAI objects (chat or text completion)."""

    def __init__(self, request: OpenAIRequest, *, model: str, request_id: str | None = None) -> None:
        self.request = request
        self.model = model
        self.is_chat = isinstance(request, ChatCompletionRequest)
        prefix = "chatcmpl" if self.is_chat else "cmpl"
        self.id = f"{prefix}-{request_id or uuid.uuid4().hex}"
        self.created = int(time.time())
        self.include_usage = bool(request.stream_options and request.stream_options.include_usage)

    def _envelope(self, *, is_chunk: bool) -> dict[str, Any]:
        if self.is_chat:
            kind = "chat.completion.chunk" if is_chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _choice(
        self, text: str, finish: StreamChunk | None, *, is_chunk: bool, is_first: bool = False
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.is_chat:
            if is_chunk:
                delta: dict[str, Any] = {"role": "assistant", "content": text} if is_first else {"content": text}
                choice["delta"] = delta
            else:
                choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish.finish_reason if finish else None
        if finish is not None:
            choice["stop_reason"] = finish.stop_reason
        return choice

    def response(self, text: str, final: StreamChunk) -> dict[str, Any]:
        """The non-streaming response object."""
        body = self._envelope(is_chunk=False)
        body["choices"] = [self._choice(text, final, is_chunk=False)]
        body["usage"] = _usage(final)
        metrics = _metrics(final)
        if metrics is not None:
            body["metrics"] = metrics
        return body

    async def stream(self, chunks: AsyncIterator[StreamChunk]) -> AsyncIterator[str]:
        """Server-sent-event lines, ending with ``data: [DONE]``."""
        is_first = True
        async for chunk in chunks:
            if chunk.text or is_first:
                body = self._envelope(is_chunk=True)
                body["choices"] = [self._choice(chunk.text, None, is_chunk=True, is_first=is_first)]
                is_first = False
                yield sse(body)
            if chunk.is_final:
                body = self._envelope(is_chunk=True)
                body["choices"] = [self._choice("", chunk, is_chunk=True)]
                yield sse(body)
                if self.include_usage:
                    body = self._envelope(is_chunk=True)
                    body["choices"] = []
                    body["usage"] = _usage(chunk)
                    metrics = _metrics(chunk)
                    if metrics is not None:
                        body["metrics"] = metrics
                    yield sse(body)
        yield DONE

    async def collect(self, chunks: AsyncIterator[StreamChunk]) -> dict[str, Any]:
        final = await collect_final(chunks)
        return self.response(final.text, final)
