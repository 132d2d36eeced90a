import pytest

from worker.tools.fit import PRESETS
from worker.tools.sizing import (
    ModelShape,
    bytes_per_weight,
    decode_roofline_tokens_per_s,
    kv_bytes_per_token,
    weight_bytes,
)

LLAMA3_8B = ModelShape.from_config(PRESETS["llama-3-8b"])
LLAMA2_7B = ModelShape.from_config(
    {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "vocab_size": 32000,
    }
)


def test_parameter_counts_match_the_published_sizes() -> None:
    assert LLAMA3_8B.num_params == pytest.approx(8.03e9, rel=0.01)
    assert LLAMA2_7B.num_params == pytest.approx(6.74e9, rel=0.01)


def test_a_7b_model_in_fp16_is_about_14_gb_and_awq_about_a_quarter() -> None:
    fp16 = weight_bytes(LLAMA2_7B, dtype="float16")
    awq = weight_bytes(LLAMA2_7B, quantization="awq", dtype="float16")
    # Per step the LM head is read, not the input embedding table: ~13.2 GB of the 13.5 GB of weights.
    assert fp16 == pytest.approx(13.2e9, rel=0.02)
    linear_fp16 = LLAMA2_7B.num_linear_params * 2
    linear_awq = LLAMA2_7B.num_linear_params * bytes_per_weight("awq")
    assert linear_awq / linear_fp16 == pytest.approx(0.25 + 2.5 / 128 / 2, rel=1e-6)  # a quarter plus scales
    assert awq < 0.3 * fp16


def test_kv_cache_per_token() -> None:
    # Llama-3-8B: 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB per token.
    assert kv_bytes_per_token(LLAMA3_8B) == 131072
    assert kv_bytes_per_token(LLAMA3_8B, kv_cache_dtype="fp8") == 65536


def test_roofline_on_h200_is_near_the_reference_measurement() -> None:
    bound = decode_roofline_tokens_per_s(LLAMA3_8B, bandwidth_gbs=4800, context_len=640)
    # 15.0 GB of weights read per step: 4.8 TB/s / 15.1 GB ~ 318 tok/s. Plain vLLM measured 205 tok/s (64%).
    assert bound == pytest.approx(4800e9 / (weight_bytes(LLAMA3_8B) + 640 * 131072))
    assert 300 < bound < 330
    assert (
        decode_roofline_tokens_per_s(LLAMA3_8B, bandwidth_gbs=4800, context_len=640, quantization="fp8") > 1.7 * bound
    )


def test_the_tools_page_names_every_fit_preset() -> None:
    from pathlib import Path

    from worker.tools.fit import PRESETS

    page = (Path(__file__).resolve().parent.parent / "docs" / "tools.md").read_text()
    assert [name for name in PRESETS if f"`{name}`" not in page] == []
