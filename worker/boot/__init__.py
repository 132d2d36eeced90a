"""Booting the engine: settings to a boot plan, the work done while vLLM is imported, the engine
started and warmed up. Only ``launch.py`` imports vLLM (``modelinfo.py`` in its own subprocess)."""
