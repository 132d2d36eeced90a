"""Synthetic checkpoints of real model shapes (config and tokenizer; dummy weights at load)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.tools.bench.timing import PROMPT
from worker.tools.fit import PRESETS

LLAMA3_SHAPES = ("llama-3-8b", "llama-3.2-1b", "llama-3-70b")


def llama3_config(shape: str = "llama-3-8b") -> dict[str, Any]:
    """A Llama-3 ``config.json`` for one of the planner's presets (all share one vocabulary)."""
    return {
        **PRESETS[shape],
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "tie_word_embeddings": shape == "llama-3.2-1b",
    }


def make_shape_model(path: Path, *, awq: bool = False, shape: str = "llama-3-8b") -> None:
    """A Llama-3-shaped checkpoint without weights (serve with LOAD_FORMAT=dummy) and a word-level
    tokenizer covering its whole vocabulary, so that text goes in and out as with a real model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    config = llama3_config(shape)
    if awq:
        config["quantization_config"] = {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 128,
            "zero_point": True,
            "version": "gemm",
        }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    words = PROMPT.lower().split()
    vocab = {word: i for i, word in enumerate(words)}
    vocab.update({f"w{i}": i for i in range(len(words), int(config["vocab_size"]))})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w10"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, unk_token="w10", bos_token="w128000", eos_token="w128001"
    )
    fast.save_pretrained(path)
