"""SPECULATION_CONTROL=auto: the controller on its own (pure), then in the real CPU engine with
the tiny drafts (the noisy copy keeps speculating, the unrelated model ends at k = 0 with probes,
the noisy draft's acceptance comes back after a stretch at k = 0, the stats stay exact)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from tests.helpers import boot_engine
from worker.schema import SpecDecodeStats, parse_request
from worker.speculation.controller import (
    PROBE_CHAIN_SEQUENCES,
    PROBE_EVERY_STEPS,
    REVIEW_EVERY_STEPS,
    SpeculationController,
)
from worker.speculation.cost import STEP_COSTS, step_ms
from worker.speculation.decide import auto_schedule
from worker.speculation.measure import Acceptance, StepTimes, batch_bucket, geometric_rate
from worker.tools.bench.closed_loop import auto_rate, closed_loop, fixed
from worker.vllm_internals.scheduler_control import ControlledScheduling
from worker.vllm_internals.stand_in import StandInScheduler

if TYPE_CHECKING:
    from vllm.config import VllmConfig

K = 4


def controller(**kwargs: Any) -> SpeculationController:
    return SpeculationController(num_spec_tokens=K, cost=STEP_COSTS["ngram"], **kwargs)


def run_steps(c: SpeculationController, *, steps: int, batch_size: int, accept: float, previous: int = 0) -> list[int]:
    """``steps`` steps of ``batch_size`` sequences, each accepting the first ``round(accept * k)``
    drafts of the k chosen the step before (``previous``, for the first): the k of each step."""
    chosen = []
    for _ in range(steps):
        pairs = {(previous, round(accept * previous)): batch_size} if previous else {}
        c.observe(pairs)
        previous = c.choose(batch_size)
        chosen.append(previous)
    return chosen


def spy_on_observe(c: SpeculationController) -> list[dict[str, Any]]:
    """The keyword arguments of each of ``c.observe``'s calls from now on (it still observes)."""
    calls: list[dict[str, Any]] = []
    observe = c.observe

    def spy(pairs: Any, **kwargs: Any) -> None:
        calls.append(kwargs)
        observe(pairs, **kwargs)

    c.observe = spy  # type: ignore[method-assign]
    return calls


def test_acceptance_is_estimated_per_position() -> None:
    a = Acceptance(3)
    # 10 sequences drafted 3: 4 accepted none, 3 accepted one, 3 accepted all three.
    a.observe({(3, 0): 4, (3, 1): 3, (3, 3): 3})
    rates = a.rates()
    assert rates[0] == pytest.approx((6 + 2 * 0.7) / (10 + 2))  # 6 of 10 accepted the first
    assert rates[1] < rates[0]  # 3 of 6 reached the second
    assert rates[2] > rates[1]  # 3 of 3 reached the third


def test_a_good_draft_keeps_speculating_and_a_bad_one_stops_then_probes() -> None:
    good = run_steps(controller(), steps=200, batch_size=1, accept=1.0)
    assert set(good) == {K}
    c = controller()
    bad = run_steps(c, steps=600, batch_size=1, accept=0.0)
    first_off = bad.index(0)
    assert first_off < 100
    tail = bad[first_off:]
    probes = [i for i, k in enumerate(tail) if k]
    assert probes and all(tail[i] == 1 for i in probes), "a probe drafts the smallest k"
    assert len(probes) == pytest.approx(len(tail) / PROBE_EVERY_STEPS, abs=2)
    assert c.num_probes == len(probes) and c.steps_by_k[0] == tail.count(0)


def test_a_probe_notices_when_acceptance_recovers() -> None:
    c = controller()
    run_steps(c, steps=400, batch_size=1, accept=0.0)
    assert c.choose_quietly(1) == 0
    recovered = run_steps(c, steps=8 * PROBE_EVERY_STEPS, batch_size=1, accept=1.0)
    assert recovered[-10:] == [K] * 10


