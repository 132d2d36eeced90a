"""Each engine step's shape and the time its outcome reached the scheduler, traced to a file (a
bench hook for the speculation map: ``SPEC_MAP_STEP_TRACE=PATH``).

The controller of ``SPECULATION_CONTROL=auto`` scales the cost model by how long its steps take
(``StepTimes``); this trace holds what it reads, for every engine (no speculation and static k
too), so that the intervals can be split offline by the k drafted, the k before, and whether a
new request's prompt shared the step. The seam's probe (:func:`worker.vllm_internals.probes.trace_steps`)
wraps vLLM's ``Scheduler.update_from_output`` in the map's process before the engines boot, as
:mod:`.acceptance_mix` does, and the engine cores forked from it inherit the wrapper. Each
engine core writes ``PATH.PID``: one line a step, ``time batch drafted verified tokens new`` (the
time the step's outcome reached the scheduler, its sequences, the k it drafted for the next step,
the drafts it verified, the tokens the target ran, the requests new in it), in blocks of 256 lines
(the last block of an engine killed at the end is lost).

    python -m worker.tools.bench.step_trace TRACE...   # intervals by batch size, k, and joins near

The split: the interval up to a step's outcome under the k the step before drafted (where
``StepTimes`` files it on vLLM's V2 runner); "join" where a request is new in the step, the one
before or the one after (with async scheduling the host prepares the next step, with its new
requests, before it takes in this step's outcome; ``StepTimes`` leaves out the step and the one
before it, and keeps the one after, which the traces show at a decode step's time); "switch" where
the k drafted changed from the step before.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from worker.speculation.cost import STEP_COSTS, StepCost, step_ms
from worker.speculation.measure import batch_bucket

if TYPE_CHECKING:
    from worker.vllm_internals.probes import StepShape

__all__ = ["TRACE_ENV", "install", "main", "split"]

TRACE_ENV = "SPEC_MAP_STEP_TRACE"
_FLUSH_EVERY = 256


def install(path: str) -> bool:
    """Traces this process's engine steps, and those of engine cores forked from it, to
    ``PATH.PID`` (the seam's :func:`~worker.vllm_internals.probes.trace_steps`); False where an
    earlier call already did."""
    from worker.vllm_internals.probes import trace_steps

    lines: list[str] = []

    def record(step: StepShape) -> None:
        lines.append(
            f"{step.at:.6f} {step.num_seqs} {step.num_drafting} {step.num_verified} {step.num_tokens} {step.num_new}\n"
        )
        if len(lines) >= _FLUSH_EVERY:
            with open(f"{path}.{os.getpid()}", "a") as out:
                out.writelines(lines)
            lines.clear()

    return trace_steps(record)


Groups = dict[tuple[int, int, bool, bool], list[tuple[float, float]]]


def split(rows: Sequence[Sequence[float]], cost: StepCost) -> Groups:
    """A trace's intervals (module docstring): (batch bucket, k, join near, k switched) ->
    [(measured ms, the model's ms)], the bucket as ``StepTimes`` files it (``batch_bucket``)."""
    groups: Groups = collections.defaultdict(list)
    for i in range(2, len(rows) - 1):
        t, b, _, verified, tokens, new = rows[i]
        before = rows[i - 1]
        k = int(before[2])
        join = bool(new or before[5] or rows[i + 1][5])
        model = step_ms(cost, batch_size=int(b), k=k, num_verified=int(verified), num_tokens=int(tokens))
        groups[(batch_bucket(int(b)), k, join, k != int(rows[i - 2][2]))].append(((t - before[0]) * 1000, model))
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Engine steps' intervals by batch size, k and joins")
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--cost", default="ngram", choices=sorted(STEP_COSTS))
    args = parser.parse_args(argv)
    for path in args.traces:
        with open(path) as lines:
            rows = [[float(x) for x in line.split()] for line in lines]
        print(f"{path}: {len(rows)} steps")
        print("| batch | k | join near | k switched | steps | measured / model | median ms | model ms | time, ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        for (bucket, k, join, switched), pairs in sorted(split(rows, STEP_COSTS[args.cost]).items()):
            if len(pairs) < 4:
                continue
            measured, model = sum(m for m, _ in pairs), sum(x for _, x in pairs)
            median_ms, model_ms = statistics.median(m for m, _ in pairs), statistics.median(x for _, x in pairs)
            print(
                f"| {(1 << (bucket - 1)) + 1 if bucket else 1}-{1 << bucket} | {k} | {'yes' if join else 'no'} "
                f"| {'yes' if switched else 'no'} | {len(pairs)} | {measured / model:.2f} "
                f"| {median_ms:.2f} | {model_ms:.2f} | {measured:.0f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
