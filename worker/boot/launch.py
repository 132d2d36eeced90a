"""Booting vLLM's engine for the worker: settings to vLLM's config, the engine started, warmed up.

``boot(plan)`` is what the entrypoints call (through ``worker.runtime``, with the plan
``worker.boot.plan`` made of the settings): it builds
vLLM's ``AsyncLLM`` off the event loop, checks a draft model against its target (vLLM does not),
runs short warm-up requests through the whole path, and returns the :class:`~worker.engine.Engine`.
A boot that fails says why in its error: when vLLM's engine core dies while starting, vLLM's own
exception says only "see root cause above", so the root cause is read from what the engine's
processes wrote (:class:`worker.boot.output_tail.OutputTail`).

Imports vLLM's public surface (``worker.vllm_internals.public``); what the boot does inside vLLM
(the worker's schedulers, the output processor switched, the plugin's graph choices) goes through
the seam, ``worker.vllm_internals``, whose contract is checked before the engine starts.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM

import worker.vllm_internals.media  # noqa: F401  (registers the media connector engine_environment selects)
from worker.boot import modelinfo
from worker.boot.draft_check import check_draft_compatible
from worker.boot.heap import freeze_heap
from worker.boot.models import check_local_paths
from worker.boot.output_tail import OutputTail
from worker.boot.plan import BootPlan, served_line
from worker.config import Settings
from worker.engine import Engine
from worker.errors import (
    ConfigError,
    EngineBootError,
    InvalidRequest,
    WorkerError,
    describe_validation_errors,
    one_line,
)
from worker.schema import parse_request
from worker.speculation.stats.tracking import RequestEnd
from worker.vllm_internals import async_llm, core_first, scheduler
from worker.vllm_internals import frontend as spec_frontend
from worker.vllm_internals.check import require_internals
from worker.vllm_internals.config_fields import engine_arg_names
from worker.vllm_internals.plugin import apply_draft_skip, apply_full_graph_choices

__all__ = [
    "WARMUP_SAMPLING_FEATURES",
    "ApiProcess",
    "boot",
    "build_args",
    "build_config",
    "check_exact_stop_stats",
    "create_engine",
    "warm_up",
]

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


# How long the boot's stop-string request waits for the engine core's answer (an idle core answers
# within a step: milliseconds).
CHECK_WAIT_S = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class ApiProcess:
    """One of several API server processes over one engine core (``worker/api_servers.py``): the
    engine core's addresses for this process (vLLM's ``client_config`` without count and index),
    how many such processes there are and which one this is."""

    addresses: dict[str, Any]
    count: int
    index: int


def engine_args_problem(engine_args: Mapping[str, Any]) -> str | None:
    """What is wrong with ``ENGINE_ARGS``: keys that are not vLLM's engine arguments; None when
    nothing is. For a boot that did not pass the process's start (``boot/preflight.py`` refuses the
    same keys there, with a suggestion for each)."""
    unknown = sorted(set(engine_args) - engine_arg_names())
    return f"ENGINE_ARGS: {', '.join(unknown)}: not a vLLM engine argument" if unknown else None


def build_args(plan: BootPlan) -> AsyncEngineArgs:
    """vLLM's engine arguments of the plan, after the checks vLLM does not make (local paths exist,
    the draft can draft for the target, ``ENGINE_ARGS`` names only vLLM's own fields)."""
    if problem := engine_args_problem(plan.settings.engine_args or {}):
        raise EngineBootError(problem)
    kwargs = copy.deepcopy(plan.engine_kwargs)  # vLLM may change what it is given; the plan stays
    check_local_paths(kwargs)
    if kwargs.get("speculative_config") is not None and plan.draft is not None:
        check_draft_compatible(
            target=plan.target.path,
            draft=plan.draft.path,
            target_label=plan.target.label,
            draft_label=plan.draft.label,
            target_revision=plan.target.revision,
            draft_revision=plan.draft.revision,
            trust_remote_code=plan.settings.trust_remote_code,
        )
    return AsyncEngineArgs(**kwargs)


def build_config(plan: BootPlan, *, api_process_count: int = 1, api_process_rank: int = 0) -> VllmConfig:
    """vLLM's config of the plan, with the stats scheduler where the plan says exact stats are on.

    What the settings leave unset takes vLLM's defaults for the deployment: a pod, vLLM's own
    server's (``vllm serve``: on an H100 / H200, ``max_num_batched_tokens`` 8192 and
    ``max_num_seqs`` 1024), so that a pod is configured as the server it is measured
    against; serverless, vLLM's library defaults (2048 and 128), since ``MAX_CONCURRENCY``,
    the jobs a worker takes at once, follows ``max_num_seqs``.
    """
    require_internals()  # every vLLM internal the seam relies on, named if missing (once a process)
    context = UsageContext.OPENAI_API_SERVER if plan.mode == "pod" else UsageContext.ENGINE_CONTEXT
    modelinfo.wait()  # the model-class inspection prepare_boot started in this process, if any
    args = build_args(plan)
    async_llm.set_api_process(args, count=api_process_count, rank=api_process_rank)
    try:
        vllm_config = args.create_engine_config(usage_context=context)
    except pydantic.ValidationError as exc:  # vLLM's config refused a value: name the variable that set it
        raise _config_error(exc, plan.settings) from None
    # vLLM's CPU platform has just set its own start method, whatever was asked: the plan's again.
    plan.apply_environment(os.environ)
    # The worker's vLLM plugin, for an engine core forked from this process (vllm_plugin's docstring).
    apply_full_graph_choices()
    apply_draft_skip()
    if plan.speculation.is_exact_stats:
        scheduler.install(vllm_config, is_auto=plan.speculation.control == "auto")
    return vllm_config


