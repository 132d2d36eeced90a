"""The engine: vLLM's ``AsyncLLM`` behind schema types. Knows nothing of RunPod or HTTP.

``Engine.boot(settings)`` builds the engine (quantization from the checkpoint unless
``QUANTIZATION`` says otherwise; speculative decoding through one config path, with a draft
compatibility check vLLM does not make). ``Engine.generate(request)`` yields one
:class:`StreamChunk` per engine step and a final one with usage, timings and exact
per-request acceptance stats.

Exact stats on every ending: vLLM attaches a request's spec-decode metrics only to the engine
core's final output, so a request finished by a stop string (detected in the frontend) or
cancelled gets none. :class:`SpecMetricsScheduler` makes the core attach snapshots (every step
for a request with stop strings, every few steps for the others); the frontend keeps the
latest, so the final output of a stop-string request carries the counts up to and including
its last step, and a cancelled one can report what was observed.

With ``worker/spec_scheduler.py`` (the scheduler subclasses, imported by the engine-core process
too), the only module that imports vLLM; where model references point is ``worker/models.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from vllm import SamplingParams, TokensPrompt
from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind, SamplingType, StructuredOutputsParams
from vllm.usage.usage_lib import UsageContext
from vllm.utils.gc_utils import freeze_gc_heap
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from worker.config import DeploymentMode, Settings
from worker.draft_check import check_draft_compatible
from worker.engine_args import build_engine_kwargs
from worker.errors import ContextLengthExceeded, EngineBootError, EngineDead, InvalidRequest, WorkerError
from worker.models import check_local_paths, resolver
from worker.schema import GenerateRequest, Served, SpecDecodeStats, StreamChunk, Timings, Usage, parse_request
from worker.spec_scheduler import SpecMetricsAsyncScheduler, SpecMetricsScheduler
from worker.stats import spec_stats_from_histogram

# vLLM's typed client errors, and the ValueError its request validation still raises in places.
_CLIENT_ERRORS: tuple[type[Exception], ...] = (VLLMClientError, ValueError)

__all__ = ["Engine", "RequestEnd"]

log = logging.getLogger(__name__)

# Sampling features that run kernels of their own in vLLM's sampler (penalties, top-k/top-p,
# min-p, seeded sampling): the warm-up runs them once, and the cold-start bench measures the
# first request that uses them.
WARMUP_SAMPLING_FEATURES: dict[str, Any] = {
    "temperature": 0.8,
    "top_k": 20,
    "top_p": 0.9,
    "min_p": 0.05,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.1,
    "seed": 7,
}


@dataclasses.dataclass(frozen=True, slots=True)
class RequestEnd:
    """How a request ended, for observers (metrics, logs)."""

    request_id: str
    outcome: str  # "finished", "cancelled", "error"
    finish_reason: str | None
    spec_decode: SpecDecodeStats | None
    time_to_first_token_s: float | None
    num_completion_tokens: int


def _stats_from_vllm(metrics: Any, *, is_partial: bool) -> SpecDecodeStats:
    return spec_stats_from_histogram(
        metrics.histogram,
        num_draft_tokens=metrics.num_draft_tokens,
        num_spec_tokens=metrics.num_spec_tokens,
        is_partial=is_partial,
        per_step_accepted=metrics.per_step_accepted or None,
        per_step_drafted=metrics.per_step_drafted or None,
    )


class Engine:
    """One booted vLLM engine shared by all requests (continuous batching)."""

    def __init__(self, llm: AsyncLLM, *, settings: Settings, model_label: str) -> None:
        self._llm = llm
        self._settings = settings
        config = llm.vllm_config
        spec = config.speculative_config
        self.max_model_len: int = config.model_config.max_model_len
        self.max_num_seqs: int = config.scheduler_config.max_num_seqs
        self.served = Served(
            model=model_label,
            quantization=config.model_config.quantization,
            speculative_method=getattr(spec, "method", None) if spec else None,
            num_speculative_tokens=getattr(spec, "num_speculative_tokens", None) if spec else None,
            spec_decode_available=bool(spec) and settings.per_request_spec_decode_metrics != "none",
        )
        self._tokenizer = llm.get_tokenizer()
        self._refuses_sampling = bool(spec) and current_platform.is_cpu()
        self.observers: list[Callable[[RequestEnd], None]] = []
        # Adapters numbered in configuration order from 1, as vLLM's OpenAI layer numbers the
        # same list, so that both entrypoints share one adapter slot per name.
        resolve = resolver(settings)
        self.lora_requests: dict[str, LoRARequest] = {
            module.name: LoRARequest(module.name, index, resolve(module.path))
            for index, module in enumerate(settings.lora_modules, start=1)
        }

    # ----------------------------------------------------------------- boot / shutdown
    @classmethod
    def build_args(cls, settings: Settings) -> AsyncEngineArgs:
        resolve = resolver(settings)
        kwargs = build_engine_kwargs(settings, resolve=resolve)
        check_local_paths(kwargs)
        spec = kwargs.get("speculative_config")
        if spec is not None and settings.draft_ref is not None:
            check_draft_compatible(
                target=kwargs["model"],
                draft=spec["model"],
                target_label=settings.target_ref,
                draft_label=settings.draft_ref,
                target_revision=settings.model_revision,
                draft_revision=settings.draft_revision,
                trust_remote_code=settings.trust_remote_code,
            )
        known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        unknown = sorted(set(settings.engine_args or {}) - known)
        if unknown:
            raise EngineBootError(f"ENGINE_ARGS: {', '.join(unknown)}: not a vLLM engine argument")
        return AsyncEngineArgs(**kwargs)

    @classmethod
    def build_config(cls, settings: Settings, *, mode: DeploymentMode = "serverless") -> VllmConfig:
        """vLLM's config for ``settings``, with the stats scheduler where it applies.

        What the settings leave unset takes vLLM's defaults for the deployment: a pod, vLLM's own
        server's (``vllm serve``: on an H100 / H200, ``max_num_batched_tokens`` 8192 and
        ``max_num_seqs`` 1024), so that a pod is configured as the server it is measured
        against; serverless, vLLM's library defaults (2048 and 128), since ``MAX_CONCURRENCY``,
        the jobs a worker takes at once, follows ``max_num_seqs``.
        """
        context = UsageContext.OPENAI_API_SERVER if mode == "pod" else UsageContext.ENGINE_CONTEXT
        vllm_config = cls.build_args(settings).create_engine_config(usage_context=context)
        if vllm_config.speculative_config is not None and settings.per_request_spec_decode_metrics != "none":
            sched = vllm_config.scheduler_config
            if sched.scheduler_cls is None:
                # vLLM turns async scheduling off for n-gram drafts and keeps it for draft models.
                sched.scheduler_cls = SpecMetricsAsyncScheduler if sched.async_scheduling else SpecMetricsScheduler
        return vllm_config

    @classmethod
    def create(cls, settings: Settings, *, mode: DeploymentMode = "serverless") -> Engine:
        """Build and start the engine (blocking; call it off the event loop). The process
        environment vLLM reads (``engine_args.engine_environment``) is set by the caller."""
        try:
            vllm_config = cls.build_config(settings, mode=mode)
            llm = AsyncLLM.from_vllm_config(vllm_config, disable_log_stats=False)
        except WorkerError:
            raise
        except Exception as exc:
            raise EngineBootError(
                f"engine failed to start for model {settings.target_ref!r}: {_one_line(exc)}"
            ) from exc
        return cls(llm, settings=settings, model_label=settings.target_ref)

    @classmethod
    async def boot(cls, settings: Settings, *, mode: DeploymentMode = "serverless") -> Engine:
        engine = await asyncio.to_thread(functools.partial(cls.create, settings, mode=mode))
        if settings.warmup_request:
            await engine.warm_up()
        # What vLLM's own server does once it has started: move everything allocated so far
        # (modules, the engine, the tokenizer) out of the garbage collector's sight, so that
        # collections while serving do not walk it again and again.
        freeze_gc_heap()
        return engine

    async def warm_up(self) -> None:
        """Short requests through the whole path (chat template, speculation, detokenizing, the
        sampler's optional kernels) before the engine is reported ready, so that the first user's
        request does not pay what vLLM initialises lazily. On the CPU (tiny model, draft
        speculation) the first request's TTFT was 25 ms against 9.5 ms for a request after a
        second's idle; with this, 14 ms. On an H200 with vLLM's kernel warm-up off, the first
        request using ``WARMUP_SAMPLING_FEATURES`` took 77 ms to its first token against 14.5 ms
        later: the third request here runs those kernels once during boot."""
        if "generate" not in await self._llm.get_supported_tasks():
            return  # e.g. an embedding model: nothing to generate
        params = {"max_tokens": 8, "ignore_eos": True, "temperature": 0}
        jobs: list[dict[str, Any]] = [{"prompt": "Hi", "sampling_params": params}]
        if getattr(self._tokenizer, "chat_template", None):
            jobs.append({"messages": [{"role": "user", "content": "Hi"}], "sampling_params": params})
        featured = dict(WARMUP_SAMPLING_FEATURES)
        if self.served.speculative_method is not None:
            featured.pop("min_p")  # vLLM 0.32 refuses min_p with speculative decoding
        if self._refuses_sampling:  # greedy only (see unsupported_sampling): the penalties remain
            for name in ("top_k", "top_p", "seed"):
                featured.pop(name)
            featured["temperature"] = 0
        started = time.perf_counter()
        for job in jobs:
            async for _ in self.generate(parse_request(job), request_id=f"warmup-{uuid.uuid4().hex}"):
                pass
        # Best effort: a feature this engine refuses is refused to users too, and must not fail the boot.
        try:
            job = {"prompt": "Hi", "sampling_params": {**params, **featured}}
            async for _ in self.generate(parse_request(job), request_id=f"warmup-{uuid.uuid4().hex}"):
                pass
        except InvalidRequest as exc:
            log.warning("warm-up request with the sampler's optional features refused: %s", exc.message)
        await self._llm.reset_prefix_cache()  # the first user finds the cache as a cold boot leaves it
        log.info("warm-up request done in %.2f s", time.perf_counter() - started)

    def shutdown(self) -> None:
        self._llm.shutdown()

    @property
    def llm(self) -> AsyncLLM:
        """vLLM's engine itself, for comparisons that must bypass the worker (benchmarks)."""
        return self._llm

    @property
    def is_dead(self) -> bool:
        return bool(self._llm.errored)

    @property
    def num_unfinished_requests(self) -> int:
        return int(self._llm.get_num_unfinished_requests())

    # ----------------------------------------------------------------- requests
    def render_prompt(self, request: GenerateRequest) -> list[int]:
        """Token ids of the request's prompt (the chat template applied to messages)."""
        tokenizer = self._tokenizer
        if request.messages is not None:
            if not getattr(tokenizer, "chat_template", None):
                raise InvalidRequest("this model has no chat template; send 'prompt' instead of 'messages'")
            text = tokenizer.apply_chat_template(
                [m.model_dump() for m in request.messages], tokenize=False, add_generation_prompt=True
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
        max_tokens = options.max_tokens or min(self._settings.default_max_tokens, room)
        values = options.model_dump(exclude={"structured_outputs", "n", "max_tokens"})
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
            raise InvalidRequest(f"sampling_params: {_one_line(exc)}") from None
        problem = self.unsupported_sampling(params)
        if problem is not None:
            name, message = problem
            raise InvalidRequest(message, param=f"sampling_params.{name}")
        return params

    def unsupported_sampling(self, params: SamplingParams) -> tuple[str, str] | None:
        """The parameter at fault and why, if this engine cannot sample it faithfully. vLLM 0.32's
        CPU build has no Triton, and its rejection sampler expands temperature, top-k and top-p per
        draft token with Triton kernels: with speculation, a request that samples (temperature > 0)
        got tokens the target all but rules out (through the pod at temperature 1, 58 of 218 sampled
        tokens with a target log-probability below -6; none without speculation; vLLM's own ``LLM``
        alike), and top-k killed the engine. So a speculating CPU engine serves greedy requests only;
        a GPU has Triton and serves them all. Checked on both paths: the native one and vLLM's
        OpenAI layer."""
        if self._refuses_sampling and params.sampling_type != SamplingType.GREEDY:
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
        start = time.perf_counter()
        request_id = request_id or uuid.uuid4().hex
        if self.is_dead:
            raise EngineDead("the inference engine has died")
        prompt_ids = self.render_prompt(request)
        params = self.sampling_params(request, num_prompt_tokens=len(prompt_ids))
        lora = self.lora_request(request.lora)
        first_token_at: float | None = None
        num_tokens = 0
        outcome = "error"
        end: RequestEnd | None = None
        # vLLM's frontend state of this request holds the latest spec-decode snapshot, which a
        # cancelled request reports; looked up once, and only when there is something to report.
        state: Any = None
        wants_state = self.served.spec_decode_available
        try:
            # vLLM's renderer, as its frontend would call it for these token ids (raw prompts handed
            # to generate() are deprecated in 0.32): its own checks, e.g. the context length.
            (engine_input,) = self._llm.renderer.render_cmpl([TokensPrompt(prompt_token_ids=prompt_ids)])
        except _CLIENT_ERRORS as exc:
            raise InvalidRequest(_one_line(exc)) from None
        outputs = self._llm.generate(engine_input, params, request_id, lora_request=lora)
        try:
            async for output in outputs:
                if wants_state and state is None:
                    state = self._request_state(request_id)
                completion = output.outputs[0]
                num_new = len(completion.token_ids)
                if num_new and first_token_at is None:
                    first_token_at = time.perf_counter()
                num_tokens += num_new
                if not output.finished:
                    yield StreamChunk(text=completion.text, num_tokens=num_new)
                    continue
                now = time.perf_counter()
                metrics = getattr(completion, "spec_decode_metrics", None)
                spec = (
                    _stats_from_vllm(metrics, is_partial=completion.finish_reason == "abort")
                    if metrics is not None
                    else None
                )
                final = StreamChunk(
                    text=completion.text,
                    num_tokens=num_new,
                    finish_reason=completion.finish_reason,
                    stop_reason=completion.stop_reason,
                    usage=Usage(
                        prompt_tokens=len(prompt_ids),
                        completion_tokens=num_tokens,
                        total_tokens=len(prompt_ids) + num_tokens,
                        cached_prompt_tokens=output.num_cached_tokens or 0,
                    ),
                    timings=_timings(
                        output, start=start, first_token_at=first_token_at, now=now, num_tokens=num_tokens
                    ),
                    spec_decode=spec,
                    served=self.served,
                )
                outcome = "finished"
                end = RequestEnd(
                    request_id, outcome, completion.finish_reason, spec, _elapsed(start, first_token_at), num_tokens
                )
                # Observers hear of the end now, not when the consumer gets round to closing us.
                self._notify(end)
                yield final
        except (asyncio.CancelledError, GeneratorExit):
            if outcome == "finished":  # closed after its final chunk: nothing was cut short
                raise
            outcome = "cancelled"
            metrics = getattr(state, "spec_decode_metrics", None)
            observed = _stats_from_vllm(metrics, is_partial=True) if metrics is not None else None
            end = RequestEnd(request_id, outcome, None, observed, _elapsed(start, first_token_at), num_tokens)
            raise
        except EngineDeadError as exc:
            raise EngineDead("the inference engine died while serving this request") from exc
        except WorkerError:
            raise
        except _CLIENT_ERRORS as exc:
            # vLLM's own request validation (e.g. a grammar it cannot compile).
            raise InvalidRequest(_one_line(exc)) from None
        finally:
            # Closing vLLM's generator aborts the engine request if it is still running,
            # now rather than whenever the garbage collector gets to it.
            await outputs.aclose()
            if outcome != "finished":
                self._notify(
                    end or RequestEnd(request_id, outcome, None, None, _elapsed(start, first_token_at), num_tokens)
                )

    def lora_request(self, name: str | None) -> LoRARequest | None:
        if name is None:
            return None
        lora = self.lora_requests.get(name)
        if lora is None:
            configured = ", ".join(self.lora_requests) or "none (set ENABLE_LORA and LORA_MODULES)"
            raise InvalidRequest(f"lora: no adapter named {name!r}; configured: {configured}", param="lora")
        return lora

    async def observe(self, outputs: AsyncIterator[Any], request_id: str) -> AsyncIterator[Any]:
        """Pass vLLM's outputs of one request through unchanged, telling the observers how it ended.

        For callers that use vLLM directly (its OpenAI layer): :meth:`generate` does the same
        inline, on the native hot path.
        """
        start = time.perf_counter()
        first_token_at: float | None = None
        num_tokens = 0
        state: Any = None
        end: RequestEnd | None = None
        try:
            async for output in outputs:
                if state is None and self.served.spec_decode_available:
                    state = self._request_state(request_id)
                new_tokens = sum(len(c.token_ids) for c in output.outputs)
                if new_tokens and first_token_at is None:
                    first_token_at = time.perf_counter()
                num_tokens += new_tokens
                if output.finished and end is None:
                    completion = output.outputs[0] if len(output.outputs) == 1 else None
                    metrics = getattr(completion, "spec_decode_metrics", None)
                    spec = None if metrics is None else _stats_from_vllm(metrics, is_partial=False)
                    finish_reason = completion.finish_reason if completion is not None else "stop"
                    end = RequestEnd(
                        request_id, "finished", finish_reason, spec, _elapsed(start, first_token_at), num_tokens
                    )
                    self._notify(end)
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            if end is None:
                metrics = getattr(state, "spec_decode_metrics", None)
                observed = None if metrics is None else _stats_from_vllm(metrics, is_partial=True)
                end = RequestEnd(request_id, "cancelled", None, observed, _elapsed(start, first_token_at), num_tokens)
                self._notify(end)
            raise
        except Exception:
            if end is None:
                end = RequestEnd(request_id, "error", None, None, _elapsed(start, first_token_at), num_tokens)
                self._notify(end)
            raise
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]

    def _request_state(self, request_id: str) -> Any:
        """vLLM's frontend state of a request, through its external -> internal id map."""
        processor = self._llm.output_processor
        ids = processor.external_req_ids.get(request_id)
        return processor.request_states.get(ids[0]) if ids else None

    def _notify(self, end: RequestEnd) -> None:
        for observer in self.observers:
            try:
                observer(end)
            except Exception:  # an observer must never break a request
                log.exception("request observer failed")
        if end.spec_decode is not None and end.outcome != "finished":
            s = end.spec_decode
            log.info(
                "request %s %s after %d tokens; partial spec-decode stats: drafted=%d accepted=%d rate=%.3f",
                end.request_id,
                end.outcome,
                end.num_completion_tokens,
                s.num_draft_tokens,
                s.num_accepted_draft_tokens,
                s.draft_acceptance_rate,
            )


def _elapsed(start: float, at: float | None) -> float | None:
    return None if at is None else at - start


def _timings(output: Any, *, start: float, first_token_at: float | None, now: float, num_tokens: int) -> Timings:
    queue_ms = None
    stats = getattr(output, "metrics", None)
    queued, scheduled = getattr(stats, "queued_ts", 0.0), getattr(stats, "scheduled_ts", 0.0)
    if queued and scheduled:
        queue_ms = max(0.0, (scheduled - queued) * 1000)
    decode_rate = None
    if first_token_at is not None and num_tokens > 1 and now > first_token_at:
        decode_rate = (num_tokens - 1) / (now - first_token_at)
    return Timings(
        queue_ms=queue_ms,
        time_to_first_token_ms=None if first_token_at is None else (first_token_at - start) * 1000,
        decode_tokens_per_s=decode_rate,
        end_to_end_ms=(now - start) * 1000,
    )


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (pydantic's validation errors name the field on the
    lines after the first), without pydantic's links."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if "errors.pydantic.dev" not in line]
    return " ".join(line for line in lines if line)[:500] or type(exc).__name__
