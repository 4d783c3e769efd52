"""The freezable subclasses :func:`~bridge_freeze_plugin.make_freezable` gives existing providers.

Each lives in THIS module under a public name that encodes the provider class it extends
(``FreezableQwen3VLModelProvider_<encoded import path>``), so pickle, ``copy``, multiprocessing and
Bridge's ``run_config.yaml`` (``_target_: bridge_freeze_plugin.mixins.generated.Freezable...``) can look
it up; in a fresh process, the module's ``__getattr__`` decodes the name, imports the provider class
and makes the subclass again.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

from bridge_freeze_plugin.state import STATE

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
    from bridge_freeze_plugin.provider import PLUGIN_CLASS_MARK

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


def __getattr__(name: str) -> Any:
    """Make a freezable subclass on demand from its encoded name (unpickling in a fresh process)."""
    base_name, sep, token = name.rpartition("_x")  # the encoded path never holds "_x"
    if not name.startswith(_PREFIX) or not sep:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, _, qualname = _decode(token).partition(":")
    obj: Any = importlib.import_module(module_name)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    if not isinstance(obj, type) or base_name != f"{_PREFIX}{obj.__name__}":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return freezable_class(obj)
