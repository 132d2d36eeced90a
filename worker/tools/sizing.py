"""Memory and bandwidth arithmetic for a decoder-only transformer (pure functions).

Decode is memory-bandwidth bound: each decode step reads every weight byte once, plus the
KV cache of every sequence in the batch. A single stream's decode rate is therefore bounded
by ``bandwidth / (weight_bytes + kv_bytes_per_token * context)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "GPUS",
    "ModelShape",
    "bytes_per_weight",
    "decode_roofline_tokens_per_s",
    "kv_bytes_per_token",
    "weight_bytes",
]

# Peak memory bandwidth in GB/s (10^9 bytes/s) and memory in GiB, from the vendors' data sheets.
GPUS: dict[str, dict[str, float]] = {
    "RTX 4090": {"bandwidth_gbs": 1008, "memory_gib": 24},
    "RTX A6000": {"bandwidth_gbs": 768, "memory_gib": 48},
    "L4": {"bandwidth_gbs": 300, "memory_gib": 24},
    "L40S": {"bandwidth_gbs": 864, "memory_gib": 48},
    "A100 40GB": {"bandwidth_gbs": 1555, "memory_gib": 40},
    "A100 80GB": {"bandwidth_gbs": 2039, "memory_gib": 80},
    "H100 PCIe": {"bandwidth_gbs": 2000, "memory_gib": 80},
    "H100 SXM": {"bandwidth_gbs": 3350, "memory_gib": 80},
    "H200": {"bandwidth_gbs": 4800, "memory_gib": 141},
}

_DTYPE_BYTES = {
    "float32": 4.0,
    "fp32": 4.0,
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "fp16": 2.0,
    "auto": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
}


@dataclass(frozen=True, slots=True)
class ModelShape:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    head_dim: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None  # the model's context (None: its config does not say)
    # An EAGLE head (a drafter over the target's hidden states): 1 for EAGLE, 3 for EAGLE-3, 0 for a
    # model. vLLM gives a head the target's input embeddings, and an fc layer that folds the
    # target's hidden states (2 or 3 of them) into one; an EAGLE-3 head's one decoder layer takes the
    # embedding and that state side by side (twice the width into its attention), and its LM head
    # covers its own draft vocabulary (``draft_vocab_size``).
    eagle: int = 0
    draft_vocab_size: int | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        architectures = " ".join(config.get("architectures") or [])
        eagle = 3 if "Eagle3" in architectures else 1 if "Eagle" in architectures else 0
        return cls(
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            vocab_size=int(config["vocab_size"]),
            head_dim=int(config.get("head_dim") or hidden // heads),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config["max_position_embeddings"])
            if config.get("max_position_embeddings")
            else None,
            eagle=eagle,
            draft_vocab_size=int(config["draft_vocab_size"]) if eagle and config.get("draft_vocab_size") else None,
        )

    @classmethod
    def from_path(cls, path: str | Path) -> ModelShape:
        return cls.from_config(json.loads((Path(path) / "config.json").read_text()))

    @property
    def num_linear_params(self) -> int:
        """Parameters of the layers' linear projections (what AWQ/GPTQ/FP8 quantize)."""
        h, d = self.hidden_size, self.head_dim
        into_attention = 2 * h if self.eagle == 3 else h
        attention = into_attention * (self.num_heads * d + 2 * self.num_kv_heads * d) + self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size  # gate, up, down (SwiGLU)
        fc = {1: 2, 3: 3}.get(self.eagle, 0) * h * h  # a head's fc folds in 2 (EAGLE) or 3 (EAGLE-3) states
        return self.num_layers * (attention + mlp) + fc

    @property
    def lm_head_vocab_size(self) -> int:
        """The rows of the LM head: an EAGLE-3 head's draft vocabulary, else the model's."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def has_input_embeddings(self) -> bool:
        """Whether the model holds an input embedding table of its own (not tied to its LM head,
        not an EAGLE head's, which vLLM shares with the target)."""
        return not (self.tie_word_embeddings or self.eagle)

    @property
    def num_embedding_params(self) -> int:
        return self.lm_head_vocab_size * self.hidden_size + (
            self.vocab_size * self.hidden_size if self.has_input_embeddings else 0
        )

    @property
    def num_norm_params(self) -> int:
        return (2 * self.num_layers + 1) * self.hidden_size

    @property
    def num_params(self) -> int:
        return self.num_linear_params + self.num_embedding_params + self.num_norm_params


# Weight formats the planners know, by the bits of a linear weight (vLLM's quantization names).
FOUR_BIT = ("awq", "awq_marlin", "gptq", "gptq_marlin", "int4", "w4a16", "compressed-tensors-w4a16")
EIGHT_BIT = ("fp8", "w8a8", "int8", "w8a16")
QUANTIZATIONS = ("none", *FOUR_BIT, *EIGHT_BIT)
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")


def bytes_per_weight(quantization: str | None, *, dtype: str = "bfloat16", group_size: int = 128) -> float:
    """Bytes per quantized linear weight, scales and zero points included (an unknown method
    counts as unquantized: the planners' own command lines accept only :data:`QUANTIZATIONS`)."""
    q = (quantization or "").lower()
    if q in FOUR_BIT:
        # 4-bit weights, an fp16 scale per group, and a 4-bit zero point per group.
        return 0.5 + (2 + 0.5) / group_size
    if q in EIGHT_BIT:
        return 1.0
    return _DTYPE_BYTES.get(dtype, 2.0)


def weight_bytes(shape: ModelShape, *, quantization: str | None = None, dtype: str = "bfloat16") -> float:
    """Bytes of weights read per decode step. Embeddings and norms stay in ``dtype``."""
    unquantized = _DTYPE_BYTES.get(dtype, 2.0)
    # Only the LM head is read per step, not the input embedding table (one row per token).
    lm_head = shape.lm_head_vocab_size * shape.hidden_size * unquantized
    return (
        shape.num_linear_params * bytes_per_weight(quantization, dtype=dtype)
        + lm_head
        + shape.num_norm_params * unquantized
    )


def kv_bytes_per_token(shape: ModelShape, *, kv_cache_dtype: str = "auto") -> float:
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * _DTYPE_BYTES.get(kv_cache_dtype, 2.0)


def decode_roofline_tokens_per_s(
    shape: ModelShape,
    *,
    bandwidth_gbs: float,
    context_len: int,
    quantization: str | None = None,
    dtype: str = "bfloat16",
    kv_cache_dtype: str = "auto",
) -> float:
    """Upper bound on single-stream decode tokens/s: bandwidth over the bytes one step reads."""
    step_bytes = weight_bytes(shape, quantization=quantization, dtype=dtype) + context_len * kv_bytes_per_token(
        shape, kv_cache_dtype=kv_cache_dtype
    )
    return bandwidth_gbs * 1e9 / step_bytes
