from worker.config import load_settings
from worker.engine_args import TINY_KV_CACHE_BYTES, TINY_MAX_MODEL_LEN, build_engine_kwargs


def resolve(ref: str) -> str:
    return "/models/" + ref.replace(":", "-") if ref.startswith("tiny:") else ref


def test_tiny_default() -> None:
    kwargs = build_engine_kwargs(load_settings({}), resolve=resolve)
    assert kwargs["model"] == "/models/tiny-target"
    assert kwargs["max_model_len"] == TINY_MAX_MODEL_LEN
    assert kwargs["kv_cache_memory_bytes"] == TINY_KV_CACHE_BYTES
    assert kwargs["enforce_eager"] is True
    assert kwargs["speculative_config"]["model"] == "/models/tiny-noisy"
    assert kwargs["per_request_spec_decode_metrics"] == "summary"


def test_real_model_keeps_vllm_defaults_and_checkpoint_quantization() -> None:
    kwargs = build_engine_kwargs(load_settings({"MODEL_NAME": "org/m"}), resolve=resolve)
    assert kwargs["model"] == "org/m"
    for unset in ("quantization", "max_model_len", "kv_cache_memory_bytes", "max_num_seqs", "speculative_config"):
        assert unset not in kwargs
    assert kwargs["enforce_eager"] is False
    assert kwargs["enable_prefix_caching"] is True


def test_settings_are_mapped() -> None:
    kwargs = build_engine_kwargs(
        load_settings(
            {
                "MODEL_NAME": "org/m",
                "QUANTIZATION": "awq_marlin",
                "KV_CACHE_DTYPE": "fp8",
                "MAX_NUM_SEQS": "64",
                "TENSOR_PARALLEL_SIZE": "2",
                "ENABLE_PREFIX_CACHING": "false",
                "MAX_MODEL_LEN": "8192",
                "SPECULATIVE_METHOD": "ngram",
                "NUM_SPECULATIVE_TOKENS": "5",
            }
        ),
        resolve=resolve,
    )
    assert kwargs["quantization"] == "awq_marlin"
    assert kwargs["kv_cache_dtype"] == "fp8"
    assert kwargs["max_num_seqs"] == 64
    assert kwargs["tensor_parallel_size"] == 2
    assert kwargs["enable_prefix_caching"] is False
    assert kwargs["max_model_len"] == 8192
    assert kwargs["speculative_config"]["method"] == "ngram"
    assert kwargs["speculative_config"]["num_speculative_tokens"] == 5


def test_stream_interval_is_vllms_default_unless_set() -> None:
    assert build_engine_kwargs(load_settings({}), resolve=resolve)["stream_interval"] == 1
    assert build_engine_kwargs(load_settings({"STREAM_INTERVAL": "8"}), resolve=resolve)["stream_interval"] == 8
