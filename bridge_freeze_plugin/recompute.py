"""Validation rule 7, shared by config validation and the provider build.

On a family with ``projection_needs_recompute_off`` (the Qwen3-VL family), full activation recompute
loses part of the vision projection's gradient: the vision config copies the language model's recompute
settings, and the DeepStack mergers run inside the checkpointed function and hand their outputs back in a
Python list, which the checkpoint does not back-propagate. So, while the projection trains:

- with a freeze flag set (the user chose what trains), it is an error, raised before any model is built;
- with no flag set, a warning only, so that installing the plugin never breaks a run that worked before.

Config validation (:mod:`bridge_freeze_plugin.validation`) applies the rule to the config's keys; the
provider (:mod:`bridge_freeze_plugin.mixins.freezable`) applies it again to its own
``recompute_granularity`` when it builds, which covers runs whose config named no family (a hub id) and
runs that never went through config validation. Imports nothing heavy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from bridge_freeze_plugin.errors import InvalidFreezeConfigError
from bridge_freeze_plugin.registry import FamilySpec
from bridge_freeze_plugin.selection import FreezeSelection

logger = logging.getLogger("bridge_freeze_plugin")

#: ``recompute_granularity`` value meaning full activation recompute.
FULL_RECOMPUTE = "full"


def is_full(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == FULL_RECOMPUTE


def why(family: FamilySpec) -> str:
    return (
        f"on the {family.name} family, under full activation recompute part of the vision projection "
        "(e.g. Qwen3-VL's DeepStack mergers) gets no gradient, a known Megatron-Bridge problem (the vision "
        "config copies the language model's recompute settings)"
    )


def check_projection_recompute(
    family: FamilySpec | None,
    selection: FreezeSelection,
    settings: Mapping[str, Any],
    *,
    asked: str,
    turn_off: str,
    freeze_projection: str,
    warn: bool = True,
) -> bool:
    """Apply rule 7; returns whether it found full recompute with a trained projection on such a family.

    ``settings`` maps each recompute key, as the user would write it, to its value; ``asked`` names the
    flags as they were set; ``turn_off`` and ``freeze_projection`` are the two fixes, spelt for the user.
    Raises :class:`InvalidFreezeConfigError` when a flag is set; logs a warning (if ``warn``) otherwise.
    """
    full_keys = [key for key, value in settings.items() if is_full(value)]
    if family is None or not family.projection_needs_recompute_off or not full_keys:
        return False
    if selection.freeze_vision_projection:
        return False
    setting = " and ".join(f"{key}=full" for key in full_keys)
    if selection.any_set:
        raise InvalidFreezeConfigError(
            f"{asked} leaves the vision projection training while {setting}: {why(family)}. Turn full recompute "
            f"off ({turn_off}, or selective), or freeze the projection too ({freeze_projection})."
        )
    if warn:
        logger.warning(
            "bridge-freeze: %s with no freeze flag set: %s. Consider turning full recompute off (%s), or "
            "freezing the projection (%s) if it need not train.",
            setting, why(family), turn_off, freeze_projection,
        )
    return True
