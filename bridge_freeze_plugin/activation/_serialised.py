"""What the plugin changes in Bridge's saved configs, and which loads of them it watches (issue 46 items 5 and 10).

Writing. Bridge writes a provider into ``run_config.yaml`` by walking ``dataclasses.fields`` (its
``_ConfigContainerBase._convert_value_to_dict``; a provider's own ``to_cfg_dict`` goes through the same call), so
the fields the plugin adds to a patched class (:mod:`._provider_fields`) are written too. A file holding them does
not load where the plugin is absent (or opted out with ``BRIDGE_FREEZE_DISABLE_AUTOLOAD=1``) in STRICT mode:
NeMo-RL read its conversion cache with ``ConfigContainer.from_yaml(path, mode=InstantiationMode.STRICT)``, which
raises ``InstantiationException: Unexpected config keys``. So the serialiser is wrapped to leave out what a run
without the plugin would not have written and a run with it does not need: a plugin field holding its default
(the patterns empty, ``full_recompute_policy: fix``, ``vision_recompute_policy: null``, the audit's defaults) and a
flag the provider's own class does not declare, while false; and ``cfg.peft`` when it is the ``TrainableOnlyPEFT``
that ``save_trainable_only`` set (``peft: null``: the model section's ``save_trainable_only: true`` sets it again when
the config is validated; check-config and Bridge's adapter tools see no PEFT). What is set is written (a pattern, a
policy, a flag true): it is what the run asked for, and a load that drops it would train another set. Bridge's own
fields (a flag its class declares) are written as Bridge writes them.

Reading. NeMo-RL (before July 2026) loaded that cache with megatron-core's ``ConfigContainer.from_yaml``, which
reads the file itself and instantiates the whole container, not through Bridge's ``read_run_config`` /
``instantiate`` that the plugin watches: ``from_yaml`` and the ``from_dict`` it calls are wrapped too
(``prewrap.reading_file`` / ``prewrap.loading_container``), so the provider it returns is marked with its file.
Each original is kept in ``STATE.guarded`` for ``deactivate()``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from bridge_freeze_plugin.activation._provider_fields import PLUGIN_FIELDS
from bridge_freeze_plugin.prewrap import STATE, declared_default, keeps, loading_container, reading_file
from bridge_freeze_plugin.request import FLAGS
from bridge_freeze_plugin.stages import is_trainable_only_peft

#: Bridge's serialiser of configs (``ConfigContainer`` and every nested config go through it), as (module, class).
SERIALISER = ("megatron.bridge.training.utils.config_utils", "_ConfigContainerBase")
_CONVERT = "_convert_value_to_dict"
#: The container loaders watched, each on the first class of the serialiser's MRO that defines it.
_LOADERS: tuple[tuple[str, Callable[[Callable[..., Any]], Callable[..., Any]]], ...] = (
    ("from_yaml", reading_file), ("from_dict", loading_container))


def _holds_default(value: Any, default: Any) -> bool:
    if isinstance(default, tuple):  # the patterns: a list or a tuple, empty
        return isinstance(value, list | tuple) and len(value) == 0
    return type(value) is type(default) and value == default


def unset_plugin_fields(provider: Any) -> list[str]:
    """The plugin's fields of ``provider`` a saved config leaves out: those holding their default, and the flags its
    class does not declare (Bridge's classes; the plugin's mixin ignored) while false."""
    unset = [name for name, fld in PLUGIN_FIELDS.items() if _holds_default(getattr(provider, name, fld.default),
                                                                          fld.default)]
    cls = type(provider)
    unset += [flag for flag in FLAGS if declared_default(cls, flag) is None and getattr(provider, flag, False) is False]
    return unset


def _has_plugin_fields(value: Any) -> bool:
    fields = getattr(type(value), "__dataclass_fields__", None)
    return isinstance(fields, dict) and PLUGIN_FIELDS.keys() <= fields.keys()


def _leaving_unset_out(convert: Callable[..., Any]) -> Callable[..., Any]:
    """Bridge's ``_convert_value_to_dict(cls, value)`` that leaves a provider's unset plugin fields out."""

    @keeps(convert)
    def _convert_value_to_dict(cls: Any, value: Any) -> Any:
        if is_trainable_only_peft(value):  # what save_trainable_only set: the config the user wrote had no PEFT
            return None
        result = convert(cls, value)
        if isinstance(result, dict) and _has_plugin_fields(value):
            for name in unset_plugin_fields(value):
                result.pop(name, None)
        return result

    return _convert_value_to_dict


def _wrap_classmethod(owner: type, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    current = vars(owner).get(name)
    func = getattr(current, "__func__", None)
    if not isinstance(current, classmethod) or func is None or hasattr(func, "__bridge_freeze_wrapped__"):
        return
    STATE.guarded.setdefault(owner, {})[name] = current
    setattr(owner, name, classmethod(wrap(func)))


def watch_saved_configs(module: ModuleType) -> None:
    """Bridge's config serialiser leaves the unset plugin fields out; its container loads mark their provider."""
    container = getattr(module, SERIALISER[1], None)
    if not isinstance(container, type) or not STATE.active:
        return
    with STATE.lock:
        _wrap_classmethod(container, _CONVERT, _leaving_unset_out)
        for name, wrap in _LOADERS:
            owner = next((klass for klass in container.__mro__ if name in vars(klass)), None)
            if owner is not None:
                _wrap_classmethod(owner, name, wrap)
