"""RunPod serverless entry: job -> vLLM engine -> streamed dicts.

Accepted ``job["input"]`` (see ``worker/schema.py`` for every field)::

    {"prompt": "Hello", "sampling_params": {"max_tokens": 64, "temperature": 0}, "stream": true}
    {"messages": [{"role": "user", "content": "Hi"}], "sampling_params": {...}}
    {"prompt": "...", "sampling_params": {"structured_outputs": {"json": {<JSON schema>}}}}

Every native item is a JSON object: ``{"text": delta}`` while streaming; the last adds
``finish_reason``, ``usage``, ``timings``, ``spec_decode`` and ``served``. Errors:
``{"error": ..., "error_type": ...}``. A streamed ``openai_route`` yields strings of whole
server-sent events instead (``worker.serverless.JobItem``).

Run locally:
    python handler.py                          # the job in test_input.json
    python handler.py --test_input '<json>'    # that job
    python handler.py --verbose                # vLLM's INFO logs too, and what worker/quiet.py leaves out
    python handler.py --rp_serve_api           # the RunPod SDK's local API server
    python handler.py --help                   # every flag; an unknown one is refused before anything boots

Importing this module boots nothing: the engine starts with the first job. A setting that can
never serve (``worker/boot/preflight.py``) ends the process with status 2 before it takes a job.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator

from worker.boot.preflight import check_at_start
from worker.config import is_on_runpod, local_run_environment, sdk_environment
from worker.errors import ConfigError
from worker.quiet import silence
from worker.sdk import import_runpod
from worker.serverless import Job, JobItem, ServerlessWorker, local_arg_parser, main_local

_worker = ServerlessWorker()


async def handler(job: Job) -> AsyncIterator[JobItem]:
    async for item in _worker.handle(job):
        yield item


def main(argv: list[str]) -> int:
    args = local_arg_parser().parse_args(argv)  # --help, or an unknown flag: usage, before anything boots
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _worker.holder.install_signal_handlers()
    is_local = not (args.rp_serve_api or is_on_runpod())
    if is_local:
        local = local_run_environment(is_verbose=args.verbose)
        os.environ.update(local)  # before the settings are read and vLLM is imported
    try:  # a setting that can never serve ends the process before it takes a job (worker/boot/preflight.py)
        check_at_start(_worker.holder.settings)
    except ConfigError as exc:
        logging.getLogger("handler").error("configuration error, exiting before taking a job: %s", exc.message)
        return 2
    if not is_local:
        os.environ.update(sdk_environment())  # before the SDK reads its log level
        runpod = import_runpod()  # reads its own --rp_* flags from sys.argv

        _worker.serve_metrics_page()

        _worker.runpod_config.update(
            handler=handler,
            concurrency_modifier=_worker.concurrency_modifier,
            return_aggregate_stream=True,
        )
        runpod.serverless.start(_worker.runpod_config)
        return 0
    # The SDK's own local mode does not iterate async-generator handlers: ours does.
    if not args.verbose:
        silence(vllm_level=local.get("VLLM_LOGGING_LEVEL"))  # what needs no action (worker/quiet.py)
    return main_local(_worker, args.test_input)


if __name__ == "__main__":  # vLLM's spawned workers re-import this file: nothing may start on import
    sys.exit(main(sys.argv[1:]))
