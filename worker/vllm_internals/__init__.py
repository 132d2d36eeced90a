"""The one seam between the worker and vLLM's internals.

The worker is fast because it reaches into vLLM: it subclasses vLLM's schedulers and output
processor (exact per-request stats, ``SPECULATION_CONTROL=auto``), wraps two of vLLM's methods for
the FULL CUDA-graph mode and replaces its CUDA-graph capture's collector context (its plugin),
builds vLLM's OpenAI app over its own engine, runs vLLM's multi-API-server machinery, registers a
media connector and fills vLLM's model-class cache; and the bench watches and steers vLLM's engine
through probes (:mod:`worker.vllm_internals.probes`), held to the same rules. Every
subclass, override, monkeypatch, private attribute and private import on vLLM lives in this
package, and nowhere else: the rest of the worker imports from vLLM only the short public surface
in :mod:`worker.vllm_internals.public` (``tests/test_vllm_seam.py`` enforces it).

It spans two vLLM releases, the CPU build's (0.32) and the image's (0.34): where they differ,
:mod:`worker.vllm_internals.variants` holds both variants and picks one when it loads, from the
installed release (:mod:`worker.vllm_internals.release`; any other release fails the boot with one
sentence naming it).

What this package relies on is declared as data in :mod:`worker.vllm_internals.contract`: each
internal, what the seam calls it with or reads of it, the seam module that needs it, and the
release it holds for where only one has it. It is checked five ways, each on its release's
entries: against the installed vLLM by ``tests/test_vllm_contract.py`` (fast lane), against the
image's pinned wheel, parsed, by ``tests/test_vllm_wheel_contract.py`` (fast lane), at the image's
build (``python -m worker vllm-contract --stamp``: where all hold, a stamp spares that image's boots
the next check; where not, the step names what broke and each boot checks), at boot before the
engine starts (:func:`worker.vllm_internals.check.require_internals`: a missing internal fails the
boot with a sentence naming it, never a silent fallback), and against another vLLM's wheel without
importing it (``python -m worker vllm-contract --wheel vllm==X``; docs/vllm-contract.md).

Imports nothing on purpose: the modules that import vLLM are loaded only where they are used.
"""
