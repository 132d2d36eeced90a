"""``SPECULATION_CONTROL=auto`` in a closed loop on the cost model: a stand-in for the GPU's map.

``streams`` streams each start a new request of ``tokens`` tokens as one ends; request ``i`` accepts
each draft with probability ``classes[i % n]`` given the one before (the classes of the map's mixed
workload); every step is priced by :data:`worker.speculation.cost.STEP_COSTS` (V2's n-gram by default) on
a virtual clock. The controller is fed each step's (drafted, accepted) pairs, shape and time, and
reviewed every ``REVIEW_EVERY_STEPS`` steps, as the worker's scheduler hooks do. The step costs are
the model's, so this checks the controller's choices against the best static k under that model,
with the batch's make-up moving as the requests end, which a uniform acceptance cannot show and the
CPU engine cannot produce (its acceptance is the tiny drafts', not chosen per request). ``skew``
(by k) makes the loop's host other than the model's: its steps at k take ``skew[k]`` times the
model's time, as on a host where verifying costs more than where the figures were fitted.

    python -m worker.tools.bench.closed_loop            # auto, auto without steady factors, static k
    python -m worker.tools.bench.closed_loop --skew 1,1.4,1.4,1.4,1.4   # a host dearer at verifying
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

from worker.speculation.controller import REVIEW_EVERY_STEPS, SAMPLE_SEQUENCES, SpeculationController
from worker.speculation.cost import STEP_COSTS, StepCost, step_ms

__all__ = ["auto_rate", "closed_loop", "fixed", "main"]

K = 4


def fixed(k: int) -> Callable[[int], int]:
    """Static k, whatever the batch size."""
    return lambda _batch_size: k


def closed_loop(
    k_of: Callable[[int], int],
    *,
    streams: int,
    classes: Sequence[float],
    controller: SpeculationController | None = None,
    cost: StepCost = STEP_COSTS["ngram"],
    tokens: int = 128,
    steps: int = 1500,
    warm: int = 400,
    seed: int = 1,
    skew: Sequence[float] | None = None,
) -> float:
    """Tokens per millisecond over the steps after ``warm`` (module docstring); ``k_of`` gives each
    step's k from the batch size (``controller.choose``, or :func:`fixed`)."""
    rng = random.Random(seed)
    num_spec_tokens = controller.num_spec_tokens if controller is not None else K
    made = 0

    def new() -> list[Any]:  # id, rate, tokens left, histogram of accepted drafts, drafts verified
        nonlocal made
        made += 1
        return [f"r{made}", classes[made % len(classes)], tokens, [0] * (num_spec_tokens + 1), 0]

    def counts(request: list[Any]) -> tuple[str, list[int], int, int]:
        return request[0], request[3], request[4], tokens - request[2]

    slots = [new() for _ in range(streams)]
    clock = counted_from = 0.0
    counted = 0
    pairs: dict[tuple[int, int], int] = {}
    shape: tuple[int, int, int, int] | None = None  # the last step's (sequences, k, verified, tokens)
    joined = joining = 0  # requests new in the last step, and in this one
    for step in range(steps):
        if controller is not None:
            controller.observe(pairs, now=clock / 1000, step=shape, joined=joined)
        joined, joining = joining, 0
        k = k_of(streams)
        shape = (streams, k, streams * k, streams * (k + 1))
        pairs = {}
        for i, request in enumerate(slots):
            accepted = 0
            while accepted < k and rng.random() < request[1]:
                accepted += 1
            got = min(1 + accepted, request[2])
            request[2] -= got
            if k:
                request[3][accepted] += 1
                request[4] += k
                if i < SAMPLE_SEQUENCES:  # what the scheduler hook reads of a step
                    pairs[(k, accepted)] = pairs.get((k, accepted), 0) + 1
            counted += got if step >= warm else 0
            if not request[2]:
                slots[i] = new()
                joining += 1
        clock += step_ms(cost, batch_size=streams, k=k) * (skew[k] if skew is not None else 1.0)
        counted_from = clock if step == warm - 1 else counted_from
        if controller is not None and (step + 1) % REVIEW_EVERY_STEPS == 0:
            controller.review([counts(r) for r in slots], batch_size=streams)  # every running request, as the hooks
    return counted / (clock - counted_from)


def auto_rate(
    streams: int, classes: Sequence[float], *, steady: bool = True, calibrate: bool = True, **kwargs: Any
) -> float:
    """:func:`closed_loop` under the controller as V2 runs it (full graphs for every k: no request
    trimmed alone); ``steady=False``: each k judged by the batch as it is (no steady factors);
    ``calibrate=False``: by the model's step times alone."""
    controller = SpeculationController(
        num_spec_tokens=K, cost=STEP_COSTS["ngram"], graph_batches=[1 << 20] * (K + 1), calibrate=calibrate
    )
    if steady:
        return closed_loop(controller.choose, streams=streams, classes=classes, controller=controller, **kwargs)
    with mock.patch("worker.speculation.controller.steady_factors", lambda _requests, n: [1.0] * (n + 1)):
        return closed_loop(controller.choose, streams=streams, classes=classes, controller=controller, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,8,32,64,128,256")
    parser.add_argument("--classes", default="1.0:0.6:0.0;0.6;0.0;1.0;0.8:0.2", help="';' between workloads")
    parser.add_argument("--skew", default="", help="by k, the host's step time over the model's (1,1.4,1.4,1.4,1.4)")
    args = parser.parse_args(argv)
    skew = [float(x) for x in args.skew.split(",")] if args.skew else None
    if skew is not None and len(skew) != K + 1:
        parser.error(f"--skew takes {K + 1} factors, one for each k from 0 to {K}")
    print(
        "| classes | streams | best static k | auto | auto without steady factors | auto by the model's step times "
        "| static k = 0 / 1 / 2 / 3 / 4 |"
    )
    print("|---|---|---|---|---|---|---|")
    for workload in args.classes.split(";"):
        classes = [float(c) for c in workload.split(":")]
        for streams in (int(s) for s in args.streams.split(",")):
            static = [closed_loop(fixed(k), streams=streams, classes=classes, skew=skew) for k in range(K + 1)]
            best = max(static)
            ratios = " / ".join(f"{s / best:.3f}" for s in static)
            auto = auto_rate(streams, classes, skew=skew)
            plain = auto_rate(streams, classes, steady=False, skew=skew)
            model_only = auto_rate(streams, classes, calibrate=False, skew=skew)
            print(
                f"| {', '.join(map(str, classes))} | {streams} | {static.index(best)} | {auto / best:.3f}x "
                f"| {plain / best:.3f}x | {model_only / best:.3f}x | {ratios} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
