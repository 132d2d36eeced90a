"""The engine core's answer to a stop string's abort, and the frontend's arithmetic on it.

Random schedules over a stand-in for vLLM's scheduler (the engine tests in ``test_engine_spec.py``
run the same hook inside the real engine core): each request yields ``accepted + 1`` tokens on a
step that verified drafts, one on a step that verified none (an n-gram miss), some with drafts a
grammar invalidated; the frontend's stop string lands on a random step, its abort a random number
of steps later, and some requests end in the core first (``max_tokens``, which trims the step's
tokens as vLLM does). The counts the frontend computes from the answer must equal the counts the
request had right after its stop string's step.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any

from worker.speculation.stats.answers import ANSWERS_ID, ANSWERS_KEY, NOT_VERIFIED, UNKNOWN, Answer, Counts, kept_counts
from worker.vllm_internals.scheduler import TAIL_STEPS
from worker.vllm_internals.stand_in import HookedStandIn, make_request, step_outputs

K = 3


@dataclasses.dataclass
class _Plan:
    """One request of a random schedule: where the frontend finds its stop string, where its abort
    lands, the token counts of its outputs after the stop, its counts at the stop, and so on."""

    stop: int
    abort: int
    seen: list[int] = dataclasses.field(default_factory=list)
    kept: tuple[list[int], int] | None = None
    answer: Any = None
    ended: int | None = None


def _request(rid: str, *, stop: list[str] | None, max_tokens: int = 10_000, client: int = 0) -> Any:
    return make_request(rid, num_spec_tokens=K, stop=stop, max_tokens=max_tokens, client=client)


def _step(
    scheduler: HookedStandIn, shapes: dict[str, tuple[int, int, int]], *, prefill: frozenset[str] = frozenset()
) -> Any:
    """One step: per request (drafts scheduled, drafts a grammar invalidated, accepted)."""
    return step_outputs(
        scheduler,
        num_scheduled_tokens={rid: 1 + d + (40 if rid in prefill else 0) for rid, (d, _, _) in shapes.items()},
        drafts={rid: [7] * d for rid, (d, _, _) in shapes.items() if d},
        invalid_drafts={rid: i for rid, (_, i, _) in shapes.items() if i},
        sampled={rid: [5] * (accepted + 1) for rid, (_, _, accepted) in shapes.items()},
    )


def _answers(outputs: dict[int, Any]) -> dict[str, tuple[int, Answer]]:
    """The step's answers: request id -> (client index, the decoded answer). They come last in a
    client's outputs, in one output of their own."""
    found = {}
    for client, eco in outputs.items():
        assert all(o.request_id != ANSWERS_ID for o in eco.outputs[:-1])
        last = eco.outputs[-1] if eco.outputs else None
        if last is not None and last.request_id == ANSWERS_ID:
            for rid, raw in last.kv_transfer_params[ANSWERS_KEY].items():
                found[rid] = (client, Answer.from_wire(raw))
    return found


def _random_shape(rng: random.Random) -> tuple[int, int, int]:
    if rng.random() < 0.25:
        return (0, 0, 0)  # no drafts this step (an n-gram miss): one token
    drafts = rng.randint(1, K)
    invalid = rng.randint(0, 1) if rng.random() < 0.1 else 0
    return (drafts, invalid, rng.randint(0, drafts - invalid))


def test_the_counts_kept_equal_the_counts_at_the_stop_string() -> None:
    seen: collections.Counter[str] = collections.Counter()
    for seed in range(40):
        seen += _trial(seed)
    # Every kind of ending came up: steps taken off (some without drafts), a request the core ended
    # itself after the stop string, and a frontend further behind than the answer describes.
    assert seen["taken off"] and seen["taken off, one without drafts"] and seen["ended in the core"]
    assert seen["tail too short"]


