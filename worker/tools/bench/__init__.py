"""``python -m worker bench``: the worker against its peers, measured as ratios in one run.

Parts (``--parts``, default all):

- ``overhead``  the same N concurrent requests through the serverless handler's code path
                and straight into vLLM's ``AsyncLLM``, on one engine in one process,
                alternating paths; throughput, TTFT and inter-token-latency ratios.
- ``pod``       our pod server and ``python -m vllm.entrypoints.openai.api_server``, same
                engine arguments, booted side by side and driven in turn by the same streaming HTTP client.
- ``coldstart`` process start to first streamed token for ``python handler.py --test_input``
                and for vLLM's server (start plus first request); the handler's import time;
                where the time goes, from the engine's own log lines.
- ``spec``      tokens/s with each draft (target as its own draft, noisy copy, unrelated,
                n-gram) and k in {2, 4, 8} versus no speculation, with the measured acceptance.
- ``roofline``  the single-stream decode bound from bytes per step and memory bandwidth.

Writes ``bench.json``, ``bench.md`` and PNG plots under ``--out``. Nothing is typed by hand:
every figure in the Markdown comes from the JSON of the same run.

One module per part (``overhead``, ``servers``, ``coldstart``, ``spec``, ``roofline``), the timing
they share (``timing``), the report (``report``), synthetic checkpoints (``shapes``) and the
command line (``cli``).
"""
