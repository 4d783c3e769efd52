"""Test support for bridge-freeze-plugin: build tiny, real Megatron-Bridge VLMs on a CPU-only machine.

A separate top-level package on purpose: it never imports ``bridge_freeze_plugin`` and the plugin never
imports it, so a GPU job that uses the plugin loads none of this, and a test can build a plain Bridge
model (plugin not loaded) to compare. The test suite, ``bridge-freeze demo`` and the benchmarks use it.
See ``tiny/`` for the per-family tiny configurations and ``train.py`` for CPU training steps.
"""