def _trial(seed: int) -> collections.Counter[str]:
    from vllm.v1.request import RequestStatus

    from worker.vllm_internals.scheduler import ENDED_STEPS

    rng = random.Random(seed)
    scheduler = HookedStandIn()
    plans = {}
    for i in range(6):
        stop_step = rng.randint(1, 30)
        lag = rng.randint(0, TAIL_STEPS + 2)  # steps the core runs before the abort lands
        max_tokens = rng.choice([10_000, stop_step * 2 + rng.randint(0, 8)])  # some end in the core first
        rid = f"r{i}"
        scheduler.add_request(_request(rid, stop=["x"], max_tokens=max_tokens, client=i % 2))
        plans[rid] = _Plan(stop=stop_step, abort=stop_step + lag)
    plain = _request("plain", stop=None)
    scheduler.add_request(plain)
    for step in range(1, 60):
        live = [rid for rid in scheduler.requests]
        outputs = _step(scheduler, {rid: _random_shape(rng) for rid in live})
        for rid, (_, answer) in _answers(outputs).items():
            plans[rid].answer = answer
        for eco in outputs.values():
            for output in eco.outputs:
                plan = plans.get(output.request_id)
                if plan is None:
                    continue
                if output.finish_reason is not None:
                    plan.ended = step
                if step <= plan.stop:
                    request = scheduler.requests.get(output.request_id)
                    metrics = output.spec_decode_metrics if request is None else request.spec_decode_metrics
                    assert metrics is not None
                    plan.kept = (list(metrics.histogram), metrics.num_draft_tokens)
                else:
                    plan.seen.append(len(output.new_token_ids))  # dropped by the frontend, counted
        aborting = [rid for rid, plan in plans.items() if plan.abort == step and step >= plan.stop]
        if aborting:
            scheduler.finish_requests(aborting, RequestStatus.FINISHED_ABORTED)
    outcomes: collections.Counter[str] = collections.Counter()
    for plan in plans.values():
        answer = plan.answer
        if answer is None:  # ended in the core long before its abort: the answer's window had passed
            assert plan.ended is not None and plan.abort - plan.ended >= ENDED_STEPS
            continue
        counts = kept_counts(
            answer.counts,
            tail=answer.tail,
            after=plan.seen,
            ended=answer.is_ended,
            final_accepted=answer.final_accepted,
        )
        if counts is None:  # the tail was too short: the frontend reports the snapshot as partial
            assert len(plan.seen) > len(answer.tail)
            outcomes["tail too short"] += 1
            continue
        assert (counts.histogram, counts.num_draft_tokens) == plan.kept
        taken_off = answer.tail[: len(plan.seen)]
        outcomes["taken off"] += bool(taken_off)
        outcomes["taken off, one without drafts"] += NOT_VERIFIED in taken_off
        outcomes["ended in the core"] += answer.is_ended and bool(taken_off)
    return outcomes


