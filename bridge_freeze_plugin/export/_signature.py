"""Calls into Megatron-Bridge that adapt to the signature they find.

Bridge's keyword arguments come and go between the commits its users pin: ``weight_dtype`` on
``MegatronModelBridge.build_conversion_tasks`` and on ``WeightConversionTask`` is in 0.6.2 and main (0.7.0) and
not in the 0.6.0-era commit SkyRL pins (91a15142). Each callable's signature is read once
(:func:`inspect.signature`) and a call passes only the keywords it takes; the caller decides what a keyword left
out means (the trainable export refuses a ``weight_dtype`` it cannot honour, the plan sizes the dtype itself).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["accepts", "bridge_version", "call_accepted"]

_PACKAGE_INFO = "megatron.bridge.package_info"

#: the underlying function -> the keyword names it takes, or None when it takes any (``**kwargs``)
_TAKES: dict[Any, frozenset[str] | None] = {}


def _key(func: Callable[..., Any]) -> Any:
    return getattr(func, "__func__", func)  # a bound method: its function (one entry per class's override)


def _keywords(func: Callable[..., Any]) -> frozenset[str] | None:
    key = _key(func)
    if key not in _TAKES:
        try:
            parameters = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):  # no signature to read (a builtin): pass everything, as before
            _TAKES[key] = None
        else:
            if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
                _TAKES[key] = None
            else:
                _TAKES[key] = frozenset(p.name for p in parameters if p.kind in (
                    inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))
    return _TAKES[key]


def accepts(func: Callable[..., Any], keyword: str) -> bool:
    """Whether ``func`` takes ``keyword`` (by name, or through ``**kwargs``)."""
    takes = _keywords(func)
    return takes is None or keyword in takes


def call_accepted(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` with the keywords ``func`` does not take left out (logged at DEBUG)."""
    takes = _keywords(func)
    if takes is not None:
        dropped = sorted(name for name in kwargs if name not in takes)
        if dropped:
            logger.debug("%s takes no %s on this Megatron-Bridge: left out",
                         getattr(func, "__qualname__", func), ", ".join(dropped))
            kwargs = {name: value for name, value in kwargs.items() if name in takes}
    return func(*args, **kwargs)


def bridge_version() -> tuple[str, tuple[int, int, int] | None]:
    """Bridge's version as it names itself (``package_info``; the installed distribution's metadata would be the
    venv's even when a source tree shadows it) and its (major, minor, patch), or None when unreadable."""
    try:
        info: Any = importlib.import_module(_PACKAGE_INFO)
    except Exception:  # noqa: BLE001 - no Bridge, or one without package_info: unknown
        return "unknown", None
    version = getattr(info, "VERSION", None)
    text = ".".join(str(v) for v in version[:3]) + "".join(str(v) for v in version[3:]) if version else str(
        getattr(info, "__version__", "unknown"))
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return text, (tuple(int(g) for g in found.groups()) if found else None)  # type: ignore[return-value]
