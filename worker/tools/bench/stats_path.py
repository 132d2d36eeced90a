"""The exact-stats path's own cost per engine step, timed directly on the CPU.

Throughput of two engines side by side could not resolve a 1% cost on the H200 (two identical
engines differed by up to 13%, two paths over one engine by 37%). This part times what the stats
path adds to each engine step instead, with vLLM's own types and serialiser:

- vLLM's per-request tracking (``RequestSpecDecodeMetrics.observe``, once per request per step),
  which ``PER_REQUEST_SPEC_DECODE_METRICS=summary`` turns on in vLLM's scheduler;
- the worker's scheduler hook (``worker/spec_scheduler.py``), over a stand-in for vLLM's
  ``update_from_output`` that returns fresh outputs, as the real one does, for vLLM's own
  ``Request`` objects (whose ``output_token_ids`` is a read-only view: slicing it is a Python call);
- the snapshots' transport: vLLM's msgpack encode in the engine core and decode in the frontend.

The hook is timed from the moment the stand-in update returns, several times (the minimum is
kept, as ``timeit`` does); the transport is each step with snapshots encoded and decoded with and
without them in turn (the median of the runs is kept); the cyclic collector is off while timing,
as in ``timeit``. For the n-gram drafts (vLLM's synchronous scheduler) all of it sits on the
engine core's critical path, so its share of a step bounds the throughput it costs; with the
async scheduler it overlaps the GPU.

A request with stop strings gets a snapshot on each step whose tokens can complete one, so that
cost depends on the text: each request streams real English text (Python's own documentation,
``pydoc_data``: prose and code, hard-wrapped lines), tokenized by a byte-level BPE trained on it
offline (about 4.5 characters a token, as Llama 3 on English), ``accepted + 1`` tokens a step,
from text in which its stop string does not occur (a request ends at its stop string). Three
cases: no stop strings; ``"\\n\\n"`` on every request (a blank line: every line of that text ends
in a newline); an agent's ``"Observation:"`` on every request (colons are frequent in it). Each
reports the share of request-steps that got a snapshot (``snapshot_rate``, periodic ones
included). A fourth row, ``all_stop_every_step``, times the ``"\\n\\n"`` case without the trigger
table (what the hook does while the table is being built, and what it did on every step before
the table existed), so a run gives before / after side by side.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any

__all__ = ["EVERY_STEP_CASE", "STOP_CASES", "bench_stats_path", "stand_in_engine"]

# Row key -> the stop string every request carries (None: no stop strings).
STOP_CASES: dict[str, str | None] = {"no_stop": None, "all_stop": "\n\n", "agent_stop": "Observation:"}
# The row of all_stop's stop string timed with no trigger table: a snapshot on every step.
EVERY_STEP_CASE = "all_stop_every_step"


def _text_and_tokenizer() -> tuple[str, Any]:
    """Python's documentation, and a byte-level BPE trained on it (offline)."""
    import pydoc_data.topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    topics = pydoc_data.topics.topics
    text = "\n\n".join(topics[name] for name in sorted(topics))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return text, tokenizer


def _without(text: str, stop: str | None) -> str:
    """The text with no occurrence of ``stop``: a request ends at its stop string (that step's
    snapshot is needed, once a request), so the rate measured is that of the steps that could
    have ended it and did not."""
    while stop and stop in text:
        text = text.replace(stop, stop[:-1])
    return text


def _step_tokens(stream: list[int], *, size: int, k: int, steps: int) -> list[list[list[int]]]:
    """Per step, per request, the tokens it yields: ``accepted + 1`` from its own place in the text."""
    rng = random.Random(0)
    positions = [rng.randrange(len(stream) - (k + 1) * steps) for _ in range(size)]
    accepted = [i % (k + 1) for i in range(steps)]
    out = []
    for step in range(steps):
        n = accepted[step] + 1
        row = []
        for i, start in enumerate(positions):
            row.append(stream[start : start + n])
            positions[i] = start + n
        out.append(row)
    return out


def stand_in_engine(
    size: int, *, k: int, steps: int, stop: str | None, stream: list[int]
) -> tuple[type, list[Any], list[Any]]:
    """vLLM's scheduler reduced to taking requests and handing back this step's outputs, and
    ``size`` of vLLM's own engine-core requests (with the metrics its scheduler gives them), each
    streaming ``accepted + 1`` tokens a step from its own place in ``stream``, and their outputs
    (the same objects every step). The hook under test subclasses the class;
    ``scripts/stats_hook_ab.py`` uses it too."""
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics
    from vllm.v1.request import Request

    listed = []
    for i in range(size):
        request = Request(f"req-{i}", stream[:8], SamplingParams(stop=[stop] if stop else None), None)
        request.spec_decode_metrics = RequestSpecDecodeMetrics.new(k)
        listed.append(request)
    flat = [EngineCoreOutput(request.request_id, []) for request in listed]
    outputs = {0: EngineCoreOutputs(engine_index=0, outputs=flat)}
    tokens = _step_tokens(stream, size=size, k=k, steps=steps)

    class Core:
        def __init__(self) -> None:
            self.requests: dict[str, Any] = {}
            self.step = 0
            self.returned = 0  # perf_counter_ns() when the last update returned: the hook's clock starts there

        def add_request(self, request: Any) -> None:
            self.requests[request.request_id] = request

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            for output, new, request in zip(flat, tokens[self.step], listed, strict=True):
                request.append_output_token_ids(new)  # vLLM's update, before the hook runs
                output.new_token_ids = new
                output.spec_decode_metrics = None
            self.returned = time.perf_counter_ns()
            return outputs

    return Core, listed, flat


