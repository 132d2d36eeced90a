"""Speculative decoding: how the worker decides it, runs it and measures it.

- Decided once, at boot: ``worker/config/speculation.py`` reads what the settings ask for (the
  speculative config, the drafter's kind) and checks it while the settings parse; ``decide.py`` turns
  it, with the mode and the device, into one :class:`~worker.speculation.decide.SpeculationPlan`
  (the control, the runner, torch.compile or not, the CUDA-graph mode, k and its schedule, exact stats), which the boot
  plan stores and every later step reads. The table of its answers, and why: docs/speculation.md.
- Run, under ``SPECULATION_CONTROL=auto``: ``controller.py`` picks k each engine step against the
  cost model of ``cost.py``; the scheduler hooks in ``stats/`` carry its k into vLLM's scheduler.
- Measured: ``stats/`` gives each request its exact acceptance counts (vLLM's scheduler and output
  processor subclassed); ``measure.py`` keeps what the controller learns from them (the acceptance
  per draft position, the host's step times).
"""
