"""Wire types: what a job may ask for and what the worker answers.

A request (``job["input"]`` in serverless mode)::

    {"prompt": "..."} | {"messages": [{"role": "user", "content": "..."}]}
    "sampling_params": {vLLM names: max_tokens, temperature, top_p, top_k, min_p, seed, stop,
                        stop_token_ids, ignore_eos, presence_penalty, frequency_penalty,
                        repetition_penalty, min_tokens, include_stop_str_in_output,
                        skip_special_tokens, structured_outputs: {json | json_object | regex
                        | choice | grammar}}
    "stream": true          (default; false gives one item with the whole text)
    "lora": "<adapter>"     (a name in LORA_MODULES)
    worker-vllm's fields: "apply_chat_template": true (a prompt sent as the user's message),
    "max_batch_size", "min_batch_size", "batch_size_growth_factor" (this job's stream coalescing)

Unknown fields are errors that name them, and so are ill-typed ones: types are strict (``"3"`` is
not an integer, ``"yes"`` not a boolean). Each answer item is a :class:`StreamChunk`; the
last one also carries ``finish_reason``, ``usage``, ``timings``, ``spec_decode`` and ``served``.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from worker.config.parsing import format_tokens_by_batch
from worker.errors import InvalidRequest, describe_validation_errors

__all__ = [
    "SPEC_DECODE_OFF",
    "BatchSizes",
    "ChatMessage",
    "GenerateRequest",
    "SamplingOptions",
    "Served",
    "SpecDecodeStats",
    "StreamChunk",
    "StructuredOutputs",
    "Timings",
    "Usage",
    "parse_batch_sizes",
    "parse_request",
    "validation_message",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class StructuredOutputs(_Strict):
    """Constrained decoding, with vLLM's ``StructuredOutputsParams`` names; exactly one field."""

    json_schema: dict[str, Any] | None = Field(None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [name for name in ("json_schema", "json_object", "regex", "choice", "grammar") if getattr(self, name)]
        if len(given) != 1:
            raise ValueError("give exactly one of json, json_object, regex, choice, grammar")
        if self.json_schema is not None:
            _check_json_schema(self.json_schema)
        return self


def _check_json_schema(schema: dict[str, Any]) -> None:
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = "/".join(str(p) for p in exc.path) or "(root)"
        raise ValueError(f"not a valid JSON schema at {path}: {exc.message}") from None


class SamplingOptions(_Strict):
    """Sampling parameters, with vLLM's names and bounds. ``n`` is 1: a native job streams one
    completion (an ``openai_route`` job returns ``n`` choices)."""

    max_tokens: int | None = Field(None, ge=1)
    min_tokens: int = Field(0, ge=0)
    temperature: float = Field(1.0, ge=0, le=100)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=10)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list, max_length=16)
    stop_token_ids: list[int] = Field(default_factory=list, max_length=64)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = None
    n: int = 1

    @model_validator(mode="before")
    @classmethod
    def _stop_as_list(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("stop"), str):
            data = {**data, "stop": [data["stop"]]}
        return data

    @field_validator("n")
    @classmethod
    def _one_completion(cls, n: int) -> int:
        if n != 1:
            raise ValueError(
                "a native job returns one completion; for several, send an openai_route job with n and "
                "temperature > 0 (vLLM samples them; on vLLM's CPU build that needs SPECULATIVE_METHOD=none)"
            )
        return n

    @model_validator(mode="after")
    def _check(self) -> SamplingOptions:
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        return self


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if isinstance(value, list):  # OpenAI's content parts (text, images): the OpenAI route takes them
            raise ValueError(
                "a native job's message content is text; content parts (images, ...) go through an openai_route "
                'job ({"openai_route": "/v1/chat/completions", "openai_input": {...}})'
            )
        return value


class BatchSizes(_Strict):
    """worker-vllm's job fields for this job's stream coalescing, in tokens per item (events per item
    on an ``openai_route`` job); unset: ``DEFAULT_BATCH_SIZE`` and the like."""

    max_batch_size: int | None = Field(None, ge=1)
    min_batch_size: int | None = Field(None, ge=1)
    batch_size_growth_factor: float | None = Field(None, ge=1)


class GenerateRequest(BatchSizes):
    prompt: str | None = Field(None, min_length=1)
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    sampling_params: SamplingOptions = Field(default_factory=SamplingOptions)
    stream: bool = True
    lora: str | None = Field(None, min_length=1, description="the name of a configured LoRA adapter (LORA_MODULES)")
    apply_chat_template: bool = Field(False, description="worker-vllm's: the prompt as the user's chat message")

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self

    @property
    def chat(self) -> list[ChatMessage] | None:
        """The messages to render with the chat template: ``messages``, or the prompt as the user's
        message under ``apply_chat_template``; None: the prompt as it is."""
        if self.messages is not None:
            return self.messages
        if self.apply_chat_template and self.prompt is not None:
            return [ChatMessage(role="user", content=self.prompt)]
        return None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_prompt_tokens: int


class Timings(BaseModel):
    """Milliseconds, except ``decode_tokens_per_s``. ``queue_ms`` is the engine scheduler's wait."""

    queue_ms: float | None
    time_to_first_token_ms: float | None
    decode_tokens_per_s: float | None
    end_to_end_ms: float


class SpecDecodeStats(BaseModel):
    """Per-request speculative-decoding acceptance, with vLLM's field names.

    ``partial`` is true when the request did not run to its end (cancelled or aborted):
    the counts then cover the verify steps observed before it stopped. A request that ran no
    verify step (``num_spec_steps`` 0: one token, or k = 0 throughout) has no
    ``mean_acceptance_length``, and one that drafted nothing no ``draft_acceptance_rate``: null,
    which 0% acceptance (1.0 and 0.0) is not.
    """

    num_spec_tokens: int
    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    draft_acceptance_rate: float | None
    mean_acceptance_length: float | None
    acceptance_histogram: list[int]
    partial: bool = False
    per_step_accepted: list[int] | None = None
    per_step_drafted: list[int] | None = None


