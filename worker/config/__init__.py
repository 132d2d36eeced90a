"""The worker's configuration: ``Settings`` parsed once from the environment (``settings.py``)."""

from worker.config.settings import (
    TINY_PREFIX,
    DeploymentMode,
    LoraModule,
    Settings,
    drafts_with_model,
    is_on_runpod,
    load_settings,
    local_run_environment,
    sdk_environment,
)

__all__ = [
    "TINY_PREFIX",
    "DeploymentMode",
    "LoraModule",
    "Settings",
    "drafts_with_model",
    "is_on_runpod",
    "load_settings",
    "local_run_environment",
    "sdk_environment",
]
