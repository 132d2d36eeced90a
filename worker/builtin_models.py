"""The models the worker makes itself, by name: the default model (SmolLM2, converted from PyPI's
package by :mod:`worker.smollm2`) and the tiny models' variants (built by :mod:`worker.tiny_models`).

Names only, so that the settings check a model reference against them without importing the
builders (nor torch or transformers behind them); the builders import their names from here.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MODEL", "TINY_VARIANTS"]

# The name MODEL_NAME gives the default (what an unset MODEL_NAME means, and what the OpenAI routes
# answer to): not a hub id, because these weights are the GGUF's 4-bit ones, not the hub's.
DEFAULT_MODEL = "smollm2:135m-instruct"
# The tiny models' variants (``tiny:target``, ...; each described in worker/tiny_models/__init__.py).
TINY_VARIANTS = ("target", "noisy", "unrelated", "mismatch", "lora", "vision")
