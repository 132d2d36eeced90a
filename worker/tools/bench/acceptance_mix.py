"""Requests of several acceptance levels in one wave, for the speculation map (a bench hook).

vLLM's synthetic rejection sampler holds every request to the same per-position rates (its Triton
kernel reads ``synthetic_conditional_rates`` by position only), so a map made with it alone gives
every request the same acceptance, where per-request choices can only tie. No setting of vLLM's
makes rates per request; this hook does, through what vLLM's V2 verification already honours: a
draft marked invalid is rejected (the seam's probe,
:func:`worker.vllm_internals.probes.reject_drafts_at`: vLLM 0.32's sampler takes the mask as
``invalid_drafts``, 0.34's kernel reads it as draft ids of -1). With the synthetic rates at full
acceptance (``LENGTH = K + 1`` in a map configuration), each draft of a request in a class of rate
``c`` is marked invalid with probability ``1 - c``, independently per position: the class accepts
each position, given the one before it, with probability ``c``. Invalid drafts are verified like the
others, as a real draft that misses is, so the cost of a step does not change.

A request's class travels in its request id (``mix{class}-...``; vLLM's frontend appends its own
suffix). The hook is installed in the map's process before the engines boot (so vLLM is imported
before the first engine's boot, as it is before every later one's), and their engine cores, forked
from it (the serverless start method), inherit it. The map refuses what the hook cannot serve
(``check_mix`` in :mod:`.spec_map_config`): a synthetic length short of full acceptance, whose
rates would multiply with the classes'; a spawned engine core. Under vLLM's adaptive verification
the rows move (its own comment in ``_verify_in_chunks``): the hook passes such a step through
unchanged.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MIX_ENV", "install", "logit_rates", "mix_class", "mix_request_id", "parse_mix"]

# The process environment's name for the classes' rates (``1.0,0.6,0.0``).
MIX_ENV = "SPEC_MAP_ACCEPTANCE_MIX"
_PREFIX = "mix"


def parse_mix(text: str) -> list[float]:
    """The classes' per-position acceptance rates, from ``1.0,0.6,0.0`` (raises ValueError)."""
    problem = f"{MIX_ENV}={text!r}: give rates between 0 and 1, comma-separated (1.0,0.6,0.0)"
    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(problem) from None
    if not rates or any(not 0.0 <= rate <= 1.0 for rate in rates):
        raise ValueError(problem)
    return rates


def mix_request_id(index: int, num_classes: int) -> str:
    """The request id of a wave's request ``index``: class ``index % num_classes``."""
    return f"{_PREFIX}{index % num_classes}-{uuid.uuid4().hex}"


@functools.lru_cache(maxsize=8192)
def mix_class(request_id: str) -> int | None:
    """The class a request id carries, or None (cached: the hook asks for each request every step)."""
    if not request_id.startswith(_PREFIX):
        return None
    head = request_id[len(_PREFIX) :].partition("-")[0]
    return int(head) if head.isascii() and head.isdigit() else None


def logit_rates(req_ids: Sequence[str], cu_num_logits: Sequence[int], rates: Sequence[float], num_logits: int) -> Any:
    """Per verified logit (the batch's requests in order, ``cu_num_logits`` their bounds), the
    acceptance rate of its request's class; 1.0 for a request without one and past the bounds."""
    table = [*rates, 1.0]  # the last entry: no class
    none = len(rates)
    per_request = np.array([table[c if c is not None and c < none else none] for c in map(mix_class, req_ids)])
    counts = np.diff(np.asarray(cu_num_logits[: len(req_ids) + 1]))
    out = np.ones(num_logits, dtype=np.float32)
    if len(per_request):
        spread = np.repeat(per_request.astype(np.float32), counts)
        out[: len(spread)] = spread[:num_logits]
    return out


def install(rates: Sequence[float]) -> bool:
    """Has vLLM's V2 verification in this process reject each class's drafts at ``1 - rate`` (the
    seam's :func:`~worker.vllm_internals.probes.reject_drafts_at`, once); False where an earlier
    call already did."""
    from worker.vllm_internals.probes import reject_drafts_at

    def rates_for(req_ids: Sequence[str], cu_num_logits: Sequence[int], num_logits: int) -> Any:
        return logit_rates(req_ids, cu_num_logits, rates, num_logits)

    return reject_drafts_at(rates_for)
