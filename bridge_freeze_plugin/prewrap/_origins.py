"""Where each flag's value on a provider came from: this run's setting, the provider's default, or a saved config.

Issue 35 item 1: a run may build from a provider Bridge saved (NeMo-RL's conversion cache, a checkpoint's
``run_config.yaml``), so "your config wins over any provider default" needs saying flag by flag. What the plugin
knows, per provider instance (a record in ``STATE.flag_origins``, by identity; nothing is written on the provider):

- every flag of a patched class is a :class:`~._flags.FlagField`, so every write of it comes here
  (:func:`note_set`): the constructor writes each flag once, a later write is a setting (the user's code, a trainer
  writing its config: NeMo-RL's copied ``freeze_*`` keys, SkyRL's flags);
- a provider Bridge's ``instantiate`` makes from a saved ``model`` section that ``read_run_config`` returned is
  marked with that file, flag by flag (:func:`instantiating`); so is the ``model`` of a container that
  ``ConfigContainer.from_yaml`` loads (:func:`reading_file`, :func:`loading_container`: NeMo-RL's conversion cache
  was read so, in STRICT mode, before NeMo-RL moved to Bridge's ``load_model_config``);
- a provider made by ``dataclasses.replace(source, ...)`` (NeMo-RL's ``model_overrides``) takes the source's marks,
  found on the stack when its constructor writes its first flag; a flag whose value the replace changed is a
  setting (an override equal to the saved value reads as saved: the two cannot be told apart).

At report time a mark holds while the flag still has the marked value (a marked flag whose value changed without a
write after construction was changed by the replace: a setting); a flag without a mark is the default when it
has the class default (``False``: the plugin's default, whatever Bridge's class declares), else a setting (a
keyword to the constructor). A provider with no record (copied with ``copy``, ``deepcopy`` or pickling, or made
before activation) falls back to :func:`~._saved.saved_flags`: a true flag that the latest saved config of its
class read by this process holds true, said as such.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.prewrap._provider import declared_default
from bridge_freeze_plugin.prewrap._saved import SavedConfig, record_saved, saved_flags, saved_for_model
from bridge_freeze_plugin.prewrap._state import STATE
from bridge_freeze_plugin.prewrap._wrapping import keeps

#: Bridge's ``instantiate`` (``load_model_config`` imports it from here at each call), as (module, name).
INSTANTIATE = ("megatron.bridge.utils.instantiate_utils", "instantiate")

#: ``dataclasses.replace`` (3.12) and ``_replace`` (3.13+, through ``__replace__``): code -> its source argument.
_REPLACE_CODES = {code: arg for name, arg in (("replace", "obj"), ("_replace", "self"))
                  if (code := getattr(getattr(dataclasses, name, None), "__code__", None)) is not None}
#: How far up the stack from a flag's first write the replace that made the provider may be.
_DEPTH = 8


class Source(enum.Enum):
    SETTING = "setting"
    DEFAULT = "default"
    SAVED = "saved"


@dataclass(frozen=True)
class FlagOrigin:
    """One flag's value on a built provider and where it came from."""

    flag: str
    value: bool
    source: Source
    #: the saved config's file (``Source.SAVED``)
    path: str | None = None
    #: the default the provider's own class declares (Bridge's), ``None`` when it declares none
    declared: bool | None = None
    #: ``Source.SAVED`` by the provider's class only: the provider has no record (a copy), see the module doc
    by_class: bool = False

    def line(self) -> str:
        """``freeze_vision_model=true: this run's setting``: one report line."""
        head = f"{self.flag}={str(self.value).lower()}: "
        if self.source is Source.SAVED and self.by_class:
            return head + (f"as in the saved config {self.path} of this provider class read by this process (this "
                           "provider is a copy whose origin is unknown; a fresh provider has false)")
        if self.source is Source.SAVED:
            return head + f"from the saved config {self.path} this provider was loaded from"
        if self.source is Source.SETTING:
            return head + "this run's setting"
        declared = (f" (the plugin's; the provider's class declares {str(self.declared).lower()})"
                    if self.declared is not None and self.declared != self.value else "")
        return head + "the provider's default" + declared

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source.value, "path": self.path, "declared": self.declared,
                "by_class": self.by_class}


@dataclass
class _Record:
    """What is known of one provider's flags: those its constructor wrote, and the marks."""

    constructed: set[str] = field(default_factory=set)
    #: flag -> (source, the value it had then, the saved file)
    marks: dict[str, tuple[Source, bool, str | None]] = field(default_factory=dict)


def _record(obj: Any, create: bool = False) -> _Record | None:
    record = STATE.flag_origins.get(obj)
    if record is None and create:
        record = _Record(marks=_replaced_from())
        try:
            STATE.flag_origins.set(obj, record)
        except TypeError:  # not weak-referenceable: nothing can be remembered of it
            return None
    return record


