import functools
import random
from pathlib import Path

import pytest

from worker.tools.costs import main_plan, plan_costs, serverless_hour
from worker.tools.fit import PRESETS, fit, main_fit
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


def tiny20(path: Path) -> Path:
    """A model directory of 20 attention heads (Llama 3.2 1B's shape otherwise)."""
    import json

    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(
        json.dumps({**PRESETS["llama-3.2-1b"], "num_attention_heads": 20, "num_key_value_heads": 4})
    )
    return path


def test_a_drafter_costs_its_weights_and_a_kv_cache_beside_the_targets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target, draft = (ModelShape.from_config(PRESETS[name]) for name in ("llama-3-8b", "llama-3.2-1b"))
    at = functools.partial(
        fit, gpu="H100 SXM", quantization=None, kv_cache_dtype="auto", max_model_len=8192, concurrency=8
    )
    alone, beside = at(target), at(target, draft=draft)
    # Llama 3.2 1B ties its embeddings: 1.24e9 parameters x 2 bytes, the table once.
    assert beside.draft_weights_gib == pytest.approx(1.236e9 * 2 / GIB, rel=0.01) and alone.draft_weights_gib == 0
    assert beside.weights_gib == alone.weights_gib
    # 16 layers x 8 KV heads x 64 x 2 (K and V) x 2 bytes = 32 KiB a token beside the target's 128.
    assert beside.kv_cache_per_token_kib == pytest.approx(128 + 32)
    assert beside.max_concurrency_at_context < alone.max_concurrency_at_context
    quantized = at(target, draft=draft, draft_quantization="fp8")
    assert quantized.draft_weights_gib < beside.draft_weights_gib
    assert main_fit(["--model", "llama-3-8b", "--draft", "llama-3.2-1b", "--concurrency", "8"]) == 0
    out = capsys.readouterr().out
    assert "with the drafter llama-3.2-1b" in out and "drafter's weights" in out and "without speculation" in out
    with pytest.raises(SystemExit) as exit_info:
        main_fit(["--model", "llama-3-8b", "--draft", "no-such-draft"])
    assert exit_info.value.code == 2 and "argument --draft: 'no-such-draft'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # a drafter with 20 heads beside a target with 32, on 8 GPUs
        main_fit(["--model", "llama-3-8b", "--draft", str(tiny20(tmp_path)), "--num-gpus", "8"])
    assert exit_info.value.code == 2 and "the drafter's 20 attention heads" in capsys.readouterr().err


def test_an_eagle3_head_counts_its_own_layers_and_shares_the_targets_embeddings() -> None:
    from worker.tools.bench.shapes import llama3_config

    target = ModelShape.from_config(PRESETS["llama-3-8b"])
    head = ModelShape.from_config(llama3_config("eagle3-llama-3-8b"))
    assert head.eagle == 3 and head.draft_vocab_size == 32000 and not head.has_input_embeddings
    h, q, kv = 4096, 32 * 128, 2 * 8 * 128
    # One decoder layer with the embedding and the target's state side by side into its attention,
    # the fc over three of the target's states, an LM head over the draft vocabulary, three norms.
    by_hand = 2 * h * (q + kv) + q * h + 3 * h * 14336 + 3 * h * h + 32000 * h + 3 * h
    assert head.num_params == by_hand
    at = functools.partial(
        fit, gpu="H100 SXM", quantization=None, kv_cache_dtype="auto", max_model_len=8192, concurrency=8
    )
    beside, alone = at(target, draft=head), at(target)
    assert beside.draft_weights_gib == pytest.approx(by_hand * 2 / GIB)  # no input table of its own
    assert beside.kv_cache_per_token_kib == pytest.approx(128 + 4)  # its one layer's K and V
    # The decode bounds are the target's alone, with a drafter or without.
    assert beside.decode_bound_tok_s_batch == alone.decode_bound_tok_s_batch


def test_serverless_hour_by_hand() -> None:
    # 20 requests/hour of 0.5 s each, idle timeout 5 s, cold start 60 s: a gap outlasts the timeout
    # with p = exp(-5/180) = 0.9726; a cycle is 180 s of waiting + p x 60 s of boot + a busy period
    # (0.5 + p/180 x 60 x 0.5) / (1 - 0.5/180) = 0.664 s: 239.02 s, so 15.06 cycles and 14.65 cold
    # starts an hour, each cycle billing E[min(gap, 5 s)] = (1 - p) x 180 = 4.93 s + p x 60 + 0.664 = 63.95 s.
    hour = serverless_hour(
        20, tokens_per_request=500, tokens_per_s=1000, price_per_s=0.001, cold_start_s=60, idle_timeout_s=5
    )
    assert hour.cold_starts == pytest.approx(14.65, abs=0.01)
    assert hour.billed_s == pytest.approx(15.0615 * 63.9514, rel=1e-4)
    assert hour.cost == pytest.approx(hour.billed_s * 0.001)
    assert (
        serverless_hour(
            0, tokens_per_request=300, tokens_per_s=1000, price_per_s=1, cold_start_s=60, idle_timeout_s=5
        ).cost
        == 0
    )


