"""``python -m worker fit`` and ``python -m worker plan``: sizing and cost planning.

``fit``: will a model fit a GPU at a context length and concurrency, what is the largest batch
or context that fits, and how fast can decode be (bandwidth, not FLOPs, bounds it).

``plan``: serverless versus a pod for a day's traffic shape, from the user's own prices
(inputs, never built-in facts; the defaults are marked as examples).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from worker.sizing import GPUS, ModelShape, decode_roofline_tokens_per_s, kv_bytes_per_token, weight_bytes

__all__ = ["PRESETS", "CostPlan", "FitReport", "fit", "main_fit", "main_plan", "plan_costs"]

GIB = 2**30

PRESETS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    },
    "llama-3.2-1b": {  # same vocabulary as the Llama-3 targets: a draft model for them
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    },
    "llama-3-70b": {
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    },
    "llama-2-7b": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
    },
    "mistral-7b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32768,
    },
    "qwen2.5-7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
    },
    "qwen2.5-32b": {
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "num_hidden_layers": 64,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "vocab_size": 152064,
    },
}

# Memory outside weights and KV cache: CUDA context, cuBLAS/attention workspaces and CUDA graphs.
FRAMEWORK_OVERHEAD_BYTES = 1.5 * GIB


def load_shape(model: str) -> ModelShape:
    if model in PRESETS:
        return ModelShape.from_config(PRESETS[model])
    path = Path(model)
    if (path / "config.json").exists():
        return ModelShape.from_path(path)
    raise SystemExit(f"unknown model {model!r}: give a directory with config.json or a preset ({', '.join(PRESETS)})")


def activation_bytes(shape: ModelShape, *, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """Peak activations of one forward pass (bf16), plus fp32 logits for the sampled positions."""
    per_token = (4 * shape.hidden_size + 2 * shape.intermediate_size) * 2
    return max_num_batched_tokens * per_token + max_num_seqs * shape.vocab_size * 4


@dataclass(frozen=True, slots=True)
class FitReport:
    gpu: str
    num_gpus: int
    memory_budget_gib: float
    weights_gib: float
    kv_cache_per_token_kib: float
    kv_cache_per_sequence_gib: float
    kv_cache_needed_gib: float
    activations_gib: float
    overhead_gib: float
    fits: bool
    max_concurrency_at_context: int
    max_context_at_concurrency: int
    decode_bound_tok_s_single: float
    decode_bound_tok_s_batch: float
    itl_floor_ms_batch: float


def fit(
    shape: ModelShape,
    *,
    gpu: str,
    quantization: str | None,
    kv_cache_dtype: str,
    max_model_len: int,
    concurrency: int,
    gpu_memory_utilization: float = 0.9,
    num_gpus: int = 1,
    max_num_batched_tokens: int = 8192,
) -> FitReport:
    spec = GPUS[gpu]
    budget = spec["memory_gib"] * GIB * gpu_memory_utilization * num_gpus
    weights = (
        weight_bytes(shape, quantization=quantization) + shape.vocab_size * shape.hidden_size * 2
    )  # + input embeddings
    kv_token = kv_bytes_per_token(shape, kv_cache_dtype=kv_cache_dtype)
    kv_seq = kv_token * max_model_len
    activations = activation_bytes(shape, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=concurrency)
    overhead = FRAMEWORK_OVERHEAD_BYTES * num_gpus
    free_for_kv = budget - weights - activations - overhead
    bandwidth = spec["bandwidth_gbs"] * num_gpus
    # A batch of `concurrency` sequences at half the context on average reads the weights once per step.
    step_bytes = weight_bytes(shape, quantization=quantization) + concurrency * (max_model_len / 2) * kv_token
    batch_tok_s = concurrency * bandwidth * 1e9 / step_bytes
    return FitReport(
        gpu=gpu,
        num_gpus=num_gpus,
        memory_budget_gib=budget / GIB,
        weights_gib=weights / GIB,
        kv_cache_per_token_kib=kv_token / 1024,
        kv_cache_per_sequence_gib=kv_seq / GIB,
        kv_cache_needed_gib=kv_seq * concurrency / GIB,
        activations_gib=activations / GIB,
        overhead_gib=overhead / GIB,
        fits=free_for_kv >= kv_seq * concurrency,
        max_concurrency_at_context=max(0, int(free_for_kv // kv_seq)),
        max_context_at_concurrency=max(0, int(free_for_kv // (kv_token * concurrency))),
        decode_bound_tok_s_single=decode_roofline_tokens_per_s(
            shape,
            bandwidth_gbs=bandwidth,
            context_len=max_model_len // 2,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
        ),
        decode_bound_tok_s_batch=batch_tok_s,
        itl_floor_ms_batch=step_bytes / (bandwidth * 1e9) * 1000,
    )


def render_fit(report: FitReport, *, model: str, quantization: str | None, max_model_len: int, concurrency: int) -> str:
    verdict = "FITS" if report.fits else "DOES NOT FIT"
    return "\n".join(
        [
            f"{model} ({quantization or 'bf16'}) on {report.num_gpus} x {report.gpu}: {verdict} "
            f"at context {max_model_len} x {concurrency} sequences",
            f"  memory budget      {report.memory_budget_gib:8.2f} GiB",
            f"  weights            {report.weights_gib:8.2f} GiB",
            f"  activations        {report.activations_gib:8.2f} GiB (peak of one forward pass, estimated)",
            f"  runtime overhead   {report.overhead_gib:8.2f} GiB (CUDA context, workspaces, graphs; estimated)",
            f"  KV cache           {report.kv_cache_per_token_kib:8.1f} KiB/token, "
            f"{report.kv_cache_per_sequence_gib:.3f} GiB per sequence, {report.kv_cache_needed_gib:.2f} GiB needed",
            f"  largest batch at context {max_model_len}: {report.max_concurrency_at_context}",
            f"  largest context at {concurrency} sequences: {report.max_context_at_concurrency}",
            f"  decode bound, 1 stream:            {report.decode_bound_tok_s_single:10,.0f} tok/s",
            f"  decode bound, {concurrency} streams:  {report.decode_bound_tok_s_batch:10,.0f} tok/s "
            f"(inter-token latency >= {report.itl_floor_ms_batch:.2f} ms)",
            "  (bounds from memory bandwidth: each step reads every weight byte and the batch's KV cache once)",
        ]
    )


def main_fit(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker fit", description="will a model fit a GPU, and how fast")
    parser.add_argument("--model", default="llama-3-8b", help=f"directory with config.json, or one of {list(PRESETS)}")
    parser.add_argument("--quantization", default=None, help="none, awq, gptq, fp8")
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto (bf16) or fp8")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--gpu", default="H100 SXM", choices=sorted(GPUS))
    parser.add_argument("--num-gpus", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    quantization = None if args.quantization in (None, "none") else args.quantization
    report = fit(
        load_shape(args.model),
        gpu=args.gpu,
        quantization=quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        concurrency=args.concurrency,
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_gpus=args.num_gpus,
    )
    if args.json:
        print(json.dumps(asdict(report), indent=1))
    else:
        print(
            render_fit(
                report,
                model=args.model,
                quantization=quantization,
                max_model_len=args.max_model_len,
                concurrency=args.concurrency,
            )
        )
    return 0 if report.fits else 1


# ------------------------------------------------------------------------------ cost plan
@dataclass(frozen=True, slots=True)
class CostPlan:
    serverless_cost_per_day: float
    pod_cost_per_day: float
    num_pods: int
    gpu_seconds_per_day: float
    tokens_per_day: float
    serverless_cost_per_million_tokens: float
    pod_cost_per_million_tokens: float
    break_even_requests_per_hour: float | None
    cheaper: str


def serverless_cost_per_hour(
    requests: float,
    *,
    tokens_per_request: float,
    tokens_per_s: float,
    price_per_s: float,
    cold_start_s: float,
    idle_timeout_s: float,
) -> float:
    """Billed seconds in one hour, times the price: the GPU's busy time, plus for each worker the
    hour needs one cold start and one idle tail (a worker lingers ``idle_timeout_s`` after its last job).
    """
    if requests <= 0:
        return 0.0
    busy = requests * tokens_per_request / tokens_per_s
    workers = math.ceil(busy / 3600)
    return (busy + workers * (cold_start_s + idle_timeout_s)) * price_per_s


def plan_costs(
    requests_per_hour: list[float],
    *,
    tokens_per_request: float,
    tokens_per_s: float,
    serverless_price_per_s: float,
    pod_price_per_hour: float,
    cold_start_s: float = 60.0,
    idle_timeout_s: float = 5.0,
    pod_max_utilization: float = 0.8,
) -> CostPlan:
    if len(requests_per_hour) != 24:
        raise ValueError("give 24 hourly request counts")
    serverless = sum(
        serverless_cost_per_hour(
            r,
            tokens_per_request=tokens_per_request,
            tokens_per_s=tokens_per_s,
            price_per_s=serverless_price_per_s,
            cold_start_s=cold_start_s,
            idle_timeout_s=idle_timeout_s,
        )
        for r in requests_per_hour
    )
    peak_busy = max(requests_per_hour) * tokens_per_request / tokens_per_s
    num_pods = max(1, math.ceil(peak_busy / (3600 * pod_max_utilization)))
    pod = num_pods * 24 * pod_price_per_hour
    tokens = sum(requests_per_hour) * tokens_per_request
    gpu_seconds = tokens / tokens_per_s

    def daily(rate: float) -> tuple[float, float]:
        s = 24 * serverless_cost_per_hour(
            rate,
            tokens_per_request=tokens_per_request,
            tokens_per_s=tokens_per_s,
            price_per_s=serverless_price_per_s,
            cold_start_s=cold_start_s,
            idle_timeout_s=idle_timeout_s,
        )
        pods = max(1, math.ceil(rate * tokens_per_request / tokens_per_s / (3600 * pod_max_utilization)))
        return s, pods * 24 * pod_price_per_hour

    break_even = None
    high = 3600 * tokens_per_s / tokens_per_request * pod_max_utilization  # one pod's capacity, requests/hour
    low_s, low_p = daily(1e-9)
    high_s, high_p = daily(high)
    if (low_s - low_p) * (high_s - high_p) <= 0:
        lo, hi = 1e-9, high
        for _ in range(100):
            mid = (lo + hi) / 2
            s, p = daily(mid)
            if (s - p) * (low_s - low_p) > 0:
                lo = mid
            else:
                hi = mid
        break_even = (lo + hi) / 2
    per_m = 1e6 / tokens if tokens else float("nan")
    return CostPlan(
        serverless_cost_per_day=serverless,
        pod_cost_per_day=pod,
        num_pods=num_pods,
        gpu_seconds_per_day=gpu_seconds,
        tokens_per_day=tokens,
        serverless_cost_per_million_tokens=serverless * per_m,
        pod_cost_per_million_tokens=pod * per_m,
        break_even_requests_per_hour=break_even,
        cheaper="serverless" if serverless < pod else "pod",
    )


# Example prices, to be replaced with your own: they are placeholders of a plausible order of
# magnitude for one 80 GB GPU, not quotes.
EXAMPLE_SERVERLESS_PRICE_PER_S = 0.00076
EXAMPLE_POD_PRICE_PER_HOUR = 2.00


def _hours(text: str) -> list[float]:
    path = Path(text)
    if path.exists():
        text = path.read_text()
    values = [float(v) for v in text.replace("\n", ",").split(",") if v.strip()]
    return values * 24 if len(values) == 1 else values


def main_plan(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker plan", description="serverless or pod for a traffic shape")
    parser.add_argument(
        "--requests-per-hour", required=True, help="one number (flat), 24 comma-separated numbers, or a file of them"
    )
    parser.add_argument("--tokens-per-request", type=float, default=500, help="output tokens per request")
    parser.add_argument(
        "--tokens-per-s",
        type=float,
        required=True,
        help="output tokens/s one GPU sustains at your concurrency (measure: python -m worker bench)",
    )
    parser.add_argument(
        "--serverless-price-per-s",
        type=float,
        default=EXAMPLE_SERVERLESS_PRICE_PER_S,
        help=f"your price per GPU-second (example default {EXAMPLE_SERVERLESS_PRICE_PER_S})",
    )
    parser.add_argument(
        "--pod-price-per-hour",
        type=float,
        default=EXAMPLE_POD_PRICE_PER_HOUR,
        help=f"your price per pod-hour (example default {EXAMPLE_POD_PRICE_PER_HOUR})",
    )
    parser.add_argument("--cold-start-s", type=float, default=60.0)
    parser.add_argument("--idle-timeout-s", type=float, default=5.0)
    parser.add_argument("--plot", type=Path, help="write a PNG of daily cost vs load")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    hours = _hours(args.requests_per_hour)
    kwargs = {
        "tokens_per_request": args.tokens_per_request,
        "tokens_per_s": args.tokens_per_s,
        "serverless_price_per_s": args.serverless_price_per_s,
        "pod_price_per_hour": args.pod_price_per_hour,
        "cold_start_s": args.cold_start_s,
        "idle_timeout_s": args.idle_timeout_s,
    }
    result = plan_costs(hours, **kwargs)
    is_example = (
        args.serverless_price_per_s == EXAMPLE_SERVERLESS_PRICE_PER_S
        or args.pod_price_per_hour == EXAMPLE_POD_PRICE_PER_HOUR
    )
    if args.json:
        print(json.dumps(asdict(result), indent=1))
    else:
        print(
            "\n".join(
                [
                    f"traffic: {sum(hours):,.0f} requests/day, {result.tokens_per_day:,.0f} tokens/day, "
                    f"{result.gpu_seconds_per_day / 3600:,.2f} GPU-hours of work at {args.tokens_per_s:,.0f} tok/s",
                    f"serverless: ${result.serverless_cost_per_day:,.2f}/day, "
                    f"${result.serverless_cost_per_million_tokens:,.3f} per million tokens",
                    f"pod ({result.num_pods} x ${args.pod_price_per_hour}/h): ${result.pod_cost_per_day:,.2f}/day, "
                    f"${result.pod_cost_per_million_tokens:,.3f} per million tokens",
                    "break-even (flat load): "
                    + (
                        f"{result.break_even_requests_per_hour:,.0f} requests/hour"
                        if result.break_even_requests_per_hour
                        else "none within one pod's capacity"
                    ),
                    f"cheaper: {result.cheaper}",
                    *(
                        [
                            "(prices are the EXAMPLE defaults: pass your own "
                            "--serverless-price-per-s / --pod-price-per-hour)"
                        ]
                        if is_example
                        else []
                    ),
                ]
            )
        )
    if args.plot:
        _plot(args.plot, hours=hours, result=result, **kwargs)
    return 0


def _plot(path: Path, *, hours: list[float], result: CostPlan, **kwargs: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capacity = 3600 * kwargs["tokens_per_s"] / kwargs["tokens_per_request"]
    rates = [capacity * i / 200 for i in range(1, 201)]
    serverless, pod = [], []
    for rate in rates:
        plan = plan_costs([rate] * 24, **kwargs)
        serverless.append(plan.serverless_cost_per_day)
        pod.append(plan.pod_cost_per_day)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(rates, serverless, label="serverless")
    ax.plot(rates, pod, label="pod")
    if result.break_even_requests_per_hour:
        ax.axvline(result.break_even_requests_per_hour, color="grey", ls=":", label="break-even")
    ax.axvline(sum(hours) / 24, color="red", ls="--", lw=1, label="your mean load")
    ax.set_xlabel("requests per hour (flat load)")
    ax.set_ylabel("cost per day ($)")
    ax.set_title("Serverless vs pod")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
