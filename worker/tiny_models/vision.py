"""The vision model's build: an Idefics3 (SmolVLM's architecture) over the trained text target, its
vision tower and connector random, with the processor and chat template vLLM needs to serve images
on a CPU without torchvision. Versioned by :data:`VISION_BUILD_VERSION` apart from the text models,
so that adding it left their cache valid."""

from __future__ import annotations

import json
from pathlib import Path

from worker.tiny_models.corpus import CHAT_TEMPLATE
from worker.tiny_models.text import save_served_dtype

__all__ = ["VISION_BUILD_VERSION", "build_vision"]

VISION_BUILD_VERSION = "v1"


def vision_chat_template() -> str:
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


def build_vision(target: Path, directory: Path) -> None:
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
    save_served_dtype(model, directory)

    # The PIL image processor: transformers' default Idefics3 processor needs torchvision, which
    # vLLM's CPU build goes without (transformers falls back to this one, with a warning).
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 2 * _VISION_TILE}, max_image_size={"longest_edge": _VISION_TILE}
    )
    template = vision_chat_template()
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
