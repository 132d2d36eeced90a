"""The speculation map's acceptance mixture (worker/tools/bench/acceptance_mix.py): classes carried by
request ids, and vLLM's V2 verification told which drafts to reject. The V2 GPU runner does not run
on a CPU, so its sampler is stood in for by a recording fake; the patch itself is checked on vLLM's
own class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from worker.tools.bench.acceptance_mix import install, logit_rates, mix_class, mix_request_id, mixed_call, parse_mix


def test_the_rates_are_read_with_a_sentence_for_bad_ones() -> None:
    assert parse_mix("1.0, 0.6,0") == [1.0, 0.6, 0.0]
    for bad in ("", "high,low", "1.5,0.2", "-0.1", "1.0,,0.5"):
        with pytest.raises(ValueError, match="between 0 and 1, comma-separated"):
            parse_mix(bad)


def test_a_request_id_carries_its_class_through_vllms_suffix() -> None:
    ids = [mix_request_id(i, 3) for i in range(6)]
    assert [mix_class(rid) for rid in ids] == [0, 1, 2, 0, 1, 2]
    assert mix_class(ids[2] + "-1a2b3c4d") == 2  # vLLM's engine core id: the external id and a suffix
    assert mix_class("req-7") is None and mix_class("mixer-1") is None and mix_class("mix\u00b2-1") is None


def test_each_logit_gets_its_requests_rate() -> None:
    req_ids = ["mix0-a-x", "plain-b", "mix2-c-y"]
    rates = logit_rates(req_ids, [0, 3, 6, 9], [1.0, 0.5, 0.0], num_logits=10)
    assert rates.tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


@dataclass
class FakeInputBatch:
    """The two fields of vLLM's V2 ``InputBatch`` the hook reads."""

    req_ids: list[str]
    cu_num_logits_np: list[int]


def test_drafts_are_rejected_at_each_class_rate() -> None:
    seen: dict[str, Any] = {}

    def fake_original_call(self: Any, logits: Any, input_batch: Any, draft_logits: Any, invalid: Any) -> str:
        seen["invalid"] = invalid
        return "verified"

    per_request = 4000
    batch = FakeInputBatch(["mix0-a", "mix1-b", "mix2-c"], [0, per_request, 2 * per_request, 3 * per_request])
    logits = torch.zeros(3 * per_request, 2)
    given = torch.zeros(3 * per_request, dtype=torch.bool)
    given[0] = True  # vLLM's own invalid drafts stay invalid
    call = mixed_call(fake_original_call, [1.0, 0.5, 0.0])
    assert call(None, logits, batch, None, given) == "verified"
    invalid = seen["invalid"].reshape(3, per_request)
    assert invalid[0, 0] and invalid[0, 1:].sum() == 0
    assert 0.45 < invalid[1].float().mean() < 0.55
    assert invalid[2].all()
    # A batch without classes passes vLLM's mask through untouched, and so does a sampler under
    # vLLM's adaptive verification (its rows move).
    call(None, logits, FakeInputBatch(["a", "b", "c"], batch.cu_num_logits_np), None, None)
    assert seen["invalid"] is None
    call(FakeAdaptiveSampler(), logits, batch, None, given)
    assert seen["invalid"] is given


class FakeAdaptiveSampler:
    """The one attribute of vLLM's V2 sampler the hook reads: adaptive verification on."""

    enable_adaptive_verification = True


def test_the_hook_wraps_vllms_v2_sampler_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    original = RejectionSampler.__call__
    # The wrapper passes these on by position, as vLLM's model runner calls it.
    assert list(inspect.signature(original).parameters) == [
        "self",
        "logits",
        "input_batch",
        "draft_logits",
        "invalid_drafts",
    ]
    monkeypatch.setattr(RejectionSampler, "__call__", original)  # restored after the test
    assert install([1.0, 0.0]) is True
    assert RejectionSampler.__call__ is not original
    assert install([0.5]) is False
