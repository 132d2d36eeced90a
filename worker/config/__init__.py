"""The worker's configuration, the only reader of the environment: the ``Settings`` schema
(``settings.py``), host and entry-point facts (``host.py``), and the environment read into the
schema (``environment.py``: ``load_settings``, and the names that are not settings). The speculation
policy the settings check is ``speculation.py``."""

from worker.config.environment import load_settings
from worker.config.host import is_on_runpod, local_run_environment, num_api_servers, sdk_environment
from worker.config.settings import DeploymentMode, LoraModule, Settings, is_embedded
from worker.config.speculation import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    TINY_PREFIX,
    VLLM_SPECULATIVE_METHODS,
    drafts_with_model,
)

__all__ = [
    "DEFAULT_NUM_SPECULATIVE_TOKENS",
    "TINY_PREFIX",
    "VLLM_SPECULATIVE_METHODS",
    "DeploymentMode",
    "LoraModule",
    "Settings",
    "drafts_with_model",
    "is_embedded",
    "is_on_runpod",
    "load_settings",
    "local_run_environment",
    "num_api_servers",
    "sdk_environment",
]
