"""The exact-stats path's own cost per engine step, timed directly on the CPU.

Throughput of two engines side by side could not resolve a 1% cost on the H200 (two identical
engines differed by up to 13%, two paths over one engine by 37%). This part times what the stats
path adds to each engine step instead, with vLLM's own types and serialiser:

- vLLM's per-request tracking (``RequestSpecDecodeMetrics.observe``, once per request per step),
  which ``PER_REQUEST_SPEC_DECODE_METRICS=summary`` turns on in vLLM's scheduler;
- the worker's scheduler hook (``worker/spec_scheduler.py``), over a stand-in for vLLM's
  ``update_from_output`` that returns fresh outputs, as the real one does;
- the snapshots' transport: vLLM's msgpack encode in the engine core and decode in the frontend.

Stats on and off run alternately over the same steps, several times (the minimum is kept, as
``timeit`` does). For the n-gram drafts (vLLM's synchronous scheduler) all of it sits on the
engine core's critical path, so its share of a step bounds the throughput it costs; with the
async scheduler it overlaps the GPU. Requests with stop strings get a snapshot on every step:
``stop_fraction`` of the batch has them.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

__all__ = ["bench_stats_path"]


def _batch(size: int, k: int, stop_fraction: float) -> tuple[dict[str, Any], dict[int, Any]]:
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    num_stop = round(size * stop_fraction)
    requests = {
        f"req-{i}": SimpleNamespace(
            request_id=f"req-{i}",
            spec_decode_metrics=RequestSpecDecodeMetrics.new(k),
            sampling_params=SamplingParams(stop=["\n\n"] if i < num_stop else None),
        )
        for i in range(size)
    }
    outputs = {0: EngineCoreOutputs(engine_index=0, outputs=[EngineCoreOutput(rid, [1, 2, 3]) for rid in requests])}
    return requests, outputs


def _time_steps(size: int, *, k: int, steps: int, stop_fraction: float, repeats: int) -> dict[str, float]:
    """Microseconds per engine step of each piece, stats on minus stats off (minimum of ``repeats``)."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from worker.spec_scheduler import SpecMetricsSnapshots

    requests, outputs = _batch(size, k, stop_fraction)
    flat = outputs[0].outputs

    class Core:  # vLLM's scheduler, reduced to taking requests and handing back fresh outputs
        def __init__(self) -> None:
            self.requests: dict[str, Any] = {}

        def add_request(self, request: Any) -> None:
            self.requests[request.request_id] = request

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            for output in flat:
                output.spec_decode_metrics = None
            return outputs

    class Hooked(SpecMetricsSnapshots, Core):
        pass

    plain, hooked = Core(), Hooked()
    for request in requests.values():
        plain.add_request(request)
        hooked.add_request(request)
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    metrics = [request.spec_decode_metrics for request in requests.values()]
    accepted = [i % (k + 1) for i in range(steps)]
    best = {name: float("inf") for name in ("observe", "hook", "plain", "transport_on", "transport_off")}
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for step in range(steps):
            for m in metrics:
                m.observe(num_draft_tokens=k, num_accepted=accepted[step])
        best["observe"] = min(best["observe"], time.perf_counter_ns() - started)
        for name, scheduler in (("hook", hooked), ("plain", plain)):
            started = time.perf_counter_ns()
            for _ in range(steps):
                scheduler.update_from_output(None, None)
            elapsed = time.perf_counter_ns() - started
            best[name] = min(best[name], elapsed)
        for name, scheduler in (("transport_on", hooked), ("transport_off", plain)):
            elapsed = 0
            for _ in range(steps):
                step_outputs = scheduler.update_from_output(None, None)
                started = time.perf_counter_ns()
                decoder.decode(encoder.encode(step_outputs[0]))
                elapsed += time.perf_counter_ns() - started
            best[name] = min(best[name], elapsed)
    per_step = {name: value / steps / 1000 for name, value in best.items()}
    costs = {
        "observe_us": per_step["observe"],
        "hook_us": per_step["hook"] - per_step["plain"],
        "transport_us": per_step["transport_on"] - per_step["transport_off"],
    }
    costs["total_us"] = sum(costs.values())
    return costs


def bench_stats_path(
    batch_sizes: list[int], *, k: int = 4, steps: int = 800, stop_fraction: float = 0.0, repeats: int = 5
) -> dict[str, Any]:
    """Per batch size, what the stats path adds to an engine step (µs), with and without stop strings."""
    from worker.spec_scheduler import SNAPSHOT_EVERY_STEPS

    rows = []
    for size in batch_sizes:
        row: dict[str, Any] = {"batch": size}
        for label, fraction in (("no_stop", stop_fraction), ("all_stop", 1.0)):
            row[label] = _time_steps(size, k=k, steps=steps, stop_fraction=fraction, repeats=repeats)
        rows.append(row)
    return {"k": k, "steps": steps, "repeats": repeats, "snapshot_every_steps": SNAPSHOT_EVERY_STEPS, "rows": rows}
