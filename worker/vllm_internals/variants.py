"""Where the releases the seam spans differ: each difference as two variants side by side, one of
them picked when this module loads, from the installed vLLM's release
(:func:`worker.vllm_internals.release.installed_release`: a release outside the window fails the
import with :class:`~worker.errors.UnsupportedVllm`, naming the version).

- vLLM's server parser (``make_arg_parser``) moved from ``vllm.entrypoints.launchers.cli_args``
  (0.32) to ``vllm.entrypoints.common.cli_args`` (0.34).
- The model runner's output indexed its rows by request id (``req_id_to_index``) in 0.32; 0.34
  dropped the field, and its own scheduler builds the index from ``req_ids`` where it needs one.
- 0.32 has two GPU model runners, V1 and V2, and its scheduler says which runs
  (``use_v2_model_runner``); 0.34 has only V2 (the attribute is gone with V1).
- 0.34's V2 runner builds a draft model's speculator from a config class that names it
  (``StandaloneARSpeculatorConfig.speculator_class``), which the seam's skip of the pass at k = 0
  replaces (:mod:`worker.vllm_internals.draft_skip`); 0.32 has no such class: the pass stays.

The contract (:mod:`worker.vllm_internals.contract`) lists each variant's internals as ``0.32 only:``
or ``0.34 only:``, so the boot checks the installed release's, and the wheel check a wheel's.
Nothing outside the seam asks which release runs. Imports no vLLM module at load: the parser's
is imported where it is called (the serving layer's, not the engine core's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from worker.vllm_internals.release import installed_release

if TYPE_CHECKING:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput

__all__ = ["RELEASE", "draft_speculator_config", "row_index", "runs_v2_model_runner", "server_arg_parser"]

RELEASE = installed_release()

if RELEASE == "0.32":

    def draft_speculator_config() -> Any:
        """The config class naming a draft model's V2 speculator: none in 0.32 (module docstring)."""
        return None

    def server_arg_parser() -> FlexibleArgumentParser:
        """vLLM's own ``vllm serve`` parser, with its defaults."""
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        return make_arg_parser(FlexibleArgumentParser())  # type: ignore[no-untyped-call]

    def row_index(output: ModelRunnerOutput) -> Mapping[str, int]:
        """Request id -> its row in the model output's per-request lists (vLLM built it)."""
        return output.req_id_to_index

    def runs_v2_model_runner(scheduler: Scheduler) -> bool:
        """Whether the engine runs vLLM's V2 model runner (vLLM's scheduler knows)."""
        return bool(scheduler.use_v2_model_runner)

else:

    def draft_speculator_config() -> Any:
        """The config class naming a draft model's V2 speculator (module docstring). Imported on
        the GPU build only: the CPU build has no V2 speculators."""
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            return None
        from vllm.v1.worker.gpu.spec_decode.standalone_ar.config import StandaloneARSpeculatorConfig

        return StandaloneARSpeculatorConfig

    def server_arg_parser() -> FlexibleArgumentParser:
        """vLLM's own ``vllm serve`` parser, with its defaults."""
        from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        return make_arg_parser(FlexibleArgumentParser())  # type: ignore[no-untyped-call,no-any-return]

    def row_index(output: ModelRunnerOutput) -> Mapping[str, int]:
        """Request id -> its row in the model output's per-request lists (built, as 0.34's own
        scheduler builds it, from ``req_ids``)."""
        return {rid: i for i, rid in enumerate(output.req_ids)}

    def runs_v2_model_runner(scheduler: Scheduler) -> bool:
        """Whether the engine runs vLLM's V2 model runner: always (0.34 has no other)."""
        return True
