"""Exact per-request speculative-decoding stats: vLLM's scheduler and output processor subclassed
(``scheduler.py``, ``frontend.py``; they import vLLM), one request's books (``tracking.py``) and the
acceptance arithmetic (``acceptance.py``, pure)."""
