"""Activation: every registered family's Bridge provider honours the flags, however it was made.

``activate()`` runs on ``import bridge_freeze_plugin`` and, for installed-only use, when a process
imports ``megatron.bridge`` (see ``_bridge_freeze_autoload``). For each provider class of each
registered family it installs, in place, once the class's module is imported:

- ``provide()`` and ``provide_distributed_model()`` wrappers with the same behaviour as
  :class:`~bridge_freeze_plugin.mixins.FreezableVLMProvider` (the freeze before the DDP wrap, the
  build-time guarantee after every pre-wrap hook, the report);
- ``False`` as the default of the three flags (Bridge's ``Qwen3VLMoEModelProvider`` defaults two of
  them to ``True``); the original defaults are remembered and named in the report.

So a provider constructed directly, returned by ``AutoBridge.to_megatron_provider()``, built by a
recipe, or a user's subclass all behave alike. ``deactivate()`` undoes everything (tests, opt-outs).
Third-party families come from the ``bridge_freeze_plugin.families`` entry-point group.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import MISSING
from types import ModuleType
from typing import Any

from _bridge_freeze_autoload import POST_IMPORT
from bridge_freeze_plugin.mixins.freezable import (
    ORIGINAL_DEFAULTS,
    FreezableVLMProvider,
    provide_distributed_frozen,
    provide_frozen,
)
from bridge_freeze_plugin.registry import REGISTRY, FamilySpec, load_entry_point_families
from bridge_freeze_plugin.report import is_rank0
from bridge_freeze_plugin.selection import FLAGS

logger = logging.getLogger("bridge_freeze_plugin")

_LOCK = threading.RLock()
_ACTIVE = False
_MISSING_ATTR = object()
#: class -> {attribute name: original value in the class __dict__ (or _MISSING_ATTR)}
_PATCHED: dict[type, dict[str, Any]] = {}
#: (function, flag) -> original default, for __init__ defaults patched in place
_INIT_DEFAULTS: list[tuple[Callable[..., Any], str, Any]] = []
_FIELD_DEFAULTS: list[tuple[Any, Any]] = []


def is_active() -> bool:
    return _ACTIVE


def patched_classes() -> list[type]:
    return list(_PATCHED)


def activate() -> None:
    """Make every registered family's providers honour the flags (idempotent, cheap, lazy)."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE:
            return
        _ACTIVE = True
    watch_registered_providers()


def watch_registered_providers() -> None:
    """Patch each registered provider class now or as soon as its module is imported."""
    load_entry_point_families()
    for spec in REGISTRY:
        _watch(spec)


def _watch(spec: FamilySpec) -> None:
    for path in spec.providers:
        module, _, qualname = path.partition(":")
        POST_IMPORT.watch(module, functools.partial(_patch_from_module, qualname=qualname))


def _on_register(spec: FamilySpec) -> None:
    """A family registered while the plugin is active (in code, or by an entry point) is patched too."""
    if _ACTIVE:
        _watch(spec)


REGISTRY.subscribe(_on_register)


def deactivate() -> None:
    """Undo every patch (classes, defaults) and stop watching imports."""
    global _ACTIVE
    with _LOCK:
        for cls, originals in _PATCHED.items():
            for name, value in originals.items():
                if value is _MISSING_ATTR:
                    if name in cls.__dict__:
                        delattr(cls, name)
                else:
                    setattr(cls, name, value)
        _PATCHED.clear()
        for func, flag, value in _INIT_DEFAULTS:
            _set_function_default(func, flag, value)
        _INIT_DEFAULTS.clear()
        for fld, value in _FIELD_DEFAULTS:
            fld.default = value
        _FIELD_DEFAULTS.clear()
        ORIGINAL_DEFAULTS.clear()
        _ACTIVE = False


def _patch_from_module(module: ModuleType, qualname: str) -> None:
    if not _ACTIVE:
        return
    obj: Any = module
    for attr in qualname.split("."):
        obj = getattr(obj, attr, None)
        if obj is None:
            if is_rank0():
                logger.warning("bridge-freeze: %s has no %s; that provider is not patched", module.__name__, qualname)
            return
    patch_provider_class(obj)


