"""The full-recompute rule on a config's values: which adjustment the build will make, said up front.

On a family whose table sets ``no_full_recompute`` (measured: the Qwen3-VL family, Ernie-4.5-VL), full
activation recompute gives wrong gradients to the parts in ``full_recompute_affects``; the table says why
(``FamilySpec.recompute_note``). When such a part trains under full recompute, the provider build turns
recompute off in those modules (:mod:`bridge_freeze_plugin.prewrap._recompute_fix`). Config validation says
so before any model is built, as a warning on rank 0: an adjustment with a memory cost, never a refusal.
No family knowledge lives here. Imports nothing heavy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from bridge_freeze_plugin.families import FamilySpec
from bridge_freeze_plugin.request import FreezeSelection, Part

logger = logging.getLogger("bridge_freeze_plugin")

#: ``recompute_granularity`` value meaning full activation recompute.
FULL_RECOMPUTE = "full"


def is_full(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == FULL_RECOMPUTE


def affected_parts(family: FamilySpec | None, selection: FreezeSelection) -> list[str]:
    """The trained parts whose gradients full recompute gets wrong on this family (``[]``: none)."""
    if family is None or not family.no_full_recompute:
        return []
    if selection.train_patterns:  # a train pattern may make any part (partly) train
        return list(family.full_recompute_affects)
    return [p for p in family.full_recompute_affects if Part(p) in selection.trained_parts(family.part_names())]


def full_recompute_adjustment(
    family: FamilySpec | None,
    selection: FreezeSelection,
    settings: Mapping[str, Any],
    *,
    flags_key: str,
    sources: Mapping[str, str] | None = None,
    warn: bool = True,
) -> str | None:
    """The adjustment the build will make for full recompute on this run (``None``: none), logged if ``warn``.

    ``settings`` maps each recompute key, as the user would write it, to its value; ``sources`` (key -> where
    its value came from) is shown next to a key whose value did not come from the config itself.
    """
    full_keys = [key for key, value in settings.items() if is_full(value)]
    parts = affected_parts(family, selection)
    if not full_keys or not parts:
        return None
    assert family is not None
    sources = sources or {}
    setting = " and ".join(
        f"{key}=full" + (f" ({sources[key]})" if sources.get(key, "config") != "config" else "") for key in full_keys
    )
    freeze = " and ".join(f"{flags_key}.freeze_{p}=true" for p in family.full_recompute_affects)
    note = (
        f"{setting} while {' and '.join(parts)} train(s) on the {family.name} family, where "
        f"{family.recompute_note or 'full recompute gives wrong gradients'}: when the model is built, the plugin "
        f"turns full recompute off in {', '.join(family.no_full_recompute)} only (the rest keeps it; more activation "
        f"memory there). To avoid the adjustment, turn full recompute off or use selective recompute, or freeze "
        f"those parts ({freeze}) if they need not train; to refuse instead, set full_recompute_policy='refuse' "
        f"on the provider."
    )
    if warn:
        logger.warning("bridge-freeze: %s", note)
    return note
