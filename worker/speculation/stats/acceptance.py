"""Pure acceptance arithmetic: a per-request histogram of accepted draft tokens to stats.

``histogram[j]`` counts verify steps in which ``j`` draft tokens were accepted
(``0 <= j <= num_spec_tokens``). Every verify step also yields one token of the target's
own (the bonus or correction token), hence ``mean_acceptance_length = 1 + accepted / steps``.
Without a verify step (a one-token answer, or k = 0 throughout) there is no length, and without a
draft no rate: None, not the 1.0 and 0.0 that 0% acceptance gives.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.schema import SpecDecodeStats

__all__ = ["acceptance_rate", "mean_acceptance_length", "spec_stats_from_histogram"]


def acceptance_rate(*, num_accepted: int, num_drafted: int) -> float | None:
    return num_accepted / num_drafted if num_drafted else None


def mean_acceptance_length(*, num_accepted: int, num_steps: int) -> float | None:
    return 1.0 + num_accepted / num_steps if num_steps else None


def spec_stats_from_histogram(
    histogram: Sequence[int],
    *,
    num_draft_tokens: int,
    num_spec_tokens: int,
    is_partial: bool = False,
    per_step_accepted: Sequence[int] | None = None,
    per_step_drafted: Sequence[int] | None = None,
) -> SpecDecodeStats:
    num_steps = sum(histogram)
    num_accepted = sum(j * count for j, count in enumerate(histogram))
    return SpecDecodeStats(
        num_spec_tokens=num_spec_tokens,
        num_spec_steps=num_steps,
        num_draft_tokens=num_draft_tokens,
        num_accepted_draft_tokens=num_accepted,
        draft_acceptance_rate=acceptance_rate(num_accepted=num_accepted, num_drafted=num_draft_tokens),
        mean_acceptance_length=mean_acceptance_length(num_accepted=num_accepted, num_steps=num_steps),
        acceptance_histogram=list(histogram),
        partial=is_partial,
        per_step_accepted=list(per_step_accepted) if per_step_accepted else None,
        per_step_drafted=list(per_step_drafted) if per_step_drafted else None,
    )