def test_tails_stop_at_steps_that_are_not_decode_steps_and_answers_go_to_their_client() -> None:
    from vllm.v1.request import RequestStatus

    scheduler = HookedStandIn()
    for rid, client in (("a", 0), ("b", 1), ("c", 0)):
        scheduler.add_request(_request(rid, stop=["x"], client=client))
    _step(scheduler, {"a": (0, 0, 0), "b": (0, 0, 0), "c": (0, 0, 0)}, prefill=frozenset("abc"))
    _step(scheduler, {"a": (3, 1, 2), "b": (2, 0, 0), "c": (3, 0, 3)})
    _step(scheduler, {"a": (0, 0, 0), "b": (3, 0, 1)})  # c not scheduled this step
    scheduler.requests["c"].status = RequestStatus.PREEMPTED
    assert not scheduler.answer_books().pending
    scheduler.finish_requests(["a", "b", "c", "gone"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.has_requests()
    outputs = _step(scheduler, {})
    tails = {rid: (client, answer.tail, answer.is_ended) for rid, (client, answer) in _answers(outputs).items()}
    assert tails == {
        "a": (0, [NOT_VERIFIED, 2, UNKNOWN], False),
        "b": (1, [3, 2, UNKNOWN], False),
        "c": (0, [UNKNOWN], False),  # preempted: its last steps' outputs may have been dropped
    }
    assert not scheduler.answer_books().pending and not scheduler.has_requests()


def test_no_answer_for_requests_without_stop_strings_and_periodic_snapshots() -> None:
    from vllm.v1.request import RequestStatus

    from worker.vllm_internals.scheduler import SNAPSHOT_EVERY_STEPS

    scheduler = HookedStandIn()
    scheduler.add_request(_request("plain", stop=None))
    scheduler.add_request(_request("stop", stop=["x"]))
    snapshots = []
    for step in range(1, SNAPSHOT_EVERY_STEPS + 1):
        outputs = _step(scheduler, {"plain": (3, 0, step % 4), "stop": (3, 0, 1)})
        for output in outputs[0].outputs:
            if output.spec_decode_metrics is not None:
                live = scheduler.requests[output.request_id].spec_decode_metrics
                assert output.spec_decode_metrics == live and output.spec_decode_metrics is not live
                snapshots.append((step, output.request_id))
    assert snapshots == [(SNAPSHOT_EVERY_STEPS, "plain"), (SNAPSHOT_EVERY_STEPS, "stop")]
    scheduler.finish_requests(["plain"], RequestStatus.FINISHED_ABORTED)
    books = scheduler.answer_books()
    assert not books.pending and books.with_stops == {"stop"}
    scheduler.finish_requests(["stop"], RequestStatus.FINISHED_ABORTED)
    books = scheduler.answer_books()
    assert books.pending == {0: ["stop"]} and not books.with_stops


def test_a_request_ended_in_the_core_is_answered_for_a_window_of_steps() -> None:
    from vllm.v1.request import RequestStatus

    from worker.vllm_internals.scheduler import ENDED_STEPS, RING_STEPS

    scheduler = HookedStandIn()
    scheduler.add_request(_request("early", stop=["x"], max_tokens=4))
    scheduler.add_request(_request("late", stop=["x"], max_tokens=4))
    scheduler.add_request(_request("latest", stop=["x"], max_tokens=4))
    scheduler.add_request(_request("other", stop=None))
    outputs = _step(scheduler, {"early": (3, 0, 3), "late": (3, 0, 3), "latest": (3, 0, 3), "other": (3, 0, 0)})
    # All ended in the core on 4 tokens; vLLM trimmed nothing here, the frontend saw 4.
    assert {o.request_id for o in outputs[0].outputs if o.finish_reason is not None} == {"early", "late", "latest"}
    scheduler.finish_requests(["early"], RequestStatus.FINISHED_ABORTED)
    _, answer = _answers(_step(scheduler, {"other": (3, 0, 0)}))["early"]
    assert (answer.tail, answer.is_ended, answer.final_accepted) == ([3], True, 3)
    counts = kept_counts(answer.counts, tail=[3], after=[4], ended=True, final_accepted=3)
    assert counts is not None and counts.histogram == [0, 0, 0, 0] and counts.num_draft_tokens == 0
    for _ in range(RING_STEPS):
        _step(scheduler, {"other": (3, 0, 0)})
    # Past the ring: answered, with no tail left to read (the frontend reports it partial at once).
    scheduler.finish_requests(["late"], RequestStatus.FINISHED_ABORTED)
    _, answer = _answers(_step(scheduler, {"other": (3, 0, 0)}))["late"]
    assert (answer.tail, answer.is_ended) == ([], True)
    assert kept_counts(answer.counts, tail=answer.tail, after=[4], ended=True, final_accepted=3) is None
    for _ in range(ENDED_STEPS):
        _step(scheduler, {"other": (3, 0, 0)})
    scheduler.finish_requests(["latest"], RequestStatus.FINISHED_ABORTED)  # past the window: no answer
    books = scheduler.answer_books()
    assert not books.pending and not books.ended


def test_kept_counts_arithmetic() -> None:
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    # Five verify steps (accepted 3, 0, 2, 1, 3; 3 drafts each) and one step without drafts.
    m = RequestSpecDecodeMetrics(3, [1, 1, 1, 2], 15, [3, 0, 2, 1, 3], [3, 3, 3, 3, 3])
    # The last two steps came after the stop string: accepted 3 (4 tokens), then a step without drafts.
    kept = kept_counts(m, tail=[NOT_VERIFIED, 3, 3], after=[4, 1])
    assert kept is not None
    assert (kept.histogram, kept.num_draft_tokens) == ([1, 1, 1, 1], 12)
    assert (kept.per_step_accepted, kept.per_step_drafted) == ([3, 0, 2, 1], [3, 3, 3, 3])
    assert kept_counts(m, tail=[3, 3], after=[]) == Counts.of(m)
    assert kept_counts(m, tail=[3], after=[4, 1]) is None  # more steps to take off than described
    assert kept_counts(m, tail=[UNKNOWN, 3], after=[1]) is None
    assert kept_counts(m, tail=[NOT_VERIFIED], after=[2]) is None  # a step without drafts yields one token
    assert kept_counts(m, tail=[3], after=[5]) is None  # 4 accepted of 3 drafts
    assert kept_counts(RequestSpecDecodeMetrics(3, [1, 0, 0, 0], 3), tail=[3], after=[3]) is None  # no such step
    # Ended in the core on a step whose tokens were trimmed to 1: its accepted count comes from the core.
    assert kept_counts(m, tail=[3], after=[1], ended=True, final_accepted=None) is None
    ended = kept_counts(m, tail=[3], after=[1], ended=True, final_accepted=3)
    assert ended is not None and ended.histogram == [1, 1, 1, 1]


def test_answers_round_trip() -> None:
    import msgspec
    import pytest
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    summary = RequestSpecDecodeMetrics(num_spec_tokens=3, histogram=[1, 0, 2, 5], num_draft_tokens=24)
    detailed = RequestSpecDecodeMetrics(
        num_spec_tokens=2,
        histogram=[1, 1, 1],
        num_draft_tokens=6,
        per_step_accepted=[0, 1, 2],
        per_step_drafted=[2] * 3,
    )
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    for metrics, tail, ended, final in [
        (summary, [3, NOT_VERIFIED, 2], False, None),
        (summary, [], True, None),
        (detailed, [2, UNKNOWN], True, 0),
        (detailed, [2], True, 2),
    ]:
        answer = Answer(counts=Counts.of(metrics), tail=tail, is_ended=ended, final_accepted=final)
        # Through vLLM's own serialiser, as the engine core sends a step's outputs to the frontend.
        carried = EngineCoreOutput(ANSWERS_ID, [], kv_transfer_params={ANSWERS_KEY: {"r": answer.to_wire()}})
        (received,) = decoder.decode(encoder.encode(EngineCoreOutputs(outputs=[carried]))).outputs
        assert received.kv_transfer_params is not None
        back = Answer.from_wire(received.kv_transfer_params[ANSWERS_KEY]["r"])
        assert back == answer and back.counts == Counts.of(metrics)
    # An answer of another shape (a field renamed or inserted by an upgrade) is refused, not misread.
    with pytest.raises(msgspec.ValidationError):
        Answer.from_wire([[3, [1, 0], "24", [], []], [], False, None])