def _replaced_from() -> dict[str, tuple[Source, bool, str | None]]:
    """The marks of the provider that ``dataclasses.replace`` is copying, when the caller's constructor is one."""
    frame = sys._getframe(3)  # _replaced_from <- _record <- note_set <- FlagField.__set__ <- __init__ ...
    for _ in range(_DEPTH):
        if frame is None:
            break
        arg = _REPLACE_CODES.get(frame.f_code)
        if arg is not None:
            source = STATE.flag_origins.get(frame.f_locals.get(arg))
            return dict(source.marks) if source is not None else {}
        frame = frame.f_back
    return {}


def note_set(obj: Any, name: str, value: Any) -> None:
    """A flag was written (:class:`~._flags.FlagField`): the constructor's first write, or a setting after it."""
    record = _record(obj, create=True)
    if record is None:
        return
    if name in record.constructed:
        record.marks[name] = (Source.SETTING, bool(value), None)
    else:
        record.constructed.add(name)


def mark_loaded(provider: Any, saved: SavedConfig) -> None:
    """``provider`` was instantiated from ``saved``: each flag the file writes has its value from there."""
    record = _record(provider, create=True)
    if record is not None:
        record.marks.update({flag: (Source.SAVED, value, saved.path) for flag, value in saved.values})


def instantiating(instantiate: Callable[..., Any]) -> Callable[..., Any]:
    """Bridge's ``instantiate(config, ...)`` that marks what it makes from a recorded saved ``model`` section."""

    @keeps(instantiate)
    def wrapper(config: Any, *args: Any, **kwargs: Any) -> Any:
        made = instantiate(config, *args, **kwargs)
        saved = saved_for_model(config)
        if saved is not None:
            mark_loaded(made, saved)
        return made

    return wrapper


def flag_origins(provider: Any, values: dict[str, bool]) -> tuple[FlagOrigin, ...]:
    """Where each flag of ``values`` (flag -> the value the build applies) came from on ``provider``."""
    record = _record(provider)
    true = tuple(flag for flag, value in values.items() if value)
    by_class = saved_flags(provider, true) if record is None else {}
    origins = []
    for flag, value in values.items():
        declared = declared_default(type(provider), flag)
        mark = record.marks.get(flag) if record is not None else None
        if mark is not None and mark[1] == value:
            origins.append(FlagOrigin(flag, value, mark[0], mark[2], declared))
        elif mark is not None:  # changed since, not by a write after construction: a replace's override
            origins.append(FlagOrigin(flag, value, Source.SETTING, None, declared))
        elif flag in by_class:
            origins.append(FlagOrigin(flag, value, Source.SAVED, by_class[flag], declared, by_class=True))
        else:
            default = getattr(type(provider), flag, False)
            source = Source.DEFAULT if value == (default if isinstance(default, bool) else False) else Source.SETTING
            origins.append(FlagOrigin(flag, value, source, None, declared))
    return tuple(origins)


#: The saved config file ``ConfigContainer.from_yaml`` is reading in this context (its ``from_dict`` instantiates it).
_READING: ContextVar[Any] = ContextVar("bridge_freeze_reading", default=None)


def reading_file(from_yaml: Callable[..., Any]) -> Callable[..., Any]:
    """``ConfigContainer.from_yaml(cls, yaml_path, mode=...)`` (the function under the classmethod) that lets the
    ``from_dict`` it calls know the file (NeMo-RL before July 2026 loaded its conversion cache so, in STRICT mode)."""

    @keeps(from_yaml)
    def from_yaml_recorded(cls: Any, yaml_path: Any, *args: Any, **kwargs: Any) -> Any:
        token = _READING.set(yaml_path)
        try:
            return from_yaml(cls, yaml_path, *args, **kwargs)
        finally:
            _READING.reset(token)

    return from_yaml_recorded


def loading_container(from_dict: Callable[..., Any]) -> Callable[..., Any]:
    """``ConfigContainer.from_dict(cls, config_dict, ...)`` that, called by :func:`reading_file`, records the file
    (as Bridge's ``read_run_config`` does) and marks the container's provider with it."""

    @keeps(from_dict)
    def from_dict_recorded(cls: Any, config_dict: Any, *args: Any, **kwargs: Any) -> Any:
        path = _READING.get()
        model = config_dict.get("model") if path is not None and isinstance(config_dict, Mapping) else None
        if model is not None:
            record_saved(path, config_dict)
        token = _READING.set(None)  # only the outermost container is the file's
        try:
            made = from_dict(cls, config_dict, *args, **kwargs)
        finally:
            _READING.reset(token)
        saved = saved_for_model(model) if model is not None else None
        provider = getattr(made, "model", None)
        if saved is not None and provider is not None:
            mark_loaded(provider, saved)
        return made

    return from_dict_recorded
