"""What the engine core answers to a stop string's abort, and what the frontend makes of it.

The answer (:class:`Answer`) is the request's counts when the core let go of it (:class:`Counts`,
vLLM's ``RequestSpecDecodeMetrics`` field by field; the seam, :mod:`worker.vllm_internals`, turns them
back into vLLM's class) and its *tail*: what each of its last steps
verified, newest first. It travels as msgspec's builtins through vLLM's serialiser and is converted
back field by field on arrival, so an answer of another shape is refused, never misread.
:func:`kept_counts` takes the steps the core ran past the stop string off the counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

__all__ = ["ANSWERS_ID", "ANSWERS_KEY", "NOT_VERIFIED", "UNKNOWN", "Answer", "Counts", "SpecCounts", "kept_counts"]

# In a tail: a step that verified no drafts (it yielded one token), and one whose shape the ring
# cannot tell (a prefill chunk or a recomputation after a preemption): the frontend stops there.
NOT_VERIFIED = -1
UNKNOWN = -2
# A step's answers travel to each client as one output of their own, under a request id vLLM never
# makes (its ids end in random hex), in that output's ``kv_transfer_params`` (vLLM ignores outputs
# of requests it does not track; only the worker's frontend reads this one): request id -> the
# :class:`Answer`, as msgspec's builtins (vLLM's serialiser carries them; the frontend converts
# them back, checked field by field). One output a step, not one per request: outputs of their own
# cost a build, an encode and a decode per answer, where one output's cost was lost in the noise
# (the exact-stats path's timing: docs/benchmarks.md).
ANSWERS_ID = "\x00spec-decode-answers"
ANSWERS_KEY = "spec_decode_answers"


class SpecCounts(Protocol):
    """What the arithmetic reads of per-request counts: vLLM's ``RequestSpecDecodeMetrics``, or :class:`Counts`."""

    @property
    def num_spec_tokens(self) -> int: ...
    @property
    def histogram(self) -> list[int]: ...
    @property
    def num_draft_tokens(self) -> int: ...
    @property
    def per_step_accepted(self) -> list[int]: ...
    @property
    def per_step_drafted(self) -> list[int]: ...


class Counts(msgspec.Struct, array_like=True, frozen=True):
    """vLLM's ``RequestSpecDecodeMetrics``, field by field, for the answer's transport."""

    num_spec_tokens: int
    histogram: list[int]
    num_draft_tokens: int
    per_step_accepted: list[int]
    per_step_drafted: list[int]

    @classmethod
    def of(cls, m: SpecCounts) -> Counts:
        """A copy of vLLM's live counts, field by field by name (a field vLLM renames fails here)."""
        return msgspec.convert(m, cls, from_attributes=True)


class Answer(msgspec.Struct, array_like=True, frozen=True):
    """The core's answer to a stop string's abort: the request's counts when the core let go of it,
    its ``tail`` (newest step first: drafts verified, NOT_VERIFIED or UNKNOWN), and whether the core
    finished it itself in the tail's newest step (``is_ended``), which accepted ``final_accepted``
    drafts (None: not known)."""

    counts: Counts
    tail: list[int]
    is_ended: bool = False
    final_accepted: int | None = None

    def to_wire(self) -> Any:
        return msgspec.to_builtins(self)

    @classmethod
    def from_wire(cls, raw: Any) -> Answer:
        """Raises ``msgspec.ValidationError`` where ``raw`` is not an answer of this shape."""
        return raw if isinstance(raw, cls) else msgspec.convert(raw, cls)


def kept_counts(
    metrics: SpecCounts,
    *,
    tail: Sequence[int],
    after: Sequence[int],
    ended: bool = False,
    final_accepted: int | None = None,
) -> Counts | None:
    """The counts of the steps a request kept, or None where they cannot be told exactly.

    ``metrics``: its counts when the engine core let go of it; ``tail``: what its last steps
    verified, newest first (drafts verified, NOT_VERIFIED or UNKNOWN); ``after``: the token count
    of each of its outputs after the one with the stop string, oldest first: the steps to take off.
    A verified step yields its accepted drafts plus one token. ``ended``: the core finished the
    request itself in its newest step, whose tokens vLLM trimmed at that stop; it accepted
    ``final_accepted`` drafts.
    """
    if len(after) > len(tail):
        return None
    histogram = list(metrics.histogram)
    drafted = metrics.num_draft_tokens
    verified = 0
    for i, num_tokens in enumerate(reversed(after)):
        shape = tail[i]
        if shape == UNKNOWN:
            return None
        if shape == NOT_VERIFIED:
            if num_tokens != 1:
                return None
            continue
        accepted = num_tokens - 1
        if ended and i == 0:
            if final_accepted is None:
                return None
            accepted = final_accepted
        if not 0 <= accepted < len(histogram) or not histogram[accepted]:
            return None
        histogram[accepted] -= 1
        drafted -= shape
        verified += 1
    if drafted < 0:
        return None
    steps = len(metrics.per_step_accepted) - verified
    return Counts(
        num_spec_tokens=metrics.num_spec_tokens,
        histogram=histogram,
        num_draft_tokens=drafted,
        per_step_accepted=metrics.per_step_accepted[: max(steps, 0)],
        per_step_drafted=metrics.per_step_drafted[: max(steps, 0)],
    )
