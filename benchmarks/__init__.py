"""Benchmarks of bridge-freeze-plugin: what freezing saves, and what the plugin costs.

Run ``python -m benchmarks.run`` (see ``docs/benchmarks.md``). Not part of the test suite.
"""
