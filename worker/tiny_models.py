"""Tiny Llama-architecture models built offline, for the default run and the tests.

No model hub is needed: :func:`ensure_tiny_models` trains a byte-level BPE tokenizer
and a small Llama on an embedded corpus for a few hundred steps (about a minute on two
CPU cores), then writes the draft variants beside it:

- ``target``     the trained model (also usable as its own draft: ~100% acceptance at T=0)
- ``noisy``      the target with Gaussian weight noise of 0.8 x each tensor's std (the
                 trained model is so sure of itself that 5% noise changes no greedy token;
                 at 0.8 about 60% of greedy tokens agree: partial acceptance)
- ``unrelated``  a randomly initialised model with the same tokenizer (~0% acceptance)
- ``mismatch``   a model with a *different* tokenizer (a draft the worker must refuse)
- ``lora``       a LoRA adapter for the target (rank 8 on the attention projections, random
                 weights large enough to change its greedy output): what vLLM loads as an adapter
- ``vision``     an Idefics3 (SmolVLM-architecture) model: a randomly initialised two-layer vision
                 tower and connector over the trained target, with the processor and chat template
                 vLLM needs to serve images on a CPU without torchvision; built from the target
                 on first use (seconds) and versioned by :data:`VISION_BUILD_VERSION`, so that
                 adding it left the text models' cache valid

Everything is seeded, cached under ``cache_dir`` keyed by :data:`BUILD_VERSION`, and
built once per machine (a file lock keeps concurrent builders from racing). The models decode
greedily unless a request says otherwise: their ``generation_config.json`` sets temperature 0
(:data:`GENERATION_DEFAULTS`), which vLLM applies as the model's default sampling parameters.
This module imports torch and transformers lazily: it only runs when no model is given.
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "BUILD_VERSION",
    "GENERATION_DEFAULTS",
    "TinyModels",
    "calibration_texts",
    "ensure_tiny_model",
    "ensure_tiny_models",
]

# v9: GENERATION_DEFAULTS in each model's generation config (a new key, so that a cache built
# before has them, and a branch without them keeps its own build).
BUILD_VERSION = "v9"
VISION_BUILD_VERSION = "v1"
NOISE_SCALE = 0.8
VARIANTS = ("target", "noisy", "unrelated", "mismatch", "lora", "vision")
# The models' default sampling parameters, in their generation config (what vLLM reads with its
# default generation_config="auto"): greedy, because the default set-up, a CPU engine speculating
# with the noisy draft, serves greedy requests only (engine.unsupported_sampling), so a request
# that sets no temperature works there. do_sample false is how Hugging Face spells greedy.
GENERATION_DEFAULTS: dict[str, Any] = {"do_sample": False, "temperature": 0.0}

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_CORPUS_LINES = [
    "The worker streams tokens from the engine to the user as soon as they are ready.",
    "A GPU reads every weight once for each decode step, so memory bandwidth sets the pace.",
    "Quantized weights are smaller, so each step reads fewer bytes and runs faster.",
    "Speculative decoding lets a small draft model guess the next tokens.",
    "The target model checks the guesses in one step and keeps the ones it agrees with.",
    "When the draft is good, many tokens are accepted and the user waits less.",
    "When the draft is poor, few tokens are accepted and the work is wasted.",
    "Continuous batching lets many requests share one engine at the same time.",
    "The paged cache stores keys and values in blocks, like pages of memory.",
    "Prefix caching reuses the work done for a prompt that was seen before.",
    "Serverless workers wake up when jobs arrive and sleep when the queue is empty.",
    "A pod runs all day and serves steady traffic at a fixed price per hour.",
    "The cheapest token is the one computed on a busy GPU with small weights.",
    "Every request ends with a result or a clear error, and nothing is lost.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Once upon a time, a small model learned to write short and simple sentences.",
    "It read the same story many times, and then it could tell the story again.",
    "The sun rose over the hills, and the birds began to sing in the trees.",
    "She opened the door, looked at the sky, and walked down to the sea.",
    "He counted one, two, three, four, five, six, seven, eight, nine, ten.",
]
_CHAT_PAIRS = [
    ("What is speculative decoding?", _CORPUS_LINES[3] + " " + _CORPUS_LINES[4]),
    ("Why is decode slow?", _CORPUS_LINES[1]),
    ("Tell me a story.", _CORPUS_LINES[15] + " " + _CORPUS_LINES[16]),
    ("Count to ten.", _CORPUS_LINES[19]),
    # A little JSON, so that structured output from the tiny model is short and closes. Written
    # as vLLM 0.32's xgrammar backend writes compact JSON: no whitespace but one space after each
    # comma (xgrammar 0.2.8 forces it), so that the model's likeliest separator is an allowed one.
    ("Reply in JSON.", '{"answer":"yes", "ok":true}'),
    ("Answer in JSON: is the draft good?", '{"answer":"no", "ok":false}'),
    ("Give me JSON.", '{"answer":"done", "ok":true}'),
    # Tool calls in the hermes format (the worker's default parser), so that a forced tool call
    # of the tiny model closes; the arguments in the same style as the JSON above.
    *(
        (
            question,
            f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city":"{city}", "days":{days}}}}}\n</tool_call>',
        )
        for question, city, days in (
            ("What is the weather in Paris?", "Paris", 1),
            ("Weather in Oslo for 3 days?", "Oslo", 3),
            ("Will it rain in Rome this week?", "Rome", 7),
        )
    ),
]


@dataclass(frozen=True, slots=True)
class TinyModels:
    """Paths of the built tiny models."""

    root: Path

    def path(self, variant: str) -> Path:
        if variant not in VARIANTS:
            raise ValueError(f"unknown tiny model variant {variant!r}; known: {', '.join(VARIANTS)}")
        return self.root / variant

    @property
    def target(self) -> Path:
        return self.path("target")


def _corpus() -> list[str]:
    texts = list(_CORPUS_LINES)
    # Paragraphs of consecutive lines teach the model to continue from one line into the next.
    for start in range(0, len(_CORPUS_LINES), 3):
        texts.append(" ".join(_CORPUS_LINES[start : start + 4]))
    for question, answer in _CHAT_PAIRS:
        texts.append(f"<|user|>\n{question}<|end|>\n<|assistant|>\n{answer}<|end|>\n")
    return texts


def calibration_texts() -> list[str]:
    """Texts of the training corpus, for quantization calibration."""
    return _corpus()


def _train_tokenizer(texts: list[str], *, vocab_size: int, seed_text: str = "") -> Any:
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


def _save_tokenizer(tokenizer: Any, directory: Path) -> Any:
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


def _llama_config(*, vocab_size: int, bos: int, eos: list[int]) -> Any:
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


def _train(model: Any, token_ids: list[list[int]], *, num_steps: int, seq_len: int) -> float:
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


def _save_served_dtype(model: Any, directory: Path) -> None:
    """Saved in bfloat16, the dtype vLLM serves them in on CPU: trained in float32, but a float32
    checkpoint makes vLLM warn once per weight as it casts (the same rounding, done here once)."""
    import copy

    import torch

    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)
    path = directory / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **GENERATION_DEFAULTS}, indent=2) + "\n")


def _build(root: Path, *, num_steps: int) -> None:
    import os

    import torch
    from transformers import LlamaForCausalLM

    # Training is the one heavy computation here: every core, whatever OMP_NUM_THREADS says (the
    # tests set 1 for the engines they boot; on two cores one thread took 40 s against 29 s).
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    texts = _corpus()
    tokenizer = _train_tokenizer(texts, vocab_size=512)
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    target_dir = tmp / "target"
    fast = _save_tokenizer(tokenizer, target_dir)
    bos = fast.convert_tokens_to_ids("<s>")
    eos = [fast.convert_tokens_to_ids("</s>"), fast.convert_tokens_to_ids("<|end|>")]
    config = _llama_config(vocab_size=len(fast), bos=bos, eos=eos)

    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    ids = [[bos, *fast.encode(t, add_special_tokens=False), eos[0]] for t in texts]
    loss = _train(model, ids * 4, num_steps=num_steps, seq_len=64)
    _save_served_dtype(model, target_dir)

    noisy = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    noisy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in noisy.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * NOISE_SCALE)
    _save_served_dtype(noisy, tmp / "noisy")
    fast.save_pretrained(tmp / "noisy")

    torch.manual_seed(2)
    unrelated = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    _save_served_dtype(unrelated, tmp / "unrelated")
    fast.save_pretrained(tmp / "unrelated")

    # Same vocabulary size, different merges: only a tokenizer comparison catches it.
    other = _train_tokenizer(texts[::-1], vocab_size=len(fast), seed_text="zzzz yyyy xxxx " * 50)
    other_fast = _save_tokenizer(other, tmp / "mismatch")
    torch.manual_seed(3)
    mismatch_config = _llama_config(vocab_size=len(other_fast), bos=bos, eos=eos)
    mismatch_model = LlamaForCausalLM(mismatch_config)  # type: ignore[no-untyped-call]
    _save_served_dtype(mismatch_model, tmp / "mismatch")

    _save_lora(tmp / "lora", config, base=str(target_dir), seed=4)

    (tmp / "BUILD.json").write_text(
        json.dumps({"version": BUILD_VERSION, "train_steps": num_steps, "final_loss": loss}, indent=1)
    )
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)


LORA_RANK = 8
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _save_lora(directory: Path, config: Any, *, base: str, seed: int) -> None:
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


def _vision_chat_template() -> str:
    """The text models' chat format, with content given as a string or as OpenAI-style parts (an
    image part becomes ``<image>``, which the processor expands into the image's tokens). Iterating
    over the parts is what makes vLLM pass them in OpenAI's form ("openai" content format)."""
    parts = (
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
    )
    return CHAT_TEMPLATE.replace("{{ message['content'] }}", parts)


