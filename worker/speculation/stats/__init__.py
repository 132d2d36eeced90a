"""Exact per-request speculative-decoding stats, the parts that import no vLLM: one request's books
(``tracking.py``), what the engine core answers to a stop string's abort and what the frontend makes
of it (``answers.py``), and the acceptance arithmetic (``acceptance.py``). vLLM's scheduler and
output processor, subclassed to produce them, are the seam's: ``worker/vllm_internals/scheduler.py``
and ``frontend.py``."""
