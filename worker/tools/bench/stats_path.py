"""The exact-stats path's own cost per engine step, timed directly on the CPU.

Throughput of two engines side by side could not resolve a cost this small on a GPU: two identical
engines differed by more than it (docs/benchmarks.md). This part times what the stats path adds
to each engine step instead, with vLLM's own types and serialiser:

- vLLM's per-request tracking (``RequestSpecDecodeMetrics.observe``, once per request per step),
  which ``PER_REQUEST_SPEC_DECODE_METRICS=summary`` turns on in vLLM's scheduler;
- the worker's scheduler hooks (``worker/vllm_internals/scheduler.py``) over the stand-in for vLLM's
  scheduler that the tests use too (``worker/vllm_internals/stand_in.py``: vLLM's own ``Request`` objects,
  scheduler and model outputs shaped as vLLM's): the per-step
  hook around vLLM's update (timed from its call to the stand-in update's start, and from the
  stand-in's return to its own), plus the abort path of every request that ends on its stop
  string (the answer: a walk of the request's last steps) and the add of the request that takes
  its place, each timed as a whole call (the stand-in's own bookkeeping counted against the hook;
  vLLM's own making of the replacing requests, ``Request(...)``, is timed apart, for scale);
- the answers' transport: vLLM's msgpack encode in the engine core and decode in the frontend, each
  step with answers encoded with and without them in turn (the median of the runs is kept);
- the frontend's scan of a step's outputs for those of requests it holds (``spec_frontend``), on
  the frontend's own process: reported beside the engine core's figures, not in their total.

The cyclic collector is off while timing, as ``timeit`` does. For n-gram drafts (vLLM's
synchronous scheduler) the engine core's part sits on its critical path, so its share of a step
bounds the throughput it costs; with the async scheduler it overlaps the GPU.

Each request streams real English text (Python's documentation, ``pydoc_data``: prose and code),
tokenized by a byte-level BPE trained on it offline (about 4.5 characters a token, as Llama 3 on
English), ``accepted + 1`` tokens a step. Three cases: no stop strings; ``"\\n\\n"`` on every
request, from text without blank lines (no request ends: what watching for a stop string costs
every step, the case the earlier designs were measured on); and ``"\\n\\n"`` on every request
ending at each blank line of the text, a new request taking its place from there on (an agent's
turns; that text has one every 40 tokens or so, so at 256 streams some 20 requests end a step).
The frontend's abort lands ``ABORT_LAG_STEPS`` steps after the stop string.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import statistics
import time
from typing import Any

__all__ = ["ABORT_LAG_STEPS", "STOP_CASES", "bench_stats_path"]

# Row key -> the stop string every request carries (None: no stop strings), and whether requests
# end at it (else the text has none).
STOP_CASES: dict[str, tuple[str | None, bool]] = {
    "no_stop": (None, False),
    "all_stop": ("\n\n", False),
    "all_stop_ending": ("\n\n", True),
}
# Steps between the one with the stop string and the one before which its abort lands.
ABORT_LAG_STEPS = 2


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


def _turn_ends(tokenizer: Any, text: str, stop: str) -> tuple[list[int], set[int]]:
    """The text's tokens, and the token positions after which its stop string has completed."""
    encoding = tokenizer.encode(text)
    ends = set()
    start = text.find(stop)
    for index, (_, end) in enumerate(encoding.offsets):
        while start != -1 and end >= start + len(stop):
            ends.add(index + 1)
            start = text.find(stop, start + 1)
    return encoding.ids, ends


def _schedule(
    size: int, *, k: int, steps: int, stream: list[int], ends: set[int] | None
) -> tuple[list[list[list[int]]], list[list[int]]]:
    """Per step, per slot, the tokens it yields (``accepted + 1`` from its own place in the text),
    and per step the slots whose request's stop string completed in that step."""
    rng = random.Random(0)
    positions = [rng.randrange(len(stream) - (k + 1) * steps) for _ in range(size)]
    accepted = [i % (k + 1) for i in range(steps)]
    tokens, ending = [], []
    for step in range(steps):
        n = accepted[step] + 1
        row, done = [], []
        for slot, start in enumerate(positions):
            row.append(stream[start : start + n])
            positions[slot] = start + n
            if ends is not None and any(p in ends for p in range(start + 1, start + n + 1)):
                done.append(slot)
        tokens.append(row)
        ending.append(done)
    return tokens, ending


