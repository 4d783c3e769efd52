"""All of the plugin's process-wide state, in one object that activation owns.

:data:`STATE` is the only mutable global of the plugin besides the family registry (which owns its
own state, :data:`bridge_freeze_plugin.registry.REGISTRY`). Everything activation changes on Bridge's
classes is recorded here, so :func:`bridge_freeze_plugin.deactivate` can undo it exactly; the record
survives ``importlib.reload`` of any plugin module because it lives in this module only and is not
re-created when this module is reloaded (see :func:`_shared_state`).

What the plugin writes onto Bridge objects, each named and documented:

- on a provider **class** of a registered family: ``provide`` / ``provide_distributed_model`` wrappers
  (each with ``__bridge_freeze_wrapped__``, the original function) and the flags as descriptors
  defaulting to ``False``;
- on every other Bridge provider class: ``provide`` / ``provide_distributed_model`` guards (each with
  ``__bridge_freeze_guarded__``) that raise when a flag is set, since no family covers it;
- on a **parameter**: ``bridge_freeze_part``, its part's name (Megatron's own convention for parameter
  marks, like ``allreduce`` or ``is_embedding_or_output_parameter``; ``state_dict()``, ``sharded_state_dict()``
  and exports carry tensors, never these attributes);
- on a provider **instance**, besides the flags it was given: ``moe_router_bias_update_rate = 0.0`` (Bridge's own
  config field) when a megatron-core without ``frozen_expert_bias`` would move the expert bias of routers the
  selection freezes, all of them (``prewrap/_freeze.py``, ``freeze_expert_biases``).

No state of the plugin's is kept on a provider **instance** or a model **chunk**. A Bridge provider *is* its model's
config: Bridge copies it (``copy.copy``, ``deepcopy``), pickles it, walks its ``__dict__``
(``remove_non_pickleables`` during HF export, ``to_cfg_dict`` for ``run_config.yaml``), compares and prints it.
So what the plugin remembers per provider (:class:`ProviderState`: the last report, whether the recompute
warning was given) and per chunk (:class:`ChunkState`: the selection applied, whether the report was
logged) lives in :class:`IdentityTable` side tables here, keyed by the object's identity and dropped when
the object is garbage-collected. A copy of a provider is a new provider with no report yet.

Per-build state (which build is running, and its :class:`~bridge_freeze_plugin.prewrap._context.BuildContext`)
is per thread and per call (:mod:`bridge_freeze_plugin.prewrap._pipeline`), never stored on the provider.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProviderState:
    """What the plugin keeps for one provider instance (in :data:`PROVIDERS`, never on the provider)."""

    report: Any = None  # FreezeReport of the last build
    recompute_warned: bool = False
    #: builds wrapped for training that made their report (a further one is another model: NeMo-RL's reference)
    training_builds: int = 0


@dataclass(frozen=True)
class TrainingBuild:
    """A model the plugin built for training, as its listeners get it (bare chunks, before Float16Module and DDP)."""

    provider: Any
    chunks: list[Any]
    classifier: Any  # Classifier: each parameter's part, by identity
    context: Any  # BuildContext
    report: Any  # the model-wide FreezeReport


@dataclass
class ChunkState:
    """What the plugin keeps for one built model chunk (in :data:`CHUNKS`, never on the chunk)."""

    selection: Any  # FreezeSelection
    family: str
    reported: bool = False
    #: ids of the trainable parameters whose optimizer group has learning rate 0 all along (max and min), recorded
    #: when the plugin's per-part overrides are built (``optim``): the run-time audit treats them like frozen ones
    zero_lr: frozenset[int] = frozenset()
    #: part name -> the learning-rate key that set it to 0 (for the audit's note)
    zero_lr_parts: tuple[str, ...] = ()


class IdentityTable:
    """Values keyed by an object's identity, forgotten when the object is garbage-collected.

    Unlike ``weakref.WeakKeyDictionary`` it needs no ``__hash__`` / ``__eq__`` (a dataclass provider has
    ``__eq__`` by value and no hash; two equal providers are still two providers).
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[Any], Any]] = {}
        # Reentrant: a key's weakref callback can run inside ``set`` on the same thread (a garbage collection at
        # the builtin call there, or the replaced value being the last holder of another key); a plain lock
        # deadlocks there for good.
        self._lock = threading.RLock()

    def get(self, obj: Any) -> Any:
        entry = self._entries.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None

    def set(self, obj: Any, value: Any) -> None:
        key = id(obj)

        def forget(ref: weakref.ref[Any], key: int = key) -> None:
            with self._lock:
                if key in self._entries and self._entries[key][0] is ref:
                    del self._entries[key]

        with self._lock:
            self._entries[key] = (weakref.ref(obj, forget), value)

    def __len__(self) -> int:
        return len(self._entries)


def provider_state(provider: Any) -> ProviderState:
    """The provider's :class:`ProviderState` (created on first use)."""
    state = STATE.providers.get(provider)
    if state is None:
        state = ProviderState()
        STATE.providers.set(provider, state)
    return state


def on_training_build(listener: Callable[[TrainingBuild], None]) -> None:
    """Call ``listener`` after every build wrapped for training (once per listener, however often registered)."""
    if listener not in STATE.build_listeners:
        STATE.build_listeners.append(listener)


def chunk_state(chunk: Any) -> ChunkState | None:
    state = STATE.chunks.get(chunk)
    return state if isinstance(state, ChunkState) else None


def set_chunk_state(chunk: Any, state: ChunkState) -> None:
    STATE.chunks.set(chunk, state)


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
    #: class -> what ``activation._provider_fields.add_fields`` added (patterns, policy fields)
    fields_added: dict[type, dict[str, Any]] = field(default_factory=dict)
    #: provider classes no family covers whose own freeze was let run (said once per class)
    left_to_bridge: set[type] = field(default_factory=set)
    #: provider instance -> :class:`ProviderState`; model chunk -> :class:`ChunkState` (by identity)
    providers: IdentityTable = field(default_factory=IdentityTable)
    chunks: IdentityTable = field(default_factory=IdentityTable)
    #: provider instance -> where its flags' values came from (``prewrap._origins``), by identity
    flag_origins: IdentityTable = field(default_factory=IdentityTable)
    #: called with a :class:`TrainingBuild` after each build wrapped for training (the run-time audit arms there)
    build_listeners: list[Callable[[Any], None]] = field(default_factory=list)


# A reload of this module (``importlib.reload``) runs it again in the same namespace: keep the objects
# made the first time, so the patch record and the MISSING marker stay the ones in use.
_previous = sys.modules[__name__].__dict__

#: Marks a value that was absent (an attribute not in a class ``__dict__``, say).
MISSING: Any = _previous.get("MISSING") or type("Missing", (), {"__repr__": lambda self: "<missing>"})()

#: The plugin's state. Only :mod:`bridge_freeze_plugin.activation` changes ``active`` and the patch records.
STATE: PluginState = _previous.get("STATE") or PluginState()