def _time_steps(
    size: int, *, k: int, steps: int, stop: str | None, repeats: int, stream: list[int], triggers: Any
) -> dict[str, float]:
    """Microseconds per engine step of each piece: vLLM's tracking and the hook timed alone (minimum
    of ``repeats``), the transport with snapshots minus without (median of ``repeats``)."""
    from worker.spec_scheduler import SpecMetricsSnapshots

    Core, listed, flat = stand_in_engine(size, k=k, steps=steps, stop=stop, stream=stream)
    metrics = [request.spec_decode_metrics for request in listed]

    class Hooked(SpecMetricsSnapshots, Core):  # type: ignore[valid-type,misc]  # a class made at run time
        pass

    hooked = Hooked()
    hooked._triggers, hooked._triggers_started = triggers, True
    for request in listed:
        hooked.add_request(request)
    # The cyclic collector off while timing, as ``timeit`` does: its passes over the growing
    # request histories landed in whichever piece was timed then (vLLM freezes the engine core's
    # start-up objects out of them; this process has no such freeze).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _timed(hooked, flat, metrics, k=k, steps=steps, size=size, repeats=repeats)
    finally:
        if collecting:
            gc.enable()


def _timed(
    hooked: Any, flat: list[Any], metrics: list[Any], *, k: int, steps: int, size: int, repeats: int
) -> dict[str, float]:
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from worker.spec_scheduler import SNAPSHOT_EVERY_STEPS

    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    accepted = [i % (k + 1) for i in range(steps)]
    best = {name: float("inf") for name in ("observe", "hook")}
    transport: list[int] = []
    snapshot_rate = 0.0
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for step in range(steps):
            for m in metrics:
                m.observe(num_draft_tokens=k, num_accepted=accepted[step])
        best["observe"] = min(best["observe"], time.perf_counter_ns() - started)
        # The hook from the moment vLLM's update returns to its own return. Not a difference of
        # two timings (with and without the hook): at 256 streams that carried a bias of -10 to
        # -19 µs, the no-stop hook measuring below zero.
        elapsed = 0
        for step in range(steps):
            hooked.step = step
            hooked.update_from_output(None, None)
            elapsed += time.perf_counter_ns() - hooked.returned
        best["hook"] = min(best["hook"], elapsed)
        # The transport: each step with a snapshot encoded and decoded with its snapshots and
        # without them, in turn (a step without one is the same bytes either way: no cost). Paired
        # per step, as two passes' totals differed by more than the snapshots cost.
        elapsed = snapshots = 0
        for step in range(steps):
            hooked.step = step
            step_outputs = hooked.update_from_output(None, None)[0]
            taken = [o.spec_decode_metrics for o in flat]
            count = len(taken) - taken.count(None)
            if not count:
                continue
            snapshots += count
            for with_snapshots in (step % 2 == 0, step % 2 == 1):
                if not with_snapshots:
                    for o in flat:
                        o.spec_decode_metrics = None
                started = time.perf_counter_ns()
                decoder.decode(encoder.encode(step_outputs))
                spent = time.perf_counter_ns() - started
                elapsed += spent if with_snapshots else -spent
                for o, m in zip(flat, taken, strict=True):
                    o.spec_decode_metrics = m
        transport.append(elapsed)
        snapshot_rate = snapshots / (steps * size)
    per_step = {name: value / steps / 1000 for name, value in best.items()}
    costs = {
        "observe_us": per_step["observe"],
        "hook_us": per_step["hook"],
        "transport_us": statistics.median(transport) / steps / 1000,
    }
    costs["total_us"] = sum(costs.values())
    costs["snapshot_rate"] = snapshot_rate
    costs["periodic_rate"] = 1 / SNAPSHOT_EVERY_STEPS
    return costs


def bench_stats_path(batch_sizes: list[int], *, k: int = 4, steps: int = 800, repeats: int = 5) -> dict[str, Any]:
    """Per batch size, what the stats path adds to an engine step (µs), for each case of STOP_CASES."""
    from worker.spec_scheduler import SNAPSHOT_EVERY_STEPS
    from worker.stop_triggers import StopTriggers

    text, tokenizer = _text_and_tokenizer()
    triggers = StopTriggers.from_tokenizer(tokenizer)
    streams = {stop: tokenizer.encode(_without(text, stop)).ids for stop in STOP_CASES.values()}
    rows = []
    for size in batch_sizes:
        row: dict[str, Any] = {"batch": size}
        for label, stop in STOP_CASES.items():
            row[label] = _time_steps(
                size, k=k, steps=steps, stop=stop, repeats=repeats, stream=streams[stop], triggers=triggers
            )
        stop = STOP_CASES["all_stop"]
        row[EVERY_STEP_CASE] = _time_steps(
            size, k=k, steps=steps, stop=stop, repeats=repeats, stream=streams[stop], triggers=None
        )
        rows.append(row)
    return {
        "k": k,
        "steps": steps,
        "repeats": repeats,
        # How the pieces were timed (results without it: the hook as stats on minus off).
        "hook_timed": "directly",
        "snapshot_every_steps": SNAPSHOT_EVERY_STEPS,
        "stops": {label: stop for label, stop in STOP_CASES.items() if stop}
        | {EVERY_STEP_CASE: STOP_CASES["all_stop"]},
        "text": "pydoc_data (Python's documentation), byte-level BPE trained on it",
        "rows": rows,
    }
