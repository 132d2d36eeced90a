"""Tiny Llama-architecture models built offline, for the default run and the tests.

No model hub is needed: :func:`ensure_tiny_models` trains a byte-level BPE tokenizer
and a small Llama on an embedded corpus for a few hundred steps, then writes the draft variants
beside it (their names: :data:`worker.builtin_models.TINY_VARIANTS`):

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
                 on first use (seconds) and versioned apart, so that adding it left the text
                 models' cache valid

Everything is seeded, cached under ``cache_dir`` keyed by the build's version, and built once per
machine (a file lock keeps concurrent builders from racing). The models decode greedily unless a
request says otherwise: their ``generation_config.json`` sets temperature 0
(:data:`GENERATION_DEFAULTS`), which vLLM applies as the model's default sampling parameters.
torch and transformers are imported lazily: they only run when no model is given.

The parts: ``corpus.py`` what they learn, ``text.py`` the text models' build, ``vision.py`` the
vision model's, ``cache.py`` where the builds are kept.
"""

from worker.tiny_models.cache import VARIANTS, TinyModels, ensure_tiny_model, ensure_tiny_models
from worker.tiny_models.corpus import calibration_texts
from worker.tiny_models.text import BUILD_VERSION, GENERATION_DEFAULTS

__all__ = [
    "BUILD_VERSION",
    "GENERATION_DEFAULTS",
    "VARIANTS",
    "TinyModels",
    "calibration_texts",
    "ensure_tiny_model",
    "ensure_tiny_models",
]
