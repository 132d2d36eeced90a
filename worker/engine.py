"""The engine: vLLM's ``AsyncLLM`` behind schema types. Knows nothing of RunPod or HTTP.

``Engine.generate(request)`` yields one :class:`StreamChunk` per engine step and a final one with
usage, timings and exact per-request acceptance stats; ``Engine.observe`` passes vLLM's own
outputs through (for vLLM's OpenAI layer) with the same bookkeeping. Booting is ``worker/boot/launch.py``.

Exact stats on every ending (stop strings, cancellations): ``worker/speculation/stats/``, with vLLM's
side of them in ``worker/vllm_internals/``, installed when the boot plan says so. This module uses
vLLM's public surface only (``worker.vllm_internals.public``); what it needs of vLLM's insides goes
through the seam (``worker.vllm_internals.async_llm``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

from transformers import PreTrainedTokenizerBase
from vllm import SamplingParams
from vllm.exceptions import VLLMClientError, VLLMValidationError
from vllm.lora.request import LoRARequest
from vllm.sampling_params import RequestOutputKind, SamplingType, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from worker.config import Settings
from worker.errors import ContextLengthExceeded, EngineDead, InvalidRequest, WorkerError, one_line
from worker.schema import GenerateRequest, Served, StreamChunk, Usage
from worker.speculation.stats.tracking import RequestEnd, RequestTracker
from worker.vllm_internals import async_llm
from worker.vllm_internals.frontend import ExactStopStats, installed_exact_stop_stats

# vLLM's typed client errors, and the ValueError its request validation still raises in places.
_CLIENT_ERRORS: tuple[type[Exception], ...] = (VLLMClientError, ValueError)

__all__ = ["Engine", "RequestEnd"]

log = logging.getLogger(__name__)


class Engine:
    """One booted vLLM engine shared by all requests (continuous batching)."""

    def __init__(
        self,
        llm: AsyncLLM,
        *,
        settings: Settings,
        served: Served,
        lora_paths: Mapping[str, str],
    ) -> None:
        """The boot plan's answers (``worker.boot.plan``): what serves (exact stats on or off
        among it), adapter paths."""
        self._llm = llm
        self._settings = settings
        config = llm.vllm_config
        spec = config.speculative_config
        self.max_model_len: int = config.model_config.max_model_len
        self.max_num_seqs: int = config.scheduler_config.max_num_seqs
        self.served = served
        self._tokenizer = llm.get_tokenizer()
        # Asked once: the native path's chat needs the tokenizer's own template. vLLM hands out
        # transformers' tokenizers for the models the worker serves, whose ``chat_template`` is
        # public (None where the model has none); a tokenizer of another kind has no template here.
        tokenizer = self._tokenizer
        self.has_chat_template = isinstance(tokenizer, PreTrainedTokenizerBase) and bool(tokenizer.chat_template)
        # The frontend half of exact stats, where the boot installed it (worker.boot.launch).
        self.exact_stop_stats: ExactStopStats | None = installed_exact_stop_stats(llm)
        # The model's default sampling parameters (its generation_config.json), applied to what a
        # request leaves unset, as vLLM's OpenAI layer applies them.
        self.default_sampling: dict[str, Any] = config.model_config.get_diff_sampling_param()
        # vLLM's CPU build cannot sample faithfully with speculation (unsupported_sampling).
        self.is_greedy_only = bool(spec) and async_llm.is_cpu_platform()
        self.observers: list[Callable[[RequestEnd], None]] = []
        # Adapters numbered in configuration order from 1, as vLLM's OpenAI layer numbers the
        # same list, so that both entrypoints share one adapter slot per name.
        self.lora_requests: dict[str, LoRARequest] = {
            name: LoRARequest(name, index, path) for index, (name, path) in enumerate(lora_paths.items(), start=1)
        }

    # ----------------------------------------------------------------- state
    def shutdown(self) -> None:
        self._llm.shutdown()

    def mark_dead(self) -> None:
        """The engine core is gone and this process's client was not told: an API process of a
        pod, whose engine core another process started and watches (vLLM's client watches only
        the processes it started, and a killed core says nothing). Fail every request in flight
        and report dead from now on, as vLLM does when its own monitor sees the death."""
        async_llm.mark_engine_dead(self._llm)

    @property
    def llm(self) -> AsyncLLM:
        """vLLM's engine itself, for comparisons that must bypass the worker (benchmarks)."""
        return self._llm

    @property
    def keeps_spec_stats(self) -> bool:
        """Whether requests get exact spec-decode stats (what a request tracker looks up)."""
        return self.served.spec_decode_available

    @property
    def is_dead(self) -> bool:
        return bool(self._llm.errored)

    @property
    def num_unfinished_requests(self) -> int:
        return int(self._llm.get_num_unfinished_requests())

    # ----------------------------------------------------------------- requests
    def render_prompt(self, request: GenerateRequest) -> list[int]:
        """Token ids of the request's prompt (the chat template applied to its chat, if any)."""
        tokenizer, chat = self._tokenizer, request.chat
        if chat is not None:
            if not self.has_chat_template:
                raise InvalidRequest("this model has no chat template; send 'prompt' instead of 'messages'")
            text = tokenizer.apply_chat_template(
                [m.model_dump() for m in chat], tokenize=False, add_generation_prompt=True
            )
            return list(tokenizer.encode(str(text), add_special_tokens=False))
        return list(tokenizer.encode(request.prompt or ""))

    def sampling_params(self, request: GenerateRequest, *, num_prompt_tokens: int) -> SamplingParams:
        options = request.sampling_params
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise ContextLengthExceeded(
                f"prompt: {num_prompt_tokens} tokens leave no room in the model's context "
                f"of {self.max_model_len} tokens",
                param="prompt",
            )
        if options.max_tokens is not None and options.max_tokens > room:
            raise ContextLengthExceeded(
                f"sampling_params.max_tokens: prompt ({num_prompt_tokens} tokens) plus max_tokens "
                f"({options.max_tokens}) exceeds the model's context of {self.max_model_len} tokens",
                param="sampling_params.max_tokens",
            )
        defaults = self.default_sampling
        default_max_tokens = min(self._settings.default_max_tokens, room, defaults.get("max_tokens", room))
        max_tokens = options.max_tokens or default_max_tokens
        values = options.model_dump(exclude={"structured_outputs", "n", "max_tokens"})
        values.update({k: v for k, v in defaults.items() if k in values and k not in options.model_fields_set})
        structured = None
        if options.structured_outputs is not None:
            so = options.structured_outputs
            structured = StructuredOutputsParams(
                json=so.json_schema,
                json_object=so.json_object,
                regex=so.regex,
                choice=so.choice,
                grammar=so.grammar,
            )
        try:
            params = SamplingParams(
                **values,
                max_tokens=max_tokens,
                structured_outputs=structured,
                output_kind=RequestOutputKind.DELTA,
            )
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(f"sampling_params: {one_line(exc)}") from None
        problem = self.unsupported_sampling(params)
        if problem is not None:
            name, message = problem
            raise InvalidRequest(message, param=f"sampling_params.{name}")
        return params

    def unsupported_sampling(self, params: SamplingParams) -> tuple[str, str] | None:
        """The parameter at fault and why, if this engine cannot sample it faithfully. vLLM 0.32's
        CPU build has no Triton, and its rejection sampler expands temperature, top-k and top-p per
        draft token with Triton kernels: with speculation, a request that samples (temperature > 0)
        got tokens the target all but rules out (through the pod at temperature 1, many sampled
        tokens with a target log-probability below -6, none without speculation, vLLM's own
        ``LLM`` alike: docs/benchmarks.md), and top-k killed the engine. So a speculating CPU engine
        serves greedy requests only; a GPU has Triton and serves them all. Checked on both paths:
        the native one and vLLM's OpenAI layer."""
        if self.is_greedy_only and params.sampling_type != SamplingType.GREEDY:
            message = (
                f"temperature {params.temperature:g}: sampling with speculative decoding is not supported on "
                "vLLM's CPU build (its rejection sampler needs Triton kernels the CPU build lacks, and returns "
                "tokens the model would not); use temperature 0, or serve without speculation "
                "(SPECULATIVE_METHOD=none)"
            )
            return "temperature", message
        return None

    async def generate(
        self, request: GenerateRequest, *, request_id: str | None = None
    ) -> AsyncGenerator[StreamChunk, None]:
        """Yield a chunk per engine output; the last one is final (``finish_reason`` set)."""
        track = RequestTracker(self, request_id or uuid.uuid4().hex)
        if self.is_dead:
            raise EngineDead("the inference engine has died")
        prompt_ids = self.render_prompt(request)
        params = self.sampling_params(request, num_prompt_tokens=len(prompt_ids))
        lora = self.lora_request(request.lora)
        try:
            engine_input = async_llm.render_token_prompt(self._llm, prompt_ids)
        except _CLIENT_ERRORS as exc:
            raise InvalidRequest(one_line(exc)) from None
        outputs = self._llm.generate(engine_input, params, track.request_id, lora_request=lora)
        try:
            async for output in outputs:
                completion = output.outputs[0]
                num_new = len(completion.token_ids)
                track.add(num_new)
                if not output.finished:
                    yield StreamChunk(text=completion.text, num_tokens=num_new)
                    continue
                now = time.perf_counter()
                spec = track.finish(completion)
                yield StreamChunk(
                    text=completion.text,
                    num_tokens=num_new,
                    finish_reason=completion.finish_reason,
                    stop_reason=completion.stop_reason,
                    usage=Usage(
                        prompt_tokens=len(prompt_ids),
                        completion_tokens=track.num_tokens,
                        total_tokens=len(prompt_ids) + track.num_tokens,
                        cached_prompt_tokens=output.num_cached_tokens or 0,
                    ),
                    timings=track.timings(output, now=now),
                    spec_decode=spec,
                    served=self.served,
                )
        except (asyncio.CancelledError, GeneratorExit):
            track.cancel()
            raise
        except EngineDeadError as exc:
            raise EngineDead("the inference engine died while serving this request") from exc
        except WorkerError:
            raise
        except _CLIENT_ERRORS as exc:
            # vLLM's own request validation (e.g. a grammar it cannot compile).
            raise InvalidRequest(one_line(exc)) from None
        except EngineGenerateError as exc:
            raise self.request_failure(exc) from None
        finally:
            # Closing vLLM's generator aborts the engine request if it is still running,
            # now rather than whenever the garbage collector gets to it.
            await outputs.aclose()
            track.fail()

    def lora_request(self, name: str | None) -> LoRARequest | None:
        if name is None:
            return None
        lora = self.lora_requests.get(name)
        if lora is None:
            configured = ", ".join(self.lora_requests) or "none (set ENABLE_LORA and LORA_MODULES)"
            raise InvalidRequest(f"lora: no adapter named {name!r}; configured: {configured}", param="lora")
        return lora

    def request_failure(self, exc: EngineGenerateError) -> WorkerError:
        """What failed a request inside vLLM's ``generate``, as every entrypoint answers it: a
        request check's failure (a ``ValueError`` or vLLM's client error) is the client's, with its
        message; anything else is the server's, naming its type, and is logged here, once, with its
        traceback. vLLM wraps both in an ``EngineGenerateError`` with no message and logs neither
        unless requests are logged (``async_llm.request_failure``)."""
        cause = async_llm.request_failure(exc)
        if isinstance(cause, _CLIENT_ERRORS):
            return InvalidRequest(one_line(cause))
        log.error("a request failed inside vLLM's engine client", exc_info=cause)
        return WorkerError(f"internal error ({type(cause).__name__})")

    async def observe(self, outputs: AsyncIterator[Any], request_id: str) -> AsyncIterator[Any]:
        """Pass vLLM's outputs of one request through unchanged, telling the observers how it ended.

        For callers that use vLLM directly (its OpenAI layer); :meth:`generate` keeps the same
        books (:class:`~worker.speculation.stats.tracking.RequestTracker`) inline, on the native hot path.
        A failure ``generate`` wrapped leaves as :meth:`request_failure` words it, in the exception
        vLLM's layer answers with that message and status, streamed or not: its validation error
        (400), or the engine client's error (500).
        """
        track = RequestTracker(self, request_id)
        try:
            async for output in outputs:
                track.add(sum(len(c.token_ids) for c in output.outputs))
                if output.finished:
                    track.finish(output.outputs[0] if len(output.outputs) == 1 else None, stats=output.metrics)
                yield output
        except EngineGenerateError as exc:
            error = self.request_failure(exc)
            if isinstance(error, InvalidRequest):
                raise VLLMValidationError(error.message) from None
            raise EngineGenerateError(error.message) from None
        except (asyncio.CancelledError, GeneratorExit):
            track.cancel()
            raise
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
            track.fail()

    def request_state(self, request_id: str) -> Any:
        """vLLM's frontend state of a request (what a request tracker reads a snapshot from)."""
        return async_llm.request_state(self._llm, request_id)

    def notify(self, end: RequestEnd) -> None:
        for observer in self.observers:
            try:
                observer(end)
            except Exception:  # an observer must never break a request
                log.exception("request observer failed")
        if end.spec_decode is not None and end.outcome != "finished":
            s = end.spec_decode
            log.info(
                "request %s %s after %d tokens; partial spec-decode stats: steps=%d drafted=%d accepted=%d",
                end.request_id,
                end.outcome,
                end.num_completion_tokens,
                s.num_spec_steps,
                s.num_draft_tokens,
                s.num_accepted_draft_tokens,
            )
