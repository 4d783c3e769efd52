"""pytest plugin for running Megatron-Bridge's own unit tests on a CPU machine (``-p bridge_unit_tests_plugin``).

Loaded by ``scripts/compare_bridge_unit_tests.py`` (which puts ``scripts/`` on ``PYTHONPATH``) before pytest
collects anything. It

- imports ``megatron.bridge`` through the harness's TE stub (:func:`bridge_freeze_harness.cpu_runtime.import_bridge`),
  so Bridge's test modules import on a machine without TransformerEngine. If bridge-freeze-plugin's autoload is
  on, this import is also what activates the plugin (the ``.pth`` hook fires after ``megatron.bridge`` imports);
  with ``BRIDGE_FREEZE_DISABLE_AUTOLOAD=1`` nothing here imports the plugin;
- pins torch to one thread (the machine's cores are shared);
- makes Bridge's ``safe_load_config_with_retry`` give up at its first attempt: no model hub is reachable here,
  and its exponential back-off (about 7 s per call) made the hub-dependent recipe tests, which fail either
  way, take most of a run's time. The same in both runs, so it changes no comparison;
- writes, at session start and finish, whether the plugin is loaded and active to the JSON file named by
  ``BRIDGE_UNIT_TESTS_STATE_FILE`` (if set), so the driver can check that each run really was in the state it
  asked for.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

from bridge_freeze_harness.cpu_runtime import import_bridge

torch.set_num_threads(1)
import_bridge()


def _no_hub_retries() -> None:
    from megatron.bridge.models.hf_pretrained import safe_config_loader

    func = safe_config_loader.safe_load_config_with_retry
    names = func.__code__.co_varnames[: func.__code__.co_argcount]
    defaults = dict(zip(names[-len(func.__defaults__) :], func.__defaults__, strict=True))
    defaults.update(max_retries=0, base_delay=0.0)
    func.__defaults__ = tuple(defaults.values())


_no_hub_retries()

STATE_FILE_ENV = "BRIDGE_UNIT_TESTS_STATE_FILE"
_STATE: dict[str, Any] = {}


def plugin_state() -> dict[str, bool]:
    """Whether ``bridge_freeze_plugin`` is imported and active, read without importing it."""
    module = sys.modules.get("bridge_freeze_plugin")
    return {
        "plugin_imported": module is not None,
        "plugin_active": bool(module is not None and module.is_active()),
    }


def _write_state() -> None:
    path = os.environ.get(STATE_FILE_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(_STATE, handle, indent=2)


def pytest_sessionstart(session: Any) -> None:
    _STATE["at_start"] = plugin_state()
    _write_state()


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    _STATE["at_finish"] = plugin_state()
    _write_state()


def pytest_report_header(config: Any) -> str:
    state = plugin_state()
    return f"bridge-freeze-plugin: imported={state['plugin_imported']} active={state['plugin_active']}"
