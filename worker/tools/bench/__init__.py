"""``python -m worker bench``: the worker against its peers, measured as ratios in one run.

Parts (``--parts``, default all):

- ``overhead``       the same N concurrent requests through the serverless handler's code path
                     and straight into vLLM's ``AsyncLLM``, on one engine in one process,
                     alternating paths; throughput, TTFT and inter-token-latency ratios (optionally
                     against a stats-off engine and an identical twin: ``--stats-off-baseline``,
                     ``--aa-baseline``).
- ``pod``            our pod server and ``python -m vllm.entrypoints.launchers.api_server.entry``, same
                     engine arguments, booted side by side and driven in turn by the same streaming
                     HTTP client; each API process's CPU time per token.
- ``coldstart``      process start to first streamed token for ``python handler.py --test_input``
                     and for vLLM's server (start plus first request); the handler's import time;
                     where the time goes, from the engine's own log lines.
- ``coldstart_handler``  the same for the handler alone.
- ``first_request``  TTFT of the first request after boot against later ones (plain, and with the
                     sampler's optional features).
- ``spec``           tokens/s with each draft (target as its own draft, noisy copy, unrelated,
                     n-gram) and k versus no speculation, with the measured acceptance, the
                     acceptance watchdog's verdict and vLLM's counters against the per-request sums.
- ``stats_path``     the exact-stats path's own CPU time per engine step (vLLM's types and serialiser).
- ``roofline``       the single-stream decode bound from bytes per step and memory bandwidth.

``--smoke`` checks the harness at tiny sizes: the in-process parts share one engine per
configuration (``engines``), and the cold start measures the handler only.

Writes ``bench.json``, ``bench.md`` and PNG plots under ``--out``. Nothing is typed by hand:
every figure in the Markdown comes from the JSON of the same run.

One module per part (``overhead``, ``servers``, ``coldstart``, ``spec``, ``stats_path``,
``roofline``), the timing they share (``timing``), the in-process parts' engines (``engines``), the
report (``report``), synthetic checkpoints (``shapes``) and the command line (``cli``).

On a GPU the bench runs in stages (``python -m worker bench --stage NAME``): the stages are data
in ``stages``, and ``stage_runner`` runs each under its deadline, stops what it started and packs
the output folder as it goes.
"""