def _time_case(
    size: int,
    *,
    k: int,
    steps: int,
    stop: str | None,
    repeats: int,
    tokens: list[list[list[int]]],
    ending: list[list[int]],
) -> dict[str, float]:
    """Microseconds per engine step of each piece (minimum of ``repeats`` for the timed-alone
    ones, median for the paired transport), and the requests ended per step."""
    from worker.speculation.stats.answers import ANSWERS_ID, ANSWERS_KEY
    from worker.vllm_internals.frontend import count_held_outputs
    from worker.vllm_internals.probes import engine_core_outputs, outputs_round_trip
    from worker.vllm_internals.stand_in import HookedStandIn, StandInScheduler, make_request, step_inputs

    serial = iter(range(10**9))

    def new_request(rid: str | None = None) -> Any:
        """One of vLLM's engine-core requests, taking a slot's place (``rid``: a twin of that one,
        for the bare stand-in)."""
        return make_request(rid or f"req-{next(serial)}", num_spec_tokens=k, stop=[stop] if stop else None)

    round_trip = outputs_round_trip()
    drafts = [0] * k
    best = {name: float("inf") for name in ("observe", "hook", "ends", "frontend", "made", "plain")}
    transport: list[int] = []
    num_ends = 0
    collecting = gc.isenabled()
    gc.disable()  # as timeit does: the collector's passes land in whichever piece is being timed
    try:
        for _ in range(repeats):
            # vLLM's per-request tracking is timed on its own below: the stand-in leaves it out.
            hooked = HookedStandIn(is_observing=False)
            slots = [new_request() for _ in range(size)]
            # The stand-in without the hooks, given twins of the same requests: what its own
            # bookkeeping costs of the ends' calls (the hooked calls' time includes it).
            bare = StandInScheduler(is_observing=False)
            for request in slots:
                hooked.add_request(request)
                bare.add_request(new_request(request.request_id))
            held: dict[str, int] = {}  # the frontend's held requests: id -> the step its abort lands
            observe = hook = ends = scan = paired = made = bookkeeping = 0
            num_ends = 0
            for step in range(steps):
                requests = slots
                ids = [r.request_id for r in requests]
                sampled = {rid: list(t) for rid, t in zip(ids, tokens[step], strict=True)}
                inputs = step_inputs(
                    num_scheduled_tokens=dict.fromkeys(ids, 1 + k),
                    drafts=dict.fromkeys(ids, drafts),
                    invalid_drafts=None,
                    sampled=sampled,
                )
                accepted = len(tokens[step][0]) - 1
                tracked = [m for r in requests if (m := r.spec_decode_metrics) is not None]
                started = time.perf_counter_ns()
                for metrics in tracked:
                    metrics.observe(num_draft_tokens=k, num_accepted=accepted)
                observe += time.perf_counter_ns() - started
                # The hook around vLLM's update (its own parts before and after the stand-in's).
                started = time.perf_counter_ns()
                outputs = hooked.update_from_output(*inputs)
                hook += (hooked.entered - started) + (time.perf_counter_ns() - hooked.returned)
                # The transport of this step's answers (sent with its outputs), paired.
                flat = outputs[0].outputs
                answered: dict[str, Any] = {}
                if flat and flat[-1].request_id == ANSWERS_ID and flat[-1].kv_transfer_params is not None:
                    answered = flat[-1].kv_transfer_params[ANSWERS_KEY]
                    plain = engine_core_outputs(flat[:-1])
                    for with_answers in (step % 2 == 0, step % 2 == 1):
                        payload = outputs[0] if with_answers else plain
                        t0 = time.perf_counter_ns()
                        round_trip(payload)
                        spent = time.perf_counter_ns() - t0
                        paired += spent if with_answers else -spent
                # The frontend's scan of the step's outputs for those of held requests.
                if held:  # as the processor: no scan while it holds nothing
                    # The scan alone: vLLM's processing of the outputs around it is vLLM's cost either way.
                    t0 = time.perf_counter_ns()
                    count_held_outputs({rid: _HeldEntry() for rid in held}, flat)
                    scan += time.perf_counter_ns() - t0
                for rid in answered:
                    held.pop(rid, None)
                # Aborts that land now (their stop string was ABORT_LAG_STEPS steps ago), and the
                # requests ending on this step: replaced by new requests, from the same place on.
                landing = [rid for rid, when in held.items() if when == step]
                ended = ending[step] if stop else []
                if landing or ended:
                    t0 = time.perf_counter_ns()
                    replacements = [new_request() for _ in ended]  # vLLM's own making of them: for scale
                    made += time.perf_counter_ns() - t0
                    twins = [new_request(r.request_id) for r in replacements]
                    t0 = time.perf_counter_ns()
                    if landing:
                        hooked.abort_requests(landing)
                    for slot, replacement in zip(ended, replacements, strict=True):
                        held[requests[slot].request_id] = step + ABORT_LAG_STEPS
                        requests[slot] = replacement
                        hooked.add_request(replacement)
                    ends += time.perf_counter_ns() - t0
                    t0 = time.perf_counter_ns()
                    if landing:
                        bare.abort_requests(landing)
                    for twin in twins:
                        bare.add_request(twin)
                    bookkeeping += time.perf_counter_ns() - t0
                num_ends += len(ended)
            best["observe"] = min(best["observe"], observe)
            best["hook"] = min(best["hook"], hook)
            best["ends"] = min(best["ends"], ends)
            best["frontend"] = min(best["frontend"], scan)
            best["made"] = min(best["made"], made)
            best["plain"] = min(best["plain"], bookkeeping)
            transport.append(paired)
    finally:
        if collecting:
            gc.enable()
    per_step = {name: value / steps / 1000 for name, value in best.items()}
    costs = {
        "observe_us": per_step["observe"],
        "hook_us": per_step["hook"],
        "ends_us": per_step["ends"],
        "transport_us": statistics.median(transport) / steps / 1000,
    }
    costs["total_us"] = sum(costs.values())
    costs["frontend_us"] = per_step["frontend"]
    # For scale, not in the total: vLLM's own making of the engine-core requests that replace them.
    costs["request_creation_us"] = per_step["made"]
    # Of ends_us, the stand-in scheduler's own bookkeeping (its finish and add, without the hooks).
    costs["stand_in_ends_us"] = per_step["plain"]
    costs["ends_per_step"] = num_ends / steps
    return costs


