"""``python -m worker fit``: will a model fit a GPU at a context length and concurrency, what is
the largest batch or context that fits, and how fast can decode be (bandwidth, not FLOPs, bounds it).

With ``--draft`` it counts a speculative drafter beside the target as vLLM holds it: its weights
resident, and its attention layers' KV cache in the same pool as the target's, a token of context
costing both (vLLM gives the drafter's layers KV cache specs of their own in one cache config).
An EAGLE head's shape is read from its config (:class:`~worker.tools.sizing.ModelShape`): its
decoder layer, fc layer and LM head (an EAGLE-3 head's over its draft vocabulary), the target's
input embeddings not counted again. An EAGLE (1) head that takes the target's LM head too is
counted with one of its own."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from worker.tools.sizing import (
    GPUS,
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    ModelShape,
    decode_roofline_tokens_per_s,
    kv_bytes_per_token,
    weight_bytes,
)

GIB = 2**30


PRESETS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
    },
    "llama-3.2-1b": {  # same vocabulary as the Llama-3 targets: a draft model for them
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,  # as the released model: no separate lm_head
    },
    "llama-3-70b": {
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
    },
    "llama-2-7b": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
    },
    "mistral-7b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32768,
        "max_position_embeddings": 32768,
    },
    "qwen2.5-7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
    },
    "qwen2.5-32b": {
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "num_hidden_layers": 64,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
    },
}


DEFAULT_CONTEXT = 8192
DEFAULT_CONCURRENCY = 32

# Memory outside weights and KV cache: CUDA context, cuBLAS/attention workspaces and CUDA graphs.
FRAMEWORK_OVERHEAD_BYTES = 1.5 * GIB


def load_shape(model: str) -> ModelShape:
    shape = _shape(model)
    if shape is None:
        raise SystemExit(
            f"unknown model {model!r}: give a directory with config.json or a preset ({', '.join(PRESETS)})"
        )
    return shape


def _shape(model: str) -> ModelShape | None:
    """A preset's shape, or the config.json's of a directory or of what ``model`` names for the
    boot (:func:`_resolved`); None: none of them."""
    if model in PRESETS:
        return ModelShape.from_config(PRESETS[model])
    path = Path(model)
    if not (path / "config.json").exists():
        path = _resolved(model)
    return ModelShape.from_path(path) if (path / "config.json").exists() else None


def _resolved(model: str) -> Path:
    """What the worker's boot would load for ``model``: an embedded model's checkpoint (the default
    model converted, a tiny one built, here and offline) or a hub id's snapshot in RunPod's model
    cache; anything else as named."""
    from worker.boot.models import looks_local, resolver
    from worker.config import load_settings
    from worker.errors import ConfigError

    if looks_local(model):
        return Path(model)
    try:
        return Path(resolver(load_settings({"MODEL_NAME": model}))(model, None))
    except (ConfigError, ValueError):  # a name no setting takes, or the default's package missing
        return Path(model)


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
    draft_weights_gib: float = 0.0  # a drafter's (``--draft``); its KV cache is in the per-token figure


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
    draft: ModelShape | None = None,
    draft_quantization: str | None = None,
) -> FitReport:
    """The verdict and bounds for ``shape`` (and ``draft``, a drafter beside it: module docstring).
    The decode bounds are the target's without speculation."""
    spec = GPUS[gpu]
    budget = spec["memory_gib"] * GIB * gpu_memory_utilization * num_gpus
    weights = _resident_weight_bytes(shape, quantization)
    draft_weights = 0.0 if draft is None else _resident_weight_bytes(draft, draft_quantization)
    target_kv_token = kv_bytes_per_token(shape, kv_cache_dtype=kv_cache_dtype)
    kv_token = target_kv_token
    if draft is not None:
        kv_token += kv_bytes_per_token(draft, kv_cache_dtype=kv_cache_dtype)
    kv_seq = kv_token * max_model_len
    # The drafter's forward passes run after the target's, so the peak is the larger of the two.
    activations = max(
        activation_bytes(model, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=concurrency)
        for model in (shape, draft)
        if model is not None
    )
    overhead = FRAMEWORK_OVERHEAD_BYTES * num_gpus
    free_for_kv = budget - weights - draft_weights - activations - overhead
    bandwidth = spec["bandwidth_gbs"] * num_gpus
    # A batch of `concurrency` sequences at half the context on average reads the weights once per step.
    # The target's step alone, as the single stream's bound below (speculation's depends on acceptance).
    step_bytes = weight_bytes(shape, quantization=quantization) + concurrency * (max_model_len / 2) * target_kv_token
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
        max_context_at_concurrency=max(
            0, min(int(free_for_kv // (kv_token * concurrency)), shape.max_position_embeddings or sys.maxsize)
        ),
        decode_bound_tok_s_single=decode_roofline_tokens_per_s(
            shape,
            bandwidth_gbs=bandwidth,
            context_len=max_model_len // 2,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
        ),
        decode_bound_tok_s_batch=batch_tok_s,
        itl_floor_ms_batch=step_bytes / (bandwidth * 1e9) * 1000,
        draft_weights_gib=draft_weights / GIB,
    )


def _resident_weight_bytes(shape: ModelShape, quantization: str | None) -> float:
    """What the weights hold in GPU memory: those a decode step reads, and the input embeddings
    (the LM head's own table where the model ties them)."""
    embeddings = shape.vocab_size * shape.hidden_size * 2 if shape.has_input_embeddings else 0
    return weight_bytes(shape, quantization=quantization) + embeddings


def render_fit(
    report: FitReport,
    *,
    model: str,
    quantization: str | None,
    max_model_len: int,
    concurrency: int,
    assumed: list[str] | None = None,
    draft: str | None = None,
) -> str:
    """The report as text; ``assumed``: the flags left at their defaults, named so the verdict
    shows what it assumed; ``draft``: the drafter's name, where one is counted."""
    verdict = "FITS" if report.fits else "DOES NOT FIT"
    beside = f" with the drafter {draft}" if draft else ""
    lines = [
        f"{model} ({quantization or 'bf16'}){beside} on {report.num_gpus} x {report.gpu}: {verdict} "
        f"with {concurrency} sequences x {max_model_len} tokens of context",
    ]
    if assumed:
        lines.append(f"  (defaults assumed: {', '.join(assumed)})")
    lines += [
        f"  memory budget      {report.memory_budget_gib:8.2f} GiB",
        f"  weights            {report.weights_gib:8.2f} GiB",
        *(
            [f"  drafter's weights  {report.draft_weights_gib:8.2f} GiB (its KV cache is in the figures below)"]
            if draft
            else []
        ),
        f"  activations        {report.activations_gib:8.2f} GiB (peak of one forward pass, estimated)",
        f"  runtime overhead   {report.overhead_gib:8.2f} GiB (CUDA context, workspaces, graphs; estimated)",
        f"  KV cache           {report.kv_cache_per_token_kib:8.1f} KiB/token, "
        f"{report.kv_cache_per_sequence_gib:.3f} GiB per sequence, {report.kv_cache_needed_gib:.2f} GiB needed",
        f"  largest batch at context {max_model_len}: {report.max_concurrency_at_context}",
        f"  largest context at {concurrency} sequences: {report.max_context_at_concurrency}",
    ]
    if not report.fits:
        if report.max_concurrency_at_context or report.max_context_at_concurrency >= 16:
            options = []
            if report.max_concurrency_at_context:
                options.append(f"--concurrency {report.max_concurrency_at_context} (at context {max_model_len})")
            if report.max_context_at_concurrency >= 16:
                options.append(f"--max-model-len {report.max_context_at_concurrency} (at {concurrency} sequences)")
            lines.append("  would fit with: " + ", or ".join(options))
        else:
            lines.append("  the weights leave no room for a KV cache: quantize (--quantization awq) or add GPUs")
    lines += [
        f"  decode bound, 1 stream:            {report.decode_bound_tok_s_single:10,.0f} tok/s",
        f"  decode bound, {concurrency} streams:  {report.decode_bound_tok_s_batch:10,.0f} tok/s "
        f"(inter-token latency >= {report.itl_floor_ms_batch:.2f} ms)",
        "  (bounds from memory bandwidth: each step reads every weight byte and the batch's KV cache once"
        + ("; the target's, without speculation)" if draft else ")"),
    ]
    return "\n".join(lines)


def main_fit(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker fit", description="will a model fit a GPU, and how fast")
    parser.add_argument("--model", default="llama-3-8b", help=f"directory with config.json, or one of {list(PRESETS)}")
    parser.add_argument("--quantization", default="none", choices=QUANTIZATIONS, help="weight format (none: bf16)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES, help="auto: the model's (bf16)")
    parser.add_argument(
        "--max-model-len", type=_positive, default=None, help=f"context per sequence ({DEFAULT_CONTEXT})"
    )
    parser.add_argument(
        "--concurrency", type=_positive, default=None, help=f"sequences at once ({DEFAULT_CONCURRENCY})"
    )
    parser.add_argument(
        "--draft", default=None, help="a drafter beside the target (SPECULATIVE_MODEL): as --model takes it"
    )
    parser.add_argument(
        "--draft-quantization", default="none", choices=QUANTIZATIONS, help="the drafter's weight format"
    )
    parser.add_argument("--gpu", default="H100 SXM", choices=sorted(GPUS))
    parser.add_argument("--num-gpus", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    shape = _shape(args.model)
    if shape is None:
        parser.error(
            f"argument --model: {args.model!r} is neither a preset ({', '.join(PRESETS)}), a model directory, "
            "an embedded model nor a hub id in RunPod's model cache"
        )
    draft = None if args.draft is None else _shape(args.draft)
    if args.draft is not None and draft is None:
        parser.error(
            f"argument --draft: {args.draft!r} is neither a preset, a model directory, an embedded model nor a hub id "
            "in RunPod's model cache"
        )
    problem = impossible_setting(
        shape,
        max_model_len=args.max_model_len,
        num_gpus=args.num_gpus,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    if problem is None and draft is not None:  # vLLM checks the drafter's context and heads too
        problem = impossible_setting(
            draft,
            max_model_len=args.max_model_len,
            num_gpus=args.num_gpus,
            gpu_memory_utilization=args.gpu_memory_utilization,
            whose="the drafter's",
        )
    if problem is not None:
        parser.error(problem)
    assumed = []
    if args.concurrency is None:
        args.concurrency = DEFAULT_CONCURRENCY
        assumed.append(f"--concurrency {DEFAULT_CONCURRENCY}")
    if args.max_model_len is None:
        args.max_model_len = min(DEFAULT_CONTEXT, shape.max_position_embeddings or DEFAULT_CONTEXT)
        assumed.append(f"--max-model-len {args.max_model_len}")
    quantization = None if args.quantization == "none" else args.quantization
    report = fit(
        shape,
        gpu=args.gpu,
        quantization=quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        concurrency=args.concurrency,
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_gpus=args.num_gpus,
        draft=draft,
        draft_quantization=None if args.draft_quantization == "none" else args.draft_quantization,
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
                assumed=assumed,
                draft=args.draft,
            )
        )
    return 0 if report.fits else 1


def impossible_setting(
    shape: ModelShape,
    *,
    max_model_len: int | None,
    num_gpus: int,
    gpu_memory_utilization: float,
    whose: str = "the model's",
) -> str | None:
    """Why vLLM would refuse these settings before any memory arithmetic, as its own checks do:
    a utilization outside (0, 1] (``CacheConfig``), a context beyond the model's
    (``max_position_embeddings``, without ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``), attention heads that
    the tensor-parallel size does not divide (``ModelConfig.verify_with_parallel_config``). ``whose``
    names ``shape`` in the sentence (a drafter's checks are the same)."""
    if not 0 < gpu_memory_utilization <= 1:
        return f"argument --gpu-memory-utilization: must be in (0, 1], got {gpu_memory_utilization:g}"
    if max_model_len is not None and shape.max_position_embeddings and max_model_len > shape.max_position_embeddings:
        return (
            f"argument --max-model-len: {max_model_len} exceeds {whose} context of "
            f"{shape.max_position_embeddings} tokens (max_position_embeddings)"
        )
    if num_gpus < 1:
        return f"argument --num-gpus: must be a positive integer, got {num_gpus}"
    if shape.num_heads % num_gpus:
        return (
            f"argument --num-gpus: {num_gpus} GPUs cannot split {whose} {shape.num_heads} attention heads "
            f"(tensor parallelism needs a divisor of {shape.num_heads})"
        )
    return None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value
