"""Saved provider configs this process read, so a build can say which flag values came from one (issue 35 item 1).

A run may build from a provider Bridge saved, not from its own settings: NeMo-RL reloads its conversion cache
(``<dir>/<model>/iter_0000000/run_config.yaml``) at every set-up, Bridge's ``load_model_config`` and resume read a
checkpoint's ``run_config.yaml``. Both read the file with Bridge's ``read_run_config`` (activation wraps it to call
:func:`record_saved`). The provider is then instantiated from it, and may be copied (NeMo-RL merges
``model_overrides`` with ``dataclasses.replace``) and have some fields set after: no attribute links the provider a
build sees to the file. What the build can know: a flag that is true on the provider, and true in a saved config
of the same provider class read by this process, may have come from that file (this run's settings may have set it
too; a fresh provider has it false, the plugin's default). The report says so per flag, and a WARNING names the
file (:func:`saved_flags`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.request import ALIASES, FLAGS

#: Bridge's reader of a saved run config: where it is defined, and the module that imports it by name (its
#: ``load_model_config`` looks the name up there at each call), as (module, name).
RUN_CONFIG_READERS = (("megatron.bridge.training.utils.checkpoint_utils", "read_run_config"),
                      ("megatron.bridge.training.checkpointing", "read_run_config"))
#: How many saved configs are remembered (the latest first wins).
_KEPT = 16


@dataclass(frozen=True)
class SavedConfig:
    """One saved provider config read by this process: its file, provider class path and flags set true."""

    path: str
    target: str
    true_flags: frozenset[str]


_SAVED: list[SavedConfig] = []
_LOCK = threading.Lock()


def record_saved(path: Any, config: Any) -> None:
    """Remember the flags a run config read from ``path`` holds true (its ``model`` section; aliases merged)."""
    model = config.get("model") if isinstance(config, Mapping) else None
    if not isinstance(model, Mapping) or not isinstance(model.get("_target_"), str):
        return
    true = {flag for flag in FLAGS if model.get(flag) is True}
    true |= {flag for alias, flag in ALIASES.items() if model.get(alias) is True}
    with _LOCK:
        _SAVED.insert(0, SavedConfig(str(path), model["_target_"], frozenset(true)))
        del _SAVED[_KEPT:]


def recording(read: Callable[..., Any]) -> Callable[..., Any]:
    """Bridge's ``read_run_config(filename)`` that also records what it read."""

    @functools.wraps(read)
    def read_run_config(run_config_filename: Any, *args: Any, **kwargs: Any) -> Any:
        config = read(run_config_filename, *args, **kwargs)
        record_saved(run_config_filename, config)
        return config

    read_run_config.__bridge_freeze_wrapped__ = read  # type: ignore[attr-defined]
    return read_run_config


def forget_saved() -> None:
    with _LOCK:
        _SAVED.clear()


def _paths(cls: type) -> set[str]:
    return {f"{k.__module__}.{k.__qualname__}" for k in cls.__mro__}


def saved_flags(provider: Any, true_flags: tuple[str, ...]) -> dict[str, str]:
    """flag -> the saved config file it may have come from, for each of ``true_flags`` (set on ``provider``) that
    the latest saved config of the provider's class read by this process also holds true."""
    paths = _paths(type(provider))
    with _LOCK:
        saved = next((s for s in _SAVED if s.target in paths), None)
    if saved is None:
        return {}
    return {flag: saved.path for flag in true_flags if flag in saved.true_flags}
