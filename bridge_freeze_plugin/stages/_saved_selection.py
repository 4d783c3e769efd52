"""The selection a checkpoint was saved with, read from its ``run_config.yaml``, and how it differs from a run's.

Bridge writes the provider into the ``model`` section of each iteration's ``run_config.yaml``; the plugin leaves its
unset fields out (``activation._serialised``), so a flag the section does not hold is false and a pattern list it
does not hold is empty. Bridge's own name of a flag (an alias: ``freeze_sound_encoder``) set true freezes that part
too, as on a provider. Patterns are compared as sets: their order does not change what trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from bridge_freeze_plugin.errors import InvalidPatternError, SelectionChange
from bridge_freeze_plugin.request import ALIASES, FLAGS, PATTERN_KEYS, FreezeSelection, pattern_tuple

#: One selection as the check sees it: each flag's value and each pattern list, by key.
Settings = dict[str, bool | tuple[str, ...]]


def saved_settings(model: Mapping[str, Any], path: str) -> Settings:
    """The flags and patterns a saved ``model`` section holds (a flag absent or not ``true`` is false)."""
    settings: Settings = {flag: model.get(flag) is True for flag in FLAGS}
    for alias, flag in ALIASES.items():
        if model.get(alias) is True:
            settings[flag] = True
    for key in PATTERN_KEYS:
        try:
            settings[key] = pattern_tuple(model.get(key), key)
        except InvalidPatternError as exc:
            raise InvalidPatternError(f"{path}: model.{exc}") from None
    return settings


def run_settings(provider: Any) -> Settings:
    """The flags and patterns this run's provider holds (as the build read them)."""
    selection = FreezeSelection.from_object(provider)
    return {**selection.as_dict(), **{key: tuple(getattr(selection, key)) for key in PATTERN_KEYS}}


def changes(saved: Settings, run: Settings) -> list[SelectionChange]:
    """Every key whose value differs, flags first (the vocabulary's order), then the pattern lists."""
    found = [SelectionChange(flag, saved[flag], run[flag]) for flag in FLAGS if saved[flag] != run[flag]]
    for key in PATTERN_KEYS:
        before, now = cast(tuple[str, ...], saved[key]), cast(tuple[str, ...], run[key])
        if set(before) != set(now):
            found.append(SelectionChange(key, before, now))
    return found


def value_text(value: bool | tuple[str, ...]) -> str:
    """A setting as a config writes it: ``true``, ``[]``, ``['vision_model\\.merger']``."""
    if isinstance(value, bool):
        return str(value).lower()
    return "[" + ", ".join(repr(p) for p in value) + "]"


def change_text(change: SelectionChange) -> str:
    """``freeze_language_model: true in the checkpoint, false in this run``."""
    return f"{change.key}: {value_text(change.saved)} in the checkpoint, {value_text(change.run)} in this run"