@dataclasses.dataclass(slots=True)
class _HeldEntry:
    """What the frontend's scan counts on a held request: its outputs after the stop string."""

    after: list[int] = dataclasses.field(default_factory=list)


def bench_stats_path(batch_sizes: list[int], *, k: int = 4, steps: int = 800, repeats: int = 5) -> dict[str, Any]:
    """Per batch size, what the stats path adds to an engine step (µs), for each case of STOP_CASES."""
    from worker.vllm_internals.scheduler import SNAPSHOT_EVERY_STEPS

    text, tokenizer = _text_and_tokenizer()
    blank = "\n\n"
    stream, blank_lines = _turn_ends(tokenizer, text, blank)
    without = tokenizer.encode(text.replace(blank, "\n")).ids
    rows = []
    for size in batch_sizes:
        row: dict[str, Any] = {"batch": size}
        for label, (stop, ending_at_stop) in STOP_CASES.items():
            tokens, ending = _schedule(
                size,
                k=k,
                steps=steps,
                stream=stream if ending_at_stop else without,
                ends=blank_lines if ending_at_stop else None,
            )
            row[label] = _time_case(size, k=k, steps=steps, stop=stop, repeats=repeats, tokens=tokens, ending=ending)
        rows.append(row)
    return {
        "k": k,
        "steps": steps,
        "repeats": repeats,
        # How the pieces were timed (results without it: the hook as stats on minus off).
        "hook_timed": "directly",
        # The design measured (results without it: snapshots on steps that can complete a stop string).
        "design": "answered aborts",
        "snapshot_every_steps": SNAPSHOT_EVERY_STEPS,
        "abort_lag_steps": ABORT_LAG_STEPS,
        "stops": {label: stop for label, (stop, _) in STOP_CASES.items() if stop},
        "text": "pydoc_data (Python's documentation), byte-level BPE trained on it",
        "rows": rows,
    }
