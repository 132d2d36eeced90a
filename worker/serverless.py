"""Serverless job logic behind ``handler.py``: job in, streamed dicts out.

``ServerlessWorker.handle(job)`` is the async generator RunPod drives. It validates the
input, boots the engine on first use, streams coalesced chunks (or one item with
``stream: false``) and ends with the final blocks. Errors are yielded as
``{"error": "...", "error_type": "..."}`` so RunPod marks the job failed while the worker
keeps serving; when the engine cannot serve any more (boot failure, engine death) the
worker also asks RunPod to replace it (``refresh_worker``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any, TypeAlias

from worker import version_line
from worker.errors import ConfigError, EngineDead, InvalidRequest, WorkerError, to_error_payload
from worker.runtime import EngineHolder
from worker.schema import GenerateRequest, parse_batch_sizes, parse_request
from worker.streaming import ChunkBatcher, coalesce_events, collect_final

__all__ = ["Job", "JobItem", "ServerlessWorker", "local_arg_parser", "main_local", "openai_error_item"]

log = logging.getLogger(__name__)

FALLBACK_CONCURRENCY = 8
# worker-vllm's stream-coalescing fields, which an openai_route job takes too.
_BATCH_FIELDS = ("max_batch_size", "min_batch_size", "batch_size_growth_factor")

# A RunPod job as the SDK hands it over: {"id": ..., "input": <anything the client sent>}.
Job: TypeAlias = Mapping[str, object]
# What a job yields, in two shapes: a JSON object (a native chunk, the final block, an OpenAI
# response object, an error item), or on a streamed openai_route a string of whole server-sent
# events ("data: {...}\n\n" each).
JobItem: TypeAlias = dict[str, object] | str


class ServerlessWorker:
    def __init__(self, holder: EngineHolder | None = None) -> None:
        self.holder = holder or EngineHolder()
        # The dict handed to runpod.serverless.start: the SDK reads "refresh_worker" from it after each job.
        self.runpod_config: dict[str, Any] = {}

    # ------------------------------------------------------------------ RunPod hooks
    def concurrency_modifier(self, current: int) -> int:
        """Jobs to take at once: MAX_CONCURRENCY, else the engine's max_num_seqs."""
        try:
            settings = self.holder.settings
        except ConfigError:
            return 1  # the first job reports the configuration error
        if settings.max_concurrency is not None:
            return settings.max_concurrency
        engine = self.holder.engine
        if engine is not None:
            return int(engine.max_num_seqs)
        return settings.max_num_seqs or FALLBACK_CONCURRENCY

    def serve_metrics_page(self) -> None:
        """With ``METRICS_PORT`` set, the pod's /metrics page on ``METRICS_HOST`` (loopback unless
        set), from now on (vLLM's gauges appear once the first job has booted the engine). A
        configuration error is left to the first job to report."""
        try:
            port, host = self.holder.settings.metrics_port, self.holder.settings.metrics_host
        except ConfigError:
            return
        if port is not None:
            from worker.metrics import serve_metrics_page

            serve_metrics_page(port, lambda: self.holder.metrics, host=host)
            log.info("metrics on http://%s:%d/metrics", host, port)

    def request_replacement(self, reason: str) -> None:
        """Ask RunPod for another worker once this job is done; logged when first asked."""
        if not self.runpod_config.get("refresh_worker"):
            log.error("asking RunPod to replace this worker: %s", reason)
        self.runpod_config["refresh_worker"] = True

    async def handle(self, job: Job) -> AsyncGenerator[JobItem, None]:
        job_id = str(job.get("id") or "local")
        request_id = f"{job_id}-{uuid.uuid4().hex[:8]}"
        job_input = job.get("input")
        is_openai = isinstance(job_input, dict) and "openai_route" in job_input
        try:
            if is_openai and isinstance(job_input, dict):
                async for line in self._openai(job_input):
                    yield line
                return
            request = parse_request(job_input)
            engine = await self.holder.get()
            # The batching loop is written out here rather than in a helper generator: every
            # engine step of every request wakes each generator frame between the SDK and vLLM,
            # and at hundreds of concurrent streams those frames are the worker's overhead.
            async with aclosing(engine.generate(request, request_id=request_id)) as chunks:
                if not request.stream:
                    yield (await collect_final(chunks)).to_wire()
                    return
                batcher = self._batcher(request)
                async for chunk in chunks:
                    out = batcher.add(chunk)
                    if out is not None:
                        yield out.to_wire()
        except asyncio.CancelledError:
            log.info("job %s cancelled", job_id)
            raise
        except WorkerError as exc:
            if exc is self.holder.boot_error:  # logged once, by the holder, when the boot failed
                self.request_replacement("its engine did not start (the boot's error above)")
            else:
                if exc.is_fatal:
                    self.request_replacement(exc.message)
                log.warning("job %s failed: %s", job_id, exc.message)
            yield to_error_payload(exc)
        except Exception as exc:
            log.exception("job %s failed unexpectedly", job_id)
            yield to_error_payload(exc)

    def _batcher(self, request: GenerateRequest) -> ChunkBatcher:
        """The job's stream coalescing: its own sizes (worker-vllm's job fields), else the settings'."""
        settings = self.holder.settings
        return ChunkBatcher(
            max_batch_size=request.max_batch_size or settings.default_batch_size,
            min_batch_size=request.min_batch_size or settings.default_min_batch_size,
            growth_factor=request.batch_size_growth_factor or settings.default_batch_size_growth_factor,
        )

    async def _openai(self, job_input: dict[str, Any]) -> AsyncIterator[JobItem]:
        """``{"openai_route": ..., "openai_input": {...}}``: what the pod server would answer, from
        vLLM's own OpenAI layer: a response object, or its server-sent events, coalesced into
        items as the native stream's tokens are (each item costs the platform a POST)."""
        unknown = sorted(set(job_input) - {"openai_route", "openai_input", *_BATCH_FIELDS})
        if unknown:
            raise InvalidRequest(
                f"{', '.join(unknown)}: unknown field (an OpenAI job has openai_route and openai_input)"
            )
        sizes = parse_batch_sizes({name: job_input[name] for name in _BATCH_FIELDS if name in job_input})
        route, body = job_input["openai_route"], job_input.get("openai_input")
        if not isinstance(route, str) or not route.startswith("/"):
            raise InvalidRequest("openai_route: give a path such as /v1/chat/completions", param="openai_route")
        if body is not None and not isinstance(body, dict):
            raise InvalidRequest(f"openai_input must be a JSON object, got {type(body).__name__}", param="openai_input")
        server = await self.holder.openai()
        response = await server.call("GET" if body is None else "POST", route, body)
        if response.status >= 400:
            yield openai_error_item(
                response.status, await response.json(), route=route, has_body=body is not None, problem=response.problem
            )
            if response.status >= 500 and self.holder.state == "dead":
                self.request_replacement("the inference engine has died")
            return
        if not response.is_stream:
            yield await response.json()
            return
        settings = self.holder.settings
        async for item in coalesce_events(
            response.events(),
            max_batch_size=sizes.max_batch_size or settings.default_batch_size,
            min_batch_size=sizes.min_batch_size or settings.default_min_batch_size,
            growth_factor=sizes.batch_size_growth_factor or settings.default_batch_size_growth_factor,
        ):
            yield item

    # ------------------------------------------------------------------ local runs
    async def run_local(self, job_input: object, *, out: Callable[[str], None] = print) -> list[JobItem]:
        """Run one job through the whole streaming path, printing every item as it arrives."""
        started = time.perf_counter()
        items: list[JobItem] = []
        try:
            async for item in self.handle({"id": "local-test", "input": job_input}):
                items.append(item)
                elapsed = time.perf_counter() - started
                if isinstance(item, str):  # server-sent events of an openai_route stream
                    out(f"[{elapsed:7.2f}s] events {json.dumps(item)}")
                elif "error" in item:
                    out(f"[{elapsed:7.2f}s] ERROR {json.dumps(item)}")
                elif "finish_reason" in item:
                    out(f"[{elapsed:7.2f}s] final {json.dumps(item, indent=2)}")
                else:
                    out(f"[{elapsed:7.2f}s] chunk {json.dumps(item)}")
        finally:
            self.holder.shutdown()
        return items


_ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


def openai_error_item(
    status: int, body: Any, *, route: str, has_body: bool, problem: str | None = None
) -> dict[str, Any]:
    """A job's error item for an OpenAI error response: ``error`` a readable string (the RunPod SDK
    shows a non-string ``error`` as Python's repr of it; ``problem``: the sentence for a request
    vLLM's layer found invalid), vLLM's error object beside it."""
    detail = body.get("error") if isinstance(body, dict) else None
    if problem is not None:
        message = problem
    elif isinstance(detail, dict) and isinstance(detail.get("message"), str):
        message = detail["message"]
    elif status == 404:
        message = f"openai_route: no route {route!r}"
    elif status == 405:
        message = f"openai_route: {route} {'takes no openai_input' if has_body else 'needs openai_input'}"
    else:
        message = f"the OpenAI route answered HTTP {status}"
    error_type = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    if isinstance(detail, dict) and detail.get("type") == EngineDead.error_type:  # the worker's own (worker/openai.py)
        error_type = EngineDead.error_type
    item: dict[str, Any] = {"error": message, "error_type": error_type, "status": status}
    if isinstance(detail, dict):
        item["openai_error"] = detail
    return item


def local_arg_parser() -> argparse.ArgumentParser:
    """``python handler.py``'s flags: the local run's own, and the RunPod SDK's (``--rp_*``, read by
    the SDK itself when it serves). Anything else is refused before anything boots."""
    parser = argparse.ArgumentParser(
        prog="python handler.py",
        description="Run one job locally (test_input.json, or --test_input), or serve RunPod's local API.",
        allow_abbrev=False,
    )
    parser.add_argument("--test_input", metavar="JSON", help='the job to run: {"input": {...}} or the input itself')
    parser.add_argument("--verbose", action="store_true", help="vLLM's own INFO logging (WARNING otherwise)")
    parser.add_argument("--version", action="version", version=version_line())
    sdk = parser.add_argument_group("RunPod SDK (its local API server)")
    sdk.add_argument("--rp_serve_api", action="store_true", help="serve RunPod's local API (POST /run, /runsync)")
    sdk.add_argument("--rp_api_port", type=int, metavar="PORT")
    sdk.add_argument("--rp_api_host", metavar="HOST")
    sdk.add_argument("--rp_api_concurrency", type=int, metavar="N")
    sdk.add_argument("--rp_log_level", metavar="LEVEL", help="ERROR, WARN, INFO or DEBUG")
    sdk.add_argument("--rp_debugger", action="store_true")
    return parser


def load_test_input(test_input: str | None, *, default_path: str = "test_input.json") -> object:
    """The job input for a local run: ``--test_input '<json>'`` or ``test_input.json``'s ``input``."""
    if test_input is not None:
        raw = test_input
    else:
        try:
            with open(default_path, encoding="utf-8") as fh:
                raw = fh.read()
        except FileNotFoundError:
            raise SystemExit(f"no --test_input given and no {default_path} found") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        hint = ""
        if test_input is not None and os.path.isfile(test_input):
            hint = f" (--test_input takes the job's JSON itself, not a file; {default_path} is read when it is absent)"
        raise SystemExit(f"test input is not valid JSON: {exc.msg} at position {exc.pos}{hint}") from None
    return data.get("input", data) if isinstance(data, dict) else data


def main_local(worker: ServerlessWorker, test_input: str | None) -> int:
    job_input = load_test_input(test_input)
    try:
        items = asyncio.run(worker.run_local(job_input))
    except BrokenPipeError:  # the reader of our output left (`| head`): the job ends, quietly
        # Python's advice for SIGPIPE: point stdout at devnull, so that its flush at exit raises nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 1 if any(isinstance(item, dict) and "error" in item for item in items) else 0