@pytest.mark.parametrize(("requests", "idle_timeout_s"), [(20, 5), (120, 5), (120, 60)])
def test_cold_starts_follow_the_arrival_rate_and_idle_timeout_as_a_simulation_does(
    requests: int, idle_timeout_s: float
) -> None:
    """The formula against a simulated worker: Poisson arrivals, one request at a time, a stop after
    ``idle_timeout_s`` without work, a 60 s boot for the request that finds it stopped."""
    rng = random.Random(7)
    service, boot, lam = 0.5, 60.0, requests / 3600
    free_at, last_done, cold, billed, t = -1e9, -1e9, 0, 0.0, 0.0
    horizon = 3600 * 400
    while t < horizon:
        t += rng.expovariate(lam)
        if t < free_at:  # busy (or booting): the request queues
            start = free_at
        elif t - last_done > idle_timeout_s:  # the worker stopped: its idle tail was billed, then a boot
            cold += 1
            billed += idle_timeout_s + boot
            start = t + boot
        else:  # idle but warm: the wait was billed
            billed += t - last_done
            start = t
        free_at = last_done = start + service
        billed += service
    hour = serverless_hour(
        requests,
        tokens_per_request=500,
        tokens_per_s=1000,
        price_per_s=1,
        cold_start_s=boot,
        idle_timeout_s=idle_timeout_s,
    )
    assert hour.cold_starts == pytest.approx(cold / 400, rel=0.05)
    assert hour.billed_s == pytest.approx(billed / 400, rel=0.05)


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
    # Break-even: the flat load at which a day of serverless costs the pod's $48.
    break_even = light.break_even_requests_per_hour
    assert break_even is not None
    assert plan_costs([break_even] * 24, **args).serverless_cost_per_day == pytest.approx(48.0, rel=1e-3)
    assert light.serverless_cold_starts_per_day > 200  # 10 requests an hour, nearly each one cold
    assert light.pod_cost_per_day == 48.0
    assert light.serverless_cost_per_million_tokens == pytest.approx(light.serverless_cost_per_day / (240 * 500) * 1e6)
    # A peak of 6000 requests/hour needs 3000 GPU-s/h > 0.8 x 3600: two pods.
    assert plan_costs([6000.0] + [0.0] * 23, **args).num_pods == 2
    with pytest.raises(ValueError):
        plan_costs([1] * 23, **args)


def test_fit_refuses_an_unknown_quantization_naming_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main_fit(["--model", "llama-3-8b", "--gpu", "RTX 4090", "--quantization", "awq4"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'awq4'" in err and "'awq'" in err and "'fp8'" in err


def test_fit_shows_what_it_assumed_and_what_would_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_fit(["--model", "llama-3-8b", "--gpu", "RTX 4090"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT with 32 sequences x 8192 tokens" in out
    assert "defaults assumed: --concurrency 32, --max-model-len 8192" in out
    shape = ModelShape.from_config(PRESETS["llama-3-8b"])
    report = fit(shape, gpu="RTX 4090", quantization=None, kv_cache_dtype="auto", max_model_len=8192, concurrency=32)
    assert f"would fit with: --concurrency {report.max_concurrency_at_context} (at context 8192)" in out
    assert main_fit(["--gpu", "RTX 4090", "--concurrency", str(report.max_concurrency_at_context)]) == 0


def test_plan_refuses_a_day_that_is_not_24_hours_and_counts_cold_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main_plan(["--requests-per-hour", "1,2", "--tokens-per-s", "100"])
    assert "24 hourly counts" in capsys.readouterr().err
    assert main_plan(["--requests-per-hour", "20", "--tokens-per-s", "1000", "--tokens-per-request", "500"]) == 0
    assert "~352 cold starts/day (60 s each, idle timeout 5 s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: must be in (0, 1], got 1.5"),
        (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization"),
        (["--max-model-len", "200000", "--concurrency", "1"], "exceeds the model's context of 8192 tokens"),
        (["--num-gpus", "3"], "3 GPUs cannot split the model's 32 attention heads"),
        (["--num-gpus", "0"], "--num-gpus: must be a positive integer"),
        (["--concurrency", "abc"], "--concurrency: must be a positive integer, got 'abc'"),
    ],
)
def test_fit_refuses_settings_vllm_would_refuse(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main_fit(["--model", "llama-3-8b", *argv])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert named in captured.err and "FITS" not in captured.out
    assert captured.err.strip().splitlines()[-1].startswith("python -m worker fit: error: ")


def test_fit_assumes_no_context_beyond_the_models(capsys: pytest.CaptureFixture[str]) -> None:
    main_fit(["--model", "llama-2-7b", "--gpu", "H200", "--concurrency", "1"])
    out = capsys.readouterr().out
    assert "--max-model-len 4096" in out and "largest context at 1 sequences: 4096" in out


def test_plan_refuses_a_day_without_requests(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main_plan(["--requests-per-hour", "0", "--tokens-per-s", "1000"])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "no requests in the day" in captured.err and "nan" not in captured.out


def test_plan_names_a_file_that_is_not_there(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "hours.csv")
    with pytest.raises(SystemExit) as exit_info:
        main_plan(["--requests-per-hour", missing, "--tokens-per-s", "100"])
    assert exit_info.value.code == 2
    assert f"no file {missing!r}" in capsys.readouterr().err


def test_fit_takes_the_names_the_worker_serves(capsys: pytest.CaptureFixture[str]) -> None:
    """An embedded model by its name, as MODEL_NAME takes it (here the tiny target, built offline)."""
    assert main_fit(["--model", "tiny:target", "--concurrency", "1"]) == 0
    assert "FITS" in capsys.readouterr().out
