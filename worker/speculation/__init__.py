"""Speculative decoding: how the worker decides it, runs it and measures it.

Imports nothing on purpose: ``worker.config`` reads the policy module while the settings parse, so
this package's face must not pull in anything that imports the settings back.
"""
