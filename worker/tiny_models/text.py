"""The text models' build: a byte-level BPE tokenizer and a small Llama trained on the corpus, the
draft variants beside it (``noisy``, ``unrelated``, ``mismatch``) and a LoRA adapter, written
under one folder keyed by :data:`BUILD_VERSION`. Seeded: a build is the same on every run of a
machine. torch and transformers are imported inside the functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.tiny_models.corpus import CHAT_TEMPLATE, SPECIAL_TOKENS, corpus

__all__ = ["BUILD_VERSION", "GENERATION_DEFAULTS", "LORA_RANK", "NOISE_SCALE", "build_text_models", "save_served_dtype"]

# v9: GENERATION_DEFAULTS in each model's generation config (a new key, so that a cache built
# before has them, and a branch without them keeps its own build).
BUILD_VERSION = "v9"
NOISE_SCALE = 0.8
# The models' default sampling parameters, in their generation config (what vLLM reads with its
# default generation_config="auto"): greedy, because the default set-up, a CPU engine speculating
# with the noisy draft, serves greedy requests only (engine.unsupported_sampling), so a request
# that sets no temperature works there. do_sample false is how Hugging Face spells greedy.
GENERATION_DEFAULTS: dict[str, Any] = {"do_sample": False, "temperature": 0.0}


def train_tokenizer(texts: list[str], *, vocab_size: int, seed_text: str = "") -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([seed_text, *texts] if seed_text else texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Any, directory: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<unk>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def llama_config(*, vocab_size: int, bos: int, eos: list[int]) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=False,
        dtype="float32",
    )


def train(model: Any, token_ids: list[list[int]], *, num_steps: int, seq_len: int) -> float:
    import torch

    stream = [t for ids in token_ids for t in ids]
    data = torch.tensor(stream, dtype=torch.long)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    model.train()
    loss_value = float("nan")
    for step in range(num_steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (16,), generator=generator)
        batch = torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])
        out = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone())
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 20) * (1 - step / num_steps * 0.9)
        optimizer.step()
        optimizer.zero_grad()
        loss_value = float(out.loss.detach())
    model.eval()
    return loss_value


def save_served_dtype(model: Any, directory: Path) -> None:
    """Saved in bfloat16, the dtype vLLM serves them in on CPU: trained in float32, but a float32
    checkpoint makes vLLM warn once per weight as it casts (the same rounding, done here once)."""
    import copy

    import torch

    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)
    path = directory / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **GENERATION_DEFAULTS}, indent=2) + "\n")


def build_text_models(root: Path, *, num_steps: int) -> None:
    """The text models (target, noisy, unrelated, mismatch, LoRA) into ``root``, which the caller
    makes complete atomically (:func:`worker.tiny_models.cache.build_once`)."""
    import os

    import torch
    from transformers import LlamaForCausalLM

    # Training is the one heavy computation here: every core, whatever OMP_NUM_THREADS says (the
    # tests set 1 for the engines they boot, which would leave the other cores idle).
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    texts = corpus()
    tokenizer = train_tokenizer(texts, vocab_size=512)
    target_dir = root / "target"
    fast = save_tokenizer(tokenizer, target_dir)
    bos = fast.convert_tokens_to_ids("<s>")
    eos = [fast.convert_tokens_to_ids("</s>"), fast.convert_tokens_to_ids("<|end|>")]
    config = llama_config(vocab_size=len(fast), bos=bos, eos=eos)

    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    ids = [[bos, *fast.encode(t, add_special_tokens=False), eos[0]] for t in texts]
    loss = train(model, ids * 4, num_steps=num_steps, seq_len=64)
    save_served_dtype(model, target_dir)

    noisy = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    noisy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in noisy.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * NOISE_SCALE)
    save_served_dtype(noisy, root / "noisy")
    fast.save_pretrained(root / "noisy")

    torch.manual_seed(2)
    unrelated = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    save_served_dtype(unrelated, root / "unrelated")
    fast.save_pretrained(root / "unrelated")

    # Same vocabulary size, different merges: only a tokenizer comparison catches it.
    other = train_tokenizer(texts[::-1], vocab_size=len(fast), seed_text="zzzz yyyy xxxx " * 50)
    other_fast = save_tokenizer(other, root / "mismatch")
    torch.manual_seed(3)
    mismatch_config = llama_config(vocab_size=len(other_fast), bos=bos, eos=eos)
    mismatch_model = LlamaForCausalLM(mismatch_config)  # type: ignore[no-untyped-call]
    save_served_dtype(mismatch_model, root / "mismatch")

    save_lora(root / "lora", config, base=str(target_dir), seed=4)

    (root / "BUILD.json").write_text(
        json.dumps({"version": BUILD_VERSION, "train_steps": num_steps, "final_loss": loss}, indent=1)
    )


LORA_RANK = 8
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def save_lora(directory: Path, config: Any, *, base: str, seed: int) -> None:
    """A PEFT-format LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``)."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    hidden = config.hidden_size
    kv_width = config.num_key_value_heads * (hidden // config.num_attention_heads)
    widths = {"q_proj": (hidden, hidden), "k_proj": (hidden, kv_width), "v_proj": (hidden, kv_width)}
    widths["o_proj"] = (hidden, hidden)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for name, (width_in, width_out) in widths.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(LORA_RANK, width_in, generator=generator) / width_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(width_out, LORA_RANK, generator=generator) * 0.5
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK,
        "lora_dropout": 0.0,
        "target_modules": list(LORA_TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1))