def test_while_off_a_request_that_joins_is_probed_without_waiting_its_turn() -> None:
    # One stream: a request that accepts nothing turned speculation off; the next one is judged by
    # probes from its first step, not by the one before it for up to PROBE_EVERY_STEPS steps.
    c = controller()
    run_steps(c, steps=400, batch_size=1, accept=0.0)
    assert c.choose_quietly(1) == 0
    probes = c.num_probes
    c.observe({}, step=(1, 0, 0, 5), joined=1)  # its prompt's step
    assert c.choose(1) == 1 and c.num_probes == probes + 1  # the smallest k: a probe
    # It accepts its drafts: probes follow while they accept, and within a few speculation is on.
    after = run_steps(c, steps=12, batch_size=1, accept=1.0, previous=1)
    assert 0 not in after and after[-4:] == [K] * 4
    # A request that joins and accepts nothing, like those before it, is off after one probe, at 1
    # stream as at 4.
    for batch_size in (1, 4):
        c = controller()
        run_steps(c, steps=400, batch_size=batch_size, accept=0.0)
        c.observe({}, step=(batch_size, 0, 0, 4 + batch_size), joined=batch_size // 2 or 1)
        assert c.choose(batch_size) == 1
        assert run_steps(c, steps=PROBE_EVERY_STEPS - 1, batch_size=batch_size, accept=0.0, previous=1) == [0] * (
            PROBE_EVERY_STEPS - 1
        )
    # At 4 streams one probe is not evidence enough: probes follow one another while half their
    # sequences accept (without: 31 steps off), and stop after PROBE_CHAIN_SEQUENCES sequences.
    c = controller()
    run_steps(c, steps=400, batch_size=4, accept=0.0)
    c.observe({}, step=(4, 0, 0, 4 + 4 * 6), joined=4)  # the whole batch replaced
    assert c.choose(4) == 1
    after = run_steps(c, steps=8, batch_size=4, accept=1.0, previous=1)
    assert after[0] == 1 and after[-1] == K
    c = controller()
    run_steps(c, steps=400, batch_size=8, accept=0.0)
    c.observe({}, step=(8, 0, 0, 8 + 8 * 6), joined=8)
    chained = [c.choose(8)]
    for _ in range(6):  # probes that half accept: evidence too weak to turn it on, yet they go on
        c.observe({(1, 1): 4, (1, 0): 4} if chained[-1] else {})
        chained.append(c.choose(8))
    assert chained == [1] * (PROBE_CHAIN_SEQUENCES // 8) + [0] * (7 - PROBE_CHAIN_SEQUENCES // 8)
    # In the closed loop, one stream of the mixed classes on a host where verifying costs 1.3x the
    # model: off during a request that accepts nothing, auto waited for a probe to see that the next
    # accepts every draft, and ran 0.89x static k = 4.
    mixed, dear = (1.0, 0.6, 0.0), (1.0, 1.3, 1.3, 1.3, 1.3)
    best = max(closed_loop(fixed(k), streams=1, classes=mixed, skew=dear) for k in range(K + 1))
    assert auto_rate(1, mixed, skew=dear) >= 0.97 * best
    # At 64 streams, requests that join one a step do not bring a probe forward.
    c = controller()
    previous = run_steps(c, steps=400, batch_size=64, accept=0.0)[-1]
    for _ in range(2 * PROBE_EVERY_STEPS):  # on to the next probe: the countdown to the one after starts there
        if previous:
            break
        c.observe({})
        previous = c.choose(64)
    assert previous
    for _ in range(PROBE_EVERY_STEPS - 1):
        c.observe({}, step=(64, 0, 0, 64), joined=1)
        assert c.choose(64) == 0


def test_the_schedule_and_the_engines_ks_bound_the_choice() -> None:
    schedule = [0] + [K] * 8 + [1] * 8 + [0] * 16  # dense: index = batch size
    c = controller(schedule=schedule, allowed_ks=[0, 2, 4])
    assert run_steps(c, steps=50, batch_size=4, accept=1.0)[-1] == 4
    assert set(run_steps(c, steps=50, batch_size=12, accept=1.0)) == {0}  # 1 is not runnable, 2 is above the cap
    assert set(run_steps(c, steps=50, batch_size=20, accept=1.0)) == {0}  # the schedule's 0: no probes either
    assert c.num_probes == 0
    assert set(run_steps(c, steps=50, batch_size=100, accept=1.0)) == {0}  # beyond the table: its last entry


def test_on_v2_no_k_runs_past_its_largest_full_cuda_graph() -> None:
    # By k, the most sequences a step replays a full graph for (vLLM's sizes up to 512 tokens).
    c = controller(allowed_ks=range(K + 1), graph_batches=[512, 256, 166, 128, 100])
    sizes = (1, 100, 101, 128, 129, 166, 167, 256, 257)
    assert [c.highest_k(b) for b in sizes] == [4, 4, 3, 3, 2, 2, 1, 1, 0]
    assert set(run_steps(c, steps=50, batch_size=300, accept=1.0)) == {0}
    assert c.num_probes == 0  # off for want of a graph, not for acceptance: no probes


# vLLM's default capture sizes for a 512-token ceiling (vllm/config/vllm.py).
SIZES_512 = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]


class _V2GraphsStandIn(StandInScheduler):
    """A fake: the stand-in of vLLM's scheduler configured as a GPU engine on the V2 runner with full
    CUDA graphs up to 512 tokens would be (the CPU build runs V1 and no graphs)."""

    def __init__(
        self,
        *,
        schedule: list[list[int]],
        is_async: bool = True,
        method: str = "ngram_gpu",
        mode: str = "FULL_AND_PIECEWISE",
        sizes: list[int] = SIZES_512,
        **kwargs: Any,
    ) -> None:
        from vllm.config import CompilationConfig, CUDAGraphMode
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        super().__init__(num_spec_tokens=K, method="ngram_gpu", max_batch_size=256, **kwargs)
        self.use_v2_model_runner = True
        self.dynamic_sd_lookup = build_dynamic_sd_schedule_lookup(schedule, 256, K)
        compilation = CompilationConfig(
            cudagraph_mode=CUDAGraphMode[mode], cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=sizes[-1]
        )
        config = SimpleNamespace(
            speculative_config=SimpleNamespace(method=method, num_speculative_tokens_per_batch_size=schedule),
            compilation_config=compilation,
            model_config=SimpleNamespace(enforce_eager=False),
            scheduler_config=SimpleNamespace(async_scheduling=is_async),
            device_config=SimpleNamespace(device_type="cuda"),
        )
        self.vllm_config = cast("VllmConfig", config)


class _ControlledV2(ControlledScheduling, _V2GraphsStandIn):
    pass


def test_on_v2_the_workers_schedule_lists_graphs_and_a_users_schedule_is_a_ceiling() -> None:
    own = _ControlledV2(schedule=auto_schedule(K, on_v2=True)).controller
    # V2 rounds each size up to a multiple of k + 1 and drops those past 512: k = 4 up to 100 sequences.
    assert own.schedule is None and own.graph_batches == [512, 256, 166, 128, 100]
    assert own.allowed_ks == [0, 1, 2, 3, 4]
    # Its one batch size per k is for vLLM's graphs only: k = 4 at 8 sequences, 1 at 256 (the graphs' bound).
    assert [own.highest_k(b) for b in (1, 8, 64, 256)] == [4, 4, 4, 1]
    users = _ControlledV2(schedule=[[1, 8, 4], [9, 256, 2]]).controller
    assert users.allowed_ks == [0, 2, 4] and [users.highest_k(b) for b in (8, 9, 200)] == [4, 2, 1]


def test_under_full_graphs_every_step_up_to_the_largest_size_replays_one() -> None:
    # The worker's default for n-gram under auto on V2 (FULL, graphs up to 1,024 tokens): V2 captures
    # each size for any mix of query lengths, so k = 3 runs on a graph at 256 sequences.
    sizes = [*SIZES_512[:-1], *range(512, 1025, 16)]
    full = _ControlledV2(schedule=auto_schedule(K, on_v2=True), mode="FULL", sizes=sizes).controller
    assert full.graph_batches == [1024, 512, 341, 256, 204]
    assert [full.highest_k(b) for b in (8, 204, 205, 256)] == [4, 4, 3, 3]


def test_n_gram_is_priced_by_whether_vllm_schedules_asynchronously_and_eagle_heads_by_their_own_fit() -> None:
    schedule = auto_schedule(K, on_v2=True)
    assert _ControlledV2(schedule=schedule).controller.cost is STEP_COSTS["ngram"]
    assert _ControlledV2(schedule=schedule, is_async=False).controller.cost is STEP_COSTS["ngram_sync"]
    for method in ("eagle", "eagle3"):
        assert _ControlledV2(schedule=schedule, method=method).controller.cost is STEP_COSTS["eagle"]
    assert _ControlledV2(schedule=schedule, method="draft_model").controller.cost is STEP_COSTS["draft_model"]


def test_a_request_that_accepts_far_less_than_the_batch_is_capped() -> None:
    c = controller()
    run_steps(c, steps=100, batch_size=256, accept=0.75)  # compute-bound: verification costs
    k = c.choose_quietly(256)
    assert k >= 2
    good = ("good", [0, 0, 0, 100, 0], 300, 400)  # 3 of 3 accepted every step
    bad = ("bad", [90, 10, 0, 0, 0], 300, 110)
    c.review([good, bad], batch_size=256)
    assert c.caps == {"bad": 1}
    assert c.draft_cap == K  # not every request is capped: the batch still drafts its k
    c.review([bad], batch_size=256)
    assert c.draft_cap == 1 and c.highest_k(256) == 1
    c.review([("new", [3, 0, 0, 0, 0], 9, 3)], batch_size=256)  # too few steps to judge
    assert c.caps == {} and c.draft_cap == K


def test_with_full_cuda_graphs_no_request_is_trimmed_alone_only_the_batch_k_comes_down() -> None:
    # A V2 graph holds every request of a step at one query length: a capped request would make
    # the batch run without it (the H200's mixed map: 0.50-0.73x static k = 4 at 32 streams).
    c = controller(graph_batches=[1024] * (K + 1))  # graphs for every k up to 1,024 sequences
    run_steps(c, steps=100, batch_size=256, accept=0.75)
    assert c.choose_quietly(256) >= 2
    good = ("good", [0, 0, 0, 100, 0], 300, 400)
    bad = ("bad", [90, 10, 0, 0, 0], 300, 110)
    worse = ("worse", [100, 0, 0, 0, 0], 300, 100)
    c.review([good, bad], batch_size=256)
    assert c.caps == {} and c.draft_cap == K  # the trimmed controller above caps "bad" alone
    c.review([bad, worse], batch_size=256)  # every request capped: the batch's k comes down, for all alike
    assert c.caps == {} and c.draft_cap == 1 and c.highest_k(256) == 1
    c.review([bad, worse], batch_size=256)  # judged afresh, not from the capped k: the same call again
    assert c.draft_cap == 1


def test_the_steady_factors_need_enough_reviewed_requests_and_weigh_each_by_its_tokens_per_step() -> None:
    c = controller()
    # Half accept every draft (20 steps of 4: 100 tokens), half none (20 tokens).
    mixed = [(f"r{i}", [0, 0, 0, 0, 20] if i % 2 else [20, 0, 0, 0, 0], 80, 100 if i % 2 else 20) for i in range(16)]
    fresh = [(f"new{i}", [1, 0, 0, 0, 0], 4, 2) for i in range(12)]
    c.review(mixed[:4] + fresh, batch_size=16)
    assert c.factors == [1.0] * (K + 1)  # 4 of 16 reviewed: too few to judge the batch's make-up
    c.review(mixed, batch_size=16)
    judged = list(c.factors)
    assert judged[2] > 1.0  # the rate-1 half stays longer at a lower k
    c.review(mixed[:3], batch_size=3)
    assert c.factors != judged and c.factors[2] > 1.0  # a batch of 3, all reviewed
    # The same requests, having had one token a step (off but for their verify steps): a make-up
    # drawn at k = 0, which a higher k would thin of its rate-1 half.
    c.review([(rid, h, d, 400 if t > 20 else 100) for rid, h, d, t in mixed], batch_size=16)
    assert judged[4] == pytest.approx(1.0) and c.factors[4] < 0.9
    c.review([(f"new{i}", [1, 0, 0, 0, 0], 4, 2) for i in range(16)], batch_size=16)
    assert c.factors == [1.0] * (K + 1)  # none reviewed (as after a stretch at k = 0): no factors


def test_the_scheduler_hooks_give_the_review_each_requests_tokens_so_far() -> None:
    from worker.vllm_internals.stand_in import ControlledStandIn, add_drafting, step_inputs

    scheduler = ControlledStandIn(num_spec_tokens=K, max_batch_size=4)
    ids = [f"req-{i}" for i in range(4)]
    add_drafting(scheduler, dict.fromkeys(ids, K), num_spec_tokens=K)
    seen: list[Any] = []
    scheduler.controller.review = lambda requests, *, batch_size: seen.append(  # type: ignore[method-assign]
        [(rid, list(histogram), drafted, tokens) for rid, histogram, drafted, tokens in requests]  # as they are then
    )
    for step in range(REVIEW_EVERY_STEPS):
        accepted = step % (K + 1)
        scheduler.update_from_output(
            *step_inputs(
                num_scheduled_tokens={rid: 1 + K for rid in ids},
                drafts={rid: [-1] * K for rid in ids},
                invalid_drafts=None,
                sampled={rid: [0] * (1 + accepted) for rid in ids},
            )
        )
        for request in scheduler.running:
            request.spec_token_ids = [-1] * K
    assert len(seen) == 1 and len(seen[0]) == 4
    # The review runs before vLLM's update of the step: its counts stop one step short.
    last = 1 + (REVIEW_EVERY_STEPS - 1) % (K + 1)
    tokens = {r.request_id: r.num_output_tokens - last for r in scheduler.running}
    for rid, histogram, drafted, num_tokens in seen[0]:
        assert num_tokens == tokens[rid] == sum(histogram) + sum(j * n for j, n in enumerate(histogram))
        assert drafted == K * sum(histogram)


def test_in_a_mixed_closed_loop_auto_weighs_what_k_does_to_the_batch() -> None:
    # The H200's mixed map at 32 and 64 streams (rates 1, 0.6 and 0), on the cost model
    # (worker/tools/bench/closed_loop.py): the best static k falls with load, and the batch holds
    # the requests that accept least the longest.
    mixed = (1.0, 0.6, 0.0)

    def static(streams: int, ks: Sequence[int]) -> float:  # the best of these static k
        return max(closed_loop(fixed(k), streams=streams, classes=mixed) for k in ks)

    for streams in (32, 64):
        assert auto_rate(streams, mixed) >= 0.97 * static(streams, range(K + 1))
    # Each k judged by the batch as it is (no steady factors): 64 streams miss.
    assert auto_rate(64, mixed, steady=False) < 0.97 * static(64, (1, 2))
    # A uniform workload: the factors stay at 1, and auto keeps to the best static k.
    for streams in (8, 64):
        assert auto_rate(streams, (0.6,)) >= 0.97 * static(streams, range(K + 1))


def test_step_times_learn_each_k_and_lean_on_the_verifying_ks_measured() -> None:
    times = StepTimes()
    assert times.scales(64, K) == [1.0] * (K + 1)  # nothing measured: the model's figures
    for _ in range(200):
        times.add(batch_size=64, k=2, measured_ms=14.0, model_ms=10.0)
        times.add(batch_size=64, k=0, measured_ms=6.0, model_ms=6.0)
    scales = times.scales(64, K)
    assert scales[0] == pytest.approx(1.0) and scales[2] == pytest.approx(1.4, rel=0.03)
    # k = 1, 3 and 4, never measured at this batch size: the host's cost of verifying, k = 2's.
    assert scales[1] == scales[3] == scales[4] == pytest.approx(1.4, rel=0.03)
    assert times.scales(33, K) == scales and times.scales(65, K) == [1.0] * (K + 1)  # 33-64, 65-128, ...
    times.add(batch_size=8, k=0, measured_ms=10.0, model_ms=5.0)  # one step: mostly the prior still
    assert 1.0 < times.scales(8, K)[0] < 1.5
    # Only k = 0 measured: no evidence that verifying costs otherwise, so k > 0 reads as k = 0 does.
    only_zero = StepTimes()
    for _ in range(100):
        only_zero.add(batch_size=128, k=0, measured_ms=13.0, model_ms=10.0)
    assert only_zero.scales(128, K) == pytest.approx([1.3] * (K + 1), rel=0.02)
    # Only k > 0 measured, and dear: k = 0 keeps the model's figures, so that it is tried.
    only_spec = StepTimes()
    for _ in range(100):
        only_spec.add(batch_size=128, k=2, measured_ms=13.0, model_ms=10.0)
    assert only_spec.scales(128, K)[0] == 1.0
    # Outputs that come unevenly (a short interval, then a long one): the time the steps took.
    uneven = StepTimes()
    for measured in [3.0, 17.0] * 100:
        uneven.add(batch_size=32, k=1, measured_ms=measured, model_ms=10.0)
    assert uneven.scales(32, K)[1] == pytest.approx(1.0, rel=0.02)  # a mean of logs: 0.71


def test_a_k_measured_dear_once_fades_back_to_its_prior_while_others_run() -> None:
    # A transient (a warm-up, a prefill ramp) must not keep a k off for good: a k not chosen is not
    # measured again, so its cell fades, slowly, while its batch size's other k values run.
    times = StepTimes()
    for _ in range(60):
        times.add(batch_size=64, k=3, measured_ms=20.0, model_ms=10.0)
    assert times.scales(64, K)[3] > 1.9
    for _ in range(3000):
        times.add(batch_size=64, k=0, measured_ms=6.0, model_ms=6.0)
        times.add(batch_size=64, k=1, measured_ms=7.0, model_ms=7.0)
    assert times.scales(64, K)[3] == pytest.approx(1.0, abs=0.05)
    for _ in range(30):  # but a few hundred steps do not make it forget
        times.add(batch_size=32, k=3, measured_ms=20.0, model_ms=10.0)
    for _ in range(100):
        times.add(batch_size=32, k=0, measured_ms=6.0, model_ms=6.0)
    assert times.scales(32, K)[3] > 1.7


def test_a_steps_time_runs_from_one_outcome_to_the_next_and_a_prefills_step_is_left_out() -> None:
    c = controller()
    model = step_ms(c.cost, batch_size=64, k=2)
    now = 0.0
    c.observe({}, now=now)
    for _ in range(100):
        now += 1.5 * model / 1000
        c.observe({(2, 1): 64}, now=now, step=(64, 2, 128, 192), scheduled_at=now - 2 * model / 1000)
    c.choose(64)
    assert c.report()["step_scales"][2] == pytest.approx(1.5, rel=0.02)
    # A step that ran a prompt's chunk besides its decode tokens: not a decode step's time.
    now += 4 * model / 1000
    c.observe({}, now=now, step=(64, 2, 128, 192 + 500))
    assert c.report()["step_scales"][2] == pytest.approx(1.5, rel=0.02)
    # A step that a request joins, and the step before it, are left out: the host prepares the join's
    # step before it takes in the outcome of the one before (on the H200, 13-22 ms where a step took 6-8).
    now += 10 * model / 1000
    c.observe({(2, 1): 64}, now=now, step=(64, 2, 128, 192))
    now += 10 * model / 1000
    c.observe({(2, 1): 64}, now=now, step=(64, 2, 128, 192 + 6), joined=1)
    for _ in range(2):
        now += 1.5 * model / 1000
        c.observe({(2, 1): 64}, now=now, step=(64, 2, 128, 192))
    assert c.report()["step_scales"][2] == pytest.approx(1.5, rel=0.02)
    # An engine idle for a second, then one step scheduled: its time runs from when it was scheduled.
    for _ in range(100):
        now += 1.0
        c.observe({(2, 1): 64}, now=now, step=(64, 2, 128, 192), scheduled_at=now - 1.5 * model / 1000)
    assert c.report()["step_scales"][2] == pytest.approx(1.5, rel=0.02)
    assert controller(calibrate=False).report()["step_scales"] is None


def test_where_the_engine_drafts_after_its_outcome_a_steps_time_holds_the_drafts_of_the_step_before() -> None:
    # vLLM's V2 runner copies a step's outcome once sampled, then drafts: the time up to the next
    # outcome is the drafting of this step's k and the next step's verification of those drafts.
    c = controller(drafts_after_output=True)
    times = c.step_times
    assert times is not None
    now = 0.0
    c.observe({}, now=now, step=(64, 0, 0, 64))
    for step in range(200):
        probe = step % 2 == 0  # a probe step drafts 1 and verifies nothing; the one after verifies 1 each
        now += 0.010
        c.observe({}, now=now, step=(64, 1, 0, 64) if probe else (64, 0, 64, 128))
    cells = times.buckets[batch_bucket(64)]
    # The steps after a probe (drafted 1 the step before, verifying 1 each) under k = 1, priced so.
    measured, model = cells[1][1], cells[1][2]
    assert model / cells[1][0] == pytest.approx(step_ms(c.cost, batch_size=64, k=1, num_verified=64, num_tokens=128))
    assert measured / cells[1][0] == pytest.approx(10.0)
    # A step after a prompt's chunk is not counted either: its time holds the chunk's drafting. (A
    # step's time is filed at the next outcome, unless a request joins there.)
    c.observe({}, now=now + 0.01, step=(64, 1, 0, 64 + 500))
    weights = {k: cell[0] for k, cell in cells.items()}
    c.observe({}, now=now + 0.02, step=(64, 0, 64, 128))
    c.observe({}, now=now + 0.03, step=(64, 1, 0, 64))
    assert {k: cell[0] for k, cell in cells.items()} == weights
    c.observe({}, now=now + 0.04, step=(64, 0, 64, 128))  # then a probe and its verification count again
    c.observe({}, now=now + 0.05, step=(64, 1, 0, 64))
    assert cells[1][0] == pytest.approx(weights[1] * times.stale_decay * times.decay + 1)


def test_the_scheduler_hooks_give_the_controller_each_steps_shape() -> None:
    from worker.vllm_internals.stand_in import ControlledStandIn, add_drafting, step_inputs

    scheduler = ControlledStandIn(num_spec_tokens=K, max_batch_size=4)
    widths = {"req-0": K, "req-1": K, "req-2": 2}
    add_drafting(scheduler, widths, num_spec_tokens=K)
    observed = spy_on_observe(scheduler.controller)
    tokens = {rid: 1 + width for rid, width in widths.items()}
    scheduler.update_from_output(
        *step_inputs(
            num_scheduled_tokens={**tokens, "new": 2},  # and two tokens of a prompt
            drafts={rid: [-1] * width for rid, width in widths.items()},
            invalid_drafts=None,
            sampled={rid: [0] for rid in widths},
            num_spec_tokens_to_schedule=1,  # the step drafts 1 for the next (as a probe's step before)
            new_requests=["new"],
        )
    )
    # sequences, k drafted, drafts verified (the step before drafted them), tokens the target ran
    assert [call["step"] for call in observed] == [(4, 1, 2 * K + 2, 3 + 2 * K + 2 + 2)]
    assert [call["joined"] for call in observed] == [1]
    # A CPU engine's steps would rescale the GPU's figures: the model's alone there.
    assert scheduler.controller.step_times is not None
    assert ControlledStandIn(num_spec_tokens=K, max_batch_size=4, device_type="cpu").controller.step_times is None


def test_a_step_scheduled_on_an_idle_engine_is_timed_from_its_scheduling() -> None:
    from worker.vllm_internals.stand_in import add_drafting, step_inputs

    class _Returning(StandInScheduler):
        """A fake: the stand-in, whose schedule() hands back a prepared step (vLLM's returns the
        object its update then gets)."""

        prepared: Any = None

        def schedule(self, throttle_prefills: bool = False) -> Any:
            return self.prepared

    class _Controlled(ControlledScheduling, _Returning):
        pass

    scheduler = _Controlled(num_spec_tokens=K, max_batch_size=4)
    observed = spy_on_observe(scheduler.controller)

    def one_step() -> None:
        inputs = step_inputs(num_scheduled_tokens={"req-0": 1}, drafts={}, invalid_drafts=None, sampled={"req-0": [0]})
        scheduler.prepared = inputs[0]
        scheduler.schedule()
        if not scheduler.running:
            add_drafting(scheduler, {"req-0": 0}, num_spec_tokens=K)
        scheduler.update_from_output(*inputs)

    one_step()  # scheduled with nothing running: an idle engine
    one_step()  # scheduled while the request runs
    assert observed[0]["scheduled_at"] is not None and observed[1]["scheduled_at"] is None


def test_in_a_closed_loop_auto_weighs_the_step_times_it_measures() -> None:
    # A host on which verifying costs more (or less) than where the model's figures were fitted: the
    # H200's mixed map measured static k = 2 steps at 64 streams 1.0x the model on one host and 1.4x
    # on another, with no speculation 1.0x on both. The loop's steps cost the model's times the skew.
    mixed = (1.0, 0.6, 0.0)

    def best_static(streams: int, classes: Sequence[float], skew: Sequence[float]) -> float:
        return max(closed_loop(fixed(k), streams=streams, classes=classes, skew=skew) for k in range(K + 1))

    dear, cheap = (1.0, 1.3, 1.3, 1.3, 1.3), (1.0, 0.85, 0.85, 0.85, 0.85)
    for streams, classes, skew in ((64, mixed, dear), (128, (0.6,), dear), (256, (0.6,), cheap)):
        best = best_static(streams, classes, skew)
        assert auto_rate(streams, classes, skew=skew) >= 0.97 * best
        assert auto_rate(streams, classes, skew=skew, calibrate=False) < 0.93 * best  # by the model alone


def test_geometric_rate_inverts_the_mean_accepted() -> None:
    for rate in (0.0, 0.3, 0.6, 0.9, 1.0):
        mean = sum(rate**p for p in range(1, K + 1))
        assert geometric_rate(mean, K) == pytest.approx(rate, abs=0.01)


# ------------------------------------------------------------------------------ real engine
def counts(stats: SpecDecodeStats) -> tuple[int, int]:
    return stats.num_draft_tokens, stats.num_accepted_draft_tokens


def check_exact(stats: SpecDecodeStats, completion_tokens: int) -> None:
    """Per-step arrays (PER_REQUEST_SPEC_DECODE_METRICS=detailed) agree with the totals, and the
    verified steps yield no more tokens than the request got."""
    if not stats.num_spec_steps:  # vLLM leaves the arrays out when empty
        assert stats.num_draft_tokens == stats.num_accepted_draft_tokens == 0
        return
    assert stats.per_step_drafted is not None and stats.per_step_accepted is not None
    assert len(stats.per_step_drafted) == len(stats.per_step_accepted) == stats.num_spec_steps
    assert sum(stats.per_step_drafted) == stats.num_draft_tokens
    assert sum(stats.per_step_accepted) == stats.num_accepted_draft_tokens
    assert all(0 <= a <= d for a, d in zip(stats.per_step_accepted, stats.per_step_drafted, strict=True))
    assert sum(stats.acceptance_histogram) == stats.num_spec_steps
    assert stats.num_spec_steps + stats.num_accepted_draft_tokens <= completion_tokens - 1 + stats.num_spec_tokens


async def generate(engine: Any, prompt: str, max_tokens: int) -> tuple[SpecDecodeStats, int]:
    request = parse_request(
        {"prompt": prompt, "sampling_params": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}}
    )
    final = [chunk async for chunk in engine.generate(request)][-1]
    assert final.spec_decode is not None and final.usage is not None
    check_exact(final.spec_decode, final.usage.completion_tokens)
    return final.spec_decode, final.usage.completion_tokens