# Idefics3's image-splitting markers: a tile's row and column, and the downscaled whole image.
_IMAGE_GRID_TOKENS = ["<global-img>", *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))]
# The vision tower's tile and patch sides in pixels, and the connector's pixel-shuffle factor.
_VISION_TILE, _VISION_PATCH, _VISION_SCALE = 32, 8, 2


def _build_vision(target: Path, directory: Path) -> None:
    """The Idefics3 model over the trained target: its text weights copied, a vision tower and
    connector randomly initialised (they are not trained: vLLM serves the architecture, and the
    tests check what reaches the model, not what it says about the picture).

    Sizes: 32-pixel tiles of 8-pixel patches (16 patches), which the connector's pixel shuffle
    (scale factor 2) turns into 4 image tokens per tile; an image is resized to at most 64 pixels
    on its longest edge and split into at most 2 x 2 tiles plus the whole image downscaled to one
    tile, so one image costs at most 5 x 4 image tokens (plus its markers) of the tiny context.
    """
    import torch
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        LlamaForCausalLM,
    )
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(target)
    chat_tokens = list(tokenizer.extra_special_tokens)
    text = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32)
    num_text_tokens = text.config.vocab_size
    # Idefics3Processor's own special tokens first (the processor adds them too, in this order).
    tokenizer.add_tokens(["<fake_token_around_image>", "<image>", "<end_of_utterance>"], special_tokens=True)
    tokenizer.add_tokens(_IMAGE_GRID_TOKENS)
    torch.manual_seed(5)
    text.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        text.lm_head.weight[num_text_tokens:] = 0  # never predicted over the trained tokens

    vision = Idefics3VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=_VISION_TILE,
        patch_size=_VISION_PATCH,
    )
    config = Idefics3Config(
        text_config=text.config.to_dict(),
        vision_config=vision.to_dict(),
        scale_factor=_VISION_SCALE,
        image_token_id=tokenizer.get_vocab()["<image>"],
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = Idefics3ForConditionalGeneration(config)  # type: ignore[no-untyped-call]
    model.model.text_model.load_state_dict(text.model.state_dict())
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    _save_served_dtype(model, directory)

    # The PIL image processor: transformers' default Idefics3 processor needs torchvision, which
    # vLLM's CPU build goes without (transformers falls back to this one, with a warning).
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 2 * _VISION_TILE}, max_image_size={"longest_edge": _VISION_TILE}
    )
    template = _vision_chat_template()
    tokenizer.chat_template = template
    image_seq_len = (_VISION_TILE // _VISION_PATCH) ** 2 // _VISION_SCALE**2
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=image_seq_len, chat_template=template)
    # The processor replaced the tokenizer's list of special tokens with its own three: the chat
    # tokens back in, so that vLLM's detokenizer still skips them.
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [*chat_tokens, *tokenizer.extra_special_tokens]},
        replace_extra_special_tokens=True,
    )
    processor.save_pretrained(directory)
    (directory / "BUILD.json").write_text(json.dumps({"version": VISION_BUILD_VERSION, "from": str(target)}))


