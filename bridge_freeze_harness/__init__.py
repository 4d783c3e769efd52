"""Test support for bridge-freeze-plugin: build tiny, real Megatron-Bridge VLMs on a CPU-only machine.

A separate top-level package on purpose: it never imports ``bridge_freeze_plugin``, so a test can build a
plain Bridge model (plugin not loaded) to compare. The plugin's runtime path (activation, the mixin,
freeze, report, validation, the registry) never imports it, so a training job that uses the plugin
loads none of this. Only two commands do, lazily inside their functions, because they build models on
the CPU / meta device: ``bridge-freeze demo`` (:mod:`bridge_freeze_plugin.cli`) and ``bridge-freeze
plan`` (:mod:`bridge_freeze_plugin.plan`). On a machine where TransformerEngine loads, the TE stub
(:mod:`bridge_freeze_harness._te_stub`) does nothing. ``tests/unit/test_layout.py`` checks where the
plugin imports it. The test suite and the benchmarks use it too.
See ``tiny/`` for the per-family tiny configurations and ``train.py`` for CPU training steps.
"""
