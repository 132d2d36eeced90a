"""Synthetic checkpoints of real model shapes (config and tokenizer; dummy weights at load)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.tools.bench.timing import PROMPT
from worker.tools.fit import PRESETS

LLAMA3_SHAPES = ("llama-3-8b", "llama-3.2-1b", "llama-3-70b", "eagle3-llama-3-8b")


def llama3_config(shape: str = "llama-3-8b") -> dict[str, Any]:
    """A Llama-3 ``config.json`` for one of the planner's presets (all share one vocabulary), or
    ``eagle3-llama-3-8b``: an EAGLE-3 head for the 8B shape, as the published ones for
    Llama-3.1-8B are (:func:`eagle3_head_config`, a 32,000-token draft vocabulary)."""
    if shape == "eagle3-llama-3-8b":
        return eagle3_head_config(llama3_config("llama-3-8b"), draft_vocab_size=32000)
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
        "tie_word_embeddings": bool(PRESETS[shape].get("tie_word_embeddings", False)),
    }


def eagle3_head_config(target: dict[str, Any], *, draft_vocab_size: int) -> dict[str, Any]:
    """An EAGLE-3 head's ``config.json`` for a Llama ``target`` config: one decoder layer at the
    target's width (vLLM's ``LlamaForCausalLMEagle3``) over three of the target's hidden states,
    vLLM's default layers (2, half way, 3 from the end) or, for a target too shallow for those to
    differ, its first three. With dummy weights its draft-to-target map stays zero (vLLM's dummy
    loader fills only floating-point tensors): draft token i is target token i."""
    config = {**target, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}
    config["draft_vocab_size"] = draft_vocab_size
    num_layers = int(target["num_hidden_layers"])
    if len({2, num_layers // 2, num_layers - 3}) < 3:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    return config


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


def llama3_tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every weight of a Llama checkpoint in Hugging Face's names, with its shape."""
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (int(config["vocab_size"]), hidden)}
    for i in range(int(config["num_hidden_layers"])):
        pre = f"model.layers.{i}."
        shapes.update(
            {
                pre + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                pre + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                pre + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                pre + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                pre + "mlp.gate_proj.weight": (inter, hidden),
                pre + "mlp.up_proj.weight": (inter, hidden),
                pre + "mlp.down_proj.weight": (hidden, inter),
                pre + "input_layernorm.weight": (hidden,),
                pre + "post_attention_layernorm.weight": (hidden,),
            }
        )
    shapes["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (int(config["vocab_size"]), hidden)
    return shapes


def write_random_weights(path: Path, *, shard_bytes: int = 5 * 2**30) -> int:
    """Real-size bf16 safetensors shards of random values for the checkpoint at ``path`` (written
    by ``make_shape_model``), with Hugging Face's index file: what a download leaves on disk, for
    measuring weight loading (its time depends on bytes, not values). Values are drawn on the GPU
    when there is one; one shard is in memory at a time. Returns the bytes written."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((path / "config.json").read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shards: list[dict[str, tuple[int, ...]]] = [{}]
    size = 0
    for name, shape in llama3_tensor_shapes(config).items():
        nbytes = 2 * int(torch.Size(shape).numel())
        if size and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = shape
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, start=1):
        tensors = {
            # Norm weights are ones, as a trained model's are near; matrices small random values.
            name: torch.ones(shape, dtype=torch.bfloat16)
            if len(shape) == 1
            else (torch.randn(shape, device=device, dtype=torch.bfloat16) * 0.02).cpu()
            for name, shape in shard.items()
        }
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(path / filename), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(shard, filename))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return total
