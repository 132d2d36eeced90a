"""A model's context limit as the worker derives it without vLLM (``worker/vllm_internals/model_len.py``),
side by side with vLLM's own derivation, on a config of each rule: the limit the worker derives is
the largest ``max_model_len`` vLLM accepts, and one token more is what vLLM refuses."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from worker.vllm_internals.model_len import (
    LENGTH_KEYS,
    OWN_DERIVATION,
    PRESCALED_ROPE_TYPES,
    context_limit,
    model_context_limit,
    read_config,
)

_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}

# One config per rule of the derivation: (its config.json, the limit the worker derives).
CONFIGS: dict[str, tuple[dict[str, Any], int]] = {
    "max_position_embeddings": ({**_LLAMA, "max_position_embeddings": 2048}, 2048),
    "the config class's default": (_LLAMA, 2048),
    "linear RoPE scales the length": (
        {**_LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}},
        16384,
    ),
    "dynamic RoPE scales the length": (
        {**_LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        8192,
    ),
    "llama3 RoPE is scaled already": (
        {
            **_LLAMA,
            "max_position_embeddings": 131072,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        131072,
    ),
    "YaRN is scaled already": (
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "max_position_embeddings": 32768,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
        },
        32768,
    ),
    "Gemma 3 is scaled already": (
        {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        },
        131072,
    ),
    "n_positions": ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_positions": 512}, 512),
    "model_max_length wins": (
        {
            "architectures": ["CohereForCausalLM"],
            "model_type": "cohere",
            "max_position_embeddings": 8192,
            "model_max_length": 131072,
        },
        131072,
    ),
    "a multimodal model's text config": (
        {
            "architectures": ["LlavaForConditionalGeneration"],
            "model_type": "llava",
            "text_config": {"model_type": "llama", "max_position_embeddings": 4096},
        },
        4096,
    ),
}


def _model(tmp_path: Path, config: dict[str, Any], *beside: str) -> Path:
    path = tmp_path / "model"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for name in beside:
        (path / name).write_text("{}")
    return path


def _vllms_max_model_len(path: Path, max_model_len: int) -> int:
    """vLLM's own derivation (what its ModelConfig runs) over vLLM's own reading of the config."""
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.config import get_config, get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    config = get_config(path, trust_remote_code=False)
    text = get_hf_text_config(config)
    convertor = MODEL_ARCH_CONFIG_CONVERTORS.get(config.model_type, ModelArchConfigConvertorBase)(config, text)
    arch: Any = SimpleNamespace(derived_max_model_len_and_key=convertor.derive_max_model_len_and_key())
    return int(
        _get_and_verify_max_len(
            hf_config=text,
            model_arch_config=arch,
            tokenizer_config=None,
            max_model_len=max_model_len,
            disable_sliding_window=False,
            sliding_window=None,
        )
    )


@pytest.mark.parametrize(("config", "tokens"), CONFIGS.values(), ids=CONFIGS.keys())
def test_the_limit_is_the_longest_max_model_len_vllm_accepts(
    tmp_path: Path, config: dict[str, Any], tokens: int
) -> None:
    path = _model(tmp_path, config)
    limit = model_context_limit(path, engine_kwargs={})
    assert limit is not None and limit.tokens == tokens, limit
    assert _vllms_max_model_len(path, tokens) == tokens
    with pytest.raises(ValueError, match=r"User-specified max_model_len \(\d+\) is greater than the derived"):
        _vllms_max_model_len(path, tokens + 1)


def test_the_source_names_the_key_that_sets_the_limit(tmp_path: Path) -> None:
    config, _ = CONFIGS["linear RoPE scales the length"]
    limit = model_context_limit(_model(tmp_path, config), engine_kwargs={})
    assert limit is not None and limit.source == "max_position_embeddings 4096 x 4 (RoPE scaling)"


def test_no_answer_where_vllm_reads_more_than_the_config(tmp_path: Path) -> None:
    plain = {**_LLAMA, "max_position_embeddings": 2048}
    assert model_context_limit(_model(tmp_path, plain), engine_kwargs={"hf_overrides": {"x": 1}}) is None
    encoder = _model(tmp_path / "encoder", plain, "sentence_bert_config.json")
    assert model_context_limit(encoder, engine_kwargs={}) is None  # its max_seq_length is vLLM's limit
    remote = _model(tmp_path / "remote", {**plain, "auto_map": {"AutoConfig": "x.Config"}})
    assert read_config(remote) is None  # vLLM may read it with the model's own class
    unknown = _model(tmp_path / "unknown", {"model_type": "not-a-transformers-type", "max_position_embeddings": 8})
    assert read_config(unknown) is None
    assert context_limit({"model_type": "llama"}, {"model_type": "llama"}) is None  # no length key: vLLM takes any
    assert context_limit({"model_type": "moss_audio"}, {"max_position_embeddings": 8}) is None


def test_the_rules_written_out_are_vllms() -> None:
    """The lists the worker writes out, read from vLLM's own source: its length keys in their order,
    the RoPE types it does not scale by, and the model types whose convertor derives the length its
    own way."""
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    base = ModelArchConfigConvertorBase.derive_max_model_len_and_key
    tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
    keys = next(
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "possible_keys"
    )
    assert tuple(keys) == LENGTH_KEYS
    source = inspect.getsource(_get_and_verify_max_len)
    tuples = [node for node in ast.walk(ast.parse(textwrap.dedent(source))) if isinstance(node, ast.Tuple)]
    unscaled = next(set(ast.literal_eval(t)) for t in tuples if "llama3" in ast.unparse(t))
    assert unscaled == PRESCALED_ROPE_TYPES
    own = {name for name, cls in MODEL_ARCH_CONFIG_CONVERTORS.items() if cls.derive_max_model_len_and_key is not base}
    assert own == OWN_DERIVATION
