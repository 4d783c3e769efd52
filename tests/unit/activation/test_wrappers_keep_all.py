"""Every function of Bridge or megatron-core that the plugin wraps keeps all it had (issue 46 item 0).

Bridge's ``read_run_config`` is an ``functools.lru_cache`` function; Bridge's own unit-test conftest calls
``read_run_config.cache_clear()`` and ``read_train_state.cache_clear()`` before and after every test, and user code
may too. A wrapper that drops ``cache_clear`` made whole files of Bridge's tests error in setup with the plugin
active. Bridge's test files are not in its wheel and CI reaches no source host, so the conftest's calls are made
here as it makes them, with the plugin active and deactivated, and every wrapper the plugin installed is compared
with the function it wraps.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_plugin.prewrap import CACHE_METHODS, STATE

#: Bridge's modules whose functions the plugin wraps (imported so that each wrapper is installed)
MODULES = ("megatron.bridge.training.utils.checkpoint_utils", "megatron.bridge.training.checkpointing",
           "megatron.bridge.models.model_provider", "megatron.bridge.utils.instantiate_utils",
           "megatron.bridge.training.optim", "megatron.bridge.training.setup",
           "megatron.core.distributed.finalize_model_grads")


def _import_all() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # a module this Bridge does not have is no wrapper to check
            continue


def _bridge_conftest_calls() -> None:
    """What Bridge's tests/unit_tests/conftest.py does around each test (its autouse cache fixture)."""
    from megatron.bridge.training.utils.checkpoint_utils import read_run_config, read_train_state

    read_run_config.cache_clear()
    read_train_state.cache_clear()


def _run_config(tmp_path: Path) -> Path:
    path = tmp_path / "run_config.yaml"
    path.write_text("model:\n  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider\n  num_layers: 2\n")
    return path


@pytest.mark.parametrize("active", [True, False], ids=["plugin-active", "plugin-deactivated"])
def test_bridges_cache_calls_work_and_the_reader_still_caches(cpu_bridge, tmp_path, active):
    _import_all()
    if not active:
        bfp.deactivate()
    try:
        from megatron.bridge.training.utils import checkpoint_utils

        assert bfp.is_active() is active
        wrapped = hasattr(checkpoint_utils.read_run_config, "__bridge_freeze_wrapped__")
        assert wrapped is active  # the case under test is the wrapper's, and deactivate gives Bridge's back
        _bridge_conftest_calls()
        path = str(_run_config(tmp_path))
        first = checkpoint_utils.read_run_config(path)
        second = checkpoint_utils.read_run_config(path)
        info = checkpoint_utils.read_run_config.cache_info()
        assert first is second and info.hits >= 1 and info.currsize >= 1  # Bridge's cache still caches
        checkpoint_utils.read_run_config.cache_clear()
        assert checkpoint_utils.read_run_config.cache_info().currsize == 0
        assert "maxsize" in checkpoint_utils.read_run_config.cache_parameters()
        _bridge_conftest_calls()
    finally:
        if not active:
            bfp.activate()


def test_every_installed_wrapper_has_all_its_original_had(cpu_bridge):
    _import_all()
    with STATE.lock:
        guarded = [(owner, name, original) for owner, names in STATE.guarded.items()
                   for name, original in names.items()]
    checked = set()
    for owner, name, original in guarded:
        installed = (owner.__dict__ if isinstance(owner, type) else vars(owner)).get(name)
        if installed is None or installed is original or not callable(original):
            continue  # not a function wrapper (a restored default, a class attribute)
        label = f"{getattr(owner, '__name__', owner)}.{name}"
        assert inspect.unwrap(installed, stop=lambda f, o=original: f is o) is original, label  # __wrapped__ leads back
        assert installed.__name__ == original.__name__ and installed.__doc__ == original.__doc__, label
        try:
            expected = inspect.signature(original)
        except (TypeError, ValueError):
            expected = None
        if expected is not None:
            assert inspect.signature(installed) == expected, label
        for method in CACHE_METHODS:
            assert hasattr(installed, method) == hasattr(original, method), (label, method)
        checked.add(label)
    # the wrappers this test exists for were among those checked (the list is the plugin's own record)
    assert {"checkpoint_utils.read_run_config", "model_provider.get_model"} <= {
        label.rsplit(".", 2)[-2] + "." + label.rsplit(".", 1)[-1] for label in checked}, sorted(checked)
    assert any(label.endswith("read_run_config") for label in checked)
    assert all(hasattr(importlib.import_module(MODULES[0]).read_run_config, m) for m in CACHE_METHODS)
