"""A draft model that runs no pass on a step that drafts nothing, and catches its KV cache up when
drafting resumes (vLLM 0.34's V2 ``standalone_ar`` speculator; GPU only: it imports Triton kernels).

Why: vLLM's draft-model speculator (``StandaloneARSpeculator.propose``) runs the draft over every
request's new tokens on every step, k = 0 included, so that the draft's KV cache stays in step
with the target's. Under ``SPECULATION_CONTROL=auto`` that is the floor of a draft that does not
pay: the controller turns drafting off, and the pass still costs its share of each step
(docs/benchmarks.md, the draft model's map). Nothing in vLLM skips it for a separate draft model
(its open work makes the skip an opt-in for MTP-style heads only), hence this subclass.

How, per request (by vLLM's request-state slot):

- a step that drafts nothing (``num_speculative_tokens == 0``) runs no draft pass; each request of
  the step remembers the first position whose draft KV it may now lack (the step's first input
  position: the last pass wrote everything before it and that position too, but after a prompt
  chunk that slot holds a placeholder token), on the GPU, without a host sync; the host keeps
  which slots may be behind;
- the next step that drafts first prefills each such request's missing range ``[first missing,
  the step's first input position)`` into the draft's cache, from the token history vLLM keeps
  (``RequestState.all_token_ids``), all requests in one varlen pass (split where the range
  exceeds the engine's token budget), then runs vLLM's own pass. That pass reads one host copy of
  the ranges (a sync, at resumption only);
- prefix caching: a block written while the draft was off holds the target's KV and none of the
  draft's, and a later request may hit it. Once any step has been skipped, a new request (or one
  resumed after preemption: vLLM adds it again) that starts on a cache hit is treated as missing
  from position 0, so that the hit is prefilled into the draft before its first drafting step.
  Blocks are not tracked one by one: the draft recomputes a hit prefix it may already hold (a
  draft's prefill of the prefix, not the target's);
- chunked prefill: a prompt chunk scheduled while the draft is off is caught up like decode tokens;
- preemption: vLLM frees the request's blocks and adds it again; the new slot starts as above;
- data or decode-context parallelism (``dp_size``/``dcp_size`` > 1) keeps vLLM's pass: every rank
  must run the same collectives; so does a KV connector (it ships blocks after the pass, to a process
  that never skipped), and a draft with sliding-window or recurrent layers (a window's blocks may be
  freed and reused before the catch-up reads them; a recurrent state is not replayed from tokens);
- vLLM's own k = 0 steps (``skip_drafts``: a batch of non-final prompt chunks, requests sure to
  reach ``max_tokens``) are skipped too, and caught up the same way.

``RUNPOD_WORKER_DRAFT_SKIP_TEST`` is a test hook for the bench's controls
(``worker.tools.bench.pause_acceptance``): ``no-catch-up`` skips the pass and never catches up
(acceptance after a pause then shows what a missing catch-up costs), ``keep-pass`` runs vLLM's pass
at k = 0 as vLLM does (the same pauses, nothing skipped).

EAGLE and MTP heads keep vLLM's pass: their catch-up would need the target's hidden states for
the positions they missed, which the target does not keep (vLLM's own skip refuses them for that).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.worker.gpu.attn_utils import build_attn_metadata, build_slot_mappings_by_layer
from vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator import StandaloneARSpeculator

from worker.vllm_internals.draft_catch_up import TEST_ENV, SkipBookkeeping

__all__ = ["SkippingDraftSpeculator"]


# Typed as Any: the type checker runs against the CPU build's vLLM (0.32), whose class of this name
# has other internals; the contract checks this module's uses against 0.34's wheel.
_StandaloneARSpeculator: Any = StandaloneARSpeculator


class SkippingDraftSpeculator(SkipBookkeeping, _StandaloneARSpeculator):  # type: ignore[misc]
    """vLLM's standalone draft-model speculator without its pass at k = 0 (module docstring).
    vLLM hands ``req_states`` to a speculator whose constructor names it (``init_speculator``)."""

    def __init__(self, vllm_config: Any, device: torch.device, req_states: Any) -> None:
        super().__init__(vllm_config, device)
        test = os.environ.get(TEST_ENV, "")
        self.init_bookkeeping(
            req_states=req_states,
            device=device,
            covers_hits=bool(vllm_config.cache_config.enable_prefix_caching),
            catches_up=test != "no-catch-up",
        )
        self._token_history = req_states.all_token_ids
        # A KV connector ships blocks after the pass (without draft KV, for a process that never skipped).
        self._can_skip = (
            self.dp_size == 1 and self.dcp_size == 1 and vllm_config.kv_transfer_config is None and test != "keep-pass"
        )
        self._is_full_attention: bool | None = None  # known once vLLM has set the draft's attention up

    def _skips(self) -> bool:
        """Whether this engine skips at all: one rank, no KV connector, and a draft of full attention
        only (a sliding window's blocks may be freed and reused before a catch-up reads them, and a
        recurrent layer's state cannot be replayed from tokens)."""
        if not self._can_skip:
            return False
        if self._is_full_attention is None:
            self._is_full_attention = (
                all(
                    isinstance(group.kv_cache_spec, FullAttentionSpec)
                    for groups in self.attn_groups
                    for group in groups
                )
                and self.block_tables.cp_size == 1
            )
        return self._is_full_attention

    def _prefill_ranges(self, ranges: list[tuple[int, int, int]]) -> None:
        """One eager draft pass over ``(slot, start, end)`` ranges: writes their draft KV."""
        device = self.device
        # Shortest first: attention backends that split a batch into decodes and prefills expect
        # that order (vLLM sorts its own batches so).
        ranges = sorted(ranges, key=lambda r: r[2] - r[1])
        num_reqs = len(ranges)
        lengths = np.array([hi - lo for _, lo, hi in ranges], dtype=np.int32)
        query_start_loc_np = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(lengths, out=query_start_loc_np[1:])
        num_tokens = int(query_start_loc_np[-1])
        ends = np.array([hi for _, _, hi in ranges], dtype=np.int32)
        positions_np = np.concatenate([np.arange(lo, hi, dtype=np.int64) for _, lo, hi in ranges])
        slots_np = np.array([slot for slot, _, _ in ranges], dtype=np.int64)

        slots = torch.from_numpy(slots_np).to(device, non_blocking=True)
        positions = torch.from_numpy(positions_np).to(device, non_blocking=True)
        query_start_loc = torch.from_numpy(query_start_loc_np).to(device, non_blocking=True)
        seq_lens = torch.from_numpy(ends).to(device, non_blocking=True)
        token_slots = torch.from_numpy(np.repeat(slots_np, lengths)).to(device, non_blocking=True)
        input_ids = self._token_history.gpu[token_slots, positions].to(torch.int32)

        block_tables = self.block_tables
        tables = [table.gpu[slots] for table in block_tables.block_tables]
        slot_mappings = block_tables.compute_slot_mappings(
            slots,
            query_start_loc,
            positions,
            num_tokens,
            # vLLM's own buffer for the expanded pass, which rewrites it before that pass.
            out=self.expanded_slot_mappings,
        )
        attn_metadata = build_attn_metadata(
            attn_groups=self.attn_groups,
            num_reqs=num_reqs,
            num_tokens=num_tokens,
            query_start_loc_gpu=query_start_loc,
            query_start_loc_cpu=torch.from_numpy(query_start_loc_np),
            max_query_len=int(lengths.max()),
            seq_lens=seq_lens,
            max_seq_len=int(ends.max()),
            block_tables=tables,
            slot_mappings=slot_mappings,
            kv_cache_config=self.kv_cache_config,
            seq_lens_cpu_upper_bound=torch.from_numpy(ends),
            positions=positions,
            is_prefilling=torch.zeros(num_reqs, dtype=torch.bool),
        )
        self._run_model(
            input_ids,
            positions,
            attn_metadata,
            build_slot_mappings_by_layer(slot_mappings, self.kv_cache_config),
            None,
            CUDAGraphMode.NONE,
        )