def engine_counters() -> tuple[int, int]:
    from worker.tools.bench.spec import engine_spec_counters

    totals = engine_spec_counters()
    return int(totals["vllm:spec_decode_num_draft_tokens"]), int(totals["vllm:spec_decode_num_accepted_tokens"])


async def counted_by_engine_since(before: tuple[int, int], drafted: int) -> tuple[int, int]:
    """vLLM's own counters since ``before``, once they have caught up with ``drafted`` (its frontend
    records a step's stats just after handing out the outputs), or after 5 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while True:
        now = engine_counters()
        delta = (now[0] - before[0], now[1] - before[1])
        if delta[0] >= drafted or loop.time() > deadline:
            return delta
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
async def noisy_auto(tiny_models: Any) -> AsyncIterator[Any]:
    """The noisy draft under auto, with a schedule capping k at 0 from batch 2 up: a request that
    runs alone speculates, and stops while others run beside it (its draft's KV kept in step)."""
    engine = await boot_engine(
        tiny_models,
        MODEL_NAME="tiny:target",
        SPECULATIVE_MODEL="tiny:noisy",
        NUM_SPECULATIVE_TOKENS=3,
        SPECULATION_CONTROL="auto",
        SPECULATIVE_TOKENS_BY_BATCH="1-1:3,2-16:0",
        PER_REQUEST_SPEC_DECODE_METRICS="detailed",
    )
    yield engine
    engine.shutdown()


PROMPT = "Once upon a time"


@pytest.mark.slow
async def test_the_noisy_draft_keeps_speculating_under_auto(noisy_auto: Any) -> None:
    stats, completion = await generate(noisy_auto, PROMPT, 120)
    assert stats.num_spec_steps + stats.num_accepted_draft_tokens == completion - 1, "every step verified drafts"
    assert stats.draft_acceptance_rate is not None and stats.draft_acceptance_rate >= 0.3


@pytest.mark.slow
async def test_after_a_stretch_at_k_zero_the_noisy_drafts_acceptance_comes_back(noisy_auto: Any) -> None:
    # The same greedy request alone (k > 0 throughout), then again with three others running beside
    # it for a while (batch 4: the schedule's k = 0, no drafts), after which it is alone again. A
    # draft whose KV cache missed the tokens of the k = 0 stretch would accept far less afterwards.
    alone, _ = await generate(noisy_auto, PROMPT, 200)
    before = engine_counters()
    task = asyncio.create_task(generate(noisy_auto, PROMPT, 200))
    # Start the others once the request has verified a few steps alone.
    others = [generate(noisy_auto, f"The worker streams {i}", 60) for i in range(3)]
    await asyncio.sleep(0)  # let the request be scheduled first
    side = await asyncio.gather(*others)
    mixed, completion = await task
    off_steps = completion - 1 - mixed.num_spec_steps - mixed.num_accepted_draft_tokens
    assert off_steps >= 20, "the request ran a stretch without drafts"
    drafted = mixed.per_step_drafted or []
    accepted = mixed.per_step_accepted or []
    tail = 20  # the verified steps after the stretch at k = 0 (its last ones: alone again)
    assert len(drafted) > tail
    tail_rate = sum(accepted[-tail:]) / sum(drafted[-tail:])
    assert alone.draft_acceptance_rate is not None
    assert tail_rate >= 0.5 * alone.draft_acceptance_rate, (tail_rate, alone.draft_acceptance_rate)
    # The stats across the changes of k: vLLM's own engine-wide counters saw the same drafts.
    mine = [counts(mixed)] + [counts(s) for s, _ in side]
    total = (sum(d for d, _ in mine), sum(a for _, a in mine))
    assert await counted_by_engine_since(before, total[0]) == total


@pytest.mark.slow
async def test_the_unrelated_draft_ends_at_k_zero_with_probes(tiny_models: Any) -> None:
    engine = await boot_engine(
        tiny_models,
        MODEL_NAME="tiny:target",
        SPECULATIVE_MODEL="tiny:unrelated",
        NUM_SPECULATIVE_TOKENS=3,
        SPECULATION_CONTROL="auto",
        PER_REQUEST_SPEC_DECODE_METRICS="detailed",
    )
    try:
        before = engine_counters()
        first, _ = await generate(engine, PROMPT, 150)  # the controller learns the draft is bad
        later, completion = await generate(engine, "The worker streams", 200)
        assert later.num_accepted_draft_tokens == 0
        # Off, but probing: one verified step of one draft in every PROBE_EVERY_STEPS or so.
        assert later.per_step_drafted and set(later.per_step_drafted) == {1}
        expected_probes = (completion - 1) / PROBE_EVERY_STEPS
        assert 1 <= later.num_spec_steps <= expected_probes + 2
        drafted = first.num_draft_tokens + later.num_draft_tokens
        assert await counted_by_engine_since(before, drafted) == (drafted, 0)
    finally:
        engine.shutdown()


@pytest.mark.slow
async def test_a_capped_request_verifies_fewer_drafts_and_the_counts_stay_exact(
    tiny_models: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trimming of a capped request's drafts, in vLLM's async scheduler (a draft model): which
    # requests are capped is the controller's call from acceptance and load, which the tiny models
    # on a CPU do not produce on demand, so a stand-in review caps every request whose prompt says
    # so to one draft a step (the engine core is forked from this process: it inherits the patch).
    def stand_in_review(self: SpeculationController, requests: Any, *, batch_size: int) -> None:
        self.caps = {rid: 1 for rid, *_ in requests if "capped" in rid}

    monkeypatch.setattr(SpeculationController, "review", stand_in_review)
    engine = await boot_engine(
        tiny_models,
        MODEL_NAME="tiny:target",
        SPECULATIVE_MODEL="tiny:target",  # its own draft: every draft accepted, the batch's k stays 3
        NUM_SPECULATIVE_TOKENS=3,
        SPECULATION_CONTROL="auto",
        PER_REQUEST_SPEC_DECODE_METRICS="detailed",
        WARMUP_REQUEST="false",
    )
    try:
        before = engine_counters()

        async def one(rid: str) -> SpecDecodeStats:
            request = parse_request(
                {"prompt": PROMPT, "sampling_params": {"temperature": 0, "max_tokens": 400, "ignore_eos": True}}
            )
            final = [chunk async for chunk in engine.generate(request, request_id=rid)][-1]
            assert final.spec_decode is not None and final.usage is not None
            check_exact(final.spec_decode, final.usage.completion_tokens)
            return final.spec_decode

        names = [f"{'capped' if i % 2 else 'free'}-{i}" for i in range(4)]
        results = await asyncio.gather(*(one(rid) for rid in names))
        for rid, stats in zip(names, results, strict=True):
            steps = stats.per_step_drafted or []
            # After the first review, a capped request verifies one draft a step.
            late = steps[REVIEW_EVERY_STEPS + 4 :]
            assert late and set(late) == ({1} if "capped" in rid else {3}), (rid, steps)
        drafted = sum(s.num_draft_tokens for s in results)
        accepted = sum(s.num_accepted_draft_tokens for s in results)
        assert await counted_by_engine_since(before, drafted) == (drafted, accepted)
    finally:
        engine.shutdown()
