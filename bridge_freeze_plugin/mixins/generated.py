"""The freezable subclasses :func:`~bridge_freeze_plugin.make_freezable` gives existing providers.

Each lives in THIS module under a public name that encodes the provider class it extends
(``FreezableQwen3VLModelProvider_<encoded import path>``), so pickle, ``copy``, multiprocessing and
Bridge's ``run_config.yaml`` (``_target_: bridge_freeze_plugin.mixins.generated.Freezable...``) can look
it up; in a fresh process, the module's ``__getattr__`` decodes the name, imports the provider class
and makes the subclass again.

Bridge only instantiates ``_target_`` paths under allowed prefixes: this module's path is added to that
allowlist once Bridge's ``instantiate_utils`` is imported. A decoded name is honoured only for a provider
class that Bridge's own allowlist accepts or that a registered family names, so the allowance cannot be
used to reach any other class.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

from _bridge_freeze_autoload import POST_IMPORT
from bridge_freeze_plugin.prewrap import STATE

#: Bridge's module that validates and instantiates ``_target_`` paths.
_BRIDGE_INSTANTIATE = "megatron.bridge.utils.instantiate_utils"

_PREFIX = "Freezable"
#: Reversible escapes: the encoded import path uses only letters, digits and "_".
_ESCAPES = (("_", "_u"), (".", "_d"), (":", "_c"))


def _encode(path: str) -> str:
    for char, escape in _ESCAPES:
        path = path.replace(char, escape)
    return path


def _decode(token: str) -> str:
    out, i = [], 0
    reverse = {escape[1]: char for char, escape in _ESCAPES}
    while i < len(token):
        if token[i] == "_" and i + 1 < len(token) and token[i + 1] in reverse:
            out.append(reverse[token[i + 1]])
            i += 2
        else:
            out.append(token[i])
            i += 1
    return "".join(out)


def class_name(cls: type) -> str:
    """The public name of ``cls``'s freezable subclass in this module."""
    return f"{_PREFIX}{cls.__name__}_x{_encode(f'{cls.__module__}:{cls.__qualname__}')}"


def freezable_class(cls: type) -> type:
    """The (cached) dataclass ``FreezableVLMProvider`` subclass of a provider class."""
    from bridge_freeze_plugin.mixins.freezable import FreezableVLMProvider
    from bridge_freeze_plugin.prewrap import PLUGIN_CLASS_MARK

    if issubclass(cls, FreezableVLMProvider):
        return cls
    generated = STATE.generated.get(cls)
    if generated is None:
        name = class_name(cls)
        namespace = {"__module__": __name__, PLUGIN_CLASS_MARK: True,
                     "__doc__": f"{cls.__name__} with bridge-freeze-plugin's FreezableVLMProvider."}
        generated = dataclasses.dataclass(type(name, (FreezableVLMProvider, cls), namespace))
        generated.__qualname__ = name
        STATE.generated[cls] = generated
        setattr(sys.modules[__name__], name, generated)
    return generated


def _may_extend(path: str) -> bool:
    """Whether a decoded ``module:QualName`` may be imported: a registered provider, or Bridge allows it."""
    from bridge_freeze_plugin.families import REGISTRY

    if any(path in spec.providers for spec in REGISTRY):
        return True
    instantiate_utils = sys.modules.get(_BRIDGE_INSTANTIATE)
    allowlist = getattr(instantiate_utils, "target_allowlist", None)
    dotted = path.replace(":", ".")
    return allowlist is not None and not dotted.startswith(__name__) and bool(allowlist.is_allowed(dotted))


def __getattr__(name: str) -> Any:
    """Make a freezable subclass on demand from its encoded name (unpickling in a fresh process)."""
    base_name, sep, token = name.rpartition("_x")  # the encoded path never holds "_x"
    path = _decode(token) if sep else ""
    if not name.startswith(_PREFIX) or not _may_extend(path):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    if not isinstance(obj, type) or base_name != f"{_PREFIX}{obj.__name__}" or not callable(
        getattr(obj, "provide", None)
    ):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (not a model provider class)")
    return freezable_class(obj)


#: The plugin's classes a Bridge ``run_config.yaml`` may name as ``_target_``: these freezable subclasses, and
#: the per-part learning-rate provider (``optimizer_config_override_provider``).
ALLOWED_TARGET_PREFIXES = (__name__ + ".", "bridge_freeze_plugin.optim._bridge.")


def _allow_in_bridge_targets(module: Any) -> None:
    register = getattr(module, "register_allowed_target_prefix", None)
    if register is not None:
        for prefix in ALLOWED_TARGET_PREFIXES:
            register(prefix)


def allow_targets() -> None:
    """Let Bridge's ``instantiate`` build the plugin's classes (now, or once Bridge's module is imported)."""
    POST_IMPORT.watch(_BRIDGE_INSTANTIATE, _allow_in_bridge_targets)


def disallow_targets() -> None:
    """Take the plugin's prefixes off Bridge's ``_target_`` allowlist again (``deactivate()``)."""
    module = sys.modules.get(_BRIDGE_INSTANTIATE)
    if module is None:
        return
    prefixes = getattr(module, "_ALLOWED_TARGET_PREFIXES", None)
    allowlist = getattr(module, "target_allowlist", None)
    for prefix in ALLOWED_TARGET_PREFIXES:
        if isinstance(prefixes, set):
            prefixes.discard(prefix)
        if allowlist is not None and prefix in allowlist.allowed_prefixes:
            allowlist.remove_prefix(prefix)


allow_targets()