def create_engine(plan: BootPlan, *, api_process: ApiProcess | None = None) -> Engine:
    """Build and start the engine (blocking; call it off the event loop). The process environment
    vLLM reads (the plan's) is set by the caller (``worker.boot.prefetch.prepare_boot``). With
    ``api_process``, connect to an engine core another process started instead of starting one."""
    tail = OutputTail.start() if api_process is None else None
    count, index = (1, 0) if api_process is None else (api_process.count, api_process.index)
    # vLLM's client of an engine core another process started (what its API server processes pass).
    client: dict[str, Any] = {}
    if api_process is not None:
        client = async_llm.client_kwargs(api_process.addresses, count=count, index=index)
    try:
        started = time.perf_counter()
        vllm_config = build_config(plan, api_process_count=count, api_process_rank=index)
        log.info("engine config built in %.2f s; starting the engine core", time.perf_counter() - started)
        # Python's advice for a process that forks without exec (the gc module's docs, gc.freeze):
        # freeze the heap right before the fork. A forked engine core (serverless) inherits the
        # main process's heap, and vLLM's boot runs full collections in it again and again (its
        # memory profiler, the weight loader, the profile run, the CUDA-graph capture: the seam keeps
        # the heap frozen there, worker.vllm_internals.capture_heap); frozen, those skip what the
        # parent allocated. A spawned core (a pod's, by default) inherits nothing; the freeze then
        # spares only this process's collections.
        freeze_heap()
        if api_process is None and vllm_config.parallel_config.data_parallel_size == 1:
            # The core forked first, the frontend's renderer built while it starts (core_first's docstring).
            llm = core_first.start_core(vllm_config, log_stats=True).build_frontend(disable_log_stats=False)
        else:
            llm = AsyncLLM.from_vllm_config(vllm_config, disable_log_stats=False, **client)
        spec = vllm_config.speculative_config
        if plan.speculation.is_exact_stats and spec is not None and spec.num_speculative_tokens is not None:
            # The frontend half: a stop string's final output waits for the core's exact counts.
            spec_frontend.install(llm, num_spec_tokens=spec.num_speculative_tokens)
    except WorkerError:
        raise
    except pydantic.ValidationError as exc:  # vLLM's config refused a value: name the variable that set it
        raise _config_error(exc, plan.settings) from None
    except Exception as exc:
        cause = tail.root_cause() if tail is not None else None
        reason = one_line(exc) if cause is None else f"{cause} (in vLLM's engine core)"
        raise EngineBootError(f"engine failed to start for model {plan.target.label!r}: {reason}") from exc
    finally:
        if tail is not None:
            tail.restore()
    served = plan.served(
        quantization=vllm_config.model_config.quantization,
        speculative_method=None if spec is None else spec.method,
        num_speculative_tokens=None if spec is None else spec.num_speculative_tokens,
    )
    # The resolved plan in one line: what the job's served block and the pod's /plan show.
    log.info(served_line(served))
    return Engine(llm, settings=plan.settings, served=served, lora_paths=plan.lora_paths)


async def boot(plan: BootPlan, *, api_process: ApiProcess | None = None) -> Engine:
    engine = await asyncio.to_thread(functools.partial(create_engine, plan, api_process=api_process))
    try:
        await load_adapters(engine)
    except ConfigError:
        engine.shutdown()
        raise
    if engine.exact_stop_stats is not None:
        await check_exact_stop_stats(engine)
    if plan.settings.warmup_request:
        await warm_up(engine)
    # What vLLM's own server does once it has started: move everything allocated so far
    # (modules, the engine, the tokenizer) out of the garbage collector's sight, so that
    # collections while serving do not walk it again and again; without vLLM's full collection
    # first, which the first job would wait for (worker.boot.heap).
    freeze_heap()
    return engine


async def load_adapters(engine: Engine) -> None:
    """Load every adapter of ``LORA_MODULES`` before the engine is reported ready, as ``vllm serve``
    does. Left to its first request, an adapter vLLM cannot load fails inside the engine core's
    step, which kills the engine: every later request, base model included, would fail. vLLM's
    ``add_lora`` fails the call alone and keeps the engine serving, so the boot can stop with a
    sentence naming the setting. Loading them now also spares the first request the load."""
    for name, request in engine.lora_requests.items():
        try:
            await engine.llm.add_lora(request)
        except Exception as exc:
            reason = async_llm.add_lora_failure(exc)
            if reason is None:  # the engine died: its own error, not the adapter's
                raise
            raise ConfigError(
                f"LORA_MODULES: adapter {name!r} at {request.lora_path!r} cannot be loaded: {reason}"
            ) from None


