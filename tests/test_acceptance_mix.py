"""The speculation map's acceptance mixture (worker/tools/bench/acceptance_mix.py): classes carried by
request ids, each logit's rate, and the install of the seam's probe that has vLLM's V2 verification
reject drafts at those rates (the probe's variants: tests/test_probes.py)."""

from __future__ import annotations

import pytest

from worker.tools.bench.acceptance_mix import install, logit_rates, mix_class, mix_request_id, parse_mix


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


def test_the_install_wraps_vllms_v2_sampler_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    original = RejectionSampler.__call__
    monkeypatch.setattr(RejectionSampler, "__call__", original)  # restored after the test
    assert install([1.0, 0.0]) is True
    assert RejectionSampler.__call__ is not original
    assert install([0.5]) is False
