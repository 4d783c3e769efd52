"""All of the plugin's process-wide state, in one object that activation owns.

:data:`STATE` is the only mutable global of the plugin besides the family registry (which owns its
own state, :data:`bridge_freeze_plugin.registry.REGISTRY`). Everything activation changes on Bridge's
classes is recorded here, so :func:`bridge_freeze_plugin.deactivate` can undo it exactly; the record
survives ``importlib.reload`` of any plugin module because it lives in this module only and is not
re-created when this module is reloaded (see :func:`_shared_state`).

What the plugin writes onto Bridge objects, each named and documented:

- on a provider **class** of a registered family: ``provide`` / ``provide_distributed_model`` wrappers
  (each with ``__bridge_freeze_wrapped__``, the original function) and the three flags as descriptors
  defaulting to ``False``;
- on every other Bridge provider class: ``provide`` / ``provide_distributed_model`` guards (each with
  ``__bridge_freeze_guarded__``) that raise when one of the three flags is set, since no family covers it;
- on a provider **instance**: ``__bridge_freeze__`` (:class:`ProviderState`: the last report, whether
  the recompute warning was given);
- on a model **chunk**: ``__bridge_freeze__`` (:class:`ChunkState`: the selection applied, whether the
  report was logged).

Per-build state (which build is running, and its :class:`~bridge_freeze_plugin.build.context.BuildContext`)
is per thread and per call (:mod:`bridge_freeze_plugin.build.pipeline`), never stored on the provider.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The attribute name used on provider instances and model chunks.
ATTR = "__bridge_freeze__"


@dataclass
class ProviderState:
    """What the plugin keeps on one provider instance."""

    report: Any = None  # FreezeReport of the last build
    recompute_warned: bool = False


@dataclass
class ChunkState:
    """What the plugin keeps on one built model chunk."""

    selection: Any  # FreezeSelection
    family: str
    reported: bool = False


def provider_state(provider: Any) -> ProviderState:
    """The provider's :class:`ProviderState` (created on first use)."""
    state = provider.__dict__.get(ATTR)
    if not isinstance(state, ProviderState):
        state = ProviderState()
        object.__setattr__(provider, ATTR, state)
    return state


def chunk_state(chunk: Any) -> ChunkState | None:
    state = getattr(chunk, ATTR, None)
    return state if isinstance(state, ChunkState) else None


def set_chunk_state(chunk: Any, state: ChunkState) -> None:
    object.__setattr__(chunk, ATTR, state)


@dataclass
class PluginState:
    """The process-wide record of what activation did (and must undo)."""

    active: bool = False
    #: the user called ``deactivate()``: the autoload hook must not activate again on its own.
    deactivated_by_user: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: class -> {attribute name: original value in the class ``__dict__`` (or MISSING)}
    patched: dict[type, dict[str, Any]] = field(default_factory=dict)
    #: class (or module) -> {name: original}: guards on providers no family covers (a flag there raises),
    #: on Bridge's adapter-only exports and on Bridge's ``setup_optimizer`` (per-part learning-rate check)
    guarded: dict[Any, dict[str, Any]] = field(default_factory=dict)
    #: (function, parameter, original default), for ``__init__`` defaults patched in place
    init_defaults: list[tuple[Callable[..., Any], str, Any]] = field(default_factory=list)
    #: (class, flag, dataclass Field, original default): the field defaults set to False
    field_defaults: list[tuple[type, str, Any, Any]] = field(default_factory=list)
    #: (class, flag) -> the default the class declared before activation set it to False
    original_defaults: dict[tuple[type, str], bool] = field(default_factory=dict)
    #: provider class -> its generated freezable subclass (:func:`~bridge_freeze_plugin.make_freezable`)
    generated: dict[type, type] = field(default_factory=dict)


# A reload of this module (``importlib.reload``) runs it again in the same namespace: keep the objects
# made the first time, so the patch record and the MISSING marker stay the ones in use.
_previous = sys.modules[__name__].__dict__

#: Marks a value that was absent (an attribute not in a class ``__dict__``, say).
MISSING: Any = _previous.get("MISSING") or type("Missing", (), {"__repr__": lambda self: "<missing>"})()

#: The plugin's state. Only :mod:`bridge_freeze_plugin.activation` changes ``active`` and the patch records.
STATE: PluginState = _previous.get("STATE") or PluginState()
