import pytest

from worker.tools.costs import plan_costs, serverless_cost_per_hour
from worker.tools.fit import PRESETS, fit
from worker.tools.sizing import ModelShape

GIB = 2**30


def test_fit_llama3_8b_bf16_on_a100_80gb_by_hand() -> None:
    shape = ModelShape.from_config(PRESETS["llama-3-8b"])
    report = fit(shape, gpu="A100 80GB", quantization=None, kv_cache_dtype="auto", max_model_len=8192, concurrency=16)
    # 8.03e9 params x 2 bytes = 16.06 GB = 14.96 GiB.
    assert report.weights_gib == pytest.approx(8.03e9 * 2 / GIB, rel=0.01)
    # 128 KiB per token x 8192 tokens = 1 GiB per sequence.
    assert report.kv_cache_per_sequence_gib == pytest.approx(1.0)
    assert report.kv_cache_needed_gib == pytest.approx(16.0)
    assert report.memory_budget_gib == pytest.approx(80 * 0.9)
    assert report.fits
    free = report.memory_budget_gib - report.weights_gib - report.activations_gib - report.overhead_gib
    assert report.max_concurrency_at_context == int(free // 1.0)
    # 2.039 TB/s over ~15.5 GB per step (weights read + KV at half context): ~130 tok/s single stream.
    assert 120 < report.decode_bound_tok_s_single < 140


def test_70b_bf16_does_not_fit_one_gpu_but_awq_does() -> None:
    shape = ModelShape.from_config(PRESETS["llama-3-70b"])
    bf16 = fit(shape, gpu="H100 SXM", quantization=None, kv_cache_dtype="auto", max_model_len=4096, concurrency=8)
    awq = fit(shape, gpu="H100 SXM", quantization="awq", kv_cache_dtype="fp8", max_model_len=4096, concurrency=8)
    assert not bf16.fits and bf16.weights_gib > 130
    assert awq.fits and awq.weights_gib < 40
    # ~37 GiB of 4-bit weights leave ~30 GiB for an fp8 KV cache of 0.625 GiB per 4096-token sequence.
    assert 40 <= awq.max_concurrency_at_context <= 60


def test_serverless_hour_by_hand() -> None:
    # 100 requests x 300 tokens at 1000 tok/s = 30 s busy, + 60 s cold start + 5 s idle = 95 s.
    cost = serverless_cost_per_hour(
        100, tokens_per_request=300, tokens_per_s=1000, price_per_s=0.001, cold_start_s=60, idle_timeout_s=5
    )
    assert cost == pytest.approx(0.095)
    assert (
        serverless_cost_per_hour(
            0, tokens_per_request=300, tokens_per_s=1000, price_per_s=0.001, cold_start_s=60, idle_timeout_s=5
        )
        == 0
    )


def test_plan_break_even_and_choice() -> None:
    args = {
        "tokens_per_request": 500,
        "tokens_per_s": 1000,
        "serverless_price_per_s": 0.001,
        "pod_price_per_hour": 2.0,
        "cold_start_s": 60,
        "idle_timeout_s": 5,
    }
    light = plan_costs([10] * 24, **args)
    heavy = plan_costs([5000] * 24, **args)
    assert light.cheaper == "serverless" and heavy.cheaper == "pod"
    assert light.num_pods == 1
    # Break-even: 24 x (r x 0.5 s + 65 s) x $0.001 = $48  =>  r = 3870 requests/hour.
    assert light.break_even_requests_per_hour == pytest.approx((2.0 / 0.001 - 65) / 0.5, rel=1e-3)
    assert light.pod_cost_per_day == 48.0
    assert light.serverless_cost_per_million_tokens == pytest.approx(light.serverless_cost_per_day / (240 * 500) * 1e6)
    # A peak of 6000 requests/hour needs 3000 GPU-s/h > 0.8 x 3600: two pods.
    assert plan_costs([6000.0] + [0.0] * 23, **args).num_pods == 2
    with pytest.raises(ValueError):
        plan_costs([1] * 23, **args)