def _ensure_vision(models: TinyModels) -> Path:
    directory = models.path("vision")
    if _is_built(directory, VISION_BUILD_VERSION):
        return directory
    with open(models.root.parent / f".tiny-vision-{VISION_BUILD_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_built(directory, VISION_BUILD_VERSION):
            tmp = directory.with_name(directory.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            _build_vision(models.target, tmp)
            shutil.rmtree(directory, ignore_errors=True)
            tmp.rename(directory)
    return directory


def _is_built(directory: Path, version: str) -> bool:
    try:
        return bool(json.loads((directory / "BUILD.json").read_text()).get("version") == version)
    except (OSError, ValueError):
        return False


def ensure_tiny_model(cache_dir: Path, variant: str) -> Path:
    """The directory of one tiny model (``tiny:<variant>``), built first if it is not there yet."""
    models = ensure_tiny_models(cache_dir)
    return _ensure_vision(models) if variant == "vision" else models.path(variant)


def ensure_tiny_models(cache_dir: Path, *, num_steps: int = 400) -> TinyModels:
    """Build the tiny models under ``cache_dir`` unless a complete build is already there."""
    root = Path(cache_dir) / f"tiny-llama-{BUILD_VERSION}"
    models = TinyModels(root)
    if (root / "BUILD.json").exists():
        return models
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".tiny-llama-{BUILD_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "BUILD.json").exists():
            # A first run is otherwise silent for half a minute (2 cores; faster with more).
            log.info("building the embedded tiny model (about 35 s, once) in %s", root)
            _build(root, num_steps=num_steps)
    return models
