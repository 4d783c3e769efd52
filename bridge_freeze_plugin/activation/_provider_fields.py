"""The plugin's settings as dataclass fields of every patched provider class.

The plugin reads from a provider every flag of the vocabulary (:mod:`.parts`; Bridge's own fields where Bridge
declares them: the vision-language flags on a VLM provider, ``freeze_audio_model`` on Qwen2-Audio...) and
:data:`PLUGIN_FIELDS`: the train / freeze patterns, ``full_recompute_policy``, the run-time audit's
``audit_steps`` / ``audit_strict`` and ``save_trainable_only`` (checkpoints of what trains). A flag the class does not
declare is added as a field too (:data:`FLAG_FIELDS`; its class attribute, the flag descriptor, is left alone).
Whatever it reads must round-trip through everything Bridge
does with a provider: ``dataclasses.fields`` / ``asdict`` / ``replace``, ``ConfigContainer.to_cfg_dict`` ->
``run_config.yaml`` -> Bridge's ``instantiate`` on resume. So activation adds them to each patched class as
real fields (in ``__dataclass_fields__``, with class defaults), and gives the class's ``__init__`` keyword
parameters for them (its ``__signature__`` says so, which is what Bridge's lenient ``instantiate`` reads).
A ``run_config.yaml`` written with the plugin still loads without it, in STRICT mode too (NeMo-RL's): the
serialiser leaves out a field holding its default and a flag the class does not declare while false
(:mod:`._serialised`); what is set is written, and only Bridge's lenient ``instantiate`` takes it without the
plugin (it drops the keys with a warning).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from bridge_freeze_plugin.prewrap import keeps
from bridge_freeze_plugin.request import DEFAULT_STEPS, FLAGS


@dataclasses.dataclass
class PluginFields:
    """The source of the field definitions (and the defaults) added to patched provider classes."""

    #: patterns refining the flags per parameter (see :class:`~bridge_freeze_plugin.FreezeSelection`)
    train_patterns: tuple[str, ...] = ()
    freeze_patterns: tuple[str, ...] = ()
    #: what a full activation recompute that breaks gradients on this family gets: "fix" or "refuse"
    full_recompute_policy: str = "fix"
    #: its former name (it also covers Ernie's language model, not only vision towers): still read, ``None``
    #: unset; a run_config.yaml written before the rename has it
    vision_recompute_policy: str | None = None
    #: the run-time audit: how many optimizer steps (0: off), and whether a trainable tensor without gradient raises
    audit_steps: int = DEFAULT_STEPS
    audit_strict: bool = False
    #: checkpoints keep only the trainable parameters (and their optimizer state), the frozen base coming from
    #: ``checkpoint.pretrained_checkpoint``, as a PEFT run's do (:mod:`bridge_freeze_plugin.stages`)
    save_trainable_only: bool = False


#: name -> the dataclass Field (shared, never mutated) and its default.
PLUGIN_FIELDS: dict[str, dataclasses.Field[Any]] = dict(PluginFields.__dataclass_fields__)  # type: ignore[arg-type]

#: Every flag as a field (default ``False``), for the classes that do not declare it.
FLAG_FIELDS: dict[str, dataclasses.Field[Any]] = dict(
    dataclasses.make_dataclass("FlagFields", [(flag, bool, False) for flag in FLAGS]).__dataclass_fields__)
#: Undo marker: only the field entry was added (the class attribute is the flag's descriptor, undone elsewhere).
_FIELD_ONLY: Any = type("_FieldOnly", (), {"__repr__": lambda self: "<field only>"})()


def add_fields(cls: type) -> dict[str, Any]:
    """Add the plugin's fields to dataclass ``cls`` (in place); what to undo (see :func:`remove_fields`)."""
    own = cls.__dict__.get("__dataclass_fields__")
    if own is None:
        return {}
    undo: dict[str, Any] = {}
    for name, fld in FLAG_FIELDS.items():
        if name not in own:
            undo[name] = _FIELD_ONLY
            own[name] = fld
    for name, fld in PLUGIN_FIELDS.items():
        if name in own:
            continue
        undo[name] = cls.__dict__.get(name, _MISSING)
        own[name] = fld
        setattr(cls, name, fld.default)
    init = cls.__dict__.get("__init__")
    if undo and callable(init) and not hasattr(init, "__bridge_freeze_init__"):
        undo["__init__"] = init
        cls.__init__ = accepting_plugin_fields(init)  # type: ignore[misc]
    return undo


def remove_fields(cls: type, undo: dict[str, Any]) -> None:
    own = cls.__dict__.get("__dataclass_fields__", {})
    for name, value in undo.items():
        if name == "__init__":
            cls.__init__ = value  # type: ignore[misc]
            continue
        own.pop(name, None)
        if value is _FIELD_ONLY:
            continue
        if value is _MISSING:
            if name in cls.__dict__:
                delattr(cls, name)
        else:
            setattr(cls, name, value)


def accepting_plugin_fields(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` that also takes the plugin's fields (and the flags it does not take) as keyword arguments, and
    says so in its signature."""
    signature = inspect.signature(init)
    added = {name: fld for name, fld in {**FLAG_FIELDS, **PLUGIN_FIELDS}.items() if name not in signature.parameters}

    @keeps(init, mark=False)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        extra = {name: kwargs.pop(name) for name in added if name in kwargs}
        init(self, *args, **kwargs)
        for name, value in extra.items():
            setattr(self, name, value)

    params = list(signature.parameters.values())
    var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=fld.default)
               for name, fld in added.items()]
    __init__.__signature__ = signature.replace(parameters=params + var_kw)  # type: ignore[attr-defined]
    __init__.__bridge_freeze_init__ = init  # type: ignore[attr-defined]
    return __init__


_MISSING: Any = type("_Missing", (), {"__repr__": lambda self: "<missing>"})()
