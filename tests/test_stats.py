import pytest

from worker.speculation.stats.acceptance import acceptance_rate, mean_acceptance_length, spec_stats_from_histogram


def test_stats_from_histogram_match_hand_computation() -> None:
    # 10 steps of k=3: 2 steps accepted 0, 3 accepted 1, 1 accepted 2, 4 accepted 3.
    stats = spec_stats_from_histogram([2, 3, 1, 4], num_draft_tokens=30, num_spec_tokens=3)
    assert stats.num_spec_steps == 10
    assert stats.num_accepted_draft_tokens == 0 * 2 + 1 * 3 + 2 * 1 + 3 * 4 == 17
    assert stats.draft_acceptance_rate == pytest.approx(17 / 30)
    assert stats.mean_acceptance_length == pytest.approx(1 + 17 / 10)
    assert stats.acceptance_histogram == [2, 3, 1, 4]
    assert stats.partial is False


def test_no_drafting_step_gives_no_figures_not_zero_percent() -> None:
    # A request that ran no verify step says so: no length and no rate, where 0% acceptance gives
    # 1.0 and 0.0 (below).
    stats = spec_stats_from_histogram([0, 0, 0], num_draft_tokens=0, num_spec_tokens=2, is_partial=True)
    assert stats.num_spec_steps == 0 and stats.acceptance_histogram == [0, 0, 0]
    assert stats.draft_acceptance_rate is None
    assert stats.mean_acceptance_length is None
    assert stats.partial


def test_zero_percent_accepted_is_told_apart_from_no_step() -> None:
    stats = spec_stats_from_histogram([4, 0, 0], num_draft_tokens=8, num_spec_tokens=2)
    assert stats.num_spec_steps == 4 and stats.num_accepted_draft_tokens == 0
    assert stats.draft_acceptance_rate == 0.0
    assert stats.mean_acceptance_length == 1.0


def test_helpers() -> None:
    assert acceptance_rate(num_accepted=3, num_drafted=4) == 0.75
    assert acceptance_rate(num_accepted=0, num_drafted=0) is None
    assert mean_acceptance_length(num_accepted=6, num_steps=3) == 3.0
    assert mean_acceptance_length(num_accepted=0, num_steps=0) is None
