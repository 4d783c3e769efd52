"""Shared fixtures. Real Megatron-Bridge models are built tiny on the CPU through the project's
own test support (``bridge_freeze_harness``); see docs/families.md."""

from __future__ import annotations

import os

import pytest

# No model hub is reachable: make any accidental hub access fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The SFT / RL fixtures and tests are the origin trainer's: a SkyRL carrying the review's megatron_config.freeze_*
# fields, whose classes are not importable here. Read them as such (no SkyRL field listing); the tests of SkyRL as
# released (tests/unit/config/test_skyrl_agreement.py) name its fields themselves.
os.environ.setdefault("BRIDGE_FREEZE_SKYRL_FIELDS", "none")


@pytest.fixture(scope="session")
def cpu_bridge():
    """``import megatron.bridge`` (TE stub) + gloo + model-parallel state, once per test session."""
    import torch

    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

    # One thread: on a 2-core machine this is faster and steadier for tiny models.
    torch.set_num_threads(1)
    bridge = import_bridge()
    init_cpu_distributed()
    return bridge



@pytest.fixture(autouse=True)
def _no_saved_configs_from_earlier_tests():
    """Each test is its own run: the saved provider configs an earlier test in this worker read (a checkpoint's
    ``run_config.yaml``) must not be attributed to this test's providers (``prewrap._saved`` attributes by
    provider class, process-wide, as a real job reads its own saved config)."""
    import sys

    saved = sys.modules.get("bridge_freeze_plugin.prewrap._saved")
    if saved is not None:
        saved.forget_saved()
    yield

# ---- Markers applied automatically (``make test-fast`` deselects both) ------------------------------
# ``bridge``: the test builds or imports real Bridge models (it uses the ``cpu_bridge`` fixture, directly or
# through another fixture). ``spawns``: the test starts processes (subprocess / Popen / a gloo worker),
# found by reading the test module: the test function, the module's functions and fixtures it uses, and
# theirs, transitively.

_SPAWN_CALLS = ("subprocess.", "Popen(", "mp.spawn", "start_processes(", "multiprocessing.")
#: Fixtures that start processes (tests/unit/conftest.py: the forkserver with Bridge preloaded, its commands).
_SPAWNING_FIXTURES = {"bridge_forkserver"}
_spawning_cache: dict[str, set[str]] = {}


def _spawning_names(path: str) -> set[str]:
    """Names of the module-level functions in ``path`` that start a process, directly or through another."""
    import ast

    if path in _spawning_cache:
        return _spawning_cache[path]
    with open(path, encoding="utf-8") as handle:
        source = handle.read()  # universal newlines: "\n" ends every line, as the parser counts lines
    spawning: set[str] = set()
    if not any(marker in source for marker in _SPAWN_CALLS):  # no function's text can hold one: nothing to parse
        _spawning_cache[path] = spawning
        return spawning
    tree = ast.parse(source)
    lines = source.split("\n")
    calls: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # the function's source segment (ast.get_source_segment, which re-splits the file at every call): a
            # module-level def starts at column 0; its last line ends at end_col_offset (UTF-8 bytes)
            last = lines[node.end_lineno - 1].encode()[: node.end_col_offset].decode()
            text = "\n".join([*lines[node.lineno - 1: node.end_lineno - 1], last])
            calls[node.name] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            calls[node.name] |= {a.arg for a in node.args.args}  # fixtures it asks for
            if any(marker in text for marker in _SPAWN_CALLS):
                spawning.add(node.name)
    changed = True
    while changed:
        changed = False
        for name, used in calls.items():
            if name not in spawning and used & spawning:
                spawning.add(name)
                changed = True
    _spawning_cache[path] = spawning
    return spawning


# ---- Order: the longest files first -----------------------------------------------------------------
# ``make test`` runs whole files in 2 workers (pytest-xdist, --dist loadfile), handed out in collection order:
# the longest started last would leave one worker idle at the end. These files (the longest in a run of
# 2026-12-07 on 2 cores, longest first) run first; every other file after them in the usual order. Order only: each
# file's tests keep theirs, and no result depends on it (a one-process run takes the same order).
LONGEST_FILES = (
    "test_cli.py", "test_plan_published.py", "test_benchmarks_smoke.py", "test_family_resume.py",
    "test_prediction_agreement.py", "test_activation.py", "test_config_trainers.py", "test_family_qwen_omni.py",
    "test_families.py", "test_freezable_serialisation.py", "test_audit_in_bridges_loop.py",
    "test_activation_state.py", "test_provider_round_trip.py", "test_bridge_training.py",
    "test_adding_a_family.py", "test_plan_sync.py", "test_provider_invisible.py", "test_hf_roundtrip.py",
    "test_recipe_every.py", "test_trainable_checkpoints.py", "test_staged_training.py", "test_stage_resume.py",
)