class Served(BaseModel):
    """What served the request: the model and the boot plan's resolved choices (the boot logs the
    same line; the pod answers them at ``/plan``). The runner: ``v2`` on a GPU, ``cpu`` on the CPU
    build. ``null`` graph mode: vLLM's own; ``torch_compile`` false: compile-free (FULL CUDA graphs
    only, or eager), ``null``: the CPU build's own choice."""

    model: str
    quantization: str | None
    speculative_method: str | None
    num_speculative_tokens: int | None
    speculation_control: Literal["auto", "static"] | None
    model_runner: Literal["v2", "cpu"]
    cudagraph_mode: str | None
    torch_compile: bool | None
    # SPECULATIVE_TOKENS_BY_BATCH's form (1-1:4,2-2:3), from the plan's (start, end, k) entries.
    speculative_tokens_by_batch: Annotated[str | None, BeforeValidator(format_tokens_by_batch)]
    spec_decode_available: bool

    @property
    def is_spec_decode_off(self) -> bool:
        """The engine speculates but keeps no per-request stats (``PER_REQUEST_SPEC_DECODE_METRICS=none``,
        or a scheduler of the user's): the answer's ``spec_decode`` says ``"off"``, not null."""
        return self.speculative_method is not None and not self.spec_decode_available


@dataclass(slots=True)
class StreamChunk:
    """One streamed item. Only the last one of a request has ``finish_reason`` and the blocks.

    A plain slotted dataclass, not a pydantic model: one is made per engine step and request,
    the worker's hottest path, and its fields come from the engine, not from users.
    ``num_tokens`` (tokens in this item) is internal and never sent.
    """

    text: str
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    spec_decode: SpecDecodeStats | None = None
    served: Served | None = None

    @property
    def is_final(self) -> bool:
        return self.finish_reason is not None

    def to_wire(self) -> dict[str, Any]:
        if self.finish_reason is None:
            return {"text": self.text}
        return {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "usage": _dump(self.usage),
            "timings": _dump(self.timings),
            "spec_decode": _spec_decode(self.spec_decode, self.served),
            "served": _dump(self.served),
        }


# ``spec_decode`` where the engine speculates without per-request stats (:attr:`Served.is_spec_decode_off`).
SPEC_DECODE_OFF = "off"


def _spec_decode(stats: SpecDecodeStats | None, served: Served | None) -> dict[str, Any] | str | None:
    """The final item's ``spec_decode``: the stats; ``"off"`` where speculation runs without them;
    null without speculation."""
    if stats is None and served is not None and served.is_spec_decode_off:
        return SPEC_DECODE_OFF
    return _dump(stats)


def _dump(block: BaseModel | None) -> dict[str, Any] | None:
    return None if block is None else block.model_dump(mode="json")


def validation_message(exc: ValidationError, *, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """A short message naming every bad field, never echoing the input; with ``model`` (the one
    validated), an unknown field names the field it most likely meant (:func:`meant_field`)."""

    def place(loc: Sequence[Any]) -> str:
        path = ".".join(str(part) for part in loc if not str(part).startswith("function-"))
        return prefix + path if path else (prefix.rstrip(".") or "input")

    def suggest(loc: Sequence[Any]) -> str | None:
        meant = meant_field(model, loc) if model is not None else None
        return prefix + meant if meant else None

    return describe_validation_errors(
        exc.errors(include_url=False, include_input=False, include_context=False), place=place, suggest=suggest
    )


def _squashed(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


def meant_field(model: type[BaseModel], loc: Sequence[Any]) -> str | None:
    """The field an unknown one at ``loc`` most likely meant, as a dotted path: a near spelling
    among its neighbours (``maxTokens``, ``max_token``: ``sampling_params.max_tokens``), or a
    sampling option given at the top of a job (``max_tokens``: ``sampling_params.max_tokens``).
    None where nothing is close."""
    *parents, name = [str(part) for part in loc]
    level: type[BaseModel] | None = model
    for part in parents:  # down the nested models the location names
        annotation = level.model_fields[part].annotation if level is not None and part in level.model_fields else None
        level = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    if level is None:
        return None
    candidates = {_squashed(field): ".".join([*parents, field]) for field in level.model_fields}
    if not parents and model is GenerateRequest:
        for field in SamplingOptions.model_fields:
            candidates.setdefault(_squashed(field), f"sampling_params.{field}")
    close = difflib.get_close_matches(_squashed(name), list(candidates), n=1, cutoff=0.8)
    return candidates[close[0]] if close else None


def parse_batch_sizes(data: dict[str, Any]) -> BatchSizes:
    """An ``openai_route`` job's coalescing fields, or :class:`InvalidRequest` naming the bad one."""
    try:
        return BatchSizes.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(validation_message(exc)) from None


def parse_request(data: Any) -> GenerateRequest:
    """Validate a job input into a :class:`GenerateRequest` or raise :class:`InvalidRequest`."""
    if not isinstance(data, dict):
        raise InvalidRequest(f"input must be a JSON object, got {type(data).__name__}")
    if "use_openai_format" in data:
        raise InvalidRequest(
            "use_openai_format: worker-vllm's field; here an OpenAI-shaped answer comes from an openai_route job "
            '({"openai_route": "/v1/chat/completions", "openai_input": {<the OpenAI request>}})',
            param="use_openai_format",
        )
    try:
        return GenerateRequest.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(validation_message(exc, model=GenerateRequest)) from None