async def warm_up(engine: Engine) -> None:
    """Short requests through the whole path (chat template, speculation, detokenizing, the
    sampler's optional kernels) before the engine is reported ready, so that the first user's
    request does not pay what vLLM initialises lazily: without it the first request's time to
    first token was several times a later one's, on the CPU and on a GPU
    (docs/gpu-results/HISTORY.md, "The settings, as measured"); the third request here runs the
    sampler's optional kernels (``WARMUP_SAMPLING_FEATURES``) once."""
    llm = engine.llm
    if "generate" not in await llm.get_supported_tasks():
        return  # e.g. an embedding model: nothing to generate
    params = {"max_tokens": 8, "ignore_eos": True, "temperature": 0}
    jobs: list[dict[str, Any]] = [{"prompt": "Hi", "sampling_params": params}]
    if engine.has_chat_template:
        jobs.append({"messages": [{"role": "user", "content": "Hi"}], "sampling_params": params})
    featured = dict(WARMUP_SAMPLING_FEATURES)
    if engine.served.speculative_method is not None:
        featured.pop("min_p")  # vLLM 0.32 refuses min_p with speculative decoding
    if engine.is_greedy_only:  # see Engine.unsupported_sampling: the penalties remain
        for name in ("top_k", "top_p", "seed"):
            featured.pop(name)
        featured["temperature"] = 0
    started = time.perf_counter()
    for job in jobs:
        async for _ in engine.generate(parse_request(job), request_id=f"warmup-{uuid.uuid4().hex}"):
            pass
    # Best effort: a feature this engine refuses is refused to users too, and must not fail the boot.
    try:
        job = {"prompt": "Hi", "sampling_params": {**params, **featured}}
        async for _ in engine.generate(parse_request(job), request_id=f"warmup-{uuid.uuid4().hex}"):
            pass
    except InvalidRequest as exc:
        log.warning("warm-up request with the sampler's optional features refused: %s", exc.message)
    await llm.reset_prefix_cache()  # the first user finds the cache as a cold boot leaves it
    log.info("warm-up request done in %.2f s", time.perf_counter() - started)


async def check_exact_stop_stats(engine: Engine, *, wait_s: float = CHECK_WAIT_S) -> bool:
    """Send one stop-string request and require its final output released with exact counts; if it
    is not (the engine core did not answer within ``wait_s``, or its answer did not match: a vLLM
    upgrade that changed what the worker's scheduler relies on), switch holding off for the
    engine's life (an error logged naming the cause), so that no user's stop string waits for an
    answer that will not come. True: exact. Runs whether or not ``WARMUP_REQUEST`` is set: it checks
    correctness, like the draft check, and costs two short requests."""
    processor = engine.exact_stop_stats
    if processor is None or not processor.is_holding:
        return False
    params: dict[str, Any] = {"max_tokens": 8, "ignore_eos": True, "temperature": 0}
    chunks = [c async for c in engine.generate(parse_request({"prompt": "Hi", "sampling_params": params}))]
    text = "".join(chunk.text for chunk in chunks)
    stop = text[2:5]  # completes within the first few tokens; the core runs on (ignore_eos) past it
    if not stop.strip():
        log.warning("exact stats for stop strings not checked: the check's greedy text %r has no stop string", text)
        return True
    ends: list[RequestEnd] = []
    engine.observers.append(ends.append)
    waited, processor.wait_s = processor.wait_s, wait_s
    try:
        job = {"prompt": "Hi", "sampling_params": {**params, "max_tokens": 64, "stop": [stop]}}
        final = [c async for c in engine.generate(parse_request(job), request_id=f"check-{uuid.uuid4().hex}")][-1]
    finally:
        processor.wait_s = waited
        engine.observers.remove(ends.append)
    await engine.llm.reset_prefix_cache()
    release = ends[-1].release if ends else None
    if final.finish_reason != "stop" or final.stop_reason != stop or release is None:
        log.warning("exact stats for stop strings not checked: the check's request did not end on %r", stop)
        return True
    if not release.is_exact:
        processor.stop_holding(f"the boot's stop-string request was released partial ({release.reason})")
        return False
    log.info("exact stats for stop strings checked: held %.1f ms for the engine core's answer", release.held_s * 1000)
    return True


def _config_error(exc: pydantic.ValidationError, settings: Settings) -> EngineBootError:
    """vLLM's config validation error as the boot error, each field named as the worker's variable
    that set it (``DTYPE``), or as an ``ENGINE_ARGS`` key."""

    def place(loc: Sequence[Any]) -> str:
        field = str(loc[0]) if loc else ""
        if field in type(settings).model_fields:
            return field.upper()
        if field in (settings.engine_args or {}):
            return f"ENGINE_ARGS.{field}"
        return field or "configuration"

    problems = describe_validation_errors(exc.errors(include_url=False), place=place, one_per_place=True)
    return EngineBootError("invalid engine configuration: " + problems)
