"""Test support: build tiny, real Megatron-Bridge VLMs on a CPU-only machine.

Nothing in the plugin proper imports this package; the test suite, the ``bridge-freeze demo``
command and the benchmarks do. See ``tiny.py`` for the per-family tiny configurations and
``stand_ins.py`` for the structural stand-ins used where a family cannot be built offline.
"""
