"""Saved provider configs this process read, so a build can say which flag values came from one (issue 35 item 1).

A run may build from a provider Bridge saved, not from its own settings: NeMo-RL reloads its conversion cache
(``<dir>/<model>/iter_0000000/run_config.yaml``) at every set-up, Bridge's ``load_model_config`` reads a
checkpoint's ``run_config.yaml``. Both read the file with Bridge's ``read_run_config`` (activation wraps it to call
:func:`record_saved`) and instantiate the provider from its ``model`` section with Bridge's ``instantiate``
(activation wraps it too: :func:`instantiating` marks the provider made from a recorded section with its file,
:mod:`._origins`). A Bridge resume reads the file only to compare parallel sizes: its provider is the run's own, not
marked. The mark follows the provider through ``dataclasses.replace`` (NeMo-RL merges ``model_overrides`` so); a
provider copied otherwise (``copy.copy``, ``deepcopy``, pickling) has no record, and only for such a provider is a
true flag attributed by class, to the latest saved config of its class read by this process (:func:`saved_flags`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.prewrap._wrapping import keeps
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
    #: flag -> the value the file holds (aliases merged), for each flag it writes
    values: tuple[tuple[str, bool], ...] = ()
    #: the ``model`` section as read (by identity: the mapping Bridge instantiates the provider from)
    model: Any = field(default=None, compare=False, repr=False)


_SAVED: list[SavedConfig] = []
_LOCK = threading.Lock()
#: Called with (path, config) after each config Bridge's reader returns (``stages``: the resume's selection check).
_READ_LISTENERS: list[Callable[[Any, Any], None]] = []


def on_saved_read(listener: Callable[[Any, Any], None]) -> None:
    """Call ``listener(path, config)`` after each saved run config Bridge's ``read_run_config`` returns (once)."""
    with _LOCK:
        if listener not in _READ_LISTENERS:
            _READ_LISTENERS.append(listener)


def record_saved(path: Any, config: Any) -> None:
    """Remember the flags a run config read from ``path`` holds true (its ``model`` section; aliases merged)."""
    model = config.get("model") if isinstance(config, Mapping) else None
    if not isinstance(model, Mapping) or not isinstance(model.get("_target_"), str):
        return
    values = {flag: model[flag] for flag in FLAGS if isinstance(model.get(flag), bool)}
    values.update({flag: True for alias, flag in ALIASES.items() if model.get(alias) is True})
    true = frozenset(flag for flag, value in values.items() if value)
    with _LOCK:
        _SAVED.insert(0, SavedConfig(str(path), model["_target_"], true, tuple(sorted(values.items())), model))
        del _SAVED[_KEPT:]


def saved_for_model(section: Any) -> SavedConfig | None:
    """The saved config whose ``model`` section is ``section`` itself (the mapping read), if one was recorded."""
    with _LOCK:
        return next((s for s in _SAVED if s.model is section), None)


def recording(read: Callable[..., Any]) -> Callable[..., Any]:
    """Bridge's ``read_run_config(filename)`` that also records what it read."""

    @keeps(read)
    def read_run_config(run_config_filename: Any, *args: Any, **kwargs: Any) -> Any:
        config = read(run_config_filename, *args, **kwargs)
        record_saved(run_config_filename, config)
        with _LOCK:
            listeners = list(_READ_LISTENERS)
        for listener in listeners:  # a listener may refuse what was read (it raises)
            listener(run_config_filename, config)
        return config

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
