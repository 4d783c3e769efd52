"""The flags as data descriptors, so a build can hide them from Bridge's own ``provide()``.

Bridge's VLM providers call their model's own ``freeze()`` inside ``provide()`` when a flag is set; that
freeze leaves gaps in some vision towers and prints one line per parameter on Nemotron-VL. The plugin
applies its own freeze instead, so while the plugin builds from a provider, Bridge's ``provide()`` must
read the flags as ``False``.

:class:`FlagField` does that per thread and per provider: inside :func:`flags_hidden`, reads of the flags
of THAT provider on THAT thread give ``False``; every other thread, and every other provider, sees the
stored values. Nothing on the provider is changed. Values live in the instance ``__dict__`` under the
flag's own name, so pickling, ``copy`` and ``dataclasses`` behave as with a plain field.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any

from bridge_freeze_plugin.prewrap._origins import note_set

_LOCAL = threading.local()


def _hidden() -> dict[int, int]:
    hidden = getattr(_LOCAL, "hidden", None)
    if hidden is None:
        hidden = _LOCAL.hidden = {}
    return hidden


@contextlib.contextmanager
def flags_hidden(provider: Any) -> Iterator[None]:
    """On this thread, the provider's flags read ``False`` until the block ends (re-entrant)."""
    hidden = _hidden()
    key = id(provider)
    hidden[key] = hidden.get(key, 0) + 1
    try:
        yield
    finally:
        hidden[key] -= 1
        if not hidden[key]:
            del hidden[key]


class FlagField:
    """A freeze flag on a provider class: the stored value, or ``False`` while a build hides it."""

    def __init__(self, default: bool = False, name: str = "") -> None:
        self.default = default
        self.name = name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self.default  # class access: the default (what dataclasses reads as the field default)
        if id(obj) in _hidden():
            return False
        return obj.__dict__.get(self.name, self.default)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = value
        note_set(obj, self.name, value)  # where the value came from, for the report (:mod:`._origins`)

    def __repr__(self) -> str:
        return f"<bridge-freeze flag {self.name} (default {self.default})>"


def with_flag_fields(cls: type) -> type:
    """Give a class body (before ``@dataclass``) one :class:`FlagField` per flag of the vocabulary, as fields."""
    from bridge_freeze_plugin.request import FLAGS

    cls.__annotations__ = {**dict.fromkeys(FLAGS, "bool"), **inspect.get_annotations(cls)}
    for flag in FLAGS:
        setattr(cls, flag, FlagField(False, flag))
    return cls
