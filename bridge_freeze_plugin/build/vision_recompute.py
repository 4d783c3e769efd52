"""Full activation recompute where it gives wrong gradients: fixed in the modules that break, not refused.

On some families full activation recompute gives wrong gradients to some parts (family data:
``FamilySpec.no_full_recompute``, the modules where it breaks; ``full_recompute_affects``, the parts whose
gradients it gets wrong; ``recompute_note``, why). When such a part trains under
``recompute_granularity="full"`` (any ``recompute_method``), the plugin turns recompute off in those modules'
own configs right after the build, before any forward; the rest of the model keeps its full recompute. The
report says so in one line.

A user who prefers the old behaviour sets ``vision_recompute_policy = "refuse"`` on the provider: a flag
set with an affected part training under full recompute is then an error before any build.
Selective recompute checkpoints inside attention only: left as it is.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from bridge_freeze_plugin.build.classify import as_chunks
from bridge_freeze_plugin.errors import InvalidFreezeConfigError
from bridge_freeze_plugin.recompute import affected_parts, is_full
from bridge_freeze_plugin.registry import FamilySpec
from bridge_freeze_plugin.selection import FreezeSelection, Part

if TYPE_CHECKING:
    from bridge_freeze_plugin.build.context import BuildContext

logger = logging.getLogger("bridge_freeze_plugin")

#: Provider attribute choosing what happens: "fix" (default) or "refuse".
POLICY_ATTR = "vision_recompute_policy"
POLICIES = ("fix", "refuse")
_RECOMPUTE_FIELDS = {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None}


def policy_of(provider: Any) -> str:
    policy = getattr(provider, POLICY_ATTR, "fix")
    if policy not in POLICIES:
        raise InvalidFreezeConfigError(
            f"{POLICY_ATTR}={policy!r} on {type(provider).__name__}: it must be one of {', '.join(POLICIES)} "
            f"('fix' turns full recompute off in the vision tower only; 'refuse' makes it an error)"
        )
    return str(policy)


def needs_fix(family: FamilySpec | None, selection: FreezeSelection, recompute_granularity: Any) -> bool:
    """Whether a part whose gradients full recompute gets wrong on this family trains under full recompute."""
    return is_full(recompute_granularity) and bool(affected_parts(family, selection))


def note(family: FamilySpec) -> str:
    """The report's line: what was changed, and why."""
    where = ", ".join(family.no_full_recompute)
    return (
        f"full activation recompute turned off in {where} (the rest of the model keeps it): on {family.name}, "
        f"{family.recompute_note or 'full recompute there gives wrong gradients'}"
    )


def turn_off(model: Any, family: FamilySpec) -> int:
    """Set recompute off in the config of every module under ``family.no_full_recompute``; configs changed."""
    changed: dict[int, Any] = {}
    for chunk in as_chunks(model):
        for name, module in chunk.named_modules():
            if not any(name == p or name.startswith(p + ".") for p in family.no_full_recompute):
                continue
            config = getattr(module, "config", None)
            if is_full(getattr(config, "recompute_granularity", None)):
                changed[id(config)] = config
    for config in changed.values():
        for field, value in _RECOMPUTE_FIELDS.items():
            setattr(config, field, value)
    return len(changed)


def refuse(context: BuildContext, *, warn_only: bool, rank0: bool) -> None:
    """The "refuse" policy: an error when a flag is set, a warning (rank 0) when none is."""
    assert context.family is not None
    trained = " and ".join(p for p in context.family.full_recompute_affects
                           if Part(p) in context.selection.trained_parts())
    message = (
        f"{context.asked} trains the {trained} under recompute_granularity=full, with {POLICY_ATTR}='refuse': "
        f"on the {context.family.name} family {context.family.recompute_note or 'that gives wrong gradients'}. "
        f"Let the plugin turn recompute off in {', '.join(context.family.no_full_recompute)} only "
        f"({POLICY_ATTR}='fix', the default), turn full recompute off (recompute_granularity=None, or selective), "
        f"or freeze those parts ({', '.join(f'freeze_{p}=True' for p in context.family.full_recompute_affects)})."
    )
    if not warn_only:
        raise InvalidFreezeConfigError(message)
    if rank0:
        logger.warning("bridge-freeze: %s", message)
