"""A recipe's config read as ``check-config`` reads a Bridge config, each flag with its source.

The recipe's own config (as Bridge writes ``run_config.yaml``) is read with the overrides by the plugin's config
reading (:func:`bridge_freeze_plugin.config.load_run`): every value read from the recipe is labelled "the recipe
NAME", every value an override wrote "override '...'". The judged values are Bridge's: each key an override names
must read the same in the plugin's reading and in the config Bridge's own override code made, else
:class:`RecipeError` (the prediction would be of a config the run does not have).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.config import BRIDGE, ConfigRun, load_config, load_run, parse_override, select
from bridge_freeze_plugin.errors import RecipeError
from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.recipes._run import RecipeRun
from bridge_freeze_plugin.request import FLAGS, INFO

#: A flag's source when no override wrote it.
FROM_RECIPE = "the recipe"
FROM_OVERRIDE = "your override"


@dataclass(frozen=True)
class FlagSource:
    """One freeze flag of the recipe's model: its value for the run, the recipe's own, and which one won."""

    key: str
    value: Any
    recipe_value: Any
    source: str  # FROM_RECIPE or FROM_OVERRIDE
    override: str | None = None  # the override's text

    def describe(self) -> str:
        shown = _shown(self.value)
        if self.override is None:
            return f"{self.key} = {shown}  ({FROM_RECIPE})"
        return f"{self.key} = {shown}  ({FROM_OVERRIDE}: {self.override}; the recipe: {_shown(self.recipe_value)})"

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "recipe_value": self.recipe_value, "source": self.source,
                "override": self.override}


@dataclass(frozen=True)
class RecipeCheck:
    """A recipe run and the plugin's reading of it."""

    run: RecipeRun
    checked: ConfigRun
    flags: tuple[FlagSource, ...]

    def as_dict(self) -> dict[str, Any]:
        return {**self.run.as_dict(), "flags": {flag.key: flag.as_dict() for flag in self.flags}}


def _shown(value: Any) -> str:
    return "true" if value is True else "false" if value is False else "null" if value is None else str(value)


def _override_keys(overrides: tuple[str, ...]) -> dict[str, str]:
    """key -> the last override's text naming it (Hydra applies them in order)."""
    keys: dict[str, str] = {}
    for text in overrides:
        keys[parse_override(text).key] = text
    return keys


def _agree(run: RecipeRun, checked: ConfigRun, keys: dict[str, str]) -> None:
    final = load_config(run.final_yaml)
    for key, text in keys.items():
        ours, bridges = select(checked.loaded.cfg, key), select(final, key)
        if ours != bridges:
            raise RecipeError(
                f"recipe {run.name}: {text} gives {key} = {_shown(bridges)} through Bridge's override code, and "
                f"{_shown(ours)} as the plugin reads it: the check would be of a config the run does not have. "
                f"Write the override as key=value with a plain value", recipe=run.name)


def _flags(run: RecipeRun, checked: ConfigRun, keys: dict[str, str]) -> tuple[FlagSource, ...]:
    """Each flag the recipe's provider has (or an override writes): its value for the run, the recipe's own."""
    family = checked.settings.family
    flags = FLAGS if family is None else tuple(INFO[part].flag for part in family.part_names())
    found = []
    for flag in flags:
        key = f"{BRIDGE.homes.home(flag)}.{flag}"
        override = next((text for k, text in keys.items() if key == k or key.startswith(k + ".")), None)
        value = select(checked.loaded.cfg, key)
        value = getattr(run.container.model, flag, None) if value is None else value
        if run.recipe_flags.get(flag) is None and override is None:
            continue  # a flag this provider does not have
        found.append(FlagSource(key, value, run.recipe_flags.get(flag),
                                FROM_RECIPE if override is None else FROM_OVERRIDE, override))
    return tuple(found)


def check_recipe(run: RecipeRun, *, family: FamilySpec | str | None = None) -> RecipeCheck:
    """The plugin's reading of ``run``'s config (nothing checked yet: :meth:`ConfigRun.validate`)."""
    checked = load_run(run.recipe_yaml, run.overrides, family=family)
    if checked.layout.name != BRIDGE.name:
        raise RecipeError(f"recipe {run.name}'s config reads as the {checked.layout.title} layout "
                          f"({checked.loaded.layout_reason}), not as a Megatron-Bridge ConfigContainer",
                          recipe=run.name)
    keys = _override_keys(run.overrides)
    _agree(run, checked, keys)
    return RecipeCheck(run, checked, _flags(run, checked, keys))
