"""Questions the plugin asks a Bridge model provider about itself (no building, no side effects).

- which family it belongs to (:func:`resolve_family`: raises when a flag is set and no family covers it);
- how to name it in messages (:func:`provider_label`, :func:`model_name_of`, :func:`describe_request`);
- what its class declared as the default of each flag, before activation patched it, and which of those
  defaults the written config overrides (:func:`declared_default`, :func:`overridden_defaults`);
- :func:`write_selection`: every flag written, always (and Bridge's own alias fields, e.g.
  ``freeze_sound_encoder``, where the provider has them).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.errors import PartNotInFamilyError, UnsupportedFreezeFlagError
from bridge_freeze_plugin.families import UNSUPPORTED_PROVIDERS, FamilySpec, class_path
from bridge_freeze_plugin.prewrap._state import STATE
from bridge_freeze_plugin.registry import family_for_provider, list_families
from bridge_freeze_plugin.request import ALIASES, FLAG_PARTS, FLAGS, FreezeSelection, asked_text, label

#: Marks the plugin's own classes (the mixin, generated freezable subclasses) in a provider's MRO.
PLUGIN_CLASS_MARK = "_bridge_freeze_plugin_class"

#: Provider attributes that may name the model (first non-empty string wins).
_MODEL_NAME_ATTRS = ("hf_model_id", "hf_model_name", "name_or_path", "_name_or_path")


@dataclass(frozen=True)
class DefaultOverride:
    """A provider's declared default for a flag, replaced by the value the plugin wrote."""

    flag: str
    provider_default: bool
    value: bool

    def __str__(self) -> str:
        return f"{self.flag}={self.provider_default} replaced by {self.value}"


def is_plugin_class(cls: type) -> bool:
    return bool(cls.__dict__.get(PLUGIN_CLASS_MARK, False))


def bridge_class(provider: Any) -> type:
    """The provider's class without the plugin's own classes (the Bridge or user class it really is)."""
    cls = provider if isinstance(provider, type) else type(provider)
    return next((k for k in cls.__mro__ if not is_plugin_class(k)), cls)


def provider_label(provider: Any) -> str:
    return bridge_class(provider).__name__


def model_name_of(provider: Any) -> str | None:
    for attr in _MODEL_NAME_ATTRS:
        value = getattr(provider, attr, None)
        if isinstance(value, str) and value:
            return value
    return None


def describe_selection(selection: FreezeSelection) -> str:
    """The flags set and the patterns given, as a user would write them (``"no freeze flag"`` when none)."""
    return asked_text(selection) or "no freeze flag"


def describe_request(provider: Any, selection: FreezeSelection) -> str:
    """``"freeze_vision_model=True on Qwen3VLModelProvider (model Qwen/...)"``, for messages."""
    model = model_name_of(provider)
    return f"{describe_selection(selection)} on {provider_label(provider)}{f' (model {model})' if model else ''}"


def resolve_family(provider: Any, selection: FreezeSelection | None = None) -> FamilySpec | None:
    """The provider's family; raises :class:`UnsupportedFreezeFlagError` if a flag is set and there is none, and
    :class:`PartNotInFamilyError` if a flag is set for a part the family does not have."""
    selection = FreezeSelection.from_object(provider) if selection is None else selection
    family = family_for_provider(provider)
    if family is None and selection.any_set:
        model = model_name_of(provider)
        reason = unsupported_reason(provider)
        supported = ", ".join(f"{f.name} ({', '.join(p.rpartition(':')[2] for p in f.providers)})"
                              for f in list_families())
        raise UnsupportedFreezeFlagError(
            f"{describe_selection(selection)} was set on "
            f"{class_path(bridge_class(provider)).replace(':', '.')}{f' (model {model})' if model else ''}, "
            f"but no bridge-freeze family covers this provider{f' ({reason})' if reason else ''}, so the flag "
            f"cannot be honoured. Supported families: {supported}. Unset the flag, register this model's family "
            f"with bridge_freeze_plugin.register_family(...), or leave the flag to Bridge's own freeze by opting "
            f"out of the plugin (BRIDGE_FREEZE_DISABLE_AUTOLOAD=1 and no 'import bridge_freeze_plugin')."
        )
    if family is not None:
        check_parts_exist(provider, family, selection)
    return family