# ------------------------------------------------------------------------------------------------
# In-place class patches.
# ------------------------------------------------------------------------------------------------


def _wrap_provide(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def provide(self: Any, *args: Any, **kwargs: Any) -> Any:
        return provide_frozen(self, functools.partial(original, self), *args, **kwargs)

    provide.__bridge_freeze_wrapped__ = original  # type: ignore[attr-defined]
    return provide


def _wrap_provide_distributed(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def provide_distributed_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        return provide_distributed_frozen(self, functools.partial(original, self), *args, **kwargs)

    provide_distributed_model.__bridge_freeze_wrapped__ = original  # type: ignore[attr-defined]
    return provide_distributed_model


def patch_provider_class(cls: type) -> None:
    """Patch one provider class in place (idempotent). Subclasses inherit the wrappers."""
    with _LOCK:
        if cls in _PATCHED or issubclass(cls, FreezableVLMProvider):
            return
        originals: dict[str, Any] = {}
        for name, wrap in (("provide", _wrap_provide), ("provide_distributed_model", _wrap_provide_distributed)):
            current = getattr(cls, name)
            if getattr(current, "__bridge_freeze_wrapped__", None) is not None:
                continue  # inherited from an already patched base
            originals[name] = cls.__dict__.get(name, _MISSING_ATTR)
            setattr(cls, name, wrap(current))
        for flag in FLAGS:
            _default_flag_to_false(cls, flag, originals)
        _PATCHED[cls] = originals
        logger.debug("bridge-freeze: patched %s.%s", cls.__module__, cls.__qualname__)


def _default_flag_to_false(cls: type, flag: str, originals: dict[str, Any]) -> None:
    """Make ``False`` the default of ``flag`` on ``cls`` and its existing subclasses."""
    fields = getattr(cls, "__dataclass_fields__", {})
    fld = fields.get(flag)
    if fld is None or fld.default is MISSING or fld.default is False:
        return
    if flag in inspect.get_annotations(cls):
        ORIGINAL_DEFAULTS[(cls, flag)] = bool(fld.default)
    _FIELD_DEFAULTS.append((fld, fld.default))
    fld.default = False
    if flag in cls.__dict__:
        originals[flag] = cls.__dict__[flag]
        setattr(cls, flag, False)
    for klass in [cls, *_all_subclasses(cls)]:
        init = klass.__dict__.get("__init__")
        if init is not None and getattr(klass, "__dataclass_fields__", {}).get(flag) is fld:
            old = _set_function_default(init, flag, False)
            if old is not _MISSING_ATTR:
                _INIT_DEFAULTS.append((init, flag, old))


def _all_subclasses(cls: type) -> list[type]:
    found: list[type] = []
    stack = list(cls.__subclasses__())
    while stack:
        klass = stack.pop()
        found.append(klass)
        stack.extend(klass.__subclasses__())
    return found


def _set_function_default(func: Any, name: str, value: Any) -> Any:
    """Replace the default of parameter ``name`` of ``func``; returns the old one (or _MISSING_ATTR)."""
    code = func.__code__
    if func.__kwdefaults__ and name in func.__kwdefaults__:
        old = func.__kwdefaults__[name]
        func.__kwdefaults__ = {**func.__kwdefaults__, name: value}
        return old
    positional = code.co_varnames[: code.co_argcount]
    defaults = func.__defaults__ or ()
    if name not in positional:
        return _MISSING_ATTR
    index = positional.index(name) - (len(positional) - len(defaults))
    if index < 0:
        return _MISSING_ATTR
    old = defaults[index]
    func.__defaults__ = (*defaults[:index], value, *defaults[index + 1 :])
    return old


def import_provider_modules() -> None:
    """Import every registered provider module now (the patches are then in place at once)."""
    for spec in REGISTRY:
        for path in spec.providers:
            importlib.import_module(path.partition(":")[0])
