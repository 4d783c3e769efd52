"""The full-recompute rule, on plain values: config validation applies it to a config's recompute keys.

On a family with ``projection_needs_recompute_off``, full activation recompute loses part of the vision
projection's gradient; the family's table says why (``FamilySpec.recompute_note``). So, while the
projection trains:

- with a freeze flag set (the user chose what trains), it is an error, raised before any model is built;
- with no flag set, a warning only, so that installing the plugin never breaks a run that worked before.

No family knowledge lives here. Imports nothing heavy.
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
    """The family's reason, as a clause (its table's ``recompute_note``)."""
    note = f" ({family.recompute_note})" if family.recompute_note else ""
    return (
        f"on the {family.name} family, under full activation recompute part of the vision projection gets "
        f"no gradient, a known Megatron-Bridge problem{note}"
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
    sources: Mapping[str, str] | None = None,
) -> bool:
    """Apply the rule; returns whether it found full recompute with a trained projection on such a family.

    ``settings`` maps each recompute key, as the user would write it, to its value; ``asked`` names the
    flags as they were set; ``turn_off`` and ``freeze_projection`` are the two fixes, spelt for the user.
    Raises :class:`InvalidFreezeConfigError` when a flag is set; logs a warning (if ``warn``) otherwise.
    ``sources`` (key -> where its value came from) is shown next to a key whose value did not come from the
    config itself (a layout default, an override...).
    """
    full_keys = [key for key, value in settings.items() if is_full(value)]
    if family is None or not family.projection_needs_recompute_off or not full_keys:
        return False
    if selection.freeze_vision_projection:
        return False
    sources = sources or {}
    setting = " and ".join(
        f"{key}=full" + (f" ({sources[key]})" if sources.get(key, "config") != "config" else "") for key in full_keys
    )
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