def unsupported_reason(provider: Any) -> str | None:
    """Why no family covers this provider, when the plugin knows (``families/unsupported.py``)."""
    cls = provider if isinstance(provider, type) else type(provider)
    for klass in cls.__mro__:
        reason = UNSUPPORTED_PROVIDERS.get(class_path(klass))
        if reason is not None:
            return reason
    return None


def declared_default(cls: type, flag: str) -> bool | None:
    """The default the provider class itself declares for ``flag`` (ignoring the plugin's classes).

    ``None`` when no class in its hierarchy declares the flag (the plugin added it).
    """
    for klass in cls.__mro__:
        if is_plugin_class(klass):
            continue
        if (klass, flag) in STATE.original_defaults:
            return STATE.original_defaults[(klass, flag)]
        if flag in inspect.get_annotations(klass):
            fld = getattr(klass, "__dataclass_fields__", {}).get(flag)
            if fld is not None and fld.default is not dataclasses.MISSING:
                return bool(fld.default)
            default = klass.__dict__.get(flag, False)
            return bool(default) if isinstance(default, bool) else False
    return None


def overridden_defaults(provider: Any) -> tuple[DefaultOverride, ...]:
    """Provider defaults that would have frozen a part which, by the written config, now trains.

    (A flag the config sets to ``True`` on a provider that defaults to ``False`` is a request, shown
    in the selection itself, not an override to warn about.)
    """
    overrides = []
    for flag in flag_attributes(type(provider)):
        default = declared_default(type(provider), flag)
        value = bool(getattr(provider, flag, False))
        if default is True and value is False:
            overrides.append(DefaultOverride(flag, default, value))
    return tuple(overrides)


def write_selection(provider: Any, selection: FreezeSelection) -> None:
    """Write every flag (and both pattern lists) to the provider, whether they are set or not, and each Bridge
    alias field the provider's class declares (``freeze_sound_encoder`` = ``freeze_audio_model``): the config wins
    over every default."""
    for name, value in selection.provider_attributes().items():
        setattr(provider, name, value)
    for alias, flag in ALIASES.items():
        if declared_default(type(provider), alias) is not None:
            setattr(provider, alias, getattr(selection, flag))


def write_aliases_back(provider: Any, selection: FreezeSelection) -> None:
    """Write the merged value of each flag that has a Bridge alias the provider's class declares back to both
    fields (``freeze_sound_encoder`` and ``freeze_audio_model``), when they differ from it: the build freezes the
    part if either is set, and what Bridge saves of the provider (``run_config.yaml``, a NeMo-RL conversion cache)
    must say the same, not the alias true and the flag false."""
    for alias, flag in ALIASES.items():
        if declared_default(type(provider), alias) is None:
            continue
        value = getattr(selection, flag)
        for name in (flag, alias):
            if getattr(provider, name, None) is not value:
                setattr(provider, name, value)


def flag_attributes(cls: type) -> tuple[str, ...]:
    """The flags, and the Bridge alias fields ``cls`` declares: every field that freezes a part."""
    return (*FLAGS, *(alias for alias in ALIASES if declared_default(cls, alias) is not None))


def check_parts_exist(provider: Any, family: FamilySpec, selection: FreezeSelection) -> None:
    """A flag set for a part the family does not have cannot be honoured: :class:`PartNotInFamilyError`."""
    missing = [flag for flag in selection.set_flags() if not family.has_part(FLAG_PARTS[flag])]
    if not missing:
        return
    model = model_name_of(provider)
    what = " and ".join(label(FLAG_PARTS[f]) for f in missing)
    raise PartNotInFamilyError(
        f"{', '.join(f'{f}=True' for f in missing)} on {provider_label(provider)}"
        f"{f' (model {model})' if model else ''}: family {family.name!r} has no {what} (its parts: "
        f"{family.describe_parts()}), so the flag cannot freeze anything. Unset {', '.join(missing)} (or set "
        f"{'them' if len(missing) > 1 else 'it'} to false)."
    )
