"""The single-stream decode bound: bytes read per step over memory bandwidth."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from worker.tools.sizing import GPUS, ModelShape, decode_roofline_tokens_per_s, kv_bytes_per_token, weight_bytes


# ------------------------------------------------------------------------------ roofline
def checkpoint_quantization(model_path: str) -> str | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        config = json.loads((Path(model_path) / "config.json").read_text())
        return str(config["quantization_config"]["quant_method"])
    return None


def bench_roofline(
    model_path: str,
    *,
    quantization: str | None,
    dtype: str,
    context_len: int,
    measured_tok_s: float | None,
    gpu: str | None,
) -> dict[str, Any]:
    shape = ModelShape.from_path(model_path)
    quantization = quantization or checkpoint_quantization(model_path)
    w_bytes = weight_bytes(shape, quantization=quantization, dtype=dtype)
    kv = kv_bytes_per_token(shape)
    rows = []
    for name, spec in GPUS.items():
        bound = decode_roofline_tokens_per_s(
            shape, bandwidth_gbs=spec["bandwidth_gbs"], context_len=context_len, quantization=quantization, dtype=dtype
        )
        row: dict[str, Any] = {"gpu": name, "bandwidth_gbs": spec["bandwidth_gbs"], "bound_tok_s": bound}
        if gpu == name and measured_tok_s:
            row["measured_tok_s"] = measured_tok_s
            row["fraction_of_bound"] = measured_tok_s / bound
        rows.append(row)
    return {
        "num_params": shape.num_params,
        "weight_bytes_per_step": w_bytes,
        "kv_bytes_per_token": kv,
        "context_len": context_len,
        "quantization": quantization,
        "dtype": dtype,
        "rows": rows,
    }
