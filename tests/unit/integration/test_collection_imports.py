"""Collecting the suite imports no heavy library: megatron-core, Megatron-Bridge and transformers are imported by the
tests that use them, when they run, so that a pytest process (each of ``make test-fast``'s two workers) whose tests
need none of them never pays for them (tests/conftest.py records what collection imported). It says so when the
whole suite is collected, as ``make test`` and ``make test-fast`` collect it; a run of one file collects only that."""

from __future__ import annotations


def test_collecting_the_suite_imports_no_megatron_and_no_transformers(pytestconfig):
    # Before: tests/unit/integration/test_training_state.py imported megatron.core.rerun_state_machine at module
    # level, and every collection imported megatron-core (and sympy): about 3.5 CPU-seconds per pytest process.
    assert pytestconfig.heavy_imported_by_collection == []
