"""The bookkeeping of a draft model's skipped pass (:mod:`worker.vllm_internals.draft_skip` has the
why): which request-state slots lack draft KV from which position, recorded on a step that drafts
nothing, and turned into catch-up ranges, packed into passes within the engine's token budget
(:func:`pack_ranges`), before the next step that drafts. A mixin over vLLM 0.34's
V2 draft-model speculator, apart from it so that the position arithmetic is tested on the CPU
(``tests/test_draft_skip.py``, over a stand-in for that GPU-only class). Imports no vLLM module: it
reads vLLM's request states and input batch by the attributes the contract lists for
:mod:`worker.vllm_internals.draft_skip`.

The host class gives what vLLM's speculator has (``max_num_reqs``, ``max_num_tokens``,
``draft_tokens``, ``propose``, ``add_request``) and two methods of its own: ``_skips`` (whether this
engine skips at all) and ``_prefill_ranges`` (one draft pass over ``(slot, start, end)`` ranges).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["TEST_ENV", "SkipBookkeeping", "pack_ranges"]

# The seam's test hook for the bench's controls (worker.vllm_internals.draft_skip): "no-catch-up" or "keep-pass".
TEST_ENV = "RUNPOD_WORKER_DRAFT_SKIP_TEST"


def pack_ranges(ranges: list[tuple[int, int, int]], budget: int) -> list[list[tuple[int, int, int]]]:
    """``(row, start, end)`` ranges of positions packed into passes of at most ``budget`` tokens,
    in order; a range longer than what is left of a pass is split, its pieces in later passes (each
    pass attends to the KV the ones before it wrote)."""
    passes: list[list[tuple[int, int, int]]] = []
    current: list[tuple[int, int, int]] = []
    room = budget
    pending = list(ranges)
    while pending:
        row, start, end = pending.pop(0)
        take = min(end - start, room)
        current.append((row, start, start + take))
        room -= take
        if start + take < end:
            pending.insert(0, (row, start + take, end))
        if room == 0:
            passes.append(current)
            current, room = [], budget
    if current:
        passes.append(current)
    return passes


# Typed as Any for the checker: the mixin's super() is vLLM's speculator, or a test's stand-in.
_Speculator: Any = object


class SkipBookkeeping(_Speculator):  # type: ignore[misc]
    """Skip the pass at k = 0, catch up before drafting (module docstring)."""

    def init_bookkeeping(self, *, req_states: Any, device: Any, covers_hits: bool, catches_up: bool) -> None:
        """``covers_hits``: prefix caching is on (a new request's hit may lack draft KV);
        ``catches_up``: off only under the bench's negative control."""
        self._req_states = req_states
        # By request-state slot: the first position without draft KV, or -1 (the draft is in step).
        self._missing_from = torch.full((self.max_num_reqs,), -1, dtype=torch.int64, device=device)
        self._behind: set[int] = set()  # the slots that may be behind, kept on the host: no sync to ask
        self._has_skipped = False  # a step was skipped since the engine started
        self._covers_hits = covers_hits
        self._catches_up = catches_up
        self.num_skipped_steps = 0
        self.num_catch_up_tokens = 0

    def _skips(self) -> bool:
        raise NotImplementedError

    def _prefill_ranges(self, ranges: list[tuple[int, int, int]]) -> None:
        raise NotImplementedError

    def add_request(self, req_index: int) -> None:
        super().add_request(req_index)
        # vLLM sets the slot's computed tokens (a prefix-cache hit) before it calls this.
        is_hit = int(self._req_states.num_computed_tokens_np[req_index]) > 0
        if self._has_skipped and self._covers_hits and self._catches_up and is_hit:
            self._missing_from[req_index] = 0
            self._behind.add(req_index)
        else:
            self._missing_from[req_index] = -1
            self._behind.discard(req_index)

    def propose(
        self,
        input_batch: Any,
        *args: Any,
        num_speculative_tokens: int | None = None,
        dummy_run: bool = False,
        is_profile: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor:
        is_real = not dummy_run and not is_profile and self._skips()
        if is_real and num_speculative_tokens == 0:
            return self._skip(input_batch)
        if is_real and self._behind:
            self._behind.intersection_update(self._req_states.index_to_req_id)  # ended or preempted: gone
            if self._behind.intersection(input_batch.idx_mapping_np[: input_batch.num_reqs].tolist()):
                self._catch_up(input_batch)
        return super().propose(  # type: ignore[no-any-return]
            input_batch,
            *args,
            num_speculative_tokens=num_speculative_tokens,
            dummy_run=dummy_run,
            is_profile=is_profile,
            **kwargs,
        )

    def _skip(self, input_batch: Any) -> torch.Tensor:
        num_reqs = input_batch.num_reqs
        slots = input_batch.idx_mapping[:num_reqs]
        starts = _first_positions(input_batch)
        if self._catches_up:
            held = self._missing_from[slots]
            self._missing_from[slots] = torch.where(held < 0, starts, held)
            self._behind.update(input_batch.idx_mapping_np[:num_reqs].tolist())
        self._has_skipped = True
        self.num_skipped_steps += 1
        self.draft_tokens[:num_reqs].fill_(-1)
        return self.draft_tokens[:num_reqs]  # type: ignore[no-any-return]

    def _catch_up(self, input_batch: Any) -> None:
        num_reqs = input_batch.num_reqs
        slots = input_batch.idx_mapping[:num_reqs]
        missing = self._missing_from[slots]
        starts = _first_positions(input_batch)
        self._missing_from[slots] = -1
        self._behind.difference_update(input_batch.idx_mapping_np[:num_reqs].tolist())
        host = torch.cat([missing, starts.long()]).cpu()  # the one sync, at resumption
        first, start = host[:num_reqs].numpy(), host[num_reqs : 2 * num_reqs].numpy()
        ranges = [(row, int(first[row]), int(start[row])) for row in range(num_reqs) if 0 <= first[row] < start[row]]
        if not ranges:
            return
        slot_of_row = input_batch.idx_mapping_np
        for ranges_of_pass in pack_ranges(ranges, self.max_num_tokens):
            self._prefill_ranges([(int(slot_of_row[row]), lo, hi) for row, lo, hi in ranges_of_pass])
            self.num_catch_up_tokens += sum(hi - lo for _, lo, hi in ranges_of_pass)


def _first_positions(input_batch: Any) -> torch.Tensor:
    """Each request's first position in the step (on the device)."""
    return input_batch.positions[input_batch.query_start_loc[: input_batch.num_reqs].long()]  # type: ignore[no-any-return]