#: The files whose tests use the Bridge forkserver (tests/unit/conftest.py): one scheduling unit under
#: ``--dist loadfile``, so that one worker starts the server (about 15 CPU-seconds and 1 GB), not each.
FORKSERVER_FILES = frozenset({
    "test_cli.py", "test_bridge_training.py", "test_distributed.py", "test_plan_per_rank.py", "test_forked_commands.py",
    "test_refit_info.py", "test_trainable_sync.py", "test_audit_distributed.py", "test_recipe_cli.py",
})

#: The files of ``make test-fast``'s subset (no ``bridge`` / ``spawns`` / ``slow`` test) whose tests import
#: megatron-core, Megatron-Bridge or transformers (check-config's build rules, its LoRA try on a plain Linear, plan's
#: HF config reading, the harness's family modules; found 2026-12-07 by running each file's fast tests alone): one
#: scheduling unit too, so that one worker pays those imports (about 6 CPU-seconds for megatron-core, 5 more for
#: Bridge and transformers), not both. Where no ``spawns`` test is selected (``make test-fast``) no test starts the
#: forkserver, and :data:`FORKSERVER_FILES` join this unit (test_plan_per_rank's fast tests import them too).
BRIDGE_IMPORTING_FAST_FILES = frozenset({
    "test_skyrl_agreement.py", "test_plan_inputs.py", "test_check_config_build_rules.py", "test_training_state.py",
    "test_harness.py", "test_hf_roundtrip.py",
})

try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pytest-xdist not installed: one process, nothing to schedule
    LoadFileScheduling = None

if LoadFileScheduling is not None:

    class _ForkserverFilesTogether(LoadFileScheduling):
        """``--dist loadfile``, with :data:`FORKSERVER_FILES` as one unit (handed out when test_cli's turn comes), and
        :data:`BRIDGE_IMPORTING_FAST_FILES` as another (the same one where no ``spawns`` test runs)."""

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            name = scope.rsplit("/", 1)[-1]
            if name in FORKSERVER_FILES:
                return "files importing Bridge" if _no_spawns_selected(self.config) else "forkserver files"
            return "files importing Bridge" if name in BRIDGE_IMPORTING_FAST_FILES else scope

    def _no_spawns_selected(config) -> bool:
        return "not spawns" in (config.getoption("markexpr") or "")

    def pytest_xdist_make_scheduler(config, log):
        if config.getoption("dist") == "loadfile":
            # pytest-xdist's default --loadscope-reorder hands the units out by their number of tests, most first,
            # not in collection order: LONGEST_FILES' order was lost (test_benchmarks_smoke, 2 tests and about 47 s,
            # went out among the last). Collection order it is.
            config.option.loadscopereorder = False
            return _ForkserverFilesTogether(config, log)
        return None


def _longest_first(items: list) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


#: What collecting the suite must not import (a test module importing one at module level makes every pytest
#: process, both of ``make test-fast``'s workers included, pay for it: megatron-core alone is about 3.5 CPU-seconds).
HEAVY_LIBRARIES = ("megatron.core", "megatron.bridge", "transformers")


def pytest_collection_finish(session):
    """Record which of :data:`HEAVY_LIBRARIES` collection imported (tests/unit/integration/test_collection_imports.py
    asserts none): before any test runs, so only test modules' and conftests' imports count."""
    import sys

    session.config.heavy_imported_by_collection = [name for name in HEAVY_LIBRARIES if name in sys.modules]


def pytest_collection_modifyitems(config, items):
    _longest_first(items)
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "cpu_bridge" in fixtures:
            item.add_marker(pytest.mark.bridge)
        function = getattr(item, "function", None)
        if function is None:
            continue
        spawning = _spawning_names(str(item.path))
        if function.__name__ in spawning or fixtures & (spawning | _SPAWNING_FIXTURES):
            item.add_marker(pytest.mark.spawns)
